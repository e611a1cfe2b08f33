//! Anthropic's prefill (docs/streaming.md#resume-after-commit): an answer continued by
//! appending the text the client already has as the final assistant message. Anthropic
//! refuses a final assistant message that ends in whitespace, so trailing whitespace is
//! left out (the client has it; the continuation's leading whitespace is not sent again).
//! Used for `anthropic` targets and Claude on Vertex (`rawPredict` takes the same
//! messages).

use bytes::Bytes;
use serde_json::{Value, json};

use crate::providers::adapter::Prefilled;

/// `body` (a Messages request) with `text` appended as the final assistant message
/// (to the client's own prefill, when its request ended with one).
pub(crate) fn prefilled(body: &[u8], text: &str) -> Option<Prefilled> {
    let sent = text.trim_end();
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let messages = v.get_mut("messages")?.as_array_mut()?;
    // Only whitespace so far: nothing to continue, the answer starts afresh.
    if !sent.is_empty() {
        append_assistant(messages, sent);
    }
    Some(Prefilled {
        body: Bytes::from(serde_json::to_vec(&v).ok()?),
        sent: sent.len(),
    })
}

/// Appends `text` to the final assistant turn of `messages` (a string, or its last
/// text block), or as a new one.
fn append_assistant(messages: &mut Vec<Value>, text: &str) {
    if let Some(last) = messages.last_mut()
        && last.get("role").and_then(Value::as_str) == Some("assistant")
    {
        match last.get_mut("content") {
            Some(Value::String(s)) => {
                s.push_str(text);
                return;
            }
            Some(Value::Array(blocks)) => {
                match blocks
                    .last_mut()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                    .and_then(|b| b.get_mut("text"))
                {
                    Some(Value::String(s)) => s.push_str(text),
                    _ => blocks.push(json!({"type": "text", "text": text})),
                }
                return;
            }
            _ => {}
        }
    }
    messages.push(json!({"role": "assistant", "content": text}));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_received_text_is_the_final_assistant_turn_without_trailing_whitespace() {
        let body = br#"{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#;
        let p = prefilled(body, "Hello, \n").unwrap();
        let v: Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(
            v["messages"][1],
            json!({"role": "assistant", "content": "Hello,"})
        );
        assert_eq!(p.sent, "Hello,".len());
        assert_eq!(v["model"], "m");

        // The client's own prefill goes on.
        let body = br#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"The answer is"}]}]}"#;
        let p = prefilled(body, " 42.").unwrap();
        let v: Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(v["messages"].as_array().unwrap().len(), 2);
        assert_eq!(v["messages"][1]["content"][0]["text"], "The answer is 42.");

        // Only whitespace so far: nothing appended, nothing carried.
        let p = prefilled(br#"{"messages":[{"role":"user","content":"hi"}]}"#, " \n").unwrap();
        let v: Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(v["messages"].as_array().unwrap().len(), 1);
        assert_eq!(p.sent, 0);
        assert!(prefilled(b"not json", "x").is_none());
    }
}

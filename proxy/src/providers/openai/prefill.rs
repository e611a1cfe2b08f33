//! The OpenAI-compatible prefill convention of vLLM and SGLang
//! (docs/streaming.md#resume-after-commit): the text the client already has as the final
//! assistant message, with `continue_final_message: true` (continue it, do not start a new
//! turn) and `add_generation_prompt: false` (which the servers require with it). Only for
//! `openai-compatible` credentials that declare `prefill: true`; the whole text is sent,
//! trailing whitespace included.

use bytes::Bytes;
use serde_json::{Value, json};

use crate::providers::adapter::Prefilled;

/// `body` (a chat completions request) asking to continue `text`.
pub(crate) fn prefilled(body: &[u8], text: &str) -> Option<Prefilled> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let messages = v.get_mut("messages")?.as_array_mut()?;
    match messages.last_mut() {
        Some(last) if last.get("role").and_then(Value::as_str) == Some("assistant") => {
            match last.get_mut("content") {
                Some(Value::String(s)) => s.push_str(text),
                Some(Value::Array(parts)) => parts.push(json!({"type": "text", "text": text})),
                _ => last["content"] = Value::String(text.to_owned()),
            }
        }
        _ => messages.push(json!({"role": "assistant", "content": text})),
    }
    let o = v.as_object_mut()?;
    o.insert("continue_final_message".into(), Value::Bool(true));
    o.insert("add_generation_prompt".into(), Value::Bool(false));
    Some(Prefilled {
        body: Bytes::from(serde_json::to_vec(&v).ok()?),
        sent: text.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vllm_convention() {
        let body = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let p = prefilled(body, "Hello, ").unwrap();
        let v: Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(
            v["messages"][1],
            json!({"role": "assistant", "content": "Hello, "})
        );
        assert_eq!(v["continue_final_message"], true);
        assert_eq!(v["add_generation_prompt"], false);
        assert_eq!(v["stream"], true);
        assert_eq!(p.sent, 7, "trailing whitespace kept");
    }
}

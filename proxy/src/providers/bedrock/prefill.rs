//! Claude on Bedrock continues a prefill like Anthropic's API
//! (docs/streaming.md#resume-after-commit): the text the client already has, as the final
//! assistant turn of the Converse request
//! (`{"role":"assistant","content":[{"text":...}]}`), without trailing whitespace, which
//! Claude refuses. Other Bedrock models are not asked to.

use bytes::Bytes;
use serde_json::{Value, json};

use crate::providers::adapter::Prefilled;

/// Whether the Bedrock model id names a Claude model (`anthropic.claude-...`, with or
/// without a cross-region prefix such as `us.`, or in an inference profile's ARN).
pub(crate) fn is_claude(model: &str) -> bool {
    model.contains("anthropic.claude")
}

/// `body` (a Converse request) with `text` as the final assistant turn.
pub(crate) fn prefilled(body: &[u8], text: &str) -> Option<Prefilled> {
    let sent = text.trim_end();
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let messages = v.get_mut("messages")?.as_array_mut()?;
    match messages.last_mut() {
        // Only whitespace so far: nothing to continue, the answer starts afresh.
        _ if sent.is_empty() => {}
        Some(last) if last.get("role").and_then(Value::as_str) == Some("assistant") => {
            let blocks = last.get_mut("content")?.as_array_mut()?;
            match blocks.last_mut().and_then(|b| b.get_mut("text")) {
                Some(Value::String(s)) => s.push_str(sent),
                _ => blocks.push(json!({"text": sent})),
            }
        }
        _ => messages.push(json!({"role": "assistant", "content": [{"text": sent}]})),
    }
    Some(Prefilled {
        body: Bytes::from(serde_json::to_vec(&v).ok()?),
        sent: sent.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_models_and_the_converse_shape() {
        assert!(is_claude("us.anthropic.claude-sonnet-4-20250514-v1:0"));
        assert!(is_claude("anthropic.claude-3-haiku-20240307-v1:0"));
        assert!(!is_claude("amazon.nova-lite-v1:0"));
        let body = br#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#;
        let p = prefilled(body, "Hello \n").unwrap();
        let v: Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(
            v["messages"][1],
            json!({"role": "assistant", "content": [{"text": "Hello"}]})
        );
        assert_eq!(p.sent, 5);
    }
}

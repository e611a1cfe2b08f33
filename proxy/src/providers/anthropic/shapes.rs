//! Anthropic's messages shapes shared by its requests, answers and streams: what a
//! target takes, ids, stop reasons, usage, error bodies both ways (Vertex AI's
//! Google-shaped refusals included), and the `rawPredict` form of a body.

use super::super::error_body;
use super::super::form::{Error, ErrorClass, Stop, Target, Usage};
use crate::providers::classify::is_context_length;
use serde::Serialize;
use serde_json::{Map, Value, json};

/// `anthropic_version` in the body of a Messages request on Vertex AI (in place of
/// the `anthropic-version` header of Anthropic's own API).
pub(crate) const RAW_PREDICT_VERSION: &str = "vertex-2023-10-16";

/// A Messages body as Vertex AI's `rawPredict` takes it (Claude on vertex): `model`
/// removed (it is in the URL; Vertex refuses it in the body) and
/// `anthropic_version` set.
pub(crate) fn to_raw_predict(body: &mut Map<String, Value>) {
    body.remove("model");
    body.insert("anthropic_version".into(), RAW_PREDICT_VERSION.into());
}

/// Whether `body` holds an empty `"signature"` (a quick scan, so that most bodies
/// are relayed untouched).
fn has_empty_signature(body: &[u8]) -> bool {
    memchr::memmem::find_iter(body, b"\"signature\"").any(|at| {
        let rest = &body[at + b"\"signature\"".len()..];
        let rest = rest.trim_ascii_start().strip_prefix(b":").unwrap_or(rest);
        rest.trim_ascii_start().starts_with(b"\"\"")
    })
}

/// Thinking blocks without a signature in a client's history (reasoning another
/// provider made, which the gateway gave the client with an empty signature, never
/// a made-up one): Anthropic refuses them and sets earlier turns' thinking aside
/// anyway, so they are left out. Whether any was.
pub(crate) fn drop_unsigned_thinking(body: &mut Map<String, Value>) -> bool {
    let mut dropped = false;
    let messages = body.get_mut("messages").and_then(Value::as_array_mut);
    for m in messages.into_iter().flatten() {
        if let Some(blocks) = m.get_mut("content").and_then(Value::as_array_mut) {
            let before = blocks.len();
            blocks.retain(|b| {
                b["type"] != "thinking" || b["signature"].as_str().is_some_and(|s| !s.is_empty())
            });
            dropped |= blocks.len() != before;
        }
    }
    dropped
}

/// A relayed Messages body without unsigned thinking (see
/// [`drop_unsigned_thinking`]); `None` when it has none (relayed as it is).
pub(crate) fn without_unsigned_thinking(body: &[u8]) -> Option<bytes::Bytes> {
    if !has_empty_signature(body) {
        return None;
    }
    let mut v: Map<String, Value> = serde_json::from_slice(body).ok()?;
    drop_unsigned_thinking(&mut v)
        .then(|| serde_json::to_vec(&v).ok().map(bytes::Bytes::from))
        .flatten()
}

/// What an Anthropic target takes beyond the form's core.
pub(in crate::providers) const TARGET: Target = Target {
    name: "an Anthropic target",
    // Anthropic's range is 0–1.
    max_temperature: 1.0,
    top_k: true,
    image_urls: true,
    tool_result_names: false,
    document_urls: true,
    tool_result_media: true,
    url_media_type: false,
};

/// A bare id → `msg_X`.
pub(in crate::providers) fn wire_id(bare: &str) -> String {
    format!("msg_{bare}")
}

/// `msg_X` → the bare id.
pub(in crate::providers) fn bare_id(id: &str) -> &str {
    id.strip_prefix("msg_").unwrap_or(id)
}

pub(in crate::providers) fn stop_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn => "end_turn",
        Stop::Sequence => "stop_sequence",
        Stop::MaxTokens => "max_tokens",
        Stop::ContextWindow => "model_context_window_exceeded",
        Stop::ToolUse => "tool_use",
        Stop::Refusal => "refusal",
        Stop::Pause => "pause_turn",
    }
}

pub(in crate::providers) fn stop_of(stop_reason: &str) -> Stop {
    match stop_reason {
        "stop_sequence" => Stop::Sequence,
        "max_tokens" => Stop::MaxTokens,
        "model_context_window_exceeded" => Stop::ContextWindow,
        "tool_use" => Stop::ToolUse,
        "refusal" => Stop::Refusal,
        "pause_turn" => Stop::Pause,
        // end_turn and anything newer
        _ => Stop::EndTurn,
    }
}

/// Anthropic `usage`, unary and streamed alike: both cache fields always present.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(super) struct WireUsage {
    input_tokens: u64,
    output_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
}

pub(super) fn wire_usage(u: &Usage) -> WireUsage {
    WireUsage {
        input_tokens: u.input,
        output_tokens: u.output,
        cache_creation_input_tokens: u.cache_write,
        cache_read_input_tokens: u.cache_read,
    }
}

/// An Anthropic error body → the form, by its `error.type`; without a known type
/// only the broad class follows from the status.
pub(in crate::providers) fn decode_error(status: u16, body: &[u8]) -> Error {
    // Anthropic on Vertex AI: the platform's own refusals (quota, auth, a model not
    // enabled) come in Google's shape, `{"error":{"code","message","status"}}`.
    if is_google_error(body) {
        return super::super::gemini::decode_error(status, body);
    }
    let said = error_body::read(status, body);
    let class = if is_context_length(body) {
        ErrorClass::ContextLength
    } else {
        match said.kind.as_deref() {
            Some("invalid_request_error") => ErrorClass::InvalidRequest,
            Some("authentication_error") => ErrorClass::Authentication,
            Some("permission_error") => ErrorClass::Permission,
            Some("not_found_error") => ErrorClass::NotFound,
            Some("request_too_large") => ErrorClass::RequestTooLarge,
            Some("billing_error") => ErrorClass::Billing,
            Some("rate_limit_error") => ErrorClass::RateLimit,
            Some("overloaded_error") => ErrorClass::Overloaded,
            Some("timeout_error") => ErrorClass::Timeout,
            Some("api_error") => ErrorClass::Server,
            _ => match status {
                429 => ErrorClass::RateLimit,
                400..=499 => ErrorClass::InvalidRequest,
                _ => ErrorClass::Server,
            },
        }
    };
    Error {
        class,
        message: said.message,
    }
}

/// Google's error shape: `error.status` a string (a gRPC code name), no Anthropic
/// `type: "error"`.
pub(in crate::providers) fn is_google_error(body: &[u8]) -> bool {
    if memchr::memmem::find(body, b"\"status\"").is_none() {
        return false;
    }
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    v["error"]["status"].is_string() && v["type"].is_null()
}

/// The form → an Anthropic error body. A context overflow's message gets the wording
/// Anthropic clients look for.
pub(in crate::providers) fn encode_error(e: &Error) -> Value {
    let kind = match e.class {
        ErrorClass::InvalidRequest | ErrorClass::ContextLength => "invalid_request_error",
        ErrorClass::Authentication => "authentication_error",
        ErrorClass::Billing => "billing_error",
        ErrorClass::Permission => "permission_error",
        ErrorClass::NotFound | ErrorClass::ModelNotFound => "not_found_error",
        ErrorClass::RequestTooLarge => "request_too_large",
        ErrorClass::RateLimit => "rate_limit_error",
        ErrorClass::Overloaded => "overloaded_error",
        ErrorClass::Timeout => "timeout_error",
        ErrorClass::Server => "api_error",
    };
    let message =
        if e.class == ErrorClass::ContextLength && !e.message.contains("prompt is too long") {
            format!("prompt is too long: {}", e.message)
        } else {
            e.message.clone()
        };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_thinking_is_left_out_of_a_relayed_body_and_signed_kept_byte_for_byte() {
        // An Anthropic SDK client sends back what it was given: a thinking block from
        // Gemini (empty signature) and one from Claude (signed).
        let body = br#"{"model":"m","max_tokens":5,"messages":[
            {"role":"user","content":"q"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"from gemini","signature": ""},{"type":"text","text":"a"}]},
            {"role":"user","content":"q2"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"from claude","signature":"EqQBCkgIARAB"},{"type":"text","text":"b"}]},
            {"role":"user","content":"q3"}]}"#;
        let out = without_unsigned_thinking(body).expect("rewritten");
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["messages"][1]["content"],
            json!([{"type": "text", "text": "a"}])
        );
        assert_eq!(v["messages"][3]["content"][0]["signature"], "EqQBCkgIARAB");
        // Nothing unsigned: relayed as it is (no parse, no rewrite).
        let signed = br#"{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"EqQB"}]}]}"#;
        assert_eq!(without_unsigned_thinking(signed), None);
        assert_eq!(without_unsigned_thinking(br#"{"messages":[]}"#), None);
    }
}

//! Unary messages ↔ the form.

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use super::super::form::{Answer, Part, Usage};
use super::super::vocab::{as_u64, str_at};
use super::request::{block, tool_use};
use super::shapes::{bare_id, stop_of, stop_reason, wire_id, wire_usage};

/// An Anthropic target's message → the form. Thinking and server-tool blocks have no
/// place in it (and translated requests never ask for them): left out.
pub(in super::super) fn decode_answer(msg: &Map<String, Value>) -> Answer<'_> {
    let blocks = msg
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let content = blocks
        .iter()
        .filter_map(|b| match str_at(b, "type") {
            Some("text") => Some(Part::Text(str_at(b, "text").unwrap_or(""))),
            Some("tool_use") => Some(Part::ToolUse(tool_use(b))),
            _ => None,
        })
        .collect();
    Answer {
        id: Cow::Borrowed(bare_id(msg.get("id").and_then(Value::as_str).unwrap_or(""))),
        content,
        stop: msg.get("stop_reason").and_then(Value::as_str).map(stop_of),
        usage: msg.get("usage").filter(|u| u.is_object()).map(|u| Usage {
            input: as_u64(&u["input_tokens"]),
            output: as_u64(&u["output_tokens"]),
            cache_read: as_u64(&u["cache_read_input_tokens"]),
            cache_write: as_u64(&u["cache_creation_input_tokens"]),
        }),
    }
}

/// The form → an Anthropic client's message, `model` = the client's name. No stop
/// sequence is named: the form only knows that one matched.
pub(in super::super) fn encode_answer(a: &Answer<'_>, client_model: &str) -> Value {
    let usage = match &a.usage {
        Some(u) => json!(wire_usage(u)),
        None => json!({"input_tokens": 0, "output_tokens": 0}),
    };
    json!({
        "id": wire_id(&a.id),
        "type": "message",
        "role": "assistant",
        "model": client_model,
        "content": a.content.iter().map(block).collect::<Vec<_>>(),
        "stop_reason": a.stop.map_or("end_turn", stop_reason),
        "stop_sequence": null,
        "usage": usage,
    })
}

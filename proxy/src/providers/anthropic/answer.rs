//! Unary messages ↔ the form.

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use super::super::form::{Answer, Part, ReasoningText, Stop, Usage};
use super::super::vocab::{JSON_TOOL, as_u64, str_at};
use super::request::{block, tool_use};
use super::shapes::{bare_id, stop_of, stop_reason, wire_id, wire_usage};

/// An Anthropic target's message → the form: text, tool calls and thinking (with
/// its signature, as it came). A call of the gateway's JSON tool is the answer's
/// text (`vocab::JSON_TOOL`), and an answer that is only that ends its turn.
/// Server-tool blocks have no place in the form: left out.
pub(in super::super) fn decode_answer(msg: &Map<String, Value>) -> Answer<'_> {
    let blocks = msg
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let mut json_answer = false;
    let content: Vec<Part<'_>> = blocks
        .iter()
        .filter_map(|b| match str_at(b, "type") {
            Some("text") => Some(Part::Text(str_at(b, "text").unwrap_or(""))),
            Some("tool_use") if str_at(b, "name") == Some(JSON_TOOL) => {
                json_answer = true;
                Some(Part::Json(tool_use(b).input))
            }
            Some("tool_use") => Some(Part::ToolUse(tool_use(b))),
            Some("thinking") => Some(Part::Reasoning(ReasoningText {
                text: str_at(b, "thinking").unwrap_or(""),
                signature: str_at(b, "signature"),
            })),
            Some("redacted_thinking") => {
                Some(Part::RedactedReasoning(str_at(b, "data").unwrap_or("")))
            }
            _ => None,
        })
        .collect();
    let calls = content.iter().any(|p| matches!(p, Part::ToolUse(_)));
    let stop = msg.get("stop_reason").and_then(Value::as_str).map(stop_of);
    Answer {
        id: Cow::Borrowed(bare_id(msg.get("id").and_then(Value::as_str).unwrap_or(""))),
        content,
        stop: match stop {
            Some(Stop::ToolUse) if json_answer && !calls => Some(Stop::EndTurn),
            other => other,
        },
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
        "content": answer_blocks(&a.content),
        "stop_reason": a.stop.map_or("end_turn", stop_reason),
        "stop_sequence": null,
        "usage": usage,
    })
}

/// An answer's blocks for an Anthropic client. Adjacent texts (parts a provider
/// splits its answer's text into, a JSON answer among them) are one text block, as
/// Anthropic writes one: the SDKs' `parse` reads a JSON answer from one block.
fn answer_blocks(parts: &[Part<'_>]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(parts.len());
    for p in parts {
        let block = answer_block(p);
        if let (Some(prev), Some(more)) = (out.last_mut(), block["text"].as_str())
            && block["type"] == "text"
            && prev["type"] == "text"
            && let Some(Value::String(text)) = prev.get_mut("text")
        {
            text.push_str(more);
            continue;
        }
        out.push(block);
    }
    out
}

/// One block of an answer to an Anthropic client: reasoning with the signature it
/// came with (empty when its provider signed none: never one made up), a JSON
/// answer as its text.
fn answer_block(p: &Part<'_>) -> Value {
    match p {
        Part::Reasoning(r) => json!({"type": "thinking", "thinking": r.text,
            "signature": r.signature.unwrap_or("")}),
        Part::Json(v) => json!({"type": "text", "text": v.to_string()}),
        other => block(other),
    }
}

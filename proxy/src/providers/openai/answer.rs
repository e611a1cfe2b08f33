//! Unary chat completions ↔ the form.

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use super::super::dialect::TranslateError;
use super::super::form::{Answer, Part, ReasoningText, Stop, ToolUse};
use super::super::vocab::{as_u64, str_at, tool_id, tool_input};
use super::request::assistant_message;
use super::shapes::{bare_id, finish_reason, form_usage, stop_of, wire_id, wire_usage};

/// An OpenAI target's chat completion → the form. The first choice is the answer; a
/// `refusal` is text whose stop reason is a refusal.
pub(in super::super) fn decode_answer(
    resp: &Map<String, Value>,
) -> Result<Answer<'_>, TranslateError> {
    let id = bare_id(resp.get("id").and_then(Value::as_str).unwrap_or(""));
    let choice = resp
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first());
    let mut content = Vec::new();
    let mut refused = false;
    if let Some(m) = choice.and_then(|c| c.get("message")) {
        // Reasoning text as vLLM, DeepSeek and others send it (no OpenAI field).
        let reasoning = str_at(m, "reasoning_content").or_else(|| str_at(m, "reasoning"));
        if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
            content.push(Part::Reasoning(ReasoningText {
                text: r,
                signature: None,
            }));
        }
        match m.get("content") {
            Some(Value::String(s)) if !s.is_empty() => content.push(Part::Text(s)),
            Some(Value::Array(parts)) => {
                content.extend(
                    parts
                        .iter()
                        .filter_map(|p| str_at(p, "text"))
                        .map(Part::Text),
                );
            }
            _ => {}
        }
        if let Some(r) = str_at(m, "refusal") {
            refused = true;
            content.push(Part::Text(r));
        }
        let calls = m.get("tool_calls").and_then(Value::as_array);
        for (n, call) in calls.into_iter().flatten().enumerate() {
            let f = call.get("function");
            let name = f.and_then(|f| f.get("name"));
            let args = f.and_then(|f| str_at(f, "arguments")).unwrap_or("");
            let Some(input) = tool_input(args) else {
                return Err(TranslateError::upstream(format!(
                    "the upstream returned arguments for tool {} that are not a JSON object",
                    name.unwrap_or(&Value::Null)
                )));
            };
            let id = match str_at(call, "id") {
                Some(s) if !s.is_empty() => Cow::Borrowed(s),
                _ => Cow::Owned(tool_id(id, n)),
            };
            content.push(Part::ToolUse(ToolUse {
                id,
                name: name.and_then(Value::as_str).unwrap_or(""),
                input: Cow::Owned(input),
            }));
        }
    }
    let stop = if refused {
        Stop::Refusal
    } else {
        choice
            .and_then(|c| str_at(c, "finish_reason"))
            .map_or(Stop::EndTurn, stop_of)
    };
    let usage = resp.get("usage").filter(|u| u.is_object()).map(|u| {
        form_usage(
            as_u64(&u["prompt_tokens"]),
            as_u64(&u["completion_tokens"]),
            as_u64(&u["prompt_tokens_details"]["cached_tokens"]),
        )
    });
    Ok(Answer {
        id: Cow::Borrowed(id),
        content,
        stop: Some(stop),
        usage,
    })
}

/// The form → an OpenAI client's chat completion, `model` = the client's name.
pub(in super::super) fn encode_answer(a: &Answer<'_>, client_model: &str, created: u64) -> Value {
    let mut message = assistant_message(&a.content);
    message.insert("refusal".into(), Value::Null);
    let mut out = json!({
        "id": wire_id(&a.id),
        "object": "chat.completion",
        "created": created,
        "model": client_model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": a.stop.map(finish_reason),
        }],
    });
    if let Some(u) = &a.usage {
        out["usage"] = json!(wire_usage(u));
    }
    out
}

//! Unary (non-streamed) 2xx bodies, upstream → client.

use serde_json::{Map, Value, json};

use super::TranslateError;
use super::vocab::{
    AnthropicCounts, AnthropicUsage, anthropic_id, as_u64, finish_reason, openai_assistant,
    openai_id, stop_reason, tool_id, tool_input,
};

fn parse(body: &[u8]) -> Result<Map<String, Value>, TranslateError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(TranslateError::upstream(
            "the upstream answered with a body that is not a JSON object",
        )),
    }
}

/// Anthropic usage → OpenAI usage.
pub(super) fn openai_usage(u: &Value) -> Value {
    json!(
        AnthropicCounts {
            input: as_u64(&u["input_tokens"]),
            output: as_u64(&u["output_tokens"]),
            cache_read: as_u64(&u["cache_read_input_tokens"]),
            cache_write: as_u64(&u["cache_creation_input_tokens"]),
        }
        .openai()
    )
}

/// OpenAI usage → Anthropic usage.
pub(super) fn anthropic_usage(u: &Value) -> Value {
    json!(AnthropicUsage::from_openai(
        as_u64(&u["prompt_tokens"]),
        as_u64(&u["completion_tokens"]),
        as_u64(&u["prompt_tokens_details"]["cached_tokens"]),
    ))
}

/// An Anthropic message → an OpenAI chat completion.
pub(super) fn messages_to_chat(
    body: &[u8],
    client_model: &str,
    created: u64,
) -> Result<Value, TranslateError> {
    let msg = parse(body)?;
    let id = msg.get("id").and_then(Value::as_str).unwrap_or("");
    let blocks = msg
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    // Thinking and server-tool blocks have no chat completions form (and translated
    // requests never ask for them): left out.
    let Ok::<_, std::convert::Infallible>(mut message) = openai_assistant(blocks, |_, _| Ok(()));
    message.insert("refusal".into(), Value::Null);
    let finish = msg
        .get("stop_reason")
        .and_then(Value::as_str)
        .map(finish_reason);
    let mut out = json!({
        "id": openai_id(id),
        "object": "chat.completion",
        "created": created,
        "model": client_model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish,
        }],
    });
    if let Some(u) = msg.get("usage").filter(|u| u.is_object()) {
        out["usage"] = openai_usage(u);
    }
    Ok(out)
}

/// An OpenAI chat completion → an Anthropic message.
pub(super) fn chat_to_messages(body: &[u8], client_model: &str) -> Result<Value, TranslateError> {
    let resp = parse(body)?;
    let id = anthropic_id(resp.get("id").and_then(Value::as_str).unwrap_or(""));
    let choice = resp
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first());
    let message = choice.and_then(|c| c.get("message"));
    let mut content = Vec::new();
    let mut refused = false;
    if let Some(m) = message {
        match m.get("content") {
            Some(Value::String(s)) if !s.is_empty() => {
                content.push(json!({"type": "text", "text": s}));
            }
            Some(Value::Array(parts)) => {
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        content.push(json!({"type": "text", "text": t}));
                    }
                }
            }
            _ => {}
        }
        if let Some(r) = m.get("refusal").and_then(Value::as_str) {
            refused = true;
            content.push(json!({"type": "text", "text": r}));
        }
        let calls = m.get("tool_calls").and_then(Value::as_array);
        for (n, call) in calls.into_iter().flatten().enumerate() {
            let f = call.get("function");
            let name = f.and_then(|f| f.get("name")).cloned().unwrap_or_default();
            let args = f
                .and_then(|f| f.get("arguments"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let Some(input) = tool_input(args) else {
                return Err(TranslateError::upstream(format!(
                    "the upstream returned arguments for tool {name} that are not a JSON object"
                )));
            };
            let call_id = match call.get("id").and_then(Value::as_str) {
                Some(s) if !s.is_empty() => s.to_owned(),
                _ => tool_id(&id, n),
            };
            content.push(json!({"type": "tool_use", "id": call_id, "name": name, "input": input}));
        }
    }
    let stop = if refused {
        "refusal"
    } else {
        choice
            .and_then(|c| c.get("finish_reason"))
            .and_then(Value::as_str)
            .map_or("end_turn", stop_reason)
    };
    let usage = resp
        .get("usage")
        .filter(|u| u.is_object())
        .map(anthropic_usage)
        .unwrap_or_else(|| json!({"input_tokens": 0, "output_tokens": 0}));
    Ok(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": client_model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage,
    }))
}

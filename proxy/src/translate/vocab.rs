//! The vocabulary both directions share: ids, stop and finish reasons, usage, data
//! URLs, and typed access to JSON objects.

use serde::Serialize;
use serde_json::{Map, Value};

use super::TranslateError;

pub(super) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// An OpenAI tool call's `arguments` string as an Anthropic `input` object: empty
/// means `{}`; anything but a JSON object is `None` (each side words its own error).
pub(super) fn tool_input(arguments: &str) -> Option<Value> {
    if arguments.trim().is_empty() {
        return Some(Value::Object(Map::new()));
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

/// `msg_X` → `chatcmpl-X`.
pub(super) fn openai_id(anthropic_id: &str) -> String {
    format!(
        "chatcmpl-{}",
        anthropic_id.strip_prefix("msg_").unwrap_or(anthropic_id)
    )
}

/// `chatcmpl-X` → `msg_X`.
pub(super) fn anthropic_id(openai_id: &str) -> String {
    format!(
        "msg_{}",
        openai_id.strip_prefix("chatcmpl-").unwrap_or(openai_id)
    )
}

/// An id for an upstream message that came without one.
pub(super) fn fresh_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// An id for an OpenAI tool call that came without one (some OpenAI-compatible
/// servers omit it): unique within the message.
pub(super) fn tool_id(message_id: &str, n: usize) -> String {
    let base = message_id
        .strip_prefix("msg_")
        .or_else(|| message_id.strip_prefix("chatcmpl-"))
        .unwrap_or(message_id);
    let base: String = base
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    format!("call_{base}_{n}")
}

/// Anthropic `stop_reason` → OpenAI `finish_reason`.
pub(super) fn finish_reason(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        // end_turn, stop_sequence, pause_turn and anything newer
        _ => "stop",
    }
}

/// OpenAI `finish_reason` → Anthropic `stop_reason`.
pub(super) fn stop_reason(finish_reason: &str) -> &'static str {
    match finish_reason {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

/// `data:<media type>;base64,<data>` → (media type, data).
pub(super) fn parse_data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let media = meta.strip_suffix(";base64")?;
    Some((media, data))
}

/// A JSON field that is present and not null.
pub(super) fn present<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

pub(super) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, TranslateError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(TranslateError::invalid(
            None,
            "the request body must be a JSON object",
        )),
        Err(e) => Err(TranslateError::invalid(
            None,
            format!("the request body is not valid JSON: {e}"),
        )),
    }
}

pub(super) fn as_u64(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Anthropic token counts, as a message or a stream reports them.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct AnthropicCounts {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl AnthropicCounts {
    /// OpenAI `usage`: cache reads and writes count in the prompt; reads are also
    /// reported apart.
    pub(super) fn openai(&self) -> OpenAiUsage {
        // Provider numbers: saturate rather than overflow.
        let prompt = self
            .input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write);
        OpenAiUsage {
            prompt_tokens: prompt,
            completion_tokens: self.output,
            total_tokens: prompt.saturating_add(self.output),
            prompt_tokens_details: Cached {
                cached_tokens: self.cache_read,
            },
        }
    }
}

/// OpenAI `usage`, unary and streamed alike.
#[derive(Serialize)]
pub(super) struct OpenAiUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: Cached,
}

#[derive(Serialize)]
struct Cached {
    cached_tokens: u64,
}

/// Anthropic `usage`, unary and streamed alike: both cache fields always present.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(super) struct AnthropicUsage {
    input_tokens: u64,
    output_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
}

impl AnthropicUsage {
    /// From OpenAI counts: cached tokens leave the input tokens (OpenAI counts them in
    /// the prompt); OpenAI reports no cache writes.
    pub(super) fn from_openai(prompt: u64, completion: u64, cached: u64) -> Self {
        Self {
            input_tokens: prompt.saturating_sub(cached),
            output_tokens: completion,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
        }
    }
}

/// Anthropic content blocks as an OpenAI assistant message (`role`, `content`, and
/// `tool_calls` when there are any), for answers and for assistant turns in a
/// request's history alike. Text blocks are joined; `content` is `null` only when
/// there are tool calls and no text. A block of another type goes to `other` with its
/// index: an error refuses the whole message, `Ok` leaves the block out.
pub(super) fn openai_assistant<E>(
    blocks: &[Value],
    mut other: impl FnMut(usize, Option<&str>) -> Result<(), E>,
) -> Result<Map<String, Value>, E> {
    let mut text = String::new();
    let mut has_text = false;
    let mut tool_calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                has_text = true;
                text.push_str(b.get("text").and_then(Value::as_str).unwrap_or(""));
            }
            Some("tool_use") => tool_calls.push(openai_tool_call(b)),
            ty => other(j, ty)?,
        }
    }
    let mut msg = Map::new();
    msg.insert("role".into(), "assistant".into());
    let content = if has_text || tool_calls.is_empty() {
        Value::String(text)
    } else {
        Value::Null
    };
    msg.insert("content".into(), content);
    if !tool_calls.is_empty() {
        msg.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    Ok(msg)
}

/// An Anthropic `tool_use` block as an OpenAI `tool_calls` entry (arguments as a
/// JSON string), for answers and for assistant turns in a request's history alike.
fn openai_tool_call(block: &Value) -> Value {
    let input = block
        .get("input")
        .cloned()
        .unwrap_or_else(|| serde_json::json!({}));
    serde_json::json!({
        "id": block.get("id").cloned().unwrap_or_default(),
        "type": "function",
        "function": {
            "name": block.get("name").cloned().unwrap_or_default(),
            "arguments": serde_json::to_string(&input).unwrap_or_default(),
        },
    })
}

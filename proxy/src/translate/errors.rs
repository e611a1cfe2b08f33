//! Error bodies, upstream shape → client shape, message kept word for word.

use serde_json::{Value, json};

use super::Direction;
use crate::outcome::is_context_length;

/// The longest raw (non-JSON) upstream body quoted as a message.
const MAX_RAW_MESSAGE: usize = 2048;

/// What an upstream error body says, whatever its shape.
struct Said {
    message: String,
    kind: Option<String>,
    code: Option<String>,
}

fn read(body: &[u8]) -> Said {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let err = &v["error"];
    let s = |x: &Value| x.as_str().map(str::to_owned);
    let message = s(&err["message"])
        .or_else(|| s(err)) // {"error": "text"}
        .or_else(|| s(&v["message"])) // vLLM: {"object":"error","message":...}
        .or_else(|| s(&v["detail"])) // FastAPI
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            let mut end = text.len().min(MAX_RAW_MESSAGE);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text[..end].to_owned()
        });
    let code = match &err["code"] {
        Value::String(c) => Some(c.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    Said {
        message,
        kind: s(&err["type"]).or_else(|| s(&v["type"]).filter(|t| t != "error")),
        code,
    }
}

fn default_message(status: u16) -> String {
    format!("the upstream answered {status}")
}

pub(super) fn translate(direction: Direction, status: u16, body: &[u8]) -> Value {
    let said = read(body);
    let message = if said.message.is_empty() {
        default_message(status)
    } else {
        said.message
    };
    match direction {
        Direction::OpenAiToAnthropic => {
            let (kind, code) = openai_kind(said.kind.as_deref(), status, is_context_length(body));
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
        Direction::AnthropicToOpenAi => {
            let context =
                said.code.as_deref() == Some("context_length_exceeded") || is_context_length(body);
            let message = if context && !message.contains("prompt is too long") {
                format!("prompt is too long: {message}")
            } else {
                message
            };
            let kind = if context {
                "invalid_request_error"
            } else {
                anthropic_kind(status)
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
    }
}

/// Anthropic error type (or the status) → OpenAI (type, code).
fn openai_kind(
    anthropic: Option<&str>,
    status: u16,
    context: bool,
) -> (&'static str, Option<&'static str>) {
    const INVALID: &str = "invalid_request_error";
    match anthropic {
        _ if context => (INVALID, Some("context_length_exceeded")),
        Some("invalid_request_error") => (INVALID, None),
        Some("authentication_error") => (INVALID, Some("invalid_api_key")),
        Some("permission_error") => (INVALID, Some("permission_denied")),
        Some("not_found_error") => (INVALID, Some("not_found")),
        Some("request_too_large") => (INVALID, Some("request_too_large")),
        Some("billing_error") => ("insufficient_quota", Some("insufficient_quota")),
        Some("rate_limit_error") => ("rate_limit_error", Some("rate_limit_exceeded")),
        Some("overloaded_error") => ("server_error", Some("overloaded")),
        Some("timeout_error") => ("server_error", Some("timeout")),
        Some("api_error") => ("server_error", None),
        _ => match status {
            429 => ("rate_limit_error", Some("rate_limit_exceeded")),
            400..=499 => (INVALID, None),
            _ => ("server_error", None),
        },
    }
}

/// Status → Anthropic error type.
fn anthropic_kind(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

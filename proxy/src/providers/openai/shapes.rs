//! OpenAI's chat completions shapes shared by its requests, answers and streams:
//! what a target takes, ids, finish reasons, usage, and error bodies both ways.

use super::super::error_body;
use super::super::form::{Error, ErrorClass, Stop, Target, Usage};
use crate::providers::classify::is_context_length;
use serde::Serialize;
use serde_json::{Value, json};

/// What an OpenAI (or OpenAI-compatible) target takes beyond the form's core.
pub(in crate::providers) const TARGET: Target = Target {
    name: "an OpenAI target",
    max_temperature: 2.0,
    top_k: false,
    image_urls: true,
    tool_result_names: false,
    // Chat completions' `file` parts take inline data or an uploaded file's id.
    document_urls: false,
    // Tool messages carry text only.
    tool_result_media: false,
    url_media_type: false,
};

/// `msg`-style bare id → `chatcmpl-X`.
pub(in crate::providers) fn wire_id(bare: &str) -> String {
    format!("chatcmpl-{bare}")
}

/// `chatcmpl-X` → the bare id.
pub(in crate::providers) fn bare_id(id: &str) -> &str {
    id.strip_prefix("chatcmpl-").unwrap_or(id)
}

pub(in crate::providers) fn finish_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::MaxTokens | Stop::ContextWindow => "length",
        Stop::ToolUse => "tool_calls",
        Stop::Refusal => "content_filter",
        Stop::EndTurn | Stop::Sequence | Stop::Pause => "stop",
    }
}

/// `finish_reason` → the form. OpenAI's `stop` cannot say whether a stop sequence
/// matched: it is a natural end.
pub(in crate::providers) fn stop_of(finish_reason: &str) -> Stop {
    match finish_reason {
        "length" => Stop::MaxTokens,
        "tool_calls" | "function_call" => Stop::ToolUse,
        "content_filter" => Stop::Refusal,
        _ => Stop::EndTurn,
    }
}

/// OpenAI `usage`, unary and streamed alike.
#[derive(Serialize)]
pub(super) struct WireUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: Cached,
}

#[derive(Serialize)]
struct Cached {
    cached_tokens: u64,
}

/// Cache reads and writes count in the prompt; reads are also reported apart.
pub(super) fn wire_usage(u: &Usage) -> WireUsage {
    // Provider numbers: saturate rather than overflow.
    let prompt = u
        .input
        .saturating_add(u.cache_read)
        .saturating_add(u.cache_write);
    WireUsage {
        prompt_tokens: prompt,
        completion_tokens: u.output,
        total_tokens: prompt.saturating_add(u.output),
        prompt_tokens_details: Cached {
            cached_tokens: u.cache_read,
        },
    }
}

/// Cached tokens leave the input (OpenAI counts them in the prompt); OpenAI reports no
/// cache writes.
pub(super) fn form_usage(prompt: u64, completion: u64, cached: u64) -> Usage {
    Usage {
        input: prompt.saturating_sub(cached),
        output: completion,
        cache_read: cached,
        cache_write: 0,
    }
}

/// An OpenAI error body → the form. OpenAI's types are coarse: the status says more.
pub(in crate::providers) fn decode_error(status: u16, body: &[u8]) -> Error {
    let said = error_body::read(status, body);
    let context =
        said.code.as_deref() == Some("context_length_exceeded") || is_context_length(body);
    let class = if context {
        ErrorClass::ContextLength
    } else if said.code.as_deref() == Some("model_not_found") {
        ErrorClass::ModelNotFound
    } else {
        match status {
            401 => ErrorClass::Authentication,
            402 => ErrorClass::Billing,
            403 => ErrorClass::Permission,
            404 => ErrorClass::NotFound,
            413 => ErrorClass::RequestTooLarge,
            429 => ErrorClass::RateLimit,
            503 | 529 => ErrorClass::Overloaded,
            504 => ErrorClass::Timeout,
            400..=499 => ErrorClass::InvalidRequest,
            _ => ErrorClass::Server,
        }
    };
    Error {
        class,
        message: said.message,
    }
}

/// The form → an OpenAI error body (`type` and `code` as OpenAI words them; context
/// overflow as `context_length_exceeded`, which clients look for).
pub(in crate::providers) fn encode_error(e: &Error) -> Value {
    const INVALID: &str = "invalid_request_error";
    let (kind, code) = match e.class {
        ErrorClass::ContextLength => (INVALID, Some("context_length_exceeded")),
        ErrorClass::InvalidRequest => (INVALID, None),
        ErrorClass::Authentication => (INVALID, Some("invalid_api_key")),
        ErrorClass::Permission => (INVALID, Some("permission_denied")),
        ErrorClass::NotFound => (INVALID, Some("not_found")),
        ErrorClass::ModelNotFound => (INVALID, Some("model_not_found")),
        ErrorClass::RequestTooLarge => (INVALID, Some("request_too_large")),
        ErrorClass::Billing => ("insufficient_quota", Some("insufficient_quota")),
        ErrorClass::RateLimit => ("rate_limit_error", Some("rate_limit_exceeded")),
        ErrorClass::Overloaded => ("server_error", Some("overloaded")),
        ErrorClass::Timeout => ("server_error", Some("timeout")),
        ErrorClass::Server => ("server_error", None),
    };
    json!({"error": {"message": e.message, "type": kind, "param": null, "code": code}})
}

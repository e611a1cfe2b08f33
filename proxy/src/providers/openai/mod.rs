//! The OpenAI chat completions adapter: requests, answers, stream chunks and error
//! bodies to and from the internal form, as a client surface (decode requests,
//! encode answers, chunks and errors) and as a provider (the reverse).

pub(super) mod adapter;
mod answer;
mod request;
mod stream;

use http::HeaderName;
use serde::Serialize;
use serde_json::{Map, Value, json};

pub(super) use answer::{decode_answer, encode_answer};
use request::assistant_message;
pub(super) use request::{decode_request, encode_request, include_usage};
pub(super) use stream::{StreamDecoder, StreamEncoder};

use super::dialect::{self, ClientDialect, Defaults, Dialect, TranslateError};
use super::error_body;
use super::form::{Answer, Error, ErrorClass, Request, Stop, Target, Usage};
use crate::providers::classify::is_context_length;
use crate::wire::surface::{Surface, Wire};

/// The OpenAI chat completions API: a client surface, and what openai,
/// openai-compatible and azure-openai targets answer in.
pub(crate) struct Chat;

pub(crate) static CHAT: Chat = Chat;

impl Dialect for Chat {
    fn target(&self) -> &'static Target {
        &TARGET
    }

    fn surface(&self) -> Option<Surface> {
        Some(Surface::ChatCompletions)
    }

    fn encode_request(
        &self,
        form: &Request<'_>,
        model: &str,
        defaults: &Defaults,
    ) -> Result<Value, TranslateError> {
        Ok(encode_request(form, model, defaults))
    }

    fn decode_answer<'a>(
        &self,
        answer: &'a Map<String, Value>,
    ) -> Result<Answer<'a>, TranslateError> {
        decode_answer(answer)
    }

    fn decode_error(&self, status: u16, body: &[u8]) -> Error {
        decode_error(status, body)
    }

    fn stream_decoder(&self) -> Box<dyn dialect::StreamDecoder> {
        Box::<StreamDecoder>::default()
    }

    /// OpenAI's own (`openai-beta`), none of Anthropic's.
    fn forwards(&self, name: &HeaderName) -> bool {
        !name.as_str().starts_with("anthropic-")
    }
}

impl ClientDialect for Chat {
    fn wire(&self) -> Wire {
        Wire::OpenAi
    }

    fn decode_request<'a>(
        &self,
        body: &'a Map<String, Value>,
        target: &Target,
    ) -> Result<Request<'a>, TranslateError> {
        decode_request(body, target)
    }

    fn encode_answer(&self, answer: &Answer<'_>, client_model: &str, created: u64) -> Value {
        encode_answer(answer, client_model, created)
    }

    fn encode_error(&self, e: &Error) -> Value {
        encode_error(e)
    }

    fn stream_encoder(
        &self,
        client_model: &str,
        created: u64,
        include_usage: bool,
    ) -> Box<dyn dialect::StreamEncoder> {
        Box::new(StreamEncoder::new(client_model, created, include_usage))
    }
}

/// What an OpenAI (or OpenAI-compatible) target takes beyond the form's core.
pub(super) const TARGET: Target = Target {
    name: "an OpenAI target",
    max_temperature: 2.0,
    top_k: false,
    image_urls: true,
    tool_result_names: false,
};

/// `msg`-style bare id → `chatcmpl-X`.
pub(super) fn wire_id(bare: &str) -> String {
    format!("chatcmpl-{bare}")
}

/// `chatcmpl-X` → the bare id.
pub(super) fn bare_id(id: &str) -> &str {
    id.strip_prefix("chatcmpl-").unwrap_or(id)
}

pub(super) fn finish_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::MaxTokens | Stop::ContextWindow => "length",
        Stop::ToolUse => "tool_calls",
        Stop::Refusal => "content_filter",
        Stop::EndTurn | Stop::Sequence | Stop::Pause => "stop",
    }
}

/// `finish_reason` → the form. OpenAI's `stop` cannot say whether a stop sequence
/// matched: it is a natural end.
pub(super) fn stop_of(finish_reason: &str) -> Stop {
    match finish_reason {
        "length" => Stop::MaxTokens,
        "tool_calls" | "function_call" => Stop::ToolUse,
        "content_filter" => Stop::Refusal,
        _ => Stop::EndTurn,
    }
}

/// OpenAI `usage`, unary and streamed alike.
#[derive(Serialize)]
struct WireUsage {
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
fn wire_usage(u: &Usage) -> WireUsage {
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
fn form_usage(prompt: u64, completion: u64, cached: u64) -> Usage {
    Usage {
        input: prompt.saturating_sub(cached),
        output: completion,
        cache_read: cached,
        cache_write: 0,
    }
}

/// An OpenAI error body → the form. OpenAI's types are coarse: the status says more.
pub(super) fn decode_error(status: u16, body: &[u8]) -> Error {
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
pub(super) fn encode_error(e: &Error) -> Value {
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

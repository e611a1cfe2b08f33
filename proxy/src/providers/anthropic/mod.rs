//! The Anthropic messages adapter: requests, answers, stream events and error bodies
//! to and from the internal form, as a client surface (decode requests, encode
//! answers, events and errors) and as a provider (the reverse).

pub(super) mod adapter;
mod answer;
mod request;
mod stream;

use http::HeaderName;
use serde::Serialize;
use serde_json::{Map, Value, json};

pub(super) use answer::{decode_answer, encode_answer};
pub(super) use request::{decode_request, encode_request};
pub(super) use stream::{StreamDecoder, StreamEncoder};

use super::dialect::{self, ClientDialect, Defaults, Dialect, TranslateError};
use super::error_body;
use super::form::{Answer, Error, ErrorClass, Request, Stop, Target, Usage};
use crate::providers::classify::is_context_length;
use crate::wire::surface::{Surface, Wire};

/// Anthropic's messages API: a client surface, and what anthropic targets (and
/// Claude on vertex) answer in.
pub(crate) struct Messages;

pub(crate) static MESSAGES: Messages = Messages;

impl Dialect for Messages {
    fn target(&self) -> &'static Target {
        &TARGET
    }

    fn surface(&self) -> Option<Surface> {
        Some(Surface::Messages)
    }

    fn encode_request(
        &self,
        form: &Request<'_>,
        model: &str,
        defaults: &Defaults,
    ) -> Result<Value, TranslateError> {
        let mut out = encode_request(form, model, defaults);
        if defaults.anthropic_on_vertex
            && let Value::Object(body) = &mut out
        {
            to_raw_predict(body);
        }
        Ok(out)
    }

    fn decode_answer<'a>(
        &self,
        answer: &'a Map<String, Value>,
    ) -> Result<Answer<'a>, TranslateError> {
        Ok(decode_answer(answer))
    }

    fn decode_error(&self, status: u16, body: &[u8]) -> Error {
        decode_error(status, body)
    }

    fn stream_decoder(&self) -> Box<dyn dialect::StreamDecoder> {
        Box::<StreamDecoder>::default()
    }

    /// Anthropic's own (`anthropic-version`, `anthropic-beta`), not OpenAI's.
    fn forwards(&self, name: &HeaderName) -> bool {
        name != "openai-beta"
    }
}

impl ClientDialect for Messages {
    fn wire(&self) -> Wire {
        Wire::Anthropic
    }

    fn decode_request<'a>(
        &self,
        body: &'a Map<String, Value>,
        target: &Target,
    ) -> Result<Request<'a>, TranslateError> {
        decode_request(body, target)
    }

    fn encode_answer(&self, answer: &Answer<'_>, client_model: &str, _created: u64) -> Value {
        encode_answer(answer, client_model)
    }

    fn encode_error(&self, e: &Error) -> Value {
        encode_error(e)
    }

    fn stream_encoder(
        &self,
        client_model: &str,
        _created: u64,
        _include_usage: bool,
    ) -> Box<dyn dialect::StreamEncoder> {
        Box::new(StreamEncoder::new(client_model))
    }
}

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

/// What an Anthropic target takes beyond the form's core.
pub(super) const TARGET: Target = Target {
    name: "an Anthropic target",
    // Anthropic's range is 0–1.
    max_temperature: 1.0,
    top_k: true,
    image_urls: true,
    tool_result_names: false,
};

/// A bare id → `msg_X`.
pub(super) fn wire_id(bare: &str) -> String {
    format!("msg_{bare}")
}

/// `msg_X` → the bare id.
pub(super) fn bare_id(id: &str) -> &str {
    id.strip_prefix("msg_").unwrap_or(id)
}

pub(super) fn stop_reason(stop: Stop) -> &'static str {
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

pub(super) fn stop_of(stop_reason: &str) -> Stop {
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
struct WireUsage {
    input_tokens: u64,
    output_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
}

fn wire_usage(u: &Usage) -> WireUsage {
    WireUsage {
        input_tokens: u.input,
        output_tokens: u.output,
        cache_creation_input_tokens: u.cache_write,
        cache_read_input_tokens: u.cache_read,
    }
}

/// An Anthropic error body → the form, by its `error.type`; without a known type
/// only the broad class follows from the status.
pub(super) fn decode_error(status: u16, body: &[u8]) -> Error {
    // Anthropic on Vertex AI: the platform's own refusals (quota, auth, a model not
    // enabled) come in Google's shape, `{"error":{"code","message","status"}}`.
    if is_google_error(body) {
        return super::gemini::decode_error(status, body);
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
pub(super) fn is_google_error(body: &[u8]) -> bool {
    if memchr::memmem::find(body, b"\"status\"").is_none() {
        return false;
    }
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    v["error"]["status"].is_string() && v["type"].is_null()
}

/// The form → an Anthropic error body. A context overflow's message gets the wording
/// Anthropic clients look for.
pub(super) fn encode_error(e: &Error) -> Value {
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

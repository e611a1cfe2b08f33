//! Anthropic (`provider: anthropic`): the messages dialect (`MESSAGES`: requests,
//! answers, stream events and error bodies to and from the internal form, as a
//! client surface (decode requests, encode answers, events and errors) and as a
//! provider (the reverse); also what Claude on Vertex AI answers in, with its
//! `rawPredict` body and Google-shaped refusals), the provider's adapter
//! (`adapter`: the messages URL, `x-api-key` and `anthropic-version`), and the
//! prefill that continues an answer (`prefill`, docs/streaming.md#resume-after-commit;
//! Claude on Vertex's too).

pub(super) mod adapter;
mod answer;
pub(super) mod prefill;
mod request;
mod shapes;
mod stream;

use http::HeaderName;
use serde_json::{Map, Value};

use super::dialect::{self, ClientDialect, Defaults, Dialect, TranslateError};
use super::form::{Answer, Error, Fetched, Request, Target};
use crate::wire::surface::{Surface, Wire};

pub(super) use answer::{decode_answer, encode_answer};
pub(super) use request::{decode_request, encode_request, fit_budget, reasoning_gives_way};
pub(super) use shapes::{
    TARGET, decode_error, drop_unsigned_thinking, encode_error, is_google_error, to_raw_predict,
    without_unsigned_thinking,
};
/// The words the translation's tests compose across dialects.
#[cfg(test)]
pub(super) use shapes::{bare_id, stop_of, stop_reason, wire_id};
pub(super) use stream::{StreamDecoder, StreamEncoder};

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
        let mut out = encode_request(form, model, defaults)?;
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
        fetched: &'a Fetched,
    ) -> Result<Request<'a>, TranslateError> {
        decode_request(body, target, fetched)
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

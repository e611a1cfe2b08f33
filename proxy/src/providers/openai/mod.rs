//! OpenAI (`provider: openai`, `openai-compatible`): the chat completions dialect
//! (`CHAT`: requests, answers, stream chunks and error bodies to and from the
//! internal form, as a client surface (decode requests, encode answers, chunks and
//! errors) and as a provider (the reverse); azure-openai's too), and the provider's
//! adapter (`adapter`: the surfaces' URLs, the Bearer key).

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
pub(super) use request::{decode_request, encode_request, include_usage};
pub(super) use shapes::{TARGET, decode_error, encode_error};
/// The words the translation's tests compose across dialects.
#[cfg(test)]
pub(super) use shapes::{bare_id, finish_reason, stop_of, wire_id};
pub(super) use stream::{StreamDecoder, StreamEncoder};

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
        fetched: &'a Fetched,
    ) -> Result<Request<'a>, TranslateError> {
        decode_request(body, target, fetched)
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

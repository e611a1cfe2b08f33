//! What a dialect is: the contract between the translation and one API's adapter.
//! An upstream API ([`Dialect`]) encodes requests from the internal form and decodes
//! its answers, errors and stream events into it, and says how its wire reads on the
//! stream path (framing, which events carry content, where usage is, how errors are
//! typed). A client API ([`ClientDialect`], OpenAI chat and Anthropic messages) does
//! the reverse halves. Each API implements them once, in its provider's folder; the
//! translation (`translate`) pairs a client's with an upstream's, and the pipeline
//! reads the wire through the upstream's.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName};
use serde_json::{Map, Value, json};

use super::form::{Answer, Error, Event, Fetched, Request, Target};
use crate::wire::sse::{self, Framer, Opening};
use crate::wire::surface::{Surface, Wire};
use crate::wire::usage::{self, Usage};

/// An API a provider answers in: requests encoded into it, answers, errors and
/// streams decoded from it, and its wire's habits on the stream path. The defaults
/// are those of the client APIs (SSE framing, their event shapes, their `usage`).
pub trait Dialect: Sync {
    /// What it takes beyond the form's core (decoders refuse the rest).
    fn target(&self) -> &'static Target;

    /// The client surface this API also is, if it is one (OpenAI chat completions,
    /// Anthropic messages): a client of that surface is relayed, not translated.
    fn surface(&self) -> Option<Surface>;

    /// The form → a request body for `model` (`None` for APIs whose URL names the
    /// model). May refuse what the API cannot take in this combination.
    fn encode_request(
        &self,
        form: &Request<'_>,
        model: &str,
        defaults: &Defaults,
    ) -> Result<Value, TranslateError>;

    /// A 2xx unary answer → the form.
    fn decode_answer<'a>(
        &self,
        answer: &'a Map<String, Value>,
    ) -> Result<Answer<'a>, TranslateError>;

    /// An error body → the form (its message kept word for word).
    fn decode_error(&self, status: u16, body: &[u8]) -> Error;

    /// A fresh decoder for one stream.
    fn stream_decoder(&self) -> Box<dyn StreamDecoder>;

    /// What an event of a stream's opening means for the commit
    /// (docs/request-lifecycle.md#streams-the-commit-point).
    fn opening(&self, event: &[u8]) -> Opening {
        sse::opening(event)
    }

    /// The token counts a unary answer or a stream event reports.
    fn usage(&self, doc: &[u8]) -> Option<Usage> {
        usage::usage(doc)
    }

    /// The content type of its streams.
    fn stream_type(&self) -> &'static str {
        "text/event-stream"
    }

    /// A framer cutting its streams into events (SSE unless its framing differs).
    fn framer(&self, max_event: usize) -> Framer {
        Framer::new(max_event)
    }

    /// An error answer as the rest of the pipeline reads it: the status to classify
    /// by, and the body (an API that types errors in a header writes it in).
    fn error_answer(&self, status: u16, _headers: &HeaderMap, body: Bytes) -> (u16, Bytes) {
        (status, body)
    }

    /// A 2xx unary answer that is no answer: the prompt was blocked (class
    /// `contentFilter`).
    fn is_blocked(&self, _answer: &[u8]) -> bool {
        false
    }

    /// Whether the client header `name` (one of the few the proxy passes on:
    /// `anthropic-version`, `anthropic-beta`, `openai-beta`) is one of this API's.
    fn forwards(&self, _name: &HeaderName) -> bool {
        false
    }
}

/// An API clients speak: their requests decoded into the form, answers, errors and
/// streams encoded from it.
pub trait ClientDialect: Sync {
    /// The client wire (its error shapes).
    fn wire(&self) -> Wire;

    /// A client body → the form, refusing (with the client's parameter path) what
    /// `target` cannot take. An image or document by URL that the target cannot
    /// fetch is taken from `fetched`, or refused naming the URL
    /// ([`TranslateError::fetch`]).
    fn decode_request<'a>(
        &self,
        body: &'a Map<String, Value>,
        target: &Target,
        fetched: &'a Fetched,
    ) -> Result<Request<'a>, TranslateError>;

    /// The form → the client's answer, `model` = the name the client sent.
    fn encode_answer(&self, answer: &Answer<'_>, client_model: &str, created: u64) -> Value;

    /// The form → the client's error body.
    fn encode_error(&self, e: &Error) -> Value;

    /// A fresh encoder for one stream.
    fn stream_encoder(
        &self,
        client_model: &str,
        created: u64,
        include_usage: bool,
    ) -> Box<dyn StreamEncoder>;
}

/// One upstream stream's decoder: each event's `data` into form events, as they come.
pub trait StreamDecoder: Send {
    fn decode(&mut self, data: &[u8], emit: &mut dyn FnMut(Event<'_>));
}

/// One client stream's encoder: form events into client SSE events, appended.
pub trait StreamEncoder: Send {
    /// Writes `ev`; `true` once the client stream is complete (later events are
    /// ignored).
    fn encode(&mut self, ev: Event<'_>, out: &mut BytesMut) -> bool;

    /// Whether the stop reason is known (the stream can be completed).
    fn stopped(&self) -> bool;

    /// Completes a stream whose last events never came.
    fn end(&mut self, out: &mut BytesMut);

    /// Fix the `created` stamp its events carry, where they carry one.
    fn set_created(&mut self, _created: u64) {}
}

/// Per-route (or per-credential) choices the wire formats leave open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// `max_tokens` sent to an Anthropic target when the OpenAI client set no limit
    /// (Anthropic requires one). Default 4096.
    pub max_tokens: u32,
    /// Send an Anthropic client's `max_tokens` to an OpenAI target as
    /// `max_completion_tokens` (required by OpenAI's reasoning models) instead of
    /// `max_tokens` (what OpenAI-compatible servers read). Default false; set it for
    /// `provider: openai` targets.
    pub openai_max_completion_tokens: bool,
    /// An Anthropic target on Vertex AI (`rawPredict`): the body carries
    /// `anthropic_version` and no `model` (see `anthropic::to_raw_predict`).
    pub anthropic_on_vertex: bool,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            max_tokens: 4096,
            openai_max_completion_tokens: false,
            anthropic_on_vertex: false,
        }
    }
}

/// A request the target cannot serve (400), or an upstream answer that cannot be
/// expressed to the client (502).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TranslateError {
    status: u16,
    param: Option<String>,
    message: String,
    /// The target's API has no equivalent for something the request needs (another
    /// target may have one); otherwise the request is malformed whatever the target.
    feature: bool,
    /// A URL the target cannot fetch itself: the gateway may fetch it and translate
    /// again with its bytes (see `form::Fetched`).
    fetch: Option<String>,
}

impl TranslateError {
    pub(crate) fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            param: Some(param.into()),
            message: message.into(),
            feature: true,
            fetch: None,
        }
    }

    /// The target needs the bytes behind `url`, which it cannot fetch itself; a
    /// feature it lacks unless the gateway fetches them.
    pub(crate) fn needs_fetch(
        param: impl Into<String>,
        message: impl Into<String>,
        url: &str,
    ) -> Self {
        Self {
            fetch: Some(url.to_owned()),
            ..Self::unsupported(param, message)
        }
    }

    /// The error with `note` added to its message.
    pub fn noted(mut self, note: &str) -> Self {
        self.message.push_str("; ");
        self.message.push_str(note);
        self
    }

    /// The URL whose bytes the target needs (see `TranslateError::needs_fetch`).
    pub fn fetch(&self) -> Option<&str> {
        self.fetch.as_deref()
    }

    pub(crate) fn invalid(param: Option<String>, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            param,
            message: message.into(),
            feature: false,
            fetch: None,
        }
    }

    pub(crate) fn upstream(message: impl Into<String>) -> Self {
        Self {
            status: 502,
            param: None,
            message: message.into(),
            feature: false,
            fetch: None,
        }
    }

    /// A feature the target's API has no equivalent for (the target is skipped as
    /// `unsupportedFeature`, docs/translation.md#a-target-that-cannot-serve-a-feature), not
    /// a malformed request.
    pub fn is_feature(&self) -> bool {
        self.feature
    }

    /// 400 for a request, 502 for an upstream answer.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The client parameter at fault (a path such as `messages[2].content[0].type`).
    pub fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// A short machine-readable code for error bodies and logs.
    pub fn code(&self) -> &'static str {
        if self.status >= 500 {
            "untranslatable_response"
        } else {
            "unsupported_parameter"
        }
    }

    /// The error in the client's shape (OpenAI's carries `param`).
    pub fn body(&self, client: Wire) -> Bytes {
        let body = match client {
            Wire::OpenAi => json!({"error": {
                "message": self.message(),
                "type": if self.status() >= 500 { "server_error" } else { "invalid_request_error" },
                "param": self.param(),
                "code": self.code(),
            }}),
            Wire::Anthropic => json!({"type": "error", "error": {
                "type": if self.status() >= 500 { "api_error" } else { "invalid_request_error" },
                "message": self.message(),
            }}),
        };
        Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
    }
}

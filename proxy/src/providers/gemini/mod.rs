//! Gemini (`provider: gemini`): Google AI's native `generateContent` API, its
//! dialect (`GENERATE_CONTENT`, also what Google's models on Vertex AI answer in)
//! and the provider's adapter (`adapter`: the `x-goog-api-key` header and the URLs
//! that name the model and the method).
//!
//! Gemini's shapes: `contents[{role: user|model, parts}]` with `text`, `inlineData`,
//! `functionCall {name, args}` and `functionResponse {name, response}` parts,
//! `systemInstruction`, `tools[{functionDeclarations}]`, `toolConfig`,
//! `generationConfig`; answers are `candidates[0].content.parts` with a
//! `finishReason`, `usageMetadata` and, when the prompt itself was blocked, only
//! `promptFeedback.blockReason`.
//!
//! # The mapping
//!
//! Gemini (Google AI's native `generateContent`) is a provider only. Its adapter
//! encodes the form: the system prompt → `systemInstruction`; turns → `contents`
//! (`user` / `model`, consecutive turns of one role merged, empty text parts left
//! out); text, base64 images and PDFs → `text` / `inlineData`; tool calls →
//! `functionCall {name, args}`; tool results → `functionResponse {name, response}`,
//! `response` the result itself when it is a JSON object, else `{"output": text}`
//! (`{"error": text}` when the client flagged an error), the name
//! taken from the call with the result's id earlier in the conversation; tools → one
//! `functionDeclarations` list, each schema sent as `parametersJsonSchema` (JSON
//! Schema as the client wrote it); `tool_choice` → `functionCallingConfig.mode`
//! `AUTO` / `NONE` / `ANY` (a named tool: `ANY` with `allowedFunctionNames`);
//! sampling, the output limit and stop sequences → `generationConfig`. The model and
//! whether to stream are in the URL, never the body. Its `form::Target` says what the
//! decoders refuse beyond the Anthropic-like core: images by URL (only inline bytes)
//! and tool results whose call is not in the conversation (they could not name their
//! function). `parallel_tool_calls: false` and the end-user id are dropped (no
//! equivalent); `top_k` is taken from Anthropic clients; temperatures up to 2.
//!
//! Answers: the first candidate's text and `functionCall` parts (thought parts left
//! out); `responseId` is the id; calls get ids `call_{responseId}_{n}` (Gemini gives
//! none), the same unary and streamed, so results can name them back; `finishReason`
//! `STOP` → end turn (tool use when the answer calls a function), `MAX_TOKENS` → max
//! tokens, `SAFETY` / `RECITATION` / `BLOCKLIST` / `PROHIBITED_CONTENT` / `SPII` (and
//! the image variants) → refusal; a prompt blocked before any candidate
//! (`promptFeedback.blockReason`) → an empty answer stopped as a refusal (the
//! pipeline classes it `contentFilter`, see `is_blocked` and `opening`). Usage:
//! `promptTokenCount` less `cachedContentTokenCount` in, cached tokens as cache reads,
//! `candidatesTokenCount` + `thoughtsTokenCount` out. Errors: by `error.status`
//! (`RESOURCE_EXHAUSTED` → rate limit, `UNAVAILABLE` → overloaded, `NOT_FOUND`,
//! `PERMISSION_DENIED`, `UNAUTHENTICATED`, `DEADLINE_EXCEEDED`, `INTERNAL`), with
//! Google's context-length wording and `API_KEY_INVALID` recognised first. Streams:
//! `alt=sse` chunks of whole parts, no `[DONE]`; the client's stream is completed by
//! `StreamTranslator::finish` once a finish reason came.
//!

pub(super) mod adapter;
mod request;
mod shapes;
mod stream;

use serde_json::{Map, Value};

use super::dialect::{self, Defaults, Dialect, TranslateError};
use super::form::{Answer, Error, Request, Target};
use crate::wire::sse::Opening;
use crate::wire::surface::Surface;
use crate::wire::usage;

pub(super) use request::encode_request;
pub(super) use shapes::{TARGET, decode_answer, decode_error, is_blocked, usage_metadata};
pub(super) use stream::{StreamDecoder, opening};

/// Google AI's `generateContent`: what gemini targets, and Google's models on
/// vertex, answer in. No client surface.
pub(crate) struct GenerateContent;

pub(crate) static GENERATE_CONTENT: GenerateContent = GenerateContent;

impl Dialect for GenerateContent {
    fn target(&self) -> &'static Target {
        &TARGET
    }

    fn surface(&self) -> Option<Surface> {
        None
    }

    /// The model and whether to stream are in the URL, never the body.
    fn encode_request(
        &self,
        form: &Request<'_>,
        model: &str,
        _defaults: &Defaults,
    ) -> Result<Value, TranslateError> {
        encode_request(form, model)
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

    fn opening(&self, event: &[u8]) -> Opening {
        opening(event)
    }

    fn usage(&self, doc: &[u8]) -> Option<usage::Usage> {
        usage_metadata(doc)
    }

    /// A prompt blocked by Google's safety filters (no candidate,
    /// `promptFeedback.blockReason`).
    fn is_blocked(&self, answer: &[u8]) -> bool {
        memchr::memmem::find(answer, b"blockReason").is_some()
            && super::vocab::parse_answer(answer).is_ok_and(|a| is_blocked(&a))
    }
}

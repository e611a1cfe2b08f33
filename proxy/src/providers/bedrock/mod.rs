//! Amazon Bedrock (`provider: bedrock`): the Converse API's dialect (`CONVERSE`),
//! ConverseStream's AWS event-stream framing (`eventstream`), SigV4 request signing
//! (`sigv4`) and the provider's adapter (`adapter`: the region's endpoint, URLs that
//! name the model, the keys from the whole Secret).
//!
//! Converse's shapes: `messages[{role: user|assistant, content}]` with `text`,
//! `image {format, source.bytes}`, `document`, `toolUse {toolUseId, name, input}`
//! and `toolResult {toolUseId, content, status}` blocks, `system[{text}]`,
//! `toolConfig {tools[{toolSpec {name, description, inputSchema.json}}],
//! toolChoice}`, `inferenceConfig {maxTokens, temperature, topP, stopSequences}`;
//! answers are `output.message.content` with a `stopReason` and `usage
//! {inputTokens, outputTokens}`; errors `{"message"}` with the type in the
//! `x-amzn-errortype` header (written into the body as `__type`, see
//! `with_error_type`). Streams arrive in AWS event-stream framing, which
//! `eventstream` turns into one SSE event per frame before anything here reads it.
//!
//! # The mapping
//!
//! Bedrock (Amazon Bedrock's `Converse` / `ConverseStream`) is a provider only. Its
//! adapter encodes the form: the system prompt → `system` text blocks; turns →
//! `messages` (`user` / `assistant`, consecutive turns of one role merged, empty
//! text left out, as Converse refuses blank text); text → `text`; base64 images →
//! `image {format, source.bytes}` (the format from the media type: png, jpeg, gif,
//! webp); PDFs → `document {format, name, source.bytes}` (the name is the title
//! cleaned to what Converse allows, else `document-N`); tool calls → `toolUse
//! {toolUseId, name, input}`; tool results → `toolResult {toolUseId, content:
//! [{text}], status: "error"?}`; tools → `toolConfig.tools[].toolSpec` with the
//! client's JSON Schema as `inputSchema.json`; `tool_choice` `auto` / `required` /
//! named → `toolChoice` `auto` / `any` / `tool`; `none` → no `toolConfig` at all
//! (Converse has no "none"); `max_tokens`, `temperature`, `top_p`, stop sequences →
//! `inferenceConfig {maxTokens, temperature, topP, stopSequences}`. The model and
//! whether to stream are in the URL. Refused with a 400 naming the client's
//! parameter: `top_k` (no Converse field), temperatures above 1, images by URL, and
//! `tool_choice: none` in a conversation that holds tool calls or results (Bedrock
//! requires `toolConfig` then, and could call a tool). `parallel_tool_calls: false`
//! and the end-user id are dropped (no equivalent).
//!
//! Answers: `output.message.content` text and `toolUse` blocks (ids kept as Bedrock
//! made them); an id is made up (Converse gives none); `stopReason` `end_turn` →
//! end turn, `tool_use` → tool use, `max_tokens` → max tokens, `stop_sequence` →
//! stop sequence, `guardrail_intervened` / `content_filtered` → refusal,
//! `model_context_window_exceeded` → context window. Usage: `inputTokens` in,
//! `outputTokens` out, `cacheReadInputTokens` / `cacheWriteInputTokens` as cache reads
//! and writes. Errors: by the type the `x-amzn-errortype` header named (copied into
//! the body as `__type`, see `with_error_type`): `ThrottlingException` → rate limit,
//! `ServiceUnavailableException` / `ModelNotReadyException` → overloaded,
//! `ValidationException` → invalid request unless it says the input is too long
//! (context length), `AccessDeniedException` → permission,
//! `UnrecognizedClientException` and the signature errors → authentication,
//! `ResourceNotFoundException` for a model → model not found. Streams: each binary
//! frame becomes one SSE event before the decoder sees it (`eventstream`); tool
//! input arrives as JSON text fragments; `metadata` (usage) after `messageStop`
//! completes the answer; an exception frame is an in-band error.
//!

pub(super) mod adapter;
pub(super) mod eventstream;
mod prefill;
mod request;
mod shapes;
pub(super) mod sigv4;
mod stream;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Map, Value};

use super::dialect::{self, Defaults, Dialect, TranslateError};
use super::form::{Answer, Error, FormatKind, Part, Request, Target, ToolChoice};
use super::vocab::refuse;
use crate::wire::sse::{Framer, Opening};
use crate::wire::surface::Surface;
use crate::wire::usage;

pub(super) use request::encode_request;
pub(super) use shapes::{
    TARGET, class_status, converse_usage, decode_answer, decode_error, with_error_type,
};
pub(super) use stream::{StreamDecoder, opening};

/// Amazon Bedrock's Converse API: what bedrock targets answer in. No client surface.
pub(crate) struct Converse;

pub(crate) static CONVERSE: Converse = Converse;

impl Dialect for Converse {
    fn target(&self) -> &'static Target {
        &TARGET
    }

    fn surface(&self) -> Option<Surface> {
        None
    }

    /// The model and whether to stream are in the URL. Converse has no "none" tool
    /// choice: leaving the tools out serves it only without tool blocks in the
    /// conversation (Bedrock then requires `toolConfig`), so that case is refused.
    fn encode_request(
        &self,
        form: &Request<'_>,
        model: &str,
        defaults: &Defaults,
    ) -> Result<Value, TranslateError> {
        let tool_blocks = form.messages.iter().any(|m| {
            m.content
                .iter()
                .any(|p| matches!(p, Part::ToolUse(_) | Part::ToolResult(_)))
        });
        let json_tool = matches!(
            form.format.as_ref().map(|f| &f.kind),
            Some(FormatKind::JsonObject)
        );
        if form.tool_choice == Some(ToolChoice::None) && tool_blocks && !json_tool {
            return Err(refuse(
                "tool_choice",
                "tool_choice none in a conversation with tool calls (Converse has no \"none\" and requires the tools then)",
                &TARGET,
            ));
        }
        encode_request(form, model, defaults)
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
        converse_usage(doc)
    }

    fn stream_type(&self) -> &'static str {
        "application/vnd.amazon.eventstream"
    }

    /// One SSE event per event-stream frame (see `eventstream`).
    fn framer(&self, max_event: usize) -> Framer {
        Framer::reframed(max_event, Box::<eventstream::Reframer>::default())
    }

    /// The type the `x-amzn-errortype` header named written into the body
    /// (`__type`), and the status that classes it (see [`class_status`]: a model
    /// still loading is overload, a model's own failure a server error).
    fn error_answer(&self, status: u16, headers: &HeaderMap, body: Bytes) -> (u16, Bytes) {
        let header = headers
            .get("x-amzn-errortype")
            .and_then(|v| v.to_str().ok());
        let body = with_error_type(header, &body);
        let kind = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("__type").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_default();
        (class_status(status, &kind), body)
    }
}

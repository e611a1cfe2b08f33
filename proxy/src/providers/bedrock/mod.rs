//! Amazon Bedrock (`provider: bedrock`): the Converse API's dialect ([`CONVERSE`]),
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
//! [`with_error_type`]). Streams arrive in AWS event-stream framing, which
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
//! the body as `__type`, see [`with_error_type`]): `ThrottlingException` → rate limit,
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
mod request;
pub(super) mod sigv4;
mod stream;

use std::borrow::Cow;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Map, Value};

pub(super) use request::encode_request;
pub(super) use stream::{StreamDecoder, opening};

use super::dialect::{self, Defaults, Dialect, TranslateError};
use super::form::{
    Answer, Error, ErrorClass, Part, Request, Stop, Target, ToolChoice, ToolUse, Usage,
};
use super::vocab::{as_u64, fresh_id, refuse, str_at};
use crate::providers::classify::is_context_length;
use crate::wire::sse::{Framer, Opening};
use crate::wire::surface::Surface;
use crate::wire::usage;

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
        _model: &str,
        _defaults: &Defaults,
    ) -> Result<Value, TranslateError> {
        let tool_blocks = form.messages.iter().any(|m| {
            m.content
                .iter()
                .any(|p| matches!(p, Part::ToolUse(_) | Part::ToolResult(_)))
        });
        if form.tool_choice == Some(ToolChoice::None) && tool_blocks {
            return Err(refuse(
                "tool_choice",
                "tool_choice none in a conversation with tool calls (Converse has no \"none\" and requires the tools then)",
                &TARGET,
            ));
        }
        Ok(encode_request(form))
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

/// What a Bedrock target takes beyond the form's core.
pub(super) const TARGET: Target = Target {
    name: "a Bedrock target",
    // Converse's `inferenceConfig.temperature` is 0–1 for every model family.
    max_temperature: 1.0,
    // `topK` is no Converse field (only a model-specific additional field).
    top_k: false,
    // Only inline bytes (or S3 locations): Bedrock fetches no URL.
    image_urls: false,
    // `toolResult` names its call by `toolUseId`.
    tool_result_names: false,
};

/// `stopReason` → the form.
pub(super) fn stop_of(reason: &str) -> Stop {
    match reason {
        "tool_use" => Stop::ToolUse,
        "max_tokens" => Stop::MaxTokens,
        "stop_sequence" => Stop::Sequence,
        "guardrail_intervened" | "content_filtered" => Stop::Refusal,
        "model_context_window_exceeded" => Stop::ContextWindow,
        // end_turn, and reasons newer than this list.
        _ => Stop::EndTurn,
    }
}

/// `usage` → the form: `inputTokens` excludes cache reads and writes, which Bedrock
/// counts apart (`cacheReadInputTokens`, `cacheWriteInputTokens`), as the form does.
pub(super) fn usage_of(u: &Value) -> Usage {
    Usage {
        input: as_u64(&u["inputTokens"]),
        output: as_u64(&u["outputTokens"]),
        cache_read: as_u64(&u["cacheReadInputTokens"]),
        cache_write: as_u64(&u["cacheWriteInputTokens"]),
    }
}

fn tool_use(call: &Value) -> ToolUse<'_> {
    ToolUse {
        id: match str_at(call, "toolUseId") {
            Some(id) if !id.is_empty() => Cow::Borrowed(id),
            _ => Cow::Owned(fresh_id()),
        },
        name: str_at(call, "name").unwrap_or(""),
        input: match call.get("input") {
            Some(a @ Value::Object(_)) => Cow::Borrowed(a),
            _ => Cow::Owned(Value::Object(Map::new())),
        },
    }
}

/// A `ConverseResponse` → the form. Converse gives no id: one is made. Reasoning
/// blocks are left out (translated requests never ask for them).
pub(in super::super) fn decode_answer(resp: &Map<String, Value>) -> Answer<'_> {
    let blocks = resp
        .get("output")
        .and_then(|o| o.get("message"))
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let mut content = Vec::with_capacity(blocks.len());
    for b in blocks {
        if let Some(t) = str_at(b, "text") {
            if !t.is_empty() {
                content.push(Part::Text(t));
            }
        } else if let Some(call) = b.get("toolUse") {
            content.push(Part::ToolUse(tool_use(call)));
        }
    }
    let calls = content.iter().any(|p| matches!(p, Part::ToolUse(_)));
    let stop = match resp.get("stopReason").and_then(Value::as_str) {
        Some(r) => stop_of(r),
        None if calls => Stop::ToolUse,
        None => Stop::EndTurn,
    };
    Answer {
        id: Cow::Owned(fresh_id()),
        content,
        stop: Some(stop),
        usage: resp.get("usage").filter(|u| u.is_object()).map(usage_of),
    }
}

/// The error type of an `x-amzn-errortype` header value
/// (`ThrottlingException:http://internal.amazon.com/...`) or a body's `__type`
/// (`com.amazon.bedrock#ValidationException`): the bare name.
pub(crate) fn error_type(raw: &str) -> &str {
    let raw = raw.split(':').next().unwrap_or(raw);
    raw.rsplit('#').next().unwrap_or(raw).trim()
}

/// A Bedrock error body with its type written in (`__type`), as the header said,
/// so that the body alone classifies it (`decode_error`, `classify::classify_status`
/// and the attempt log see only status and body). A body that is not a JSON object
/// becomes `{"message": <its text>}`.
pub(crate) fn with_error_type(header: Option<&str>, body: &[u8]) -> bytes::Bytes {
    let mut v = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => m,
        _ => {
            let mut m = Map::new();
            m.insert(
                "message".into(),
                String::from_utf8_lossy(body).trim().to_string().into(),
            );
            m
        }
    };
    // AWS JSON errors sometimes spell it `Message`.
    if !v.contains_key("message")
        && let Some(m) = v.remove("Message")
    {
        v.insert("message".into(), m);
    }
    if let Some(t) = header.map(error_type).filter(|t| !t.is_empty()) {
        v.insert("__type".into(), t.into());
    } else if let Some(t) = v.get("__type").and_then(Value::as_str) {
        let bare = error_type(t).to_string();
        v.insert("__type".into(), bare.into());
    }
    bytes::Bytes::from(serde_json::to_vec(&Value::Object(v)).unwrap_or_default())
}

/// The status that classes a Bedrock error as the gateway's failure classes expect
/// (SPEC §3): the upstream's, except for the types whose status says less than their
/// name. `ModelNotReadyException` (a 429 while the model loads) and
/// `ServiceUnavailableException` are overload (503); `ModelErrorException` and
/// `ModelStreamErrorException` (424: the model failed, not the request) are server
/// errors (502); `ModelTimeoutException` is a timeout (408).
pub(crate) fn class_status(status: u16, error_type: &str) -> u16 {
    match error_type {
        "ThrottlingException" | "throttlingException" => 429,
        "ModelNotReadyException"
        | "modelNotReadyException"
        | "ServiceUnavailableException"
        | "serviceUnavailableException" => 503,
        "ModelErrorException"
        | "modelErrorException"
        | "ModelStreamErrorException"
        | "modelStreamErrorException" => 502,
        "InternalServerException" | "internalServerException" => 500,
        "ModelTimeoutException" | "modelTimeoutException" => 408,
        "AccessDeniedException"
        | "accessDeniedException"
        | "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "ExpiredTokenException" => 403,
        "ValidationException" | "validationException" => 400,
        "ResourceNotFoundException" | "resourceNotFoundException" => 404,
        _ => status,
    }
}

/// A Bedrock error body (`{"message", "__type"?}`, or the in-band shape
/// `{"error": {"type", "code", "message"}}` an exception frame becomes) → the form,
/// by its type, then its wording, then the HTTP status.
pub(super) fn decode_error(status: u16, body: &[u8]) -> Error {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let (kind, message) = match v.get("error") {
        Some(e) if e.is_object() => (str_at(e, "type"), str_at(e, "message")),
        _ => (str_at(&v, "__type"), str_at(&v, "message")),
    };
    let message = match message {
        Some(m) if !m.is_empty() => m.to_owned(),
        _ => super::error_body::read(status, body).message,
    };
    let kind = kind.map(error_type).unwrap_or("");
    let class = if is_context_length(body) {
        ErrorClass::ContextLength
    } else {
        match kind {
            "ValidationException" | "validationException" => ErrorClass::InvalidRequest,
            "AccessDeniedException" | "accessDeniedException" => ErrorClass::Permission,
            "UnrecognizedClientException"
            | "InvalidSignatureException"
            | "ExpiredTokenException"
            | "IncompleteSignatureException"
            | "MissingAuthenticationTokenException" => ErrorClass::Authentication,
            // "The provided model identifier is invalid.", "Could not resolve the
            // foundation model from the provided model identifier."
            "ResourceNotFoundException" | "resourceNotFoundException" => {
                if message.contains("model") {
                    ErrorClass::ModelNotFound
                } else {
                    ErrorClass::NotFound
                }
            }
            "ThrottlingException" | "throttlingException" | "ServiceQuotaExceededException" => {
                ErrorClass::RateLimit
            }
            "ServiceUnavailableException"
            | "serviceUnavailableException"
            | "ModelNotReadyException"
            | "modelNotReadyException" => ErrorClass::Overloaded,
            "ModelTimeoutException" | "modelTimeoutException" => ErrorClass::Timeout,
            "InternalServerException"
            | "internalServerException"
            | "ModelErrorException"
            | "modelErrorException"
            | "ModelStreamErrorException"
            | "modelStreamErrorException" => ErrorClass::Server,
            _ => match status {
                401 => ErrorClass::Authentication,
                403 => ErrorClass::Permission,
                404 => ErrorClass::NotFound,
                408 => ErrorClass::Timeout,
                413 => ErrorClass::RequestTooLarge,
                429 => ErrorClass::RateLimit,
                503 | 529 => ErrorClass::Overloaded,
                504 => ErrorClass::Timeout,
                400..=499 => ErrorClass::InvalidRequest,
                _ => ErrorClass::Server,
            },
        }
    };
    Error { class, message }
}

/// Bedrock's `usage` (a Converse answer, or a ConverseStream `metadata` event), as
/// [`usage::Usage`]:
/// cache reads and writes, which Bedrock counts apart, are input as OpenAI counts
/// them.
#[derive(Debug, Default, Clone, Copy, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct BedrockUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_write_input_tokens: u64,
}

static BEDROCK_USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"inputTokens\""));

/// The usage a Converse answer or ConverseStream `metadata` event reports
/// (`usage.inputTokens`, ...), read from the raw bytes.
fn converse_usage(doc: &[u8]) -> Option<usage::Usage> {
    BEDROCK_USAGE_KEY.find(doc)?;
    let at = memchr::memmem::find(doc, b"\"usage\"")? + b"\"usage\"".len();
    let rest = &doc[at..];
    let start = rest
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b':'))?;
    let mut values =
        serde_json::Deserializer::from_slice(&rest[start..]).into_iter::<BedrockUsage>();
    let u = values.next()?.ok()?;
    Some(usage::Usage {
        input_tokens: u
            .input_tokens
            .saturating_add(u.cache_read_input_tokens)
            .saturating_add(u.cache_write_input_tokens),
        output_tokens: u.output_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_map() {
        assert_eq!(stop_of("end_turn"), Stop::EndTurn);
        assert_eq!(stop_of("tool_use"), Stop::ToolUse);
        assert_eq!(stop_of("max_tokens"), Stop::MaxTokens);
        assert_eq!(stop_of("stop_sequence"), Stop::Sequence);
        assert_eq!(stop_of("guardrail_intervened"), Stop::Refusal);
        assert_eq!(stop_of("content_filtered"), Stop::Refusal);
        assert_eq!(stop_of("something_new"), Stop::EndTurn);
    }

    #[test]
    fn error_types_come_from_the_header_or_the_body() {
        assert_eq!(
            error_type("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
            "ThrottlingException"
        );
        assert_eq!(
            error_type("com.amazon.bedrock#ValidationException"),
            "ValidationException"
        );
        let b = with_error_type(
            Some("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
            br#"{"message":"Too many requests, please wait before trying again."}"#,
        );
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["__type"], "ThrottlingException");
        let b = with_error_type(None, b"<html>oops</html>");
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["message"], "<html>oops</html>");
    }

    #[test]
    fn errors_classify_by_type_then_wording() {
        let e = |status, body: &str| decode_error(status, body.as_bytes()).class;
        assert_eq!(
            e(
                429,
                r#"{"__type":"ThrottlingException","message":"Too many requests"}"#
            ),
            ErrorClass::RateLimit
        );
        assert_eq!(
            e(
                400,
                r#"{"__type":"ValidationException","message":"Input is too long for requested model."}"#
            ),
            ErrorClass::ContextLength
        );
        assert_eq!(
            e(
                400,
                r#"{"__type":"ValidationException","message":"Malformed input request"}"#
            ),
            ErrorClass::InvalidRequest
        );
        assert_eq!(
            e(
                403,
                r#"{"__type":"UnrecognizedClientException","message":"The security token included in the request is invalid."}"#
            ),
            ErrorClass::Authentication
        );
        assert_eq!(
            e(
                403,
                r#"{"__type":"AccessDeniedException","message":"You don't have access to the model"}"#
            ),
            ErrorClass::Permission
        );
        assert_eq!(
            e(
                429,
                r#"{"__type":"ModelNotReadyException","message":"Model is not ready"}"#
            ),
            ErrorClass::Overloaded
        );
        assert_eq!(
            e(
                200,
                r#"{"error":{"type":"modelStreamErrorException","code":502,"message":"boom"}}"#
            ),
            ErrorClass::Server
        );
        assert_eq!(
            e(
                404,
                r#"{"__type":"ResourceNotFoundException","message":"Could not resolve the foundation model from the provided model identifier."}"#
            ),
            ErrorClass::ModelNotFound
        );
        assert_eq!(class_status(429, "ModelNotReadyException"), 503);
        assert_eq!(class_status(424, "ModelErrorException"), 502);
        assert_eq!(class_status(400, "SomethingElse"), 400);
    }

    #[test]
    fn reads_converse_usage() {
        let bedrock = b"event: metadata\ndata: {\"metadata\":{\"usage\":{\"inputTokens\":12,\"outputTokens\":5,\"totalTokens\":17},\"metrics\":{\"latencyMs\":9}}}\n\n";
        assert_eq!(
            converse_usage(bedrock),
            Some(usage::Usage {
                input_tokens: 12,
                output_tokens: 5
            })
        );
        assert_eq!(converse_usage(br#"{"metadata":{}}"#), None);
    }
}

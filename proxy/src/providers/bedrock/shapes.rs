//! Converse's shapes shared by its requests and streams: what a target takes, stop
//! reasons, usage, tool uses, answers into the form, and its errors (typed by
//! `x-amzn-errortype`, classed by type) into the form.

use super::super::form::{
    Answer, Error, ErrorClass, Part, ReasoningText, Stop, Target, ToolUse, Usage,
};
use super::super::vocab::{JSON_TOOL, as_u64, fresh_id, str_at};
use crate::providers::classify::is_context_length;
use crate::wire::usage;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// What a Bedrock target takes beyond the form's core.
pub(in crate::providers) const TARGET: Target = Target {
    name: "a Bedrock target",
    // Converse's `inferenceConfig.temperature` is 0–1 for every model family.
    max_temperature: 1.0,
    // `topK` is no Converse field (only a model-specific additional field).
    top_k: false,
    // Only inline bytes (or S3 locations): Bedrock fetches no URL.
    image_urls: false,
    // `toolResult` names its call by `toolUseId`.
    tool_result_names: false,
    // Only inline bytes (or S3 locations): the gateway fetches a URL for it.
    document_urls: false,
    // `toolResult.content` takes text, image and document blocks.
    tool_result_media: true,
    url_media_type: false,
};

/// `stopReason` → the form.
pub(in crate::providers) fn stop_of(reason: &str) -> Stop {
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
pub(in crate::providers) fn usage_of(u: &Value) -> Usage {
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

/// A `ConverseResponse` → the form: text, tool calls and reasoning (with its
/// signature, or encrypted, as it came); a call of the gateway's JSON tool is the
/// answer's text (`vocab::JSON_TOOL`). Converse gives no id: one is made.
pub(in crate::providers) fn decode_answer(resp: &Map<String, Value>) -> Answer<'_> {
    let blocks = resp
        .get("output")
        .and_then(|o| o.get("message"))
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let mut content = Vec::with_capacity(blocks.len());
    let mut json_answer = false;
    for b in blocks {
        if let Some(t) = str_at(b, "text") {
            if !t.is_empty() {
                content.push(Part::Text(t));
            }
        } else if let Some(call) = b.get("toolUse") {
            if str_at(call, "name") == Some(JSON_TOOL) {
                json_answer = true;
                content.push(Part::Json(tool_use(call).input));
            } else {
                content.push(Part::ToolUse(tool_use(call)));
            }
        } else if let Some(r) = b.get("reasoningContent") {
            if let Some(text) = r.get("reasoningText") {
                content.push(Part::Reasoning(ReasoningText {
                    text: str_at(text, "text").unwrap_or(""),
                    signature: str_at(text, "signature"),
                }));
            } else if let Some(data) = str_at(r, "redactedContent") {
                content.push(Part::RedactedReasoning(data));
            }
        }
    }
    let calls = content.iter().any(|p| matches!(p, Part::ToolUse(_)));
    let stop = match resp.get("stopReason").and_then(Value::as_str) {
        // An answer given through the JSON tool alone ends its turn.
        Some("tool_use") if json_answer && !calls => Stop::EndTurn,
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
/// (docs/request-lifecycle.md#streams-the-commit-point): the upstream's, except for the
/// types whose status says less than their name. `ModelNotReadyException` (a 429 while the
/// model loads) and `ServiceUnavailableException` are overload (503); `ModelErrorException`
/// and `ModelStreamErrorException` (424: the model failed, not the request) are server
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
pub(in crate::providers) fn decode_error(status: u16, body: &[u8]) -> Error {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let (kind, message) = match v.get("error") {
        Some(e) if e.is_object() => (str_at(e, "type"), str_at(e, "message")),
        _ => (str_at(&v, "__type"), str_at(&v, "message")),
    };
    let message = match message {
        Some(m) if !m.is_empty() => m.to_owned(),
        _ => super::super::error_body::read(status, body).message,
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
pub(in crate::providers) fn converse_usage(doc: &[u8]) -> Option<usage::Usage> {
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

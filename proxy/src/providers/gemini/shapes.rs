//! Gemini's shapes shared by its requests and streams: what a target takes, finish
//! reasons, usage, tool calls, answers and error bodies into the form, and the
//! `usageMetadata` read from raw bytes.

use super::super::form::{
    Answer, Error, ErrorClass, Part, ReasoningText, Stop, Target, ToolUse, Usage,
};
use super::super::vocab::{as_u64, fresh_id, str_at, tool_id};
use crate::providers::classify::is_context_length;
use crate::wire::usage;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// What a Gemini target takes beyond the form's core.
pub(in crate::providers) const TARGET: Target = Target {
    name: "a Gemini target",
    // Gemini's range is 0–2.
    max_temperature: 2.0,
    top_k: true,
    // `fileData` with the URL and its media type (Google fetches public URLs since
    // January 2026); a URL whose type its name does not tell is refused.
    image_urls: true,
    // `functionResponse` names the function it answers.
    tool_result_names: true,
    // `fileData` with the URL (Google fetches public URLs since January 2026).
    document_urls: true,
    // As parts beside the `functionResponse`, in the same user turn.
    tool_result_media: true,
    // `fileData` carries the URL's media type, which the URL's name must tell.
    url_media_type: true,
};

/// `finishReason` → the form. `STOP` ends with tool calls when the answer holds
/// some (Gemini has no reason of its own for that). Safety and policy stops
/// (`SAFETY`, `RECITATION`, `BLOCKLIST`, `PROHIBITED_CONTENT`, `SPII`,
/// `IMAGE_SAFETY`, ...) are refusals; anything else (`MALFORMED_FUNCTION_CALL`,
/// `OTHER`, newer reasons) a natural end.
pub(in crate::providers) fn stop_of(finish_reason: &str, has_tool_calls: bool) -> Stop {
    match finish_reason {
        "MAX_TOKENS" => Stop::MaxTokens,
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION"
        | "LANGUAGE" => Stop::Refusal,
        _ if has_tool_calls => Stop::ToolUse,
        _ => Stop::EndTurn,
    }
}

/// `usageMetadata` → the form. `promptTokenCount` includes cached tokens (they
/// leave the input, as for OpenAI) and not tool-use prompt tokens (added); output
/// is the candidates' tokens plus thinking tokens, which Google bills as output.
pub(in crate::providers) fn usage_of(u: &Value) -> Usage {
    let cached = as_u64(&u["cachedContentTokenCount"]);
    let prompt =
        as_u64(&u["promptTokenCount"]).saturating_add(as_u64(&u["toolUsePromptTokenCount"]));
    Usage {
        input: prompt.saturating_sub(cached),
        output: as_u64(&u["candidatesTokenCount"]).saturating_add(as_u64(&u["thoughtsTokenCount"])),
        cache_read: cached,
        cache_write: 0,
    }
}

/// A `functionCall` part → a tool call. Gemini usually gives no id: one is made
/// from the answer's id and the call's position, the same unary and streamed.
fn tool_use<'a>(call: &'a Value, answer_id: &str, n: usize) -> ToolUse<'a> {
    ToolUse {
        id: match str_at(call, "id") {
            Some(id) if !id.is_empty() => Cow::Borrowed(id),
            _ => Cow::Owned(tool_id(answer_id, n)),
        },
        name: str_at(call, "name").unwrap_or(""),
        input: match call.get("args") {
            Some(a @ Value::Object(_)) => Cow::Borrowed(a),
            _ => Cow::Owned(Value::Object(Map::new())),
        },
    }
}

/// A Gemini target's `GenerateContentResponse` → the form. The first candidate is
/// the answer; thought parts are its reasoning.
/// A prompt blocked before any candidate is an empty answer stopped as a refusal.
pub(in crate::providers) fn decode_answer(resp: &Map<String, Value>) -> Answer<'_> {
    let id = match resp.get("responseId").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => Cow::Borrowed(id),
        _ => Cow::Owned(fresh_id()),
    };
    let candidate = resp
        .get("candidates")
        .and_then(Value::as_array)
        .and_then(|c| c.first());
    let parts = candidate
        .and_then(|c| c.get("content"))
        .and_then(|c| c.get("parts"))
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let mut content = Vec::with_capacity(parts.len());
    let mut calls = 0;
    for p in parts {
        // Thoughts (summaries, when asked for with `includeThoughts`): reasoning
        // Google does not sign in a way other APIs could send back.
        if p.get("thought") == Some(&Value::Bool(true)) {
            if let Some(t) = str_at(p, "text").filter(|t| !t.is_empty()) {
                content.push(Part::Reasoning(ReasoningText {
                    text: t,
                    signature: None,
                }));
            }
            continue;
        }
        if let Some(t) = str_at(p, "text") {
            if !t.is_empty() {
                content.push(Part::Text(t));
            }
        } else if let Some(call) = p.get("functionCall") {
            content.push(Part::ToolUse(tool_use(call, &id, calls)));
            calls += 1;
        }
    }
    let stop = match candidate.and_then(|c| str_at(c, "finishReason")) {
        Some(r) => Some(stop_of(r, calls > 0)),
        None if candidate.is_none() && is_blocked(resp) => Some(Stop::Refusal),
        None => Some(if calls > 0 {
            Stop::ToolUse
        } else {
            Stop::EndTurn
        }),
    };
    Answer {
        id,
        content,
        stop,
        usage: resp
            .get("usageMetadata")
            .filter(|u| u.is_object())
            .map(usage_of),
    }
}

/// Whether a response (or stream chunk) is a prompt blocked by Google's safety
/// filters: `promptFeedback.blockReason`, and no candidate.
pub(in crate::providers) fn is_blocked(resp: &Map<String, Value>) -> bool {
    resp.get("promptFeedback")
        .and_then(|f| f.get("blockReason"))
        .is_some_and(|r| !r.is_null())
        && resp
            .get("candidates")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}

/// A Gemini error body (`{"error": {"code", "message", "status", "details"}}`, or
/// a one-element array of it) → the form, by its `status` (google.rpc.Code), then
/// its wording, then the HTTP status.
pub(in crate::providers) fn decode_error(status: u16, body: &[u8]) -> Error {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let v = match v {
        Value::Array(mut a) if !a.is_empty() => a.swap_remove(0),
        other => other,
    };
    let err = &v["error"];
    let message = match str_at(err, "message") {
        Some(m) if !m.is_empty() => m.to_owned(),
        _ => {
            let said = super::super::error_body::read(status, body);
            said.message
        }
    };
    let invalid_key = memchr::memmem::find(body, b"API_KEY_INVALID").is_some();
    let class = if is_context_length(body) {
        ErrorClass::ContextLength
    } else if invalid_key {
        ErrorClass::Authentication
    } else {
        match str_at(err, "status") {
            Some("INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE") => {
                ErrorClass::InvalidRequest
            }
            Some("UNAUTHENTICATED") => ErrorClass::Authentication,
            Some("PERMISSION_DENIED") => ErrorClass::Permission,
            // "models/x is not found for API version v1beta, or is not supported
            // for generateContent": what OpenAI calls model_not_found.
            Some("NOT_FOUND") if message.contains("models/") => ErrorClass::ModelNotFound,
            Some("NOT_FOUND") => ErrorClass::NotFound,
            Some("RESOURCE_EXHAUSTED") => ErrorClass::RateLimit,
            Some("UNAVAILABLE") => ErrorClass::Overloaded,
            Some("DEADLINE_EXCEEDED") => ErrorClass::Timeout,
            Some("INTERNAL" | "UNKNOWN" | "CANCELLED" | "ABORTED" | "DATA_LOSS") => {
                ErrorClass::Server
            }
            _ => match status {
                401 => ErrorClass::Authentication,
                403 => ErrorClass::Permission,
                404 => ErrorClass::NotFound,
                413 => ErrorClass::RequestTooLarge,
                429 => ErrorClass::RateLimit,
                503 => ErrorClass::Overloaded,
                504 => ErrorClass::Timeout,
                400..=499 => ErrorClass::InvalidRequest,
                _ => ErrorClass::Server,
            },
        }
    };
    Error { class, message }
}

/// Gemini's `usageMetadata`, as [`usage::Usage`]: the prompt (cached and tool-use prompt
/// tokens included, as OpenAI counts cached ones) in, candidates plus thinking
/// tokens (billed as output) out.
#[derive(Debug, Default, Clone, Copy, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct GeminiUsage {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    tool_use_prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    #[serde(default)]
    thoughts_token_count: u64,
}

static GEMINI_USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usageMetadata\""));

/// The usage a Gemini answer or stream chunk reports (`usageMetadata`), read from
/// the raw bytes as [`usage::usage`] reads the client APIs'.
pub(in crate::providers) fn usage_metadata(doc: &[u8]) -> Option<usage::Usage> {
    let at = GEMINI_USAGE_KEY.find(doc)? + b"\"usageMetadata\"".len();
    let rest = &doc[at..];
    let start = rest
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b':'))?;
    let mut values =
        serde_json::Deserializer::from_slice(&rest[start..]).into_iter::<GeminiUsage>();
    let u = values.next()?.ok()?;
    Some(usage::Usage {
        input_tokens: u
            .prompt_token_count
            .saturating_add(u.tool_use_prompt_token_count),
        output_tokens: u
            .candidates_token_count
            .saturating_add(u.thoughts_token_count),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_map() {
        assert_eq!(stop_of("STOP", false), Stop::EndTurn);
        assert_eq!(stop_of("STOP", true), Stop::ToolUse);
        assert_eq!(stop_of("MAX_TOKENS", true), Stop::MaxTokens);
        for r in [
            "SAFETY",
            "RECITATION",
            "BLOCKLIST",
            "PROHIBITED_CONTENT",
            "SPII",
        ] {
            assert_eq!(stop_of(r, false), Stop::Refusal, "{r}");
        }
        assert_eq!(stop_of("MALFORMED_FUNCTION_CALL", false), Stop::EndTurn);
    }

    #[test]
    fn errors_classify_by_status_then_wording() {
        let e = |status, body: &str| decode_error(status, body.as_bytes()).class;
        assert_eq!(
            e(
                429,
                r#"{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}"#
            ),
            ErrorClass::RateLimit
        );
        assert_eq!(
            e(
                503,
                r#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#
            ),
            ErrorClass::Overloaded
        );
        assert_eq!(
            e(
                400,
                r#"{"error":{"code":400,"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#
            ),
            ErrorClass::ContextLength
        );
        assert_eq!(
            e(
                400,
                r#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}"#
            ),
            ErrorClass::Authentication
        );
        assert_eq!(
            e(
                403,
                r#"[{"error":{"code":403,"message":"Method doesn't allow unregistered callers","status":"PERMISSION_DENIED"}}]"#
            ),
            ErrorClass::Permission
        );
        assert_eq!(
            e(
                404,
                r#"{"error":{"code":404,"message":"models/gemini-9 is not found for API version v1beta","status":"NOT_FOUND"}}"#
            ),
            ErrorClass::ModelNotFound
        );
        assert_eq!(
            e(
                404,
                r#"{"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND"}}"#
            ),
            ErrorClass::NotFound
        );
        assert_eq!(e(502, "<html>bad gateway</html>"), ErrorClass::Server);
        assert_eq!(
            decode_error(500, br#"{"error":{"code":500,"message":"An internal error has occurred.","status":"INTERNAL"}}"#).message,
            "An internal error has occurred."
        );
    }

    #[test]
    fn reads_usage_metadata() {
        let gemini = b"data: {\"candidates\":[],\"usageMetadata\": {\"promptTokenCount\":12,\"candidatesTokenCount\":5,\"thoughtsTokenCount\":3,\"totalTokenCount\":20}}\n\n";
        assert_eq!(
            usage_metadata(gemini),
            Some(usage::Usage {
                input_tokens: 12,
                output_tokens: 8
            })
        );
        assert_eq!(usage_metadata(br#"{"candidates":[]}"#), None);
    }
}

//! Helpers every adapter uses: ids, data URLs, typed access to JSON objects and the
//! errors a decoder reports.

use bytes::{BufMut, BytesMut};
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::dialect::TranslateError;
use super::form::{Fetched, Target};

/// Content blocks of one streamed message whose tool-call arguments are relayed: far
/// more than any real answer has, and a bound on a decoder's block table, which a
/// provider's indexes would otherwise grow without end (docs/limits.md#memory).
pub(super) const MAX_BLOCKS: usize = 4096;

pub(super) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A tool call's `arguments` string as an `input` object: empty means `{}`; anything
/// but a JSON object is `None` (each side words its own error).
pub(super) fn tool_input(arguments: &str) -> Option<Value> {
    if arguments.trim().is_empty() {
        return Some(Value::Object(Map::new()));
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

/// A bare id (see `form::Answer::id`) for an upstream message that came without one.
pub(super) fn fresh_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// An id for a tool call that came without one (some OpenAI-compatible servers omit
/// it): unique within the message whose bare id is `message_id`.
pub(super) fn tool_id(message_id: &str, n: usize) -> String {
    let base: String = message_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    format!("call_{base}_{n}")
}

/// `data:<media type>;base64,<data>` → (media type, data).
pub(super) fn parse_data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let media = meta.strip_suffix(";base64")?;
    Some((media, data))
}

/// A JSON field that is present and not null.
pub(super) fn present<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

pub(super) fn str_field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    obj.get(key).and_then(Value::as_str)
}

/// `v[key]` as a string, when `v` is an object holding one.
pub(super) fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

pub(super) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, TranslateError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(TranslateError::invalid(
            None,
            "the request body must be a JSON object",
        )),
        Err(e) => Err(TranslateError::invalid(
            None,
            format!("the request body is not valid JSON: {e}"),
        )),
    }
}

/// An upstream answer body, which must be a JSON object.
pub(super) fn parse_answer(body: &[u8]) -> Result<Map<String, Value>, TranslateError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(TranslateError::upstream(
            "the upstream answered with a body that is not a JSON object",
        )),
    }
}

pub(super) fn as_u64(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// A parameter the target cannot honour (400).
pub(super) fn refuse(param: impl Into<String>, what: &str, target: &Target) -> TranslateError {
    TranslateError::unsupported(param, format!("{what} cannot be served by {}", target.name))
}

/// A request that is malformed whatever the target (400).
pub(super) fn invalid(param: impl Into<String>, message: impl Into<String>) -> TranslateError {
    TranslateError::invalid(Some(param.into()), message)
}

pub(super) fn token_count(v: &Value, param: &str) -> Result<u64, TranslateError> {
    v.as_u64()
        .ok_or_else(|| invalid(param, format!("{param} must be a non-negative integer")))
}

pub(super) fn number<'a>(
    v: &'a Value,
    param: &str,
) -> Result<&'a serde_json::Number, TranslateError> {
    match v {
        Value::Number(n) => Ok(n),
        _ => Err(invalid(param, format!("{param} must be a number"))),
    }
}

/// `temperature`, refused above what the target accepts.
pub(super) fn temperature<'a>(
    v: &'a Value,
    target: &Target,
) -> Result<&'a serde_json::Number, TranslateError> {
    let n = number(v, "temperature")?;
    if n.as_f64().is_some_and(|t| t > target.max_temperature) {
        return Err(refuse(
            "temperature",
            &format!("temperature above {}", target.max_temperature),
            target,
        ));
    }
    Ok(n)
}

/// A text part's `text`, which must be a string.
pub(super) fn text_of(part: &Value, at: impl FnOnce() -> String) -> Result<&str, TranslateError> {
    str_at(part, "text").ok_or_else(|| invalid(at() + ".text", "a text part needs text"))
}

/// The request's `tools`, empty when absent.
pub(super) fn tools_array(req: &Map<String, Value>) -> Result<&[Value], TranslateError> {
    match present(req, "tools") {
        None => Ok(&[]),
        Some(t) => t
            .as_array()
            .map(Vec::as_slice)
            .ok_or_else(|| invalid("tools", "tools must be an array")),
    }
}

pub(super) fn description(
    f: &Map<String, Value>,
    at: impl FnOnce() -> String,
) -> Result<Option<&str>, TranslateError> {
    match present(f, "description") {
        None => Ok(None),
        Some(Value::String(d)) => Ok(Some(d)),
        Some(_) => Err(invalid(at(), "a tool description must be a string")),
    }
}

/// A tool's schema; none is an object with no properties.
pub(super) fn schema(schema: Option<&Value>) -> Value {
    schema
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}))
}

/// An image a target that reads only inline bytes cannot take (unless the gateway
/// fetches it).
pub(super) const IMAGE_URL: &str = "an image by URL (the target reads inline bytes only)";

/// A document a target that reads only inline bytes cannot take (unless the
/// gateway fetches it).
pub(super) const DOCUMENT_URL: &str = "a document by URL (the target reads inline bytes only)";

/// The media type a URL's file name says (its extension), for APIs that need one
/// beside the URL. Query and fragment are not part of the name.
pub(crate) fn media_type_of_url(url: &str) -> Option<&'static str> {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let name = path.rsplit('/').next().unwrap_or(path);
    let ext = name.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "heic" => "image/heic",
        "heif" => "image/heif",
        "pdf" => "application/pdf",
        "txt" => "text/plain",
        _ => return None,
    })
}

/// An image or document at a URL, as a target takes it.
pub(super) enum AtUrl<'a> {
    /// The URL itself: the provider fetches it.
    Url(&'a str),
    /// The bytes the gateway fetched: (media type, base64).
    Inline(&'a str, &'a str),
}

/// `url` for `target`: the URL where the provider fetches it itself (`by_url`, and
/// its media type known where the target needs it), else the bytes the gateway
/// fetched, else a refusal naming the URL (`what` at `param`) so that the gateway
/// may fetch it and translate again.
pub(super) fn at_url<'a>(
    url: &'a str,
    by_url: bool,
    fetched: &'a Fetched,
    param: impl Into<String>,
    what: &str,
    target: &Target,
) -> Result<AtUrl<'a>, TranslateError> {
    if by_url && (!target.url_media_type || media_type_of_url(url).is_some()) {
        return Ok(AtUrl::Url(url));
    }
    if let Some((media_type, data)) = fetched.get(url) {
        return Ok(AtUrl::Inline(media_type, data));
    }
    Err(TranslateError::needs_fetch(
        param,
        format!("{what} cannot be served by {}", target.name),
        url,
    ))
}

/// The tool through which an API without a schema-less JSON mode (Anthropic's
/// messages, Bedrock's Converse) is asked for a JSON object (OpenAI's
/// `json_object`): the model must call it, and its input is the answer. Decoders of
/// those APIs turn its call back into the answer's text. The name is the gateway's:
/// a client tool of that name is refused (`reserved_tool_name`).
pub(super) const JSON_TOOL: &str = "switchback_json_answer";

pub(super) const JSON_TOOL_DESCRIPTION: &str =
    "Give your answer as this tool's input: a JSON object. Call it exactly once.";

/// A client tool named like the gateway's JSON tool: refused, as its calls would be
/// read as the answer's text.
pub(super) fn reserved_tool_name(
    name: &str,
    at: impl FnOnce() -> String,
) -> Result<(), TranslateError> {
    if name == JSON_TOOL {
        return Err(invalid(
            at(),
            format!("the tool name {JSON_TOOL} is reserved by the gateway"),
        ));
    }
    Ok(())
}

/// A schema a target cannot express (see `schema`), refused naming the construct
/// and where it is in the client's schema (`param`).
pub(super) fn inexpressible(
    param: &str,
    e: super::schema::Inexpressible,
    target: &Target,
) -> TranslateError {
    let at = if e.at.is_empty() {
        String::new()
    } else {
        format!(" at {}", e.at)
    };
    TranslateError::unsupported(
        param,
        format!("{}{at} cannot be served by {}", e.construct, target.name),
    )
}

/// A tool result a target that names the function it answers cannot place.
pub(super) const UNKNOWN_CALL: &str = "a tool result whose tool call is not earlier in the conversation (the result must name the function it answers)";

/// Appends `v` as JSON (an SSE event's data) to `out`.
pub(super) fn write_json<T: Serialize + ?Sized>(out: &mut BytesMut, v: &T) {
    // Serialising plain structs and `Value`s into memory cannot fail.
    let _ = serde_json::to_writer(out.writer(), v);
}

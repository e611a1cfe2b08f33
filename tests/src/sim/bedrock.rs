//! The strict Bedrock flavor ([`Flavor::Bedrock`](super::Flavor::Bedrock)): Amazon
//! Bedrock's runtime `Converse` / `ConverseStream` API as the real service takes and
//! answers it.
//!
//! Refused before any behaviour is taken (the request is still recorded and
//! counted), in AWS's error shape (`{"message"}` with the type in
//! `x-amzn-errortype`):
//!
//! * paths other than `POST /model/{modelId}/converse` and
//!   `/model/{modelId}/converse-stream`: 404 `UnknownOperationException`;
//! * a request not signed with SigV4 as AWS checks it: no `Authorization` (403
//!   `MissingAuthenticationTokenException`), an access key id the simulator does not
//!   know or a session token missing or wrong for it (403
//!   `UnrecognizedClientException`), a credential scope for another region or
//!   service, an `x-amz-date` more than 5 minutes off, or a signature that differs
//!   from the one recomputed here with `aws-sigv4` over the request as received
//!   (403 `InvalidSignatureException`);
//! * a body that is not a JSON object, a top-level field Converse does not have
//!   (`model`, `stream`, `max_tokens`, ...), no `messages`, a first turn that is not
//!   `user`, turns that do not alternate, a role other than `user` / `assistant`, a
//!   content block that is not exactly one of the Converse block types, blank text,
//!   a `toolUse` without `toolUseId` / `name` / object `input`, a `toolResult`
//!   without `toolUseId` / `content` or whose content blocks are not `text`,
//!   `image`, `document` or `json`, an `image` or `document` block without a format
//!   Converse knows and `source.bytes` (a `document` also without a `name`), a
//!   `reasoningContent` without `reasoningText {text, signature}` or
//!   `redactedContent`, an `outputConfig` other than `textFormat {type:
//!   "json_schema", structure.jsonSchema.schema}` with the schema a JSON object in a
//!   string, `inferenceConfig` or `toolConfig` fields it does not have, tool blocks
//!   without `toolConfig`: 400 `ValidationException`.
//!
//! Keys: [`BEDROCK_ACCESS_KEY_ID`] (long-term, no session token) and
//! [`BEDROCK_TEMP_ACCESS_KEY_ID`] (temporary: [`BEDROCK_SESSION_TOKEN`] required),
//! both with [`BEDROCK_SECRET_ACCESS_KEY`], in [`BEDROCK_REGION`].
//!
//! Answers: `ConverseResponse` JSON; streams are real AWS event-stream frames
//! (`application/vnd.amazon.eventstream`, encoded by `aws-smithy-eventstream`):
//! `messageStart`, `contentBlockDelta` per piece, `contentBlockStop`, `messageStop`,
//! `metadata`, each payload padded with a `p` field as AWS pads them. Behaviours:
//! answers, streams and tool calls; `RateLimited` → 429 `ThrottlingException`;
//! `ServerError(503)` → `ServiceUnavailableException`, other 5xx
//! `InternalServerException`; `ContextLength` → 400 "Input is too long for requested
//! model."; `StreamErrorFirst` / `OpeningThenError` → an exception frame
//! (`serviceUnavailableException`) before any content; `StreamThen { chunks, event
//! }` → `chunks` pieces then an exception frame whose `:exception-type` is `event`;
//! `HugeBody { bytes }` → an answer whose text is `bytes` long (streamed: in one
//! frame); `BreakMidStream`, `StallMidStream`, `Hang`, `Delay`, `Reset`, `Status` as
//! elsewhere. Any other behaviour is a 500 `InternalServerException` saying it is not
//! simulated.

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_runtime_api::client::identity::Identity;
use aws_smithy_types::event_stream::{Header, HeaderValue as FrameValue, Message};
use axum::body::Body;
use axum::http::{Method, Response, header};
use bytes::Bytes;
use serde_json::{Value, json};

use super::{
    Behavior, CancelGuard, Ctx, Endpoint, PROMPT_TOKENS, ResetConnection, StreamEnd, StreamFault,
    answer_text, base_response, completion_tokens, rest_after, split_words, stream_pieces,
};

/// The long-term access key id the simulator knows (no session token).
pub const BEDROCK_ACCESS_KEY_ID: &str = "AKIASIMBEDROCK0001";
/// A temporary access key id: its requests must carry [`BEDROCK_SESSION_TOKEN`].
pub const BEDROCK_TEMP_ACCESS_KEY_ID: &str = "ASIASIMBEDROCK0002";
/// The secret access key of both.
pub const BEDROCK_SECRET_ACCESS_KEY: &str = "sim/Bedrock+Secret/Key0123456789abcdefghij";
/// The session token of [`BEDROCK_TEMP_ACCESS_KEY_ID`].
pub const BEDROCK_SESSION_TOKEN: &str = "FwoGZXIvYXdzEBsimSessionTokenForTests//+==";
/// The region requests must be signed for.
pub const BEDROCK_REGION: &str = "us-east-1";
/// `toolUseId` of the simulator's tool calls.
pub const BEDROCK_TOOL_USE_ID: &str = "tooluse_sim_0";

const TOP_LEVEL: [&str; 11] = [
    "messages",
    "outputConfig",
    "system",
    "inferenceConfig",
    "toolConfig",
    "guardrailConfig",
    "additionalModelRequestFields",
    "promptVariables",
    "additionalModelResponseFieldPaths",
    "requestMetadata",
    "performanceConfig",
];
const BLOCKS: [&str; 9] = [
    "text",
    "image",
    "document",
    "video",
    "toolUse",
    "toolResult",
    "guardContent",
    "cachePoint",
    "reasoningContent",
];
const INFERENCE: [&str; 4] = ["maxTokens", "temperature", "topP", "stopSequences"];

/// What Converse refuses in an `image` or `document` block at `at`.
fn media_refusal(kind: &str, v: &Value, at: &str) -> Option<Refusal> {
    let format = v.get("format").and_then(Value::as_str).unwrap_or("");
    let known = match kind {
        "image" => matches!(format, "png" | "jpeg" | "gif" | "webp"),
        _ => matches!(
            format,
            "pdf" | "csv" | "doc" | "docx" | "xls" | "xlsx" | "html" | "txt" | "md"
        ),
    };
    let named = kind == "image" || v.get("name").and_then(Value::as_str).is_some();
    if !known || !named || v.pointer("/source/bytes").and_then(Value::as_str).is_none() {
        return Some(validation(format!(
            "Malformed input request: {at}.{kind} needs a format Converse knows, source.bytes{}",
            if kind == "image" { "" } else { " and a name" }
        )));
    }
    None
}

/// (status, `x-amzn-errortype`, message).
pub type Refusal = (u16, &'static str, String);

/// Bedrock's refusal of a Claude prefill (a final assistant message) that ends in
/// whitespace.
pub const BEDROCK_TRAILING_WHITESPACE: &str = "The model returned the following errors: final assistant content cannot end with trailing whitespace";

fn validation(message: impl Into<String>) -> Refusal {
    (400, "ValidationException", message.into())
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Which endpoint a request is for, its model and whether it streams, and the
/// refusal AWS would answer it with, if any.
pub(super) fn route(
    parts: &axum::http::request::Parts,
    body: &[u8],
    json: Option<&Value>,
) -> (Endpoint, String, bool, Option<Refusal>) {
    let path = parts.uri.path();
    let found = path.strip_prefix("/model/").and_then(|rest| {
        let (model, op) = rest.rsplit_once('/')?;
        let stream = match op {
            "converse" => false,
            "converse-stream" => true,
            _ => return None,
        };
        (!model.is_empty() && !model.contains('/')).then_some((model, stream))
    });
    let Some((raw_model, stream)) = found.filter(|_| parts.method == Method::POST) else {
        return (
            Endpoint::Unknown,
            String::new(),
            false,
            Some((404, "UnknownOperationException", "Unknown operation".into())),
        );
    };
    let model = percent_decode(raw_model).unwrap_or_default();
    let refusal = signature_refusal(parts, body).or_else(|| body_refusal(json));
    (Endpoint::Converse, model, stream, refusal)
}

/// SigV4 as AWS checks it: recomputed here with the same crate over the request as
/// received, and compared whole.
fn signature_refusal(parts: &axum::http::request::Parts, body: &[u8]) -> Option<Refusal> {
    let h = &parts.headers;
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    let Some(auth) = text("authorization") else {
        return Some((
            403,
            "MissingAuthenticationTokenException",
            "Missing Authentication Token".into(),
        ));
    };
    let invalid = |m: &str| Some((403, "InvalidSignatureException", m.to_string()));
    let unrecognized = || {
        Some((
            403,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.".to_string(),
        ))
    };
    let Some(rest) = auth.strip_prefix("AWS4-HMAC-SHA256 ") else {
        return invalid("Authorization header requires the AWS4-HMAC-SHA256 algorithm.");
    };
    let field = |name: &str| {
        rest.split(", ")
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    let (Some(credential), Some(signed), Some(_)) = (
        field("Credential"),
        field("SignedHeaders"),
        field("Signature"),
    ) else {
        return invalid("Authorization header is malformed.");
    };
    let scope: Vec<&str> = credential.split('/').collect();
    let [akid, date, region, service, "aws4_request"] = scope[..] else {
        return invalid("Credential is malformed.");
    };
    let expected_token = match akid {
        BEDROCK_ACCESS_KEY_ID => None,
        BEDROCK_TEMP_ACCESS_KEY_ID => Some(BEDROCK_SESSION_TOKEN),
        _ => return unrecognized(),
    };
    if text("x-amz-security-token") != expected_token {
        return unrecognized();
    }
    if region != BEDROCK_REGION || service != "bedrock" {
        return invalid(&format!(
            "Credential should be scoped to a valid region and service, not '{region}/{service}'."
        ));
    }
    let Some(amz_date) = text("x-amz-date") else {
        return invalid(
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
        );
    };
    let Some(time) = parse_amz_date(amz_date) else {
        return invalid("Date must be in ISO-8601 'basic format'.");
    };
    if !amz_date.starts_with(date) {
        return invalid(
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP.",
        );
    }
    let skew = match SystemTime::now().duration_since(time) {
        Ok(d) => d,
        Err(e) => e.duration(),
    };
    if skew > Duration::from_secs(300) {
        return invalid("Signature expired.");
    }
    let signed: Vec<&str> = signed.split(';').collect();
    for required in ["host", "x-amz-date"] {
        if !signed.contains(&required) {
            return invalid(&format!("'{required}' must be a signed header."));
        }
    }
    if expected_token.is_some() && !signed.contains(&"x-amz-security-token") {
        return invalid("'x-amz-security-token' must be a signed header.");
    }
    // The signer adds x-amz-date and the token itself; the rest as received.
    let mut headers = Vec::new();
    for name in &signed {
        if matches!(*name, "x-amz-date" | "x-amz-security-token") {
            continue;
        }
        let Some(v) = text(name) else {
            return invalid(&format!("Signed header '{name}' is missing."));
        };
        headers.push((*name, v));
    }
    let host = text("host").unwrap_or("");
    let uri = format!(
        "http://{host}{}",
        parts
            .uri
            .path_and_query()
            .map_or(parts.uri.path(), |pq| pq.as_str())
    );
    let identity: Identity = Credentials::new(
        akid,
        BEDROCK_SECRET_ACCESS_KEY,
        expected_token.map(str::to_owned),
        None,
        "sim",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(BEDROCK_REGION)
        .name("bedrock")
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .expect("sim: signing params")
        .into();
    let Ok(signable) = SignableRequest::new(
        parts.method.as_str(),
        &uri,
        headers.into_iter(),
        SignableBody::Bytes(body),
    ) else {
        return invalid("The request cannot be signed.");
    };
    let Ok(out) = sign(signable, &params) else {
        return invalid("The request cannot be signed.");
    };
    let (instructions, _) = out.into_parts();
    let recomputed = instructions
        .headers()
        .find(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.to_string());
    if recomputed.as_deref() != Some(auth) {
        return invalid(
            "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.",
        );
    }
    None
}

/// `20261202T130500Z` → a time.
fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss) = (num(9..11)?, num(11..13)?, num(13..15)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// What Converse refuses in a body.
fn body_refusal(json: Option<&Value>) -> Option<Refusal> {
    let Some(Value::Object(req)) = json else {
        return Some(validation(
            "Malformed input request, please reformat your input and try again.",
        ));
    };
    if let Some(k) = req.keys().find(|k| !TOP_LEVEL.contains(&k.as_str())) {
        return Some(validation(format!(
            "Malformed input request: extraneous key [{k}] is not permitted, please reformat your input and try again."
        )));
    }
    let Some(messages) = req.get("messages").and_then(Value::as_array) else {
        return Some(validation(
            "1 validation error detected: Value null at 'messages' failed to satisfy constraint: Member must not be null",
        ));
    };
    if messages.is_empty() {
        return Some(validation(
            "A conversation must start with a user message. Try again with a conversation that starts with a user message.",
        ));
    }
    let mut tool_blocks = false;
    let mut last_role = "";
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(role, "user" | "assistant") {
            return Some(validation(format!(
                "1 validation error detected: Value '{role}' at 'messages.{}.member.role' failed to satisfy constraint: Member must satisfy enum value set: [user, assistant]",
                i + 1
            )));
        }
        if i == 0 && role != "user" {
            return Some(validation(
                "A conversation must start with a user message. Try again with a conversation that starts with a user message.",
            ));
        }
        if role == last_role {
            return Some(validation(
                "A conversation must alternate between user and assistant roles. Make sure the conversation alternates between user and assistant roles and try again.",
            ));
        }
        last_role = role;
        let Some(content) = m
            .get("content")
            .and_then(Value::as_array)
            .filter(|c| !c.is_empty())
        else {
            return Some(validation(format!(
                "The content field in the Message object at messages.{i} is empty. Add a ContentBlock object to the content field and try again."
            )));
        };
        if let Some(k) = m
            .as_object()
            .and_then(|o| o.keys().find(|k| !matches!(k.as_str(), "role" | "content")))
        {
            return Some(validation(format!(
                "Malformed input request: extraneous key [{k}] is not permitted"
            )));
        }
        for (j, b) in content.iter().enumerate() {
            let at = format!("messages.{i}.content.{j}");
            let Some(obj) = b.as_object().filter(|o| o.len() == 1) else {
                return Some(validation(format!(
                    "Malformed input request: {at} must set exactly one content block type"
                )));
            };
            let (kind, v) = obj.iter().next().expect("one key");
            if !BLOCKS.contains(&kind.as_str()) {
                return Some(validation(format!(
                    "Malformed input request: extraneous key [{kind}] is not permitted at {at}"
                )));
            }
            match kind.as_str() {
                "text" if v.as_str().is_none_or(|t| t.trim().is_empty()) => {
                    return Some(validation(
                        "The text field in the ContentBlock object is blank. Add text to the text field, and try again.",
                    ));
                }
                "toolUse" => {
                    tool_blocks = true;
                    if v.get("toolUseId").and_then(Value::as_str).is_none()
                        || v.get("name").and_then(Value::as_str).is_none()
                        || !v.get("input").is_some_and(Value::is_object)
                    {
                        return Some(validation(format!(
                            "Malformed input request: {at}.toolUse needs toolUseId, name and an object input"
                        )));
                    }
                }
                "toolResult" => {
                    tool_blocks = true;
                    let Some(blocks) = v.get("content").and_then(Value::as_array) else {
                        return Some(validation(format!(
                            "Malformed input request: {at}.toolResult needs toolUseId and content"
                        )));
                    };
                    if v.get("toolUseId").and_then(Value::as_str).is_none() {
                        return Some(validation(format!(
                            "Malformed input request: {at}.toolResult needs toolUseId and content"
                        )));
                    }
                    for (k, b) in blocks.iter().enumerate() {
                        let here = format!("{at}.toolResult.content.{k}");
                        let Some((kind, v)) = b
                            .as_object()
                            .filter(|o| o.len() == 1)
                            .and_then(|o| o.iter().next())
                        else {
                            return Some(validation(format!(
                                "Malformed input request: {here} must set exactly one block type"
                            )));
                        };
                        let refusal = match kind.as_str() {
                            "text" | "json" => None,
                            "image" | "document" => media_refusal(kind, v, &here),
                            other => Some(validation(format!(
                                "Malformed input request: extraneous key [{other}] is not permitted at {here}"
                            ))),
                        };
                        if refusal.is_some() {
                            return refusal;
                        }
                    }
                }
                "image" | "document" => {
                    if let Some(r) = media_refusal(kind, v, &at) {
                        return Some(r);
                    }
                }
                "reasoningContent" => {
                    let text = v.get("reasoningText");
                    let ok = match (text, v.get("redactedContent")) {
                        (Some(t), None) => t["text"].is_string() && t["signature"].is_string(),
                        (None, Some(r)) => r.is_string(),
                        _ => false,
                    };
                    if !ok {
                        return Some(validation(format!(
                            "Malformed input request: {at}.reasoningContent needs reasoningText {{text, signature}} or redactedContent"
                        )));
                    }
                }
                _ => {}
            }
        }
    }
    if let Some(oc) = req.get("outputConfig") {
        let schema = oc
            .pointer("/textFormat/structure/jsonSchema/schema")
            .and_then(Value::as_str)
            .and_then(|s| serde_json::from_str::<Value>(s).ok());
        let ok = oc.as_object().is_some_and(|o| o.len() == 1)
            && oc.pointer("/textFormat/type") == Some(&json!("json_schema"))
            && schema.is_some_and(|s| s.is_object());
        if !ok {
            return Some(validation(
                "Malformed input request: outputConfig.textFormat needs type json_schema and structure.jsonSchema.schema, a JSON schema in a string",
            ));
        }
    }
    if let Some(system) = req.get("system")
        && !system.as_array().is_some_and(|s| {
            s.iter()
                .all(|b| b.get("text").is_some_and(Value::is_string))
        })
    {
        return Some(validation(
            "Malformed input request: system must be a list of text blocks",
        ));
    }
    if let Some(inference) = req.get("inferenceConfig") {
        let Some(obj) = inference.as_object() else {
            return Some(validation(
                "Malformed input request: inferenceConfig must be an object",
            ));
        };
        if let Some(k) = obj.keys().find(|k| !INFERENCE.contains(&k.as_str())) {
            return Some(validation(format!(
                "Malformed input request: extraneous key [{k}] is not permitted in inferenceConfig"
            )));
        }
        if let Some(t) = obj
            .get("temperature")
            .and_then(Value::as_f64)
            .filter(|t| !(0.0..=1.0).contains(t))
        {
            return Some(validation(format!(
                "1 validation error detected: Value '{t}' at 'inferenceConfig.temperature' failed to satisfy constraint: Member must have value less than or equal to 1"
            )));
        }
    }
    match req.get("toolConfig") {
        None if tool_blocks => {
            return Some(validation(
                "The toolConfig field must be defined when using toolUse and toolResult content blocks.",
            ));
        }
        None => {}
        Some(tc) => {
            let ok_tools = tc.get("tools").and_then(Value::as_array).is_some_and(|ts| {
                !ts.is_empty()
                    && ts.iter().all(|t| {
                        let spec = &t["toolSpec"];
                        t.as_object().is_some_and(|o| o.len() == 1)
                            && spec["name"].is_string()
                            && spec["inputSchema"]["json"].is_object()
                            && spec.as_object().is_some_and(|o| {
                                o.keys().all(|k| {
                                    matches!(k.as_str(), "name" | "description" | "inputSchema")
                                })
                            })
                    })
            });
            let ok_choice = tc.get("toolChoice").is_none_or(|c| {
                c.as_object().is_some_and(|o| {
                    o.len() == 1
                        && (o.contains_key("auto")
                            || o.contains_key("any")
                            || o.get("tool").is_some_and(|t| t["name"].is_string()))
                })
            });
            let extra = tc.as_object().and_then(|o| {
                o.keys()
                    .find(|k| !matches!(k.as_str(), "tools" | "toolChoice"))
                    .cloned()
            });
            if !ok_tools || !ok_choice || extra.is_some() {
                return Some(validation(
                    "Malformed input request: toolConfig must hold tools[].toolSpec {name, description, inputSchema.json} and at most one toolChoice of auto, any or tool",
                ));
            }
        }
    }
    None
}

/// An AWS error answer: the type in `x-amzn-errortype`, `{"message"}` in the body.
pub(super) fn error_response(ctx: &Ctx, refusal: &Refusal) -> Response<Body> {
    let (status, kind, message) = refusal;
    base_response(ctx, *status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            "x-amzn-errortype",
            format!("{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"),
        )
        .body(Body::from(json!({"message": message}).to_string()))
        .expect("sim: valid response")
}

fn usage(out: u64) -> Value {
    json!({"inputTokens": PROMPT_TOKENS, "outputTokens": out, "totalTokens": PROMPT_TOKENS + out})
}

/// A `ConverseResponse` answering `text`, stopped for `stop_reason`.
pub fn bedrock_response(text: &str, stop_reason: &str) -> Value {
    json!({
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": stop_reason,
        "usage": usage(completion_tokens(text)),
        "metrics": {"latencyMs": 120}
    })
}

/// A `ConverseResponse` whose model calls `name` with `arguments` (after `text`).
pub fn bedrock_tool_use_response(text: Option<&str>, name: &str, arguments: &Value) -> Value {
    let mut content: Vec<Value> = text.map(|t| json!({"text": t})).into_iter().collect();
    content.push(
        json!({"toolUse": {"toolUseId": BEDROCK_TOOL_USE_ID, "name": name, "input": arguments}}),
    );
    json!({
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": "tool_use",
        "usage": usage(5),
        "metrics": {"latencyMs": 120}
    })
}

fn frame(headers: &[(&str, &str)], payload: &[u8]) -> Bytes {
    let mut m = Message::new(payload.to_vec());
    for (k, v) in headers {
        m = m.add_header(Header::new(
            k.to_string(),
            FrameValue::String(v.to_string().into()),
        ));
    }
    let mut out = Vec::new();
    write_message_to(&m, &mut out).expect("sim: frame encodes");
    Bytes::from(out)
}

/// One ConverseStream event frame, its payload padded as AWS pads them (`p`).
pub fn bedrock_event(name: &str, mut payload: Value) -> Bytes {
    if let Some(o) = payload.as_object_mut() {
        o.insert("p".into(), "abcdefghijklmnopqrstuvwxyzABCDEF".into());
    }
    frame(
        &[
            (":event-type", name),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.to_string().as_bytes(),
    )
}

/// An exception frame (`:message-type` exception).
pub fn bedrock_exception(kind: &str, message: &str) -> Bytes {
    frame(
        &[
            (":exception-type", kind),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        json!({"message": message}).to_string().as_bytes(),
    )
}

fn opening() -> Vec<Bytes> {
    vec![bedrock_event("messageStart", json!({"role": "assistant"}))]
}

fn text_deltas(pieces: &[String]) -> Vec<Bytes> {
    pieces
        .iter()
        .map(|p| {
            bedrock_event(
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": p}}),
            )
        })
        .collect()
}

fn closing(stop_reason: &str, out: u64, blocks: u64) -> Vec<Bytes> {
    let mut v: Vec<Bytes> = (0..blocks)
        .map(|i| bedrock_event("contentBlockStop", json!({"contentBlockIndex": i})))
        .collect();
    v.push(bedrock_event(
        "messageStop",
        json!({"stopReason": stop_reason}),
    ));
    v.push(bedrock_event(
        "metadata",
        json!({"usage": usage(out), "metrics": {"latencyMs": 120}}),
    ));
    v
}

/// The frames of a streamed answer made of `pieces`.
pub fn bedrock_stream_frames(pieces: &[String]) -> Vec<Bytes> {
    let mut v = opening();
    v.extend(text_deltas(pieces));
    v.extend(closing("end_turn", completion_tokens(&pieces.concat()), 1));
    v
}

/// The frames of a streamed tool call: optional text, then the call whose input
/// arrives in two fragments.
pub fn bedrock_tool_use_frames(text: Option<&str>, name: &str, arguments: &Value) -> Vec<Bytes> {
    let mut v = opening();
    let mut block = 0;
    if let Some(t) = text {
        v.extend(text_deltas(&split_words(t)));
        v.push(bedrock_event(
            "contentBlockStop",
            json!({"contentBlockIndex": 0}),
        ));
        block = 1;
    }
    v.push(bedrock_event(
        "contentBlockStart",
        json!({"contentBlockIndex": block, "start": {"toolUse": {"toolUseId": BEDROCK_TOOL_USE_ID, "name": name}}}),
    ));
    let input = arguments.to_string();
    let cut = input.len() / 2;
    let cut = (0..=cut)
        .rev()
        .find(|i| input.is_char_boundary(*i))
        .unwrap_or(0);
    for piece in [&input[..cut], &input[cut..]] {
        v.push(bedrock_event(
            "contentBlockDelta",
            json!({"contentBlockIndex": block, "delta": {"toolUse": {"input": piece}}}),
        ));
    }
    v.push(bedrock_event(
        "contentBlockStop",
        json!({"contentBlockIndex": block}),
    ));
    v.push(bedrock_event(
        "messageStop",
        json!({"stopReason": "tool_use"}),
    ));
    v.push(bedrock_event(
        "metadata",
        json!({"usage": usage(5), "metrics": {"latencyMs": 120}}),
    ));
    v
}

/// A 200 event-stream response: one body chunk per frame.
fn frames(
    ctx: &Ctx,
    frames: Vec<Bytes>,
    interval: Duration,
    end: StreamEnd,
    guard: CancelGuard,
) -> Response<Body> {
    let body = super::chunked(frames, interval, end, guard);
    base_response(ctx, 200)
        .header(header::CONTENT_TYPE, "application/vnd.amazon.eventstream")
        .body(Body::from_stream(body))
        .expect("sim: valid response")
}

fn converse_json(ctx: &Ctx, body: &Value, guard: CancelGuard) -> Response<Body> {
    guard.finish();
    base_response(ctx, 200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("sim: valid response")
}

fn text_answer(ctx: &Ctx, text: &str, guard: CancelGuard) -> Response<Body> {
    if ctx.stream {
        frames(
            ctx,
            bedrock_stream_frames(&split_words(text)),
            Duration::ZERO,
            StreamEnd::Finish,
            guard,
        )
    } else {
        converse_json(ctx, &bedrock_response(text, "end_turn"), guard)
    }
}

fn failing(ctx: &Ctx, refusal: Refusal, guard: CancelGuard) -> Response<Body> {
    guard.finish();
    error_response(ctx, &refusal)
}

/// Runs `behavior` as Bedrock would answer it (see the module docs).
pub(super) async fn respond(
    ctx: &Ctx,
    behavior: Behavior,
    guard: CancelGuard,
) -> Result<Response<Body>, ResetConnection> {
    let mut behavior = behavior;
    while let Behavior::Delay(d, next) = behavior {
        tokio::time::sleep(d).await;
        behavior = *next;
    }
    let name = &ctx.name;
    Ok(match behavior {
        Behavior::Answer => text_answer(
            ctx,
            &rest_after(&answer_text(name), ctx.prefill.as_deref()),
            guard,
        ),
        Behavior::AnswerText(t) => text_answer(ctx, &rest_after(&t, ctx.prefill.as_deref()), guard),
        Behavior::FailAfter {
            text,
            content,
            fault,
        } => {
            let text = text.unwrap_or_else(|| answer_text(name));
            let pieces = split_words(&rest_after(&text, ctx.prefill.as_deref()));
            let mut f = opening();
            f.extend(text_deltas(&pieces[..content.min(pieces.len())]));
            let end = match fault {
                StreamFault::Cut => StreamEnd::Break,
                StreamFault::Stall => StreamEnd::Stall,
                StreamFault::Error => {
                    f.push(bedrock_exception(
                        "serviceUnavailableException",
                        "Bedrock is unable to process your request.",
                    ));
                    StreamEnd::Finish
                }
            };
            frames(ctx, f, Duration::ZERO, end, guard)
        }
        Behavior::Stream { chunks, interval } => {
            let pieces = stream_pieces(name, chunks);
            if ctx.stream {
                frames(
                    ctx,
                    bedrock_stream_frames(&pieces),
                    interval,
                    StreamEnd::Finish,
                    guard,
                )
            } else {
                converse_json(ctx, &bedrock_response(&pieces.concat(), "end_turn"), guard)
            }
        }
        Behavior::Replay { unary, events } => {
            if ctx.stream {
                let f = events
                    .into_iter()
                    .filter_map(|e| {
                        let (name, payload) = e.as_object()?.iter().next()?;
                        Some(bedrock_event(name, payload.clone()))
                    })
                    .collect();
                frames(ctx, f, Duration::ZERO, StreamEnd::Finish, guard)
            } else {
                converse_json(ctx, &unary, guard)
            }
        }
        Behavior::ToolCall {
            name,
            arguments,
            text,
        } => {
            if ctx.stream {
                let f = bedrock_tool_use_frames(text.as_deref(), &name, &arguments);
                frames(ctx, f, Duration::ZERO, StreamEnd::Finish, guard)
            } else {
                converse_json(
                    ctx,
                    &bedrock_tool_use_response(text.as_deref(), &name, &arguments),
                    guard,
                )
            }
        }
        Behavior::RateLimited { .. } => failing(
            ctx,
            (
                429,
                "ThrottlingException",
                "Too many requests, please wait before trying again.".into(),
            ),
            guard,
        ),
        Behavior::ServerError(503) => failing(
            ctx,
            (
                503,
                "ServiceUnavailableException",
                "Bedrock is unable to process your request.".into(),
            ),
            guard,
        ),
        Behavior::ServerError(s) => failing(
            ctx,
            (
                s,
                "InternalServerException",
                "The server encountered an internal error while processing the request.".into(),
            ),
            guard,
        ),
        Behavior::ContextLength(_) => failing(
            ctx,
            validation("Input is too long for requested model."),
            guard,
        ),
        Behavior::Status { status, body, .. } => {
            guard.finish();
            base_response(ctx, status)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.unwrap_or_else(|| {
                    json!({"message": "simulated"}).to_string()
                })))
                .expect("sim: valid response")
        }
        Behavior::StreamErrorFirst | Behavior::OpeningThenError => {
            let mut f = opening();
            if matches!(behavior, Behavior::OpeningThenError) {
                f.push(bedrock_event(
                    "contentBlockStart",
                    json!({"contentBlockIndex": 0, "start": {}}),
                ));
            }
            f.push(bedrock_exception(
                "serviceUnavailableException",
                "Bedrock is unable to process your request.",
            ));
            frames(ctx, f, Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::StreamThen { chunks, event } => {
            let mut f = opening();
            f.extend(text_deltas(&stream_pieces(name, chunks)));
            f.push(bedrock_exception(
                &event,
                "The model stream failed (simulated).",
            ));
            frames(ctx, f, Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::BreakMidStream { chunks } | Behavior::StallMidStream { chunks } => {
            let end = if matches!(behavior, Behavior::BreakMidStream { .. }) {
                StreamEnd::Break
            } else {
                StreamEnd::Stall
            };
            let mut f = opening();
            f.extend(text_deltas(&stream_pieces(name, chunks)));
            frames(ctx, f, Duration::ZERO, end, guard)
        }
        Behavior::HugeBody { bytes } => {
            let text = "y".repeat(bytes);
            if ctx.stream {
                frames(
                    ctx,
                    bedrock_stream_frames(&[text]),
                    Duration::ZERO,
                    StreamEnd::Finish,
                    guard,
                )
            } else {
                converse_json(ctx, &bedrock_response(&text, "end_turn"), guard)
            }
        }
        Behavior::StreamWithoutContent => {
            frames(ctx, opening(), Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::EmptyStream => frames(ctx, Vec::new(), Duration::ZERO, StreamEnd::Finish, guard),
        Behavior::Hang => {
            std::future::pending::<()>().await;
            unreachable!("pending never completes")
        }
        Behavior::Reset => {
            guard.finish();
            return Err(ResetConnection);
        }
        other => failing(
            ctx,
            (
                500,
                "InternalServerException",
                format!("behaviour {other:?} is not simulated for bedrock"),
            ),
            guard,
        ),
    })
}

/// The body AWS sends with `status` (the type goes in `x-amzn-errortype`).
pub fn bedrock_error_body(status: u16) -> Value {
    let message = match status {
        400 => "Malformed input request, please reformat your input and try again.",
        403 => "The security token included in the request is invalid.",
        404 => "Could not resolve the foundation model from the provided model identifier.",
        429 => "Too many requests, please wait before trying again.",
        503 => "Bedrock is unable to process your request.",
        _ => "The server encountered an internal error while processing the request.",
    };
    json!({"message": message})
}

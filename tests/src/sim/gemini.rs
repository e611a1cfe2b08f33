//! The strict Gemini flavor ([`Flavor::Gemini`](super::Flavor::Gemini)): Google AI's
//! `generateContent` API as the real service takes and answers it.
//!
//! Refused before any behaviour is taken (the request is still recorded and
//! counted), in Google's error shape (`{"error":{"code","message","status"}}`):
//!
//! * paths other than `POST /v1beta/models/{model}:generateContent`,
//!   `POST /v1beta/models/{model}:streamGenerateContent?alt=sse` (without `alt=sse`
//!   Google streams a JSON array, which no SSE client reads: refused here) and
//!   `GET /v1beta/models`: 404;
//! * no `x-goog-api-key`: 403 `PERMISSION_DENIED` (what Google answers an
//!   unidentified caller); the key [`GEMINI_BAD_KEY`]: 400 `API_KEY_INVALID`;
//! * a body that is not a JSON object, or with a top-level field the API does not
//!   have (`model`, `messages`, `stream`, ...): 400 `Invalid JSON payload received.
//!   Unknown name ...`;
//! * `contents[].role` other than `user` / `model`, a turn without parts, a part
//!   that is not exactly one of `text`, `inlineData`, `fileData`, `functionCall`,
//!   `functionResponse`, a `fileData` without `mimeType` and `fileUri`, a
//!   `functionResponse` without `name` or whose `response`
//!   is not an object, `generationConfig` or function declaration fields it does
//!   not have: 400 `INVALID_ARGUMENT`.

use serde_json::{Map, Value, json};

use super::{Endpoint, PROMPT_TOKENS, completion_tokens};

/// `responseId` of every Gemini answer (and of each chunk of a stream).
pub const GEMINI_RESPONSE_ID: &str = "sim-gemini-response";
/// A key the Gemini flavor refuses as Google refuses an unknown one.
pub const GEMINI_BAD_KEY: &str = "bad-gemini-key";

const TOP_LEVEL: [&str; 8] = [
    "contents",
    "systemInstruction",
    "tools",
    "toolConfig",
    "generationConfig",
    "safetySettings",
    "cachedContent",
    "labels",
];

const GENERATION_CONFIG: [&str; 13] = [
    "temperature",
    "topP",
    "topK",
    "maxOutputTokens",
    "stopSequences",
    "candidateCount",
    "presencePenalty",
    "frequencyPenalty",
    "seed",
    "responseMimeType",
    "responseSchema",
    "responseJsonSchema",
    "thinkingConfig",
];

/// Google's error body.
pub fn gemini_error(code: u16, status: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message, "status": status}})
}

/// The error body Google sends with `status`. A 429 carries `RetryInfo` (2 s).
pub fn gemini_error_body(status: u16) -> Value {
    match status {
        400 => gemini_error(
            400,
            "INVALID_ARGUMENT",
            "Request contains an invalid argument.",
        ),
        401 => gemini_error(
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials.",
        ),
        403 => gemini_error(
            403,
            "PERMISSION_DENIED",
            "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
        ),
        404 => gemini_error(
            404,
            "NOT_FOUND",
            "models/unknown is not found for API version v1beta, or is not supported for generateContent.",
        ),
        429 => json!({"error": {
            "code": 429,
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                    "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                    "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2s"}
            ]
        }}),
        503 => gemini_error(
            503,
            "UNAVAILABLE",
            "The model is overloaded. Please try again later.",
        ),
        504 => gemini_error(
            504,
            "DEADLINE_EXCEEDED",
            "Deadline expired before operation could complete.",
        ),
        s if s >= 500 => gemini_error(
            s,
            "INTERNAL",
            "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
        ),
        s => gemini_error(s, "FAILED_PRECONDITION", "Request failed (simulated)."),
    }
}

/// 400 of a prompt over the model's context window, as Google words it.
pub fn gemini_context_length_error() -> Value {
    gemini_error(
        400,
        "INVALID_ARGUMENT",
        "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).",
    )
}

fn usage(out: u64) -> Value {
    json!({"promptTokenCount": PROMPT_TOKENS, "candidatesTokenCount": out,
        "totalTokenCount": PROMPT_TOKENS + out,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": PROMPT_TOKENS}]})
}

fn response(model: &str, parts: Vec<Value>, finish: Option<&str>, usage: Value) -> Value {
    let mut candidate = json!({"content": {"parts": parts, "role": "model"}, "index": 0});
    if let Some(f) = finish {
        candidate["finishReason"] = f.into();
    }
    json!({"candidates": [candidate], "usageMetadata": usage, "modelVersion": model,
        "responseId": GEMINI_RESPONSE_ID})
}

/// A `GenerateContentResponse` answering `text`, stopped for `finish_reason`.
pub fn gemini_response(model: &str, text: &str, finish_reason: &str) -> Value {
    response(
        model,
        vec![json!({"text": text})],
        Some(finish_reason),
        usage(completion_tokens(text)),
    )
}

/// A response whose model calls `name` with `arguments` (after `text`, if any).
pub fn gemini_tool_call_response(
    model: &str,
    text: Option<&str>,
    name: &str,
    arguments: &Value,
) -> Value {
    let mut parts: Vec<Value> = text.map(|t| json!({"text": t})).into_iter().collect();
    parts.push(json!({"functionCall": {"name": name, "args": arguments}}));
    response(model, parts, Some("STOP"), usage(5))
}

/// A prompt blocked by the safety filters: no candidate, `promptFeedback`.
pub fn gemini_blocked_prompt(model: &str) -> Value {
    json!({
        "promptFeedback": {"blockReason": "SAFETY", "safetyRatings": [
            {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH"}]},
        "usageMetadata": {"promptTokenCount": PROMPT_TOKENS, "totalTokenCount": PROMPT_TOKENS},
        "modelVersion": model,
        "responseId": GEMINI_RESPONSE_ID
    })
}

/// `data: {...}\r\n\r\n`: Google's SSE framing (CRLF, no event names, no `[DONE]`).
pub fn gemini_sse(data: &Value) -> String {
    format!("data: {data}\r\n\r\n")
}

/// A streamed answer: one chunk per piece (usage so far in each), the finish reason
/// and final usage in the last.
pub fn gemini_stream_events(model: &str, pieces: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(pieces.len() + 1);
    let mut so_far = String::new();
    for (i, p) in pieces.iter().enumerate() {
        so_far.push_str(p);
        let last = i + 1 == pieces.len();
        out.push(gemini_sse(&response(
            model,
            vec![json!({"text": p})],
            last.then_some("STOP"),
            usage(completion_tokens(&so_far)),
        )));
    }
    if pieces.is_empty() {
        out.push(gemini_sse(&response(
            model,
            vec![json!({"text": ""})],
            Some("STOP"),
            usage(0),
        )));
    }
    out
}

/// A chunk without content: an empty text part, the prompt's usage.
pub fn gemini_empty_chunk(model: &str) -> String {
    gemini_sse(&response(
        model,
        vec![json!({"text": ""})],
        None,
        json!({"promptTokenCount": PROMPT_TOKENS, "totalTokenCount": PROMPT_TOKENS}),
    ))
}

/// A streamed tool call: the text (if any), then the call whole with the finish.
pub fn gemini_tool_call_stream_events(
    model: &str,
    text: Option<&str>,
    name: &str,
    arguments: &Value,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(t) = text {
        out.push(gemini_sse(&response(
            model,
            vec![json!({"text": t})],
            None,
            json!({"promptTokenCount": PROMPT_TOKENS, "totalTokenCount": PROMPT_TOKENS}),
        )));
    }
    out.push(gemini_sse(&response(
        model,
        vec![json!({"functionCall": {"name": name, "args": arguments}})],
        Some("STOP"),
        usage(5),
    )));
    out
}

/// The Gemini flavor's models list.
pub fn gemini_models(ids: &[&str]) -> Value {
    json!({"models": ids.iter().map(|id| json!({
        "name": format!("models/{id}"), "displayName": id,
        "supportedGenerationMethods": ["generateContent", "countTokens"]
    })).collect::<Vec<_>>()})
}

/// Route and validate one request. Returns the endpoint, the model (from the
/// path), whether it streams, and the refusal Google would answer, if any.
pub(super) fn route(
    parts: &axum::http::request::Parts,
    json: Option<&Value>,
) -> (Endpoint, String, bool, Option<(u16, Value)>) {
    let not_found = || {
        (
            404,
            gemini_error(404, "NOT_FOUND", "Requested entity was not found."),
        )
    };
    let path = parts.uri.path();
    let query = parts.uri.query().unwrap_or("");
    let post = parts.method == axum::http::Method::POST;
    let (endpoint, model, stream) = if !post && path == "/v1beta/models" {
        (Endpoint::Models, String::new(), false)
    } else if let Some(rest) = path.strip_prefix("/v1beta/models/").filter(|_| post) {
        match rest.rsplit_once(':') {
            Some((model, "generateContent")) => (Endpoint::Generate, model.to_owned(), false),
            Some((model, "streamGenerateContent")) => {
                if !query.split('&').any(|kv| kv == "alt=sse") {
                    return (
                        Endpoint::Generate,
                        model.to_owned(),
                        true,
                        Some((
                            400,
                            gemini_error(
                                400,
                                "INVALID_ARGUMENT",
                                "sim: streamGenerateContent without alt=sse answers a JSON array, not server-sent events",
                            ),
                        )),
                    );
                }
                (Endpoint::Generate, model.to_owned(), true)
            }
            _ => return (Endpoint::Unknown, String::new(), false, Some(not_found())),
        }
    } else {
        return (Endpoint::Unknown, String::new(), false, Some(not_found()));
    };
    let model = super::percent_decode(&model);
    let key = parts
        .headers
        .get("x-goog-api-key")
        .and_then(|v| v.to_str().ok());
    match key {
        None | Some("") => return (endpoint, model, stream, Some((403, gemini_error_body(403)))),
        Some(GEMINI_BAD_KEY) => {
            let body = json!({"error": {"code": 400,
                "message": "API key not valid. Please pass a valid API key.",
                "status": "INVALID_ARGUMENT",
                "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID", "domain": "googleapis.com",
                    "metadata": {"service": "generativelanguage.googleapis.com"}}]}});
            return (endpoint, model, stream, Some((400, body)));
        }
        Some(_) => {}
    }
    if endpoint == Endpoint::Models {
        return (endpoint, model, stream, None);
    }
    let refusal = json.and_then(Value::as_object).map_or_else(
        || Some("Invalid JSON payload received. Expected an object.".to_owned()),
        check_body,
    );
    (
        endpoint,
        model,
        stream,
        refusal.map(|m| (400, gemini_error(400, "INVALID_ARGUMENT", &m))),
    )
}

fn unknown(name: &str, at: &str) -> String {
    format!("Invalid JSON payload received. Unknown name \"{name}\" at '{at}': Cannot find field.")
}

/// What Google refuses in a `generateContent` body.
pub(super) fn check_body(body: &Map<String, Value>) -> Option<String> {
    for k in body.keys() {
        if !TOP_LEVEL.contains(&k.as_str()) {
            return Some(format!(
                "Invalid JSON payload received. Unknown name \"{k}\": Cannot find field."
            ));
        }
    }
    let contents = body.get("contents").and_then(Value::as_array);
    let Some(contents) = contents.filter(|c| !c.is_empty()) else {
        return Some("* GenerateContentRequest.contents: contents is not specified".into());
    };
    for (i, c) in contents.iter().enumerate() {
        match c.get("role").and_then(Value::as_str) {
            Some("user" | "model") => {}
            _ => return Some("Please use a valid role: user, model.".into()),
        }
        let parts = c.get("parts").and_then(Value::as_array);
        let Some(parts) = parts.filter(|p| !p.is_empty()) else {
            return Some(format!(
                "* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            ));
        };
        for (j, p) in parts.iter().enumerate() {
            let Some(p) = p.as_object() else {
                return Some(format!("contents[{i}].parts[{j}] must be an object"));
            };
            let data: Vec<&String> = p
                .keys()
                .filter(|k| !matches!(k.as_str(), "thought" | "thoughtSignature"))
                .collect();
            if data.len() != 1
                || !matches!(
                    data[0].as_str(),
                    "text" | "inlineData" | "fileData" | "functionCall" | "functionResponse"
                )
            {
                return Some(format!(
                    "* GenerateContentRequest.contents[{i}].parts[{j}].data: required oneof field 'data' must have one initialized field"
                ));
            }
            if let Some(r) = p.get("functionResponse") {
                if r.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    return Some(format!(
                        "* GenerateContentRequest.contents[{i}].parts[{j}].function_response.name: Name cannot be empty."
                    ));
                }
                if !r.get("response").is_some_and(Value::is_object) {
                    return Some(format!(
                        "* GenerateContentRequest.contents[{i}].parts[{j}].function_response.response: must be an object"
                    ));
                }
            }
            if let Some(f) = p.get("functionCall")
                && f.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
            {
                return Some(format!(
                    "* GenerateContentRequest.contents[{i}].parts[{j}].function_call.name: Name cannot be empty."
                ));
            }
            if let Some(d) = p.get("inlineData")
                && (d.get("mimeType").is_none() || d.get("data").is_none())
            {
                return Some(format!(
                    "* GenerateContentRequest.contents[{i}].parts[{j}].inline_data: mimeType and data are required"
                ));
            }
            if let Some(d) = p.get("fileData")
                && (d.get("mimeType").is_none() || d.get("fileUri").is_none())
            {
                return Some(format!(
                    "* GenerateContentRequest.contents[{i}].parts[{j}].file_data: mimeType and fileUri are required"
                ));
            }
        }
    }
    if let Some(g) = body.get("generationConfig").and_then(Value::as_object) {
        for k in g.keys() {
            if !GENERATION_CONFIG.contains(&k.as_str()) {
                return Some(unknown(k, "generation_config"));
            }
        }
    }
    for t in body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for (j, f) in t
            .get("functionDeclarations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            for k in f.as_object().into_iter().flat_map(Map::keys) {
                if !matches!(
                    k.as_str(),
                    "name"
                        | "description"
                        | "parameters"
                        | "parametersJsonSchema"
                        | "response"
                        | "responseJsonSchema"
                        | "behavior"
                ) {
                    return Some(unknown(k, &format!("tools[0].function_declarations[{j}]")));
                }
            }
        }
    }
    None
}

/// Tool calls (`functionCall` parts of `model` turns) in a Gemini request, as
/// (name, args).
pub fn gemini_function_calls(body: &Value) -> Vec<(String, Value)> {
    parts_of(body, "model", "functionCall")
        .map(|f| {
            (
                str_of(f, "name"),
                f.get("args").cloned().unwrap_or(Value::Null),
            )
        })
        .collect()
}

/// Tool results (`functionResponse` parts of `user` turns) in a Gemini request, as
/// (name, response).
pub fn gemini_function_responses(body: &Value) -> Vec<(String, Value)> {
    parts_of(body, "user", "functionResponse")
        .map(|f| {
            (
                str_of(f, "name"),
                f.get("response").cloned().unwrap_or(Value::Null),
            )
        })
        .collect()
}

fn str_of(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_owned()
}

fn parts_of<'a>(body: &'a Value, role: &'a str, kind: &'a str) -> impl Iterator<Item = &'a Value> {
    body.get("contents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(move |c| c.get("role").and_then(Value::as_str) == Some(role))
        .flat_map(|c| {
            c.get("parts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .filter_map(move |p| p.get(kind))
}

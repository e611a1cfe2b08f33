//! The form → a Gemini `generateContent` body. The model is not in the body (it is
//! in the URL), nor is `stream` (the method says it).

use std::collections::HashMap;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::super::dialect::TranslateError;
use super::super::form::{
    DocumentSource, FormatKind, Image, Message, Part, ReasoningKind, Request, Role, ToolChoice,
    ToolOutput,
};
use super::super::schema::{Inexpressible, recursive_ref};
use super::super::vocab::{inexpressible, media_type_of_url, refuse, schema};
use super::shapes::TARGET;

/// The largest thinking budget sent: what Gemini 2.5 Flash takes (Pro takes
/// 32,768, Flash-Lite 24,576).
const MAX_THINKING_BUDGET: u64 = 24576;

pub(in super::super) fn encode_request(
    req: &Request<'_>,
    model: &str,
) -> Result<Value, TranslateError> {
    let mut out = Map::new();
    if !req.system.is_empty() {
        let parts: Vec<Value> = req.system.iter().map(|t| json!({"text": t})).collect();
        out.insert("systemInstruction".into(), json!({"parts": parts}));
    }
    out.insert("contents".into(), Value::Array(contents(&req.messages)));
    if !req.tools.is_empty() {
        // The JSON Schema as the client sent it (`parametersJsonSchema`), not
        // Gemini's OpenAPI subset (`parameters`), which refuses common JSON Schema
        // keywords such as `additionalProperties`.
        let declarations: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), t.name.into());
                if let Some(d) = t.description {
                    f.insert("description".into(), d.into());
                }
                f.insert("parametersJsonSchema".into(), schema(t.schema));
                Value::Object(f)
            })
            .collect();
        out.insert(
            "tools".into(),
            json!([{"functionDeclarations": declarations}]),
        );
    }
    if let Some(tc) = &req.tool_choice {
        let config = match tc {
            ToolChoice::Auto => json!({"mode": "AUTO"}),
            ToolChoice::None => json!({"mode": "NONE"}),
            ToolChoice::Required => json!({"mode": "ANY"}),
            ToolChoice::Tool(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
        };
        out.insert(
            "toolConfig".into(),
            json!({"functionCallingConfig": config}),
        );
    }
    let mut generation = Map::new();
    if let Some(t) = req.temperature {
        generation.insert("temperature".into(), Value::Number(t.clone()));
    }
    if let Some(p) = req.top_p {
        generation.insert("topP".into(), Value::Number(p.clone()));
    }
    if let Some(k) = req.top_k {
        generation.insert("topK".into(), k.into());
    }
    if let Some(n) = req.max_tokens {
        generation.insert("maxOutputTokens".into(), n.into());
    }
    if !req.stop.is_empty() {
        generation.insert("stopSequences".into(), req.stop.clone().into());
    }
    if let Some(f) = &req.format {
        // Gemini models before 3 take function calling or a JSON answer, not both.
        if !req.tools.is_empty() && !model.starts_with("gemini-3") {
            return Err(refuse(
                f.param,
                "a JSON answer together with tools (Gemini models before Gemini 3 take one or the other)",
                &TARGET,
            ));
        }
        generation.insert("responseMimeType".into(), "application/json".into());
        if let FormatKind::JsonSchema(js) = &f.kind {
            // JSON Schema as the client wrote it; Gemini unrolls recursion only to a
            // finite depth, when it is optional: a recursive schema is refused.
            if let Some(r) = recursive_ref(js.schema) {
                let construct = format!("a recursive $ref ({r})");
                let at = Inexpressible {
                    at: String::new(),
                    construct,
                };
                return Err(inexpressible(f.param, at, &TARGET));
            }
            generation.insert("responseJsonSchema".into(), js.schema.clone());
        }
    }
    if let Some(config) = thinking_config(req, model) {
        generation.insert("thinkingConfig".into(), config);
    }
    if !generation.is_empty() {
        generation.insert("candidateCount".into(), 1.into());
        out.insert("generationConfig".into(), Value::Object(generation));
    }
    Ok(Value::Object(out))
}

/// `thinkingConfig` by the table of `form::Effort`: Gemini 3 models by level
/// (`low`, `high`: what every one of them takes; a budget still goes as a budget,
/// which they take for compatibility), earlier ones by budget (at most
/// [`MAX_THINKING_BUDGET`]; 0 turns thinking off, except on Pro models, which cannot
/// and get their least, 128; -1 lets the model decide). The
/// thoughts' text is asked for when the client's API has a place for it.
fn thinking_config(req: &Request<'_>, model: &str) -> Option<Value> {
    let gemini3 = model.starts_with("gemini-3");
    let mut config = Map::new();
    if let Some(r) = req.reasoning {
        match (r.kind, gemini3) {
            (ReasoningKind::Effort(e), true) => {
                let level = if e.coarse() == super::super::form::Effort::Low {
                    "low"
                } else {
                    "high"
                };
                config.insert("thinkingLevel".into(), level.into());
            }
            (ReasoningKind::Off, true) => {
                config.insert("thinkingLevel".into(), "low".into());
            }
            (ReasoningKind::Effort(e), false) => {
                config.insert(
                    "thinkingBudget".into(),
                    e.budget().min(MAX_THINKING_BUDGET).into(),
                );
            }
            (ReasoningKind::Budget(b), _) => {
                config.insert("thinkingBudget".into(), b.min(MAX_THINKING_BUDGET).into());
            }
            // Pro models cannot turn thinking off: their least budget.
            (ReasoningKind::Off, false) => {
                let least = if model.contains("-pro") { 128 } else { 0 };
                config.insert("thinkingBudget".into(), least.into());
            }
            (ReasoningKind::Adaptive, _) => {
                config.insert("thinkingBudget".into(), (-1).into());
            }
        }
    }
    let off = req.reasoning.is_some_and(|r| r.kind == ReasoningKind::Off);
    if req.reasoning_content && !off {
        config.insert("includeThoughts".into(), true.into());
    }
    (!config.is_empty()).then_some(Value::Object(config))
}

/// Turns merged so roles alternate (`user` / `model`), tool results in the user
/// turn around them, each naming the function of the call it answers.
fn contents(messages: &[Message<'_>]) -> Vec<Value> {
    // Tool call id → function name, from the conversation so far (decoders refuse a
    // result whose call is not in it).
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut turns: Vec<(Role, Vec<Value>)> = Vec::with_capacity(messages.len());
    for m in messages {
        let mut parts = Vec::with_capacity(m.content.len());
        for p in &m.content {
            if let Part::ToolUse(t) = p {
                names.insert(&t.id, t.name);
            }
            if let Some(v) = part(p, &names) {
                parts.push(v);
            }
            // A tool result's images and documents follow its functionResponse, in
            // the same turn (a functionResponse holds JSON only).
            if let Part::ToolResult(r) = p
                && let ToolOutput::Parts(ps) = &r.content
            {
                parts.extend(
                    ps.iter()
                        .filter(|p| !matches!(p, Part::Text(_)))
                        .filter_map(|p| part(p, &names)),
                );
            }
        }
        match turns.last_mut() {
            Some((r, ps)) if *r == m.role => ps.extend(parts),
            _ => turns.push((m.role, parts)),
        }
    }
    turns
        .into_iter()
        .map(|(role, mut parts)| {
            if parts.is_empty() {
                // Gemini refuses a turn without parts.
                parts.push(json!({"text": ""}));
            }
            let role = match role {
                Role::User => "user",
                Role::Assistant => "model",
            };
            json!({"role": role, "parts": parts})
        })
        .collect()
}

fn part(p: &Part<'_>, names: &HashMap<&str, &str>) -> Option<Value> {
    Some(match p {
        // Gemini refuses empty text parts beside others.
        Part::Text("") => return None,
        Part::Text(t) => json!({"text": t}),
        Part::Image(Image::Base64 { media_type, data }) => {
            json!({"inlineData": {"mimeType": media_type, "data": data}})
        }
        // Decoders keep a URL only when its name tells its media type.
        Part::Image(Image::Url(url)) => file_data(url, "image/jpeg"),
        Part::Document(d) => match d.source {
            DocumentSource::Base64 { media_type, data } => {
                json!({"inlineData": {"mimeType": media_type, "data": data}})
            }
            DocumentSource::Text(text) => {
                let data = base64::engine::general_purpose::STANDARD.encode(text);
                json!({"inlineData": {"mimeType": "text/plain", "data": data}})
            }
            DocumentSource::Url(url) => file_data(url, "application/pdf"),
        },
        // Reasoning goes back to no one but the provider that made it (Gemini's
        // thought signatures do not travel through other APIs).
        Part::Reasoning(_) | Part::RedactedReasoning(_) => return None,
        // Only in answers: as text.
        Part::Json(v) => json!({"text": v.to_string()}),
        Part::ToolUse(t) => json!({"functionCall": {"name": t.name, "args": t.input}}),
        Part::ToolResult(r) => {
            let text = r.content.text().into_owned();
            let name = names.get(r.tool_use_id).copied().unwrap_or(r.tool_use_id);
            json!({"functionResponse": {"name": name, "response": response(text, r.is_error)}})
        }
    })
}

/// A file Google fetches (`fileData`), typed by its name (else `fallback`).
fn file_data(url: &str, fallback: &str) -> Value {
    let media_type = media_type_of_url(url).unwrap_or(fallback);
    json!({"fileData": {"mimeType": media_type, "fileUri": url}})
}

/// A tool result as `functionResponse.response`, which must be a JSON object: a
/// result that is one goes as it is; anything else is wrapped by Google's
/// convention, `{"output": text}`, or `{"error": text}` for a failed call (whose
/// flag an object sent as it is would lose).
fn response(text: String, is_error: bool) -> Value {
    if !is_error && let Ok(object @ Value::Object(_)) = serde_json::from_str::<Value>(&text) {
        return object;
    }
    let key = if is_error { "error" } else { "output" };
    json!({ key: text })
}

//! The form → a Gemini `generateContent` body. The model is not in the body (it is
//! in the URL), nor is `stream` (the method says it).

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::super::form::{Image, Message, Part, Request, Role, ToolChoice, ToolOutput};
use super::super::vocab::schema;

pub(in super::super) fn encode_request(req: &Request<'_>) -> Value {
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
    if !generation.is_empty() {
        generation.insert("candidateCount".into(), 1.into());
        out.insert("generationConfig".into(), Value::Object(generation));
    }
    Value::Object(out)
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
        // Decoders refuse images by URL for this target (`TARGET.image_urls`).
        Part::Image(Image::Url(_)) => return None,
        Part::Document(d) => json!({"inlineData": {"mimeType": d.media_type, "data": d.data}}),
        Part::ToolUse(t) => json!({"functionCall": {"name": t.name, "args": t.input}}),
        Part::ToolResult(r) => {
            let text = match &r.content {
                ToolOutput::Text(s) => (*s).to_owned(),
                ToolOutput::Parts(ts) => ts.concat(),
            };
            let name = names.get(r.tool_use_id).copied().unwrap_or(r.tool_use_id);
            json!({"functionResponse": {"name": name, "response": response(text, r.is_error)}})
        }
    })
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

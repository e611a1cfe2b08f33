//! The form → a Bedrock `Converse` / `ConverseStream` body. The model is not in the
//! body (it is in the URL: `/model/{modelId}/converse`), nor is `stream` (the path
//! says it).

use serde_json::{Map, Value, json};

use super::super::form::{Image, Message, Part, Request, Role, ToolChoice, ToolOutput};
use super::super::vocab::schema;

pub(in super::super) fn encode_request(req: &Request<'_>) -> Value {
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(messages(&req.messages)));
    if !req.system.is_empty() {
        let blocks: Vec<Value> = req.system.iter().map(|t| json!({"text": t})).collect();
        out.insert("system".into(), Value::Array(blocks));
    }
    // Converse has no "none": without tool blocks in the conversation the tools are
    // left out, which is exactly "call none" (the pipeline refuses `none` beside
    // tool history, where Bedrock requires `toolConfig`).
    let no_tools = req.tool_choice == Some(ToolChoice::None);
    if !req.tools.is_empty() && !no_tools {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut spec = Map::new();
                spec.insert("name".into(), t.name.into());
                if let Some(d) = t.description.filter(|d| !d.is_empty()) {
                    spec.insert("description".into(), d.into());
                }
                spec.insert("inputSchema".into(), json!({"json": schema(t.schema)}));
                json!({"toolSpec": spec})
            })
            .collect();
        let mut config = Map::new();
        config.insert("tools".into(), Value::Array(tools));
        match &req.tool_choice {
            Some(ToolChoice::Auto) => {
                config.insert("toolChoice".into(), json!({"auto": {}}));
            }
            Some(ToolChoice::Required) => {
                config.insert("toolChoice".into(), json!({"any": {}}));
            }
            Some(ToolChoice::Tool(name)) => {
                config.insert("toolChoice".into(), json!({"tool": {"name": name}}));
            }
            Some(ToolChoice::None) | None => {}
        }
        out.insert("toolConfig".into(), Value::Object(config));
    }
    let mut inference = Map::new();
    if let Some(n) = req.max_tokens {
        inference.insert("maxTokens".into(), n.into());
    }
    if let Some(t) = req.temperature {
        inference.insert("temperature".into(), Value::Number(t.clone()));
    }
    if let Some(p) = req.top_p {
        inference.insert("topP".into(), Value::Number(p.clone()));
    }
    if !req.stop.is_empty() {
        inference.insert("stopSequences".into(), req.stop.clone().into());
    }
    if !inference.is_empty() {
        out.insert("inferenceConfig".into(), Value::Object(inference));
    }
    Value::Object(out)
}

/// Turns merged so roles alternate (Converse requires it), empty text left out (it
/// refuses blank text blocks), turns left empty dropped.
fn messages(messages: &[Message<'_>]) -> Vec<Value> {
    let mut turns: Vec<(Role, Vec<Value>)> = Vec::with_capacity(messages.len());
    let mut documents = 0usize;
    for m in messages {
        let blocks: Vec<Value> = m
            .content
            .iter()
            .filter_map(|p| block(p, &mut documents))
            .collect();
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((r, bs)) if *r == m.role => bs.extend(blocks),
            _ => turns.push((m.role, blocks)),
        }
    }
    turns
        .into_iter()
        .map(|(role, content)| {
            let role = match role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            json!({"role": role, "content": content})
        })
        .collect()
}

/// `image/png` → `png` (Converse names the format, not the media type).
fn format_of(media_type: &str) -> &str {
    media_type
        .rsplit_once('/')
        .map_or(media_type, |(_, sub)| sub)
}

fn block(p: &Part<'_>, documents: &mut usize) -> Option<Value> {
    Some(match p {
        Part::Text("") => return None,
        Part::Text(t) => json!({"text": t}),
        Part::Image(Image::Base64 { media_type, data }) => {
            json!({"image": {"format": format_of(media_type), "source": {"bytes": data}}})
        }
        // Decoders refuse images by URL for this target (`TARGET.image_urls`).
        Part::Image(Image::Url(_)) => return None,
        Part::Document(d) => {
            *documents += 1;
            // Converse requires a name (letters, digits, spaces, hyphens, parentheses
            // and brackets): the title cleaned, else a made-up one.
            let name: String = d
                .title
                .unwrap_or("")
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || " -()[]".contains(*c))
                .collect();
            let name = match name.trim() {
                "" => format!("document-{documents}"),
                n => n.to_string(),
            };
            json!({"document": {"format": format_of(d.media_type), "name": name,
                "source": {"bytes": d.data}}})
        }
        Part::ToolUse(t) => {
            json!({"toolUse": {"toolUseId": t.id, "name": t.name, "input": t.input}})
        }
        Part::ToolResult(r) => {
            let content: Vec<Value> = match &r.content {
                ToolOutput::Text(s) => vec![json!({"text": s})],
                ToolOutput::Parts(ts) => ts.iter().map(|t| json!({"text": t})).collect(),
            };
            let mut result = Map::new();
            result.insert("toolUseId".into(), r.tool_use_id.into());
            result.insert("content".into(), Value::Array(content));
            if r.is_error {
                result.insert("status".into(), "error".into());
            }
            json!({"toolResult": result})
        }
    })
}

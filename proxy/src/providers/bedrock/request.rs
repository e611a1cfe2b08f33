//! The form → a Bedrock `Converse` / `ConverseStream` body. The model is not in the
//! body (it is in the URL: `/model/{modelId}/converse`), nor is `stream` (the path
//! says it).

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::super::anthropic::{fit_budget, reasoning_gives_way};
use super::super::dialect::{Defaults, TranslateError};
use super::super::form::{
    DocumentSource, Effort, FormatKind, Image, Message, Part, ReasoningKind, Request, Role,
    ToolChoice, ToolOutput,
};
use super::super::schema::claude_subset;
use super::super::vocab::{JSON_TOOL, JSON_TOOL_DESCRIPTION, inexpressible, refuse, schema};
use super::shapes::TARGET;

/// The model families whose reasoning Converse carries, each in its own
/// `additionalModelRequestFields`, told by the model id.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Claude,
    Nova,
    GptOss,
    Other,
}

fn family(model: &str) -> Family {
    if model.contains("anthropic.") || model.contains("claude") {
        Family::Claude
    } else if model.contains("amazon.nova") {
        Family::Nova
    } else if model.contains("openai.gpt-oss") {
        Family::GptOss
    } else {
        Family::Other
    }
}

pub(in super::super) fn encode_request(
    req: &Request<'_>,
    model: &str,
    defaults: &Defaults,
) -> Result<Value, TranslateError> {
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(messages(&req.messages)));
    if !req.system.is_empty() {
        let blocks: Vec<Value> = req.system.iter().map(|t| json!({"text": t})).collect();
        out.insert("system".into(), Value::Array(blocks));
    }
    let family = family(model);
    let (fields, budget) = reasoning_fields(req, family)?;
    if let Some(config) = tool_config(req) {
        out.insert("toolConfig".into(), config);
    }
    if let Some(f) = &req.format
        && let FormatKind::JsonSchema(js) = &f.kind
    {
        let schema = claude_subset(js.schema).map_err(|e| inexpressible(f.param, e, &TARGET))?;
        let mut definition = Map::new();
        // Converse takes the schema as a JSON string.
        definition.insert("schema".into(), schema.to_string().into());
        if let Some(n) = js.name {
            definition.insert("name".into(), n.into());
        }
        if let Some(d) = js.description {
            definition.insert("description".into(), d.into());
        }
        out.insert(
            "outputConfig".into(),
            json!({"textFormat": {"type": "json_schema", "structure": {"jsonSchema": definition}}}),
        );
    }
    let mut inference = Map::new();
    // Claude's thinking counts in the limit, which must leave room for it (see
    // `anthropic::fit_budget`).
    let (max_tokens, fields) = match (req.max_tokens, budget, fields) {
        (Some(n), Some(b), Some(f)) if b > 0 => {
            let thinking = fit_budget(f["thinking"].clone(), b, n);
            (Some(n), thinking.map(|t| json!({"thinking": t})))
        }
        (None, Some(b), f) if b > 0 => (Some(b.saturating_add(u64::from(defaults.max_tokens))), f),
        (n, _, f) => (n, f),
    };
    if let Some(f) = fields {
        out.insert("additionalModelRequestFields".into(), f);
    }
    if let Some(n) = max_tokens {
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
    Ok(Value::Object(out))
}

/// `toolConfig`: the client's tools, and the JSON tool for `json_object` (see
/// `vocab::JSON_TOOL`). Converse has no "none": without tool blocks in the
/// conversation the tools are left out, which is exactly "call none" (`none`
/// beside tool history, where Bedrock requires `toolConfig`, is refused before).
fn tool_config(req: &Request<'_>) -> Option<Value> {
    let json_tool = matches!(
        req.format.as_ref().map(|f| &f.kind),
        Some(FormatKind::JsonObject)
    );
    let no_tools = req.tool_choice == Some(ToolChoice::None) && !json_tool;
    if (req.tools.is_empty() || no_tools) && !json_tool {
        return None;
    }
    let mut tools: Vec<Value> = req
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
    let forced = json!({"tool": {"name": JSON_TOOL}});
    let choice = match &req.tool_choice {
        _ if json_tool && req.tools.is_empty() => Some(forced),
        Some(ToolChoice::None) if json_tool => Some(forced),
        None | Some(ToolChoice::Auto) if json_tool => Some(json!({"any": {}})),
        Some(ToolChoice::Auto) => Some(json!({"auto": {}})),
        Some(ToolChoice::Required) => Some(json!({"any": {}})),
        Some(ToolChoice::Tool(name)) => Some(json!({"tool": {"name": name}})),
        Some(ToolChoice::None) | None => None,
    };
    if json_tool {
        tools.push(
            json!({"toolSpec": {"name": JSON_TOOL, "description": JSON_TOOL_DESCRIPTION,
            "inputSchema": {"json": {"type": "object"}}}}),
        );
    }
    let mut config = Map::new();
    config.insert("tools".into(), Value::Array(tools));
    if let Some(c) = choice {
        config.insert("toolChoice".into(), c);
    }
    Some(Value::Object(config))
}

/// How much to reason, in the `additionalModelRequestFields` of the model's family
/// (by the table of `form::Effort`): Claude's `thinking` budget, Nova's
/// `reasoningConfig` level, gpt-oss's `reasoning_effort`; and Claude's budget (0
/// for adaptive), which the output limit must leave room for. Another family has no
/// reasoning setting Converse can carry: refused. Claude's thinking gives way to
/// what Claude cannot think with (see `anthropic::reasoning_gives_way`).
fn reasoning_fields(
    req: &Request<'_>,
    family: Family,
) -> Result<(Option<Value>, Option<u64>), TranslateError> {
    let Some(r) = req.reasoning else {
        return Ok((None, None));
    };
    if r.kind == ReasoningKind::Off {
        return Ok((None, None));
    }
    let level = |kind| match kind {
        ReasoningKind::Effort(e) => Some(e.coarse().as_str()),
        ReasoningKind::Budget(b) => Some(Effort::of_budget(b).as_str()),
        _ => None,
    };
    Ok(match family {
        Family::Claude => {
            if reasoning_gives_way(req) {
                return Ok((None, None));
            }
            let (config, budget) = match r.kind {
                ReasoningKind::Adaptive => (json!({"type": "adaptive"}), 0),
                ReasoningKind::Effort(e) => (
                    json!({"type": "enabled", "budget_tokens": e.budget()}),
                    e.budget(),
                ),
                ReasoningKind::Budget(b) => (json!({"type": "enabled", "budget_tokens": b}), b),
                ReasoningKind::Off => return Ok((None, None)),
            };
            (Some(json!({"thinking": config})), Some(budget))
        }
        Family::Nova => (
            level(r.kind)
                .map(|l| json!({"reasoningConfig": {"type": "enabled", "maxReasoningEffort": l}})),
            None,
        ),
        Family::GptOss => (level(r.kind).map(|l| json!({"reasoning_effort": l})), None),
        Family::Other => {
            return Err(refuse(
                r.param,
                "reasoning settings for this model family (Converse carries Claude's, Nova's and gpt-oss's)",
                &TARGET,
            ));
        }
    })
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
        // Decoders put the fetched bytes in place of a URL for this target.
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
            let (format, bytes) = match d.source {
                DocumentSource::Base64 { media_type, data } => {
                    (format_of(media_type), data.to_owned())
                }
                DocumentSource::Text(text) => (
                    "txt",
                    base64::engine::general_purpose::STANDARD.encode(text),
                ),
                DocumentSource::Url(_) => return None,
            };
            json!({"document": {"format": format, "name": name, "source": {"bytes": bytes}}})
        }
        // Reasoning goes back with its signature (Claude requires it); unsigned
        // reasoning (another provider's) is left out.
        Part::Reasoning(r) => {
            let signature = r.signature?;
            json!({"reasoningContent": {"reasoningText": {"text": r.text, "signature": signature}}})
        }
        Part::RedactedReasoning(data) => {
            json!({"reasoningContent": {"redactedContent": data}})
        }
        // Only in answers: as text.
        Part::Json(v) => json!({"text": v.to_string()}),
        Part::ToolUse(t) => {
            json!({"toolUse": {"toolUseId": t.id, "name": t.name, "input": t.input}})
        }
        Part::ToolResult(r) => {
            let content: Vec<Value> = match &r.content {
                ToolOutput::Text(s) => vec![json!({"text": s})],
                ToolOutput::Parts(ps) => ps.iter().filter_map(|p| block(p, documents)).collect(),
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

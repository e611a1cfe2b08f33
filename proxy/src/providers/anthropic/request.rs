//! Messages request bodies ↔ the form (see the `translate` module docs for the
//! mapping and the table of parameters refused or dropped).

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use super::super::dialect::{Defaults, TranslateError};
use super::super::form::{
    Document, Image, Message, Part, Request, Role, Target, Tool, ToolChoice, ToolOutput,
    ToolResult, ToolUse,
};
use super::super::vocab::{
    IMAGE_URL, UNKNOWN_CALL, description, invalid, number, present, refuse, schema, str_at,
    temperature, text_of, token_count, tools_array,
};

// ---------------------------------------------------------------------------------
// Decode: an Anthropic client's body → the form
// ---------------------------------------------------------------------------------

/// Every top-level field is accounted for (see the OpenAI decoder), in the body's
/// (sorted) key order.
pub(in super::super) fn decode_request<'a>(
    req: &'a Map<String, Value>,
    target: &Target,
) -> Result<Request<'a>, TranslateError> {
    let mut out = Request {
        parallel_tool_calls: true,
        ..Request::default()
    };
    for (key, value) in req {
        if value.is_null() {
            continue;
        }
        let k = key.as_str();
        match k {
            "model" | "messages" | "system" | "tools" | "tool_choice" => {}
            "max_tokens" => out.max_tokens = Some(token_count(value, k)?),
            "temperature" => out.temperature = Some(temperature(value, target)?),
            "top_p" => out.top_p = Some(number(value, k)?),
            "stop_sequences" => {
                out.stop = value
                    .as_array()
                    .and_then(|a| a.iter().map(Value::as_str).collect::<Option<_>>())
                    .ok_or_else(|| invalid(k, "stop_sequences must be an array of strings"))?;
            }
            "stream" => {
                out.stream = Some(
                    value
                        .as_bool()
                        .ok_or_else(|| invalid(k, "stream must be a boolean"))?,
                );
            }
            "metadata" => out.user = value.get("user_id").and_then(Value::as_str),
            "top_k" if !target.top_k => return Err(refuse(k, "top_k", target)),
            "top_k" => out.top_k = Some(token_count(value, k)?),
            "thinking" => {
                if str_at(value, "type") != Some("disabled") {
                    return Err(refuse(k, "extended thinking", target));
                }
            }
            // Scheduling and prompt-caching hints: the answer is the same without them.
            "service_tier" | "cache_control" => {}
            "container" | "mcp_servers" | "context_management" => {
                return Err(refuse(k, k, target));
            }
            _ => return Err(refuse(k, &format!("the parameter {k}"), target)),
        }
    }
    if let Some(system) = present(req, "system") {
        out.system = decode_system(system)?;
    }
    decode_messages(req, target, &mut out)?;
    out.tools = decode_tools(req, target)?;
    if let Some(tc) = present(req, "tool_choice") {
        out.tool_choice = Some(match str_at(tc, "type").unwrap_or("") {
            "auto" => ToolChoice::Auto,
            "any" => ToolChoice::Required,
            "none" => ToolChoice::None,
            "tool" => ToolChoice::Tool(str_at(tc, "name").ok_or_else(|| {
                invalid("tool_choice.name", "tool_choice of type tool needs a name")
            })?),
            other => {
                return Err(invalid(
                    "tool_choice.type",
                    format!("unknown tool_choice {other:?}"),
                ));
            }
        });
        if tc.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            out.parallel_tool_calls = false;
        }
    }
    Ok(out)
}

fn decode_system(system: &Value) -> Result<Vec<&str>, TranslateError> {
    match system {
        Value::String(s) if s.is_empty() => Ok(Vec::new()),
        Value::String(s) => Ok(vec![s.as_str()]),
        // `cache_control` on a block is dropped with the block's other attributes.
        Value::Array(blocks) => blocks
            .iter()
            .enumerate()
            .map(|(j, b)| {
                if str_at(b, "type") != Some("text") {
                    return Err(invalid(
                        format!("system[{j}].type"),
                        "system blocks must be text",
                    ));
                }
                text_of(b, || format!("system[{j}]"))
            })
            .collect(),
        _ => Err(invalid("system", "system must be a string or text blocks")),
    }
}

fn decode_messages<'a>(
    req: &'a Map<String, Value>,
    target: &Target,
    out: &mut Request<'a>,
) -> Result<(), TranslateError> {
    let messages = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("messages", "messages must be an array"))?;
    out.messages.reserve(messages.len());
    // Tool call ids so far, for a target whose tool results name their function.
    let mut calls: Vec<&str> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = str_at(m, "role").unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        let (role, content) = match (role, content) {
            ("user", Value::String(s)) => (Role::User, vec![Part::Text(s)]),
            ("assistant", Value::String(s)) => (Role::Assistant, vec![Part::Text(s)]),
            ("user", Value::Array(blocks)) => (Role::User, user_blocks(blocks, i, target)?),
            ("assistant", Value::Array(blocks)) => {
                (Role::Assistant, assistant_blocks(blocks, i, target)?)
            }
            ("user" | "assistant", _) => {
                return Err(invalid(
                    format!("messages[{i}].content"),
                    "content must be a string or an array of blocks",
                ));
            }
            (other, _) => {
                return Err(invalid(
                    format!("messages[{i}].role"),
                    format!("unknown message role {other:?}"),
                ));
            }
        };
        if target.tool_result_names {
            for (j, p) in content.iter().enumerate() {
                match p {
                    Part::ToolUse(t) => calls.push(match &t.id {
                        Cow::Borrowed(id) => id,
                        Cow::Owned(_) => "",
                    }),
                    Part::ToolResult(r) if !calls.contains(&r.tool_use_id) => {
                        return Err(refuse(
                            format!("messages[{i}].content[{j}].tool_use_id"),
                            UNKNOWN_CALL,
                            target,
                        ));
                    }
                    _ => {}
                }
            }
        }
        out.messages.push(Message { role, content });
    }
    Ok(())
}

fn image<'a>(b: &'a Value, at: &str, target: &Target) -> Result<Image<'a>, TranslateError> {
    let source = b.get("source");
    let field = |k: &str| source.and_then(|s| str_at(s, k)).unwrap_or("");
    match source.and_then(|s| str_at(s, "type")) {
        Some("base64") => Ok(Image::Base64 {
            media_type: field("media_type"),
            data: field("data"),
        }),
        Some("url") if target.image_urls => Ok(Image::Url(field("url"))),
        Some("url") => Err(refuse(format!("{at}.source.url"), IMAGE_URL, target)),
        _ => Err(refuse(
            format!("{at}.source.type"),
            "an image source other than base64 or url",
            target,
        )),
    }
}

fn user_blocks<'a>(
    blocks: &'a [Value],
    i: usize,
    target: &Target,
) -> Result<Vec<Part<'a>>, TranslateError> {
    let mut out = Vec::with_capacity(blocks.len());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let part = match str_at(b, "type") {
            Some("text") => Part::Text(text_of(b, || at.clone())?),
            Some("image") => Part::Image(image(b, &at, target)?),
            Some("document") => {
                let source = b.get("source");
                let get = |k: &str| source.and_then(|s| str_at(s, k));
                if get("type") != Some("base64") || get("media_type") != Some("application/pdf") {
                    return Err(refuse(
                        at + ".source",
                        "a document other than a base64 PDF",
                        target,
                    ));
                }
                Part::Document(Document {
                    media_type: "application/pdf",
                    data: get("data").unwrap_or(""),
                    title: str_at(b, "title"),
                })
            }
            Some("tool_result") => {
                let content = match b.get("content") {
                    None | Some(Value::Null) => ToolOutput::Text(""),
                    Some(Value::String(s)) => ToolOutput::Text(s),
                    Some(Value::Array(inner)) => {
                        let mut texts = Vec::with_capacity(inner.len());
                        for (k, c) in inner.iter().enumerate() {
                            if str_at(c, "type") != Some("text") {
                                return Err(refuse(
                                    format!("{at}.content[{k}].type"),
                                    "a tool result that is not text",
                                    target,
                                ));
                            }
                            texts.push(text_of(c, || format!("{at}.content[{k}]"))?);
                        }
                        ToolOutput::Parts(texts)
                    }
                    Some(_) => {
                        return Err(invalid(
                            at + ".content",
                            "tool_result content must be a string or blocks",
                        ));
                    }
                };
                Part::ToolResult(ToolResult {
                    tool_use_id: str_at(b, "tool_use_id").unwrap_or_default(),
                    content,
                    is_error: b.get("is_error") == Some(&Value::Bool(true)),
                })
            }
            other => {
                return Err(refuse(
                    at + ".type",
                    &format!(
                        "a block of type {:?} in a user message",
                        other.unwrap_or("")
                    ),
                    target,
                ));
            }
        };
        out.push(part);
    }
    Ok(out)
}

fn assistant_blocks<'a>(
    blocks: &'a [Value],
    i: usize,
    target: &Target,
) -> Result<Vec<Part<'a>>, TranslateError> {
    let mut out = Vec::with_capacity(blocks.len());
    for (j, b) in blocks.iter().enumerate() {
        match str_at(b, "type") {
            Some("text") => out.push(Part::Text(str_at(b, "text").unwrap_or(""))),
            Some("tool_use") => out.push(Part::ToolUse(tool_use(b))),
            // Earlier reasoning has no place in the form; the answer stands without it.
            Some("thinking" | "redacted_thinking") => {}
            other => {
                return Err(refuse(
                    format!("messages[{i}].content[{j}].type"),
                    &format!(
                        "a block of type {:?} in an assistant message",
                        other.unwrap_or("")
                    ),
                    target,
                ));
            }
        }
    }
    Ok(out)
}

/// A `tool_use` block, in a request's history or an answer.
pub(super) fn tool_use(b: &Value) -> ToolUse<'_> {
    ToolUse {
        id: Cow::Borrowed(str_at(b, "id").unwrap_or("")),
        name: str_at(b, "name").unwrap_or(""),
        input: match b.get("input") {
            Some(input) => Cow::Borrowed(input),
            None => Cow::Owned(json!({})),
        },
    }
}

fn decode_tools<'a>(
    req: &'a Map<String, Value>,
    target: &Target,
) -> Result<Vec<Tool<'a>>, TranslateError> {
    tools_array(req)?
        .iter()
        .enumerate()
        .map(|(j, t)| {
            if let Some(ty) = str_at(t, "type")
                && ty != "custom"
            {
                return Err(refuse(
                    format!("tools[{j}].type"),
                    &format!("the server tool {ty}"),
                    target,
                ));
            }
            let t = t
                .as_object()
                .ok_or_else(|| invalid(format!("tools[{j}]"), "a tool must be an object"))?;
            Ok(Tool {
                name: t
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("tools[{j}].name"), "a tool needs a name"))?,
                description: description(t, || format!("tools[{j}].description"))?,
                schema: present(t, "input_schema"),
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------
// Encode: the form → an Anthropic target's body
// ---------------------------------------------------------------------------------

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

pub(in super::super) fn encode_request(
    req: &Request<'_>,
    model: &str,
    defaults: &Defaults,
) -> Value {
    let mut out = Map::new();
    out.insert("model".into(), model.into());
    if let Some(t) = req.temperature {
        out.insert("temperature".into(), Value::Number(t.clone()));
    }
    if let Some(p) = req.top_p {
        out.insert("top_p".into(), Value::Number(p.clone()));
    }
    if let Some(k) = req.top_k {
        out.insert("top_k".into(), k.into());
    }
    if !req.stop.is_empty() {
        out.insert("stop_sequences".into(), req.stop.clone().into());
    }
    if let Some(stream) = req.stream {
        out.insert("stream".into(), stream.into());
    }
    // One leading system prompt: a string, or one text block per part.
    match req.system.as_slice() {
        [] => {}
        [one] => {
            out.insert("system".into(), (*one).into());
        }
        many => {
            let blocks = many.iter().map(|t| text_block(t)).collect();
            out.insert("system".into(), Value::Array(blocks));
        }
    }
    out.insert("messages".into(), Value::Array(turns(&req.messages)));
    // Anthropic requires a limit.
    let max_tokens = req.max_tokens.unwrap_or(u64::from(defaults.max_tokens));
    out.insert("max_tokens".into(), max_tokens.into());

    let has_tools = !req.tools.is_empty();
    if has_tools {
        let tools = req
            .tools
            .iter()
            .map(|t| {
                let mut tool = Map::new();
                tool.insert("name".into(), t.name.into());
                if let Some(d) = t.description {
                    tool.insert("description".into(), d.into());
                }
                tool.insert("input_schema".into(), schema(t.schema));
                Value::Object(tool)
            })
            .collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    let mut tool_choice = req.tool_choice.as_ref().map(|tc| match tc {
        ToolChoice::None => json!({"type": "none"}),
        ToolChoice::Auto => json!({"type": "auto"}),
        ToolChoice::Required => json!({"type": "any"}),
        ToolChoice::Tool(name) => json!({"type": "tool", "name": name}),
    });
    if !req.parallel_tool_calls && has_tools {
        let tc = tool_choice.get_or_insert_with(|| json!({"type": "auto"}));
        if tc["type"] != "none"
            && let Some(obj) = tc.as_object_mut()
        {
            obj.insert("disable_parallel_tool_use".into(), true.into());
        }
    }
    if let Some(tc) = tool_choice {
        out.insert("tool_choice".into(), tc);
    }
    if let Some(id) = req.user {
        out.insert("metadata".into(), json!({"user_id": id}));
    }
    Value::Object(out)
}

/// Turns merged so roles alternate, as Anthropic requires (tool results join the
/// user turn around them). A turn that is one text block is sent as a string.
fn turns(messages: &[Message<'_>]) -> Vec<Value> {
    let mut turns: Vec<(Role, Vec<Value>)> = Vec::with_capacity(messages.len());
    for m in messages {
        let blocks = m.content.iter().map(block);
        match turns.last_mut() {
            Some((r, b)) if *r == m.role => b.extend(blocks),
            _ => turns.push((m.role, blocks.collect())),
        }
    }
    turns
        .into_iter()
        .map(|(role, mut blocks)| {
            let role = match role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            let content = match blocks.len() {
                0 => Value::String(String::new()),
                1 if blocks[0]["type"] == "text" => blocks.swap_remove(0)["text"].take(),
                _ => Value::Array(blocks),
            };
            json!({"role": role, "content": content})
        })
        .collect()
}

pub(super) fn block(p: &Part<'_>) -> Value {
    match p {
        Part::Text(t) => text_block(t),
        Part::Image(Image::Url(url)) => {
            json!({"type": "image", "source": {"type": "url", "url": url}})
        }
        Part::Image(Image::Base64 { media_type, data }) => json!({"type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data}}),
        Part::Document(d) => {
            let mut doc = json!({"type": "document",
                "source": {"type": "base64", "media_type": d.media_type, "data": d.data}});
            if let Some(title) = d.title {
                doc["title"] = title.into();
            }
            doc
        }
        Part::ToolUse(t) => {
            json!({"type": "tool_use", "id": t.id, "name": t.name, "input": t.input})
        }
        Part::ToolResult(r) => {
            let content = match &r.content {
                ToolOutput::Text(s) => Value::String((*s).to_owned()),
                ToolOutput::Parts(ts) => Value::Array(ts.iter().map(|t| text_block(t)).collect()),
            };
            let mut b =
                json!({"type": "tool_result", "tool_use_id": r.tool_use_id, "content": content});
            if r.is_error {
                b["is_error"] = true.into();
            }
            b
        }
    }
}

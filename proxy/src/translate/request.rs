//! Request bodies, both ways (see the module docs for the mapping and the table of
//! parameters that are refused or dropped).

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::vocab::{openai_assistant, parse_data_url, parse_object, present, tool_input};
use super::{Defaults, TranslateError};

const ANTHROPIC: &str = "cannot be served by an Anthropic target";
const OPENAI: &str = "cannot be served by an OpenAI target";

fn refuse(param: impl Into<String>, what: &str, target: &str) -> TranslateError {
    TranslateError::unsupported(param, format!("{what} {target}"))
}

fn invalid(param: impl Into<String>, message: impl Into<String>) -> TranslateError {
    TranslateError::invalid(Some(param.into()), message)
}

fn str_field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    obj.get(key).and_then(Value::as_str)
}

fn token_count(v: &Value, param: &str) -> Result<u64, TranslateError> {
    v.as_u64()
        .ok_or_else(|| invalid(param, format!("{param} must be a non-negative integer")))
}

fn text_block(text: impl Into<Value>) -> Value {
    json!({"type": "text", "text": text.into()})
}

// ---------------------------------------------------------------------------------
// Chat completions → messages
// ---------------------------------------------------------------------------------

pub(super) fn chat_to_messages(
    body: &[u8],
    model: &str,
    defaults: &Defaults,
) -> Result<Value, TranslateError> {
    let req = parse_object(body)?;
    let mut out = Map::new();
    out.insert("model".into(), model.into());
    let (mut max_tokens, mut max_completion_tokens) = (None, None);
    let mut parallel_tool_calls = true;
    let (mut user, mut safety_identifier) = (None, None);

    for (key, value) in &req {
        if value.is_null() {
            continue;
        }
        let k = key.as_str();
        match k {
            "model" | "messages" | "tools" | "tool_choice" | "stream_options" => {}
            "max_tokens" => max_tokens = Some(token_count(value, k)?),
            "max_completion_tokens" => max_completion_tokens = Some(token_count(value, k)?),
            "temperature" => {
                let t = value
                    .as_f64()
                    .ok_or_else(|| invalid(k, "temperature must be a number"))?;
                if t > 1.0 {
                    return Err(refuse(k, "temperature above 1", ANTHROPIC));
                }
                out.insert(k.into(), value.clone());
            }
            "top_p" => {
                out.insert(k.into(), value.clone());
            }
            "stop" => {
                let seqs = match value {
                    Value::String(s) => vec![Value::String(s.clone())],
                    Value::Array(a) => a.clone(),
                    _ => return Err(invalid(k, "stop must be a string or an array of strings")),
                };
                if !seqs.is_empty() {
                    out.insert("stop_sequences".into(), Value::Array(seqs));
                }
            }
            "stream" => {
                out.insert(k.into(), value.clone());
            }
            "parallel_tool_calls" => parallel_tool_calls = value.as_bool() != Some(false),
            "user" => user = value.as_str(),
            "safety_identifier" => safety_identifier = value.as_str(),
            "n" if value.as_u64() != Some(1) => return Err(refuse(k, "n > 1", ANTHROPIC)),
            "logprobs" if value.as_bool() != Some(false) => {
                return Err(refuse(k, "logprobs", ANTHROPIC));
            }
            "top_logprobs" if value.as_u64() != Some(0) => {
                return Err(refuse(k, "top_logprobs", ANTHROPIC));
            }
            "presence_penalty" | "frequency_penalty" if value.as_f64() != Some(0.0) => {
                return Err(refuse(k, &format!("a non-zero {k}"), ANTHROPIC));
            }
            "logit_bias" if !value.as_object().is_some_and(Map::is_empty) => {
                return Err(refuse(k, "logit_bias", ANTHROPIC));
            }
            "response_format" => {
                let ty = value.get("type").and_then(Value::as_str).unwrap_or("");
                if ty != "text" {
                    return Err(refuse(
                        k,
                        &format!("response_format {ty:?} (a JSON mode)"),
                        ANTHROPIC,
                    ));
                }
            }
            "modalities" => {
                let text_only = value
                    .as_array()
                    .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text")));
                if !text_only {
                    return Err(refuse(k, "modalities other than text", ANTHROPIC));
                }
            }
            "audio" => return Err(refuse(k, "audio output", ANTHROPIC)),
            "web_search_options" => return Err(refuse(k, "web_search_options", ANTHROPIC)),
            "functions" | "function_call" => {
                return Err(refuse(
                    k,
                    &format!("{k} (deprecated: use tools and tool_choice)"),
                    ANTHROPIC,
                ));
            }
            // Accepted in their neutral form above, or dropped: see the module docs.
            "n"
            | "logprobs"
            | "top_logprobs"
            | "presence_penalty"
            | "frequency_penalty"
            | "logit_bias"
            | "seed"
            | "metadata"
            | "store"
            | "service_tier"
            | "prompt_cache_key"
            | "prompt_cache_retention"
            | "prediction"
            | "reasoning_effort"
            | "verbosity" => {}
            _ => return Err(refuse(k, &format!("the parameter {k}"), ANTHROPIC)),
        }
    }

    let (system, messages) = chat_messages(&req)?;
    if !system.is_empty() {
        let system = if system.len() == 1 {
            system
                .into_iter()
                .next()
                .and_then(|b| b.get("text").cloned())
        } else {
            Some(Value::Array(system))
        };
        out.insert("system".into(), system.unwrap_or_default());
    }
    out.insert("messages".into(), Value::Array(messages));
    out.insert(
        "max_tokens".into(),
        max_completion_tokens
            .or(max_tokens)
            .unwrap_or(u64::from(defaults.max_tokens))
            .into(),
    );

    let tools = chat_tools(&req)?;
    let has_tools = !tools.is_empty();
    if has_tools {
        out.insert("tools".into(), Value::Array(tools));
    }
    let mut tool_choice = match present(&req, "tool_choice") {
        Some(tc) => Some(chat_tool_choice(tc)?),
        None => None,
    };
    if !parallel_tool_calls && has_tools {
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
    if let Some(id) = safety_identifier.or(user) {
        out.insert("metadata".into(), json!({"user_id": id}));
    }
    Ok(Value::Object(out))
}

/// (system text blocks, messages).
fn chat_messages(req: &Map<String, Value>) -> Result<(Vec<Value>, Vec<Value>), TranslateError> {
    let messages = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("messages", "messages must be an array"))?;
    let mut system = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, blocks: Vec<Value>| match turns.last_mut() {
        Some((r, b)) if *r == role => b.extend(blocks),
        _ => turns.push((role, blocks)),
    };
    for (i, m) in messages.iter().enumerate() {
        let m = m
            .as_object()
            .ok_or_else(|| invalid(format!("messages[{i}]"), "a message must be an object"))?;
        match str_field(m, "role").unwrap_or("") {
            "system" | "developer" => {
                for b in chat_text_parts(m.get("content"), i)? {
                    if b["text"].as_str().is_some_and(|t| !t.is_empty()) {
                        system.push(b);
                    }
                }
            }
            "user" => push("user", chat_user_content(m.get("content"), i)?),
            "assistant" => push("assistant", chat_assistant(m, i)?),
            "tool" => {
                let id = str_field(m, "tool_call_id").ok_or_else(|| {
                    invalid(
                        format!("messages[{i}].tool_call_id"),
                        "a tool message needs tool_call_id",
                    )
                })?;
                let content = match m.get("content") {
                    Some(Value::String(s)) => Value::String(s.clone()),
                    other => Value::Array(chat_text_parts(other, i)?),
                };
                push(
                    "user",
                    vec![json!({"type": "tool_result", "tool_use_id": id, "content": content})],
                );
            }
            "function" => {
                return Err(refuse(
                    format!("messages[{i}].role"),
                    "the function role (deprecated: use tool)",
                    ANTHROPIC,
                ));
            }
            other => {
                return Err(invalid(
                    format!("messages[{i}].role"),
                    format!("unknown message role {other:?}"),
                ));
            }
        }
    }
    let messages = turns
        .into_iter()
        .map(|(role, blocks)| json!({"role": role, "content": collapse(blocks)}))
        .collect();
    Ok((system, messages))
}

/// One plain text block is sent as a string.
fn collapse(mut blocks: Vec<Value>) -> Value {
    let single_text = blocks.len() == 1
        && blocks[0]["type"] == "text"
        && blocks[0].as_object().is_some_and(|o| o.len() == 2);
    if single_text {
        return blocks.swap_remove(0)["text"].take();
    }
    if blocks.is_empty() {
        return Value::String(String::new());
    }
    Value::Array(blocks)
}

/// Content that may only hold text (system, developer and tool messages).
fn chat_text_parts(content: Option<&Value>, i: usize) -> Result<Vec<Value>, TranslateError> {
    match content {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![text_block(s.as_str())]),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .filter(|(_, p)| p.get("text").and_then(Value::as_str) != Some(""))
            .map(|(j, p)| match p.get("type").and_then(Value::as_str) {
                Some("text") => Ok(text_block(p.get("text").cloned().unwrap_or_default())),
                other => Err(refuse(
                    format!("messages[{i}].content[{j}].type"),
                    &format!(
                        "a content part of type {:?} in this message",
                        other.unwrap_or("")
                    ),
                    ANTHROPIC,
                )),
            })
            .collect(),
        Some(_) => Err(invalid(
            format!("messages[{i}].content"),
            "content must be a string or an array of parts",
        )),
    }
}

fn chat_user_content(content: Option<&Value>, i: usize) -> Result<Vec<Value>, TranslateError> {
    let parts = match content {
        Some(Value::Array(parts)) => parts,
        other => return chat_text_parts(other, i),
    };
    let mut blocks = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let at = || format!("messages[{i}].content[{j}]");
        match p.get("type").and_then(Value::as_str) {
            Some("text") => {
                // Anthropic rejects empty text blocks.
                if p.get("text").and_then(Value::as_str) != Some("") {
                    blocks.push(text_block(p.get("text").cloned().unwrap_or_default()));
                }
            }
            Some("image_url") => {
                let url = match p.get("image_url") {
                    Some(Value::String(u)) => Some(u.as_str()),
                    Some(o) => o.get("url").and_then(Value::as_str),
                    None => None,
                }
                .ok_or_else(|| invalid(at() + ".image_url.url", "an image part needs a url"))?;
                let source = if url.starts_with("data:") {
                    let (media, data) = parse_data_url(url).ok_or_else(|| {
                        refuse(
                            at() + ".image_url.url",
                            "an image data URL that is not base64",
                            ANTHROPIC,
                        )
                    })?;
                    json!({"type": "base64", "media_type": media, "data": data})
                } else {
                    json!({"type": "url", "url": url})
                };
                blocks.push(json!({"type": "image", "source": source}));
            }
            Some("file") => {
                let file = p.get("file");
                let pdf = file
                    .and_then(|f| f.get("file_data"))
                    .and_then(Value::as_str)
                    .and_then(parse_data_url)
                    .filter(|(media, _)| *media == "application/pdf");
                let Some((media, data)) = pdf else {
                    return Err(refuse(
                        at() + ".file",
                        "a file part other than an inline PDF (file_data)",
                        ANTHROPIC,
                    ));
                };
                let mut doc = json!({"type": "document",
                    "source": {"type": "base64", "media_type": media, "data": data}});
                if let Some(name) = file.and_then(|f| f.get("filename")).and_then(Value::as_str) {
                    doc["title"] = name.into();
                }
                blocks.push(doc);
            }
            other => {
                return Err(refuse(
                    at() + ".type",
                    &format!("a content part of type {:?}", other.unwrap_or("")),
                    ANTHROPIC,
                ));
            }
        }
    }
    Ok(blocks)
}

fn chat_assistant(m: &Map<String, Value>, i: usize) -> Result<Vec<Value>, TranslateError> {
    for k in ["audio", "function_call"] {
        if present(m, k).is_some() {
            return Err(refuse(
                format!("messages[{i}].{k}"),
                &format!("an assistant message with {k}"),
                ANTHROPIC,
            ));
        }
    }
    let tool_calls = present(m, "tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut blocks = Vec::with_capacity(1 + tool_calls.len());
    match m.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            if !s.is_empty() || tool_calls.is_empty() {
                blocks.push(text_block(s.as_str()));
            }
        }
        Some(Value::Array(parts)) => {
            for (j, p) in parts.iter().enumerate() {
                let text = match p.get("type").and_then(Value::as_str) {
                    Some("text") => p.get("text"),
                    Some("refusal") => p.get("refusal"),
                    other => {
                        return Err(refuse(
                            format!("messages[{i}].content[{j}].type"),
                            &format!(
                                "a content part of type {:?} in an assistant message",
                                other.unwrap_or("")
                            ),
                            ANTHROPIC,
                        ));
                    }
                };
                if text.and_then(Value::as_str) != Some("") {
                    blocks.push(text_block(text.cloned().unwrap_or_default()));
                }
            }
        }
        Some(_) => {
            return Err(invalid(
                format!("messages[{i}].content"),
                "content must be a string or an array of parts",
            ));
        }
    }
    if let Some(r) = str_field(m, "refusal") {
        blocks.push(text_block(r));
    }
    for (j, call) in tool_calls.iter().enumerate() {
        let at = format!("messages[{i}].tool_calls[{j}]");
        if call
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("function")
            != "function"
        {
            return Err(refuse(at + ".type", "a custom tool call", ANTHROPIC));
        }
        let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
        let f = call.get("function");
        let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
        let name =
            name.ok_or_else(|| invalid(at.clone() + ".function.name", "a tool call needs a name"))?;
        let args = f
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let Some(input) = tool_input(args) else {
            return Err(refuse(
                at + ".function.arguments",
                "tool call arguments that are not a JSON object",
                ANTHROPIC,
            ));
        };
        blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
    }
    Ok(blocks)
}

/// The request's `tools`, empty when absent.
fn tools_array(req: &Map<String, Value>) -> Result<&[Value], TranslateError> {
    match present(req, "tools") {
        None => Ok(&[]),
        Some(t) => t
            .as_array()
            .map(Vec::as_slice)
            .ok_or_else(|| invalid("tools", "tools must be an array")),
    }
}

fn chat_tools(req: &Map<String, Value>) -> Result<Vec<Value>, TranslateError> {
    tools_array(req)?
        .iter()
        .enumerate()
        .map(|(j, t)| {
            let ty = t.get("type").and_then(Value::as_str).unwrap_or("function");
            if ty != "function" {
                return Err(refuse(
                    format!("tools[{j}].type"),
                    &format!("a tool of type {ty:?}"),
                    ANTHROPIC,
                ));
            }
            let f = t
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    invalid(
                        format!("tools[{j}].function"),
                        "a function tool needs function",
                    )
                })?;
            let mut tool = Map::new();
            tool.insert("name".into(), f.get("name").cloned().unwrap_or_default());
            if let Some(d) = present(f, "description") {
                tool.insert("description".into(), d.clone());
            }
            tool.insert(
                "input_schema".into(),
                present(f, "parameters")
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            );
            Ok(Value::Object(tool))
        })
        .collect()
}

fn chat_tool_choice(tc: &Value) -> Result<Value, TranslateError> {
    match tc {
        Value::String(s) => match s.as_str() {
            "none" => Ok(json!({"type": "none"})),
            "auto" => Ok(json!({"type": "auto"})),
            "required" => Ok(json!({"type": "any"})),
            other => Err(invalid(
                "tool_choice",
                format!("unknown tool_choice {other:?}"),
            )),
        },
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    invalid(
                        "tool_choice.function.name",
                        "a named tool_choice needs a name",
                    )
                })?;
            Ok(json!({"type": "tool", "name": name}))
        }
        Value::Object(o) => {
            let ty = o.get("type").and_then(Value::as_str).unwrap_or("typeless");
            Err(refuse(
                "tool_choice.type",
                &format!("tool_choice {ty:?}"),
                ANTHROPIC,
            ))
        }
        _ => Err(invalid(
            "tool_choice",
            "tool_choice must be a string or an object",
        )),
    }
}

#[derive(Deserialize)]
struct UsagePeek {
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

pub(super) fn include_usage(body: &[u8]) -> bool {
    serde_json::from_slice::<UsagePeek>(body)
        .ok()
        .and_then(|p| p.stream_options?.include_usage)
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------------
// Messages → chat completions
// ---------------------------------------------------------------------------------

pub(super) fn messages_to_chat(
    body: &[u8],
    model: &str,
    defaults: &Defaults,
) -> Result<Value, TranslateError> {
    let req = parse_object(body)?;
    let mut out = Map::new();
    out.insert("model".into(), model.into());
    for (key, value) in &req {
        if value.is_null() {
            continue;
        }
        let k = key.as_str();
        match k {
            "model" | "messages" | "system" | "tools" | "tool_choice" => {}
            "max_tokens" => {
                let field = if defaults.openai_max_completion_tokens {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                };
                out.insert(field.into(), token_count(value, k)?.into());
            }
            "temperature" | "top_p" => {
                out.insert(k.into(), value.clone());
            }
            "stop_sequences" => {
                let seqs = value
                    .as_array()
                    .ok_or_else(|| invalid(k, "stop_sequences must be an array of strings"))?;
                if !seqs.is_empty() {
                    out.insert("stop".into(), value.clone());
                }
            }
            "stream" => {
                out.insert(k.into(), value.clone());
                if value.as_bool() == Some(true) {
                    out.insert("stream_options".into(), json!({"include_usage": true}));
                }
            }
            "metadata" => {
                if let Some(id) = value.get("user_id").and_then(Value::as_str) {
                    out.insert("user".into(), id.into());
                }
            }
            "top_k" => return Err(refuse(k, "top_k", OPENAI)),
            "thinking" => {
                if value.get("type").and_then(Value::as_str) != Some("disabled") {
                    return Err(refuse(k, "extended thinking", OPENAI));
                }
            }
            // Scheduling and prompt-caching hints: the answer is the same without them.
            "service_tier" | "cache_control" => {}
            "container" | "mcp_servers" | "context_management" => {
                return Err(refuse(k, k, OPENAI));
            }
            _ => return Err(refuse(k, &format!("the parameter {k}"), OPENAI)),
        }
    }

    let mut messages = Vec::new();
    if let Some(system) = present(&req, "system")
        && let Some(content) = anthropic_system(system)?
    {
        messages.push(json!({"role": "system", "content": content}));
    }
    anthropic_messages(&req, &mut messages)?;
    out.insert("messages".into(), Value::Array(messages));

    let tools = anthropic_tools(&req)?;
    let has_tools = !tools.is_empty();
    if has_tools {
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(tc) = present(&req, "tool_choice") {
        let ty = tc.get("type").and_then(Value::as_str).unwrap_or("");
        let choice = match ty {
            "auto" => json!("auto"),
            "any" => json!("required"),
            "none" => json!("none"),
            "tool" => {
                let name = tc.get("name").and_then(Value::as_str).ok_or_else(|| {
                    invalid("tool_choice.name", "tool_choice of type tool needs a name")
                })?;
                json!({"type": "function", "function": {"name": name}})
            }
            other => {
                return Err(invalid(
                    "tool_choice.type",
                    format!("unknown tool_choice {other:?}"),
                ));
            }
        };
        out.insert("tool_choice".into(), choice);
        if has_tools && tc.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            out.insert("parallel_tool_calls".into(), false.into());
        }
    }
    Ok(Value::Object(out))
}

fn anthropic_system(system: &Value) -> Result<Option<Value>, TranslateError> {
    match system {
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(Value::String(s.clone()))),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                if b.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(invalid(
                        format!("system[{j}].type"),
                        "system blocks must be text",
                    ));
                }
                parts.push(text_block(b.get("text").cloned().unwrap_or_default()));
            }
            Ok(match parts.len() {
                0 => None,
                _ => Some(collapse(parts)),
            })
        }
        _ => Err(invalid("system", "system must be a string or text blocks")),
    }
}

fn anthropic_messages(
    req: &Map<String, Value>,
    out: &mut Vec<Value>,
) -> Result<(), TranslateError> {
    let messages = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("messages", "messages must be an array"))?;
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        match (role, content) {
            ("user" | "assistant", Value::String(s)) => {
                out.push(json!({"role": role, "content": s}));
            }
            ("user", Value::Array(blocks)) => anthropic_user(blocks, i, out)?,
            ("assistant", Value::Array(blocks)) => out.push(anthropic_assistant(blocks, i)?),
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
        }
    }
    Ok(())
}

fn anthropic_image(b: &Value, at: &str) -> Result<Value, TranslateError> {
    let source = b.get("source");
    let ty = source.and_then(|s| s.get("type")).and_then(Value::as_str);
    let field = |k: &str| {
        source
            .and_then(|s| s.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let url = match ty {
        Some("base64") => format!("data:{};base64,{}", field("media_type"), field("data")),
        Some("url") => field("url").to_owned(),
        _ => {
            return Err(refuse(
                format!("{at}.source.type"),
                "an image source other than base64 or url",
                OPENAI,
            ));
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

fn anthropic_user(blocks: &[Value], i: usize, out: &mut Vec<Value>) -> Result<(), TranslateError> {
    let mut parts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(text_block(b.get("text").cloned().unwrap_or_default())),
            Some("image") => parts.push(anthropic_image(b, &at)?),
            Some("document") => {
                let source = b.get("source");
                let get = |k: &str| source.and_then(|s| s.get(k)).and_then(Value::as_str);
                if get("type") != Some("base64") || get("media_type") != Some("application/pdf") {
                    return Err(refuse(
                        at + ".source",
                        "a document other than a base64 PDF",
                        OPENAI,
                    ));
                }
                let name = b
                    .get("title")
                    .and_then(Value::as_str)
                    .unwrap_or("document.pdf");
                parts.push(json!({"type": "file", "file": {
                    "filename": name,
                    "file_data": format!("data:application/pdf;base64,{}", get("data").unwrap_or("")),
                }}));
            }
            Some("tool_result") => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let content = match b.get("content") {
                    None | Some(Value::Null) => Value::String(String::new()),
                    Some(Value::String(s)) => Value::String(s.clone()),
                    Some(Value::Array(inner)) => {
                        let mut texts = Vec::with_capacity(inner.len());
                        for (k, c) in inner.iter().enumerate() {
                            if c.get("type").and_then(Value::as_str) != Some("text") {
                                return Err(refuse(
                                    format!("{at}.content[{k}].type"),
                                    "a tool result that is not text",
                                    OPENAI,
                                ));
                            }
                            texts.push(text_block(c.get("text").cloned().unwrap_or_default()));
                        }
                        collapse(texts)
                    }
                    Some(_) => {
                        return Err(invalid(
                            at + ".content",
                            "tool_result content must be a string or blocks",
                        ));
                    }
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            other => {
                return Err(refuse(
                    at + ".type",
                    &format!(
                        "a block of type {:?} in a user message",
                        other.unwrap_or("")
                    ),
                    OPENAI,
                ));
            }
        }
    }
    if !parts.is_empty() {
        out.push(json!({"role": "user", "content": collapse(parts)}));
    }
    Ok(())
}

fn anthropic_assistant(blocks: &[Value], i: usize) -> Result<Value, TranslateError> {
    let msg = openai_assistant(blocks, |j, ty| match ty {
        // Earlier reasoning has no chat completions form; the answer stands without it.
        Some("thinking" | "redacted_thinking") => Ok(()),
        other => Err(refuse(
            format!("messages[{i}].content[{j}].type"),
            &format!(
                "a block of type {:?} in an assistant message",
                other.unwrap_or("")
            ),
            OPENAI,
        )),
    })?;
    Ok(Value::Object(msg))
}

fn anthropic_tools(req: &Map<String, Value>) -> Result<Vec<Value>, TranslateError> {
    tools_array(req)?
        .iter()
        .enumerate()
        .map(|(j, t)| {
            if let Some(ty) = t.get("type").and_then(Value::as_str)
                && ty != "custom"
            {
                return Err(refuse(
                    format!("tools[{j}].type"),
                    &format!("the server tool {ty}"),
                    OPENAI,
                ));
            }
            let mut f = Map::new();
            f.insert("name".into(), t.get("name").cloned().unwrap_or_default());
            if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
                f.insert("description".into(), d.clone());
            }
            f.insert(
                "parameters".into(),
                t.get("input_schema")
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            );
            Ok(json!({"type": "function", "function": f}))
        })
        .collect()
}

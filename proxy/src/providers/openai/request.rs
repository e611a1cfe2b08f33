//! Chat completions request bodies ↔ the form (see the `translate` module docs for the
//! mapping and the table of parameters refused or dropped).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::super::dialect::{Defaults, TranslateError};
use super::super::form::{
    Document, Image, Message, Part, Request, Role, Target, Tool, ToolChoice, ToolOutput,
    ToolResult, ToolUse,
};
use super::super::vocab::{
    IMAGE_URL, UNKNOWN_CALL, description, invalid, number, parse_data_url, present, refuse, schema,
    str_at, str_field, temperature, text_of, token_count, tool_input, tools_array,
};

// ---------------------------------------------------------------------------------
// Decode: an OpenAI client's body → the form
// ---------------------------------------------------------------------------------

/// Every top-level field is accounted for: decoded, accepted in its neutral form,
/// dropped (see the docs' table) or refused, naming it. Fields are visited in the
/// body's (sorted) key order, so the first problem found is the one reported.
pub(in super::super) fn decode_request<'a>(
    req: &'a Map<String, Value>,
    target: &Target,
) -> Result<Request<'a>, TranslateError> {
    let mut out = Request {
        parallel_tool_calls: true,
        ..Request::default()
    };
    let (mut max_tokens, mut max_completion_tokens) = (None, None);
    let (mut user, mut safety_identifier) = (None, None);

    for (key, value) in req {
        if value.is_null() {
            continue;
        }
        let k = key.as_str();
        match k {
            "model" | "messages" | "tools" | "tool_choice" | "stream_options" => {}
            "max_tokens" => max_tokens = Some(token_count(value, k)?),
            "max_completion_tokens" => max_completion_tokens = Some(token_count(value, k)?),
            "temperature" => out.temperature = Some(temperature(value, target)?),
            "top_p" => out.top_p = Some(number(value, k)?),
            "stop" => {
                out.stop = match value {
                    Value::String(s) => vec![s.as_str()],
                    Value::Array(a) => a
                        .iter()
                        .map(Value::as_str)
                        .collect::<Option<_>>()
                        .ok_or_else(|| invalid(k, STOP))?,
                    _ => return Err(invalid(k, STOP)),
                };
            }
            "stream" => {
                out.stream = Some(
                    value
                        .as_bool()
                        .ok_or_else(|| invalid(k, "stream must be a boolean"))?,
                );
            }
            "parallel_tool_calls" => out.parallel_tool_calls = value.as_bool() != Some(false),
            "user" => user = value.as_str(),
            "safety_identifier" => safety_identifier = value.as_str(),
            "n" if value.as_u64() != Some(1) => return Err(refuse(k, "n > 1", target)),
            "logprobs" if value.as_bool() != Some(false) => {
                return Err(refuse(k, "logprobs", target));
            }
            "top_logprobs" if value.as_u64() != Some(0) => {
                return Err(refuse(k, "top_logprobs", target));
            }
            "presence_penalty" | "frequency_penalty" if value.as_f64() != Some(0.0) => {
                return Err(refuse(k, &format!("a non-zero {k}"), target));
            }
            "logit_bias" if !value.as_object().is_some_and(Map::is_empty) => {
                return Err(refuse(k, "logit_bias", target));
            }
            "response_format" => {
                let ty = str_at(value, "type").unwrap_or("");
                if ty != "text" {
                    return Err(refuse(
                        k,
                        &format!("response_format {ty:?} (a JSON mode)"),
                        target,
                    ));
                }
            }
            "modalities" => {
                let text_only = value
                    .as_array()
                    .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text")));
                if !text_only {
                    return Err(refuse(k, "modalities other than text", target));
                }
            }
            "audio" => return Err(refuse(k, "audio output", target)),
            "web_search_options" => return Err(refuse(k, "web_search_options", target)),
            "functions" | "function_call" => {
                return Err(refuse(
                    k,
                    &format!("{k} (deprecated: use tools and tool_choice)"),
                    target,
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
            _ => return Err(refuse(k, &format!("the parameter {k}"), target)),
        }
    }
    out.max_tokens = max_completion_tokens.or(max_tokens);
    out.user = safety_identifier.or(user);
    decode_messages(req, target, &mut out)?;
    out.tools = decode_tools(req, target)?;
    out.tool_choice = match present(req, "tool_choice") {
        Some(tc) => Some(decode_tool_choice(tc, target)?),
        None => None,
    };
    Ok(out)
}

const STOP: &str = "stop must be a string or an array of strings";

/// `system` and `developer` messages, wherever they are, go to the system prompt;
/// `tool` messages become user turns holding one tool result.
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
        let m = m
            .as_object()
            .ok_or_else(|| invalid(format!("messages[{i}]"), "a message must be an object"))?;
        let (role, content) = match str_field(m, "role").unwrap_or("") {
            "system" | "developer" => {
                let texts = text_parts(m.get("content"), i, target)?;
                out.system
                    .extend(texts.into_iter().filter(|t| !t.is_empty()));
                continue;
            }
            "user" => (Role::User, user_content(m.get("content"), i, target)?),
            "assistant" => {
                let parts = assistant(m, i, target)?;
                if target.tool_result_names {
                    calls.extend(parts.iter().filter_map(|p| match p {
                        Part::ToolUse(t) => Some(match &t.id {
                            Cow::Borrowed(id) => *id,
                            Cow::Owned(_) => "",
                        }),
                        _ => None,
                    }));
                }
                (Role::Assistant, parts)
            }
            "tool" => {
                let id = str_field(m, "tool_call_id").ok_or_else(|| {
                    invalid(
                        format!("messages[{i}].tool_call_id"),
                        "a tool message needs tool_call_id",
                    )
                })?;
                if target.tool_result_names && !calls.contains(&id) {
                    return Err(refuse(
                        format!("messages[{i}].tool_call_id"),
                        UNKNOWN_CALL,
                        target,
                    ));
                }
                let content = match m.get("content") {
                    Some(Value::String(s)) => ToolOutput::Text(s),
                    other => ToolOutput::Parts(text_parts(other, i, target)?),
                };
                let result = ToolResult {
                    tool_use_id: id,
                    content,
                    is_error: false,
                };
                (Role::User, vec![Part::ToolResult(result)])
            }
            "function" => {
                return Err(refuse(
                    format!("messages[{i}].role"),
                    "the function role (deprecated: use tool)",
                    target,
                ));
            }
            other => {
                return Err(invalid(
                    format!("messages[{i}].role"),
                    format!("unknown message role {other:?}"),
                ));
            }
        };
        out.messages.push(Message { role, content });
    }
    Ok(())
}

/// Content that may only hold text (system, developer and tool messages). A plain
/// string is kept even when empty; empty text parts are left out.
fn text_parts<'a>(
    content: Option<&'a Value>,
    i: usize,
    target: &Target,
) -> Result<Vec<&'a str>, TranslateError> {
    match content {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.as_str()]),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .filter(|(_, p)| str_at(p, "text") != Some(""))
            .map(|(j, p)| match str_at(p, "type") {
                Some("text") => text_of(p, || format!("messages[{i}].content[{j}]")),
                other => Err(refuse(
                    format!("messages[{i}].content[{j}].type"),
                    &format!(
                        "a content part of type {:?} in this message",
                        other.unwrap_or("")
                    ),
                    target,
                )),
            })
            .collect(),
        Some(_) => Err(invalid(
            format!("messages[{i}].content"),
            "content must be a string or an array of parts",
        )),
    }
}

fn user_content<'a>(
    content: Option<&'a Value>,
    i: usize,
    target: &Target,
) -> Result<Vec<Part<'a>>, TranslateError> {
    let parts = match content {
        Some(Value::Array(parts)) => parts,
        other => {
            let texts = text_parts(other, i, target)?;
            return Ok(texts.into_iter().map(Part::Text).collect());
        }
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let at = || format!("messages[{i}].content[{j}]");
        match str_at(p, "type") {
            Some("text") => {
                let text = text_of(p, at)?;
                // Anthropic and Bedrock reject empty text blocks.
                if !text.is_empty() {
                    out.push(Part::Text(text));
                }
            }
            Some("image_url") => {
                let url = match p.get("image_url") {
                    Some(Value::String(u)) => Some(u.as_str()),
                    Some(o) => str_at(o, "url"),
                    None => None,
                }
                .ok_or_else(|| invalid(at() + ".image_url.url", "an image part needs a url"))?;
                // `detail` is a resolution hint other providers do not take.
                let image = if url.starts_with("data:") {
                    let (media_type, data) = parse_data_url(url).ok_or_else(|| {
                        refuse(
                            at() + ".image_url.url",
                            "an image data URL that is not base64",
                            target,
                        )
                    })?;
                    Image::Base64 { media_type, data }
                } else if target.image_urls {
                    Image::Url(url)
                } else {
                    return Err(refuse(at() + ".image_url.url", IMAGE_URL, target));
                };
                out.push(Part::Image(image));
            }
            Some("file") => {
                let file = p.get("file");
                let pdf = file
                    .and_then(|f| str_at(f, "file_data"))
                    .and_then(parse_data_url)
                    .filter(|(media, _)| *media == "application/pdf");
                let Some((media_type, data)) = pdf else {
                    return Err(refuse(
                        at() + ".file",
                        "a file part other than an inline PDF (file_data)",
                        target,
                    ));
                };
                out.push(Part::Document(Document {
                    media_type,
                    data,
                    title: file.and_then(|f| str_at(f, "filename")),
                }));
            }
            other => {
                return Err(refuse(
                    at() + ".type",
                    &format!("a content part of type {:?}", other.unwrap_or("")),
                    target,
                ));
            }
        }
    }
    Ok(out)
}

fn assistant<'a>(
    m: &'a Map<String, Value>,
    i: usize,
    target: &Target,
) -> Result<Vec<Part<'a>>, TranslateError> {
    for k in ["audio", "function_call"] {
        if present(m, k).is_some() {
            return Err(refuse(
                format!("messages[{i}].{k}"),
                &format!("an assistant message with {k}"),
                target,
            ));
        }
    }
    let tool_calls = present(m, "tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out = Vec::with_capacity(1 + tool_calls.len());
    match m.get("content") {
        None | Some(Value::Null) => {}
        // An empty text beside tool calls is left out (Anthropic rejects empty text).
        Some(Value::String(s)) => {
            if !s.is_empty() || tool_calls.is_empty() {
                out.push(Part::Text(s));
            }
        }
        Some(Value::Array(parts)) => {
            for (j, p) in parts.iter().enumerate() {
                let at = || format!("messages[{i}].content[{j}]");
                let text = match str_at(p, "type") {
                    Some("text") => text_of(p, at)?,
                    Some("refusal") => str_at(p, "refusal")
                        .ok_or_else(|| invalid(at() + ".refusal", "a refusal part needs text"))?,
                    other => {
                        return Err(refuse(
                            at() + ".type",
                            &format!(
                                "a content part of type {:?} in an assistant message",
                                other.unwrap_or("")
                            ),
                            target,
                        ));
                    }
                };
                if !text.is_empty() {
                    out.push(Part::Text(text));
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
        out.push(Part::Text(r));
    }
    for (j, call) in tool_calls.iter().enumerate() {
        let at = format!("messages[{i}].tool_calls[{j}]");
        if str_at(call, "type").unwrap_or("function") != "function" {
            return Err(refuse(at + ".type", "a custom tool call", target));
        }
        let f = call.get("function");
        let name = f.and_then(|f| str_at(f, "name"));
        let name =
            name.ok_or_else(|| invalid(at.clone() + ".function.name", "a tool call needs a name"))?;
        let args = f.and_then(|f| str_at(f, "arguments")).unwrap_or("");
        let Some(input) = tool_input(args) else {
            return Err(refuse(
                at + ".function.arguments",
                "tool call arguments that are not a JSON object",
                target,
            ));
        };
        out.push(Part::ToolUse(ToolUse {
            id: Cow::Borrowed(str_at(call, "id").unwrap_or_default()),
            name,
            input: Cow::Owned(input),
        }));
    }
    Ok(out)
}

fn decode_tools<'a>(
    req: &'a Map<String, Value>,
    target: &Target,
) -> Result<Vec<Tool<'a>>, TranslateError> {
    tools_array(req)?
        .iter()
        .enumerate()
        .map(|(j, t)| {
            let ty = str_at(t, "type").unwrap_or("function");
            if ty != "function" {
                return Err(refuse(
                    format!("tools[{j}].type"),
                    &format!("a tool of type {ty:?}"),
                    target,
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
            // `strict` is dropped: schema adherence is not enforced elsewhere.
            Ok(Tool {
                name: str_field(f, "name").ok_or_else(|| {
                    invalid(format!("tools[{j}].function.name"), "a tool needs a name")
                })?,
                description: description(f, || format!("tools[{j}].function.description"))?,
                schema: present(f, "parameters"),
            })
        })
        .collect()
}

fn decode_tool_choice<'a>(
    tc: &'a Value,
    target: &Target,
) -> Result<ToolChoice<'a>, TranslateError> {
    match tc {
        Value::String(s) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(invalid(
                "tool_choice",
                format!("unknown tool_choice {other:?}"),
            )),
        },
        Value::Object(o) if str_field(o, "type") == Some("function") => {
            let name = o
                .get("function")
                .and_then(|f| str_at(f, "name"))
                .ok_or_else(|| {
                    invalid(
                        "tool_choice.function.name",
                        "a named tool_choice needs a name",
                    )
                })?;
            Ok(ToolChoice::Tool(name))
        }
        Value::Object(o) => {
            let ty = str_field(o, "type").unwrap_or("typeless");
            Err(refuse(
                "tool_choice.type",
                &format!("tool_choice {ty:?}"),
                target,
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

/// Whether the client asked for the stream's usage chunk.
pub(in super::super) fn include_usage(body: &[u8]) -> bool {
    serde_json::from_slice::<UsagePeek>(body)
        .ok()
        .and_then(|p| p.stream_options?.include_usage)
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------------
// Encode: the form → an OpenAI target's body
// ---------------------------------------------------------------------------------

pub(in super::super) fn encode_request(
    req: &Request<'_>,
    model: &str,
    defaults: &Defaults,
) -> Value {
    let mut out = Map::new();
    out.insert("model".into(), model.into());
    if let Some(n) = req.max_tokens {
        // OpenAI's reasoning models reject `max_tokens`; many OpenAI-compatible
        // servers only read it.
        let field = if defaults.openai_max_completion_tokens {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        out.insert(field.into(), n.into());
    }
    if let Some(t) = req.temperature {
        out.insert("temperature".into(), Value::Number(t.clone()));
    }
    if let Some(p) = req.top_p {
        out.insert("top_p".into(), Value::Number(p.clone()));
    }
    // `top_k` never gets here: `TARGET` has none, so decoders refuse it.
    if !req.stop.is_empty() {
        out.insert("stop".into(), req.stop.clone().into());
    }
    if let Some(stream) = req.stream {
        out.insert("stream".into(), stream.into());
        if stream {
            // So the stream ends with usage (the client's API always reports it).
            out.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    if let Some(user) = req.user {
        out.insert("user".into(), user.into());
    }

    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if !req.system.is_empty() {
        messages.push(json!({"role": "system", "content": texts(&req.system)}));
    }
    for m in &req.messages {
        match m.role {
            Role::User => user_messages(&m.content, &mut messages),
            Role::Assistant => messages.push(Value::Object(assistant_message(&m.content))),
        }
    }
    out.insert("messages".into(), Value::Array(messages));

    if !req.tools.is_empty() {
        let tools = req
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), t.name.into());
                if let Some(d) = t.description {
                    f.insert("description".into(), d.into());
                }
                f.insert("parameters".into(), schema(t.schema));
                json!({"type": "function", "function": f})
            })
            .collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(tc) = &req.tool_choice {
        let choice = match tc {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::Required => json!("required"),
            ToolChoice::None => json!("none"),
            ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
        };
        out.insert("tool_choice".into(), choice);
        if !req.tools.is_empty() && !req.parallel_tool_calls {
            out.insert("parallel_tool_calls".into(), false.into());
        }
    }
    Value::Object(out)
}

fn text_part(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// One text is sent as a string, several as text parts.
fn texts(texts: &[&str]) -> Value {
    match texts {
        [] => Value::String(String::new()),
        [one] => Value::String((*one).to_owned()),
        many => Value::Array(many.iter().map(|t| text_part(t)).collect()),
    }
}

/// A user turn: its tool results as `tool` messages first (OpenAI has no tool
/// results inside a user message), then the rest as one `user` message if anything
/// is left.
fn user_messages(content: &[Part<'_>], out: &mut Vec<Value>) {
    let mut parts = Vec::new();
    for p in content {
        match p {
            Part::Text(t) => parts.push(text_part(t)),
            Part::Image(image) => {
                let url = match image {
                    Image::Base64 { media_type, data } => {
                        format!("data:{media_type};base64,{data}")
                    }
                    Image::Url(u) => (*u).to_owned(),
                };
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            Part::Document(d) => parts.push(json!({"type": "file", "file": {
                "filename": d.title.unwrap_or("document.pdf"),
                "file_data": format!("data:{};base64,{}", d.media_type, d.data),
            }})),
            Part::ToolResult(r) => {
                // Tool messages have no error flag: the result's text says what failed.
                let content = match &r.content {
                    ToolOutput::Text(s) => Value::String((*s).to_owned()),
                    ToolOutput::Parts(ts) => texts(ts),
                };
                out.push(
                    json!({"role": "tool", "tool_call_id": r.tool_use_id, "content": content}),
                );
            }
            // Decoders put tool calls in assistant turns only.
            Part::ToolUse(_) => {}
        }
    }
    if !parts.is_empty() {
        let content = match parts.len() {
            1 if parts[0]["type"] == "text" => parts.swap_remove(0)["text"].take(),
            _ => Value::Array(parts),
        };
        out.push(json!({"role": "user", "content": content}));
    }
}

/// An assistant message (`role`, `content`, and `tool_calls` when there are any),
/// for answers and for assistant turns in a request's history alike. Texts are
/// joined; `content` is `null` only when there are tool calls and no text.
pub(super) fn assistant_message(content: &[Part<'_>]) -> Map<String, Value> {
    let mut text = String::new();
    let mut has_text = false;
    let mut tool_calls = Vec::new();
    for p in content {
        match p {
            Part::Text(t) => {
                has_text = true;
                text.push_str(t);
            }
            Part::ToolUse(t) => tool_calls.push(json!({
                "id": t.id,
                "type": "function",
                "function": {
                    "name": t.name,
                    "arguments": serde_json::to_string(&*t.input).unwrap_or_default(),
                },
            })),
            // Decoders put only text and tool calls in assistant turns.
            _ => {}
        }
    }
    let mut msg = Map::new();
    msg.insert("role".into(), "assistant".into());
    let content = if has_text || tool_calls.is_empty() {
        Value::String(text)
    } else {
        Value::Null
    };
    msg.insert("content".into(), content);
    if !tool_calls.is_empty() {
        msg.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    msg
}

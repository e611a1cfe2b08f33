//! Chat completions request bodies ↔ the form (see the `translate` module docs for the
//! mapping and the table of parameters refused or dropped).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::super::dialect::{Defaults, TranslateError};
use super::super::form::{
    Document, DocumentSource, Effort, Fetched, Format, FormatKind, Image, JsonSchema, Message,
    Part, Reasoning, ReasoningKind, Request, Role, Target, Tool, ToolChoice, ToolOutput,
    ToolResult, ToolUse,
};
use super::super::schema::openai_strict;
use super::super::vocab::{
    AtUrl, IMAGE_URL, UNKNOWN_CALL, at_url, description, invalid, number, parse_data_url, present,
    refuse, reserved_tool_name, schema, str_at, str_field, temperature, text_of, token_count,
    tool_input, tools_array,
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
    fetched: &'a Fetched,
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
            "response_format" => out.format = response_format(value)?,
            "reasoning_effort" => {
                let kind = match value.as_str() {
                    Some("none") => ReasoningKind::Off,
                    Some(e) => ReasoningKind::Effort(
                        Effort::parse(e)
                            .ok_or_else(|| invalid(k, format!("unknown reasoning_effort {e:?}")))?,
                    ),
                    None => return Err(invalid(k, "reasoning_effort must be a string")),
                };
                out.reasoning = Some(Reasoning {
                    param: "reasoning_effort",
                    kind,
                });
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
            | "verbosity" => {}
            _ => return Err(refuse(k, &format!("the parameter {k}"), target)),
        }
    }
    out.max_tokens = max_completion_tokens.or(max_tokens);
    out.user = safety_identifier.or(user);
    decode_messages(req, target, fetched, &mut out)?;
    out.tools = decode_tools(req, target)?;
    out.tool_choice = match present(req, "tool_choice") {
        Some(tc) => Some(decode_tool_choice(tc, target)?),
        None => None,
    };
    Ok(out)
}

const STOP: &str = "stop must be a string or an array of strings";

/// `response_format`: `text` (no format), `json_object`, or `json_schema` with its
/// `name`, `description`, `schema` and `strict`.
fn response_format(value: &Value) -> Result<Option<Format<'_>>, TranslateError> {
    const K: &str = "response_format";
    let kind = match str_at(value, "type") {
        Some("text") => return Ok(None),
        Some("json_object") => FormatKind::JsonObject,
        Some("json_schema") => {
            let js = value
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    invalid(
                        "response_format.json_schema",
                        "json_schema must be an object",
                    )
                })?;
            match present(js, "schema") {
                Some(schema @ Value::Object(_)) => FormatKind::JsonSchema(JsonSchema {
                    name: str_field(js, "name"),
                    description: str_field(js, "description"),
                    schema,
                    strict: js.get("strict") == Some(&Value::Bool(true)),
                }),
                Some(_) => {
                    return Err(invalid(
                        "response_format.json_schema.schema",
                        "the schema must be a JSON object",
                    ));
                }
                // A format without a schema asks for JSON, no more.
                None => FormatKind::JsonObject,
            }
        }
        other => {
            return Err(invalid(
                "response_format.type",
                format!("unknown response_format type {:?}", other.unwrap_or("")),
            ));
        }
    };
    let param = match kind {
        FormatKind::JsonSchema(_) => "response_format.json_schema.schema",
        FormatKind::JsonObject => K,
    };
    Ok(Some(Format { param, kind }))
}

/// `system` and `developer` messages, wherever they are, go to the system prompt;
/// `tool` messages become user turns holding one tool result.
fn decode_messages<'a>(
    req: &'a Map<String, Value>,
    target: &Target,
    fetched: &'a Fetched,
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
            "user" => (
                Role::User,
                user_content(m.get("content"), i, target, fetched)?,
            ),
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
                    other => ToolOutput::Parts(
                        text_parts(other, i, target)?
                            .into_iter()
                            .map(Part::Text)
                            .collect(),
                    ),
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
    fetched: &'a Fetched,
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
                } else {
                    let param = at() + ".image_url.url";
                    match at_url(url, target.image_urls, fetched, param, IMAGE_URL, target)? {
                        AtUrl::Url(u) => Image::Url(u),
                        AtUrl::Inline(media_type, data) => Image::Base64 { media_type, data },
                    }
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
                    source: DocumentSource::Base64 { media_type, data },
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
            let name = str_field(f, "name").ok_or_else(|| {
                invalid(format!("tools[{j}].function.name"), "a tool needs a name")
            })?;
            reserved_tool_name(name, || format!("tools[{j}].function.name"))?;
            Ok(Tool {
                name,
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
    if let Some(f) = &req.format {
        out.insert("response_format".into(), response_format_of(f));
    }
    if let Some(r) = &req.reasoning
        && let Some(effort) = reasoning_effort(r.kind)
    {
        out.insert("reasoning_effort".into(), effort.into());
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

/// The name given a schema that came without one (OpenAI requires one).
const SCHEMA_NAME: &str = "structured_output";

/// A JSON format as `response_format`. A schema is sent `strict` when OpenAI's
/// strict mode takes it as it is (Anthropic's structured outputs are always
/// enforced; OpenAI enforces only strict schemas, which must close every object and
/// require every property): otherwise as a best-effort schema.
fn response_format_of(f: &Format<'_>) -> Value {
    match &f.kind {
        FormatKind::JsonObject => json!({"type": "json_object"}),
        FormatKind::JsonSchema(js) => {
            let mut spec = Map::new();
            spec.insert("name".into(), js.name.unwrap_or(SCHEMA_NAME).into());
            if let Some(d) = js.description {
                spec.insert("description".into(), d.into());
            }
            spec.insert("schema".into(), js.schema.clone());
            spec.insert("strict".into(), openai_strict(js.schema).into());
            json!({"type": "json_schema", "json_schema": spec})
        }
    }
}

/// How much to reason as `reasoning_effort` (see `form::Effort`): a budget by the
/// table, on the low / medium / high scale every OpenAI reasoning model takes.
/// Off and adaptive leave it out: the model's default (a model that does not reason
/// refuses the field, and `none` is not taken by every reasoning model).
fn reasoning_effort(kind: ReasoningKind) -> Option<&'static str> {
    match kind {
        ReasoningKind::Effort(e) => Some(e.coarse().as_str()),
        ReasoningKind::Budget(b) => Some(Effort::of_budget(b).as_str()),
        ReasoningKind::Off | ReasoningKind::Adaptive => None,
    }
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
            Part::Document(d) => match d.source {
                DocumentSource::Base64 { media_type, data } => {
                    parts.push(json!({"type": "file", "file": {
                        "filename": d.title.unwrap_or("document.pdf"),
                        "file_data": format!("data:{media_type};base64,{data}"),
                    }}));
                }
                // Plain text is text: chat completions' file parts take PDFs.
                DocumentSource::Text(t) => parts.push(text_part(t)),
                // Decoders refuse documents by URL for this target.
                DocumentSource::Url(_) => {}
            },
            Part::ToolResult(r) => {
                // Tool messages have no error flag: the result's text says what failed.
                // Decoders refuse media in tool results for this target.
                let content = match &r.content {
                    ToolOutput::Text(s) => Value::String((*s).to_owned()),
                    ToolOutput::Parts(ps) => {
                        let ts: Vec<&str> = ps
                            .iter()
                            .filter_map(|p| match p {
                                Part::Text(t) => Some(*t),
                                _ => None,
                            })
                            .collect();
                        texts(&ts)
                    }
                };
                out.push(
                    json!({"role": "tool", "tool_call_id": r.tool_use_id, "content": content}),
                );
            }
            // Decoders put tool calls and reasoning in assistant turns only.
            // (and JSON answers in answers only).
            Part::ToolUse(_) | Part::Reasoning(_) | Part::RedactedReasoning(_) | Part::Json(_) => {}
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
            Part::Json(v) => {
                has_text = true;
                text.push_str(&v.to_string());
            }
            Part::ToolUse(t) => tool_calls.push(json!({
                "id": t.id,
                "type": "function",
                "function": {
                    "name": t.name,
                    "arguments": serde_json::to_string(&*t.input).unwrap_or_default(),
                },
            })),
            // Chat completions take back no reasoning (and decoders put only text,
            // reasoning and tool calls in assistant turns).
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

//! Messages request bodies ↔ the form (see the `translate` module docs for the
//! mapping and the table of parameters refused or dropped).

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use super::super::dialect::{Defaults, TranslateError};
use super::super::form::{
    Document, DocumentSource, Effort, Fetched, Format, FormatKind, Image, JsonSchema, Message,
    Part, Reasoning, ReasoningKind, ReasoningText, Request, Role, Target, Tool, ToolChoice,
    ToolOutput, ToolResult, ToolUse,
};
use super::super::schema::claude_subset;
use super::super::vocab::{
    AtUrl, DOCUMENT_URL, IMAGE_URL, JSON_TOOL, JSON_TOOL_DESCRIPTION, UNKNOWN_CALL, at_url,
    description, inexpressible, invalid, number, present, refuse, reserved_tool_name, schema,
    str_at, temperature, text_of, token_count, tools_array,
};
use super::shapes::TARGET;

// ---------------------------------------------------------------------------------
// Decode: an Anthropic client's body → the form
// ---------------------------------------------------------------------------------

/// Every top-level field is accounted for (see the OpenAI decoder), in the body's
/// (sorted) key order.
pub(in super::super) fn decode_request<'a>(
    req: &'a Map<String, Value>,
    target: &Target,
    fetched: &'a Fetched,
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
                let (kind, shown) = thinking(value)?;
                // Adaptive thinking at an `output_config.effort` is that effort
                // (whichever of the two is read first).
                let effort = matches!(
                    out.reasoning.map(|r| r.kind),
                    Some(ReasoningKind::Effort(_))
                );
                if !(kind == ReasoningKind::Adaptive && effort) {
                    out.reasoning = Some(Reasoning {
                        param: "thinking",
                        kind,
                    });
                }
                out.reasoning_content = shown;
            }
            "output_config" => output_config(value, &mut out)?,
            // The structured-output field of the beta, before `output_config.format`.
            "output_format" => {
                out.format = Some(json_format(value, "output_format")?);
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
    decode_messages(req, target, fetched, &mut out)?;
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

/// `thinking`: its kind, and whether the client wants the reasoning's text
/// (`display: "omitted"` says no).
fn thinking(value: &Value) -> Result<(ReasoningKind, bool), TranslateError> {
    let shown = str_at(value, "display") != Some("omitted");
    Ok(match str_at(value, "type") {
        Some("disabled") => (ReasoningKind::Off, false),
        Some("adaptive") => (ReasoningKind::Adaptive, shown),
        Some("enabled") => {
            let budget = value
                .get("budget_tokens")
                .ok_or_else(|| {
                    invalid(
                        "thinking.budget_tokens",
                        "enabled thinking needs budget_tokens",
                    )
                })
                .and_then(|b| token_count(b, "thinking.budget_tokens"))?;
            (ReasoningKind::Budget(budget), shown)
        }
        other => {
            return Err(TranslateError::unsupported(
                "thinking.type",
                format!(
                    "thinking of type {:?} cannot be translated",
                    other.unwrap_or("")
                ),
            ));
        }
    })
}

/// `output_config`: `format` (a JSON schema the answer must match) and `effort`
/// (how much to reason, where `thinking` gives no budget).
fn output_config<'a>(value: &'a Value, out: &mut Request<'a>) -> Result<(), TranslateError> {
    let Some(config) = value.as_object() else {
        return Err(invalid("output_config", "output_config must be an object"));
    };
    for (k, v) in config {
        match (k.as_str(), v) {
            (_, Value::Null) => {}
            ("format", f) => out.format = Some(json_format(f, "output_config.format")?),
            ("effort", Value::String(e)) => {
                let effort = Effort::parse(e).ok_or_else(|| {
                    invalid("output_config.effort", format!("unknown effort {e:?}"))
                })?;
                if !matches!(
                    out.reasoning.map(|r| r.kind),
                    Some(ReasoningKind::Budget(_) | ReasoningKind::Off)
                ) {
                    out.reasoning = Some(Reasoning {
                        param: "output_config.effort",
                        kind: ReasoningKind::Effort(effort),
                    });
                }
            }
            (other, _) => {
                return Err(TranslateError::unsupported(
                    format!("output_config.{other}"),
                    format!("output_config.{other} cannot be translated"),
                ));
            }
        }
    }
    Ok(())
}

/// A JSON output format, `{type: "json_schema", schema}`, at `param`.
fn json_format<'a>(f: &'a Value, param: &'static str) -> Result<Format<'a>, TranslateError> {
    if str_at(f, "type") != Some("json_schema") {
        return Err(invalid(
            format!("{param}.type"),
            "the output format must be of type json_schema",
        ));
    }
    let schema = match f.get("schema") {
        Some(s @ Value::Object(_)) => s,
        _ => {
            return Err(invalid(
                format!("{param}.schema"),
                "the output format needs a schema (a JSON object)",
            ));
        }
    };
    Ok(Format {
        param: if param == "output_format" {
            "output_format.schema"
        } else {
            "output_config.format.schema"
        },
        kind: FormatKind::JsonSchema(JsonSchema {
            name: None,
            description: None,
            schema,
            strict: true,
        }),
    })
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
        let role = str_at(m, "role").unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        let (role, content) = match (role, content) {
            ("user", Value::String(s)) => (Role::User, vec![Part::Text(s)]),
            ("assistant", Value::String(s)) => (Role::Assistant, vec![Part::Text(s)]),
            ("user", Value::Array(blocks)) => {
                (Role::User, user_blocks(blocks, i, target, fetched)?)
            }
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

/// A block's `source.url` (at `at`), as the target takes it (see `vocab::at_url`).
fn source_url<'a>(
    url: &'a str,
    at: &str,
    by_url: bool,
    fetched: &'a Fetched,
    what: &str,
    target: &Target,
) -> Result<AtUrl<'a>, TranslateError> {
    at_url(
        url,
        by_url,
        fetched,
        format!("{at}.source.url"),
        what,
        target,
    )
}

fn image<'a>(
    b: &'a Value,
    at: &str,
    target: &Target,
    fetched: &'a Fetched,
) -> Result<Image<'a>, TranslateError> {
    let source = b.get("source");
    let field = |k: &str| source.and_then(|s| str_at(s, k)).unwrap_or("");
    match source.and_then(|s| str_at(s, "type")) {
        Some("base64") => Ok(Image::Base64 {
            media_type: field("media_type"),
            data: field("data"),
        }),
        Some("url") => Ok(
            match source_url(
                field("url"),
                at,
                target.image_urls,
                fetched,
                IMAGE_URL,
                target,
            )? {
                AtUrl::Url(u) => Image::Url(u),
                AtUrl::Inline(media_type, data) => Image::Base64 { media_type, data },
            },
        ),
        _ => Err(refuse(
            format!("{at}.source.type"),
            "an image source other than base64 or url",
            target,
        )),
    }
}

/// A `document` block: a base64 PDF, plain text, or a PDF by URL (the URL where
/// the target fetches it, else the bytes the gateway fetched). `citations` asks for
/// citation metadata on the answer's text, which no other API returns: dropped, the
/// text is the same; `context` (text beside the document) is refused, as leaving it
/// out would change what the model reads.
fn document<'a>(
    b: &'a Value,
    at: &str,
    target: &Target,
    fetched: &'a Fetched,
) -> Result<Document<'a>, TranslateError> {
    let source = b.get("source");
    let get = |k: &str| source.and_then(|s| str_at(s, k));
    if b.get("context").is_some_and(|c| !c.is_null()) {
        return Err(refuse(
            format!("{at}.context"),
            "a document's context",
            target,
        ));
    }
    let source = match (get("type"), get("media_type")) {
        (Some("base64"), Some(media_type @ "application/pdf")) => DocumentSource::Base64 {
            media_type,
            data: get("data").unwrap_or(""),
        },
        (Some("text"), Some("text/plain") | None) => {
            DocumentSource::Text(get("data").unwrap_or(""))
        }
        (Some("url"), _) => {
            let url = get("url").unwrap_or("");
            match source_url(url, at, target.document_urls, fetched, DOCUMENT_URL, target)? {
                AtUrl::Url(u) => DocumentSource::Url(u),
                AtUrl::Inline(media_type, data) => DocumentSource::Base64 { media_type, data },
            }
        }
        (ty, media) => {
            let what = match ty {
                Some("file") => "a document by file_id (Anthropic's Files API)".to_owned(),
                Some("content") => "a document of content blocks".to_owned(),
                _ => format!(
                    "a document of type {:?} ({})",
                    ty.unwrap_or(""),
                    media.unwrap_or("no media type")
                ),
            };
            return Err(refuse(format!("{at}.source"), &what, target));
        }
    };
    Ok(Document {
        source,
        title: str_at(b, "title"),
    })
}

fn user_blocks<'a>(
    blocks: &'a [Value],
    i: usize,
    target: &Target,
    fetched: &'a Fetched,
) -> Result<Vec<Part<'a>>, TranslateError> {
    let mut out = Vec::with_capacity(blocks.len());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let part = match str_at(b, "type") {
            Some("text") => Part::Text(text_of(b, || at.clone())?),
            Some("image") => Part::Image(image(b, &at, target, fetched)?),
            Some("document") => Part::Document(document(b, &at, target, fetched)?),
            Some("tool_result") => Part::ToolResult(ToolResult {
                tool_use_id: str_at(b, "tool_use_id").unwrap_or_default(),
                content: tool_result_content(b, &at, target, fetched)?,
                is_error: b.get("is_error") == Some(&Value::Bool(true)),
            }),
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

/// A `tool_result`'s content: a string, or text, image and document blocks (media
/// only for a target whose tool results carry it).
fn tool_result_content<'a>(
    b: &'a Value,
    at: &str,
    target: &Target,
    fetched: &'a Fetched,
) -> Result<ToolOutput<'a>, TranslateError> {
    let inner = match b.get("content") {
        None | Some(Value::Null) => return Ok(ToolOutput::Text("")),
        Some(Value::String(s)) => return Ok(ToolOutput::Text(s)),
        Some(Value::Array(inner)) => inner,
        Some(_) => {
            return Err(invalid(
                format!("{at}.content"),
                "tool_result content must be a string or blocks",
            ));
        }
    };
    let mut parts = Vec::with_capacity(inner.len());
    for (k, c) in inner.iter().enumerate() {
        let here = format!("{at}.content[{k}]");
        let ty = str_at(c, "type");
        if matches!(ty, Some("image" | "document")) && !target.tool_result_media {
            return Err(refuse(
                format!("{here}.type"),
                &format!("a tool result holding an {}", ty.unwrap_or("")),
                target,
            ));
        }
        parts.push(match ty {
            Some("text") => Part::Text(text_of(c, || here.clone())?),
            Some("image") => Part::Image(image(c, &here, target, fetched)?),
            Some("document") => Part::Document(document(c, &here, target, fetched)?),
            other => {
                return Err(refuse(
                    format!("{here}.type"),
                    &format!("a tool result block of type {:?}", other.unwrap_or("")),
                    target,
                ));
            }
        });
    }
    Ok(ToolOutput::Parts(parts))
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
            // Earlier reasoning, with the provider's signature as it came (an empty
            // one is none: reasoning a provider did not sign).
            Some("thinking") => out.push(Part::Reasoning(ReasoningText {
                text: str_at(b, "thinking").unwrap_or(""),
                signature: str_at(b, "signature").filter(|s| !s.is_empty()),
            })),
            Some("redacted_thinking") => {
                out.push(Part::RedactedReasoning(str_at(b, "data").unwrap_or("")));
            }
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
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("tools[{j}].name"), "a tool needs a name"))?;
            reserved_tool_name(name, || format!("tools[{j}].name"))?;
            Ok(Tool {
                name,
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
) -> Result<Value, TranslateError> {
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
    // Anthropic requires a limit; thinking counts in it.
    let (max_tokens, thinking) = match (req.max_tokens, thinking_config(req)) {
        (Some(n), Some((config, budget))) => (n, fit_budget(config, budget, n)),
        (None, Some((config, budget))) => (
            budget.saturating_add(u64::from(defaults.max_tokens)),
            Some(config),
        ),
        (n, None) => (n.unwrap_or(u64::from(defaults.max_tokens)), None),
    };
    out.insert("max_tokens".into(), max_tokens.into());
    if let Some(config) = &thinking {
        out.insert("thinking".into(), config.clone());
    }

    let json_tool = matches!(
        req.format.as_ref().map(|f| &f.kind),
        Some(FormatKind::JsonObject)
    );
    let has_tools = !req.tools.is_empty() || json_tool;
    if has_tools {
        let mut tools: Vec<Value> = req
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
        if json_tool {
            tools.push(
                json!({"name": JSON_TOOL, "description": JSON_TOOL_DESCRIPTION,
                "input_schema": {"type": "object"}}),
            );
        }
        out.insert("tools".into(), Value::Array(tools));
    }
    let mut tool_choice = req.tool_choice.as_ref().map(|tc| match tc {
        ToolChoice::None => json!({"type": "none"}),
        ToolChoice::Auto => json!({"type": "auto"}),
        ToolChoice::Required => json!({"type": "any"}),
        ToolChoice::Tool(name) => json!({"type": "tool", "name": name}),
    });
    if json_tool {
        tool_choice = Some(json_tool_choice(req));
    }
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
    if let Some(f) = &req.format
        && let FormatKind::JsonSchema(js) = &f.kind
    {
        let schema = claude_subset(js.schema).map_err(|e| inexpressible(f.param, e, &TARGET))?;
        out.insert(
            "output_config".into(),
            json!({"format": {"type": "json_schema", "schema": schema}}),
        );
    }
    if let Some(id) = req.user {
        out.insert("metadata".into(), json!({"user_id": id}));
    }
    Ok(Value::Object(out))
}

/// JSON mode without a schema (`json_object`) on an API whose structured outputs
/// need one: a tool whose input is the answer, which the model must call (or, when
/// the client's own tools may be called, call some tool). Its call comes back as the
/// answer's text (see `vocab::JSON_TOOL`).
fn json_tool_choice(req: &Request<'_>) -> Value {
    match &req.tool_choice {
        _ if req.tools.is_empty() => json!({"type": "tool", "name": JSON_TOOL}),
        None | Some(ToolChoice::Auto) => json!({"type": "any"}),
        Some(ToolChoice::None) => json!({"type": "tool", "name": JSON_TOOL}),
        // The answer is a call of the client's tool: no text to shape.
        Some(ToolChoice::Required) => json!({"type": "any"}),
        Some(ToolChoice::Tool(name)) => json!({"type": "tool", "name": name}),
    }
}

/// The `thinking` a request asks for, and its budget (0 for adaptive), by the table
/// of `form::Effort`; `disabled` for off. Reasoning is a hint: it gives way to what
/// Anthropic cannot combine with it (see [`reasoning_gives_way`]).
fn thinking_config(req: &Request<'_>) -> Option<(Value, u64)> {
    let r = req.reasoning?;
    let config = match r.kind {
        ReasoningKind::Off => return Some((json!({"type": "disabled"}), 0)),
        ReasoningKind::Adaptive => (json!({"type": "adaptive"}), 0),
        ReasoningKind::Effort(e) => (
            json!({"type": "enabled", "budget_tokens": e.budget()}),
            e.budget(),
        ),
        ReasoningKind::Budget(b) => (json!({"type": "enabled", "budget_tokens": b}), b),
    };
    (!reasoning_gives_way(req)).then_some(config)
}

/// Whether reasoning must be left out because Claude cannot think with what else
/// the request asks (Anthropic's rules, on its API, Bedrock's and Vertex's): a
/// `temperature` other than 1, a `top_p` under 0.95 or `top_k`; a tool call the
/// model is forced to make (a named or required `tool_choice`, and JSON mode's
/// tool); or a conversation that continues tool calls made without signed
/// reasoning (a client of an API that cannot send it back: Anthropic requires that
/// turn's thinking block then).
pub(in super::super) fn reasoning_gives_way(req: &Request<'_>) -> bool {
    let json_tool = matches!(
        req.format.as_ref().map(|f| &f.kind),
        Some(FormatKind::JsonObject)
    );
    req.temperature.is_some_and(|t| t.as_f64() != Some(1.0))
        || req
            .top_p
            .is_some_and(|p| p.as_f64().is_some_and(|p| p < 0.95))
        || req.top_k.is_some()
        || matches!(
            req.tool_choice,
            Some(ToolChoice::Required | ToolChoice::Tool(_))
        )
        || json_tool
        || continues_unreasoned_tool_call(&req.messages)
}

/// Whether the request answers tool calls of an assistant turn that carries no
/// signed reasoning.
fn continues_unreasoned_tool_call(messages: &[Message<'_>]) -> bool {
    let mut turns = messages.iter().rev();
    let (Some(last), Some(before)) = (turns.next(), turns.next()) else {
        return false;
    };
    last.role == Role::User
        && last
            .content
            .iter()
            .any(|p| matches!(p, Part::ToolResult(_)))
        && before.role == Role::Assistant
        && before.content.iter().any(|p| matches!(p, Part::ToolUse(_)))
        && !before.content.iter().any(|p| {
            matches!(
                p,
                Part::Reasoning(ReasoningText {
                    signature: Some(_),
                    ..
                }) | Part::RedactedReasoning(_)
            )
        })
}

/// `thinking` within the client's own output limit (Anthropic counts thinking in
/// it, and requires a budget of at least 1,024 below it): the budget lowered to at
/// most half the limit, so the answer keeps the other half, or left out when that
/// is under 1,024 (a limit under 2,048 tokens).
pub(in super::super) fn fit_budget(config: Value, budget: u64, max_tokens: u64) -> Option<Value> {
    if budget == 0 {
        return Some(config); // adaptive, disabled
    }
    let fitted = budget.min(max_tokens / 2);
    (fitted >= 1024).then(|| json!({"type": "enabled", "budget_tokens": fitted}))
}

/// Turns merged so roles alternate, as Anthropic requires (tool results join the
/// user turn around them). A turn that is one text block is sent as a string.
fn turns(messages: &[Message<'_>]) -> Vec<Value> {
    let mut turns: Vec<(Role, Vec<Value>)> = Vec::with_capacity(messages.len());
    for m in messages {
        // Unsigned reasoning has no block here (see `block`).
        let blocks = m.content.iter().map(block).filter(|b| !b.is_null());
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
            let source = match d.source {
                DocumentSource::Base64 { media_type, data } => {
                    json!({"type": "base64", "media_type": media_type, "data": data})
                }
                DocumentSource::Text(text) => {
                    json!({"type": "text", "media_type": "text/plain", "data": text})
                }
                DocumentSource::Url(url) => json!({"type": "url", "url": url}),
            };
            let mut doc = json!({"type": "document", "source": source});
            if let Some(title) = d.title {
                doc["title"] = title.into();
            }
            doc
        }
        // Reasoning goes back with the signature it came with; unsigned reasoning
        // (another provider's) Anthropic would refuse: left out.
        Part::Reasoning(r) => match r.signature {
            Some(sig) => json!({"type": "thinking", "thinking": r.text, "signature": sig}),
            None => Value::Null,
        },
        Part::RedactedReasoning(data) => json!({"type": "redacted_thinking", "data": data}),
        // Only in answers (see `answer`): as text.
        Part::Json(v) => text_block(&v.to_string()),
        Part::ToolUse(t) => {
            json!({"type": "tool_use", "id": t.id, "name": t.name, "input": t.input})
        }
        Part::ToolResult(r) => {
            let content = match &r.content {
                ToolOutput::Text(s) => Value::String((*s).to_owned()),
                ToolOutput::Parts(ps) => Value::Array(ps.iter().map(block).collect()),
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

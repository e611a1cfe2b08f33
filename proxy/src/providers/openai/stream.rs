//! Chat completion chunks ↔ form events.
//!
//! Chunks are parsed into small borrowed structs (strings stay in the event's bytes
//! unless they hold escapes) and written straight into the caller's buffer.

use std::borrow::Cow;

use bytes::{BufMut, BytesMut};
use serde::{Deserialize, Serialize};

use super::super::dialect;
use super::super::form::{Event, Stop, Usage, UsageDelta};
use super::super::vocab::fresh_id;
use super::super::vocab::write_json;
use super::shapes::{WireUsage, bare_id, finish_reason, form_usage, stop_of, wire_id, wire_usage};

// ---------------------------------------------------------------------------------
// Decode: an OpenAI target's chunks → events
// ---------------------------------------------------------------------------------

#[derive(Deserialize)]
struct ChunkIn<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    choices: Option<Vec<ChoiceIn<'a>>>,
    #[serde(default)]
    usage: Option<UsageIn>,
}

#[derive(Deserialize)]
struct ChoiceIn<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    delta: Option<DeltaIn<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct DeltaIn<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    /// Reasoning text as vLLM, DeepSeek and others send it (`reasoning_content`;
    /// `reasoning` in newer vLLM): no OpenAI field.
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<ToolDeltaIn<'a>>>,
}

#[derive(Deserialize)]
struct ToolDeltaIn<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<FunctionDeltaIn<'a>>,
}

#[derive(Deserialize)]
struct FunctionDeltaIn<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct UsageIn {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<DetailsIn>,
}

#[derive(Deserialize)]
struct DetailsIn {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// Reads one OpenAI stream. The first choice is the answer.
#[derive(Default)]
pub(in super::super) struct StreamDecoder {
    started: bool,
    /// Per tool call so far, in order (its position is the form's `tool`): OpenAI's
    /// `tool_calls[].index` and the id it came with.
    tools: Vec<(u32, Option<String>)>,
    refused: bool,
    stopped: bool,
    usage_seen: bool,
}

impl StreamDecoder {
    /// One event's `data`.
    pub(in super::super) fn decode(&mut self, data: &[u8], emit: &mut dyn FnMut(Event<'_>)) {
        if data.trim_ascii() == b"[DONE]" {
            emit(Event::End);
            return;
        }
        let Ok(chunk) = serde_json::from_slice::<ChunkIn<'_>>(data) else {
            return; // not a chunk: nothing to say
        };
        if !self.started {
            self.started = true;
            let id = chunk.id.as_deref().filter(|s| !s.is_empty());
            emit(Event::Start {
                id: id.map(bare_id),
            });
        }
        for choice in chunk.choices.iter().flatten().filter(|c| c.index == 0) {
            if let Some(d) = &choice.delta {
                let reasoning = d.reasoning_content.as_deref().or(d.reasoning.as_deref());
                if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
                    emit(Event::Reasoning(r));
                }
                if let Some(t) = d.content.as_deref().filter(|t| !t.is_empty()) {
                    emit(Event::Text(t));
                }
                if let Some(r) = d.refusal.as_deref().filter(|r| !r.is_empty()) {
                    self.refused = true;
                    emit(Event::Text(r));
                }
                for tc in d.tool_calls.iter().flatten() {
                    self.tool_call(tc, emit);
                }
            }
            if let Some(f) = choice.finish_reason.as_deref() {
                self.stopped = true;
                emit(Event::Stop(if self.refused {
                    Stop::Refusal
                } else {
                    stop_of(f)
                }));
            }
        }
        if let Some(u) = &chunk.usage {
            self.usage_seen = true;
            let cached = u
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens);
            let u = form_usage(
                u.prompt_tokens.unwrap_or(0),
                u.completion_tokens.unwrap_or(0),
                cached.unwrap_or(0),
            );
            emit(Event::Usage(UsageDelta {
                input: Some(u.input),
                output: Some(u.output),
                cache_read: Some(u.cache_read),
                cache_write: Some(u.cache_write),
            }));
        }
        // The usage chunk follows the finish chunk: once both are in, the answer is
        // complete even if `[DONE]` never comes.
        if self.stopped && self.usage_seen {
            emit(Event::End);
        }
    }

    fn tool_call(&mut self, tc: &ToolDeltaIn<'_>, emit: &mut dyn FnMut(Event<'_>)) {
        // A delta names its call by index; a new id at a known index is a new call.
        let new_id = tc.id.as_deref().filter(|s| !s.is_empty());
        let known = self
            .tools
            .iter()
            .rposition(|(i, id)| *i == tc.index && new_id.is_none_or(|n| id.as_deref() == Some(n)));
        let tool = match known {
            Some(n) => n as u32,
            None => {
                let n = self.tools.len() as u32;
                let name = tc.function.as_ref().and_then(|f| f.name.as_deref());
                emit(Event::ToolStart {
                    tool: n,
                    id: new_id,
                    name: name.unwrap_or(""),
                });
                self.tools.push((tc.index, new_id.map(str::to_owned)));
                n
            }
        };
        let args = tc.function.as_ref().and_then(|f| f.arguments.as_deref());
        if let Some(json) = args.filter(|a| !a.is_empty()) {
            emit(Event::ToolArgs { tool, json });
        }
    }
}

// ---------------------------------------------------------------------------------
// Encode: events → an OpenAI client's chunks
// ---------------------------------------------------------------------------------

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [Choice<'a>],
    /// Absent unless the client asked for usage; then `null` except in the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<WireUsage>>,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCallDelta<'a>; 1]>,
}

#[derive(Serialize)]
struct ToolCallDelta<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'a str>,
    function: FunctionDelta<'a>,
}

#[derive(Serialize)]
struct FunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a str>,
}

/// Writes one OpenAI client stream.
pub(in super::super) struct StreamEncoder {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    usage: Usage,
    /// The stop reason, once the finish chunk has been written.
    stop: Option<Stop>,
    /// The tool call begun last, while none of its arguments has been written: a
    /// call without arguments (Gemini's `"args": {}`, Anthropic's and Bedrock's
    /// empty input) gets `{}` before the stream moves on, as OpenAI sends it; an
    /// empty string is no JSON (`json.loads` refuses it).
    bare_tool: Option<u32>,
}

impl StreamEncoder {
    pub(in super::super) fn new(client_model: &str, created: u64, include_usage: bool) -> Self {
        Self {
            id: String::new(),
            model: client_model.to_owned(),
            created,
            include_usage,
            usage: Usage::default(),
            stop: None,
            bare_tool: None,
        }
    }

    pub(in super::super) fn set_created(&mut self, created: u64) {
        self.created = created;
    }

    /// Whether the answer can be completed: its stop reason is known.
    pub(in super::super) fn stopped(&self) -> bool {
        self.stop.is_some()
    }

    /// Returns whether the client stream is complete.
    pub(in super::super) fn encode(&mut self, ev: Event<'_>, out: &mut BytesMut) -> bool {
        match &ev {
            Event::ToolArgs { tool, .. } if self.bare_tool == Some(*tool) => self.bare_tool = None,
            // An error ends the stream as it is: no arguments made up for it.
            Event::ToolArgs { .. } | Event::Usage(_) | Event::Error(_) => {}
            _ => self.close_bare_tool(out),
        }
        match ev {
            Event::Start { id } => {
                if let Some(id) = id {
                    self.id = wire_id(id);
                }
                let role = Delta {
                    role: Some("assistant"),
                    content: Some(""),
                    ..Delta::default()
                };
                self.chunk(out, role, None);
            }
            Event::Text(t) => {
                let text = Delta {
                    content: Some(t),
                    ..Delta::default()
                };
                self.chunk(out, text, None);
            }
            Event::ToolStart { tool, id, name } => {
                let call = ToolCallDelta {
                    index: tool,
                    id: Some(id.unwrap_or("")),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(name),
                        arguments: Some(""),
                    },
                };
                self.tool_chunk(out, call);
                self.bare_tool = Some(tool);
            }
            Event::ToolArgs { tool, json } => self.args_chunk(out, tool, json),
            // The official SDKs read no reasoning field (see docs/translation.md).
            Event::Reasoning(_) | Event::ReasoningSignature(_) | Event::RedactedReasoning(_) => {}
            Event::Usage(u) => self.usage.update(&u),
            Event::Stop(stop) => {
                if self.stop.is_none() {
                    self.stop = Some(stop);
                    self.chunk(out, Delta::default(), Some(finish_reason(stop)));
                }
            }
            Event::End => {
                self.end(out);
                return true;
            }
            Event::Error(e) => {
                out.put_slice(b"data: ");
                write_json(out, &super::shapes::encode_error(&e));
                out.put_slice(b"\n\n");
                return true;
            }
        }
        false
    }

    /// `{}` for the tool call begun last, if none of its arguments came.
    fn close_bare_tool(&mut self, out: &mut BytesMut) {
        if let Some(tool) = self.bare_tool.take() {
            self.args_chunk(out, tool, "{}");
        }
    }

    /// More arguments of tool call `tool`.
    fn args_chunk(&mut self, out: &mut BytesMut, tool: u32, json: &str) {
        let call = ToolCallDelta {
            index: tool,
            id: None,
            kind: None,
            function: FunctionDelta {
                name: None,
                arguments: Some(json),
            },
        };
        self.tool_chunk(out, call);
    }

    fn tool_chunk(&mut self, out: &mut BytesMut, call: ToolCallDelta<'_>) {
        let delta = Delta {
            tool_calls: Some([call]),
            ..Delta::default()
        };
        self.chunk(out, delta, None);
    }

    fn chunk(&mut self, out: &mut BytesMut, delta: Delta<'_>, finish: Option<&str>) {
        let choices = [Choice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason: finish,
        }];
        // With include_usage every chunk carries `usage: null` but the last.
        self.write_chunk(out, &choices, self.include_usage.then_some(None));
    }

    fn write_chunk(
        &mut self,
        out: &mut BytesMut,
        choices: &[Choice<'_>],
        usage: Option<Option<WireUsage>>,
    ) {
        if self.id.is_empty() {
            // The upstream's message_start (and its id) went missing.
            self.id = wire_id(&fresh_id());
        }
        out.put_slice(b"data: ");
        write_json(
            out,
            &Chunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices,
                usage,
            },
        );
        out.put_slice(b"\n\n");
    }

    /// The usage chunk (if asked for) and `[DONE]`.
    pub(in super::super) fn end(&mut self, out: &mut BytesMut) {
        if self.include_usage {
            let usage = wire_usage(&self.usage);
            self.write_chunk(out, &[], Some(Some(usage)));
        }
        out.put_slice(b"data: [DONE]\n\n");
    }
}

impl dialect::StreamDecoder for StreamDecoder {
    fn decode(&mut self, data: &[u8], emit: &mut dyn FnMut(Event<'_>)) {
        StreamDecoder::decode(self, data, emit)
    }
}

impl dialect::StreamEncoder for StreamEncoder {
    fn encode(&mut self, ev: Event<'_>, out: &mut BytesMut) -> bool {
        StreamEncoder::encode(self, ev, out)
    }

    fn stopped(&self) -> bool {
        StreamEncoder::stopped(self)
    }

    fn end(&mut self, out: &mut BytesMut) {
        StreamEncoder::end(self, out)
    }

    fn set_created(&mut self, created: u64) {
        StreamEncoder::set_created(self, created)
    }
}

//! Streams: one upstream SSE event in, zero or more complete client SSE events out,
//! at once (see the module docs for the one place an event waits for the next).
//!
//! Each event is parsed into small borrowed structs (strings stay in the event's
//! bytes unless they hold escapes) and the client events are serialised straight
//! into the caller's buffer.

use std::borrow::Cow;

use bytes::{BufMut, BytesMut};
use serde::{Deserialize, Serialize};

use super::vocab::{
    AnthropicCounts, AnthropicUsage, OpenAiUsage, anthropic_id, finish_reason, fresh_id, now,
    openai_id, stop_reason, tool_id,
};
use super::{Direction, errors};
use crate::sse;

/// Translates one upstream stream for one client. Feed it every upstream event in
/// order with [`event`](Self::event) (the unterminated tail `Framer::take_rest`
/// returns counts as an event), then call [`finish`](Self::finish) once when the
/// upstream ends cleanly. If the upstream connection fails instead, the caller
/// writes its own failure event (`sse::failure_event`) as it does untranslated.
pub struct StreamTranslator {
    direction: Direction,
    inner: Inner,
    done: bool,
}

enum Inner {
    /// Anthropic events in, OpenAI chunks out.
    FromAnthropic(FromAnthropic),
    /// OpenAI chunks in, Anthropic events out.
    FromOpenAi(FromOpenAi),
}

impl StreamTranslator {
    /// `include_usage`: the OpenAI client's `stream_options.include_usage` (see
    /// [`super::include_usage`]); ignored for Anthropic clients, which always get usage.
    pub fn new(direction: Direction, client_model: &str, include_usage: bool) -> Self {
        let inner = match direction {
            Direction::OpenAiToAnthropic => Inner::FromAnthropic(FromAnthropic {
                id: String::new(),
                model: client_model.to_owned(),
                created: now(),
                include_usage,
                tool_of_block: Vec::new(),
                tools: 0,
                usage: AnthropicCounts::default(),
                finish: None,
            }),
            Direction::AnthropicToOpenAi => Inner::FromOpenAi(FromOpenAi {
                id: String::new(),
                model: client_model.to_owned(),
                started: false,
                next_block: 0,
                open: None,
                tools: Vec::new(),
                stop: None,
                refused: false,
                usage: None,
            }),
        };
        Self {
            direction,
            inner,
            done: false,
        }
    }

    /// Fix the `created` stamp of OpenAI chunks (reproducible output in tests).
    pub fn with_created(mut self, created: u64) -> Self {
        if let Inner::FromAnthropic(a) = &mut self.inner {
            a.created = created;
        }
        self
    }

    /// Whether the client stream is complete (terminated normally or by an error
    /// event): later events are ignored.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Translate ONE complete upstream event, appending the client events to `out`.
    pub fn event(&mut self, upstream_event: &[u8], out: &mut BytesMut) {
        if self.done {
            return;
        }
        let fields = sse::fields(upstream_event);
        let Some(data) = fields.data else {
            return; // a comment or keep-alive
        };
        if let Some(e) = sse::error_in(&fields) {
            self.error(e.status, &e.body, out);
            return;
        }
        self.done = match &mut self.inner {
            Inner::FromAnthropic(a) => a.event(data, out),
            Inner::FromOpenAi(o) => o.event(data, out),
        };
    }

    /// The upstream ended. Completes a stream whose last terminal events were
    /// missing but whose stop reason is known; otherwise (the upstream stopped
    /// mid-answer) ends the client stream with an error event.
    pub fn finish(&mut self, out: &mut BytesMut) {
        if self.done {
            return;
        }
        self.done = true;
        let completed = match &mut self.inner {
            Inner::FromAnthropic(a) => {
                a.finish.is_some() && {
                    a.end(out);
                    true
                }
            }
            Inner::FromOpenAi(o) => {
                o.stop.is_some() && {
                    o.end(out);
                    true
                }
            }
        };
        if !completed {
            out.put_slice(&sse::failure_event(
                self.direction.client_wire(),
                "the upstream stream ended before the answer was complete",
            ));
        }
    }

    fn error(&mut self, status: u16, body: &[u8], out: &mut BytesMut) {
        self.done = true;
        let v = errors::translate(self.direction, status, body);
        match self.direction {
            Direction::OpenAiToAnthropic => out.put_slice(b"data: "),
            Direction::AnthropicToOpenAi => out.put_slice(b"event: error\ndata: "),
        }
        write_json(out, &v);
        out.put_slice(b"\n\n");
    }
}

fn write_json<T: Serialize + ?Sized>(out: &mut BytesMut, v: &T) {
    // Serialising plain structs and `Value`s into memory cannot fail.
    let _ = serde_json::to_writer(out.writer(), v);
}

fn write_anthropic<T: Serialize + ?Sized>(out: &mut BytesMut, name: &str, v: &T) {
    out.put_slice(b"event: ");
    out.put_slice(name.as_bytes());
    out.put_slice(b"\ndata: ");
    write_json(out, v);
    out.put_slice(b"\n\n");
}

// ---------------------------------------------------------------------------------
// Anthropic events → OpenAI chunks
// ---------------------------------------------------------------------------------

#[derive(Deserialize)]
struct AnEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    index: Option<usize>,
    #[serde(default, borrow)]
    message: Option<AnMessage<'a>>,
    #[serde(default, borrow)]
    content_block: Option<AnBlock<'a>>,
    #[serde(default, borrow)]
    delta: Option<AnDelta<'a>>,
    #[serde(default)]
    usage: Option<AnUsage>,
}

#[derive(Deserialize)]
struct AnMessage<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<AnUsage>,
}

#[derive(Deserialize)]
struct AnBlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct AnDelta<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    partial_json: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
struct AnUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

/// Anthropic's counts so far: each event reports cumulative values.
impl AnthropicCounts {
    fn update(&mut self, u: &AnUsage) {
        let set = |slot: &mut u64, v: Option<u64>| {
            if let Some(v) = v {
                *slot = v;
            }
        };
        set(&mut self.input, u.input_tokens);
        set(&mut self.output, u.output_tokens);
        set(&mut self.cache_read, u.cache_read_input_tokens);
        set(&mut self.cache_write, u.cache_creation_input_tokens);
    }
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [Choice<'a>],
    /// Absent unless the client asked for usage; then `null` except in the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<OpenAiUsage>>,
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

/// Content blocks of one Anthropic message whose tool-call arguments are relayed:
/// far more than any real answer has, and a bound on the index table.
const MAX_BLOCKS: usize = 4096;

struct FromAnthropic {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    /// Content block index → tool call ordinal (OpenAI's `tool_calls[].index`).
    tool_of_block: Vec<Option<u32>>,
    tools: u32,
    usage: AnthropicCounts,
    /// The finish reason, once the finish chunk has been written.
    finish: Option<&'static str>,
}

impl FromAnthropic {
    fn chunk(&self, out: &mut BytesMut, delta: Delta<'_>, finish: Option<&str>) {
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
        &self,
        out: &mut BytesMut,
        choices: &[Choice<'_>],
        usage: Option<Option<OpenAiUsage>>,
    ) {
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

    fn ensure_id(&mut self) {
        if self.id.is_empty() {
            self.id = openai_id(&fresh_id());
        }
    }

    /// Returns whether the client stream is complete.
    fn event(&mut self, data: &[u8], out: &mut BytesMut) -> bool {
        let Ok(ev) = serde_json::from_slice::<AnEvent<'_>>(data) else {
            return false; // not an Anthropic event: nothing to say
        };
        match ev.kind.as_ref() {
            "message_start" => {
                if let Some(m) = &ev.message {
                    if let Some(id) = &m.id {
                        self.id = openai_id(id);
                    }
                    if let Some(u) = &m.usage {
                        self.usage.update(u);
                    }
                }
                self.ensure_id();
                self.chunk(
                    out,
                    Delta {
                        role: Some("assistant"),
                        content: Some(""),
                        ..Delta::default()
                    },
                    None,
                );
            }
            "content_block_start" => {
                self.ensure_id();
                let (Some(index), Some(block)) = (ev.index, &ev.content_block) else {
                    return false;
                };
                match block.kind.as_ref() {
                    "text" => {
                        if let Some(t) = block.text.as_deref().filter(|t| !t.is_empty()) {
                            self.text(t, out);
                        }
                    }
                    "tool_use" => {
                        let n = self.tools;
                        self.tools = self.tools.saturating_add(1);
                        // The index is the provider's number: a table indexed by it
                        // stays small (a block past MAX_BLOCKS gets no arguments).
                        if index < MAX_BLOCKS {
                            if self.tool_of_block.len() <= index {
                                self.tool_of_block.resize(index + 1, None);
                            }
                            self.tool_of_block[index] = Some(n);
                        }
                        self.chunk(
                            out,
                            Delta {
                                tool_calls: Some([ToolCallDelta {
                                    index: n,
                                    id: Some(block.id.as_deref().unwrap_or("")),
                                    kind: Some("function"),
                                    function: FunctionDelta {
                                        name: Some(block.name.as_deref().unwrap_or("")),
                                        arguments: Some(""),
                                    },
                                }]),
                                ..Delta::default()
                            },
                            None,
                        );
                    }
                    // thinking, redacted_thinking, server tools: no chat form.
                    _ => {}
                }
            }
            "content_block_delta" => {
                self.ensure_id();
                let Some(d) = &ev.delta else { return false };
                match d.kind.as_deref() {
                    Some("text_delta") => {
                        if let Some(t) = d.text.as_deref().filter(|t| !t.is_empty()) {
                            self.text(t, out);
                        }
                    }
                    Some("input_json_delta") => {
                        let tool = ev
                            .index
                            .and_then(|i| self.tool_of_block.get(i).copied().flatten());
                        let args = d.partial_json.as_deref().filter(|a| !a.is_empty());
                        if let (Some(n), Some(args)) = (tool, args) {
                            self.chunk(
                                out,
                                Delta {
                                    tool_calls: Some([ToolCallDelta {
                                        index: n,
                                        id: None,
                                        kind: None,
                                        function: FunctionDelta {
                                            name: None,
                                            arguments: Some(args),
                                        },
                                    }]),
                                    ..Delta::default()
                                },
                                None,
                            );
                        }
                    }
                    // thinking_delta, signature_delta, citations_delta: no chat form.
                    _ => {}
                }
            }
            "message_delta" => {
                self.ensure_id();
                if let Some(u) = &ev.usage {
                    self.usage.update(u);
                }
                let stop = ev.delta.as_ref().and_then(|d| d.stop_reason.as_deref());
                if let Some(stop) = stop
                    && self.finish.is_none()
                {
                    let finish = finish_reason(stop);
                    self.finish = Some(finish);
                    self.chunk(out, Delta::default(), Some(finish));
                }
            }
            "message_stop" => {
                self.ensure_id();
                self.end(out);
                return true;
            }
            // ping, content_block_stop and anything newer carry nothing for the client.
            _ => {}
        }
        false
    }

    fn text(&self, t: &str, out: &mut BytesMut) {
        self.chunk(
            out,
            Delta {
                content: Some(t),
                ..Delta::default()
            },
            None,
        );
    }

    /// The usage chunk (if asked for) and `[DONE]`.
    fn end(&mut self, out: &mut BytesMut) {
        if self.include_usage {
            self.write_chunk(out, &[], Some(Some(self.usage.openai())));
        }
        out.put_slice(b"data: [DONE]\n\n");
    }
}

// ---------------------------------------------------------------------------------
// OpenAI chunks → Anthropic events
// ---------------------------------------------------------------------------------

#[derive(Deserialize)]
struct OaChunk<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    choices: Option<Vec<OaChoice<'a>>>,
    #[serde(default)]
    usage: Option<OaUsageIn>,
}

#[derive(Deserialize)]
struct OaChoice<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    delta: Option<OaDelta<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct OaDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<OaToolDelta<'a>>>,
}

#[derive(Deserialize)]
struct OaToolDelta<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<OaFunctionDelta<'a>>,
}

#[derive(Deserialize)]
struct OaFunctionDelta<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct OaUsageIn {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<OaDetails>,
}

#[derive(Deserialize)]
struct OaDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Serialize)]
struct BlockDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: usize,
    delta: DeltaBody<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum DeltaBody<'a> {
    TextDelta { text: &'a str },
    InputJsonDelta { partial_json: &'a str },
}

#[derive(Serialize)]
struct BlockStop {
    #[serde(rename = "type")]
    kind: &'static str,
    index: usize,
}

#[derive(Serialize)]
struct MessageStart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: StartMessage<'a>,
}

#[derive(Serialize)]
struct StartMessage<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: [(); 0],
    stop_reason: Option<()>,
    stop_sequence: Option<()>,
    usage: AnthropicUsage,
}

#[derive(Serialize)]
struct BlockStart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: usize,
    content_block: StartBlock<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StartBlock<'a> {
    Text {
        text: &'static str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Empty,
    },
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct MessageDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    delta: StopDelta<'a>,
    usage: AnthropicUsage,
}

#[derive(Serialize)]
struct StopDelta<'a> {
    stop_reason: &'a str,
    stop_sequence: Option<()>,
}

#[derive(Serialize)]
struct Kind {
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Text(usize),
    Tool(usize),
}

struct FromOpenAi {
    id: String,
    model: String,
    started: bool,
    next_block: usize,
    open: Option<Open>,
    /// (OpenAI tool call index, its id, content block index).
    tools: Vec<(u32, String, usize)>,
    stop: Option<&'static str>,
    refused: bool,
    usage: Option<AnthropicUsage>,
}

impl FromOpenAi {
    /// Returns whether the client stream is complete.
    fn event(&mut self, data: &[u8], out: &mut BytesMut) -> bool {
        if data.trim_ascii() == b"[DONE]" {
            self.end(out);
            return true;
        }
        let Ok(chunk) = serde_json::from_slice::<OaChunk<'_>>(data) else {
            return false;
        };
        self.start(chunk.id.as_deref(), out);
        for choice in chunk.choices.iter().flatten().filter(|c| c.index == 0) {
            if let Some(d) = &choice.delta {
                if let Some(t) = d.content.as_deref().filter(|t| !t.is_empty()) {
                    self.text(t, out);
                }
                if let Some(r) = d.refusal.as_deref().filter(|r| !r.is_empty()) {
                    self.refused = true;
                    self.text(r, out);
                }
                for tc in d.tool_calls.iter().flatten() {
                    self.tool_call(tc, out);
                }
            }
            if let Some(f) = choice.finish_reason.as_deref() {
                self.close(out);
                self.stop = Some(if self.refused {
                    "refusal"
                } else {
                    stop_reason(f)
                });
            }
        }
        if let Some(u) = &chunk.usage {
            let cached = u
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens);
            self.usage = Some(AnthropicUsage::from_openai(
                u.prompt_tokens.unwrap_or(0),
                u.completion_tokens.unwrap_or(0),
                cached.unwrap_or(0),
            ));
        }
        // Anthropic reports the stop reason and usage together: write them as soon as
        // both are known (the usage chunk follows the finish chunk).
        if self.stop.is_some() && self.usage.is_some() {
            self.end(out);
            return true;
        }
        false
    }

    fn start(&mut self, upstream_id: Option<&str>, out: &mut BytesMut) {
        if self.started {
            return;
        }
        self.started = true;
        self.id = match upstream_id.filter(|s| !s.is_empty()) {
            Some(id) => anthropic_id(id),
            None => anthropic_id(&fresh_id()),
        };
        write_anthropic(
            out,
            "message_start",
            &MessageStart {
                kind: "message_start",
                message: StartMessage {
                    id: &self.id,
                    kind: "message",
                    role: "assistant",
                    model: &self.model,
                    content: [],
                    stop_reason: None,
                    stop_sequence: None,
                    // Input tokens are known only at the end (see the module docs).
                    usage: AnthropicUsage::default(),
                },
            },
        );
    }

    fn close(&mut self, out: &mut BytesMut) {
        if let Some(Open::Text(index) | Open::Tool(index)) = self.open.take() {
            write_anthropic(
                out,
                "content_block_stop",
                &BlockStop {
                    kind: "content_block_stop",
                    index,
                },
            );
        }
    }

    fn open_block(&mut self, block: StartBlock<'_>, out: &mut BytesMut) -> usize {
        self.close(out);
        let index = self.next_block;
        self.next_block = self.next_block.saturating_add(1);
        write_anthropic(
            out,
            "content_block_start",
            &BlockStart {
                kind: "content_block_start",
                index,
                content_block: block,
            },
        );
        index
    }

    fn text(&mut self, text: &str, out: &mut BytesMut) {
        let index = match self.open {
            Some(Open::Text(i)) => i,
            _ => {
                let i = self.open_block(StartBlock::Text { text: "" }, out);
                self.open = Some(Open::Text(i));
                i
            }
        };
        write_anthropic(
            out,
            "content_block_delta",
            &BlockDelta {
                kind: "content_block_delta",
                index,
                delta: DeltaBody::TextDelta { text },
            },
        );
    }

    fn tool_call(&mut self, tc: &OaToolDelta<'_>, out: &mut BytesMut) {
        let new_id = tc.id.as_deref().filter(|s| !s.is_empty());
        let known = self
            .tools
            .iter()
            .rev()
            .find(|(i, id, _)| *i == tc.index && new_id.is_none_or(|n| n == id))
            .map(|t| t.2);
        let index = match known {
            Some(b) => b,
            None => {
                let id = match new_id {
                    Some(id) => id.to_owned(),
                    None => tool_id(&self.id, self.tools.len()),
                };
                let name = tc.function.as_ref().and_then(|f| f.name.as_deref());
                let block = StartBlock::ToolUse {
                    id: &id,
                    name: name.unwrap_or(""),
                    input: Empty {},
                };
                let b = self.open_block(block, out);
                self.open = Some(Open::Tool(b));
                self.tools.push((tc.index, id, b));
                b
            }
        };
        let args = tc.function.as_ref().and_then(|f| f.arguments.as_deref());
        if let Some(partial_json) = args.filter(|a| !a.is_empty()) {
            write_anthropic(
                out,
                "content_block_delta",
                &BlockDelta {
                    kind: "content_block_delta",
                    index,
                    delta: DeltaBody::InputJsonDelta { partial_json },
                },
            );
        }
    }

    /// Close the open block, then `message_delta` (stop reason and usage) and
    /// `message_stop`.
    fn end(&mut self, out: &mut BytesMut) {
        self.start(None, out);
        self.close(out);
        write_anthropic(
            out,
            "message_delta",
            &MessageDelta {
                kind: "message_delta",
                delta: StopDelta {
                    stop_reason: self.stop.unwrap_or("end_turn"),
                    stop_sequence: None,
                },
                usage: self.usage.unwrap_or_default(),
            },
        );
        write_anthropic(
            out,
            "message_stop",
            &Kind {
                kind: "message_stop",
            },
        );
    }
}

//! Messages stream events ↔ form events.
//!
//! Events are parsed into small borrowed structs (strings stay in the event's bytes
//! unless they hold escapes) and written straight into the caller's buffer.

use std::borrow::Cow;

use bytes::{BufMut, BytesMut};
use serde::{Deserialize, Serialize};

use super::super::dialect;
use super::super::form::{Event, Stop, Usage, UsageDelta};
use super::super::vocab::write_json;
use super::super::vocab::{JSON_TOOL, MAX_BLOCKS, fresh_id, tool_id};
use super::shapes::{WireUsage, bare_id, stop_of, stop_reason, wire_id, wire_usage};

// ---------------------------------------------------------------------------------
// Decode: an Anthropic target's events → form events
// ---------------------------------------------------------------------------------

#[derive(Deserialize)]
struct EventIn<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    index: Option<usize>,
    #[serde(default, borrow)]
    message: Option<MessageIn<'a>>,
    #[serde(default, borrow)]
    content_block: Option<BlockIn<'a>>,
    #[serde(default, borrow)]
    delta: Option<DeltaIn<'a>>,
    #[serde(default)]
    usage: Option<UsageIn>,
}

#[derive(Deserialize)]
struct MessageIn<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<UsageIn>,
}

#[derive(Deserialize)]
struct BlockIn<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    data: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct DeltaIn<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    partial_json: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    signature: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
struct UsageIn {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl UsageIn {
    fn delta(&self) -> UsageDelta {
        UsageDelta {
            input: self.input_tokens,
            output: self.output_tokens,
            cache_read: self.cache_read_input_tokens,
            cache_write: self.cache_creation_input_tokens,
        }
    }
}

/// Reads one Anthropic stream.
#[derive(Default)]
pub(in super::super) struct StreamDecoder {
    /// Content block index → the form's tool number.
    tool_of_block: Vec<Option<u32>>,
    tools: u32,
    /// The block of the gateway's JSON tool, whose input is the answer's text
    /// (`vocab::JSON_TOOL`).
    json_block: Option<usize>,
}

impl StreamDecoder {
    /// One event's `data`.
    pub(in super::super) fn decode(&mut self, data: &[u8], emit: &mut dyn FnMut(Event<'_>)) {
        let Ok(ev) = serde_json::from_slice::<EventIn<'_>>(data) else {
            return; // not an Anthropic event: nothing to say
        };
        match ev.kind.as_ref() {
            "message_start" => {
                let m = ev.message.as_ref();
                if let Some(u) = m.and_then(|m| m.usage.as_ref()) {
                    emit(Event::Usage(u.delta()));
                }
                let id = m.and_then(|m| m.id.as_deref()).map(bare_id);
                emit(Event::Start { id });
            }
            "content_block_start" => {
                let (Some(index), Some(block)) = (ev.index, &ev.content_block) else {
                    return;
                };
                match block.kind.as_ref() {
                    "text" => {
                        if let Some(t) = block.text.as_deref().filter(|t| !t.is_empty()) {
                            emit(Event::Text(t));
                        }
                    }
                    "tool_use" if block.name.as_deref() == Some(JSON_TOOL) => {
                        self.json_block = Some(index);
                    }
                    "thinking" => {
                        if let Some(t) = block.thinking.as_deref().filter(|t| !t.is_empty()) {
                            emit(Event::Reasoning(t));
                        }
                    }
                    "redacted_thinking" => {
                        emit(Event::RedactedReasoning(
                            block.data.as_deref().unwrap_or(""),
                        ));
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
                        emit(Event::ToolStart {
                            tool: n,
                            id: Some(block.id.as_deref().unwrap_or("")),
                            name: block.name.as_deref().unwrap_or(""),
                        });
                    }
                    // Server tools: no place in the form.
                    _ => {}
                }
            }
            "content_block_delta" => {
                let Some(d) = &ev.delta else { return };
                match d.kind.as_deref() {
                    Some("text_delta") => {
                        if let Some(t) = d.text.as_deref().filter(|t| !t.is_empty()) {
                            emit(Event::Text(t));
                        }
                    }
                    Some("input_json_delta") => {
                        let args = d.partial_json.as_deref().filter(|a| !a.is_empty());
                        if ev.index.is_some() && ev.index == self.json_block {
                            if let Some(json) = args {
                                emit(Event::Text(json));
                            }
                            return;
                        }
                        let tool = ev
                            .index
                            .and_then(|i| self.tool_of_block.get(i).copied().flatten());
                        if let (Some(tool), Some(json)) = (tool, args) {
                            emit(Event::ToolArgs { tool, json });
                        }
                    }
                    Some("thinking_delta") => {
                        if let Some(t) = d.thinking.as_deref().filter(|t| !t.is_empty()) {
                            emit(Event::Reasoning(t));
                        }
                    }
                    Some("signature_delta") => {
                        if let Some(s) = d.signature.as_deref().filter(|s| !s.is_empty()) {
                            emit(Event::ReasoningSignature(s));
                        }
                    }
                    // citations_delta: no place in the form.
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(u) = &ev.usage {
                    emit(Event::Usage(u.delta()));
                }
                if let Some(stop) = ev.delta.as_ref().and_then(|d| d.stop_reason.as_deref()) {
                    // An answer given through the JSON tool alone ends its turn.
                    let stop = match stop_of(stop) {
                        Stop::ToolUse if self.json_block.is_some() && self.tools == 0 => {
                            Stop::EndTurn
                        }
                        other => other,
                    };
                    emit(Event::Stop(stop));
                }
            }
            "message_stop" => emit(Event::End),
            // ping, content_block_stop and anything newer carry nothing for the client.
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------
// Encode: form events → an Anthropic client's events
// ---------------------------------------------------------------------------------

#[derive(Serialize)]
struct BlockDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: usize,
    delta: DeltaBody<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(clippy::enum_variant_names)] // Anthropic's own names
enum DeltaBody<'a> {
    TextDelta { text: &'a str },
    InputJsonDelta { partial_json: &'a str },
    ThinkingDelta { thinking: &'a str },
    SignatureDelta { signature: &'a str },
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
    usage: WireUsage,
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
    /// Its signature comes in a `signature_delta` (none when the provider signed
    /// nothing: the block keeps the empty one).
    Thinking {
        thinking: &'static str,
        signature: &'static str,
    },
    RedactedThinking {
        data: &'a str,
    },
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct MessageDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    delta: StopDelta<'a>,
    usage: WireUsage,
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

fn write_event<T: Serialize + ?Sized>(out: &mut BytesMut, name: &str, v: &T) {
    out.put_slice(b"event: ");
    out.put_slice(name.as_bytes());
    out.put_slice(b"\ndata: ");
    write_json(out, v);
    out.put_slice(b"\n\n");
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Text(usize),
    Tool(usize),
    Thinking(usize),
    Redacted(usize),
}

/// Writes one Anthropic client stream.
pub(in super::super) struct StreamEncoder {
    /// The bare id (see `form::Answer::id`), once started.
    id: String,
    model: String,
    started: bool,
    next_block: usize,
    open: Option<Open>,
    /// The form's tool number → its content block index.
    tool_blocks: Vec<usize>,
    stop: Option<Stop>,
    usage: Option<Usage>,
}

impl StreamEncoder {
    pub(in super::super) fn new(client_model: &str) -> Self {
        Self {
            id: String::new(),
            model: client_model.to_owned(),
            started: false,
            next_block: 0,
            open: None,
            tool_blocks: Vec::new(),
            stop: None,
            usage: None,
        }
    }

    /// Whether the answer can be completed: its stop reason is known.
    pub(in super::super) fn stopped(&self) -> bool {
        self.stop.is_some()
    }

    /// Returns whether the client stream is complete.
    pub(in super::super) fn encode(&mut self, ev: Event<'_>, out: &mut BytesMut) -> bool {
        match ev {
            Event::Start { id } => self.start(id, out),
            Event::Text(text) => self.text(text, out),
            Event::ToolStart { tool, id, name } => {
                let id = match id {
                    Some(id) => Cow::Borrowed(id),
                    None => Cow::Owned(tool_id(&self.id, tool as usize)),
                };
                let block = StartBlock::ToolUse {
                    id: &id,
                    name,
                    input: Empty {},
                };
                let b = self.open_block(block, out);
                self.open = Some(Open::Tool(b));
                self.tool_blocks.push(b);
            }
            Event::ToolArgs { tool, json } => {
                if let Some(&index) = self.tool_blocks.get(tool as usize) {
                    let delta = BlockDelta {
                        kind: "content_block_delta",
                        index,
                        delta: DeltaBody::InputJsonDelta { partial_json: json },
                    };
                    write_event(out, "content_block_delta", &delta);
                }
            }
            Event::Reasoning(text) => {
                let index = match self.open {
                    Some(Open::Thinking(i)) => i,
                    _ => {
                        let block = StartBlock::Thinking {
                            thinking: "",
                            signature: "",
                        };
                        let i = self.open_block(block, out);
                        self.open = Some(Open::Thinking(i));
                        i
                    }
                };
                self.delta(index, DeltaBody::ThinkingDelta { thinking: text }, out);
            }
            Event::ReasoningSignature(signature) => {
                if let Some(Open::Thinking(index)) = self.open {
                    self.delta(index, DeltaBody::SignatureDelta { signature }, out);
                }
            }
            Event::RedactedReasoning(data) => {
                let i = self.open_block(StartBlock::RedactedThinking { data }, out);
                self.open = Some(Open::Redacted(i));
            }
            Event::Usage(d) => self.usage.get_or_insert_default().update(&d),
            Event::Stop(stop) => {
                self.close(out);
                self.stop = Some(stop);
            }
            Event::End => {
                self.end(out);
                return true;
            }
            Event::Error(e) => {
                out.put_slice(b"event: error\ndata: ");
                write_json(out, &super::shapes::encode_error(&e));
                out.put_slice(b"\n\n");
                return true;
            }
        }
        false
    }

    fn start(&mut self, id: Option<&str>, out: &mut BytesMut) {
        if self.started {
            return;
        }
        self.started = true;
        self.id = match id {
            Some(id) => id.to_owned(),
            None => fresh_id(),
        };
        let id = wire_id(&self.id);
        write_event(
            out,
            "message_start",
            &MessageStart {
                kind: "message_start",
                message: StartMessage {
                    id: &id,
                    kind: "message",
                    role: "assistant",
                    model: &self.model,
                    content: [],
                    stop_reason: None,
                    stop_sequence: None,
                    // Input tokens may be known only at the end (see the module docs):
                    // the final message_delta carries them.
                    usage: WireUsage::default(),
                },
            },
        );
    }

    fn delta(&mut self, index: usize, delta: DeltaBody<'_>, out: &mut BytesMut) {
        let delta = BlockDelta {
            kind: "content_block_delta",
            index,
            delta,
        };
        write_event(out, "content_block_delta", &delta);
    }

    fn close(&mut self, out: &mut BytesMut) {
        if let Some(
            Open::Text(index) | Open::Tool(index) | Open::Thinking(index) | Open::Redacted(index),
        ) = self.open.take()
        {
            let stop = BlockStop {
                kind: "content_block_stop",
                index,
            };
            write_event(out, "content_block_stop", &stop);
        }
    }

    fn open_block(&mut self, block: StartBlock<'_>, out: &mut BytesMut) -> usize {
        self.start(None, out);
        self.close(out);
        let index = self.next_block;
        self.next_block = self.next_block.saturating_add(1);
        let start = BlockStart {
            kind: "content_block_start",
            index,
            content_block: block,
        };
        write_event(out, "content_block_start", &start);
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
        let delta = BlockDelta {
            kind: "content_block_delta",
            index,
            delta: DeltaBody::TextDelta { text },
        };
        write_event(out, "content_block_delta", &delta);
    }

    /// Close the open block, then `message_delta` (stop reason and usage) and
    /// `message_stop`.
    pub(in super::super) fn end(&mut self, out: &mut BytesMut) {
        self.start(None, out);
        self.close(out);
        let delta = MessageDelta {
            kind: "message_delta",
            delta: StopDelta {
                stop_reason: stop_reason(self.stop.unwrap_or(Stop::EndTurn)),
                stop_sequence: None,
            },
            usage: self.usage.as_ref().map(wire_usage).unwrap_or_default(),
        };
        write_event(out, "message_delta", &delta);
        write_event(
            out,
            "message_stop",
            &Kind {
                kind: "message_stop",
            },
        );
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
}

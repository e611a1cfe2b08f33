//! What the client holds of one streamed answer, read from the events sent to it in
//! its own API (OpenAI chat chunks or Anthropic events): the text (bounded by
//! `maxHeldBytes`: past it the text is released and the stream cannot be resumed),
//! whether a tool call is in progress, the stream's id and Anthropic's content block
//! indexes. Once the stream is resumed, the continuation's events are rewritten into
//! the same stream here: the first stream's id, nothing the client already has (the
//! continuation's opening, the whitespace the prefill left out), block indexes that
//! continue, and usage that sums the attempts.
//!
//! Only a stream whose route resumes is read like this: every event is parsed once.
//! Until the first resume, what the client gets is passed on as it is (no copy).

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::wire::sse;
use crate::wire::surface::Wire;
use crate::wire::usage::Usage;

/// Why a committed stream that failed is not resumed (besides finding no target).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unresumable {
    /// A tool call was being streamed: its arguments cannot be continued.
    ToolCallInProgress,
    /// The client was sent more text than `maxHeldBytes`.
    HeldBytesExceeded,
}

/// The kind of an open Anthropic content block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Text,
    ToolUse,
    Other,
}

/// What the client holds, and how continuations are spliced in.
#[derive(Debug)]
pub(super) struct Transcript {
    wire: Wire,
    max_held: usize,
    text: String,
    overflowed: bool,
    tool_open: bool,
    /// OpenAI: the id of the first chunk (every chunk of the stream keeps it).
    id: Option<String>,
    /// Anthropic: the open content block, and the next index free.
    open: Option<(u64, Block)>,
    next_index: u64,
    /// Set from the first resume on.
    splice: Option<Splice>,
}

/// How the current continuation is rewritten.
#[derive(Debug, Default)]
struct Splice {
    /// Trailing whitespace of the client's text that the prefill left out: the
    /// continuation's leading whitespace, as far as it matches, is not sent again.
    skip: String,
    /// Anthropic: continuation block index → client block index.
    map: Vec<(u64, u64)>,
    /// Anthropic: the continuation's first content block was seen.
    started: bool,
    /// What the attempts before this one reported, added to what it reports.
    carried: Usage,
    /// Anthropic: the continuation's input tokens (its `message_start`, not sent).
    input: u64,
}

impl Transcript {
    pub(super) fn new(wire: Wire, max_held: usize) -> Self {
        Self {
            wire,
            max_held,
            text: String::new(),
            overflowed: false,
            tool_open: false,
            id: None,
            open: None,
            next_index: 0,
            splice: None,
        }
    }

    /// The text the client holds, for the prefill.
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// Bytes held for the text (counted in the replica's memory figures).
    pub(super) fn held(&self) -> usize {
        self.text.capacity()
    }

    /// The answer ended: nothing more is held.
    pub(super) fn release(&mut self) {
        self.text = String::new();
    }

    /// Whether the stream may be continued elsewhere.
    pub(super) fn resumable(&self) -> Result<(), Unresumable> {
        if self.tool_open {
            Err(Unresumable::ToolCallInProgress)
        } else if self.overflowed {
            Err(Unresumable::HeldBytesExceeded)
        } else {
            Ok(())
        }
    }

    /// A continuation begins: its prefill carried the first `sent` bytes of the
    /// text; `carried` is what the attempts before it reported in all.
    pub(super) fn resume(&mut self, sent: usize, carried: Usage) {
        let sent = sent.min(self.text.len());
        let skip = self.text.get(sent..).unwrap_or_default().to_owned();
        self.splice = Some(Splice {
            skip,
            carried,
            ..Splice::default()
        });
    }

    /// What the client gets of `chunk` (whole events in its API, as the committed
    /// stream sends them): the chunk itself before any resume, read on the way;
    /// rewritten after one.
    pub(super) fn pass(&mut self, chunk: Bytes) -> Bytes {
        if self.splice.is_none() {
            for ev in sse::split_events(&chunk) {
                self.observe(ev);
            }
            return chunk;
        }
        let mut out = BytesMut::with_capacity(chunk.len() + 64);
        for ev in sse::split_events(&chunk) {
            let start = out.len();
            match self.wire {
                Wire::OpenAi => self.splice_openai(ev, &mut out),
                Wire::Anthropic => self.splice_anthropic(ev, &mut out),
            }
            let written = out.split_off(start);
            for e in sse::split_events(&written) {
                self.observe(e);
            }
            out.unsplit(written);
        }
        out.freeze()
    }

    fn hold(&mut self, text: &str) {
        if self.overflowed || text.is_empty() {
            return;
        }
        if self.text.len().saturating_add(text.len()) > self.max_held {
            // Past the bound: released, and the stream can no longer be resumed.
            self.overflowed = true;
            self.text = String::new();
            return;
        }
        self.text.push_str(text);
    }

    /// Reads an event the client gets.
    fn observe(&mut self, ev: &[u8]) {
        let Some(data) = sse::fields(ev).data else {
            return;
        };
        match self.wire {
            Wire::OpenAi => {
                let Ok(c) = serde_json::from_slice::<Chunk<'_>>(data) else {
                    return;
                };
                if self.id.is_none()
                    && let Some(id) = c.id
                {
                    self.id = Some(id.into_owned());
                }
                for choice in &c.choices {
                    if let Some(d) = &choice.delta {
                        if d.tool_calls.is_some() {
                            self.tool_open = true;
                        }
                        if let Some(t) = &d.content {
                            self.hold(t);
                        }
                    }
                    if choice.finish_reason.is_some() {
                        self.tool_open = false;
                    }
                }
            }
            Wire::Anthropic => {
                let Ok(e) = serde_json::from_slice::<Event<'_>>(data) else {
                    return;
                };
                match e.kind.as_deref() {
                    Some("content_block_start") => {
                        let i = e.index.unwrap_or(self.next_index);
                        let kind = match e.content_block.and_then(|b| b.kind).as_deref() {
                            Some("text") => Block::Text,
                            Some("tool_use" | "server_tool_use") => Block::ToolUse,
                            _ => Block::Other,
                        };
                        self.tool_open = kind == Block::ToolUse;
                        self.open = Some((i, kind));
                        self.next_index = self.next_index.max(i + 1);
                    }
                    Some("content_block_delta") => {
                        if let Some(t) = e.delta.and_then(|d| d.text) {
                            self.hold(&t);
                        }
                    }
                    Some("content_block_stop") => {
                        self.tool_open = false;
                        self.open = None;
                    }
                    _ => {}
                }
            }
        }
    }

    /// What is left of a continuation's `text` after the whitespace the client
    /// already has.
    fn unskipped<'t>(skip: &mut String, text: &'t str) -> &'t str {
        let mut rest = text;
        while let Some(want) = skip.chars().next() {
            match rest.chars().next() {
                Some(c) if c == want => {
                    rest = &rest[c.len_utf8()..];
                    skip.drain(..want.len_utf8());
                }
                Some(_) => skip.clear(),
                None => break,
            }
        }
        if !rest.is_empty() {
            skip.clear();
        }
        rest
    }

    fn splice_openai(&mut self, ev: &[u8], out: &mut BytesMut) {
        let Some(data) = sse::fields(ev).data else {
            out.extend_from_slice(ev); // a comment
            return;
        };
        let Ok(mut v) = serde_json::from_slice::<Value>(data) else {
            out.extend_from_slice(ev); // [DONE]
            return;
        };
        let Some(splice) = self.splice.as_mut() else {
            return;
        };
        if let (Some(id), Some(o)) = (&self.id, v.as_object_mut()) {
            o.insert("id".into(), Value::String(id.clone()));
        }
        let mut keep = v.get("usage").is_some_and(|u| !u.is_null());
        if let Some(choice) = v
            .get_mut("choices")
            .and_then(Value::as_array_mut)
            .and_then(|c| c.first_mut())
        {
            keep |= choice.get("finish_reason").is_some_and(|f| !f.is_null());
            if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
                // The role was said at the start of the answer.
                delta.remove("role");
                if let Some(text) = delta.get("content").and_then(Value::as_str) {
                    let rest = Self::unskipped(&mut splice.skip, text).to_owned();
                    if rest.is_empty() {
                        delta.remove("content");
                    } else {
                        delta.insert("content".into(), Value::String(rest));
                    }
                }
                keep |= delta.values().any(|v| !v.is_null());
            }
        }
        if !keep {
            return;
        }
        if let Some(u) = v.get_mut("usage").and_then(Value::as_object_mut) {
            let n = |u: &serde_json::Map<String, Value>, k: &str| {
                u.get(k).and_then(Value::as_u64).unwrap_or(0)
            };
            let input = splice.carried.input_tokens + n(u, "prompt_tokens");
            let output = splice.carried.output_tokens + n(u, "completion_tokens");
            u.insert("prompt_tokens".into(), json!(input));
            u.insert("completion_tokens".into(), json!(output));
            u.insert("total_tokens".into(), json!(input + output));
        }
        write_event(out, None, &v);
    }

    fn splice_anthropic(&mut self, ev: &[u8], out: &mut BytesMut) {
        let f = sse::fields(ev);
        let Some(data) = f.data else {
            out.extend_from_slice(ev);
            return;
        };
        let Ok(mut v) = serde_json::from_slice::<Value>(data) else {
            out.extend_from_slice(ev);
            return;
        };
        let (open, next) = (self.open, self.next_index);
        let Some(splice) = self.splice.as_mut() else {
            return;
        };
        let mapped = |splice: &Splice, i: u64| {
            splice
                .map
                .iter()
                .find(|(from, _)| *from == i)
                .map_or(i, |(_, to)| *to)
        };
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        match v.get("type").and_then(Value::as_str).unwrap_or_default() {
            // The client has its message: one message_start per stream.
            "message_start" => {
                splice.input = v
                    .pointer("/message/usage/input_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                return;
            }
            "content_block_start" => {
                let text = v.pointer("/content_block/type").and_then(Value::as_str) == Some("text");
                let first = !splice.started;
                splice.started = true;
                if first
                    && text
                    && let Some((to, Block::Text)) = open
                {
                    // The open text block goes on.
                    splice.map.push((index, to));
                    return;
                }
                if let Some((o, _)) = open {
                    let stop = json!({"type": "content_block_stop", "index": o});
                    write_event(out, Some("content_block_stop"), &stop);
                }
                splice.map.push((index, next));
                v["index"] = json!(next);
            }
            "content_block_delta" => {
                v["index"] = json!(mapped(splice, index));
                if v.pointer("/delta/type").and_then(Value::as_str) == Some("text_delta")
                    && let Some(text) = v.pointer("/delta/text").and_then(Value::as_str)
                {
                    let rest = Self::unskipped(&mut splice.skip, text).to_owned();
                    if rest.is_empty() {
                        return;
                    }
                    v["delta"]["text"] = Value::String(rest);
                }
            }
            "content_block_stop" => {
                v["index"] = json!(mapped(splice, index));
            }
            "message_delta" => {
                if let Some(u) = v.get_mut("usage").and_then(Value::as_object_mut) {
                    let n = |k: &str| u.get(k).and_then(Value::as_u64);
                    let output = splice.carried.output_tokens + n("output_tokens").unwrap_or(0);
                    let input =
                        splice.carried.input_tokens + n("input_tokens").unwrap_or(splice.input);
                    u.insert("output_tokens".into(), json!(output));
                    u.insert("input_tokens".into(), json!(input));
                }
            }
            _ => {}
        }
        write_event(out, f.event.and_then(|e| std::str::from_utf8(e).ok()), &v);
    }
}

fn write_event(out: &mut BytesMut, name: Option<&str>, data: &Value) {
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// The parts of an OpenAI chat chunk the transcript reads.
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    choices: Vec<Choice<'a>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
}

/// The parts of an Anthropic stream event the transcript reads.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    content_block: Option<BlockStart<'a>>,
    #[serde(default, borrow)]
    delta: Option<TextDelta<'a>>,
}

#[derive(Deserialize)]
struct BlockStart<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct TextDelta<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(data: Value) -> Bytes {
        Bytes::from(format!("data: {data}\n\n"))
    }

    fn aev(name: &str, data: Value) -> Bytes {
        Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
    }

    fn datas(b: &[u8]) -> Vec<Value> {
        sse::split_events(b)
            .filter_map(|e| sse::fields(e).data)
            .filter_map(|d| serde_json::from_slice(d).ok())
            .collect()
    }

    #[test]
    fn an_openai_continuation_keeps_the_id_and_skips_what_the_client_has() {
        let mut t = Transcript::new(Wire::OpenAi, 1024);
        let first = ev(
            json!({"id": "first", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "one two "}}]}),
        );
        assert_eq!(t.pass(first.clone()), first, "passed on as it is");
        assert_eq!(t.text(), "one two ");
        t.resume(
            "one two".len(),
            Usage {
                input_tokens: 3,
                output_tokens: 2,
            },
        );
        let mut cont = BytesMut::new();
        cont.extend_from_slice(&ev(json!({"id": "second", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})));
        cont.extend_from_slice(&ev(
            json!({"id": "second", "choices": [{"index": 0, "delta": {"content": " three"}}]}),
        ));
        cont.extend_from_slice(&ev(json!({"id": "second", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})));
        cont.extend_from_slice(&ev(json!({"id": "second", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}})));
        cont.extend_from_slice(b"data: [DONE]\n\n");
        let out = t.pass(cont.freeze());
        let events = datas(&out);
        assert_eq!(events.len(), 3, "{events:?}");
        assert!(events.iter().all(|e| e["id"] == "first"), "{events:?}");
        assert_eq!(
            events[0]["choices"][0]["delta"],
            json!({"content": "three"})
        );
        assert_eq!(events[2]["usage"]["prompt_tokens"], 13);
        assert_eq!(events[2]["usage"]["completion_tokens"], 3);
        assert_eq!(events[2]["usage"]["total_tokens"], 16);
        assert!(out.ends_with(b"data: [DONE]\n\n"));
        assert_eq!(t.text(), "one two three", "held for another resume");
    }

    #[test]
    fn an_anthropic_continuation_goes_on_in_the_open_block() {
        let mut t = Transcript::new(Wire::Anthropic, 1024);
        for e in [
            aev(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 10, "output_tokens": 1}}}),
            ),
            aev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            aev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "one two "}}),
            ),
        ] {
            t.pass(e);
        }
        t.resume(
            "one two".len(),
            Usage {
                input_tokens: 10,
                output_tokens: 2,
            },
        );
        let mut cont = BytesMut::new();
        for e in [
            aev(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_2", "usage": {"input_tokens": 12, "output_tokens": 1}}}),
            ),
            aev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            aev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " three"}}),
            ),
            aev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            aev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}}),
            ),
            aev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ),
            aev(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
            ),
            aev("message_stop", json!({"type": "message_stop"})),
        ] {
            cont.extend_from_slice(&e);
        }
        let out = t.pass(cont.freeze());
        let kinds: Vec<_> = datas(&out)
            .iter()
            .map(|e| {
                format!(
                    "{}{}",
                    e["type"].as_str().unwrap(),
                    e.get("index").map(|i| format!(":{i}")).unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "content_block_delta:0",
                "content_block_stop:0",
                "content_block_start:1",
                "content_block_stop:1",
                "message_delta",
                "message_stop"
            ]
        );
        let events = datas(&out);
        assert_eq!(events[0]["delta"]["text"], "three");
        assert_eq!(
            events[4]["usage"],
            json!({"input_tokens": 22, "output_tokens": 6})
        );
        assert!(String::from_utf8_lossy(&out).starts_with("event: content_block_delta\n"));
    }

    #[test]
    fn a_block_the_break_left_open_that_is_not_text_is_closed_first() {
        let mut t = Transcript::new(Wire::Anthropic, 1024);
        t.pass(aev("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}})));
        t.resume(0, Usage::default());
        let out = t.pass(aev("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
        let events = datas(&out);
        assert_eq!(events[0], json!({"type": "content_block_stop", "index": 0}));
        assert_eq!(events[1]["index"], 1);
    }

    #[test]
    fn tool_calls_in_progress_and_text_past_the_bound_are_not_resumable() {
        let mut t = Transcript::new(Wire::OpenAi, 8);
        t.pass(ev(json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}]})));
        assert_eq!(t.resumable(), Err(Unresumable::ToolCallInProgress));
        let mut t = Transcript::new(Wire::Anthropic, 8);
        t.pass(aev("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use"}})));
        assert_eq!(t.resumable(), Err(Unresumable::ToolCallInProgress));
        t.pass(aev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ));
        assert_eq!(
            t.resumable(),
            Ok(()),
            "a completed tool call does not prevent it"
        );
        t.pass(aev("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "12345"}})));
        assert!(t.held() >= 5);
        t.pass(aev("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "6789"}})));
        assert_eq!(t.resumable(), Err(Unresumable::HeldBytesExceeded));
        assert_eq!(t.held(), 0, "released");
    }
}

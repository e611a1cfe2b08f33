//! ConverseStream events → form events, and what an event of a stream's opening
//! means for the commit.
//!
//! The upstream's binary event-stream frames reach this module as SSE events made by
//! `eventstream` (one per frame): `event: <:event-type>` and `data:
//! {"<:event-type>": <payload>}` (the union shape AWS's own JSON uses), or, for an
//! exception frame, an `event: error` that `sse::error_in` reads. Events:
//! `messageStart {role}`, `contentBlockStart {contentBlockIndex, start.toolUse
//! {toolUseId, name}}`, `contentBlockDelta {contentBlockIndex, delta: {text} |
//! {toolUse: {input}}}` (tool input streamed as JSON text fragments),
//! `contentBlockStop`, `messageStop {stopReason}`, `metadata {usage, metrics}`
//! (after the stop: it ends the answer).

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;

use super::super::dialect;
use super::super::form::{Event, Stop, UsageDelta};
use super::super::vocab::{JSON_TOOL, MAX_BLOCKS, fresh_id};
use super::shapes::stop_of;
use crate::wire::sse::{self, Opening};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EventIn<'a> {
    #[serde(default)]
    message_start: Option<serde::de::IgnoredAny>,
    #[serde(default, borrow)]
    content_block_start: Option<BlockStartIn<'a>>,
    #[serde(default, borrow)]
    content_block_delta: Option<BlockDeltaIn<'a>>,
    #[serde(default, borrow)]
    message_stop: Option<StopIn<'a>>,
    #[serde(default)]
    metadata: Option<MetadataIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockStartIn<'a> {
    #[serde(default)]
    content_block_index: u64,
    #[serde(default, borrow)]
    start: Option<StartIn<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartIn<'a> {
    #[serde(default, borrow)]
    tool_use: Option<ToolStartIn<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolStartIn<'a> {
    #[serde(default, borrow)]
    tool_use_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockDeltaIn<'a> {
    #[serde(default)]
    content_block_index: u64,
    #[serde(default, borrow)]
    delta: Option<DeltaIn<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeltaIn<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_use: Option<ToolDeltaIn<'a>>,
    #[serde(default, borrow)]
    reasoning_content: Option<ReasoningDeltaIn<'a>>,
}

/// A reasoning block's delta: its text, the signature over it, or (whole) the
/// reasoning the model encrypted.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReasoningDeltaIn<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    signature: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    redacted_content: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ToolDeltaIn<'a> {
    #[serde(default, borrow)]
    input: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StopIn<'a> {
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct MetadataIn {
    #[serde(default)]
    usage: Option<UsageIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageIn {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_write_input_tokens: Option<u64>,
}

/// Reads one ConverseStream.
#[derive(Default)]
pub(in super::super) struct StreamDecoder {
    started: bool,
    /// contentBlockIndex of each tool call → its number in the answer.
    tools: HashMap<u64, u32>,
    /// Tool calls begun so far (numbers them; the table above stops growing).
    begun: u32,
    /// contentBlockIndex of the gateway's JSON tool, whose input is the answer's
    /// text (`vocab::JSON_TOOL`).
    json_block: Option<u64>,
    stopped: bool,
    ended: bool,
}

impl StreamDecoder {
    /// One event's `data`.
    pub(in super::super) fn decode(&mut self, data: &[u8], emit: &mut dyn FnMut(Event<'_>)) {
        let Ok(ev) = serde_json::from_slice::<EventIn<'_>>(data) else {
            return; // not a Converse event: nothing to say
        };
        if !self.started {
            self.started = true;
            // Converse gives no id: the answer's is made up, once.
            emit(Event::Start {
                id: Some(&fresh_id()),
            });
        }
        let _ = ev.message_start;
        if let Some(start) = &ev.content_block_start
            && let Some(t) = start.start.as_ref().and_then(|s| s.tool_use.as_ref())
            && t.name.as_deref() == Some(JSON_TOOL)
        {
            self.json_block = Some(start.content_block_index);
        } else if let Some(start) = &ev.content_block_start
            && let Some(t) = start.start.as_ref().and_then(|s| s.tool_use.as_ref())
        {
            let tool = self.begun;
            self.begun = self.begun.saturating_add(1);
            // The table stays bounded: a block past MAX_BLOCKS gets no arguments.
            if self.tools.len() < MAX_BLOCKS {
                self.tools.insert(start.content_block_index, tool);
            }
            emit(Event::ToolStart {
                tool,
                id: t.tool_use_id.as_deref(),
                name: t.name.as_deref().unwrap_or(""),
            });
        }
        if let Some(d) = &ev.content_block_delta
            && let Some(delta) = &d.delta
        {
            if let Some(t) = delta.text.as_deref().filter(|t| !t.is_empty()) {
                emit(Event::Text(t));
            }
            let input = delta
                .tool_use
                .as_ref()
                .and_then(|t| t.input.as_deref())
                .filter(|j| !j.is_empty());
            if let Some(json) = input {
                if self.json_block == Some(d.content_block_index) {
                    emit(Event::Text(json));
                } else if let Some(&tool) = self.tools.get(&d.content_block_index) {
                    emit(Event::ToolArgs { tool, json });
                }
            }
            if let Some(r) = &delta.reasoning_content {
                if let Some(t) = r.text.as_deref().filter(|t| !t.is_empty()) {
                    emit(Event::Reasoning(t));
                }
                if let Some(s) = r.signature.as_deref().filter(|s| !s.is_empty()) {
                    emit(Event::ReasoningSignature(s));
                }
                if let Some(data) = r.redacted_content.as_deref() {
                    emit(Event::RedactedReasoning(data));
                }
            }
        }
        if let Some(stop) = &ev.message_stop
            && !self.stopped
        {
            self.stopped = true;
            let reason = stop_of(stop.stop_reason.as_deref().unwrap_or("end_turn"));
            // An answer given through the JSON tool alone ends its turn.
            let reason = match reason {
                Stop::ToolUse if self.json_block.is_some() && self.begun == 0 => Stop::EndTurn,
                other => other,
            };
            emit(Event::Stop(reason));
        }
        if let Some(u) = ev.metadata.as_ref().and_then(|m| m.usage.as_ref()) {
            emit(Event::Usage(UsageDelta {
                input: u.input_tokens,
                output: u.output_tokens,
                cache_read: u.cache_read_input_tokens,
                cache_write: u.cache_write_input_tokens,
            }));
            // The metadata event is the last one: usage is final.
            if self.stopped && !self.ended {
                self.ended = true;
                emit(Event::End);
            }
        }
    }
}

/// What one event of a ConverseStream's opening means for the commit
/// (docs/request-lifecycle.md#streams-the-commit-point): `messageStart`, a
/// `contentBlockStart` that is not a tool call, an empty delta, `contentBlockStop` and
/// `metadata` hold back; text, a tool call or the stop commit; an exception frame (an
/// `event: error`) is an error.
pub(crate) fn opening(event: &[u8]) -> Opening {
    let f = sse::fields(event);
    let Some(data) = f.data else {
        return Opening::Hold;
    };
    if let Some(e) = sse::error_in(&f) {
        return Opening::Error(e);
    }
    let Ok(ev) = serde_json::from_slice::<EventIn<'_>>(data) else {
        return Opening::Content; // not ours to judge
    };
    let tool_start = ev
        .content_block_start
        .as_ref()
        .and_then(|s| s.start.as_ref())
        .is_some_and(|s| s.tool_use.is_some());
    let delta = ev
        .content_block_delta
        .as_ref()
        .and_then(|d| d.delta.as_ref())
        .is_some_and(|d| {
            d.text.as_deref().is_some_and(|t| !t.is_empty())
                || d.reasoning_content.as_ref().is_some_and(|r| {
                    r.text.as_deref().is_some_and(|t| !t.is_empty()) || r.redacted_content.is_some()
                })
                || d.tool_use
                    .as_ref()
                    .and_then(|t| t.input.as_deref())
                    .is_some_and(|j| !j.is_empty())
        });
    if tool_start || delta || ev.message_stop.is_some() {
        Opening::Content
    } else {
        Opening::Hold
    }
}

impl dialect::StreamDecoder for StreamDecoder {
    fn decode(&mut self, data: &[u8], emit: &mut dyn FnMut(Event<'_>)) {
        StreamDecoder::decode(self, data, emit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&str]) -> Vec<String> {
        let mut d = StreamDecoder::default();
        let mut out = Vec::new();
        for c in chunks {
            d.decode(c.as_bytes(), &mut |e| {
                let s = format!("{e:?}");
                // The made-up id differs per run.
                out.push(if s.starts_with("Start") {
                    "Start".into()
                } else {
                    s
                });
            });
        }
        out
    }

    #[test]
    fn tool_calls_stream_their_input_in_fragments() {
        let out = events(&[
            r#"{"messageStart":{"role":"assistant"}}"#,
            r#"{"contentBlockDelta":{"contentBlockIndex":0,"delta":{"text":"Let me check."}}}"#,
            r#"{"contentBlockStop":{"contentBlockIndex":0}}"#,
            r#"{"contentBlockStart":{"contentBlockIndex":1,"start":{"toolUse":{"toolUseId":"tooluse_1","name":"get_weather"}}}}"#,
            r#"{"contentBlockDelta":{"contentBlockIndex":1,"delta":{"toolUse":{"input":"{\"city\":"}}}}"#,
            r#"{"contentBlockDelta":{"contentBlockIndex":1,"delta":{"toolUse":{"input":"\"Paris\"}"}}}}"#,
            r#"{"contentBlockStop":{"contentBlockIndex":1}}"#,
            r#"{"messageStop":{"stopReason":"tool_use"}}"#,
            r#"{"metadata":{"usage":{"inputTokens":10,"outputTokens":5,"totalTokens":15},"metrics":{"latencyMs":100}}}"#,
        ]);
        assert_eq!(
            out,
            [
                "Start",
                r#"Text("Let me check.")"#,
                r#"ToolStart { tool: 0, id: Some("tooluse_1"), name: "get_weather" }"#,
                r#"ToolArgs { tool: 0, json: "{\"city\":" }"#,
                r#"ToolArgs { tool: 0, json: "\"Paris\"}" }"#,
                "Stop(ToolUse)",
                "Usage(UsageDelta { input: Some(10), output: Some(5), cache_read: None, cache_write: None })",
                "End",
            ]
        );
    }

    #[test]
    fn a_provider_cannot_grow_the_tool_table_without_end() {
        // Each tool call at a new block index: the table stops at MAX_BLOCKS, the
        // numbering goes on, and a block past the bound gets no arguments.
        let mut d = StreamDecoder::default();
        let mut last = None;
        for i in 0..(MAX_BLOCKS as u64 + 10) {
            let start = format!(
                r#"{{"contentBlockStart":{{"contentBlockIndex":{i},"start":{{"toolUse":{{"toolUseId":"t{i}","name":"f"}}}}}}}}"#
            );
            d.decode(start.as_bytes(), &mut |e| {
                if let Event::ToolStart { tool, .. } = e {
                    last = Some(tool);
                }
            });
        }
        assert_eq!(d.tools.len(), MAX_BLOCKS);
        assert_eq!(last, Some(MAX_BLOCKS as u32 + 9));
        let mut args = 0;
        let past = format!(
            r#"{{"contentBlockDelta":{{"contentBlockIndex":{},"delta":{{"toolUse":{{"input":"{{}}"}}}}}}}}"#,
            MAX_BLOCKS + 5
        );
        d.decode(past.as_bytes(), &mut |e| {
            if matches!(e, Event::ToolArgs { .. }) {
                args += 1;
            }
        });
        assert_eq!(args, 0);
    }

    #[test]
    fn openings_hold_what_carries_no_content() {
        let ev = |name: &str, d: &str| format!("event: {name}\ndata: {{\"{name}\":{d}}}\n\n");
        for (name, d) in [
            ("messageStart", r#"{"role":"assistant"}"#),
            ("contentBlockStart", r#"{"contentBlockIndex":0,"start":{}}"#),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":0,"delta":{"text":""}}"#,
            ),
            ("contentBlockStop", r#"{"contentBlockIndex":0}"#),
        ] {
            assert_eq!(opening(ev(name, d).as_bytes()), Opening::Hold, "{name}");
        }
        assert_eq!(
            opening(
                ev(
                    "contentBlockDelta",
                    r#"{"contentBlockIndex":0,"delta":{"text":"Hi"}}"#
                )
                .as_bytes()
            ),
            Opening::Content
        );
        let Opening::Error(e) = opening(
            b"event: error\ndata: {\"error\":{\"type\":\"throttlingException\",\"code\":429,\"message\":\"slow down\"}}\n\n",
        ) else {
            panic!("an exception frame is an error")
        };
        assert_eq!(e.status, 429);
    }
}

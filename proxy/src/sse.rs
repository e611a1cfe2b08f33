//! Server-sent events on the stream path: cutting upstream bytes into whole events
//! (wherever the network split them), spotting an in-band error event, and the
//! error event the proxy writes when a committed stream fails.
//!
//! Events are emitted as soon as their terminating blank line arrives: the framer
//! holds at most one partial event, never the stream, and never more than its
//! event size limit plus the last chunk pushed (`--max-event-bytes`).

use std::borrow::Cow;

use bytes::{Buf, Bytes, BytesMut};
use serde::Deserialize;

use crate::surface::Wire;

/// The default `--max-event-bytes`: the largest SSE event relayed.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;

/// Accumulates upstream chunks and yields complete events (terminator included).
#[derive(Debug)]
pub struct Framer {
    buf: BytesMut,
    /// Bytes of `buf` already scanned without finding a boundary.
    scanned: usize,
    /// Largest event accepted, terminator included.
    max_event: usize,
}

impl Default for Framer {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

/// An event (or the bytes of one still without a boundary) is over the size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTooLarge;

impl Framer {
    pub fn new(max_event: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            scanned: 0,
            max_event,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes held: at most the limit plus the last chunk pushed, since every push is
    /// followed by `next_event` until it yields nothing or fails.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete event, if one has fully arrived. An event over the limit,
    /// or that many bytes without a boundary, is an error; the buffer is freed then
    /// (the stream cannot be resynchronised, so it ends).
    pub fn next_event(&mut self) -> Result<Option<Bytes>, EventTooLarge> {
        // Resume a little before the last scan end: a boundary may straddle chunks.
        let from = self.scanned.saturating_sub(3);
        match event_end(&self.buf, from) {
            Some(end) if end > self.max_event => Err(self.overflow()),
            Some(end) => {
                self.scanned = 0;
                Ok(Some(self.buf.split_to(end).freeze()))
            }
            None if self.buf.len() > self.max_event => Err(self.overflow()),
            None => {
                self.scanned = self.buf.len();
                Ok(None)
            }
        }
    }

    fn overflow(&mut self) -> EventTooLarge {
        self.buf = BytesMut::new();
        self.scanned = 0;
        EventTooLarge
    }

    /// Whatever is left once the upstream ended (an unterminated last event).
    pub fn take_rest(&mut self) -> Option<Bytes> {
        self.scanned = 0;
        if self.buf.has_remaining() {
            Some(self.buf.split().freeze())
        } else {
            None
        }
    }
}

/// End (exclusive) of the first event in `buf`: the index after the blank line that
/// closes it. Accepts `\n\n`, `\r\n\r\n` and mixed `\n\r\n` / `\r\n\n`.
fn event_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(nl) = memchr::memchr(b'\n', &buf[i..]) {
        let at = i + nl;
        match buf.get(at + 1) {
            Some(b'\n') => return Some(at + 2),
            Some(b'\r') if buf.get(at + 2) == Some(&b'\n') => return Some(at + 3),
            _ => {}
        }
        i = at + 1;
    }
    None
}

/// The events of a buffer of whole events (as [`Framer`] yields them), in order; an
/// unterminated tail comes last.
pub fn split_events(mut buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        if buf.is_empty() {
            return None;
        }
        let end = event_end(buf, 0).unwrap_or(buf.len());
        let (ev, rest) = buf.split_at(end);
        buf = rest;
        Some(ev)
    })
}

/// The fields of one event that matter to the proxy.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EventFields<'a> {
    pub event: Option<&'a [u8]>,
    /// First `data:` line (provider events are single-line JSON).
    pub data: Option<&'a [u8]>,
}

pub fn fields(event: &[u8]) -> EventFields<'_> {
    let mut out = EventFields::default();
    for line in event.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = field_value(line, b"event") {
            out.event = Some(v);
        } else if let Some(v) = field_value(line, b"data")
            && out.data.is_none()
        {
            out.data = Some(v);
        }
    }
    out
}

fn field_value<'a>(line: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let rest = line.strip_prefix(name)?.strip_prefix(b":")?;
    Some(rest.strip_prefix(b" ").unwrap_or(rest))
}

/// An in-band error reported by the provider as an SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError {
    /// The HTTP status this error would have had as a plain response, so it can be
    /// classified like one (Anthropic `overloaded_error` → 529, and so on).
    pub status: u16,
    /// The error payload, used for context-length detection and the attempt log.
    pub body: Bytes,
}

#[derive(Deserialize)]
struct ErrorEnvelope<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    error: Option<ErrorDetail<'a>>,
}

#[derive(Deserialize)]
struct ErrorDetail<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    code: Option<serde_json::Value>,
}

/// Is this event an error event? Anthropic: `event: error` / `"type":"error"`;
/// OpenAI-style: a `data:` object with a top-level `error`.
pub fn error_event(event: &[u8]) -> Option<StreamError> {
    error_in(&fields(event))
}

/// [`error_event`] for an event whose fields are already split out.
pub fn error_in(f: &EventFields<'_>) -> Option<StreamError> {
    let named_error = f.event == Some(b"error".as_slice());
    let data = f.data?;
    if !named_error && memchr::memmem::find(data, b"\"error\"").is_none() {
        return None; // cheap exit for ordinary chunks
    }
    let env: ErrorEnvelope<'_> = serde_json::from_slice(data).ok()?;
    let detail = env.error?;
    if !named_error && env.kind.as_deref().is_some_and(|k| k != "error") {
        return None;
    }
    let status = status_for(detail.kind.as_deref(), detail.code.as_ref());
    Some(StreamError {
        status,
        body: Bytes::copy_from_slice(data),
    })
}

fn status_for(kind: Option<&str>, code: Option<&serde_json::Value>) -> u16 {
    let code_str = code.and_then(|c| c.as_str());
    if let Some(n) = code
        .and_then(|c| c.as_u64())
        .filter(|n| (400..600).contains(n))
    {
        return n as u16;
    }
    match kind.or(code_str) {
        Some("overloaded_error") => 529,
        Some("rate_limit_error" | "rate_limit_exceeded" | "rate_limited") => 429,
        Some("authentication_error" | "invalid_api_key") => 401,
        Some("permission_error") => 403,
        Some("not_found_error") => 404,
        Some("request_too_large") => 413,
        Some("timeout_error") => 504,
        Some("invalid_request_error" | "context_length_exceeded") => 400,
        _ => 500,
    }
}

/// What an event of a stream's opening means for the commit (SPEC §3).
#[derive(Debug, PartialEq, Eq)]
pub enum Opening {
    /// Carries no content: held back until one that does (comments, an OpenAI
    /// role-only chunk, Anthropic `message_start`, `ping`, an empty text
    /// `content_block_start`).
    Hold,
    /// Content (or anything not known to be empty): commits the stream.
    Content,
    /// `data: [DONE]`: the stream ends.
    Done,
    /// An in-band error.
    Error(StreamError),
}

/// The parts of an opening event's JSON that tell content from none. Fields not
/// listed are skipped unparsed.
#[derive(Deserialize)]
struct OpeningData<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    content_block: Option<Block<'a>>,
    #[serde(default)]
    choices: Option<Vec<Choice<'a>>>,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
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
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    function_call: Option<serde::de::IgnoredAny>,
}

/// Classify one event of a stream that is not committed yet. Only the opening
/// events are looked at this closely: after commit, events are just forwarded.
pub fn opening(event: &[u8]) -> Opening {
    let f = fields(event);
    let Some(data) = f.data else {
        // Comments, blank keep-alives, an `event:` line alone: nothing to show.
        return Opening::Hold;
    };
    if let Some(e) = error_in(&f) {
        return Opening::Error(e);
    }
    if data.trim_ascii() == b"[DONE]" {
        return Opening::Done;
    }
    let Ok(d) = serde_json::from_slice::<OpeningData<'_>>(data) else {
        return Opening::Content; // not ours to judge
    };
    let empty = |s: &Option<Cow<'_, str>>| s.as_deref().is_none_or(str::is_empty);
    let anthropic = f
        .event
        .map(|e| std::str::from_utf8(e).unwrap_or(""))
        .or(d.kind.as_deref());
    match anthropic {
        Some("message_start" | "ping") => return Opening::Hold,
        Some("content_block_start") => {
            return match &d.content_block {
                Some(b) if b.kind.as_deref() == Some("text") && empty(&b.text) => Opening::Hold,
                _ => Opening::Content,
            };
        }
        _ => {}
    }
    match &d.choices {
        // A chunk without choices (Azure's prompt filter results) or whose choices
        // only say the role.
        Some(choices)
            if choices.iter().all(|c| {
                c.finish_reason.is_none()
                    && c.delta.as_ref().is_none_or(|d| {
                        empty(&d.content)
                            && empty(&d.refusal)
                            && d.tool_calls.is_none()
                            && d.function_call.is_none()
                    })
            }) =>
        {
            Opening::Hold
        }
        _ => Opening::Content,
    }
}

/// The event that ends a committed stream which failed, in the client's wire format.
pub fn failure_event(wire: Wire, message: &str) -> Bytes {
    match wire {
        Wire::OpenAi => {
            let body = serde_json::json!({"error": {
                "message": message, "type": "server_error", "code": "stream_interrupted"}});
            Bytes::from(format!("data: {body}\n\n"))
        }
        Wire::Anthropic => {
            let body = serde_json::json!({"type": "error", "error": {
                "type": "api_error", "message": message}});
            Bytes::from(format!("event: error\ndata: {body}\n\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_events(chunks: &[&[u8]]) -> Vec<Bytes> {
        let mut f = Framer::default();
        let mut out = Vec::new();
        for c in chunks {
            f.push(c);
            while let Some(e) = f.next_event().unwrap() {
                out.push(e);
            }
        }
        out.extend(f.take_rest());
        out
    }

    #[test]
    fn frames_events_split_at_every_byte() {
        let stream =
            b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\nevent: ping\ndata: {}\n\ndata: [DONE]\n\n";
        let whole = all_events(&[stream]);
        assert_eq!(whole.len(), 4);
        assert_eq!(&whole[1][..], b"data: {\"b\":2}\r\n\r\n");
        for cut in 1..stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(all_events(&[a, b]), whole, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(all_events(&bytes), whole);
    }

    #[test]
    fn keeps_an_unterminated_tail() {
        assert_eq!(
            all_events(&[b"data: 1\n\ndata: 2"]),
            vec![
                Bytes::from_static(b"data: 1\n\n"),
                Bytes::from_static(b"data: 2")
            ]
        );
    }

    #[test]
    fn spots_anthropic_and_openai_error_events() {
        let e = error_event(
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        )
        .unwrap();
        assert_eq!(e.status, 529);
        let e = error_event(
            b"data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":null}}\n\n",
        )
        .unwrap();
        assert_eq!(e.status, 500);
        let e = error_event(
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"slow\"}}\n\n",
        )
        .unwrap();
        assert_eq!(e.status, 429);
    }

    #[test]
    fn ordinary_events_are_not_errors() {
        assert!(
            error_event(b"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"error\\\"\"}}]}\n\n")
                .is_none()
        );
        assert!(
            error_event(
                b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n"
            )
            .is_none()
        );
        assert!(error_event(b"data: [DONE]\n\n").is_none());
        assert!(error_event(b": keep-alive\n\n").is_none());
    }

    #[test]
    fn failure_events_parse_as_errors_in_both_wires() {
        for wire in [Wire::OpenAi, Wire::Anthropic] {
            let ev = failure_event(wire, "upstream broke");
            assert!(error_event(&ev).is_some(), "{wire:?}");
        }
    }
}

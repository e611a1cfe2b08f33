//! Server-sent events on the stream path: cutting upstream bytes into whole events
//! (wherever the network split them), telling an opening event without content
//! from one that commits (OpenAI chat chunks and Anthropic events by their shape,
//! the Responses API's typed events by their type), spotting an in-band error
//! event, and the error event the proxy writes when a committed stream fails.
//!
//! Events are emitted as soon as their terminating blank line arrives: the framer
//! holds at most one partial event, never the stream, and never more than its
//! event size limit plus the last chunk pushed (`--max-event-bytes`).

use std::borrow::Cow;
use std::sync::LazyLock;

use bytes::Bytes;
use serde::Deserialize;

use crate::wire::json::{member_end, skip_ws, string_end};
use crate::wire::surface::{Surface, Wire};

/// The default `--max-event-bytes`: the largest SSE event relayed.
pub(crate) const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;

/// Accumulates upstream chunks and yields complete events (terminator included).
///
/// A plain buffer with a read offset: a committed stream's events are read in place
/// ([`Framer::next_in_place`]) and the consumed prefix is dropped at the next push
/// (moving only the partial event left over). Splitting each event off a `BytesMut`
/// instead cost ~300 instructions per event (the shared buffer's bookkeeping, then a
/// copy when the next chunk needed room), more than the proxy's checks of it.
#[derive(Debug)]
pub struct Framer {
    buf: Vec<u8>,
    /// Bytes at the front of `buf` already yielded.
    start: usize,
    /// Bytes after `start` already scanned without finding a boundary.
    scanned: usize,
    /// Largest event accepted, terminator included.
    max_event: usize,
    /// An upstream that does not frame its stream as SSE (a binary framing): its
    /// frames become SSE events before they are framed here.
    reframer: Option<Box<dyn Reframe>>,
    /// A binary frame was over the limit: the stream ends.
    overflowed: bool,
}

impl Default for Framer {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

/// An event (or the bytes of one still without a boundary) is over the size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTooLarge;

/// Turns a stream framed otherwise (a provider's binary framing) into SSE events,
/// so the rest of the stream path (opening, commit, translation, the size limit)
/// reads it like any other upstream.
pub trait Reframe: Send + std::fmt::Debug {
    /// Feeds `chunk`, appending one whole SSE event per complete frame to `out`. A
    /// frame over `max_event` is refused from its declared length.
    fn push(
        &mut self,
        chunk: &[u8],
        max_event: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), EventTooLarge>;

    /// Bytes held of a frame not yet complete.
    fn buffered(&self) -> usize;
}

impl Framer {
    pub fn new(max_event: usize) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            max_event,
            reframer: None,
            overflowed: false,
        }
    }

    /// A framer for a stream `reframer` turns into SSE events, one per frame, under
    /// the same limit.
    pub(crate) fn reframed(max_event: usize, reframer: Box<dyn Reframe>) -> Self {
        Self {
            reframer: Some(reframer),
            ..Self::new(max_event)
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        if self.start > 0 {
            // Whole events already yielded: keep only the partial one after them.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        match &mut self.reframer {
            None => self.buf.extend_from_slice(chunk),
            Some(r) => {
                if r.push(chunk, self.max_event, &mut self.buf).is_err() {
                    self.overflowed = true;
                }
            }
        }
    }

    /// Bytes held: at most the limit plus the last chunk pushed, since every push is
    /// followed by `next_event` until it yields nothing or fails.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start + self.reframer.as_ref().map_or(0, |r| r.buffered())
    }

    /// The next complete event, if one has fully arrived, read in place. An event
    /// over the limit, or that many bytes without a boundary, is an error; the buffer
    /// is freed then (the stream cannot be resynchronised, so it ends).
    pub fn next_in_place(&mut self) -> Result<Option<&[u8]>, EventTooLarge> {
        if self.overflowed {
            return Err(self.overflow());
        }
        let rest = &self.buf[self.start..];
        // Resume a little before the last scan end: a boundary may straddle chunks.
        let from = self.scanned.saturating_sub(3);
        match event_end(rest, from) {
            Some(end) if end > self.max_event => Err(self.overflow()),
            Some(end) => {
                let at = self.start;
                self.start += end;
                self.scanned = 0;
                Ok(Some(&self.buf[at..at + end]))
            }
            None if rest.len() > self.max_event => Err(self.overflow()),
            None => {
                self.scanned = rest.len();
                Ok(None)
            }
        }
    }

    /// [`Framer::next_in_place`], the event copied out.
    pub fn next_event(&mut self) -> Result<Option<Bytes>, EventTooLarge> {
        Ok(self.next_in_place()?.map(Bytes::copy_from_slice))
    }

    fn overflow(&mut self) -> EventTooLarge {
        self.buf = Vec::new();
        self.start = 0;
        self.scanned = 0;
        EventTooLarge
    }

    /// Whatever is left once the upstream ended (an unterminated last event).
    pub fn take_rest(&mut self) -> Option<Bytes> {
        let rest =
            (self.start < self.buf.len()).then(|| Bytes::copy_from_slice(&self.buf[self.start..]));
        self.buf.clear();
        self.start = 0;
        self.scanned = 0;
        rest
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
pub(crate) fn split_events(mut buf: &[u8]) -> impl Iterator<Item = &[u8]> {
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
    // Lines found with memchr: a byte-at-a-time split cost ~1.3k instructions per
    // chat chunk, and every event of a stream's opening is looked at.
    let mut rest = event;
    while !rest.is_empty() {
        let (line, next) = match memchr::memchr(b'\n', rest) {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        rest = next;
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

/// Looked for in every opening event: built once (`memmem::find` builds its
/// searcher on each call, ~550 instructions).
static ERROR_KEY: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"\"error\""));

/// Is this event an error event? Anthropic: `event: error` / `"type":"error"`;
/// OpenAI-style: a `data:` object with a top-level `error`.
pub fn error_event(event: &[u8]) -> Option<StreamError> {
    error_in(&fields(event))
}

/// [`error_event`] for an event whose fields are already split out.
pub(crate) fn error_in(f: &EventFields<'_>) -> Option<StreamError> {
    let named_error = f.event == Some(b"error".as_slice());
    let data = f.data?;
    if !named_error && ERROR_KEY.find(data).is_none() {
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
        Some("invalid_request_error" | "context_length_exceeded" | "invalid_prompt") => 400,
        _ => 500,
    }
}

/// What an event of a stream's opening means for the commit
/// (docs/request-lifecycle.md#streams-the-commit-point).
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
    first_look(f.event, data).unwrap_or_else(|| parsed_opening(f.event, data))
}

/// [`opening`] for the data of an event that is neither an error nor `[DONE]`, by
/// the full parse: the reference [`first_look`] must agree with.
fn parsed_opening(event: Option<&[u8]>, data: &[u8]) -> Opening {
    let Ok(d) = serde_json::from_slice::<OpeningData<'_>>(data) else {
        return Opening::Content; // not ours to judge
    };
    let empty = |s: &Option<Cow<'_, str>>| s.as_deref().is_none_or(str::is_empty);
    let anthropic = event
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

/// [`opening`]'s verdict on a chunk of the common shapes, read without building
/// anything: an OpenAI chunk (no `event:` line), or an Anthropic event other than
/// the three whose name can hold it back (`message_start`, `ping`,
/// `content_block_start`). `None` when unsure: then the full parse decides.
///
/// Why: the full parse (serde into [`OpeningData`]) cost ~5k instructions per event
/// and every stream's opening goes through it at least twice (OpenAI's role chunk,
/// then the first content chunk). This walk reads the same members with the answer
/// check's scanner (`json`).
///
/// Why it agrees with the full parse: that one says `Hold` only when the data parses
/// and every choice is empty, and `Content` otherwise (content found, no `choices`,
/// or a parse that fails). So a `Content` here needs only the members read right:
/// keys compared raw, and any key spelled with an escape or beyond ASCII (which
/// serde would decode) makes it unsure. A `Hold` needs the parse to succeed too:
/// the members skipped are scanned as serde's `IgnoredAny` would (`json::value_end`),
/// the fields the parse reads are `null` or `""` (nothing to decode), and a field
/// twice, an array where a struct is expected, or anything else unexpected makes it
/// unsure.
fn first_look(event: Option<&[u8]>, data: &[u8]) -> Option<Opening> {
    // With an `event:` line, the name says which API, and `type` is not read.
    let type_decides = match event {
        None => true,
        Some(b"message_start" | b"ping" | b"content_block_start") => return None,
        Some(_) => false,
    };
    let (mut choices, mut kind) = (None, false);
    let end = object_members(data, skip_ws(data, 0), |key, data, at| match key {
        b"choices" if choices.is_none() => {
            let (has, end) = choices_content(data, at)?;
            choices = Some(has);
            Some(end)
        }
        b"type" if !type_decides && !kind => {
            kind = true;
            plain_string_end(data, at)
        }
        // Twice (a parse error), or what only the full parse reads.
        b"choices" | b"type" | b"content_block" => None,
        _ => member_end(data, at).ok(),
    })?;
    if skip_ws(data, end) != data.len() {
        return None;
    }
    Some(match choices {
        // `[]` or choices that are all empty.
        Some(Some(false)) => Opening::Hold,
        // `null`, no `choices`, or content in one of them.
        _ => Opening::Content,
    })
}

/// `choices` at `data[at]`: `Some(has_content)` for an array, `None` for `null`, and
/// where it ends.
fn choices_content(data: &[u8], at: usize) -> Option<(Option<bool>, usize)> {
    if let Some(end) = null_end(data, at) {
        return Some((None, end));
    }
    if data.get(at) != Some(&b'[') {
        return None;
    }
    let mut has = false;
    let mut i = skip_ws(data, at + 1);
    if data.get(i) == Some(&b']') {
        return Some((Some(false), i + 1));
    }
    loop {
        let (content, end) = choice_content(data, i)?;
        has |= content;
        i = skip_ws(data, end);
        match data.get(i) {
            Some(b',') => i = skip_ws(data, i + 1),
            Some(b']') => return Some((Some(has), i + 1)),
            _ => return None,
        }
    }
}

/// One choice: does it carry anything (a `finish_reason`, or a delta with content)?
fn choice_content(data: &[u8], at: usize) -> Option<(bool, usize)> {
    let (mut delta, mut finish) = (None, None);
    let end = object_members(data, at, |key, data, at| match key {
        b"delta" if delta.is_none() => {
            let (has, end) = delta_content(data, at)?;
            delta = Some(has);
            Some(end)
        }
        b"finish_reason" if finish.is_none() => {
            let end = null_end(data, at);
            finish = Some(end.is_none());
            end.or_else(|| member_end(data, at).ok())
        }
        b"delta" | b"finish_reason" => None,
        _ => member_end(data, at).ok(),
    })?;
    Some((delta == Some(true) || finish == Some(true), end))
}

/// A delta: `null`, or an object whose `content` / `refusal` are `null` or `""`
/// and whose `tool_calls` / `function_call` are `null` or absent, has no content.
fn delta_content(data: &[u8], at: usize) -> Option<(bool, usize)> {
    if let Some(end) = null_end(data, at) {
        return Some((false, end));
    }
    let mut seen = [false; 4];
    let mut has = false;
    let end = object_members(data, at, |key, data, at| {
        let (slot, empty_string_ok) = match key {
            b"content" => (0, true),
            b"refusal" => (1, true),
            b"tool_calls" => (2, false),
            b"function_call" => (3, false),
            _ => return member_end(data, at).ok(),
        };
        if std::mem::replace(&mut seen[slot], true) {
            return None;
        }
        if let Some(end) = null_end(data, at) {
            return Some(end);
        }
        if empty_string_ok && data.get(at..at + 2) == Some(&b"\"\""[..]) {
            return Some(at + 2);
        }
        has = true;
        member_end(data, at).ok()
    })?;
    Some((has, end))
}

/// Walks the object at `data[at]`: `member` is given each key (raw, as written) and
/// where its value starts, and says where that value ends (`None`: unsure, stop).
/// Returns where the object ends.
fn object_members(
    data: &[u8],
    at: usize,
    mut member: impl FnMut(&[u8], &[u8], usize) -> Option<usize>,
) -> Option<usize> {
    if data.get(at) != Some(&b'{') {
        return None;
    }
    let mut i = skip_ws(data, at + 1);
    if data.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if data.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(data, i + 1).ok()?;
        let key = &data[i + 1..key_end - 1];
        // Serde decodes escapes and checks UTF-8 in keys: only plain ones are compared.
        if key.iter().any(|&b| b == b'\\' || !b.is_ascii()) {
            return None;
        }
        i = skip_ws(data, key_end);
        if data.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(data, member(key, data, skip_ws(data, i + 1))?);
        match data.get(i) {
            Some(b',') => i = skip_ws(data, i + 1),
            Some(b'}') => return Some(i + 1),
            _ => return None,
        }
    }
}

fn null_end(data: &[u8], at: usize) -> Option<usize> {
    (data.get(at..at + 4) == Some(&b"null"[..])).then_some(at + 4)
}

/// A string with nothing for serde to decode or check (ASCII, no escapes).
fn plain_string_end(data: &[u8], at: usize) -> Option<usize> {
    if data.get(at) != Some(&b'"') {
        return None;
    }
    let end = string_end(data, at + 1).ok()?;
    data[at + 1..end - 1]
        .iter()
        .all(|&b| b != b'\\' && b.is_ascii())
        .then_some(end)
}

/// [`opening`] for a stream of `surface`: the Responses API's events are read by
/// [`responses_opening`], every other stream (OpenAI chat chunks, Anthropic events)
/// by [`opening`].
pub(crate) fn opening_for(surface: Surface, event: &[u8]) -> Opening {
    match surface {
        Surface::Responses => responses_opening(event),
        _ => opening(event),
    }
}

/// [`error_event`] for a stream of `surface` (after commit: does this event say the
/// stream failed?).
pub(crate) fn error_event_for(surface: Surface, event: &[u8]) -> Option<StreamError> {
    match surface {
        Surface::Responses => responses_error(&fields(event)),
        _ => error_event(event),
    }
}

/// The parts of a Responses API event that say whether it carries content or an
/// error. Fields not listed are skipped unparsed.
#[derive(Deserialize)]
struct ResponsesEvent<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    /// The text, arguments or refusal of a `*.delta` event.
    #[serde(default, borrow)]
    delta: Option<Cow<'a, str>>,
    /// `response.output_item.done`: the finished item.
    #[serde(default)]
    item: Option<serde::de::IgnoredAny>,
    /// `response.created`, `.in_progress`, `.completed`, `.incomplete`, `.failed`.
    #[serde(default, borrow)]
    response: Option<ResponseObject<'a>>,
    /// `error` as OpenAI sends it: `{"type":"error","error":{"code","message",...}}`.
    #[serde(default, borrow)]
    error: Option<ErrorDetail<'a>>,
    /// `error` as OpenAI documents it: `code` and `message` at the top level.
    #[serde(default)]
    code: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ResponseObject<'a> {
    #[serde(default)]
    output: Option<Vec<serde::de::IgnoredAny>>,
    #[serde(default, borrow)]
    error: Option<ErrorDetail<'a>>,
}

/// Events of a Responses API stream that only announce what is coming: held back
/// until the first that carries output (the commit rule of
/// docs/request-lifecycle.md#streams-the-commit-point on this API's events).
const RESPONSES_ANNOUNCEMENTS: [&str; 6] = [
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.reasoning_summary_part.added",
];

/// Classify one opening event of an OpenAI Responses API stream. Held back: SSE
/// comments, the lifecycle and announcement events ([`RESPONSES_ANNOUNCEMENTS`]),
/// a `*.delta` with an empty delta, a `response.completed` / `.incomplete` with no
/// output. An `error` event or `response.failed` is an in-band error, classified by
/// its `code` like a status (`rate_limit_exceeded` as 429, `server_error` as 500,
/// ...). Anything else commits: a text, refusal or function-call arguments delta,
/// a finished output item, a completed response with output, and any event type this
/// proxy does not know (not ours to judge).
pub(crate) fn responses_opening(event: &[u8]) -> Opening {
    let f = fields(event);
    let Some(data) = f.data else {
        return Opening::Hold;
    };
    if data.trim_ascii() == b"[DONE]" {
        return Opening::Done;
    }
    let Ok(d) = serde_json::from_slice::<ResponsesEvent<'_>>(data) else {
        return Opening::Content;
    };
    let event_name = f.event.and_then(|e| std::str::from_utf8(e).ok());
    let kind = d.kind.as_deref().or(event_name).unwrap_or("");
    if let Some(e) = responses_error_in(kind, &d, data) {
        return Opening::Error(e);
    }
    let empty = |s: &Option<Cow<'_, str>>| s.as_deref().is_none_or(str::is_empty);
    match kind {
        k if RESPONSES_ANNOUNCEMENTS.contains(&k) => Opening::Hold,
        k if k.ends_with(".delta") && empty(&d.delta) => Opening::Hold,
        "response.completed" | "response.incomplete" => {
            let output = d.response.as_ref().and_then(|r| r.output.as_ref());
            if output.is_some_and(|o| !o.is_empty()) {
                Opening::Content
            } else {
                Opening::Hold
            }
        }
        "response.output_item.done" if d.item.is_none() => Opening::Hold,
        _ => Opening::Content,
    }
}

/// Is this Responses API event an in-band error (`error`, `response.failed`)? Only
/// events named so (or, without an `event:` line, mentioning an error at all) are
/// parsed.
fn responses_error(f: &EventFields<'_>) -> Option<StreamError> {
    let data = f.data?;
    match f.event {
        Some(b"error" | b"response.failed") => {}
        Some(_) => return None,
        None if ERROR_KEY.find(data).is_none() => return None,
        None => {}
    }
    let d: ResponsesEvent<'_> = serde_json::from_slice(data).ok()?;
    let event_name = f.event.and_then(|e| std::str::from_utf8(e).ok());
    responses_error_in(d.kind.as_deref().or(event_name)?, &d, data)
}

fn responses_error_in(kind: &str, d: &ResponsesEvent<'_>, data: &[u8]) -> Option<StreamError> {
    let status = match kind {
        "error" => match &d.error {
            Some(e) => status_for(e.kind.as_deref(), e.code.as_ref()),
            None => status_for(None, d.code.as_ref()),
        },
        "response.failed" => {
            let e = d.response.as_ref().and_then(|r| r.error.as_ref());
            status_for(
                e.and_then(|e| e.kind.as_deref()),
                e.and_then(|e| e.code.as_ref()),
            )
        }
        _ => return None,
    };
    Some(StreamError {
        status,
        body: Bytes::copy_from_slice(data),
    })
}

/// [`failure_event`] for a stream of `surface`: a Responses API client gets the
/// API's own `error` event (`event: error`, `"type":"error"`, the error object
/// inside, as OpenAI sends it and its SDKs raise it).
pub(crate) fn failure_event_for(surface: Surface, message: &str) -> Bytes {
    match surface {
        Surface::Responses => {
            let body = serde_json::json!({"type": "error", "error": {
                "type": "server_error", "code": "stream_interrupted",
                "message": message, "param": null}});
            Bytes::from(format!("event: error\ndata: {body}\n\n"))
        }
        s => failure_event(s.wire(), message),
    }
}

/// The event that ends a committed stream which failed, in the client's wire format.
pub(crate) fn failure_event(wire: Wire, message: &str) -> Bytes {
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

    /// `first_look` when it decides, else nothing; checked against the full parse.
    fn looked(event: Option<&[u8]>, data: &[u8]) -> Option<Opening> {
        let quick = first_look(event, data);
        if let Some(v) = &quick {
            assert_eq!(
                *v,
                parsed_opening(event, data),
                "{:?} {:?}",
                event.map(String::from_utf8_lossy),
                String::from_utf8_lossy(data)
            );
        }
        quick
    }

    #[test]
    fn the_first_look_decides_the_common_chunks_without_the_full_parse() {
        let chunk = |delta: &str, finish: &str| {
            format!(
                r#"{{"choices":[{{"delta":{delta},"finish_reason":{finish},"index":0,"logprobs":null}}],"created":1700000000,"id":"chatcmpl-1","model":"m","object":"chat.completion.chunk"}}"#
            )
        };
        let hold = [
            chunk(r#"{"content":"","role":"assistant"}"#, "null"),
            chunk(r#"{"role":"assistant","refusal":null}"#, "null"),
            chunk("null", "null"),
            chunk("{}", "null"),
            r#"{"id":"x","object":"chat.completion.chunk","choices":[],"prompt_filter_results":[{"prompt_index":0}]}"#.into(),
            r#" { "choices" : [ { "delta" : { "content" : null , "tool_calls" : null } } ] } "#.into(),
        ];
        for data in &hold {
            assert_eq!(looked(None, data.as_bytes()), Some(Opening::Hold), "{data}");
        }
        let content = [
            chunk(r#"{"content":"Hi"}"#, "null"),
            chunk(r#"{"content":"\n\"quoted\" \u00e9"}"#, "null"),
            chunk(r#"{"refusal":"no"}"#, "null"),
            chunk(
                r#"{"tool_calls":[{"index":0,"function":{"arguments":""}}]}"#,
                "null",
            ),
            chunk(r#"{"function_call":{"name":"f"}}"#, "null"),
            chunk("{}", r#""stop""#),
            r#"{"id":"x","choices":null}"#.into(),
            r#"{"id":"x","usage":{"prompt_tokens":1}}"#.into(),
        ];
        for data in &content {
            assert_eq!(
                looked(None, data.as_bytes()),
                Some(Opening::Content),
                "{data}"
            );
        }
        let delta = br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#;
        assert_eq!(
            looked(Some(&b"content_block_delta"[..]), delta),
            Some(Opening::Content)
        );
        // What only the full parse can say.
        for (event, data) in [
            (
                Some(&b"message_start"[..]),
                &br#"{"type":"message_start","message":{}}"#[..],
            ),
            (Some(&b"ping"[..]), &br#"{"type":"ping"}"#[..]),
            (None, &br#"{"type":"ping","choices":[]}"#[..]),
            (None, &br#"{"choices":[],"choices":[]}"#[..]),
            (None, &br#"{"ch\u006fices":[]}"#[..]),
            (None, &br#"{"choices":[["x"]]}"#[..]),
            (
                None,
                &br#"{"choices":[{"delta":{"content":"","content":""}}]}"#[..],
            ),
            (None, &br#"{"choices":[]} x"#[..]),
            (None, &br#"{"choices":["#[..]),
        ] {
            assert_eq!(
                first_look(event, data),
                None,
                "{:?}",
                String::from_utf8_lossy(data)
            );
        }
    }

    #[test]
    fn the_first_look_agrees_with_the_full_parse_on_every_fixture_event() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate");
        let mut decided = 0;
        for side in ["chat-client", "messages-client"] {
            for entry in std::fs::read_dir(dir.join(side)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|e| e != "sse") {
                    continue;
                }
                let text = std::fs::read(&path).unwrap();
                for ev in split_events(&text) {
                    let f = fields(ev);
                    if let Some(data) = f.data
                        && error_in(&f).is_none()
                        && data.trim_ascii() != b"[DONE]"
                        && looked(f.event, data).is_some()
                    {
                        decided += 1;
                    }
                }
            }
        }
        assert!(
            decided > 50,
            "{decided} events decided without the full parse"
        );
    }

    mod first_look_properties {
        use super::*;
        use proptest::prelude::*;

        /// A JSON value that a chunk's member might hold, as text.
        fn member_value() -> impl Strategy<Value = String> {
            prop::sample::select(vec![
                "null",
                "\"\"",
                "\"x\"",
                "\"\\u0041\"",
                "\"\\n\"",
                "0",
                "true",
                "[]",
                "{}",
                "[1]",
                "{\"a\":null}",
                "\"stop\"",
                "\"\u{e9}\"",
            ])
            .prop_map(str::to_owned)
        }

        /// Mostly what an empty field holds.
        fn empty_mostly() -> impl Strategy<Value = String> {
            prop_oneof![
                4 => prop::sample::select(vec!["null", "\"\""]).prop_map(str::to_owned),
                1 => member_value(),
            ]
        }

        /// An object of `(key, value)` members, in the order given (keys may repeat).
        fn object(
            member: impl Strategy<Value = (String, String)>,
            max: usize,
        ) -> impl Strategy<Value = String> {
            proptest::collection::vec(member, 0..max).prop_map(|ms| {
                let body: Vec<String> = ms.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", body.join(","))
            })
        }

        fn keyed(
            keys: &'static [&'static str],
            value: impl Strategy<Value = String>,
        ) -> impl Strategy<Value = (String, String)> {
            (prop::sample::select(keys), value).prop_map(|(k, v)| (k.to_owned(), v))
        }

        fn delta() -> impl Strategy<Value = String> {
            object(
                prop_oneof![
                    4 => keyed(&["content", "refusal", "tool_calls", "function_call"], empty_mostly()),
                    1 => keyed(&["role", "c\\u006fntent", "n\u{e9}"], member_value()),
                ],
                4,
            )
        }

        fn choice() -> impl Strategy<Value = String> {
            object(
                prop_oneof![
                    4 => delta().prop_map(|v| ("delta".to_owned(), v)),
                    2 => keyed(&["finish_reason"], empty_mostly()),
                    1 => keyed(&["delta", "index", "logprobs"], member_value()),
                ],
                4,
            )
        }

        /// Chunks in the shapes both APIs send, members in any order, some twice.
        fn chunk() -> impl Strategy<Value = String> {
            let choices = proptest::collection::vec(choice(), 0..3)
                .prop_map(|cs| format!("[{}]", cs.join(",")));
            object(
                prop_oneof![
                    4 => choices.prop_map(|v| ("choices".to_owned(), v)),
                    2 => keyed(&["id", "model", "object", "usage"], member_value()),
                    1 => keyed(&["type"], prop::sample::select(vec!["\"ping\"", "\"content_block_delta\"", "1"]).prop_map(str::to_owned)),
                    1 => keyed(&["content_block", "choices"], member_value()),
                ],
                4,
            )
        }

        fn event_name() -> impl Strategy<Value = Option<&'static [u8]>> {
            prop::option::of(prop::sample::select(vec![
                &b"content_block_delta"[..],
                &b"message_delta"[..],
                &b"message_start"[..],
                &b"ping"[..],
                &b"content_block_start"[..],
            ]))
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn agrees_with_the_full_parse(
                data in chunk(),
                event in event_name(),
                edits in proptest::collection::vec(
                    (any::<prop::sample::Index>(), 0u8..3, prop::sample::select(b"{}[]\",:\\ 0n\"x".to_vec())),
                    0..3,
                ),
            ) {
                let mut data = data.into_bytes();
                looked(event, &data);
                for (at, edit, byte) in edits {
                    let i = at.index(data.len() + 1);
                    match edit {
                        0 if i < data.len() => { data.remove(i); }
                        1 if i < data.len() => data[i] = byte,
                        _ => data.insert(i, byte),
                    }
                    looked(event, &data);
                }
            }
        }
    }

    #[test]
    fn failure_events_parse_as_errors_in_both_wires() {
        for wire in [Wire::OpenAi, Wire::Anthropic] {
            let ev = failure_event(wire, "upstream broke");
            assert!(error_event(&ev).is_some(), "{wire:?}");
        }
    }

    fn responses_event(kind: &str, data: &str) -> Vec<u8> {
        format!("event: {kind}\ndata: {{\"type\":\"{kind}\",\"sequence_number\":0,{data}}}\n\n")
            .into_bytes()
    }

    /// docs/responses-api.md#the-responses-api with the commit rule of
    /// docs/request-lifecycle.md#streams-the-commit-point on the Responses API's events:
    /// lifecycle and announcement events are held, the first output commits, `error` and
    /// `response.failed` are in-band errors classified by their code.
    #[test]
    fn responses_events_hold_commit_and_fail_by_their_type() {
        let created = r#""response":{"id":"resp_1","object":"response","status":"in_progress","error":null,"model":"gpt-4o","output":[],"usage":null}"#;
        for (kind, data) in [
            ("response.created", created),
            ("response.in_progress", created),
            (
                "response.output_item.added",
                r#""output_index":0,"item":{"type":"message","id":"m","status":"in_progress","role":"assistant","content":[]}"#,
            ),
            (
                "response.content_part.added",
                r#""item_id":"m","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}"#,
            ),
            ("response.output_text.delta", r#""item_id":"m","delta":"""#),
            ("response.completed", created),
        ] {
            assert_eq!(
                responses_opening(&responses_event(kind, data)),
                Opening::Hold,
                "{kind}"
            );
        }
        assert_eq!(responses_opening(b": keep-alive\n\n"), Opening::Hold);
        for (kind, data) in [
            (
                "response.output_text.delta",
                r#""item_id":"m","delta":"Hi""#,
            ),
            ("response.refusal.delta", r#""item_id":"m","delta":"No""#),
            (
                "response.function_call_arguments.delta",
                r#""item_id":"fc","delta":"{\"a\""#,
            ),
            (
                "response.output_item.done",
                r#""output_index":0,"item":{"type":"message","id":"m","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}"#,
            ),
            (
                "response.completed",
                r#""response":{"status":"completed","error":null,"output":[{"type":"message"}],"usage":{"input_tokens":1,"output_tokens":1}}"#,
            ),
            ("response.some_future_event", r#""x":1"#),
        ] {
            assert_eq!(
                responses_opening(&responses_event(kind, data)),
                Opening::Content,
                "{kind}"
            );
        }
        let status = |ev: Vec<u8>| match responses_opening(&ev) {
            Opening::Error(e) => e.status,
            other => panic!("not an error: {other:?}"),
        };
        // As OpenAI sends it, as it documents it, and the terminal event.
        assert_eq!(
            status(responses_event(
                "error",
                r#""error":{"type":"server_error","code":"server_error","message":"overloaded","param":null}"#
            )),
            500
        );
        assert_eq!(
            status(responses_event(
                "error",
                r#""code":"rate_limit_exceeded","message":"slow down","param":null"#
            )),
            429
        );
        assert_eq!(
            status(responses_event(
                "response.failed",
                r#""response":{"status":"failed","error":{"code":"invalid_prompt","message":"no"},"output":[]}"#
            )),
            400
        );
        // After commit too, but not on the chat rules, which would not see them.
        let failed = responses_event(
            "response.failed",
            r#""response":{"status":"failed","error":{"code":"server_error","message":"x"}}"#,
        );
        assert_eq!(
            error_event_for(Surface::Responses, &failed).map(|e| e.status),
            Some(500)
        );
        assert!(
            error_event_for(
                Surface::Responses,
                &responses_event("response.created", created)
            )
            .is_none()
        );
        assert!(error_event_for(Surface::ChatCompletions, &failed).is_none());
        // The proxy's own failure event is one a Responses client reads as an error.
        let ev = failure_event_for(Surface::Responses, "upstream broke");
        assert!(ev.starts_with(b"event: error\n"));
        assert_eq!(
            error_event_for(Surface::Responses, &ev).map(|e| e.status),
            Some(500)
        );
    }
}

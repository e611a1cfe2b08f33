//! Upstream answers on their way to the client. For streams, the whole life of one
//! after the status line: its opening (events that carry no content are held back
//! until the first one that does, or an error, SPEC §3), the commit, the committed
//! stream forwarded event by event, the error event that ends a failed one, and
//! the report of how it ended (stats, circuit, the request log line). For unary
//! answers, the capped read. For both, the header filter.
//!
//! Nothing is buffered beyond the held-back prefix and one partial event, both
//! bounded by `--max-event-bytes`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http_body_util::BodyDataStream;
use hyper::body::Incoming;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, sleep_until};

use crate::config::snapshot::{CredentialRt, RouteRt, TargetRt, TargetState};
use crate::gateway::Refusals;
use crate::limits::bytes::{Budget, Held};
use crate::limits::circuit::Transition;
use crate::limits::clients::ClientUsage;
use crate::observe::counters::{self, RouteCounters, RouteTargetCounters, Usage};
use crate::pipeline::outcome::{Reason, classify_status, may_advance};
use crate::providers::translate::{Direction, StreamTranslator};
use crate::wire::rewrite::{JsonStr, replace_model_into};
use crate::wire::sse::{self, EventTooLarge, Framer, Opening, StreamError};
use crate::wire::surface::Surface;
use switchback_crds::config::Price;

/// A stream's upstream body, chunk by chunk as it arrives.
pub(crate) type Upstream = BodyDataStream<Incoming>;

/// How an upstream stream opened.
pub(crate) enum Opened<U> {
    /// The first event that is not held back: content, or an in-band error
    /// (`error`). `held` is the raw events held back before it.
    Event {
        held: BytesMut,
        first: Bytes,
        error: Option<StreamError>,
        upstream: U,
        framer: Framer,
    },
    /// Ended, or said `[DONE]`, before any content.
    Empty,
    /// An event, or the held-back prefix, over the event size limit.
    TooLarge,
}

/// Read a stream's opening: hold back the events without content until the first
/// event that is not (content or error). The caller bounds it in time (the
/// attempt's timeout); the held prefix is bounded by `max_event` in size.
pub(crate) async fn open<U>(
    mut upstream: U,
    max_event: usize,
    surface: Surface,
    direction: Option<Direction>,
) -> Result<Opened<U>, hyper::Error>
where
    U: futures_util::Stream<Item = Result<Bytes, hyper::Error>> + Unpin,
{
    // Bedrock streams in AWS event-stream framing: one SSE event per binary frame.
    let mut framer = match direction {
        Some(d) if d.to_bedrock() => Framer::event_stream(max_event),
        _ => Framer::new(max_event),
    };
    let mut held = BytesMut::new();
    let mut ended = false;
    loop {
        let ev = match framer.next_event() {
            Err(EventTooLarge) => return Ok(Opened::TooLarge),
            Ok(Some(ev)) => ev,
            Ok(None) if ended => return Ok(Opened::Empty),
            Ok(None) => match upstream.next().await {
                Some(chunk) => {
                    framer.push(&chunk?);
                    continue;
                }
                // Ended: an unterminated last event may still carry content.
                None => {
                    ended = true;
                    match framer.take_rest() {
                        Some(rest) => rest,
                        None => return Ok(Opened::Empty),
                    }
                }
            },
        };
        // The Responses API is never translated; the others are read in the
        // upstream's own API (a Gemini chunk is not an OpenAI one).
        let opening = match surface {
            Surface::Responses => sse::opening_for(surface, &ev),
            _ => crate::providers::translate::opening(direction, &ev),
        };
        let error = match opening {
            Opening::Hold => {
                if held.len().saturating_add(ev.len()) > max_event {
                    return Ok(Opened::TooLarge);
                }
                held.extend_from_slice(&ev);
                continue;
            }
            Opening::Done => return Ok(Opened::Empty),
            Opening::Content => None,
            Opening::Error(e) => Some(e),
        };
        return Ok(Opened::Event {
            held,
            first: ev,
            error,
            upstream,
            framer,
        });
    }
}

/// What a stream attempt needs, besides the upstream answer, to commit it.
pub(crate) struct StreamAttempt<'a> {
    pub target: &'a TargetRt,
    pub route: &'a RouteRt,
    /// `--max-event-bytes`: one event, and the held-back opening.
    pub max_event_bytes: usize,
    pub refused: &'a Arc<Refusals>,
    /// The name the client sent, as a JSON string (every event gets it back).
    pub model: &'a JsonStr,
    /// The client's API: its event vocabulary and its error event.
    pub surface: Surface,
    /// Set when the upstream speaks the other API: the direction, the client's
    /// model name and whether the client asked for usage.
    pub translator: Option<(Direction, &'a str, bool)>,
    /// The concurrency slot, held until the stream ends.
    pub permit: Option<OwnedSemaphorePermit>,
    /// The LLMClient whose usage the stream's events count to.
    pub client: Option<ClientUsage>,
    /// The target's price, for the client's cost.
    pub price: Option<Price>,
    /// Drop the usage-only chunk (asked for on the client's behalf).
    pub strip_usage: bool,
}

/// Why a 2xx stream was not committed.
pub(crate) enum NotCommitted {
    /// The attempt's deadline passed before the first content event.
    TimedOut,
    /// A failure of the attempt (with the in-band error's status, if it was one).
    Failed(Reason, Option<u16>),
}

/// A 2xx stream: hold back its opening until the first content event (or an error)
/// within `deadline`, then commit it (SPEC §3). A stream without content, an
/// opening over the event size limit, or an in-band error the chain may move past is
/// not committed; an in-band error that speaks about the request (context length,
/// auth, another 4xx) and that the route does not advance on is relayed in the
/// stream, as the provider sent it, after the held-back events.
pub(crate) async fn start_stream(
    status: StatusCode,
    mut headers: HeaderMap,
    response: Incoming,
    deadline: Instant,
    a: StreamAttempt<'_>,
) -> Result<(Response<Body>, Arc<LineSlot>), NotCommitted> {
    let opened = tokio::time::timeout_at(
        deadline,
        open(
            BodyDataStream::new(response),
            a.max_event_bytes,
            a.surface,
            a.translator.map(|(d, _, _)| d),
        ),
    )
    .await;
    let (held, first, error, upstream, framer) = match opened {
        Err(_) => return Err(NotCommitted::TimedOut),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "upstream stream failed before its first content event");
            return Err(NotCommitted::Failed(Reason::ConnectionError, None));
        }
        Ok(Ok(Opened::Empty)) => return Err(NotCommitted::Failed(Reason::InvalidResponse, None)),
        Ok(Ok(Opened::TooLarge)) => {
            a.refused.events.fetch_add(1, Ordering::Relaxed);
            return Err(NotCommitted::Failed(Reason::EventTooLarge, None));
        }
        Ok(Ok(Opened::Event {
            held,
            first,
            error,
            upstream,
            framer,
        })) => (held, first, error, upstream, framer),
    };
    let first = match error {
        Some(e) => {
            let reason = classify_status(e.status, &e.body);
            if !reason.returns_upstream_answer()
                || may_advance(reason, Some(e.status), &a.route.spec.fallback)
            {
                return Err(NotCommitted::Failed(reason, Some(e.status)));
            }
            // Relayed like an error body: without the key, should it echo it.
            match &a.target.credential.key {
                Some(key) => mask_key(first, key.expose()),
                None => first,
            }
        }
        None => first,
    };
    let (t, route) = (a.target, a.route);
    let cb = &route.spec.circuit_breaker;
    let line = Arc::new(LineSlot::default());
    let ending = Ending {
        state: t.state.clone(),
        counters: t.counters.clone(),
        route: route.counters.clone(),
        threshold: cb.consecutive_failures,
        open_for: Duration::from_millis(cb.open_for_ms),
        target: t.credential.target_header.clone(),
        failure: None,
        completed: false,
        refused: a.refused.clone(),
        line: line.clone(),
    };
    let state = Committed {
        upstream,
        framer,
        model: a.model.clone(),
        surface: a.surface,
        translator: a
            .translator
            .map(|(d, model, usage)| StreamTranslator::new(d, model, usage)),
        // A committed stream that sends nothing for this long has stalled.
        idle: Duration::from_millis(t.spec.timeout_ms.unwrap_or(route.spec.timeout_ms)),
        counters: t.counters.clone(),
        credential: Some(t.credential.clone()),
        permit: a.permit,
        client: a.client,
        price: a.price,
        strip_usage: a.strip_usage,
        reported: Usage::default(),
        ending: Some(ending),
        done: false,
    };
    if state.translator.is_some() {
        // The proxy writes a translated stream's events itself, as SSE, whatever
        // framing the upstream used (Bedrock: AWS event stream).
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
    }
    let response = commit_stream(status, headers, &held, &first, state);
    Ok((response, line))
}

/// A unary answer's reservation in the answer budget (`--max-inflight-response-bytes`).
pub(crate) type AnswerHeld = Held<Arc<Budget>>;

/// What [`read_capped`] made of a unary answer.
pub(crate) enum Capped {
    /// The whole answer, and its bytes' reservation in the answer budget.
    Whole(Bytes, AnswerHeld),
    /// Over `--max-response-bytes` (what was read is dropped at once).
    TooLarge,
    /// Does not fit in what is left of the answer budget (likewise dropped).
    OverBudget,
}

/// Read a unary answer whole, up to `cap` bytes, every byte of buffer it takes
/// reserved in `budget` first: the answer's declared length up front, else the
/// buffer as it grows (doubling, never past `cap`).
pub(crate) async fn read_capped(
    response: Incoming,
    cap: usize,
    budget: &Arc<Budget>,
) -> Result<Capped, hyper::Error> {
    // A declared length over the cap is refused before reading a byte.
    let declared = hyper::body::Body::size_hint(&response).exact();
    if declared.is_some_and(|n| n > cap as u64) {
        return Ok(Capped::TooLarge);
    }
    let declared = declared.map_or(0, |n| n as usize);
    let mut held = Held::new(budget.clone());
    if !held.grow(declared) {
        return Ok(Capped::OverBudget);
    }
    let mut body = BodyDataStream::new(response);
    let Some(first) = body.next().await.transpose()? else {
        return Ok(Capped::Whole(Bytes::new(), held));
    };
    if first.len() > cap {
        return Ok(Capped::TooLarge);
    }
    if !held.grow_to(first.len()) {
        return Ok(Capped::OverBudget);
    }
    // The usual answer arrives in one chunk: handed on without a copy.
    let Some(second) = body.next().await.transpose()? else {
        return Ok(Capped::Whole(first, held));
    };
    // A Vec, whose `reserve_exact` keeps to what the budget covers.
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = first;
    let mut next = Some(second);
    loop {
        if chunk.len() > cap.saturating_sub(buf.len()) {
            return Ok(Capped::TooLarge);
        }
        let need = buf.len() + chunk.len();
        if need > buf.capacity() {
            // Room for the declared length at once, else double: amortised copies,
            // and the budget always covers the whole buffer.
            let room = need.max(declared).max(buf.capacity() * 2).min(cap);
            if !held.grow_to(room) {
                return Ok(Capped::OverBudget);
            }
            buf.reserve_exact(room - buf.len());
        }
        buf.extend_from_slice(&chunk);
        match next.take() {
            Some(c) => chunk = c,
            None => match body.next().await.transpose()? {
                Some(c) => chunk = c,
                None => return Ok(Capped::Whole(Bytes::from(buf), held)),
            },
        }
    }
}

/// Bytes of a held unary answer handed to the connection at a time: the answer's
/// reservation is given back when its last slice is taken, so a client that reads
/// slowly keeps it (and hyper is not handed 32 MiB at once).
const ANSWER_SLICE: usize = 256 * 1024;

/// A unary answer on its way to the client, with its reservation in the answer
/// budget, given back with the last slice. One frame for an answer of up to
/// [`ANSWER_SLICE`] bytes (the usual one), as a plain body would be.
pub(crate) struct HeldAnswer {
    rest: Bytes,
    held: Option<AnswerHeld>,
}

impl HeldAnswer {
    pub(crate) fn new(bytes: Bytes, held: AnswerHeld) -> Self {
        Self {
            rest: bytes,
            held: Some(held),
        }
    }
}

impl hyper::body::Body for HeldAnswer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            this.held = None;
            return std::task::Poll::Ready(None);
        }
        let slice = this.rest.split_to(this.rest.len().min(ANSWER_SLICE));
        if this.rest.is_empty() {
            this.held = None;
        }
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(slice))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// Read an error answer, cut at `cap` bytes (it is only classified and relayed).
pub(crate) async fn read_cut(response: Incoming, cap: usize) -> Result<Bytes, hyper::Error> {
    let mut buf = BytesMut::new();
    let mut body = BodyDataStream::new(response);
    while let Some(chunk) = body.next().await.transpose()? {
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() >= cap {
            break;
        }
    }
    Ok(buf.freeze())
}

/// An upstream answer on its way out, with only the provider headers SPEC §8 lists
/// (see [`relayed_as`]): framing and hop-by-hop headers are the gateway's own
/// business, cookies and a provider's internal headers are none of the client's,
/// and `x-request-id` is the client's (the provider's goes out as
/// `x-upstream-request-id`).
pub(crate) fn relay(status: StatusCode, headers: HeaderMap, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = relayed_headers(headers);
    r
}

/// The provider's `x-request-id`, as the client sees it.
pub const X_UPSTREAM_REQUEST_ID: HeaderName = HeaderName::from_static("x-upstream-request-id");

/// Room for the kept headers and the gateway's own (`x-switchback-*`,
/// `x-request-id`), so that neither grows the map on the way out.
const RELAYED_CAPACITY: usize = 16;

/// The headers of `upstream` that reach the client. One pass, moving the names and
/// values kept (a provider's own header names are not even cloned); everything else
/// is dropped with the provider's map.
fn relayed_headers(upstream: HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(RELAYED_CAPACITY);
    // Where further values of the last name go: the iteration gives them with no
    // name (`x-ratelimit-limit-requests` twice).
    let mut last: Option<header::OccupiedEntry<'_, HeaderValue>> = None;
    for (name, value) in upstream {
        match name {
            Some(name) => {
                last = relayed_as(name).map(|name| match out.entry(name) {
                    header::Entry::Vacant(v) => v.insert_entry(value),
                    header::Entry::Occupied(mut o) => {
                        o.append(value);
                        o
                    }
                });
            }
            None => {
                if let Some(o) = &mut last {
                    o.append(value);
                }
            }
        }
    }
    out
}

/// The name a provider header is relayed under, or `None` when it is not relayed:
/// `content-type`, `retry-after`, `retry-after-ms`, `openai-processing-ms`, the
/// `x-ratelimit-*` and `anthropic-ratelimit-*` families, and `x-request-id` as
/// `x-upstream-request-id` (SPEC §8).
fn relayed_as(name: HeaderName) -> Option<HeaderName> {
    if name == header::CONTENT_TYPE || name == header::RETRY_AFTER {
        return Some(name);
    }
    let s = name.as_str();
    if s == "x-request-id" {
        Some(X_UPSTREAM_REQUEST_ID)
    } else if s == "retry-after-ms"
        || s == "openai-processing-ms"
        || s.starts_with("x-ratelimit-")
        || s.starts_with("anthropic-ratelimit-")
    {
        Some(name)
    } else {
        None
    }
}

/// Keys shorter than this are not looked for: too likely to match ordinary words.
const MIN_MASKED_KEY: usize = 8;

/// What a key echoed in a provider's error body becomes.
const MASK: &[u8] = b"****";

/// `body` with every key-shaped run of bytes (letters, digits, `-`, `_`, `.`) that is
/// or contains `key` replaced by `****`: a provider that echoes the credential's key
/// in a 401 must not hand it to the client. Costs one substring search when the key
/// is absent (the usual case), and is only run on error bodies.
pub(crate) fn mask_key(body: Bytes, key: &str) -> Bytes {
    match masked(&body, key) {
        Some(out) => Bytes::from(out),
        None => body,
    }
}

/// `body` with the key masked as [`mask_key`] does, or `None` (nothing allocated)
/// when no spelling of the key is in it. JSON may spell any character of the key as
/// an escape (`sk-abc\/def`, `sk\u002dabc`): when the body holds a backslash, each
/// character may be one, and a masked run takes in whole escapes around the key, so
/// the JSON stays valid.
pub(crate) fn masked(body: &[u8], key: &str) -> Option<Vec<u8>> {
    let key = key.as_bytes();
    if key.len() < MIN_MASKED_KEY {
        return None;
    }
    let finder = memchr::memmem::Finder::new(key);
    let escaped = memchr::memchr(b'\\', body).is_some();
    let find = |from: usize| -> Option<(usize, usize)> {
        if escaped {
            find_escaped(body, key, from)
        } else {
            let at = from + finder.find(&body[from..])?;
            Some((at, at + key.len()))
        }
    };
    let (mut at, mut key_end) = find(0)?;
    let mut out = Vec::with_capacity(body.len());
    let mut copied = 0;
    loop {
        // Backslashes too: the run never starts inside an escape.
        let mut start = at;
        while start > copied && (shaped(body[start - 1]) || body[start - 1] == b'\\') {
            start -= 1;
        }
        let mut end = key_end;
        while end < body.len() {
            if shaped(body[end]) {
                end += 1;
            } else if let Some((c, n)) = escape_at(body, end)
                && shaped(c)
            {
                end += n;
            } else {
                break;
            }
        }
        out.extend_from_slice(&body[copied..start]);
        out.extend_from_slice(MASK);
        copied = end;
        match find(copied) {
            Some((a, e)) => (at, key_end) = (a, e),
            None => break,
        }
    }
    out.extend_from_slice(&body[copied..]);
    Some(out)
}

/// A byte of a key-shaped run.
fn shaped(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// The JSON escape at `at` (`\/`, `\n`, `\u002d`, ...): the ASCII byte it stands for
/// and its length. `None` when there is none, or it stands for a non-ASCII character.
fn escape_at(body: &[u8], at: usize) -> Option<(u8, usize)> {
    if body.get(at) != Some(&b'\\') {
        return None;
    }
    let c = match *body.get(at + 1)? {
        b'u' => {
            let hex = std::str::from_utf8(body.get(at + 2..at + 6)?).ok()?;
            let v = u16::from_str_radix(hex, 16).ok()?;
            return u8::try_from(v).ok().filter(u8::is_ascii).map(|b| (b, 6));
        }
        c @ (b'/' | b'\\' | b'"') => c,
        b'b' => 8,
        b'f' => 12,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        _ => return None,
    };
    Some((c, 2))
}

/// The first spelling of `key` at or after `from`, each of its bytes as itself or as
/// a JSON escape: its start and end.
fn find_escaped(body: &[u8], key: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut i = from;
    while i < body.len() {
        i += memchr::memchr2(key[0], b'\\', &body[i..])?;
        if let Some(end) = spelled_at(body, i, key) {
            return Some((i, end));
        }
        i += 1;
    }
    None
}

/// Where `key` ends if it is spelled at `at`, escapes allowed.
fn spelled_at(body: &[u8], mut at: usize, key: &[u8]) -> Option<usize> {
    for &k in key {
        match *body.get(at)? {
            b if b == k => at += 1,
            b'\\' => match escape_at(body, at)? {
                (c, n) if c == k => at += n,
                _ => return None,
            },
            _ => return None,
        }
    }
    Some(at)
}

/// Does the answer come in a content coding (gzip, br, ...)? The proxy asks for
/// `identity` and does not decode, so such a body cannot be read, rewritten or
/// relayed as it is.
pub(crate) fn is_encoded(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
}

/// How a committed stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The provider ended it.
    Completed,
    /// It failed after commit (a break, a stall, an in-band error, an event over
    /// the limit) and was ended with the error event.
    Failed(Reason),
    /// The client went away first.
    ClientGone,
}

impl StreamEnd {
    /// As the request log line's `stream` field says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::ClientGone => "clientClosed",
            Self::Failed(r) => r.as_str(),
        }
    }
}

/// A stream's request log line, written once the stream has ended.
pub type LogLine = Box<dyn FnOnce(StreamEnd) + Send>;

/// Where a committed stream and the server meet: the server leaves the request's log
/// line, the stream's end writes it with how it ended, whichever comes second (the
/// body is not polled before the server has the response, but may be dropped with
/// it). The lock is held only to swap the state, never across an await nor while the
/// line is written.
#[derive(Default)]
pub struct LineSlot(std::sync::Mutex<Slot>);

#[derive(Default)]
enum Slot {
    #[default]
    Empty,
    Line(LogLine),
    Ended(StreamEnd),
    Written,
}

impl LineSlot {
    /// The server's half: the line to write when the stream ends.
    pub fn write_when_ended(&self, line: LogLine) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *g, Slot::Written) {
            Slot::Ended(end) => {
                drop(g);
                line(end);
            }
            Slot::Empty => *g = Slot::Line(line),
            other => *g = other,
        }
    }

    /// The stream's half: it ended so.
    fn ended(&self, end: StreamEnd) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *g, Slot::Written) {
            Slot::Line(line) => {
                drop(g);
                line(end);
            }
            Slot::Empty => *g = Slot::Ended(end),
            other => *g = other,
        }
    }
}

/// The attempt's verdict on a committed stream, which it only earns at the stream's
/// end: counted in stats (successes or failures by reason, the route's failed
/// requests), the circuit, and the request log line, once, when the body ends or
/// is dropped (the client went away).
pub(crate) struct Ending {
    pub state: Arc<TargetState>,
    pub counters: Arc<RouteTargetCounters>,
    pub route: Arc<RouteCounters>,
    /// `circuitBreaker` of the route: consecutive failures, base open time.
    pub threshold: u32,
    pub open_for: Duration,
    /// The credential, for the log line when the circuit opens.
    pub target: HeaderValue,
    /// Why the stream failed after commit, if it did.
    pub failure: Option<(Reason, Option<u16>)>,
    /// The provider ended the stream.
    pub completed: bool,
    /// Where refusals by a limit are counted (for `/metrics`).
    pub refused: Arc<Refusals>,
    /// The request log line, written when the stream ends.
    pub line: Arc<LineSlot>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        let end = match self.failure {
            Some((reason, status)) => {
                self.counters.failures.inc(reason);
                counters::inc(&self.route.failed);
                self.state.record_failure(status, reason);
                if reason.trips_breaker(status)
                    && matches!(
                        self.state.breaker.failure(
                            Instant::now(),
                            self.threshold,
                            self.open_for,
                            false
                        ),
                        Transition::Opened | Transition::Reopened
                    )
                {
                    tracing::warn!(target_credential = ?self.target, reason = reason.as_str(),
                        "circuit opened by a stream that failed after commit");
                }
                StreamEnd::Failed(reason)
            }
            // The provider did its part, or did so as far as the client stayed.
            None => {
                counters::inc(&self.counters.successes);
                self.state.breaker.success(false);
                if self.completed {
                    StreamEnd::Completed
                } else {
                    StreamEnd::ClientGone
                }
            }
        };
        self.line.ended(end);
    }
}

/// Is this the chunk `stream_options.include_usage` adds to an OpenAI stream (no
/// choices, only usage)? Parsed, but only events that carry usage get here (one per
/// stream).
fn is_usage_only(ev: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Choices {
        #[serde(default)]
        choices: Option<Vec<serde::de::IgnoredAny>>,
    }
    sse::fields(ev)
        .data
        .and_then(|d| serde_json::from_slice::<Choices>(d).ok())
        .is_some_and(|c| c.choices.is_none_or(|c| c.is_empty()))
}

/// Looked for in every event of a committed stream: built once, not per event
/// (`memmem::find` builds its searcher on each call, ~550 instructions).
static ERROR_WORD: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"error"));

/// A committed stream: what the body needs to forward the rest. Generic over the
/// upstream body only so that tests can drive it with a scripted one.
pub(crate) struct Committed<U = Upstream> {
    pub upstream: U,
    pub framer: Framer,
    pub model: JsonStr,
    /// The client's API.
    pub surface: Surface,
    /// Set when the upstream speaks the other API.
    pub translator: Option<StreamTranslator>,
    pub idle: Duration,
    pub counters: Arc<RouteTargetCounters>,
    /// Whose key to mask in an in-band error relayed after commit.
    pub credential: Option<Arc<CredentialRt>>,
    /// The concurrency slot, held until the stream ends.
    pub permit: Option<OwnedSemaphorePermit>,
    /// The LLMClient whose usage the events count to, and the target's price.
    pub client: Option<ClientUsage>,
    pub price: Option<Price>,
    /// Drop the usage-only chunk: the client did not ask for it.
    pub strip_usage: bool,
    /// The usage reported so far (the largest count seen of each kind).
    pub reported: Usage,
    pub ending: Option<Ending>,
    pub done: bool,
}

impl<U> Committed<U> {
    /// One upstream event on its way to the client, appended to `out`: usage
    /// counted, an in-band error noted, then either translated into the client's
    /// API or given the client's `model` name. May append nothing (an event the
    /// client's API has no counterpart for).
    fn forward(&mut self, ev: &[u8], out: &mut BytesMut) {
        let usage = match &self.translator {
            Some(t) if t.from_gemini() => counters::gemini_usage(ev),
            Some(t) if t.from_bedrock() => counters::bedrock_usage(ev),
            _ => counters::usage(ev),
        };
        if let Some(u) = usage {
            // Counts are running totals, not increments: Anthropic's message_start
            // says the input (and an output of 1 or so), each message_delta the
            // output so far; some OpenAI-compatible servers repeat usage on every
            // chunk. Only what is new is counted.
            let new = Usage {
                input_tokens: u.input_tokens.saturating_sub(self.reported.input_tokens),
                output_tokens: u.output_tokens.saturating_sub(self.reported.output_tokens),
            };
            self.reported.input_tokens += new.input_tokens;
            self.reported.output_tokens += new.output_tokens;
            self.counters.add_usage(new);
            if let Some(c) = &self.client {
                c.record(new, self.price.as_ref());
            }
            // Asked for on the client's behalf: counted, not forwarded.
            if self.strip_usage && is_usage_only(ev) {
                return;
            }
        }
        // Cheap test first: most events never mention an error.
        let without_key;
        let mut ev = ev;
        if ERROR_WORD.find(ev).is_some() {
            if let Some(e) = sse::error_event_for(self.surface, ev) {
                self.fail(classify_status(e.status, &e.body), Some(e.status));
            }
            // Relayed like an error body: without the key, should it echo it.
            if let Some(key) = self.credential.as_ref().and_then(|c| c.key.as_ref())
                && let Some(m) = masked(ev, key.expose())
            {
                without_key = m;
                ev = &without_key;
            }
        }
        match &mut self.translator {
            None => replace_model_into(ev, &self.model, out),
            Some(t) => t.event(ev, out),
        }
    }

    /// The stream failed after commit: counted when it ends.
    fn fail(&mut self, reason: Reason, status: Option<u16>) {
        if let Some(e) = &mut self.ending
            && e.failure.is_none()
        {
            e.failure = Some((reason, status));
        }
    }

    /// The upstream ended normally: its unterminated tail, and whatever the
    /// translation still owes the client.
    fn finish(&mut self, out: &mut BytesMut) {
        if let Some(tail) = self.framer.take_rest() {
            self.forward(&tail, out);
        }
        if let Some(t) = &mut self.translator {
            t.finish(out);
        }
        if let Some(e) = &mut self.ending {
            e.completed = true;
        }
    }

    /// An event over the limit was refused.
    fn refused(&self) {
        if let Some(e) = &self.ending {
            e.refused
                .events
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// End the stream with the error event.
    fn abort(&mut self, reason: Reason, message: &str, out: &mut BytesMut) {
        self.done = true;
        self.fail(reason, None);
        out.extend_from_slice(&sse::failure_event_for(self.surface, message));
        // The upstream connection and the concurrency slot go now, not when the
        // client finally reads the end.
        self.permit = None;
    }
}

/// After commit: forward each event as soon as it is complete, with `model` set to
/// the client's name. A failure ends the stream with an error event; a stall longer
/// than the idle limit counts as a failure.
pub(crate) fn commit_stream(
    status: StatusCode,
    headers: HeaderMap,
    held: &[u8],
    first: &[u8],
    state: Committed,
) -> Response<Body> {
    relay(
        status,
        headers,
        Body::from_stream(CommittedStream::new(held, first, state)),
    )
}

/// Bytes of forwarded events that make one write on their own.
const COALESCE_LIMIT: usize = 16 * 1024;
/// Event-loop turns a held chunk waits for more upstream data before it is sent.
const EMPTY_TURNS: u8 = 3;

/// The body of a committed stream. Events already complete when it is polled, or
/// delivered by the upstream within a few event-loop turns, go out together as one
/// chunk (one write instead of one per event; nothing waits for data not yet read).
/// The idle limit is one timer re-armed lazily: arriving data only moves
/// `idle_since`, and the timer, when it fires early, is pushed to the real deadline.
pub(crate) struct CommittedStream<U = Upstream> {
    state: Committed<U>,
    /// Forwarded, not yet sent: the opening, checked before commit, or events
    /// held while the upstream's connection task is let run (see `poll_next`).
    pending: BytesMut,
    /// Event-loop turns since the last upstream chunk while holding events.
    empty_turns: u8,
    idle_since: Instant,
    idle_timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<U> CommittedStream<U> {
    /// `held`: the events held back before commit; `first`: the event that
    /// committed. Both are sent first.
    pub(crate) fn new(held: &[u8], first: &[u8], mut state: Committed<U>) -> Self {
        let mut pending = BytesMut::new();
        for ev in sse::split_events(held) {
            state.forward(ev, &mut pending);
        }
        state.forward(first, &mut pending);
        CommittedStream {
            pending,
            empty_turns: 0,
            idle_since: Instant::now(),
            idle_timer: Box::pin(sleep_until(Instant::now() + state.idle)),
            state,
        }
    }
}

impl<U> futures_util::Stream for CommittedStream<U>
where
    U: futures_util::Stream<Item = Result<Bytes, hyper::Error>> + Unpin,
{
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        let st = &mut this.state;
        let mut out = std::mem::take(&mut this.pending);
        loop {
            // The framer is taken out for the loop: its events are read in place
            // while `forward` borrows the rest of the state.
            let mut framer = std::mem::take(&mut st.framer);
            loop {
                match framer.next_in_place() {
                    Ok(Some(ev)) => st.forward(ev, &mut out),
                    Ok(None) => break,
                    Err(EventTooLarge) => {
                        st.refused();
                        st.abort(
                            Reason::EventTooLarge,
                            "an upstream event was larger than the proxy's event size limit",
                            &mut out,
                        );
                        break;
                    }
                }
            }
            st.framer = framer;
            // Enough for one write: send it, keep the rest for the next poll.
            if st.done || out.len() >= COALESCE_LIMIT {
                break;
            }
            match st.upstream.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    st.framer.push(&chunk);
                    this.idle_since = Instant::now();
                    this.empty_turns = 0;
                }
                Poll::Ready(None) => {
                    st.done = true;
                    st.finish(&mut out);
                    break;
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!(error = %e, "upstream stream failed after commit");
                    st.abort(
                        Reason::ConnectionError,
                        "the upstream stream failed after it had started",
                        &mut out,
                    );
                    break;
                }
                Poll::Pending => {
                    if !out.is_empty() {
                        // hyper's client hands a body over one chunk at a time through
                        // its connection task, which may already hold the next events
                        // (a provider's burst arrives in one read). Let that task run
                        // before writing, so the burst leaves as one write, not one
                        // per event. It takes two turns of the event loop to deliver
                        // a chunk already read; after EMPTY_TURNS turns without one,
                        // send: nothing waits for data that has not arrived.
                        if this.empty_turns < EMPTY_TURNS {
                            this.empty_turns += 1;
                            this.pending = out;
                            cx.waker().wake_by_ref();
                            return Poll::Pending;
                        }
                        break;
                    }
                    // Nothing to send and nothing arriving: is the stream stalled? The
                    // timer is moved only when it fires before the real deadline.
                    loop {
                        if this.idle_timer.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        let deadline = this.idle_since + st.idle;
                        if Instant::now() >= deadline {
                            break;
                        }
                        this.idle_timer.as_mut().reset(deadline);
                    }
                    st.abort(
                        Reason::Timeout,
                        "the upstream stream stalled after it had started",
                        &mut out,
                    );
                    break;
                }
            }
        }
        this.empty_turns = 0;
        // Empty here only when the upstream is done and nothing is left to send.
        if out.is_empty() {
            // Ended: the verdict is in, report it now rather than when the
            // client's connection lets go of the body.
            drop(st.ending.take());
            Poll::Ready(None)
        } else {
            Poll::Ready(Some(Ok(out.freeze())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// An upstream body scripted like hyper's client body: each chunk it already holds
    /// is handed over `turns` event-loop turns after the previous one was taken
    /// (Pending with a wake-up in between). With `stall`, nothing comes after the
    /// first chunk: no wake-up, ever (data that has not arrived).
    struct Scripted {
        chunks: VecDeque<Bytes>,
        turns: u8,
        waited: u8,
        stall: bool,
        taken: usize,
    }

    impl Scripted {
        fn new(chunks: impl IntoIterator<Item = Bytes>, stall: bool) -> Self {
            Scripted {
                chunks: chunks.into_iter().collect(),
                turns: 2,
                waited: 0,
                stall,
                taken: 0,
            }
        }
    }

    impl futures_util::Stream for Scripted {
        type Item = Result<Bytes, hyper::Error>;

        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            if self.stall && self.taken > 0 {
                return Poll::Pending;
            }
            if self.waited < self.turns {
                self.waited += 1;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.waited = 0;
            self.taken += 1;
            Poll::Ready(self.chunks.pop_front().map(Ok))
        }
    }

    fn state(upstream: Scripted, max_event: usize, ending: Option<Ending>) -> Committed<Scripted> {
        Committed {
            upstream,
            framer: Framer::new(max_event),
            model: JsonStr::new("smart"),
            surface: Surface::ChatCompletions,
            translator: None,
            idle: Duration::from_secs(60),
            counters: Arc::default(),
            credential: None,
            permit: None,
            client: None,
            price: None,
            strip_usage: false,
            reported: Default::default(),
            ending,
            done: false,
        }
    }

    fn committed(chunks: &[&'static str], stall: bool) -> CommittedStream<Scripted> {
        let upstream = Scripted::new(
            chunks.iter().map(|c| Bytes::from_static(c.as_bytes())),
            stall,
        );
        CommittedStream::new(
            b"",
            b"data: {\"model\":\"gpt-x\",\"n\":0}\n\n",
            state(upstream, sse::DEFAULT_MAX_EVENT_BYTES, None),
        )
    }

    const EVENTS: [&str; 3] = [
        "data: {\"model\":\"gpt-x\",\"n\":1}\n\n",
        "data: {\"model\":\"gpt-x\",\"n\":2}\n\n",
        "data: {\"model\":\"gpt-x\",\"n\":3}\n\n",
    ];

    #[tokio::test(start_paused = true)]
    async fn a_burst_the_upstream_already_holds_leaves_as_one_chunk() {
        let mut body = committed(&EVENTS, false);
        let mut sent = Vec::new();
        while let Some(Ok(chunk)) = body.next().await {
            sent.push(chunk);
        }
        assert_eq!(sent.len(), 1, "one write for the burst: {sent:?}");
        let text = std::str::from_utf8(&sent[0]).unwrap();
        assert_eq!(text.matches("\"model\":\"smart\"").count(), 4, "{text}");
        assert!(!text.contains("gpt-x"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn what_has_arrived_is_sent_without_waiting_for_more() {
        let mut body = committed(&EVENTS, true);
        // Paused clock: if the stream waited on anything but its own turns, the
        // runtime would jump to this timeout.
        let first = tokio::time::timeout(Duration::from_millis(1), body.next())
            .await
            .expect("sent without waiting for more upstream data")
            .unwrap()
            .unwrap();
        let text = std::str::from_utf8(&first).unwrap();
        assert_eq!(text.matches("\"model\":\"smart\"").count(), 2, "{text}");
    }

    /// What a test keeps of a stream's verdict.
    struct Verdict {
        target: Arc<TargetState>,
        counters: Arc<RouteTargetCounters>,
        route: Arc<RouteCounters>,
        refused: Arc<Refusals>,
        line: Arc<LineSlot>,
    }

    fn make_ending(threshold: u32) -> (Ending, Verdict) {
        let v = Verdict {
            target: Arc::default(),
            counters: Arc::default(),
            route: Arc::default(),
            refused: Arc::default(),
            line: Arc::default(),
        };
        let e = Ending {
            state: v.target.clone(),
            counters: v.counters.clone(),
            route: v.route.clone(),
            threshold,
            open_for: Duration::from_secs(30),
            target: HeaderValue::from_static("team-a/primary"),
            failure: None,
            completed: false,
            refused: v.refused.clone(),
            line: v.line.clone(),
        };
        (e, v)
    }

    /// A log line that records how the stream ended, and whether it was written.
    fn line(slot: &LineSlot) -> Arc<std::sync::Mutex<Option<StreamEnd>>> {
        let seen = Arc::new(std::sync::Mutex::new(None));
        let s = seen.clone();
        slot.write_when_ended(Box::new(move |end| *s.lock().unwrap() = Some(end)));
        seen
    }

    /// An endless line after the first event: the stream ends with the error event,
    /// the framer never holds more than the limit and a chunk, and the failure is
    /// counted against the target.
    #[tokio::test(start_paused = true)]
    async fn an_event_over_the_limit_ends_the_stream_with_the_error_event() {
        const LIMIT: usize = 64 * 1024;
        let filler = Bytes::from(vec![b'y'; 4096]);
        let mut chunks = vec![Bytes::from_static(b"data: {\"x\":\"")];
        chunks.extend(std::iter::repeat_n(filler, 10_000)); // 40 MB if buffered
        let (ending, v) = make_ending(1);
        let logged = line(&v.line);
        let mut body = CommittedStream::new(
            b"",
            b"data: {\"n\":0}\n\n",
            state(Scripted::new(chunks, false), LIMIT, Some(ending)),
        );
        let mut text = Vec::new();
        while let Some(Ok(chunk)) = body.next().await {
            assert!(body.state.framer.buffered() <= LIMIT + 4096);
            text.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.ends_with("\n\n") && text.contains("stream_interrupted"),
            "{text}"
        );
        assert!(
            body.state.upstream.chunks.len() > 9_000,
            "stopped reading at the limit"
        );
        assert_eq!(body.state.framer.buffered(), 0, "buffer freed");
        assert_eq!(v.counters.failures.get(Reason::EventTooLarge), 1);
        assert_eq!(counters::get(&v.counters.successes), 0);
        assert_eq!(
            v.refused.events.load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert_eq!(counters::get(&v.route.failed), 1);
        assert!(
            v.target.breaker.is_open(Instant::now()),
            "counted by the circuit"
        );
        assert_eq!(
            *logged.lock().unwrap(),
            Some(StreamEnd::Failed(Reason::EventTooLarge))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_in_band_error_after_commit_counts_as_a_failure() {
        let (ending, v) = make_ending(1);
        let err = Bytes::from_static(
            b"data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":null}}\n\n",
        );
        let mut body = CommittedStream::new(
            b"",
            b"data: {\"n\":0}\n\n",
            state(Scripted::new([err], false), 1024, Some(ending)),
        );
        while body.next().await.is_some() {}
        drop(body);
        assert_eq!(v.counters.failures.get(Reason::Status5xx), 1);
        assert_eq!(counters::get(&v.counters.successes), 0);
        assert_eq!(counters::get(&v.route.failed), 1);
        assert!(
            v.target.breaker.is_open(Instant::now()),
            "counted by the circuit"
        );
    }

    /// The request log line of a stream is written when the stream ends, not when it
    /// is committed, and says how it ended; the success is counted then too.
    #[tokio::test(start_paused = true)]
    async fn a_streams_log_line_is_written_when_it_ends() {
        let (ending, v) = make_ending(5);
        let logged = line(&v.line);
        let chunks = EVENTS.iter().map(|e| Bytes::from_static(e.as_bytes()));
        let mut upstream = Scripted::new(chunks, false);
        upstream.turns = 4; // one event per write
        let mut body = CommittedStream::new(
            b"",
            b"data: {\"n\":0}\n\n",
            state(upstream, 1024, Some(ending)),
        );
        body.next().await.unwrap().unwrap();
        assert_eq!(*logged.lock().unwrap(), None, "not at commit");
        assert_eq!(counters::get(&v.counters.successes), 0, "not yet earned");
        while body.next().await.is_some() {}
        assert_eq!(*logged.lock().unwrap(), Some(StreamEnd::Completed));
        assert_eq!(counters::get(&v.counters.successes), 1);
        drop(body);
        assert_eq!(counters::get(&v.counters.successes), 1, "counted once");

        // The client goes away mid-stream: not the provider's failure.
        let (ending, v) = make_ending(1);
        let logged = line(&v.line);
        let mut body = CommittedStream::new(
            b"",
            b"data: {\"n\":0}\n\n",
            state(
                Scripted::new(
                    EVENTS.iter().map(|e| Bytes::from_static(e.as_bytes())),
                    true,
                ),
                1024,
                Some(ending),
            ),
        );
        body.next().await.unwrap().unwrap();
        drop(body);
        assert_eq!(*logged.lock().unwrap(), Some(StreamEnd::ClientGone));
        assert!(!v.target.breaker.is_open(Instant::now()));

        // A stream that ended before the server left its line: written when it does.
        let (ending, v) = make_ending(1);
        drop(ending);
        let logged = line(&v.line);
        assert_eq!(*logged.lock().unwrap(), Some(StreamEnd::ClientGone));
    }

    fn chunks(s: &str) -> Scripted {
        Scripted::new(
            s.as_bytes()
                .chunks(7)
                .map(Bytes::copy_from_slice)
                .collect::<Vec<_>>(),
            false,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn the_opening_holds_back_events_without_content() {
        let s = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n\
                 : comment\n\n\
                 event: ping\ndata: {\"type\":\"ping\"}\n\n\
                 event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
                 event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
        let Ok(Opened::Event {
            held, first, error, ..
        }) = open(chunks(s), 1 << 20, Surface::Messages, None).await
        else {
            panic!("opened on content")
        };
        assert!(error.is_none());
        assert_eq!(sse::split_events(&held).count(), 4);
        assert!(first.starts_with(b"event: content_block_delta"));

        let s = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n\
                 event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        let Ok(Opened::Event { error: Some(e), .. }) =
            open(chunks(s), 1 << 20, Surface::Messages, None).await
        else {
            panic!("opened on the error")
        };
        assert_eq!(classify_status(e.status, &e.body), Reason::Status5xx);

        let role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n";
        for empty in [
            "",
            "data: [DONE]\n\n",
            &format!("{role}data: [DONE]\n\n"),
            role,
        ] {
            assert!(
                matches!(
                    open(chunks(empty), 1 << 20, Surface::ChatCompletions, None).await,
                    Ok(Opened::Empty)
                ),
                "{empty:?}"
            );
        }
        let many_pings = "event: ping\ndata: {\"type\":\"ping\"}\n\n".repeat(100);
        assert!(matches!(
            open(chunks(&many_pings), 1000, Surface::Messages, None).await,
            Ok(Opened::TooLarge)
        ));
        let endless = format!("data: {{\"x\":\"{}", "y".repeat(5000));
        assert!(matches!(
            open(chunks(&endless), 1000, Surface::ChatCompletions, None).await,
            Ok(Opened::TooLarge)
        ));
    }

    #[test]
    fn an_echoed_key_is_masked_in_error_bodies() {
        const KEY: &str = "sk-proj-Abc123_def456-XYZ";
        let mask = |body: &str| {
            let out = mask_key(Bytes::copy_from_slice(body.as_bytes()), KEY);
            String::from_utf8(out.to_vec()).unwrap()
        };
        assert_eq!(
            mask(&format!(
                r#"{{"error":{{"message":"Incorrect API key provided: {KEY}.","code":"invalid_api_key"}}}}"#
            )),
            r#"{"error":{"message":"Incorrect API key provided: ****","code":"invalid_api_key"}}"#
        );
        // Inside a longer key-shaped run, several times, at both ends.
        assert_eq!(
            mask(&format!("{KEY} Bearer x{KEY}y, key={KEY}")),
            "**** Bearer ****, key=****"
        );
        // Absent, or a key too short to look for: unchanged, not copied.
        let body = Bytes::from_static(b"{\"error\":\"sk-proj-****XYZ is wrong\"}");
        let out = mask_key(body.clone(), KEY);
        assert_eq!(out.as_ptr(), body.as_ptr());
        assert_eq!(mask_key(Bytes::from_static(b"abc"), "abc"), "abc");
    }

    #[test]
    fn a_key_spelled_with_json_escapes_is_masked_and_the_json_stays_valid() {
        const KEY: &str = "sk-abc/def_0123456789";
        let mask = |body: &str| String::from_utf8(masked(body.as_bytes(), KEY).unwrap()).unwrap();
        for spelled in [
            r"sk-abc\/def_0123456789",
            r"sk\u002dabc\/def_0123456789",
            r"sk\u002Dabc\u002fdef_0123456789",
            r"\u0073\u006b-abc/def_0123456789",
            r"sk-abc\/def_012345678\u0039",
        ] {
            let body =
                format!(r#"{{"error":{{"message":"bad key {spelled}\n(x)","key":"{spelled}"}}}}"#);
            let out = mask(&body);
            assert_eq!(
                out, r#"{"error":{"message":"bad key ****\n(x)","key":"****"}}"#,
                "{spelled}"
            );
            let v: serde_json::Value = serde_json::from_str(&out).expect("still JSON");
            assert!(!v.to_string().contains("0123456789"), "{spelled}");
        }
        // Escapes around the key go with it, never half of one.
        assert_eq!(
            mask(r#""\u0041sk-abc\/def_0123456789\u0042!""#),
            r#""****!""#
        );
        assert_eq!(mask(r#""\"sk-abc/def_0123456789\"""#), r#""\"****\"""#);
        // A backslash elsewhere, or a near miss: nothing to mask, nothing allocated.
        assert!(masked(br#"{"a":"x\/y","b":"sk-abc\/def_012345678"}"#, KEY).is_none());
        assert!(masked(br#""sk-abc\u00"#, KEY).is_none());
        assert!(masked(b"sk-abc/def_012345678", KEY).is_none());
    }

    #[test]
    fn relayed_answers_keep_only_the_listed_provider_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-type", "application/json"),
            ("x-ratelimit-remaining-requests", "99"),
            ("x-ratelimit-reset-tokens", "6ms"),
            ("anthropic-ratelimit-tokens-remaining", "1000"),
            ("retry-after", "2"),
            ("retry-after-ms", "1500"),
            ("openai-processing-ms", "321"),
            ("x-request-id", "upstream-id"),
            ("connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("content-length", "12"),
            ("content-encoding", "gzip"),
            ("server", "cloudflare"),
            ("cf-ray", "8f1e-AMS"),
            ("openai-organization", "org-secret"),
            ("strict-transport-security", "max-age=31536000"),
            ("x-envoy-upstream-service-time", "12"),
            ("x-ratelimit", "not-the-family"),
        ] {
            h.insert(k, HeaderValue::from_static(v));
        }
        h.append("set-cookie", HeaderValue::from_static("__cf_bm=a"));
        h.append("set-cookie", HeaderValue::from_static("_cfuvid=b"));
        h.append("x-ratelimit-limit-requests", HeaderValue::from_static("1"));
        h.append("x-ratelimit-limit-requests", HeaderValue::from_static("2"));
        let r = relay(StatusCode::CREATED, h, Body::empty());
        assert_eq!(r.status(), StatusCode::CREATED);
        let mut names: Vec<_> = r.headers().keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "anthropic-ratelimit-tokens-remaining",
                "content-type",
                "openai-processing-ms",
                "retry-after",
                "retry-after-ms",
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-tokens",
                "x-upstream-request-id",
            ]
        );
        assert_eq!(r.headers()["x-upstream-request-id"], "upstream-id");
        assert_eq!(
            r.headers()
                .get_all("x-ratelimit-limit-requests")
                .iter()
                .collect::<Vec<_>>(),
            ["1", "2"],
            "every value of a kept header"
        );
    }
}

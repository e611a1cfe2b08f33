//! Streams on their way to the client: the whole life of one after the status line.
//! Its opening (events that carry no content are held back until the first one that
//! does, or an error, docs/request-lifecycle.md#streams-the-commit-point), the commit, the
//! committed stream forwarded event by event (given the client's `model`, or translated),
//! the error event that ends a failed one, and the report of how it ended (stats, circuit,
//! the request log line). A stream whose route resumes
//! (docs/streaming.md#resume-after-commit) does not end itself on a failure the route would
//! resume: it stops, and tells the body that resumes it (`resume`) how it ended
//! ([`StreamReport`]).
//!
//! Nothing is buffered beyond the held-back prefix and one partial event, both
//! bounded by `--max-event-bytes`.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http_body_util::BodyDataStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, sleep_until};

use super::charge::charge;
use super::log::ResumeLog;
use super::outcome::may_advance;
use super::relay::{mask_keys, masked_any, relay};
use crate::config::snapshot::{CredentialRt, RouteRt, TargetRt};
use crate::config::target::TargetState;
use crate::limits::answers::Refusals;
use crate::limits::circuit::Transition;
use crate::limits::clients::{ClientUsage, HeldReservation, Reserved};
use crate::observe::cost::Pricing;
use crate::observe::counters::{self, RouteCounters, RouteTargetCounters};
use crate::observe::genai::{At, NO_RESPONSE_MODEL, Streamed};
use crate::observe::reason::Reason;
use crate::providers::Dialect;
use crate::providers::classify::classify_status;
use crate::providers::translate::{StreamTranslator, Translation};
use crate::upstream::Incoming;
use crate::wire::content;
use crate::wire::rewrite::{JsonStr, answer_model, replace_model_into};
use crate::wire::sse::{self, EventTooLarge, Framer, Opening, StreamError};
use crate::wire::surface::Surface;
use crate::wire::usage::{self, Usage};
use switchback_crds::config::Fallback;

/// Whether `route` resumes the streams of a client of `surface`: chat completions
/// and messages streams, when the route asks for it.
pub(crate) fn resumes(route: &RouteRt, surface: Surface) -> bool {
    matches!(surface, Surface::ChatCompletions | Surface::Messages)
        && route
            .spec
            .stream
            .as_ref()
            .is_some_and(|s| s.resume.is_some())
}

/// What a committed stream under a resuming body tells it, once, when it ends.
#[derive(Debug)]
pub(crate) struct StreamReport {
    /// The route's `fallback`: which failures after commit are resumed.
    fallback: Fallback,
    end: OnceLock<AttemptEnd>,
}

/// How one committed attempt ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttemptEnd {
    /// The usage its provider reported (the largest count of each kind).
    pub usage: Usage,
    /// Why it failed, if it did.
    pub failure: Option<(Reason, Option<u16>)>,
    /// It stopped on that failure without telling the client (a failure the route
    /// resumes); otherwise the client had the error event, or the provider's.
    pub held: bool,
    /// Its usage was estimated, not (all) reported.
    pub estimated: bool,
}

impl StreamReport {
    pub(crate) fn new(fallback: Fallback) -> Self {
        Self {
            fallback,
            end: OnceLock::new(),
        }
    }

    /// Whether a failure after commit is resumed rather than ending the stream: one
    /// that would have failed over before the commit (a break, a stall, an in-band
    /// error of a class the route fails over on), not one that speaks about the
    /// request.
    pub(crate) fn resumes(&self, reason: Reason, status: Option<u16>) -> bool {
        !reason.returns_upstream_answer() && may_advance(reason, status, &self.fallback)
    }

    pub(crate) fn ended(&self, end: AttemptEnd) {
        let _ = self.end.set(end);
    }

    /// How the attempt ended, once it has.
    pub(crate) fn end(&self) -> Option<AttemptEnd> {
        self.end.get().copied()
    }
}

/// On a committed stream's response, for the walk's hook: the stream reports to a
/// resuming body.
#[derive(Clone, Debug)]
pub(crate) struct Resuming(pub Arc<StreamReport>);

/// A stream's upstream body, chunk by chunk as it arrives.
pub(crate) type Upstream = BodyDataStream<Incoming>;

/// What the upstream's stream yields: a piece of the answer as read, or why it stopped.
pub(crate) type Chunk = Result<Bytes, crate::upstream::Error>;

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
/// `upstream_api`: the dialect of an upstream that speaks another API than the
/// client (its framing, its events); `None` when it speaks the client's.
pub(crate) async fn open<U>(
    mut upstream: U,
    max_event: usize,
    surface: Surface,
    upstream_api: Option<&'static dyn Dialect>,
) -> Result<Opened<U>, crate::upstream::Error>
where
    U: futures_util::Stream<Item = Chunk> + Unpin,
{
    let mut framer = match upstream_api {
        Some(d) => d.framer(max_event),
        None => Framer::new(max_event),
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
        // upstream's own API (a translated upstream's chunk is not the client's).
        let opening = match (surface, upstream_api) {
            (Surface::Responses, _) | (_, None) => sse::opening_for(surface, &ev),
            (_, Some(d)) => d.opening(&ev),
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
    /// Set when the upstream speaks another API: the translation, the client's
    /// model name and whether the client asked for usage.
    pub translator: Option<(Translation, &'a str, bool)>,
    /// The concurrency slot, held until the stream ends.
    pub permit: Option<OwnedSemaphorePermit>,
    /// The LLMClient whose usage the stream's events count to.
    pub client: Option<ClientUsage>,
    /// The target's prices, to charge its usage with.
    pub pricing: Pricing,
    /// Drop the usage-only chunk (asked for on the client's behalf).
    pub strip_usage: bool,
    /// The request's budget reservation, taken when the stream commits.
    pub reservation: Option<&'a HeldReservation>,
    /// The request body's size: the prompt's estimate (bytes / 4), should the usage
    /// have to be estimated.
    pub prompt_bytes: usize,
    /// When the try started, and where its GenAI metrics go.
    pub started: Instant,
    pub genai: At,
}

/// How long a stream whose content has ended is read on for its usage after the
/// client went away (docs/tenancy.md#a-client-that-leaves-still-pays).
pub(crate) const READ_ON: Duration = Duration::from_secs(10);

/// Why a 2xx stream was not committed.
pub(crate) enum NotCommitted {
    /// The attempt's deadline passed before the first content event.
    TimedOut,
    /// A failure of the attempt (with the in-band error's status, if it was one).
    Failed(Reason, Option<u16>),
}

/// A 2xx stream: hold back its opening until the first content event (or an error)
/// within `deadline`, then commit it (docs/request-lifecycle.md#streams-the-commit-point).
/// A stream without content, an opening over the event size limit, or an in-band error the
/// chain may move past is not committed; an in-band error that speaks about the request
/// (context length, auth, another 4xx) and that the route does not advance on is relayed in
/// the stream, as the provider sent it, after the held-back events.
pub(crate) async fn start_stream(
    status: StatusCode,
    mut headers: HeaderMap,
    response: Incoming,
    deadline: Instant,
    a: StreamAttempt<'_>,
) -> Result<(Response<Body>, Arc<LineSlot>), NotCommitted> {
    // A body that reads its own connection has every chunk already read at hand: no
    // turns of the event loop to wait for one (see `CommittedStream::poll_next`).
    let turns = if response.drives_its_connection() {
        0
    } else {
        EMPTY_TURNS
    };
    let opened = tokio::time::timeout_at(
        deadline,
        open(
            BodyDataStream::new(response),
            a.max_event_bytes,
            a.surface,
            a.translator.map(|(t, _, _)| t.upstream()),
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
            mask_keys(first, a.target.credential.keys.secrets())
        }
        None => first,
    };
    let line = Arc::new(LineSlot::default());
    let state = committed(upstream, framer, turns, a, line.clone());
    let report = state.report.clone();
    if state.translator.is_some() {
        // The proxy writes a translated stream's events itself, as SSE, whatever
        // framing the upstream used (a binary one included).
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
    }
    let mut response = commit_stream(status, headers, &held, &first, state);
    if let Some(report) = report {
        // For the walk's resume hook, which wraps the body (only routes that resume).
        response.extensions_mut().insert(Resuming(report));
    }
    Ok((response, line))
}

/// What a committed stream carries to its end: the upstream and its framer, the
/// client's `model` or the translation, the idle limit, the counters, slots and
/// client it holds, and its verdict's [`Ending`].
fn committed<U>(
    upstream: U,
    framer: Framer,
    hand_over_turns: u8,
    a: StreamAttempt<'_>,
    line: Arc<LineSlot>,
) -> Committed<U> {
    let (t, route) = (a.target, a.route);
    let cb = &route.spec.circuit_breaker;
    // Only a route that resumes allocates anything for it.
    let report =
        resumes(route, a.surface).then(|| Arc::new(StreamReport::new(route.spec.fallback.clone())));
    let policy = route.spec.stream.as_ref();
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
        // Under a resuming body, the body writes the line when the answer ends.
        line: report.is_none().then_some(line),
        estimated: false,
        genai: Some(GenAiStream {
            at: a.genai,
            response_model: NO_RESPONSE_MODEL,
            look: GenAiStream::LOOK,
            started: a.started,
            first: a.started.elapsed(),
            usage: Usage::default(),
        }),
    };
    Committed {
        upstream,
        framer,
        model: a.model.clone(),
        surface: a.surface,
        translator: a
            .translator
            .map(|(d, model, usage)| StreamTranslator::new(d, model, usage)),
        // A committed stream that sends nothing for this long has stalled:
        // `spec.stream.idleTimeout`, else the attempt's timeout.
        idle: Duration::from_millis(
            policy
                .and_then(|p| p.idle_timeout_ms)
                .or(t.spec.timeout_ms)
                .unwrap_or(route.spec.timeout_ms),
        ),
        counters: t.counters.clone(),
        credential: Some(t.credential.clone()),
        permit: a.permit,
        reserved: a.reservation.and_then(|r| r.take()),
        prompt_estimate: (a.prompt_bytes as u64).div_ceil(4),
        client: a.client,
        pricing: a.pricing,
        strip_usage: a.strip_usage,
        reported: Usage::default(),
        relayed: Relayed::default(),
        ending: Some(ending),
        done: false,
        report,
        held: false,
        hand_over_turns,
    }
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

/// A stream's request log line, written once the stream has ended; with what the
/// resumes of a resuming route's stream add to it.
/// Its last argument: the stream's usage was estimated, not reported
/// (docs/troubleshooting.md#usage-marked-estimated).
pub type LogLine = Box<dyn FnOnce(StreamEnd, Option<ResumeLog>, bool) + Send>;

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
    Ended(StreamEnd, Option<ResumeLog>, bool),
    Written,
}

impl LineSlot {
    /// The server's half: the line to write when the stream ends.
    pub fn write_when_ended(&self, line: LogLine) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *g, Slot::Written) {
            Slot::Ended(end, resume, estimated) => {
                drop(g);
                line(end, resume, estimated);
            }
            Slot::Empty => *g = Slot::Line(line),
            other => *g = other,
        }
    }

    /// The stream's half: it ended so.
    pub(super) fn ended(&self, end: StreamEnd, resume: Option<ResumeLog>, estimated: bool) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *g, Slot::Written) {
            Slot::Line(line) => {
                drop(g);
                line(end, resume, estimated);
            }
            Slot::Empty => *g = Slot::Ended(end, resume, estimated),
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
    /// The request log line, written when the stream ends; `None` under a resuming
    /// body, which writes it (and counts the route's failure) when the answer ends.
    pub line: Option<Arc<LineSlot>>,
    /// The stream's usage was estimated (docs/troubleshooting.md#usage-marked-estimated),
    /// as its log line says.
    pub estimated: bool,
    /// What the GenAI metrics are told at its end (`None` in tests).
    pub genai: Option<GenAiStream>,
}

/// What a committed stream tells the GenAI metrics (`observe::genai`) at its end.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GenAiStream {
    pub at: At,
    /// The slot of the model its events name, once one did.
    pub response_model: u8,
    /// Events still looked at for it (a provider that names none, Bedrock, is not
    /// searched to the end).
    pub look: u8,
    pub started: Instant,
    /// From the try's start to its commit, at the first content event.
    pub first: Duration,
    /// What its provider reported (the largest count of each kind).
    pub usage: Usage,
}

impl GenAiStream {
    const LOOK: u8 = 4;

    /// Told at the stream's end: how it went, in the target's GenAI metrics.
    fn tell(&self, counters: &RouteTargetCounters, failure: Option<Reason>, completed: bool) {
        let duration = self.started.elapsed();
        match failure {
            Some(reason) => counters.genai.failed(self.at, reason, duration),
            None => counters.genai.streamed(
                self.at,
                self.response_model,
                Streamed {
                    duration,
                    first: self.first,
                    completed,
                    usage: (self.usage != Usage::default()).then_some(self.usage),
                },
            ),
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if let Some(g) = &self.genai {
            g.tell(&self.counters, self.failure.map(|f| f.0), self.completed);
        }
        let end = match self.failure {
            Some((reason, status)) => {
                self.counters.failures.inc(reason);
                if self.line.is_some() {
                    counters::inc(&self.route.failed);
                }
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
        if let Some(line) = &self.line {
            line.ended(end, None, self.estimated);
        }
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

/// What a billed client's stream relayed of the answer, and whether its usage is in
/// (docs/tenancy.md#a-client-that-leaves-still-pays): what a client that walks away
/// mid-answer is charged from.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Relayed {
    /// Bytes of content (text, arguments, reasoning) sent to the client.
    pub content_bytes: u64,
    /// An event said the content is over (what follows is the usage and the end).
    pub content_ended: bool,
    /// A usage report came with or after the end of the content: the final one.
    pub usage_final: bool,
    /// What was estimated on top of the reports (see `Committed::estimate`).
    pub estimated: Usage,
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
    /// The LLMClient whose usage the events count to, and the target's prices.
    pub client: Option<ClientUsage>,
    pub pricing: Pricing,
    /// The request's budget reservation, settled once the stream's usage is in.
    pub reserved: Option<Reserved>,
    /// The prompt's size in tokens, estimated (request bytes / 4).
    pub prompt_estimate: u64,
    /// Drop the usage-only chunk: the client did not ask for it.
    pub strip_usage: bool,
    /// The usage reported so far (the largest count seen of each kind).
    pub reported: Usage,
    /// What the client was sent of the answer (billed clients only).
    pub relayed: Relayed,
    pub ending: Option<Ending>,
    pub done: bool,
    /// Set when the route resumes: a failure it would resume stops the stream
    /// without the error event, and how the attempt ended is told here.
    pub report: Option<Arc<StreamReport>>,
    /// The stream stopped on a failure the client has not been told of (resume).
    pub held: bool,
    /// Event-loop turns a chunk of forwarded events waits for more of the upstream's
    /// before it is sent: [`EMPTY_TURNS`] when another task hands the upstream's body
    /// over, 0 when reading it reads the connection.
    pub hand_over_turns: u8,
}

impl<U> Committed<U> {
    /// One upstream event on its way to the client, appended to `out`: usage
    /// counted, an in-band error noted, then either translated into the client's
    /// API or given the client's `model` name. May append nothing (an event the
    /// client's API has no counterpart for).
    fn forward(&mut self, ev: &[u8], out: &mut BytesMut) {
        if let Some(g) = self.ending.as_mut().and_then(|e| e.genai.as_mut())
            && g.look > 0
        {
            g.look -= 1;
            if let Some(m) = answer_model(ev) {
                g.response_model = self.counters.genai.response_model(Some(m));
                g.look = 0;
            }
        }
        let mark = out.len();
        let usage = self.forward_counted(ev, out);
        // Only a billed client's stream is read for what it relayed.
        if self.client.is_some() {
            let sent = &out[mark..];
            let r = &mut self.relayed;
            r.content_bytes += content::content_len(self.surface, sent);
            r.content_ended = r.content_ended || content::ends_content(self.surface, sent);
            r.usage_final = r.usage_final || (usage && r.content_ended);
        }
    }

    /// [`Self::forward`]'s work; whether the event reported usage.
    fn forward_counted(&mut self, ev: &[u8], out: &mut BytesMut) -> bool {
        let usage = match &self.translator {
            Some(t) => t.upstream().usage(ev),
            None => usage::usage(ev),
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
            if let Some(g) = self.ending.as_mut().and_then(|e| e.genai.as_mut()) {
                g.usage = self.reported;
            }
            charge(
                &self.counters,
                &self.pricing,
                self.client.as_ref(),
                new,
                false,
            );
            // Asked for on the client's behalf: counted, not forwarded.
            if self.strip_usage && is_usage_only(ev) {
                return true;
            }
        }
        // Cheap test first: most events never mention an error.
        let without_key;
        let mut ev = ev;
        if ERROR_WORD.find(ev).is_some() {
            if let Some(e) = sse::error_event_for(self.surface, ev) {
                let (reason, status) = (classify_status(e.status, &e.body), Some(e.status));
                if self.stop_to_resume(reason, status) {
                    return usage.is_some();
                }
                self.fail(reason, status);
            }
            // Relayed like an error body: without the key, should it echo it.
            if let Some(c) = self.credential.as_ref()
                && let Some(m) = masked_any(ev, c.keys.secrets())
            {
                without_key = m;
                ev = &without_key;
            }
        }
        match &mut self.translator {
            None => replace_model_into(ev, &self.model, out),
            Some(t) => t.event(ev, out),
        }
        usage.is_some()
    }

    /// Every whole event the framer holds forwarded into `out`; one over the size
    /// limit ends the stream. The framer is taken out for the loop: its events are
    /// read in place while `forward` borrows the rest of the state.
    fn forward_framed(&mut self, out: &mut BytesMut) {
        let mut framer = std::mem::take(&mut self.framer);
        // Stopped to be resumed: nothing after the failure is the client's.
        while !self.done {
            match framer.next_in_place() {
                Ok(Some(ev)) => self.forward(ev, out),
                Ok(None) => break,
                Err(EventTooLarge) => {
                    self.refused();
                    self.abort(
                        Reason::EventTooLarge,
                        "an upstream event was larger than the proxy's event size limit",
                        out,
                    );
                    break;
                }
            }
        }
        self.framer = framer;
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

    /// A failure the route resumes, under a resuming body: the stream stops here,
    /// without the error event (the body continues the answer elsewhere, or ends it
    /// with the error event itself).
    fn stop_to_resume(&mut self, reason: Reason, status: Option<u16>) -> bool {
        if !self
            .report
            .as_ref()
            .is_some_and(|r| r.resumes(reason, status))
        {
            return false;
        }
        self.done = true;
        self.held = true;
        self.fail(reason, status);
        self.permit = None;
        true
    }

    /// How the attempt ended, told to a resuming body (once, as the stream ends).
    fn tell(&self) {
        if let Some(r) = &self.report {
            r.ended(AttemptEnd {
                usage: self.reported,
                failure: self.ending.as_ref().and_then(|e| e.failure),
                held: self.held,
                estimated: self.ending.as_ref().is_some_and(|e| e.estimated),
            });
        }
    }

    /// The stream is over for its client (it ended, failed, or the client went
    /// away) without the usage that ends an answer: what the client was sent is
    /// charged from the prompt and the content relayed (bytes / 4), on top of what
    /// was reported, and marked estimated (docs/troubleshooting.md#usage-marked-estimated).
    /// Nothing relayed, nothing charged; a second call charges nothing more.
    fn estimate(&mut self) {
        let Some(c) = &self.client else {
            return;
        };
        let r = self.relayed;
        if r.usage_final || r.content_bytes == 0 {
            return;
        }
        let have = Usage {
            input_tokens: self.reported.input_tokens + r.estimated.input_tokens,
            output_tokens: self.reported.output_tokens + r.estimated.output_tokens,
        };
        let new = Usage {
            // A reported input count (Anthropic's `message_start`) is the real one.
            input_tokens: if have.input_tokens == 0 {
                self.prompt_estimate
            } else {
                0
            },
            output_tokens: r
                .content_bytes
                .div_ceil(4)
                .saturating_sub(have.output_tokens),
        };
        if new == Usage::default() {
            return;
        }
        // Kept apart from `reported`: a resumed answer's usage, as its client sees
        // it, sums what the providers reported.
        self.relayed.estimated.input_tokens += new.input_tokens;
        self.relayed.estimated.output_tokens += new.output_tokens;
        charge(&self.counters, &self.pricing, Some(c), new, true);
        if let Some(e) = &mut self.ending {
            e.estimated = true;
        }
    }

    /// The client went away before the stream ended
    /// (docs/tenancy.md#a-client-that-leaves-still-pays). A stream whose content has ended
    /// is read on for the usage that follows, in a task of its own, for up to [`READ_ON`],
    /// forwarding nothing; one left mid-answer is cancelled at once (dropped with `self`)
    /// and its usage estimated. The reservation settles, the verdict is counted and the log
    /// line written, when that is done.
    fn left_by_client(mut self)
    where
        U: futures_util::Stream<Item = Chunk> + Unpin + Send + 'static,
    {
        let Some(c) = &self.client else {
            return;
        };
        if !self.done && self.relayed.content_ended && !self.relayed.usage_final {
            let settling = c.settling().clone();
            settling.spawn(self.read_on());
            return;
        }
        self.estimate();
        self.tell();
    }

    /// Reads the rest of a stream its client left after the content, for its usage.
    async fn read_on(mut self)
    where
        U: futures_util::Stream<Item = Chunk> + Unpin,
    {
        let deadline = Instant::now() + READ_ON;
        let mut sink = BytesMut::new();
        while !self.done && !self.relayed.usage_final {
            match tokio::time::timeout_at(deadline, self.upstream.next()).await {
                Ok(Some(Ok(chunk))) => {
                    self.framer.push(&chunk);
                    self.forward_framed(&mut sink);
                    sink.clear();
                }
                Ok(None) => {
                    if let Some(tail) = self.framer.take_rest() {
                        self.forward(&tail, &mut sink);
                    }
                    break;
                }
                Ok(Some(Err(_))) | Err(_) => break,
            }
        }
        self.estimate();
        self.tell();
    }

    /// End the stream with the error event.
    fn abort(&mut self, reason: Reason, message: &str, out: &mut BytesMut) {
        if self.stop_to_resume(reason, None) {
            return;
        }
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

/// Has the idle `deadline` passed? The timer is moved only when it fires before the
/// real deadline (arriving data moves the deadline, not the timer); `false` leaves it
/// armed to wake the task.
fn stalled(
    timer: &mut std::pin::Pin<Box<tokio::time::Sleep>>,
    deadline: Instant,
    cx: &mut std::task::Context<'_>,
) -> bool {
    loop {
        if timer.as_mut().poll(cx).is_pending() {
            return false;
        }
        if Instant::now() >= deadline {
            return true;
        }
        timer.as_mut().reset(deadline);
    }
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
pub(crate) struct CommittedStream<U = Upstream>
where
    U: futures_util::Stream<Item = Chunk> + Unpin + Send + 'static,
{
    /// Taken when the client goes away first (see [`Committed::left_by_client`]).
    state: Option<Committed<U>>,
    /// Forwarded, not yet sent: the opening, checked before commit, or events
    /// held while the upstream's connection task is let run (see `poll_next`).
    pending: BytesMut,
    /// Event-loop turns since the last upstream chunk while holding events.
    empty_turns: u8,
    idle_since: Instant,
    idle_timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<U> CommittedStream<U>
where
    U: futures_util::Stream<Item = Chunk> + Unpin + Send + 'static,
{
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
            state: Some(state),
        }
    }
}

impl<U> Drop for CommittedStream<U>
where
    U: futures_util::Stream<Item = Chunk> + Unpin + Send + 'static,
{
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            state.left_by_client();
        }
    }
}

impl<U> futures_util::Stream for CommittedStream<U>
where
    U: futures_util::Stream<Item = Chunk> + Unpin + Send + 'static,
{
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        let Some(st) = this.state.as_mut() else {
            return Poll::Ready(None);
        };
        let mut out = std::mem::take(&mut this.pending);
        loop {
            st.forward_framed(&mut out);
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
                        if this.empty_turns < st.hand_over_turns {
                            this.empty_turns += 1;
                            this.pending = out;
                            cx.waker().wake_by_ref();
                            return Poll::Pending;
                        }
                        break;
                    }
                    // Nothing to send and nothing arriving: is the stream stalled?
                    if !stalled(&mut this.idle_timer, this.idle_since + st.idle, cx) {
                        return Poll::Pending;
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
            // Ended: the usage is in (or estimated), the reservation settles, and
            // the verdict is in: report it now rather than when the client's
            // connection lets go of the body.
            st.estimate();
            st.reserved = None;
            st.tell();
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
        type Item = Chunk;

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
            pricing: Default::default(),
            reserved: None,
            prompt_estimate: 0,
            strip_usage: false,
            reported: Default::default(),
            relayed: Default::default(),
            ending,
            done: false,
            report: None,
            held: false,
            // Scripted like hyper-util's body, handed over by another task.
            hand_over_turns: EMPTY_TURNS,
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
            line: Some(v.line.clone()),
            estimated: false,
            genai: None,
        };
        (e, v)
    }

    /// A log line that records how the stream ended, and whether it was written.
    fn line(slot: &LineSlot) -> Arc<std::sync::Mutex<Option<StreamEnd>>> {
        let seen = Arc::new(std::sync::Mutex::new(None));
        let s = seen.clone();
        slot.write_when_ended(Box::new(move |end, _, _| *s.lock().unwrap() = Some(end)));
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
            assert!(body.state.as_ref().unwrap().framer.buffered() <= LIMIT + 4096);
            text.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.ends_with("\n\n") && text.contains("stream_interrupted"),
            "{text}"
        );
        assert!(
            body.state.as_ref().unwrap().upstream.chunks.len() > 9_000,
            "stopped reading at the limit"
        );
        assert_eq!(
            body.state.as_ref().unwrap().framer.buffered(),
            0,
            "buffer freed"
        );
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
}

//! Unary answers: a 2xx read whole, within `--max-response-bytes` and the replica's
//! answer budget (`--max-inflight-response-bytes`), checked, counted, given the
//! client's `model` or translated, and handed to the client with its reservation
//! (given back with the last byte).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::BodyDataStream;
use tokio::time::Instant;

use super::attempt::{Attempt, Attempted, Failure, UpstreamAnswer, timed_out};
use super::call::Call;
use super::charge::charge;
use super::relay::{self, relay};
use crate::config::snapshot::TargetRt;
use crate::gateway::Gateway;
use crate::limits::bytes::{Budget, Held};
use crate::observe::reason::Reason;
use crate::providers::translate::{self, Translation};
use crate::upstream::Incoming;
use crate::wire::json;
use crate::wire::rewrite::{answer_model, replace_model};
use crate::wire::usage;

/// A unary answer's read within the attempt's deadline ([`Capping`]), as the
/// bytes and their reservation, or why it is unusable (a limit's refusal counted).
pub(super) fn capped(
    a: &Attempt<'_, '_>,
    read: Result<Result<Capped, crate::upstream::Error>, tokio::time::error::Elapsed>,
) -> Result<(Bytes, AnswerHeld), Reason> {
    let refused = &a.gw.refused;
    match read {
        Err(_) => Err(timed_out(a.budget)),
        Ok(Err(_)) => Err(Reason::ConnectionError),
        Ok(Ok(Capped::TooLarge)) => {
            refused.responses.fetch_add(1, Ordering::Relaxed);
            Err(Reason::ResponseTooLarge)
        }
        Ok(Ok(Capped::OverBudget)) => {
            refused.over_budget.fetch_add(1, Ordering::Relaxed);
            Err(Reason::Overloaded)
        }
        Ok(Ok(Capped::Whole(bytes, held))) => Ok((bytes, held)),
    }
}

/// A unary 2xx, read whole (within `--max-response-bytes` and the answer budget):
/// usage counted, then given the client's `model` or
/// translated into the client's API. One the client could not use (truncated, HTML,
/// not JSON, not translatable) is the provider's failure, before anything is
/// committed.
pub(super) fn unary(
    a: &Attempt<'_, '_>,
    status: StatusCode,
    headers: HeaderMap,
    bytes: Bytes,
    held: AnswerHeld,
) -> Attempted {
    let (t, call) = (a.target, a.call);
    let translation = a.plan.translation;
    // A translation parses the answer anyway; only a relayed one needs the check.
    // Is it one whole JSON object (what every unary answer of both APIs is)? A scan
    // that builds nothing: see `json`.
    if translation.is_none() && !json::is_object(&bytes) {
        return Attempted::Failed(Failure::bare(Reason::InvalidResponse));
    }
    let usage = match translation {
        Some(tr) => tr.upstream().usage(&bytes),
        None => usage::usage(&bytes),
    };
    // The model the answer names, before the client's name replaces it.
    let response_model = t.counters.genai.response_model(answer_model(&bytes));
    if let Some(u) = usage {
        charge(&t.counters, &t.pricing, call.client, u, false);
        tracing::Span::current()
            .record("gen_ai.usage.input_tokens", u.input_tokens)
            .record("gen_ai.usage.output_tokens", u.output_tokens);
    }
    // A prompt the provider's filters blocked is a 200 without an answer: the
    // request's fault, like a content filter's 400, answered (translated: no
    // content, stopped as a refusal) unless the route fails over on `contentFilter`.
    let blocked = translation.is_some_and(|tr| translate::is_blocked(tr, &bytes));
    let (model_json, model) = call.answer_model(a.route, t);
    let bytes = match translation {
        None => replace_model(&bytes, model_json).unwrap_or(bytes),
        Some(tr) => match translate::response(tr, &bytes, model) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(target = %t.label, error = %e, "untranslatable upstream answer");
                return Attempted::Failed(Failure::bare(Reason::InvalidResponse));
            }
        },
    };
    if blocked {
        return Attempted::Failed(Failure {
            reason: Reason::ContentFilter,
            status: Some(status.as_u16()),
            retry_after: None,
            answer: Some(UpstreamAnswer {
                status,
                headers,
                body: bytes,
            }),
        });
    }
    let genai = &t.counters.genai;
    let at = genai.at(call.surface.operation(), t.model(call.client_model));
    genai.answered_unary(at, response_model, a.started.elapsed(), usage);
    // The reservation goes with the answer until its last byte is handed on.
    let body = Body::new(HeldAnswer::new(bytes, held));
    Attempted::Committed(relay(status, headers, body), None)
}

/// A unary answer's reservation in the answer budget (`--max-inflight-response-bytes`).
pub(crate) type AnswerHeld = Held<Arc<Budget>>;

/// What [`Capping::read`] made of a unary answer.
pub(crate) enum Capped {
    /// The whole answer, and its bytes' reservation in the answer budget.
    Whole(Bytes, AnswerHeld),
    /// Over `--max-response-bytes` (what was read is dropped at once).
    TooLarge,
    /// Does not fit in what is left of the answer budget (likewise dropped).
    OverBudget,
}

/// A unary answer being read whole, up to `cap` bytes, every byte of buffer it
/// takes reserved in the answer budget first: the answer's declared length up
/// front, else the buffer as it grows (doubling, never past `cap`). Everything read
/// so far is kept here between awaits, so a read dropped half-way (the client went
/// away, see [`Unanswered`]) can be taken up again where it stopped.
pub(crate) struct Capping {
    body: BodyDataStream<Incoming>,
    cap: usize,
    declared: usize,
    /// Taken with the whole answer.
    held: Option<AnswerHeld>,
    /// The first chunk, kept as it is until a second comes (the usual answer
    /// arrives in one: handed on without a copy).
    first: Option<Bytes>,
    /// A Vec, whose `reserve_exact` keeps to what the budget covers.
    buf: Vec<u8>,
}

/// Reads a unary answer whole in one go ([`Capping`] without taking it up again):
/// for answers no client waits on, such as media fetched for a target.
pub(crate) async fn read_capped(
    response: Incoming,
    cap: usize,
    budget: &Arc<Budget>,
) -> Result<Capped, crate::upstream::Error> {
    match Capping::start(response, cap, budget) {
        Ok(mut capping) => capping.read().await,
        Err(refused) => Ok(refused),
    }
}

impl Capping {
    /// Starts reading `response`; a declared length over `cap` is refused before
    /// reading a byte, one over the budget's room likewise.
    pub(crate) fn start(
        response: Incoming,
        cap: usize,
        budget: &Arc<Budget>,
    ) -> Result<Self, Capped> {
        let declared = hyper::body::Body::size_hint(&response).exact();
        if declared.is_some_and(|n| n > cap as u64) {
            return Err(Capped::TooLarge);
        }
        let declared = declared.map_or(0, |n| n as usize);
        let mut held = Held::new(budget.clone());
        if !held.grow(declared) {
            return Err(Capped::OverBudget);
        }
        Ok(Self {
            body: BodyDataStream::new(response),
            cap,
            declared,
            held: Some(held),
            first: None,
            buf: Vec::new(),
        })
    }

    /// Reads on to the end of the answer.
    pub(crate) async fn read(&mut self) -> Result<Capped, crate::upstream::Error> {
        loop {
            let Some(chunk) = self.body.next().await.transpose()? else {
                // Read once to its end: taken again, it has nothing more to give.
                let Some(held) = self.held.take() else {
                    return Ok(Capped::TooLarge);
                };
                let whole = match self.first.take() {
                    Some(first) => first,
                    None => Bytes::from(std::mem::take(&mut self.buf)),
                };
                return Ok(Capped::Whole(whole, held));
            };
            if let Some(refused) = self.take(chunk) {
                return Ok(refused);
            }
        }
    }

    /// One more chunk of the answer, or why the answer is refused.
    fn take(&mut self, chunk: Bytes) -> Option<Capped> {
        if self.first.is_none() && self.buf.is_empty() {
            if chunk.len() > self.cap {
                return Some(Capped::TooLarge);
            }
            if !self.held.as_mut().is_some_and(|h| h.grow_to(chunk.len())) {
                return Some(Capped::OverBudget);
            }
            self.first = Some(chunk);
            return None;
        }
        if let Some(first) = self.first.take()
            && let Some(refused) = self.append(&first)
        {
            return Some(refused);
        }
        self.append(&chunk)
    }

    fn append(&mut self, chunk: &[u8]) -> Option<Capped> {
        let buf = &mut self.buf;
        if chunk.len() > self.cap.saturating_sub(buf.len()) {
            return Some(Capped::TooLarge);
        }
        let need = buf.len() + chunk.len();
        if need > buf.capacity() {
            // Room for the declared length at once, else double: amortised copies,
            // and the budget always covers the whole buffer.
            let room = need
                .max(self.declared)
                .max(buf.capacity() * 2)
                .min(self.cap);
            if !self.held.as_mut().is_some_and(|h| h.grow_to(room)) {
                return Some(Capped::OverBudget);
            }
            buf.reserve_exact(room - buf.len());
        }
        buf.extend_from_slice(chunk);
        None
    }
}

/// A unary try in flight for a client that is billed
/// (docs/tenancy.md#a-client-that-leaves-still-pays). The upstream call is polled through
/// here (its response future, then the answer's read), so that when the client goes away
/// meanwhile (the call is dropped with `Call::abandoned` set) what is in flight is handed
/// to a continuation: it reads the answer to its end, within the try's deadline and the
/// response size limit, forwards nothing, and counts its usage, keeping the request's
/// reservation until then. Dropped for any other reason (a timeout, a hedge lost), the
/// upstream call is cancelled as before.
pub(super) struct Unanswered<'a, 'c> {
    call: &'a Call<'c>,
    target: &'a TargetRt,
    gw: &'a Gateway,
    translation: Option<Translation>,
    deadline: Instant,
    pub response: Option<ResponseFuture>,
    pub reading: Option<Capping>,
}

/// The upstream response on its way (hyper-util's future: boxed, so `Unpin`).
pub(super) type ResponseFuture = crate::upstream::ResponseFuture;

impl<'a, 'c> Unanswered<'a, 'c> {
    pub(super) fn new(a: &Attempt<'a, 'c>) -> Self {
        Self {
            call: a.call,
            target: a.target,
            gw: a.gw,
            translation: a.plan.translation,
            deadline: a.deadline,
            response: None,
            reading: None,
        }
    }
}

impl Drop for Unanswered<'_, '_> {
    fn drop(&mut self) {
        if self.response.is_none() && self.reading.is_none() {
            return;
        }
        // A stream left before its first content produced nothing the client had:
        // cancelled, as before.
        let Some(client) = self.call.client.filter(|_| !self.call.stream) else {
            return;
        };
        if !self.call.abandoned.load(Ordering::Acquire) {
            return;
        }
        let (response, reading) = (self.response.take(), self.reading.take());
        let reserved = self.call.reservation.and_then(|r| r.take());
        let client = client.clone();
        let counters = self.target.counters.clone();
        let pricing = self.target.pricing;
        let at = counters.genai.at(
            self.call.surface.operation(),
            self.target.model(self.call.client_model),
        );
        let (translation, deadline) = (self.translation, self.deadline);
        let cap = self.gw.upstream_limits.max_response_bytes;
        let answers = self.gw.answers.clone();
        let label = self.target.label.clone();
        client.settling().clone().spawn(async move {
            // Settles once the answer is counted.
            let _reserved = reserved;
            let reading = match (reading, response) {
                (Some(r), _) => r,
                (None, Some(future)) => match tokio::time::timeout_at(deadline, future).await {
                    Ok(Ok(r)) if r.status().is_success() && !relay::is_encoded(r.headers()) => {
                        match Capping::start(r.into_body(), cap, &answers) {
                            Ok(c) => c,
                            Err(_) => return,
                        }
                    }
                    // An error answer carries no usage; nothing came, nothing to count.
                    _ => return,
                },
                (None, None) => return,
            };
            let mut reading = reading;
            let Ok(Ok(Capped::Whole(bytes, _held))) =
                tokio::time::timeout_at(deadline, reading.read()).await
            else {
                return;
            };
            let usage = match translation {
                Some(tr) => tr.upstream().usage(&bytes),
                None => usage::usage(&bytes),
            };
            if let Some(u) = usage {
                charge(&counters, &pricing, Some(&client), u, false);
                let response_model = counters.genai.response_model(answer_model(&bytes));
                counters.genai.tokens(at, response_model, u);
            }
            tracing::debug!(target_credential = %label, client = &*client.client.label,
                input_tokens = usage.map(|u| u.input_tokens),
                output_tokens = usage.map(|u| u.output_tokens),
                "counted the answer of a unary call its client walked away from");
        });
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

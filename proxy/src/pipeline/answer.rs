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
use hyper::body::Incoming;

use super::attempt::{Attempt, Attempted, Failure, UpstreamAnswer, timed_out};
use super::relay::relay;
use crate::limits::bytes::{Budget, Held};
use crate::observe::reason::Reason;
use crate::providers::translate;
use crate::wire::json;
use crate::wire::rewrite::replace_model;
use crate::wire::usage;

/// A unary answer's read within the attempt's deadline (`read_capped`), as the
/// bytes and their reservation, or why it is unusable (a limit's refusal counted).
pub(super) fn capped(
    a: &Attempt<'_, '_>,
    read: Result<Result<Capped, hyper::Error>, tokio::time::error::Elapsed>,
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
    if let Some(u) = usage {
        t.counters.add_usage(u);
        if let Some(c) = call.client {
            c.record(u, t.spec.price.as_ref());
        }
        tracing::Span::current()
            .record("gen_ai.usage.input_tokens", u.input_tokens)
            .record("gen_ai.usage.output_tokens", u.output_tokens);
    }
    // A prompt the provider's filters blocked is a 200 without an answer: the
    // request's fault, like a content filter's 400, answered (translated: no
    // content, stopped as a refusal) unless the route fails over on `contentFilter`.
    let blocked = translation.is_some_and(|tr| translate::is_blocked(tr, &bytes));
    let bytes = match translation {
        None => replace_model(&bytes, &call.client_model_json).unwrap_or(bytes),
        Some(tr) => match translate::response(tr, &bytes, call.client_model) {
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
    // The reservation goes with the answer until its last byte is handed on.
    let body = Body::new(HeldAnswer::new(bytes, held));
    Attempted::Committed(relay(status, headers, body), None)
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

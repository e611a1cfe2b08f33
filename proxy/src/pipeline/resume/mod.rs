//! Resume after commit (docs/streaming.md#resume-after-commit): the body of a stream whose
//! route resumes. The committed stream underneath (`stream`) does not end itself with the
//! error event when it breaks, stalls or gets an in-band error the route fails over on: it
//! stops and tells this body how it ended ([`StreamReport`]). The body asks the next
//! eligible target to continue the answer (`continuation`: the walk with a prefill) and
//! splices its events into the same client stream (`transcript`), or, when the stream
//! cannot be resumed, ends it with the error event as the stream would have. It counts
//! resumes (route, target, outcome), keeps the replica's figure of the text held for them,
//! and writes the request's log line when the answer ends.
//!
//! Nothing here runs for a route without resume, or for a request that is not a
//! chat or messages stream: its streams are the plain committed stream, and the
//! walk does nothing more than check the route's policy.

mod continuation;
mod transcript;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, BodyDataStream};
use axum::http::{HeaderMap, HeaderValue};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use switchback_crds::config::Resume;
use tokio::time::Instant;
use tracing::Instrument;

use super::call::{Call, Outcome};
use super::log::{AttemptLog, ResumeLog};
use super::order::Order;
use super::stream::{AttemptEnd, LineSlot, Resuming, StreamEnd, StreamReport};
use crate::config::snapshot::RouteRt;
use crate::gateway::Gateway;
use crate::limits::clients::ClientUsage;
use crate::observe::counters;
use crate::observe::reason::{Reason, ResumeOutcome};
use crate::observe::telemetry::TRACE_TARGET;
use crate::wire::rewrite::JsonStr;
use crate::wire::sse;
use crate::wire::surface::Surface;
use crate::wire::usage::Usage;

use continuation::Found;
use transcript::{Transcript, Unresumable};

/// The walk's hook: a committed stream of a route that resumes gets the resuming
/// body. `order` is the request's order of targets, `started` when its walk began
/// (the whole call's budget runs from then).
pub(super) fn hook(
    gw: &Arc<Gateway>,
    route: &Arc<RouteRt>,
    call: &Call<'_>,
    mut outcome: Outcome,
    order: Order,
    started: Instant,
) -> Outcome {
    let (Some(line), Some(by)) = (&outcome.stream_line, outcome.answered_by) else {
        return outcome;
    };
    let Some(Resuming(report)) = outcome.response.extensions_mut().remove::<Resuming>() else {
        return outcome;
    };
    let Some(policy) = route.spec.stream.as_ref().and_then(|s| s.resume) else {
        return outcome;
    };
    let order = order.as_slice();
    let at = order.iter().position(|&i| i == by).unwrap_or(order.len());
    let seed = Seed {
        gw: gw.clone(),
        route: route.clone(),
        policy,
        order: order.to_vec(),
        budget: started + Duration::from_millis(route.spec.timeout_ms),
        surface: call.surface,
        client_model: call.client_model.to_owned(),
        client_model_json: call.client_model_json.clone(),
        body: call.body.clone(),
        client_headers: call.client_headers.clone(),
        request_id: call.request_id.clone(),
        hops: call.hops,
        client: call.client.cloned(),
        include_usage: call.include_usage,
        strip_usage: call.strip_usage,
        span: tracing::Span::current(),
    };
    let line = line.clone();
    let committed = Instant::now();
    outcome.response = std::mem::take(&mut outcome.response).map(|body| {
        let first = Attempt {
            body: body.into_data_stream(),
            report,
            target: by,
            at,
            committed,
        };
        Body::from_stream(Resumable::new(first, seed, line))
    });
    outcome
}

/// What a continuation is asked with, owned by the body: the route, the request as
/// the walk had it, the request's order of targets, the whole call's budget.
pub(super) struct Seed {
    pub gw: Arc<Gateway>,
    pub route: Arc<RouteRt>,
    pub policy: Resume,
    pub order: Vec<u8>,
    pub budget: Instant,
    pub surface: Surface,
    pub client_model: String,
    pub client_model_json: JsonStr,
    pub body: Bytes,
    pub client_headers: HeaderMap,
    pub request_id: HeaderValue,
    pub hops: u8,
    pub client: Option<ClientUsage>,
    pub include_usage: Option<bool>,
    pub strip_usage: bool,
    /// The request's span: a resume's span is its child.
    pub span: tracing::Span,
}

/// The committed attempt relayed now.
struct Attempt {
    /// What its committed stream sends the client.
    body: BodyDataStream,
    report: Arc<StreamReport>,
    /// Its target, and that target's position in `Seed::order`.
    target: u8,
    at: usize,
    committed: Instant,
}

type Finding = Pin<Box<dyn Future<Output = Found> + Send>>;

/// The body of a stream whose route resumes.
pub(crate) struct Resumable {
    inner: Option<Attempt>,
    transcript: Transcript,
    seed: Arc<Seed>,
    /// A continuation being looked for.
    finding: Option<Finding>,
    /// The request's log line, written when the answer ends.
    line: Arc<LineSlot>,
    log: ResumeLog,
    /// Usage the attempts before the current one reported.
    carried: Usage,
    /// Text held, as counted in the replica's figure (`Gateway::resume_held`).
    counted: usize,
    ended: bool,
    /// An attempt's usage was estimated (docs/troubleshooting.md#usage-marked-estimated),
    /// as the log line says.
    estimated: bool,
}

impl Resumable {
    fn new(first: Attempt, seed: Seed, line: Arc<LineSlot>) -> Self {
        let max_held = usize::try_from(seed.policy.max_held_bytes).unwrap_or(usize::MAX);
        Self {
            inner: Some(first),
            transcript: Transcript::new(seed.surface.wire(), max_held),
            seed: Arc::new(seed),
            finding: None,
            line,
            log: ResumeLog::default(),
            carried: Usage::default(),
            counted: 0,
            ended: false,
            estimated: false,
        }
    }

    /// Keeps the replica's figure of held text in step with this stream's.
    fn count_held(&mut self) {
        let now = self.transcript.held();
        let held = &self.seed.gw.resume_held;
        if now > self.counted {
            held.fetch_add(now - self.counted, Ordering::Relaxed);
        } else if now < self.counted {
            held.fetch_sub(self.counted - now, Ordering::Relaxed);
        }
        self.counted = now;
    }

    /// The attempt relayed so far ended, as `end` says (`None`: it said nothing,
    /// which a committed stream always does; read as a completion).
    fn after(&mut self, a: Attempt, end: Option<AttemptEnd>, out: &mut BytesMut) {
        self.estimated |= end.is_some_and(|e| e.estimated);
        let Some(AttemptEnd {
            usage,
            failure: Some((reason, status)),
            held,
            ..
        }) = end
        else {
            self.finish(StreamEnd::Completed);
            return;
        };
        self.log.log.push(AttemptLog {
            target: a.target,
            status,
            reason,
            duration: a.committed.elapsed(),
            retry_after: None,
        });
        if !held {
            // A failure the route does not resume: the client was told already.
            counters::inc(&self.seed.route.counters.failed);
            self.finish(StreamEnd::Failed(reason));
            return;
        }
        let seed = &self.seed;
        let why = match self.transcript.resumable() {
            Err(Unresumable::ToolCallInProgress) => Some(ResumeOutcome::ToolCallInProgress),
            Err(Unresumable::HeldBytesExceeded) => Some(ResumeOutcome::HeldBytesExceeded),
            Ok(()) if self.log.resumes >= seed.policy.max_resumes => {
                Some(ResumeOutcome::MaxResumesUsed)
            }
            Ok(()) if Instant::now() >= seed.budget => Some(ResumeOutcome::BudgetExhausted),
            Ok(()) if a.at + 1 >= seed.order.len() => Some(ResumeOutcome::NoEligibleTarget),
            Ok(()) => None,
        };
        if let Some(why) = why {
            self.give_up(a.target, reason, why, out);
            return;
        }
        self.carried.input_tokens += usage.input_tokens;
        self.carried.output_tokens += usage.output_tokens;
        let span = tracing::info_span!(target: TRACE_TARGET, parent: &seed.span, "resume",
            switchback.resume.after = reason.as_str(),
            switchback.resume.outcome = tracing::field::Empty,
            switchback.resume.target = tracing::field::Empty);
        let text = self.transcript.text().to_owned();
        let find = continuation::find(seed.clone(), (a.target, reason), a.at + 1, text);
        self.finding = Some(Box::pin(find.instrument(span)));
    }

    /// What the walk for a continuation found.
    fn found(&mut self, found: Found, out: &mut BytesMut) {
        match found {
            Found::Continued {
                attempt: (body, report),
                target,
                at,
                prefilled,
                log,
                sent,
            } => {
                let route = &self.seed.route;
                let t = &route.targets[target as usize];
                counters::inc(&route.counters.resumed);
                t.counters.resumes.inc(ResumeOutcome::Resumed);
                self.log.log.extend(log);
                self.log.sent += sent;
                self.log.resumes += 1;
                self.log.resumed_by = Some(target);
                tracing::debug!(route = %route.spec.id, target = %t.label, "a committed stream was resumed");
                out.extend_from_slice(b": switchback resumed ");
                out.extend_from_slice(t.credential.target_header.as_bytes());
                out.extend_from_slice(b"\n\n");
                self.transcript.resume(prefilled, self.carried);
                self.inner = Some(Attempt {
                    body: body.into_data_stream(),
                    report,
                    target,
                    at,
                    committed: Instant::now(),
                });
            }
            Found::NotResumed {
                why,
                broken,
                reason,
                log,
                sent,
            } => {
                self.log.log.extend(log);
                self.log.sent += sent;
                self.give_up(broken, reason, why, out);
            }
        }
    }

    /// Not resumed: the error event, as the stream would have ended itself.
    fn give_up(&mut self, target: u8, reason: Reason, why: ResumeOutcome, out: &mut BytesMut) {
        let route = &self.seed.route;
        counters::inc(&route.counters.failed);
        route.targets[target as usize].counters.resumes.inc(why);
        self.log.outcome = Some(why);
        tracing::debug!(route = %route.spec.id, reason = reason.as_str(), outcome = why.as_str(),
            "a committed stream failed and was not resumed");
        let message = match reason {
            Reason::Timeout => "the upstream stream stalled after it had started",
            _ => "the upstream stream failed after it had started",
        };
        out.extend_from_slice(&sse::failure_event_for(self.seed.surface, message));
        self.finish(StreamEnd::Failed(reason));
    }

    /// The answer ended: its log line, with what the resumes add.
    fn finish(&mut self, end: StreamEnd) {
        if !self.ended {
            self.ended = true;
            // Dropping the attempt relayed now settles its usage (estimated when its
            // client left it mid-answer).
            let report = self.inner.as_ref().map(|a| a.report.clone());
            self.inner = None;
            self.estimated |= report.and_then(|r| r.end()).is_some_and(|e| e.estimated);
            self.transcript.release();
            self.count_held();
            self.line
                .ended(end, Some(std::mem::take(&mut self.log)), self.estimated);
        }
    }
}

impl Drop for Resumable {
    fn drop(&mut self) {
        self.transcript.release();
        self.count_held();
        // The client went away first (or the drain ended the stream).
        self.finish(StreamEnd::ClientGone);
    }
}

impl futures_util::Stream for Resumable {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(finding) = &mut this.finding {
                let Poll::Ready(found) = finding.as_mut().poll(cx) else {
                    return Poll::Pending;
                };
                this.finding = None;
                let mut out = BytesMut::new();
                this.found(found, &mut out);
                if !out.is_empty() {
                    return Poll::Ready(Some(Ok(out.freeze())));
                }
                continue;
            }
            let Some(inner) = &mut this.inner else {
                return Poll::Ready(None);
            };
            match inner.body.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    let chunk = this.transcript.pass(chunk);
                    this.count_held();
                    if !chunk.is_empty() {
                        return Poll::Ready(Some(Ok(chunk)));
                    }
                }
                // The stream underneath ended (it never fails as a body).
                Poll::Ready(Some(Err(_)) | None) => {
                    let Some(a) = this.inner.take() else {
                        continue;
                    };
                    let end = a.report.end();
                    let mut out = BytesMut::new();
                    this.after(a, end, &mut out);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(out.freeze())));
                    }
                }
            }
        }
    }
}

//! The walk along one route's targets: in the order the route's strategy gives
//! (`order`), each target is tried with its retries (`target`) until one answers;
//! a target that fails over or is passed over counts as a fallback away from it;
//! when every target that can serve the call was skipped for an open circuit, the
//! first of them is tried anyway. It ends with the answer committed, or with the
//! gateway's error for the failure the chain ended on (`failure`), and records the
//! route's counters: requests, fallbacks, failures, duration and the gateway's own
//! overhead (everything but waiting on providers, backoff and queues).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Response, StatusCode};
use tokio::time::Instant;

use super::failure::finish_failed;
use super::order::order;
use super::outcome::may_advance;
use super::send::{Failure, Http, Transport};
use super::{AttemptLog, Call, LineSlot, Outcome};
use crate::config::snapshot::RouteRt;
use crate::gateway::Gateway;
use crate::observe::counters;
use crate::observe::reason::Reason;
use crate::providers::translate::TranslateError;
use crate::wire::surface;

/// Walk `route`'s targets for `call`, sending over HTTP.
pub async fn run(gw: &Gateway, route: &RouteRt, call: &Call<'_>) -> Outcome {
    walk(&Http, gw, route, call, rand::random::<f64>()).await
}

/// [`run`] over any transport, with the strategy's draw in `[0, 1)` given.
pub(super) async fn walk<T: Transport>(
    transport: &T,
    gw: &Gateway,
    route: &RouteRt,
    call: &Call<'_>,
    draw: f64,
) -> Outcome {
    let started = Instant::now();
    counters::inc(&route.counters.requests);
    let mut walk = Walk {
        transport,
        gw,
        route,
        call,
        budget: started + Duration::from_millis(route.spec.timeout_ms),
        log: Vec::new(),
        sent: 0,
        waited: Duration::ZERO,
        shortest_retry_after: None,
        untranslatable: None,
    };
    let outcome = walk.along(order(route, draw).as_slice()).await;
    let total = started.elapsed();
    route.counters.duration.observe(total);
    route
        .counters
        .overhead
        .observe(total.saturating_sub(walk.waited));
    outcome
}

/// One request's walk along its route's targets.
pub(super) struct Walk<'a, 'c, T> {
    pub transport: &'a T,
    pub gw: &'a Gateway,
    pub route: &'a RouteRt,
    pub call: &'a Call<'c>,
    pub budget: Instant,
    pub log: Vec<AttemptLog>,
    /// Upstream requests sent.
    pub sent: u32,
    /// Time spent waiting on providers, backoff and queues: everything that is not
    /// the gateway's own work.
    pub waited: Duration,
    pub shortest_retry_after: Option<Duration>,
    /// Why a target that needed translation could not take the request.
    pub untranslatable: Option<TranslateError>,
}

/// What trying one target came to.
pub(super) enum Tried {
    Answered(Response<Body>, Option<Arc<LineSlot>>),
    Skipped(Reason),
    Failed(Failure),
}

/// What the walk keeps of the targets it moved past.
#[derive(Default)]
struct Passed {
    /// The position in the order of the last target considered.
    position: u32,
    skipped: usize,
    skipped_open: usize,
    skipped_unserved: usize,
    /// The first target skipped for its open circuit, and its position.
    first_open: Option<(usize, u8)>,
    /// The last failure of a target that was tried.
    last_failure: Option<Failure>,
}

impl Passed {
    fn skipped(&mut self, reason: Reason, pos: usize, i: u8) {
        self.skipped += 1;
        self.skipped_open += usize::from(reason == Reason::CircuitOpen);
        self.skipped_unserved += usize::from(reason == Reason::UnsupportedSurface);
        if reason == Reason::CircuitOpen && self.first_open.is_none() {
            self.first_open = Some((pos, i));
        }
    }

    /// Every target that can serve the API called was skipped because its circuit
    /// is open (targets that cannot serve it at all are no reason not to): the first
    /// of them, to try anyway.
    fn all_open(&self, sent: u32) -> Option<(usize, u8)> {
        let only_open = self.skipped_open + self.skipped_unserved == self.skipped;
        self.first_open.filter(|_| sent == 0 && only_open)
    }
}

impl<T: Transport> Walk<'_, '_, T> {
    /// Each target of `order` in turn, until one answers or the chain stops.
    async fn along(&mut self, order: &[u8]) -> Outcome {
        let mut passed = Passed::default();
        for (pos, &i) in order.iter().enumerate() {
            passed.position = pos as u32;
            let last = pos + 1 == order.len();
            match self.target(i, false).await {
                Tried::Answered(response, line) => {
                    return self.answered(response, line, pos as u32, i);
                }
                Tried::Skipped(reason) => {
                    passed.skipped(reason, pos, i);
                    self.moved_past(i, reason, last);
                }
                Tried::Failed(failure) => {
                    if !may_advance(failure.reason, failure.status, &self.route.spec.fallback) {
                        return self.failed(failure, pos as u32);
                    }
                    self.moved_past(i, failure.reason, last);
                    passed.last_failure = Some(failure);
                    if Instant::now() >= self.budget {
                        break;
                    }
                }
            }
        }
        if let Some((pos, first)) = passed.all_open(self.sent) {
            return self.forced(first, pos as u32, passed.position).await;
        }
        let last = match passed.last_failure.take() {
            Some(f) => f,
            None => self.all_skipped(),
        };
        self.failed(last, passed.position)
    }

    /// A request left target `i` for the next one, for `reason`.
    fn moved_past(&self, i: u8, reason: Reason, last: bool) {
        if !last {
            let t = &self.route.targets[i as usize];
            t.counters.fallbacks_away.inc(reason);
        }
    }

    /// Every target skipped for an open circuit: the first is tried anyway, so a
    /// recovered provider is found even when no probe is due; its failure is 503.
    async fn forced(&mut self, i: u8, pos: u32, last_position: u32) -> Outcome {
        match self.target(i, true).await {
            Tried::Answered(response, line) => self.answered(response, line, pos, i),
            Tried::Failed(_) | Tried::Skipped(_) => {
                self.failed(Failure::bare(Reason::CircuitOpen), last_position)
            }
        }
    }

    /// Target `i` passed over before anything was sent to it.
    pub(super) fn skip(&mut self, i: u8, reason: Reason) -> Tried {
        self.route.targets[i as usize].counters.failures.inc(reason);
        self.log.push(AttemptLog {
            target: i,
            status: None,
            reason,
            duration: Duration::ZERO,
            retry_after: None,
        });
        Tried::Skipped(reason)
    }

    fn answered(
        &mut self,
        response: Response<Body>,
        stream_line: Option<Arc<LineSlot>>,
        pos: u32,
        i: u8,
    ) -> Outcome {
        if pos > 0 {
            counters::inc(&self.route.counters.fallbacks);
        }
        Outcome {
            response,
            attempts: self.sent,
            fallbacks: pos,
            target: Some(
                self.route.targets[i as usize]
                    .credential
                    .target_header
                    .clone(),
            ),
            answered_by: Some(i),
            log: std::mem::take(&mut self.log),
            stream_line,
        }
    }

    fn failed(&mut self, failure: Failure, fallbacks: u32) -> Outcome {
        counters::inc(&self.route.counters.failed);
        // Nothing was sent and a target refused the request's parameters: that is the
        // answer (a 400 naming the parameter), not "no target available".
        if self.sent == 0
            && let Some(e) = self.untranslatable.take()
        {
            return Outcome {
                response: surface::json_response(
                    StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST),
                    e.body(self.call.surface.wire()),
                ),
                attempts: 0,
                fallbacks,
                target: None,
                answered_by: None,
                log: std::mem::take(&mut self.log),
                stream_line: None,
            };
        }
        finish_failed(
            self.route,
            self.call,
            failure,
            self.sent,
            fallbacks,
            std::mem::take(&mut self.log),
            self.shortest_retry_after,
        )
    }

    /// Nothing was sent: every target was skipped. Parked everywhere answers 429 with
    /// the soonest end of a park; no target that can serve the API called at all, a
    /// 503 saying so (see `failure`).
    fn all_skipped(&mut self) -> Failure {
        let all = |reason| !self.log.is_empty() && self.log.iter().all(|l| l.reason == reason);
        if all(Reason::UnsupportedSurface) {
            return Failure::bare(Reason::UnsupportedSurface);
        }
        if !all(Reason::Parked) {
            return Failure::bare(Reason::MissingKey);
        }
        let now = self.gw.now_ms();
        let soonest = self
            .route
            .targets
            .iter()
            .map(|t| t.state.parked_until_ms().saturating_sub(now))
            .min()
            .unwrap_or(0);
        self.shortest_retry_after = Some(Duration::from_millis(soonest));
        Failure::bare(Reason::Parked)
    }
}

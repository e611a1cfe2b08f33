//! First-token hedging (`spec.hedge`, docs/streaming.md#first-token-hedging). When a try
//! has nothing to commit (a stream: its first content event; a unary call: its successful
//! answer) by `after`, the next eligible target of the walk's order (the one a failover
//! would try next: not skipped for its key, surface, park, circuit, ramp or a full queue)
//! is sent the request beside it, if the route's budget allows (`limits::hedge`: at most
//! `maxPercent` of its requests of the last 60 s) and the hedge would start before the
//! whole call's budget runs out. The first of the two to commit is the answer; the other is
//! dropped there and then, which closes its upstream connection, so its provider stops.
//!
//! One hedge per request. A try that fails while the other runs waits for it; a
//! hedge that failed leaves the slow try running, and the walk later passes its
//! target over (it was tried). Both tries are counted and logged like any other
//! (the cancelled one with reason `hedgeLost`); the hedge's target counts it as
//! started, won, lost or failed. A hedge won by a later target is a fallback.
//!
//! Only a route that hedges gets here: the rest of the walk sees an `Option` that is
//! `None`, and no timer is set. What the walk and a try hold of it (`Hedging`,
//! `Raced`) is in `state`, so that they need nothing of this file.

pub(super) mod state;

use state::Raced;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Response;
use tokio::time::{Instant, sleep_until};
use tracing::Instrument;

use crate::limits::circuit::{Admit, Probe};
use crate::limits::concurrency::Refused;
use crate::observe::counters;
use crate::observe::reason::Reason;
use crate::pipeline::attempt::{Attempt, Attempted, Failure, Plan, Transport};
use crate::pipeline::outcome::attempt_deadline;
use crate::pipeline::stream::LineSlot;
use crate::pipeline::walk::Walk;

/// The target a hedge goes to, ready to send.
struct Beside<'p> {
    pos: u32,
    j: u8,
    plan: Plan,
    probe: Option<Probe<'p>>,
}

/// What came first in the race.
enum First {
    Primary(Attempted),
    Hedge(Attempted),
}

impl<'a, T: Transport> Walk<'a, '_, T> {
    /// When a hedge would start beside a try that started at `started`: for a request
    /// that hedges and has not yet, when that is before the call's budget runs out.
    pub(super) fn hedge_at(&self, started: Instant) -> Option<Instant> {
        let h = self.hedge.as_deref()?;
        if h.started.is_some() {
            return None;
        }
        let at = started.checked_add(Duration::from_millis(h.policy.after_ms))?;
        (at < self.budget).then_some(at)
    }

    /// The hedge's target, when it was at position `pos` and failed: the walk does not
    /// try it again, and moves past it for this reason.
    pub(super) fn hedge_failed_at(&self, pos: usize) -> Option<Reason> {
        let h = self.hedge.as_deref()?;
        match h.started {
            Some((p, _)) if p as usize == pos => h.failed,
            _ => None,
        }
    }

    /// The hedge's target and its position in the order, once started.
    pub(super) fn hedge_target(&self) -> Option<(u32, u8)> {
        self.hedge.as_deref()?.started
    }

    /// Try `i` (its try number `tries`, started at `started`, `primary` in flight)
    /// raced against a hedge from `at`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn raced<F>(
        &mut self,
        (i, key): (u8, u8),
        tries: u32,
        probe: &mut Option<Probe<'_>>,
        span: &tracing::Span,
        started: Instant,
        at: Instant,
        primary: F,
    ) -> Raced
    where
        F: Future<Output = Attempted>,
    {
        let mut primary = pin!(primary);
        tokio::select! {
            biased;
            result = &mut primary => return Raced::Primary(result, Instant::now()),
            () = sleep_until(at) => {}
        }
        let Some(beside) = self.beside(i) else {
            let result = primary.await;
            return Raced::Primary(result, Instant::now());
        };
        let (pos, j, plan, mut hedge_probe) = (beside.pos, beside.j, beside.plan, beside.probe);
        if let Some(h) = self.hedge.as_deref_mut() {
            h.started = Some((pos, j));
        }
        let (gw, route, call, transport, budget) =
            (self.gw, self.route, self.call, self.transport, self.budget);
        let tj = &route.targets[j as usize];
        counters::inc(&tj.counters.requests);
        counters::inc(&tj.counters.hedges);
        let (hedge_span, hedge_started) = self.counted(tj, 1);
        let hedge_key = tj.credential.keys.pick(gw.now_ms()).unwrap_or(0);
        tracing::debug!(route = %route.spec.id, target = %route.targets[i as usize].label,
            hedge = %tj.label, "no answer yet: hedged");
        let hedge = async {
            let permit = match &tj.credential.limiter {
                None => None,
                Some(limiter) => match limiter.acquire(budget).await {
                    Ok(permit) => Some(permit),
                    Err(Refused::QueueFull) => {
                        return Attempted::Failed(Failure::bare(Reason::QueueFull));
                    }
                    Err(Refused::Deadline) => {
                        return Attempted::Failed(Failure::bare(Reason::Budget));
                    }
                },
            };
            let attempt = Attempt {
                gw,
                route,
                target: tj,
                call,
                plan: &plan,
                key: hedge_key,
                deadline: attempt_deadline(Instant::now(), &tj.spec, budget),
                budget,
                started: hedge_started,
                permit,
                span: &hedge_span,
            };
            transport
                .attempt(attempt)
                .instrument(hedge_span.clone())
                .await
        };
        let mut hedge = pin!(hedge);
        let first = tokio::select! {
            biased;
            result = &mut primary => First::Primary(result),
            result = &mut hedge => First::Hedge(result),
        };
        // Whichever future is not awaited below is dropped on return, which closes
        // its upstream connection.
        match first {
            First::Primary(committed @ Attempted::Committed(..)) => {
                self.lost(j, &hedge_span, hedge_started, false);
                counters::inc(&tj.counters.hedge_losses);
                Raced::Primary(committed, Instant::now())
            }
            First::Hedge(Attempted::Committed(response, line)) => {
                self.lost(i, span, started, true);
                let (response, line) = self.hedge_committed(
                    j,
                    &hedge_span,
                    hedge_started,
                    hedge_probe,
                    response,
                    line,
                );
                Raced::HedgeWon(response, line, Reason::HedgeLost)
            }
            First::Hedge(Attempted::Failed(f)) => {
                let hedged = (j, hedge_key);
                self.hedge_failed(hedged, &hedge_span, hedge_started, &mut hedge_probe, f);
                let result = primary.await;
                Raced::Primary(result, Instant::now())
            }
            First::Primary(Attempted::Failed(f)) => {
                // The slow try failed: the hedge may still answer.
                let ended = Instant::now();
                let result = hedge.await;
                self.waited += ended.elapsed();
                match result {
                    Attempted::Committed(response, line) => {
                        let reason = f.reason;
                        let elapsed = self.timed(
                            &route.targets[i as usize],
                            span,
                            (f.status, Some(f.reason)),
                            started,
                            ended,
                        );
                        self.note(i, &f, elapsed, tries);
                        let _ =
                            self.after(&route.targets[i as usize], &f, tries, probe, (key, false));
                        let (response, line) = self.hedge_committed(
                            j,
                            &hedge_span,
                            hedge_started,
                            hedge_probe,
                            response,
                            line,
                        );
                        Raced::HedgeWon(response, line, reason)
                    }
                    Attempted::Failed(h) => {
                        let hedged = (j, hedge_key);
                        self.hedge_failed(hedged, &hedge_span, hedge_started, &mut hedge_probe, h);
                        Raced::Primary(Attempted::Failed(f), ended)
                    }
                }
            }
        }
    }

    /// The next target after `i` in the order that a failover would try now, made
    /// ready to send, if the route's budget lets this request hedge.
    fn beside(&mut self, i: u8) -> Option<Beside<'a>> {
        let h = self.hedge.as_deref()?;
        let (order, max_percent) = (h.order, h.policy.max_percent);
        let route = self.route;
        let budget = route.hedge.as_deref()?;
        // Most requests of a route at its cap find it spent: say so before any work.
        if !budget.allows(self.gw.now_ms(), max_percent) {
            return None;
        }
        let now = Instant::now();
        let from = order.as_slice().iter().position(|&k| k == i)? + 1;
        for (pos, &j) in order.as_slice().iter().enumerate().skip(from) {
            let t = &route.targets[j as usize];
            let Ok(exchange) = self.exchange(t) else {
                continue;
            };
            let spec = &t.credential.spec;
            if let (Some(limiter), Some(max)) = (&t.credential.limiter, spec.max_concurrency)
                && limiter.in_flight(max) >= max
                && limiter.waiting() >= spec.max_queue.unwrap_or(0)
            {
                continue; // its queue is full
            }
            let breaker = &t.state.breaker;
            let probe = match breaker.admit(now) {
                Admit::Yes if self.ramped_away(t) => continue,
                Admit::Yes => None,
                Admit::Probe => Some(Probe::new(breaker)),
                Admit::No => continue,
            };
            let Ok(plan) = self.plan(t, exchange) else {
                continue;
            };
            if !budget.take(self.gw.now_ms(), max_percent) {
                return None;
            }
            return Some(Beside {
                pos: pos as u32,
                j,
                plan,
                probe,
            });
        }
        None
    }

    /// Try `i`, started at `started`, dropped because the other try of its hedge
    /// committed first: logged and counted as `hedgeLost`. `waited`: its time was
    /// spent waiting on the provider (the slow try's; the hedge's overlaps it).
    fn lost(&mut self, i: u8, span: &tracing::Span, started: Instant, waited: bool) {
        let t = &self.route.targets[i as usize];
        let elapsed = started.elapsed();
        if waited {
            self.waited += elapsed;
        }
        super::target::recorded(t, self.call, span, (None, Some(Reason::HedgeLost)), elapsed);
        t.counters.failures.inc(Reason::HedgeLost);
        self.log.push(super::log::AttemptLog {
            target: i,
            status: None,
            reason: Reason::HedgeLost,
            duration: elapsed,
            retry_after: None,
        });
    }

    /// The hedge on `j` committed first: counted as a success of its target (a
    /// stream's verdict comes at its end) and as a hedge won.
    fn hedge_committed(
        &mut self,
        j: u8,
        span: &tracing::Span,
        started: Instant,
        probe: Option<Probe<'_>>,
        response: Response<Body>,
        line: Option<Arc<LineSlot>>,
    ) -> (Response<Body>, Option<Arc<LineSlot>>) {
        let t = &self.route.targets[j as usize];
        let elapsed = started.elapsed();
        super::target::recorded(
            t,
            self.call,
            span,
            (Some(response.status().as_u16()), None),
            elapsed,
        );
        counters::inc(&t.counters.hedge_wins);
        self.succeeded(t, probe, elapsed, response, line)
    }

    /// The hedge on `j` failed: counted and logged like any try's failure (its
    /// circuit and park told), not retried; the walk will not try `j` again.
    fn hedge_failed(
        &mut self,
        (j, key): (u8, u8),
        span: &tracing::Span,
        started: Instant,
        probe: &mut Option<Probe<'_>>,
        f: Failure,
    ) {
        let t = &self.route.targets[j as usize];
        let elapsed = started.elapsed();
        super::target::recorded(t, self.call, span, (f.status, Some(f.reason)), elapsed);
        counters::inc(&t.counters.hedge_failures);
        self.note(j, &f, elapsed, 1);
        let _ = self.after(t, &f, 1, probe, (key, false));
        if let Some(h) = self.hedge.as_deref_mut() {
            h.failed = Some(f.reason);
        }
    }
}

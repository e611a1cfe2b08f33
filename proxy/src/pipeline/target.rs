//! One target of the walk, tried with its retries. Before anything is sent: how the
//! request reaches it (its adapter's exchange), whether it can take it (key, park,
//! circuit) and its body (relayed or translated; continuing a broken stream's answer
//! when resuming one). Then each try: a concurrency slot,
//! the try sent (`send`), and its outcome: a success closes a half-open circuit; a
//! failure is counted and logged, may open the circuit, park the target after a 429,
//! and is retried after its backoff or Retry-After while attempts and the budget
//! allow (`outcome`). A try on a route that hedges may be raced against the next
//! target (`hedge`); on a route that ramps, a target whose circuit closed moments
//! ago may pass the request on (`rampingUp`).

use std::time::Duration;

use axum::body::Body;
use axum::http::Response;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, sleep_until};
use tracing::Instrument;

use super::attempt::{Attempt, Attempted, Failure, Plan, Transport, attempt_span};
use super::call::Call;
use super::hedge::state::Raced;
use super::log::AttemptLog;
use super::outcome::{attempt_deadline, backoff, retryable, share_end};
use super::stream::LineSlot;
use super::walk::{Tried, Walk};
use crate::config::snapshot::TargetRt;
use crate::limits::circuit::{Admit, Probe, Transition};
use crate::limits::concurrency::{Limiter, Refused};
use crate::observe::counters;
use crate::observe::reason::Reason;
use crate::providers::Exchange;
use crate::providers::classify;
use crate::providers::translate::{self, TranslateError, Translation};

/// Why a target got no plan: a reason to pass it over, or its translation's
/// refusal (which the walk may resolve by fetching a URL for it).
pub(super) enum Unplanned {
    Skip(Reason),
    Untranslatable(TranslateError),
}

/// After a failed try: give up on the target, try it again after a wait, or send the
/// same try at once with another of its keys (a 429, 401 or 403 set the key aside).
pub(super) enum Next {
    GiveUp,
    RetryAfter(Duration),
    OtherKey,
}

impl<T: Transport> Walk<'_, '_, T> {
    /// Try target `i` with its retries. `forced` ignores an open circuit.
    pub(super) async fn target(&mut self, i: u8, forced: bool) -> Tried {
        let route = self.route;
        let t = &route.targets[i as usize];
        counters::inc(&t.counters.requests);
        let exchange = match self.exchange(t) {
            Ok(exchange) => exchange,
            Err(reason) => return self.skip(i, reason),
        };
        let breaker = &t.state.breaker;
        let mut probe = match breaker.admit(Instant::now()) {
            Admit::Yes if !forced && self.ramped_away(t) => return self.skip(i, Reason::RampingUp),
            Admit::Yes => None,
            Admit::Probe => Some(Probe::new(breaker)),
            // Tried although open: its success closes the circuit like a probe's.
            Admit::No if forced => Some(Probe::new(breaker)),
            Admit::No => return self.skip(i, Reason::CircuitOpen),
        };
        let plan = loop {
            match self.plan(t, exchange) {
                Ok(plan) => break plan,
                Err(Unplanned::Skip(reason)) => return self.skip(i, reason),
                // An image or document by URL the target cannot fetch: the gateway
                // fetches it (once for the whole walk) and translates again. Boxed:
                // the fetch's state stays out of this future's unless it is needed.
                Err(Unplanned::Untranslatable(e)) => match e.fetch() {
                    Some(url) if self.may_fetch(url) => {
                        let url = url.to_owned();
                        Box::pin(self.fetch_media(url)).await;
                    }
                    _ => return self.untranslatable(i, e),
                },
            }
        };
        // Its tries end by then: the budget, less what later targets are owed.
        let end = self.target_end(i, t);
        let mut tries = 0u32;
        // Keys set aside and replaced at once: each is an attempt, not a retry, and
        // a request goes through each key once at most.
        let mut switched = 0usize;
        // The key the next try goes with, when a key was just set aside.
        let mut next_key = None;
        loop {
            tries += 1;
            if Instant::now() >= self.budget {
                return Tried::Failed(Failure::bare(Reason::Budget));
            }
            let permit = match &t.credential.limiter {
                None => None,
                Some(limiter) => match self.queue(limiter).await {
                    Ok(permit) => Some(permit),
                    // A full queue moves on at once, without spending a retry.
                    Err(Refused::QueueFull) => return self.skip(i, Reason::QueueFull),
                    Err(Refused::Deadline) => return Tried::Failed(Failure::bare(Reason::Budget)),
                },
            };
            let (span, started) = self.counted(t, tries);
            let key = match next_key.take() {
                Some(k) => k,
                None => t.credential.keys.pick(self.gw.now_ms()).unwrap_or(0),
            };
            let attempt = Attempt {
                gw: self.gw,
                route,
                target: t,
                call: self.call,
                plan: &plan,
                key,
                deadline: attempt_deadline(started, &t.spec, end),
                budget: self.budget,
                started,
                permit,
                span: &span,
            };
            let transport = self.transport;
            // Awaited here, not in a function of its own (a nested async fn is copied
            // into its parent's state as it is built). Without traces the span is
            // disabled: skip the wrapper; the future is made in each branch, not bound
            // to a local (an awaited local is kept in the state twice). A try that
            // may be hedged is raced in a boxed future of its own (`hedge`).
            let (result, ended) = match self.hedge_at(started) {
                None => {
                    let result = if span.is_disabled() {
                        transport.attempt(attempt).await
                    } else {
                        transport.attempt(attempt).instrument(span.clone()).await
                    };
                    (result, Instant::now())
                }
                Some(at) => {
                    let primary = transport.attempt(attempt).instrument(span.clone());
                    let raced =
                        self.raced((i, key), tries, &mut probe, &span, started, at, primary);
                    match Box::pin(raced).await {
                        Raced::Primary(result, ended) => (result, ended),
                        Raced::HedgeWon(response, line, left) => {
                            return Tried::HedgeWon(response, line, left);
                        }
                    }
                }
            };
            let elapsed = self.timed(t, &span, seen(&result), started, ended);
            let failure = match result {
                Attempted::Committed(response, line) => {
                    let (response, line) = self.succeeded(t, probe, elapsed, response, line);
                    return Tried::Answered(response, line);
                }
                Attempted::Failed(f) => f,
            };
            self.note(i, &failure, elapsed, tries);
            let may_switch = switched + 1 < t.credential.keys.len();
            match self.after(t, &failure, tries, &mut probe, (key, may_switch)) {
                Next::GiveUp => return Tried::Failed(failure),
                Next::OtherKey => {
                    switched += 1;
                    tries -= 1;
                    next_key = Some(t.credential.keys.after(key, self.gw.now_ms()));
                }
                Next::RetryAfter(wait) => {
                    let Some(resume) = Instant::now().checked_add(wait).filter(|r| *r < end) else {
                        // The wait does not fit the budget: let the next target try.
                        return Tried::Failed(failure);
                    };
                    sleep_until(resume).await;
                    self.waited += wait;
                }
            }
        }
    }

    /// When target `i`'s tries must be done: the call's budget for a target with its
    /// own `timeout` (each try has that), else the budget less what the targets after
    /// it in the order are owed (`share_end`), counting only those that could be tried
    /// now (not skipped for their circuit, park, key or surface).
    fn target_end(&self, i: u8, t: &TargetRt) -> Instant {
        let order = self.order.as_slice();
        let Some(pos) = order.iter().position(|&k| k == i) else {
            return self.budget;
        };
        if t.spec.timeout_ms.is_some() || pos + 1 == order.len() {
            return self.budget;
        }
        let now = Instant::now();
        let later = order[pos + 1..]
            .iter()
            .map(|&j| &self.route.targets[j as usize])
            .filter(|l| self.exchange(l).is_ok() && !l.state.breaker.is_open(now))
            .map(|l| l.spec.timeout_ms);
        share_end(
            now,
            self.budget,
            self.route.spec.timeout_ms,
            self.route.targets.len(),
            later,
        )
    }

    /// The failback ramp (`circuitBreaker.rampUp`) gives this request to the next
    /// target: on a route that ramps, with another target to go to, unless the walk
    /// came back to this one (see `walk`).
    pub(super) fn ramped_away(&self, t: &TargetRt) -> bool {
        let Some(ms) = self.route.spec.circuit_breaker.ramp_up_ms else {
            return false;
        };
        !self.unramped
            && self.route.targets.len() > 1
            && !t
                .state
                .breaker
                .ramp_admits(Instant::now(), Duration::from_millis(ms))
    }

    /// How the request reaches target `t`, or why it is passed over before anything
    /// is sent to it, for a reason known without asking anyone. (Open circuits and
    /// full queues are checked as the target is tried.)
    pub(super) fn exchange(&self, t: &TargetRt) -> Result<Exchange, Reason> {
        let credential = &t.credential;
        let model = t.model(self.call.client_model);
        let Some(exchange) =
            credential
                .adapter
                .exchange(self.call.surface, model, &credential.spec)
        else {
            return Err(Reason::UnsupportedSurface);
        };
        if credential.keys.is_empty() {
            return Err(Reason::MissingKey);
        }
        let cap = self.route.spec.fallback.max_retry_after_ms;
        if t.state.parked(self.gw.now_ms(), cap) {
            return Err(Reason::Parked);
        }
        Ok(exchange)
    }

    /// A target whose translation could not take the request, passed over: for a
    /// feature its API lacks (`unsupportedFeature`,
    /// docs/translation.md#a-target-that-cannot-serve-a-feature) or a body it finds
    /// malformed (`unsupportedParameter`); another target may serve it.
    fn untranslatable(&mut self, i: u8, e: TranslateError) -> Tried {
        let why = e
            .fetch()
            .and_then(|url| self.unfetched.iter().find(|(u, _)| u == url))
            .map(|(_, why)| why.clone());
        let e = match why {
            Some(why) => e.noted(&format!("the gateway could not fetch it: {why}")),
            None => e,
        };
        let reason = if e.is_feature() {
            Reason::UnsupportedFeature
        } else {
            Reason::UnsupportedParameter
        };
        let t = &self.route.targets[i as usize];
        tracing::debug!(route = %self.route.spec.id, target = %t.label,
            reason = reason.as_str(), param = e.param(), feature = e.message(),
            "target cannot serve the request");
        self.refused.push((i, e));
        self.skip(i, reason)
    }

    /// The body target `t` is sent: translated into its dialect, or the client's
    /// with the target's model. A request the target cannot take is passed over.
    pub(super) fn plan(&mut self, t: &TargetRt, exchange: Exchange) -> Result<Plan, Unplanned> {
        let call = self.call;
        let adapter = t.credential.adapter;
        let translation = exchange
            .translated
            .then(|| Translation::to(call.surface.wire(), exchange.dialect));
        let body = match translation {
            Some(tr) => {
                let model = t.spec.upstream_model(call.client_model);
                let defaults = adapter.defaults();
                translate::request_with(tr, &call.body, model, &defaults, &self.fetched)
                    .map_err(Unplanned::Untranslatable)?
            }
            None => {
                let model = t.upstream_model_json(call.client_model);
                adapter
                    .relay_body(&call.body, model)
                    .ok_or(Unplanned::Skip(Reason::UnsupportedParameter))?
            }
        };
        // Resuming a broken stream: the target continues the client's text, or is
        // passed over.
        let body = match self.prefill {
            None => body,
            Some(text) => {
                let model = t.model(call.client_model);
                let p = adapter
                    .prefill(&body, text, model, &t.credential.spec)
                    .ok_or(Unplanned::Skip(Reason::CannotResume))?;
                self.prefilled = p.sent;
                p.body
            }
        };
        Ok(Plan {
            exchange,
            translation,
            body,
        })
    }

    /// The credential's concurrency slot (`maxConcurrency`), waited for in its queue
    /// within the budget; the wait is not the gateway's own time.
    async fn queue(&mut self, limiter: &Limiter) -> Result<OwnedSemaphorePermit, Refused> {
        let queued = Instant::now();
        let got = limiter.acquire(self.budget).await;
        self.waited += queued.elapsed();
        got
    }

    /// A try about to be sent, counted; its trace span, and when it started.
    pub(super) fn counted(&mut self, t: &TargetRt, tries: u32) -> (tracing::Span, Instant) {
        let started = Instant::now();
        self.sent += 1;
        counters::inc(&self.route.counters.attempts);
        counters::inc(&t.counters.attempts);
        if tries > 1 {
            counters::inc(&t.counters.retries);
        }
        (attempt_span(t, self.call, tries), started)
    }

    /// A try's outcome (see [`seen`]) on its span, and its duration from `started`
    /// to `ended` (the provider's time, not the gateway's).
    pub(super) fn timed(
        &mut self,
        t: &TargetRt,
        span: &tracing::Span,
        seen: (Option<u16>, Option<Reason>),
        started: Instant,
        ended: Instant,
    ) -> Duration {
        let elapsed = ended.saturating_duration_since(started);
        recorded(t, self.call, span, seen, elapsed);
        self.waited += elapsed;
        elapsed
    }

    /// A committed answer. A stream's verdict (success or failure, for stats and the
    /// circuit) comes at its end (see `stream::Ending`); its first content closes a
    /// half-open circuit.
    pub(super) fn succeeded(
        &self,
        t: &TargetRt,
        mut probe: Option<Probe<'_>>,
        elapsed: Duration,
        response: Response<Body>,
        line: Option<std::sync::Arc<LineSlot>>,
    ) -> (Response<Body>, Option<std::sync::Arc<LineSlot>>) {
        let streamed = line.is_some();
        let verdict = !streamed || probe.is_some();
        if verdict && t.state.breaker.success(probe.is_some()) == Transition::Closed {
            tracing::info!(target_credential = %t.label,
                model = t.model(self.call.client_model), "circuit closed");
        }
        if let Some(p) = probe.take() {
            p.done();
        }
        t.state.observe_latency(elapsed);
        t.state.latency.observe(elapsed);
        if streamed {
            t.counters.ttfb.observe(elapsed);
        } else {
            counters::inc(&t.counters.successes);
        }
        (response, line)
    }

    /// A failed try of target `i`, counted and in the attempt log.
    pub(super) fn note(&mut self, i: u8, f: &Failure, elapsed: Duration, tries: u32) {
        let route = self.route;
        let t = &route.targets[i as usize];
        t.counters.failures.inc(f.reason);
        t.state.record_failure(f.status, f.reason);
        self.log.push(AttemptLog {
            target: i,
            status: f.status,
            reason: f.reason,
            duration: elapsed,
            retry_after: f.retry_after,
        });
        tracing::debug!(route = %self.route.spec.id, target = %t.label, status = ?f.status,
            reason = f.reason.as_str(), try_no = tries, "attempt failed");
    }

    /// What a failed try means for the target: the circuit told (an opened one
    /// advances at once), the target parked after a 429 (for later requests too,
    /// never longer than `maxRetryAfter`), and whether and when it is tried again.
    /// Retry-After is a provider's number: everything here saturates or is checked.
    pub(super) fn after(
        &mut self,
        t: &TargetRt,
        f: &Failure,
        tries: u32,
        probe: &mut Option<Probe<'_>>,
        (key, may_switch): (u8, bool),
    ) -> Next {
        let now_ms = self.gw.now_ms();
        if self.set_key_aside(t, key, f, tries, now_ms)
            && may_switch
            && t.credential.keys.another_usable(now_ms, key)
        {
            // The same try with the next key; a probe's turn goes with it.
            return Next::OtherKey;
        }
        if f.reason.trips_breaker(f.status) {
            let cb = &self.route.spec.circuit_breaker;
            let tr = t.state.breaker.failure(
                Instant::now(),
                cb.consecutive_failures,
                Duration::from_millis(cb.open_for_ms),
                probe.is_some(),
            );
            if let Some(p) = probe.take() {
                p.done();
            }
            if matches!(tr, Transition::Opened | Transition::Reopened) {
                tracing::warn!(target_credential = %t.label,
                    model = t.model(self.call.client_model), reason = f.reason.as_str(),
                    "circuit opened");
                // Its probes, if it is probed, are due once `openFor` has passed.
                self.gw.health.wake();
                return Next::GiveUp;
            }
        } else {
            // Says nothing about the provider's health: let another request probe.
            drop(probe.take());
        }
        let cap = Duration::from_millis(self.route.spec.fallback.max_retry_after_ms);
        if let Some(ra) = f.retry_after {
            if f.reason == Reason::RateLimited {
                let park = ra.min(cap);
                // Every key is parked now: the target is, until the first is usable.
                let mut until = now_ms.saturating_add(classify::millis(park));
                if t.credential.keys.len() > 1 {
                    until = until.min(t.credential.keys.soonest_usable_ms());
                }
                if until > now_ms {
                    t.state.park_until(until);
                }
                self.shortest_retry_after =
                    Some(self.shortest_retry_after.map_or(park, |s| s.min(park)));
            }
            if ra > cap {
                return Next::GiveUp; // abandon this target at once
            }
        }
        let retry = &t.spec.retry;
        if tries >= retry.attempts || !retryable(f.reason, f.status, retry) {
            return Next::GiveUp;
        }
        Next::RetryAfter(match f.retry_after {
            Some(ra) if retry.honour_retry_after => ra,
            _ => backoff(tries, retry, rand::random::<f64>()),
        })
    }
}

impl<T: Transport> Walk<'_, '_, T> {
    /// A failure that is about the key sent (docs/request-lifecycle.md#key-pools): a 429
    /// parks it for its Retry-After (or the retry's backoff), never longer than
    /// `maxRetryAfter`; a 401 or 403 rejects it for the credential's `keyRejectedFor`.
    /// Whether it was one.
    fn set_key_aside(&self, t: &TargetRt, key: u8, f: &Failure, tries: u32, now_ms: u64) -> bool {
        let pool = &t.credential.keys;
        if pool.is_empty() {
            return false;
        }
        let k = &pool.get(key).state;
        match (f.reason, f.status) {
            (Reason::RateLimited, _) => {
                let cap = Duration::from_millis(self.route.spec.fallback.max_retry_after_ms);
                let park = f
                    .retry_after
                    .unwrap_or_else(|| backoff(tries, &t.spec.retry, 1.0))
                    .min(cap);
                k.park_until(now_ms.saturating_add(classify::millis(park)));
                counters::inc(&k.rate_limited);
                true
            }
            (Reason::AuthError, Some(401 | 403)) => {
                let ms = t.credential.spec.key_rejected_for_ms;
                k.reject_until(now_ms.saturating_add(ms));
                counters::inc(&k.rejected);
                tracing::warn!(target_credential = %t.label, key = &*pool.get(key).name,
                    status = ?f.status, "key rejected by the provider");
                true
            }
            _ => false,
        }
    }
}

/// What a try came to, as its span and log see it: the status, and the failure.
fn seen(result: &Attempted) -> (Option<u16>, Option<Reason>) {
    match result {
        Attempted::Committed(r, _) => (Some(r.status().as_u16()), None),
        Attempted::Failed(f) => (f.status, Some(f.reason)),
    }
}

/// A try's outcome on its span, and its duration in the target's histogram; a
/// failed one's in the GenAI operation duration with its `error.type` (a try that
/// answered is counted there with what it answered: `answer`, `stream`). A try
/// cancelled because its hedge answered first did not fail: it is not.
pub(super) fn recorded(
    t: &TargetRt,
    call: &Call<'_>,
    span: &tracing::Span,
    (status, failure): (Option<u16>, Option<Reason>),
    elapsed: Duration,
) {
    span.record("http.response.status_code", status);
    if let Some(reason) = failure {
        span.record("error.type", reason.as_str());
        if reason != Reason::HedgeLost {
            let genai = &t.counters.genai;
            let at = genai.at(call.surface.operation(), t.model(call.client_model));
            genai.failed(at, reason, elapsed);
        }
    }
    t.counters.attempt_duration.observe(elapsed);
}

//! The walk along one route's targets: in the order the route's strategy gives
//! (`order`), each target is tried with its retries (`target`) until one answers;
//! a target that fails over or is passed over counts as a fallback away from it;
//! when every target that can serve the call was skipped for an open circuit, the
//! first of them is tried anyway; a target the failback ramp passed over is tried
//! once the others could not answer (`rampingUp` only moves load, it never fails a
//! request). A try may be hedged on the next target (`hedge`); a hedge won makes
//! its target the one that answered. It ends with the answer committed, or with the
//! gateway's error for the failure the chain ended on (`failure`), and records the
//! route's counters: requests, fallbacks, failures, duration and the gateway's own
//! overhead (everything but waiting on providers, backoff and queues).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Response;
use tokio::time::Instant;

use super::attempt::{Failure, Transport};
use super::call::{Call, Outcome};
use super::failure::{finish_failed, unservable_request};
use super::hedge::state::Hedging;
use super::log::AttemptLog;
use super::order::{Order, order};
use super::outcome::may_advance;
use super::stream::LineSlot;
use crate::config::snapshot::RouteRt;
use crate::gateway::Gateway;
use crate::observe::counters;
use crate::observe::reason::Reason;
use crate::providers::translate::TranslateError;

/// The walk over any transport (`request::run` sends over HTTP), with the strategy's
/// draw in `[0, 1)` given.
pub(super) async fn walk<T: Transport>(
    transport: &T,
    gw: &Gateway,
    route: &RouteRt,
    call: &Call<'_>,
    draw: f64,
) -> Outcome {
    let started = Instant::now();
    counters::inc(&route.counters.requests);
    let budget = started + Duration::from_millis(route.spec.timeout_ms);
    let order = order(route, draw);
    let mut walk = Walk::new(transport, gw, route, call, budget);
    walk.order = order;
    walk.hedge = Hedging::begin(gw, route, order);
    let order = order.as_slice();
    // The walk's loop is here, not in a method of its own: a nested async fn would be
    // copied into this future's state as it is built, once more per request.
    let mut passed = Passed::default();
    let mut next = 0;
    let outcome = 'walk: {
        loop {
            // The order; then, once, a target the ramp passed over when no other
            // answered (it is healthy). One await of `target` for both: each call
            // site of an async fn is a variant of this future's state.
            let (pos, i, again) = if next < order.len() {
                next += 1;
                (next - 1, order[next - 1], false)
            } else if let Some(i) = passed.first_ramping.take()
                && Instant::now() < walk.budget
            {
                walk.unramped = true;
                (passed.position as usize, i, true)
            } else {
                break;
            };
            let last = pos + 1 == order.len();
            if !again {
                passed.position = pos as u32;
                if let Some(reason) = walk.hedge_failed_at(pos) {
                    // A hedge tried it already, and it failed.
                    walk.moved_past(i, reason, last);
                    continue;
                }
            }
            match walk.target(i, false).await {
                Tried::Answered(response, line) => {
                    break 'walk walk.answered(response, line, pos as u32, i);
                }
                Tried::HedgeWon(response, line, left) => {
                    break 'walk walk.hedge_won(response, line, i, left);
                }
                Tried::Skipped(_) if again => {}
                Tried::Skipped(reason) => {
                    passed.skipped(reason, pos, i);
                    walk.moved_past(i, reason, last);
                }
                Tried::Failed(failure) => {
                    if !may_advance(failure.reason, failure.status, &route.spec.fallback) {
                        break 'walk walk.failed(failure, pos as u32);
                    }
                    if !again {
                        walk.moved_past(i, failure.reason, last);
                    }
                    passed.last_failure = Some(failure);
                    if Instant::now() >= walk.budget {
                        break;
                    }
                }
            }
        }
        if let Some((pos, first)) = passed.all_open(walk.sent) {
            break 'walk walk.forced(first, pos as u32, passed.position).await;
        }
        let last = match passed.last_failure.take() {
            Some(f) => f,
            None => walk.all_skipped(),
        };
        walk.failed(last, passed.position)
    };
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
    /// The targets whose translation could not take the request, and why (a feature
    /// their API lacks, or a malformed body), in the order they were met.
    pub refused: Vec<(u8, TranslateError)>,
    /// Images and documents fetched for targets that cannot fetch a URL themselves
    /// (docs/translation.md#documents-and-media), kept for every target of the walk; and
    /// the URLs that could not be.
    pub fetched: crate::providers::translate::Fetched,
    pub fetched_held: Vec<super::answer::AnswerHeld>,
    pub unfetched: Vec<(String, String)>,
    /// Resuming a broken stream (docs/streaming.md#resume-after-commit): the text the
    /// client has, which each target is asked to continue (a target that cannot is skipped
    /// as `cannotResume`); and how much of it the last target's prefill carried.
    pub prefill: Option<&'a str>,
    pub prefilled: usize,
    /// First-token hedging, on a route that hedges (see `hedge`).
    pub hedge: Option<Box<Hedging>>,
    /// The walk came back to a target the failback ramp passed over: no ramp now.
    pub unramped: bool,
    /// The order the walk takes (empty for a continuation's walk, whose targets may
    /// then each use the whole budget): what a target without a timeout leaves the
    /// targets after it (`outcome::share_end`).
    pub order: Order,
}

impl<'a, 'c, T> Walk<'a, 'c, T> {
    pub(super) fn new(
        transport: &'a T,
        gw: &'a Gateway,
        route: &'a RouteRt,
        call: &'a Call<'c>,
        budget: Instant,
    ) -> Self {
        Walk {
            transport,
            gw,
            route,
            call,
            budget,
            log: Vec::new(),
            sent: 0,
            waited: Duration::ZERO,
            shortest_retry_after: None,
            refused: Vec::new(),
            fetched: Default::default(),
            fetched_held: Vec::new(),
            unfetched: Vec::new(),
            prefill: None,
            prefilled: 0,
            hedge: None,
            unramped: false,
            order: Order::default(),
        }
    }
}

/// What trying one target came to.
pub(super) enum Tried {
    Answered(Response<Body>, Option<Arc<LineSlot>>),
    /// A hedge beside the target's try answered first (see `hedge`); the request
    /// left the target for this reason.
    HedgeWon(Response<Body>, Option<Arc<LineSlot>>, Reason),
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
    /// The first target the failback ramp passed over.
    first_ramping: Option<u8>,
    /// The last failure of a target that was tried.
    last_failure: Option<Failure>,
}

impl Passed {
    fn skipped(&mut self, reason: Reason, pos: usize, i: u8) {
        self.skipped += 1;
        self.skipped_open += usize::from(reason == Reason::CircuitOpen);
        // A target that cannot serve the API called, or something the request needs,
        // is no reason not to try one whose circuit is open.
        self.skipped_unserved += usize::from(matches!(
            reason,
            Reason::UnsupportedSurface | Reason::UnsupportedFeature
        ));
        if reason == Reason::CircuitOpen && self.first_open.is_none() {
            self.first_open = Some((pos, i));
        }
        if reason == Reason::RampingUp && self.first_ramping.is_none() {
            self.first_ramping = Some(i);
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
            Tried::HedgeWon(response, line, left) => self.hedge_won(response, line, i, left),
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
        if i == 0 {
            counters::inc(&self.route.counters.primary_answers);
        }
        let t = &self.route.targets[i as usize];
        Outcome {
            response,
            attempts: self.sent,
            fallbacks: pos,
            target: Some(t.credential.target_header.clone()),
            model: t.model_header(self.call.client_model),
            answered_by: Some(i),
            log: std::mem::take(&mut self.log),
            stream_line,
        }
    }

    /// The hedge beside target `i`'s try answered: the request left `i` for `left`,
    /// and the hedge's target answered (a fallback when it is not the first).
    fn hedge_won(
        &mut self,
        response: Response<Body>,
        stream_line: Option<Arc<LineSlot>>,
        i: u8,
        left: Reason,
    ) -> Outcome {
        self.moved_past(i, left, false);
        let (pos, j) = self.hedge_target().unwrap_or((0, i));
        self.answered(response, stream_line, pos, j)
    }

    fn failed(&mut self, failure: Failure, fallbacks: u32) -> Outcome {
        counters::inc(&self.route.counters.failed);
        // Nothing was sent and no target can serve what the request needs (each one
        // refused it, or cannot serve the API called): that is the answer, a 400
        // naming the field and the targets tried
        // (docs/translation.md#a-target-that-cannot-serve-a-feature), not "no target
        // available".
        let unservable = |l: &AttemptLog| {
            matches!(
                l.reason,
                Reason::UnsupportedFeature
                    | Reason::UnsupportedParameter
                    | Reason::UnsupportedSurface
            )
        };
        if self.sent == 0 && !self.refused.is_empty() && self.log.iter().all(unservable) {
            let response = unservable_request(self.route, self.call, &self.refused, &self.log);
            return Outcome {
                response,
                attempts: 0,
                fallbacks,
                target: None,
                model: None,
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

#[cfg(test)]
pub(super) mod tests {
    //! The walk on tokio's paused clock, its upstream a script: every wait (an
    //! answer's delay, a backoff, a Retry-After) is exact, and nothing is sent.

    use std::collections::VecDeque;
    use std::sync::Mutex;

    use axum::http::{HeaderMap, HeaderValue, StatusCode};
    use switchback_crds::config::{Retry, Strategy};
    use tokio::time::{sleep, timeout_at};

    use super::super::attempt::{Attempt, Attempted, timed_out};
    use super::*;
    use crate::config::snapshot::TargetRt;
    use crate::pipeline::order::tests::route;
    use crate::wire::rewrite::JsonStr;
    use crate::wire::surface::Surface;

    /// What one try answers, after how long.
    #[derive(Clone, Copy)]
    enum Play {
        Ok,
        Fail(Reason, Option<u16>, Option<Duration>),
    }

    const MS: Duration = Duration::from_millis(1);

    /// An upstream that answers each target's tries as scripted, within the try's
    /// deadline as the real one does, and remembers when each try came.
    struct Script<'r> {
        route: &'r RouteRt,
        plays: Mutex<Vec<VecDeque<(Duration, Play)>>>,
        tries: Mutex<Vec<(u8, Instant)>>,
        /// The key each try was sent with.
        keys: Mutex<Vec<u8>>,
    }

    impl<'r> Script<'r> {
        fn new(route: &'r RouteRt, plays: &[&[(Duration, Play)]]) -> Self {
            Self {
                route,
                plays: Mutex::new(plays.iter().map(|p| p.iter().copied().collect()).collect()),
                tries: Mutex::default(),
                keys: Mutex::default(),
            }
        }

        /// The targets tried, in order.
        fn targets(&self) -> Vec<u8> {
            self.tries.lock().unwrap().iter().map(|(i, _)| *i).collect()
        }

        /// When each try started, from `start`.
        fn at(&self, start: Instant) -> Vec<Duration> {
            let tries = self.tries.lock().unwrap();
            tries.iter().map(|(_, at)| *at - start).collect()
        }
    }

    impl Transport for Script<'_> {
        async fn attempt(&self, a: Attempt<'_, '_>) -> Attempted {
            let i = self
                .route
                .targets
                .iter()
                .position(|t| std::ptr::eq(t, a.target))
                .expect("a target of the route") as u8;
            self.tries.lock().unwrap().push((i, Instant::now()));
            self.keys.lock().unwrap().push(a.key);
            let next = self.plays.lock().unwrap()[i as usize].pop_front();
            let (delay, play) = next.expect("a try the script foresaw");
            if timeout_at(a.deadline, sleep(delay)).await.is_err() {
                return Attempted::Failed(Failure::bare(timed_out(a.budget)));
            }
            match play {
                Play::Ok => Attempted::Committed(Response::new(Body::empty()), None),
                Play::Fail(reason, status, retry_after) => Attempted::Failed(Failure {
                    reason,
                    status,
                    retry_after,
                    answer: None,
                }),
            }
        }
    }

    fn fail(status: u16) -> Play {
        let reason = crate::providers::classify::classify_status(status, b"");
        Play::Fail(reason, Some(status), None)
    }

    fn rate_limited(retry_after: Duration) -> Play {
        Play::Fail(Reason::RateLimited, Some(429), Some(retry_after))
    }

    /// A route of `n` targets on one credential, tried in declared order.
    fn targets(n: usize) -> RouteRt {
        route(Strategy::Fallback, vec![(1, None); n])
    }

    fn retry(attempts: u32, backoff_ms: u64) -> Retry {
        Retry {
            attempts,
            initial_backoff_ms: backoff_ms,
            max_backoff_ms: backoff_ms,
            ..Retry::default()
        }
    }

    /// Walk `route` once with `script`, from now, on a gateway of its own.
    async fn walk_once(route: &RouteRt, script: &Script<'_>) -> Outcome {
        walk_with(
            &Gateway::new(1024, "test".into(), 1).unwrap(),
            route,
            script,
        )
        .await
    }

    /// Walk `route` once over `transport` on `gw`: a unary chat completion for
    /// model `m` (the hedging tests share it).
    pub(in crate::pipeline) async fn walk_with<T: Transport>(
        gw: &Gateway,
        route: &RouteRt,
        transport: &T,
    ) -> Outcome {
        let (headers, id) = (HeaderMap::new(), HeaderValue::from_static("req-1"));
        let call = Call {
            surface: Surface::ChatCompletions,
            client_model: "m",
            client_model_json: JsonStr::new("m"),
            body: bytes::Bytes::from_static(br#"{"model":"m","messages":[]}"#),
            stream: false,
            client_headers: &headers,
            request_id: &id,
            hops: 0,
            client: None,
            include_usage: None,
            strip_usage: false,
            reservation: None,
            abandoned: &crate::pipeline::STAYS,
        };
        walk(transport, gw, route, &call, 0.0).await
    }

    pub(in crate::pipeline) fn reasons(outcome: &Outcome) -> Vec<(u8, Reason)> {
        outcome.log.iter().map(|l| (l.target, l.reason)).collect()
    }

    fn target(route: &RouteRt, i: usize) -> &TargetRt {
        &route.targets[i]
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_waits_its_backoff_then_the_next_target_answers() {
        let mut route = targets(2);
        route.targets[0].spec.retry = retry(2, 100);
        let script = Script::new(
            &route,
            &[
                &[(10 * MS, fail(503)), (10 * MS, fail(503))],
                &[(MS, Play::Ok)],
            ],
        );
        let start = Instant::now();
        let outcome = walk_once(&route, &script).await;
        assert_eq!(outcome.response.status(), StatusCode::OK);
        assert_eq!(script.targets(), [0, 0, 1]);
        let at = script.at(start);
        // Full jitter: the second try waits less than the backoff after the first
        // ends; tokio's timer rounds a deadline up to its next millisecond, so a draw
        // just under 100 ms wakes at 110 ms.
        assert!(at[1] >= 10 * MS && at[1] <= 110 * MS, "{at:?}");
        assert_eq!(at[2], at[1] + 10 * MS, "the next target at once");
        assert_eq!((outcome.attempts, outcome.fallbacks), (3, 1));
        assert_eq!(outcome.answered_by, Some(1));
        assert_eq!(
            reasons(&outcome),
            [(0, Reason::Status5xx), (0, Reason::Status5xx)]
        );
        let c = &target(&route, 0).counters;
        assert_eq!(counters::get(&c.retries), 1);
        assert_eq!(c.fallbacks_away.get(Reason::Status5xx), 1);
        assert_eq!(counters::get(&route.counters.fallbacks), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_waited_and_parks_the_target_for_later_requests() {
        let mut route = targets(2);
        route.spec.timeout_ms = 10_000;
        route.targets[0].spec.retry = retry(2, 100);
        let script = Script::new(
            &route,
            &[&[(MS, rate_limited(2 * 1000 * MS)), (MS, Play::Ok)], &[]],
        );
        let start = Instant::now();
        let outcome = walk_once(&route, &script).await;
        assert_eq!(outcome.answered_by, Some(0));
        assert_eq!(script.at(start), [Duration::ZERO, 2001 * MS]);
        assert_eq!(outcome.log[0].retry_after, Some(2000 * MS));
        // The park was set at the 429, for the Retry-After.
        let parked = target(&route, 0).state.parked_until_ms();
        assert!((2000..=2002).contains(&parked), "{parked}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_over_the_cap_abandons_the_target_and_parks_it_for_the_cap() {
        let mut route = targets(2);
        route.targets[0].spec.retry = retry(3, 100);
        route.spec.fallback.max_retry_after_ms = 30_000;
        let script = Script::new(
            &route,
            &[&[(MS, rate_limited(60_000 * MS))], &[(MS, Play::Ok)]],
        );
        let start = Instant::now();
        let outcome = walk_once(&route, &script).await;
        assert_eq!(script.targets(), [0, 1], "no retry spent waiting a minute");
        assert_eq!(script.at(start), [Duration::ZERO, MS]);
        assert_eq!(outcome.answered_by, Some(1));
        let parked = target(&route, 0).state.parked_until_ms();
        assert!((30_000..=30_001).contains(&parked), "{parked}");

        // The next request passes the parked target over without sending to it.
        let script = Script::new(&route, &[&[], &[(MS, Play::Ok)]]);
        let outcome = walk_once(&route, &script).await;
        assert_eq!(script.targets(), [1]);
        assert_eq!(reasons(&outcome), [(0, Reason::Parked)]);
        assert_eq!(outcome.fallbacks, 1, "a skipped target is moved past too");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_longer_than_the_budget_leaves_lets_the_next_target_try_now() {
        let mut route = targets(2);
        route.spec.timeout_ms = 1_000;
        route.targets[0].spec.retry = retry(3, 100);
        let script = Script::new(
            &route,
            &[
                &[(
                    MS,
                    Play::Fail(Reason::Status5xx, Some(503), Some(5_000 * MS)),
                )],
                &[(MS, Play::Ok)],
            ],
        );
        let start = Instant::now();
        let outcome = walk_once(&route, &script).await;
        assert_eq!(script.targets(), [0, 1]);
        assert_eq!(script.at(start), [Duration::ZERO, MS]);
        assert_eq!(outcome.answered_by, Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_timeout_advances_at_once_without_a_retry() {
        let mut route = targets(2);
        route.targets[0].spec.retry = retry(3, 100);
        route.targets[0].spec.timeout_ms = Some(100);
        let script = Script::new(&route, &[&[(1_000 * MS, Play::Ok)], &[(MS, Play::Ok)]]);
        let start = Instant::now();
        let outcome = walk_once(&route, &script).await;
        assert_eq!(script.targets(), [0, 1]);
        assert_eq!(script.at(start), [Duration::ZERO, 100 * MS]);
        assert_eq!(reasons(&outcome), [(0, Reason::Timeout)]);
        assert_eq!(outcome.answered_by, Some(1));
    }

    /// docs/request-lifecycle.md#time-budgets: with the defaults (a 60 s budget, no target
    /// timeouts), a first target that never answers gets half the budget, and the second
    /// answers.
    #[tokio::test(start_paused = true)]
    async fn a_hung_target_leaves_the_next_one_its_share_of_the_budget() {
        let mut route = targets(2);
        route.spec.timeout_ms = 60_000;
        let script = Script::new(
            &route,
            &[&[(3_600_000 * MS, Play::Ok)], &[(10 * MS, Play::Ok)]],
        );
        let start = Instant::now();
        let outcome = walk_once(&route, &script).await;
        assert_eq!(outcome.response.status(), StatusCode::OK);
        assert_eq!(outcome.answered_by, Some(1));
        assert_eq!(script.at(start), [Duration::ZERO, 30_000 * MS]);
        assert_eq!(reasons(&outcome), [(0, Reason::Timeout)]);

        // Three targets: each later one is owed a third; the second, hung too, leaves
        // the last all that remains.
        let mut route = targets(3);
        route.spec.timeout_ms = 60_000;
        let hang = [(3_600_000 * MS, Play::Ok)];
        let script = Script::new(&route, &[&hang, &hang, &[(MS, Play::Ok)]]);
        let start = Instant::now();
        let outcome = walk_once(&route, &script).await;
        assert_eq!(outcome.answered_by, Some(2));
        assert_eq!(script.at(start), [Duration::ZERO, 20_000 * MS, 40_000 * MS]);

        // A later target's own timeout is what it is owed; the last may use all.
        let mut route = targets(2);
        route.spec.timeout_ms = 60_000;
        route.targets[1].spec.timeout_ms = Some(5_000);
        let script = Script::new(&route, &[&hang, &hang]);
        let start = Instant::now();
        let outcome = walk_once(&route, &script).await;
        assert_eq!(script.at(start), [Duration::ZERO, 55_000 * MS]);
        assert_eq!(outcome.response.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(start.elapsed(), 60_000 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_ends_the_walk_with_504() {
        let mut route = targets(3);
        route.spec.timeout_ms = 500;
        // A timeout of its own past the budget: the first may spend all of it.
        route.targets[0].spec.timeout_ms = Some(10_000);
        let slow = [(10_000 * MS, Play::Ok)];
        let script = Script::new(&route, &[&slow, &slow, &slow]);
        let start = Instant::now();
        let outcome = walk_once(&route, &script).await;
        assert_eq!(start.elapsed(), 500 * MS);
        assert_eq!(
            script.targets(),
            [0],
            "nothing is tried once the budget is spent"
        );
        assert_eq!(outcome.response.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(reasons(&outcome), [(0, Reason::Budget)]);
        assert_eq!(counters::get(&route.counters.failed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_circuit_skips_its_target_until_every_one_is_open() {
        let mut route = targets(2);
        route.spec.circuit_breaker.consecutive_failures = 1;
        route.spec.circuit_breaker.open_for_ms = 30_000;
        // The first request opens the first target's circuit.
        let script = Script::new(&route, &[&[(MS, fail(503))], &[(MS, Play::Ok)]]);
        let outcome = walk_once(&route, &script).await;
        assert_eq!(script.targets(), [0, 1]);
        assert_eq!(outcome.answered_by, Some(1));
        // The next passes it over.
        let script = Script::new(&route, &[&[], &[(MS, fail(503))]]);
        let outcome = walk_once(&route, &script).await;
        assert_eq!(script.targets(), [1]);
        assert_eq!(
            reasons(&outcome),
            [(0, Reason::CircuitOpen), (1, Reason::Status5xx)]
        );
        assert_eq!(outcome.response.status(), StatusCode::BAD_GATEWAY);
        // Both open now: the first is tried anyway, and its success closes it.
        let script = Script::new(&route, &[&[(MS, Play::Ok)], &[]]);
        let outcome = walk_once(&route, &script).await;
        assert_eq!(script.targets(), [0]);
        assert_eq!(outcome.answered_by, Some(0));
        assert!(!target(&route, 0).state.breaker.is_open(Instant::now()));
        assert!(target(&route, 1).state.breaker.is_open(Instant::now()));
    }

    /// docs/request-lifecycle.md#key-pools: a 429 parks the key sent and the same try goes
    /// at once to the next key (an attempt, not a retry or a fallback); a 401 rejects the
    /// key for `keyRejectedFor`, and later requests pass it over.
    #[tokio::test(start_paused = true)]
    async fn a_key_set_aside_hands_the_same_try_to_the_next_key() {
        let mut route = crate::pipeline::order::tests::route_with_keys(
            Strategy::Fallback,
            vec![(1, None); 2],
            3,
        );
        route.spec.timeout_ms = 60_000;
        let keys = &route.targets[0].credential.keys;
        let script = Script::new(
            &route,
            &[&[(MS, rate_limited(20_000 * MS)), (MS, Play::Ok)], &[]],
        );
        let start = Instant::now();
        let outcome = walk_once(&route, &script).await;
        assert_eq!(outcome.answered_by, Some(0));
        assert_eq!((outcome.attempts, outcome.fallbacks), (2, 0));
        assert_eq!(*script.keys.lock().unwrap(), [0, 1]);
        assert_eq!(
            script.at(start),
            [Duration::ZERO, MS],
            "at once, no backoff"
        );
        assert_eq!(reasons(&outcome), [(0, Reason::RateLimited)]);
        assert_eq!(counters::get(&target(&route, 0).counters.retries), 0);
        assert_eq!(
            keys.get(0).state.shown(1).0,
            switchback_crds::stats::KeyState::Parked
        );
        assert_eq!(
            target(&route, 0).state.parked_until_ms(),
            0,
            "the target is not"
        );

        // The next request takes the next key in turn; a 401 rejects it, and the next
        // usable one answers.
        let script = Script::new(&route, &[&[(MS, fail(401)), (MS, Play::Ok)], &[]]);
        let outcome = walk_once(&route, &script).await;
        assert_eq!(
            outcome.answered_by,
            Some(0),
            "authError is opt-in, but a key is not the target"
        );
        assert_eq!(*script.keys.lock().unwrap(), [1, 2]);
        let rejected = keys.get(1).state.shown(10);
        assert_eq!(rejected.0, switchback_crds::stats::KeyState::Rejected);
        assert!(
            rejected.1.unwrap() >= 300_000,
            "keyRejectedFor, 5m by default"
        );

        // Only key 2 is usable now: every request takes it.
        let script = Script::new(&route, &[&[(MS, Play::Ok), (MS, Play::Ok)], &[]]);
        walk_once(&route, &script).await;
        walk_once(&route, &script).await;
        assert_eq!(*script.keys.lock().unwrap(), [2, 2]);

        // Its 429 leaves no key usable: the target counts as rate limited, parked until
        // its first key is back, and the walk moves on.
        let script = Script::new(
            &route,
            &[&[(MS, rate_limited(5_000 * MS))], &[(MS, Play::Ok)]],
        );
        let outcome = walk_once(&route, &script).await;
        assert_eq!(script.targets(), [0, 1]);
        assert_eq!(outcome.answered_by, Some(1));
        let now = Gateway::new(1024, "t".into(), 1).unwrap().now_ms();
        let parked = target(&route, 0).state.parked_until_ms();
        assert!(
            parked > now && parked <= now + 5_001,
            "the first key back: {parked}"
        );
        assert_eq!(keys.usable(now), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_the_route_does_not_fail_over_on_ends_the_chain() {
        let route = targets(2);
        let script = Script::new(&route, &[&[(MS, fail(401))], &[(MS, Play::Ok)]]);
        let outcome = walk_once(&route, &script).await;
        assert_eq!(script.targets(), [0], "authError is opt-in");
        assert_eq!(reasons(&outcome), [(0, Reason::AuthError)]);
        assert_eq!(outcome.answered_by, None);
        assert_eq!(outcome.fallbacks, 0);
    }
}

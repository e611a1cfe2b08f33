//! First-token hedging and the failback ramp through the walk
//! (docs/streaming.md#first-token-hedging), on tokio's paused clock with a scripted
//! upstream: every wait is exact, and the script records the tries it was sent and those
//! dropped before they ended (the connection a real transport would close).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Response, StatusCode};
use switchback_crds::config::{Hedge, Strategy};
use tokio::time::{Instant, sleep, timeout_at};

use super::attempt::{Attempt, Attempted, Failure, Transport, timed_out};
use super::walk::tests::{reasons, walk_with};
use crate::config::snapshot::RouteRt;
use crate::gateway::Gateway;
use crate::limits::hedge::HedgeBudget;
use crate::observe::counters::{self, RouteTargetCounters};
use crate::observe::reason::Reason;
use crate::pipeline::order::tests::route;

const MS: Duration = Duration::from_millis(1);

/// What one try answers, after how long: `Ok`, or a 503.
#[derive(Clone, Copy)]
enum Play {
    Ok(Duration),
    Fail(Duration),
}

/// An upstream that answers each target's tries as scripted (the last play of a
/// target repeats), within the try's deadline, and records which tries came when
/// and which were dropped unfinished.
struct Script<'r> {
    route: &'r RouteRt,
    plays: Mutex<Vec<VecDeque<Play>>>,
    tries: Mutex<Vec<(u8, Instant)>>,
    dropped: Arc<Mutex<Vec<(u8, Instant)>>>,
}

/// Records its try as dropped unless it ended.
struct Unfinished(u8, Arc<Mutex<Vec<(u8, Instant)>>>, bool);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.2 {
            self.1.lock().unwrap().push((self.0, Instant::now()));
        }
    }
}

impl<'r> Script<'r> {
    fn new(route: &'r RouteRt, plays: &[&[Play]]) -> Self {
        Self {
            route,
            plays: Mutex::new(plays.iter().map(|p| p.iter().copied().collect()).collect()),
            tries: Mutex::default(),
            dropped: Arc::default(),
        }
    }

    fn targets(&self) -> Vec<u8> {
        self.tries.lock().unwrap().iter().map(|(i, _)| *i).collect()
    }

    fn at(&self, start: Instant) -> Vec<Duration> {
        let tries = self.tries.lock().unwrap();
        tries.iter().map(|(_, at)| *at - start).collect()
    }

    /// The tries dropped unfinished: their target, and when, from `start`.
    fn dropped(&self, start: Instant) -> Vec<(u8, Duration)> {
        let d = self.dropped.lock().unwrap();
        d.iter().map(|(i, at)| (*i, *at - start)).collect()
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
        let play = {
            let mut plays = self.plays.lock().unwrap();
            let q = &mut plays[i as usize];
            if q.len() > 1 {
                q.pop_front()
            } else {
                q.front().copied()
            }
        };
        let play = play.expect("a try the script foresaw");
        let mut guard = Unfinished(i, self.dropped.clone(), false);
        let delay = match play {
            Play::Ok(d) | Play::Fail(d) => d,
        };
        let waited = timeout_at(a.deadline, sleep(delay)).await;
        guard.2 = true;
        if waited.is_err() {
            return Attempted::Failed(Failure::bare(timed_out(a.budget)));
        }
        match play {
            Play::Ok(_) => Attempted::Committed(Response::new(Body::empty()), None),
            Play::Fail(_) => Attempted::Failed(Failure {
                reason: Reason::Status5xx,
                status: Some(503),
                retry_after: None,
                answer: None,
            }),
        }
    }
}

/// A route of `n` targets in declared order, hedging after `after_ms` at most
/// `max_percent` of its requests, with a budget of `timeout_ms`.
fn hedged(n: usize, after_ms: u64, max_percent: u32, timeout_ms: u64) -> RouteRt {
    let mut r = route(Strategy::Fallback, vec![(1, None); n]);
    r.spec.timeout_ms = timeout_ms;
    r.spec.hedge = Some(Hedge {
        after_ms,
        max_percent,
    });
    r.hedge = Some(Arc::default());
    r
}

fn gateway() -> Gateway {
    Gateway::new(1024, "test".into(), 1).unwrap()
}

fn c(route: &RouteRt, i: usize) -> &RouteTargetCounters {
    &route.targets[i].counters
}

/// Hedges started, won, lost and failed on target `i`.
fn hedges(route: &RouteRt, i: usize) -> [u64; 4] {
    let c = c(route, i);
    [&c.hedges, &c.hedge_wins, &c.hedge_losses, &c.hedge_failures].map(counters::get)
}

#[tokio::test(start_paused = true)]
async fn a_slow_primary_is_hedged_the_backup_wins_and_the_primary_is_dropped_at_once() {
    let route = hedged(2, 100, 100, 10_000);
    let script = Script::new(&route, &[&[Play::Ok(1_000 * MS)], &[Play::Ok(30 * MS)]]);
    let start = Instant::now();
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(outcome.response.status(), StatusCode::OK);
    assert_eq!(
        start.elapsed(),
        130 * MS,
        "the backup's answer, not the primary's"
    );
    assert_eq!(script.targets(), [0, 1]);
    assert_eq!(
        script.at(start),
        [Duration::ZERO, 100 * MS],
        "started at `after`"
    );
    assert_eq!(
        script.dropped(start),
        [(0, 130 * MS)],
        "the primary is dropped as the hedge commits"
    );
    assert_eq!(outcome.answered_by, Some(1));
    assert_eq!((outcome.attempts, outcome.fallbacks), (2, 1));
    assert_eq!(reasons(&outcome), [(0, Reason::HedgeLost)]);
    assert_eq!(outcome.log[0].duration, 130 * MS);
    assert_eq!(hedges(&route, 1), [1, 1, 0, 0]);
    assert_eq!(hedges(&route, 0), [0; 4]);
    assert_eq!(counters::get(&route.counters.fallbacks), 1, "a fallback");
    assert_eq!(c(&route, 0).fallbacks_away.get(Reason::HedgeLost), 1);
    assert_eq!(c(&route, 0).failures.get(Reason::HedgeLost), 1);
    assert_eq!(counters::get(&c(&route, 1).successes), 1);
    assert_eq!(counters::get(&route.counters.attempts), 2);
}

#[tokio::test(start_paused = true)]
async fn a_primary_that_answers_before_after_is_not_hedged() {
    let route = hedged(2, 100, 100, 10_000);
    let script = Script::new(&route, &[&[Play::Ok(99 * MS)], &[Play::Ok(MS)]]);
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(script.targets(), [0]);
    assert_eq!(outcome.answered_by, Some(0));
    assert_eq!((outcome.attempts, outcome.fallbacks), (1, 0));
    assert!(outcome.log.is_empty());
    assert_eq!(hedges(&route, 1), [0; 4]);
    assert_eq!(script.dropped(Instant::now()), []);
}

#[tokio::test(start_paused = true)]
async fn the_primary_answering_first_cancels_the_hedge() {
    let route = hedged(2, 100, 100, 10_000);
    let script = Script::new(&route, &[&[Play::Ok(150 * MS)], &[Play::Ok(500 * MS)]]);
    let start = Instant::now();
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(start.elapsed(), 150 * MS);
    assert_eq!(script.targets(), [0, 1]);
    assert_eq!(script.dropped(start), [(1, 150 * MS)]);
    assert_eq!(outcome.answered_by, Some(0));
    assert_eq!((outcome.attempts, outcome.fallbacks), (2, 0));
    assert_eq!(reasons(&outcome), [(1, Reason::HedgeLost)]);
    assert_eq!(outcome.log[0].duration, 50 * MS);
    assert_eq!(hedges(&route, 1), [1, 0, 1, 0]);
    assert_eq!(counters::get(&route.counters.fallbacks), 0);
    assert_eq!(c(&route, 1).fallbacks_away.get(Reason::HedgeLost), 0);
}

#[tokio::test(start_paused = true)]
async fn the_hedge_goes_to_the_target_a_failover_would_try_next() {
    let route = hedged(3, 100, 100, 10_000);
    // The second target is parked after a 429: a failover would pass it over.
    route.targets[1].state.park_until(60_000);
    let script = Script::new(
        &route,
        &[&[Play::Ok(1_000 * MS)], &[Play::Ok(MS)], &[Play::Ok(MS)]],
    );
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(script.targets(), [0, 2]);
    assert_eq!(outcome.answered_by, Some(2));
    assert_eq!(outcome.fallbacks, 2);
    assert_eq!(reasons(&outcome), [(0, Reason::HedgeLost)]);
    assert_eq!(hedges(&route, 2), [1, 1, 0, 0]);

    // With nothing eligible after the slow one, it is waited for.
    let route = hedged(2, 100, 100, 10_000);
    route.targets[1].state.park_until(60_000);
    let script = Script::new(&route, &[&[Play::Ok(1_000 * MS)], &[Play::Ok(MS)]]);
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(script.targets(), [0]);
    assert_eq!(outcome.answered_by, Some(0));
}

#[tokio::test(start_paused = true)]
async fn a_hedge_never_starts_past_the_calls_budget() {
    // `after` is the budget: no hedge; the primary (a timeout of its own past the
    // budget: it may spend all of it) runs out of budget.
    let mut route = hedged(2, 1_000, 100, 1_000);
    route.targets[0].spec.timeout_ms = Some(10_000);
    let script = Script::new(&route, &[&[Play::Ok(5_000 * MS)], &[Play::Ok(MS)]]);
    let start = Instant::now();
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(start.elapsed(), 1_000 * MS);
    assert_eq!(
        script.targets(),
        [0],
        "nothing started at or past the budget"
    );
    assert_eq!(outcome.response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(hedges(&route, 1), [0; 4]);

    // Just before it: the hedge starts, and answers within it.
    let mut route = hedged(2, 900, 100, 1_000);
    route.targets[0].spec.timeout_ms = Some(10_000);
    let script = Script::new(&route, &[&[Play::Ok(5_000 * MS)], &[Play::Ok(MS)]]);
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(script.targets(), [0, 1]);
    assert_eq!(outcome.answered_by, Some(1));
}

#[tokio::test(start_paused = true)]
async fn at_most_max_percent_of_the_requests_are_hedged_under_load() {
    let route = hedged(2, 100, 10, 10_000);
    let script = Script::new(&route, &[&[Play::Ok(300 * MS)], &[Play::Ok(MS)]]);
    let gw = gateway();
    // A hundred requests at once, every one slow enough to be hedged.
    let walks = (0..100).map(|_| walk_with(&gw, &route, &script));
    let outcomes = futures_util::future::join_all(walks).await;
    let by_backup = outcomes.iter().filter(|o| o.answered_by == Some(1)).count();
    assert_eq!(by_backup, 10, "10 % of 100");
    assert_eq!(script.targets().iter().filter(|&&t| t == 1).count(), 10);
    assert_eq!(hedges(&route, 1), [10, 10, 0, 0]);
    let budget: &HedgeBudget = route.hedge.as_deref().unwrap();
    assert_eq!(budget.window(gw.now_ms()), (100, 10));
    // Eighty more a minute later: the window now holds only them.
    tokio::time::advance(Duration::from_secs(60)).await;
    let walks = (0..80).map(|_| walk_with(&gw, &route, &script));
    futures_util::future::join_all(walks).await;
    assert_eq!(hedges(&route, 1)[0], 18, "8 of 80");
}

#[tokio::test(start_paused = true)]
async fn a_primary_that_fails_while_the_hedge_runs_leaves_the_answer_to_the_hedge() {
    let route = hedged(2, 100, 100, 10_000);
    let script = Script::new(&route, &[&[Play::Fail(150 * MS)], &[Play::Ok(200 * MS)]]);
    let start = Instant::now();
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(start.elapsed(), 300 * MS);
    assert_eq!(script.targets(), [0, 1], "the hedge is not sent twice");
    assert_eq!(script.dropped(start), []);
    assert_eq!(outcome.answered_by, Some(1));
    assert_eq!(reasons(&outcome), [(0, Reason::Status5xx)]);
    assert_eq!(c(&route, 0).fallbacks_away.get(Reason::Status5xx), 1);
    assert_eq!(hedges(&route, 1), [1, 1, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_hedge_is_not_tried_again_by_the_walk() {
    let route = hedged(3, 100, 100, 10_000);
    let script = Script::new(
        &route,
        &[
            &[Play::Fail(300 * MS)],
            &[Play::Fail(50 * MS)],
            &[Play::Ok(MS)],
        ],
    );
    let start = Instant::now();
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(script.targets(), [0, 1, 2]);
    assert_eq!(script.at(start), [Duration::ZERO, 100 * MS, 300 * MS]);
    assert_eq!(outcome.answered_by, Some(2));
    assert_eq!((outcome.attempts, outcome.fallbacks), (3, 2));
    assert_eq!(
        reasons(&outcome),
        [(1, Reason::Status5xx), (0, Reason::Status5xx)]
    );
    assert_eq!(hedges(&route, 1), [1, 0, 0, 1]);
    assert_eq!(c(&route, 1).fallbacks_away.get(Reason::Status5xx), 1);

    // The hedge fails and the slow primary answers after all.
    let route = hedged(2, 100, 100, 10_000);
    let script = Script::new(&route, &[&[Play::Ok(300 * MS)], &[Play::Fail(MS)]]);
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(outcome.answered_by, Some(0));
    assert_eq!(reasons(&outcome), [(1, Reason::Status5xx)]);
    assert_eq!(hedges(&route, 1), [1, 0, 0, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_route_without_hedge_never_hedges() {
    let mut route = hedged(2, 100, 100, 10_000);
    route.spec.hedge = None;
    route.hedge = None;
    let script = Script::new(&route, &[&[Play::Ok(1_000 * MS)], &[Play::Ok(MS)]]);
    let outcome = walk_with(&gateway(), &route, &script).await;
    assert_eq!(script.targets(), [0]);
    assert_eq!(outcome.answered_by, Some(0));
}

/// A route of `n` targets ramping up over 30 s, its first target's circuit opened
/// and then closed by a probe now.
async fn ramping(n: usize) -> RouteRt {
    let mut route = route(Strategy::Fallback, vec![(1, None); n]);
    route.spec.circuit_breaker.ramp_up_ms = Some(30_000);
    let cb = &route.spec.circuit_breaker;
    let breaker = &route.targets[0].state.breaker;
    let open_for = Duration::from_millis(cb.open_for_ms);
    breaker.failure(Instant::now(), 1, open_for, false);
    tokio::time::advance(open_for).await;
    assert_eq!(
        breaker.admit(Instant::now()),
        crate::limits::circuit::Admit::Probe
    );
    breaker.success(true);
    route
}

#[tokio::test(start_paused = true)]
async fn the_ramp_gives_a_closed_targets_requests_back_from_ten_to_a_hundred_percent() {
    let route = ramping(2).await;
    let gw = gateway();
    let script = Script::new(&route, &[&[Play::Ok(MS)], &[Play::Ok(MS)]]);
    let closed = Instant::now();
    let mut shares = Vec::new();
    for at in [0, 10, 15, 20, 30] {
        tokio::time::advance((closed + Duration::from_secs(at)) - Instant::now()).await;
        let mut first = 0;
        for _ in 0..100 {
            // The answer takes 1 ms: 100 requests stay within 0.1 s of the point.
            first += usize::from(walk_with(&gw, &route, &script).await.answered_by == Some(0));
        }
        shares.push(first);
    }
    // 10 % at the close, 40 % at a third, 55 % half way, 70 %, all at the end.
    assert_eq!(shares, [10, 40, 55, 70, 100]);
    let skipped = c(&route, 0).failures.get(Reason::RampingUp);
    assert_eq!(skipped as usize, 500 - shares.iter().sum::<usize>());
    assert_eq!(c(&route, 0).fallbacks_away.get(Reason::RampingUp), skipped);
}

#[tokio::test(start_paused = true)]
async fn a_ramping_target_is_skipped_with_its_reason_but_answers_when_no_other_can() {
    let route = ramping(2).await;
    let gw = gateway();
    // Nine of the first ten requests go to the next target...
    let script = Script::new(&route, &[&[Play::Ok(MS)], &[Play::Ok(MS)]]);
    let outcome = walk_with(&gw, &route, &script).await;
    assert_eq!(script.targets(), [1]);
    assert_eq!(reasons(&outcome), [(0, Reason::RampingUp)]);
    assert_eq!((outcome.attempts, outcome.fallbacks), (1, 1));
    // ...unless it fails: the ramping target is healthy, and answers.
    let script = Script::new(&route, &[&[Play::Ok(MS)], &[Play::Fail(MS)]]);
    let outcome = walk_with(&gw, &route, &script).await;
    assert_eq!(script.targets(), [1, 0]);
    assert_eq!(outcome.answered_by, Some(0));
    assert_eq!(
        reasons(&outcome),
        [(0, Reason::RampingUp), (1, Reason::Status5xx)]
    );
    // Or when it cannot be tried at all.
    route.targets[1].state.park_until(60_000);
    let outcome = walk_with(&gw, &route, &script).await;
    assert_eq!(outcome.answered_by, Some(0));
    assert_eq!(
        reasons(&outcome),
        [(0, Reason::RampingUp), (1, Reason::Parked)]
    );
    // A route of one target has nowhere to send its share: no ramp.
    let route = ramping(1).await;
    let script = Script::new(&route, &[&[Play::Ok(MS)]]);
    let outcome = walk_with(&gw, &route, &script).await;
    assert!(outcome.log.is_empty());
    assert_eq!(outcome.answered_by, Some(0));
}

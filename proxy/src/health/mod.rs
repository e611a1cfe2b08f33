//! Background health (docs/request-lifecycle.md#probed-circuits): requests the proxy sends
//! on its own to learn how a target is doing, so no client request has to find out.
//!
//! - **Probed circuits** (`circuitBreaker.probeInterval`): once an open circuit's
//!   `openFor` has passed, one minimal request (one output token, `probe`), then one
//!   every interval while they fail; a success closes the circuit (the ramp, if any,
//!   starts), a failure keeps it open one more interval. Nothing is probed while a
//!   circuit is closed, unless the target has a health check.
//! - **Health checks** (a target's `healthCheck.interval`): the same request every
//!   interval while the circuit is closed too; `consecutiveFailures` failed checks in a
//!   row open the circuit, and each answered check's latency feeds the smoothed
//!   latency `least-latency` orders by. While the circuit is open, the checks are its
//!   probes (at `probeInterval`, or at the check's interval when that is 0s).
//!
//! One task ([`run`]) keeps the schedule: it wakes when a probe is due, when a circuit
//! opens or a config is applied ([`Health::wake`]), or when a probe ends, and starts
//! the probes that are due, each in a task of its own. A target shared by several
//! routes (same credential and model) has one state and is probed once, for the first
//! route that uses it (routes in `namespace/name` order): its settings, its counts.
//! Probes are counted per target (`Probes`) by outcome: `success`, or the failure's
//! reason.
//!
//! The fleet-wide view (issue 32 item 5) builds on the same state: the breaker's
//! transitions ([`crate::limits::circuit::Breaker::begin_probe`] and
//! [`crate::limits::circuit::Breaker::probe_done`], or `success`/`failure`), the keys'
//! park and rejection ends (`limits::keys`), and [`Probes::set_delegated`], which
//! tells this replica that another one probes the target.

pub mod fleet;
mod probe;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use crate::config::snapshot::TargetRt;
use crate::gateway::Gateway;
use crate::observe::counters::ByReason;
use crate::observe::reason::Reason;

/// The schedule's longest sleep: a config swap or an opened circuit wakes it sooner.
const IDLE: Duration = Duration::from_secs(60);

/// What the request path tells the prober.
#[derive(Debug, Default)]
pub struct Health {
    wake: Notify,
    /// The fleet's health view holds on this replica now (`fleet`), for `/metrics`.
    pub view_holds: AtomicBool,
}

impl Health {
    /// Look at the schedule again now: a circuit opened, a config was applied.
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

/// One target's probes: counts by outcome, the last one, and the health checks'
/// schedule. Part of the target's state, kept across reloads.
#[derive(Debug, Default)]
pub struct Probes {
    pub successes: AtomicU64,
    pub failures: ByReason,
    last: Mutex<Option<(Option<Reason>, SystemTime)>>,
    /// Health checks: when the next one is due (`None`: the first is due now), and
    /// whether one is running.
    schedule: Mutex<(Option<Instant>, bool)>,
    /// Another replica probes this target (the fleet's choice): this one sends none,
    /// and learns what the other found through the breaker.
    delegated: AtomicBool,
}

impl Probes {
    /// The last probe: `None` for a success, else its failure's reason; and when.
    pub fn last(&self) -> Option<(Option<Reason>, SystemTime)> {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, outcome: Result<(), Reason>) {
        match outcome {
            Ok(()) => {
                self.successes.fetch_add(1, Ordering::Relaxed);
            }
            Err(r) => self.failures.inc(r),
        }
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((outcome.err(), SystemTime::now()));
    }

    /// Whether this replica leaves the target's probes to another one. The fleet-wide
    /// view sets it (issue 32 item 5); nothing else does.
    pub fn set_delegated(&self, delegated: bool) {
        self.delegated.store(delegated, Ordering::Relaxed);
    }

    pub fn delegated(&self) -> bool {
        self.delegated.load(Ordering::Relaxed)
    }

    /// A health check is due at `now` (`every` apart): it is taken (marked running);
    /// or when the next is due.
    fn take_check(&self, now: Instant) -> Result<(), Option<Instant>> {
        let mut s = self.schedule.lock().unwrap_or_else(|p| p.into_inner());
        match *s {
            (_, true) => Err(None),
            (Some(at), false) if at > now => Err(Some(at)),
            _ => {
                s.1 = true;
                Ok(())
            }
        }
    }

    fn check_done(&self, next: Instant) {
        *self.schedule.lock().unwrap_or_else(|p| p.into_inner()) = (Some(next), false);
    }
}

/// Why a probe is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The circuit is open: the prober holds its half-open turn.
    Circuit,
    /// A health check of a target whose circuit is closed.
    Check,
}

/// What the schedule says of one target now.
enum Due {
    Now(Kind),
    At(Instant),
    Never,
}

/// Keeps the schedule for as long as the gateway runs.
pub async fn run(gw: Arc<Gateway>) {
    let mut running = JoinSet::new();
    loop {
        let next = start_due(&gw, &mut running, Instant::now());
        tokio::select! {
            () = sleep_until(next) => {}
            () = gw.health.wake.notified() => {}
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
    }
}

/// Starts every probe due at `now`; when the next one is due.
fn start_due(gw: &Arc<Gateway>, running: &mut JoinSet<()>, now: Instant) -> Instant {
    let snapshot = gw.snapshot();
    let mut next = now + IDLE;
    let mut seen = HashSet::new();
    for route in &snapshot.route_list {
        for (i, t) in route.targets.iter().enumerate() {
            if !seen.insert(Arc::as_ptr(&t.state)) {
                continue;
            }
            match due(t, now) {
                Due::Now(kind) => {
                    running.spawn(probe::run(gw.clone(), route.clone(), i, kind));
                }
                Due::At(at) => next = next.min(at),
                Due::Never => {}
            }
        }
    }
    next
}

/// Whether target `t` is to be probed now, later or not.
fn due(t: &TargetRt, now: Instant) -> Due {
    if t.state.probes.delegated() {
        return Due::Never;
    }
    let breaker = &t.state.breaker;
    if breaker.begin_probe(now) {
        return Due::Now(Kind::Circuit);
    }
    if let Some(at) = breaker.next_probe() {
        return Due::At(at);
    }
    if breaker.is_open(now) {
        // Half-open (a probe runs), or a client request probes it (probeInterval 0s).
        return Due::Never;
    }
    if t.spec.health_check.is_none() {
        return Due::Never;
    }
    match t.state.probes.take_check(now) {
        Ok(()) => Due::Now(Kind::Check),
        Err(Some(at)) => Due::At(at),
        // Running: its end wakes the schedule.
        Err(None) => Due::Never,
    }
}

/// How often an open circuit of `t` on `route` is probed: `probeInterval`, else the
/// target's health check interval; `None`: a client request is its half-open probe.
pub fn probe_every(
    route: &switchback_crds::config::Route,
    t: &switchback_crds::config::Target,
) -> Option<Duration> {
    let cb = &route.circuit_breaker;
    if cb.probes() {
        return Some(Duration::from_millis(cb.probe_interval_ms));
    }
    t.health_check.map(|h| Duration::from_millis(h.interval_ms))
}

//! The circuit breaker of one target (credential + upstream model): a small state
//! machine over failover-safe failures.
//!
//! Closed counts consecutive failures; at the threshold it opens for `openFor`. Once
//! that has passed, exactly one request is let through as a half-open probe: success
//! closes the circuit (and resets the open time), failure reopens it with the open
//! time doubled, capped at [`MAX_OPEN`]. The lock is held only for a state
//! transition, never across an await; a probe whose request is dropped hands its
//! turn back (see [`Probe`]).
//!
//! Probed circuits (`circuitBreaker.probeInterval`,
//! docs/request-lifecycle.md#probed-circuits): a breaker told to probe
//! ([`Breaker::set_probing`]) never lets a client request through as the half-open probe.
//! Once `openFor` has passed, the background prober (`health`) takes the turn
//! ([`Breaker::begin_probe`]) and reports what its own minimal request found
//! ([`Breaker::probe_done`]): a success closes the circuit (and starts the ramp), a failure
//! keeps it open for one more interval, never doubling anything.
//!
//! The failback ramp (`circuitBreaker.rampUp`, docs/streaming.md#failback-ramp): a circuit
//! closed by its probe lets through a share of the requests that grows linearly from 10 %
//! to 100 % over `rampUp` ([`Breaker::ramp_admits`]). The share is counted, not drawn: each
//! request adds it to a credit, and one is let through each time the credit reaches a whole
//! request, so any `n` requests at share `s` let `s × n` through (rounded down). Only a
//! route with `rampUp` asks.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// Open time never grows past this.
pub const MAX_OPEN: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Closed { failures: u32 },
    Open { until: Instant, open_for: Duration },
    HalfOpen { open_for: Duration },
}

/// What the breaker says about sending a request now.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// Yes, as the one half-open probe: report its outcome through the [`Probe`].
    Probe,
    No,
}

#[derive(Debug)]
pub struct Breaker {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: State,
    /// Wall-clock time of the last transition, for stats.
    since: SystemTime,
    /// Transitions so far (open/close events for logs and status).
    opened: u64,
    /// When a probe last closed the circuit, while a ramp may still run from it.
    closed_at: Option<Instant>,
    /// The ramp's credit, in thousandths of a request.
    credit: u32,
    /// Probed in the background every this long while open (`probeInterval`, or a
    /// health check's interval); `None`: a client request is the half-open probe.
    probe_every: Option<Duration>,
    /// The half-open turn is the background prober's.
    background: bool,
}

/// The ramp's share at its start, in thousandths.
pub const RAMP_FROM_PERMILLE: u32 = 100;

/// The share of requests a target ramping up for `ramp_up` takes `elapsed` after its
/// circuit closed, in thousandths: 100 at the close, growing linearly to 1000.
pub fn ramp_share_permille(elapsed: Duration, ramp_up: Duration) -> u32 {
    if elapsed >= ramp_up || ramp_up.is_zero() {
        return 1000;
    }
    let growth = u128::from(1000 - RAMP_FROM_PERMILLE) * elapsed.as_micros() / ramp_up.as_micros();
    RAMP_FROM_PERMILLE + growth as u32
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                state: State::Closed { failures: 0 },
                since: SystemTime::now(),
                opened: 0,
                closed_at: None,
                credit: 0,
                probe_every: None,
                background: false,
            }),
        }
    }
}

/// How a transition changed the circuit, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    None,
    Opened,
    Reopened,
    Closed,
}

impl Breaker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> (State, SystemTime) {
        let g = self.lock();
        (g.state, g.since)
    }

    /// The state as stats report it: an open circuit whose time is up reads HalfOpen,
    /// unless it is probed in the background (no client request gets through, so it
    /// reads Open until a probe closes it).
    pub fn reported(&self, now: Instant) -> crate::limits::circuit::Reported {
        let g = self.lock();
        match g.state {
            State::Closed { .. } => Reported::Closed,
            State::Open { until, .. } if now < until || g.probe_every.is_some() => Reported::Open,
            State::HalfOpen { .. } if g.background => Reported::Open,
            State::Open { .. } | State::HalfOpen { .. } => Reported::HalfOpen,
        }
    }

    /// Times it has opened (here, or adopted from the fleet).
    pub fn opened(&self) -> u64 {
        self.lock().opened
    }

    /// Whether requests skip the target now.
    pub fn is_open(&self, now: Instant) -> bool {
        let g = self.lock();
        match g.state {
            State::Closed { .. } => false,
            State::Open { until, .. } => now < until || g.probe_every.is_some(),
            State::HalfOpen { .. } => true,
        }
    }

    /// Probe an open circuit in the background every `every`
    /// (docs/request-lifecycle.md#probed-circuits), or let a client request be the
    /// half-open probe (`None`). Set from the config of the first route that uses the
    /// target, at each reload.
    pub fn set_probing(&self, every: Option<Duration>) {
        self.lock().probe_every = every;
    }

    /// Whether it is open and probed in the background now.
    pub fn probing(&self) -> bool {
        let g = self.lock();
        g.probe_every.is_some() && !matches!(g.state, State::Closed { .. })
    }

    /// When the background prober should next probe it: an open circuit's end, while
    /// probing is set.
    pub fn next_probe(&self) -> Option<Instant> {
        let g = self.lock();
        match g.state {
            State::Open { until, .. } if g.probe_every.is_some() => Some(until),
            _ => None,
        }
    }

    /// The background prober takes the half-open turn, when it is due at `now`.
    pub fn begin_probe(&self, now: Instant) -> bool {
        let mut g = self.lock();
        match g.state {
            State::Open { until, open_for } if now >= until && g.probe_every.is_some() => {
                g.state = State::HalfOpen { open_for };
                g.background = true;
                true
            }
            _ => false,
        }
    }

    /// What the background probe taken with [`Breaker::begin_probe`] found: a success
    /// closes the circuit (the ramp starts from now), a failure keeps it open one more
    /// interval. A probe overtaken by events (the circuit closed meanwhile) changes
    /// nothing.
    pub fn probe_done(&self, now: Instant, healthy: bool) -> Transition {
        let mut g = self.lock();
        let State::HalfOpen { open_for } = g.state else {
            return Transition::None;
        };
        if !g.background {
            return Transition::None;
        }
        g.background = false;
        if healthy {
            g.state = State::Closed { failures: 0 };
            g.since = SystemTime::now();
            g.closed_at = Some(now);
            g.credit = 0;
            return Transition::Closed;
        }
        let every = g.probe_every.unwrap_or(open_for);
        g.state = State::Open {
            until: now + every,
            open_for,
        };
        Transition::None
    }

    /// The fleet says the circuit is open (another replica opened it, issue 32 item 5):
    /// a closed circuit opens for `open_for` from `now`, as if it had failed here, and
    /// is probed (or client-probed) like one that did. An open one is left as it is.
    pub fn adopt_open(&self, now: Instant, open_for: Duration) -> Transition {
        let mut g = self.lock();
        if !matches!(g.state, State::Closed { .. }) {
            return Transition::None;
        }
        g.state = State::Open {
            until: now + open_for,
            open_for,
        };
        g.since = SystemTime::now();
        g.opened += 1;
        g.closed_at = None;
        Transition::Opened
    }

    /// The fleet says the circuit is closed (another replica's probe succeeded): an
    /// open one closes as a probe's success closes it (the ramp starts from `now`). A
    /// background probe running here finds it closed and changes nothing.
    pub fn adopt_closed(&self, now: Instant) -> Transition {
        let mut g = self.lock();
        if matches!(g.state, State::Closed { .. }) {
            return Transition::None;
        }
        g.background = false;
        g.state = State::Closed { failures: 0 };
        g.since = SystemTime::now();
        g.closed_at = Some(now);
        g.credit = 0;
        Transition::Closed
    }

    /// A background probe that ended without a verdict (cancelled): probe again now.
    pub fn probe_dropped(&self, now: Instant) {
        let mut g = self.lock();
        if let (State::HalfOpen { open_for }, true) = (g.state, g.background) {
            g.background = false;
            g.state = State::Open {
                until: now,
                open_for,
            };
        }
    }

    pub fn admit(&self, now: Instant) -> Admit {
        let mut g = self.lock();
        match g.state {
            State::Closed { .. } => Admit::Yes,
            State::Open { until, open_for } if now >= until && g.probe_every.is_none() => {
                g.state = State::HalfOpen { open_for };
                g.since = SystemTime::now();
                Admit::Probe
            }
            State::Open { .. } | State::HalfOpen { .. } => Admit::No,
        }
    }

    /// A failover-safe failure (transport, attempt timeout, 5xx).
    pub fn failure(
        &self,
        now: Instant,
        threshold: u32,
        base_open: Duration,
        probe: bool,
    ) -> Transition {
        let mut g = self.lock();
        let (next, transition) = match g.state {
            // The background prober holds the turn: a client request tried anyway
            // (every circuit open) says nothing more.
            State::HalfOpen { .. } if g.background => (g.state, Transition::None),
            State::HalfOpen { open_for } if probe => {
                let open_for = (open_for * 2).min(MAX_OPEN);
                (
                    State::Open {
                        until: now + open_for,
                        open_for,
                    },
                    Transition::Reopened,
                )
            }
            State::Closed { failures } if failures + 1 >= threshold.max(1) => (
                State::Open {
                    until: now + base_open,
                    open_for: base_open,
                },
                Transition::Opened,
            ),
            State::Closed { failures } => (
                State::Closed {
                    failures: failures + 1,
                },
                Transition::None,
            ),
            // Failures of requests admitted before the circuit opened change nothing.
            other => (other, Transition::None),
        };
        if transition != Transition::None {
            g.since = SystemTime::now();
            g.opened += 1;
            g.closed_at = None;
        }
        g.state = next;
        transition
    }

    /// A success (or any answer that says the provider is healthy).
    pub fn success(&self, probe: bool) -> Transition {
        let mut g = self.lock();
        match g.state {
            State::Closed { failures } => {
                if failures != 0 {
                    g.state = State::Closed { failures: 0 };
                }
                Transition::None
            }
            // A probe, or the request tried anyway because every circuit was open.
            State::HalfOpen { .. } | State::Open { .. } if probe => {
                g.background = false;
                g.state = State::Closed { failures: 0 };
                g.since = SystemTime::now();
                g.closed_at = Some(Instant::now());
                g.credit = 0;
                Transition::Closed
            }
            _ => Transition::None,
        }
    }

    /// The failback ramp: may a request that the circuit admits go to the target at
    /// `now`, its route ramping up over `ramp_up`? Always, unless a probe closed the
    /// circuit less than `ramp_up` ago; then as many as the ramp's share (see the
    /// module's header).
    pub fn ramp_admits(&self, now: Instant, ramp_up: Duration) -> bool {
        let mut g = self.lock();
        let Some(closed) = g.closed_at else {
            return true;
        };
        let elapsed = now.saturating_duration_since(closed);
        if elapsed >= ramp_up {
            // Another route of the target may ramp for longer: keep the close.
            return true;
        }
        g.credit += ramp_share_permille(elapsed, ramp_up);
        if g.credit >= 1000 {
            g.credit -= 1000;
            true
        } else {
            false
        }
    }

    /// A probe that ended without a verdict (its request was dropped, or the answer
    /// said nothing about the provider's health): let the next request probe.
    pub fn release_probe(&self, now: Instant) {
        let mut g = self.lock();
        if let (State::HalfOpen { open_for }, false) = (g.state, g.background) {
            g.state = State::Open {
                until: now,
                open_for,
            };
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    Closed,
    Open,
    HalfOpen,
}

/// The half-open probe's turn. Dropped without [`Probe::done`], it hands the turn back
/// so a cancelled probe never wedges the circuit half-open.
pub struct Probe<'a> {
    breaker: &'a Breaker,
    armed: bool,
}

impl<'a> Probe<'a> {
    pub fn new(breaker: &'a Breaker) -> Self {
        Self {
            breaker,
            armed: true,
        }
    }

    pub fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.breaker.release_probe(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_and_success_resets_the_count() {
        let b = Breaker::default();
        let now = Instant::now();
        assert_eq!(b.failure(now, 3, BASE, false), Transition::None);
        assert_eq!(b.failure(now, 3, BASE, false), Transition::None);
        b.success(false);
        assert_eq!(b.failure(now, 3, BASE, false), Transition::None);
        assert_eq!(b.failure(now, 3, BASE, false), Transition::None);
        assert_eq!(b.admit(now), Admit::Yes);
        assert_eq!(b.failure(now, 3, BASE, false), Transition::Opened);
        assert_eq!(b.admit(now), Admit::No);
        assert_eq!(b.reported(now), Reported::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_after_open_for_then_close_on_success() {
        let b = Breaker::default();
        let t0 = Instant::now();
        b.failure(t0, 1, BASE, false);
        assert_eq!(b.admit(t0 + BASE - Duration::from_millis(1)), Admit::No);
        assert_eq!(b.reported(t0 + BASE), Reported::HalfOpen);
        assert_eq!(b.admit(t0 + BASE), Admit::Probe);
        assert_eq!(b.admit(t0 + BASE), Admit::No, "exactly one probe");
        assert_eq!(b.success(true), Transition::Closed);
        assert_eq!(b.admit(t0 + BASE), Admit::Yes);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens_with_the_open_time_doubled_up_to_five_minutes() {
        let b = Breaker::default();
        let mut now = Instant::now();
        b.failure(now, 1, BASE, false);
        let mut expected = BASE;
        for _ in 0..6 {
            now += expected;
            assert_eq!(b.admit(now), Admit::Probe);
            assert_eq!(b.failure(now, 1, BASE, true), Transition::Reopened);
            expected = (expected * 2).min(MAX_OPEN);
            assert_eq!(
                b.admit(now + expected - Duration::from_millis(1)),
                Admit::No
            );
        }
        assert_eq!(expected, MAX_OPEN);
        now += expected;
        assert_eq!(b.admit(now), Admit::Probe);
        b.success(true);
        // Closed again: the next opening starts from the base time.
        b.failure(now, 1, BASE, false);
        assert_eq!(b.admit(now + BASE), Admit::Probe);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_probe_hands_its_turn_back() {
        let b = Breaker::default();
        let now = Instant::now();
        b.failure(now, 1, BASE, false);
        assert_eq!(b.admit(now + BASE), Admit::Probe);
        drop(Probe::new(&b));
        assert_eq!(
            b.admit(now + BASE),
            Admit::Probe,
            "the next request may probe"
        );
        let p = Probe::new(&b);
        b.success(true);
        p.done();
        assert_eq!(b.admit(now + BASE), Admit::Yes);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_tried_while_open_closes_the_circuit_on_success() {
        let b = Breaker::default();
        let now = Instant::now();
        b.failure(now, 1, BASE, false);
        assert_eq!(b.admit(now), Admit::No);
        assert_eq!(b.success(true), Transition::Closed);
        assert_eq!(b.admit(now), Admit::Yes);
    }

    #[tokio::test(start_paused = true)]
    async fn late_failures_of_requests_admitted_earlier_do_not_extend_an_open_circuit() {
        let b = Breaker::default();
        let now = Instant::now();
        b.failure(now, 1, BASE, false);
        assert_eq!(b.failure(now, 1, BASE, false), Transition::None);
        assert_eq!(b.admit(now + BASE), Admit::Probe);
    }

    #[tokio::test(start_paused = true)]
    async fn a_circuit_closed_by_its_probe_ramps_its_share_from_ten_to_a_hundred_percent() {
        let b = Breaker::default();
        let ramp = Duration::from_secs(30);
        let t0 = Instant::now();
        assert!(
            (0..100).all(|_| b.ramp_admits(t0, ramp)),
            "no ramp before a close"
        );
        b.failure(t0, 1, BASE, false);
        tokio::time::advance(BASE).await;
        assert_eq!(b.admit(Instant::now()), Admit::Probe);
        assert_eq!(b.success(true), Transition::Closed);
        let closed = Instant::now();
        // Of 1000 requests at each point of the ramp, how many the target takes.
        let taken = |after: Duration| {
            (0..1000)
                .filter(|_| b.ramp_admits(closed + after, ramp))
                .count()
        };
        assert_eq!(taken(Duration::ZERO), 100, "10 % at the close");
        assert_eq!(taken(Duration::from_millis(7_500)), 325, "a quarter in");
        assert_eq!(taken(Duration::from_secs(15)), 550, "half way");
        assert_eq!(taken(Duration::from_secs(27)), 910);
        assert_eq!(taken(ramp), 1000, "all of them at the end");
        // Counted, not drawn: the first request at 10 % waits for nine others.
        assert_eq!(
            ramp_share_permille(Duration::from_secs(3), ramp),
            190,
            "linear"
        );
    }

    const EVERY: Duration = Duration::from_secs(10);

    /// docs/request-lifecycle.md#probed-circuits: probed in the background, an open circuit
    /// never lets a client request through; the prober's turn comes once `openFor` has
    /// passed, then every interval while it fails, without doubling; a success closes it.
    #[tokio::test(start_paused = true)]
    async fn a_probed_circuit_lets_no_client_request_through_and_never_doubles() {
        let b = Breaker::default();
        b.set_probing(Some(EVERY));
        let t0 = Instant::now();
        assert!(!b.probing(), "closed: nothing to probe");
        assert_eq!(b.next_probe(), None);
        assert_eq!(b.failure(t0, 1, BASE, false), Transition::Opened);
        assert!(b.probing());
        assert_eq!(
            b.next_probe(),
            Some(t0 + BASE),
            "the first probe once openFor has passed"
        );
        assert!(!b.begin_probe(t0 + BASE - Duration::from_millis(1)));
        assert_eq!(
            b.admit(t0 + BASE),
            Admit::No,
            "no client request is a probe"
        );
        assert_eq!(b.reported(t0 + BASE), Reported::Open);
        assert!(b.is_open(t0 + BASE));
        let mut now = t0 + BASE;
        for _ in 0..20 {
            assert!(b.begin_probe(now));
            assert!(!b.begin_probe(now), "one probe at a time");
            assert_eq!(b.admit(now), Admit::No);
            assert_eq!(b.reported(now), Reported::Open);
            assert_eq!(b.probe_done(now, false), Transition::None);
            assert_eq!(
                b.next_probe(),
                Some(now + EVERY),
                "one interval, never doubled"
            );
            assert!(!b.begin_probe(now + EVERY - Duration::from_millis(1)));
            now += EVERY;
        }
        assert!(b.begin_probe(now));
        assert_eq!(b.probe_done(now, true), Transition::Closed);
        assert_eq!(b.admit(now), Admit::Yes);
        assert!(!b.probing());
        assert!(
            !b.ramp_admits(now, Duration::from_secs(30)),
            "a probe's close starts the ramp"
        );
        // Opened again, it starts from openFor again.
        assert_eq!(b.failure(now, 1, BASE, false), Transition::Opened);
        assert_eq!(b.next_probe(), Some(now + BASE));
    }

    #[tokio::test(start_paused = true)]
    async fn a_background_probe_overtaken_or_dropped_changes_nothing_it_should_not() {
        let b = Breaker::default();
        b.set_probing(Some(EVERY));
        let now = Instant::now();
        b.failure(now, 1, BASE, false);
        let due = now + BASE;
        // Dropped without a verdict: due again at once.
        assert!(b.begin_probe(due));
        b.probe_dropped(due);
        assert_eq!(b.next_probe(), Some(due));
        // A client request tried anyway (every circuit open) while the prober holds the
        // turn: its failure and its dropped turn change nothing...
        assert!(b.begin_probe(due));
        assert_eq!(b.failure(due, 1, BASE, true), Transition::None);
        b.release_probe(due);
        assert!(!b.begin_probe(due), "still the prober's turn");
        // ...its success closes the circuit, and the prober's late verdict is ignored.
        assert_eq!(b.success(true), Transition::Closed);
        assert_eq!(b.probe_done(due, false), Transition::None);
        assert_eq!(b.admit(due), Admit::Yes);
        // Probing switched off (probeInterval 0s): a client request probes again.
        b.set_probing(None);
        b.failure(due, 1, BASE, false);
        assert_eq!(b.admit(due + BASE), Admit::Probe);
        assert!(!b.begin_probe(due + BASE));
    }

    /// What a fleet-wide view (issue 32 item 5) feeds in: an open circuit elsewhere
    /// opens this one (probed here as if it had failed here); a success elsewhere
    /// closes it, ramp included, and a probe still running here changes nothing.
    #[tokio::test(start_paused = true)]
    async fn the_fleet_can_open_and_close_a_circuit() {
        let b = Breaker::default();
        b.set_probing(Some(EVERY));
        let now = Instant::now();
        assert_eq!(b.adopt_open(now, BASE), Transition::Opened);
        assert_eq!(b.adopt_open(now, BASE), Transition::None, "already open");
        assert_eq!(b.admit(now), Admit::No);
        assert_eq!(b.next_probe(), Some(now + BASE));
        assert!(b.begin_probe(now + BASE));
        assert_eq!(b.adopt_closed(now + BASE), Transition::Closed);
        assert_eq!(
            b.probe_done(now + BASE, false),
            Transition::None,
            "late, ignored"
        );
        assert_eq!(b.admit(now + BASE), Admit::Yes);
        assert!(
            !b.ramp_admits(now + BASE, Duration::from_secs(30)),
            "the ramp starts"
        );
        assert_eq!(b.adopt_closed(now + BASE), Transition::None);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_probe_that_closes_the_circuit_starts_a_ramp() {
        let b = Breaker::default();
        let ramp = Duration::from_secs(30);
        let now = Instant::now();
        b.failure(now, 3, BASE, false);
        b.success(false);
        assert!(b.ramp_admits(now, ramp), "a closed circuit's success");
        b.failure(now, 1, BASE, false);
        assert_eq!(b.success(true), Transition::Closed);
        assert!(!b.ramp_admits(now, ramp), "ramping");
        // Reopened during the ramp: the next close starts a ramp of its own.
        b.failure(now, 1, BASE, false);
        assert!(b.ramp_admits(now, ramp), "no ramp while open");
        tokio::time::advance(BASE).await;
        assert_eq!(b.admit(Instant::now()), Admit::Probe);
        b.success(true);
        let admitted = (0..10)
            .filter(|_| b.ramp_admits(Instant::now(), ramp))
            .count();
        assert_eq!(admitted, 1, "10 % again");
    }
}

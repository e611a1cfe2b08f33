//! What the gateway keeps per LLMClient (docs/tenancy.md#usage, docs/tenancy.md#budgets):
//! its usage counters (requests, tokens, cost, throttles, estimates; reported on
//! `/admin/v1/stats` and `/metrics`), its rate limits (requests and tokens per minute,
//! concurrency, each this replica's share), and its budgets: the operator's rendered
//! `exhausted`, and the reservation each request makes before it is sent upstream
//! ([`Need`], [`Reserved`]) against this replica's share of what is left (the operator's
//! rendered `left`, or without one the budget itself and this replica's own day and month
//! counts), settled to the real usage when the answer ends.
//!
//! Counters outlive reloads (kept in the config's carried state), so the operator's
//! per-instance deltas never see one go backwards, and a request admitted under one
//! config settles under the next. The request path touches atomics, plus two short
//! uncontended mutexes (a token bucket's state, a client's budget ledger) that are
//! never held across an await.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use switchback_crds::config::{Client, ClientBudget, ObjectId};
use switchback_crds::cost::UnitPrice;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::observe::cost::UsdCounter;
use crate::wire::usage::Usage;

/// Usage of one client since this replica started, across reloads.
#[derive(Debug, Default)]
pub struct ClientCounters {
    /// Let through to routing (throttled ones are not counted here).
    pub requests: AtomicU64,
    pub input_tokens: AtomicU64,
    pub output_tokens: AtomicU64,
    /// Millionths of a USD, from the answering target's price.
    pub micro_usd: AtomicU64,
    pub rate_limited: AtomicU64,
    pub budget_exhausted: AtomicU64,
    /// Requests whose usage was estimated (a stream the client left mid-answer), and
    /// the tokens estimated for them (also in the counts above).
    pub estimated_requests: AtomicU64,
    pub estimated_tokens: AtomicU64,
    /// Unix milliseconds of the last request, let through or refused; 0 = none.
    pub last_request_ms: AtomicU64,
    /// This replica's day and month counts, the reservations of the requests in
    /// flight, and the counters at the operator's last scrape rounds.
    ledger: Mutex<Ledger>,
}

/// How many of the operator's scrape rounds a client remembers its counters at: the
/// rendering of round N reaches the replica a delivery after the scrape, by when a
/// few more rounds went by.
const ROUNDS: usize = 16;

/// One client's budget book on this replica.
#[derive(Debug, Default)]
struct Ledger {
    period: Period,
    /// What the requests in flight reserved and have not settled yet.
    reserved_tokens: u64,
    reserved_micro_usd: u64,
    /// The counters as reported at recent scrape rounds, oldest first (a ring).
    rounds: [Counted; ROUNDS],
    next: usize,
}

/// Cumulative tokens and cost at one scrape round.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub round: u64,
    pub tokens: u64,
    pub micro_usd: u64,
}

impl Ledger {
    /// The counters the operator summed at `round`: the latest reading it could have
    /// had (the last round at or before it this replica answered), or none (zeros:
    /// the operator counted nothing of this replica, which started since).
    fn basis(&self, round: u64) -> Counted {
        self.rounds
            .iter()
            .filter(|r| r.round != 0 && r.round <= round)
            .max_by_key(|r| r.round)
            .copied()
            .unwrap_or_default()
    }
}

/// The current UTC day's tokens and month's cost (standalone budgets).
#[derive(Debug, Clone, Copy)]
struct Period {
    /// Days since 1970-01-01 the tokens are for.
    day: u64,
    tokens: u64,
    /// `year * 12 + month0` the cost is for.
    month: u64,
    micro_usd: u64,
}

/// No day nor month yet: the first [`Period::at`] starts both.
impl Default for Period {
    fn default() -> Self {
        Self {
            day: u64::MAX,
            tokens: 0,
            month: u64::MAX,
            micro_usd: 0,
        }
    }
}

impl Period {
    /// Roll over to `day` (days since 1970-01-01) and its month (a new period starts
    /// from zero). The month is a function of the day: worked out only when the day
    /// changes.
    fn at(&mut self, day: u64) {
        if day == self.day {
            return;
        }
        self.day = day;
        self.tokens = 0;
        let month = month_index(day);
        if month != self.month {
            self.month = month;
            self.micro_usd = 0;
        }
    }
}

impl ClientCounters {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tokens and cost counted since start, as `/admin/v1/stats` reports them.
    pub fn counted(&self) -> (u64, u64) {
        let tokens =
            self.input_tokens.load(Ordering::Relaxed) + self.output_tokens.load(Ordering::Relaxed);
        (tokens, self.micro_usd.load(Ordering::Relaxed))
    }

    /// The operator's scrape round `round` read these counters (see
    /// `switchback_crds::config::BudgetLeft`).
    pub(crate) fn read_at(&self, counted: Counted) {
        if counted.round == 0 {
            return;
        }
        let mut l = self.ledger();
        // A round read twice (a retried scrape) keeps its first reading: the one the
        // operator may have summed.
        if l.rounds.iter().any(|r| r.round == counted.round) {
            return;
        }
        let i = l.next;
        l.rounds[i] = counted;
        l.next = (i + 1) % ROUNDS;
    }

    /// Tokens the requests in flight reserve now.
    pub(crate) fn reserved_tokens(&self) -> u64 {
        self.ledger().reserved_tokens
    }
}

/// Tokens of one client on one route, for `switchback_client_tokens_total`.
#[derive(Debug, Default)]
pub struct RouteTokens {
    pub input: AtomicU64,
    pub output: AtomicU64,
}

/// The wall clock the budgets read: the start time plus tokio's monotonic clock
/// since then. Immune to wall-clock jumps, and paused-clock tests can move it.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    /// The start time, as time since the Unix epoch (kept so, the request path does
    /// no `SystemTime` arithmetic).
    started: Duration,
    epoch: Instant,
}

impl WallClock {
    /// `started_at` (wall) was `epoch` (monotonic).
    pub fn new(started_at: SystemTime, epoch: Instant) -> Self {
        Self {
            started: started_at.duration_since(UNIX_EPOCH).unwrap_or_default(),
            epoch,
        }
    }

    pub fn now(&self) -> SystemTime {
        self.at(Instant::now())
    }

    /// The wall time of a monotonic instant already read (one clock read per request).
    pub fn at(&self, now: Instant) -> SystemTime {
        UNIX_EPOCH + self.unix(now)
    }

    /// [`WallClock::at`] as time since the Unix epoch.
    pub fn unix(&self, now: Instant) -> Duration {
        self.started + now.saturating_duration_since(self.epoch)
    }
}

/// A token bucket on tokio's clock (so paused-clock tests drive it). `tokens` may go
/// negative: tokens per minute are charged after the answer, from reported usage.
#[derive(Debug)]
struct Bucket {
    capacity: f64,
    per_sec: f64,
    /// Tokens left, and when that was computed.
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    /// `per_minute` tokens, refilled evenly, full at the start.
    fn per_minute(per_minute: u32) -> Self {
        let capacity = f64::from(per_minute);
        Self {
            capacity,
            per_sec: capacity / 60.0,
            state: Mutex::new((capacity, Instant::now())),
        }
    }

    fn refilled(&self, now: Instant) -> std::sync::MutexGuard<'_, (f64, Instant)> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let dt = now.saturating_duration_since(s.1).as_secs_f64();
        s.0 = (s.0 + dt * self.per_sec).min(self.capacity);
        s.1 = now;
        s
    }

    /// Seconds until the bucket holds `need`, rounded up, at least 1.
    fn wait(&self, have: f64, need: f64) -> u64 {
        (((need - have) / self.per_sec).ceil() as u64).max(1)
    }

    /// Take one token, or say how many seconds until one is there.
    fn take(&self, now: Instant) -> Result<(), u64> {
        let mut s = self.refilled(now);
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            Ok(())
        } else {
            Err(self.wait(s.0, 1.0))
        }
    }

    /// Admit while the bucket is not negative (nothing taken).
    fn check(&self, now: Instant) -> Result<(), u64> {
        let s = self.refilled(now);
        if s.0 >= 0.0 {
            Ok(())
        } else {
            Err(self.wait(s.0, 0.0))
        }
    }

    fn charge(&self, n: u64, now: Instant) {
        let mut s = self.refilled(now);
        s.0 -= n as f64;
    }
}

/// This replica's share of one client's limits. Kept across reloads while the shares
/// stay the same (they are kept keyed by them).
#[derive(Debug)]
pub struct Limits {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    slots: Option<Arc<Semaphore>>,
}

/// The shares a [`Limits`] enforces: `(rpm, tpm, concurrency)`.
pub(crate) type Shares = (Option<u32>, Option<u32>, Option<u32>);

impl Limits {
    /// This replica's shares of `c`'s limits, `replicas` sharing them.
    pub(crate) fn shares(c: &Client, replicas: u32) -> Shares {
        let l = &c.limits;
        let share = |n: u32| (n / replicas.max(1)).max(1);
        (
            l.requests_per_minute.map(share),
            l.tokens_per_minute.map(share),
            l.max_concurrency.map(share),
        )
    }

    pub fn new((rpm, tpm, concurrency): Shares) -> Self {
        Self {
            requests: rpm.map(Bucket::per_minute),
            tokens: tpm.map(Bucket::per_minute),
            slots: concurrency.map(|n| Arc::new(Semaphore::new(n as usize))),
        }
    }
}

/// A budget spent: which, and until when.
#[derive(Debug, Clone)]
pub struct Spent {
    pub budget: Arc<str>,
    pub until: SystemTime,
}

/// Continuations that count what clients walked away from (an abandoned unary
/// answer read to its end, a stream read on for its usage): spawned tasks, counted
/// so that a replica that drains waits for them before it hands its counts over.
#[derive(Debug, Default)]
pub struct Settling {
    pending: AtomicUsize,
    idle: Notify,
}

impl Settling {
    /// Runs `work` in a task of its own, counted until it ends.
    pub fn spawn(self: &Arc<Self>, work: impl std::future::Future<Output = ()> + Send + 'static) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        let me = self.clone();
        tokio::spawn(async move {
            work.await;
            if me.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                me.idle.notify_waiters();
            }
        });
    }

    /// Continuations still running.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Waits until none is running.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.pending() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One client as a snapshot serves it.
#[derive(Debug)]
pub struct ClientRt {
    pub id: ObjectId,
    /// `namespace/name`: the request log, spans and metrics (never the key).
    pub label: Arc<str>,
    pub counters: Arc<ClientCounters>,
    pub limits: Option<Arc<Limits>>,
    /// Rendered by the operator (`Client.exhausted`).
    pub exhausted: Option<Spent>,
    /// Its budgets, when it has any: what each request reserves against, this
    /// replica's share of what is left.
    pub budget: Option<ClientBudget>,
    /// Replicas sharing its limits and budgets (the operator's rendering, or
    /// standalone `--replicas`).
    pub replicas: u32,
    /// Requests reserve before they are sent (`--budget-reservation`, default on);
    /// off, budgets are checked against what was counted only.
    pub reserve: bool,
    /// No operator: nothing renders `exhausted` or `left`.
    pub standalone: bool,
    pub clock: WallClock,
    /// Where continuations that count abandoned answers are tracked.
    pub settling: Arc<Settling>,
}

/// Why a client's request is refused before routing (429).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Throttled {
    /// Over a rate or concurrency limit (`rate_limited`).
    RateLimited {
        retry_after: u64,
        limit: &'static str,
    },
    /// A budget is spent (`budget_exhausted`).
    BudgetExhausted { retry_after: u64, budget: Arc<str> },
    /// What is left of a budget on this replica, less what the requests in flight
    /// reserved, does not cover this request's reservation (`budget_exhausted`).
    NotCovered(Box<Uncovered>),
}

/// A reservation that did not fit: what it asked, what was there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncovered {
    pub retry_after: u64,
    /// `tokensPerDay` or `usdPerMonth`.
    pub budget: &'static str,
    pub need: Need,
    /// In the budget's unit (tokens, or millionths of a USD): this replica's share of
    /// what is left, what it spent of it, what the requests in flight reserve.
    pub share: u64,
    pub spent: u64,
    pub reserved: u64,
}

impl Uncovered {
    /// The request could never fit this share, whatever settles: only a smaller
    /// output cap (or the next period) helps.
    pub(crate) fn never_fits(&self) -> bool {
        let need = if self.budget == USD_PER_MONTH {
            self.need.micro_usd
        } else {
            self.need.tokens
        };
        need > self.share.saturating_sub(self.spent)
    }
}

/// A request let through: holds its concurrency slot (if the client has a limit)
/// until dropped (a stream keeps it until the stream ends), and its budget
/// reservation until the answer ends.
#[derive(Debug, Default)]
pub struct Admitted {
    pub slot: Option<OwnedSemaphorePermit>,
    pub reserved: Option<Reserved>,
}

/// Budget names, as in `spec.budget` and the operator's `exhausted`.
pub(crate) const TOKENS_PER_DAY: &str = "tokensPerDay";
pub(crate) const USD_PER_MONTH: &str = "usdPerMonth";

/// What one request reserves of its client's budgets before it is sent
/// (docs/tenancy.md#reserve-before-sending): its output cap (or the client's
/// `defaultReservation`) plus an estimate of its input (request bytes / 4), in tokens, and
/// that priced with the route's first target for a cost budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Need {
    pub tokens: u64,
    pub micro_usd: u64,
    /// The output cap the request set (`max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`) and its value; `None`: the default reservation.
    pub cap: Option<(&'static str, u64)>,
    /// The output tokens reserved (the cap, or the default reservation).
    pub output: u64,
    /// The input estimate.
    pub input: u64,
}

impl Need {
    /// `cap`: the request's output cap; `body`: its size in bytes; `output`: whether
    /// the API answers with generated tokens at all (not embeddings).
    pub fn of(
        cap: Option<(&'static str, u64)>,
        body: usize,
        budget: &ClientBudget,
        price: Option<&UnitPrice>,
        output: bool,
    ) -> Need {
        let input = (body as u64).div_ceil(4);
        let out = match (output, cap) {
            (false, _) => 0,
            (true, Some((_, n))) => n,
            (true, None) => budget.default_reservation(),
        };
        let usage = Usage {
            input_tokens: input,
            output_tokens: out,
        };
        Need {
            tokens: input.saturating_add(out),
            micro_usd: price.map_or(0, |p| {
                p.cost(usage.input_tokens, usage.output_tokens)
                    .micro_rounded()
            }),
            cap: cap.filter(|_| output),
            output: out,
            input,
        }
    }
}

/// A request's reservation in its client's budget ledger, given back (settled: the
/// real usage is counted by then) when dropped.
#[derive(Debug)]
pub struct Reserved {
    counters: Arc<ClientCounters>,
    tokens: u64,
    micro_usd: u64,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let mut l = self.counters.ledger();
        l.reserved_tokens = l.reserved_tokens.saturating_sub(self.tokens);
        l.reserved_micro_usd = l.reserved_micro_usd.saturating_sub(self.micro_usd);
    }
}

/// Where a request's reservation waits for whoever settles it: the answer as it
/// ends, or the continuation that counts an answer its client walked away from.
/// Taken once; what is not taken settles with the request.
#[derive(Debug, Default)]
pub(crate) struct HeldReservation(Mutex<Option<Reserved>>);

impl HeldReservation {
    pub fn new(r: Option<Reserved>) -> Self {
        Self(Mutex::new(r))
    }

    pub fn take(&self) -> Option<Reserved> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// This replica's share of one budget, in its unit: what may be spent, what was.
struct Share {
    share: u64,
    spent: u64,
}

impl ClientRt {
    /// Let the request through or say why not. Budgets first (a spent budget is
    /// the more lasting reason; then the request's reservation, `need`, when the
    /// client has a budget), then concurrency, tokens (nothing taken), and requests
    /// (a token taken only once everything else agreed). `now`: when the request
    /// arrived, read once by the caller (it also times the request).
    pub fn admit(&self, now: Instant, need: &Need) -> Result<Admitted, Throttled> {
        let c = &self.counters;
        let unix = self.clock.unix(now);
        c.last_request_ms
            .store((unix.as_millis() as u64).max(1), Ordering::Relaxed);
        let refused = self.check(unix, now, need);
        match &refused {
            Err(Throttled::RateLimited { .. }) => c.rate_limited.fetch_add(1, Ordering::Relaxed),
            Err(Throttled::BudgetExhausted { .. } | Throttled::NotCovered(_)) => {
                c.budget_exhausted.fetch_add(1, Ordering::Relaxed)
            }
            Ok(_) => c.requests.fetch_add(1, Ordering::Relaxed),
        };
        refused
    }

    /// `unix`: `now` as wall time since the Unix epoch.
    fn check(&self, unix: Duration, now: Instant, need: &Need) -> Result<Admitted, Throttled> {
        if let Some(spent) = &self.exhausted
            && let Ok(left) = spent.until.duration_since(UNIX_EPOCH + unix)
            && !left.is_zero()
        {
            return Err(Throttled::BudgetExhausted {
                retry_after: secs_up(left),
                budget: spent.budget.clone(),
            });
        }
        let reserved = match &self.budget {
            Some(b) => self.reserve(b, unix, need)?,
            None => None,
        };
        let Some(l) = &self.limits else {
            return Ok(Admitted {
                slot: None,
                reserved,
            });
        };
        let slot = match &l.slots {
            None => None,
            Some(s) => Some(
                s.clone()
                    .try_acquire_owned()
                    .map_err(|_| Throttled::RateLimited {
                        retry_after: 1,
                        limit: "maxConcurrency",
                    })?,
            ),
        };
        if let Some(t) = &l.tokens {
            t.check(now).map_err(|retry_after| Throttled::RateLimited {
                retry_after,
                limit: "tokensPerMinute",
            })?;
        }
        if let Some(r) = &l.requests {
            r.take(now).map_err(|retry_after| Throttled::RateLimited {
                retry_after,
                limit: "requestsPerMinute",
            })?;
        }
        Ok(Admitted { slot, reserved })
    }

    /// Reserve `need` against this replica's share of what is left of each budget
    /// (docs/tenancy.md#reserve-before-sending), or refuse: the share, less what was spent
    /// of it and what the requests in flight reserved, must cover it. Without reservation
    /// (`--budget-reservation off`) a request is refused only once the share is spent.
    fn reserve(
        &self,
        b: &ClientBudget,
        unix: Duration,
        need: &Need,
    ) -> Result<Option<Reserved>, Throttled> {
        let day = day_of(unix);
        let (tokens, micro_usd) = self.counters.counted();
        let mut l = self.counters.ledger();
        l.period.at(day);
        // The operator's rendering, for the day (or month) it was made in.
        let left = b.left.filter(|left| left.day <= day);
        let mut checks: [Option<(&'static str, Share, u64, u64)>; 2] = [None, None];
        if let Some(cap) = b.tokens_per_day {
            let share = match left
                .filter(|x| x.day == day)
                .and_then(|x| Some((x, x.tokens?)))
            {
                Some((x, left)) => Share {
                    share: left / u64::from(self.replicas.max(1)),
                    spent: tokens.saturating_sub(l.basis(x.round).tokens),
                },
                None => Share {
                    share: cap / u64::from(self.replicas.max(1)),
                    spent: l.period.tokens,
                },
            };
            checks[0] = Some((TOKENS_PER_DAY, share, l.reserved_tokens, need.tokens));
        }
        if let Some(usd) = b.usd_per_month {
            let month = month_index(day);
            let rendered = left
                .filter(|x| month_index(x.day) == month)
                .and_then(|x| Some((x, x.micro_usd?)));
            let share = match rendered {
                Some((x, left)) => Share {
                    share: left / u64::from(self.replicas.max(1)),
                    spent: micro_usd.saturating_sub(l.basis(x.round).micro_usd),
                },
                None => Share {
                    share: ((usd * 1e6).round() as u64) / u64::from(self.replicas.max(1)),
                    spent: l.period.micro_usd,
                },
            };
            checks[1] = Some((USD_PER_MONTH, share, l.reserved_micro_usd, need.micro_usd));
        }
        for (budget, s, reserved, asked) in checks.into_iter().flatten() {
            let covered = if self.reserve {
                // Nothing left is nothing left, even for a request that reserves 0
                // (a cost budget whose first target has no price).
                s.spent < s.share
                    && s.spent.saturating_add(reserved).saturating_add(asked) <= s.share
            } else {
                s.spent < s.share
            };
            if covered {
                continue;
            }
            // Settling what is in flight would make room: soon. Otherwise the share
            // is spent for a request this size: until the period ends standalone;
            // in a cluster the operator re-renders the shares as replicas report.
            let room = s.spent.saturating_add(asked) <= s.share;
            let retry_after = if room && self.reserve {
                1
            } else if self.standalone {
                let end = if budget == TOKENS_PER_DAY {
                    day_start(day + 1)
                } else {
                    month_start(month_index(day) + 1)
                };
                secs_up(end.duration_since(UNIX_EPOCH + unix).unwrap_or_default())
            } else {
                SHARE_RETRY_AFTER
            };
            return Err(Throttled::NotCovered(Box::new(Uncovered {
                retry_after,
                budget,
                need: *need,
                share: s.share,
                spent: s.spent,
                reserved,
            })));
        }
        if !self.reserve {
            return Ok(None);
        }
        l.reserved_tokens += need.tokens;
        l.reserved_micro_usd += need.micro_usd;
        Ok(Some(Reserved {
            counters: self.counters.clone(),
            tokens: need.tokens,
            micro_usd: need.micro_usd,
        }))
    }
}

/// `Retry-After` when a replica's share of a budget is spent in a cluster: the
/// operator re-renders the shares from the replicas' usage within a few scrapes.
const SHARE_RETRY_AFTER: u64 = 30;

/// Where one request's usage is counted: its client, and the client's counters on
/// the route serving it (tokens; cost by target index).
#[derive(Debug, Clone)]
pub struct ClientUsage {
    pub client: Arc<ClientRt>,
    pub route: Arc<RouteTokens>,
    pub costs: Arc<[Arc<UsdCounter>]>,
}

impl ClientUsage {
    /// Count what a provider reported (a unary answer, or one stream event), priced
    /// by the answering target (`micro`: millionths of a USD, see `pipeline::charge`),
    /// and charge it to tokens per minute.
    pub fn record(&self, u: Usage, micro: u64) {
        let c = &self.client.counters;
        c.input_tokens.fetch_add(u.input_tokens, Ordering::Relaxed);
        c.output_tokens
            .fetch_add(u.output_tokens, Ordering::Relaxed);
        self.route
            .input
            .fetch_add(u.input_tokens, Ordering::Relaxed);
        self.route
            .output
            .fetch_add(u.output_tokens, Ordering::Relaxed);
        c.micro_usd.fetch_add(micro, Ordering::Relaxed);
        let tokens = u.input_tokens + u.output_tokens;
        let bucket = self.client.limits.as_ref().and_then(|l| l.tokens.as_ref());
        let ledger = self.client.budget.is_some() || self.client.standalone;
        if bucket.is_none() && !ledger {
            return;
        }
        // One clock read for both.
        let now = Instant::now();
        if let Some(t) = bucket {
            t.charge(tokens, now);
        }
        if ledger {
            let mut l = c.ledger();
            l.period.at(day_of(self.client.clock.unix(now)));
            l.period.tokens += tokens;
            l.period.micro_usd += micro;
        }
    }

    /// Count usage the proxy estimated (nothing reported it): as [`Self::record`],
    /// and in the client's estimates.
    pub(crate) fn record_estimate(&self, u: Usage, micro: u64) {
        self.record(u, micro);
        let c = &self.client.counters;
        c.estimated_requests.fetch_add(1, Ordering::Relaxed);
        c.estimated_tokens
            .fetch_add(u.input_tokens + u.output_tokens, Ordering::Relaxed);
    }

    /// Where this client's continuations are tracked.
    pub fn settling(&self) -> &Arc<Settling> {
        &self.client.settling
    }
}

/// Whole seconds, rounded up, at least 1 (a `Retry-After` a client may trust).
fn secs_up(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}

/// Days since 1970-01-01 (UTC) of a time since the Unix epoch.
fn day_of(unix: Duration) -> u64 {
    unix.as_secs() / 86_400
}

fn day_start(day: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(day * 86_400)
}

/// `year * 12 + month0` of a day (proleptic Gregorian, H. Hinnant's `civil_from_days`).
fn month_index(day: u64) -> u64 {
    let (y, m) = civil(day);
    y * 12 + (m - 1)
}

fn civil(day: u64) -> (u64, u64) {
    let z = day + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m)
}

/// The first instant of a month given as `year * 12 + month0`.
fn month_start(index: u64) -> SystemTime {
    let (y, m) = (index / 12, index % 12 + 1);
    // Hinnant's `days_from_civil`.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    day_start(era * 146_097 + doe - 719_468)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn days(t: SystemTime) -> u64 {
        day_of(t.duration_since(UNIX_EPOCH).unwrap())
    }

    #[test]
    fn months_and_days_are_utc_calendar_ones() {
        let t = |s: &str| humantime::parse_rfc3339(s).unwrap();
        let d = days(t("2026-12-31T23:59:59Z"));
        assert_eq!(day_start(d + 1), t("2027-01-01T00:00:00Z"));
        assert_eq!(month_start(month_index(d) + 1), t("2027-01-01T00:00:00Z"));
        let feb = days(t("2028-02-29T12:00:00Z"));
        assert_eq!(month_start(month_index(feb)), t("2028-02-01T00:00:00Z"));
        assert_eq!(month_start(month_index(feb) + 1), t("2028-03-01T00:00:00Z"));
        assert_eq!(month_index(days(t("1970-01-01T00:00:00Z"))), 1970 * 12);
    }

    /// A client with `budget`, `replicas` sharing it, at 2026-12-02T10:00:00Z.
    fn client(budget: ClientBudget, replicas: u32, reserve: bool) -> ClientUsage {
        counting(budget, replicas, reserve, Arc::default())
    }

    /// [`client`] on `counters` (a reload keeps them).
    fn counting(
        budget: ClientBudget,
        replicas: u32,
        reserve: bool,
        counters: Arc<ClientCounters>,
    ) -> ClientUsage {
        let started = humantime::parse_rfc3339("2026-12-02T10:00:00Z").unwrap();
        ClientUsage {
            client: Arc::new(ClientRt {
                id: ObjectId::new("team-a", "app"),
                label: "team-a/app".into(),
                counters,
                limits: None,
                exhausted: None,
                budget: Some(budget),
                replicas,
                reserve,
                standalone: false,
                clock: WallClock::new(started, Instant::now()),
                settling: Arc::default(),
            }),
            route: Arc::default(),
            costs: Arc::default(),
        }
    }

    fn tokens(per_day: u64) -> ClientBudget {
        ClientBudget {
            tokens_per_day: Some(per_day),
            ..Default::default()
        }
    }

    fn spend(c: &ClientUsage, input: u64, output: u64) {
        c.record(
            Usage {
                input_tokens: input,
                output_tokens: output,
            },
            0,
        );
    }

    fn need(c: &ClientUsage, cap: u64, body: usize) -> Need {
        Need::of(
            Some(("max_tokens", cap)),
            body,
            c.client.budget.as_ref().unwrap(),
            None,
            true,
        )
    }

    fn admit(c: &ClientUsage, n: &Need) -> Result<Admitted, Throttled> {
        c.client.admit(Instant::now(), n)
    }

    #[tokio::test(start_paused = true)]
    async fn requests_reserve_their_cap_and_input_and_settle_to_what_they_used() {
        let c = client(tokens(1000), 1, true);
        // max_tokens 100 and 80 bytes of request: 100 + 20 reserved each.
        let n = need(&c, 100, 80);
        assert_eq!((n.tokens, n.output, n.input), (120, 100, 20));
        let mut held: Vec<Admitted> = (0..8).map(|_| admit(&c, &n).unwrap()).collect();
        assert_eq!(c.client.counters.reserved_tokens(), 960);
        let Err(Throttled::NotCovered(u)) = admit(&c, &n) else {
            panic!("a ninth does not fit 1000");
        };
        assert_eq!(
            (u.share, u.spent, u.reserved, u.retry_after),
            (1000, 0, 960, 1)
        );
        assert!(!u.never_fits(), "room once the others settle");
        // One answer used 110 of its 120: settled, 10 come back.
        spend(&c, 10, 100);
        held.pop();
        assert_eq!(c.client.counters.reserved_tokens(), 840);
        let Err(Throttled::NotCovered(_)) = admit(&c, &n) else {
            panic!("110 + 840 + 120 is over 1000");
        };
        assert_eq!(
            c.client.counters.budget_exhausted.load(Ordering::Relaxed),
            2
        );
        // A cap that alone exceeds what is left never fits, whatever settles.
        let Err(Throttled::NotCovered(u)) = admit(&c, &need(&c, 5000, 80)) else {
            panic!("5020 of 1000");
        };
        assert!(u.never_fits());
        assert_eq!(u.need.cap, Some(("max_tokens", 5000)));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_cap_the_default_reservation_is_reserved_and_embeddings_reserve_input_only() {
        let b = ClientBudget {
            tokens_per_day: Some(10_000),
            default_reservation: Some(300),
            ..Default::default()
        };
        let n = Need::of(None, 40, &b, None, true);
        assert_eq!((n.tokens, n.cap), (310, None));
        let n = Need::of(Some(("max_tokens", 50)), 40, &b, None, false);
        assert_eq!((n.tokens, n.output, n.cap), (10, 0, None), "an embedding");
        let price = UnitPrice::parse("2.5", "10").unwrap();
        let n = Need::of(Some(("max_tokens", 100)), 400, &b, Some(&price), true);
        assert_eq!(
            n.micro_usd,
            100 * 25 / 10 + 100 * 10,
            "priced as the first target"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_rendered_remainder_is_shared_and_counted_from_the_replicas_own_reading() {
        let mut b = tokens(1000);
        let c = client(b, 2, true);
        // Before the operator's round 7, this replica had counted 300 tokens...
        spend(&c, 100, 200);
        c.client.counters.read_at(Counted {
            round: 7,
            tokens: 300,
            micro_usd: 0,
        });
        // ...and since, 50 more.
        spend(&c, 0, 50);
        // The operator summed 600 over both replicas at round 7: 400 left, 200 each.
        b.left = Some(switchback_crds::config::BudgetLeft {
            round: 7,
            day: day_of(c.client.clock.unix(Instant::now())),
            tokens: Some(400),
            micro_usd: None,
        });
        let c = counting(b, 2, true, c.client.counters.clone());
        let ok = admit(&c, &need(&c, 130, 80)).expect("50 + 150 of 200");
        let Err(Throttled::NotCovered(u)) = admit(&c, &need(&c, 0, 4)) else {
            panic!("nothing left of the share");
        };
        assert_eq!((u.share, u.spent, u.reserved), (200, 50, 150));
        drop(ok);
        // A rendering of a round this replica did not answer counts from the last one
        // it did before (what the operator had of it); a later replica from zero.
        c.client.counters.read_at(Counted {
            round: 9,
            tokens: 350,
            micro_usd: 0,
        });
        let l = c.client.counters.ledger();
        assert_eq!(l.basis(8).tokens, 300);
        assert_eq!(l.basis(9).tokens, 350);
        assert_eq!(l.basis(6), Counted::default());
    }

    #[tokio::test(start_paused = true)]
    async fn without_reservation_only_what_was_counted_is_checked() {
        let c = client(tokens(100), 1, false);
        let n = need(&c, 1000, 80);
        let ok = admit(&c, &n).expect("nothing reserved, nothing counted yet");
        assert!(ok.reserved.is_none());
        admit(&c, &n).expect("still nothing counted");
        spend(&c, 50, 50);
        assert!(matches!(admit(&c, &n), Err(Throttled::NotCovered(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_refills_evenly_and_may_go_negative() {
        let b = Bucket::per_minute(2);
        let now = Instant::now();
        assert_eq!(b.take(now), Ok(()));
        assert_eq!(b.take(now), Ok(()));
        assert_eq!(b.take(now), Err(30), "one token every 30 s");
        assert_eq!(b.take(now + Duration::from_secs(30)), Ok(()));
        let t = Bucket::per_minute(60);
        t.charge(120, now);
        assert_eq!(t.check(now), Err(60), "60 tokens short at 1 per second");
        assert_eq!(t.check(now + Duration::from_secs(60)), Ok(()));
    }
}

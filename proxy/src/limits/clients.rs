//! What the gateway keeps per LLMClient (SPEC §9): its usage counters (requests,
//! tokens, cost, throttles; reported on `/admin/v1/stats` and `/metrics`), its rate
//! limits (requests and tokens per minute, concurrency, each this replica's share),
//! and its budgets (the operator's rendered `exhausted`, or standalone the replica's
//! own daily token and monthly cost counts).
//!
//! Counters outlive reloads (kept in the config's carried state), so the operator's
//! per-instance deltas never see one go backwards. The request path touches atomics,
//! plus two short uncontended mutexes (a token bucket's state, a standalone budget's
//! period) that are never held across an await.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use switchback_crds::config::{Client, ClientBudget, ObjectId, Price};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

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
    /// Unix milliseconds of the last request, let through or refused; 0 = none.
    pub last_request_ms: AtomicU64,
    /// Standalone only: this replica's counts in the current UTC day and month.
    period: Mutex<Period>,
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
pub type Shares = (Option<u32>, Option<u32>, Option<u32>);

impl Limits {
    pub fn shares(c: &Client) -> Shares {
        let l = &c.limits;
        (
            l.requests_per_minute.map(|n| c.share(n)),
            l.tokens_per_minute.map(|n| c.share(n)),
            l.max_concurrency.map(|n| c.share(n)),
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
    /// Standalone: the budgets this replica enforces from its own counts.
    pub standalone_budget: Option<ClientBudget>,
    /// Standalone: keep the day and month counts (even without a budget yet, so a
    /// budget added by a reload sees the day so far).
    pub standalone: bool,
    pub clock: WallClock,
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
}

/// A request let through: holds its concurrency slot (if the client has a limit)
/// until dropped; a stream keeps it until the stream ends.
#[derive(Debug)]
pub struct Admitted(pub Option<OwnedSemaphorePermit>);

impl ClientRt {
    /// Let the request through or say why not. Budgets first (a spent budget is
    /// the more lasting reason), then concurrency, tokens (nothing taken), and
    /// requests (a token taken only once everything else agreed). `now`: when the
    /// request arrived, read once by the caller (it also times the request).
    pub fn admit(&self, now: Instant) -> Result<Admitted, Throttled> {
        let c = &self.counters;
        let unix = self.clock.unix(now);
        c.last_request_ms
            .store((unix.as_millis() as u64).max(1), Ordering::Relaxed);
        let refused = self.check(unix, now);
        match &refused {
            Err(Throttled::RateLimited { .. }) => c.rate_limited.fetch_add(1, Ordering::Relaxed),
            Err(Throttled::BudgetExhausted { .. }) => {
                c.budget_exhausted.fetch_add(1, Ordering::Relaxed)
            }
            Ok(_) => c.requests.fetch_add(1, Ordering::Relaxed),
        };
        refused
    }

    /// `unix`: `now` as wall time since the Unix epoch.
    fn check(&self, unix: Duration, now: Instant) -> Result<Admitted, Throttled> {
        if let Some(spent) = &self.exhausted
            && let Ok(left) = spent.until.duration_since(UNIX_EPOCH + unix)
            && !left.is_zero()
        {
            return Err(Throttled::BudgetExhausted {
                retry_after: secs_up(left),
                budget: spent.budget.clone(),
            });
        }
        if let Some(b) = &self.standalone_budget {
            self.standalone_check(b, unix)?;
        }
        let Some(l) = &self.limits else {
            return Ok(Admitted(None));
        };
        let permit = match &l.slots {
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
        Ok(Admitted(permit))
    }

    fn standalone_check(&self, b: &ClientBudget, unix: Duration) -> Result<(), Throttled> {
        let p = {
            let mut p = self
                .counters
                .period
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            p.at(day_of(unix));
            *p
        };
        let spent = |budget: &str, until: SystemTime| Throttled::BudgetExhausted {
            retry_after: secs_up(until.duration_since(UNIX_EPOCH + unix).unwrap_or_default()),
            budget: budget.into(),
        };
        if b.tokens_per_day.is_some_and(|max| p.tokens >= max) {
            return Err(spent("tokensPerDay", day_start(p.day + 1)));
        }
        if b.usd_per_month
            .is_some_and(|max| p.micro_usd as f64 >= max * 1e6)
        {
            return Err(spent("usdPerMonth", month_start(p.month + 1)));
        }
        Ok(())
    }
}

/// Where one request's usage is counted: its client, and the client's counters on
/// the route serving it.
#[derive(Debug, Clone)]
pub struct ClientUsage {
    pub client: Arc<ClientRt>,
    pub route: Arc<RouteTokens>,
}

impl ClientUsage {
    /// Count what a provider reported (a unary answer, or one stream event), priced
    /// with the answering target's price, and charge it to tokens per minute.
    pub fn record(&self, u: Usage, price: Option<&Price>) {
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
        // USD per million tokens = micro-USD per token.
        let micro = price.map_or(0, |p| {
            (u.input_tokens as f64 * p.input_per_million
                + u.output_tokens as f64 * p.output_per_million)
                .round() as u64
        });
        c.micro_usd.fetch_add(micro, Ordering::Relaxed);
        let tokens = u.input_tokens + u.output_tokens;
        let bucket = self.client.limits.as_ref().and_then(|l| l.tokens.as_ref());
        if bucket.is_none() && !self.client.standalone {
            return;
        }
        // One clock read for both.
        let now = Instant::now();
        if let Some(t) = bucket {
            t.charge(tokens, now);
        }
        if self.client.standalone {
            let mut p = c.period.lock().unwrap_or_else(|p| p.into_inner());
            p.at(day_of(self.client.clock.unix(now)));
            p.tokens += tokens;
            p.micro_usd += micro;
        }
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

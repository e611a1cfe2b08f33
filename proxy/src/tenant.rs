//! What the gateway keeps per LLMClient (SPEC §9): its usage counters (requests,
//! tokens, cost, throttles; reported on `/admin/v1/stats` and `/metrics`) and its rate
//! limits (requests and tokens per minute, concurrency, each this replica's share).
//!
//! Counters outlive reloads (kept in [`crate::snapshot::Carried`]), so the operator's
//! per-instance deltas never see one go backwards. The request path touches atomics,
//! plus a short uncontended mutex per token bucket, never held across an await.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use switchback_crds::config::{Client, ObjectId, Price};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::stats::Usage;

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
}

/// Tokens of one client on one route, for `switchback_client_tokens_total`.
#[derive(Debug, Default)]
pub struct RouteTokens {
    pub input: AtomicU64,
    pub output: AtomicU64,
}

/// The wall clock the gateway reads for clients: the start time plus tokio's
/// monotonic clock since then. Immune to wall-clock jumps, and paused-clock tests can
/// move it.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    pub started_at: SystemTime,
    pub epoch: Instant,
}

impl WallClock {
    pub fn now(&self) -> SystemTime {
        self.started_at + self.epoch.elapsed()
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
/// stay the same (keyed by them, see `snapshot`).
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

/// One client as a snapshot serves it.
#[derive(Debug)]
pub struct ClientRt {
    pub id: ObjectId,
    /// `namespace/name`: the request log, spans and metrics (never the key).
    pub label: Arc<str>,
    pub counters: Arc<ClientCounters>,
    pub limits: Option<Arc<Limits>>,
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
}

/// A request let through: holds its concurrency slot (if the client has a limit)
/// until dropped; a stream keeps it until the stream ends.
#[derive(Debug)]
pub struct Admitted(pub Option<OwnedSemaphorePermit>);

impl ClientRt {
    /// Let the request through or say why not: concurrency, tokens (nothing
    /// taken), then requests (a token taken only once everything else agreed).
    pub fn admit(&self) -> Result<Admitted, Throttled> {
        let c = &self.counters;
        let wall = self.clock.now();
        c.last_request_ms
            .store(unix_ms(wall).max(1), Ordering::Relaxed);
        let refused = self.check();
        match &refused {
            Err(Throttled::RateLimited { .. }) => c.rate_limited.fetch_add(1, Ordering::Relaxed),
            Ok(_) => c.requests.fetch_add(1, Ordering::Relaxed),
        };
        refused
    }

    fn check(&self) -> Result<Admitted, Throttled> {
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
        let now = Instant::now();
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
        if let Some(t) = self.client.limits.as_ref().and_then(|l| l.tokens.as_ref()) {
            t.charge(tokens, Instant::now());
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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

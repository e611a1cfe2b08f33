//! What the gateway keeps per LLMClient (SPEC §9): its usage counters (requests,
//! tokens, cost, throttles), reported on `/admin/v1/stats` (for the operator, which
//! sums them across replicas) and on `/metrics`.
//!
//! Counters outlive reloads (kept in [`crate::snapshot::Carried`]), so the operator's
//! per-instance deltas never see one go backwards. The request path touches atomics
//! only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use switchback_crds::config::{ObjectId, Price};
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

/// One client as a snapshot serves it.
#[derive(Debug)]
pub struct ClientRt {
    pub id: ObjectId,
    /// `namespace/name`: the request log, spans and metrics (never the key).
    pub label: Arc<str>,
    pub counters: Arc<ClientCounters>,
    pub clock: WallClock,
}

impl ClientRt {
    /// A request of this client reached routing.
    pub fn admit(&self) {
        let c = &self.counters;
        c.last_request_ms
            .store(unix_ms(self.clock.now()).max(1), Ordering::Relaxed);
        c.requests.fetch_add(1, Ordering::Relaxed);
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
    /// with the answering target's price.
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
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

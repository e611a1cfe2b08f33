//! What the request path counts per route and per (route, target): requests,
//! attempts, retries, successes, failures and fallbacks by reason, resumes by
//! outcome, tokens, cost, and latency histograms (the GenAI semantic conventions'
//! ones in `genai`). Read back by the admin port (`/admin/v1/stats` for the
//! operator, Prometheus `/metrics`), which walks the live snapshot at scrape time.
//!
//! The request path only ever touches atomics here (no lock, no allocation).
//! Counters live in registries that outlive reloads (`config::prepare`'s carried
//! state), so a reload never resets them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::observe::cost::UsdCounter;
use crate::observe::genai::GenAi;
use crate::observe::reason::{Reason, ResumeOutcome};
use crate::wire::usage::Usage;

/// Histogram upper bounds in seconds (Prometheus-style, `+Inf` implied).
pub(crate) const BOUNDS: [f64; 17] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// A lock-free histogram over `BOUNDS`.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BOUNDS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub(crate) fn sum_secs(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Per-bucket (not cumulative) counts, with their upper bounds.
    pub(crate) fn buckets(&self) -> Vec<(f64, u64)> {
        BOUNDS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect()
    }

    /// The `q` quantile in milliseconds, interpolated linearly inside its bucket;
    /// `None` before the first observation.
    pub(crate) fn quantile_ms(&self, q: f64) -> Option<f64> {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut seen = 0u64;
        for (i, c) in counts.iter().enumerate() {
            if *c == 0 {
                continue;
            }
            if (seen + c) as f64 >= rank {
                let lo = if i == 0 { 0.0 } else { BOUNDS[i - 1] };
                // Above the last bound: report the last bound, the most that is known.
                let hi = BOUNDS.get(i).copied().unwrap_or(BOUNDS[BOUNDS.len() - 1]);
                let within = (rank - seen as f64) / *c as f64;
                return Some((lo + (hi - lo) * within) * 1000.0);
            }
            seen += c;
        }
        None
    }
}

/// Counts per reason, indexed by [`Reason::index`].
#[derive(Debug, Default)]
pub struct ByReason([AtomicU64; Reason::COUNT]);

impl ByReason {
    pub(crate) fn inc(&self, r: Reason) {
        self.0[r.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, r: Reason) -> u64 {
        self.0[r.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn nonzero(&self) -> impl Iterator<Item = (Reason, u64)> + '_ {
        Reason::ALL
            .into_iter()
            .map(|r| (r, self.get(r)))
            .filter(|(_, n)| *n > 0)
    }
}

/// Committed streams that failed where their route resumes, by what became of them,
/// indexed by [`ResumeOutcome::index`].
#[derive(Debug, Default)]
pub struct ByResume([AtomicU64; ResumeOutcome::COUNT]);

impl ByResume {
    pub(crate) fn inc(&self, o: ResumeOutcome) {
        self.0[o.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, o: ResumeOutcome) -> u64 {
        self.0[o.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn nonzero(&self) -> impl Iterator<Item = (ResumeOutcome, u64)> + '_ {
        ResumeOutcome::ALL
            .into_iter()
            .map(|o| (o, self.get(o)))
            .filter(|(_, n)| *n > 0)
    }
}

pub(crate) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

pub fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Per route, across reloads.
#[derive(Debug, Default)]
pub struct RouteCounters {
    pub requests: AtomicU64,
    pub attempts: AtomicU64,
    pub fallbacks: AtomicU64,
    pub failed: AtomicU64,
    /// Committed streams continued on another target (docs/streaming.md#resume-after-commit).
    pub resumed: AtomicU64,
    /// Requests answered by the route's first declared target (its primary): how
    /// much of the route it still carries (the cost-inversion alert).
    pub primary_answers: AtomicU64,
    /// Client request to response head (for streams: to the first content event).
    pub duration: Histogram,
    /// `duration` minus time spent waiting on providers and in deliberate waits.
    pub overhead: Histogram,
}

/// Per (route, target), across reloads.
#[derive(Debug, Default)]
pub struct RouteTargetCounters {
    pub requests: AtomicU64,
    pub attempts: AtomicU64,
    pub retries: AtomicU64,
    pub successes: AtomicU64,
    /// Failed attempts and skips.
    pub failures: ByReason,
    /// Requests that moved on from this target, by the reason they left.
    pub fallbacks_away: ByReason,
    pub input_tokens: AtomicU64,
    pub output_tokens: AtomicU64,
    pub attempt_duration: Histogram,
    /// Time to the first content event of committed streams.
    pub ttfb: Histogram,
    /// Resumes (docs/streaming.md#resume-after-commit): `resumed`, counted on the target
    /// that continued a broken stream; the reasons one was not, on the target whose stream
    /// broke.
    pub resumes: ByResume,
    /// Hedged attempts started on this target beside a slow one (`spec.hedge`), and
    /// how they ended: committed first (won), cancelled because the slow one
    /// committed first (lost), or failed. One abandoned by its client is in none.
    pub hedges: AtomicU64,
    pub hedge_wins: AtomicU64,
    pub hedge_losses: AtomicU64,
    pub hedge_failures: AtomicU64,
    /// What the answers of this target cost at its `price` (reported and estimated
    /// usage), and how much of that was beyond the route's first target's price.
    pub cost: UsdCounter,
    pub fallback_extra: UsdCounter,
    /// The OpenTelemetry GenAI metrics of its upstream operations.
    pub genai: GenAi,
}

impl RouteTargetCounters {
    pub fn add_usage(&self, u: Usage) {
        add(&self.input_tokens, u.input_tokens);
        add(&self.output_tokens, u.output_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let h = Histogram::default();
        assert_eq!(h.quantile_ms(0.5), None);
        for _ in 0..100 {
            h.observe(Duration::from_millis(20)); // bucket (10ms, 25ms]
        }
        let p50 = h.quantile_ms(0.5).unwrap();
        assert!((10.0..=25.0).contains(&p50), "{p50}");
        h.observe(Duration::from_secs(2));
        let p99 = h.quantile_ms(0.99).unwrap();
        assert!(p99 <= 25.0, "one slow request in 101 is above p99: {p99}");
        let p100 = h.quantile_ms(1.0).unwrap();
        assert!((1000.0..=2500.0).contains(&p100), "{p100}");
        assert_eq!(h.count(), 101);
        assert!((h.sum_secs() - 4.0).abs() < 1e-6);
        let b = h.buckets();
        assert_eq!(b.len(), BOUNDS.len() + 1);
        assert_eq!(b.iter().map(|(_, c)| c).sum::<u64>(), 101);
    }

    #[test]
    fn reasons_count_separately() {
        let r = ByReason::default();
        r.inc(Reason::Status5xx);
        r.inc(Reason::Status5xx);
        r.inc(Reason::QueueFull);
        assert_eq!(
            r.nonzero().collect::<Vec<_>>(),
            vec![(Reason::Status5xx, 2), (Reason::QueueFull, 1)]
        );
    }
}

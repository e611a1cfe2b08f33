//! What the proxy knows of each target (credential + upstream model) beyond one
//! config: whether it is parked after a 429, its circuit, its latency, its last
//! failure, its background probes. Shared by every route and snapshot that uses the
//! target, kept across reloads, and updated from the request path with atomics (the
//! last failure's short lock is never held across an await).
//!
//! **Fed by the fleet** (issue 32 item 5: the operator's view, applied by
//! `health::fleet`): what one replica finds is told to the others, and what they found
//! applied here, through this state alone,
//! found by the live snapshot (`route_list[..].targets[..].state`, and a credential's
//! keys in `credentials[id].keys`):
//!
//! | what the fleet says | call |
//! |---|---|
//! | a circuit is open elsewhere | `state.breaker.adopt_open(now, open_for)` |
//! | a probe elsewhere succeeded | `state.breaker.adopt_closed(now)` |
//! | another replica probes this target | `state.probes.set_delegated(true)` (the prober here sends nothing) |
//! | a key is parked / rejected elsewhere | `key.state.park_until(ms)` / `reject_until(ms)` (proxy-clock ms, `Gateway::now_ms`; the later end wins) |
//! | a key works again | `key.state.lift()` |
//!
//! What this replica finds is read back the same way: `breaker.reported`, `state()`,
//! `probes.last()`, `KeyState::shown` (and `/admin/v1/stats` reports them all).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use switchback_crds::config::ObjectId;

use crate::health::Probes;
use crate::limits::circuit::Breaker;
use crate::observe::counters::Histogram;
use crate::observe::reason::Reason;

/// Runtime facts about one target (credential + upstream model), shared by every
/// route and snapshot that uses it, updated from the request path without holding a
/// lock across an await.
#[derive(Debug, Default)]
pub struct TargetState {
    /// Milliseconds on the proxy clock until which the target is parked after a 429.
    parked_until_ms: AtomicU64,
    /// What the target was prepared from (URL, provider, headers, key), hashed: a
    /// reload that changes it clears the park, which was about the old target.
    fingerprint: AtomicU64,
    /// Smoothed latency in microseconds; 0 = never measured.
    latency_ewma_us: AtomicU64,
    pub breaker: Breaker,
    /// Latency of answered attempts (full answer, or first content event for streams).
    pub latency: Histogram,
    last_failure: Mutex<Option<FailureRecord>>,
    /// Its background probes and health checks (docs/request-lifecycle.md#probed-circuits).
    pub probes: Probes,
}

/// The last failure of a target, for stats.
#[derive(Debug, Clone, Copy)]
pub struct FailureRecord {
    pub status: Option<u16>,
    pub reason: Reason,
    pub at: SystemTime,
}

impl TargetState {
    pub fn parked_until_ms(&self) -> u64 {
        self.parked_until_ms.load(Ordering::Relaxed)
    }

    /// Park until `until_ms`, never shortening an existing park.
    pub fn park_until(&self, until_ms: u64) {
        self.parked_until_ms.fetch_max(until_ms, Ordering::Relaxed);
    }

    /// Is the target parked at `now_ms` for a route whose `maxRetryAfter` is
    /// `cap_ms`? A park never outlives the cap: one set under a larger cap (another
    /// route, or before a reload lowered it) is cut down to it here.
    pub fn parked(&self, now_ms: u64, cap_ms: u64) -> bool {
        let until = self.parked_until_ms.load(Ordering::Relaxed);
        if until <= now_ms {
            return false;
        }
        let latest = now_ms.saturating_add(cap_ms);
        if until > latest {
            self.parked_until_ms.fetch_min(latest, Ordering::Relaxed);
            return latest > now_ms;
        }
        true
    }

    /// Record what the target is now prepared from; a change clears the park.
    pub(super) fn adopt(&self, fingerprint: u64) {
        let old = self.fingerprint.swap(fingerprint, Ordering::Relaxed);
        if old != 0 && old != fingerprint {
            self.parked_until_ms.store(0, Ordering::Relaxed);
        }
    }

    pub fn latency_ewma_us(&self) -> u64 {
        self.latency_ewma_us.load(Ordering::Relaxed)
    }

    pub fn record_failure(&self, status: Option<u16>, reason: Reason) {
        let rec = FailureRecord {
            status,
            reason,
            at: SystemTime::now(),
        };
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(rec);
    }

    pub fn last_failure(&self) -> Option<FailureRecord> {
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fold one measurement in (weight 0.2 for the new sample).
    pub fn observe_latency(&self, sample: Duration) {
        let sample = (sample.as_micros() as u64).max(1);
        let _ = self
            .latency_ewma_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 {
                    sample
                } else {
                    (old * 4 + sample) / 5
                })
            });
    }
}

/// Identity of a target's runtime state: circuit, parking and latency belong to the
/// pair (credential, upstream model), whichever routes use it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TargetKey {
    pub credential: ObjectId,
    pub model: Option<String>,
    /// A `modelMap` target's map (empty otherwise): one state for the whole map.
    pub model_map: std::collections::BTreeMap<String, String>,
}

#[cfg(test)]
mod park_tests {
    use super::TargetState;

    #[test]
    fn a_park_never_outlives_the_cap_it_is_read_under() {
        let t = TargetState::default();
        // Parked for an hour, under a route (or a config) whose cap was larger.
        t.park_until(1_000 + 3_600_000);
        assert!(t.parked(1_000, 10_000));
        assert!(t.parked_until_ms() <= 11_000, "cut down to the cap");
        assert!(t.parked(10_999, 10_000));
        assert!(!t.parked(11_000, 10_000));
        // Absurd ends saturate instead of wrapping.
        t.park_until(u64::MAX);
        assert!(t.parked(20_000, u64::MAX));
        assert!(!t.parked(u64::MAX, 5));
    }

    #[test]
    fn a_target_made_from_something_else_is_no_longer_parked() {
        let t = TargetState::default();
        t.adopt(7);
        t.park_until(60_000);
        t.adopt(7); // a reload that kept the target as it was
        assert!(t.parked(0, u64::MAX));
        t.adopt(8); // its URL, headers or key changed
        assert!(!t.parked(0, u64::MAX));
    }
}

//! A credential's keys at run time (docs/request-lifecycle.md#key-pools): one key, or a
//! pool of them (`secretRef.keys`), each with the headers that carry it and its state.
//!
//! A key answered with 429 is *parked* until its Retry-After (or the retry backoff)
//! ends; one answered with 401 or 403 is *rejected* for the credential's
//! `keyRejectedFor`. Requests take the usable keys in turn: [`KeyPool::pick`] is one
//! atomic add and one atomic read while every key is usable (one more of each per key
//! set aside that comes up), no lock; a try whose key was set aside goes at once to
//! the next usable key ([`KeyPool::after`]). `benches/keys.rs` measures it. When no key is usable, the one
//! set aside the shortest is taken anyway (the walk decides whether to send at all:
//! a target parked after its last usable key's 429 is skipped as `parked`).
//!
//! A key's state ([`KeyState`]) outlives reloads while the key's value stays (a rotated
//! key starts afresh), and is what another source of truth may set too: the ends of a
//! park and of a rejection are plain atomics written with `fetch_max`, so a replica's
//! own findings and a fleet-wide view (issue 32 item 5, delivered by the operator)
//! combine by taking the later end, whoever writes first.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use http::HeaderMap;
use switchback_crds::secret::Secret;
use switchback_crds::stats::KeyState as Shown;

/// What one key is to requests, kept across reloads that keep its value.
#[derive(Debug, Default)]
pub struct KeyState {
    /// Proxy-clock milliseconds until which it is parked after a 429.
    parked_until_ms: AtomicU64,
    /// Proxy-clock milliseconds until which it is rejected after a 401 or 403.
    rejected_until_ms: AtomicU64,
    /// Upstream requests sent with it (probes included).
    pub attempts: AtomicU64,
    /// 429s that parked it.
    pub rate_limited: AtomicU64,
    /// 401s and 403s that rejected it.
    pub rejected: AtomicU64,
    /// Wall-clock milliseconds when this replica loaded this value (0: unknown): a
    /// rejection the fleet reports from before it was about an older value
    /// (`health::fleet`).
    pub loaded_at_ms: u64,
}

impl KeyState {
    /// A key's state for a value loaded now.
    pub fn loaded_now() -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Self {
            loaded_at_ms: now,
            ..Self::default()
        }
    }

    /// Park it until `until_ms` (never shortening a park).
    pub fn park_until(&self, until_ms: u64) {
        self.parked_until_ms.fetch_max(until_ms, Ordering::Relaxed);
    }

    /// Reject it until `until_ms` (never shortening a rejection).
    pub(crate) fn reject_until(&self, until_ms: u64) {
        self.rejected_until_ms
            .fetch_max(until_ms, Ordering::Relaxed);
    }

    /// Use it again now, whatever set it aside: for a fleet-wide view that learns the
    /// key works again (issue 32 item 5). Nothing here calls it.
    pub fn lift(&self) {
        self.parked_until_ms.store(0, Ordering::Relaxed);
        self.rejected_until_ms.store(0, Ordering::Relaxed);
    }

    /// When it may be used again (`0`: now).
    pub(crate) fn usable_from_ms(&self) -> u64 {
        self.parked_until_ms
            .load(Ordering::Relaxed)
            .max(self.rejected_until_ms.load(Ordering::Relaxed))
    }

    pub fn usable(&self, now_ms: u64) -> bool {
        self.usable_from_ms() <= now_ms
    }

    /// Its state at `now_ms` as stats and status show it, and until when: a rejection
    /// outweighs a park.
    pub fn shown(&self, now_ms: u64) -> (Shown, Option<u64>) {
        let rejected = self.rejected_until_ms.load(Ordering::Relaxed);
        let parked = self.parked_until_ms.load(Ordering::Relaxed);
        if rejected > now_ms {
            (Shown::Rejected, Some(rejected))
        } else if parked > now_ms {
            (Shown::Parked, Some(parked))
        } else {
            (Shown::Active, None)
        }
    }
}

/// One key ready for requests.
#[derive(Debug)]
pub struct PoolKey {
    /// The Secret data key holding it: its name in stats, status and metrics.
    pub name: Box<str>,
    /// The credential's headers with this key's.
    pub headers: HeaderMap,
    /// The value, only to mask it in provider error bodies relayed to clients.
    pub secret: Option<Secret<String>>,
    pub state: Arc<KeyState>,
}

/// A credential's keys in declared order (only those the Secret holds), taken in turn.
#[derive(Debug, Default)]
pub struct KeyPool {
    keys: Box<[PoolKey]>,
    /// The turn: the next request starts looking at `next % len`.
    next: AtomicUsize,
}

impl KeyPool {
    pub fn new(keys: Vec<PoolKey>) -> Self {
        Self {
            keys: keys.into_boxed_slice(),
            next: AtomicUsize::new(0),
        }
    }

    /// No key at all: the target is skipped as `missingKey`.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn get(&self, i: u8) -> &PoolKey {
        &self.keys[usize::from(i).min(self.keys.len().saturating_sub(1))]
    }

    pub fn iter(&self) -> impl Iterator<Item = &PoolKey> {
        self.keys.iter()
    }

    /// The key a request uses at `now_ms`: the usable ones in turn, else the one whose
    /// park or rejection ends soonest. `None` only for an empty pool. A turn that comes
    /// up on a key set aside is passed on to the next turn, not to the next key: each
    /// usable key keeps an equal share (a parked key's turns do not all go to its
    /// neighbour).
    pub fn pick(&self, now_ms: u64) -> Option<u8> {
        let n = self.keys.len();
        if n <= 1 {
            return (n == 1).then_some(0);
        }
        for _ in 0..n {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % n;
            if self.keys[i].state.usable(now_ms) {
                return Some(i as u8);
            }
        }
        Some(self.soonest())
    }

    /// The first usable key after `key` (in declared order, round and round): where a
    /// try whose key was just set aside goes; else the one back soonest.
    pub fn after(&self, key: u8, now_ms: u64) -> u8 {
        let n = self.keys.len();
        (1..n)
            .map(|k| (usize::from(key) + k) % n)
            .find(|&i| self.keys[i].state.usable(now_ms))
            .map_or_else(|| self.soonest(), |i| i as u8)
    }

    /// The key whose park or rejection ends soonest.
    fn soonest(&self) -> u8 {
        (0..self.keys.len())
            .min_by_key(|&i| self.keys[i].state.usable_from_ms())
            .unwrap_or(0) as u8
    }

    /// Whether a key other than `but` is usable at `now_ms`.
    pub(crate) fn another_usable(&self, now_ms: u64, but: u8) -> bool {
        self.keys
            .iter()
            .enumerate()
            .any(|(i, k)| i != usize::from(but) && k.state.usable(now_ms))
    }

    /// Usable keys at `now_ms`.
    pub fn usable(&self, now_ms: u64) -> usize {
        self.keys.iter().filter(|k| k.state.usable(now_ms)).count()
    }

    /// When the first key is usable again (`now_ms` or earlier when one is now).
    pub(crate) fn soonest_usable_ms(&self) -> u64 {
        self.keys
            .iter()
            .map(|k| k.state.usable_from_ms())
            .min()
            .unwrap_or(0)
    }

    /// A pool of `n` keys named `k0`, `k1`, ... with no headers and no value (tests).
    #[cfg(test)]
    pub(crate) fn unkeyed(n: usize) -> Self {
        Self::new(
            (0..n)
                .map(|i| PoolKey {
                    name: format!("k{i}").into(),
                    headers: HeaderMap::new(),
                    secret: None,
                    state: Arc::default(),
                })
                .collect(),
        )
    }

    /// The values, to mask in what providers echo.
    pub(crate) fn secrets(&self) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .filter_map(|k| k.secret.as_ref().map(|s| s.expose().as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> KeyPool {
        KeyPool::unkeyed(n)
    }

    #[test]
    fn requests_take_the_usable_keys_in_turn() {
        let p = pool(3);
        let turns: Vec<u8> = (0..6).map(|_| p.pick(0).unwrap()).collect();
        assert_eq!(turns, [0, 1, 2, 0, 1, 2]);
        p.get(1).state.park_until(1_000);
        let turns: Vec<u8> = (0..4).map(|_| p.pick(500).unwrap()).collect();
        assert_eq!(
            turns,
            [0, 2, 0, 2],
            "the parked key is passed over, the rest alternate"
        );
        assert!(p.another_usable(500, 0));
        assert_eq!(p.usable(500), 2);
        assert_eq!(
            p.after(0, 500),
            2,
            "the next usable after the one set aside"
        );
        assert_eq!(p.after(2, 500), 0);
        // Its park over, it takes its turn again.
        let turns: Vec<u8> = (0..3).map(|_| p.pick(1_000).unwrap()).collect();
        assert_eq!(turns, [0, 1, 2]);
    }

    #[test]
    fn with_none_usable_the_one_set_aside_shortest_is_taken() {
        let p = pool(3);
        p.get(0).state.reject_until(300_000);
        p.get(1).state.park_until(2_000);
        p.get(2).state.park_until(5_000);
        assert_eq!(p.usable(0), 0);
        assert!(!p.another_usable(0, 1));
        assert_eq!(p.pick(0), Some(1));
        assert_eq!(p.soonest_usable_ms(), 2_000);
        assert_eq!(p.get(0).state.shown(0), (Shown::Rejected, Some(300_000)));
        assert_eq!(p.get(1).state.shown(0), (Shown::Parked, Some(2_000)));
        assert_eq!(p.get(1).state.shown(2_000), (Shown::Active, None));
        // A rejection outweighs a park; neither is ever shortened.
        p.get(1).state.reject_until(10_000);
        p.get(1).state.park_until(1);
        assert_eq!(p.get(1).state.shown(3_000), (Shown::Rejected, Some(10_000)));
        p.get(1).state.lift();
        assert_eq!(p.get(1).state.shown(3_000), (Shown::Active, None));
        assert_eq!(pool(0).pick(0), None);
        assert_eq!(pool(1).pick(0), Some(0));
    }
}

//! How many of a route's requests this replica may hedge (`spec.hedge.maxPercent`,
//! docs/streaming.md#first-token-hedging): at most that percentage of the route's requests
//! started in the last 60 s, this one included, counted in one-second buckets of the proxy
//! clock.
//!
//! Only a route that hedges has one, and only its requests touch it: one short lock
//! per request to count it, and one more to take a hedge, both a few additions and
//! never held across an await. Kept across reloads with the route's counters.

use std::sync::Mutex;

/// Seconds of the sliding window.
pub const WINDOW_SECS: u64 = 60;

/// Requests started and hedged per second, over the last [`WINDOW_SECS`].
#[derive(Debug, Default)]
pub struct HedgeBudget(Mutex<Window>);

#[derive(Debug)]
struct Window {
    /// By `second % WINDOW_SECS`: the second it counts, its requests, its hedges.
    buckets: [Bucket; WINDOW_SECS as usize],
}

#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    second: u64,
    requests: u32,
    hedges: u32,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            // `u64::MAX`: a second no clock reaches, so an unused bucket counts nothing.
            buckets: [Bucket {
                second: u64::MAX,
                ..Bucket::default()
            }; WINDOW_SECS as usize],
        }
    }
}

impl Window {
    fn bucket(&mut self, second: u64) -> &mut Bucket {
        let b = &mut self.buckets[(second % WINDOW_SECS) as usize];
        if b.second != second {
            *b = Bucket {
                second,
                ..Bucket::default()
            };
        }
        b
    }

    /// Requests and hedges of the window ending with `second`.
    fn totals(&self, second: u64) -> (u64, u64) {
        let from = (second + 1).saturating_sub(WINDOW_SECS);
        self.buckets
            .iter()
            .filter(|b| (from..=second).contains(&b.second))
            .fold((0, 0), |(r, h), b| {
                (r + u64::from(b.requests), h + u64::from(b.hedges))
            })
    }
}

impl HedgeBudget {
    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request of the route started at `now_ms` (the proxy clock).
    pub fn started(&self, now_ms: u64) {
        let mut w = self.lock();
        let b = w.bucket(now_ms / 1000);
        b.requests = b.requests.saturating_add(1);
    }

    /// Would one more request be hedged at `now_ms`, `max_percent` of the window's
    /// requests being the most? Nothing is taken (see [`HedgeBudget::take`]).
    pub fn allows(&self, now_ms: u64, max_percent: u32) -> bool {
        let (requests, hedges) = self.lock().totals(now_ms / 1000);
        within(requests, hedges, max_percent)
    }

    /// May one more request be hedged at `now_ms`, `max_percent` of the window's
    /// requests being the most? Taken when it may.
    pub fn take(&self, now_ms: u64, max_percent: u32) -> bool {
        let second = now_ms / 1000;
        let mut w = self.lock();
        let (requests, hedges) = w.totals(second);
        if !within(requests, hedges, max_percent) {
            return false;
        }
        let b = w.bucket(second);
        b.hedges = b.hedges.saturating_add(1);
        true
    }

    /// Requests and hedges of the window ending at `now_ms`.
    pub fn window(&self, now_ms: u64) -> (u64, u64) {
        self.lock().totals(now_ms / 1000)
    }
}

/// One more hedge keeps `hedges` within `max_percent` of `requests`.
fn within(requests: u64, hedges: u64, max_percent: u32) -> bool {
    (hedges + 1) * 100 <= u64::from(max_percent) * requests
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_the_percentage_of_the_windows_requests_is_hedged() {
        let b = HedgeBudget::default();
        let mut hedged = 0;
        for i in 0..100u64 {
            b.started(i * 10);
            hedged += u32::from(b.take(i * 10, 10));
        }
        assert_eq!(hedged, 10, "10 % of 100");
        assert_eq!(b.window(999), (100, 10));
        // Each hedge needs its ten requests: the first comes with the tenth.
        let b = HedgeBudget::default();
        for _ in 0..9 {
            b.started(0);
            assert!(!b.take(0, 10));
        }
        b.started(0);
        assert!(b.allows(0, 10));
        assert!(b.take(0, 10), "this request included");
        assert!(!b.allows(0, 10));
        assert!(!b.take(0, 10));
    }

    #[test]
    fn the_window_slides_by_the_second() {
        let b = HedgeBudget::default();
        for _ in 0..10 {
            b.started(500);
        }
        assert!(b.take(500, 10));
        assert!(!b.take(59_999, 10), "the window still holds the hedge");
        // The second the requests and the hedge were counted in has left the window.
        assert_eq!(b.window(60_000), (0, 0));
        b.started(60_000);
        assert!(!b.take(60_000, 10), "one request is not enough for 10 %");
        assert!(b.take(60_000, 100));
        // Sixty seconds later a bucket is reused, not added to.
        for _ in 0..3 {
            b.started(120_000);
        }
        assert_eq!(b.window(120_000), (3, 0));
    }

    #[test]
    fn a_hundred_percent_hedges_every_request() {
        let b = HedgeBudget::default();
        for i in 0..50 {
            b.started(i);
            assert!(b.take(i, 100));
        }
    }
}

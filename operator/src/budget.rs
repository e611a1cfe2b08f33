//! The status write budget: a global token bucket (`--status-writes-per-second`) and a
//! per-object minimum interval (`--status-interval`) for writes that change only
//! traffic facts. Time is passed in, so the rules are tested without a clock.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug)]
pub struct StatusBudget {
    per_second: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
    interval: Duration,
    last_write: HashMap<String, Instant>,
}

/// Whether a write may go now.
#[derive(Debug, PartialEq, Eq)]
pub enum Permit {
    Granted,
    /// Try again after this long.
    Wait(Duration),
}

impl StatusBudget {
    pub fn new(per_second: f64, interval: Duration, now: Instant) -> Self {
        let per_second = per_second.max(0.01);
        let burst = per_second.max(1.0);
        Self {
            per_second,
            burst,
            tokens: burst,
            refilled: now,
            interval,
            last_write: HashMap::new(),
        }
    }

    /// Asks to write the status of `key`. `urgent` writes (conditions changed) skip the
    /// per-object interval; every write takes a token from the global bucket.
    pub fn permit(&mut self, key: &str, urgent: bool, now: Instant) -> Permit {
        if !urgent && let Some(last) = self.last_write.get(key) {
            let next = *last + self.interval;
            if next > now {
                return Permit::Wait(next - now);
            }
        }
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.refilled = now;
        if self.tokens < 1.0 {
            let wait = (1.0 - self.tokens) / self.per_second;
            return Permit::Wait(Duration::from_secs_f64(wait).max(Duration::from_millis(10)));
        }
        self.tokens -= 1.0;
        self.last_write.insert(key.to_string(), now);
        Permit::Granted
    }

    /// Forget an object (deleted).
    pub fn forget(&mut self, key: &str) {
        self.last_write.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_only_writes_wait_for_the_interval_condition_changes_do_not() {
        let t0 = Instant::now();
        let mut b = StatusBudget::new(100.0, Duration::from_secs(10), t0);
        assert_eq!(b.permit("a", false, t0), Permit::Granted);
        assert_eq!(
            b.permit("a", false, t0 + Duration::from_secs(4)),
            Permit::Wait(Duration::from_secs(6))
        );
        assert_eq!(
            b.permit("a", true, t0 + Duration::from_secs(4)),
            Permit::Granted
        );
        assert_eq!(
            b.permit("b", false, t0 + Duration::from_secs(4)),
            Permit::Granted
        );
        assert_eq!(
            b.permit("a", false, t0 + Duration::from_secs(14)),
            Permit::Granted
        );
    }

    #[test]
    fn the_global_budget_caps_writes_per_second() {
        let t0 = Instant::now();
        let mut b = StatusBudget::new(5.0, Duration::from_secs(1), t0);
        let granted = (0..20)
            .filter(|i| b.permit(&format!("r{i}"), true, t0) == Permit::Granted)
            .count();
        assert_eq!(granted, 5, "burst is one second's worth");
        match b.permit("late", true, t0) {
            Permit::Wait(d) => assert!(d <= Duration::from_millis(200), "{d:?}"),
            Permit::Granted => panic!("over budget"),
        }
        // Over 10 seconds, about 50 more.
        let mut more = 0;
        for ms in (0..10_000).step_by(10) {
            if b.permit(&format!("x{ms}"), true, t0 + Duration::from_millis(ms)) == Permit::Granted
            {
                more += 1;
            }
        }
        assert!((49..=51).contains(&more), "{more}");
    }
}

//! The status write budget: a global token bucket (`--status-writes-per-second`) and a
//! per-object minimum interval (`--status-interval`) for writes that change only
//! traffic facts. Time is passed in, so the rules are tested without a clock.
//!
//! When the bucket runs short, a route's condition change goes first: it is what
//! `kubectl wait --for=condition=Programmed` waits on. Everything else (traffic facts,
//! ProviderCredential status) takes only what those leave over, so during a bulk apply
//! the ~3 writes per credential do not delay the routes behind them.

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

/// Which writes go first when the budget is short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// An LLMRoute's conditions or observed generation change.
    First,
    /// Any other write: it waits while [`Priority::First`] writes use the bucket, and is
    /// granted only while half the burst is spare. Without such writes the bucket fills
    /// within a second, so these are delayed, never starved, once the bulk is written.
    Spare,
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
    /// per-object interval; every write takes a token from the global bucket, and a
    /// [`Priority::Spare`] write only while the bucket is at least half full.
    pub fn permit(&mut self, key: &str, urgent: bool, priority: Priority, now: Instant) -> Permit {
        if !urgent && let Some(last) = self.last_write.get(key) {
            let next = *last + self.interval;
            if next > now {
                return Permit::Wait(next - now);
            }
        }
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.refilled = now;
        let needed = match priority {
            Priority::First => 1.0,
            // Half of what the burst holds beyond the one token a write takes: with a
            // burst of one (a budget of 1/s or less) there is nothing to reserve.
            Priority::Spare => 1.0 + (self.burst - 1.0) / 2.0,
        };
        if self.tokens < needed {
            let wait = (needed - self.tokens) / self.per_second;
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
        assert_eq!(b.permit("a", false, Priority::Spare, t0), Permit::Granted);
        assert_eq!(
            b.permit("a", false, Priority::Spare, t0 + Duration::from_secs(4)),
            Permit::Wait(Duration::from_secs(6))
        );
        assert_eq!(
            b.permit("a", true, Priority::First, t0 + Duration::from_secs(4)),
            Permit::Granted
        );
        assert_eq!(
            b.permit("b", false, Priority::Spare, t0 + Duration::from_secs(4)),
            Permit::Granted
        );
        assert_eq!(
            b.permit("a", false, Priority::Spare, t0 + Duration::from_secs(14)),
            Permit::Granted
        );
    }

    #[test]
    fn the_global_budget_caps_writes_per_second() {
        let t0 = Instant::now();
        let mut b = StatusBudget::new(5.0, Duration::from_secs(1), t0);
        let granted = (0..20)
            .filter(|i| b.permit(&format!("r{i}"), true, Priority::First, t0) == Permit::Granted)
            .count();
        assert_eq!(granted, 5, "burst is one second's worth");
        match b.permit("late", true, Priority::First, t0) {
            Permit::Wait(d) => assert!(d <= Duration::from_millis(200), "{d:?}"),
            Permit::Granted => panic!("over budget"),
        }
        // Over 10 seconds, about 50 more.
        let mut more = 0;
        for ms in (0..10_000).step_by(10) {
            if b.permit(
                &format!("x{ms}"),
                true,
                Priority::First,
                t0 + Duration::from_millis(ms),
            ) == Permit::Granted
            {
                more += 1;
            }
        }
        assert!((49..=51).contains(&more), "{more}");
    }

    #[test]
    fn route_condition_changes_go_before_spare_writes_and_spare_writes_follow() {
        let t0 = Instant::now();
        let mut b = StatusBudget::new(10.0, Duration::from_secs(10), t0);
        // A bulk apply: route condition changes take every token as it comes...
        let (mut first, mut spare, mut spare_later) = (0, 0, 0);
        for ms in (0..5_000).step_by(20) {
            let at = t0 + Duration::from_millis(ms);
            if b.permit(&format!("route{ms}"), true, Priority::First, at) == Permit::Granted {
                first += 1;
            }
            if b.permit(&format!("cred{ms}"), true, Priority::Spare, at) == Permit::Granted {
                spare += 1;
                spare_later += usize::from(ms >= 100);
            }
        }
        // ...so once the full bucket they found is half spent, spare writes wait: the
        // 10 burst + 10/s for 5 s all go to the routes but for the first moment's spare.
        assert_eq!(
            spare_later, 0,
            "a spare write took a token routes were waiting for"
        );
        assert!(spare <= 5, "{spare}");
        assert!((59..=61).contains(&(first + spare)), "{first} + {spare}");
        // Once the routes are written, the spare writes follow within a second...
        let after = t0 + Duration::from_millis(5_000);
        let Permit::Wait(wait) = b.permit("cred", true, Priority::Spare, after) else {
            panic!("granted from an empty bucket");
        };
        assert!(wait <= Duration::from_millis(600), "{wait:?}");
        assert_eq!(
            b.permit("cred", true, Priority::Spare, after + wait),
            Permit::Granted
        );
        // ...and while routes use part of the budget, the rest goes to spare writes.
        let (mut first, mut spare) = (0, 0);
        let t1 = after + Duration::from_secs(2);
        for ms in (0..10_000).step_by(10) {
            let at = t1 + Duration::from_millis(ms);
            // Routes ask 4 times a second, spare writers 100 times.
            if ms % 250 == 0
                && b.permit(&format!("r{ms}"), true, Priority::First, at) == Permit::Granted
            {
                first += 1;
            }
            if b.permit(&format!("c{ms}"), true, Priority::Spare, at) == Permit::Granted {
                spare += 1;
            }
        }
        assert_eq!(first, 40, "a route write waited behind spare writes");
        assert!((55..=66).contains(&spare), "{spare}");
    }

    #[test]
    fn a_budget_of_one_per_second_still_grants_spare_writes() {
        let t0 = Instant::now();
        let mut b = StatusBudget::new(1.0, Duration::from_secs(10), t0);
        assert_eq!(b.permit("c", true, Priority::Spare, t0), Permit::Granted);
        assert_eq!(
            b.permit("d", true, Priority::Spare, t0 + Duration::from_secs(1)),
            Permit::Granted
        );
    }
}

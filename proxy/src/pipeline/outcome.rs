//! What one attempt's failure means for the walk: whether the same target may be
//! tried again, whether the chain may advance to the next target (the outcome
//! table of docs/request-lifecycle.md#what-each-outcome-does), how long to back off, and
//! one attempt's deadline. Pure functions over compiled policy, so every row is unit-tested
//! here.

use std::time::Duration;

use switchback_crds::config::{Fallback, Retry, Target};

use crate::observe::reason::Reason;

/// May the same target be tried again after this failure (attempts permitting)?
pub fn retryable(reason: Reason, status: Option<u16>, retry: &Retry) -> bool {
    // A context-length or content-filter answer is never retried, even if its status
    // is listed: the same request gets the same answer; a loop loops again.
    if matches!(
        reason,
        Reason::ContextLength | Reason::ContentFilter | Reason::LoopDetected
    ) {
        return false;
    }
    match (reason, status) {
        (Reason::ConnectionError, _) => true,
        // Attempt timeouts, context length and skips advance at once.
        (Reason::Timeout | Reason::Budget, None) => false,
        (_, Some(s)) => match &retry.on_status_codes {
            Some(list) => list.contains(&s),
            None => s == 408 || s == 429 || (500..=599).contains(&s),
        },
        _ => false,
    }
}

/// May the chain move on to the next target after this failure?
pub fn may_advance(reason: Reason, status: Option<u16>, fallback: &Fallback) -> bool {
    if status.is_some_and(|s| fallback.on_status_codes.contains(&s)) {
        return true;
    }
    match reason {
        // Skips always advance: nothing was sent, so nothing else could answer.
        r if r.is_skip() => true,
        // A target that leads back to a gateway can answer nothing: like a skip.
        Reason::LoopDetected => true,
        other => other
            .class()
            .is_some_and(|c| fallback.on_failures.contains(&c)),
    }
}

/// Full-jitter backoff before retry number `retry` (1 = the first retry):
/// uniform in `[0, min(maxBackoff, initialBackoff * 2^(retry-1)))`.
pub fn backoff(retry: u32, policy: &Retry, unit: f64) -> Duration {
    let exp = policy
        .initial_backoff_ms
        .saturating_mul(1u64 << (retry.saturating_sub(1)).min(20));
    let cap = exp.min(policy.max_backoff_ms);
    Duration::from_micros((cap as f64 * 1000.0 * unit.clamp(0.0, 1.0)) as u64)
}

/// When a target without its own `timeout` must be done
/// (docs/request-lifecycle.md#time-budgets): the call's budget less what the targets after
/// it are owed, so a hung target never spends it all. Each later target (`later`: their
/// `timeout`s) is owed its `timeout`, or an equal share of the route's (`route_timeout_ms /
/// targets`) when it has none; the last target (no `later`) may use all that remains.
/// However little is left, a target gets at least an equal split of it with the targets
/// after it.
pub fn share_end(
    now: tokio::time::Instant,
    budget: tokio::time::Instant,
    route_timeout_ms: u64,
    targets: usize,
    later: impl Iterator<Item = Option<u64>>,
) -> tokio::time::Instant {
    let share = route_timeout_ms / targets.max(1) as u64;
    let (mut owed_ms, mut after) = (0u64, 0u64);
    for timeout in later {
        owed_ms = owed_ms.saturating_add(timeout.unwrap_or(share));
        after += 1;
    }
    let left = budget.saturating_duration_since(now);
    let floor = left / (after as u32 + 1);
    let mine = left
        .saturating_sub(Duration::from_millis(owed_ms))
        .max(floor);
    now.checked_add(mine).map_or(budget, |end| end.min(budget))
}

/// The per-attempt deadline: the target's timeout, never past the call's budget.
pub fn attempt_deadline(
    now: tokio::time::Instant,
    target: &Target,
    budget: tokio::time::Instant,
) -> tokio::time::Instant {
    match target
        .timeout_ms
        .and_then(|ms| now.checked_add(Duration::from_millis(ms)))
    {
        Some(at) => at.min(budget),
        None => budget,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::classify::{millis, retry_after};
    use http::header::{HeaderMap, HeaderValue};
    use switchback_crds::config::FailureClass;

    fn retry_default() -> Retry {
        Retry {
            attempts: 3,
            ..Retry::default()
        }
    }

    #[test]
    fn content_filter_is_returned_unless_listed_and_never_retried() {
        let r = Retry {
            on_status_codes: Some(vec![400]),
            ..retry_default()
        };
        assert!(!retryable(Reason::ContentFilter, Some(400), &r));
        assert!(!Reason::ContentFilter.trips_breaker(Some(400)));
        assert!(Reason::ContentFilter.returns_upstream_answer());
        assert!(!may_advance(
            Reason::ContentFilter,
            Some(400),
            &Fallback::default()
        ));
        let mut listed = Fallback::default();
        listed.on_failures.push(FailureClass::ContentFilter);
        assert!(may_advance(Reason::ContentFilter, Some(400), &listed));
    }

    #[test]
    fn an_answer_the_replica_cannot_hold_stops_the_chain_without_a_retry() {
        let mut every = Fallback::default();
        every.on_failures.push(FailureClass::AuthError);
        assert!(!may_advance(Reason::Overloaded, None, &every));
        assert!(!retryable(Reason::Overloaded, None, &retry_default()));
        assert!(!Reason::Overloaded.is_skip());
    }

    #[test]
    fn a_loop_is_never_retried_and_always_advances() {
        let listed = Retry {
            on_status_codes: Some(vec![508]),
            ..retry_default()
        };
        for r in [retry_default(), listed] {
            assert!(!retryable(Reason::LoopDetected, Some(508), &r));
        }
        let none = Fallback {
            on_failures: vec![],
            ..Fallback::default()
        };
        assert!(may_advance(Reason::LoopDetected, Some(508), &none));
        assert!(!Reason::LoopDetected.trips_breaker(Some(508)));
        assert!(!Reason::LoopDetected.is_skip(), "it was sent");
        assert!(!Reason::LoopDetected.returns_upstream_answer());
        assert_eq!(
            crate::providers::classify::classify_status(508, b""),
            Reason::LoopDetected
        );
    }

    #[test]
    fn default_retry_set_is_transport_408_429_and_5xx() {
        let r = retry_default();
        assert!(retryable(Reason::ConnectionError, None, &r));
        assert!(retryable(Reason::Timeout, Some(408), &r));
        assert!(retryable(Reason::RateLimited, Some(429), &r));
        assert!(retryable(Reason::Status5xx, Some(500), &r));
        assert!(
            !retryable(Reason::Timeout, None, &r),
            "attempt timeouts advance at once"
        );
        assert!(!retryable(Reason::ContextLength, Some(400), &r));
        assert!(!retryable(Reason::AuthError, Some(401), &r));
        assert!(!retryable(Reason::ClientError, Some(404), &r));
    }

    #[test]
    fn listed_statuses_replace_the_default_set() {
        let r = Retry {
            on_status_codes: Some(vec![503, 409]),
            ..retry_default()
        };
        assert!(retryable(Reason::Status5xx, Some(503), &r));
        assert!(!retryable(Reason::Status5xx, Some(500), &r));
        assert!(retryable(Reason::ClientError, Some(409), &r));
        assert!(
            retryable(Reason::ConnectionError, None, &r),
            "transport errors always retry"
        );
        let r = Retry {
            on_status_codes: Some(vec![400]),
            ..retry_default()
        };
        assert!(!retryable(Reason::ContextLength, Some(400), &r));
    }

    #[test]
    fn advancing_follows_fallback_on() {
        let f = Fallback::default();
        for r in [
            Reason::Status5xx,
            Reason::RateLimited,
            Reason::Timeout,
            Reason::Budget,
            Reason::ConnectionError,
            Reason::ContextLength,
            Reason::InvalidResponse,
            Reason::ResponseTooLarge,
            Reason::MissingKey,
            Reason::Parked,
        ] {
            assert!(may_advance(r, None, &f), "{r:?}");
        }
        assert!(
            !may_advance(Reason::AuthError, Some(401), &f),
            "authError is opt-in"
        );
        assert!(!may_advance(Reason::ClientError, Some(400), &f));
        let f = Fallback {
            on_failures: vec![FailureClass::AuthError],
            on_status_codes: vec![404],
            ..Fallback::default()
        };
        assert!(may_advance(Reason::AuthError, Some(403), &f));
        assert!(may_advance(Reason::ClientError, Some(404), &f));
        assert!(!may_advance(Reason::Status5xx, Some(500), &f));
    }

    #[test]
    fn backoff_is_full_jitter_doubling_and_capped() {
        let r = Retry {
            initial_backoff_ms: 100,
            max_backoff_ms: 250,
            ..retry_default()
        };
        assert_eq!(backoff(1, &r, 0.0), Duration::ZERO);
        assert_eq!(backoff(1, &r, 0.5), Duration::from_millis(50));
        assert_eq!(backoff(2, &r, 0.5), Duration::from_millis(100));
        assert_eq!(
            backoff(3, &r, 0.5),
            Duration::from_millis(125),
            "capped at maxBackoff"
        );
        assert_eq!(backoff(40, &r, 0.999), Duration::from_micros(249_750));
    }

    /// Absurd provider numbers saturate, and what is computed from them never
    /// overflows a clock (`Instant + Duration` used to panic on these).
    #[test]
    fn absurd_retry_afters_saturate() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let mut h = HeaderMap::new();
        for (v, secs) in [
            ("9223372036854775809", 9_223_372_036_854_775_809),
            ("18446744073709551615", u64::MAX),
            ("99999999999999999999999999", u64::MAX),
        ] {
            h.insert("retry-after", HeaderValue::from_static(v));
            let ra = retry_after(&h, now).unwrap();
            assert_eq!(ra, Duration::from_secs(secs), "{v}");
            assert_eq!(millis(ra), u64::MAX);
            assert!(tokio::time::Instant::now().checked_add(ra).is_none());
        }
        h.remove("retry-after");
        for v in ["1e400", "-5", "NaN", "inf"] {
            h.insert("retry-after-ms", HeaderValue::from_static(v));
            assert_eq!(retry_after(&h, now), None, "{v}");
        }
        h.insert("retry-after-ms", HeaderValue::from_static("1e300"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(u64::MAX)));
        let target = Target {
            health_check: None,
            model_map: Default::default(),
            credential: switchback_crds::config::ObjectId::new("ns", "c"),
            model: None,
            weight: 1,
            timeout_ms: Some(u64::MAX),
            retry: Retry::default(),
            price: None,
        };
        let start = tokio::time::Instant::now();
        let budget = start + Duration::from_secs(60);
        assert_eq!(attempt_deadline(start, &target, budget), budget);
    }

    #[test]
    fn a_target_without_a_timeout_leaves_the_later_ones_what_they_are_owed() {
        let now = tokio::time::Instant::now();
        let s = |secs: u64| Duration::from_secs(secs);
        let budget = now + s(60);
        let end = |targets, later: &[Option<u64>]| {
            share_end(now, budget, 60_000, targets, later.iter().copied()) - now
        };
        assert_eq!(end(2, &[None]), s(30), "the defaults: half each");
        assert_eq!(end(2, &[]), s(60), "the last may use all that remains");
        assert_eq!(end(3, &[None, None]), s(20));
        assert_eq!(
            end(3, &[Some(5_000), None]),
            s(35),
            "a timeout is what it is owed"
        );
        assert_eq!(
            end(4, &[Some(59_000), Some(59_000)]),
            s(20),
            "never less than a split"
        );
        // Later in the walk: what is left is shared the same way.
        let later = now + s(50);
        assert_eq!(
            share_end(later, budget, 60_000, 2, [None].into_iter()) - later,
            s(5),
            "10 s left, 30 s owed: an equal split"
        );
        assert_eq!(
            share_end(budget + s(1), budget, 60_000, 2, [None].into_iter()),
            budget
        );
    }
}

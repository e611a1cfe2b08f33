//! Per-client usage and budgets (docs/tenancy.md#budgets), pure: the proxies' cumulative
//! per-client counters turned into usage per UTC day and calendar month, joined with
//! what `status.usage` said when this operator first saw the client (so usage is
//! monotonic across proxy and operator restarts), and the verdict on each budget.
//!
//! Per-instance deltas are taken by `aggregate` (the same rules as route counters);
//! this module owns the periods: a delta counts in the period of the scrape that saw
//! it, so a request made just before midnight and scraped just after counts in the new
//! day. That, and what clients spend between two scrapes, is the documented overshoot.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{Timestamp, ToSpan, tz::TimeZone};
use switchback_crds::client::{LLMClientStatus, Throttled, UsagePeriod};
use switchback_crds::config::{BudgetLeft, Exhausted};
use switchback_crds::cost::Usd;
use switchback_crds::stats::ClientStats;

/// Budget names, as in `spec.budget` and `Exhausted.budget`.
pub const TOKENS_PER_DAY: &str = "tokensPerDay";
pub const USD_PER_MONTH: &str = "usdPerMonth";

const DAY_MS: u64 = 86_400_000;

/// Counters of spend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Millionths of a USD.
    pub micro_usd: u64,
}

impl Usage {
    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    pub fn add(&mut self, o: &Usage) {
        self.requests = self.requests.saturating_add(o.requests);
        self.input_tokens = self.input_tokens.saturating_add(o.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
        self.micro_usd = self.micro_usd.saturating_add(o.micro_usd);
    }
}

/// Requests refused with 429 without going upstream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Throttles {
    pub rate_limited: u64,
    pub budget_exhausted: u64,
}

impl Throttles {
    pub fn add(&mut self, o: &Throttles) {
        self.rate_limited = self.rate_limited.saturating_add(o.rate_limited);
        self.budget_exhausted = self.budget_exhausted.saturating_add(o.budget_exhausted);
    }
}

/// One instance's cumulative counters for one client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    pub usage: Usage,
    pub throttles: Throttles,
}

impl Reading {
    pub fn of(s: &ClientStats) -> Self {
        Self {
            usage: Usage {
                requests: s.requests,
                input_tokens: s.input_tokens,
                output_tokens: s.output_tokens,
                micro_usd: s.micro_usd,
            },
            throttles: Throttles {
                rate_limited: s.rate_limited,
                budget_exhausted: s.budget_exhausted,
            },
        }
    }

    /// `self - earlier`, or `self` when any counter went down (a reset).
    pub fn since(&self, earlier: &Reading) -> Reading {
        let (u, e) = (&self.usage, &earlier.usage);
        let (t, f) = (&self.throttles, &earlier.throttles);
        let reset = u.requests < e.requests
            || u.input_tokens < e.input_tokens
            || u.output_tokens < e.output_tokens
            || u.micro_usd < e.micro_usd
            || t.rate_limited < f.rate_limited
            || t.budget_exhausted < f.budget_exhausted;
        if reset {
            return *self;
        }
        Reading {
            usage: Usage {
                requests: u.requests - e.requests,
                input_tokens: u.input_tokens - e.input_tokens,
                output_tokens: u.output_tokens - e.output_tokens,
                micro_usd: u.micro_usd - e.micro_usd,
            },
            throttles: Throttles {
                rate_limited: t.rate_limited - f.rate_limited,
                budget_exhausted: t.budget_exhausted - f.budget_exhausted,
            },
        }
    }
}

/// Usage within one period, labelled by the period's start (ms since the epoch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Period {
    pub since_ms: u64,
    pub usage: Usage,
}

impl Period {
    /// This period's usage when it is the one starting at `start`, else nothing.
    fn at(&self, start: u64) -> Usage {
        if self.since_ms == start {
            self.usage
        } else {
            Usage::default()
        }
    }

    /// Adds `u` in the period starting at `start`, first starting over when that is
    /// a later period than the one counted.
    fn add(&mut self, start: u64, u: &Usage) {
        if start > self.since_ms {
            *self = Period {
                since_ms: start,
                usage: Usage::default(),
            };
        }
        if start == self.since_ms {
            self.usage.add(u);
        }
    }
}

/// What this operator counted for one client since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    pub today: Period,
    pub month: Period,
    pub throttled: Throttles,
}

impl Counted {
    /// Adds a delta seen by the scrape at `now_ms`.
    pub fn add(&mut self, now_ms: u64, delta: &Reading) {
        self.today.add(day_start(now_ms), &delta.usage);
        self.month.add(month_start(now_ms), &delta.usage);
        self.throttled.add(&delta.throttles);
    }
}

/// Start of the UTC day holding `ms`.
pub fn day_start(ms: u64) -> u64 {
    ms - ms % DAY_MS
}

/// Start of the UTC calendar month holding `ms`.
pub fn month_start(ms: u64) -> u64 {
    let Some(ts) = timestamp(ms) else {
        return day_start(ms);
    };
    let date = ts.to_zoned(TimeZone::UTC).date().first_of_month();
    date.to_zoned(TimeZone::UTC)
        .map(|z| z.timestamp().as_millisecond().max(0) as u64)
        .unwrap_or_else(|_| day_start(ms))
}

/// Start of the next UTC calendar month after the one holding `ms`.
pub fn next_month_start(ms: u64) -> u64 {
    let Some(ts) = timestamp(ms) else {
        return day_start(ms) + DAY_MS;
    };
    let date = ts.to_zoned(TimeZone::UTC).date().first_of_month();
    date.checked_add(1.month())
        .and_then(|d| d.to_zoned(TimeZone::UTC))
        .map(|z| z.timestamp().as_millisecond().max(0) as u64)
        .unwrap_or_else(|_| day_start(ms) + DAY_MS)
}

fn timestamp(ms: u64) -> Option<Timestamp> {
    Timestamp::from_millisecond(i64::try_from(ms).ok()?).ok()
}

/// RFC 3339 of `ms`, to the second.
pub fn rfc3339(ms: u64) -> String {
    timestamp(ms - ms % 1000)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// `Time` of a millisecond instant (to the second).
pub fn at(ms: u64) -> Option<Time> {
    timestamp(ms - ms % 1000).map(Time)
}

fn ms_of(t: &Time) -> Option<u64> {
    u64::try_from(t.0.as_millisecond()).ok()
}

/// What `status` said when this operator first saw the client: usage in the periods
/// it covers and the throttle totals, continued from instead of starting at zero.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seed {
    pub today: Option<Period>,
    pub month: Option<Period>,
    pub throttled: Throttles,
}

impl Seed {
    pub fn from_status(status: Option<&LLMClientStatus>) -> Self {
        let Some(s) = status else {
            return Self::default();
        };
        let period = |p: &Option<UsagePeriod>| {
            let p = p.as_ref()?;
            Some(Period {
                since_ms: ms_of(p.since.as_ref()?)?,
                usage: Usage {
                    requests: p.requests.max(0) as u64,
                    input_tokens: p.input_tokens.max(0) as u64,
                    output_tokens: p.output_tokens.max(0) as u64,
                    micro_usd: parse_micro_usd(&p.usd).unwrap_or(0),
                },
            })
        };
        let usage = s.usage.as_ref();
        Self {
            today: usage.and_then(|u| period(&u.today)),
            month: usage.and_then(|u| period(&u.this_month)),
            throttled: s
                .throttled
                .as_ref()
                .map(|t| Throttles {
                    rate_limited: t.rate_limited.max(0) as u64,
                    budget_exhausted: t.budget_exhausted.max(0) as u64,
                })
                .unwrap_or_default(),
        }
    }
}

/// A client's usage now: the seed's and this operator's counts, in the periods
/// holding `now_ms`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Current {
    pub today: Period,
    pub month: Period,
    pub throttled: Throttles,
}

pub fn current(seed: &Seed, counted: Option<&Counted>, now_ms: u64) -> Current {
    let (day, month) = (day_start(now_ms), month_start(now_ms));
    let mut today = seed.today.map(|p| p.at(day)).unwrap_or_default();
    let mut this_month = seed.month.map(|p| p.at(month)).unwrap_or_default();
    let mut throttled = seed.throttled;
    if let Some(c) = counted {
        today.add(&c.today.at(day));
        this_month.add(&c.month.at(month));
        throttled.add(&c.throttled);
    }
    Current {
        today: Period {
            since_ms: day,
            usage: today,
        },
        month: Period {
            since_ms: month,
            usage: this_month,
        },
        throttled,
    }
}

/// A client's budgets, from `spec.budget`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    pub tokens_per_day: Option<u64>,
    pub micro_usd_per_month: Option<u64>,
}

impl Budget {
    pub fn of(spec: Option<&switchback_crds::client::BudgetSpec>) -> Self {
        let Some(b) = spec else {
            return Self::default();
        };
        Self {
            tokens_per_day: b.tokens_per_day.and_then(|t| u64::try_from(t).ok()),
            micro_usd_per_month: b.usd_per_month.as_deref().and_then(parse_micro_usd),
        }
    }

    pub fn is_set(&self) -> bool {
        self.tokens_per_day.is_some() || self.micro_usd_per_month.is_some()
    }

    /// The budget spent at `now_ms`, if any: the day's tokens first (it ends sooner).
    pub fn exhausted(&self, usage: &Current, now_ms: u64) -> Option<Exhausted> {
        if let Some(cap) = self.tokens_per_day
            && usage.today.usage.tokens() >= cap
        {
            return Some(Exhausted {
                budget: TOKENS_PER_DAY.into(),
                until: rfc3339(day_start(now_ms) + DAY_MS),
            });
        }
        if let Some(cap) = self.micro_usd_per_month
            && usage.month.usage.micro_usd >= cap
        {
            return Some(Exhausted {
                budget: USD_PER_MONTH.into(),
                until: rfc3339(next_month_start(now_ms)),
            });
        }
        None
    }

    /// What is left of each budget, cluster-wide, with `usage` summed as of scrape
    /// round `round` at `now_ms` (0 when spent): what the proxies reserve against,
    /// each its share (docs/tenancy.md#across-replicas).
    pub fn left(&self, usage: &Current, round: u64, now_ms: u64) -> BudgetLeft {
        BudgetLeft {
            round,
            day: now_ms / DAY_MS,
            tokens: self
                .tokens_per_day
                .map(|cap| cap.saturating_sub(usage.today.usage.tokens())),
            micro_usd: self
                .micro_usd_per_month
                .map(|cap| cap.saturating_sub(usage.month.usage.micro_usd)),
        }
    }

    /// Percent used of the budget closest to exhaustion (rounded down); `None`
    /// without a budget.
    pub fn used_percent(&self, usage: &Current) -> Option<i32> {
        let pct = |used: u64, cap: u64| (u128::from(used) * 100 / u128::from(cap.max(1))) as u64;
        let tokens = self
            .tokens_per_day
            .map(|cap| pct(usage.today.usage.tokens(), cap));
        let usd = self
            .micro_usd_per_month
            .map(|cap| pct(usage.month.usage.micro_usd, cap));
        let worst = tokens.into_iter().chain(usd).max()?;
        Some(worst.min(i32::MAX as u64) as i32)
    }
}

/// Whether what is left of a client's budgets, `now`, is worth rendering again in
/// place of what was rendered, `before` (each rendering is a ConfigMap write). A
/// rendering stays valid however old it is: each replica spends its share of it
/// from its own counters at that round, so together they stay within it. A new one
/// moves the shares to where the traffic is: it is rendered once half of a
/// replica's share has been spent anywhere, when a budget runs out, and for a new
/// day (or month).
pub fn rerender(before: &BudgetLeft, now: &BudgetLeft, replicas: u32) -> bool {
    if before.day != now.day {
        return true;
    }
    let moved = |b: Option<u64>, n: Option<u64>| match (b, n) {
        (Some(b), Some(n)) => {
            let spent = b.saturating_sub(n);
            (n == 0 && b > 0) || spent.saturating_mul(2 * u64::from(replicas.max(1))) >= b.max(1)
        }
        (b, n) => b.is_some() != n.is_some(),
    };
    moved(before.tokens, now.tokens) || moved(before.micro_usd, now.micro_usd)
}

/// A decimal USD string ("200.00", "0.0015") as millionths; `None` when it is not a
/// plain non-negative decimal or has more than six decimals.
pub fn parse_micro_usd(s: &str) -> Option<u64> {
    s.parse::<Usd>().ok()?.exact_micro()
}

/// Millionths of a USD as a decimal string with at least two decimals: "3.10",
/// "0.000150" → "0.00015".
pub fn format_micro_usd(micro: u64) -> String {
    Usd::from_micro(micro).to_string()
}

/// The status form of one period.
pub fn usage_period(p: &Period) -> UsagePeriod {
    let u = &p.usage;
    let i = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    UsagePeriod {
        since: at(p.since_ms),
        requests: i(u.requests),
        input_tokens: i(u.input_tokens),
        output_tokens: i(u.output_tokens),
        tokens: i(u.tokens()),
        usd: format_micro_usd(u.micro_usd),
    }
}

/// The status form of the throttle totals.
pub fn throttled(t: &Throttles) -> Throttled {
    let i = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Throttled {
        rate_limited: i(t.rate_limited),
        budget_exhausted: i(t.budget_exhausted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-02T10:00:00Z.
    const NOW: u64 = 1_796_205_600_000;

    fn ms(rfc: &str) -> u64 {
        rfc.parse::<Timestamp>().unwrap().as_millisecond() as u64
    }

    fn spend(tokens: u64, micro_usd: u64) -> Reading {
        Reading {
            usage: Usage {
                requests: 1,
                input_tokens: tokens / 2,
                output_tokens: tokens - tokens / 2,
                micro_usd,
            },
            throttles: Throttles::default(),
        }
    }

    #[test]
    fn periods_are_utc_days_and_calendar_months() {
        assert_eq!(rfc3339(NOW), "2026-12-02T10:00:00Z");
        assert_eq!(rfc3339(day_start(NOW)), "2026-12-02T00:00:00Z");
        assert_eq!(rfc3339(month_start(NOW)), "2026-12-01T00:00:00Z");
        assert_eq!(rfc3339(next_month_start(NOW)), "2027-01-01T00:00:00Z");
        let feb = ms("2028-02-29T23:59:59Z");
        assert_eq!(rfc3339(next_month_start(feb)), "2028-03-01T00:00:00Z");
    }

    #[test]
    fn a_new_day_starts_from_zero_and_the_month_goes_on() {
        let mut c = Counted::default();
        c.add(NOW, &spend(100, 10));
        c.add(NOW + DAY_MS, &spend(40, 5));
        let now = current(&Seed::default(), Some(&c), NOW + DAY_MS);
        assert_eq!(now.today.usage.tokens(), 40);
        assert_eq!(now.month.usage.tokens(), 140);
        assert_eq!(now.month.usage.micro_usd, 15);
        // Nothing counted yet on the day after: today is zero, not yesterday's.
        let later = current(&Seed::default(), Some(&c), NOW + 2 * DAY_MS);
        assert_eq!(later.today.usage, Usage::default());
        assert_eq!(later.month.usage.tokens(), 140);
    }

    #[test]
    fn usage_continues_from_the_status_of_the_same_period_only() {
        let status: LLMClientStatus = serde_json::from_value(serde_json::json!({
            "usage": {
                "today": {"since": "2026-12-02T00:00:00Z", "requests": 3, "inputTokens": 100,
                          "outputTokens": 20, "tokens": 120, "usd": "1.50"},
                "thisMonth": {"since": "2026-11-01T00:00:00Z", "requests": 9, "inputTokens": 900,
                              "outputTokens": 90, "tokens": 990, "usd": "9.00"}
            },
            "throttled": {"rateLimited": 4, "budgetExhausted": 1}
        }))
        .unwrap();
        let seed = Seed::from_status(Some(&status));
        let mut c = Counted::default();
        c.add(NOW, &spend(10, 250_000));
        let now = current(&seed, Some(&c), NOW);
        assert_eq!(now.today.usage.requests, 4);
        assert_eq!(now.today.usage.tokens(), 130);
        assert_eq!(now.today.usage.micro_usd, 1_750_000);
        // Last month's figures are not this month's.
        assert_eq!(now.month.usage.tokens(), 10);
        assert_eq!(now.throttled.rate_limited, 4);
        assert_eq!(usage_period(&now.today).usd, "1.75");
    }

    #[test]
    fn a_budget_is_spent_when_usage_reaches_it_until_the_period_ends() {
        let budget = Budget::of(Some(&switchback_crds::client::BudgetSpec {
            tokens_per_day: Some(1000),
            usd_per_month: Some("2.00".into()),
            ..Default::default()
        }));
        let mut c = Counted::default();
        c.add(NOW, &spend(999, 1_000_000));
        let now = current(&Seed::default(), Some(&c), NOW);
        assert_eq!(budget.exhausted(&now, NOW), None);
        assert_eq!(budget.used_percent(&now), Some(99));
        c.add(NOW, &spend(51, 0));
        let now = current(&Seed::default(), Some(&c), NOW);
        assert_eq!(
            budget.exhausted(&now, NOW),
            Some(Exhausted {
                budget: TOKENS_PER_DAY.into(),
                until: "2026-12-03T00:00:00Z".into()
            })
        );
        assert_eq!(budget.used_percent(&now), Some(105));
        // The next day the tokens are back; the month's dollars are not.
        c.add(NOW + DAY_MS, &spend(0, 1_000_000));
        let next = current(&Seed::default(), Some(&c), NOW + DAY_MS);
        assert_eq!(
            budget.exhausted(&next, NOW + DAY_MS),
            Some(Exhausted {
                budget: USD_PER_MONTH.into(),
                until: "2027-01-01T00:00:00Z".into()
            })
        );
    }

    #[test]
    fn what_is_left_is_rendered_again_once_half_a_share_moved() {
        let budget = Budget::of(Some(&switchback_crds::client::BudgetSpec {
            tokens_per_day: Some(1000),
            usd_per_month: Some("2.00".into()),
            ..Default::default()
        }));
        let mut c = Counted::default();
        c.add(NOW, &spend(400, 500_000));
        let now = current(&Seed::default(), Some(&c), NOW);
        let left = budget.left(&now, 7, NOW);
        assert_eq!(
            left,
            BudgetLeft {
                round: 7,
                day: NOW / DAY_MS,
                tokens: Some(600),
                micro_usd: Some(1_500_000),
            }
        );
        let after = |tokens: u64, usd: u64| BudgetLeft {
            round: 8,
            tokens: Some(tokens),
            micro_usd: Some(usd),
            ..left
        };
        // Two replicas share 600: a re-rendering once 150 (half a share) went.
        assert!(!rerender(&left, &after(451, 1_500_000), 2));
        assert!(rerender(&left, &after(450, 1_500_000), 2));
        assert!(
            rerender(&left, &after(600, 1_100_000), 2),
            "the dollars moved"
        );
        assert!(!rerender(&left, &after(600, 1_500_000), 8));
        assert!(rerender(&left, &after(0, 1_500_000), 2000), "spent");
        let tomorrow = BudgetLeft {
            day: left.day + 1,
            ..left
        };
        assert!(rerender(&left, &tomorrow, 2), "a new day");
        // Spent beyond it (what was in flight when it ran out): 0 left, not less.
        c.add(NOW, &spend(700, 0));
        let now = current(&Seed::default(), Some(&c), NOW);
        assert_eq!(budget.left(&now, 9, NOW).tokens, Some(0));
    }

    #[test]
    fn a_counter_that_shrinks_is_a_reset() {
        let a = spend(100, 10);
        let b = spend(40, 5);
        assert_eq!(b.since(&a), b);
        let mut c = a;
        c.usage.add(&b.usage);
        assert_eq!(c.since(&a), b);
    }

    #[test]
    fn usd_strings_round_trip_through_millionths() {
        for (s, micro) in [
            ("200.00", 200_000_000),
            ("0.0015", 1_500),
            ("3.1", 3_100_000),
            ("7", 7_000_000),
            (".5", 500_000),
        ] {
            assert_eq!(parse_micro_usd(s), Some(micro), "{s}");
        }
        for bad in ["", ".", "-1", "1e3", "0.1234567", "1.2.3"] {
            assert_eq!(parse_micro_usd(bad), None, "{bad}");
        }
        assert_eq!(format_micro_usd(3_100_000), "3.10");
        assert_eq!(format_micro_usd(150), "0.00015");
        assert_eq!(format_micro_usd(0), "0.00");
        assert_eq!(format_micro_usd(79_550_000), "79.55");
    }
}

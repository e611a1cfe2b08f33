//! What answers cost, counted on the request path: exact amounts (see
//! `switchback_crds::cost`) kept in two atomics, and each target's prices made ready
//! for it when a config is prepared.
//!
//! A cost is `tokens × price` in femto-USD (a `u128`); there is no 128-bit atomic, so
//! a [`UsdCounter`] keeps the whole nano-USD in one `u64` and the femto-USD below them
//! in another. Both only grow, so a reading never goes backwards (a Prometheus counter
//! must not), and their sum is exact.

use std::sync::atomic::{AtomicU64, Ordering};

use switchback_crds::config::Price;
use switchback_crds::cost::{UnitPrice, Usd};

use crate::wire::usage::Usage;

const FEMTO_PER_NANO: u128 = 1_000_000;

/// A cumulative amount of USD, exact, added to without a lock.
#[derive(Debug, Default)]
pub struct UsdCounter {
    /// Whole nano-USD: room for $18 billion.
    nano: AtomicU64,
    /// The femto-USD below them, each add under 10^6: room for 10^13 adds.
    femto: AtomicU64,
}

impl UsdCounter {
    pub fn add(&self, usd: Usd) {
        let f = usd.femto();
        if f == 0 {
            return;
        }
        let nano = u64::try_from(f / FEMTO_PER_NANO).unwrap_or(u64::MAX);
        if nano > 0 {
            self.nano.fetch_add(nano, Ordering::Relaxed);
        }
        // Under 10^6: always fits.
        self.femto
            .fetch_add((f % FEMTO_PER_NANO) as u64, Ordering::Relaxed);
    }

    pub fn get(&self) -> Usd {
        let nano = u128::from(self.nano.load(Ordering::Relaxed));
        let femto = u128::from(self.femto.load(Ordering::Relaxed));
        Usd::from_femto(nano * FEMTO_PER_NANO + femto)
    }
}

/// A target's prices as its answers are charged: its own, and the route's first
/// (declared) target's, made once per config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pricing {
    /// Its `price` per token; zero when it has none.
    pub price: UnitPrice,
    /// It has a `price` at all.
    pub priced: bool,
    /// The first target's price, when this target is not the first: what the same
    /// tokens would have cost there (zero for an unpriced first target).
    pub primary: Option<UnitPrice>,
    /// Its place in the route's declared order.
    pub index: u8,
}

impl Pricing {
    /// Target `index` of a route whose first target has price `primary`.
    pub fn new(price: Option<&Price>, primary: Option<&Price>, index: usize) -> Self {
        let unit = |p: Option<&Price>| p.map(UnitPrice::of).unwrap_or_default();
        Pricing {
            price: unit(price),
            priced: price.is_some(),
            primary: (index > 0).then(|| unit(primary)),
            index: u8::try_from(index).unwrap_or(u8::MAX),
        }
    }

    /// What `u` costs here, and how much of that is beyond what the first target
    /// would have charged for the same tokens (nothing when this is the first, or
    /// when it is cheaper).
    pub fn charge(&self, u: Usage) -> (Usd, Usd) {
        let cost = self.price.cost(u.input_tokens, u.output_tokens);
        let extra = match self.primary {
            Some(p) => cost.saturating_sub(p.cost(u.input_tokens, u.output_tokens)),
            None => Usd::ZERO,
        };
        (cost, extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(i: f64, o: f64) -> Price {
        Price {
            input_per_million: i,
            output_per_million: o,
        }
    }

    fn usage(i: u64, o: u64) -> Usage {
        Usage {
            input_tokens: i,
            output_tokens: o,
        }
    }

    #[test]
    fn a_counter_sums_exactly_across_its_two_words() {
        let c = UsdCounter::default();
        // $0.0000033 = 3,300 nano-USD; $0.000000000000001 = 1 femto-USD.
        for _ in 0..1000 {
            c.add("0.0000033".parse().unwrap());
            c.add(Usd::from_femto(1));
        }
        c.add(Usd::ZERO);
        assert_eq!(c.get().to_string(), "0.003300000001");
        let big: Usd = "17000000000.123456789012345".parse().unwrap();
        let c = UsdCounter::default();
        c.add(big);
        assert_eq!(
            c.get(),
            big,
            "beyond what nano-USD alone would hold exactly in f64"
        );
    }

    #[test]
    fn a_fallback_is_charged_beyond_the_first_targets_price() {
        let cheap = price(0.15, 0.60);
        let dear = price(2.5, 10.0);
        let first = Pricing::new(Some(&cheap), Some(&cheap), 0);
        let (cost, extra) = first.charge(usage(1000, 2000));
        assert_eq!((cost.to_string(), extra), ("0.00135".into(), Usd::ZERO));
        let second = Pricing::new(Some(&dear), Some(&cheap), 1);
        let (cost, extra) = second.charge(usage(1000, 2000));
        assert_eq!(cost.to_string(), "0.0225");
        assert_eq!(extra.to_string(), "0.02115", "0.0225 - 0.00135");
        // Cheaper than the first: nothing beyond it.
        let back = Pricing::new(Some(&cheap), Some(&dear), 1);
        assert_eq!(back.charge(usage(1000, 2000)).1, Usd::ZERO);
        // An unpriced first target charges nothing: all of it is beyond.
        let after_free = Pricing::new(Some(&dear), None, 1);
        assert_eq!(after_free.charge(usage(1000, 2000)).1.to_string(), "0.0225");
        // An unpriced target costs nothing.
        let free = Pricing::new(None, Some(&cheap), 1);
        assert!(!free.priced);
        assert_eq!(free.charge(usage(1000, 2000)), (Usd::ZERO, Usd::ZERO));
    }
}

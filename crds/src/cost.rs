//! Exact money: what tokens cost at a target's `price`, as integers.
//!
//! A price is USD per million tokens with up to nine decimals (the CRD's pattern), so
//! one token costs a whole number of femto-USD (1e-15 USD): [`UnitPrice`]. What a
//! request costs is then `tokens × price` in integers ([`Usd`], a `u128` of femto-USD,
//! far beyond any real spend), and sums of costs never drift the way sums of floats
//! do. The proxy counts in it (`/admin/v1/stats` carries it as a decimal string), the
//! operator sums replicas' deltas in it, and status shows it as a decimal string
//! like an LLMClient's `usd`.
//!
//! The compiled config carries prices as JSON numbers (`f64`); [`UnitPrice::of`]
//! recovers the decimal the spec said from the shortest representation of that
//! number, which is the spec's own for every price of up to 15 significant digits.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::Price;

/// Decimals of a [`Usd`]: femto-USD.
pub const DECIMALS: u32 = 15;
const SCALE: u128 = 10u128.pow(DECIMALS);
const FEMTO_PER_MICRO: u128 = SCALE / 1_000_000;
/// Decimals of a price per million tokens (the CRD's pattern allows nine).
const PRICE_DECIMALS: u32 = 9;

/// An amount of USD, exact to 1e-15 (femto-USD), never negative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd(u128);

impl Usd {
    pub const ZERO: Usd = Usd(0);

    pub const fn from_femto(femto: u128) -> Self {
        Usd(femto)
    }

    pub const fn femto(self) -> u128 {
        self.0
    }

    pub fn is_zero(&self) -> bool {
        self.0 == 0
    }

    pub fn saturating_add(self, o: Usd) -> Usd {
        Usd(self.0.saturating_add(o.0))
    }

    /// `self - o`, or zero when `o` is more.
    pub fn saturating_sub(self, o: Usd) -> Usd {
        Usd(self.0.saturating_sub(o.0))
    }

    /// `micro` millionths of a USD.
    pub const fn from_micro(micro: u64) -> Self {
        Usd(micro as u128 * FEMTO_PER_MICRO)
    }

    /// In millionths of a USD, when it is a whole number of them.
    pub fn exact_micro(self) -> Option<u64> {
        self.0
            .is_multiple_of(FEMTO_PER_MICRO)
            .then(|| u64::try_from(self.0 / FEMTO_PER_MICRO).ok())
            .flatten()
    }

    /// Millionths of a USD, rounded half up (an LLMClient's `microUsd`).
    pub fn micro_rounded(self) -> u64 {
        u64::try_from((self.0 + FEMTO_PER_MICRO / 2) / FEMTO_PER_MICRO).unwrap_or(u64::MAX)
    }

    /// In USD as a float, for Prometheus (which has no other number).
    pub fn as_f64(self) -> f64 {
        // Whole and fraction apart: a u128 of femto-USD does not fit f64's mantissa.
        (self.0 / SCALE) as f64 + (self.0 % SCALE) as f64 / SCALE as f64
    }
}

/// A decimal string, with at least two decimals and no trailing zeros beyond them:
/// "0.00", "3.10", "0.0000033", "12.345678901234567".
impl fmt::Display for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fraction = format!("{:015}", self.0 % SCALE);
        let fraction = fraction.trim_end_matches('0');
        write!(f, "{}.{fraction:0<2}", self.0 / SCALE)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a USD amount: a non-negative decimal like \"3.10\" with at most 15 decimals")]
pub struct NotUsd(pub String);

impl FromStr for Usd {
    type Err = NotUsd;

    fn from_str(s: &str) -> Result<Self, NotUsd> {
        fixed(s.trim(), DECIMALS)
            .map(Usd)
            .ok_or_else(|| NotUsd(s.to_string()))
    }
}

impl Serialize for Usd {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A decimal (digits, at most one point, at most `decimals` decimals) as an integer
/// of 10^-`decimals` units; `None` for anything else or what does not fit.
fn fixed(s: &str, decimals: u32) -> Option<u128> {
    let (whole, fraction) = s.split_once('.').unwrap_or((s, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty()
        || !digits(whole)
        || !digits(fraction)
        || fraction.len() > decimals as usize
        || (s.contains('.') && fraction.is_empty())
    {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        let scale = 10u128.pow(decimals - fraction.len() as u32);
        fraction.parse::<u128>().ok()? * scale
    };
    whole
        .checked_mul(10u128.pow(decimals))?
        .checked_add(fraction)
}

/// What one token costs at a price, in femto-USD: USD per million tokens with nine
/// decimals is femto-USD per token exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnitPrice {
    pub input: u64,
    pub output: u64,
}

impl UnitPrice {
    /// From the spec's decimal strings ("2.50", "0.075"); `None` when one is not a
    /// decimal of at most nine decimals.
    pub fn parse(input_per_million: &str, output_per_million: &str) -> Option<Self> {
        let per_token = |s: &str| u64::try_from(fixed(s, PRICE_DECIMALS)?).ok();
        Some(UnitPrice {
            input: per_token(input_per_million)?,
            output: per_token(output_per_million)?,
        })
    }

    /// From a compiled price: the decimal the spec said, read back from the
    /// shortest representation of its `f64` (exact up to 15 significant digits;
    /// beyond, the nearest nine-decimal value). A price that is not a finite,
    /// non-negative number costs nothing.
    pub fn of(p: &Price) -> Self {
        let per_token = |usd_per_million: f64| {
            if !(usd_per_million.is_finite() && usd_per_million >= 0.0) {
                return 0;
            }
            // `{}` of an f64 never uses an exponent and round-trips: "2.5", "0.075".
            let s = usd_per_million.to_string();
            let (whole, fraction) = s.split_once('.').unwrap_or((&s, ""));
            let cut = &fraction[..fraction.len().min(PRICE_DECIMALS as usize)];
            let exact = fixed(&format!("{whole}.{cut:0<1}"), PRICE_DECIMALS).unwrap_or(0);
            // The digits past the ninth decimal round the last one kept.
            let up = fraction
                .as_bytes()
                .get(PRICE_DECIMALS as usize)
                .is_some_and(|d| *d >= b'5');
            u64::try_from(exact + u128::from(up)).unwrap_or(u64::MAX)
        };
        UnitPrice {
            input: per_token(p.input_per_million),
            output: per_token(p.output_per_million),
        }
    }

    /// What `input` and `output` tokens cost, exactly.
    pub fn cost(&self, input: u64, output: u64) -> Usd {
        let (i, o) = (u128::from(input), u128::from(output));
        // At most 2 × u64::MAX², well inside u128.
        Usd(i * u128::from(self.input) + o * u128::from(self.output))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usd(s: &str) -> Usd {
        s.parse().unwrap()
    }

    fn price(input: &str, output: &str) -> UnitPrice {
        UnitPrice::parse(input, output).unwrap()
    }

    #[test]
    fn amounts_print_as_decimal_strings_with_at_least_two_decimals() {
        for (s, printed) in [
            ("0", "0.00"),
            ("3.1", "3.10"),
            ("79.55", "79.55"),
            ("0.0000033", "0.0000033"),
            ("12.345678901234567", "12.345678901234567"),
            ("1000000", "1000000.00"),
            ("0.000000000000001", "0.000000000000001"),
        ] {
            assert_eq!(usd(s).to_string(), printed, "{s}");
            assert_eq!(usd(&usd(s).to_string()), usd(s), "round trip of {s}");
        }
        for bad in ["", ".", "1.", "-1", "1e3", "0.0000000000000001", "1,5", "x"] {
            assert!(bad.parse::<Usd>().is_err(), "{bad:?}");
        }
        assert_eq!(usd("1.5").femto(), 1_500_000_000_000_000);
        let json = serde_json::to_string(&usd("0.0225")).unwrap();
        assert_eq!(json, "\"0.0225\"");
        assert_eq!(serde_json::from_str::<Usd>(&json).unwrap(), usd("0.0225"));
    }

    #[test]
    fn a_request_costs_tokens_times_the_price_exactly() {
        // $2.50 / $10.00 per million: 1000 in, 2000 out = $0.0025 + $0.02.
        let p = price("2.50", "10.00");
        assert_eq!(p.cost(1000, 2000).to_string(), "0.0225");
        // $0.15 / $0.60: 10 in, 3 out = $0.0000015 + $0.0000018.
        assert_eq!(price("0.15", "0.60").cost(10, 3).to_string(), "0.0000033");
        // Nine decimals per million: one token at the smallest price there is.
        assert_eq!(
            price("0.000000001", "0").cost(1, 0),
            Usd::from_femto(1),
            "one femto-USD"
        );
        // Hostile counts do not overflow.
        let most = price("999999999.999999999", "999999999.999999999").cost(u64::MAX, u64::MAX);
        assert!(most.femto() > 0);
        assert_eq!(UnitPrice::default().cost(5, 5), Usd::ZERO, "unpriced");
        assert!(
            UnitPrice::parse("2.5000000001", "1").is_none(),
            "ten decimals"
        );
    }

    #[test]
    fn sums_of_costs_do_not_drift() {
        // A price and a count whose float product is inexact: 0.1 + 0.2 style. A
        // million requests of 7 input tokens at $0.1 per million each cost
        // $0.0000007; a float sum of those is off in its last digits.
        let p = price("0.1", "0.3");
        let mut total = Usd::ZERO;
        let mut float = 0.0f64;
        for _ in 0..1_000_000 {
            let one = p.cost(7, 1);
            total = total.saturating_add(one);
            float += 7.0 * 0.1e-6 + 0.3e-6;
        }
        assert_eq!(total.to_string(), "1.00");
        assert_ne!(float, 1.0, "the float sum drifts (the reason for integers)");
        assert_eq!(total.micro_rounded(), 1_000_000);
    }

    #[test]
    fn compiled_prices_give_back_the_specs_decimal() {
        let of = |i: f64, o: f64| {
            UnitPrice::of(&Price {
                input_per_million: i,
                output_per_million: o,
            })
        };
        for (spec, value) in [
            ("2.50", 2.5),
            ("0.15", 0.15),
            ("0.075", 0.075),
            ("0.0375", 0.0375),
            ("0.000000001", 0.000000001),
            ("123456.123456789", 123456.123456789),
            ("999999999", 999999999.0),
            ("0", 0.0),
        ] {
            assert_eq!(of(value, value), price(spec, spec), "{spec}");
        }
        assert_eq!(of(f64::NAN, -1.0), UnitPrice::default());
    }

    #[test]
    fn whole_millionths_convert_both_ways() {
        assert_eq!(Usd::from_micro(3_100_000).to_string(), "3.10");
        assert_eq!(usd("0.0015").exact_micro(), Some(1_500));
        assert_eq!(
            usd("0.0000015").exact_micro(),
            None,
            "not a whole millionth"
        );
    }

    #[test]
    fn micro_usd_rounds_half_up() {
        assert_eq!(usd("0.0000005").micro_rounded(), 1);
        assert_eq!(usd("0.0000004999").micro_rounded(), 0);
        assert_eq!(usd("3.10").micro_rounded(), 3_100_000);
        assert!((usd("0.0225").as_f64() - 0.0225).abs() < 1e-15);
        assert_eq!(usd("12345678901.5").as_f64(), 12345678901.5);
    }
}

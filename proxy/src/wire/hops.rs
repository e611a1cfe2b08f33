//! `x-switchback-hops` (docs/limits.md#no-loops): how many Switchback gateways a request
//! has passed through. Read once per request before anything else; each upstream
//! request carries the count plus one, so a credential whose base URL leads back to a
//! gateway (its own or another's) is refused at `--max-hops` instead of looping.
//!
//! What is read: absent is 0. A whole decimal number (digits only, surrounding spaces
//! trimmed by the HTTP parser) is that number, saturating: `99999999999999999999` is
//! a very large count, refused like any count at the limit. Anything else (a sign, a
//! fraction, letters, empty) cannot be trusted to count and is refused as invalid:
//! 400 `invalid_request` naming the header. Several `x-switchback-hops` headers: the
//! largest counts (a hop that appended instead of replacing must not reset it).
//!
//! What is sent costs one header insert of a static value: no allocation.

use http::{HeaderMap, HeaderValue};

use super::headers::X_HOPS;

/// The largest `--max-hops`: a longer chain of gateways is not a design anyone needs.
pub const MAX: u8 = 32;

/// Why a request's hop count refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The count is at or over `--max-hops`: 508 `loop_detected`.
    Loop { hops: u64, max: u8 },
    /// Not a whole number: 400 `invalid_request`.
    Unreadable,
}

impl Refused {
    /// The error message, naming the header and the flag.
    pub fn message(self) -> String {
        match self {
            Self::Loop { hops, max } => format!(
                "loop detected: the request has passed through {hops} Switchback gateways \
                 (x-switchback-hops: {hops}) and this one allows {max} (--max-hops); a \
                 credential's baseURL leads back to a gateway"
            ),
            Self::Unreadable => "x-switchback-hops must be a whole number of gateways \
                                 passed through (it is set by Switchback gateways; clients \
                                 need not send it)"
                .to_owned(),
        }
    }
}

/// The request's hop count, if it may go on: below `max`.
#[inline]
pub fn incoming(headers: &HeaderMap, max: u8) -> Result<u8, Refused> {
    let mut values = headers.get_all(X_HOPS).iter();
    let Some(first) = values.next() else {
        return Ok(0);
    };
    let mut hops = count(first.as_bytes())?;
    for v in values {
        hops = hops.max(count(v.as_bytes())?);
    }
    if hops >= u64::from(max) {
        return Err(Refused::Loop { hops, max });
    }
    Ok(hops as u8)
}

/// A whole decimal number, saturating.
fn count(v: &[u8]) -> Result<u64, Refused> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return Err(Refused::Unreadable);
    }
    Ok(v.iter().fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

/// The header value for `n` hops (`n <= MAX`; larger values say `MAX`).
#[inline]
pub fn value(n: u8) -> HeaderValue {
    VALUES[usize::from(n.min(MAX))].clone()
}

macro_rules! statics {
    ($($v:literal),*) => { [$(HeaderValue::from_static($v)),*] };
}

/// "0" to "32", static: a clone is a copy of a pointer, never an allocation.
static VALUES: [HeaderValue; MAX as usize + 1] = statics!(
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32"
);

#[cfg(test)]
mod tests {
    use super::*;

    fn with(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(X_HOPS, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn absent_is_zero_and_counts_below_the_limit_pass() {
        assert_eq!(incoming(&HeaderMap::new(), 2), Ok(0));
        assert_eq!(incoming(&with(&["1"]), 2), Ok(1));
        assert_eq!(incoming(&with(&["007"]), 8), Ok(7));
    }

    #[test]
    fn a_count_at_or_over_the_limit_is_a_loop_however_large() {
        assert_eq!(
            incoming(&with(&["2"]), 2),
            Err(Refused::Loop { hops: 2, max: 2 })
        );
        assert_eq!(
            incoming(&with(&["99999999999999999999999999"]), 2),
            Err(Refused::Loop {
                hops: u64::MAX,
                max: 2
            })
        );
        // The largest of several counts: appending cannot reset the count.
        assert_eq!(
            incoming(&with(&["0", "5"]), 2),
            Err(Refused::Loop { hops: 5, max: 2 })
        );
        let m = Refused::Loop { hops: 2, max: 2 }.message();
        assert!(
            m.contains("x-switchback-hops: 2") && m.contains("--max-hops"),
            "{m}"
        );
    }

    #[test]
    fn anything_but_a_whole_number_is_unreadable() {
        for v in ["", "-1", "+1", "1.0", "one", "1 2", "0x1"] {
            assert_eq!(incoming(&with(&[v]), 2), Err(Refused::Unreadable), "{v:?}");
        }
        assert_eq!(incoming(&with(&["1", "x"]), 2), Err(Refused::Unreadable));
        assert!(Refused::Unreadable.message().contains("x-switchback-hops"));
    }

    #[test]
    fn values_are_the_counts() {
        for n in 0..=MAX {
            assert_eq!(value(n).to_str().unwrap(), n.to_string());
        }
        assert_eq!(value(200), value(MAX));
    }
}

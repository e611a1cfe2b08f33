//! Per-field checks shared by the route, credential and client compilers. Each takes the
//! field's path from the object's root, records a diagnostic when the value breaks a
//! rule, and returns the value to use (a harmless stand-in after an error: an object
//! with any error is dropped anyway, and carrying on finds its other problems too).

use crate::compile::{Diagnostic, Kind, Severity};
use crate::config::ObjectId;
use crate::duration;

/// Collects the diagnostics of one object.
pub(crate) struct Checker {
    kind: Kind,
    object: ObjectId,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

impl Checker {
    pub(crate) fn new(kind: Kind, object: &ObjectId) -> Self {
        Self {
            kind,
            object: object.clone(),
            diagnostics: Vec::new(),
        }
    }

    pub(crate) fn error(
        &mut self,
        reason: &'static str,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.push(Severity::Error, reason, field.into(), message.into());
    }

    pub(crate) fn warning(
        &mut self,
        reason: &'static str,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.push(Severity::Warning, reason, field.into(), message.into());
    }

    /// A schema-level problem: the reason every plain field error carries.
    pub(crate) fn invalid(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.error(super::reason::INVALID_SPEC, field, message);
    }

    pub(crate) fn has_errors(&self) -> bool {
        self.diagnostics
            .iter()
            .any(|d| d.severity == Severity::Error)
    }

    fn push(&mut self, severity: Severity, reason: &'static str, field: String, message: String) {
        self.diagnostics.push(Diagnostic {
            kind: self.kind,
            object: self.object.clone(),
            severity,
            reason,
            field,
            message,
        });
    }
}

/// An integer within `min..=max` (schema `minimum`/`maximum`), or `default` when unset.
pub(crate) fn int_in_range(
    c: &mut Checker,
    field: &str,
    value: Option<i32>,
    min: i32,
    max: i32,
    default: u32,
) -> u32 {
    let Some(value) = value else {
        return default;
    };
    if value < min {
        c.invalid(field, format!("{value} is below the minimum {min}"));
        return default;
    }
    if value > max {
        c.invalid(field, format!("{value} is above the maximum {max}"));
        return default;
    }
    // min >= 0 for every caller, so value is non-negative here.
    u32::try_from(value).unwrap_or(default)
}

/// A 64-bit integer within `min..=max`, or `None` when unset or out of range.
pub(crate) fn int64_in_range(
    c: &mut Checker,
    field: &str,
    value: Option<i64>,
    min: i64,
    max: i64,
) -> Option<u64> {
    let value = value?;
    if value < min {
        c.invalid(field, format!("{value} is below the minimum {min}"));
        return None;
    }
    if value > max {
        c.invalid(field, format!("{value} is above the maximum {max}"));
        return None;
    }
    u64::try_from(value).ok()
}

/// An RFC 1123 label (a namespace name): lower-case alphanumerics and `-`, starting
/// and ending alphanumeric, 1 to 63 characters.
pub(crate) fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && is_label(s)
}

/// An RFC 1123 subdomain (an object name): dot-separated labels, at most 253
/// characters (as the API server checks it: no limit per label).
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-')
}

/// A Gateway API duration in milliseconds, or `default_ms` when unset. `positive`
/// adds the CEL rule `duration(self) > duration('0s')`.
pub(crate) fn duration_ms(
    c: &mut Checker,
    field: &str,
    value: Option<&str>,
    default_ms: u64,
    positive: bool,
) -> u64 {
    optional_duration_ms(c, field, value, positive).unwrap_or(default_ms)
}

pub(crate) fn optional_duration_ms(
    c: &mut Checker,
    field: &str,
    value: Option<&str>,
    positive: bool,
) -> Option<u64> {
    let text = value?;
    match duration::parse_ms(text) {
        None => {
            c.invalid(
                field,
                format!("{text:?} is not a duration like 250ms, 10s, 1m30s or 1h"),
            );
            None
        }
        Some(0) if positive => {
            c.invalid(field, format!("{text:?} must be above 0"));
            None
        }
        Some(ms) => Some(ms),
    }
}

/// One of a fixed set of names (schema `enum`).
pub(crate) fn one_of<T: Copy>(
    c: &mut Checker,
    field: &str,
    value: &str,
    choices: &[(&str, T)],
) -> Option<T> {
    if let Some((_, parsed)) = choices.iter().find(|(name, _)| *name == value) {
        return Some(*parsed);
    }
    let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
    c.invalid(
        field,
        format!("{value:?} is not one of {}", names.join(", ")),
    );
    None
}

/// A list's length within `min..=max` (schema `minItems`/`maxItems`); `noun` is what
/// the list holds, plural.
pub(crate) fn list_len(
    c: &mut Checker,
    field: &str,
    len: usize,
    min: usize,
    max: usize,
    noun: &str,
) -> bool {
    if len < min {
        let message = if len == 0 {
            format!("has no {noun}; at least {min} is required")
        } else {
            format!("has {len} {noun}; at least {min} are required")
        };
        c.invalid(field, message);
        return false;
    }
    if len > max {
        c.invalid(field, format!("has {len} {noun}; the maximum is {max}"));
        return false;
    }
    true
}

/// A string's length in characters within `min..=max` (schema `minLength`/`maxLength`).
pub(crate) fn string_len(
    c: &mut Checker,
    field: &str,
    value: &str,
    min: usize,
    max: usize,
) -> bool {
    let len = value.chars().count();
    if len < min {
        c.invalid(field, "must not be empty");
        return false;
    }
    if len > max {
        c.invalid(
            field,
            format!("is {len} characters long; the maximum is {max}"),
        );
        return false;
    }
    true
}

/// HTTP status codes, each 100..=599, at most `max`; sorted and deduplicated.
pub(crate) fn status_codes(c: &mut Checker, field: &str, codes: &[i32], max: usize) -> Vec<u16> {
    list_len(c, field, codes.len(), 0, max, "status codes");
    let mut out = Vec::with_capacity(codes.len());
    for (i, code) in codes.iter().enumerate() {
        let status = int_in_range(c, &format!("{field}[{i}]"), Some(*code), 100, 599, 0);
        if let Ok(status) = u16::try_from(status)
            && status != 0
        {
            out.push(status);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// A non-negative decimal string like "2.50" (schema pattern
/// `^[0-9]{1,9}(\.[0-9]{1,9})?$`).
pub(crate) fn decimal(c: &mut Checker, field: &str, value: &str) -> f64 {
    let (whole, fraction) = match value.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (value, None),
    };
    let digits = |s: &str| (1..=9).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    if digits(whole) && fraction.is_none_or(digits) {
        // Digits and at most one point: always a valid f64.
        if let Ok(number) = value.parse::<f64>() {
            return number;
        }
    }
    c.invalid(
        field,
        format!("{value:?} is not a decimal number like \"2.50\""),
    );
    0.0
}

/// Visible ASCII, space and tab: what every HTTP client accepts without escaping.
pub(crate) fn is_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

//! Gateway API durations (`250ms`, `10s`, `1m30s`, `1h`): parsing to milliseconds and
//! printing back in the same form for messages.
//!
//! The accepted language is exactly the schema's pattern
//! `^([0-9]{1,5}(h|m|s|ms)){1,4}$`, so a manifest the API server accepts always
//! compiles, and one it would refuse never does.

/// Parses a Gateway API duration into milliseconds; `None` when it is not one.
pub fn parse_ms(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut parts = 0;
    let mut total: u64 = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || digits > 5 {
            return None;
        }
        let number: u64 = text[start..i].parse().ok()?;
        let unit_ms = match (bytes.get(i), bytes.get(i + 1)) {
            (Some(b'm'), Some(b's')) => {
                i += 2;
                1
            }
            (Some(b'h'), _) => {
                i += 1;
                3_600_000
            }
            (Some(b'm'), _) => {
                i += 1;
                60_000
            }
            (Some(b's'), _) => {
                i += 1;
                1_000
            }
            _ => return None,
        };
        parts += 1;
        if parts > 4 {
            return None;
        }
        // At most 4 * 99999h: far below u64::MAX milliseconds.
        total += number * unit_ms;
    }
    (parts > 0).then_some(total)
}

/// Formats milliseconds the way a user would write them: `100ms`, `2s`, `1m30s`.
pub fn format_ms(ms: u64) -> String {
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, milli) = (rest / 1_000, rest % 1_000);
    for (value, unit) in [(h, "h"), (m, "m"), (s, "s"), (milli, "ms")] {
        if value > 0 {
            out.push_str(&format!("{value}{unit}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_gateway_api_form() {
        for (text, ms) in [
            ("250ms", 250),
            ("10s", 10_000),
            ("1m30s", 90_000),
            ("1h", 3_600_000),
            ("0s", 0),
            ("1h1m1s1ms", 3_661_001),
            ("99999ms", 99_999),
            ("1s500ms", 1_500),
        ] {
            assert_eq!(parse_ms(text), Some(ms), "{text}");
        }
    }

    #[test]
    fn refuses_everything_else() {
        for text in [
            "",
            "1",
            "s",
            "1.5s",
            "-1s",
            "1d",
            "100000ms",
            "1h1m1s1ms1h",
            " 1s",
            "1s ",
            "1us",
            "1M",
            "1ns",
        ] {
            assert_eq!(parse_ms(text), None, "{text:?}");
        }
    }

    #[test]
    fn formats_like_a_user_would() {
        assert_eq!(format_ms(100), "100ms");
        assert_eq!(format_ms(2_000), "2s");
        assert_eq!(format_ms(90_000), "1m30s");
        assert_eq!(format_ms(3_600_000), "1h");
        assert_eq!(format_ms(1_500), "1s500ms");
        assert_eq!(format_ms(0), "0s");
    }
}

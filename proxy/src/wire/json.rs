//! Is a provider's unary 2xx one whole JSON object? A validity check that builds
//! nothing and allocates nothing.
//!
//! Why it exists: a truncated, empty, HTML or otherwise broken 2xx is the provider's
//! failure (`invalidResponse`, issue 11), refused before anything is committed, and
//! the check runs on every relayed unary answer, so it must not add measurable cost
//! per request.
//!
//! What it accepts: exactly what `serde_json::from_slice::<serde::de::IgnoredAny>`
//! accepts, for a body whose first non-whitespace byte is `{`: RFC 8259's grammar as
//! serde_json reads it (control characters refused inside strings, escapes checked,
//! `\u` followed by four hex digits but the code point not judged, UTF-8 not checked,
//! only JSON whitespace around the value). The property tests in
//! `tests/properties.rs` hold it to that on generated, mutated and truncated bodies.
//!
//! Why not serde: its `IgnoredAny` path reads one byte at a time through its
//! peek/eat calls and keeps the nesting on a heap stack (an allocation per answer
//! nested more than one level, which every chat answer is). Here the nesting is a
//! bit per level in a `u128` (deeper documents, rare, go to serde), string bodies
//! are skipped 8 bytes at a time, and the per-token helpers are inlined (their call
//! overhead was a third of the cost): on the benchmark's 318-byte answer, 2.7k
//! instructions against serde's 4.6k.

/// One whole JSON object, optionally surrounded by JSON whitespace?
pub fn is_object(body: &[u8]) -> bool {
    let start = skip_ws(body, 0);
    if body.get(start) != Some(&b'{') {
        return false;
    }
    match value_end(body, start) {
        Ok(end) => skip_ws(body, end) == body.len(),
        Err(Stop::Invalid) => false,
        // Nesting beyond what the bit stack holds: serde decides, at its usual cost.
        Err(Stop::TooDeep) => serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok(),
    }
}

/// Why [`value_end`] stopped short of a value's end.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Invalid,
    /// Nested deeper than [`MAX_DEPTH`] containers.
    TooDeep,
}

/// Containers the bit stack of [`value_end`] tracks.
const MAX_DEPTH: u32 = u128::BITS;

/// The end (exclusive) of the JSON value starting at `b[i]`, read as serde's
/// `IgnoredAny` reads it.
pub(crate) fn value_end(b: &[u8], mut i: usize) -> Result<usize, Stop> {
    // Bit `d` of `objects` is set when the container at depth `d` is an object (else
    // an array); `depth` containers are open; `in_object` caches the innermost bit.
    let mut objects: u128 = 0;
    let mut depth: u32 = 0;
    let mut in_object = false;
    'value: loop {
        // `i` is at the first byte of a value.
        match b.get(i) {
            Some(b'{') => {
                if depth == MAX_DEPTH {
                    return Err(Stop::TooDeep);
                }
                objects |= 1 << depth;
                depth += 1;
                i = skip_ws(b, i + 1);
                if b.get(i) == Some(&b'}') {
                    depth -= 1;
                    i += 1;
                } else {
                    in_object = true;
                    i = member_value(b, i)?;
                    continue 'value;
                }
            }
            Some(b'[') => {
                if depth == MAX_DEPTH {
                    return Err(Stop::TooDeep);
                }
                objects &= !(1 << depth);
                depth += 1;
                i = skip_ws(b, i + 1);
                if b.get(i) == Some(&b']') {
                    depth -= 1;
                    i += 1;
                } else {
                    in_object = false;
                    continue 'value;
                }
            }
            Some(b'"') => i = string_end(b, i + 1)?,
            Some(b'-' | b'0'..=b'9') => i = number_end(b, i)?,
            Some(b't') => i = literal_end(b, i, b"true")?,
            Some(b'f') => i = literal_end(b, i, b"false")?,
            Some(b'n') => i = literal_end(b, i, b"null")?,
            _ => return Err(Stop::Invalid),
        }
        // After a value: the next one in its container, or the container's end.
        loop {
            if depth == 0 {
                return Ok(i);
            }
            i = skip_ws(b, i);
            match b.get(i) {
                Some(b',') if in_object => {
                    i = member_value(b, skip_ws(b, i + 1))?;
                    continue 'value;
                }
                Some(b',') => {
                    i = skip_ws(b, i + 1);
                    continue 'value;
                }
                Some(b'}') if in_object => {}
                Some(b']') if !in_object => {}
                _ => return Err(Stop::Invalid),
            }
            depth -= 1;
            i += 1;
            in_object = depth > 0 && objects >> (depth - 1) & 1 == 1;
        }
    }
}

/// [`value_end`] with the scalars a member usually holds (a string, a number) read
/// in place: the walk over a stream's opening skips several per event, and the
/// general loop's setup cost more than the scalar itself.
#[inline(always)]
pub(crate) fn member_end(b: &[u8], i: usize) -> Result<usize, Stop> {
    match b.get(i) {
        Some(b'"') => string_end(b, i + 1),
        Some(b'-' | b'0'..=b'9') => number_end(b, i),
        _ => value_end(b, i),
    }
}

/// `"key"` `:` at `b[i]`: the index of the member's value.
#[inline(always)]
fn member_value(b: &[u8], i: usize) -> Result<usize, Stop> {
    if b.get(i) != Some(&b'"') {
        return Err(Stop::Invalid);
    }
    let i = skip_ws(b, string_end(b, i + 1)?);
    if b.get(i) != Some(&b':') {
        return Err(Stop::Invalid);
    }
    Ok(skip_ws(b, i + 1))
}

/// The first index from `i` that is not JSON whitespace.
#[inline(always)]
pub(crate) fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// The end of a string whose opening quote is just before `b[i]`.
#[inline(always)]
pub(crate) fn string_end(b: &[u8], mut i: usize) -> Result<usize, Stop> {
    loop {
        i = plain_end(b, i);
        match b.get(i) {
            Some(b'"') => return Ok(i + 1),
            Some(b'\\') => match b.get(i + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                Some(b'u')
                    if b.get(i + 2..i + 6)
                        .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
                {
                    i += 6
                }
                _ => return Err(Stop::Invalid),
            },
            // A control character, or the body ended inside the string.
            _ => return Err(Stop::Invalid),
        }
    }
}

/// The first index from `i` holding `"`, `\` or a control character (or the end).
/// Eight bytes at a time: each test below sets a byte's high bit exactly where the
/// byte matches, for the lowest matching byte of the word (a borrow can only
/// mark bytes above a real match), which is the one taken.
#[inline(always)]
fn plain_end(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    while let Some(word) = b.get(i..i + 8) {
        let x = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let control = x.wrapping_sub(ONES * 0x20) & !x;
        let q = x ^ (ONES * u64::from(b'"'));
        let quote = q.wrapping_sub(ONES) & !q;
        let s = x ^ (ONES * u64::from(b'\\'));
        let backslash = s.wrapping_sub(ONES) & !s;
        let hits = (control | quote | backslash) & HIGH;
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i)
        && c != b'"'
        && c != b'\\'
        && c >= 0x20
    {
        i += 1;
    }
    i
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` from `b[i]`. A digit after a
/// leading `0` is left for the caller, to whom it cannot follow a value.
#[inline(always)]
fn number_end(b: &[u8], mut i: usize) -> Result<usize, Stop> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits_end(b, i + 1),
        _ => return Err(Stop::Invalid),
    }
    if b.get(i) == Some(&b'.') {
        let end = digits_end(b, i + 1);
        if end == i + 1 {
            return Err(Stop::Invalid);
        }
        i = end;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        let end = digits_end(b, i);
        if end == i {
            return Err(Stop::Invalid);
        }
        i = end;
    }
    Ok(i)
}

#[inline(always)]
fn digits_end(b: &[u8], mut i: usize) -> usize {
    while let Some(b'0'..=b'9') = b.get(i) {
        i += 1;
    }
    i
}

#[inline(always)]
fn literal_end(b: &[u8], i: usize, word: &[u8]) -> Result<usize, Stop> {
    if b.get(i..i + word.len()) == Some(word) {
        Ok(i + word.len())
    } else {
        Err(Stop::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde_says(b: &[u8]) -> bool {
        b.trim_ascii_start().first() == Some(&b'{')
            && serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
    }

    #[track_caller]
    fn agrees(b: &[u8], expected: bool) {
        assert_eq!(
            serde_says(b),
            expected,
            "serde on {:?}",
            String::from_utf8_lossy(b)
        );
        assert_eq!(is_object(b), expected, "{:?}", String::from_utf8_lossy(b));
    }

    #[test]
    fn whole_objects_pass() {
        for ok in [
            &b"{}"[..],
            b" \r\n\t{ } \n",
            br#"{"a":1,"b":[true,false,null,-0,1.5e3,2E-2,0.25,"x"],"c":{"d":[]}}"#,
            br#"{"s":"esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDE00 end"}"#,
            br#"{"long":"a string long enough for several words at once, with no escapes"}"#,
            "{\"utf8\":\"h\u{e9}llo \u{1f600}\"}".as_bytes(),
            b"{\"not utf-8 either\":\"\xff\xfe\"}",
            br#"{ "a" : [ 1 , { } , [ ] ] , "b" : "" }"#,
        ] {
            agrees(ok, true);
        }
    }

    #[test]
    fn broken_bodies_fail() {
        for bad in [
            &b""[..],
            b"   ",
            b"OK",
            b"<html><body><h1>502 Bad Gateway</h1></body></html>",
            b"[]",
            b"\"a\"",
            b"{",
            b"{\"a\":1",
            b"{\"a\":1}}",
            b"{\"a\":1} x",
            b"{\"a\":1}{}",
            b"\x0c{}",
            b"{\"a\" 1}",
            b"{\"a\":1,}",
            b"{,}",
            b"{1:2}",
            b"{\"a\":[1,]}",
            b"{\"a\":[1 2]}",
            b"{\"a\":]}",
            b"{\"a\":[}",
            b"{\"a\":01}",
            b"{\"a\":-}",
            b"{\"a\":1.}",
            b"{\"a\":.5}",
            b"{\"a\":+1}",
            b"{\"a\":1e}",
            b"{\"a\":1e+}",
            b"{\"a\":tru}",
            b"{\"a\":nul}",
            b"{\"a\":True}",
            b"{\"a\":\"tab\there\"}",
            b"{\"a\":\"new\nline\"}",
            b"{\"a\":\"\\x\"}",
            b"{\"a\":\"\\u12G4\"}",
            b"{\"a\":\"\\u12\"}",
            b"{\"a\":\"unterminated}",
            b"{\"a\":\"ends in a backslash\\",
            b"{'a':1}",
        ] {
            agrees(bad, false);
        }
    }

    #[test]
    fn deep_nesting_is_decided_like_serde() {
        for depth in [MAX_DEPTH as usize - 1, MAX_DEPTH as usize, 300] {
            let inner = depth - 1;
            let ok = format!("{}{}{}", "{\"a\":".repeat(inner), "{}", "}".repeat(inner));
            agrees(ok.as_bytes(), true);
            let arrays = format!("{{\"a\":{}{}}}", "[".repeat(inner), "]".repeat(inner));
            agrees(arrays.as_bytes(), true);
            agrees(&ok.as_bytes()[..ok.len() - 1], false);
        }
        assert_eq!(value_end(b"[[]]", 0), Ok(4));
    }

    #[test]
    fn member_end_reads_scalars_as_value_end_does() {
        for v in [
            &b"\"x\","[..],
            b"\"unterminated",
            b"\"\\u12\"",
            b"0,",
            b"01",
            b"-",
            b"-0.5e+3}",
            b"1.",
            b"null",
            b"nul",
            b"[1,{\"a\":2}]",
            b"{",
            b"",
        ] {
            assert_eq!(
                member_end(v, 0),
                value_end(v, 0),
                "{:?}",
                String::from_utf8_lossy(v)
            );
        }
    }

    #[test]
    fn every_position_of_a_special_byte_in_a_word_is_seen() {
        // The 8-byte skip must stop at a quote, backslash or control byte wherever it
        // falls in the word, and not before.
        for len in 0..20 {
            for special in [b'"', b'\\', b'\n', 0x00, 0x1f] {
                let mut body = b"{\"k\":\"".to_vec();
                body.extend(std::iter::repeat_n(b'x', len));
                body.push(special);
                body.extend_from_slice(b"yy\"}");
                // A stray quote, `\y` (not an escape) or a raw control byte.
                agrees(&body, false);
                let mut plain = b"{\"k\":\"".to_vec();
                plain.extend(std::iter::repeat_n(0x7f_u8, len));
                plain.extend_from_slice(&[0x20, 0x80, 0xff]);
                plain.extend_from_slice(b"\"}");
                agrees(&plain, true);
            }
        }
    }
}

//! What of a provider's answer reaches the client, for every answer, streamed,
//! unary or an error relayed unchanged: only the provider headers
//! docs/request-lifecycle.md#of-a-providers-answer lists, no body in a content coding the
//! proxy did not ask for, and never the credential's key, should the provider echo it in an
//! error.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use bytes::Bytes;

use crate::wire::headers::X_UPSTREAM_REQUEST_ID;

/// An upstream answer on its way out, with only the provider headers
/// docs/request-lifecycle.md#of-a-providers-answer lists (see [`relayed_as`]): framing and
/// hop-by-hop headers are the gateway's own business, cookies and a provider's internal
/// headers are none of the client's, and `x-request-id` is the client's (the provider's
/// goes out as `x-upstream-request-id`).
pub(crate) fn relay(status: StatusCode, headers: HeaderMap, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = relayed_headers(headers);
    r
}

/// Room for the kept headers and the gateway's own (`x-switchback-*`,
/// `x-request-id`), so that neither grows the map on the way out.
const RELAYED_CAPACITY: usize = 16;

/// The headers of `upstream` that reach the client. One pass, moving the names and
/// values kept (a provider's own header names are not even cloned); everything else
/// is dropped with the provider's map.
fn relayed_headers(upstream: HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(RELAYED_CAPACITY);
    // Where further values of the last name go: the iteration gives them with no
    // name (`x-ratelimit-limit-requests` twice).
    let mut last: Option<header::OccupiedEntry<'_, HeaderValue>> = None;
    for (name, value) in upstream {
        match name {
            Some(name) => {
                last = relayed_as(name).map(|name| match out.entry(name) {
                    header::Entry::Vacant(v) => v.insert_entry(value),
                    header::Entry::Occupied(mut o) => {
                        o.append(value);
                        o
                    }
                });
            }
            None => {
                if let Some(o) = &mut last {
                    o.append(value);
                }
            }
        }
    }
    out
}

/// The name a provider header is relayed under, or `None` when it is not relayed:
/// `content-type`, `retry-after`, `retry-after-ms`, `openai-processing-ms`, the
/// `x-ratelimit-*` and `anthropic-ratelimit-*` families, and `x-request-id` as
/// `x-upstream-request-id` (docs/request-lifecycle.md#of-a-providers-answer).
fn relayed_as(name: HeaderName) -> Option<HeaderName> {
    if name == header::CONTENT_TYPE || name == header::RETRY_AFTER {
        return Some(name);
    }
    let s = name.as_str();
    if s == "x-request-id" {
        Some(X_UPSTREAM_REQUEST_ID)
    } else if s == "retry-after-ms"
        || s == "openai-processing-ms"
        || s.starts_with("x-ratelimit-")
        || s.starts_with("anthropic-ratelimit-")
    {
        Some(name)
    } else {
        None
    }
}

/// Keys shorter than this are not looked for: too likely to match ordinary words.
const MIN_MASKED_KEY: usize = 8;

/// What a key echoed in a provider's error body becomes.
const MASK: &[u8] = b"****";

/// `body` with every key-shaped run of bytes (letters, digits, `-`, `_`, `.`) that is
/// or contains `key` replaced by `****`: a provider that echoes the credential's key
/// in a 401 must not hand it to the client. Costs one substring search when the key
/// is absent (the usual case), and is only run on error bodies.
pub(crate) fn mask_key(body: Bytes, key: &str) -> Bytes {
    match masked(&body, key) {
        Some(out) => Bytes::from(out),
        None => body,
    }
}

/// `body` with every key of `keys` masked (a pool's: a provider may echo any).
pub(crate) fn mask_keys<'k>(body: Bytes, keys: impl Iterator<Item = &'k str>) -> Bytes {
    keys.fold(body, mask_key)
}

/// [`masked`] for each of `keys`: `None` (nothing allocated) when none is in `body`.
pub(crate) fn masked_any<'k>(body: &[u8], keys: impl Iterator<Item = &'k str>) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    for key in keys {
        if let Some(m) = masked(out.as_deref().unwrap_or(body), key) {
            out = Some(m);
        }
    }
    out
}

/// `body` with the key masked as [`mask_key`] does, or `None` (nothing allocated)
/// when no spelling of the key is in it. JSON may spell any character of the key as
/// an escape (`sk-abc\/def`, `sk\u002dabc`): when the body holds a backslash, each
/// character may be one, and a masked run takes in whole escapes around the key, so
/// the JSON stays valid.
pub(crate) fn masked(body: &[u8], key: &str) -> Option<Vec<u8>> {
    let key = key.as_bytes();
    if key.len() < MIN_MASKED_KEY {
        return None;
    }
    let finder = memchr::memmem::Finder::new(key);
    let escaped = memchr::memchr(b'\\', body).is_some();
    let find = |from: usize| -> Option<(usize, usize)> {
        if escaped {
            find_escaped(body, key, from)
        } else {
            let at = from + finder.find(&body[from..])?;
            Some((at, at + key.len()))
        }
    };
    let (mut at, mut key_end) = find(0)?;
    let mut out = Vec::with_capacity(body.len());
    let mut copied = 0;
    loop {
        // Backslashes too: the run never starts inside an escape.
        let mut start = at;
        while start > copied && (shaped(body[start - 1]) || body[start - 1] == b'\\') {
            start -= 1;
        }
        let mut end = key_end;
        while end < body.len() {
            if shaped(body[end]) {
                end += 1;
            } else if let Some((c, n)) = escape_at(body, end)
                && shaped(c)
            {
                end += n;
            } else {
                break;
            }
        }
        out.extend_from_slice(&body[copied..start]);
        out.extend_from_slice(MASK);
        copied = end;
        match find(copied) {
            Some((a, e)) => (at, key_end) = (a, e),
            None => break,
        }
    }
    out.extend_from_slice(&body[copied..]);
    Some(out)
}

/// A byte of a key-shaped run.
fn shaped(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// The JSON escape at `at` (`\/`, `\n`, `\u002d`, ...): the ASCII byte it stands for
/// and its length. `None` when there is none, or it stands for a non-ASCII character.
fn escape_at(body: &[u8], at: usize) -> Option<(u8, usize)> {
    if body.get(at) != Some(&b'\\') {
        return None;
    }
    let c = match *body.get(at + 1)? {
        b'u' => {
            let hex = std::str::from_utf8(body.get(at + 2..at + 6)?).ok()?;
            let v = u16::from_str_radix(hex, 16).ok()?;
            return u8::try_from(v).ok().filter(u8::is_ascii).map(|b| (b, 6));
        }
        c @ (b'/' | b'\\' | b'"') => c,
        b'b' => 8,
        b'f' => 12,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        _ => return None,
    };
    Some((c, 2))
}

/// The first spelling of `key` at or after `from`, each of its bytes as itself or as
/// a JSON escape: its start and end.
fn find_escaped(body: &[u8], key: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut i = from;
    while i < body.len() {
        i += memchr::memchr2(key[0], b'\\', &body[i..])?;
        if let Some(end) = spelled_at(body, i, key) {
            return Some((i, end));
        }
        i += 1;
    }
    None
}

/// Where `key` ends if it is spelled at `at`, escapes allowed.
fn spelled_at(body: &[u8], mut at: usize, key: &[u8]) -> Option<usize> {
    for &k in key {
        match *body.get(at)? {
            b if b == k => at += 1,
            b'\\' => match escape_at(body, at)? {
                (c, n) if c == k => at += n,
                _ => return None,
            },
            _ => return None,
        }
    }
    Some(at)
}

/// Does the answer come in a content coding (gzip, br, ...)? The proxy asks for
/// `identity` and does not decode, so such a body cannot be read, rewritten or
/// relayed as it is.
pub(crate) fn is_encoded(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echoed_key_is_masked_in_error_bodies() {
        const KEY: &str = "sk-proj-Abc123_def456-XYZ";
        let mask = |body: &str| {
            let out = mask_key(Bytes::copy_from_slice(body.as_bytes()), KEY);
            String::from_utf8(out.to_vec()).unwrap()
        };
        assert_eq!(
            mask(&format!(
                r#"{{"error":{{"message":"Incorrect API key provided: {KEY}.","code":"invalid_api_key"}}}}"#
            )),
            r#"{"error":{"message":"Incorrect API key provided: ****","code":"invalid_api_key"}}"#
        );
        // Inside a longer key-shaped run, several times, at both ends.
        assert_eq!(
            mask(&format!("{KEY} Bearer x{KEY}y, key={KEY}")),
            "**** Bearer ****, key=****"
        );
        // Absent, or a key too short to look for: unchanged, not copied.
        let body = Bytes::from_static(b"{\"error\":\"sk-proj-****XYZ is wrong\"}");
        let out = mask_key(body.clone(), KEY);
        assert_eq!(out.as_ptr(), body.as_ptr());
        assert_eq!(mask_key(Bytes::from_static(b"abc"), "abc"), "abc");
    }

    #[test]
    fn a_key_spelled_with_json_escapes_is_masked_and_the_json_stays_valid() {
        const KEY: &str = "sk-abc/def_0123456789";
        let mask = |body: &str| String::from_utf8(masked(body.as_bytes(), KEY).unwrap()).unwrap();
        for spelled in [
            r"sk-abc\/def_0123456789",
            r"sk\u002dabc\/def_0123456789",
            r"sk\u002Dabc\u002fdef_0123456789",
            r"\u0073\u006b-abc/def_0123456789",
            r"sk-abc\/def_012345678\u0039",
        ] {
            let body =
                format!(r#"{{"error":{{"message":"bad key {spelled}\n(x)","key":"{spelled}"}}}}"#);
            let out = mask(&body);
            assert_eq!(
                out, r#"{"error":{"message":"bad key ****\n(x)","key":"****"}}"#,
                "{spelled}"
            );
            let v: serde_json::Value = serde_json::from_str(&out).expect("still JSON");
            assert!(!v.to_string().contains("0123456789"), "{spelled}");
        }
        // Escapes around the key go with it, never half of one.
        assert_eq!(
            mask(r#""\u0041sk-abc\/def_0123456789\u0042!""#),
            r#""****!""#
        );
        assert_eq!(mask(r#""\"sk-abc/def_0123456789\"""#), r#""\"****\"""#);
        // A backslash elsewhere, or a near miss: nothing to mask, nothing allocated.
        assert!(masked(br#"{"a":"x\/y","b":"sk-abc\/def_012345678"}"#, KEY).is_none());
        assert!(masked(br#""sk-abc\u00"#, KEY).is_none());
        assert!(masked(b"sk-abc/def_012345678", KEY).is_none());
    }

    #[test]
    fn relayed_answers_keep_only_the_listed_provider_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-type", "application/json"),
            ("x-ratelimit-remaining-requests", "99"),
            ("x-ratelimit-reset-tokens", "6ms"),
            ("anthropic-ratelimit-tokens-remaining", "1000"),
            ("retry-after", "2"),
            ("retry-after-ms", "1500"),
            ("openai-processing-ms", "321"),
            ("x-request-id", "upstream-id"),
            ("connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("content-length", "12"),
            ("content-encoding", "gzip"),
            ("server", "cloudflare"),
            ("cf-ray", "8f1e-AMS"),
            ("openai-organization", "org-secret"),
            ("strict-transport-security", "max-age=31536000"),
            ("x-envoy-upstream-service-time", "12"),
            ("x-ratelimit", "not-the-family"),
        ] {
            h.insert(k, HeaderValue::from_static(v));
        }
        h.append("set-cookie", HeaderValue::from_static("__cf_bm=a"));
        h.append("set-cookie", HeaderValue::from_static("_cfuvid=b"));
        h.append("x-ratelimit-limit-requests", HeaderValue::from_static("1"));
        h.append("x-ratelimit-limit-requests", HeaderValue::from_static("2"));
        let r = relay(StatusCode::CREATED, h, Body::empty());
        assert_eq!(r.status(), StatusCode::CREATED);
        let mut names: Vec<_> = r.headers().keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "anthropic-ratelimit-tokens-remaining",
                "content-type",
                "openai-processing-ms",
                "retry-after",
                "retry-after-ms",
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-tokens",
                "x-upstream-request-id",
            ]
        );
        assert_eq!(r.headers()["x-upstream-request-id"], "upstream-id");
        assert_eq!(
            r.headers()
                .get_all("x-ratelimit-limit-requests")
                .iter()
                .collect::<Vec<_>>(),
            ["1", "2"],
            "every value of a kept header"
        );
    }
}

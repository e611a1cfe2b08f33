//! Rewriting the `"model"` value inside JSON bytes without parsing them.
//!
//! Requests get the target's upstream model; responses and every stream event get
//! the name the client sent. A byte-level rewrite keeps the hot path free of a JSON
//! parse + re-serialise per chunk. It is sound because a raw `"model"` followed by
//! `:` can only be an object key: inside a JSON string every `"` is escaped.

use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use memchr::memmem;

const KEY: &[u8] = b"\"model\"";
static FINDER: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(KEY));

/// A JSON string literal, quotes included, ready to splice into a document.
#[derive(Clone, Debug)]
pub struct JsonStr(Bytes);

impl JsonStr {
    pub fn new(s: &str) -> Self {
        // Serialising a &str cannot fail.
        Self(Bytes::from(serde_json::to_vec(s).unwrap_or_default()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Where a `"model": "<value>"` pair's string value sits: `start..end` covers the
/// value's quotes.
fn next_model_value(doc: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut at = from;
    while let Some(found) = FINDER.find(&doc[at..]) {
        let key_end = at + found + KEY.len();
        at = key_end;
        let mut i = skip_ws(doc, key_end);
        if doc.get(i) != Some(&b':') {
            continue;
        }
        i = skip_ws(doc, i + 1);
        if doc.get(i) != Some(&b'"') {
            continue; // null or another type: leave it alone
        }
        let end = string_end(doc, i)?;
        return Some((i, end));
    }
    None
}

fn skip_ws(doc: &[u8], mut i: usize) -> usize {
    while matches!(doc.get(i), Some(b' ' | b'\t' | b'\r' | b'\n')) {
        i += 1;
    }
    i
}

/// Index just past the closing quote of the string starting at `open`.
fn string_end(doc: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    while i < doc.len() {
        match doc[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// Replace the value of every `"model"` key with `to`. Returns `None` when there is
/// nothing to change (no key, or every value already equals `to`), so callers can
/// forward the original bytes without a copy.
pub fn replace_model(doc: &[u8], to: &JsonStr) -> Option<Bytes> {
    let mut at = 0;
    loop {
        let (start, end) = next_model_value(doc, at)?;
        if &doc[start..end] != to.as_bytes() {
            break;
        }
        at = end;
    }
    let mut out = BytesMut::with_capacity(doc.len() + 32);
    replace_model_into(doc, to, &mut out);
    Some(out.freeze())
}

/// `doc` with the value of every `"model"` key replaced by `to`, appended to `out`.
pub fn replace_model_into(doc: &[u8], to: &JsonStr, out: &mut BytesMut) {
    let mut copied = 0;
    let mut at = 0;
    while let Some((start, end)) = next_model_value(doc, at) {
        at = end;
        if &doc[start..end] == to.as_bytes() {
            continue;
        }
        out.extend_from_slice(&doc[copied..start]);
        out.extend_from_slice(to.as_bytes());
        copied = end;
    }
    out.extend_from_slice(&doc[copied..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(doc: &str, to: &str) -> String {
        match replace_model(doc.as_bytes(), &JsonStr::new(to)) {
            Some(b) => String::from_utf8(b.to_vec()).unwrap(),
            None => doc.to_string(),
        }
    }

    #[test]
    fn rewrites_top_level_and_nested_values() {
        assert_eq!(
            rw(r#"{"id":"x","model":"gpt-4o-2024","n":1}"#, "smart"),
            r#"{"id":"x","model":"smart","n":1}"#
        );
        assert_eq!(
            rw(
                r#"{"type":"message_start","message":{"model" : "claude"}}"#,
                "smart"
            ),
            r#"{"type":"message_start","message":{"model" : "smart"}}"#
        );
    }

    #[test]
    fn ignores_escaped_quotes_inside_strings_and_non_string_values() {
        let doc = r#"{"content":"say \"model\": \"x\"","model":null}"#;
        assert_eq!(rw(doc, "smart"), doc);
        let doc = r#"{"content":"a \\\"model\\\":\"x\"","model":"m"}"#;
        assert!(rw(doc, "smart").ends_with(r#""model":"smart"}"#));
        assert!(rw(doc, "smart").starts_with(r#"{"content":"a \\\"model\\\":\"x\"""#));
    }

    #[test]
    fn escapes_the_new_name_and_skips_no_op() {
        assert_eq!(rw(r#"{"model":"a"}"#, "we\"ird"), r#"{"model":"we\"ird"}"#);
        assert!(replace_model(br#"{"model":"same"}"#, &JsonStr::new("same")).is_none());
        assert!(replace_model(b"data: [DONE]", &JsonStr::new("x")).is_none());
    }

    #[test]
    fn handles_escaped_backslash_before_closing_quote() {
        assert_eq!(
            rw(r#"{"model":"a\\","x":"model"}"#, "b"),
            r#"{"model":"b","x":"model"}"#
        );
    }
}

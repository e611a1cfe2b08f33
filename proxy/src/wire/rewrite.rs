//! Rewriting the `"model"` value inside JSON bytes without parsing them.
//!
//! Requests get the target's upstream model in exactly the top-level member the
//! router read, whatever its spelling (`"m\u006fdel"` decodes to `model`), and no
//! other (`metadata.model` is the client's business): [`replace_top_level_model`].
//! Responses and every stream event get the name the client sent wherever a provider
//! puts a model (Anthropic nests it in `message_start`): [`replace_model`]. A
//! byte-level rewrite keeps the hot path free of a JSON parse + re-serialise per
//! chunk. It is sound because a raw `"model"` followed by `:` can only be an object
//! key: inside a JSON string every `"` is escaped.

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

/// Gemini's answers name their model so.
const VERSION_KEY: &[u8] = b"\"modelVersion\"";
static VERSION_FINDER: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(VERSION_KEY));

/// The model an answer (or a stream event) says it came from: the first `"model"`
/// string value in it (nested ones too: Anthropic's `message_start`), else Gemini's
/// `"modelVersion"`, as the JSON literal (quotes included); `None` when it names none
/// (Bedrock's Converse never does).
pub fn answer_model(doc: &[u8]) -> Option<&[u8]> {
    next_model_value(doc, 0)
        .or_else(|| next_string_value(doc, 0, &VERSION_FINDER, VERSION_KEY.len()))
        .map(|(start, end)| &doc[start..end])
}

/// Where a `"model": "<value>"` pair's string value sits: `start..end` covers the
/// value's quotes.
fn next_model_value(doc: &[u8], from: usize) -> Option<(usize, usize)> {
    next_string_value(doc, from, &FINDER, KEY.len())
}

/// Where the string value of the next key `finder` finds (of `key_len` bytes, quotes
/// included) sits.
fn next_string_value(
    doc: &[u8],
    from: usize,
    finder: &memmem::Finder<'_>,
    key_len: usize,
) -> Option<(usize, usize)> {
    let mut at = from;
    while let Some(found) = finder.find(&doc[at..]) {
        let key_end = at + found + key_len;
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

/// The span (quotes included) of the string value of the top-level member whose key
/// decodes to `name`, in a document that is a JSON object. `None` when there is no
/// such member, its value is not a string, or the document is not an object. The
/// router reads the body with serde, which refuses duplicate members, so the first
/// match is the one it read.
fn top_level_string(doc: &[u8], name: &str) -> Option<(usize, usize)> {
    let mut i = skip_ws(doc, 0);
    if doc.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_ws(doc, i);
        match doc.get(i)? {
            b'"' => {}
            b',' => {
                i += 1;
                continue;
            }
            _ => return None,
        }
        let key_end = string_end(doc, i)?;
        let wanted = key_is(&doc[i..key_end], name);
        i = skip_ws(doc, key_end);
        if doc.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(doc, i + 1);
        let value_end = value_end(doc, i)?;
        if wanted {
            return (doc[i] == b'"').then_some((i, value_end));
        }
        i = value_end;
    }
}

/// Whether the JSON string literal `key` (quotes included) decodes to `name`.
fn key_is(key: &[u8], name: &str) -> bool {
    let inner = &key[1..key.len() - 1];
    if !inner.contains(&b'\\') {
        return inner == name.as_bytes();
    }
    // Escaped keys are rare: decode properly.
    serde_json::from_slice::<String>(key).is_ok_and(|k| k == name)
}

/// Index just past the JSON value starting at `i`.
fn value_end(doc: &[u8], i: usize) -> Option<usize> {
    match doc.get(i)? {
        b'"' => string_end(doc, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < doc.len() {
                match doc[j] {
                    b'"' => {
                        j = string_end(doc, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < doc.len()
                && !matches!(doc[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n')
            {
                j += 1;
            }
            Some(j)
        }
    }
}

/// Replace the value of the top-level `"model"` member (however its key is spelled)
/// with `to`, leaving every nested `model` alone. `None` when there is nothing to
/// change, so callers can forward the original bytes without a copy.
pub fn replace_top_level_model(doc: &[u8], to: &JsonStr) -> Option<Bytes> {
    let (start, end) = top_level_string(doc, "model")?;
    if &doc[start..end] == to.as_bytes() {
        return None;
    }
    let mut out = BytesMut::with_capacity(doc.len() - (end - start) + to.as_bytes().len());
    out.extend_from_slice(&doc[..start]);
    out.extend_from_slice(to.as_bytes());
    out.extend_from_slice(&doc[end..]);
    Some(out.freeze())
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
pub(crate) fn replace_model_into(doc: &[u8], to: &JsonStr, out: &mut BytesMut) {
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

static STREAM_OPTIONS: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\"stream_options\""));

/// An OpenAI chat request (a JSON object) that asks for the stream's usage chunk:
/// `stream_options.include_usage` set to true. Without `stream_options` the member
/// is spliced in after the opening brace (no parse); with one, the body is parsed and
/// written again (rare: clients that set it usually ask for usage already). `None`
/// when the body is not an object.
pub(crate) fn with_include_usage(doc: &[u8]) -> Option<Bytes> {
    const MEMBER: &[u8] = br#""stream_options":{"include_usage":true}"#;
    let open = doc.iter().position(|b| !b.is_ascii_whitespace())?;
    if doc[open] != b'{' {
        return None;
    }
    if STREAM_OPTIONS.find(doc).is_none() {
        let rest = &doc[open + 1..];
        let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
        let mut out = BytesMut::with_capacity(doc.len() + MEMBER.len() + 1);
        out.extend_from_slice(&doc[..=open]);
        out.extend_from_slice(MEMBER);
        if !empty {
            out.extend_from_slice(b",");
        }
        out.extend_from_slice(rest);
        return Some(out.freeze());
    }
    let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(doc).ok()?;
    let options = v
        .entry("stream_options")
        .or_insert_with(|| serde_json::json!({}));
    if !options.is_object() {
        *options = serde_json::json!({});
    }
    options["include_usage"] = serde_json::Value::Bool(true);
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

#[cfg(test)]
mod include_usage_tests {
    use super::*;

    #[test]
    fn usage_is_asked_for_with_or_without_stream_options() {
        let parse = |b: Bytes| serde_json::from_slice::<serde_json::Value>(&b).unwrap();
        let v = parse(with_include_usage(br#" {"model":"m","stream":true}"#).unwrap());
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "m");
        let v = parse(
            with_include_usage(br#"{"model":"m","stream_options":{"include_usage":false,"x":1}}"#)
                .unwrap(),
        );
        assert_eq!(
            v["stream_options"],
            serde_json::json!({"include_usage": true, "x": 1})
        );
        let v = parse(with_include_usage(b"{}").unwrap());
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert!(with_include_usage(b"[1]").is_none());
    }
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
    fn an_answer_names_its_model_as_providers_spell_it() {
        let model = |doc: &str| answer_model(doc.as_bytes()).map(|m| m.to_vec());
        assert_eq!(
            model(r#"{"id":"x","model":"gpt-4o-2024-08-06","choices":[]}"#),
            Some(br#""gpt-4o-2024-08-06""#.to_vec())
        );
        assert_eq!(
            model(r#"{"type":"message_start","message":{"model" : "claude-x"}}"#),
            Some(br#""claude-x""#.to_vec())
        );
        assert_eq!(
            model(r#"{"candidates":[],"modelVersion":"gemini-2.5-flash"}"#),
            Some(br#""gemini-2.5-flash""#.to_vec())
        );
        assert_eq!(model(r#"{"output":{},"model":null}"#), None);
        assert_eq!(model(r#"{"output":{"message":{}}}"#), None);
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

    fn rw_top(doc: &str, to: &str) -> String {
        match replace_top_level_model(doc.as_bytes(), &JsonStr::new(to)) {
            Some(b) => String::from_utf8(b.to_vec()).unwrap(),
            None => doc.to_string(),
        }
    }

    #[test]
    fn requests_rewrite_the_top_level_member_the_router_read_and_no_other() {
        // The spelling serde decodes to `model` is the one rewritten.
        assert_eq!(
            rw_top(r#"{"m\u006fdel":"smart","messages":[]}"#, "gpt-4o"),
            r#"{"m\u006fdel":"gpt-4o","messages":[]}"#
        );
        // Nested models are the client's business.
        assert_eq!(
            rw_top(
                r#"{"metadata":{"model":"mine"},"tools":[{"model":"t"}],"model" : "smart"}"#,
                "gpt-4o"
            ),
            r#"{"metadata":{"model":"mine"},"tools":[{"model":"t"}],"model" : "gpt-4o"}"#
        );
        // Strings that merely contain the key, values of other types, numbers and
        // literals are skipped correctly on the way.
        assert_eq!(
            rw_top(
                r#"{"a":"\"model\":\"x\"","n":-1.5e3,"t":true,"z":null,"model":"s"}"#,
                "m"
            ),
            r#"{"a":"\"model\":\"x\"","n":-1.5e3,"t":true,"z":null,"model":"m"}"#
        );
        assert!(replace_top_level_model(br#"{"model":"same"}"#, &JsonStr::new("same")).is_none());
        assert!(replace_top_level_model(br#"{"model":null}"#, &JsonStr::new("x")).is_none());
        assert!(replace_top_level_model(br#"{"x":{"model":"a"}}"#, &JsonStr::new("x")).is_none());
        assert!(replace_top_level_model(br#"["model"]"#, &JsonStr::new("x")).is_none());
        assert!(
            replace_top_level_model(br#"{"model":"unterminated"#, &JsonStr::new("x")).is_none()
        );
    }

    /// Whatever the document, the top-level rewrite agrees with serde about which
    /// member is `model`: parse, rewrite, parse again.
    #[test]
    fn top_level_rewrite_agrees_with_serde() {
        let docs = [
            r#"{"model":"a"}"#,
            r#"{ "\u006d\u006f\u0064\u0065\u006c" : "a" , "x" : [1, {"model": "b"}] }"#,
            r#"{"x":"}","y":"{\"","model":"a","z":{"model":"c"}}"#,
            r#"{"deep":[[[{"model":"n"}]]],"model":"a"}"#,
        ];
        for doc in docs {
            let out = rw_top(doc, "rewritten");
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["model"], "rewritten", "{doc} -> {out}");
            let before: serde_json::Value = serde_json::from_str(doc).unwrap();
            let mut expected = before.clone();
            expected["model"] = "rewritten".into();
            assert_eq!(v, expected, "only the top-level member changed: {doc}");
        }
    }

    #[test]
    fn handles_escaped_backslash_before_closing_quote() {
        assert_eq!(
            rw(r#"{"model":"a\\","x":"model"}"#, "b"),
            r#"{"model":"b","x":"model"}"#
        );
    }
}

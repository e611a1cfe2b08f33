//! Property tests over the parsers that read client and provider bytes (issue 11):
//! the SSE framer, the model rewrite, manifest parsing and translation never panic
//! on any input; the framer is lossless, independent of where the network cut the
//! bytes, and holds no more than its limit; the rewrite changes exactly the member
//! the router reads; the unary answer check (`json::is_object`) says valid exactly
//! when serde_json does.

use std::borrow::Cow;
use std::path::Path;

use bytes::BytesMut;
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::Value;
use switchback_proxy::providers::translate::{self, Defaults, Direction, StreamTranslator};
use switchback_proxy::sources::manifest::{self, ManifestSet};
use switchback_proxy::wire::json;
use switchback_proxy::wire::rewrite::{JsonStr, replace_top_level_model};
use switchback_proxy::wire::sse::Framer;

/// What the router reads of a request body (as `server.rs` does).
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
}

fn routed_model(doc: &[u8]) -> Option<String> {
    serde_json::from_slice::<Peek<'_>>(doc)
        .ok()?
        .model
        .map(Cow::into_owned)
}

/// Bytes rich in what SSE framing cares about.
fn sse_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            4 => Just(b'a'),
            3 => Just(b'\n'),
            2 => Just(b'\r'),
            1 => Just(b':'),
            1 => Just(b' '),
            1 => any::<u8>(),
        ],
        0..max,
    )
}

/// `input` cut at the given points.
fn chunks<'a>(input: &'a [u8], cuts: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(input.len() + 1)).collect();
    at.sort_unstable();
    let mut out = Vec::new();
    let mut from = 0;
    for to in at.into_iter().chain([input.len()]) {
        out.push(&input[from..to]);
        from = to;
    }
    out
}

/// Frames `parts` with a limit that no input reaches: every event, then the rest.
fn frame(parts: &[&[u8]]) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    let mut f = Framer::new(usize::MAX / 2);
    let mut events = Vec::new();
    for p in parts {
        f.push(p);
        while let Some(e) = f.next_event().expect("no limit is reached") {
            events.push(e.to_vec());
        }
    }
    (events, f.take_rest().map(|b| b.to_vec()))
}

/// A JSON string literal of `s` whose characters are escaped or not as `escape` says.
fn spelled(s: &str, escape: &[bool]) -> String {
    let mut out = String::from("\"");
    for (i, c) in s.chars().enumerate() {
        if escape.get(i).copied().unwrap_or(false) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// Small JSON values, some holding a nested `model` member.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        "[a-z \"\\\\é]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![Just("model".to_string()), "[a-z]{1,6}"],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A request body: other members around one top-level `model`, its key spelled with
/// random escapes, random whitespace between tokens.
fn request_doc() -> impl Strategy<Value = (String, String)> {
    (
        proptest::collection::btree_map("[a-ln-z][a-z]{0,6}", json_value(), 0..5),
        "[a-zA-Z0-9./:-]{1,20}",
        proptest::collection::vec(any::<bool>(), 5),
        any::<prop::sample::Index>(),
        proptest::collection::vec(prop_oneof![Just(""), Just(" "), Just("\n\t")], 8),
    )
        .prop_map(|(others, model, escape, position, ws)| {
            let mut members: Vec<String> = others
                .iter()
                .map(|(k, v)| format!("{}{}:{}{}", spelled(k, &[]), ws[0], ws[1], v))
                .collect();
            let at = position.index(members.len() + 1);
            members.insert(
                at,
                format!(
                    "{}{}:{}{}",
                    spelled("model", &escape),
                    ws[2],
                    ws[3],
                    Value::String(model.clone())
                ),
            );
            let sep = format!("{},{}", ws[4], ws[5]);
            (
                format!("{}{{{}{}}}{}", ws[6], members.join(&sep), ws[7], ws[6]),
                model,
            )
        })
}

fn without_model(doc: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(doc).expect("a JSON document");
    v.as_object_mut().expect("an object").remove("model");
    v
}

/// The answer check's reference: what the proxy asked of serde before `json`.
fn serde_says_object(b: &[u8]) -> bool {
    b.trim_ascii_start().first() == Some(&b'{')
        && serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
}

/// Bytes that change a JSON document's meaning when put anywhere in it.
fn json_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        2 => prop::sample::select(b"{}[]\",:\\/ \n\t\r0123456789.eE+-tfnulrsabu".to_vec()),
        1 => any::<u8>(),
    ]
}

/// An object of [`json_value`]s, compact or pretty.
fn json_object() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::btree_map("[a-z\"\\\\é]{0,6}", json_value(), 0..5),
        any::<bool>(),
    )
        .prop_map(|(m, pretty)| {
            let v = Value::Object(m.into_iter().collect());
            if pretty {
                serde_json::to_vec_pretty(&v).expect("a value")
            } else {
                serde_json::to_vec(&v).expect("a value")
            }
        })
}

/// One edit of `doc`: a byte removed, replaced or inserted at `at`.
fn mutated(mut doc: Vec<u8>, at: prop::sample::Index, edit: u8, byte: u8) -> Vec<u8> {
    let i = at.index(doc.len() + 1);
    match edit % 3 {
        0 if i < doc.len() => {
            doc.remove(i);
        }
        1 if i < doc.len() => doc[i] = byte,
        _ => doc.insert(i, byte),
    }
    doc
}

#[test]
fn the_answer_check_agrees_with_serde_on_every_truncation_of_real_answers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate");
    let mut answers = Vec::new();
    for side in ["chat-client", "messages-client"] {
        for entry in std::fs::read_dir(dir.join(side)).expect("fixtures") {
            let path = entry.expect("an entry").path();
            if path.extension().is_some_and(|e| e == "json") {
                answers.push(std::fs::read(&path).expect("a fixture"));
            }
        }
    }
    assert!(answers.len() > 50, "{} fixtures", answers.len());
    for doc in &answers {
        assert_eq!(json::is_object(doc), serde_says_object(doc));
        for cut in 0..doc.len() {
            let part = &doc[..cut];
            assert_eq!(
                json::is_object(part),
                serde_says_object(part),
                "{:?}",
                String::from_utf8_lossy(part)
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_answer_check_agrees_with_serde_on_generated_and_mutated_answers(
        doc in json_object(),
        edits in proptest::collection::vec(
            (any::<prop::sample::Index>(), any::<u8>(), json_byte()),
            0..4,
        ),
    ) {
        prop_assert!(json::is_object(&doc));
        let mut doc = doc;
        for (at, edit, byte) in edits {
            doc = mutated(doc, at, edit, byte);
            prop_assert_eq!(
                json::is_object(&doc),
                serde_says_object(&doc),
                "{:?}",
                String::from_utf8_lossy(&doc)
            );
        }
    }

    #[test]
    fn the_answer_check_agrees_with_serde_on_json_like_noise(
        doc in proptest::collection::vec(json_byte(), 0..60),
    ) {
        let mut body = b"{".to_vec();
        body.extend(doc);
        prop_assert_eq!(json::is_object(&body), serde_says_object(&body));
    }

    #[test]
    fn framing_is_lossless_and_independent_of_the_cuts(
        input in sse_bytes(600),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..30),
    ) {
        let whole = frame(&[&input]);
        let cut = frame(&chunks(&input, &cuts));
        prop_assert_eq!(&cut, &whole);
        let mut joined: Vec<u8> = whole.0.concat();
        joined.extend(whole.1.unwrap_or_default());
        prop_assert_eq!(joined, input);
    }

    #[test]
    fn the_framer_holds_no_more_than_its_limit_and_the_last_chunk(
        input in sse_bytes(2_000),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
        limit in 1usize..64,
    ) {
        let mut f = Framer::new(limit);
        for part in chunks(&input, &cuts) {
            f.push(part);
            loop {
                match f.next_event() {
                    Ok(Some(e)) => prop_assert!(e.len() <= limit),
                    Ok(None) => break,
                    // Past the limit the buffer is freed and the stream ends.
                    Err(_) => {
                        prop_assert_eq!(f.buffered(), 0);
                        break;
                    }
                }
            }
            prop_assert!(f.buffered() <= limit + part.len());
        }
    }

    #[test]
    fn the_rewrite_changes_exactly_the_member_the_router_reads(
        (doc, model) in request_doc(),
        to in "[a-zA-Z0-9./:-]{1,20}",
    ) {
        prop_assert_eq!(routed_model(doc.as_bytes()), Some(model.clone()));
        let rewritten = replace_top_level_model(doc.as_bytes(), &JsonStr::new(&to));
        let out = match &rewritten {
            Some(b) => b.to_vec(),
            None => {
                // Unchanged only when the model already is the target's.
                prop_assert_eq!(&model, &to);
                doc.clone().into_bytes()
            }
        };
        prop_assert_eq!(routed_model(&out), Some(to));
        prop_assert_eq!(without_model(&out), without_model(doc.as_bytes()));
    }

    #[test]
    fn the_rewrite_never_panics(doc in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = replace_top_level_model(&doc, &JsonStr::new("gpt-4o"));
    }

    #[test]
    fn manifest_parsing_never_panics(
        text in prop_oneof![
            any::<String>(),
            "[a-zA-Z:{}\\[\\],\"' \n#&*!|>-]{0,300}",
            Just("apiVersion: switchback.dev/v1alpha1\nkind: LLMRoute\n".to_string()),
        ],
        tail in "[a-zA-Z0-9:{}\\[\\], \n-]{0,120}",
    ) {
        let mut set = ManifestSet::default();
        let mut errors = Vec::new();
        manifest::load_text(Path::new("fuzz.yaml"), &format!("{text}{tail}"), &mut set, &mut errors);
    }

    #[test]
    fn translation_never_panics(
        body in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            json_value().prop_map(|v| v.to_string().into_bytes()),
        ],
        events in proptest::collection::vec(
            prop_oneof![
                sse_bytes(120),
                json_value().prop_map(|v| format!("data: {v}\n\n").into_bytes()),
            ],
            0..6,
        ),
        status in 400u16..600,
    ) {
        for direction in [Direction::OpenAiToAnthropic, Direction::AnthropicToOpenAi] {
            let _ = translate::request(direction, &body, "up", &Defaults::default());
            let _ = translate::response_at(direction, &body, "smart", 0);
            let _ = translate::error(direction, status, &body);
            let mut stream = StreamTranslator::new(direction, "smart", true);
            let mut out = BytesMut::new();
            for e in &events {
                stream.event(e, &mut out);
            }
            stream.finish(&mut out);
        }
    }
}

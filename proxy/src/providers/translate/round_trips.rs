//! Each adapter against itself, on every golden fixture in its wire: encoding what it
//! decoded from its own encoding changes nothing (`encode ∘ decode` is idempotent).
//! The form then loses nothing an adapter writes, so what a pairing produces depends
//! on the other adapter only.

use std::path::Path;

use bytes::BytesMut;
use serde_json::Value;

use super::super::{anthropic, bedrock, form, gemini, openai, vocab};
use super::{Defaults, Fetched};
use crate::wire::sse::Framer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Adapter {
    OpenAi,
    Anthropic,
}

const ADAPTERS: [Adapter; 2] = [Adapter::OpenAi, Adapter::Anthropic];
const CREATED: u64 = 1_700_000_000;

/// Fixture bodies in `adapter`'s wire of one kind (`request`, `response`, `error`,
/// `stream`), with their names: the inputs of one folder and the expected outputs
/// of the other.
fn fixtures(adapter: Adapter, kind: &str) -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate");
    // chat-client's inputs are OpenAI requests and Anthropic answers, errors and
    // streams; messages-client's the reverse. Each folder's outputs are in the other
    // wire.
    let anthropic_inputs = kind != "request";
    let (in_dir, out_dir) = if (adapter == Adapter::Anthropic) == anthropic_inputs {
        ("chat-client", "messages-client")
    } else {
        ("messages-client", "chat-client")
    };
    let ext = if kind == "stream" { "sse" } else { "json" };
    let mut out = Vec::new();
    for (dir, part) in [(in_dir, "in"), (out_dir, "out")] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            // `*-vertex-*` are Vertex AI's variants of the wire (a `rawPredict` body,
            // a Google-shaped error), not the adapter's own.
            // `*-json-object*` requests, once encoded, ask for JSON through the
            // gateway's own tool, whose name a client may not use.
            if name.starts_with(&format!("{kind}-"))
                && name.ends_with(&format!(".{part}.{ext}"))
                && !name.contains("-vertex-")
                && !(part == "out" && name.contains("-json-object"))
            {
                let body = std::fs::read(root.join(dir).join(&name)).unwrap();
                out.push((format!("{dir}/{name}"), body));
            }
        }
    }
    out.sort();
    assert!(out.len() >= 6, "{adapter:?} {kind}: {} fixtures", out.len());
    out
}

fn request_round(adapter: Adapter, body: &[u8]) -> Value {
    let parsed = vocab::parse_object(body).expect("a JSON object");
    let defaults = Defaults::default();
    let none = Fetched::default();
    match adapter {
        Adapter::OpenAi => {
            let form = openai::decode_request(&parsed, &openai::TARGET, &none).expect("decodes");
            openai::encode_request(&form, "m", &defaults)
        }
        Adapter::Anthropic => {
            let form =
                anthropic::decode_request(&parsed, &anthropic::TARGET, &none).expect("decodes");
            anthropic::encode_request(&form, "m", &defaults).expect("encodes")
        }
    }
}

fn answer_round(adapter: Adapter, body: &[u8]) -> Value {
    let parsed = vocab::parse_answer(body).expect("a JSON object");
    match adapter {
        Adapter::OpenAi => {
            let answer = openai::decode_answer(&parsed).expect("decodes");
            openai::encode_answer(&answer, "m", CREATED)
        }
        Adapter::Anthropic => anthropic::encode_answer(&anthropic::decode_answer(&parsed), "m"),
    }
}

fn error_round(adapter: Adapter, status: u16, body: &[u8]) -> Value {
    match adapter {
        Adapter::OpenAi => openai::encode_error(&openai::decode_error(status, body)),
        Adapter::Anthropic => anthropic::encode_error(&anthropic::decode_error(status, body)),
    }
}

/// A stream through one adapter's decoder and encoder, as `StreamTranslator` feeds
/// them (in-band errors aside: they never reach a decoder).
fn stream_round(adapter: Adapter, body: &[u8]) -> (Vec<u8>, Vec<String>) {
    let mut framer = Framer::default();
    framer.push(body);
    let mut events = Vec::new();
    while let Some(ev) = framer.next_event().unwrap().or_else(|| framer.take_rest()) {
        events.push(ev);
    }
    let mut out = BytesMut::new();
    let mut seen = Vec::new();
    let mut done = false;
    let mut openai = (
        openai::StreamDecoder::default(),
        openai::StreamEncoder::new("m", CREATED, true),
    );
    let mut anthropic = (
        anthropic::StreamDecoder::default(),
        anthropic::StreamEncoder::new("m"),
    );
    for ev in &events {
        let fields = crate::wire::sse::fields(ev);
        let Some(data) = fields.data else { continue };
        if done || crate::wire::sse::error_in(&fields).is_some() {
            break;
        }
        let mut emit = |e: form::Event<'_>| {
            seen.push(format!("{e:?}"));
            if !done {
                done = match adapter {
                    Adapter::OpenAi => openai.1.encode(e, &mut out),
                    Adapter::Anthropic => anthropic.1.encode(e, &mut out),
                };
            }
        };
        match adapter {
            Adapter::OpenAi => openai.0.decode(data, &mut emit),
            Adapter::Anthropic => anthropic.0.decode(data, &mut emit),
        }
    }
    (out.to_vec(), seen)
}

#[test]
fn requests_survive_their_own_adapter() {
    for adapter in ADAPTERS {
        for (name, body) in fixtures(adapter, "request") {
            let once = request_round(adapter, &body);
            let twice = request_round(adapter, once.to_string().as_bytes());
            assert_eq!(once, twice, "{adapter:?} {name}");
        }
    }
}

#[test]
fn answers_survive_their_own_adapter() {
    for adapter in ADAPTERS {
        for (name, body) in fixtures(adapter, "response") {
            let once = answer_round(adapter, &body);
            let twice = answer_round(adapter, once.to_string().as_bytes());
            assert_eq!(once, twice, "{adapter:?} {name}");
        }
    }
}

#[test]
fn errors_survive_their_own_adapter() {
    for adapter in ADAPTERS {
        for (name, body) in fixtures(adapter, "error") {
            for status in [400, 401, 403, 404, 429, 500, 503, 529] {
                let once = error_round(adapter, status, &body);
                let twice = error_round(adapter, status, once.to_string().as_bytes());
                assert_eq!(once, twice, "{adapter:?} {name} {status}");
            }
        }
    }
}

#[test]
fn streams_survive_their_own_adapter() {
    for adapter in ADAPTERS {
        for (name, body) in fixtures(adapter, "stream") {
            let (once, events) = stream_round(adapter, &body);
            let (twice, again) = stream_round(adapter, &once);
            assert_eq!(
                String::from_utf8_lossy(&once),
                String::from_utf8_lossy(&twice),
                "{adapter:?} {name}"
            );
            // What the encoder wrote decodes to the same text and tool calls.
            let content = |evs: &[String]| -> Vec<String> {
                evs.iter()
                    .filter(|e| e.starts_with("Text") || e.starts_with("Tool"))
                    .cloned()
                    .collect()
            };
            assert_eq!(content(&events), content(&again), "{adapter:?} {name}");
        }
    }
}

// ---------------------------------------------------------------------------------
// Gemini: a provider only, so its wire is never decoded from its own encoding. What
// holds instead: what a client adapter round-trips, Gemini's encoder reads the same;
// and a Gemini answer reads the same to both client adapters.
// ---------------------------------------------------------------------------------

fn gemini_fixtures(sub: &str, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/translate")
        .join(sub);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(prefix) && n.ends_with(".in.json"))
        .map(|n| (format!("{sub}/{n}"), std::fs::read(dir.join(&n)).unwrap()))
        .collect();
    out.sort();
    assert!(out.len() >= 4, "{sub} {prefix}: {}", out.len());
    out
}

#[test]
fn gemini_requests_read_the_same_after_a_client_round_trip() {
    for (sub, adapter) in [
        ("chat-client-gemini", Adapter::OpenAi),
        ("messages-client-gemini", Adapter::Anthropic),
    ] {
        for (name, body) in gemini_fixtures(sub, "request-") {
            let to_gemini = |body: &[u8]| {
                let parsed = vocab::parse_object(body).expect("a JSON object");
                let none = Fetched::default();
                let form = match adapter {
                    Adapter::OpenAi => openai::decode_request(&parsed, &gemini::TARGET, &none),
                    Adapter::Anthropic => {
                        anthropic::decode_request(&parsed, &gemini::TARGET, &none)
                    }
                }
                .expect("decodes");
                gemini::encode_request(&form, "gemini-2.5-flash").expect("encodes")
            };
            let once = to_gemini(&body);
            let again = request_round(adapter, &body);
            assert_eq!(once, to_gemini(again.to_string().as_bytes()), "{name}");
        }
    }
}

/// Text, tool calls, stop reason and usage of an answer, as one client reads it.
fn summary(answer: &form::Answer<'_>) -> String {
    let text: String = answer
        .content
        .iter()
        .filter_map(|p| match p {
            form::Part::Text(t) => Some(t.to_string()),
            // A JSON answer reaches every client as its text.
            form::Part::Json(v) => Some(v.to_string()),
            _ => None,
        })
        .collect();
    let calls: Vec<String> = answer
        .content
        .iter()
        .filter_map(|p| match p {
            form::Part::ToolUse(t) => Some(format!("{} {} {}", t.id, t.name, t.input)),
            _ => None,
        })
        .collect();
    format!(
        "{} | {text} | {calls:?} | {:?} | {:?}",
        answer.id, answer.stop, answer.usage
    )
}

#[test]
fn gemini_answers_read_the_same_to_both_clients() {
    for (name, body) in gemini_fixtures("chat-client-gemini", "response-") {
        let parsed = vocab::parse_answer(&body).expect("a JSON object");
        let answer = gemini::decode_answer(&parsed);
        let as_openai = openai::encode_answer(&answer, "m", CREATED);
        let as_anthropic = anthropic::encode_answer(&answer, "m");
        let openai_map = as_openai.as_object().unwrap();
        let anthropic_map = as_anthropic.as_object().unwrap();
        let read_openai = openai::decode_answer(openai_map).expect("decodes");
        let read_anthropic = anthropic::decode_answer(anthropic_map);
        assert_eq!(summary(&read_openai), summary(&answer), "{name}");
        assert_eq!(summary(&read_anthropic), summary(&answer), "{name}");
    }
}

// ---------------------------------------------------------------------------------
// Bedrock: a provider only too; the same two properties.
// ---------------------------------------------------------------------------------

#[test]
fn bedrock_requests_read_the_same_after_a_client_round_trip() {
    for (sub, adapter) in [
        ("chat-client-bedrock", Adapter::OpenAi),
        ("messages-client-bedrock", Adapter::Anthropic),
    ] {
        for (name, body) in gemini_fixtures(sub, "request-") {
            let to_bedrock = |body: &[u8]| {
                let parsed = vocab::parse_object(body).expect("a JSON object");
                let none = Fetched::default();
                let form = match adapter {
                    Adapter::OpenAi => openai::decode_request(&parsed, &bedrock::TARGET, &none),
                    Adapter::Anthropic => {
                        anthropic::decode_request(&parsed, &bedrock::TARGET, &none)
                    }
                }
                .expect("decodes");
                bedrock::encode_request(&form, "anthropic.claude", &Defaults::default())
                    .expect("encodes")
            };
            let once = to_bedrock(&body);
            let again = request_round(adapter, &body);
            assert_eq!(once, to_bedrock(again.to_string().as_bytes()), "{name}");
        }
    }
}

#[test]
fn bedrock_answers_read_the_same_to_both_clients() {
    for (name, body) in gemini_fixtures("chat-client-bedrock", "response-") {
        let parsed = vocab::parse_answer(&body).expect("a JSON object");
        let answer = bedrock::decode_answer(&parsed);
        let as_openai = openai::encode_answer(&answer, "m", CREATED);
        let as_anthropic = anthropic::encode_answer(&answer, "m");
        let read_openai = openai::decode_answer(as_openai.as_object().unwrap()).expect("decodes");
        let read_anthropic = anthropic::decode_answer(as_anthropic.as_object().unwrap());
        // A stop sequence is `stop` to OpenAI clients, which cannot say which matched.
        let openai_summary = summary(&answer).replace("Some(Sequence)", "Some(EndTurn)");
        assert_eq!(summary(&read_openai), openai_summary, "{name}");
        assert_eq!(summary(&read_anthropic), summary(&answer), "{name}");
    }
}

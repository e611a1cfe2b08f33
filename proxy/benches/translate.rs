//! What translation adds per stream event and per unary call, against the
//! untranslated path (which only rewrites `model`). Inputs are the golden fixtures
//! under `tests/fixtures/translate/`. Prints figures; asserts nothing.
//!
//! `cargo bench -p switchback-proxy --bench translate`

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::BytesMut;
use switchback_proxy::providers::translate::{self, Defaults, Direction, StreamTranslator};
use switchback_proxy::wire::rewrite::{JsonStr, replace_model};
use switchback_proxy::wire::sse::Framer;

const ROUNDS: usize = 20_000;

/// Every pairing with its fixtures folder.
const PAIRINGS: [(&str, Direction); 6] = [
    ("chat-client", Direction::OpenAiToAnthropic),
    ("messages-client", Direction::AnthropicToOpenAi),
    ("chat-client-gemini", Direction::OpenAiToGemini),
    ("messages-client-gemini", Direction::AnthropicToGemini),
    ("chat-client-bedrock", Direction::OpenAiToBedrock),
    ("messages-client-bedrock", Direction::AnthropicToBedrock),
];

/// A Bedrock fixture stream (its events as the proxy reads them) back in the binary
/// AWS event-stream frames ConverseStream sends, one chunk per frame: its translated
/// figure includes reading the frames (the Converse dialect's framer).
fn bedrock_frames(events: &[bytes::Bytes]) -> Vec<bytes::Bytes> {
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    events
        .iter()
        .filter_map(|ev| {
            let f = switchback_proxy::wire::sse::fields(ev);
            let (name, data) = (std::str::from_utf8(f.event?).ok()?, f.data?);
            let v: serde_json::Value = serde_json::from_slice(data).ok()?;
            let (kind, payload, value) = match v.get("error") {
                Some(e) => (
                    "exception",
                    serde_json::json!({"message": e["message"]}),
                    e["type"].as_str()?.to_owned(),
                ),
                None => ("event", v.get(name)?.clone(), name.to_owned()),
            };
            let type_header = if kind == "event" {
                ":event-type"
            } else {
                ":exception-type"
            };
            let m = Message::new(payload.to_string().into_bytes())
                .add_header(Header::new(type_header, HeaderValue::String(value.into())))
                .add_header(Header::new(
                    ":message-type",
                    HeaderValue::String(kind.into()),
                ));
            let mut out = Vec::new();
            write_message_to(&m, &mut out).ok()?;
            Some(bytes::Bytes::from(out))
        })
        .collect()
}

fn fixtures(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/translate")
        .join(sub)
}

fn files(sub: &str, prefix: &str, suffix: &str) -> Vec<Vec<u8>> {
    let mut names: Vec<_> = std::fs::read_dir(fixtures(sub))
        .expect("fixtures")
        .map(|e| {
            e.expect("entry")
                .file_name()
                .into_string()
                .expect("utf-8 name")
        })
        .filter(|n| n.starts_with(prefix) && n.ends_with(suffix))
        .collect();
    names.sort();
    names
        .iter()
        .map(|n| std::fs::read(fixtures(sub).join(n)).expect("read"))
        .collect()
}

fn events(stream: &[u8]) -> Vec<bytes::Bytes> {
    let mut f = Framer::default();
    f.push(stream);
    std::iter::from_fn(|| f.next_event().ok().flatten()).collect()
}

/// Microseconds per item of `run`, over `ROUNDS` rounds of `items` items.
fn micros(items: usize, mut run: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..ROUNDS {
        run();
    }
    start.elapsed().as_secs_f64() * 1e6 / (ROUNDS * items) as f64
}

fn main() {
    let model = JsonStr::new("smart");
    println!("translation cost (release build, one core, {ROUNDS} rounds per figure)\n");
    println!(
        "{:<28} {:>8} {:>12} {:>12} {:>12}",
        "streams", "events", "native µs", "translated", "added µs"
    );
    // chat-client fixtures are Anthropic upstream streams; messages-client are OpenAI
    // ones; the -gemini folders' are Gemini's, the -bedrock folders' Bedrock's (sent
    // as binary event-stream frames: reading them is counted), for each client.
    for (sub, dir) in PAIRINGS {
        let streams: Vec<Vec<bytes::Bytes>> = files(sub, "stream-", ".in.sse")
            .iter()
            .map(|s| events(s))
            .collect();
        let n: usize = streams.iter().map(Vec::len).sum();
        let mut out = BytesMut::with_capacity(8192);
        let native = micros(n, || {
            for s in &streams {
                for ev in s {
                    black_box(replace_model(ev, &model));
                }
            }
        });
        let frames: Vec<Vec<bytes::Bytes>> = streams.iter().map(|s| bedrock_frames(s)).collect();
        let translated = micros(n, || {
            if dir.to_bedrock() {
                for s in &frames {
                    let mut t = StreamTranslator::new(dir, "smart", true);
                    let mut framer = dir.translation().upstream().framer(1 << 20);
                    for frame in s {
                        framer.push(frame);
                        while let Ok(Some(ev)) = framer.next_in_place() {
                            t.event(ev, &mut out);
                            out.clear();
                        }
                    }
                    t.finish(&mut out);
                    out.clear();
                }
                return;
            }
            for s in &streams {
                let mut t = StreamTranslator::new(dir, "smart", true);
                for ev in s {
                    t.event(ev, &mut out);
                    out.clear();
                }
                t.finish(&mut out);
                out.clear();
            }
        });
        println!(
            "{:<28} {:>8} {:>12.2} {:>12.2} {:>12.2}",
            format!("{dir:?}"),
            n,
            native,
            translated,
            translated - native
        );
    }

    println!(
        "\n{:<28} {:>8} {:>12} {:>12} {:>12}",
        "unary (request + response)", "calls", "native µs", "translated", "added µs"
    );
    for (sub, dir) in PAIRINGS {
        let requests = files(sub, "request-", ".in.json");
        let responses = files(sub, "response-", ".in.json");
        let pairs: Vec<(&Vec<u8>, &Vec<u8>)> =
            requests.iter().zip(responses.iter().cycle()).collect();
        let upstream = JsonStr::new("upstream-model");
        let native = micros(pairs.len(), || {
            for (req, resp) in &pairs {
                black_box(replace_model(req, &upstream));
                black_box(replace_model(resp, &model));
            }
        });
        let defaults = Defaults::default();
        let translated = micros(pairs.len(), || {
            for (req, resp) in &pairs {
                let _ = black_box(translate::request(dir, req, "upstream-model", &defaults));
                let _ = black_box(translate::response(dir, resp, "smart"));
            }
        });
        println!(
            "{:<28} {:>8} {:>12.2} {:>12.2} {:>12.2}",
            format!("{dir:?}"),
            pairs.len(),
            native,
            translated,
            translated - native
        );
    }

    // Claude on Vertex for an Anthropic client: no translation, but the body is
    // parsed and written again (`model` out, `anthropic_version` in) where a native
    // target only has its model replaced in place.
    println!(
        "\n{:<28} {:>8} {:>12} {:>12} {:>12}",
        "vertex claude request", "calls", "native µs", "rewritten", "added µs"
    );
    let requests = files("messages-client", "request-", ".in.json");
    let upstream = JsonStr::new("upstream-model");
    let native = micros(requests.len(), || {
        for req in &requests {
            black_box(replace_model(req, &upstream));
        }
    });
    let rewritten = micros(requests.len(), || {
        for req in &requests {
            black_box(switchback_proxy::providers::vertex::anthropic_body(req));
        }
    });
    println!(
        "{:<28} {:>8} {:>12.2} {:>12.2} {:>12.2}",
        "AnthropicToVertexClaude",
        requests.len(),
        native,
        rewritten,
        rewritten - native
    );
}

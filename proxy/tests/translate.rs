//! OpenAI <-> Anthropic translation against golden fixtures
//! (`tests/fixtures/translate/`, see its README), plus a property test that
//! streams split at random byte boundaries translate exactly like whole ones.
//!
//! `SWITCHBACK_BLESS=1 cargo test -p switchback-proxy --test translate` rewrites the
//! expected files from the current output (review the diff before keeping it).

use std::path::{Path, PathBuf};

use bytes::BytesMut;
use proptest::prelude::*;
use serde_json::{Value, json};
use switchback_crds::config::Provider;
use switchback_proxy::providers::translate::{self, Defaults, Direction, StreamTranslator};
use switchback_proxy::wire::sse::{self, Framer};
use switchback_proxy::wire::surface::{Surface, Wire};

const CREATED: u64 = 1_700_000_000;
const CLIENT_MODEL: &str = "smart";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate")
}

fn dirs() -> [(&'static str, Direction, &'static str); 6] {
    [
        (
            "chat-client",
            Direction::OpenAiToAnthropic,
            "claude-sonnet-4-5",
        ),
        ("messages-client", Direction::AnthropicToOpenAi, "gpt-4o"),
        (
            "chat-client-gemini",
            Direction::OpenAiToGemini,
            "gemini-2.5-flash",
        ),
        (
            "messages-client-gemini",
            Direction::AnthropicToGemini,
            "gemini-2.5-flash",
        ),
        (
            "chat-client-bedrock",
            Direction::OpenAiToBedrock,
            "anthropic.claude-3-5-sonnet-20240620-v1:0",
        ),
        (
            "messages-client-bedrock",
            Direction::AnthropicToBedrock,
            "anthropic.claude-3-5-sonnet-20240620-v1:0",
        ),
    ]
}

/// Bedrock answers carry no id: the proxy makes a fresh one per answer, which the
/// comparison reads as `<fresh>` (`chatcmpl-` / `msg_` and 32 hex digits).
fn fresh_ids(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "id"
                    && let Some(s) = x.as_str()
                    && let Some(hex) = s
                        .strip_prefix("chatcmpl-")
                        .or_else(|| s.strip_prefix("msg_"))
                    && hex.len() == 32
                    && hex.bytes().all(|b| b.is_ascii_hexdigit())
                {
                    *x = Value::String("<fresh>".into());
                } else {
                    fresh_ids(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(fresh_ids),
        _ => {}
    }
}

fn bless() -> bool {
    std::env::var_os("SWITCHBACK_BLESS").is_some()
}

fn opts(dir: &Path, name: &str) -> Value {
    std::fs::read(dir.join(format!("{name}.opts.json")))
        .map(|b| serde_json::from_slice(&b).expect("opts file is JSON"))
        .unwrap_or(Value::Null)
}

/// One SSE event as (event name, data), data parsed when it is JSON.
fn sse_events(text: &[u8]) -> Vec<(Option<String>, Value)> {
    let mut framer = Framer::default();
    framer.push(text);
    let mut out = Vec::new();
    while let Some(ev) = framer.next_event().unwrap().or_else(|| framer.take_rest()) {
        let f = sse::fields(&ev);
        let Some(data) = f.data else { continue };
        let data = serde_json::from_slice(data)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(data).into_owned()));
        let mut data = data;
        fresh_ids(&mut data);
        out.push((
            f.event.map(|e| String::from_utf8_lossy(e).into_owned()),
            data,
        ));
    }
    out
}

enum Got {
    Json(Value),
    Sse(Vec<u8>),
}

/// Run one fixture; returns (expected file, what the code produced).
fn run_case(dir: &Path, direction: Direction, upstream_model: &str, file: &str) -> (PathBuf, Got) {
    let (name, ext) = file.split_once(".in.").expect("an .in. file");
    let input = std::fs::read(dir.join(file)).unwrap();
    let o = opts(dir, name);
    let kind = name.split('-').next().unwrap_or("");
    match kind {
        "request" => {
            let defaults = Defaults {
                max_tokens: o["max_tokens"].as_u64().map_or(4096, |n| n as u32),
                openai_max_completion_tokens: o["openai_max_completion_tokens"] == true,
                anthropic_on_vertex: o["anthropic_on_vertex"] == true,
            };
            let got = translate::request(direction, &input, upstream_model, &defaults)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            (
                dir.join(format!("{name}.out.json")),
                Got::Json(serde_json::from_slice(&got).unwrap()),
            )
        }
        "reject" => {
            let err = translate::request(direction, &input, upstream_model, &Defaults::default())
                .expect_err(file);
            (
                dir.join(format!("{name}.error.json")),
                Got::Json(json!({
                    "status": err.status(),
                    "param": err.param(),
                    "message": err.message(),
                })),
            )
        }
        "response" => {
            let got = translate::response_at(direction, &input, CLIENT_MODEL, CREATED)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            (
                dir.join(format!("{name}.out.json")),
                Got::Json(serde_json::from_slice(&got).unwrap()),
            )
        }
        "error" => {
            let status = o["status"].as_u64().expect("error fixtures set a status") as u16;
            let got = translate::error(direction, status, &input);
            (
                dir.join(format!("{name}.out.json")),
                Got::Json(serde_json::from_slice(&got).unwrap()),
            )
        }
        "stream" => {
            assert_eq!(ext, "sse", "{file}");
            let got = translate_chunks(direction, o["include_usage"] == true, &[&input]);
            (dir.join(format!("{name}.out.sse")), Got::Sse(got.to_vec()))
        }
        other => panic!("{file}: unknown fixture kind {other:?}"),
    }
}

#[test]
fn golden_fixtures() {
    let mut failures = Vec::new();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for (sub, direction, upstream_model) in dirs() {
        let dir = fixtures().join(sub);
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|f| f.contains(".in."))
            .collect();
        files.sort();
        for file in files {
            let (expected_path, got) = run_case(&dir, direction, upstream_model, &file);
            *counts
                .entry(format!("{sub}/{}", file.split('-').next().unwrap()))
                .or_default() += 1;
            if bless() {
                let bytes = match &got {
                    Got::Json(v) => {
                        let mut b = serde_json::to_vec_pretty(v).unwrap();
                        b.push(b'\n');
                        b
                    }
                    Got::Sse(b) => b.clone(),
                };
                std::fs::write(&expected_path, bytes).unwrap();
                continue;
            }
            let expected = std::fs::read(&expected_path)
                .unwrap_or_else(|_| panic!("missing {}", expected_path.display()));
            let same = match &got {
                Got::Json(v) => {
                    let (mut v, mut e) =
                        (v.clone(), serde_json::from_slice::<Value>(&expected).ok());
                    fresh_ids(&mut v);
                    e.iter_mut().for_each(fresh_ids);
                    e.as_ref() == Some(&v)
                }
                Got::Sse(b) => sse_events(b) == sse_events(&expected),
            };
            if !same {
                let shown = match got {
                    Got::Json(v) => serde_json::to_string_pretty(&v).unwrap(),
                    Got::Sse(b) => String::from_utf8_lossy(&b).into_owned(),
                };
                failures.push(format!("{sub}/{file}: got\n{shown}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // Every mapping has fixtures in both directions.
    for (sub, ..) in dirs() {
        for kind in ["request", "reject", "response", "stream", "error"] {
            let n = counts.get(&format!("{sub}/{kind}")).copied().unwrap_or(0);
            assert!(n >= 3, "{sub}: only {n} {kind} fixtures");
        }
    }
}

/// Each upstream event yields its client events at once: the text of a delta is in
/// the output as soon as that one event has been fed in.
#[test]
fn streams_are_not_buffered() {
    for (sub, direction, _) in dirs() {
        let input = std::fs::read(fixtures().join(sub).join("stream-text.in.sse")).unwrap();
        let mut t = StreamTranslator::new(direction, CLIENT_MODEL, false);
        let mut framer = Framer::default();
        framer.push(&input);
        let mut saw_text = 0;
        while let Some(ev) = framer.next_event().unwrap() {
            let mut out = BytesMut::new();
            t.event(&ev, &mut out);
            let needle: &[u8] = b"Hello";
            if memchr_find(&ev, needle) {
                saw_text += 1;
                assert!(memchr_find(&out, needle), "{sub}: delta held back");
                // Every client event is complete.
                assert!(out.ends_with(b"\n\n"), "{sub}");
            }
        }
        assert_eq!(saw_text, 1, "{sub}");
    }
}

fn memchr_find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn translated_streams_parse_as_the_client_expects() {
    // OpenAI client: every data line is a chunk with the client's model, then [DONE].
    let input = std::fs::read(fixtures().join("chat-client/stream-usage-tool-use.in.sse")).unwrap();
    let out = translate_chunks(Direction::OpenAiToAnthropic, true, &[&input]);
    let events = sse_events(&out);
    let (last, chunks) = events.split_last().unwrap();
    assert_eq!(last.1, "[DONE]");
    for (name, chunk) in chunks {
        assert!(name.is_none());
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], CLIENT_MODEL);
        assert_eq!(chunk["id"], chunks[0].1["id"]);
    }
    let args: String = chunks
        .iter()
        .filter_map(|(_, c)| {
            c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
        })
        .collect();
    assert_eq!(
        args,
        r#"{"location": "San Francisco, CA", "unit": "fahrenheit"}{}"#
    );
    // Anthropic client: named events whose data type matches the name.
    let input = std::fs::read(fixtures().join("messages-client/stream-tool-calls.in.sse")).unwrap();
    let out = translate_chunks(Direction::AnthropicToOpenAi, false, &[&input]);
    let events = sse_events(&out);
    for (name, data) in &events {
        assert_eq!(name.as_deref(), data["type"].as_str());
    }
    assert_eq!(events[0].1["message"]["model"], CLIENT_MODEL);
    assert_eq!(events.last().unwrap().0.as_deref(), Some("message_stop"));
}

#[test]
fn in_band_errors_stay_errors_after_translation() {
    for (sub, direction, _) in dirs() {
        let input = std::fs::read(fixtures().join(sub).join("stream-error.in.sse")).unwrap();
        let out = translate_chunks(direction, false, &[&input]);
        let mut framer = Framer::default();
        framer.push(&out);
        let mut last = None;
        while let Some(ev) = framer.next_event().unwrap() {
            last = Some(ev);
        }
        let e = sse::error_event(&last.unwrap()).expect("ends with an error event");
        // Overloaded (529) and server_error (500) both stay 5xx-class on the client side.
        assert!(e.status >= 500, "{sub}: {}", e.status);
    }
}

#[test]
fn context_length_errors_still_classify_after_translation() {
    let [
        (chat, to_anthropic, _),
        (messages, to_openai, _),
        (chat_gemini, openai_to_gemini, _),
        (messages_gemini, anthropic_to_gemini, _),
        (chat_bedrock, openai_to_bedrock, _),
        (messages_bedrock, anthropic_to_bedrock, _),
    ] = dirs();
    for (sub, direction, name) in [
        (chat, to_anthropic, "error-context-length.in.json"),
        (messages, to_openai, "error-context-length.in.json"),
        (messages, to_openai, "error-vllm-context.in.json"),
        (
            chat_gemini,
            openai_to_gemini,
            "error-context-length.in.json",
        ),
        (
            messages_gemini,
            anthropic_to_gemini,
            "error-context-length.in.json",
        ),
        (
            chat_bedrock,
            openai_to_bedrock,
            "error-context-length.in.json",
        ),
        (
            messages_bedrock,
            anthropic_to_bedrock,
            "error-context-length.in.json",
        ),
    ] {
        let path = fixtures().join(sub).join(name);
        let body = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(switchback_proxy::providers::classify::is_context_length(
            &body
        ));
        let out = translate::error(direction, 400, &body);
        assert!(
            switchback_proxy::providers::classify::is_context_length(&out),
            "{sub}: {}",
            String::from_utf8_lossy(&out)
        );
    }
}

#[test]
fn translate_errors_render_in_the_client_shape() {
    let err = translate::request(
        Direction::OpenAiToAnthropic,
        br#"{"model":"m","messages":[],"n":3}"#,
        "claude",
        &Defaults::default(),
    )
    .unwrap_err();
    assert_eq!(err.status(), 400);
    assert_eq!(err.param(), Some("n"));
    let v: Value = serde_json::from_slice(&err.body(Wire::OpenAi)).unwrap();
    assert_eq!(v["error"]["param"], "n");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "unsupported_parameter");
    assert_eq!(
        v["error"]["message"],
        "n > 1 cannot be served by an Anthropic target"
    );
    let v: Value = serde_json::from_slice(&err.body(Wire::Anthropic)).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    // Bad upstream output is a 502.
    let err = translate::response(
        Direction::AnthropicToOpenAi,
        br#"{"id":"x","choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{oops"}}]}}]}"#,
        "m",
    )
    .unwrap_err();
    assert_eq!(err.status(), 502);
    assert!(
        translate::request(
            Direction::AnthropicToOpenAi,
            b"not json",
            "m",
            &Defaults::default()
        )
        .is_err()
    );
}

/// Assistant turns in an Anthropic client's history become OpenAI assistant messages
/// by the same rules as answers: text joined, tool calls kept, thinking left out; a
/// block with no chat completions form is refused with its path.
#[test]
fn assistant_history_blocks_are_kept_dropped_or_refused() {
    let body = br#"{"model":"m","max_tokens":10,"messages":[
        {"role":"user","content":"hi"},
        {"role":"assistant","content":[
            {"type":"thinking","thinking":"hmm","signature":"s"},
            {"type":"text","text":"Let me "},
            {"type":"text","text":"look."},
            {"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]}"#;
    let out = translate::request(
        Direction::AnthropicToOpenAi,
        body,
        "gpt",
        &Defaults::default(),
    )
    .expect("translates");
    let v: Value = serde_json::from_slice(&out).unwrap();
    let assistant = &v["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["content"], "Let me look.");
    assert_eq!(assistant["tool_calls"][0]["id"], "t1");
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        r#"{"a":1}"#
    );

    let body = br#"{"model":"m","max_tokens":10,"messages":[
        {"role":"user","content":"hi"},
        {"role":"assistant","content":[{"type":"text","text":"x"},{"type":"server_tool_use","id":"s","name":"web_search","input":{}}]}]}"#;
    let err = translate::request(
        Direction::AnthropicToOpenAi,
        body,
        "gpt",
        &Defaults::default(),
    )
    .unwrap_err();
    assert_eq!(err.status(), 400);
    assert_eq!(err.param(), Some("messages[1].content[1].type"));
}

#[test]
fn directions_follow_surface_and_provider() {
    use Direction::*;
    assert_eq!(
        Direction::for_target(Surface::ChatCompletions, Provider::Anthropic),
        Some(OpenAiToAnthropic)
    );
    assert_eq!(
        Direction::for_target(Surface::Messages, Provider::Openai),
        Some(AnthropicToOpenAi)
    );
    assert_eq!(
        Direction::for_target(Surface::Messages, Provider::OpenaiCompatible),
        Some(AnthropicToOpenAi)
    );
    assert_eq!(
        Direction::for_target(Surface::ChatCompletions, Provider::Openai),
        None
    );
    assert_eq!(
        Direction::for_target(Surface::Messages, Provider::Anthropic),
        None
    );
    assert_eq!(
        Direction::for_target(Surface::Embeddings, Provider::Anthropic),
        None
    );
    assert_eq!(
        OpenAiToAnthropic.upstream_surface(),
        Some(Surface::Messages)
    );
    assert_eq!(
        AnthropicToOpenAi.upstream_surface(),
        Some(Surface::ChatCompletions)
    );
    assert_eq!(OpenAiToAnthropic.client_wire(), Wire::OpenAi);
    assert_eq!(AnthropicToOpenAi.upstream_wire(), Some(Wire::OpenAi));
    // Gemini answers both surfaces; it is no surface itself (its URL names the
    // model and the method), and embeddings on it have no translation.
    assert_eq!(
        Direction::for_target(Surface::ChatCompletions, Provider::Gemini),
        Some(OpenAiToGemini)
    );
    assert_eq!(
        Direction::for_target(Surface::Messages, Provider::Gemini),
        Some(AnthropicToGemini)
    );
    assert_eq!(
        Direction::for_target(Surface::Embeddings, Provider::Gemini),
        None
    );
    assert_eq!(AnthropicToGemini.client_wire(), Wire::Anthropic);
    assert_eq!(OpenAiToGemini.upstream_wire(), None);
    assert_eq!(OpenAiToGemini.upstream_surface(), None);
}

#[test]
fn include_usage_is_read_from_the_client_body() {
    assert!(translate::include_usage(
        br#"{"stream":true,"stream_options":{"include_usage":true}}"#
    ));
    assert!(!translate::include_usage(br#"{"stream":true}"#));
    assert!(!translate::include_usage(b"nonsense"));
}

/// Every recorded-style upstream stream in the fixtures, with its direction.
fn recorded_streams() -> Vec<(Direction, bool, Vec<u8>)> {
    let mut out = Vec::new();
    for (sub, direction, _) in dirs() {
        let dir = fixtures().join(sub);
        for e in std::fs::read_dir(&dir).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if let Some(stem) = name.strip_suffix(".in.sse") {
                let usage = opts(&dir, stem)["include_usage"] == true;
                out.push((direction, usage, std::fs::read(dir.join(&name)).unwrap()));
            }
        }
    }
    out.sort_by(|a, b| a.2.cmp(&b.2));
    assert!(out.len() >= 8);
    out
}

/// A provider's numbers are not trusted: a block index no table could hold and token
/// counts that overflow when summed translate without a panic or a giant allocation.
#[test]
fn absurd_provider_numbers_in_a_stream_do_not_panic() {
    let max = u64::MAX;
    let input = format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_1\",\"model\":\"m\",\"usage\":{{\"input_tokens\":{max},\"cache_read_input_tokens\":{max},\"cache_creation_input_tokens\":{max},\"output_tokens\":1}}}}}}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":{max},\"content_block\":{{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{{}}}}}}\n\n\
         event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":{max},\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{{}}\"}}}}\n\n\
         event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"tool_use\"}},\"usage\":{{\"output_tokens\":{max}}}}}\n\n\
         event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
    );
    let out = translate_chunks(Direction::OpenAiToAnthropic, true, &[input.as_bytes()]);
    let events = sse_events(&out);
    let usage = events
        .iter()
        .find_map(|(_, c)| c.get("usage").filter(|u| u.is_object()))
        .expect("a usage chunk");
    assert_eq!(usage["prompt_tokens"], max);
    assert_eq!(usage["total_tokens"], max);
    assert!(out.len() < 64 * 1024);
}

/// Feed `chunks` through a framer and a translator, as the proxy does.
/// A tool that takes no arguments, streamed by Gemini (`"args": {}`), Anthropic
/// (`input: {}` and an empty `input_json_delta`) and Bedrock (an empty `toolUse`
/// input): an OpenAI client's arguments are `{}` (what OpenAI sends, and what
/// `json.loads` takes), never the empty string.
#[test]
fn a_tool_call_without_arguments_streams_to_openai_clients_as_an_empty_object() {
    for (sub, direction) in [
        ("chat-client", Direction::OpenAiToAnthropic),
        ("chat-client-gemini", Direction::OpenAiToGemini),
        ("chat-client-bedrock", Direction::OpenAiToBedrock),
    ] {
        let input = std::fs::read(fixtures().join(sub).join("stream-tool-no-args.in.sse")).unwrap();
        let out = translate_chunks(direction, false, &[&input]);
        let events = sse_events(&out);
        let calls: Vec<&Value> = events
            .iter()
            .filter_map(|(_, c)| {
                c["choices"][0]["delta"]["tool_calls"][0]
                    .as_object()
                    .map(|_| c)
            })
            .collect();
        assert!(
            !calls.is_empty(),
            "{sub}: {}",
            String::from_utf8_lossy(&out)
        );
        let call = &calls[0]["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_time", "{sub}");
        let args: String = calls
            .iter()
            .filter_map(|c| {
                c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
            })
            .collect();
        assert_eq!(args, "{}", "{sub}: {}", String::from_utf8_lossy(&out));
        // Every chunk of the call names it by the same index.
        assert!(
            calls
                .iter()
                .all(|c| c["choices"][0]["delta"]["tool_calls"][0]["index"] == 0)
        );
    }
}

fn translate_chunks(direction: Direction, usage: bool, chunks: &[&[u8]]) -> BytesMut {
    let mut t = StreamTranslator::new(direction, CLIENT_MODEL, usage).with_created(CREATED);
    let mut framer = Framer::default();
    let mut out = BytesMut::new();
    for c in chunks {
        framer.push(c);
        while let Some(ev) = framer.next_event().unwrap() {
            t.event(&ev, &mut out);
        }
    }
    if let Some(rest) = framer.take_rest() {
        t.event(&rest, &mut out);
    }
    t.finish(&mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Split at random byte boundaries (and optionally with CRLF line endings), a
    /// stream translates to exactly what the whole stream does.
    #[test]
    fn split_streams_translate_like_whole_ones(
        which in 0usize..64,
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
        crlf in any::<bool>(),
    ) {
        let streams = recorded_streams();
        let (direction, usage, input) = &streams[which % streams.len()];
        let whole = translate_chunks(*direction, *usage, &[input]);
        let input: Vec<u8> = if crlf {
            String::from_utf8(input.clone()).unwrap().replace('\n', "\r\n").into_bytes()
        } else {
            input.clone()
        };
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(input.len() + 1)).collect();
        at.push(0);
        at.push(input.len());
        at.sort_unstable();
        at.dedup();
        let chunks: Vec<&[u8]> = at.windows(2).map(|w| &input[w[0]..w[1]]).collect();
        let split = translate_chunks(*direction, *usage, &chunks);
        if direction.to_bedrock() {
            // Each translation makes its own answer id (Bedrock gives none).
            prop_assert_eq!(sse_events(&split), sse_events(&whole));
        } else {
            prop_assert_eq!(String::from_utf8_lossy(&split), String::from_utf8_lossy(&whole));
        }
    }
}

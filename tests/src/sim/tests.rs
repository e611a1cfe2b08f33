//! Drives every behaviour with a plain reqwest client, over real loopback sockets.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::{Instant, timeout};

use super::*;

/// Generous bound for things that must happen promptly; with a paused clock it only
/// fires when the runtime is otherwise idle, i.e. when the awaited thing never happens.
const SOON: Duration = Duration::from_secs(30);

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn post(sim: &SimProvider, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("http://{}{path}", sim.addr()))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request")
}

async fn json_of(resp: reqwest::Response) -> Value {
    serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json body")
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

fn chat_stream(model: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

fn message(model: &str) -> Value {
    json!({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
}

fn message_stream(model: &str) -> Value {
    json!({"model": model, "max_tokens": 64, "stream": true,
           "messages": [{"role": "user", "content": "hi"}]})
}

/// Splits an SSE body into (event name, data) pairs.
fn parse_sse(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut event = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    event = Some(v.to_owned());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            (event, data)
        })
        .collect()
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers()
        .get(name)
        .unwrap_or_else(|| panic!("missing header {name}"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn openai_answer_is_a_chat_completion_echoing_the_model() {
    let sim = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let resp = client()
        .post(sim.endpoint())
        .header("authorization", "Bearer sk-test")
        .header("x-custom", "42")
        .header("content-type", "application/json")
        .body(chat("gpt-4o").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "content-type"), "application/json");
    assert_eq!(header(&resp, "x-request-id"), "req_sim_1");
    let body = json_of(resp).await;
    assert_eq!(body, openai_completion("gpt-4o", "Hello from primary."));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["total_tokens"], 13);

    let got = sim.received();
    assert_eq!(got.len(), 1);
    assert_eq!(sim.hits(), 1);
    assert_eq!(got[0].method, Method::POST);
    assert_eq!(got[0].path, "/v1/chat/completions");
    assert_eq!(got[0].header("authorization"), Some("Bearer sk-test"));
    assert_eq!(got[0].header("x-custom"), Some("42"));
    assert_eq!(got[0].model(), Some("gpt-4o"));
    assert_eq!(got[0].json.as_ref(), Some(&chat("gpt-4o")));
    assert_eq!(got[0].body, chat("gpt-4o").to_string().as_bytes());
    assert_eq!(sim.cancelled(), 0);
}

#[tokio::test]
async fn anthropic_answer_is_a_message() {
    let sim = SimProvider::start_named("claude-sim", Flavor::Anthropic).await;
    assert!(sim.base_url().starts_with("http://127.0.0.1:"));
    assert!(sim.base_url().ends_with("/v1"));
    let resp = post(&sim, "/v1/messages", &message("claude-sonnet-4-5")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "request-id"), "req_sim_1");
    let body = json_of(resp).await;
    assert_eq!(
        body,
        anthropic_message("claude-sonnet-4-5", "Hello from claude-sim.")
    );
    assert_eq!(body["type"], "message");
    assert_eq!(body["content"][0]["type"], "text");
    assert_eq!(body["stop_reason"], "end_turn");
}

#[tokio::test]
async fn embeddings_models_and_unknown_paths() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let body = json_of(
        post(
            &sim,
            "/v1/embeddings",
            &json!({"model": "text-embedding-3-small", "input": ["a", "b"]}),
        )
        .await,
    )
    .await;
    assert_eq!(body, openai_embeddings("text-embedding-3-small", 2));
    assert_eq!(
        body["data"][1]["embedding"].as_array().unwrap().len(),
        EMBEDDING_DIMS
    );

    let one = json_of(
        post(
            &sim,
            "/v1/embeddings",
            &json!({"model": "e", "input": [1, 2, 3]}),
        )
        .await,
    )
    .await;
    assert_eq!(one["data"].as_array().unwrap().len(), 1);

    let resp = client()
        .get(format!("{}/models", sim.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        json_of(resp).await,
        models_list(Flavor::OpenAi, &SIM_MODELS)
    );

    // Wrong surface for the flavor: 404 in the flavor's shape, and still recorded.
    let resp = post(&sim, "/v1/messages", &message("m")).await;
    assert_eq!(resp.status(), 404);
    assert_eq!(json_of(resp).await, error_body(Flavor::OpenAi, 404));
    let paths: Vec<_> = sim.received().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/v1/embeddings",
            "/v1/embeddings",
            "/v1/models",
            "/v1/messages"
        ]
    );

    let anthropic = SimProvider::start(Flavor::Anthropic).await;
    let resp = post(&anthropic, "/v1/chat/completions", &chat("m")).await;
    assert_eq!(resp.status(), 404);
    assert_eq!(json_of(resp).await["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn answer_streams_when_the_request_asks() {
    let sim = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let req = json!({"model": "gpt-4o", "stream": true, "stream_options": {"include_usage": true},
                     "messages": []});
    let resp = post(&sim, "/v1/chat/completions", &req).await;
    assert_eq!(resp.status(), 200);
    assert!(header(&resp, "content-type").starts_with("text/event-stream"));
    let text = resp.text().await.unwrap();
    let pieces = split_words("Hello from primary.");
    assert_eq!(text, openai_stream_events("gpt-4o", &pieces, true).concat());

    let events = parse_sse(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert!(chunks.iter().all(|c| c["model"] == "gpt-4o"));
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Hello from primary.");
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(chunks[chunks.len() - 1]["choices"], json!([]));
    assert_eq!(chunks[chunks.len() - 1]["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn anthropic_stream_has_the_real_event_sequence() {
    let sim = SimProvider::start_named("b", Flavor::Anthropic).await;
    sim.push(Behavior::Stream {
        chunks: 2,
        interval: Duration::ZERO,
    });
    let resp = post(&sim, "/v1/messages", &message_stream("claude-x")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "content-type"), "text/event-stream");
    let text = resp.text().await.unwrap();
    let events = parse_sse(&text);
    let names: Vec<_> = events.iter().map(|(e, _)| e.clone().unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for (name, data) in &events {
        let data: Value = serde_json::from_str(data).unwrap();
        assert_eq!(&data["type"], name.as_deref().unwrap());
    }
    let start: Value = serde_json::from_str(&events[0].1).unwrap();
    assert_eq!(start["message"]["model"], "claude-x");
    let text: String = events
        .iter()
        .filter(|(e, _)| e.as_deref() == Some("content_block_delta"))
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["delta"]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(text, stream_pieces("b", 2).concat());

    // Answer on a streaming request streams the answer text.
    let text = post(&sim, "/v1/messages", &message_stream("claude-x"))
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(
        text,
        anthropic_stream_events("claude-x", &split_words("Hello from b.")).concat()
    );
}

/// Each event arrives as its own chunk, `interval` apart: nothing is buffered.
#[tokio::test(start_paused = true)]
async fn stream_events_arrive_incrementally() {
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        let sim = SimProvider::start_named("p", flavor).await;
        let interval = Duration::from_secs(1);
        sim.push(Behavior::Stream {
            chunks: 3,
            interval,
        });
        let body = match flavor {
            Flavor::OpenAi | Flavor::Azure | Flavor::Gemini | Flavor::Vertex | Flavor::Bedrock => {
                chat_stream("m")
            }
            Flavor::Anthropic => message_stream("m"),
        };
        let start = Instant::now();
        let mut resp = client()
            .post(sim.endpoint())
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let mut arrivals = Vec::new();
        while let Some(chunk) = resp.chunk().await.unwrap() {
            arrivals.push((start.elapsed(), chunk));
        }
        let expected = match flavor {
            Flavor::OpenAi | Flavor::Azure | Flavor::Gemini | Flavor::Vertex | Flavor::Bedrock => {
                openai_stream_events("m", &stream_pieces("p", 3), false)
            }
            Flavor::Anthropic => anthropic_stream_events("m", &stream_pieces("p", 3)),
        };
        assert_eq!(
            arrivals.len(),
            expected.len(),
            "{flavor:?}: one chunk per event"
        );
        for (k, ((at, chunk), event)) in arrivals.iter().zip(&expected).enumerate() {
            assert_eq!(chunk, event.as_bytes(), "{flavor:?} event {k}");
            // Event k cannot be sent before k intervals passed; the clock is paused,
            // so it arrives exactly then.
            assert_eq!(*at, interval * k as u32, "{flavor:?} event {k}");
        }
        assert_eq!(sim.cancelled(), 0);
    }
}

#[tokio::test]
async fn error_statuses_have_flavor_shaped_bodies() {
    let oa = SimProvider::start(Flavor::OpenAi).await;
    oa.push(Behavior::RateLimited {
        retry_after_secs: 7,
    });
    oa.push(Behavior::ServerError(503));
    oa.push(Behavior::Status {
        status: 418,
        body: Some("teapot".into()),
        retry_after: Some("3".into()),
    });
    oa.push(Behavior::Status {
        status: 401,
        body: None,
        retry_after: None,
    });

    let resp = post(&oa, "/v1/chat/completions", &chat("m")).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(header(&resp, "retry-after"), "7");
    let body = json_of(resp).await;
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(body, error_body(Flavor::OpenAi, 429));

    let resp = post(&oa, "/v1/chat/completions", &chat("m")).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(json_of(resp).await["error"]["type"], "server_error");

    let resp = post(&oa, "/v1/chat/completions", &chat("m")).await;
    assert_eq!(resp.status(), 418);
    assert_eq!(header(&resp, "retry-after"), "3");
    assert!(header(&resp, "content-type").starts_with("text/plain"));
    assert_eq!(resp.text().await.unwrap(), "teapot");

    let resp = post(&oa, "/v1/chat/completions", &chat("m")).await;
    assert_eq!(resp.status(), 401);
    assert_eq!(json_of(resp).await["error"]["code"], "invalid_api_key");

    let an = SimProvider::start(Flavor::Anthropic).await;
    an.push(Behavior::ServerError(529));
    an.push(Behavior::RateLimited {
        retry_after_secs: 1,
    });
    let resp = post(&an, "/v1/messages", &message("m")).await;
    assert_eq!(resp.status(), 529);
    assert_eq!(
        json_of(resp).await,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );
    let resp = post(&an, "/v1/messages", &message("m")).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(header(&resp, "retry-after"), "1");
    assert_eq!(json_of(resp).await["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn context_length_wordings() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    for wording in [
        ContextWording::OpenAi,
        ContextWording::Anthropic,
        ContextWording::Vllm,
        ContextWording::Gemini,
    ] {
        sim.push(Behavior::ContextLength(wording));
        let resp = post(&sim, "/v1/chat/completions", &chat("m")).await;
        assert_eq!(resp.status(), 400);
        let body = json_of(resp).await;
        assert_eq!(body, context_length_error(wording));
        match wording {
            ContextWording::OpenAi => {
                assert_eq!(body["error"]["code"], "context_length_exceeded")
            }
            ContextWording::Anthropic => assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("prompt is too long")
            ),
            ContextWording::Vllm => {
                assert!(!body["error"]["code"].is_string());
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("maximum context length")
                );
            }
            ContextWording::Gemini => {
                assert_eq!(body["error"]["status"], "INVALID_ARGUMENT");
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("exceeds the maximum number of tokens")
                );
            }
        }
    }
}

#[tokio::test]
async fn stream_error_first() {
    let an = SimProvider::start(Flavor::Anthropic).await;
    an.push(Behavior::StreamErrorFirst);
    let resp = post(&an, "/v1/messages", &message_stream("m")).await;
    assert_eq!(resp.status(), 200);
    let events = parse_sse(&resp.text().await.unwrap());
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0.as_deref(), Some("error"));
    let data: Value = serde_json::from_str(&events[0].1).unwrap();
    assert_eq!(data["type"], "error");
    assert_eq!(data["error"]["type"], "overloaded_error");

    let oa = SimProvider::start(Flavor::OpenAi).await;
    oa.push(Behavior::StreamErrorFirst);
    let resp = post(&oa, "/v1/chat/completions", &chat_stream("m")).await;
    assert_eq!(resp.status(), 200);
    let events = parse_sse(&resp.text().await.unwrap());
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, None);
    let data: Value = serde_json::from_str(&events[0].1).unwrap();
    assert_eq!(data["error"]["type"], "server_error");
}

#[tokio::test]
async fn reset_is_a_transport_error_not_a_status() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    sim.push(Behavior::Reset);
    let client = client();
    let err = client
        .post(sim.endpoint())
        .body(chat("m").to_string())
        .send()
        .await
        .expect_err("a reset must not produce a response");
    // The connection was made and the request sent; no response head came back
    // (hyper: IncompleteMessage).
    assert!(err.is_request(), "{err:?}");
    assert!(err.status().is_none());
    assert!(!err.is_timeout());
    // Recorded on arrival, and the next request (new connection) is answered.
    assert_eq!(sim.hits(), 1);
    assert_eq!(sim.received()[0].model(), Some("m"));
    let resp = client
        .post(sim.endpoint())
        .body(chat("m").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(sim.cancelled(), 0);
}

#[tokio::test(start_paused = true)]
async fn hang_is_cancelled_when_the_client_goes_away() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    sim.push(Behavior::Hang);
    let url = sim.endpoint();
    let request =
        tokio::spawn(async move { client().post(url).body(chat("m").to_string()).send().await });
    timeout(SOON, sim.wait_hits(1))
        .await
        .expect("request arrives");
    // Hanging is not answering: the clock can run on and nothing comes back.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!request.is_finished());
    assert_eq!(sim.cancelled(), 0);
    request.abort();
    timeout(SOON, sim.wait_cancelled(1))
        .await
        .expect("handler dropped after the client went away");
    assert_eq!(sim.cancelled(), 1);
}

#[tokio::test(start_paused = true)]
async fn delay_then_behave() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    sim.push(Behavior::ServerError(502).after(Duration::from_secs(5)));
    let start = Instant::now();
    let resp = post(&sim, "/v1/chat/completions", &chat("m")).await;
    assert_eq!(resp.status(), 502);
    assert!(start.elapsed() >= Duration::from_secs(5));
    // Recorded on arrival, before the delay ran out.
    sim.push(Behavior::Delay(
        Duration::from_secs(60),
        Box::new(Behavior::Answer),
    ));
    let url = sim.endpoint();
    let request = tokio::spawn(async move {
        client()
            .post(url)
            .body(chat("late").to_string())
            .send()
            .await
    });
    timeout(SOON, sim.wait_hits(2)).await.unwrap();
    assert_eq!(sim.received()[1].model(), Some("late"));
    request.abort();
    timeout(SOON, sim.wait_cancelled(1)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn stall_mid_stream_sends_some_events_then_nothing() {
    let sim = SimProvider::start(Flavor::Anthropic).await;
    sim.push(Behavior::StallMidStream { chunks: 2 });
    let mut resp = post(&sim, "/v1/messages", &message_stream("m")).await;
    assert_eq!(resp.status(), 200);
    let expected = anthropic_stream_events("m", &stream_pieces("sim", 2));
    for event in &expected[..2] {
        let chunk = resp.chunk().await.unwrap().expect("an event");
        assert_eq!(chunk, event.as_bytes());
    }
    // No end, no error: the stream just stops. (Timeout under a paused clock: fires
    // only once everything is idle.)
    assert!(
        timeout(Duration::from_secs(600), resp.chunk())
            .await
            .is_err()
    );
    assert_eq!(sim.cancelled(), 0);
    drop(resp);
    timeout(SOON, sim.wait_cancelled(1))
        .await
        .expect("stream body dropped after the client went away");
}

#[tokio::test]
async fn break_mid_stream_is_a_body_error() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    sim.push(Behavior::BreakMidStream { chunks: 3 });
    let mut resp = post(&sim, "/v1/chat/completions", &chat_stream("m")).await;
    assert_eq!(resp.status(), 200);
    let expected = openai_stream_events("m", &stream_pieces("sim", 3), false);
    let mut got = Vec::new();
    let err = loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => got.push(chunk),
            Ok(None) => panic!("stream ended cleanly after {} chunks", got.len()),
            Err(e) => break e,
        }
    };
    assert_eq!(got.len(), 3);
    for (chunk, event) in got.iter().zip(&expected) {
        assert_eq!(chunk, event.as_bytes());
    }
    // reqwest 0.13 reports a body cut short (chunked framing ends at EOF) as a decode
    // error; either way it is not a status.
    assert!(err.is_body() || err.is_decode(), "{err:?}");
    assert_eq!(sim.cancelled(), 0);
}

#[tokio::test]
async fn queue_then_default() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    sim.push(Behavior::ServerError(500));
    sim.push(Behavior::ServerError(502));
    sim.set_default(Behavior::AnswerText("fallback text".into()));
    assert_eq!(sim.queued(), 2);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            post(&sim, "/v1/chat/completions", &chat("m"))
                .await
                .status(),
        );
    }
    assert_eq!(statuses, [500, 502, 200, 200]);
    assert_eq!(sim.queued(), 0);
    let body = json_of(post(&sim, "/v1/chat/completions", &chat("m")).await).await;
    assert_eq!(body, openai_completion("m", "fallback text"));
    assert_eq!(sim.hits(), 5);
}

#[tokio::test]
async fn recording_can_be_turned_off_and_drained() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    post(&sim, "/v1/chat/completions", &chat("a")).await;
    assert_eq!(sim.take_received().len(), 1);
    assert!(sim.received().is_empty());
    sim.set_recording(false);
    post(&sim, "/v1/chat/completions", &chat("b")).await;
    assert!(sim.received().is_empty());
    assert_eq!(sim.hits(), 2);
}

#[tokio::test]
async fn shutdown_and_last_drop_stop_the_server() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let url = sim.endpoint();
    let clone = sim.clone();
    drop(sim);
    // A clone keeps it alive.
    assert_eq!(
        client()
            .post(&url)
            .body(chat("m").to_string())
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    clone.shutdown();
    tokio::task::yield_now().await;
    let err = client()
        .post(&url)
        .body(chat("m").to_string())
        .send()
        .await
        .expect_err("shut down");
    assert!(err.is_connect(), "{err:?}");

    let other = SimProvider::start(Flavor::Anthropic).await;
    let url = other.endpoint();
    drop(other);
    tokio::task::yield_now().await;
    let err = client()
        .post(&url)
        .body(message("m").to_string())
        .send()
        .await
        .expect_err("dropped");
    assert!(err.is_connect(), "{err:?}");
}

#[tokio::test]
async fn providers_are_independent() {
    let a = SimProvider::start_named("a", Flavor::OpenAi).await;
    let b = SimProvider::start_named("b", Flavor::OpenAi).await;
    a.push(Behavior::ServerError(500));
    assert_eq!(
        post(&b, "/v1/chat/completions", &chat("m")).await.status(),
        200
    );
    assert_eq!(
        post(&a, "/v1/chat/completions", &chat("m")).await.status(),
        500
    );
    assert_eq!((a.hits(), b.hits()), (1, 1));
    assert_ne!(a.addr(), b.addr());
}

#[tokio::test]
async fn a_cycle_takes_turns_and_the_queue_still_comes_first() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    sim.set_default(Behavior::Cycle(vec![
        Behavior::ServerError(503),
        Behavior::Answer,
    ]));
    sim.push(Behavior::ServerError(500));
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            post(&sim, "/v1/chat/completions", &chat("m"))
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [500, 503, 200, 503, 200]);
}

fn weather_args() -> Value {
    json!({"city": "Zürich", "unit": "celsius", "days": [1, 2]})
}

/// Data of the OpenAI chunks of a stream body, `[DONE]` checked and dropped.
fn openai_chunks(text: &str) -> Vec<Value> {
    let events = parse_sse(text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn argument_fragments_cut_mid_token_and_join_back() {
    let args = weather_args();
    let pieces = argument_fragments(&args);
    assert!(pieces.len() > 3, "{pieces:?}");
    assert!(
        pieces
            .iter()
            .all(|p| p.chars().count() <= ARGUMENT_FRAGMENT_CHARS)
    );
    // Multibyte characters are never split.
    assert_eq!(pieces.concat(), args.to_string());
    // No piece but the last is a complete JSON value: a client must reassemble.
    assert!(serde_json::from_str::<Value>(&pieces[0]).is_err());
    assert_eq!(argument_fragments(&json!({})), ["{}"]);
}

#[tokio::test]
async fn openai_tool_call_unary_has_string_arguments() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    sim.push(Behavior::tool_call("get_weather", weather_args()));
    let body = json_of(post(&sim, "/v1/chat/completions", &chat("gpt-4o")).await).await;
    assert_eq!(
        body,
        openai_tool_call_completion("gpt-4o", None, "get_weather", &weather_args())
    );
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["id"], OPENAI_TOOL_CALL_ID);
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let raw = call["function"]["arguments"]
        .as_str()
        .expect("a JSON string");
    assert_eq!(serde_json::from_str::<Value>(raw).unwrap(), weather_args());

    // With text before the call, and the default answers the next request.
    sim.push(Behavior::ToolCall {
        name: "f".into(),
        arguments: json!({}),
        text: Some("Let me check.".into()),
    });
    let body = json_of(post(&sim, "/v1/chat/completions", &chat("m")).await).await;
    assert_eq!(body["choices"][0]["message"]["content"], "Let me check.");
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        "{}"
    );
    let body = json_of(post(&sim, "/v1/chat/completions", &chat("m")).await).await;
    assert_eq!(body, openai_completion("m", "Hello from sim."));
}

#[tokio::test]
async fn openai_tool_call_streams_as_indexed_deltas() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    for text in [None, Some("Checking the weather.")] {
        sim.push(Behavior::ToolCall {
            name: "get_weather".into(),
            arguments: weather_args(),
            text: text.map(str::to_owned),
        });
        let req = json!({"model": "gpt-4o", "stream": true,
                         "stream_options": {"include_usage": true}, "messages": []});
        let resp = post(&sim, "/v1/chat/completions", &req).await;
        assert!(header(&resp, "content-type").starts_with("text/event-stream"));
        let body = resp.text().await.unwrap();
        assert_eq!(
            body,
            openai_tool_call_stream_events("gpt-4o", text, "get_weather", &weather_args(), true)
                .concat()
        );
        let chunks = openai_chunks(&body);
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        // Reassemble the way the SDKs do: by tool call index.
        let (mut id, mut name, mut args, mut content) =
            (String::new(), String::new(), String::new(), String::new());
        let mut heads = 0;
        for c in &chunks {
            let Some(delta) = c["choices"].get(0).map(|ch| &ch["delta"]) else {
                continue;
            };
            if let Some(t) = delta["content"].as_str() {
                content += t;
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(call["index"], 0);
                if let Some(i) = call["id"].as_str() {
                    heads += 1;
                    id += i;
                    assert_eq!(call["type"], "function");
                }
                name += call["function"]["name"].as_str().unwrap_or("");
                args += call["function"]["arguments"].as_str().unwrap();
            }
        }
        assert_eq!(heads, 1, "id, type and name come once");
        assert_eq!(id, OPENAI_TOOL_CALL_ID);
        assert_eq!(name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&args).unwrap(),
            weather_args()
        );
        assert_eq!(content, text.unwrap_or(""));
        let fragments = argument_fragments(&weather_args()).len();
        let n = chunks.len();
        assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(chunks[n - 1]["choices"], json!([]));
        let words = text.map_or(0, |t| t.split_whitespace().count());
        assert_eq!(
            chunks[n - 1]["usage"]["completion_tokens"],
            (words + fragments) as u64
        );
        // No usage chunk unless asked.
        sim.push(Behavior::tool_call("get_weather", weather_args()));
        let body = post(&sim, "/v1/chat/completions", &chat_stream("gpt-4o"))
            .await
            .text()
            .await
            .unwrap();
        let chunks = openai_chunks(&body);
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "tool_calls"
        );
        assert_eq!(chunks.len(), 1 + fragments + 1);
    }
}

#[tokio::test]
async fn anthropic_tool_use_unary_has_object_input() {
    let sim = SimProvider::start(Flavor::Anthropic).await;
    sim.push(Behavior::tool_call("get_weather", weather_args()));
    let body = json_of(post(&sim, "/v1/messages", &message("claude-x")).await).await;
    assert_eq!(
        body,
        anthropic_tool_use_message("claude-x", None, "get_weather", &weather_args())
    );
    assert_eq!(body["stop_reason"], "tool_use");
    assert_eq!(body["content"].as_array().unwrap().len(), 1);
    let block = &body["content"][0];
    assert_eq!(block["type"], "tool_use");
    assert_eq!(block["id"], ANTHROPIC_TOOL_USE_ID);
    assert_eq!(block["name"], "get_weather");
    assert_eq!(block["input"], weather_args());

    sim.push(Behavior::ToolCall {
        name: "get_weather".into(),
        arguments: weather_args(),
        text: Some("Let me check.".into()),
    });
    let body = json_of(post(&sim, "/v1/messages", &message("claude-x")).await).await;
    let types: Vec<_> = body["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(types, ["text", "tool_use"]);
    assert_eq!(body["content"][0]["text"], "Let me check.");

    // Not a generation endpoint: answers as usual.
    sim.push(Behavior::tool_call("f", json!({})));
    let resp = client()
        .get(format!("{}/models", sim.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_of(resp).await,
        models_list(Flavor::Anthropic, &SIM_MODELS)
    );
}

#[tokio::test]
async fn anthropic_tool_use_streams_input_json_deltas() {
    let sim = SimProvider::start(Flavor::Anthropic).await;
    for text in [None, Some("Checking the weather.")] {
        sim.push(Behavior::ToolCall {
            name: "get_weather".into(),
            arguments: weather_args(),
            text: text.map(str::to_owned),
        });
        let resp = post(&sim, "/v1/messages", &message_stream("claude-x")).await;
        assert_eq!(header(&resp, "content-type"), "text/event-stream");
        let body = resp.text().await.unwrap();
        assert_eq!(
            body,
            anthropic_tool_use_stream_events("claude-x", text, "get_weather", &weather_args())
                .concat()
        );
        let events: Vec<(String, Value)> = parse_sse(&body)
            .into_iter()
            .map(|(e, d)| (e.unwrap(), serde_json::from_str(&d).unwrap()))
            .collect();
        for (name, data) in &events {
            assert_eq!(&data["type"], name.as_str());
        }
        let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
        let fragments = argument_fragments(&weather_args()).len();
        let mut want = vec!["message_start"];
        let tool_index = match text {
            None => 0,
            Some(t) => {
                want.extend(["content_block_start", "ping"]);
                want.extend(std::iter::repeat_n(
                    "content_block_delta",
                    t.split_whitespace().count(),
                ));
                want.push("content_block_stop");
                1
            }
        };
        want.extend(["content_block_start", "content_block_delta"]);
        if text.is_none() {
            want.push("ping");
        }
        want.extend(std::iter::repeat_n("content_block_delta", fragments));
        want.extend(["content_block_stop", "message_delta", "message_stop"]);
        assert_eq!(names, want);

        // Reassemble the way the SDKs do: per block index.
        let start = events
            .iter()
            .find(|(e, d)| e == "content_block_start" && d["content_block"]["type"] == "tool_use")
            .map(|(_, d)| d)
            .unwrap();
        assert_eq!(start["index"], tool_index);
        assert_eq!(
            start["content_block"],
            json!({"type": "tool_use", "id": ANTHROPIC_TOOL_USE_ID, "name": "get_weather", "input": {}})
        );
        let partial: String = events
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
            .inspect(|(_, d)| assert_eq!(d["index"], tool_index))
            .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&partial).unwrap(),
            weather_args()
        );
        let text_got: String = events
            .iter()
            .filter_map(|(_, d)| d["delta"]["text"].as_str())
            .collect();
        assert_eq!(text_got, text.unwrap_or(""));
        let delta = &events[events.len() - 2].1;
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    }
}

#[tokio::test]
async fn tool_declarations_calls_and_results_are_readable_from_requests() {
    let oa = SimProvider::start(Flavor::OpenAi).await;
    let req = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_time", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2",
         "content": [{"type": "text", "text": "12:"}, {"type": "text", "text": "00"}]}
    ], "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time"}}
    ]});
    post(&oa, "/v1/chat/completions", &req).await;
    let got = &oa.received()[0];
    assert_eq!(got.tool_names(), ["get_weather", "get_time"]);
    assert_eq!(
        got.tool_uses(),
        [
            ToolUse {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: json!({"city": "Paris"})
            },
            ToolUse {
                id: "call_2".into(),
                name: "get_time".into(),
                arguments: json!("not json")
            }
        ]
    );
    let results = got.tool_results();
    assert_eq!(results.len(), 2);
    assert_eq!(
        (results[0].id.as_str(), results[0].text().as_str()),
        ("call_1", "18C")
    );
    assert_eq!(
        (results[1].id.as_str(), results[1].text().as_str()),
        ("call_2", "12:00")
    );
    assert_eq!(results[0].is_error, None);

    let an = SimProvider::start(Flavor::Anthropic).await;
    let req = json!({"model": "claude-x", "max_tokens": 64, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
             "content": [{"type": "text", "text": "failed"}]},
            {"type": "text", "text": "thanks"}]}
    ], "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]});
    post(&an, "/v1/messages", &req).await;
    let got = &an.received()[0];
    assert_eq!(got.tool_names(), ["get_weather"]);
    assert_eq!(
        got.tool_uses(),
        [ToolUse {
            id: "toolu_1".into(),
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"})
        }]
    );
    let results = got.tool_results();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0].id, "toolu_1");
    assert_eq!(results[0].content, json!("18C"));
    assert_eq!(results[1].is_error, Some(true));
    assert_eq!(results[1].text(), "failed");

    // A request without tools has none of them.
    post(&an, "/v1/messages", &message("m")).await;
    let plain = &an.received()[1];
    assert!(plain.tool_names().is_empty());
    assert!(plain.tool_uses().is_empty());
    assert!(plain.tool_results().is_empty());
}

#[tokio::test]
async fn the_responses_api_answers_in_openais_shapes_and_refuses_what_openai_does() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let ask = json!({"model": "gpt-4o", "input": "hello"});
    let r = post(&sim, "/v1/responses", &ask).await;
    assert_eq!(r.status(), 200);
    let body = json_of(r).await;
    assert_eq!(
        body,
        responses::response_object("gpt-4o", Some(&answer_text("sim")))
    );
    assert_eq!(body["usage"]["input_tokens"], PROMPT_TOKENS);
    assert_eq!(body["usage"]["output_tokens"], 3);

    // Streamed: typed events, numbered, ending with `response.completed`.
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let r = post(&sim, "/v1/responses", &streamed).await;
    assert!(header(&r, "content-type").starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let datas: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let kinds: Vec<&str> = datas.iter().map(|d| d["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..5],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta"
        ]
    );
    assert_eq!(kinds.last(), Some(&"response.completed"));
    for (i, d) in datas.iter().enumerate() {
        assert_eq!(d["sequence_number"], i, "{d}");
    }
    assert!(!text.contains("[DONE]"));

    // Refused before any behaviour is taken: no input, an unknown model.
    sim.push(Behavior::ServerError(500));
    for (body, code) in [
        (json!({"model": "gpt-4o"}), "missing_required_parameter"),
        (json!({"model": "gpt-9", "input": "hi"}), "model_not_found"),
    ] {
        let r = post(&sim, "/v1/responses", &body).await;
        assert_eq!(r.status(), 400);
        assert_eq!(json_of(r).await["error"]["code"], code);
    }
    assert_eq!(sim.queued(), 1, "refusals take no behaviour");
    assert_eq!(post(&sim, "/v1/responses", &ask).await.status(), 500);

    // In-band failures: `error`, then `response.failed`.
    sim.push(Behavior::StreamErrorFirst);
    let text = post(&sim, "/v1/responses", &streamed)
        .await
        .text()
        .await
        .unwrap();
    assert!(text.starts_with("event: error\n"), "{text}");
    assert!(text.contains("event: response.failed\n"), "{text}");
}

/// The Vertex flavor's token endpoint checks the grant as Google does, and its model
/// endpoints take only live tokens and Vertex's own bodies.
#[tokio::test(start_paused = true)]
async fn vertex_verifies_the_grant_and_the_token() {
    use switchback_crds::service_account::ServiceAccount;
    use switchback_proxy::providers::vertex::{Signer, unix_now};

    let sim = SimProvider::start_named("vertex", Flavor::Vertex).await;
    let grant = |edit: &dyn Fn(&mut Value), at: u64, tamper: bool| {
        let mut sa: Value = serde_json::from_str(&sim.service_account_json()).unwrap();
        edit(&mut sa);
        let signer = Signer::new(&ServiceAccount::parse(&sa.to_string()).unwrap()).unwrap();
        let mut form = signer.form_body(at).unwrap().expose().clone();
        if tamper {
            // A character inside the signature changed: another signature.
            let i = form.len() - 10;
            let other = if &form[i..=i] == "A" { "B" } else { "A" };
            form.replace_range(i..=i, other);
        }
        client()
            .post(sim.token_uri())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .send()
    };
    let now = unix_now();
    let keep = |_: &mut Value| {};
    for (why, response) in [
        ("signature", grant(&keep, now, true).await.unwrap()),
        ("expired", grant(&keep, now - 7200, false).await.unwrap()),
        (
            "iss",
            grant(
                &|sa| sa["client_email"] = json!("x@y.iam.gserviceaccount.com"),
                now,
                false,
            )
            .await
            .unwrap(),
        ),
        (
            "aud",
            grant(
                &|sa| sa["token_uri"] = json!("https://oauth2.googleapis.com/token"),
                now,
                false,
            )
            .await
            .unwrap(),
        ),
    ] {
        assert_eq!(response.status(), 400, "{why}");
        let refusal = json_of(response).await;
        assert_eq!(refusal["error"], "invalid_grant", "{why}");
        if why == "signature" {
            assert_eq!(refusal["error_description"], "Invalid JWT Signature.");
        }
    }
    assert!(sim.issued_tokens().is_empty());

    let r = grant(&keep, now, false).await.unwrap();
    assert_eq!(r.status(), 200);
    let answer = json_of(r).await;
    assert_eq!(answer["token_type"], "Bearer");
    assert_eq!(answer["expires_in"], VERTEX_TOKEN_LIFETIME);
    let token = answer["access_token"].as_str().unwrap().to_owned();
    assert_eq!(sim.token_requests(), 5);

    let claude = format!(
        "{}/projects/{VERTEX_PROJECT}/locations/{VERTEX_LOCATION}/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict",
        sim.base_url()
    );
    let call = |bearer: Option<&str>, body: Value| {
        let mut r = client().post(&claude).json(&body);
        if let Some(t) = bearer {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let good = json!({"anthropic_version": VERTEX_ANTHROPIC_VERSION, "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = call(None, good.clone()).await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(json_of(r).await["error"]["status"], "UNAUTHENTICATED");
    assert_eq!(
        call(Some("ya29.forged"), good.clone())
            .await
            .unwrap()
            .status(),
        401
    );
    let mut with_model = good.clone();
    with_model["model"] = json!("claude-sonnet-4-5");
    let r = call(Some(&token), with_model).await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(json_of(r).await["error"]["type"], "invalid_request_error");
    let mut old_version = good.clone();
    old_version["anthropic_version"] = json!("2023-06-01");
    assert_eq!(call(Some(&token), old_version).await.unwrap().status(), 400);
    let r = call(Some(&token), good.clone()).await.unwrap();
    assert_eq!(r.status(), 200);
    let message = json_of(r).await;
    assert_eq!(message["type"], "message");
    assert_eq!(message["model"], "claude-sonnet-4-5@20250929");
    // The token dies with its lifetime, on tokio's clock.
    tokio::time::advance(Duration::from_secs(VERTEX_TOKEN_LIFETIME)).await;
    assert_eq!(call(Some(&token), good).await.unwrap().status(), 401);
}

/// A SigV4 signature the way the proxy makes it (the same crate), over `body`.
fn bedrock_signed(url: &str, body: &[u8], token: Option<&str>) -> Vec<(String, String)> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let akid = if token.is_some() {
        BEDROCK_TEMP_ACCESS_KEY_ID
    } else {
        BEDROCK_ACCESS_KEY_ID
    };
    let identity = aws_credential_types::Credentials::new(
        akid,
        BEDROCK_SECRET_ACCESS_KEY,
        token.map(str::to_owned),
        None,
        "test",
    )
    .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(BEDROCK_REGION)
        .name("bedrock")
        .time(std::time::SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .unwrap()
        .into();
    let host = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let signable = SignableRequest::new(
        "POST",
        url,
        [
            ("host", host.as_str()),
            ("content-type", "application/json"),
        ]
        .into_iter(),
        SignableBody::Bytes(body),
    )
    .unwrap();
    let (instructions, _) = sign(signable, &params).unwrap().into_parts();
    instructions
        .headers()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The Bedrock flavor recomputes the signature: a correctly signed request is
/// answered (JSON and event-stream frames), the same headers over another body are
/// refused, as are a missing session token and a body Converse does not take.
#[tokio::test]
async fn bedrock_checks_sigv4_and_streams_event_stream_frames() {
    use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
    let sim = SimProvider::start_named("br", Flavor::Bedrock).await;
    let send = |path: &str, body: &'static str, token: Option<&'static str>, tamper: bool| {
        let url = format!("{}{path}", sim.base_url());
        let signed = bedrock_signed(&url, body.as_bytes(), token);
        let sent = if tamper {
            body.replace("hi", "ho")
        } else {
            body.to_owned()
        };
        let mut req = client()
            .post(&url)
            .header("content-type", "application/json")
            .body(sent);
        for (k, v) in signed {
            req = req.header(k, v);
        }
        req.send()
    };
    let body = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#;
    let path = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse";
    let r = send(path, body, None, false).await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["output"]["message"]["content"][0]["text"],
        "Hello from br."
    );
    assert_eq!(v["stopReason"], "end_turn");

    let r = send(path, body, None, true).await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(
        r.headers()["x-amzn-errortype"]
            .to_str()
            .unwrap()
            .starts_with("InvalidSignatureException")
    );

    let r = send(path, body, Some(BEDROCK_SESSION_TOKEN), false)
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "temporary keys with their token");

    let r = send(
        path,
        r#"{"model":"m","messages":[{"role":"user","content":[{"text":"hi"}]}]}"#,
        None,
        false,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("extraneous key [model]"));

    let stream_path = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream";
    let r = send(stream_path, body, None, false).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "application/vnd.amazon.eventstream"
    );
    let mut buf = bytes::BytesMut::from(&r.bytes().await.unwrap()[..]);
    let mut decoder = MessageFrameDecoder::new();
    let mut names = Vec::new();
    while let DecodedFrame::Complete(m) = decoder.decode_frame(&mut buf).unwrap() {
        let name = m
            .headers()
            .iter()
            .find(|h| h.name().as_str() == ":event-type")
            .unwrap();
        names.push(name.value().as_string().unwrap().as_str().to_owned());
    }
    assert_eq!(names[0], "messageStart");
    assert_eq!(names[names.len() - 2..], ["messageStop", "metadata"]);
    assert!(names.iter().filter(|n| *n == "contentBlockDelta").count() >= 3);
}

// ---- docs/streaming.md#resume-after-commit: streams that fail after N content events, and prefills -----------

/// The text deltas of an SSE body, in either flavor.
fn streamed_text(body: &str) -> String {
    parse_sse(body)
        .iter()
        .filter_map(|(_, data)| serde_json::from_str::<Value>(data).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")
                .or_else(|| v.pointer("/delta/text"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

/// Reads a body until it ends, fails, or sends nothing for a minute (a stall, under a
/// paused clock): what arrived, and how it stopped.
async fn read_until_stopped(mut resp: reqwest::Response) -> (String, &'static str) {
    let mut got = Vec::new();
    let how = loop {
        match timeout(Duration::from_secs(60), resp.chunk()).await {
            Err(_) => break "stalled",
            Ok(Ok(Some(chunk))) => got.extend_from_slice(&chunk),
            Ok(Ok(None)) => break "ended",
            Ok(Err(_)) => break "cut",
        }
    };
    (String::from_utf8(got).unwrap(), how)
}

#[tokio::test(start_paused = true)]
async fn a_stream_fails_after_n_content_events_as_scripted() {
    let text = "one two three four five";
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        let (path, body) = match flavor {
            Flavor::OpenAi => ("/v1/chat/completions", chat_stream("m")),
            _ => ("/v1/messages", message_stream("m")),
        };
        for (fault, how) in [
            (StreamFault::Cut, "cut"),
            (StreamFault::Stall, "stalled"),
            (StreamFault::Error, "ended"),
        ] {
            let sim = SimProvider::start(flavor).await;
            sim.push(Behavior::FailAfter {
                text: Some(text.into()),
                content: 2,
                fault,
            });
            let resp = post(&sim, path, &body).await;
            assert_eq!(resp.status(), 200);
            let (got, stopped) = read_until_stopped(resp).await;
            assert_eq!(
                (stopped, streamed_text(&got)),
                (how, "one two ".into()),
                "{flavor:?} {fault:?}: {got}"
            );
            // The opening came first, the ending never did.
            let events = parse_sse(&got);
            let overloaded = events
                .iter()
                .filter(|(_, d)| d.contains("overloaded") || d.contains("server_error"))
                .count();
            assert_eq!(
                overloaded,
                usize::from(fault == StreamFault::Error),
                "{got}"
            );
            assert!(
                !got.contains("[DONE]") && !got.contains("message_stop"),
                "{got}"
            );
            assert!(!got.contains("\"finish_reason\":\"stop\""), "{got}");
            if flavor == Flavor::Anthropic {
                assert_eq!(events[0].0.as_deref(), Some("message_start"));
            }
        }
    }
}

#[tokio::test]
async fn anthropic_continues_a_prefill_and_refuses_one_ending_in_whitespace() {
    let sim = SimProvider::start(Flavor::Anthropic).await;
    sim.set_default(Behavior::AnswerText("one two three".into()));
    let mut body = message_stream("m");
    body["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": [{"type": "text", "text": "one two"}]}));
    let resp = post(&sim, "/v1/messages", &body).await;
    assert_eq!(resp.status(), 200);
    let got = resp.text().await.unwrap();
    assert_eq!(streamed_text(&got), " three", "what is left: {got}");
    assert!(
        got.contains(CONTINUED_ANTHROPIC_ID),
        "another message: {got}"
    );
    assert_eq!(sim.received()[0].prefill().as_deref(), Some("one two"));

    body["messages"][1] = json!({"role": "assistant", "content": "one two "});
    let resp = post(&sim, "/v1/messages", &body).await;
    assert_eq!(resp.status(), 400);
    let err = json_of(resp).await;
    assert_eq!(err["error"]["message"], TRAILING_WHITESPACE, "{err}");
    assert_eq!(sim.received()[1].prefill().as_deref(), Some("one two "));
}

#[tokio::test]
async fn an_openai_compatible_server_continues_only_when_asked_the_vllm_way() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    sim.set_default(Behavior::AnswerText("one two three".into()));
    let mut body = chat_stream("m");
    body["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "one two "}));
    // History only: a new answer.
    let got = post(&sim, "/v1/chat/completions", &body)
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(streamed_text(&got), "one two three");
    assert!(!got.contains(CONTINUED_OPENAI_ID));
    // Asked to continue, but with the generation prompt vLLM adds by default.
    body["continue_final_message"] = json!(true);
    let resp = post(&sim, "/v1/chat/completions", &body).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(
        json_of(resp).await["error"]["message"],
        CONTINUE_WITH_GENERATION_PROMPT
    );
    body["add_generation_prompt"] = json!(false);
    let got = post(&sim, "/v1/chat/completions", &body)
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(streamed_text(&got), "three", "{got}");
    assert!(got.contains(CONTINUED_OPENAI_ID), "{got}");
    assert_eq!(sim.received()[2].prefill().as_deref(), Some("one two "));
}

//! Streams through the proxy: events forwarded as they arrive, retries and fallbacks
//! only before the first event reaches the client, an in-band error as the first
//! event failing over, and a failure after commit ending the stream with an error
//! event. Paused clock throughout.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use switchback_tests::harness::{TestProxy, credential, header, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider, stream_pieces};
use tokio::time::Instant;

async fn setup(flavor: Flavor, spec: &str) -> (SimProvider, SimProvider, TestProxy) {
    let provider = match flavor {
        Flavor::OpenAi => "openai",
        Flavor::Azure => "azure-openai",
        Flavor::Gemini => "gemini",
        Flavor::Bedrock => unreachable!("bedrock takes the whole Secret: see tests/bedrock.rs"),
        Flavor::Anthropic => "anthropic",
        Flavor::Vertex => unreachable!("a vertex credential is a service account: tests/vertex.rs"),
    };
    let primary = SimProvider::start_named("primary", flavor).await;
    let backup = SimProvider::start_named("backup", flavor).await;
    let manifests = format!(
        "{}{}{}",
        credential("primary", provider, &primary.base_url(), "sk-primary"),
        credential("backup", provider, &backup.base_url(), "sk-backup"),
        route("smart", spec)
    );
    (primary, backup, TestProxy::start(&manifests).await)
}

const SPEC: &str = "  targets:
    - credentialRef: { name: primary }
      model: upstream-primary
      timeout: 2s
      retry: { attempts: 2 }
    - credentialRef: { name: backup }
      model: upstream-backup
";

/// Every chunk of the body with the (virtual) time it arrived.
async fn read_timed(r: reqwest::Response) -> Vec<(Duration, String)> {
    let started = Instant::now();
    let mut out = Vec::new();
    let mut body = r.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.expect("the proxy's stream itself does not break");
        out.push((
            started.elapsed(),
            String::from_utf8(chunk.to_vec()).unwrap(),
        ));
    }
    out
}

/// The JSON payloads of every `data:` line (skipping `[DONE]`).
fn data_events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{d}: {e}")))
        .collect()
}

fn openai_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn events_are_forwarded_as_they_arrive_with_the_clients_model_name() {
    let (primary, _backup, proxy) = setup(Flavor::OpenAi, SPEC).await;
    primary.push(Behavior::Stream {
        chunks: 5,
        interval: Duration::from_secs(1),
    });
    let r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/event-stream"));
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    let chunks = read_timed(r).await;
    let first = chunks.first().unwrap().0;
    let last = chunks.last().unwrap().0;
    assert!(
        first < Duration::from_secs(1),
        "the first event is not held for the rest: {first:?}"
    );
    assert!(last >= Duration::from_secs(4), "{last:?}");
    let distinct: std::collections::BTreeSet<_> = chunks.iter().map(|c| c.0.as_secs()).collect();
    assert!(
        distinct.len() >= 4,
        "events arrived one by one, not in a lump: {chunks:?}"
    );

    let text: String = chunks.iter().map(|c| c.1.as_str()).collect();
    let events = data_events(&text);
    assert!(events.iter().all(|e| e["model"] == "smart"), "{text}");
    assert_eq!(openai_text(&events), stream_pieces("primary", 5).concat());
    assert!(text.trim_end().ends_with("data: [DONE]"));
    assert_eq!(primary.received()[0].model(), Some("upstream-primary"));
}

#[tokio::test(start_paused = true)]
async fn an_error_as_the_first_event_fails_over() {
    for flavor in [Flavor::Anthropic, Flavor::OpenAi] {
        let (primary, backup, proxy) = setup(flavor, SPEC).await;
        primary.set_default(Behavior::StreamErrorFirst);
        let r = match flavor {
            Flavor::Anthropic => proxy.messages("smart", true).await,
            Flavor::OpenAi | Flavor::Azure | Flavor::Gemini | Flavor::Vertex | Flavor::Bedrock => {
                proxy.chat("smart", true).await
            }
        };
        assert_eq!(r.status(), 200);
        assert_eq!(
            header(&r, "x-switchback-target"),
            "team-a/backup",
            "{flavor:?}"
        );
        assert_eq!(
            header(&r, "x-switchback-attempts"),
            "3",
            "{flavor:?}: overloaded is retried"
        );
        let text = r.text().await.unwrap();
        assert!(
            !text.contains("overloaded"),
            "{flavor:?}: the client never sees the error: {text}"
        );
        let events = data_events(&text);
        assert!(!events.is_empty());
        if flavor == Flavor::Anthropic {
            assert_eq!(events[0]["type"], "message_start");
            assert_eq!(events[0]["message"]["model"], "smart");
            assert!(text.contains("event: message_stop"));
        }
        assert_eq!(primary.hits(), 2);
        assert_eq!(backup.hits(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn failures_before_the_first_event_fall_back() {
    let (primary, backup, proxy) = setup(Flavor::OpenAi, SPEC).await;
    primary.push(Behavior::ServerError(503));
    primary.push(
        Behavior::Stream {
            chunks: 3,
            interval: Duration::ZERO,
        }
        .after(Duration::from_secs(5)),
    );
    let started = Instant::now();
    let r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-attempts"), "3");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let events = data_events(&r.text().await.unwrap());
    assert!(openai_text(&events).contains("backup"), "{events:?}");
    assert_eq!(backup.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_break_after_commit_ends_the_stream_with_an_error_event() {
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        let (primary, backup, proxy) = setup(flavor, SPEC).await;
        // Five events: past the events without content (an Anthropic stream opens
        // with three), so the stream is committed when it breaks.
        primary.push(Behavior::BreakMidStream { chunks: 5 });
        let r = match flavor {
            Flavor::Anthropic => proxy.messages("smart", true).await,
            Flavor::OpenAi | Flavor::Azure | Flavor::Gemini | Flavor::Vertex | Flavor::Bedrock => {
                proxy.chat("smart", true).await
            }
        };
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        let events = data_events(&text);
        let last = events.last().unwrap();
        assert!(
            last["error"]["message"]
                .as_str()
                .unwrap()
                .contains("failed"),
            "{flavor:?}: {text}"
        );
        if flavor == Flavor::Anthropic {
            assert!(text.contains("event: error"));
            assert_eq!(last["type"], "error");
        }
        assert_eq!(
            backup.hits(),
            0,
            "{flavor:?}: no fallback once the client has events"
        );
        assert_eq!(primary.hits(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_stall_after_commit_ends_the_stream_after_the_idle_limit() {
    let (primary, backup, proxy) = setup(Flavor::OpenAi, SPEC).await;
    primary.push(Behavior::StallMidStream { chunks: 2 });
    let started = Instant::now();
    let r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let last = data_events(&text).pop().unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stalled"),
        "{text}"
    );
    assert_eq!(backup.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_client_leaving_mid_stream_closes_the_upstream_stream() {
    let (primary, _backup, proxy) = setup(Flavor::OpenAi, SPEC).await;
    primary.push(Behavior::Stream {
        chunks: 100,
        interval: Duration::from_secs(1),
    });
    let r = proxy.chat("smart", true).await;
    let mut body = r.bytes_stream();
    body.next().await.unwrap().unwrap();
    drop(body);
    tokio::time::timeout(Duration::from_secs(10), primary.wait_cancelled(1))
        .await
        .expect("the upstream stream is dropped when the client leaves");
}

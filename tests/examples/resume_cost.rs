//! Time to resume (SPEC §13): the client-visible gap between the last byte a broken
//! provider sent and the first byte of the continuation, minus that continuation
//! provider's own time to first token (measured directly, with the same prefilled
//! request). What is left is what resuming costs the proxy: noticing the break, the
//! walk to the next target, the prefill, a new upstream request and its opening.
//! Simulated providers on loopback, the proxy in-process, real clock. Prints
//! figures; asserts nothing.
//!
//! `cargo run --release -p switchback-tests --example resume_cost`

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;
use switchback_tests::harness::{TestProxy, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider, StreamFault};

const ROUNDS: usize = 300;
const TEXT: &str = "one two three four five six seven eight nine ten";

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn line(label: &str, mut d: Vec<Duration>) -> Vec<Duration> {
    d.sort();
    println!(
        "resume_cost: {label:<34} p50 {:>8.3} ms  p90 {:>8.3} ms  p99 {:>8.3} ms",
        quantile(&d, 0.5).as_secs_f64() * 1e3,
        quantile(&d, 0.9).as_secs_f64() * 1e3,
        quantile(&d, 0.99).as_secs_f64() * 1e3,
    );
    d
}

/// Time from sending `body` to the first chunk with text, straight to `url`.
async fn direct_ttft(http: &reqwest::Client, url: &str, body: &serde_json::Value) -> Duration {
    let started = Instant::now();
    let r = http
        .post(url)
        .header("x-api-key", "sk-test")
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .expect("the backup answers");
    let mut body = r.bytes_stream();
    while let Some(chunk) = body.next().await {
        if String::from_utf8_lossy(&chunk.expect("a chunk")).contains("text_delta") {
            break;
        }
    }
    started.elapsed()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let primary = SimProvider::start_named("primary", Flavor::Anthropic).await;
    let backup = SimProvider::start_named("backup", Flavor::Anthropic).await;
    backup.set_default(Behavior::AnswerText(TEXT.into()));
    let manifests = format!(
        "{}{}{}",
        credential("primary", "anthropic", &primary.base_url(), "sk-test"),
        credential("backup", "anthropic", &backup.base_url(), "sk-test"),
        route(
            "smart",
            "  targets:
    - credentialRef: { name: primary }
    - credentialRef: { name: backup }
  stream:
    resume: { mode: Continue }
"
        )
    );
    let proxy = TestProxy::start(&manifests).await;
    let body = json!({"model": "smart", "stream": true, "max_tokens": 64,
        "messages": [{"role": "user", "content": "count to ten"}]});
    let mut gaps = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS + 20 {
        primary.push(Behavior::FailAfter {
            text: Some(TEXT.into()),
            content: 4,
            fault: StreamFault::Cut,
        });
        let r = proxy.post("/v1/messages", &body).await;
        let mut stream = r.bytes_stream();
        let (mut last_before, mut first_after) = (None, None);
        let mut resumed = false;
        while let Some(chunk) = stream.next().await {
            let at = Instant::now();
            let chunk = String::from_utf8_lossy(&chunk.expect("the proxy's stream")).into_owned();
            if let Some(i) = chunk.find(": switchback resumed") {
                resumed = true;
                if chunk[i..].contains("text_delta") {
                    first_after = Some(at);
                    break;
                }
                continue;
            }
            if resumed {
                if chunk.contains("text_delta") {
                    first_after = Some(at);
                    break;
                }
            } else {
                last_before = Some(at);
            }
        }
        // Drain: the next round starts on a finished stream.
        while stream.next().await.is_some() {}
        if round >= 20 {
            let (Some(a), Some(b)) = (last_before, first_after) else {
                panic!("round {round} was not resumed");
            };
            gaps.push(b - a);
        }
    }
    // The continuation provider's own time to first token, asked the same thing.
    let asked = backup
        .received()
        .pop()
        .expect("the backup was asked")
        .json
        .unwrap();
    let url = format!("{}/messages", backup.base_url());
    let http = reqwest::Client::new();
    let mut ttft = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        ttft.push(direct_ttft(&http, &url, &asked).await);
    }
    println!("resume_cost: {ROUNDS} resumed streams (anthropic → anthropic, cut after 4 words)");
    let gaps = line("client-visible gap", gaps);
    let ttft = line("backup's own time to first token", ttft);
    let cost: Vec<Duration> = gaps
        .iter()
        .zip(&ttft)
        .map(|(g, t)| g.saturating_sub(*t))
        .collect();
    line("time to resume (gap − TTFT)", cost);
}

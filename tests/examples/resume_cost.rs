//! Time to resume (docs/streaming.md#resume-after-commit): the client-visible gap between
//! the last byte a broken provider sent and the first byte of the continuation, minus that
//! continuation provider's own time to first token (measured directly, with the same
//! prefilled request). What is left is what resuming costs the proxy: noticing the break,
//! the walk to the next target, the prefill, a new upstream request and its opening.
//! Simulated providers on loopback, the proxy in-process, real clock. Prints figures;
//! asserts nothing.
//!
//! `cargo run --release -p switchback-tests --example resume_cost`

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;
use switchback_tests::harness::{TestProxy, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider, StreamFault};

const ROUNDS: usize = 300;
const BACKUP_TTFT: Duration = Duration::from_millis(20);
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

/// Resumed streams through the proxy at `url`: the client-visible gap of each, and
/// the continuation provider's own time to first token for the same request.
async fn measure(
    url: String,
    primary: SimProvider,
    backup: SimProvider,
) -> (Vec<Duration>, Vec<Duration>) {
    let http = reqwest::Client::new();
    let body = json!({"model": "smart", "stream": true, "max_tokens": 64,
        "messages": [{"role": "user", "content": "count to ten"}]});
    let mut gaps = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS + 20 {
        primary.push(Behavior::FailAfter {
            text: Some(TEXT.into()),
            content: 4,
            fault: StreamFault::Cut,
        });
        let r = http
            .post(&url)
            .json(&body)
            .send()
            .await
            .expect("the proxy answers");
        let mut stream = r.bytes_stream();
        let (mut last_before, mut first_after) = (None, None);
        let mut resumed = false;
        let mut seen = String::new();
        while let Some(chunk) = stream.next().await {
            let at = Instant::now();
            let chunk = String::from_utf8_lossy(&chunk.expect("the proxy's stream")).into_owned();
            seen.push_str(&chunk);
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
                panic!("round {round} was not resumed: {seen}");
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
    let mut ttft = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        ttft.push(direct_ttft(&http, &url, &asked).await);
    }
    (gaps, ttft)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let primary = SimProvider::start_named("primary", Flavor::Anthropic).await;
    let backup = SimProvider::start_named("backup", Flavor::Anthropic).await;
    // The backup takes BACKUP_TTFT to its first token: the client reads the broken
    // attempt's last bytes before the continuation's arrive, on a 2-core machine too.
    backup.set_default(Behavior::AnswerText(TEXT.into()).after(BACKUP_TTFT));
    let manifests = format!(
        "{}{}{}",
        credential("primary", "anthropic", &primary.base_url(), "sk-test"),
        credential("backup", "anthropic", &backup.base_url(), "sk-test"),
        route(
            "smart",
            "  targets:
    - credentialRef: { name: primary }
    - credentialRef: { name: backup }
  # Every round breaks the primary: keep its circuit closed for the whole run.
  circuitBreaker: { consecutiveFailures: 1000 }
  stream:
    resume: { mode: Continue }
"
        )
    );
    let proxy = TestProxy::start(&manifests).await;
    let url = proxy.url("/v1/messages");
    // The client on a thread and runtime of its own: its timestamps are taken when
    // bytes arrive, not when the proxy's and the providers' tasks let it run.
    let client = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(measure(url, primary, backup))
    });
    let (gaps, ttft) = client.join().expect("the client thread");
    println!(
        "resume_cost: {ROUNDS} resumed streams (anthropic → anthropic, cut after 4 words, \
         the backup's first token after {BACKUP_TTFT:?})"
    );
    let gaps = line("client-visible gap", gaps);
    let ttft = line("backup's own time to first token", ttft);
    // Quantile by quantile (both lists are sorted), signed: a resume that costs less
    // than the timers' resolution (about a millisecond) can come out below zero.
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let diff = |q: f64| ms(quantile(&gaps, q)) - ms(quantile(&ttft, q));
    println!(
        "resume_cost: {:<34} p50 {:>8.3} ms  p90 {:>8.3} ms  p99 {:>8.3} ms",
        "time to resume (gap − TTFT)",
        diff(0.5),
        diff(0.9),
        diff(0.99),
    );
}

//! Budgets that hold (docs/tenancy.md#budgets). A request reserves its output cap and input
//! estimate before it is sent, so many at once cannot spend past a budget (on the
//! real `switchback-proxy` binary); a client that walks away still pays: a unary
//! answer is read to its end and counted, a stream whose content had ended is read
//! on for its usage, a stream left mid-answer is cancelled upstream at once and its
//! usage estimated and marked so. Counts are read as the operator reads them, on
//! `/admin/v1/stats`.

use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use switchback_tests::binaries::{Process, build};
use switchback_tests::harness::{TestProxy, priced_client};
use switchback_tests::sim::{Behavior, Flavor, PROMPT_TOKENS, SimProvider};
use tokio::time::{Instant, sleep, timeout};

const KEY: &str = "sk-team-a-app-0123456789";

/// `Hello from primary.`: three words.
const OUTPUT_TOKENS: u64 = 3;

/// One provider of `flavor` behind `smart` (priced), and team-a/app with `spec`
/// lines (its budget) added.
fn manifests(sim: &SimProvider, flavor: Flavor, client_spec: &str) -> String {
    let provider = match flavor {
        Flavor::Anthropic => "anthropic",
        _ => "openai",
    };
    priced_client(provider, &sim.base_url(), KEY, client_spec)
}

/// team-a/app as `/admin/v1/stats` at `admin` (a base URL) reports it.
async fn client_stats(http: &reqwest::Client, admin: &str) -> Value {
    let stats: Value = http
        .get(format!("{admin}/admin/v1/stats"))
        .send()
        .await
        .expect("admin answers")
        .json()
        .await
        .expect("stats are JSON");
    stats["clients"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["client"]["name"] == "app"))
        .cloned()
        .unwrap_or_else(|| panic!("team-a/app in {stats}"))
}

fn tokens(c: &Value) -> u64 {
    c["inputTokens"].as_u64().unwrap_or(0) + c["outputTokens"].as_u64().unwrap_or(0)
}

/// A chat request that caps its output at `max_tokens`.
fn capped(max_tokens: u64) -> Value {
    json!({"model": "smart", "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": "hello"}]})
}

/// The real binary, standalone on `manifests`, with `extra` arguments; its admin base
/// URL, data base URL and log file.
fn start_binary(dir: &Path, manifests: &str, extra: &[&str]) -> (Process, String, String) {
    let file = dir.join("switchback.yaml");
    std::fs::write(&file, manifests).unwrap();
    let log = dir.join("proxy.log");
    let mut args = vec!["--threads", "2", "--log-format", "json"];
    args.extend(extra);
    let (process, [data, admin]) =
        Process::start_proxy(&build().join("switchback-proxy"), &file, &log, &args);
    (
        process,
        format!("http://127.0.0.1:{admin}"),
        format!("http://127.0.0.1:{data}"),
    )
}

/// A hundred words: an answer that uses all of `max_tokens: 100`.
fn hundred_words() -> String {
    (0..100)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sends `n` capped requests at once; (status, error code, Retry-After, message) of
/// each.
async fn at_once(
    http: &reqwest::Client,
    data: &str,
    n: usize,
    max_tokens: u64,
) -> Vec<(u16, String, String, String)> {
    let sends = (0..n).map(|_| {
        let request = http
            .post(format!("{data}/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&capped(max_tokens));
        async move {
            let r = request.send().await.expect("the proxy answers");
            let status = r.status().as_u16();
            let retry_after = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            let code = body["error"]["code"].as_str().unwrap_or("").to_string();
            let message = body["error"]["message"].as_str().unwrap_or("").to_string();
            (status, code, retry_after, message)
        }
    });
    futures_util::future::join_all(sends).await
}

/// 20 requests of `max_tokens: 100` at once, from a client with 1,000 tokens a day,
/// to a provider that uses all 100 (and 10 of input): at most 10 go upstream, the
/// rest get 429 `budget_exhausted` at once, and what is counted stays within the
/// budget. Without reservation (the behaviour before it) all 20 go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_requests_at_once_hold_a_thousand_token_budget() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimProvider::start_named("primary", Flavor::OpenAi).await;
    // Slow enough that every request is in flight before the first answer counts.
    sim.set_default(Behavior::AnswerText(hundred_words()).after(Duration::from_millis(1500)));
    let yaml = manifests(&sim, Flavor::OpenAi, "  budget: { tokensPerDay: 1000 }\n");
    let (mut proxy, admin, data) = start_binary(dir.path(), &yaml, &[]);
    let http = reqwest::Client::new();

    let answers = at_once(&http, &data, 20, 100).await;
    let sent = sim.hits();
    let ok = answers.iter().filter(|a| a.0 == 200).count();
    assert_eq!(
        ok, sent,
        "every request let through was sent, and only those"
    );
    assert!(
        (1..=10).contains(&sent),
        "{sent} of 20 went upstream: {answers:?}"
    );
    for (status, code, retry_after, message) in answers.iter().filter(|a| a.0 != 200) {
        assert_eq!(
            (*status, code.as_str()),
            (429, "budget_exhausted"),
            "{message}"
        );
        assert_eq!(retry_after, "1", "the reservations in flight settle soon");
        assert!(
            message.contains("max_tokens (100)") && message.contains("requests in flight hold"),
            "{message}"
        );
    }
    let c = client_stats(&http, &admin).await;
    let budget = 1000;
    assert!(
        tokens(&c) <= budget,
        "counted {} of {budget}: {c}",
        tokens(&c)
    );
    assert_eq!(tokens(&c), sent as u64 * (100 + PROMPT_TOKENS), "{c}");
    assert_eq!(c["budgetExhausted"], 20 - sent as u64, "{c}");
    assert_eq!(c["reservedTokens"], Value::Null, "all settled: {c}");

    // A cap that alone exceeds what is left: refused, naming the field.
    let big = at_once(&http, &data, 1, 5000).await;
    let (status, code, _, message) = &big[0];
    assert_eq!((*status, code.as_str()), (429, "budget_exhausted"));
    assert!(
        message.contains("max_tokens (5000)") && message.contains("lower max_tokens"),
        "{message}"
    );
    // One at a time until refused: never past the budget.
    for _ in 0..10 {
        at_once(&http, &data, 1, 100).await;
    }
    let c = client_stats(&http, &admin).await;
    assert!(
        tokens(&c) <= budget,
        "counted {} of {budget}: {c}",
        tokens(&c)
    );
    assert_eq!(
        sim.hits() as u64 * (100 + PROMPT_TOKENS),
        tokens(&c),
        "only what was sent is counted"
    );
    proxy.stop();

    // The same without reservation: everything goes, the budget is spent twice over.
    let sim = SimProvider::start_named("primary", Flavor::OpenAi).await;
    sim.set_default(Behavior::AnswerText(hundred_words()).after(Duration::from_millis(1500)));
    let yaml = manifests(&sim, Flavor::OpenAi, "  budget: { tokensPerDay: 1000 }\n");
    let dir = tempfile::tempdir().unwrap();
    let (mut proxy, admin, data) =
        start_binary(dir.path(), &yaml, &["--budget-reservation", "off"]);
    let answers = at_once(&http, &data, 20, 100).await;
    assert_eq!(sim.hits(), 20, "{answers:?}");
    let c = client_stats(&http, &admin).await;
    assert_eq!(tokens(&c), 20 * (100 + PROMPT_TOKENS), "{c}");
    proxy.stop();
}

/// Polls team-a/app's stats until `done` says so, for up to 10 s.
async fn stats_until(proxy: &TestProxy, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let c = client_stats(&proxy.http, &proxy.admin_url("")).await;
        if done(&c) {
            return c;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "gave up: {c}");
        sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `body` to `path` as team-a/app in the background; the task is aborted to
/// walk away.
fn send(proxy: &TestProxy, path: &str, body: Value) -> tokio::task::JoinHandle<String> {
    let request = proxy
        .http
        .post(proxy.url(path))
        .bearer_auth(KEY)
        .header("x-api-key", KEY)
        .json(&body);
    tokio::spawn(async move {
        let r = request.send().await.expect("the proxy answers");
        r.text().await.unwrap_or_default()
    })
}

/// Reads a stream as team-a/app until `until` is in what came, then walks away (the
/// connection closes); what came.
async fn read_then_leave(proxy: &TestProxy, path: &str, body: Value, until: &str) -> String {
    let r = proxy
        .http
        .post(proxy.url(path))
        .bearer_auth(KEY)
        .header("x-api-key", KEY)
        .json(&body)
        .send()
        .await
        .expect("the proxy answers");
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let mut text = String::new();
    while !text.contains(until) {
        let chunk = timeout(Duration::from_secs(5), body.next())
            .await
            .unwrap_or_else(|_| panic!("{until:?} never came: {text}"))
            .expect("more of the stream")
            .expect("a chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text
}

/// A unary call whose client leaves while the provider is still thinking: the answer
/// is read to its end (the upstream call is not cancelled) and counted, and the
/// client's reservation settles then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_answer_its_client_left_is_read_to_its_end_and_counted() {
    let sim = SimProvider::start_named("primary", Flavor::OpenAi).await;
    sim.set_default(Behavior::Answer.after(Duration::from_millis(800)));
    let proxy = TestProxy::start(&manifests(
        &sim,
        Flavor::OpenAi,
        "  budget: { tokensPerDay: 100000 }\n",
    ))
    .await;
    let call = send(&proxy, "/v1/chat/completions", capped(100));
    timeout(Duration::from_secs(5), sim.wait_hits(1))
        .await
        .unwrap();
    call.abort();
    let c = stats_until(&proxy, |c| c["outputTokens"] == OUTPUT_TOKENS).await;
    assert_eq!(c["inputTokens"], PROMPT_TOKENS, "{c}");
    assert_eq!(
        c["estimatedRequests"],
        Value::Null,
        "reported, not estimated: {c}"
    );
    assert_eq!(c["reservedTokens"], Value::Null, "settled: {c}");
    assert_eq!(sim.cancelled(), 0, "the upstream call was not cancelled");
}

/// A stream whose client leaves after the last content chunk, before the usage that
/// follows (OpenAI's usage chunk, Anthropic's `message_delta`): read on for it, and
/// the provider's own count is what is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_left_after_its_content_is_read_on_for_its_usage() {
    for (flavor, path, body, end) in [
        (
            Flavor::OpenAi,
            "/v1/chat/completions",
            json!({"model": "smart", "stream": true,
                   "messages": [{"role": "user", "content": "hello"}]}),
            "\"finish_reason\":\"stop\"",
        ),
        (
            Flavor::Anthropic,
            "/v1/messages",
            json!({"model": "smart", "stream": true, "max_tokens": 64,
                   "messages": [{"role": "user", "content": "hello"}]}),
            "event: content_block_stop",
        ),
    ] {
        let sim = SimProvider::start_named("primary", flavor).await;
        sim.set_default(Behavior::UsageAfter(Duration::from_millis(800)));
        let proxy = TestProxy::start(&manifests(
            &sim,
            flavor,
            "  budget: { tokensPerDay: 100000 }\n",
        ))
        .await;
        let text = read_then_leave(&proxy, path, body, end).await;
        assert!(!text.contains("usage\":{\"prompt_tokens"), "{text}");
        let c = stats_until(&proxy, |c| c["outputTokens"] == OUTPUT_TOKENS).await;
        assert_eq!(c["inputTokens"], PROMPT_TOKENS, "{flavor:?}: {c}");
        assert_eq!(c["estimatedRequests"], Value::Null, "{flavor:?}: {c}");
        assert_eq!(c["reservedTokens"], Value::Null, "{flavor:?}: {c}");
        assert_eq!(sim.cancelled(), 0, "{flavor:?}: read to its end");
    }
}

/// A stream whose client leaves mid-answer: the upstream is cancelled at once, and
/// the usage is estimated from the prompt and the content relayed (bytes / 4),
/// marked estimated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_left_mid_answer_is_cancelled_and_estimated() {
    let sim = SimProvider::start_named("primary", Flavor::OpenAi).await;
    // The role chunk, `primary-0 ` and `primary-1 `, then nothing: mid-answer.
    sim.set_default(Behavior::StallMidStream { chunks: 3 });
    let proxy = TestProxy::start(&manifests(
        &sim,
        Flavor::OpenAi,
        "  budget: { tokensPerDay: 100000 }\n",
    ))
    .await;
    let body = json!({"model": "smart", "stream": true,
                      "messages": [{"role": "user", "content": "hello"}]});
    read_then_leave(&proxy, "/v1/chat/completions", body, "primary-1").await;
    timeout(Duration::from_secs(5), sim.wait_cancelled(1))
        .await
        .expect("the upstream stream is cancelled at once");
    let c = stats_until(&proxy, |c| c["estimatedRequests"] == 1).await;
    // The prompt as sent upstream, and "primary-0 primary-1 " (20 bytes).
    let sent = sim.received()[0].body.len() as u64;
    assert_eq!(c["inputTokens"], sent.div_ceil(4), "{c}");
    assert_eq!(c["outputTokens"], 5, "{c}");
    assert_eq!(c["estimatedTokens"], sent.div_ceil(4) + 5, "{c}");
    assert_eq!(c["reservedTokens"], Value::Null, "{c}");
}

/// What the request log says of clients that walked away (the real binary, its JSON
/// log): a unary call left waiting is logged (status 499), and a stream left
/// mid-answer says its usage was estimated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walking_away_is_in_the_request_log() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimProvider::start_named("primary", Flavor::OpenAi).await;
    sim.push(Behavior::Answer.after(Duration::from_millis(800)));
    sim.push(Behavior::StallMidStream { chunks: 3 });
    let yaml = manifests(&sim, Flavor::OpenAi, "  budget: { tokensPerDay: 100000 }\n");
    let (mut proxy, admin, data) = start_binary(dir.path(), &yaml, &["--drain-delay", "0s"]);
    let http = reqwest::Client::new();

    let call = {
        let request = http
            .post(format!("{data}/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&capped(100));
        tokio::spawn(async move { request.send().await.map(|r| r.status()) })
    };
    timeout(Duration::from_secs(5), sim.wait_hits(1))
        .await
        .unwrap();
    call.abort();
    let r = http
        .post(format!("{data}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "smart", "stream": true,
                      "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    let mut text = String::new();
    while !text.contains("primary-1") {
        let chunk = timeout(Duration::from_secs(5), body.next()).await.unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap().unwrap()));
    }
    drop(body);
    let start = Instant::now();
    let c = loop {
        let c = client_stats(&http, &admin).await;
        if c["estimatedRequests"] == 1 && c["outputTokens"].as_u64() >= Some(OUTPUT_TOKENS) {
            break c;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{c}");
        sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(c["requests"], 2, "{c}");
    // SIGTERM: the request log is flushed on the way out (a kill would lose its tail).
    let status = std::process::Command::new("kill")
        .args(["-TERM", &proxy.pid().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let start = Instant::now();
    while proxy.exited().is_none() {
        assert!(start.elapsed() < Duration::from_secs(10), "still running");
        sleep(Duration::from_millis(50)).await;
    }
    let log = std::fs::read_to_string(dir.path().join("proxy.log")).unwrap();
    let lines: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["target"] == "switchback::request")
        .collect();
    // The JSON log flattens each event's fields into the line.
    let field = |l: &Value, k: &str| l[k].clone();
    assert!(
        lines
            .iter()
            .any(|l| field(l, "status") == 499 && field(l, "client") == "team-a/app"),
        "the abandoned unary call is logged: {lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| field(l, "usage") == "estimated" && field(l, "stream") == "clientClosed"),
        "the stream left mid-answer says estimated: {lines:?}"
    );
}

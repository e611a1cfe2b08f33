//! Per-client usage, limits and budgets (docs/tenancy.md#budgets), standalone: usage counted per
//! LLMClient on `/admin/v1/stats` and `/metrics` (unary and streamed), requests and
//! tokens per minute and concurrency answered with 429 `rate_limited` without an
//! upstream call, the replica's share, the operator's rendered `exhausted`, the
//! standalone daily token budget, and the stream usage asked for on the client's
//! behalf (and kept from it). Waiting runs on tokio's paused clock.

use std::time::Duration;

use serde_json::Value;
use switchback_crds::config::Exhausted;
use switchback_proxy::sources::standalone::compile_manifests_for;
use switchback_tests::harness::{TestProxy, chat_body, header, priced_client};
use switchback_tests::sim::{Behavior, Flavor, PROMPT_TOKENS, SimProvider};

const KEY: &str = "sk-team-a-app-0123456789";

/// `Hello from primary.`: three words.
const OUTPUT_TOKENS: u64 = 3;
const TOKENS: u64 = PROMPT_TOKENS + OUTPUT_TOKENS;

/// One OpenAI provider behind `smart` (priced), and team-a/app with `spec` lines
/// (limits, budget) added.
async fn setup(client_spec: &str) -> (SimProvider, TestProxy) {
    setup_with(Flavor::OpenAi, client_spec).await
}

/// [`setup`] with a provider of the given flavour.
async fn setup_with(flavor: Flavor, client_spec: &str) -> (SimProvider, TestProxy) {
    let primary = SimProvider::start_named("primary", flavor).await;
    let provider = match flavor {
        Flavor::OpenAi => "openai",
        Flavor::Azure => "azure-openai",
        Flavor::Gemini => "gemini",
        Flavor::Bedrock => unreachable!("bedrock takes the whole Secret: see tests/bedrock.rs"),
        Flavor::Anthropic => "anthropic",
        Flavor::Vertex => "vertex",
    };
    let manifests = priced_client(provider, &primary.base_url(), KEY, client_spec);
    let proxy = TestProxy::start(&manifests).await;
    (primary, proxy)
}

async fn chat(proxy: &TestProxy, body: &Value) -> reqwest::Response {
    proxy
        .http
        .post(proxy.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .expect("proxy answers")
}

async fn ask(proxy: &TestProxy) -> reqwest::Response {
    chat(proxy, &chat_body("smart", false)).await
}

/// The stats of team-a/app.
async fn client_stats(proxy: &TestProxy) -> Value {
    let stats = proxy.admin_stats().await;
    stats["clients"]
        .as_array()
        .and_then(|cs| {
            cs.iter()
                .find(|c| c["client"]["namespace"] == "team-a" && c["client"]["name"] == "app")
        })
        .cloned()
        .unwrap_or_else(|| panic!("team-a/app in {stats}"))
}

/// A 429 of the given code, with its Retry-After in seconds.
async fn refused(r: reqwest::Response, code: &str) -> u64 {
    assert_eq!(r.status(), 429);
    let retry_after: u64 = header(&r, "retry-after")
        .parse()
        .expect("a Retry-After in seconds");
    assert!(retry_after >= 1);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    retry_after
}

/// Re-apply the manifests with the operator's rendering of team-a/app changed.
fn render(proxy: &TestProxy, change: impl FnOnce(&mut switchback_crds::config::Client)) {
    let gw = &proxy.running.gateway;
    let (mut compiled, warnings) = compile_manifests_for(&proxy.manifest, &gw.auth).unwrap();
    change(&mut compiled.config.clients[0]);
    gw.apply(&compiled, warnings).unwrap();
}

fn metric(text: &str, name: &str, labels: &[&str]) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name} {labels:?} in\n{text}"))
}

#[tokio::test(start_paused = true)]
async fn usage_is_counted_per_client_unary_and_streamed_and_survives_a_reload() {
    let (primary, proxy) = setup("").await;
    assert_eq!(ask(&proxy).await.status(), 200);
    // A stream that did not ask for usage: asked for on its behalf, not shown to it.
    let r = chat(&proxy, &chat_body("smart", true)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(!text.contains("\"usage\""), "usage chunk stripped: {text}");
    assert!(text.contains("Hello"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let asked = primary.received()[1].json.clone().unwrap();
    assert_eq!(asked["stream_options"]["include_usage"], true, "{asked}");
    // A stream that asked gets it.
    let mut body = chat_body("smart", true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let text = chat(&proxy, &body).await.text().await.unwrap();
    assert!(text.contains("\"usage\""), "the client asked: {text}");

    let c = client_stats(&proxy).await;
    assert_eq!(c["requests"], 3, "{c}");
    assert_eq!(c["inputTokens"], 3 * PROMPT_TOKENS, "{c}");
    assert_eq!(c["outputTokens"], 3 * OUTPUT_TOKENS, "{c}");
    // 2.50 and 10.00 USD per million: micro-USD per token.
    let per_request = (PROMPT_TOKENS as f64 * 2.5 + OUTPUT_TOKENS as f64 * 10.0) as u64;
    assert_eq!(c["microUsd"], 3 * per_request, "{c}");
    assert_eq!(
        (c["rateLimited"].as_u64(), c["budgetExhausted"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(c["lastRequestAt"].as_str().is_some(), "{c}");

    let metrics = proxy.admin_text("/metrics").await;
    let labels = ["client=\"team-a/app\"", "route=\"team-a/smart\""];
    assert_eq!(
        metric(
            &metrics,
            "switchback_client_tokens_total",
            &[labels[0], labels[1], "direction=\"input\""]
        ),
        3 * PROMPT_TOKENS
    );
    assert!(!metrics.contains(KEY), "never the key");

    render(&proxy, |_| {});
    let after = client_stats(&proxy).await;
    assert_eq!(after, c, "a reload keeps the counters");
}

/// An OpenAI client's stream answered by an Anthropic provider: usage counted from
/// the provider's events, and the client, which did not ask, gets no usage chunk.
#[tokio::test(start_paused = true)]
async fn a_translated_stream_counts_usage_and_answers_as_the_client_asked() {
    let (primary, proxy) = setup_with(Flavor::Anthropic, "").await;
    let r = chat(&proxy, &chat_body("smart", true)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("Hello"), "{text}");
    assert!(!text.contains("\"usage\""), "not asked for: {text}");
    assert_eq!(primary.received()[0].path, "/v1/messages");
    let c = client_stats(&proxy).await;
    assert_eq!(c["inputTokens"], PROMPT_TOKENS, "{c}");
    // message_start's output count (1) is part of message_delta's running total.
    assert_eq!(c["outputTokens"], OUTPUT_TOKENS, "{c}");
}

#[tokio::test(start_paused = true)]
async fn requests_per_minute_over_the_limit_get_429_without_an_upstream_call() {
    let (primary, proxy) = setup("  limits: { requestsPerMinute: 2 }\n").await;
    assert_eq!(ask(&proxy).await.status(), 200);
    assert_eq!(ask(&proxy).await.status(), 200);
    let r = ask(&proxy).await;
    assert_eq!(header(&r, "x-switchback-attempts"), "0");
    let retry_after = refused(r, "rate_limited").await;
    assert!(retry_after <= 30, "one request every 30 s: {retry_after}");
    assert_eq!(primary.hits(), 2, "never sent upstream");
    let c = client_stats(&proxy).await;
    assert_eq!(
        (c["requests"].as_u64(), c["rateLimited"].as_u64()),
        (Some(2), Some(1))
    );
    let metrics = proxy.admin_text("/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "switchback_client_throttled_total",
            &["team-a/app", "reason=\"rate_limited\""]
        ),
        1
    );

    tokio::time::advance(Duration::from_secs(retry_after)).await;
    assert_eq!(ask(&proxy).await.status(), 200, "a token is back");
}

#[tokio::test(start_paused = true)]
async fn tokens_per_minute_are_charged_after_the_answer() {
    // 20 per minute: the first answer leaves 7, the second is admitted (not negative)
    // and leaves -6; the third waits for 6 tokens at one every 3 s.
    let (primary, proxy) = setup("  limits: { tokensPerMinute: 20 }\n").await;
    assert_eq!(ask(&proxy).await.status(), 200);
    assert_eq!(ask(&proxy).await.status(), 200);
    let retry_after = refused(ask(&proxy).await, "rate_limited").await;
    assert!(retry_after <= 18, "{retry_after}");
    assert_eq!(primary.hits(), 2);
    tokio::time::advance(Duration::from_secs(retry_after)).await;
    assert_eq!(ask(&proxy).await.status(), 200);
    assert_eq!(client_stats(&proxy).await["inputTokens"], 3 * PROMPT_TOKENS);
}

#[tokio::test(start_paused = true)]
async fn a_stream_holds_its_concurrency_slot_until_it_ends() {
    let (primary, proxy) = setup("  limits: { maxConcurrency: 1 }\n").await;
    primary.push(Behavior::Stream {
        chunks: 3,
        interval: Duration::from_secs(5),
    });
    let stream = chat(&proxy, &chat_body("smart", true)).await;
    assert_eq!(stream.status(), 200);
    let retry_after = refused(ask(&proxy).await, "rate_limited").await;
    assert_eq!(retry_after, 1);
    assert_eq!(primary.hits(), 1, "never sent upstream");
    let text = stream.text().await.unwrap();
    assert!(text.contains("[DONE]"), "{text}");
    assert_eq!(ask(&proxy).await.status(), 200, "the slot is free again");
    assert_eq!(client_stats(&proxy).await["rateLimited"], 1);
}

#[tokio::test(start_paused = true)]
async fn each_replica_enforces_its_share_of_the_limit() {
    let (primary, proxy) = setup("  limits: { requestsPerMinute: 4 }\n").await;
    render(&proxy, |c| c.replicas = 2);
    assert_eq!(ask(&proxy).await.status(), 200);
    assert_eq!(ask(&proxy).await.status(), 200);
    refused(ask(&proxy).await, "rate_limited").await;
    assert_eq!(primary.hits(), 2, "4 per minute over 2 replicas is 2 here");
}

#[tokio::test(start_paused = true)]
async fn a_rendered_exhausted_budget_refuses_until_the_period_ends() {
    let (primary, proxy) = setup("").await;
    let until = proxy.running.gateway.clock().now() + Duration::from_secs(3600);
    render(&proxy, |c| {
        c.exhausted = Some(Exhausted {
            budget: "usdPerMonth".into(),
            until: humantime::format_rfc3339(until).to_string(),
        })
    });
    let retry_after = refused(ask(&proxy).await, "budget_exhausted").await;
    assert!((3590..=3600).contains(&retry_after), "{retry_after}");
    assert_eq!(primary.hits(), 0);
    let c = client_stats(&proxy).await;
    assert_eq!(
        (c["requests"].as_u64(), c["budgetExhausted"].as_u64()),
        (Some(0), Some(1))
    );

    tokio::time::advance(Duration::from_secs(3601)).await;
    assert_eq!(ask(&proxy).await.status(), 200, "the period is over");
}

#[tokio::test(start_paused = true)]
async fn standalone_the_daily_token_budget_is_spent_then_renewed_at_utc_midnight() {
    // A request without max_tokens reserves the default reservation (1 here) plus
    // its input estimate (bytes / 4): a budget of one answer plus one reservation
    // admits a second request after the first spent 13, not a third.
    let reserves = 1 + (chat_body("smart", false).to_string().len() as u64).div_ceil(4);
    let (primary, proxy) = setup(&format!(
        "  budget: {{ tokensPerDay: {}, defaultReservation: 1 }}\n",
        TOKENS + reserves
    ))
    .await;
    assert_eq!(ask(&proxy).await.status(), 200);
    assert_eq!(
        ask(&proxy).await.status(),
        200,
        "13 spent, room for a reservation"
    );
    let retry_after = refused(ask(&proxy).await, "budget_exhausted").await;
    assert!(retry_after <= 86_400, "{retry_after}");
    assert_eq!(primary.hits(), 2);
    // At the next UTC midnight (by the proxy's clock, which the test moves).
    tokio::time::advance(Duration::from_secs(retry_after)).await;
    assert_eq!(ask(&proxy).await.status(), 200, "a new UTC day");
    assert_eq!(client_stats(&proxy).await["budgetExhausted"], 1);
}

//! Per-client usage (SPEC §9), standalone: usage counted per LLMClient on
//! `/admin/v1/stats` and `/metrics` (unary and streamed). Waiting runs on tokio's
//! paused clock.

use serde_json::Value;
use switchback_proxy::reload::compile_manifests_for;
use switchback_tests::harness::{TestProxy, chat_body, credential, route};
use switchback_tests::sim::{Flavor, PROMPT_TOKENS, SimProvider};

const KEY: &str = "sk-team-a-app-0123456789";

/// `Hello from primary.`: three words.
const OUTPUT_TOKENS: u64 = 3;

/// One OpenAI provider behind `smart` (priced), and team-a/app with `spec` lines
/// (limits, budget) added.
async fn setup(client_spec: &str) -> (SimProvider, TestProxy) {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let manifests = [
        credential("primary", "openai", &primary.base_url(), "sk-primary"),
        route(
            "smart",
            "  timeout: 60s
  targets:
    - credentialRef: { name: primary }
      price: { inputPerMillion: \"2.50\", outputPerMillion: \"10.00\" }
",
        ),
        format!(
            "---
apiVersion: v1
kind: Secret
metadata: {{ name: app-llm, namespace: team-a }}
stringData: {{ apiKey: \"{KEY}\" }}
---
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: {{ name: app, namespace: team-a }}
spec:
  keySecretRef: {{ name: app-llm, key: apiKey }}
{client_spec}"
        ),
    ]
    .concat();
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
    let (_primary, proxy) = setup("").await;
    assert_eq!(ask(&proxy).await.status(), 200);
    // A stream that asks for usage: counted from its last chunk.
    let mut body = chat_body("smart", true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let text = chat(&proxy, &body).await.text().await.unwrap();
    assert!(text.contains("\"usage\""), "the client asked: {text}");
    assert!(text.contains("Hello"), "{text}");
    // Another client request, answered without usage: nothing to count.
    let text = chat(&proxy, &chat_body("smart", true))
        .await
        .text()
        .await
        .unwrap();
    assert!(text.contains("Hello"), "{text}");

    let c = client_stats(&proxy).await;
    assert_eq!(c["requests"], 3, "{c}");
    assert_eq!(c["inputTokens"], 2 * PROMPT_TOKENS, "{c}");
    assert_eq!(c["outputTokens"], 2 * OUTPUT_TOKENS, "{c}");
    // 2.50 and 10.00 USD per million: micro-USD per token.
    let per_request = (PROMPT_TOKENS as f64 * 2.5 + OUTPUT_TOKENS as f64 * 10.0) as u64;
    assert_eq!(c["microUsd"], 2 * per_request, "{c}");
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
        2 * PROMPT_TOKENS
    );
    assert!(!metrics.contains(KEY), "never the key");

    render(&proxy, |_| {});
    let after = client_stats(&proxy).await;
    assert_eq!(after, c, "a reload keeps the counters");
}

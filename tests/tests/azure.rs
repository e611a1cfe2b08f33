//! `provider: azure-openai` and `modelMap` through the whole proxy, against the strict
//! Azure simulator (`Flavor::Azure`): both client surfaces unary and streamed, on the
//! v1 API and the classic deployment paths; the `api-key` header; Azure's
//! millisecond Retry-After headers; its content filter (returned unless listed); its
//! context-length wording; chains across three providers; and the upstream model
//! following the name the client sent. Waiting runs on tokio's paused clock.

use std::time::Duration;

use serde_json::{Value, json};
use switchback_tests::harness::{
    TestProxy, chat_body, credential, header, json_of, messages_body, route, streamed_text,
};
use switchback_tests::sim::{
    Behavior, ContextWording, Flavor, SimProvider, azure_content_filter_error,
};
use tokio::time::Instant;

const AZURE_KEY: &str = "azure-key-0123456789abcdef";

/// An azure-openai credential for `sim`; `api_version` `None` = the v1 API.
fn azure_credential(name: &str, sim: &SimProvider, api_version: Option<&str>) -> String {
    let c = credential(name, "azure-openai", &sim.base_url(), AZURE_KEY);
    match api_version {
        Some(v) => c.replacen(
            "  provider: azure-openai\n",
            &format!("  provider: azure-openai\n  apiVersion: \"{v}\"\n"),
            1,
        ),
        None => c,
    }
}

/// One Azure deployment behind route `smart`, asked on both surfaces, unary and
/// streamed; returns what the simulator received.
async fn both_surfaces(api_version: Option<&str>) -> Vec<switchback_tests::sim::Received> {
    let azure = SimProvider::start_named("azure", Flavor::Azure).await;
    let manifests = format!(
        "{}{}",
        azure_credential("az", &azure, api_version),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: az }\n      model: gpt-4o\n"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;

    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/az");
    let body = json_of(r).await;
    assert_eq!(body["model"], "smart");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from azure."
    );
    // Azure's own fields reach an OpenAI client as Azure sent them.
    assert!(body["prompt_filter_results"].is_array(), "{body}");

    let r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert_eq!(streamed_text(&text), "Hello from azure.", "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    for line in text.lines().filter(|l| l.starts_with("data: {")) {
        let chunk: Value = serde_json::from_str(&line[6..]).unwrap();
        assert_eq!(
            chunk["model"], "smart",
            "every chunk names the client's model"
        );
    }

    let r = proxy.messages("smart", false).await;
    assert_eq!(r.status(), 200);
    let body = json_of(r).await;
    assert_eq!(body["type"], "message");
    assert_eq!(body["model"], "smart");
    assert_eq!(body["content"][0]["text"], "Hello from azure.");

    let r = proxy.messages("smart", true).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: message_start"), "{text}");
    assert_eq!(streamed_text(&text), "Hello from azure.", "{text}");
    assert!(text.contains("event: message_stop"), "{text}");

    let got = azure.received();
    assert_eq!(got.len(), 4);
    for r in &got {
        assert_eq!(r.header("api-key"), Some(AZURE_KEY), "{}", r.path);
        assert_eq!(r.header("authorization"), None, "never Authorization");
        assert_eq!(r.header("x-api-key"), None);
    }
    // The key is nowhere on the admin port.
    for path in ["/admin/v1/config", "/admin/v1/stats", "/metrics"] {
        assert!(!proxy.admin_text(path).await.contains(AZURE_KEY), "{path}");
    }
    got
}

#[tokio::test]
async fn v1_api_serves_both_surfaces_unary_and_streamed() {
    for api_version in [None, Some("v1")] {
        let got = both_surfaces(api_version).await;
        for r in &got {
            assert_eq!(r.path, "/openai/v1/chat/completions", "{api_version:?}");
            assert_eq!(
                r.model(),
                Some("gpt-4o"),
                "the deployment is the body's model"
            );
        }
        // The translated request asks the way Azure's newer deployments need.
        let translated = got[2].json.as_ref().unwrap();
        assert_eq!(translated["max_completion_tokens"], 64, "{translated}");
    }
}

#[tokio::test]
async fn classic_api_puts_the_deployment_and_api_version_in_the_path() {
    let got = both_surfaces(Some("2024-10-21")).await;
    for r in &got {
        assert_eq!(
            r.path,
            "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"
        );
    }
}

#[tokio::test]
async fn classic_embeddings_go_to_the_deployment() {
    let azure = SimProvider::start_named("azure", Flavor::Azure).await;
    let manifests = format!(
        "{}{}",
        azure_credential("az", &azure, Some("2025-04-01-preview")),
        route(
            "embed",
            "  targets:\n    - credentialRef: { name: az }\n      model: text-embedding-3-small\n"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    let r = proxy
        .post(
            "/v1/embeddings",
            &json!({"model": "embed", "input": ["a", "b"]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(json_of(r).await["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        azure.received()[0].path,
        "/openai/deployments/text-embedding-3-small/embeddings?api-version=2025-04-01-preview"
    );
}

/// What the real service refuses, the simulator refuses, without taking a behaviour.
#[tokio::test]
async fn the_simulator_refuses_what_azure_refuses() {
    let azure = SimProvider::start(Flavor::Azure).await;
    let http = reqwest::Client::new();
    let base = azure.base_url();
    let classic = |q: &str| format!("{base}/deployments/gpt-4o/chat/completions{q}");
    let body = chat_body("gpt-4o", false);
    // (url, request headers, status, error.code)
    type Case<'a> = (String, Vec<(&'a str, &'a str)>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (azure.endpoint(), vec![], 401, "401"),
        (
            azure.endpoint(),
            vec![("authorization", "Bearer sk-x")],
            401,
            "401",
        ),
        (classic(""), vec![("api-key", "k")], 404, "404"),
        (
            classic("?api-version=2019-01-01"),
            vec![("api-key", "k")],
            404,
            "404",
        ),
        (
            format!("{base}/deployments/nope/chat/completions?api-version=2024-10-21"),
            vec![("api-key", "k")],
            404,
            "DeploymentNotFound",
        ),
        (
            format!("{base}/chat/completions"),
            vec![("api-key", "k")],
            404,
            "404",
        ),
    ];
    azure.push(Behavior::ServerError(500));
    for (url, headers, status, code) in cases {
        let mut req = http.post(&url).json(&body);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), status, "{url}");
        assert_eq!(json_of(r).await["error"]["code"], code, "{url}");
    }
    assert_eq!(azure.queued(), 1, "refusals take no behaviour");
    let r = http
        .post(classic("?api-version=2024-10-21"))
        .header("api-key", "k")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    assert_eq!(azure.hits(), 7, "every request was recorded");
}

/// An unknown deployment is Azure's 404: the request's fault, returned as it came.
#[tokio::test]
async fn an_unknown_deployment_is_returned_unchanged() {
    let azure = SimProvider::start(Flavor::Azure).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let manifests = format!(
        "{}{}{}",
        azure_credential("az", &azure, Some("2024-10-21")),
        credential("backup", "openai", &backup.base_url(), "sk-backup"),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: az }\n      model: gpt-5-typo\n    - credentialRef: { name: backup }\n"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 404);
    assert_eq!(json_of(r).await["error"]["code"], "DeploymentNotFound");
    assert_eq!(backup.hits(), 0);
}

/// Two-target route: an Azure primary (v1 API) and an OpenAI backup.
async fn azure_then_openai(spec_extra: &str) -> (SimProvider, SimProvider, TestProxy) {
    let azure = SimProvider::start_named("azure", Flavor::Azure).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let manifests = format!(
        "{}{}{}",
        azure_credential("az", &azure, None),
        credential("backup", "openai", &backup.base_url(), "sk-backup"),
        route(
            "smart",
            &format!(
                "  targets:
    - credentialRef: {{ name: az }}
      model: gpt-4o
      retry: {{ attempts: 2, initialBackoff: 5s, maxBackoff: 5s }}
    - credentialRef: {{ name: backup }}
      model: gpt-backup
  fallback:
    maxRetryAfter: 10s
{spec_extra}"
            )
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    (azure, backup, proxy)
}

#[tokio::test(start_paused = true)]
async fn azure_millisecond_retry_afters_are_honoured_before_retry_after() {
    let (azure, backup, proxy) = azure_then_openai("").await;
    for (header_name, ms) in [("retry-after-ms", 250u64), ("x-ms-retry-after-ms", 400)] {
        // Retry-After says 8s, the computed backoff would be up to 5s: the
        // millisecond header is what is waited.
        azure.push(Behavior::RateLimitedMs {
            ms,
            header: header_name,
            secs: 8,
        });
        let started = Instant::now();
        let r = proxy.chat("smart", false).await;
        let took = started.elapsed();
        assert_eq!(r.status(), 200, "{header_name}");
        assert_eq!(header(&r, "x-switchback-target"), "team-a/az");
        assert_eq!(header(&r, "x-switchback-attempts"), "2");
        assert!(
            took >= Duration::from_millis(ms) && took < Duration::from_millis(ms + 500),
            "{header_name}: waited {took:?}"
        );
    }
    assert_eq!(backup.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_azure_retry_after_beyond_the_cap_abandons_and_parks_within_it() {
    let (azure, backup, proxy) = azure_then_openai("").await;
    // 2 minutes in milliseconds, over maxRetryAfter (10s): no wait, straight on.
    azure.push(Behavior::RateLimitedMs {
        ms: 120_000,
        header: "x-ms-retry-after-ms",
        secs: 120,
    });
    let started = Instant::now();
    let r = proxy.chat("smart", false).await;
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-attempts"), "2");
    // Parked for later requests, but never past the cap.
    let r = proxy.chat("smart", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(azure.hits(), 1, "parked");
    tokio::time::sleep(Duration::from_secs(11)).await;
    let r = proxy.chat("smart", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/az");
    assert_eq!(azure.hits(), 2, "the park ended at maxRetryAfter");
    assert_eq!(backup.hits(), 2);
}

#[tokio::test]
async fn a_content_filter_refusal_is_returned_unchanged_and_not_failed_over() {
    let (azure, backup, proxy) = azure_then_openai("").await;
    azure.push(Behavior::ContentFilter);
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 400);
    assert_eq!(header(&r, "x-switchback-attempts"), "1", "never retried");
    assert_eq!(header(&r, "x-switchback-target"), "team-a/az");
    assert_eq!(json_of(r).await, azure_content_filter_error());
    // The Anthropic surface gets it in its own shape, still the request's fault.
    azure.push(Behavior::ContentFilter);
    let r = proxy.messages("smart", true).await;
    assert_eq!(r.status(), 400);
    let body = json_of(r).await;
    assert_eq!(body["type"], "error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("content management policy"),
        "{body}"
    );
    assert_eq!(backup.hits(), 0);
    assert_eq!(azure.hits(), 2);
    let stats = proxy.admin_stats().await.to_string();
    assert!(stats.contains("contentFilter"), "{stats}");
}

#[tokio::test]
async fn a_content_filter_refusal_fails_over_when_the_route_lists_it() {
    let (azure, backup, proxy) =
        azure_then_openai("    onFailures: [status5xx, rateLimited, contentFilter]\n").await;
    azure.push(Behavior::ContentFilter);
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-attempts"), "2");
    assert_eq!(backup.hits(), 1);
    azure.push(Behavior::ContentFilter);
    let r = proxy.messages("smart", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        streamed_text(&r.text().await.unwrap()),
        "Hello from backup."
    );
}

/// A 200 cut by the output filter is an answer: committed, not a failure.
#[tokio::test]
async fn a_filtered_answer_is_a_normal_answer() {
    let (azure, backup, proxy) =
        azure_then_openai("    onFailures: [status5xx, contentFilter]\n").await;
    azure.push(Behavior::FilteredAnswer);
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    let body = json_of(r).await;
    assert_eq!(body["choices"][0]["finish_reason"], "content_filter");
    azure.push(Behavior::FilteredAnswer);
    let r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(
        text.contains(r#""finish_reason":"content_filter""#),
        "{text}"
    );
    assert_eq!(backup.hits(), 0);
}

#[tokio::test]
async fn azure_context_length_wording_advances_as_context_length() {
    let (azure, backup, proxy) = azure_then_openai("").await;
    azure.push(Behavior::ContextLength(ContextWording::OpenAi));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-attempts"), "2", "not retried");
    assert_eq!(backup.hits(), 1);
    let stats = proxy.admin_stats().await.to_string();
    assert!(stats.contains("contextLength"), "{stats}");

    // Without contextLength in the list, the chain stops on it: Azure's answer as is.
    let (azure, backup, proxy) = azure_then_openai("    onFailures: [status5xx]\n").await;
    azure.push(Behavior::ContextLength(ContextWording::OpenAi));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 400);
    assert_eq!(json_of(r).await["error"]["code"], "context_length_exceeded");
    assert_eq!(backup.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn azure_429_then_openai_5xx_then_anthropic_serves_both_surfaces() {
    let azure = SimProvider::start_named("azure", Flavor::Azure).await;
    let openai = SimProvider::start_named("openai", Flavor::OpenAi).await;
    let anthropic = SimProvider::start_named("claude", Flavor::Anthropic).await;
    let manifests = format!(
        "{}{}{}{}",
        azure_credential("az", &azure, Some("2024-10-21")),
        credential("oa", "openai", &openai.base_url(), "sk-openai"),
        credential("an", "anthropic", &anthropic.base_url(), "sk-ant"),
        route(
            "smart",
            "  targets:
    - credentialRef: { name: az }
      model: gpt-4o
      retry: { attempts: 2 }
    - credentialRef: { name: oa }
      model: gpt-4o
    - credentialRef: { name: an }
      model: claude-sonnet-4-5
  fallback:
    maxRetryAfter: 5s
"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    for (i, (surface, stream)) in [
        ("chat", false),
        ("chat", true),
        ("messages", false),
        ("messages", true),
    ]
    .into_iter()
    .enumerate()
    {
        // Azure: 429 twice (the wait of 200ms honoured, then out of attempts);
        // OpenAI: 503; Anthropic answers.
        for _ in 0..2 {
            azure.push(Behavior::RateLimitedMs {
                ms: 200,
                header: "retry-after-ms",
                secs: 1,
            });
        }
        openai.push(Behavior::ServerError(503));
        let r = match surface {
            "chat" => proxy.chat("smart", stream).await,
            _ => proxy.messages("smart", stream).await,
        };
        assert_eq!(r.status(), 200, "{surface} {stream}");
        assert_eq!(header(&r, "x-switchback-target"), "team-a/an");
        assert_eq!(header(&r, "x-switchback-attempts"), "4");
        assert_eq!(header(&r, "x-switchback-fallbacks"), "2");
        let text = r.text().await.unwrap();
        if stream {
            assert_eq!(streamed_text(&text), "Hello from claude.", "{text}");
        } else {
            assert!(text.contains("Hello from claude."), "{text}");
        }
        assert_eq!(azure.hits(), 2 * (i + 1));
        assert_eq!(openai.hits(), i + 1);
        assert_eq!(anthropic.hits(), i + 1);
        // The 429s parked the Azure target for 200ms: let that pass.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(anthropic.received()[0].model(), Some("claude-sonnet-4-5"));
}

/// Two providers with a `modelMap` each: the upstream model (Azure: the deployment
/// in the path) follows the name the client sent.
#[tokio::test]
async fn model_map_picks_the_upstream_model_by_the_clients_name() {
    let azure = SimProvider::start_named("azure", Flavor::Azure).await;
    let anthropic = SimProvider::start_named("claude", Flavor::Anthropic).await;
    let openai = SimProvider::start_named("openai", Flavor::OpenAi).await;
    let manifests = format!(
        "{}{}{}{}{}",
        azure_credential("az", &azure, Some("2024-10-21")),
        credential("an", "anthropic", &anthropic.base_url(), "sk-ant"),
        credential("oa", "openai", &openai.base_url(), "sk-openai"),
        route(
            "tiers",
            "  models: [smart, fast]
  targets:
    - credentialRef: { name: az }
      modelMap: { smart: gpt-4o, fast: gpt-4o-mini }
    - credentialRef: { name: an }
      modelMap: { smart: claude-sonnet-4-5, fast: claude-haiku-4-5 }
",
        ),
        route(
            "gpt",
            "  models: [big, small]
  targets:
    - credentialRef: { name: oa }
      modelMap: { big: gpt-4.1, small: gpt-4.1-nano }
",
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    for (name, deployment) in [("smart", "gpt-4o"), ("fast", "gpt-4o-mini")] {
        let r = proxy.chat(name, false).await;
        assert_eq!(r.status(), 200);
        assert_eq!(json_of(r).await["model"], name);
        let got = azure.take_received();
        assert_eq!(
            got[0].path,
            format!("/openai/deployments/{deployment}/chat/completions?api-version=2024-10-21")
        );
        assert_eq!(got[0].model(), Some(deployment));
    }
    azure.set_default(Behavior::ServerError(503));
    for (name, model) in [("smart", "claude-sonnet-4-5"), ("fast", "claude-haiku-4-5")] {
        for stream in [false, true] {
            let r = proxy.chat(name, stream).await;
            assert_eq!(r.status(), 200);
            assert_eq!(header(&r, "x-switchback-target"), "team-a/an");
            let got = anthropic.take_received();
            assert_eq!(got[0].model(), Some(model), "{name}");
        }
        let r = proxy.messages(name, false).await;
        assert_eq!(r.status(), 200);
        assert_eq!(json_of(r).await["model"], name);
        assert_eq!(anthropic.take_received()[0].model(), Some(model));
    }
    for (name, model) in [("big", "gpt-4.1"), ("small", "gpt-4.1-nano")] {
        let r = proxy.post("/v1/messages", &messages_body(name, true)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(openai.take_received()[0].model(), Some(model));
    }
    // The loaded config says which name maps to which model.
    let config = proxy.admin_config().await.to_string();
    assert!(config.contains("claude-haiku-4-5"), "{config}");
}

/// Without `model` or `modelMap` the deployment is the name the client sent, made
/// into one path segment however it is spelt.
#[tokio::test]
async fn the_clients_name_is_the_deployment_when_the_target_names_none() {
    let azure = SimProvider::start(Flavor::Azure).await;
    azure.set_deployments(&["team/gpt 4o"]);
    let manifests = format!(
        "{}{}",
        azure_credential("az", &azure, Some("2024-06-01")),
        route(
            "odd",
            "  models: [\"team/gpt 4o\"]\n  targets:\n    - credentialRef: { name: az }\n"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    let r = proxy.chat("team/gpt 4o", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        azure.received()[0].path,
        "/openai/deployments/team%2Fgpt%204o/chat/completions?api-version=2024-06-01"
    );
}

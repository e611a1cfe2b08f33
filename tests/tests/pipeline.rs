//! The attempt pipeline end to end: every row of the outcome table
//! (docs/request-lifecycle.md#what-each-outcome-does), every terminal status, and the
//! response headers, against simulated providers. Waiting (backoff, Retry-After, timeouts,
//! budgets) runs on tokio's paused clock.

use std::time::Duration;

use serde_json::{Value, json};
use switchback_tests::harness::{TestProxy, chat_body, credential, header, json_of, route};
use switchback_tests::sim::{Behavior, ContextWording, Flavor, SimProvider};
use tokio::time::Instant;

/// Two OpenAI-flavoured providers, `primary` and `backup`, behind route `smart`.
async fn setup(spec: &str) -> (SimProvider, SimProvider, TestProxy) {
    let (primary, backup, manifests) = two_providers(spec).await;
    (primary, backup, TestProxy::start(&manifests).await)
}

/// The providers and manifests of [`setup`], for a proxy started another way.
async fn two_providers(spec: &str) -> (SimProvider, SimProvider, String) {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let manifests = format!(
        "{}{}{}",
        credential("primary", "openai", &primary.base_url(), "sk-primary"),
        credential("backup", "openai", &backup.base_url(), "sk-backup"),
        route("smart", spec)
    );
    (primary, backup, manifests)
}

const TWO_TARGETS: &str = "  targets:
    - credentialRef: { name: primary }
      model: gpt-primary
      retry: { attempts: 3, initialBackoff: 100ms, maxBackoff: 1s }
    - credentialRef: { name: backup }
      model: gpt-backup
";

#[tokio::test(start_paused = true)]
async fn first_target_answers_with_headers_and_the_clients_model_name() {
    let (primary, backup, proxy) = setup(TWO_TARGETS).await;
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-route"), "team-a/smart");
    assert_eq!(header(&r, "x-switchback-attempts"), "1");
    assert_eq!(header(&r, "x-switchback-fallbacks"), "0");
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    assert_eq!(header(&r, "x-request-id").len(), 36, "a request id is made");
    let body = json_of(r).await;
    assert_eq!(
        body["model"], "smart",
        "the response names the model the client sent"
    );
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("primary")
    );
    let got = primary.received();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].model(),
        Some("gpt-primary"),
        "upstream gets the target's model"
    );
    assert_eq!(got[0].path, "/v1/chat/completions");
    assert_eq!(backup.hits(), 0);

    let r = proxy
        .http
        .post(proxy.url("/v1/chat/completions"))
        .header("x-request-id", "req-123")
        .json(&chat_body("smart", false))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&r, "x-request-id"), "req-123");
    assert_eq!(
        primary.received()[1].header("x-request-id"),
        Some("req-123")
    );
}

/// The model the router read is the one rewritten, however the client spelled its key,
/// and nothing nested is touched (issue 11, item 7).
#[tokio::test(start_paused = true)]
async fn the_upstream_model_replaces_exactly_the_member_the_router_read() {
    let (primary, _backup, proxy) = setup(TWO_TARGETS).await;
    let body = r#"{"m\u006fdel":"smart","metadata":{"model":"the-clients-own"},"messages":[{"role":"user","content":"hi"}]}"#;
    let r = proxy
        .http
        .post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-route"), "team-a/smart");
    let got = &primary.received()[0];
    assert_eq!(got.model(), Some("gpt-primary"), "{:?}", got.json);
    assert_eq!(
        got.json.as_ref().unwrap()["metadata"]["model"],
        "the-clients-own"
    );
}

#[tokio::test(start_paused = true)]
async fn server_errors_are_retried_with_backoff_then_fall_back() {
    let (primary, backup, proxy) = setup(TWO_TARGETS).await;
    primary.set_default(Behavior::ServerError(503));
    let started = Instant::now();
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-attempts"), "4");
    assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(primary.hits(), 3);
    assert_eq!(backup.hits(), 1);
    assert_eq!(backup.received()[0].model(), Some("gpt-backup"));
    // Full jitter: the two waits are below 100ms and 200ms.
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(json_of(r).await["model"], "smart");
}

#[tokio::test(start_paused = true)]
async fn transport_errors_and_408_are_retried_on_the_same_target() {
    let (primary, backup, proxy) = setup(TWO_TARGETS).await;
    primary.push(Behavior::Reset);
    primary.push(Behavior::Status {
        status: 408,
        body: None,
        retry_after: None,
    });
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-attempts"), "3");
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    assert_eq!(backup.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn listed_retry_statuses_replace_the_default_set() {
    let spec = "  targets:
    - credentialRef: { name: primary }
      retry: { attempts: 3, onStatusCodes: [503] }
    - credentialRef: { name: backup }
";
    let (primary, backup, proxy) = setup(spec).await;
    primary.set_default(Behavior::ServerError(500));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        primary.hits(),
        1,
        "500 is not listed: advance without retrying"
    );
    assert_eq!(backup.hits(), 1);
    assert_eq!(
        backup.received()[0].model(),
        Some("smart"),
        "no model given: the client's name"
    );
}

#[tokio::test(start_paused = true)]
async fn rate_limits_wait_retry_after_then_retry_the_same_target() {
    let (primary, backup, proxy) = setup(TWO_TARGETS).await;
    primary.push(Behavior::RateLimited {
        retry_after_secs: 2,
    });
    let started = Instant::now();
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "Retry-After is honoured"
    );
    assert_eq!(header(&r, "x-switchback-attempts"), "2");
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    assert_eq!(backup.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_rate_limited_target_is_parked_for_later_requests() {
    let spec = "  targets:
    - credentialRef: { name: primary }
    - credentialRef: { name: backup }
";
    let (primary, backup, proxy) = setup(spec).await;
    primary.push(Behavior::RateLimited {
        retry_after_secs: 20,
    });
    let r = proxy.chat("smart", false).await;
    assert_eq!(
        header(&r, "x-switchback-target"),
        "team-a/backup",
        "one attempt: advance"
    );
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-attempts"), "1");
    assert_eq!(
        header(&r, "x-switchback-fallbacks"),
        "1",
        "a skipped target counts as moved past"
    );
    assert_eq!(primary.hits(), 1, "a parked target gets nothing");
    tokio::time::sleep(Duration::from_secs(21)).await;
    let r = proxy.chat("smart", false).await;
    assert_eq!(
        header(&r, "x-switchback-target"),
        "team-a/primary",
        "parking ends with Retry-After"
    );
    assert_eq!(backup.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn retry_after_beyond_the_cap_abandons_the_target_at_once() {
    let spec = format!("{TWO_TARGETS}  fallback: {{ maxRetryAfter: 5s }}\n");
    let (primary, backup, proxy) = setup(&spec).await;
    primary.push(Behavior::RateLimited {
        retry_after_secs: 60,
    });
    let started = Instant::now();
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(primary.hits(), 1);
    assert_eq!(backup.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn attempt_timeouts_advance_at_once_without_retrying() {
    let spec = "  targets:
    - credentialRef: { name: primary }
      timeout: 2s
      retry: { attempts: 3 }
    - credentialRef: { name: backup }
";
    let (primary, backup, proxy) = setup(spec).await;
    primary.set_default(Behavior::Hang);
    let started = Instant::now();
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(primary.hits(), 1);
    assert_eq!(backup.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn context_length_overflows_advance_at_once_in_every_wording() {
    for wording in [
        ContextWording::OpenAi,
        ContextWording::Anthropic,
        ContextWording::Vllm,
    ] {
        let (primary, backup, proxy) = setup(TWO_TARGETS).await;
        primary.push(Behavior::ContextLength(wording));
        let r = proxy.chat("smart", false).await;
        assert_eq!(r.status(), 200, "{wording:?}");
        assert_eq!(primary.hits(), 1, "{wording:?}: never retried");
        assert_eq!(backup.hits(), 1, "{wording:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn auth_errors_are_returned_unchanged_unless_opted_in() {
    let (primary, backup, proxy) = setup(TWO_TARGETS).await;
    primary.push(Behavior::Status {
        status: 401,
        body: Some(r#"{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}"#.into()),
        retry_after: None,
    });
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 401);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    assert_eq!(json_of(r).await["error"]["code"], "invalid_api_key");
    assert_eq!(backup.hits(), 0);

    let spec = format!(
        "{TWO_TARGETS}  fallback: {{ onFailures: [status5xx, rateLimited, timeout, connectionError, contextLength, authError] }}\n"
    );
    let (primary, backup, proxy) = setup(&spec).await;
    primary.push(Behavior::Status {
        status: 403,
        body: None,
        retry_after: None,
    });
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(primary.hits(), 1);
    assert_eq!(backup.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn other_client_errors_are_returned_unchanged_and_never_retried() {
    let (primary, backup, proxy) = setup(TWO_TARGETS).await;
    let body = r#"{"error":{"message":"messages is required","type":"invalid_request_error","param":"messages","code":null}}"#;
    primary.push(Behavior::Status {
        status: 422,
        body: Some(body.into()),
        retry_after: None,
    });
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 422);
    assert_eq!(r.text().await.unwrap(), body, "status and body unchanged");
    assert_eq!(primary.hits(), 1);
    assert_eq!(backup.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn extra_fallback_statuses_advance() {
    let spec = format!("{TWO_TARGETS}  fallback: {{ onStatusCodes: [404] }}\n");
    let (primary, backup, proxy) = setup(&spec).await;
    primary.push(Behavior::Status {
        status: 404,
        body: None,
        retry_after: None,
    });
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(primary.hits(), 1);
    assert_eq!(backup.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_class_missing_from_fallback_on_stops_the_chain() {
    let spec = format!("{TWO_TARGETS}  fallback: {{ onFailures: [timeout] }}\n");
    let (primary, backup, proxy) = setup(&spec).await;
    primary.set_default(Behavior::ServerError(502));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 502);
    assert_eq!(
        header(&r, "x-switchback-attempts"),
        "3",
        "retries on the same target still come first"
    );
    let body = json_of(r).await;
    assert_eq!(body["error"]["code"], "all_providers_failed");
    assert_eq!(body["error"]["attempts"].as_array().unwrap().len(), 3);
    assert_eq!(backup.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn exhausted_chain_of_server_errors_answers_502_with_the_attempt_list() {
    let (primary, backup, proxy) = setup(TWO_TARGETS).await;
    primary.set_default(Behavior::ServerError(500));
    backup.set_default(Behavior::Reset);
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 502);
    assert_eq!(header(&r, "x-switchback-attempts"), "4");
    assert_eq!(header(&r, "x-switchback-target"), "");
    let body = json_of(r).await;
    assert_eq!(body["error"]["code"], "all_providers_failed");
    assert_eq!(body["error"]["type"], "server_error");
    let attempts = body["error"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 4);
    assert_eq!(attempts[0]["target"], "team-a/primary");
    assert_eq!(attempts[0]["model"], "gpt-primary");
    assert_eq!(attempts[0]["status"], 500);
    assert_eq!(attempts[0]["reason"], "status5xx");
    assert!(attempts[0]["durationMs"].is_u64());
    assert_eq!(attempts[3]["target"], "team-a/backup");
    assert_eq!(attempts[3]["status"], Value::Null);
    assert_eq!(attempts[3]["reason"], "connectionError");
}

#[tokio::test(start_paused = true)]
async fn exhausted_chain_of_rate_limits_answers_429_with_the_shortest_retry_after() {
    let spec = "  targets:
    - credentialRef: { name: primary }
    - credentialRef: { name: backup }
";
    let (primary, backup, proxy) = setup(spec).await;
    primary.push(Behavior::RateLimited {
        retry_after_secs: 9,
    });
    backup.push(Behavior::RateLimited {
        retry_after_secs: 4,
    });
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "retry-after"), "4");
    assert_eq!(json_of(r).await["error"]["code"], "rate_limited");

    // Both are parked now: answered 429 without calling anyone.
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-switchback-attempts"), "0");
    assert_eq!(header(&r, "retry-after"), "4");
    assert_eq!(primary.hits() + backup.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn attempt_timeouts_everywhere_answer_504() {
    let spec = "  targets:
    - credentialRef: { name: primary }
      timeout: 1s
    - credentialRef: { name: backup }
      timeout: 1s
";
    let (primary, backup, proxy) = setup(spec).await;
    primary.set_default(Behavior::Hang);
    backup.set_default(Behavior::Hang);
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 504);
    let body = json_of(r).await;
    assert_eq!(body["error"]["code"], "upstream_timeout");
    assert_eq!(body["error"]["attempts"][1]["reason"], "timeout");
}

#[tokio::test(start_paused = true)]
async fn the_call_budget_bounds_everything() {
    let spec = "  timeout: 3s
  targets:
    - credentialRef: { name: primary }
      timeout: 10s
    - credentialRef: { name: backup }
";
    let (primary, backup, proxy) = setup(spec).await;
    primary.set_default(Behavior::Hang);
    let started = Instant::now();
    let r = proxy.chat("smart", false).await;
    let took = started.elapsed();
    assert_eq!(r.status(), 504);
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert_eq!(backup.hits(), 0, "no budget left for the backup");
    assert_eq!(
        json_of(r).await["error"]["attempts"][0]["reason"],
        "budgetExhausted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_backoff_that_does_not_fit_the_budget_advances_instead() {
    let spec = "  timeout: 5s
  targets:
    - credentialRef: { name: primary }
      retry: { attempts: 3 }
    - credentialRef: { name: backup }
";
    let (primary, backup, proxy) = setup(spec).await;
    primary.push(Behavior::Status {
        status: 503,
        body: None,
        retry_after: Some("30".into()),
    });
    let started = Instant::now();
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(primary.hits(), 1);
    assert_eq!(backup.hits(), 1);
}

#[tokio::test]
async fn unknown_models_get_404_in_each_surfaces_shape() {
    let (_p, _b, proxy) = setup(TWO_TARGETS).await;
    let r = proxy.chat("nope", false).await;
    assert_eq!(r.status(), 404);
    assert!(!header(&r, "x-request-id").is_empty());
    let body = json_of(r).await;
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let r = proxy.messages("nope", false).await;
    assert_eq!(r.status(), 404);
    let body = json_of(r).await;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn malformed_bodies_get_400() {
    let (_p, _b, proxy) = setup(TWO_TARGETS).await;
    let r = proxy
        .http
        .post(proxy.url("/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = proxy
        .post("/v1/chat/completions", &json!({"messages": []}))
        .await;
    assert_eq!(r.status(), 400);
    assert!(
        json_of(r).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("model")
    );
}

#[tokio::test]
async fn bodies_over_the_limit_get_413() {
    let p = SimProvider::start(Flavor::OpenAi).await;
    let manifests = format!(
        "{}{}",
        credential("primary", "openai", &p.base_url(), "sk-1"),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: primary }\n"
        )
    );
    let proxy = TestProxy::try_start(&manifests, 1024).await.unwrap();
    let big =
        json!({"model": "smart", "messages": [{"role": "user", "content": "x".repeat(4096)}]});
    let r = proxy.post("/v1/chat/completions", &big).await;
    assert_eq!(r.status(), 413);
    assert!(
        json_of(r).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1024")
    );
    assert_eq!(p.hits(), 0);
}

#[tokio::test]
async fn client_credentials_never_reach_providers() {
    let openai = SimProvider::start(Flavor::OpenAi).await;
    let anthropic = SimProvider::start(Flavor::Anthropic).await;
    let manifests = format!(
        "{}{}{}{}",
        credential("oa", "openai", &openai.base_url(), "sk-openai-secret"),
        credential("an", "anthropic", &anthropic.base_url(), "sk-ant-secret"),
        route("gpt", "  targets:\n    - credentialRef: { name: oa }\n"),
        route("claude", "  targets:\n    - credentialRef: { name: an }\n"),
    );
    let proxy = TestProxy::start(&manifests).await;
    let r = proxy
        .http
        .post(proxy.url("/v1/chat/completions"))
        .header("authorization", "Bearer client-token")
        .header("x-api-key", "client-key")
        .header("cookie", "session=1")
        .json(&chat_body("gpt", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = &openai.received()[0];
    assert_eq!(got.header("authorization"), Some("Bearer sk-openai-secret"));
    assert_eq!(got.header("x-api-key"), None);
    assert_eq!(got.header("cookie"), None);

    let r = proxy
        .http
        .post(proxy.url("/v1/messages"))
        .header("x-api-key", "client-key")
        .header("authorization", "Bearer client-token")
        .header("anthropic-beta", "tools-2024")
        .json(&switchback_tests::harness::messages_body("claude", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = &anthropic.received()[0];
    assert_eq!(got.header("x-api-key"), Some("sk-ant-secret"));
    assert_eq!(got.header("authorization"), None);
    assert_eq!(got.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(got.header("anthropic-beta"), Some("tools-2024"));
    assert_eq!(got.path, "/v1/messages");
    assert_eq!(json_of(r).await["model"], "claude");
}

#[tokio::test]
async fn targets_without_a_key_or_the_surface_are_skipped() {
    let anthropic = SimProvider::start(Flavor::Anthropic).await;
    let openai = SimProvider::start(Flavor::OpenAi).await;
    let keyless = "---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: keyless, namespace: team-a }
spec:
  provider: openai
  baseURL: http://127.0.0.1:9/v1
  secretRef: { name: absent, key: apiKey }
  allowPrivateNetwork: true
";
    let manifests = format!(
        "{keyless}{}{}{}",
        credential("an", "anthropic", &anthropic.base_url(), "sk-ant"),
        credential("oa", "openai", &openai.base_url(), "sk-oa"),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: keyless }\n    - credentialRef: { name: an }\n    - credentialRef: { name: oa }\n"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    let config = proxy.admin_config().await;
    let warnings = config["load"]["warnings"].to_string();
    assert!(warnings.contains("team-a/keyless"), "{warnings}");
    // Embeddings have no Anthropic counterpart: that target is skipped too.
    let r = proxy
        .post("/v1/embeddings", &json!({"model": "smart", "input": "a"}))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/oa");
    assert_eq!(header(&r, "x-switchback-fallbacks"), "2");
    assert_eq!(header(&r, "x-switchback-attempts"), "1");
    assert_eq!(anthropic.hits(), 0);

    let r = proxy.messages("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/an");

    let keyless_only = format!(
        "{keyless}{}",
        route(
            "solo",
            "  targets:\n    - credentialRef: { name: keyless }\n"
        )
    );
    let proxy = TestProxy::start(&keyless_only).await;
    let r = proxy.chat("solo", false).await;
    assert_eq!(r.status(), 503);
    let body = json_of(r).await;
    assert_eq!(body["error"]["code"], "no_available_target");
    assert_eq!(body["error"]["attempts"][0]["reason"], "missingKey");
}

#[tokio::test]
async fn a_client_that_goes_away_stops_all_upstream_work() {
    let spec = "  targets:
    - credentialRef: { name: primary }
      retry: { attempts: 3 }
    - credentialRef: { name: backup }
";
    let (primary, backup, proxy) = setup(spec).await;
    primary.set_default(Behavior::Hang);
    let request = proxy.spawn_chat("smart");
    primary.wait_hits(1).await;
    request.abort();
    tokio::time::timeout(Duration::from_secs(5), primary.wait_cancelled(1))
        .await
        .expect("the upstream request is dropped when the client leaves");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(primary.hits(), 1);
    assert_eq!(backup.hits(), 0);
}

#[tokio::test]
async fn embeddings_and_the_model_list() {
    let (primary, _b, proxy) = setup(TWO_TARGETS).await;
    let r = proxy
        .post(
            "/v1/embeddings",
            &json!({"model": "smart", "input": ["a", "b"]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(primary.received()[0].path, "/v1/embeddings");
    assert_eq!(json_of(r).await["model"], "smart");

    let r = proxy
        .http
        .get(proxy.url("/v1/models"))
        .send()
        .await
        .unwrap();
    let body = json_of(r).await;
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], "smart");
    let r = proxy
        .http
        .get(proxy.url("/v1/models"))
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    let body = json_of(r).await;
    assert_eq!(body["data"][0]["type"], "model");
    assert_eq!(body["has_more"], false);
}

#[tokio::test]
async fn loadbalance_spreads_first_picks_by_weight() {
    let spec = "  strategy: { mode: loadbalance }
  targets:
    - credentialRef: { name: primary }
      weight: 1
    - credentialRef: { name: backup }
      weight: 3
";
    let (primary, backup, proxy) = setup(spec).await;
    for _ in 0..200 {
        assert_eq!(proxy.chat("smart", false).await.status(), 200);
    }
    // Expected 50 / 150; binomial sd ~6.1, so 25..75 is beyond four sd.
    assert!(
        (25..=75).contains(&primary.hits()),
        "primary {}",
        primary.hits()
    );
    assert_eq!(primary.hits() + backup.hits(), 200);
}

#[tokio::test]
async fn upstream_connections_are_pooled_and_reused() {
    let (primary, _backup, proxy) = setup(TWO_TARGETS).await;
    for _ in 0..5 {
        assert_eq!(proxy.chat("smart", false).await.status(), 200);
    }
    let peers: std::collections::BTreeSet<_> = primary.received().iter().map(|r| r.peer).collect();
    assert_eq!(
        peers.len(),
        1,
        "five sequential requests share one keep-alive connection: {peers:?}"
    );
    assert_eq!(primary.received()[0].version, reqwest::Version::HTTP_11);
}

/// The binary serves the data port from one thread per core, each with its own
/// upstream pool: the pipeline works the same there (fallback, headers, streams, one
/// shared circuit), on fresh connections spread over the threads.
#[tokio::test]
async fn data_port_served_by_threads_of_its_own_walks_targets_the_same() {
    let (primary, backup, manifests) = two_providers(
        "  targets:\n    - credentialRef: { name: primary }\n    \
         - credentialRef: { name: backup }\n",
    )
    .await;
    primary.set_default(Behavior::ServerError(503));
    let proxy = TestProxy::start_threaded(&manifests, 2).await;
    for i in 0..8 {
        // A client per request: a new connection each time.
        let r = reqwest::Client::new()
            .post(proxy.url("/v1/chat/completions"))
            .json(&chat_body("smart", i % 2 == 1))
            .send()
            .await
            .expect("proxy answers");
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
        assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
        let text = r.text().await.expect("body");
        assert!(text.contains("backup"), "{text}");
    }
    // One circuit for the whole proxy, whichever thread served: the default
    // `consecutiveFailures: 5` opens it after five failures in all, then the primary
    // is skipped.
    assert_eq!(primary.hits(), 5);
    assert_eq!(backup.hits(), 8);
}

/// Real clock: the manifest watcher's reload is awaited.
#[tokio::test]
async fn every_answer_carries_the_generation_even_before_a_route_is_chosen() {
    let (_primary, _backup, manifests) = two_providers(TWO_TARGETS).await;
    // The route's own generation (7) differs from the config's load count (1).
    let manifests = manifests.replace(
        "name: smart, namespace: team-a }",
        "name: smart, namespace: team-a, generation: 7 }",
    );
    assert!(manifests.contains("generation: 7"));
    let proxy = TestProxy::start_configured(&manifests, |o| {
        o.max_body_bytes = 8 << 10;
        o.limits.max_inflight_body_bytes = 4 << 10;
    })
    .await;
    let generation = |r: &reqwest::Response| {
        r.headers()
            .get("x-switchback-generation")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let routed = proxy.chat("smart", false).await;
    assert_eq!(routed.status(), 200);
    assert_eq!(generation(&routed).as_deref(), Some("7"), "the route's");

    let unrouted = |config: &'static str| {
        let proxy = &proxy;
        async move {
            let post = |body: Vec<u8>| {
                proxy
                    .http
                    .post(proxy.url("/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .body(body)
            };
            let cases = [
                ("not JSON", post(b"{".to_vec()), 400),
                ("no model", post(b"{}".to_vec()), 400),
                ("unknown model", post(br#"{"model":"nope"}"#.to_vec()), 404),
                ("over the body limit", post(vec![b' '; 9 << 10]), 413),
                ("over the body budget", post(vec![b' '; 5 << 10]), 503),
                ("models", proxy.http.get(proxy.url("/v1/models")), 200),
                ("unknown path", proxy.http.post(proxy.url("/v1/nope")), 404),
                (
                    "wrong method",
                    proxy.http.get(proxy.url("/v1/messages")),
                    405,
                ),
            ];
            for (what, request, status) in cases {
                let r = request.send().await.unwrap();
                assert_eq!(r.status(), status, "{what}");
                assert_eq!(generation(&r).as_deref(), Some(config), "{what}");
                assert!(r.headers().contains_key("x-request-id"), "{what}");
            }
        }
    };
    assert_eq!(proxy.admin_stats().await["configGeneration"], 1);
    unrouted("1").await;

    // The generation of the config each request saw: the next load's after a reload.
    proxy.rewrite(&manifests.replace("gpt-backup", "gpt-backup-2"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while proxy.admin_stats().await["configGeneration"] != 2 {
        assert!(Instant::now() < deadline, "the edit was not loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unrouted("2").await;
    let routed = proxy.chat("smart", false).await;
    assert_eq!(
        generation(&routed).as_deref(),
        Some("7"),
        "still the route's"
    );
}

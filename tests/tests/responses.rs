//! `POST /v1/responses` (the OpenAI Responses API, docs/responses-api.md#the-responses-api)
//! through the whole pipeline against simulated providers: passed through to the targets
//! that serve it (openai, azure-openai on its v1 API, openai-compatible declaring
//! `responsesAPI: true`) with the route's model, failover by the same classes as chat
//! completions, the stream commit rule on its event types, the targets that cannot serve it
//! skipped as `unsupportedSurface`, and its usage counted. Waiting runs on tokio's paused
//! clock.

use serde_json::{Value, json};
use switchback_tests::harness::{TestProxy, credential, header, route};
use switchback_tests::sim::responses::{error_event, failed_event};
use switchback_tests::sim::{Behavior, Flavor, PROMPT_TOKENS, SimProvider, answer_text};

/// Providers behind the routes of [`setup`].
struct Setup {
    primary: SimProvider,
    backup: SimProvider,
    claude: SimProvider,
    vllm: SimProvider,
    proxy: TestProxy,
}

/// An openai-compatible credential for `sim`, declaring the Responses API or not.
fn compatible(name: &str, sim: &SimProvider, responses_api: bool) -> String {
    let c = credential(name, "openai-compatible", &sim.base_url(), "sk-vllm");
    if !responses_api {
        return c;
    }
    c.replacen(
        "  provider: openai-compatible\n",
        "  provider: openai-compatible\n  responsesAPI: true\n",
        1,
    )
}

/// Routes:
/// * `smart`: primary (openai, `gpt-4o`), then backup (openai, `gpt-4o-mini`);
/// * `mixed`: claude (anthropic) first, then primary;
/// * `legacy`: claude, then an openai-compatible server that does not declare the
///   Responses API: nothing that can serve it.
async fn setup() -> Setup {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let claude = SimProvider::start_named("claude", Flavor::Anthropic).await;
    let vllm = SimProvider::start_named("vllm", Flavor::OpenAi).await;
    let manifests = [
        credential("primary", "openai", &primary.base_url(), "sk-primary"),
        credential("backup", "openai", &backup.base_url(), "sk-backup"),
        credential("claude", "anthropic", &claude.base_url(), "sk-claude"),
        compatible("vllm", &vllm, false),
        route(
            "smart",
            "  targets:
    - credentialRef: { name: primary }
      model: gpt-4o
    - credentialRef: { name: backup }
      model: gpt-4o-mini
",
        ),
        route(
            "mixed",
            "  targets:
    - credentialRef: { name: claude }
      model: claude-sonnet-4-5
    - credentialRef: { name: primary }
      model: gpt-4o
",
        ),
        route(
            "legacy",
            "  targets:
    - credentialRef: { name: claude }
      model: claude-sonnet-4-5
    - credentialRef: { name: vllm }
      model: sim-chat
",
        ),
    ]
    .concat();
    Setup {
        proxy: TestProxy::start(&manifests).await,
        primary,
        backup,
        claude,
        vllm,
    }
}

fn request(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "input": "hello", "instructions": "be brief"})
}

async fn responses(proxy: &TestProxy, model: &str, stream: bool) -> reqwest::Response {
    proxy.post("/v1/responses", &request(model, stream)).await
}

/// The `(event, data)` pairs of a Responses API stream (comments left out).
fn parse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|e| {
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_else(|| panic!("an event line in {e:?}"));
            Some((name.to_owned(), serde_json::from_str(data).unwrap()))
        })
        .collect()
}

/// The text a stream's `response.output_text.delta` events spell.
fn streamed_text(events: &[(String, Value)]) -> String {
    events
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_owned())
        .collect()
}

/// A target's counters on `/admin/v1/stats`, by route and credential name.
async fn target_stats(proxy: &TestProxy, route: &str, credential: &str) -> Value {
    let stats = proxy.admin_stats().await;
    stats["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["route"]["name"] == route)
        .flat_map(|r| r["targets"].as_array().cloned().unwrap_or_default())
        .find(|t| t["credential"]["name"] == credential)
        .unwrap_or_else(|| panic!("no stats for {route}/{credential}: {stats}"))
}

#[tokio::test(start_paused = true)]
async fn a_unary_429_fails_over_to_the_backup_with_each_targets_model() {
    let s = setup().await;
    s.primary.push(Behavior::RateLimited {
        retry_after_secs: 5,
    });
    let r = responses(&s.proxy, "smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-attempts"), "2");
    assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["model"], "smart", "the name the client sent");
    assert_eq!(
        body["output"][0]["content"][0]["text"],
        answer_text("backup")
    );

    // Passed through as sent, with the target's model and its credential's key.
    let tried = &s.primary.received()[0];
    assert_eq!(tried.path, "/v1/responses");
    assert_eq!(tried.model(), Some("gpt-4o"));
    let got = &s.backup.received()[0];
    assert_eq!(got.path, "/v1/responses");
    assert_eq!(got.model(), Some("gpt-4o-mini"));
    assert_eq!(got.header("authorization"), Some("Bearer sk-backup"));
    let sent = got.json.as_ref().unwrap();
    assert_eq!(sent["input"], "hello");
    assert_eq!(sent["instructions"], "be brief");

    // The Retry-After parks the primary for the next request too.
    let r = responses(&s.proxy, "smart", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(s.primary.hits(), 1, "parked");
    assert_eq!(
        target_stats(&s.proxy, "smart", "primary").await["failures"]["rateLimited"],
        1
    );
}

#[tokio::test(start_paused = true)]
async fn unary_5xx_and_unusable_answers_fail_over_like_chat_completions() {
    let s = setup().await;
    for (behavior, reason) in [
        (Behavior::ServerError(503), "status5xx"),
        (
            Behavior::Unusable(switchback_tests::sim::Unusable::Truncated),
            "invalidResponse",
        ),
    ] {
        s.primary.push(behavior);
        let r = responses(&s.proxy, "smart", false).await;
        assert_eq!(r.status(), 200, "{reason}");
        assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["model"], "smart");
        assert_eq!(
            target_stats(&s.proxy, "smart", "primary").await["failures"][reason],
            1,
            "{reason}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_fails_over_on_an_error_before_its_first_delta() {
    let s = setup().await;
    // `error` then `response.failed` after the opening; `error` as the first event;
    // `response.failed` alone, a rate limit.
    s.primary.push(Behavior::OpeningThenError);
    s.primary.push(Behavior::StreamErrorFirst);
    s.primary.push(Behavior::OpeningThen(failed_event(
        "gpt-4o",
        4,
        "rate_limit_exceeded",
        "Rate limit reached for gpt-4o",
    )));
    for case in ["opening, error", "error first", "response.failed"] {
        let r = responses(&s.proxy, "smart", true).await;
        assert_eq!(r.status(), 200, "{case}");
        assert_eq!(header(&r, "x-switchback-target"), "team-a/backup", "{case}");
        assert_eq!(header(&r, "x-switchback-attempts"), "2", "{case}");
        let events = parse_events(&r.text().await.unwrap());
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.first(), Some(&"response.created"), "{case}");
        assert_eq!(names.last(), Some(&"response.completed"), "{case}");
        assert!(
            !names
                .iter()
                .any(|n| *n == "error" || *n == "response.failed"),
            "nothing of the failed attempt reaches the client ({case}): {names:?}"
        );
        assert_eq!(streamed_text(&events), answer_text("backup"), "{case}");
        for (name, data) in &events {
            if let Some(model) = data["response"].get("model") {
                assert_eq!(model, "smart", "{case}: {name}");
            }
        }
    }
    let failures = &target_stats(&s.proxy, "smart", "primary").await["failures"];
    assert_eq!(failures["status5xx"], 2, "{failures}");
    assert_eq!(failures["rateLimited"], 1, "{failures}");
}

#[tokio::test(start_paused = true)]
async fn a_stream_holding_only_announcements_is_an_invalid_response() {
    let s = setup().await;
    s.primary.push(Behavior::StreamWithoutContent);
    let r = responses(&s.proxy, "smart", true).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    let events = parse_events(&r.text().await.unwrap());
    assert_eq!(
        events
            .iter()
            .filter(|(n, _)| n == "response.created")
            .count(),
        1,
        "the held opening of the failed attempt is dropped"
    );
    assert_eq!(
        target_stats(&s.proxy, "smart", "primary").await["failures"]["invalidResponse"],
        1
    );
}

#[tokio::test(start_paused = true)]
async fn after_the_first_delta_an_error_event_reaches_the_client_and_counts() {
    let s = setup().await;
    // The opening (4 events) and two deltas, then an in-band error.
    s.primary.push(Behavior::StreamThen {
        chunks: 6,
        event: error_event(6, "server_error", "The model broke mid-answer."),
    });
    let r = responses(&s.proxy, "smart", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    let events = parse_events(&r.text().await.unwrap());
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(data["error"]["message"], "The model broke mid-answer.");
    assert_eq!(streamed_text(&events), "primary-0 primary-1 ");
    assert_eq!(s.backup.hits(), 0, "no failover after commit");
    let primary = target_stats(&s.proxy, "smart", "primary").await;
    assert_eq!(primary["failures"]["status5xx"], 1, "{primary}");
    assert_eq!(primary["successes"], 0, "{primary}");

    // A break after commit ends the stream with the API's own error event.
    s.primary.push(Behavior::BreakMidStream { chunks: 6 });
    let r = responses(&s.proxy, "smart", true).await;
    let events = parse_events(&r.text().await.unwrap());
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(data["type"], "error");
    assert_eq!(data["error"]["code"], "stream_interrupted");
    assert_eq!(s.backup.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_anthropic_target_is_skipped_as_unsupported_surface() {
    let s = setup().await;
    let r = responses(&s.proxy, "mixed", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    assert_eq!(
        header(&r, "x-switchback-attempts"),
        "1",
        "the skip sent nothing"
    );
    assert_eq!(
        header(&r, "x-switchback-fallbacks"),
        "1",
        "but was moved past"
    );
    assert_eq!(s.claude.hits(), 0);
    assert_eq!(s.primary.received()[0].model(), Some("gpt-4o"));
    let claude = target_stats(&s.proxy, "mixed", "claude").await;
    assert_eq!(claude["failures"]["unsupportedSurface"], 1, "{claude}");
    assert_eq!(claude["attempts"], 0, "{claude}");

    // The same route's chat completions still reach it (translated).
    let r = s.proxy.chat("mixed", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/claude");
}

/// docs/request-lifecycle.md#route-and-target-order: when every target is skipped for an
/// open circuit, one is tried anyway. A target that cannot serve the API at all does not
/// stand in the way of that.
#[tokio::test(start_paused = true)]
async fn an_open_circuit_is_still_tried_when_the_other_targets_cannot_serve_it() {
    let claude = SimProvider::start_named("claude", Flavor::Anthropic).await;
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let manifests = [
        credential("claude", "anthropic", &claude.base_url(), "sk-claude"),
        credential("primary", "openai", &primary.base_url(), "sk-primary"),
        route(
            "guarded",
            "  circuitBreaker: { consecutiveFailures: 1, openFor: 60s }
  targets:
    - credentialRef: { name: claude }
      model: claude-sonnet-4-5
    - credentialRef: { name: primary }
      model: gpt-4o
",
        ),
    ]
    .concat();
    let proxy = TestProxy::start(&manifests).await;
    primary.push(Behavior::ServerError(500));
    let r = responses(&proxy, "guarded", false).await;
    assert_eq!(r.status(), 502);
    assert_eq!(
        target_stats(&proxy, "guarded", "primary").await["circuit"],
        "Open"
    );

    // Open, and the only target that serves it: tried anyway, and it has recovered.
    let r = responses(&proxy, "guarded", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
    assert_eq!(primary.hits(), 2);
    assert_eq!(claude.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn when_no_target_can_serve_it_the_client_is_told_which_and_why() {
    let s = setup().await;
    for stream in [false, true] {
        let r = responses(&s.proxy, "legacy", stream).await;
        // docs/request-lifecycle.md#when-the-chain-stops: all skipped is 503
        // `no_available_target`; the message says why.
        assert_eq!(r.status(), 503);
        assert_eq!(header(&r, "x-switchback-attempts"), "0");
        assert_eq!(header(&r, "x-switchback-route"), "team-a/legacy");
        let body: Value = r.json().await.unwrap();
        let e = &body["error"];
        assert_eq!(e["code"], "no_available_target");
        let message = e["message"].as_str().unwrap();
        for part in [
            "team-a/legacy",
            "POST /v1/responses",
            "team-a/claude is anthropic",
            "team-a/vllm is openai-compatible without responsesAPI: true",
        ] {
            assert!(message.contains(part), "{part:?} in {message}");
        }
        let attempts = e["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2);
        for a in attempts {
            assert_eq!(a["reason"], "unsupportedSurface");
            assert_eq!(a["status"], Value::Null);
        }
    }
    assert_eq!(s.claude.hits() + s.vllm.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn each_kind_of_target_is_called_on_its_own_path() {
    let vllm = SimProvider::start_named("vllm", Flavor::OpenAi).await;
    let azure = SimProvider::start_named("azure", Flavor::Azure).await;
    let manifests = [
        compatible("vllm", &vllm, true),
        credential("az", "azure-openai", &azure.base_url(), "az-key"),
        route(
            "compat",
            "  targets:
    - credentialRef: { name: vllm }
      modelMap: { compat: sim-chat }
",
        ),
        route(
            "az",
            "  targets:
    - credentialRef: { name: az }
      model: gpt-4o-mini
",
        ),
    ]
    .concat();
    let proxy = TestProxy::start(&manifests).await;

    let r = responses(&proxy, "compat", false).await;
    assert_eq!(r.status(), 200);
    let got = &vllm.received()[0];
    assert_eq!(got.path, "/v1/responses");
    assert_eq!(got.model(), Some("sim-chat"), "modelMap applies");
    assert_eq!(got.header("authorization"), Some("Bearer sk-vllm"));

    // Azure's v1 API: the deployment as `model`, the key in `api-key`.
    let r = responses(&proxy, "az", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        streamed_text(&parse_events(&r.text().await.unwrap())),
        answer_text("azure")
    );
    let got = &azure.received()[0];
    assert_eq!(got.path, "/openai/v1/responses");
    assert_eq!(got.model(), Some("gpt-4o-mini"));
    assert_eq!(got.header("api-key"), Some("az-key"));
    assert_eq!(got.header("authorization"), None);
}

#[tokio::test(start_paused = true)]
async fn a_request_the_provider_refuses_is_its_answer_unchanged() {
    let s = setup().await;
    let r = s
        .proxy
        .post("/v1/responses", &json!({"model": "smart"}))
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "missing_required_parameter");
    assert_eq!(body["error"]["param"], "input");
    assert_eq!(s.backup.hits(), 0, "a 4xx is not failed over");

    let r = responses(&s.proxy, "nobody-serves-this", false).await;
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_found");
}

/// `switchback_tokens_total` of a target, by direction.
async fn tokens(proxy: &TestProxy, target: &str, direction: &str) -> u64 {
    let metrics = proxy.admin_text("/metrics").await;
    metrics
        .lines()
        .filter(|l| l.starts_with("switchback_tokens_total{"))
        .filter(|l| l.contains(&format!("target=\"team-a/{target}\"")))
        .filter(|l| l.contains(&format!("direction=\"{direction}\"")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[tokio::test(start_paused = true)]
async fn usage_of_unary_and_streamed_answers_is_counted() {
    let s = setup().await;
    let r = responses(&s.proxy, "smart", false).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["usage"]["input_tokens"], PROMPT_TOKENS);
    let r = responses(&s.proxy, "smart", true).await;
    let events = parse_events(&r.text().await.unwrap());
    let (_, done) = events.last().unwrap();
    assert_eq!(done["response"]["usage"]["output_tokens"], 3);
    // "Hello from primary.": three words, twice.
    assert_eq!(
        tokens(&s.proxy, "primary", "input").await,
        2 * PROMPT_TOKENS
    );
    assert_eq!(tokens(&s.proxy, "primary", "output").await, 2 * 3);
}

//! `provider: vertex` through the whole proxy, against the strict Vertex simulator
//! (`Flavor::Vertex`, which verifies the JWT bearer grant and refuses requests
//! without a live token): Gemini and Claude models on both client surfaces, unary
//! and streamed; the OAuth token fetched once and reused, refreshed before it
//! expires (tokio's paused clock); token exchange failures (an error status, an
//! answer that is not a token, a hang, a refused grant) are `authError`s that fail
//! over when the route lists it and answer 502 otherwise; Vertex's 429 fails over;
//! a private `token_uri` needs `allowPrivateNetwork`; neither the key nor the token
//! appears in logs, answers or the admin port.

use std::time::Duration;

use serde_json::{Value, json};
use switchback_tests::harness::{
    self, CapturedLog, TestProxy, credential, header, json_of, route, streamed_text,
};
use switchback_tests::sim::{
    Behavior, Flavor, SimProvider, TokenBehavior, VERTEX_ANTHROPIC_VERSION, VERTEX_LOCATION,
    VERTEX_PROJECT,
};

const GEMINI: &str = "gemini-2.5-flash";
const CLAUDE: &str = "claude-sonnet-4-5@20250929";

/// A vertex credential `name` for `sim` (its base URL and service-account key), with
/// the service-account JSON changed by `edit`.
fn vertex_credential_with(name: &str, sim: &SimProvider, edit: impl Fn(&mut Value)) -> String {
    let mut sa: Value = serde_json::from_str(&sim.service_account_json()).unwrap();
    edit(&mut sa);
    harness::vertex_credential(name, &sim.base_url(), &sa.to_string())
}

fn vertex_credential(name: &str, sim: &SimProvider) -> String {
    vertex_credential_with(name, sim, |_| {})
}

/// Routes `gem` (a Gemini model) and `claude` (a Claude model) on one vertex
/// credential, each alone or before an OpenAI backup, with `fallback` under
/// `fallback:` when not empty.
async fn setup(backup: bool, fallback: &str) -> (SimProvider, Option<SimProvider>, TestProxy) {
    let vertex = SimProvider::start_named("vertex", Flavor::Vertex).await;
    let mut manifests = vertex_credential("vtx", &vertex);
    let backup = if backup {
        let sim = SimProvider::start_named("backup", Flavor::OpenAi).await;
        manifests += &credential("backup", "openai", &sim.base_url(), "sk-backup-0123456789");
        Some(sim)
    } else {
        None
    };
    for (name, model) in [("gem", GEMINI), ("claude", CLAUDE)] {
        let mut spec =
            format!("  targets:\n    - credentialRef: {{ name: vtx }}\n      model: \"{model}\"\n");
        if backup.is_some() {
            spec += "    - credentialRef: { name: backup }\n      model: backup-model\n";
        }
        if !fallback.is_empty() {
            spec += &format!("  fallback:\n{fallback}");
        }
        manifests += &route(name, &spec);
    }
    let proxy = TestProxy::start(&manifests).await;
    (vertex, backup, proxy)
}

fn path(publisher: &str, model: &str, method: &str) -> String {
    format!(
        "/v1/projects/{VERTEX_PROJECT}/locations/{VERTEX_LOCATION}/publishers/{publisher}/models/{model}:{method}"
    )
}

#[tokio::test]
async fn gemini_and_claude_on_vertex_serve_both_surfaces_unary_and_streamed() {
    let (vertex, _, proxy) = setup(false, "").await;
    for route in ["gem", "claude"] {
        let r = proxy.chat(route, false).await;
        assert_eq!(r.status(), 200, "{route}");
        assert_eq!(header(&r, "x-switchback-target"), "team-a/vtx");
        let body = json_of(r).await;
        assert_eq!(body["object"], "chat.completion", "{body}");
        assert_eq!(body["model"], route);
        assert_eq!(
            body["choices"][0]["message"]["content"],
            "Hello from vertex."
        );
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"]["prompt_tokens"], 10, "{body}");

        let r = proxy
            .post(
                "/v1/chat/completions",
                &json!({"model": route, "stream": true, "stream_options": {"include_usage": true},
                    "messages": [{"role": "user", "content": "hello"}]}),
            )
            .await;
        assert_eq!(r.status(), 200, "{route}");
        let text = r.text().await.unwrap();
        assert_eq!(streamed_text(&text), "Hello from vertex.", "{text}");
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        assert!(text.contains(r#""prompt_tokens":10"#), "{text}");
        for line in text.lines().filter(|l| l.starts_with("data: {")) {
            let chunk: Value = serde_json::from_str(&line[6..]).unwrap();
            assert_eq!(chunk["model"], route, "{line}");
        }

        let r = proxy.messages(route, false).await;
        assert_eq!(r.status(), 200, "{route}");
        let body = json_of(r).await;
        assert_eq!(body["type"], "message", "{body}");
        assert_eq!(body["model"], route);
        assert_eq!(body["content"][0]["text"], "Hello from vertex.");
        assert_eq!(body["stop_reason"], "end_turn");
        assert_eq!(body["usage"]["input_tokens"], 10);

        let r = proxy.messages(route, true).await;
        assert_eq!(r.status(), 200, "{route}");
        let text = r.text().await.unwrap();
        assert!(text.starts_with("event: message_start"), "{text}");
        assert_eq!(streamed_text(&text), "Hello from vertex.", "{text}");
        assert!(text.contains(r#""stop_reason":"end_turn""#), "{text}");
        assert!(text.contains("event: message_stop"), "{text}");
        assert!(
            !text.contains(CLAUDE),
            "the upstream model never shows: {text}"
        );
    }

    let got = vertex.received();
    let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    let gem = |m| path("google", GEMINI, m);
    let claude = |m| path("anthropic", CLAUDE, m);
    assert_eq!(
        paths,
        [
            gem("generateContent"),
            gem("streamGenerateContent?alt=sse"),
            gem("generateContent"),
            gem("streamGenerateContent?alt=sse"),
            claude("rawPredict"),
            claude("streamRawPredict"),
            claude("rawPredict"),
            claude("streamRawPredict"),
        ]
    );
    let tokens = vertex.issued_tokens();
    assert_eq!(tokens.len(), 1, "one token for eight requests: {tokens:?}");
    assert_eq!(vertex.token_requests(), 1);
    for r in &got {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {}", tokens[0]).as_str())
        );
        let body = r.json.as_ref().unwrap();
        if r.path.contains("/anthropic/") {
            assert_eq!(body["anthropic_version"], VERTEX_ANTHROPIC_VERSION);
            assert!(body.get("model").is_none(), "{body}");
            assert!(r.header("anthropic-version").is_none());
        } else {
            assert!(body["contents"][0]["role"] == "user", "{body}");
        }
    }
}

/// docs/providers.md#vertex: vertex takes the whole Secret, its service-account key under
/// `serviceAccount.json` when `secretRef` names no key.
#[tokio::test]
async fn a_vertex_credential_without_a_key_name_reads_service_account_json() {
    let vertex = SimProvider::start_named("vertex", Flavor::Vertex).await;
    let credential = vertex_credential("vtx", &vertex);
    let whole_secret = credential.replace(
        "secretRef: { name: vtx-sa, key: serviceAccount.json }",
        "secretRef: { name: vtx-sa }",
    );
    assert_ne!(
        whole_secret, credential,
        "the harness's credential changed shape"
    );
    let spec =
        format!("  targets:\n    - credentialRef: {{ name: vtx }}\n      model: \"{GEMINI}\"\n");
    let proxy = TestProxy::start(&(whole_secret + &route("gem", &spec))).await;
    let r = proxy.chat("gem", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/vtx");
    assert_eq!(
        json_of(r).await["choices"][0]["message"]["content"],
        "Hello from vertex."
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_first_requests_share_one_token_exchange() {
    let (vertex, _, proxy) = setup(false, "").await;
    // The exchange takes a while: every request arrives while it is in flight.
    vertex.set_token_default(TokenBehavior::IssueAfter(Duration::from_millis(500)));
    let calls: Vec<_> = (0..12).map(|_| proxy.spawn_chat("gem")).collect();
    for c in calls {
        assert_eq!(c.await.unwrap().status(), 200);
    }
    assert_eq!(vertex.token_requests(), 1);
    assert_eq!(vertex.hits(), 12);
}

/// Waits (on the paused clock) until the simulator has issued `n` tokens: a refresh
/// runs in the background, after the request that found the token due.
async fn token_requests_reach(vertex: &SimProvider, n: usize) {
    for _ in 0..500 {
        if vertex.token_requests() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} token requests, not {n}", vertex.token_requests());
}

#[tokio::test(start_paused = true)]
async fn the_token_is_refreshed_in_the_background_before_it_expires() {
    let (vertex, _, mut proxy) = setup(false, "").await;
    // Hours pass on the paused clock: the proxy closes idle client connections
    // (90 s), so each request here opens a new one.
    proxy.http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    assert_eq!(proxy.chat("claude", false).await.status(), 200);
    assert_eq!(vertex.token_requests(), 1);
    // Google's tokens live an hour: reused until five minutes before that.
    tokio::time::advance(Duration::from_secs(3600 - 300 - 10)).await;
    assert_eq!(proxy.chat("gem", false).await.status(), 200);
    assert_eq!(vertex.token_requests(), 1, "still fresh");
    // Due: this request is served with the token it has; a new one is fetched
    // beside it, and the next request carries that one.
    tokio::time::advance(Duration::from_secs(20)).await;
    assert_eq!(proxy.chat("gem", true).await.status(), 200);
    token_requests_reach(&vertex, 2).await;
    assert_eq!(proxy.chat("claude", true).await.status(), 200);
    assert_eq!(vertex.token_requests(), 2);

    // Expired (an hour on, with no request meanwhile): the request waits for a new
    // token. A short-lived one is refreshed at half its life.
    vertex.set_token_lifetime(60);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(proxy.messages("claude", false).await.status(), 200);
    assert_eq!(vertex.token_requests(), 3);
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(proxy.messages("claude", true).await.status(), 200);
    assert_eq!(vertex.token_requests(), 3);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(proxy.messages("gem", false).await.status(), 200);
    token_requests_reach(&vertex, 4).await;
    assert_eq!(proxy.messages("gem", true).await.status(), 200);
    assert_eq!(vertex.token_requests(), 4);

    // Every request carried a token that was live when it was sent (the simulator
    // refuses others), each token in turn.
    let issued = vertex.issued_tokens();
    assert_eq!(issued.len(), 4);
    let used: Vec<String> = vertex
        .received()
        .iter()
        .map(|r| r.header("authorization").unwrap().to_owned())
        .collect();
    let expected: Vec<String> = [0, 0, 0, 1, 2, 2, 2, 3]
        .iter()
        .map(|&i| format!("Bearer {}", issued[i]))
        .collect();
    assert_eq!(used, expected);
}

async fn stats_failures(proxy: &TestProxy, route: &str) -> Value {
    let stats = proxy.admin_stats().await;
    let r = stats["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["route"]["name"] == route)
        .cloned()
        .unwrap_or_else(|| panic!("{route} in {stats}"));
    r["targets"][0]["failures"].clone()
}

#[tokio::test(start_paused = true)]
async fn a_failed_token_exchange_is_an_auth_error_that_fails_over() {
    let (vertex, backup, proxy) = setup(true, "    onFailures: [authError, rateLimited]\n").await;
    let backup = backup.unwrap();
    for (k, failure) in [
        TokenBehavior::Status(500),
        TokenBehavior::Status(403),
        TokenBehavior::NotJson,
        TokenBehavior::Hang,
    ]
    .into_iter()
    .enumerate()
    {
        vertex.push_token(failure.clone());
        let r = proxy.chat("claude", false).await;
        assert_eq!(r.status(), 200, "{failure:?}");
        assert_eq!(
            header(&r, "x-switchback-target"),
            "team-a/backup",
            "{failure:?}"
        );
        assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
        assert_eq!(vertex.token_requests(), k + 1, "no retry of the exchange");
        assert_eq!(vertex.hits(), 0, "nothing sent to Vertex without a token");
    }
    assert_eq!(backup.hits(), 4);
    let failures = stats_failures(&proxy, "claude").await;
    assert!(failures.to_string().contains("authError"), "{failures}");
    // A failure caches nothing: the next request gets a token and is served.
    let r = proxy.messages("claude", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/vtx");
    assert_eq!(vertex.token_requests(), 5);
}

#[tokio::test]
async fn without_auth_error_in_the_route_a_failed_exchange_answers_502() {
    let (vertex, backup, proxy) = setup(true, "").await;
    vertex.push_token(TokenBehavior::Status(400));
    let r = proxy.chat("gem", false).await;
    assert_eq!(r.status(), 502);
    let body = json_of(r).await;
    assert_eq!(body["error"]["code"], "upstream_auth_error", "{body}");
    assert_eq!(
        body["error"]["attempts"][0]["reason"], "authError",
        "{body}"
    );
    vertex.push_token(TokenBehavior::Status(400));
    let r = proxy.messages("gem", false).await;
    assert_eq!(r.status(), 502);
    let body = json_of(r).await;
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(backup.unwrap().hits(), 0);
}

#[tokio::test]
async fn a_grant_the_token_endpoint_refuses_is_an_auth_error() {
    // Signed by the right key but for another account: Google's `invalid_grant`.
    let vertex = SimProvider::start_named("vertex", Flavor::Vertex).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let mut manifests = vertex_credential_with("vtx", &vertex, |sa| {
        sa["client_email"] = json!("someone-else@sim-project.iam.gserviceaccount.com");
    });
    manifests += &credential(
        "backup",
        "openai",
        &backup.base_url(),
        "sk-backup-0123456789",
    );
    manifests += &route(
        "gem",
        &format!(
            "  targets:\n    - credentialRef: {{ name: vtx }}\n      model: {GEMINI}\n    - credentialRef: {{ name: backup }}\n  fallback:\n    onFailures: [authError]\n"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    let r = proxy.chat("gem", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(vertex.token_requests(), 1);
    assert!(vertex.issued_tokens().is_empty());
    assert_eq!(vertex.hits(), 0);
}

#[tokio::test]
async fn vertex_rate_limits_and_server_errors_fail_over() {
    let (vertex, backup, proxy) = setup(true, "").await;
    let backup = backup.unwrap();
    for route in ["gem", "claude"] {
        vertex.push(Behavior::RateLimited {
            retry_after_secs: 1,
        });
        let r = proxy.chat(route, false).await;
        assert_eq!(r.status(), 200, "{route}");
        assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
        vertex.push(Behavior::ServerError(503));
        let r = proxy.messages(route, true).await;
        assert_eq!(r.status(), 200, "{route}");
        assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    }
    assert_eq!(backup.hits(), 4);
}

#[tokio::test]
async fn vertex_errors_reach_anthropic_clients_in_their_shape() {
    let (vertex, _, proxy) = setup(false, "").await;
    // A 404 (a model not enabled in the project) is the request's: relayed, in the
    // client's shape, never retried.
    vertex.push(Behavior::ServerError(404));
    let r = proxy.messages("claude", false).await;
    assert_eq!(r.status(), 404);
    let body = json_of(r).await;
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
    vertex.push(Behavior::ServerError(404));
    let r = proxy.chat("claude", false).await;
    assert_eq!(r.status(), 404);
    let body = json_of(r).await;
    assert_eq!(
        body["error"]["message"], "Requested entity was not found.",
        "{body}"
    );
    // 429 with nothing to fall back to: the gateway's rate_limited.
    vertex.push(Behavior::RateLimited {
        retry_after_secs: 1,
    });
    let r = proxy.messages("claude", false).await;
    assert_eq!(r.status(), 429);
}

#[tokio::test]
async fn a_private_token_uri_needs_allow_private_network() {
    let vertex = SimProvider::start_named("vertex", Flavor::Vertex).await;
    // A public-looking base URL, the token URI on loopback: the key is not used.
    let manifests = vertex_credential("vtx", &vertex)
        .replace("allowPrivateNetwork: true", "allowPrivateNetwork: false")
        .replace(
            &vertex.base_url(),
            "https://us-east5-aiplatform.googleapis.com/v1",
        )
        + &route(
            "gem",
            &format!("  targets:\n    - credentialRef: {{ name: vtx }}\n      model: {GEMINI}\n"),
        );
    let proxy = TestProxy::start(&manifests).await;
    let r = proxy.chat("gem", false).await;
    assert_eq!(r.status(), 503);
    let body = json_of(r).await;
    assert_eq!(
        body["error"]["attempts"][0]["reason"], "missingKey",
        "{body}"
    );
    assert_eq!(vertex.token_requests(), 0);

    // `localhost` by name is private too (a name that only resolves to a private
    // address is refused by the guarded client's resolver, see `netguard`).
    let manifests = manifests.replace("http://127.0.0.1", "http://localhost");
    let proxy = TestProxy::start(&manifests).await;
    let r = proxy.chat("gem", false).await;
    assert_eq!(r.status(), 503);
    assert_eq!(vertex.token_requests(), 0);
}

#[tokio::test]
async fn neither_the_key_nor_the_token_leaves_the_proxy() {
    let logs = CapturedLog::default();
    let capture = logs.capture_json_debug();

    let (vertex, _backup, proxy) = setup(true, "    onFailures: [authError]\n").await;
    let mut seen = String::new();
    // A failed exchange first (logged), then served requests, then a 401 from the
    // model endpoint (the error body relayed): every path that logs or answers.
    vertex.push_token(TokenBehavior::Status(401));
    vertex.push(Behavior::ServerError(401));
    for stream in [false, true] {
        for r in [
            proxy.chat("gem", stream).await,
            proxy.messages("claude", stream).await,
            proxy.chat("claude", stream).await,
        ] {
            seen.push_str(&format!("{:?}", r.headers()));
            seen.push_str(&r.text().await.unwrap());
        }
    }
    for path in ["/admin/v1/config", "/admin/v1/stats", "/metrics"] {
        seen.push_str(&proxy.admin_text(path).await);
    }
    drop(proxy);
    capture.stop();

    let logs = logs.text();
    // The failed exchange was logged (so logs were captured), by its status alone.
    assert!(
        logs.contains(r#""error":"the token endpoint answered 401""#),
        "{logs}"
    );
    let sa: Value = serde_json::from_str(&vertex.service_account_json()).unwrap();
    let pem = sa["private_key"].as_str().unwrap();
    // A line of the key's base64 body.
    let key_line = pem.lines().nth(3).unwrap();
    let tokens = vertex.issued_tokens();
    assert!(!tokens.is_empty());
    for secret in tokens.iter().map(String::as_str).chain([key_line]) {
        assert!(!logs.contains(secret), "{secret} leaked into the logs");
        assert!(
            !seen.contains(secret),
            "{secret} leaked into answers or admin output"
        );
    }
    assert!(
        seen.contains("vertex"),
        "the admin config lists the credential"
    );
}

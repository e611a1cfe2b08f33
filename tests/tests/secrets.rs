//! No key material in any output: logs (JSON, debug level), the admin endpoints,
//! metrics, response headers and bodies, across a run that succeeds, falls back,
//! fails, streams and reloads; then client keys with `--auth required` (a known key,
//! one whose namespace has no route, an unknown one); then a key pool whose keys are
//! parked, rejected and echoed back by the provider (docs/request-lifecycle.md#key-pools).
//! Also checks the per-request log line's fields, the client among them.

use std::time::Duration;

use switchback_tests::harness::{CapturedLog, TestProxy, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};

const KEYS: [&str; 2] = ["sk-live-PRIMARY-7f3a9c", "sk-live-BACKUP-41d2e8"];

fn record(seen: &mut String, r: &reqwest::Response) {
    for (k, v) in r.headers() {
        seen.push_str(&format!("{k}: {v:?}\n"));
    }
}

async fn text(proxy: &TestProxy, url: String) -> String {
    proxy
        .http
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn keys_never_leave_through_any_output() {
    let logs = CapturedLog::default();
    let captured = logs.clone();
    // The binary's own log pipeline, JSON, at debug level.
    // A current-thread runtime: every task of the in-process proxy logs through it.
    let capture = logs.capture_json_debug();

    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let manifests = format!(
        "{}{}{}",
        credential("primary", "openai", &primary.base_url(), KEYS[0]),
        credential("backup", "openai", &backup.base_url(), KEYS[1]),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: primary }\n      model: up-primary\n    - credentialRef: { name: backup }\n"
        )
        .replace("namespace: team-a }", "namespace: team-a, generation: 7 }"),
    );
    let proxy = TestProxy::start(&manifests).await;
    let mut seen = String::new();

    // Answered, fell back, failed everywhere, relayed 401, streamed, broke mid-stream.
    let script = [
        vec![],
        vec![Behavior::ServerError(503)],
        vec![Behavior::Reset],
        vec![Behavior::Status {
            status: 401,
            body: None,
            retry_after: None,
        }],
    ];
    for (n, pushes) in script.into_iter().enumerate() {
        for b in pushes {
            primary.push(b);
        }
        if n == 2 {
            backup.push(Behavior::ServerError(500));
        }
        let r = proxy.chat("smart", false).await;
        assert_eq!(
            r.headers()["x-switchback-generation"],
            "7",
            "the route's generation"
        );
        record(&mut seen, &r);
        seen.push_str(&r.text().await.unwrap());
    }
    primary.push(Behavior::BreakMidStream { chunks: 2 });
    let r = proxy.chat("smart", true).await;
    record(&mut seen, &r);
    seen.push_str(&r.text().await.unwrap());
    let r = proxy.chat("smart", true).await;
    seen.push_str(&r.text().await.unwrap());

    // A refused reload reports problems; a good one rotates nothing into view.
    proxy.rewrite(&manifests.replace("up-primary", "up-primary\n      weight: 0"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while proxy.admin_config().await["load"]["lastError"].is_null() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "reload refusal not reported"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for path in [
        "/admin/v1/config",
        "/admin/v1/stats",
        "/metrics",
        "/healthz",
        "/readyz",
    ] {
        seen.push_str(&text(&proxy, proxy.admin_url(path)).await);
    }
    seen.push_str(&text(&proxy, proxy.url("/v1/models")).await);
    drop(proxy);
    capture.stop();

    let logs = logs.text();
    assert!(logs.lines().count() > 5, "logs were captured: {logs}");
    for key in KEYS {
        assert!(!logs.contains(key), "a key leaked into the logs:\n{logs}");
        assert!(
            !seen.contains(key),
            "a key leaked into an answer or admin output:\n{seen}"
        );
    }
    // Providers did get the keys: the test would be vacuous otherwise.
    assert!(
        primary
            .received()
            .iter()
            .all(|r| r.header("authorization") == Some(&format!("Bearer {}", KEYS[0])))
    );

    // The per-request line: JSON, with who served and the fallback fields.
    let fell_back = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["message"] == "request" && v["fallbacks"] == 1 && v["status"] == 200)
        .unwrap_or_else(|| panic!("no request line for the fallback:\n{logs}"));
    assert_eq!(fell_back["route"], "team-a/smart");
    assert_eq!(fell_back["generation"], 7);
    assert_eq!(
        fell_back["request_id"].as_str().map(str::len),
        Some(36),
        "the request id made for the request: {fell_back}"
    );
    assert_eq!(fell_back["served_by"], "team-a/backup");
    assert_eq!(fell_back["fallback_provider"], "team-a/backup");
    assert_eq!(fell_back["fallback_model"], "smart");
    // An array, not a string holding one.
    let attempts = &fell_back["attempt_log"];
    assert!(attempts.is_array(), "{fell_back}");
    assert_eq!(attempts[0]["target"], "team-a/primary");
    assert_eq!(attempts[0]["status"], 503);
    assert_eq!(attempts[0]["reason"], "status5xx");

    // In the same test (a thread-local subscriber can miss events whose callsites
    // another test thread registers at the same moment): client keys too.
    captured.0.lock().unwrap().clear();
    client_keys_never_leave_and_the_request_line_names_the_client(&primary, &captured).await;
    captured.0.lock().unwrap().clear();
    pool_keys_never_leave(&captured).await;
}

/// A key pool (docs/request-lifecycle.md#key-pools): its keys are sent in turn, one is
/// parked (429), one rejected (401, the provider echoing it in its error body) and probed;
/// none shows in a log, an answer or an admin output, though stats, metrics and logs name
/// each by its data-key name.
async fn pool_keys_never_leave(logs: &CapturedLog) {
    const POOL: [&str; 3] = [
        "sk-live-POOL-ONE-5e1a0b",
        "sk-live-POOL-TWO-7c2d9f",
        "sk-live-POOL-THREE-91ab34",
    ];
    let capture = logs.capture_json_debug();
    let provider = SimProvider::start_named("pooled", Flavor::OpenAi).await;
    provider.set_key_behavior(
        POOL[1],
        Some(Behavior::RateLimited {
            retry_after_secs: 30,
        }),
    );
    provider.set_key_behavior(
        POOL[2],
        Some(Behavior::Status {
            status: 401,
            body: Some(format!(
                r#"{{"error":{{"message":"Incorrect API key provided: {}","type":"invalid_request_error","code":"invalid_api_key"}}}}"#,
                POOL[2]
            )),
            retry_after: None,
        }),
    );
    let manifests = format!(
        "---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: {{ name: pooled, namespace: team-a }}
spec:
  provider: openai
  baseURL: {}
  secretRef: {{ name: pool-keys, keys: [one, two, three] }}
  allowPrivateNetwork: true
---
apiVersion: v1
kind: Secret
metadata: {{ name: pool-keys, namespace: team-a }}
stringData: {{ one: {}, two: {}, three: {} }}
{}",
        provider.base_url(),
        POOL[0],
        POOL[1],
        POOL[2],
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: pooled }\n      healthCheck: { interval: 1s }\n"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    let mut seen = String::new();
    for stream in [false, false, false, true, true, false] {
        let r = proxy.chat("smart", stream).await;
        record(&mut seen, &r);
        seen.push_str(&r.text().await.unwrap());
    }
    // Every key set aside at once: a request takes the one set aside the shortest,
    // and the 401's echoed key is masked in what reaches the client.
    provider.set_key_behavior(
        POOL[0],
        Some(Behavior::Status {
            status: 401,
            body: Some(format!(
                r#"{{"error":{{"message":"bad key {}"}}}}"#,
                POOL[0]
            )),
            retry_after: None,
        }),
    );
    for _ in 0..3 {
        let r = proxy.chat("smart", false).await;
        record(&mut seen, &r);
        seen.push_str(&r.text().await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await; // a health check or two
    for path in ["/admin/v1/config", "/admin/v1/stats", "/metrics"] {
        seen.push_str(&text(&proxy, proxy.admin_url(path)).await);
    }
    drop(proxy);
    capture.stop();
    let logs = logs.text();
    for key in POOL {
        assert!(
            !logs.contains(key),
            "a pool key leaked into the logs:\n{logs}"
        );
        assert!(
            !seen.contains(key),
            "a pool key leaked into an answer or admin output:\n{seen}"
        );
    }
    // Not vacuous: every key was sent, the echoes were relayed (masked), and the
    // outputs name the keys.
    let sent: std::collections::BTreeSet<String> = provider
        .received()
        .iter()
        .filter_map(|r| r.key().map(str::to_owned))
        .collect();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(
        seen.contains("Incorrect API key provided") || seen.contains("bad key"),
        "{seen}"
    );
    assert!(seen.contains(r#"key="three""#), "metrics name keys: {seen}");
    assert!(logs.contains("key rejected by the provider"), "{logs}");
}

/// With `--auth required`: no client key (known or not) in the logs, answers or admin
/// output, and the request line carries the client as `namespace/name`.
async fn client_keys_never_leave_and_the_request_line_names_the_client(
    provider: &SimProvider,
    logs: &CapturedLog,
) {
    // The first part stopped its writer: this part logs through a pipeline of its own.
    let capture = logs.capture_json_debug();
    const CLIENT_KEYS: [&str; 3] = [
        "sk-client-APP-0123456789",
        "sk-client-OTHER-0123456789",
        "sk-client-WRONG-0123456789",
    ];
    let client = |ns: &str, key: &str| {
        format!(
            "---
apiVersion: v1
kind: Secret
metadata: {{ name: app-llm, namespace: {ns} }}
stringData: {{ apiKey: {key} }}
---
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: {{ name: app, namespace: {ns} }}
spec:
  keySecretRef: {{ name: app-llm, key: apiKey }}
"
        )
    };
    let manifests = format!(
        "{}{}{}{}",
        credential("primary", "openai", &provider.base_url(), KEYS[0]),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: primary }\n"
        ),
        client("team-a", CLIENT_KEYS[0]),
        // Its namespace has no route: it authenticates and finds no model.
        client("team-b", CLIENT_KEYS[1]),
    );
    let proxy = TestProxy::start(&manifests).await;
    let mut seen = String::new();
    let mut statuses = Vec::new();
    for key in CLIENT_KEYS {
        let r = proxy
            .http
            .post(proxy.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&switchback_tests::harness::chat_body("smart", false))
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
        record(&mut seen, &r);
        seen.push_str(&r.text().await.unwrap());
    }
    assert_eq!(statuses, [200, 404, 401]);
    for path in ["/admin/v1/config", "/admin/v1/stats", "/metrics"] {
        seen.push_str(&text(&proxy, proxy.admin_url(path)).await);
    }
    drop(proxy);
    capture.stop();

    let logs = logs.text();
    for key in CLIENT_KEYS {
        assert!(
            !logs.contains(key),
            "a client key leaked into the logs:\n{logs}"
        );
        assert!(
            !seen.contains(key),
            "a client key leaked into an answer or admin output:\n{seen}"
        );
    }
    let lines: Vec<(String, String)> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "request")
        .map(|v| (v["client"].to_string(), v["route"].to_string()))
        .collect();
    // Refused requests (401, 404) never reach a route, so they have no request line.
    assert_eq!(
        lines,
        [(
            r#""team-a/app""#.to_string(),
            r#""team-a/smart""#.to_string()
        )],
        "{logs}"
    );
}

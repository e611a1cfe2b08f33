//! Health that spans keys and probes (docs/request-lifecycle.md#key-pools), end to end
//! through the proxy and simulated providers, on tokio's paused clock: key pools (a
//! provider that tells keys apart), open circuits probed in the background instead of by
//! client requests, a hung target that leaves the next one its share of the budget, opt-in
//! health checks, and which model answered.

use std::time::Duration;

use serde_json::{Value, json};
use switchback_tests::harness::{TestProxy, credential, header, route, streamed_text};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};
use tokio::time::Instant;

/// A pool credential `name` over the data keys `k1`, `k2`, `k3` of its Secret, whose
/// values are `sk-<name>-1` .. `sk-<name>-3`.
fn pool(name: &str, base_url: &str) -> String {
    credential(name, "openai", base_url, "unused")
        .replace(
            &format!("secretRef: {{ name: {name}-key, key: apiKey }}"),
            &format!(
                "secretRef: {{ name: {name}-key, keys: [k1, k2, k3] }}\n  keyRejectedFor: 10m"
            ),
        )
        .replace(
            "stringData: { apiKey: unused }",
            &format!("stringData: {{ k1: sk-{name}-1, k2: sk-{name}-2, k3: sk-{name}-3 }}"),
        )
}

/// Simulated `primary` and `backup` providers and a proxy serving the route `smart`
/// over them in that order, with `spec` (indented spec lines) before its targets.
async fn primary_and_backup(spec: &str) -> (SimProvider, SimProvider, TestProxy) {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let manifests = [
        credential("primary", "openai", &primary.base_url(), "sk-primary"),
        credential("backup", "openai", &backup.base_url(), "sk-backup"),
        route(
            "smart",
            &format!(
                "{spec}  targets:\n    - credentialRef: {{ name: primary }}\n    - credentialRef: {{ name: backup }}\n"
            ),
        ),
    ]
    .concat();
    (primary, backup, TestProxy::start(&manifests).await)
}

/// The keys the provider was sent, in order, by their number (`sk-primary-2` is 2).
fn keys_sent(sim: &SimProvider) -> Vec<u8> {
    sim.take_received()
        .iter()
        .filter_map(|r| r.key()?.rsplit('-').next()?.parse().ok())
        .collect()
}

async fn served(proxy: &TestProxy) -> reqwest::Response {
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200, "{:?}", r.headers());
    r
}

fn key_stats(stats: &Value) -> Vec<(String, String)> {
    stats["credentials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["credential"]["name"] == "primary")
        .unwrap()["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["name"].as_str().unwrap().to_owned(),
                k["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_key_pool_takes_keys_in_turn_and_sets_aside_the_ones_refused() {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let manifests = [
        pool("primary", &primary.base_url()),
        credential("backup", "openai", &backup.base_url(), "sk-backup"),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: primary }\n    - credentialRef: { name: backup }\n",
        ),
    ]
    .concat();
    let proxy = TestProxy::start(&manifests).await;
    for _ in 0..6 {
        served(&proxy).await;
    }
    assert_eq!(keys_sent(&primary), [1, 2, 3, 1, 2, 3], "round robin");

    // Key 2 is rate limited: the request that takes it is sent again at once with the
    // next key: an attempt, not a fallback; later requests pass key 2 over.
    primary.set_key_behavior(
        "sk-primary-2",
        Some(Behavior::RateLimited {
            retry_after_secs: 20,
        }),
    );
    served(&proxy).await; // key 1
    let r = served(&proxy).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    assert_eq!(header(&r, "x-switchback-attempts"), "2");
    assert_eq!(header(&r, "x-switchback-fallbacks"), "0");
    for _ in 0..3 {
        served(&proxy).await;
    }
    // Key 2's turns pass to the next turn: keys 1 and 3 share its traffic.
    assert_eq!(keys_sent(&primary), [1, 2, 3, 3, 1, 3]);

    // Key 3 is refused (401): rejected for keyRejectedFor; only key 1 is left.
    primary.set_key_behavior(
        "sk-primary-3",
        Some(Behavior::Status {
            status: 401,
            body: None,
            retry_after: None,
        }),
    );
    for _ in 0..4 {
        let r = served(&proxy).await;
        assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    }
    let sent = keys_sent(&primary);
    assert_eq!(sent.iter().filter(|k| **k == 3).count(), 1, "{sent:?}");
    assert_eq!(sent.iter().filter(|k| **k == 2).count(), 0, "{sent:?}");
    let stats = proxy.admin_stats().await;
    assert_eq!(
        key_stats(&stats),
        [
            ("k1".to_owned(), "Active".to_owned()),
            ("k2".to_owned(), "Parked".to_owned()),
            ("k3".to_owned(), "Rejected".to_owned()),
        ]
    );
    let k3 = &stats["credentials"][1]["keys"][2];
    assert_eq!(
        (k3["rejected"].as_u64(), k3["rateLimited"].as_u64()),
        (Some(1), Some(0))
    );
    let metrics = proxy.admin_text("/metrics").await;
    for line in [
        r#"switchback_key_state{credential="team-a/primary",key="k2",state="Parked"} 1"#,
        r#"switchback_key_state{credential="team-a/primary",key="k3",state="Rejected"} 1"#,
        r#"switchback_key_set_aside_total{credential="team-a/primary",key="k2",reason="rateLimited"} 1"#,
        r#"switchback_key_set_aside_total{credential="team-a/primary",key="k3",reason="authError"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }

    // Key 1 rate limited too: every key is set aside, so the target counts as rate
    // limited and the walk moves on to the backup.
    primary.set_key_behavior(
        "sk-primary-1",
        Some(Behavior::RateLimited {
            retry_after_secs: 5,
        }),
    );
    let r = served(&proxy).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
    let r = served(&proxy).await;
    assert_eq!(header(&r, "x-switchback-attempts"), "1", "parked: skipped");
    assert_eq!(keys_sent(&primary), [1]);

    // Five seconds on, key 1's park is over: the primary serves again, with key 1
    // only (key 2 is parked for 20 s, key 3 rejected for 10 min).
    primary.set_key_behavior("sk-primary-1", None);
    tokio::time::sleep(Duration::from_secs(6)).await;
    for _ in 0..3 {
        let r = served(&proxy).await;
        assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    }
    assert_eq!(keys_sent(&primary), [1, 1, 1]);
}

/// The issue's scenario, with the route's defaults (consecutiveFailures 5, openFor
/// 30s, probeInterval 10s): the primary is down for 60 s, then healthy; one request
/// every 4 s. Every request is answered, no client request is spent on the open
/// circuit, and traffic is back on the primary within 15 s of its recovery (a client
/// request as the half-open probe, doubling `openFor` on failure, took a minute).
#[tokio::test(start_paused = true)]
async fn an_open_circuit_is_probed_and_traffic_is_back_within_one_interval() {
    let (primary, _backup, proxy) = primary_and_backup("").await;
    let start = Instant::now();
    primary.set_default(Behavior::ServerError(503));
    let recovered = Duration::from_secs(60);
    let mut back: Option<Duration> = None;
    for n in 0..30u64 {
        let at = Duration::from_secs(4 * n);
        tokio::time::sleep_until(start + at).await;
        if at >= recovered {
            primary.set_default(Behavior::Answer);
        }
        let r = proxy.chat("smart", false).await;
        assert_eq!(r.status(), 200, "request {n} at {at:?} is answered");
        let by = header(&r, "x-switchback-target").to_owned();
        match (by.as_str(), back) {
            ("team-a/primary", None) if at > Duration::ZERO => back = Some(at),
            ("team-a/backup", Some(b)) => {
                panic!("back on the primary at {b:?}, then not at {at:?}")
            }
            _ => {}
        }
    }
    let back = back.expect("traffic returned to the primary");
    assert!(
        back >= recovered && back - recovered <= Duration::from_secs(15),
        "back on the primary {:?} after its recovery",
        back - recovered
    );
    // Client requests reached the primary only until the circuit opened (5 failures)
    // and after it closed; in between, only probes (one every 10 s once openFor had
    // passed: at 46 s and 56 s they failed, at 66 s one closed it).
    let received = primary.received();
    let probes = received
        .iter()
        .filter(|r| r.header("x-request-id") == Some("switchback-probe"))
        .count();
    let clients_while_down = received
        .iter()
        .filter(|r| r.header("x-request-id") != Some("switchback-probe"))
        .count();
    assert_eq!(probes, 3, "two failed probes, then the one that closed it");
    let after_back = ((Duration::from_secs(116) - back).as_secs() / 4 + 1) as usize;
    assert_eq!(clients_while_down, 5 + after_back);
    let metrics = proxy.admin_text("/metrics").await;
    for line in [
        r#"switchback_probes_total{route="team-a/smart",target="team-a/primary",model="",outcome="success"} 1"#,
        r#"switchback_probes_total{route="team-a/smart",target="team-a/primary",model="",outcome="status5xx"} 2"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    let t = &proxy.admin_stats().await["routes"][0]["targets"][0];
    assert_eq!(t["lastProbe"]["outcome"], "success", "{t}");
    assert_eq!(t["circuit"], "Closed");
}

#[tokio::test(start_paused = true)]
async fn while_probing_the_stats_say_so_and_no_request_reaches_the_target() {
    let (primary, _backup, proxy) = primary_and_backup(
        "  circuitBreaker: { consecutiveFailures: 1, openFor: 5s, probeInterval: 2s }\n",
    )
    .await;
    primary.set_default(Behavior::Hang);
    served(&proxy).await; // the primary hangs: its share runs out, the backup answers
    let t = proxy.admin_stats().await["routes"][0]["targets"][0].clone();
    assert_eq!(
        (t["state"].as_str(), t["probing"].as_bool()),
        (Some("CircuitOpen"), Some(true)),
        "{t}"
    );
    // Past openFor, requests still skip it; the probes time out (10 s, no target
    // timeout) one after the other.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let r = served(&proxy).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-attempts"), "1");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let t = proxy.admin_stats().await["routes"][0]["targets"][0].clone();
    assert_eq!(t["state"], "CircuitOpen", "{t}");
    assert!(t["probes"]["timeout"].as_u64() >= Some(2), "{t}");
    assert_eq!(t["lastProbe"]["outcome"], "timeout", "{t}");
    primary.set_default(Behavior::Answer);
    tokio::time::sleep(Duration::from_secs(13)).await;
    let r = served(&proxy).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
}

/// docs/request-lifecycle.md#time-budgets: with the defaults (a 60 s budget, no target
/// timeouts), a first target that never answers gets half the budget, and the second
/// answers.
#[tokio::test(start_paused = true)]
async fn a_hung_first_target_gets_half_the_budget_and_the_second_answers() {
    let (primary, _backup, proxy) = primary_and_backup("").await;
    primary.set_default(Behavior::Hang);
    let start = Instant::now();
    let r = served(&proxy).await;
    let took = start.elapsed();
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert!(
        took >= Duration::from_secs(30) && took < Duration::from_secs(31),
        "{took:?}"
    );
    assert_eq!(
        primary.cancelled(),
        1,
        "the hung attempt was dropped at 30 s"
    );
}

#[tokio::test(start_paused = true)]
async fn health_checks_feed_least_latency_and_open_the_circuit() {
    let slow = SimProvider::start_named("slow", Flavor::OpenAi).await;
    let fast = SimProvider::start_named("fast", Flavor::OpenAi).await;
    slow.set_default(Behavior::Delay(
        Duration::from_millis(400),
        Box::new(Behavior::Answer),
    ));
    fast.set_default(Behavior::Delay(
        Duration::from_millis(50),
        Box::new(Behavior::Answer),
    ));
    let manifests = [
        credential("slow", "openai", &slow.base_url(), "sk-slow"),
        credential("fast", "openai", &fast.base_url(), "sk-fast"),
        route(
            "smart",
            "  strategy: { mode: least-latency }
  circuitBreaker: { consecutiveFailures: 2, openFor: 30s, probeInterval: 0s }
  targets:
    - credentialRef: { name: slow }
      healthCheck: { interval: 5s }
    - credentialRef: { name: fast }
      healthCheck: { interval: 5s }
",
        ),
    ]
    .concat();
    let proxy = TestProxy::start(&manifests).await;
    // No client request yet: the checks alone measure both.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let stats = proxy.admin_stats().await;
    let r = &stats["routes"][0];
    assert_eq!(r["order"], json!([1, 0]), "the fast one first: {r}");
    for t in r["targets"].as_array().unwrap() {
        assert_eq!(t["probing"], true, "{t}");
        assert!(t["probes"]["success"].as_u64() >= Some(2), "{t}");
        assert!(t["latency"]["smoothedMs"].as_f64().is_some(), "{t}");
    }
    assert_eq!(
        slow.hits() + fast.hits(),
        6,
        "one check each at 0, 5 and 10 s"
    );
    assert_eq!(
        header(&served(&proxy).await, "x-switchback-target"),
        "team-a/fast"
    );

    // The fast one fails its checks: two in a row open its circuit, with no client
    // request involved; the checks go on (probeInterval 0s: at the check's interval)
    // and the first that passes closes it.
    fast.set_default(Behavior::ServerError(503));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let t = proxy.admin_stats().await["routes"][0]["targets"][1].clone();
    assert_eq!(t["circuit"], "Open", "{t}");
    assert_eq!(
        header(&served(&proxy).await, "x-switchback-target"),
        "team-a/slow"
    );
    fast.set_default(Behavior::Answer);
    tokio::time::sleep(Duration::from_secs(36)).await;
    let t = proxy.admin_stats().await["routes"][0]["targets"][1].clone();
    assert_eq!(t["circuit"], "Closed", "{t}");
}

/// Every provider answers its own probe: the strict simulators refuse anything their
/// real service would, so a probe they answer 200 is one the service takes.
#[tokio::test(start_paused = true)]
async fn every_provider_answers_its_probe() {
    use switchback_tests::harness::{bedrock_credential, vertex_credential};
    use switchback_tests::sim::{BEDROCK_ACCESS_KEY_ID, BEDROCK_SECRET_ACCESS_KEY};
    let openai = SimProvider::start_named("openai", Flavor::OpenAi).await;
    let anthropic = SimProvider::start_named("anthropic", Flavor::Anthropic).await;
    let azure = SimProvider::start_named("azure", Flavor::Azure).await;
    let gemini = SimProvider::start_named("gemini", Flavor::Gemini).await;
    let vertex = SimProvider::start_named("vertex", Flavor::Vertex).await;
    let bedrock = SimProvider::start_named("bedrock", Flavor::Bedrock).await;
    let target = |name: &str, model: &str| {
        route(
            name,
            &format!(
                "  targets:\n    - credentialRef: {{ name: {name} }}\n      model: {model}\n      healthCheck: {{ interval: 5s }}\n"
            ),
        )
    };
    let manifests = [
        credential("openai", "openai", &openai.base_url(), "sk-o"),
        target("openai", "gpt-4o"),
        credential("anthropic", "anthropic", &anthropic.base_url(), "sk-a"),
        target("anthropic", "claude-sonnet-4-5"),
        credential("azure", "azure-openai", &azure.base_url(), "az-key"),
        target("azure", "gpt-4o"),
        credential("gemini", "gemini", &gemini.base_url(), "g-key"),
        target("gemini", "gemini-2.5-flash"),
        vertex_credential("vertex", &vertex.base_url(), &vertex.service_account_json()),
        target("vertex", "claude-sonnet-4-5"),
        bedrock_credential(
            "bedrock",
            &bedrock.base_url(),
            BEDROCK_ACCESS_KEY_ID,
            BEDROCK_SECRET_ACCESS_KEY,
            None,
        ),
        target("bedrock", "anthropic.claude-sonnet-4-v1:0"),
    ]
    .concat();
    let proxy = TestProxy::start(&manifests).await;
    // The first checks are due at once; wait (a bounded while) until all have ended.
    let mut stats = proxy.admin_stats().await;
    for _ in 0..40 {
        let probed = stats["routes"].as_array().unwrap().iter();
        if probed
            .clone()
            .all(|r| r["targets"][0]["lastProbe"].is_object())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        stats = proxy.admin_stats().await;
    }
    for r in stats["routes"].as_array().unwrap() {
        let t = &r["targets"][0];
        assert_eq!(
            t["lastProbe"]["outcome"], "success",
            "{}: {t}",
            r["route"]["name"]
        );
    }
    for (sim, path) in [
        (&openai, "/v1/chat/completions"),
        (&anthropic, "/v1/messages"),
        (&azure, "/openai/v1/chat/completions"),
        (&gemini, "/v1beta/models/gemini-2.5-flash:generateContent"),
        (&bedrock, "/model/anthropic.claude-sonnet-4-v1%3A0/converse"),
    ] {
        let got = sim.received();
        assert_eq!(got.len(), 1, "{}", sim.name());
        assert_eq!(got[0].path, path, "{}", sim.name());
    }
    // One output token, in each API's own words.
    let body = |sim: &SimProvider| sim.received()[0].json.clone().unwrap();
    assert_eq!(body(&openai)["max_completion_tokens"], 1);
    assert_eq!(body(&anthropic)["max_tokens"], 1);
    assert_eq!(body(&azure)["max_tokens"], 1);
    assert_eq!(body(&gemini)["generationConfig"]["maxOutputTokens"], 1);
    assert_eq!(body(&bedrock)["inferenceConfig"]["maxTokens"], 1);
    assert_eq!(body(&vertex)["max_tokens"], 1);
}

/// docs/request-lifecycle.md#headers: `x-switchback-model` names the upstream model on
/// every answer; with `responseModel: served` the body's `model` (every stream chunk's)
/// says it too, on both client surfaces, relayed or translated.
#[tokio::test]
async fn the_answer_says_which_model_answered() {
    let openai = SimProvider::start_named("openai", Flavor::OpenAi).await;
    let anthropic = SimProvider::start_named("anthropic", Flavor::Anthropic).await;
    let routes = |served: bool| {
        let mode = if served {
            "  responseModel: served\n"
        } else {
            ""
        };
        [
            route(
                "smart",
                &format!("{mode}  targets:\n    - credentialRef: {{ name: openai }}\n      model: gpt-up\n"),
            ),
            route(
                "claude",
                &format!(
                    "{mode}  targets:\n    - credentialRef: {{ name: anthropic }}\n      model: claude-up\n"
                ),
            ),
        ]
        .concat()
    };
    let creds = [
        credential("openai", "openai", &openai.base_url(), "sk-o"),
        credential("anthropic", "anthropic", &anthropic.base_url(), "sk-a"),
    ]
    .concat();
    for served in [false, true] {
        let proxy = TestProxy::start(&format!("{creds}{}", routes(served))).await;
        for (model, upstream) in [("smart", "gpt-up"), ("claude", "claude-up")] {
            let said = if served { upstream } else { model };
            for surface in ["chat", "messages"] {
                for stream in [false, true] {
                    let r = match surface {
                        "chat" => proxy.chat(model, stream).await,
                        _ => proxy.messages(model, stream).await,
                    };
                    let what = format!("{model} on {surface}, stream {stream}, served {served}");
                    assert_eq!(r.status(), 200, "{what}");
                    assert_eq!(header(&r, "x-switchback-model"), upstream, "{what}");
                    let body = r.text().await.unwrap();
                    let models = models_in(&body, stream);
                    assert!(!models.is_empty(), "{what}: {body}");
                    assert!(models.iter().all(|m| m == said), "{what}: {models:?}");
                    if stream {
                        assert!(!streamed_text(&body).is_empty(), "{what}");
                    }
                }
            }
        }
    }
}

/// Every `model` a body carries: a unary answer's, or each stream event's (an
/// Anthropic stream names it in `message_start`'s `message`).
fn models_in(body: &str, stream: bool) -> Vec<String> {
    let docs: Vec<Value> = if stream {
        body.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect()
    } else {
        vec![serde_json::from_str(body).unwrap()]
    };
    docs.iter()
        .filter_map(|d| d.get("model").or_else(|| d.get("message")?.get("model")))
        .filter_map(|m| m.as_str().map(str::to_owned))
        .collect()
}

/// A probe that cannot be sent (here: the credential's key is missing) says nothing of
/// the provider: counted by its reason, the circuit left as it is, nothing sent.
#[tokio::test(start_paused = true)]
async fn a_probe_that_cannot_be_sent_changes_no_circuit() {
    let keyless = SimProvider::start_named("keyless", Flavor::OpenAi).await;
    let manifests = [
        credential("keyless", "openai", &keyless.base_url(), "sk-k")
            .replace("key: apiKey }", "key: absent }"),
        route(
            "smart",
            "  circuitBreaker: { consecutiveFailures: 1 }
  targets:\n    - credentialRef: { name: keyless }\n      healthCheck: { interval: 1s }\n",
        ),
    ]
    .concat();
    let proxy = TestProxy::start(&manifests).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let t = proxy.admin_stats().await["routes"][0]["targets"][0].clone();
    assert!(t["probes"]["missingKey"].as_u64() >= Some(2), "{t}");
    assert_eq!(t["lastProbe"]["outcome"], "missingKey", "{t}");
    assert_eq!(
        (t["circuit"].as_str(), t["state"].as_str()),
        (Some("Closed"), Some("NoKey"))
    );
    assert_eq!(keyless.hits(), 0);
}

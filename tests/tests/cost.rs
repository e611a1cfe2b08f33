//! What routes cost (issue 33): answers priced with their target's `price` from the
//! usage providers report (and what the proxy estimates), what fallbacks cost beyond
//! the route's first target, and how much the first target still answers, read as
//! Prometheus and the operator read them (`/metrics`, `/admin/v1/stats`), with known
//! prices and usage so that every figure is an exact decimal.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;
use switchback_crds::cost::{UnitPrice, Usd};
use switchback_tests::harness::{TestProxy, app_client, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider, openai_recorded};
use tokio::time::{Instant, sleep, timeout};

const KEY: &str = "sk-team-a-app-0123456789";

/// The cheap first target and the dear fallback, in USD per million tokens.
const CHEAP: (&str, &str) = ("0.15", "0.60");
const DEAR: (&str, &str) = ("2.50", "10.00");

/// `primary` (cheap) then `backup` (dear) behind `smart`, and team-a/app.
fn manifests(primary: &SimProvider, backup: &SimProvider) -> String {
    [
        credential("primary", "openai", &primary.base_url(), "sk-1"),
        credential("backup", "openai", &backup.base_url(), "sk-2"),
        route(
            "smart",
            &format!(
                "  targets:
    - credentialRef: {{ name: primary }}
      model: up-primary
      price: {{ inputPerMillion: \"{}\", outputPerMillion: \"{}\" }}
    - credentialRef: {{ name: backup }}
      model: up-backup
      price: {{ inputPerMillion: \"{}\", outputPerMillion: \"{}\" }}
",
                CHEAP.0, CHEAP.1, DEAR.0, DEAR.1
            ),
        ),
        app_client(KEY, ""),
    ]
    .concat()
}

async fn chat(proxy: &TestProxy, stream: bool) -> reqwest::Response {
    proxy
        .http
        .post(proxy.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "smart", "stream": stream,
                      "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .expect("proxy answers")
}

/// The samples of a Prometheus text document: (name, labels) → value.
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once("=\"")?;
                    Some((k.to_string(), v.trim_end_matches('"').to_string()))
                })
                .collect();
            Some((name.to_string(), labels, value.parse().ok()?))
        })
        .collect()
}

/// The value of the one sample of `name` with (at least) `labels`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<f64> = samples(text)
        .into_iter()
        .filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
        })
        .map(|(_, _, v)| v)
        .collect();
    assert!(found.len() <= 1, "{name} {labels:?}: {found:?}");
    found.first().copied()
}

fn usd(s: &str) -> Usd {
    s.parse().unwrap()
}

/// A Prometheus float against the exact amount (floats carry ~15 digits).
fn assert_usd(got: Option<f64>, want: Usd, what: &str) {
    let got = got.unwrap_or_else(|| panic!("{what}: no sample"));
    assert!(
        (got - want.as_f64()).abs() <= want.as_f64() * 1e-12 + 1e-18,
        "{what}: {got} != {want}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_cost_their_targets_price_and_fallbacks_what_they_cost_beyond_the_first() {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    primary.set_default(openai_recorded("up-primary", &["priced"], 1000, 2000));
    backup.set_default(openai_recorded("up-backup", &["priced"], 1000, 2000));
    let proxy = TestProxy::start(&manifests(&primary, &backup)).await;

    // The first target answers; then it fails and the dear one answers, unary and
    // streamed.
    assert_eq!(chat(&proxy, false).await.status(), 200);
    primary.push(Behavior::ServerError(503));
    let r = chat(&proxy, false).await;
    assert_eq!(r.headers()["x-switchback-target"], "team-a/backup");
    primary.push(Behavior::ServerError(503));
    let r = chat(&proxy, true).await;
    assert_eq!(r.headers()["x-switchback-target"], "team-a/backup");
    let body = r.text().await.unwrap();
    assert!(body.contains("priced"), "{body}");

    // 1000 in + 2000 out: $0.00135 on the first target, $0.0225 on the fallback,
    // $0.02115 of which beyond what the first would have charged.
    let cheap = UnitPrice::parse(CHEAP.0, CHEAP.1).unwrap().cost(1000, 2000);
    let dear = UnitPrice::parse(DEAR.0, DEAR.1).unwrap().cost(1000, 2000);
    assert_eq!(
        (cheap.to_string(), dear.to_string()),
        ("0.00135".into(), "0.0225".into())
    );
    let stats = proxy.admin_stats().await;
    let r = &stats["routes"][0];
    assert_eq!(r["costUsd"], "0.04635", "{r}");
    assert_eq!(r["fallbackExtraUsd"], "0.0423", "{r}");
    assert_eq!(r["targets"][0]["costUsd"], "0.00135", "{r}");
    assert_eq!(r["targets"][1]["costUsd"], "0.045", "{r}");
    let client = &stats["clients"][0];
    assert_eq!(
        client["microUsd"], 46_350,
        "the client's cost agrees: {client}"
    );

    let metrics = proxy.admin_text("/metrics").await;
    fn target<'a>(t: &'a str, m: &'a str) -> [(&'a str, &'a str); 4] {
        [
            ("route", "team-a/smart"),
            ("target", t),
            ("model", m),
            ("client", "team-a/app"),
        ]
    }
    let of = |labels: &[(&str, &str)]| value(&metrics, "switchback_cost_usd_total", labels);
    assert_usd(
        of(&target("team-a/primary", "up-primary")),
        cheap,
        "primary",
    );
    assert_usd(
        of(&target("team-a/backup", "up-backup")),
        usd("0.045"),
        "backup",
    );
    assert_usd(
        value(
            &metrics,
            "switchback_fallback_extra_cost_usd_total",
            &[("route", "team-a/smart")],
        ),
        usd("0.0423"),
        "beyond the first",
    );
    assert_eq!(
        value(
            &metrics,
            "switchback_primary_answers_total",
            &[("route", "team-a/smart"), ("mode", "fallback")],
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &metrics,
            "switchback_requests_total",
            &[("route", "team-a/smart"), ("outcome", "answered")],
        ),
        Some(3.0)
    );
}

/// A stream its client leaves mid-answer is charged what the proxy estimated (the
/// prompt and the content relayed, bytes / 4), at the target's price.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn estimated_usage_is_priced_too() {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    // The role chunk, `primary-0 ` and `primary-1 `, then nothing: mid-answer.
    primary.set_default(Behavior::StallMidStream { chunks: 3 });
    let proxy = TestProxy::start(&manifests(&primary, &backup)).await;
    let r = chat(&proxy, true).await;
    let mut body = r.bytes_stream();
    let mut text = String::new();
    while !text.contains("primary-1") {
        let chunk = timeout(Duration::from_secs(5), body.next())
            .await
            .expect("a chunk")
            .expect("more")
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(body);
    let deadline = Instant::now() + Duration::from_secs(10);
    let client = loop {
        let stats = proxy.admin_stats().await;
        let c = stats["clients"][0].clone();
        if c["estimatedRequests"] == 1 {
            break (c, stats);
        }
        assert!(Instant::now() < deadline, "no estimate: {stats}");
        sleep(Duration::from_millis(20)).await;
    };
    let (c, stats) = client;
    let (input, output) = (
        c["inputTokens"].as_u64().unwrap(),
        c["outputTokens"].as_u64().unwrap(),
    );
    assert!(input > 0 && output > 0, "{c}");
    let want = UnitPrice::parse(CHEAP.0, CHEAP.1)
        .unwrap()
        .cost(input, output);
    assert_eq!(stats["routes"][0]["costUsd"], want.to_string(), "{stats}");
    assert_eq!(
        stats["routes"][0]["targets"][0]["costUsd"],
        want.to_string()
    );
}

//! The OpenTelemetry GenAI semantic conventions' metrics (issue 33): after unary,
//! streamed, failed-over, failed and embeddings requests, `/metrics` has
//! `gen_ai_client_token_usage`, `gen_ai_client_operation_duration_seconds`,
//! `gen_ai_server_time_to_first_token_seconds` and
//! `gen_ai_server_time_per_output_token_seconds` (the Prometheus names of
//! `gen_ai.client.token.usage`, ...), with the conventions' units, bucket boundaries
//! and attributes, beside the `switchback_*` metrics; and the same go over OTLP/HTTP
//! to a collector on loopback, under the conventions' own names.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::metrics::v1::{AggregationTemporality, HistogramDataPoint, metric};
use prost::Message;
use serde_json::json;
use switchback_tests::binaries::{Process, build};
use switchback_tests::harness::{TestProxy, credential, route};
use switchback_tests::sim::{Behavior, Flavor, PROMPT_TOKENS, SimProvider, openai_recorded};

/// The bucket boundaries the conventions advise, by metric.
const TOKEN_BOUNDS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
const DURATION_BOUNDS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
const TTFT_BOUNDS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
const TPOT_BOUNDS: [f64; 13] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];

/// The model the first provider's answers name (not the one asked for).
const DATED: &str = "up-primary-2024-08-06";

/// A recorded OpenAI answer naming `DATED`, 100 prompt and 300 completion tokens,
/// unary and streamed.
fn dated_answer() -> Behavior {
    openai_recorded(DATED, &["hi", " there"], 100, 300)
}

/// `primary` (OpenAI) then `backup` (Anthropic) behind `smart`.
async fn proxy_with(primary: &SimProvider, backup: &SimProvider) -> TestProxy {
    TestProxy::start(&format!(
        "{}{}{}",
        credential("primary", "openai", &primary.base_url(), "sk-1"),
        credential("backup", "anthropic", &backup.base_url(), "sk-2"),
        route(
            "smart",
            "  targets:
    - credentialRef: { name: primary }
      model: up-primary
    - credentialRef: { name: backup }
      model: up-backup
"
        ),
    ))
    .await
}

/// A histogram family of a Prometheus text document: per label set (without `le`),
/// its buckets (`le` → cumulative count), `_sum` and `_count`.
#[derive(Debug, Default)]
struct Family {
    buckets: BTreeMap<String, Vec<(String, f64)>>,
    sums: BTreeMap<String, f64>,
    counts: BTreeMap<String, f64>,
}

fn family(text: &str, name: &str) -> Family {
    let mut f = Family::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().unwrap();
        let (metric, labels) = series
            .split_once('{')
            .map(|(m, l)| (m, l.trim_end_matches('}')))
            .unwrap_or((series, ""));
        let mut le = None;
        let rest: Vec<&str> = labels
            .split(',')
            .filter(|l| match l.strip_prefix("le=") {
                Some(v) => {
                    le = Some(v.trim_matches('"').to_string());
                    false
                }
                None => !l.is_empty(),
            })
            .collect();
        let key = rest.join(",");
        match metric.strip_prefix(name) {
            Some("_bucket") => f.buckets.entry(key).or_default().push((le.unwrap(), value)),
            Some("_sum") => {
                f.sums.insert(key, value);
            }
            Some("_count") => {
                f.counts.insert(key, value);
            }
            _ => {}
        }
    }
    f
}

impl Family {
    /// The label set (as written, `le` left out) that has all of `labels`.
    fn key(&self, labels: &[(&str, &str)]) -> String {
        let keys: Vec<&String> = self
            .counts
            .keys()
            .filter(|k| {
                labels
                    .iter()
                    .all(|(n, v)| k.split(',').any(|l| l == format!("{n}=\"{v}\"")))
            })
            .collect();
        assert_eq!(keys.len(), 1, "{labels:?} among {:?}", self.counts.keys());
        keys[0].clone()
    }

    fn count(&self, labels: &[(&str, &str)]) -> f64 {
        self.counts[&self.key(labels)]
    }

    fn sum(&self, labels: &[(&str, &str)]) -> f64 {
        self.sums[&self.key(labels)]
    }

    /// The cumulative count at `le`.
    fn at(&self, labels: &[(&str, &str)], le: &str) -> f64 {
        self.buckets[&self.key(labels)]
            .iter()
            .find(|(l, _)| l == le)
            .unwrap_or_else(|| panic!("no le={le}"))
            .1
    }

    /// Whether a series has both labels (as written).
    fn has_both(&self, a: &str, b: &str) -> bool {
        self.counts.keys().any(|k| k.contains(a) && k.contains(b))
    }

    /// Every series' `le` values are the conventions' bounds, then `+Inf`.
    fn assert_bounds(&self, bounds: &[f64], what: &str) {
        assert!(!self.buckets.is_empty(), "{what}: no series");
        for (key, buckets) in &self.buckets {
            let les: Vec<&str> = buckets.iter().map(|(l, _)| l.as_str()).collect();
            assert_eq!(les.last(), Some(&"+Inf"), "{what} {key}");
            let values: Vec<f64> = les[..les.len() - 1]
                .iter()
                .map(|l| l.parse().unwrap())
                .collect();
            assert_eq!(values, bounds, "{what} {key}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_stream_failover_and_errors_are_in_the_genai_metrics() {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::Anthropic).await;
    primary.set_default(dated_answer());
    let proxy = proxy_with(&primary, &backup).await;

    // Unary and streamed by the first target.
    assert_eq!(proxy.chat("smart", false).await.status(), 200);
    let r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("there"));
    // Failed over to the second (another provider), then failed on both.
    primary.push(Behavior::ServerError(503));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.headers()["x-switchback-target"], "team-a/backup");
    primary.push(Behavior::ServerError(503));
    backup.push(Behavior::ServerError(529));
    assert_eq!(proxy.chat("smart", false).await.status(), 502);
    // An embeddings request.
    primary.push(Behavior::Answer);
    let r = proxy
        .post("/v1/embeddings", &json!({"model": "smart", "input": "a"}))
        .await;
    assert_eq!(r.status(), 200);

    let text = proxy.admin_text("/metrics").await;
    for (name, unit) in [
        ("gen_ai_client_token_usage", None),
        ("gen_ai_client_operation_duration_seconds", Some("seconds")),
        ("gen_ai_server_time_to_first_token_seconds", Some("seconds")),
        (
            "gen_ai_server_time_per_output_token_seconds",
            Some("seconds"),
        ),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} histogram\n")),
            "{name} is a histogram:\n{text}"
        );
        if let Some(unit) = unit {
            assert!(text.contains(&format!("# UNIT {name} {unit}\n")), "{name}");
        }
    }
    assert!(
        text.contains("switchback_requests_total{"),
        "switchback_* stay"
    );

    let chat_primary = [
        ("gen_ai_operation_name", "chat"),
        ("gen_ai_provider_name", "openai"),
        ("gen_ai_request_model", "up-primary"),
    ];
    let with = |more: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
        chat_primary.iter().chain(more).copied().collect()
    };

    let tokens = family(&text, "gen_ai_client_token_usage");
    tokens.assert_bounds(&TOKEN_BOUNDS, "token usage");
    // The unary answer and the stream: 100 input tokens each (≤ 256), 300 output
    // (≤ 1024), under the model the answers named.
    let input = with(&[
        ("gen_ai_response_model", DATED),
        ("gen_ai_token_type", "input"),
    ]);
    assert_eq!((tokens.count(&input), tokens.sum(&input)), (2.0, 200.0));
    assert_eq!(tokens.at(&input, "64.0"), 0.0);
    assert_eq!(tokens.at(&input, "256.0"), 2.0);
    let output = with(&[
        ("gen_ai_response_model", DATED),
        ("gen_ai_token_type", "output"),
    ]);
    assert_eq!((tokens.count(&output), tokens.sum(&output)), (2.0, 600.0));
    assert_eq!(tokens.at(&output, "256.0"), 0.0);
    assert_eq!(tokens.at(&output, "1024.0"), 2.0);
    // The fallback's answer: Anthropic's, translated, naming the model asked for.
    let backup_input = [
        ("gen_ai_operation_name", "chat"),
        ("gen_ai_provider_name", "anthropic"),
        ("gen_ai_request_model", "up-backup"),
        ("gen_ai_response_model", "up-backup"),
        ("gen_ai_token_type", "input"),
    ];
    assert_eq!(tokens.sum(&backup_input), PROMPT_TOKENS as f64);
    // Embeddings: input only.
    let embeddings = [
        ("gen_ai_operation_name", "embeddings"),
        ("gen_ai_provider_name", "openai"),
        ("gen_ai_token_type", "input"),
    ];
    assert_eq!(tokens.count(&embeddings), 1.0);
    assert!(
        !tokens.has_both(
            "gen_ai_operation_name=\"embeddings\"",
            "gen_ai_token_type=\"output\""
        ),
        "no output tokens for embeddings"
    );

    let duration = family(&text, "gen_ai_client_operation_duration_seconds");
    duration.assert_bounds(&DURATION_BOUNDS, "operation duration");
    // Answered: the unary call and the stream (to its end).
    assert_eq!(
        duration.count(&with(&[("gen_ai_response_model", DATED)])),
        2.0
    );
    // Failed: the first target twice (503), the second once (529), with error.type.
    assert_eq!(duration.count(&with(&[("error_type", "status5xx")])), 2.0);
    let backup_failed = [
        ("gen_ai_provider_name", "anthropic"),
        ("error_type", "status5xx"),
    ];
    assert_eq!(duration.count(&backup_failed), 1.0);
    assert!(
        !duration.has_both("error_type", "gen_ai_response_model"),
        "a failure names no response model"
    );

    // The stream alone: time to its first token, and per output token after it.
    let ttft = family(&text, "gen_ai_server_time_to_first_token_seconds");
    ttft.assert_bounds(&TTFT_BOUNDS, "time to first token");
    assert_eq!(ttft.count(&with(&[("gen_ai_response_model", DATED)])), 1.0);
    let tpot = family(&text, "gen_ai_server_time_per_output_token_seconds");
    tpot.assert_bounds(&TPOT_BOUNDS, "time per output token");
    assert_eq!(tpot.count(&with(&[("gen_ai_response_model", DATED)])), 1.0);
}

/// A collector on loopback that keeps every OTLP/HTTP metrics export it is sent.
async fn collector() -> (String, Arc<Mutex<Vec<Bytes>>>) {
    let received: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let app = {
        let received = received.clone();
        axum::Router::new()
            .route(
                "/v1/metrics",
                post(move |body: Bytes| {
                    let received = received.clone();
                    async move {
                        received.lock().unwrap().push(body);
                        ""
                    }
                }),
            )
            // The binary sends its traces there too.
            .route("/v1/traces", post(|| async { "" }))
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn attr<'a>(p: &'a HistogramDataPoint, key: &str) -> Option<&'a str> {
    p.attributes.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(s) => Some(s.as_str()),
            _ => None,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_genai_metrics_go_to_an_otlp_collector() {
    let (url, received) = collector().await;
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::Anthropic).await;
    primary.set_default(dated_answer());
    let proxy = proxy_with(&primary, &backup).await;
    // Every 100 ms, as --otlp-metrics-interval would.
    let exporting = proxy
        .running
        .export_otlp_metrics(&url, Duration::from_millis(100))
        .expect("an exporter");
    let streamed = proxy.chat("smart", true).await.text().await.unwrap();
    assert!(streamed.contains("there"), "{streamed}");
    primary.push(Behavior::ServerError(503));
    assert_eq!(proxy.chat("smart", false).await.status(), 200);

    // Until an export holds both answers (the first ones may predate them).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let request = loop {
        let last = received.lock().unwrap().last().cloned();
        if let Some(body) = last {
            let r = ExportMetricsServiceRequest::decode(body.as_ref()).expect("OTLP protobuf");
            let names = r.resource_metrics[0].scope_metrics[0]
                .metrics
                .iter()
                .map(|m| m.name.clone())
                .collect::<Vec<_>>();
            // Input and output of the stream's and of the fallback's answer.
            if names.len() == 4 && tokens_counted(&r) >= 4 {
                break r;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no full export");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(exporting);

    let rm = &request.resource_metrics[0];
    let resource = rm.resource.as_ref().unwrap();
    assert!(resource.attributes.iter().any(|kv| kv.key == "service.name"
        && matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()),
                    Some(AnyValue::StringValue(s)) if s == "switchback-proxy")));
    let metrics = &rm.scope_metrics[0].metrics;
    for (name, unit, bounds) in [
        ("gen_ai.client.token.usage", "{token}", &TOKEN_BOUNDS[..]),
        (
            "gen_ai.client.operation.duration",
            "s",
            &DURATION_BOUNDS[..],
        ),
        ("gen_ai.server.time_to_first_token", "s", &TTFT_BOUNDS[..]),
        ("gen_ai.server.time_per_output_token", "s", &TPOT_BOUNDS[..]),
    ] {
        let m = metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} in {metrics:?}"));
        assert_eq!(m.unit, unit, "{name}");
        let Some(metric::Data::Histogram(h)) = &m.data else {
            panic!("{name} is a histogram: {m:?}")
        };
        assert_eq!(
            h.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        for p in &h.data_points {
            assert_eq!(p.explicit_bounds, bounds, "{name}");
            assert_eq!(p.bucket_counts.len(), bounds.len() + 1, "{name}");
            assert_eq!(p.bucket_counts.iter().sum::<u64>(), p.count, "{name}");
            assert_eq!(attr(p, "gen_ai.operation.name"), Some("chat"), "{name}");
            assert!(p.start_time_unix_nano > 0 && p.time_unix_nano > p.start_time_unix_nano);
        }
    }
    let points = |name: &str| -> Vec<HistogramDataPoint> {
        match &metrics.iter().find(|m| m.name == name).unwrap().data {
            Some(metric::Data::Histogram(h)) => h.data_points.clone(),
            _ => Vec::new(),
        }
    };
    let input = points("gen_ai.client.token.usage")
        .into_iter()
        .find(|p| {
            attr(p, "gen_ai.token.type") == Some("input")
                && attr(p, "gen_ai.provider.name") == Some("openai")
        })
        .expect("the first target's input tokens");
    assert_eq!(attr(&input, "gen_ai.request.model"), Some("up-primary"));
    assert_eq!(attr(&input, "gen_ai.response.model"), Some(DATED));
    assert_eq!((input.count, input.sum), (1, Some(100.0)));
    let failed = points("gen_ai.client.operation.duration")
        .into_iter()
        .find(|p| attr(p, "error.type").is_some())
        .expect("the failed try");
    assert_eq!(attr(&failed, "error.type"), Some("status5xx"));
    assert_eq!(attr(&failed, "gen_ai.response.model"), None);
    let anthropic = points("gen_ai.client.token.usage")
        .into_iter()
        .find(|p| attr(p, "gen_ai.provider.name") == Some("anthropic"));
    assert!(anthropic.is_some(), "the fallback's answer");
}

/// Token usage data points in an export.
fn tokens_counted(r: &ExportMetricsServiceRequest) -> u64 {
    r.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .filter(|m| m.name == "gen_ai.client.token.usage")
        .filter_map(|m| match &m.data {
            Some(metric::Data::Histogram(h)) => Some(h.data_points.len() as u64),
            _ => None,
        })
        .sum()
}

/// The real binary: `--otlp-endpoint` turns the export on (`--otlp-metrics-interval`
/// says how often), and a SIGTERM sends the last counts before the process exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_sends_its_last_metrics_when_it_stops() {
    let (url, received) = collector().await;
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::Anthropic).await;
    primary.set_default(dated_answer());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("switchback.yaml");
    std::fs::write(
        &file,
        format!(
            "{}{}{}",
            credential("primary", "openai", &primary.base_url(), "sk-1"),
            credential("backup", "anthropic", &backup.base_url(), "sk-2"),
            route(
                "smart",
                "  targets:\n    - credentialRef: { name: primary }\n      model: up-primary\n"
            ),
        ),
    )
    .unwrap();
    let log = dir.path().join("proxy.log");
    let (mut proxy, [data, _]) = Process::start_proxy(
        &build().join("switchback-proxy"),
        &file,
        &log,
        &[
            "--otlp-endpoint",
            &url,
            "--otlp-metrics-interval",
            "1h",
            "--drain-delay",
            "0s",
        ],
    );
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{data}/v1/chat/completions"))
        .json(&json!({"model": "smart", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        received.lock().unwrap().is_empty(),
        "nothing before the hour"
    );
    let status = std::process::Command::new("kill")
        .args(["-TERM", &proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = proxy.exited() {
            break exit;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the proxy did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit}");
    let body = received
        .lock()
        .unwrap()
        .last()
        .cloned()
        .expect("the last export");
    let r = ExportMetricsServiceRequest::decode(body.as_ref()).unwrap();
    assert_eq!(
        tokens_counted(&r),
        2,
        "the request's input and output: {r:?}"
    );
}

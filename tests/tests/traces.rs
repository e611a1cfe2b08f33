//! OpenTelemetry traces: one span per request with a child span per upstream
//! attempt, GenAI attributes, exported over OTLP/HTTP to a collector on loopback.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use switchback_tests::harness::{TestProxy, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};
use tracing_subscriber::layer::SubscriberExt;

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| {
            kv.value.as_ref()?.value.as_ref().map(|v| match v {
                AnyValue::StringValue(s) => s.clone(),
                AnyValue::IntValue(i) => i.to_string(),
                other => format!("{other:?}"),
            })
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_attempts_become_spans() {
    // A collector that keeps every export it is sent.
    let received: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let app = {
        let received = received.clone();
        axum::Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let received = received.clone();
                async move {
                    received.lock().unwrap().push(body);
                    ""
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let provider = switchback_proxy::telemetry::tracer_provider(&collector).unwrap();
    let subscriber =
        tracing_subscriber::registry().with(switchback_proxy::telemetry::trace_layer(&provider));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    primary.push(Behavior::ServerError(503));
    let manifests = format!(
        "{}{}{}",
        credential("primary", "openai", &primary.base_url(), "sk-1"),
        credential("backup", "openai", &backup.base_url(), "sk-2"),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: primary }\n      model: up-primary\n    - credentialRef: { name: backup }\n      model: up-backup\n"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    assert_eq!(proxy.chat("smart", false).await.status(), 200);
    tokio::task::spawn_blocking(move || provider.force_flush())
        .await
        .unwrap()
        .unwrap();

    let spans: Vec<Span> = received
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| {
            ExportTraceServiceRequest::decode(b.as_ref())
                .expect("OTLP protobuf")
                .resource_spans
        })
        .flat_map(|rs| rs.scope_spans)
        .flat_map(|ss| ss.spans)
        .collect();
    let request = spans
        .iter()
        .find(|s| s.name == "chat smart")
        .expect("a request span");
    assert_eq!(
        attr(request, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert_eq!(
        attr(request, "gen_ai.request.model").as_deref(),
        Some("smart")
    );
    assert_eq!(
        attr(request, "switchback.route").as_deref(),
        Some("team-a/smart")
    );
    assert_eq!(
        attr(request, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(attr(request, "switchback.fallbacks").as_deref(), Some("1"));

    let attempts: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == request.span_id)
        .collect();
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    let first = attempts
        .iter()
        .find(|s| s.name == "chat up-primary")
        .expect("primary attempt");
    assert_eq!(
        attr(first, "gen_ai.provider.name").as_deref(),
        Some("openai")
    );
    assert_eq!(
        attr(first, "http.response.status_code").as_deref(),
        Some("503")
    );
    assert_eq!(attr(first, "error.type").as_deref(), Some("status5xx"));
    assert_eq!(attr(first, "server.address").as_deref(), Some("127.0.0.1"));
    let second = attempts
        .iter()
        .find(|s| s.name == "chat up-backup")
        .expect("backup attempt");
    assert_eq!(
        attr(second, "gen_ai.request.model").as_deref(),
        Some("up-backup")
    );
    assert_eq!(
        attr(second, "gen_ai.usage.input_tokens").as_deref(),
        Some("10")
    );
    assert_eq!(
        attr(second, "switchback.target").as_deref(),
        Some("team-a/backup")
    );
}

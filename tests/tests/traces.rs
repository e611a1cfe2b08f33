//! OpenTelemetry traces: one span per request with a child span per upstream
//! attempt, GenAI attributes, exported over OTLP/HTTP to a collector on loopback.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use switchback_tests::harness::{TestProxy, chat_body, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};
use tracing_subscriber::layer::SubscriberExt;

const CLIENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

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

    let provider = switchback_proxy::observe::telemetry::tracer_provider(&collector).unwrap();
    let subscriber = tracing_subscriber::registry()
        .with(switchback_proxy::observe::telemetry::trace_layer(&provider));
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
    // A client that sends its W3C trace context: continued, and passed on upstream.
    let r = proxy
        .http
        .post(proxy.url("/v1/chat/completions"))
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .json(&chat_body("smart", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
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
        .find(|s| s.name == "chat smart" && hex(&s.trace_id) != CLIENT_TRACE)
        .expect("a request span");
    // Without a client trace, providers get the proxy's own.
    let sent = backup.received()[0]
        .header("traceparent")
        .map(str::to_owned);
    let attempt_ids: Vec<String> = spans
        .iter()
        .filter(|s| s.parent_span_id == request.span_id)
        .map(|s| hex(&s.span_id))
        .collect();
    let sent = sent.expect("a traceparent upstream");
    assert!(
        attempt_ids
            .iter()
            .any(|id| sent == format!("00-{}-{id}-01", hex(&request.trace_id))),
        "{sent} names the attempt's span in the request's trace: {attempt_ids:?}"
    );

    // The client's trace: the request span is its child; the upstream request
    // carries the same trace, with the attempt span as parent.
    let continued = spans
        .iter()
        .find(|s| s.name == "chat smart" && hex(&s.trace_id) == CLIENT_TRACE)
        .expect("the request span continues the client's trace");
    assert_eq!(hex(&continued.parent_span_id), CLIENT_SPAN);
    let attempt = spans
        .iter()
        .find(|s| s.parent_span_id == continued.span_id)
        .expect("its attempt span");
    assert_eq!(
        primary.received()[1].header("traceparent"),
        Some(format!("00-{CLIENT_TRACE}-{}-01", hex(&attempt.span_id)).as_str())
    );
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

//! Where the proxy's logs and traces go: log lines (text or JSON) through a
//! non-blocking writer, and OpenTelemetry traces over OTLP/HTTP when an endpoint is
//! configured: one span per request and one child span per upstream attempt, with
//! GenAI semantic-convention attributes; the GenAI metrics go there too
//! (`otlp_metrics`).
//!
//! Trace spans use the target `TRACE_TARGET`. Only the OTLP layer listens to it, so
//! with tracing off those spans are disabled at their call sites and cost nothing
//! (the log layers' filters are static target filters, cached per call site).

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter, Targets, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub(crate) mod otlp_metrics;
mod request_lines;
mod writer;
pub use request_lines::RequestLines;
pub use writer::BatchedWriter;

/// `--log-format`: human-readable text, or one JSON object per line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The `tracing` target of request and attempt spans.
pub(crate) const TRACE_TARGET: &str = "switchback::trace";

/// W3C trace context: the client's trace, continued by the request span and passed on
/// to providers.
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub(crate) const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The request span continues the client's trace when the client sent a
/// `traceparent` (W3C trace context). Nothing to do when traces are off.
pub(crate) fn continue_trace(span: &tracing::Span, client: &HeaderMap) {
    if span.is_disabled() || !client.contains_key(TRACEPARENT) {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Extract(client));
    let _ = span.set_parent(parent);
}

/// The trace context an upstream request carries: with traces on, the attempt
/// span's (the client's trace when it sent one, else a trace of the proxy's own);
/// with traces off, the client's `traceparent` and `tracestate` unchanged.
pub(crate) fn propagate(attempt: &tracing::Span, client: &HeaderMap, upstream: &mut HeaderMap) {
    if attempt.is_disabled() {
        for name in [TRACEPARENT, TRACESTATE] {
            if let Some(v) = client.get(&name) {
                upstream.insert(name, v.clone());
            }
        }
        return;
    }
    TraceContextPropagator::new().inject_context(&attempt.context(), &mut Inject(upstream));
}

struct Extract<'a>(&'a HeaderMap);

impl Extractor for Extract<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct Inject<'a>(&'a mut HeaderMap);

impl Injector for Inject<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::try_from(value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Keeps the log writer and the trace exporter running; dropping it flushes both.
pub struct Telemetry {
    logs: BatchedWriter,
    tracer: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(t) = self.tracer.take() {
            let _ = t.shutdown();
        }
        self.logs.stop();
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot set up OTLP export to {endpoint}: {message}")]
pub struct TelemetryError {
    endpoint: String,
    message: String,
}

/// An OTLP/HTTP tracer provider exporting to `{endpoint}/v1/traces`.
pub fn tracer_provider(endpoint: &str) -> Result<SdkTracerProvider, TelemetryError> {
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .build()
        .map_err(|e| TelemetryError {
            endpoint: endpoint.to_string(),
            message: e.to_string(),
        })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name("switchback-proxy")
                .build(),
        )
        .build())
}

/// The layer that turns `TRACE_TARGET` spans into OpenTelemetry spans.
pub fn trace_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("switchback-proxy"))
        .with_filter(filter_fn(|m| m.target() == TRACE_TARGET))
}

/// Install the process-wide subscriber. Call once, from `main`.
pub fn init(format: LogFormat, otlp_endpoint: Option<&str>) -> Result<Telemetry, TelemetryError> {
    let filter =
        || EnvFilter::try_from_env("SWITCHBACK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let writer = BatchedWriter::start(std::io::stdout());
    // Colour codes only for a person at a terminal; they cost time per line otherwise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let tracer = otlp_endpoint.map(tracer_provider).transpose()?;
    dispatch(format, &writer, filter, ansi, tracer.as_ref()).init();
    Ok(Telemetry {
        logs: writer,
        tracer,
    })
}

/// The whole subscriber: log lines, request lines, and the OTLP layer when there is
/// a tracer. `filter` gives the `SWITCHBACK_LOG` directives (once per layer). Public
/// so that tests can read the lines exactly as the binary writes them.
pub fn dispatch(
    format: LogFormat,
    writer: &BatchedWriter,
    filter: impl Fn() -> EnvFilter,
    ansi: bool,
    tracer: Option<&SdkTracerProvider>,
) -> tracing::Dispatch {
    // Target filters, not closures: they are decided once per call site, so with
    // traces off the request and attempt spans are never even created.
    let logs_only = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_target(TRACE_TARGET, LevelFilter::OFF)
        .with_target(request_lines::TARGET, LevelFilter::OFF);
    let request_lines_only = Targets::new().with_target(request_lines::TARGET, LevelFilter::TRACE);
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(writer.clone())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(writer.clone())
            .boxed(),
    }
    .with_filter(filter().and(logs_only));
    // The per-request line has a writer of its own; SWITCHBACK_LOG still decides.
    let request_lines = RequestLines::new(writer.clone(), matches!(format, LogFormat::Json))
        .with_filter(filter().and(request_lines_only));
    let subscriber = tracing_subscriber::registry()
        .with(logs)
        .with(request_lines);
    // Not `.with(Option<layer>)`: an absent layer counts as interested in everything,
    // which would bring the disabled trace spans back to life.
    match tracer {
        Some(t) => subscriber.with(trace_layer(t)).into(),
        None => subscriber.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    /// Collects what is written, for the writer's and the layers' tests.
    #[derive(Clone, Default)]
    pub(super) struct Sink(pub(super) Arc<Mutex<Vec<u8>>>);

    impl Sink {
        pub(super) fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
        type Writer = Sink;
        fn make_writer(&'a self) -> Sink {
            self.clone()
        }
    }

    #[test]
    fn without_otlp_trace_spans_are_never_created_and_each_line_is_written_once() {
        let sink = Sink::default();
        let writer = BatchedWriter::flushing_every(sink.clone(), Duration::from_secs(3600));
        // Even with every level on, the trace spans stay off without a tracer.
        let dispatch = dispatch(
            LogFormat::Text,
            &writer,
            || EnvFilter::new("trace"),
            false,
            None,
        );
        tracing::dispatcher::with_default(&dispatch, || {
            let span = tracing::info_span!(target: TRACE_TARGET, "request", x = 1);
            assert!(span.is_disabled(), "a trace span was created without OTLP");
            tracing::info!(target: request_lines::TARGET, status = 200u16, "request");
            tracing::info!(target: "switchback_proxy", "serving");
        });
        writer.stop();
        let text = sink.text();
        assert_eq!(text.matches("switchback::request").count(), 1, "{text}");
        assert_eq!(text.matches("serving").count(), 1, "{text}");
    }

    #[test]
    fn without_traces_the_clients_trace_context_is_passed_on_unchanged() {
        let mut client = HeaderMap::new();
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        client.insert(TRACEPARENT, HeaderValue::from_static(tp));
        client.insert(TRACESTATE, HeaderValue::from_static("vendor=1"));
        let mut upstream = HeaderMap::new();
        propagate(&tracing::Span::none(), &client, &mut upstream);
        assert_eq!(upstream[TRACEPARENT], tp);
        assert_eq!(upstream[TRACESTATE], "vendor=1");
        let mut upstream = HeaderMap::new();
        propagate(&tracing::Span::none(), &HeaderMap::new(), &mut upstream);
        assert!(upstream.is_empty());
    }
}

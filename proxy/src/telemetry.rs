//! Where the proxy's logs and traces go: log lines (text or JSON) through a
//! non-blocking writer, and OpenTelemetry traces over OTLP/HTTP when an endpoint is
//! configured: one span per request and one child span per upstream attempt, with
//! GenAI semantic-convention attributes.
//!
//! Trace spans use the target [`TRACE_TARGET`]. Only the OTLP layer listens to it, so
//! with tracing off those spans are disabled at their call sites and cost nothing.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::cli::LogFormat;

/// The `tracing` target of request and attempt spans.
pub const TRACE_TARGET: &str = "switchback::trace";

/// Keeps the log writer and the trace exporter running; dropping it flushes both.
pub struct Telemetry {
    _log_writer: tracing_appender::non_blocking::WorkerGuard,
    tracer: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(t) = self.tracer.take() {
            let _ = t.shutdown();
        }
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

/// The layer that turns [`TRACE_TARGET`] spans into OpenTelemetry spans.
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
        EnvFilter::try_from_env("SWITCHBACK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Log lines are written by a background thread: a slow stdout never blocks a request.
    let (writer, guard) = tracing_appender::non_blocking(std::io::stdout());
    let not_trace_spans = filter_fn(|m| !(m.is_span() && m.target() == TRACE_TARGET));
    // Colour codes only for a person at a terminal; they cost time per line otherwise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(writer)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(writer)
            .boxed(),
    }
    .with_filter(filter.and(not_trace_spans));
    let tracer = otlp_endpoint.map(tracer_provider).transpose()?;
    tracing_subscriber::registry()
        .with(logs)
        .with(tracer.as_ref().map(|t| trace_layer(t)))
        .init();
    Ok(Telemetry {
        _log_writer: guard,
        tracer,
    })
}

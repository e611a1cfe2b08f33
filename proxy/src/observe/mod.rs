//! What the proxy counts and logs: why attempts fail (`reason`, the one vocabulary
//! of failures and skips), per-route and per-target counters and histograms
//! (`counters`), what answers cost (`cost`), the OpenTelemetry GenAI metrics
//! (`genai`), and where log lines and traces go (`telemetry`: the non-blocking
//! writer, the request log's line layer, OTLP export and trace context).
//!
//! Read back by the admin port; written by the request path with atomics only. It
//! knows no route, provider or config.

pub mod cost;
pub mod counters;
pub mod genai;
pub mod reason;
pub mod telemetry;

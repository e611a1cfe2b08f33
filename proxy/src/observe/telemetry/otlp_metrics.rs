//! The GenAI semantic conventions' metrics over OTLP/HTTP: every interval (and once
//! more at shutdown) the series `/metrics` shows are sent to `{endpoint}/v1/metrics`
//! as one protobuf `ExportMetricsServiceRequest`: histograms with the conventions'
//! names (`gen_ai.client.token.usage`), units (`{token}`, `s`), bounds and
//! attributes, cumulative since the process started.
//!
//! Built from the same counters `/metrics` reads (their source is given as a
//! function), not from OpenTelemetry SDK instruments: those would look up each
//! request's attribute set in a locked map on the request path, and the SDK's
//! metric data cannot be filled from outside it. The messages are the OpenTelemetry
//! project's own (`opentelemetry-proto`, what `opentelemetry-otlp` encodes traces
//! with), sent by `reqwest` (already in the tree under the trace exporter).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Histogram, HistogramDataPoint, Metric, ResourceMetrics, ScopeMetrics,
    metric::Data,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::TelemetryError;
use crate::observe::genai::{Kind, Series};

/// Where the series come from at each export.
pub type Source = Arc<dyn Fn() -> Vec<Series> + Send + Sync>;

/// How long one export may take before it is given up (the next one sends it all:
/// the series are cumulative).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The exporter: its endpoint, its client and what it sends.
pub struct OtlpMetrics {
    url: String,
    http: reqwest::Client,
    source: Source,
    resource: Resource,
    started_unix_nano: u64,
}

/// A running exporter; dropping it stops it (without a last export: see
/// [`OtlpMetrics::export`]).
pub struct Exporting {
    pub exporter: Arc<OtlpMetrics>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Exporting {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OtlpMetrics {
    /// An exporter to `{endpoint}/v1/metrics` of what `source` gives, for the replica
    /// `instance_id` that started at `started`.
    pub fn new(
        endpoint: &str,
        source: Source,
        instance_id: &str,
        started: SystemTime,
    ) -> Result<Self, TelemetryError> {
        let url = format!("{}/v1/metrics", endpoint.trim_end_matches('/'));
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(TelemetryError {
                endpoint: endpoint.to_string(),
                message: "not an http:// or https:// URL".into(),
            });
        }
        let http = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TelemetryError {
                endpoint: endpoint.to_string(),
                message: e.to_string(),
            })?;
        Ok(OtlpMetrics {
            url,
            http,
            source,
            resource: Resource {
                attributes: vec![
                    attribute("service.name", "switchback-proxy"),
                    attribute("service.instance.id", instance_id),
                ],
                ..Default::default()
            },
            started_unix_nano: unix_nano(started),
        })
    }

    /// Export every `interval` until dropped.
    pub fn start(self, interval: Duration) -> Exporting {
        let exporter = Arc::new(self);
        let task = {
            let exporter = exporter.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await; // the first tick is now: nothing to say yet
                let mut failing = false;
                loop {
                    tick.tick().await;
                    match exporter.export().await {
                        Ok(()) if failing => {
                            tracing::info!(url = %exporter.url, "OTLP metrics export works again");
                            failing = false;
                        }
                        Ok(()) => {}
                        // Said once, not every interval.
                        Err(e) if !failing => {
                            tracing::warn!(url = %exporter.url, error = %e,
                                "OTLP metrics export failed; retried every interval");
                            failing = true;
                        }
                        Err(_) => {}
                    }
                }
            })
        };
        Exporting { exporter, task }
    }

    /// Send the series now.
    pub async fn export(&self) -> Result<(), String> {
        let body = self.request(SystemTime::now()).encode_to_vec();
        let r = self
            .http
            .post(&self.url)
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(format!("the collector answered {}", r.status()))
        }
    }

    /// The request that says what the series hold at `now`.
    pub fn request(&self, now: SystemTime) -> ExportMetricsServiceRequest {
        let series = (self.source)();
        let now = unix_nano(now);
        let metrics = Kind::ALL
            .into_iter()
            .filter_map(|kind| {
                let points: Vec<HistogramDataPoint> = series
                    .iter()
                    .filter(|s| s.kind == kind)
                    .map(|s| HistogramDataPoint {
                        attributes: s.attributes.iter().map(|(k, v)| attribute(k, v)).collect(),
                        start_time_unix_nano: self.started_unix_nano,
                        time_unix_nano: now,
                        count: s.data.count(),
                        sum: Some(kind.sum(s.data.sum)),
                        bucket_counts: s.data.counts.clone(),
                        explicit_bounds: kind.bounds().to_vec(),
                        ..Default::default()
                    })
                    .collect();
                (!points.is_empty()).then(|| Metric {
                    name: kind.name().into(),
                    description: kind.description().into(),
                    unit: kind.unit().into(),
                    data: Some(Data::Histogram(Histogram {
                        data_points: points,
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    })),
                    ..Default::default()
                })
            })
            .collect();
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: "switchback-proxy".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }
}

fn attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn unix_nano(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::genai::HistData;

    #[test]
    fn series_become_cumulative_histograms_under_the_conventions_names() {
        let source: Source = Arc::new(|| {
            vec![Series {
                kind: Kind::OperationDuration,
                attributes: vec![
                    ("gen_ai.operation.name", "chat".into()),
                    ("error.type", "timeout".into()),
                ],
                data: HistData {
                    counts: vec![0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                    sum: 100_040_000,
                },
            }]
        });
        let started = UNIX_EPOCH + Duration::from_secs(10);
        let e = OtlpMetrics::new("http://127.0.0.1:4318/", source, "i-1", started).unwrap();
        assert_eq!(e.url, "http://127.0.0.1:4318/v1/metrics");
        let r = e.request(UNIX_EPOCH + Duration::from_secs(20));
        let scope = &r.resource_metrics[0].scope_metrics[0];
        assert_eq!(scope.metrics.len(), 1, "only metrics with series");
        let m = &scope.metrics[0];
        assert_eq!(
            (m.name.as_str(), m.unit.as_str()),
            ("gen_ai.client.operation.duration", "s")
        );
        let Some(Data::Histogram(h)) = &m.data else {
            panic!("{m:?}")
        };
        assert_eq!(
            h.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        let p = &h.data_points[0];
        assert_eq!((p.count, p.sum), (3, Some(100.04)));
        assert_eq!(p.explicit_bounds.len() + 1, p.bucket_counts.len());
        assert_eq!(p.start_time_unix_nano, 10_000_000_000);
        assert_eq!(p.time_unix_nano, 20_000_000_000);
        assert_eq!(p.attributes[1].key, "error.type");
        assert!(OtlpMetrics::new("collector:4318", Arc::new(Vec::new), "i", started).is_err());
    }
}

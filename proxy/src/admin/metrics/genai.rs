//! The OpenTelemetry GenAI semantic conventions' metrics (`observe::genai`) of every
//! target of the snapshot, merged where their attributes meet (two routes on one
//! provider and model are one series), for `/metrics` and the OTLP exporter
//! (`observe::telemetry::otlp_metrics`). On `/metrics` they take the Prometheus
//! names of OpenTelemetry metrics: dots become underscores, seconds get their unit
//! suffix (`gen_ai_client_operation_duration_seconds`), `{token}` is an annotation
//! and adds none (`gen_ai_client_token_usage`); attributes likewise
//! (`gen_ai_request_model`, `error_type`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::Fmt;
use crate::config::snapshot::Snapshot;
use crate::observe::genai::{Attributes, HistData, Kind, Series};

/// Every series with observations, merged by metric and attributes.
pub fn series(snapshot: &Snapshot) -> Vec<Series> {
    let mut merged: BTreeMap<(Kind, Attributes), HistData> = BTreeMap::new();
    let mut seen = HashSet::new();
    for r in &snapshot.route_list {
        for t in &r.targets {
            if !seen.insert(Arc::as_ptr(&t.counters)) {
                continue;
            }
            let provider = t.credential.adapter.system();
            for p in t.counters.genai.points() {
                merged
                    .entry((p.kind, p.attributes(provider)))
                    .or_default()
                    .merge(&p.data);
            }
        }
    }
    merged
        .into_iter()
        .map(|((kind, attributes), data)| Series {
            kind,
            attributes,
            data,
        })
        .collect()
}

pub(super) fn encode(enc: &mut DescriptorEncoder<'_>, snapshot: &Snapshot) -> Fmt {
    let all = series(snapshot);
    for kind in Kind::ALL {
        let name = kind.name().replace('.', "_");
        let unit = (kind.unit() == "s").then_some(Unit::Seconds);
        let mut m = enc.encode_descriptor(
            &name,
            kind.description(),
            unit.as_ref(),
            MetricType::Histogram,
        )?;
        for s in all.iter().filter(|s| s.kind == kind) {
            let labels: Vec<(String, &str)> = s
                .attributes
                .iter()
                .map(|(k, v)| (k.replace('.', "_"), v.as_str()))
                .collect();
            let buckets: Vec<(f64, u64)> = kind
                .bounds()
                .iter()
                .copied()
                .chain([f64::MAX]) // prometheus-client's +Inf
                .zip(s.data.counts.iter().copied())
                .collect();
            m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                kind.sum(s.data.sum),
                s.data.count(),
                &buckets,
                None,
            )?;
        }
    }
    Ok(())
}

//! The operator's Prometheus metrics and its small HTTP server: `/healthz`,
//! `/readyz` (caches synced) and `/metrics` (text exposition). Metrics live in a
//! registry owned by the caller: no global state.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: &'static str,
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Default)]
pub struct Metrics {
    pub reconciles: Family<ControllerLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub status_writes: Family<KindLabels, Counter>,
    pub config_writes: Family<KindLabels, Counter>,
    pub scrapes: Family<ResultLabels, Counter>,
    pub events: Family<ReasonLabels, Counter>,
    pub leader: Gauge,
}

impl Metrics {
    /// Registers every metric in `registry` under the `switchback_operator` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("switchback_operator");
        r.register(
            "reconciles",
            "Reconciles run, by controller",
            m.reconciles.clone(),
        );
        r.register(
            "reconcile_errors",
            "Reconciles that failed, by controller and error",
            m.errors.clone(),
        );
        r.register(
            "status_writes",
            "Status patches sent, by kind",
            m.status_writes.clone(),
        );
        r.register(
            "config_writes",
            "Rendered ConfigMap/Secret applies and deletes, by kind",
            m.config_writes.clone(),
        );
        r.register(
            "proxy_scrapes",
            "Proxy /admin/v1/stats scrapes, by result",
            m.scrapes.clone(),
        );
        r.register(
            "events",
            "Kubernetes Events published, by reason",
            m.events.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        m
    }
}

/// What the HTTP server reads.
pub struct Health {
    pub registry: Registry,
    /// Set once the caches have synced (or, on a standby replica, once it is waiting
    /// for the Lease).
    pub ready: AtomicBool,
}

pub fn router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health)
}

async fn readyz(State(h): State<Arc<Health>>) -> impl IntoResponse {
    if h.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n")
    }
}

async fn metrics(State(h): State<Arc<Health>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &h.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Binds and serves until the task is dropped.
pub async fn serve(addr: SocketAddr, health: Arc<Health>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, router(health)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_with_their_labels() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.reconciles
            .get_or_create(&ControllerLabels {
                controller: "llmroute",
            })
            .inc();
        m.errors
            .get_or_create(&ErrorLabels {
                controller: "llmroute",
                error: "kube",
            })
            .inc();
        m.events
            .get_or_create(&ReasonLabels {
                reason: "CircuitOpened",
            })
            .inc();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains("switchback_operator_reconciles_total{controller=\"llmroute\"} 1"),
            "{out}"
        );
        assert!(out.contains(
            "switchback_operator_reconcile_errors_total{controller=\"llmroute\",error=\"kube\"} 1"
        ));
        assert!(
            out.contains("switchback_operator_events_total{reason=\"CircuitOpened\"} 1"),
            "{out}"
        );
    }
}

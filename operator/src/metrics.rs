//! The operator's Prometheus metrics and its small HTTP server: `/healthz`,
//! `/readyz` (caches synced) and `/metrics` (text exposition). Metrics live in a
//! registry owned by the caller: no global state.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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
use switchback_crds::config::ObjectId;

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeliveryLabels {
    /// The source namespace whose delivery failed.
    pub namespace: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// `namespace/name`, as the proxy's `route` label.
    pub route: String,
    /// The reason of the route's Programmed condition.
    pub reason: String,
}

/// `switchback_operator_route_programmed`: one series per route, 1 while its
/// Programmed condition is True and 0 while it is False, labelled with the
/// condition's reason. A route whose reason changes loses its old series (one series
/// per route at any time); a deleted route loses it too (see [`Self::retain`]).
#[derive(Clone, Default)]
pub struct RouteProgrammed {
    family: Family<RouteLabels, Gauge>,
    /// The labels of each route's series now, to remove it when they change.
    current: Arc<Mutex<HashMap<ObjectId, RouteLabels>>>,
}

impl RouteProgrammed {
    /// Records the Programmed condition just computed for `route`.
    pub fn set(&self, route: &ObjectId, programmed: bool, reason: &str) {
        let labels = RouteLabels {
            route: route.to_string(),
            reason: reason.to_string(),
        };
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = current.insert(route.clone(), labels.clone())
            && old != labels
        {
            self.family.remove(&old);
        }
        self.family
            .get_or_create(&labels)
            .set(i64::from(programmed));
    }

    /// The reason and value of `route`'s series, if it has one.
    #[cfg(test)]
    pub fn of(&self, route: &ObjectId) -> Option<(String, i64)> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let labels = current.get(route)?;
        Some((
            labels.reason.clone(),
            self.family.get_or_create(labels).get(),
        ))
    }

    /// Drops the series of the routes `exists` says are gone.
    pub fn retain(&self, exists: impl Fn(&ObjectId) -> bool) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.retain(|id, labels| {
            let keep = exists(id);
            if !keep {
                self.family.remove(labels);
            }
            keep
        });
    }
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
    /// The proxy replicas of the last scrape round, by whether their stats were read
    /// (`result`: `ok`, `error`). Set by the leader only: a standby has no series.
    pub proxy_replicas: Family<ResultLabels, Gauge>,
    pub route_programmed: RouteProgrammed,
    /// Failed delivery attempts of one namespace's objects, by namespace and reason.
    pub delivery_failures: Family<DeliveryLabels, Counter>,
    /// Namespaces whose rendering is not delivered now (leader only).
    pub namespaces_undelivered: Gauge,
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
        r.register(
            "proxy_replicas",
            "Ready proxy replicas found in the last scrape round, by whether their stats were read (result ok or error); leader only",
            m.proxy_replicas.clone(),
        );
        r.register(
            "delivery_failures",
            "Failed attempts to deliver one namespace's rendered objects (it keeps its last delivered version), by source namespace and reason (too_large, invalid, conflict, forbidden, not_found, unavailable)",
            m.delivery_failures.clone(),
        );
        r.register(
            "namespaces_undelivered",
            "Source namespaces whose current rendering is not delivered (their routes say DeliveryFailed); leader only",
            m.namespaces_undelivered.clone(),
        );
        r.register(
            "route_programmed",
            "1 while an LLMRoute's Programmed condition is True, 0 while False, by route (namespace/name) and the condition's reason; leader only",
            m.route_programmed.family.clone(),
        );
        m
    }

    /// Counts one failed delivery attempt of `namespace`.
    pub fn delivery_failed(&self, namespace: &str, reason: &'static str) {
        self.delivery_failures
            .get_or_create(&DeliveryLabels {
                namespace: namespace.to_string(),
                reason,
            })
            .inc();
    }

    /// Counts the replicas of a scrape round: `ok` were read, `error` were not.
    pub fn proxy_replicas_seen(&self, ok: usize, error: usize) {
        for (result, n) in [("ok", ok), ("error", error)] {
            self.proxy_replicas
                .get_or_create(&ResultLabels { result })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
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

    fn exposition(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn proxy_replicas_are_counted_by_result_and_absent_until_a_round() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        // A standby (or a leader before its first round) says nothing: the alert on
        // "no ready proxy" must not read a default 0 as "none found".
        let out = exposition(&registry);
        assert!(
            !out.contains("switchback_operator_proxy_replicas{"),
            "{out}"
        );

        m.proxy_replicas_seen(2, 1);
        let out = exposition(&registry);
        assert!(
            out.contains("switchback_operator_proxy_replicas{result=\"ok\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("switchback_operator_proxy_replicas{result=\"error\"} 1"),
            "{out}"
        );

        m.proxy_replicas_seen(0, 0);
        let out = exposition(&registry);
        assert!(
            out.contains("switchback_operator_proxy_replicas{result=\"ok\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("switchback_operator_proxy_replicas{result=\"error\"} 0"),
            "{out}"
        );
    }

    #[test]
    fn route_programmed_keeps_one_series_per_route_and_forgets_deleted_routes() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let (smart, cheap) = (
            ObjectId::new("team-a", "smart"),
            ObjectId::new("team-b", "cheap"),
        );
        m.route_programmed.set(&smart, true, "Programmed");
        m.route_programmed.set(&cheap, false, "NotRendered");
        let out = exposition(&registry);
        assert!(
            out.contains(
                "switchback_operator_route_programmed{route=\"team-a/smart\",reason=\"Programmed\"} 1"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "switchback_operator_route_programmed{route=\"team-b/cheap\",reason=\"NotRendered\"} 0"
            ),
            "{out}"
        );

        // The reason changes: the series of the old reason goes.
        m.route_programmed.set(&smart, false, "Pending");
        let out = exposition(&registry);
        assert!(
            out.contains(
                "switchback_operator_route_programmed{route=\"team-a/smart\",reason=\"Pending\"} 0"
            ),
            "{out}"
        );
        assert!(!out.contains("reason=\"Programmed\""), "{out}");

        // team-b/cheap was deleted.
        m.route_programmed.retain(|id| *id == smart);
        let out = exposition(&registry);
        assert!(!out.contains("team-b/cheap"), "{out}");
        assert!(out.contains("route=\"team-a/smart\""), "{out}");
    }
}

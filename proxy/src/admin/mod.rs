//! The admin port (default 9090): `/healthz`, `/readyz` (ready once a config is
//! loaded, and not while draining), `/admin/v1/config` (the config served, no key
//! material, and the limits in effect), `/admin/v1/stats` (`stats`, for the
//! operator; `handover`: what it last read, for the final counts at shutdown) and
//! `/metrics` (`metrics`, Prometheus), behind the admin token's guard (`guard`). It
//! reads the gateway's state; it serves no client.

pub mod guard;
pub mod handover;
pub mod metrics;
pub mod stats;

use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, StatusCode, header};
use axum::routing::get;

use crate::gateway::Gateway;
use crate::wire::surface::pretty_json;

/// The admin port's app, behind the admin token's guard (none without a token file).
pub fn router(
    gw: Arc<Gateway>,
    token: Option<Arc<switchback_crds::admintoken::AdminTokenFile>>,
) -> Router {
    guard::guard(endpoints(gw), token)
}

fn endpoints(gw: Arc<Gateway>) -> Router {
    let registry = Arc::new(metrics::registry(gw.clone()));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/admin/v1/config", get(config))
        .route("/admin/v1/stats", get(stats_doc))
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        metrics::render(&registry),
                    )
                }
            }),
        )
        .with_state(gw)
}

/// `?round=N`: the operator's scrape round (see `stats::report_for`); anything else
/// in the query is ignored.
async fn stats_doc(
    State(gw): State<Arc<Gateway>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response<Body> {
    let round = query.as_deref().and_then(|q| {
        q.split('&')
            .find_map(|pair| pair.strip_prefix("round="))
            .and_then(|n| n.parse::<u64>().ok())
    });
    pretty_json(StatusCode::OK, &stats::report_for(&gw, round))
}

async fn readyz(State(gw): State<Arc<Gateway>>) -> (StatusCode, Cow<'static, str>) {
    if gw.front.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into())
    } else if gw.is_ready() {
        (StatusCode::OK, "ready\n".into())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            not_ready_because(&gw).into(),
        )
    }
}

/// Why a gateway that serves no config yet is not ready: nothing delivered yet, or
/// what was delivered was refused (and why).
fn not_ready_because(gw: &Gateway) -> String {
    match gw.report().last_error {
        Some(refused) => {
            let mut text = String::from("no config loaded yet: the config was refused:\n");
            for p in &refused.problems {
                text.push_str("  ");
                text.push_str(&p.to_string());
                text.push('\n');
            }
            text
        }
        None => "no config loaded yet\n".into(),
    }
}

/// `GET /admin/v1/config`: the compiled config being served (no key material: keys
/// live apart from it, clients show only their key hash), which credentials have a
/// key, the `--auth` mode, and the load report.
async fn config(State(gw): State<Arc<Gateway>>) -> Response<Body> {
    let snapshot = gw.snapshot();
    let credentials: Vec<_> = snapshot
        .config
        .credentials
        .iter()
        .map(|c| {
            let mut v = serde_json::to_value(c).unwrap_or_default();
            let has_key = snapshot
                .credentials
                .get(&c.id)
                .is_some_and(|rt| !rt.keys.is_empty());
            v["keyPresent"] = serde_json::Value::Bool(has_key);
            v
        })
        .collect();
    let limits = &gw.front.limits;
    let body = serde_json::json!({
        "ready": gw.is_ready(),
        "load": gw.report(),
        "auth": gw.auth.mode.as_str(),
        // What the flags set (docs/limits.md#the-limits): lets a deployment check its
        // values arrived.
        "settings": {
            "threads": gw.lanes,
            "maxBodyBytes": gw.max_body_bytes,
            "headerReadTimeoutMs": limits.header_read_timeout.as_millis() as u64,
            "bodyReadTimeoutMs": limits.body_read_timeout.as_millis() as u64,
            "idleTimeoutMs": limits.idle_timeout.as_millis() as u64,
            "maxConnections": limits.max_connections,
            "maxInflightBodyBytes": limits.max_inflight_body_bytes,
            "maxHeaderBytes": limits.max_header_bytes,
            "maxInflightHeaderBytes": limits.max_inflight_header_bytes,
            "clientWriteTimeoutMs": limits.client_write_timeout.as_millis() as u64,
            "maxHops": limits.max_hops,
            "adminMaxConnections": limits.admin_max_connections,
            "adminIdleTimeoutMs": limits.admin_idle_timeout.as_millis() as u64,
            "maxEventBytes": gw.upstream_limits.max_event_bytes,
            "maxResponseBytes": gw.upstream_limits.max_response_bytes,
            "maxInflightResponseBytes": gw.upstream_limits.max_inflight_response_bytes,
            "allowEmptyConfig": gw.allow_empty_config,
        },
        "routes": snapshot.config.routes,
        "credentials": credentials,
        // Key hashes only (HMACs under the cluster secret), never keys.
        "clients": snapshot.config.clients,
    });
    pretty_json(StatusCode::OK, &body)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn readyz_says_why_the_gateway_is_not_ready() {
        let gw = Arc::new(Gateway::new(1024, "test".into(), 1).unwrap());
        let (status, text) = readyz(State(gw.clone())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(text, "no config loaded yet\n");

        let e = gw
            .apply(&switchback_crds::compile::Compiled::default(), Vec::new())
            .unwrap_err();
        assert!(matches!(e, crate::gateway::ApplyError::NoRoute), "{e}");
        gw.refuse(vec![crate::gateway::Problem {
            file: Some("switchback.yaml".into()),
            line: None,
            object: None,
            field: None,
            message: e.to_string(),
        }]);
        let (status, text) = readyz(State(gw.clone())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            text.contains("switchback.yaml: the config has no LLMRoute"),
            "{text}"
        );
        assert!(text.contains("--allow-empty-config"), "{text}");
        assert!(!gw.is_ready());

        gw.front
            .draining
            .store(true, std::sync::atomic::Ordering::Release);
        assert_eq!(readyz(State(gw)).await.1, "shutting down\n");
    }

    /// `/admin/v1/config` shows the limits the flags set (a chart's values can be
    /// checked on a running replica) next to the config.
    #[tokio::test]
    async fn the_config_endpoint_shows_the_limits_in_effect() {
        let mut gw = Gateway::new(4096, "test".into(), 3).unwrap();
        gw.front = Arc::new(crate::front::Front::new(
            crate::front::ClientLimits {
                max_connections: 123,
                idle_timeout: Duration::from_secs(7),
                ..Default::default()
            },
            3,
        ));
        gw.set_upstream_limits(crate::limits::answers::UpstreamLimits {
            max_event_bytes: 2048,
            ..Default::default()
        });
        let response = config(State(Arc::new(gw))).await;
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let settings = &v["settings"];
        assert_eq!(settings["threads"], 3);
        assert_eq!(settings["maxBodyBytes"], 4096);
        assert_eq!(settings["maxConnections"], 123);
        assert_eq!(settings["idleTimeoutMs"], 7000);
        assert_eq!(settings["headerReadTimeoutMs"], 10_000);
        assert_eq!(settings["maxEventBytes"], 2048);
        assert_eq!(settings["maxResponseBytes"], 32 << 20);
        assert_eq!(settings["allowEmptyConfig"], false);
        assert_eq!(settings["maxHeaderBytes"], 64 << 10);
        assert_eq!(settings["clientWriteTimeoutMs"], 60_000);
        assert_eq!(settings["maxHops"], 2);
        assert_eq!(settings["adminMaxConnections"], 128);
        assert_eq!(settings["adminIdleTimeoutMs"], 30_000);
    }
}

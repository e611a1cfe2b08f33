//! Finding the proxy replicas and reading their `/admin/v1/stats`: the ready
//! endpoints of the proxy admin Service (EndpointSlices), and the terminating ones
//! until they are gone (a draining replica still counts usage: docs/tenancy.md#drains), or the
//! fixed `--proxy-admin-url` list for proxies run outside the cluster. Each read
//! names the scrape round it belongs to (`?round=`), which the proxies remember
//! their client counters at (see `switchback_crds::config::BudgetLeft`).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};
use switchback_crds::admintoken::AdminToken;
use switchback_crds::stats::{STATS_VERSION, StatsReport};

use crate::aggregate::Scrape;

/// One scrape may take this long.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// A replica to read, as found: its admin base URL, and whether it is shutting down
/// (scraped for its counts, not counted among the ready replicas).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub url: String,
    pub terminating: bool,
}

/// Where the replicas are.
#[derive(Clone, Debug)]
pub enum Replicas {
    /// Fixed admin base URLs.
    Urls(Vec<String>),
    /// The ready endpoints of a Service, on a named port.
    Service {
        namespace: String,
        name: String,
        port_name: String,
    },
}

impl Replicas {
    /// The replicas to read: ready ones, and terminating ones until they exit. A
    /// fixed URL is read whatever its readiness; one that drains says so in its
    /// stats.
    pub async fn discover(&self, client: &Client) -> Result<Vec<Found>, kube::Error> {
        match self {
            Replicas::Urls(urls) => Ok(urls
                .iter()
                .map(|u| Found {
                    url: u.trim_end_matches('/').to_string(),
                    terminating: false,
                })
                .collect()),
            Replicas::Service {
                namespace,
                name,
                port_name,
            } => {
                let api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
                let slices = api
                    .list(
                        &ListParams::default()
                            .labels(&format!("kubernetes.io/service-name={name}")),
                    )
                    .await?;
                Ok(endpoints(&slices.items, port_name))
            }
        }
    }
}

/// Pure: `http://ip:port` on `port_name` of every endpoint in `slices` that is ready,
/// or terminating (serving or not: a replica that drains answers 503 on /readyz but
/// still counts what its open requests spend, until it exits and leaves the slice).
pub fn endpoints(slices: &[EndpointSlice], port_name: &str) -> Vec<Found> {
    let mut out = Vec::new();
    for slice in slices {
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(port_name))
            .and_then(|p| p.port)
        else {
            continue;
        };
        for endpoint in slice.endpoints.iter().flatten() {
            let conditions = endpoint.conditions.as_ref();
            // "unknown" is ready, per the EndpointSlice API.
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            if !ready && !terminating {
                continue;
            }
            for address in endpoint.addresses.iter().take(1) {
                let host = if address.contains(':') {
                    format!("[{address}]")
                } else {
                    address.clone()
                };
                out.push(Found {
                    url: format!("http://{host}:{port}"),
                    terminating,
                });
            }
        }
    }
    out.sort_by(|a, b| a.url.cmp(&b.url));
    out.dedup_by(|a, b| a.url == b.url);
    out
}

/// Scrapes one replica in scrape round `round`, with the admin token
/// (`--proxy-admin-token-file`) as `Authorization: Bearer` when there is one.
pub async fn scrape(
    http: &reqwest::Client,
    base: &str,
    token: Option<&AdminToken>,
    round: u64,
) -> Scrape {
    let result = async {
        let mut request = http
            .get(format!("{base}/admin/v1/stats?round={round}"))
            .timeout(SCRAPE_TIMEOUT);
        if let Some(token) = token {
            // Marked sensitive: never shown in reqwest's Debug output.
            request = request.bearer_auth(token.expose());
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        if response.status() == reqwest::StatusCode::UNAUTHORIZED {
            return Err(if token.is_some() {
                format!(
                    "{UNAUTHORIZED}: the proxy refused the admin token (token mismatch: \
                         --proxy-admin-token-file must hold the proxy's --admin-token-file token)"
                )
            } else {
                format!(
                    "{UNAUTHORIZED}: the proxy requires an admin token; none is configured \
                         (set --proxy-admin-token-file)"
                )
            });
        }
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        let body = response.bytes().await.map_err(|e| e.to_string())?;
        let report: StatsReport =
            serde_json::from_slice(&body).map_err(|e| format!("not a stats document: {e}"))?;
        if report.version != STATS_VERSION {
            return Err(format!(
                "stats version {} is not supported (this operator reads {STATS_VERSION})",
                report.version
            ));
        }
        Ok(report)
    }
    .await;
    Scrape {
        endpoint: base.to_string(),
        result,
    }
}

/// How a 401 scrape error starts.
pub const UNAUTHORIZED: &str = "HTTP 401 Unauthorized";

/// The replicas whose last scrape was refused for the admin token, so that each is
/// logged once when it starts refusing (and again only after it accepted in between).
#[derive(Debug, Default)]
pub struct Refusals {
    refusing: BTreeSet<String>,
}

impl Refusals {
    /// The scrapes refused for the token that were not refused the time before.
    pub fn observe<'s>(&mut self, scrapes: &'s [Scrape]) -> Vec<&'s Scrape> {
        let mut new = Vec::new();
        for s in scrapes {
            match &s.result {
                Err(e) if e.starts_with(UNAUTHORIZED) => {
                    if self.refusing.insert(s.endpoint.clone()) {
                        new.push(s);
                    }
                }
                _ => {
                    self.refusing.remove(&s.endpoint);
                }
            }
        }
        let seen: BTreeSet<&str> = scrapes.iter().map(|s| s.endpoint.as_str()).collect();
        self.refusing.retain(|e| seen.contains(e.as_str()));
        new
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    #[test]
    fn ready_and_terminating_endpoints_on_the_admin_port() {
        let endpoint = |ip: &str, ready: Option<bool>, terminating: Option<bool>| Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready,
                serving: ready,
                terminating,
            }),
            ..Endpoint::default()
        };
        let slice = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(vec![
                endpoint("10.0.0.1", Some(true), None),
                // Not ready, not terminating: starting, or failing its probe.
                endpoint("10.0.0.2", Some(false), Some(false)),
                endpoint("10.0.0.3", None, None),
                // Draining after SIGTERM: /readyz says 503, its counts still matter.
                endpoint("10.0.0.4", Some(false), Some(true)),
            ]),
            ports: Some(vec![
                EndpointPort {
                    name: Some("data".into()),
                    port: Some(8080),
                    ..EndpointPort::default()
                },
                EndpointPort {
                    name: Some("admin".into()),
                    port: Some(9090),
                    ..EndpointPort::default()
                },
            ]),
            ..EndpointSlice::default()
        };
        let found = |url: &str, terminating| Found {
            url: url.into(),
            terminating,
        };
        assert_eq!(
            endpoints(&[slice], "admin"),
            [
                found("http://10.0.0.1:9090", false),
                found("http://10.0.0.3:9090", false),
                found("http://10.0.0.4:9090", true),
            ]
        );
    }

    /// A stand-in proxy admin port on loopback that records the Authorization header
    /// of each request and answers like a proxy with token `accept`.
    async fn admin_port(accept: &'static str) -> (String, Arc<Mutex<Vec<Option<String>>>>) {
        use axum::http::{HeaderMap, StatusCode};
        let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let app = axum::Router::new().route(
            "/admin/v1/stats",
            axum::routing::get({
                let seen = seen.clone();
                move |headers: HeaderMap| async move {
                    let auth = headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_string());
                    seen.lock().unwrap().push(auth.clone());
                    if auth.as_deref() == Some(&format!("Bearer {accept}")) {
                        let report = StatsReport {
                            version: STATS_VERSION,
                            instance_id: "i".into(),
                            ..StatsReport::default()
                        };
                        (StatusCode::OK, serde_json::to_string(&report).unwrap())
                    } else {
                        (StatusCode::UNAUTHORIZED, "{}".to_string())
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}"), seen)
    }

    const TOKEN: &str = "admin-token-0123456789abcdef";

    #[tokio::test]
    async fn every_scrape_carries_the_admin_token() {
        let (base, seen) = admin_port(TOKEN).await;
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let token = AdminToken::new(TOKEN.as_bytes()).unwrap();
        let s = scrape(&http, &base, Some(&token), 7).await;
        assert_eq!(s.result.unwrap().instance_id, "i");
        assert_eq!(
            seen.lock().unwrap().as_slice(),
            [Some(format!("Bearer {TOKEN}"))]
        );
    }

    #[tokio::test]
    async fn a_refused_token_is_a_scrape_error_that_does_not_show_it() {
        let (base, _) = admin_port("the-proxys-own-token-0123").await;
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let token = AdminToken::new(TOKEN.as_bytes()).unwrap();
        let e = scrape(&http, &base, Some(&token), 7)
            .await
            .result
            .unwrap_err();
        assert!(e.starts_with(UNAUTHORIZED), "{e}");
        assert!(e.contains("token mismatch"), "{e}");
        assert!(!e.contains(TOKEN), "{e}");
        let e = scrape(&http, &base, None, 7).await.result.unwrap_err();
        assert!(
            e.starts_with(UNAUTHORIZED) && e.contains("--proxy-admin-token-file"),
            "{e}"
        );
    }

    #[test]
    fn a_refusing_replica_is_reported_once_until_it_accepts() {
        let refused = |endpoint: &str| Scrape {
            endpoint: endpoint.into(),
            result: Err(format!("{UNAUTHORIZED}: token mismatch")),
        };
        let down = |endpoint: &str| Scrape {
            endpoint: endpoint.into(),
            result: Err("connection refused".into()),
        };
        let ends = |v: Vec<&Scrape>| v.iter().map(|s| s.endpoint.clone()).collect::<Vec<_>>();
        let mut r = Refusals::default();
        assert_eq!(ends(r.observe(&[refused("a"), down("b")])), ["a"]);
        assert!(r.observe(&[refused("a"), down("b")]).is_empty());
        assert_eq!(ends(r.observe(&[refused("a"), refused("b")])), ["b"]);
        // `a` accepted (or failed otherwise) once: a new refusal is news again.
        assert!(r.observe(&[down("a"), refused("b")]).is_empty());
        assert_eq!(ends(r.observe(&[refused("a"), refused("b")])), ["a"]);
        // A replica gone from the list is forgotten.
        assert!(r.observe(&[refused("a")]).is_empty());
        assert_eq!(ends(r.observe(&[refused("a"), refused("b")])), ["b"]);
    }
}

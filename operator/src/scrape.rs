//! Finding the proxy replicas and reading their `/admin/v1/stats`: the ready
//! endpoints of the proxy admin Service (EndpointSlices), or the fixed
//! `--proxy-admin-url` list for proxies run outside the cluster.

use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};
use switchback_crds::stats::{STATS_VERSION, StatsReport};

use crate::aggregate::Scrape;

/// One scrape may take this long.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// Admin base URLs of the ready replicas.
    pub async fn discover(&self, client: &Client) -> Result<Vec<String>, kube::Error> {
        match self {
            Replicas::Urls(urls) => Ok(urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_string())
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
                Ok(ready_endpoints(&slices.items, port_name))
            }
        }
    }
}

/// Pure: `http://ip:port` of every ready endpoint in `slices` on `port_name`.
pub fn ready_endpoints(slices: &[EndpointSlice], port_name: &str) -> Vec<String> {
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
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true); // "unknown" is ready, per the EndpointSlice API
            if !ready {
                continue;
            }
            for address in endpoint.addresses.iter().take(1) {
                let host = if address.contains(':') {
                    format!("[{address}]")
                } else {
                    address.clone()
                };
                out.push(format!("http://{host}:{port}"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Scrapes one replica.
pub async fn scrape(http: &reqwest::Client, base: &str) -> Scrape {
    let result = async {
        let response = http
            .get(format!("{base}/admin/v1/stats"))
            .timeout(SCRAPE_TIMEOUT)
            .send()
            .await
            .map_err(|e| e.to_string())?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    #[test]
    fn only_ready_endpoints_on_the_admin_port() {
        let endpoint = |ip: &str, ready: Option<bool>| Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready,
                ..EndpointConditions::default()
            }),
            ..Endpoint::default()
        };
        let slice = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(vec![
                endpoint("10.0.0.1", Some(true)),
                endpoint("10.0.0.2", Some(false)),
                endpoint("10.0.0.3", None),
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
        assert_eq!(
            ready_endpoints(&[slice], "admin"),
            ["http://10.0.0.1:9090", "http://10.0.0.3:9090"]
        );
    }
}

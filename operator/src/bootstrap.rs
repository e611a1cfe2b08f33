//! The Secrets an install needs generated once (docs/chart.md#generated-secrets): the
//! client-key HMAC secret and the proxies' admin token.
//!
//! The chart renders neither: a GitOps tool renders with `helm template` (no `lookup`),
//! so a random value in a template would be a new value at every sync. The operator
//! creates each at start when it is absent, with a random value, and never overwrites
//! one that exists (the user's own, or its own from an earlier start); two replicas
//! starting together race on `create`, and the loser reads the winner's. The Secrets
//! carry no owner: they outlive the operator and `helm uninstall`, as the keys hashed
//! with them do.
//!
//! The operator reads them through the API, not from a volume: a pod waits for its
//! required Secret volumes, and the operator cannot wait for what it is to create. The
//! proxies mount them as required volumes, so their pods wait until this is done.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use rand::Rng;
use switchback_crds::admintoken::{AdminToken, AdminTokenFile, Refresh};
use switchback_crds::delivery::{MANAGED_BY, MANAGED_BY_LABEL};

/// The annotation saying what a generated Secret is for.
pub const PURPOSE_ANNOTATION: &str = "switchback.dev/generated";

/// One Secret of the gateway namespace the operator reads, and may create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generated {
    pub namespace: String,
    pub name: String,
    /// The data key holding the value.
    pub key: String,
    /// Create it when absent (`--generate-*`); otherwise it is the user's to create.
    pub generate: bool,
    /// What it is, for the annotation and the messages.
    pub purpose: &'static str,
    /// Random alphanumeric characters in a generated value.
    pub length: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(
        "Secret {namespace}/{name} ({purpose}) does not exist; create it with the key {key:?} \
         (or let the operator generate it: the chart does unless an existingSecret is named)"
    )]
    Missing {
        namespace: String,
        name: String,
        key: String,
        purpose: &'static str,
    },
    #[error("Secret {namespace}/{name} ({purpose}) has no key {key:?}; it is never overwritten")]
    NoKey {
        namespace: String,
        name: String,
        key: String,
        purpose: &'static str,
    },
    #[error("Kubernetes API, Secret {namespace}/{name}: {source}")]
    Kube {
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

impl Generated {
    fn kube(&self, source: kube::Error) -> BootstrapError {
        BootstrapError::Kube {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// The value in `secret`, or why there is none.
    fn value_of(&self, secret: &Secret) -> Result<Vec<u8>, BootstrapError> {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(&self.key))
            .map(|v| v.0.clone())
            .ok_or_else(|| BootstrapError::NoKey {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                key: self.key.clone(),
                purpose: self.purpose,
            })
    }

    /// The Secret to create: a fresh random value, labelled as the operator's.
    pub fn fresh(&self) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                    (
                        "app.kubernetes.io/part-of".to_string(),
                        "switchback".to_string(),
                    ),
                ])),
                annotations: Some(BTreeMap::from([(
                    PURPOSE_ANNOTATION.to_string(),
                    format!(
                        "{}: created by switchback-operator because it was absent; never overwritten",
                        self.purpose
                    ),
                )])),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from([(
                self.key.clone(),
                ByteString(random_value(self.length).into_bytes()),
            )])),
            ..Secret::default()
        }
    }

    /// The Secret's value: read, or created first when absent and `generate`.
    /// Returns whether this call created it.
    pub async fn ensure(&self, api: &Api<Secret>) -> Result<(Vec<u8>, bool), BootstrapError> {
        if let Some(existing) = api.get_opt(&self.name).await.map_err(|e| self.kube(e))? {
            return Ok((self.value_of(&existing)?, false));
        }
        if !self.generate {
            return Err(BootstrapError::Missing {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                key: self.key.clone(),
                purpose: self.purpose,
            });
        }
        match api.create(&PostParams::default(), &self.fresh()).await {
            Ok(created) => Ok((self.value_of(&created)?, true)),
            // Another replica created it first: use that one.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api.get(&self.name).await.map_err(|e| self.kube(e))?;
                Ok((self.value_of(&existing)?, false))
            }
            Err(e) => Err(self.kube(e)),
        }
    }

    /// [`Generated::ensure`] until it succeeds and `accept` takes the value, retrying
    /// every `every` and logging why not (a user's Secret not created yet, a value
    /// too short, RBAC). The operator is not ready meanwhile.
    pub async fn wait_for<T>(
        &self,
        api: &Api<Secret>,
        every: std::time::Duration,
        accept: impl Fn(&[u8]) -> Result<T, String>,
    ) -> T {
        loop {
            let why = match self.ensure(api).await {
                Ok((value, created)) => match accept(&value) {
                    Ok(v) => {
                        if created {
                            tracing::info!(
                                secret = %format!("{}/{}", self.namespace, self.name),
                                "created the {} (it was absent)",
                                self.purpose
                            );
                        }
                        return v;
                    }
                    Err(e) => format!(
                        "Secret {}/{} key {:?} ({}): {e}",
                        self.namespace, self.name, self.key, self.purpose
                    ),
                },
                Err(e) => e.to_string(),
            };
            tracing::error!("{why}; retrying in {every:?}");
            tokio::time::sleep(every).await;
        }
    }
}

/// `length` random ASCII letters and digits, from the thread's CSPRNG (ChaCha, seeded
/// by the OS): about 5.95 bits each, so 64 carry 380 bits.
pub fn random_value(length: usize) -> String {
    rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(length)
        .map(char::from)
        .collect()
}

/// Where the operator takes the proxies' admin token from: a file
/// (`--proxy-admin-token-file`, re-read when it changes) or a Secret of the gateway
/// namespace (`--admin-token-secret`, watched: a rotated token is used at the next
/// scrape).
#[derive(Clone, Debug)]
pub enum AdminTokenSource {
    File(Arc<AdminTokenFile>),
    Secret(Arc<WatchedToken>),
}

impl AdminTokenSource {
    /// The token to send now (the last good one when the source went bad), and a log
    /// line when it changed.
    pub fn current(&self) -> Option<Arc<AdminToken>> {
        match self {
            AdminTokenSource::File(file) => {
                let (token, refresh) = file.current();
                match refresh {
                    Refresh::Unchanged => {}
                    Refresh::Reloaded => tracing::info!(
                        file = %file.path().display(),
                        "the proxy admin token file changed: scraping with the new token"
                    ),
                    Refresh::KeptLast(why) => tracing::warn!("{why}"),
                }
                Some(token)
            }
            AdminTokenSource::Secret(watched) => Some(watched.current()),
        }
    }
}

/// The admin token of a Secret, kept current by a watch on that one Secret.
pub struct WatchedToken {
    secret: Generated,
    store: Store<Secret>,
    /// The resourceVersion last read, and the token in use.
    state: Mutex<(Option<String>, Arc<AdminToken>)>,
    _watch: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for WatchedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedToken")
            .field("secret", &self.secret.name)
            .finish_non_exhaustive()
    }
}

impl WatchedToken {
    /// Starts watching `secret` (by name) with `first`, the token read at start.
    pub fn start(client: Client, secret: Generated, first: AdminToken) -> Self {
        let api: Api<Secret> = Api::namespaced(client, &secret.namespace);
        let (store, writer) = reflector::store();
        let config = watcher::Config::default().fields(&format!("metadata.name={}", secret.name));
        let events = reflector::reflector(writer, watcher(api, config)).default_backoff();
        let watch = tokio::spawn(events.for_each(|event| {
            if let Err(e) = event {
                tracing::warn!(error = %e, "watching the admin token Secret");
            }
            std::future::ready(())
        }));
        Self {
            secret,
            store,
            state: Mutex::new((None, Arc::new(first))),
            _watch: watch,
        }
    }

    fn current(&self) -> Arc<AdminToken> {
        let object = ObjectRef::new(&self.secret.name).within(&self.secret.namespace);
        let found = self.store.get(&object);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let version = found
            .as_ref()
            .and_then(|s| s.metadata.resource_version.clone());
        if version.is_none() || version == state.0 {
            // Not listed yet, deleted (the last good token stays), or unchanged.
            return state.1.clone();
        }
        let first_read = state.0.is_none();
        state.0 = version;
        let parsed = found
            .as_deref()
            .ok_or_else(|| "absent".to_string())
            .and_then(|s| self.secret.value_of(s).map_err(|e| e.to_string()))
            .and_then(|v| AdminToken::new(&v).map_err(|e| e.to_string()));
        match parsed {
            Ok(token) => {
                if !first_read && token.expose() != state.1.expose() {
                    tracing::info!(
                        secret = %self.secret.name,
                        "the proxy admin token Secret changed: scraping with the new token"
                    );
                }
                state.1 = Arc::new(token);
            }
            Err(why) => tracing::warn!(
                secret = %self.secret.name,
                "the admin token Secret holds no usable token ({why}); the last good one stays in use"
            ),
        }
        state.1.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{ApiServerVerifier, Expect, not_found};
    use http::{Method, Request, Response};
    use kube::client::Body;
    use serde_json::json;

    /// The Secrets of namespace `gw` on a scripted API server.
    fn scripted() -> (Api<Secret>, ApiServerVerifier) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        (
            Api::namespaced(client, "gw"),
            ApiServerVerifier::new(handle),
        )
    }

    const PATH: &str = "/api/v1/namespaces/gw/secrets/sb-client-key-hmac";

    fn hmac(generate: bool) -> Generated {
        Generated {
            namespace: "gw".into(),
            name: "sb-client-key-hmac".into(),
            key: "hmac".into(),
            generate,
            purpose: "client-key HMAC secret",
            length: 64,
        }
    }

    #[test]
    fn random_values_are_alphanumeric_and_differ() {
        let a = random_value(64);
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_alphanumeric()), "{a}");
        assert_ne!(a, random_value(64));
        let fresh = hmac(true).fresh();
        let value = &fresh.data.as_ref().unwrap()["hmac"].0;
        assert_eq!(value.len(), 64);
        assert_eq!(
            fresh.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
            MANAGED_BY
        );
        assert!(fresh.metadata.owner_references.is_none());
    }

    fn secret_json(value: &str) -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "sb-client-key-hmac", "namespace": "gw", "resourceVersion": "7"},
            "data": {"hmac": base64(value)}
        })
    }

    fn base64(v: &str) -> String {
        serde_json::to_value(ByteString(v.as_bytes().to_vec()))
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }

    fn absent() -> serde_json::Value {
        not_found("secrets", "sb-client-key-hmac")
    }

    /// An existing Secret is read and never written, whatever `generate` says.
    #[tokio::test]
    async fn an_existing_secret_is_read_not_overwritten() {
        let (api, server) = scripted();
        let server = server.run(vec![Expect::new(Method::GET, PATH, |_| {
            (200, secret_json("an existing value of 32 bytes or more"))
        })]);
        let (value, created) = hmac(true).ensure(&api).await.unwrap();
        crate::fixtures::finish(server).await;
        assert_eq!(value, b"an existing value of 32 bytes or more");
        assert!(!created);
    }

    /// Absent and ours to generate: created with a random value; absent and the
    /// user's: an error naming the Secret and the key.
    #[tokio::test]
    async fn an_absent_secret_is_created_only_when_generated() {
        let (api, server) = scripted();
        let server = server.run(vec![
            Expect::new(Method::GET, PATH, |_| (404, absent())),
            Expect::new(
                Method::POST,
                "/api/v1/namespaces/gw/secrets?".to_string(),
                |body| {
                    let b = body.unwrap();
                    assert_eq!(b["metadata"]["name"], "sb-client-key-hmac");
                    assert!(b["metadata"]["ownerReferences"].is_null());
                    (201, b)
                },
            ),
        ]);
        let (value, created) = hmac(true).ensure(&api).await.unwrap();
        crate::fixtures::finish(server).await;
        assert!(created);
        assert_eq!(value.len(), 64);

        let (api, server) = scripted();
        let server = server.run(vec![Expect::new(Method::GET, PATH, |_| (404, absent()))]);
        let e = hmac(false).ensure(&api).await.unwrap_err();
        crate::fixtures::finish(server).await;
        let e = e.to_string();
        assert!(e.contains("gw/sb-client-key-hmac"), "{e}");
        assert!(e.contains("\"hmac\""), "{e}");
    }

    /// Two operator replicas start together: the one whose create loses (409) uses
    /// the winner's value.
    #[tokio::test]
    async fn losing_the_create_race_reads_the_winners_value() {
        let (api, server) = scripted();
        let server = server.run(vec![
            Expect::new(Method::GET, PATH, |_| (404, absent())),
            Expect::new(
                Method::POST,
                "/api/v1/namespaces/gw/secrets?".to_string(),
                |_| {
                    (
                        409,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "reason": "AlreadyExists", "code": 409, "message": "exists"}),
                    )
                },
            ),
            Expect::new(Method::GET, PATH, |_| {
                (200, secret_json("the winner's value, 32 bytes or more"))
            }),
        ]);
        let (value, created) = hmac(true).ensure(&api).await.unwrap();
        crate::fixtures::finish(server).await;
        assert_eq!(value, b"the winner's value, 32 bytes or more");
        assert!(!created);
    }

    /// A Secret without the key is the user's mistake to fix: never overwritten.
    #[tokio::test]
    async fn a_secret_without_the_key_is_an_error() {
        let (api, server) = scripted();
        let server = server.run(vec![Expect::new(Method::GET, PATH, |_| {
            (
                200,
                json!({"apiVersion": "v1", "kind": "Secret",
                           "metadata": {"name": "sb-client-key-hmac", "namespace": "gw"},
                           "data": {"other": "eA=="}}),
            )
        })]);
        let e = hmac(true).ensure(&api).await.unwrap_err();
        crate::fixtures::finish(server).await;
        assert!(e.to_string().contains("never overwritten"), "{e}");
    }
}

//! Test fixtures (compiled only for tests): objects, a [`Context`] on kube's mock
//! service, and [`ApiServerVerifier`], a scripted API server that asserts each call's
//! method, path, query and body and answers it as the API server would.

use std::sync::Arc;

use http::{Method, Request, Response};
use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::Value;
use switchback_crds::credential::{CredentialSecretRef, SecretKeySelector};
use switchback_crds::route::{CredentialRef, TargetSpec};
use switchback_crds::{
    LLMClient, LLMRoute, LLMRouteSpec, ProviderCredential, ProviderCredentialSpec,
};
use tokio::sync::mpsc;
use tower_test::mock::{self, Handle};

use crate::controller::{Context, Settings, Stores, Triggers};
use crate::metrics::Metrics;

pub const GATEWAY: &str = "switchback";

/// `secs` seconds after a fixed instant.
pub fn time(secs: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + secs).unwrap())
}

/// An LLMRoute `ns/name` at `generation` whose targets use these credentials.
pub fn route(ns: &str, name: &str, generation: i64, credentials: &[&str]) -> LLMRoute {
    let mut r = LLMRoute::new(
        name,
        LLMRouteSpec {
            targets: credentials
                .iter()
                .map(|c| TargetSpec {
                    credential_ref: CredentialRef {
                        name: c.to_string(),
                    },
                    ..TargetSpec::default()
                })
                .collect(),
            ..LLMRouteSpec::default()
        },
    );
    r.metadata.namespace = Some(ns.into());
    r.metadata.generation = Some(generation);
    r.metadata.resource_version = Some("100".into());
    r.metadata.uid = Some(format!("uid-{ns}-{name}"));
    r
}

/// An OpenAI ProviderCredential reading `key` of Secret `secret`.
pub fn credential(ns: &str, name: &str, secret: &str, key: &str) -> ProviderCredential {
    let mut c = ProviderCredential::new(
        name,
        ProviderCredentialSpec {
            provider: "openai".into(),
            secret_ref: CredentialSecretRef {
                name: secret.into(),
                key: key.into(),
                keys: None,
            },
            ..ProviderCredentialSpec::default()
        },
    );
    c.metadata.namespace = Some(ns.into());
    c.metadata.generation = Some(1);
    c.metadata.resource_version = Some("7".into());
    c.metadata.uid = Some(format!("uid-{ns}-{name}"));
    c
}

/// An LLMClient sending the key in `key` of Secret `secret`, with a daily token budget.
pub fn client(ns: &str, name: &str, secret: &str, key: &str, tokens_per_day: i64) -> LLMClient {
    let mut c = LLMClient::new(
        name,
        switchback_crds::client::LLMClientSpec {
            key_secret_ref: SecretKeySelector {
                name: secret.into(),
                key: key.into(),
            },
            budget: Some(switchback_crds::client::BudgetSpec {
                tokens_per_day: Some(tokens_per_day),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    c.metadata.namespace = Some(ns.into());
    c.metadata.generation = Some(1);
    c.metadata.resource_version = Some("9".into());
    c.metadata.uid = Some(format!("uid-{ns}-{name}"));
    c
}

/// A Secret as the API server returns it (`data`).
pub fn secret(ns: &str, name: &str, data: &[(&str, &str)]) -> KubeSecret {
    KubeSecret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            resource_version: Some("1".into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        k8s_openapi::ByteString(v.as_bytes().to_vec()),
                    )
                })
                .collect(),
        ),
        ..KubeSecret::default()
    }
}

/// Writers behind the test context's stores.
pub struct Caches {
    pub routes: Writer<LLMRoute>,
    pub credentials: Writer<ProviderCredential>,
    pub clients: Writer<switchback_crds::LLMClient>,
    pub secrets: Writer<kube::api::PartialObjectMeta<KubeSecret>>,
    pub rendered_maps: Writer<k8s_openapi::api::core::v1::ConfigMap>,
    pub rendered_secrets: Writer<KubeSecret>,
}

impl Caches {
    pub fn add_route(&mut self, r: LLMRoute) {
        self.routes.apply_watcher_event(&watcher::Event::Apply(r));
    }
    pub fn add_client(&mut self, c: switchback_crds::LLMClient) {
        self.clients.apply_watcher_event(&watcher::Event::Apply(c));
    }
    pub fn add_credential(&mut self, c: ProviderCredential) {
        self.credentials
            .apply_watcher_event(&watcher::Event::Apply(c));
    }
    /// Adds the Secret's metadata (what the metadata watcher sees).
    pub fn add_secret(&mut self, s: &KubeSecret) {
        let meta = kube::api::PartialObjectMeta::<KubeSecret> {
            types: None,
            metadata: s.metadata.clone(),
            _phantom: Default::default(),
        };
        self.secrets
            .apply_watcher_event(&watcher::Event::Apply(meta));
    }
    pub fn add_rendered_map(&mut self, cm: k8s_openapi::api::core::v1::ConfigMap) {
        self.rendered_maps
            .apply_watcher_event(&watcher::Event::Apply(cm));
    }
    pub fn add_rendered_secret(&mut self, s: KubeSecret) {
        self.rendered_secrets
            .apply_watcher_event(&watcher::Event::Apply(s));
    }
    pub fn remove_rendered_map(&mut self, cm: k8s_openapi::api::core::v1::ConfigMap) {
        self.rendered_maps
            .apply_watcher_event(&watcher::Event::Delete(cm));
    }
    pub fn remove_rendered_secret(&mut self, s: KubeSecret) {
        self.rendered_secrets
            .apply_watcher_event(&watcher::Event::Delete(s));
    }
}

/// What a test gets: the context, the scripted API server, the caches and the
/// trigger receivers.
pub struct TestContext {
    pub ctx: Arc<Context>,
    pub api: ApiServerVerifier,
    pub caches: Caches,
    pub route_triggers: mpsc::UnboundedReceiver<kube::runtime::reflector::ObjectRef<LLMRoute>>,
    pub credential_triggers:
        mpsc::UnboundedReceiver<kube::runtime::reflector::ObjectRef<ProviderCredential>>,
    pub client_triggers: mpsc::UnboundedReceiver<kube::runtime::reflector::ObjectRef<LLMClient>>,
}

impl Context {
    /// A context on kube's mock service, with empty caches.
    pub fn test() -> TestContext {
        Self::test_with(|_| {})
    }

    /// As [`Context::test`], with `adjust` applied to the settings.
    pub fn test_with(adjust: impl FnOnce(&mut Settings)) -> TestContext {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let (routes, routes_w) = reflector::store();
        let (credentials, credentials_w) = reflector::store();
        let (clients, clients_w) = reflector::store();
        let (secrets, secrets_w) = reflector::store();
        let (rendered_maps, maps_w) = reflector::store();
        let (rendered_secrets, rsecrets_w) = reflector::store();
        let (route_tx, route_triggers) = mpsc::unbounded_channel();
        let (credential_tx, credential_triggers) = mpsc::unbounded_channel();
        let (client_tx, client_triggers) = mpsc::unbounded_channel();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "switchback-operator".into(),
                instance: Some("test".into()),
            },
        );
        let mut settings = Settings {
            gateway_namespace: GATEWAY.into(),
            scope: crate::scope::Scope::All,
            status_interval: std::time::Duration::from_secs(10),
            status_writes_per_second: 100.0,
            models_per_client: false,
            client_key_hasher: None,
            private_networks: Default::default(),
            part_limits: Default::default(),
            proxy_reader_role: None,
        };
        adjust(&mut settings);
        let ctx = Context::new(
            client,
            settings,
            Stores {
                routes,
                credentials,
                clients,
                secrets,
                rendered_maps,
                rendered_secrets,
                synced: Default::default(),
            },
            Metrics::default(),
            recorder,
            Triggers {
                routes: route_tx,
                credentials: credential_tx,
                clients: client_tx,
                delivery: Default::default(),
            },
        );
        TestContext {
            ctx: Arc::new(ctx),
            api: ApiServerVerifier::new(handle),
            caches: Caches {
                routes: routes_w,
                credentials: credentials_w,
                clients: clients_w,
                secrets: secrets_w,
                rendered_maps: maps_w,
                rendered_secrets: rsecrets_w,
            },
            route_triggers,
            credential_triggers,
            client_triggers,
        }
    }
}

/// One expected call.
pub struct Expect {
    pub method: Method,
    /// Path and query, exactly as kube sends them.
    pub uri: String,
    /// Asserts on the JSON body (if any) and returns the response body.
    pub respond: Box<dyn FnOnce(Option<Value>) -> (u16, Value) + Send>,
}

impl Expect {
    pub fn new(
        method: Method,
        uri: impl Into<String>,
        respond: impl FnOnce(Option<Value>) -> (u16, Value) + Send + 'static,
    ) -> Self {
        Self {
            method,
            uri: uri.into(),
            respond: Box::new(respond),
        }
    }
}

/// The scripted API server.
pub struct ApiServerVerifier(pub Arc<tokio::sync::Mutex<Handle<Request<Body>, Response<Body>>>>);

impl ApiServerVerifier {
    pub fn new(handle: Handle<Request<Body>, Response<Body>>) -> Self {
        Self(Arc::new(tokio::sync::Mutex::new(handle)))
    }

    /// Serves exactly `script`, in order, asserting each call; panics on a call that
    /// was not expected. Await the handle to check every expected call came.
    pub fn run(&self, script: Vec<Expect>) -> tokio::task::JoinHandle<()> {
        let handle = self.0.clone();
        tokio::spawn(async move {
            // One script at a time: the next waits until this one has been served.
            let mut handle = handle.lock_owned().await;
            for (i, expect) in script.into_iter().enumerate() {
                let (request, send) = handle.next_request().await.unwrap_or_else(|| {
                    panic!("call {i} ({} {}) never came", expect.method, expect.uri)
                });
                assert_eq!(
                    request.method(),
                    expect.method,
                    "call {i}: {}",
                    request.uri()
                );
                // A trailing `*` matches any rest (a digest in an object's name).
                match expect.uri.strip_suffix('*') {
                    Some(prefix) => assert!(
                        request.uri().to_string().starts_with(prefix),
                        "call {i}: {} is not {}",
                        request.uri(),
                        expect.uri
                    ),
                    None => assert_eq!(request.uri().to_string(), expect.uri, "call {i}"),
                }
                let content_type = request
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .map(|v| v.to_str().unwrap().to_string());
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body = (!bytes.is_empty()).then(|| {
                    serde_json::from_slice::<Value>(&bytes).unwrap_or_else(|e| {
                        panic!("call {i}: body is not JSON ({e}): {content_type:?}")
                    })
                });
                let (status, response) = (expect.respond)(body);
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(serde_json::to_vec(&response).unwrap()))
                        .unwrap(),
                );
            }
        })
    }
}

/// The body an API server answers a 404 with.
#[allow(dead_code)]
pub fn not_found(kind: &str, name: &str) -> Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{kind} \"{name}\" not found"), "reason": "NotFound", "code": 404
    })
}

/// Awaits the scripted server, failing after a second (a call that never came).
pub async fn finish(server: tokio::task::JoinHandle<()>) {
    tokio::time::timeout(std::time::Duration::from_secs(1), server)
        .await
        .expect("the expected API calls did not all come")
        .expect("the API server script panicked");
}

//! Cluster mode (`--namespace NS`): watch the ConfigMaps and Secrets labelled
//! `switchback.dev/config` in NS through the API (in-cluster config, or KUBECONFIG
//! outside), merge every source namespace into one config and apply it exactly as
//! standalone mode does (prepare, then swap).
//!
//! A rendered object that cannot be read (hand-edited, unknown format version) does
//! not take the others down: its source namespace keeps its last good config, the
//! rest is applied, and the problem is recorded as a refusal (`/admin/v1/config`,
//! `/admin/v1/stats`) until the operator rewrites the object. A merged config that
//! cannot be prepared, or that has no LLMRoute at all (SPEC §8, unless
//! `--allow-empty-config`), is refused whole and the last good one keeps serving.
//!
//! Needs only get/list/watch on ConfigMaps and Secrets of NS.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use switchback_crds::compile::Compiled;
use switchback_crds::config::{CompiledConfig, Keys};
use switchback_crds::delivery::{self, NamespaceConfig};
use tokio::sync::Notify;

use crate::gateway::{Gateway, Problem};

/// Quiet time after a change before applying: the operator writes a namespace's Secret
/// and ConfigMap back to back.
const DEBOUNCE: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("no Kubernetes API to talk to ({0}); run in a cluster or set KUBECONFIG")]
    Connect(#[from] kube::Error),
}

/// The client from the in-cluster config, or KUBECONFIG.
pub async fn connect() -> Result<Client, ClusterError> {
    Ok(Client::try_default().await?)
}

/// The last good config and keys of each source namespace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LastGood {
    pub configs: BTreeMap<String, CompiledConfig>,
    pub keys: BTreeMap<String, Keys>,
}

/// What to serve, and what was wrong with the objects read.
#[derive(Debug, Default)]
pub struct Merged {
    pub compiled: Compiled,
    /// Objects that could not be read (their namespace keeps its last good config),
    /// and routes dropped because another namespace already serves their model.
    pub problems: Vec<Problem>,
    /// Credentials without a key: their targets are skipped.
    pub warnings: Vec<Problem>,
}

fn problem(object: String, message: String) -> Problem {
    Problem {
        file: None,
        line: None,
        object: Some(object),
        field: None,
        message,
    }
}

/// Pure: the config to serve from the rendered objects, updating `last` with what
/// read well. Source namespaces whose ConfigMap is gone are dropped.
///
/// `models_per_client` (`--auth required`): a model name is unique within a source
/// namespace only, since each client resolves names among the routes it may call
/// (SPEC §9 Tenancy; `prepare` refuses a client that could reach two). Otherwise it is
/// unique across all of them.
pub fn merge(
    gateway_namespace: &str,
    maps: &[Arc<ConfigMap>],
    secrets: &[Arc<KubeSecret>],
    last: &mut LastGood,
    models_per_client: bool,
) -> Merged {
    let mut problems = Vec::new();
    let mut present = BTreeSet::new();
    for cm in maps {
        let name = cm.name_any();
        if let Ok(ns) = delivery::source_namespace(&name, delivery::ROUTES_PREFIX) {
            present.insert(ns.to_string());
        }
        match delivery::read_config_map(cm) {
            Ok((ns, config)) => {
                last.configs.insert(ns, config);
            }
            Err(e) => problems.push(problem(
                format!("{gateway_namespace}/{name}"),
                e.to_string(),
            )),
        }
    }
    last.configs.retain(|ns, _| present.contains(ns));
    let mut keyed = BTreeSet::new();
    for s in secrets {
        let name = s.name_any();
        if let Ok(ns) = delivery::source_namespace(&name, delivery::KEYS_PREFIX) {
            keyed.insert(ns.to_string());
        }
        match delivery::read_keys_secret(s) {
            Ok((ns, keys)) => {
                last.keys.insert(ns, keys);
            }
            // Never echo Secret content: the error names the key, not its value.
            Err(e) => problems.push(problem(
                format!("{gateway_namespace}/{name}"),
                e.to_string(),
            )),
        }
    }
    last.keys.retain(|ns, _| keyed.contains(ns));

    // One model, one route (per namespace, with models per client): the operator
    // guarantees it; a hand edit might not.
    let mut claimed: BTreeMap<String, String> = BTreeMap::new();
    let mut parts = Vec::new();
    for (ns, config) in &last.configs {
        if models_per_client {
            claimed.clear();
        }
        let mut config = config.clone();
        config.routes.retain(|r| {
            let taken = r
                .models
                .iter()
                .find_map(|m| claimed.get(m).map(|owner| (m, owner)));
            if let Some((model, owner)) = taken {
                problems.push(problem(
                    r.id.to_string(),
                    format!(
                        "model {model:?} is already served by {owner}; this route is not served"
                    ),
                ));
                return false;
            }
            for m in &r.models {
                claimed.insert(m.clone(), r.id.to_string());
            }
            true
        });
        parts.push(NamespaceConfig {
            config,
            keys: last.keys.get(ns).cloned().unwrap_or_default(),
        });
    }
    let compiled = delivery::merge(parts.iter());
    let warnings = compiled
        .config
        .credentials
        .iter()
        .filter(|c| compiled.keys.get(&c.id).is_none())
        .map(|c| {
            problem(
                c.id.to_string(),
                format!(
                    "no key in Secret {gateway_namespace}/{}; targets using this credential are skipped",
                    delivery::keys_name(&c.id.namespace)
                ),
            )
        })
        .collect();
    Merged {
        compiled,
        problems,
        warnings,
    }
}

/// Watches the rendered objects and applies them. Dropping it stops watching.
pub struct ClusterWatch {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ClusterWatch {
    /// The watch tasks, for `Running` to own (aborted when it drops).
    pub fn into_tasks(mut self) -> Vec<tokio::task::JoinHandle<()>> {
        std::mem::take(&mut self.tasks)
    }
}

impl Drop for ClusterWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts watching `namespace`; the gateway becomes ready once both lists are read
/// and applied. A namespace with no route rendered gives a config with no LLMRoute:
/// served while no route has been ([`Gateway::empty_until_routed`], set in cluster
/// mode: a fresh install is ready), refused once routes were served unless
/// [`Gateway::allow_empty_config`].
pub fn watch(gw: Arc<Gateway>, client: Client, namespace: &str) -> ClusterWatch {
    let config = watcher::Config::default().labels(delivery::LABEL);
    let changed = Arc::new(Notify::new());
    let (maps, writer) = reflector::store::<ConfigMap>();
    let map_events = reflector::reflector(
        writer,
        watcher(Api::namespaced(client.clone(), namespace), config.clone()),
    )
    .default_backoff();
    let (secrets, writer) = reflector::store::<KubeSecret>();
    let secret_events =
        reflector::reflector(writer, watcher(Api::namespaced(client, namespace), config))
            .default_backoff();
    let tasks = vec![
        tokio::spawn(map_events.for_each(drain(changed.clone(), "ConfigMaps"))),
        tokio::spawn(secret_events.for_each(drain(changed.clone(), "Secrets"))),
        tokio::spawn(apply_loop(
            gw,
            namespace.to_string(),
            maps,
            secrets,
            changed,
        )),
    ];
    ClusterWatch { tasks }
}

/// Consumes a watch stream, signalling every event (errors are logged; the stream
/// retries with backoff).
fn drain<T>(
    changed: Arc<Notify>,
    what: &'static str,
) -> impl FnMut(Result<T, watcher::Error>) -> std::future::Ready<()> {
    move |event| {
        match event {
            Ok(_) => changed.notify_one(),
            Err(e) => tracing::warn!(error = %e, "watching rendered {what}"),
        }
        std::future::ready(())
    }
}

async fn apply_loop(
    gw: Arc<Gateway>,
    namespace: String,
    maps: Store<ConfigMap>,
    secrets: Store<KubeSecret>,
    changed: Arc<Notify>,
) {
    let _ = futures_util::join!(maps.wait_until_ready(), secrets.wait_until_ready());
    let mut last = LastGood::default();
    let mut applied: Option<Compiled> = None;
    loop {
        let merged = merge(
            &namespace,
            &maps.state(),
            &secrets.state(),
            &mut last,
            gw.auth.mode == crate::config::keys::AuthMode::Required,
        );
        let same = applied
            .as_ref()
            .is_some_and(|a| a.config == merged.compiled.config && a.keys == merged.compiled.keys);
        if !same {
            for w in &merged.warnings {
                tracing::warn!(problem = %w, "config warning");
            }
            match gw.apply(&merged.compiled, merged.warnings.clone()) {
                Ok(()) => {
                    tracing::info!(
                        namespace = %namespace,
                        routes = merged.compiled.config.routes.len(),
                        generation = gw.report().generation,
                        "config applied"
                    );
                    applied = Some(merged.compiled);
                }
                Err(e) => {
                    tracing::error!(error = %e, "config refused; still serving the last good config");
                    gw.refuse(vec![Problem {
                        file: None,
                        line: None,
                        object: None,
                        field: None,
                        message: e.to_string(),
                    }]);
                }
            }
        }
        if !merged.problems.is_empty() {
            for p in &merged.problems {
                tracing::error!(problem = %p, "rendered object refused; its namespace keeps its last good config");
            }
            gw.refuse(merged.problems);
        }
        changed.notified().await;
        tokio::time::sleep(DEBOUNCE).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use http::{Request, Response};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::client::Body;
    use serde_json::json;
    use switchback_crds::config::{
        CircuitBreaker, Credential, Fallback, ObjectId, Provider, Route, SecretKeyRef, Strategy,
        Target,
    };
    use switchback_crds::secret::Secret;

    use super::*;

    const GW: &str = "switchback";

    fn config(ns: &str, route: &str, model: &str) -> CompiledConfig {
        let credential = ObjectId::new(ns, "openai");
        CompiledConfig {
            routes: vec![Route {
                response_model: Default::default(),
                id: ObjectId::new(ns, route),
                generation: 2,
                models: vec![model.into()],
                strategy: Strategy::Fallback,
                targets: vec![Target {
                    health_check: None,
                    model_map: Default::default(),
                    credential: credential.clone(),
                    model: None,
                    weight: 1,
                    timeout_ms: None,
                    retry: Default::default(),
                    price: None,
                }],
                fallback: Fallback::default(),
                circuit_breaker: CircuitBreaker::default(),
                timeout_ms: 60_000,
                shared_with: Vec::new(),
                stream: None,
                hedge: None,
            }],
            credentials: vec![Credential {
                key_rejected_for_ms: 300_000,
                api_version: None,
                responses_api: false,
                prefill: false,
                project: None,
                location: None,
                region: None,
                id: credential,
                provider: Provider::Openai,
                base_url: "https://api.openai.com/v1".into(),
                headers: BTreeMap::new(),
                max_concurrency: None,
                max_queue: None,
                allow_private_network: false,
                secret_ref: SecretKeyRef {
                    keys: Vec::new(),
                    name: "keys".into(),
                    key: "openai".into(),
                },
            }],
            ..CompiledConfig::default()
        }
    }

    fn keys(ns: &str, key: &str) -> Keys {
        Keys(BTreeMap::from([(
            ObjectId::new(ns, "openai"),
            Secret::new(key.to_string()),
        )]))
    }

    fn map(ns: &str, c: &CompiledConfig) -> Arc<ConfigMap> {
        Arc::new(delivery::config_map(GW, ns, c).unwrap())
    }

    fn secret(ns: &str, k: &Keys) -> Arc<KubeSecret> {
        Arc::new(delivery::keys_secret(GW, ns, k).unwrap())
    }

    #[test]
    fn namespaces_are_merged_with_their_keys() {
        let mut last = LastGood::default();
        let m = merge(
            GW,
            &[
                map("team-a", &config("team-a", "smart", "smart")),
                map("team-b", &config("team-b", "fast", "fast")),
            ],
            &[secret("team-a", &keys("team-a", "sk-a"))],
            &mut last,
            false,
        );
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert_eq!(m.compiled.config.routes.len(), 2);
        assert_eq!(m.compiled.keys.0.len(), 1);
        // team-b's credential has no key: a warning, not a refusal.
        assert_eq!(m.warnings.len(), 1);
        assert_eq!(m.warnings[0].object.as_deref(), Some("team-b/openai"));
    }

    #[test]
    fn a_broken_object_keeps_its_namespace_last_good_config() {
        let mut last = LastGood::default();
        let good = map("team-a", &config("team-a", "smart", "smart"));
        merge(GW, std::slice::from_ref(&good), &[], &mut last, false);
        let mut broken = (*good).clone();
        broken
            .data
            .as_mut()
            .unwrap()
            .insert(delivery::CONFIG_KEY.into(), "{ hand edited".into());
        let m = merge(
            GW,
            &[
                Arc::new(broken),
                map("team-b", &config("team-b", "fast", "fast")),
            ],
            &[],
            &mut last,
            false,
        );
        assert_eq!(m.problems.len(), 1);
        assert_eq!(
            m.problems[0].object.as_deref(),
            Some("switchback/switchback-routes-team-a")
        );
        let ids = served(&m);
        assert_eq!(ids, ["team-a/smart", "team-b/fast"]);
        // The ConfigMap is deleted: the namespace goes.
        let m = merge(
            GW,
            &[map("team-b", &config("team-b", "fast", "fast"))],
            &[],
            &mut last,
            false,
        );
        assert_eq!(m.compiled.config.routes.len(), 1);
        assert!(m.problems.is_empty());
    }

    /// The routes a merge serves, as `namespace/name`.
    fn served(m: &Merged) -> Vec<String> {
        m.compiled
            .config
            .routes
            .iter()
            .map(|r| r.id.to_string())
            .collect()
    }

    #[test]
    fn a_model_claimed_twice_is_served_once() {
        let mut last = LastGood::default();
        let m = merge(
            GW,
            &[
                map("team-a", &config("team-a", "x", "same")),
                map("team-b", &config("team-b", "y", "same")),
            ],
            &[],
            &mut last,
            false,
        );
        assert_eq!(m.compiled.config.routes.len(), 1);
        assert_eq!(m.problems.len(), 1);
        assert!(m.problems[0].message.contains("already served by team-a/x"));
    }

    #[test]
    fn with_models_per_client_each_namespace_may_serve_a_name_once() {
        let mut last = LastGood::default();
        let mut a = config("team-a", "x", "same");
        let twice = a.routes[0].clone();
        a.routes.push(Route {
            id: ObjectId::new("team-a", "x2"),
            ..twice
        });
        let m = merge(
            GW,
            &[
                map("team-a", &a),
                map("team-b", &config("team-b", "y", "same")),
            ],
            &[],
            &mut last,
            true,
        );
        // team-b's `same` is for team-b's clients; team-a's second one is refused.
        let served = served(&m);
        assert_eq!(served, ["team-a/x", "team-b/y"]);
        assert_eq!(m.problems.len(), 1);
        assert!(m.problems[0].message.contains("already served by team-a/x"));
    }

    /// A fake API server on kube's mock service: lists `maps` and `secrets` (of the
    /// gateway namespace, selected by label) and keeps every watch open; when
    /// `delete_maps` fires, the first ConfigMap watch reports each listed map deleted.
    fn fake_api(
        maps: Vec<Arc<ConfigMap>>,
        secrets: Vec<Arc<KubeSecret>>,
        delete_maps: Option<tokio::sync::oneshot::Receiver<()>>,
    ) -> (Client, tokio::task::JoinHandle<()>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let server = tokio::spawn(async move {
            let mut open_watches = Vec::new();
            let mut map_watch = None;
            let mut delete_maps = delete_maps;
            loop {
                let next = tokio::select! {
                    next = handle.next_request() => next,
                    Ok(()) = async { delete_maps.as_mut().unwrap().await }, if delete_maps.is_some() && map_watch.is_some() => {
                        delete_maps = None;
                        let send: tower_test::mock::SendResponse<Response<Body>> =
                            map_watch.take().unwrap();
                        let mut events = Vec::new();
                        for cm in &maps {
                            let mut object = serde_json::to_value(&**cm).unwrap();
                            object["metadata"]["resourceVersion"] = json!("11");
                            let line = json!({"type": "DELETED", "object": object});
                            events.extend(serde_json::to_vec(&line).unwrap());
                            events.push(b'\n');
                        }
                        send.send_response(Response::builder().body(Body::from(events)).unwrap());
                        continue;
                    }
                };
                let Some((request, send)) = next else {
                    return;
                };
                let uri = request.uri().to_string();
                assert!(
                    uri.contains("labelSelector=switchback.dev%2Fconfig"),
                    "selects by label: {uri}"
                );
                let of_maps = uri.starts_with(&format!("/api/v1/namespaces/{GW}/configmaps"));
                if uri.contains("watch=true") {
                    if of_maps && map_watch.is_none() && delete_maps.is_some() {
                        map_watch = Some(send);
                    } else {
                        open_watches.push(send); // never answered: the watch stays open
                    }
                    continue;
                }
                let (kind, items) = if of_maps {
                    (
                        "ConfigMapList",
                        maps.iter()
                            .map(|m| serde_json::to_value(&**m).unwrap())
                            .collect::<Vec<_>>(),
                    )
                } else if uri.starts_with(&format!("/api/v1/namespaces/{GW}/secrets")) {
                    (
                        "SecretList",
                        secrets
                            .iter()
                            .map(|m| serde_json::to_value(&**m).unwrap())
                            .collect(),
                    )
                } else {
                    panic!("unexpected call {uri}");
                };
                let list = json!({
                    "apiVersion": "v1", "kind": kind,
                    "metadata": {"resourceVersion": "10"},
                    "items": items,
                });
                send.send_response(
                    Response::builder()
                        .body(Body::from(serde_json::to_vec(&list).unwrap()))
                        .unwrap(),
                );
            }
        });
        (client, server)
    }

    /// Waits (at most 2 s) until `done` holds.
    async fn until(what: &str, done: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(2), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}, within 2 s"));
    }

    fn refusal(gw: &Gateway) -> Option<String> {
        let error = gw.report().last_error?;
        Some(error.problems.iter().map(|p| p.to_string()).collect())
    }

    /// The watch wiring against kube's mock service: both lists are answered, the
    /// watches stay open, and the gateway serves what was listed.
    #[tokio::test]
    async fn lists_are_applied_and_the_gateway_becomes_ready() {
        let cm = map("team-a", &config("team-a", "smart", "smart"));
        let s = secret("team-a", &keys("team-a", "sk-a"));
        let (client, server) = fake_api(vec![cm], vec![s], None);
        let gw = Arc::new(Gateway::new(1024, "cluster:switchback".into(), 1).unwrap());
        let _watch = watch(gw.clone(), client, GW);
        until("the gateway becomes ready", || gw.is_ready()).await;
        let snapshot = gw.snapshot();
        assert_eq!(snapshot.config.routes.len(), 1);
        assert!(
            gw.report().warnings.is_empty(),
            "{:?}",
            gw.report().warnings
        );
        drop(_watch);
        server.abort();
    }

    /// SPEC §8 and §11: a delivered config with no LLMRoute is refused where a route
    /// is needed (`empty_until_routed` off: not ready, saying why); a fresh cluster
    /// install (`empty_until_routed`, as `start` sets in cluster mode) serves it and is
    /// ready, answering 404 until routes arrive; `--allow-empty-config` serves it too.
    #[tokio::test]
    async fn a_first_delivery_with_no_route_is_served_in_a_fresh_cluster_install() {
        let (client, server) = fake_api(Vec::new(), Vec::new(), None);
        let gw = Arc::new(Gateway::new(1024, "cluster:switchback".into(), 1).unwrap());
        let _watch = watch(gw.clone(), client, GW);
        until("the empty delivery is refused", || refusal(&gw).is_some()).await;
        let why = refusal(&gw).unwrap();
        assert!(why.contains("no LLMRoute"), "{why}");
        assert!(why.contains("--allow-empty-config"), "{why}");
        assert!(!gw.is_ready());
        assert_eq!(gw.report().generation, 0);
        drop(_watch);
        server.abort();

        for (empty_until_routed, allow_empty_config) in [(true, false), (false, true)] {
            let (client, server) = fake_api(Vec::new(), Vec::new(), None);
            let mut served = Gateway::new(1024, "cluster:switchback".into(), 1).unwrap();
            served.empty_until_routed = empty_until_routed;
            served.allow_empty_config = allow_empty_config;
            let served = Arc::new(served);
            let _watch = watch(served.clone(), client, GW);
            until("the empty delivery is served", || served.is_ready()).await;
            assert!(served.snapshot().config.routes.is_empty());
            assert!(served.report().last_error.is_none());
            assert_eq!(served.report().generation, 1);
            drop(_watch);
            server.abort();
        }
    }

    /// Every rendered route going away (the operator's objects deleted) is a delivery
    /// with no LLMRoute: refused, and the last good config keeps serving, ready.
    #[tokio::test]
    async fn a_delivery_that_drops_every_route_keeps_the_last_good_config() {
        let cm = map("team-a", &config("team-a", "smart", "smart"));
        let s = secret("team-a", &keys("team-a", "sk-a"));
        let (delete, deleted) = tokio::sync::oneshot::channel();
        let (client, server) = fake_api(vec![cm], vec![s], Some(deleted));
        let mut gw = Gateway::new(1024, "cluster:switchback".into(), 1).unwrap();
        // As in cluster mode: an empty first config would be served, an emptying edit not.
        gw.empty_until_routed = true;
        let gw = Arc::new(gw);
        let _watch = watch(gw.clone(), client, GW);
        until("the gateway becomes ready", || gw.is_ready()).await;
        delete.send(()).unwrap();
        until("the delivery without routes is refused", || {
            refusal(&gw).is_some()
        })
        .await;
        let why = refusal(&gw).unwrap();
        assert!(why.contains("no LLMRoute"), "{why}");
        assert!(gw.is_ready(), "still ready on the last good config");
        assert_eq!(gw.snapshot().config.routes.len(), 1);
        assert_eq!(gw.report().generation, 1);
        drop(_watch);
        server.abort();
    }

    #[test]
    fn object_names_parse() {
        let meta = ObjectMeta {
            name: Some("switchback-routes-".into()),
            ..ObjectMeta::default()
        };
        let cm = ConfigMap {
            metadata: meta,
            ..ConfigMap::default()
        };
        let mut last = LastGood::default();
        let m = merge(GW, &[Arc::new(cm)], &[], &mut last, false);
        assert_eq!(m.problems.len(), 1);
    }
}

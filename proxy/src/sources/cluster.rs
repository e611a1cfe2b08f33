//! Cluster mode (`--namespace NS`): watch the index ConfigMap `switchback-index` of NS
//! through the API (in-cluster config, or KUBECONFIG outside), fetch by name the parts
//! and keys Secrets it names, assemble each source namespace, merge them into one
//! config and apply it exactly as standalone mode does (prepare, then swap).
//!
//! The index is the operator's commit point (`switchback_crds::delivery::index`): a
//! namespace is swapped only once every object its entry names has arrived and reads
//! back as the content its name stands for, so a proxy never serves part of a
//! namespace, nor a mix of two of its generations. Parts never change once written,
//! so each is fetched once; what the index no longer names is forgotten.
//!
//! A namespace that cannot be assembled (an object missing or unreadable, hand-edited,
//! an unknown format version) does not take the others down: it keeps its last good
//! config, the rest is applied, and the problem is recorded as a refusal
//! (`/admin/v1/config`, `/admin/v1/stats`) and fetched again after a backoff. A merged
//! config that cannot be prepared, or that has no LLMRoute at all
//! (docs/proxy.md#loading-and-reloading-config, unless `--allow-empty-config`), is refused
//! whole and the last good one keeps serving.
//!
//! Needs only get, list and watch on the index ConfigMap by name (the watch selects it
//! with `metadata.name`, which RBAC authorizes as a request on that name) and get on
//! the objects it names: the chart's Role and the reader Role the operator keeps.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use switchback_crds::compile::Compiled;
use switchback_crds::delivery::index::{self, Entry, Index};
use switchback_crds::delivery::{self, DeliveryError, NamespaceConfig};
use tokio::sync::Notify;

use crate::gateway::{Gateway, Problem};

/// Quiet time after a change of the index before applying it.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Objects fetched at once.
const FETCHERS: usize = 8;
/// The first wait before fetching again what could not be read; it doubles up to
/// [`MAX_RETRY`]. A new index retries at once.
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("no Kubernetes API to talk to ({0}); run in a cluster or set KUBECONFIG")]
    Connect(#[from] kube::Error),
}

/// The client from the in-cluster config, or KUBECONFIG.
pub async fn connect() -> Result<Client, ClusterError> {
    Ok(Client::try_default().await?)
}

/// The last good version of each source namespace, with the index entry it was read
/// from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LastGood {
    pub namespaces: BTreeMap<String, (Entry, NamespaceConfig)>,
}

/// The objects fetched by name, and why others could not be.
#[derive(Debug, Default)]
pub struct Fetched {
    pub maps: HashMap<String, ConfigMap>,
    pub secrets: HashMap<String, KubeSecret>,
    /// Objects that could not be read, with why (never their content).
    pub errors: BTreeMap<String, String>,
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

/// The index in `index` (none yet: nothing delivered, an empty one).
pub fn read_index(index: Option<&ConfigMap>) -> Result<Index, DeliveryError> {
    index.map_or_else(|| Ok(Index::default()), index::read_index)
}

/// Pure: the config to serve from the index and the objects fetched, updating `last`
/// with each namespace that assembled whole. An index that does not read keeps every
/// namespace's last good config; source namespaces it no longer names are dropped.
///
/// `models_per_client` (`--auth required`): a model name is unique within a source
/// namespace only, since each client resolves names among the routes it may call
/// (docs/tenancy.md#tenancy; `prepare` refuses a client that could reach two). Otherwise it is
/// unique across all of them.
pub fn merge(
    gateway_namespace: &str,
    index: &Result<Index, DeliveryError>,
    fetched: &Fetched,
    last: &mut LastGood,
    models_per_client: bool,
) -> Merged {
    let mut problems = Vec::new();
    match index {
        Ok(index) => assemble_all(gateway_namespace, index, fetched, last, &mut problems),
        Err(e) => problems.push(problem(
            format!("{gateway_namespace}/{}", index::INDEX_NAME),
            e.to_string(),
        )),
    }
    let parts = claim_models(last, models_per_client, &mut problems);
    let compiled = delivery::merge(parts.iter().map(|(ns, p)| (ns.as_str(), p)));
    let warnings = compiled
        .config
        .credentials
        .iter()
        .filter(|c| compiled.keys.get(&c.id).is_none())
        .map(|c| {
            let keys = last
                .namespaces
                .get(&c.id.namespace)
                .map_or_else(String::new, |(e, _)| e.keys.clone());
            problem(
                c.id.to_string(),
                format!(
                    "no key in Secret {gateway_namespace}/{keys}; targets using this credential \
                     are skipped"
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

/// Assembles each namespace whose entry changed; keeps the last good one of those that
/// do not assemble, and drops the namespaces the index no longer names.
fn assemble_all(
    gateway_namespace: &str,
    index: &Index,
    fetched: &Fetched,
    last: &mut LastGood,
    problems: &mut Vec<Problem>,
) {
    last.namespaces
        .retain(|ns, _| index.namespaces.contains_key(ns));
    for (ns, entry) in &index.namespaces {
        if last.namespaces.get(ns).is_some_and(|(e, _)| e == entry) {
            continue;
        }
        let read = delivery::assemble(
            ns,
            entry,
            |n| fetched.maps.get(n),
            |n| fetched.secrets.get(n),
        );
        match read {
            Ok(config) => {
                last.namespaces.insert(ns.clone(), (entry.clone(), config));
            }
            Err(DeliveryError::Missing { object, .. }) if fetched.errors.contains_key(&object) => {
                problems.push(problem(
                    format!("{gateway_namespace}/{object}"),
                    format!(
                        "cannot be read ({}); namespace {ns} keeps its last good config",
                        fetched.errors[&object]
                    ),
                ));
            }
            // Never echo Secret content: the errors name keys and objects, not values.
            Err(e) => problems.push(problem(
                format!("{gateway_namespace}/{}", e_object(&e, entry)),
                format!("{e}; namespace {ns} keeps its last good config"),
            )),
        }
    }
}

/// The object an assembly error is about (the first part, when it does not say).
fn e_object<'a>(e: &'a DeliveryError, entry: &'a Entry) -> &'a str {
    match e {
        DeliveryError::Missing { object, .. }
        | DeliveryError::Content { object }
        | DeliveryError::MissingConfig { object }
        | DeliveryError::Json { object, .. }
        | DeliveryError::Version { object, .. }
        | DeliveryError::ForeignObject { object, .. }
        | DeliveryError::KeyEncoding { object, .. }
        | DeliveryError::RevisionKey { object }
        | DeliveryError::Name { object, .. } => object,
        _ => entry.parts.first().map_or("", String::as_str),
    }
}

/// One model, one route (per namespace, with models per client): the operator
/// guarantees it; a hand edit might not. The namespaces' configs with the routes that
/// lost a claim left out.
fn claim_models(
    last: &LastGood,
    models_per_client: bool,
    problems: &mut Vec<Problem>,
) -> Vec<(String, NamespaceConfig)> {
    let mut claimed: BTreeMap<String, String> = BTreeMap::new();
    let mut parts = Vec::new();
    for (ns, (_, part)) in &last.namespaces {
        if models_per_client {
            claimed.clear();
        }
        let mut part = part.clone();
        part.config.routes.retain(|r| {
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
        parts.push((ns.clone(), part));
    }
    parts
}

/// The objects `index` names that `last` does not already hold the content of and
/// `fetched` does not have: what to GET.
pub fn wanted(index: &Index, last: &LastGood, fetched: &Fetched) -> (Vec<String>, Vec<String>) {
    let mut maps = Vec::new();
    let mut secrets = Vec::new();
    for (ns, entry) in &index.namespaces {
        if last.namespaces.get(ns).is_some_and(|(e, _)| e == entry) {
            continue;
        }
        maps.extend(
            entry
                .parts
                .iter()
                .filter(|n| !fetched.maps.contains_key(*n))
                .cloned(),
        );
        if !fetched.secrets.contains_key(&entry.keys) {
            secrets.push(entry.keys.clone());
        }
    }
    (maps, secrets)
}

impl Fetched {
    /// Forgets what `index` does not name (their namespaces moved on or went).
    fn prune(&mut self, index: &Index) {
        let (maps, secrets) = index.names();
        let maps: BTreeSet<&str> = maps.into_iter().collect();
        let secrets: BTreeSet<&str> = secrets.into_iter().collect();
        self.maps.retain(|n, _| maps.contains(n.as_str()));
        self.secrets.retain(|n, _| secrets.contains(n.as_str()));
        self.errors.clear();
    }

    /// Forgets the objects of every namespace of `index` that did not assemble (an
    /// object edited in place is fetched again once the operator has put it back).
    fn forget_unassembled(&mut self, index: &Index, last: &LastGood) {
        for (ns, entry) in &index.namespaces {
            if last.namespaces.get(ns).is_some_and(|(e, _)| e == entry) {
                continue;
            }
            for name in entry.names() {
                self.maps.remove(name);
                self.secrets.remove(name);
            }
        }
    }

    /// GETs `maps` and `secrets` by name, a few at once.
    async fn fetch(
        &mut self,
        client: &Client,
        namespace: &str,
        maps: Vec<String>,
        secrets: Vec<String>,
    ) {
        for (name, got) in get_all::<ConfigMap>(client, namespace, maps).await {
            match got {
                Ok(cm) => {
                    self.maps.insert(name, cm);
                }
                Err(e) => {
                    self.errors.insert(name, e);
                }
            }
        }
        for (name, got) in get_all::<KubeSecret>(client, namespace, secrets).await {
            match got {
                Ok(s) => {
                    self.secrets.insert(name, s);
                }
                Err(e) => {
                    self.errors.insert(name, e);
                }
            }
        }
    }
}

/// Each of `names` of kind `K` in `namespace`, or why it could not be read ("not
/// found", or kube's error, which names the request, never a Secret's data).
async fn get_all<K>(
    client: &Client,
    namespace: &str,
    names: Vec<String>,
) -> Vec<(String, Result<K, String>)>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let gets = names.into_iter().map(|name| {
        let api = api.clone();
        async move {
            let got = match api.get_opt(&name).await {
                Ok(Some(object)) => Ok(object),
                Ok(None) => Err("not found".to_string()),
                Err(e) => Err(e.to_string()),
            };
            (name, got)
        }
    });
    futures_util::stream::iter(gets)
        .buffer_unordered(FETCHERS)
        .collect()
        .await
}

/// Watches the index and applies what it names. Dropping it stops watching.
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

/// Starts watching `namespace`'s index; the gateway becomes ready once it is read and
/// what it names applied. No index, or one naming no route, gives a config with no
/// LLMRoute: served while no route has been (`Gateway::empty_until_routed`, set in
/// cluster mode: a fresh install is ready), refused once routes were served unless
/// `Gateway::allow_empty_config`.
pub fn watch(gw: Arc<Gateway>, client: Client, namespace: &str) -> ClusterWatch {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", index::INDEX_NAME));
    let changed = Arc::new(Notify::new());
    let (index, writer) = reflector::store::<ConfigMap>();
    let index_events = reflector::reflector(
        writer,
        watcher(Api::namespaced(client.clone(), namespace), config),
    )
    .default_backoff();
    let mut tasks = super::fleet_view::watch(gw.clone(), client.clone(), namespace);
    tasks.extend([
        tokio::spawn(index_events.for_each(drain(changed.clone()))),
        tokio::spawn(apply_loop(
            gw,
            client,
            namespace.to_string(),
            index,
            changed,
        )),
    ]);
    ClusterWatch { tasks }
}

/// Consumes the index's watch stream, signalling every event (errors are logged; the
/// stream retries with backoff).
fn drain<T>(
    changed: Arc<Notify>,
) -> impl FnMut(Result<T, watcher::Error>) -> std::future::Ready<()> {
    move |event| {
        match event {
            Ok(_) => changed.notify_one(),
            Err(e) => {
                tracing::warn!(error = %e, "watching the index ConfigMap {}", index::INDEX_NAME)
            }
        }
        std::future::ready(())
    }
}

async fn apply_loop(
    gw: Arc<Gateway>,
    client: Client,
    namespace: String,
    index: Store<ConfigMap>,
    changed: Arc<Notify>,
) {
    let _ = index.wait_until_ready().await;
    let mut last = LastGood::default();
    let mut fetched = Fetched::default();
    let mut applied: Option<Compiled> = None;
    let mut retry = FIRST_RETRY;
    loop {
        let current = read_index(index.state().first().map(|cm| &**cm));
        if let Ok(current) = &current {
            fetched.prune(current);
            let (maps, secrets) = wanted(current, &last, &fetched);
            fetched.fetch(&client, &namespace, maps, secrets).await;
        }
        let merged = merge(
            &namespace,
            &current,
            &fetched,
            &mut last,
            gw.auth.mode == crate::config::keys::AuthMode::Required,
        );
        apply(&gw, &namespace, &merged, &mut applied);
        if merged.problems.is_empty() {
            retry = FIRST_RETRY;
            changed.notified().await;
        } else {
            for p in &merged.problems {
                tracing::error!(problem = %p, "rendered object refused; its namespace keeps its last good config");
            }
            gw.refuse(merged.problems);
            if let Ok(current) = &current {
                fetched.forget_unassembled(current, &last);
            }
            // What could not be read may be there in a moment (the operator's reader
            // Role, a part deleted under an older index): look again, or on news.
            tokio::select! {
                _ = changed.notified() => retry = FIRST_RETRY,
                _ = tokio::time::sleep(retry) => retry = (retry * 2).min(MAX_RETRY),
            }
        }
        tokio::time::sleep(DEBOUNCE).await;
    }
}

/// Applies `merged` when it differs from what was applied last.
fn apply(gw: &Gateway, namespace: &str, merged: &Merged, applied: &mut Option<Compiled>) {
    let same = applied.as_ref().is_some_and(|a| {
        a.config == merged.compiled.config
            && a.keys == merged.compiled.keys
            && a.revision_keys == merged.compiled.revision_keys
    });
    if same {
        return;
    }
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
            *applied = Some(merged.compiled.clone());
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;
    use switchback_crds::config::{
        CircuitBreaker, CompiledConfig, Credential, Fallback, Keys, ObjectId, Provider, Route,
        SecretKeyRef, Strategy, Target,
    };
    use switchback_crds::delivery::{NamespaceObjects, PartLimits};
    use switchback_crds::revision::{RevisionKey, Revisions};
    use switchback_crds::secret::Secret;

    use super::*;

    const GW: &str = "switchback";

    fn route(ns: &str, name: &str, model: &str) -> Route {
        Route {
            response_model: Default::default(),
            id: ObjectId::new(ns, name),
            generation: 2,
            models: vec![model.into()],
            strategy: Strategy::Fallback,
            targets: vec![Target {
                health_check: None,
                model_map: Default::default(),
                credential: ObjectId::new(ns, "openai"),
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
        }
    }

    fn config(ns: &str, routes: &[(&str, &str)]) -> CompiledConfig {
        let mut routes: Vec<Route> = routes.iter().map(|(n, m)| route(ns, n, m)).collect();
        routes.sort_by(|a, b| a.id.cmp(&b.id));
        CompiledConfig {
            routes,
            credentials: vec![Credential {
                key_rejected_for_ms: 300_000,
                api_version: None,
                responses_api: false,
                prefill: false,
                project: None,
                location: None,
                region: None,
                id: ObjectId::new(ns, "openai"),
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

    /// One namespace rendered by the operator's own function, in parts of at most
    /// `part_bytes`.
    fn render(ns: &str, config: CompiledConfig, key: &str, part_bytes: usize) -> NamespaceObjects {
        let part = NamespaceConfig {
            config,
            keys: keys(ns, key),
            revision_key: Some(RevisionKey::random()),
        };
        let limits = PartLimits {
            max_parts: 64,
            max_part_bytes: part_bytes,
        };
        delivery::render_namespace(GW, ns, &part, limits).unwrap()
    }

    /// A small namespace of `routes` (name, model), in one part, key `sk-<ns>`.
    fn one_part(ns: &str, routes: &[(&str, &str)]) -> NamespaceObjects {
        render(ns, config(ns, routes), &format!("sk-{ns}"), 900 * 1024)
    }

    fn index_of(rendered: &[(&str, &NamespaceObjects)]) -> Index {
        Index {
            namespaces: rendered
                .iter()
                .map(|(ns, o)| (ns.to_string(), o.entry()))
                .collect(),
            ..Index::default()
        }
    }

    fn fetched(rendered: &[&NamespaceObjects]) -> Fetched {
        let mut f = Fetched::default();
        for o in rendered {
            for p in &o.parts {
                f.maps.insert(p.metadata.name.clone().unwrap(), p.clone());
            }
            f.secrets
                .insert(o.keys.metadata.name.clone().unwrap(), o.keys.clone());
        }
        f
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
    fn namespaces_are_merged_with_their_keys_and_revision_keys() {
        let a = one_part("team-a", &[("smart", "smart")]);
        let b = one_part("team-b", &[("fast", "fast")]);
        let index = index_of(&[("team-a", &a), ("team-b", &b)]);
        let mut last = LastGood::default();
        let m = merge(
            GW,
            &Ok(index.clone()),
            &fetched(&[&a, &b]),
            &mut last,
            false,
        );
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        assert_eq!(served(&m), ["team-a/smart", "team-b/fast"]);
        assert_eq!(m.compiled.keys.0.len(), 2);
        assert_eq!(m.compiled.revision_keys.len(), 2);
        // The operator's revision of a route, from what it rendered, is the one the
        // proxy computes from what it assembled: the revision key came with the keys.
        let key = |o: &NamespaceObjects| {
            let data = o.keys.data.as_ref().unwrap();
            String::from_utf8(data[delivery::REVISION_KEY].0.clone())
                .unwrap()
                .parse::<RevisionKey>()
                .unwrap()
        };
        let operator_keys = BTreeMap::from([
            ("team-a".to_string(), key(&a)),
            ("team-b".to_string(), key(&b)),
        ]);
        let rendered = config("team-a", &[("smart", "smart")]);
        let operator = Revisions::new(&rendered, &keys("team-a", "sk-team-a"), &operator_keys)
            .route(&rendered.routes[0]);
        let proxy = Revisions::new(
            &m.compiled.config,
            &m.compiled.keys,
            &m.compiled.revision_keys,
        )
        .route(&m.compiled.config.routes[0]);
        assert_eq!(proxy, operator);
        // Nothing to fetch again while the index stays.
        assert_eq!(wanted(&index, &last, &Fetched::default()), (vec![], vec![]));
    }

    #[test]
    fn a_namespace_is_swapped_only_whole_and_never_as_a_mix_of_generations() {
        let routes: Vec<(String, String)> = (0..300)
            .map(|i| (format!("r{i}"), format!("m{i}")))
            .collect();
        let pairs = |v: &[(String, String)]| -> Vec<(String, String)> { v.to_vec() };
        let as_refs = |v: &[(String, String)]| -> CompiledConfig {
            let refs: Vec<(&str, &str)> = v.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            config("team-a", &refs)
        };
        let v1 = render("team-a", as_refs(&routes), "sk-a", 16 * 1024);
        assert!(v1.parts.len() >= 4, "{}", v1.parts.len());
        let mut edited = pairs(&routes);
        edited[17].1 = "renamed".into();
        edited[250].1 = "renamed-too".into();
        let mut v2 = render("team-a", as_refs(&edited), "sk-a", 16 * 1024);
        // Same revision key as v1 (the operator keeps it): only the edited parts differ.
        v2.keys = v1.keys.clone();
        let b = one_part("team-b", &[("fast", "fast")]);

        let mut last = LastGood::default();
        let gen1 = index_of(&[("team-a", &v1), ("team-b", &b)]);
        let m = merge(GW, &Ok(gen1), &fetched(&[&v1, &b]), &mut last, false);
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert_eq!(m.compiled.config.routes.len(), 301);

        // Generation 2 is indexed; one of its new parts has not arrived (or cannot be
        // read yet): team-a stays on generation 1 whole, team-b is served.
        let gen2 = index_of(&[("team-a", &v2), ("team-b", &b)]);
        let (old_entry, new_entry) = (v1.entry(), v2.entry());
        let new_parts: Vec<&str> = new_entry
            .parts
            .iter()
            .filter(|n| !old_entry.parts.contains(n))
            .map(String::as_str)
            .collect();
        assert_eq!(new_parts.len(), 2, "two edits in two parts");
        let mut partial = fetched(&[&v1, &v2, &b]);
        partial.maps.remove(new_parts[1]);
        partial
            .errors
            .insert(new_parts[1].to_string(), "forbidden".into());
        let (maps, _) = wanted(&gen2, &last, &partial);
        assert_eq!(maps, [new_parts[1]], "only what is missing is fetched");
        let m = merge(GW, &Ok(gen2.clone()), &partial, &mut last, false);
        assert_eq!(m.problems.len(), 1, "{:?}", m.problems);
        let why = m.problems[0].to_string();
        assert!(why.contains("cannot be read (forbidden)"), "{why}");
        assert!(why.contains("team-a keeps its last good config"), "{why}");
        let models: Vec<&str> = m
            .compiled
            .config
            .routes
            .iter()
            .flat_map(|r| r.models.iter().map(String::as_str))
            .collect();
        assert!(
            models.contains(&"m17") && models.contains(&"m250"),
            "generation 1, whole"
        );
        assert!(!models.contains(&"renamed"), "no part of generation 2");
        assert!(models.contains(&"fast"));

        // The missing part arrives holding generation 1's content under generation 2's
        // name (an edit in place): refused the same way.
        let mut mixed = fetched(&[&v1, &v2, &b]);
        let stale = v1.parts.iter().find(|p| !v2.parts.contains(p)).unwrap();
        mixed.maps.get_mut(new_parts[1]).unwrap().data = stale.data.clone();
        let m = merge(GW, &Ok(gen2.clone()), &mixed, &mut last, false);
        assert!(
            m.problems[0]
                .to_string()
                .contains("not the one its name stands for"),
            "{:?}",
            m.problems
        );
        assert!(
            !m.compiled
                .config
                .routes
                .iter()
                .any(|r| r.models == ["renamed"])
        );
        // What did not assemble is fetched again (the operator puts an object edited
        // in place back under its name).
        mixed.forget_unassembled(&gen2, &last);
        let (maps, secrets) = wanted(&gen2, &last, &mixed);
        assert_eq!(maps.len(), v2.parts.len(), "{maps:?}");
        assert_eq!(secrets, [v2.entry().keys]);

        // Everything arrived: generation 2, whole.
        let m = merge(GW, &Ok(gen2), &fetched(&[&v2, &b]), &mut last, false);
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        let models: Vec<&str> = m
            .compiled
            .config
            .routes
            .iter()
            .flat_map(|r| r.models.iter().map(String::as_str))
            .collect();
        assert!(models.contains(&"renamed") && models.contains(&"renamed-too"));
        assert!(!models.contains(&"m17") && !models.contains(&"m250"));

        // The index stops naming team-a: it goes. An index that does not read keeps
        // every namespace as it is.
        let m = merge(
            GW,
            &Ok(index_of(&[("team-b", &b)])),
            &fetched(&[&b]),
            &mut last,
            false,
        );
        assert_eq!(served(&m), ["team-b/fast"]);
        let broken = Err(DeliveryError::Index {
            object: index::INDEX_NAME.into(),
            key: index::INDEX_KEY,
            message: "not JSON".into(),
        });
        let m = merge(GW, &broken, &Fetched::default(), &mut last, false);
        assert_eq!(served(&m), ["team-b/fast"]);
        assert_eq!(
            m.problems[0].object.as_deref(),
            Some("switchback/switchback-index")
        );
    }

    #[test]
    fn a_model_claimed_twice_is_served_once() {
        let a = one_part("team-a", &[("x", "same")]);
        let b = one_part("team-b", &[("y", "same")]);
        let mut last = LastGood::default();
        let index = Ok(index_of(&[("team-a", &a), ("team-b", &b)]));
        let m = merge(GW, &index, &fetched(&[&a, &b]), &mut last, false);
        assert_eq!(m.compiled.config.routes.len(), 1);
        assert_eq!(m.problems.len(), 1);
        assert!(m.problems[0].message.contains("already served by team-a/x"));
    }

    #[test]
    fn with_models_per_client_each_namespace_may_serve_a_name_once() {
        let a = one_part("team-a", &[("x", "same"), ("x2", "same")]);
        let b = one_part("team-b", &[("y", "same")]);
        let mut last = LastGood::default();
        let index = Ok(index_of(&[("team-a", &a), ("team-b", &b)]));
        let m = merge(GW, &index, &fetched(&[&a, &b]), &mut last, true);
        // team-b's `same` is for team-b's clients; team-a's second one is refused.
        assert_eq!(served(&m), ["team-a/x", "team-b/y"]);
        assert_eq!(m.problems.len(), 1);
        assert!(m.problems[0].message.contains("already served by team-a/x"));
    }

    /// A fake API server on kube's mock service, with the proxy's RBAC: it lists and
    /// watches the index by name only (asserting the field selector) and answers GETs
    /// of the objects `objects` holds by name (404 for others, 403 for what `forbidden`
    /// names, once); when `empty_index` fires, the index watch reports an index that
    /// names nothing.
    fn fake_api(
        index: Option<ConfigMap>,
        objects: Vec<NamespaceObjects>,
        forbidden: Option<String>,
        empty_index: Option<tokio::sync::oneshot::Receiver<()>>,
        health: Option<ConfigMap>,
    ) -> (Client, tokio::task::JoinHandle<()>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let server = tokio::spawn(async move {
            let mut open_watches = Vec::new();
            let mut index_watch = None;
            let mut empty_index = empty_index;
            let mut forbidden = forbidden;
            loop {
                let next = tokio::select! {
                    next = handle.next_request() => next,
                    Ok(()) = async { empty_index.as_mut().unwrap().await }, if empty_index.is_some() && index_watch.is_some() => {
                        empty_index = None;
                        let send: tower_test::mock::SendResponse<Response<Body>> =
                            index_watch.take().unwrap();
                        let mut object = serde_json::to_value(index::index_config_map(GW, &Index::default())).unwrap();
                        object["metadata"]["resourceVersion"] = json!("11");
                        let line = json!({"type": "MODIFIED", "object": object});
                        let mut events = serde_json::to_vec(&line).unwrap();
                        events.push(b'\n');
                        send.send_response(Response::builder().body(Body::from(events)).unwrap());
                        continue;
                    }
                };
                let Some((request, send)) = next else {
                    return;
                };
                let uri = request.uri().to_string();
                let maps = format!("/api/v1/namespaces/{GW}/configmaps");
                let secrets = format!("/api/v1/namespaces/{GW}/secrets");
                let (path, query) = uri.split_once('?').unwrap_or((&uri, ""));
                if path == maps && query.contains("fieldSelector=metadata.name%3Dswitchback-health")
                {
                    // The fleet's health view, by name: listed, then watched.
                    if query.contains("watch=true") {
                        open_watches.push(send);
                        continue;
                    }
                    send.send_response(list_of(health.as_ref()));
                    continue;
                }
                if path == maps {
                    assert!(
                        query.contains("fieldSelector=metadata.name%3Dswitchback-index"),
                        "lists and watches the index alone: {uri}"
                    );
                    if query.contains("watch=true") {
                        if index_watch.is_none() && empty_index.is_some() {
                            index_watch = Some(send);
                        } else {
                            open_watches.push(send); // never answered: the watch stays open
                        }
                        continue;
                    }
                    send.send_response(list_of(index.as_ref()));
                    continue;
                }
                let name = path.rsplit('/').next().unwrap().to_string();
                let found = if path.starts_with(&maps) {
                    objects
                        .iter()
                        .flat_map(|o| &o.parts)
                        .find(|p| p.metadata.name.as_deref() == Some(&name))
                        .map(|p| serde_json::to_value(p).unwrap())
                } else if path.starts_with(&secrets) {
                    objects
                        .iter()
                        .map(|o| &o.keys)
                        .find(|s| s.metadata.name.as_deref() == Some(&name))
                        .map(|s| serde_json::to_value(s).unwrap())
                } else {
                    panic!("unexpected call {uri}");
                };
                let (code, body) = match found {
                    _ if forbidden.as_deref() == Some(&name) => {
                        forbidden = None;
                        (
                            403,
                            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "forbidden"}),
                        )
                    }
                    Some(object) => (200, object),
                    None => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
                    ),
                };
                send.send_response(
                    Response::builder()
                        .status(code)
                        .body(Body::from(serde_json::to_vec(&body).unwrap()))
                        .unwrap(),
                );
            }
        });
        (client, server)
    }

    /// A ConfigMap list answer of `item` (or none), as a by-name list gets.
    fn list_of(item: Option<&ConfigMap>) -> Response<Body> {
        let list = json!({
            "apiVersion": "v1", "kind": "ConfigMapList",
            "metadata": {"resourceVersion": "10"},
            "items": item.into_iter().collect::<Vec<_>>(),
        });
        Response::builder()
            .body(Body::from(serde_json::to_vec(&list).unwrap()))
            .unwrap()
    }

    /// Waits (at most 5 s) until `done` holds.
    async fn until(what: &str, done: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}, within 5 s"));
    }

    fn refusal(gw: &Gateway) -> Option<String> {
        let error = gw.report().last_error?;
        Some(error.problems.iter().map(|p| p.to_string()).collect())
    }

    /// The watch wiring against kube's mock service: the index is listed by name, the
    /// objects it names are fetched by name (a 403, as while the operator's reader Role
    /// is not updated yet, is fetched again), and the gateway serves them.
    #[tokio::test]
    async fn the_index_is_applied_by_name_and_the_gateway_becomes_ready() {
        let a = one_part("team-a", &[("smart", "smart")]);
        let index = index::index_config_map(GW, &index_of(&[("team-a", &a)]));
        let part = a.parts[0].metadata.name.clone();
        let (client, server) = fake_api(Some(index), vec![a], part, None, None);
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

    /// docs/proxy.md#loading-and-reloading-config: a delivered config with no LLMRoute (no
    /// index yet) is refused where a route is needed (`empty_until_routed` off: not ready,
    /// saying why); a fresh cluster install (`empty_until_routed`, as `start` sets in
    /// cluster mode) serves it and is ready, answering 404 until routes arrive;
    /// `--allow-empty-config` serves it too.
    #[tokio::test]
    async fn a_first_delivery_with_no_route_is_served_in_a_fresh_cluster_install() {
        let (client, server) = fake_api(None, Vec::new(), None, None, None);
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
            let (client, server) = fake_api(None, Vec::new(), None, None, None);
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

    /// Every rendered route going away (an index naming nothing) is a delivery with no
    /// LLMRoute: refused, and the last good config keeps serving, ready.
    #[tokio::test]
    async fn a_delivery_that_drops_every_route_keeps_the_last_good_config() {
        let a = one_part("team-a", &[("smart", "smart")]);
        let index = index::index_config_map(GW, &index_of(&[("team-a", &a)]));
        let (empty, emptied) = tokio::sync::oneshot::channel();
        let (client, server) = fake_api(Some(index), vec![a], None, Some(emptied), None);
        let mut gw = Gateway::new(1024, "cluster:switchback".into(), 1).unwrap();
        // As in cluster mode: an empty first config would be served, an emptying edit not.
        gw.empty_until_routed = true;
        let gw = Arc::new(gw);
        let _watch = watch(gw.clone(), client, GW);
        until("the gateway becomes ready", || gw.is_ready()).await;
        empty.send(()).unwrap();
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

    /// The fleet's health view (issue 32 item 5) is watched by name beside the index
    /// and applied: its circuit opens here and its probes are left to the replica it
    /// names. Then the API server stops answering: the view is not refreshed, expires,
    /// and this replica serves on its own findings, probing again itself.
    #[tokio::test]
    async fn the_fleets_view_is_applied_and_lapses_when_the_api_server_stops_answering() {
        use switchback_crds::fleet::{
            FleetCircuit, FleetView, TargetView, VIEW_VERSION, format_ms,
        };
        let a = one_part("team-a", &[("smart", "smart")]);
        let index = index::index_config_map(GW, &index_of(&[("team-a", &a)]));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let view = FleetView {
            version: VIEW_VERSION,
            expires_at: format_ms(now + 3_000),
            targets: vec![TargetView {
                credential: ObjectId::new("team-a", "openai"),
                model: None,
                circuit: FleetCircuit::Open,
                // Opened elsewhere after this replica started (its circuits' start).
                since: format_ms(now + 500),
                until: Some(format_ms(now + 60_000)),
                prober: Some("another-replica".into()),
            }],
            keys: Vec::new(),
        };
        let health = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(switchback_crds::fleet::VIEW_NAME.into()),
                namespace: Some(GW.into()),
                resource_version: Some("9".into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                switchback_crds::fleet::DATA_KEY.to_string(),
                serde_json::to_string(&view).unwrap(),
            )])),
            ..Default::default()
        };
        let (client, server) = fake_api(Some(index), vec![a], None, None, Some(health));
        let gw = Arc::new(Gateway::new(1024, "cluster:switchback".into(), 1).unwrap());
        let _watch = watch(gw.clone(), client, GW);
        until("the gateway becomes ready", || gw.is_ready()).await;
        let state = || gw.snapshot().route_list[0].targets[0].state.clone();
        // Its `since` is half a second ahead: adopted once this replica's start is older.
        until(
            "the fleet's opening adopted, its probes left to another",
            || state().probes.delegated() && state().breaker.opened() == 1,
        )
        .await;
        server.abort();
        until("the view lapsed: this replica probes again", || {
            !state().probes.delegated()
        })
        .await;
        assert!(gw.is_ready(), "serving on its own findings");
        assert!(
            state().breaker.is_open(tokio::time::Instant::now()),
            "the opening it adopted stands until its own probe"
        );
        drop(_watch);
    }
}

//! The reconcilers and their wiring: one [`Context`], one [`Error`] with a metric label,
//! one [`error_policy`].
//!
//! - **Delivery** ([`deliver`]): level-triggered over the whole cluster, because
//!   `compile` is (a model name belongs to the oldest route in any namespace). Any
//!   change to an LLMRoute, ProviderCredential, referenced Secret or rendered object
//!   re-renders; only objects whose content differs are applied (server-side apply,
//!   field manager [`MANAGER`]), namespaces left without routes lose both objects.
//!   The result is kept as the [`World`], and the routes and credentials whose facts
//!   changed are queued on their controllers (Secrets are mapped back to their users
//!   this way).
//! - **LLMRoute** ([`reconcile_route`]), **ProviderCredential**
//!   ([`reconcile_credential`]) and **LLMClient** ([`reconcile_client`]) controllers
//!   write status computed purely by [`crate::status`], only when it differs, within
//!   the write budget. The credential controller also holds deletion with a finalizer
//!   while routes reference it.
//! - **Client overlay**: after each scrape round, the clients' usage (their status'
//!   seed plus what was counted, [`crate::usage`]) decides which budgets are spent;
//!   those, and the ready replica count the limits are shared by, are laid over the
//!   rendered clients, and a change re-delivers.
//!
//! Only the leader runs any of this (see `leader`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use switchback_crds::admintoken::Refresh;
use switchback_crds::compile::{Inputs, Kind};
use switchback_crds::config::{CompiledConfig, ObjectId};
use switchback_crds::delivery::{self, DeliveryError, NamespaceConfig};
use switchback_crds::route::TotalStats;
use switchback_crds::{LLMClient, LLMRoute, ProviderCredential};
use tokio::sync::{Notify, mpsc};

use crate::aggregate::{Aggregator, Snapshot};
use crate::budget::{Permit, Priority, StatusBudget};
use crate::circuit_events::CircuitEvents;
use crate::metrics::{
    ControllerLabels, ErrorLabels, Health, KindLabels, Metrics, ReasonLabels, ResultLabels,
};
use crate::render::ClientOverlay;
use crate::render::{Rendering, render};
use crate::scrape::{self, Replicas};
use crate::status::{self, ClientFacts, CredentialFacts, RouteFacts};
use crate::synced::{Cache, Synced};
use crate::usage::{self, Budget, Seed};

/// Field manager of every write.
pub const MANAGER: &str = "switchback-operator";
/// Holds a ProviderCredential's deletion while routes reference it.
pub const FINALIZER: &str = "switchback.dev/credential-in-use";
/// Reconcile everything at least this often, whatever the watches say.
const RESYNC: Duration = Duration::from_secs(300);
/// Quiet time collecting changes before one delivery.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// The longest quiet time a slow delivery sets for the next one.
const MAX_QUIET: Duration = Duration::from_secs(1);
/// Namespaces whose rendered objects are written at once.
const DELIVERY_WRITERS: usize = 8;
/// Longest a status write waits for a route's delivery and its loading by the
/// proxies (see `held`).
const HOLD: Duration = Duration::from_secs(5);
/// How often a held route looks again.
const HOLD_RECHECK: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("rendering: {0}")]
    Delivery(#[from] DeliveryError),
    #[error("{0} has no namespace")]
    NoNamespace(String),
}

impl Error {
    /// The API server refused a write made against a stale read.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(s)) if s.code == 409)
    }

    /// The `error` label of `switchback_operator_reconcile_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            e if e.is_conflict() => "conflict",
            Error::Kube(_) => "kube",
            Error::Delivery(_) => "delivery",
            Error::NoNamespace(_) => "no_namespace",
        }
    }
}

/// What the operator needs from its flags.
#[derive(Clone, Debug)]
pub struct Settings {
    pub gateway_namespace: String,
    pub status_interval: Duration,
    pub status_writes_per_second: f64,
    /// `--auth required`: model names resolve per client (SPEC §9 Tenancy).
    pub models_per_client: bool,
    /// With `--auth required`, what client keys are hashed with; without, rendered
    /// clients carry no hash and nobody authenticates with them.
    pub client_key_hasher: Option<Arc<switchback_crds::keyhash::KeyHasher>>,
}

/// The informer caches every reconciler reads.
#[derive(Clone)]
pub struct Stores {
    pub routes: Store<LLMRoute>,
    pub credentials: Store<ProviderCredential>,
    pub clients: Store<LLMClient>,
    /// Metadata only: Secret data is fetched for referenced Secrets alone.
    pub secrets: Store<PartialObjectMeta<KubeSecret>>,
    pub rendered_maps: Store<ConfigMap>,
    pub rendered_secrets: Store<KubeSecret>,
    /// Whether all of the above have listed once (never await the stores themselves:
    /// see `synced`).
    pub synced: Synced,
}

/// Where delivery queues objects whose facts changed.
#[derive(Clone)]
pub struct Triggers {
    pub routes: mpsc::UnboundedSender<ObjectRef<LLMRoute>>,
    pub credentials: mpsc::UnboundedSender<ObjectRef<ProviderCredential>>,
    pub clients: mpsc::UnboundedSender<ObjectRef<LLMClient>>,
    /// Wakes the delivery loop.
    pub delivery: Arc<Notify>,
}

/// The last delivery: the rendering plus digests of each object's facts.
pub struct World {
    pub rendering: Rendering,
    route_digests: HashMap<ObjectId, u64>,
    credential_digests: HashMap<ObjectId, u64>,
    client_digests: HashMap<ObjectId, u64>,
    /// When each route's `Served` (generation and revision) was first delivered, to
    /// tell how long the proxies have had to load it.
    served_since: HashMap<ObjectId, tokio::time::Instant>,
    /// The generation of each LLMRoute this rendering was computed from.
    generations: HashMap<ObjectId, i64>,
}

impl World {
    pub fn new(
        rendering: Rendering,
        routes: &[LLMRoute],
        credentials: &[ProviderCredential],
        clients: &[LLMClient],
    ) -> Self {
        let digest = |kind: Kind, id: &ObjectId, extra: &dyn Fn(&mut DefaultHasher)| {
            let mut h = DefaultHasher::new();
            for d in rendering.diagnostics(kind, id) {
                (
                    d.reason,
                    &d.field,
                    &d.message,
                    d.severity == switchback_crds::compile::Severity::Error,
                )
                    .hash(&mut h);
            }
            extra(&mut h);
            h.finish()
        };
        let route_digests = routes
            .iter()
            .map(|r| {
                let id = ObjectId::of(r);
                // `Served` carries the revision: a credential edit or a rotated key
                // alone re-queues the routes using it, so Programmed is recomputed.
                let served = rendering.served.get(&id).copied();
                let d = digest(Kind::LLMRoute, &id, &|h| served.hash(h));
                (id, d)
            })
            .collect();
        let users = users(routes);
        let credential_digests = credentials
            .iter()
            .map(|c| {
                let id = ObjectId::of(c);
                let names = users.get(&id).cloned().unwrap_or_default();
                let d = digest(Kind::ProviderCredential, &id, &|h| names.hash(h));
                (id, d)
            })
            .collect();
        let client_digests = clients
            .iter()
            .map(|c| {
                let id = ObjectId::of(c);
                let routes = rendering.client(&id).map(|c| c.routes.len());
                let d = digest(Kind::LLMClient, &id, &|h| routes.hash(h));
                (id, d)
            })
            .collect();
        Self {
            rendering,
            route_digests,
            credential_digests,
            client_digests,
            served_since: HashMap::new(),
            generations: routes
                .iter()
                .map(|r| (ObjectId::of(r), r.metadata.generation.unwrap_or(0)))
                .collect(),
        }
    }

    /// Dates each route's `Served`: kept from `old` when unchanged, else `now`.
    pub fn dated(mut self, old: Option<&World>, now: tokio::time::Instant) -> Self {
        self.served_since = self
            .rendering
            .served
            .iter()
            .map(|(id, served)| {
                let kept = old.and_then(|o| {
                    (o.rendering.served.get(id) == Some(served))
                        .then(|| o.served_since.get(id).copied())
                        .flatten()
                });
                (id.clone(), kept.unwrap_or(now))
            })
            .collect();
        self
    }

    /// Objects whose facts differ from `old`.
    fn changed(&self, old: &World) -> (Vec<ObjectId>, Vec<ObjectId>, Vec<ObjectId>) {
        let diff = |new: &HashMap<ObjectId, u64>, old: &HashMap<ObjectId, u64>| {
            new.iter()
                .filter(|(id, d)| old.get(*id) != Some(*d))
                .map(|(id, _)| id.clone())
                .collect::<Vec<_>>()
        };
        (
            diff(&self.route_digests, &old.route_digests),
            diff(&self.credential_digests, &old.credential_digests),
            diff(&self.client_digests, &old.client_digests),
        )
    }
}

/// LLMRoute names referencing each credential, sorted.
fn users(routes: &[LLMRoute]) -> BTreeMap<ObjectId, Vec<String>> {
    let mut out: BTreeMap<ObjectId, BTreeSet<String>> = BTreeMap::new();
    for r in routes {
        let id = ObjectId::of(r);
        for t in &r.spec.targets {
            out.entry(ObjectId::new(&id.namespace, &t.credential_ref.name))
                .or_default()
                .insert(id.name.clone());
        }
    }
    out.into_iter()
        .map(|(k, v)| (k, v.into_iter().collect()))
        .collect()
}

/// Everything the reconcilers share.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub stores: Stores,
    pub metrics: Metrics,
    pub recorder: Recorder,
    pub triggers: Triggers,
    pub world: RwLock<Option<Arc<World>>>,
    pub proxies: RwLock<Arc<Snapshot>>,
    /// Routes whose status write is held until their generation is rendered: the
    /// generation and when it was first seen unrendered.
    unrendered: Mutex<HashMap<ObjectId, (i64, tokio::time::Instant)>>,
    pub budget: Mutex<StatusBudget>,
    /// `status.totals` found when this process first saw each route.
    seeds: Mutex<HashMap<ObjectId, TotalStats>>,
    /// Referenced Secrets, by resourceVersion.
    secret_cache: Mutex<HashMap<ObjectId, KubeSecret>>,
    /// Route sets named in the last DeletionBlocked Event per credential.
    blocked: Mutex<HashMap<ObjectId, Vec<String>>>,
    /// `status.usage` and `status.throttled` found when this process first saw each
    /// client.
    client_seeds: Mutex<HashMap<ObjectId, Seed>>,
    /// What the last scrape round lays over the rendered clients.
    overlay: RwLock<Arc<ClientOverlay>>,
}

impl Context {
    pub fn new(
        client: Client,
        settings: Settings,
        stores: Stores,
        metrics: Metrics,
        recorder: Recorder,
        triggers: Triggers,
    ) -> Self {
        let budget = StatusBudget::new(
            settings.status_writes_per_second,
            settings.status_interval,
            tokio::time::Instant::now(),
        );
        Self {
            client,
            settings,
            stores,
            metrics,
            recorder,
            triggers,
            world: RwLock::new(None),
            proxies: RwLock::new(Arc::new(Snapshot::default())),
            unrendered: Mutex::new(HashMap::new()),
            budget: Mutex::new(budget),
            seeds: Mutex::new(HashMap::new()),
            secret_cache: Mutex::new(HashMap::new()),
            blocked: Mutex::new(HashMap::new()),
            client_seeds: Mutex::new(HashMap::new()),
            overlay: RwLock::new(Arc::new(ClientOverlay::default())),
        }
    }

    pub fn overlay(&self) -> Arc<ClientOverlay> {
        self.overlay
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The seed of a client: its status when this process first saw it.
    fn client_seed(&self, client: &LLMClient) -> Seed {
        self.client_seeds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(ObjectId::of(client))
            .or_insert_with(|| Seed::from_status(client.status.as_ref()))
            .clone()
    }

    pub fn world(&self) -> Option<Arc<World>> {
        self.world.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn proxies(&self) -> Arc<Snapshot> {
        self.proxies
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn permit(&self, key: &str, urgent: bool, priority: Priority) -> Permit {
        self.budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .permit(key, urgent, priority, tokio::time::Instant::now())
    }

    fn reconciled(&self, controller: &'static str) {
        self.metrics
            .reconciles
            .get_or_create(&ControllerLabels { controller })
            .inc();
    }

    /// An Event went out, counted by its reason.
    fn published(&self, reason: &'static str) {
        self.metrics
            .events
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    fn failed(&self, controller: &'static str, error: &Error) {
        self.metrics
            .errors
            .get_or_create(&ErrorLabels {
                controller,
                error: error.metric_label(),
            })
            .inc();
    }

    fn wrote(
        &self,
        family: &prometheus_client::metrics::family::Family<
            KindLabels,
            prometheus_client::metrics::counter::Counter,
        >,
        kind: &'static str,
    ) {
        family.get_or_create(&KindLabels { kind }).inc();
    }

    /// Full copies of the Secrets the credentials and clients reference, fetched when
    /// their resourceVersion changed; absent Secrets are left out.
    async fn referenced_secrets(
        &self,
        credentials: &[ProviderCredential],
        clients: &[LLMClient],
    ) -> Result<Vec<KubeSecret>, Error> {
        let wanted: BTreeSet<ObjectId> = credentials
            .iter()
            .map(|c| ObjectId::new(ObjectId::of(c).namespace, &c.spec.secret_ref.name))
            .chain(
                clients
                    .iter()
                    .map(|c| ObjectId::new(ObjectId::of(c).namespace, &c.spec.key_secret_ref.name)),
            )
            .collect();
        let mut fetch = Vec::new();
        {
            let mut cache = self.secret_cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.retain(|id, _| wanted.contains(id));
            for id in &wanted {
                let meta = self
                    .stores
                    .secrets
                    .get(&ObjectRef::new(&id.name).within(&id.namespace));
                let Some(meta) = meta else {
                    cache.remove(id);
                    continue;
                };
                let fresh = cache
                    .get(id)
                    .is_some_and(|s| s.metadata.resource_version == meta.metadata.resource_version);
                if !fresh {
                    fetch.push(id.clone());
                }
            }
        }
        for id in fetch {
            let api: Api<KubeSecret> = Api::namespaced(self.client.clone(), &id.namespace);
            let got = api.get_opt(&id.name).await?;
            let mut cache = self.secret_cache.lock().unwrap_or_else(|p| p.into_inner());
            match got {
                Some(secret) => cache.insert(id, secret),
                None => cache.remove(&id),
            };
        }
        let cache = self.secret_cache.lock().unwrap_or_else(|p| p.into_inner());
        Ok(cache.values().cloned().collect())
    }
}

/// Re-renders every namespace, applies what differs, deletes what is no longer wanted,
/// and queues the routes and credentials whose facts changed.
pub async fn deliver(ctx: &Context) -> Result<(), Error> {
    ctx.reconciled("delivery");
    let routes: Vec<LLMRoute> = ctx
        .stores
        .routes
        .state()
        .iter()
        .map(|r| (**r).clone())
        .collect();
    let credentials: Vec<ProviderCredential> = ctx
        .stores
        .credentials
        .state()
        .iter()
        .map(|c| (**c).clone())
        .collect();
    let clients: Vec<LLMClient> = ctx
        .stores
        .clients
        .state()
        .iter()
        .map(|c| (**c).clone())
        .collect();
    let secrets = ctx.referenced_secrets(&credentials, &clients).await?;
    let rendered_maps = ctx.stores.rendered_maps.state();
    let previous: BTreeMap<String, CompiledConfig> = rendered_maps
        .iter()
        .filter_map(|cm| delivery::read_config_map(cm).ok())
        .collect();
    let mut rendering = render(
        &Inputs {
            routes: &routes,
            credentials: &credentials,
            clients: &clients,
            secrets: &secrets,
            client_key_hasher: ctx.settings.client_key_hasher.as_deref(),
            models_per_client: ctx.settings.models_per_client,
        },
        &previous,
    );
    rendering.lay_over(&ctx.overlay());

    let gw = &ctx.settings.gateway_namespace;
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), gw);
    let keys: Api<KubeSecret> = Api::namespaced(ctx.client.clone(), gw);
    let apply = PatchParams::apply(MANAGER).force();
    // Namespaces are written concurrently (a bulk apply touches every one of them
    // in each delivery); within one, keys first: a config never arrives before the
    // keys it needs.
    let writes: Vec<_> = rendering
        .namespaces
        .iter()
        .map(|(ns, part)| write_namespace(ctx, &maps, &keys, &apply, ns, part))
        .collect();
    let mut writes = futures_util::stream::iter(writes).buffer_unordered(DELIVERY_WRITERS);
    while let Some(written) = writes.next().await {
        written?;
    }
    drop(writes);
    let stale = |name: &str, prefix: &'static str| {
        delivery::source_namespace(name, prefix)
            .map(|ns| !rendering.namespaces.contains_key(ns))
            .unwrap_or(false)
    };
    for cm in &rendered_maps {
        let name = cm.name_any();
        if stale(&name, delivery::ROUTES_PREFIX) && managed(&**cm) {
            ignore_not_found(maps.delete(&name, &DeleteParams::default()).await)?;
            ctx.wrote(&ctx.metrics.config_writes, "ConfigMapDelete");
        }
    }
    for s in ctx.stores.rendered_secrets.state() {
        let name = s.name_any();
        if stale(&name, delivery::KEYS_PREFIX) && managed(&*s) {
            ignore_not_found(keys.delete(&name, &DeleteParams::default()).await)?;
            ctx.wrote(&ctx.metrics.config_writes, "SecretDelete");
        }
    }

    let world = World::new(rendering, &routes, &credentials, &clients)
        .dated(ctx.world().as_deref(), tokio::time::Instant::now());
    let world = Arc::new(world);
    let old = ctx
        .world
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .replace(world.clone());
    if let Some(old) = old {
        let (routes, credentials, clients) = world.changed(&old);
        for id in clients {
            let _ = ctx
                .triggers
                .clients
                .send(ObjectRef::new(&id.name).within(&id.namespace));
        }
        for id in routes {
            let _ = ctx
                .triggers
                .routes
                .send(ObjectRef::new(&id.name).within(&id.namespace));
        }
        for id in credentials {
            let _ = ctx
                .triggers
                .credentials
                .send(ObjectRef::new(&id.name).within(&id.namespace));
        }
    }
    Ok(())
}

/// Writes one namespace's rendered keys Secret, then its ConfigMap, each only when it
/// differs from what the cache holds.
async fn write_namespace(
    ctx: &Context,
    maps: &Api<ConfigMap>,
    keys: &Api<KubeSecret>,
    apply: &PatchParams,
    ns: &str,
    part: &NamespaceConfig,
) -> Result<(), Error> {
    let gw = &ctx.settings.gateway_namespace;
    let secret = delivery::keys_secret(gw, ns, &part.keys)?;
    let name = delivery::keys_name(ns);
    let current = ctx
        .stores
        .rendered_secrets
        .get(&ObjectRef::new(&name).within(gw));
    if current.is_none_or(|c| c.data != secret.data || !has_labels(&*c, &secret)) {
        keys.patch(&name, apply, &Patch::Apply(&secret)).await?;
        ctx.wrote(&ctx.metrics.config_writes, "Secret");
    }
    let map = delivery::config_map(gw, ns, &part.config)?;
    let name = delivery::routes_name(ns);
    let current = ctx
        .stores
        .rendered_maps
        .get(&ObjectRef::new(&name).within(gw));
    if current.is_none_or(|c| c.data != map.data || !has_labels(&*c, &map)) {
        maps.patch(&name, apply, &Patch::Apply(&map)).await?;
        ctx.wrote(&ctx.metrics.config_writes, "ConfigMap");
    }
    Ok(())
}

fn has_labels<K: Resource>(current: &K, wanted: &K) -> bool {
    let have = current.meta().labels.as_ref();
    wanted
        .meta()
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
}

fn managed<K: Resource>(obj: &K) -> bool {
    obj.meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(delivery::MANAGED_BY_LABEL))
        .is_some_and(|v| v == delivery::MANAGED_BY)
}

fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Now, to the second (the API stores times to the second).
fn now() -> Time {
    Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now()))
}

/// Writes an LLMRoute's status when it changed, within the budget.
pub async fn reconcile_route(route: Arc<LLMRoute>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.reconciled("llmroute");
    let ns = route
        .namespace()
        .ok_or_else(|| Error::NoNamespace(route.name_any()))?;
    let Some(world) = ctx.world() else {
        return Ok(Action::requeue(Duration::from_millis(500)));
    };
    let id = ObjectId::of(&*route);
    let seed = ctx
        .seeds
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(id.clone())
        .or_insert_with(|| {
            route
                .status
                .as_ref()
                .and_then(|s| s.totals.clone())
                .unwrap_or_default()
        })
        .clone();
    let proxies = ctx.proxies();
    let desired = status::route_status(&RouteFacts {
        route: &route,
        diagnostics: world.rendering.diagnostics(Kind::LLMRoute, &id).collect(),
        served: world.rendering.served.get(&id).copied(),
        proxies: &proxies,
        seed,
        now: now(),
    });
    let current = route.status.clone().unwrap_or_default();
    if desired == current {
        return Ok(Action::requeue(RESYNC));
    }
    if let Some(wait) = held(&ctx, &world, &route, &id, &desired) {
        return Ok(Action::requeue(wait));
    }
    let urgent = !status::only_traffic_changed(&current, &desired);
    // A condition change is what `kubectl wait` waits on: it goes before the rest.
    let priority = if urgent {
        Priority::First
    } else {
        Priority::Spare
    };
    if let Permit::Wait(wait) = ctx.permit(&format!("LLMRoute/{id}"), urgent, priority) {
        return Ok(Action::requeue(wait));
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        // Which top-level status fields this write changes: why a route is written.
        let (c, d) = (json!(current), json!(desired));
        let changed: Vec<&String> = d
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| c.get(k.as_str()) != Some(v))
            .map(|(k, _)| k)
            .collect();
        tracing::debug!(route = %id, ?changed, "writing status");
    }
    let api: Api<LLMRoute> = Api::namespaced(ctx.client.clone(), &ns);
    apply_status(&ctx, &api, &route.name_any(), "LLMRoute", &desired).await?;
    Ok(Action::requeue(RESYNC))
}

/// Whether to hold a status write that would only say "not there yet": the route's
/// generation is not rendered yet (a delivery is on its way: it re-queues the route),
/// or it is rendered and the proxies have not loaded it yet (`Programmed=Pending`;
/// the scrape that sees it served re-queues the route). Either is most likely over
/// within a second, and writing it would cost a second write moments later: a bulk
/// apply would need two or three writes per route instead of one. A hold lasts at
/// most [`HOLD`] from when the content was first seen, so a stalled delivery or
/// proxy never hides a route's conditions for long. Returns when to look again.
fn held(
    ctx: &Context,
    world: &World,
    route: &LLMRoute,
    id: &ObjectId,
    desired: &switchback_crds::route::LLMRouteStatus,
) -> Option<Duration> {
    let now = tokio::time::Instant::now();
    let generation = route.metadata.generation.unwrap_or(0);
    let since = if world.generations.get(id) != Some(&generation) {
        let mut first = ctx.unrendered.lock().unwrap_or_else(|p| p.into_inner());
        let at = first.entry(id.clone()).or_insert((generation, now));
        if at.0 != generation {
            *at = (generation, now);
        }
        at.1
    } else {
        ctx.unrendered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        let pending = desired
            .conditions
            .iter()
            .any(|c| c.type_ == status::types::PROGRAMMED && c.reason == status::reasons::PENDING);
        if !pending {
            return None;
        }
        *world.served_since.get(id)?
    };
    (now.saturating_duration_since(since) < HOLD).then_some(HOLD_RECHECK)
}

/// Server-side apply of a computed status (the operator owns every status field),
/// counted in `switchback_operator_status_writes_total`.
async fn apply_status<K>(
    ctx: &Context,
    api: &Api<K>,
    name: &str,
    kind: &'static str,
    status: &impl serde::Serialize,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = Patch::Apply(json!({
        "apiVersion": K::api_version(&()),
        "kind": kind,
        "status": status,
    }));
    api.patch_status(name, &PatchParams::apply(MANAGER).force(), &patch)
        .await?;
    ctx.wrote(&ctx.metrics.status_writes, kind);
    Ok(())
}

/// Finalizer and status of a ProviderCredential.
pub async fn reconcile_credential(
    credential: Arc<ProviderCredential>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.reconciled("providercredential");
    let ns = credential
        .namespace()
        .ok_or_else(|| Error::NoNamespace(credential.name_any()))?;
    let Some(world) = ctx.world() else {
        return Ok(Action::requeue(Duration::from_millis(500)));
    };
    let id = ObjectId::of(&*credential);
    let name = credential.name_any();
    let api: Api<ProviderCredential> = Api::namespaced(ctx.client.clone(), &ns);
    // Users straight from the cache, not the (debounced) world: the finalizer must not
    // let go while a route that was just created references it.
    let routes: Vec<LLMRoute> = ctx
        .stores
        .routes
        .state()
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(ns.as_str()))
        .map(|r| (**r).clone())
        .collect();
    let users = users(&routes).remove(&id).unwrap_or_default();
    let finalizers = credential.finalizers();
    let has_finalizer = finalizers.iter().any(|f| f == FINALIZER);
    let deleting = credential.meta().deletion_timestamp.is_some();

    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if deleting && users.is_empty() {
        let rest: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
        set_finalizers(&api, &credential, json!(rest)).await?;
        ctx.blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        return Ok(Action::await_change());
    }
    if !deleting && !has_finalizer {
        let mut all: Vec<&String> = finalizers.iter().collect();
        let ours = FINALIZER.to_string();
        all.push(&ours);
        set_finalizers(&api, &credential, json!(all)).await?;
        // The patch comes back through the watch and reconciles again.
        return Ok(Action::await_change());
    }
    if deleting {
        let new_set = {
            let mut blocked = ctx.blocked.lock().unwrap_or_else(|p| p.into_inner());
            blocked.insert(id.clone(), users.clone()).as_ref() != Some(&users)
        };
        if new_set {
            ctx.recorder
                .publish(
                    &Event {
                        type_: EventType::Warning,
                        reason: status::reasons::DELETION_BLOCKED.into(),
                        note: Some(format!(
                            "deletion is held while LLMRoutes reference this credential: {}",
                            users.join(", ")
                        )),
                        action: "Delete".into(),
                        secondary: None,
                    },
                    &credential.object_ref(&()),
                )
                .await?;
            ctx.published(status::reasons::DELETION_BLOCKED);
        }
    }

    let previous = credential
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let desired = status::credential_status(&CredentialFacts {
        generation: credential.meta().generation,
        previous: &previous,
        diagnostics: world
            .rendering
            .diagnostics(Kind::ProviderCredential, &id)
            .collect(),
        routes: &users,
        deleting,
        now: now(),
    });
    let requeue = if deleting {
        Action::requeue(Duration::from_secs(30))
    } else {
        Action::requeue(RESYNC)
    };
    if credential.status.as_ref() == Some(&desired) {
        return Ok(requeue);
    }
    // The count of routes using it moves with every route applied: on its own it
    // waits for the per-object interval, as traffic facts do, from 0 to some too: a
    // bulk apply creates the credentials first and their routes just after, and each
    // write spent on a count is one a route waits for.
    let urgent = deleting
        || credential.status.as_ref().is_none_or(|s| {
            s.conditions != desired.conditions
                || s.observed_generation != desired.observed_generation
        });
    // Routes show what a credential's status says (ResolvedRefs), and nothing waits on
    // a credential's conditions: its writes take what route writes leave over.
    if let Permit::Wait(wait) =
        ctx.permit(&format!("ProviderCredential/{id}"), urgent, Priority::Spare)
    {
        return Ok(Action::requeue(wait));
    }
    apply_status(&ctx, &api, &name, "ProviderCredential", &desired).await?;
    Ok(requeue)
}

/// Writes an LLMClient's status when it changed, within the budget: Ready from the
/// rendering's diagnostics and the spent budgets, usage from the scrapes.
pub async fn reconcile_client(client: Arc<LLMClient>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.reconciled("llmclient");
    let ns = client
        .namespace()
        .ok_or_else(|| Error::NoNamespace(client.name_any()))?;
    let Some(world) = ctx.world() else {
        return Ok(Action::requeue(Duration::from_millis(500)));
    };
    let id = ObjectId::of(&*client);
    let proxies = ctx.proxies();
    let overlay = ctx.overlay();
    let view = proxies.clients.get(&id);
    let now_ms = Timestamp::now().as_millisecond().max(0) as u64;
    let current = usage::current(&ctx.client_seed(&client), view.map(|v| &v.counted), now_ms);
    let desired = status::client_status(&ClientFacts {
        client: &client,
        diagnostics: world.rendering.diagnostics(Kind::LLMClient, &id).collect(),
        routes: world.rendering.client(&id).map(|c| c.routes.len()),
        usage: current,
        exhausted: overlay.exhausted.get(&id),
        view,
        window_seconds: proxies.window_seconds,
        auth_required: ctx.settings.client_key_hasher.is_some(),
        now: now(),
    });
    let existing = client.status.clone().unwrap_or_default();
    if desired == existing {
        return Ok(Action::requeue(RESYNC));
    }
    // Ready is what `kubectl wait` waits on; usage moves with every request and waits
    // for the per-object interval.
    let urgent = !status::only_client_traffic_changed(&existing, &desired);
    let priority = if urgent {
        Priority::First
    } else {
        Priority::Spare
    };
    if let Permit::Wait(wait) = ctx.permit(&format!("LLMClient/{id}"), urgent, priority) {
        return Ok(Action::requeue(wait));
    }
    let api: Api<LLMClient> = Api::namespaced(ctx.client.clone(), &ns);
    apply_status(&ctx, &api, &client.name_any(), "LLMClient", &desired).await?;
    Ok(Action::requeue(RESYNC))
}

/// After a scrape round: the budgets spent (usage = each client's seed plus what was
/// counted) and the ready replicas, as laid over the rendered clients.
fn client_overlay(ctx: &Context, proxies: &Snapshot, now_ms: u64) -> ClientOverlay {
    let mut exhausted = BTreeMap::new();
    for client in ctx.stores.clients.state() {
        let budget = Budget::of(client.spec.budget.as_ref());
        if !budget.is_set() {
            continue;
        }
        let id = ObjectId::of(&*client);
        let counted = proxies.clients.get(&id).map(|v| &v.counted);
        let current = usage::current(&ctx.client_seed(&client), counted, now_ms);
        if let Some(spent) = budget.exhausted(&current, now_ms) {
            exhausted.insert(id, spent);
        }
    }
    ClientOverlay {
        replicas: u32::try_from(proxies.replicas.len()).unwrap_or(u32::MAX),
        exhausted,
    }
}

/// Sets `metadata.finalizers` with a JSON merge patch carrying the resourceVersion
/// read, so a concurrent change (another finalizer added) fails with 409 and the
/// reconcile retries on fresh data instead of overwriting it.
async fn set_finalizers(
    api: &Api<ProviderCredential>,
    credential: &ProviderCredential,
    finalizers: serde_json::Value,
) -> Result<(), Error> {
    let patch = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": credential.resource_version(),
        }
    });
    api.patch(
        &credential.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// The one error policy: count, log, retry with a short delay (a 409 right away).
pub fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<K>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let controller = match K::kind(&()).as_ref() {
        "LLMRoute" => "llmroute",
        "LLMClient" => "llmclient",
        _ => "providercredential",
    };
    ctx.failed(controller, error);
    tracing::warn!(object = %ObjectId::of(&*obj), %error, "reconcile failed");
    match error {
        e if e.is_conflict() => Action::requeue(Duration::from_millis(200)),
        _ => Action::requeue(Duration::from_secs(5)),
    }
}

/// How the proxies are found and their stats read.
#[derive(Clone, Debug)]
pub struct ScrapeOptions {
    pub replicas: Replicas,
    pub interval: Duration,
    pub window: Duration,
    /// `--proxy-admin-token-file`: the proxies' admin token, sent on every scrape.
    pub admin_token: Option<Arc<switchback_crds::admintoken::AdminTokenFile>>,
}

/// Scrapes the proxies forever: aggregate, queue routes whose facts changed, publish
/// circuit Events (as `circuit_events` decides: every change, flapping held back).
pub async fn scrape_loop(ctx: Arc<Context>, opts: ScrapeOptions) {
    let http = match reqwest::Client::builder().no_proxy().build() {
        Ok(h) => h,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the HTTP client for scraping");
            return;
        }
    };
    let started = Timestamp::now().as_millisecond() as u64;
    let mut agg = Aggregator::new(opts.window.as_millis() as u64, started);
    let mut events = CircuitEvents::default();
    let mut refusals = scrape::Refusals::default();
    let mut tick = tokio::time::interval(opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let endpoints = match opts.replicas.discover(&ctx.client).await {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "listing the proxy replicas");
                continue;
            }
        };
        let token = opts.admin_token.as_ref().map(|file| {
            let (token, refresh) = file.current();
            match refresh {
                Refresh::Unchanged => {}
                Refresh::Reloaded => tracing::info!(
                    file = %file.path().display(),
                    "the proxy admin token file changed: scraping with the new token"
                ),
                Refresh::KeptLast(why) => tracing::warn!("{why}"),
            }
            token
        });
        let scrapes = futures_util::future::join_all(
            endpoints
                .iter()
                .map(|e| scrape::scrape(&http, e, token.as_deref())),
        )
        .await;
        for s in refusals.observe(&scrapes) {
            if let Err(e) = &s.result {
                tracing::warn!(replica = %s.endpoint, "scraping a proxy replica: {e}");
            }
        }
        for s in &scrapes {
            let result = if s.result.is_ok() { "ok" } else { "error" };
            ctx.metrics
                .scrapes
                .get_or_create(&ResultLabels { result })
                .inc();
        }
        let before = ctx.proxies();
        let transitions = agg.observe(Timestamp::now().as_millisecond() as u64, &scrapes);
        // Deleted routes are forgotten, but only against a synced cache: an empty store
        // at start-up would wipe the totals of every route.
        if ctx.stores.synced.is_synced() {
            let exists = |id: &ObjectId| {
                ctx.stores
                    .routes
                    .get(&ObjectRef::new(&id.name).within(&id.namespace))
                    .is_some()
            };
            agg.retain_routes(exists);
            ctx.seeds
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|id, _| exists(id));
            ctx.unrendered
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|id, _| exists(id));
        }
        if ctx.stores.synced.is_synced() {
            let exists = |id: &ObjectId| {
                ctx.stores
                    .clients
                    .get(&ObjectRef::new(&id.name).within(&id.namespace))
                    .is_some()
            };
            agg.retain_clients(exists);
            ctx.client_seeds
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|id, _| exists(id));
        }
        let after = Arc::new(agg.snapshot().clone());
        *ctx.proxies.write().unwrap_or_else(|p| p.into_inner()) = after.clone();
        let now_ms = Timestamp::now().as_millisecond().max(0) as u64;
        let overlay = client_overlay(&ctx, &after, now_ms);
        let overlay_changed = *ctx.overlay() != overlay;
        if overlay_changed {
            tracing::info!(
                replicas = overlay.replicas,
                exhausted = overlay.exhausted.len(),
                "client limits or spent budgets changed; re-delivering"
            );
            *ctx.overlay.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(overlay);
            ctx.triggers.delivery.notify_one();
        }
        for c in ctx.stores.clients.state() {
            let id = ObjectId::of(&*c);
            if overlay_changed || before.clients.get(&id) != after.clients.get(&id) {
                let _ = ctx.triggers.clients.send(ObjectRef::from_obj(&*c));
            }
        }

        let all = before.replicas != after.replicas;
        for route in ctx.stores.routes.state() {
            let id = ObjectId::of(&*route);
            if all || before.routes.get(&id) != after.routes.get(&id) {
                let _ = ctx.triggers.routes.send(ObjectRef::from_obj(&*route));
            }
        }
        if ctx.stores.synced.is_synced() {
            events.retain_routes(|id| {
                ctx.stores
                    .routes
                    .get(&ObjectRef::new(&id.name).within(&id.namespace))
                    .is_some()
            });
        }
        for t in events.observe(tokio::time::Instant::now(), transitions) {
            let Some(route) = ctx
                .stores
                .routes
                .get(&ObjectRef::new(&t.route.name).within(&t.route.namespace))
            else {
                continue;
            };
            let target = match &t.model {
                Some(m) => format!("{} (model {m})", t.credential.name),
                None => t.credential.name.clone(),
            };
            let (type_, reason, note) = if t.to == switchback_crds::stats::CircuitState::Open {
                (
                    EventType::Warning,
                    "CircuitOpened",
                    format!(
                        "circuit of target {target} opened on {} proxy replica(s)",
                        t.open_replicas
                    ),
                )
            } else {
                (
                    EventType::Normal,
                    "CircuitClosed",
                    format!("circuit of target {target} closed on every proxy replica"),
                )
            };
            let event = Event {
                type_,
                reason: reason.into(),
                note: Some(note),
                action: "Route".into(),
                secondary: None,
            };
            match ctx.recorder.publish(&event, &route.object_ref(&())).await {
                Ok(()) => ctx.published(reason),
                Err(e) => tracing::warn!(error = %e, "publishing a circuit Event"),
            }
        }
    }
}

/// Waits for a poke (or the resync period), then delivers; retries failures with
/// backoff.
async fn delivery_loop(ctx: Arc<Context>, poke: Arc<Notify>, health: Arc<Health>) {
    ctx.stores.synced.wait().await;
    health
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    tracing::info!("caches synced; delivering");
    let mut backoff = Duration::from_secs(1);
    // When the last delivery may start the next one: as long after it ended as it
    // took. While changes keep coming (a bulk apply), delivery, which renders the
    // whole cluster, then gets at most half the time, and the API server and the
    // status writes the rest; a change after a quiet spell waits only DEBOUNCE.
    let mut next_after = tokio::time::Instant::now();
    loop {
        let quiet = next_after.saturating_duration_since(tokio::time::Instant::now());
        tokio::time::sleep(DEBOUNCE.max(quiet)).await;
        let started = tokio::time::Instant::now();
        let result = deliver(&ctx).await;
        let ended = tokio::time::Instant::now();
        next_after = ended + (ended - started).min(MAX_QUIET);
        match result {
            Ok(()) => backoff = Duration::from_secs(1),
            Err(error) => {
                ctx.failed("delivery", &error);
                tracing::warn!(%error, retry_in = ?backoff, "delivery failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(60));
                poke.notify_one();
            }
        }
        tokio::select! {
            _ = poke.notified() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
    }
}

fn poke_on<T>(poke: Arc<Notify>) -> impl FnMut(&T) + Send + 'static {
    move |_| poke.notify_one()
}

/// What of an LLMRoute or ProviderCredential a rendering reads beyond its spec (which
/// moves its generation): identity and age. Status and managed fields are left out.
fn rendered_part(meta: &kube::api::ObjectMeta) -> u64 {
    let mut h = DefaultHasher::new();
    meta.uid.hash(&mut h);
    meta.generation.hash(&mut h);
    meta.creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .hash(&mut h);
    meta.deletion_timestamp.is_some().hash(&mut h);
    h.finish()
}

/// Pokes delivery on an LLMRoute or ProviderCredential event only when it can change
/// what is rendered: not on a status write. The operator writes about one status per
/// route, and each write comes back through the watch; poking on those would re-render
/// the whole cluster for every one of them during a bulk apply.
#[derive(Default)]
struct RenderedParts {
    seen: HashMap<(Option<String>, String), u64>,
    /// Filled during a relist; replaces `seen` when it completes, so objects deleted
    /// while the watch was down are forgotten.
    relist: Option<HashMap<(Option<String>, String), u64>>,
}

impl RenderedParts {
    /// Whether this event can change the rendering.
    fn changes<K: Resource>(&mut self, event: &watcher::Event<K>) -> bool {
        let key = |obj: &K| (obj.meta().namespace.clone(), obj.name_any());
        match event {
            watcher::Event::Apply(obj) => {
                self.seen.insert(key(obj), rendered_part(obj.meta()))
                    != Some(rendered_part(obj.meta()))
            }
            watcher::Event::Delete(obj) => {
                self.seen.remove(&key(obj));
                true
            }
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                false
            }
            watcher::Event::InitApply(obj) => {
                let part = rendered_part(obj.meta());
                let id = key(obj);
                let changed = self.seen.get(&id) != Some(&part);
                self.relist
                    .get_or_insert_with(HashMap::new)
                    .insert(id, part);
                changed
            }
            watcher::Event::InitDone => {
                if let Some(fresh) = self.relist.take() {
                    self.seen = fresh;
                }
                true
            }
        }
    }
}

fn poke_on_rendered_change<K: Resource>(
    poke: Arc<Notify>,
) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) + Send + 'static {
    let mut parts = RenderedParts::default();
    move |event| {
        if let Ok(event) = event
            && parts.changes(event)
        {
            poke.notify_one();
        }
    }
}

fn receiver_stream<T: Send + 'static>(
    rx: mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
}

/// Runs every watch, the delivery loop, both controllers and the scraper until a
/// shutdown signal.
pub async fn run(
    client: Client,
    settings: Settings,
    scrape: ScrapeOptions,
    metrics: Metrics,
    health: Arc<Health>,
    recorder: Recorder,
) {
    let wc = watcher::Config::default();
    let gw = settings.gateway_namespace.clone();
    let rendered = watcher::Config::default().labels(delivery::LABEL);
    let poke = Arc::new(Notify::new());
    let synced = Synced::default();

    let (routes, w) = reflector::store();
    let route_events =
        reflector::reflector(w, watcher(Api::<LLMRoute>::all(client.clone()), wc.clone()))
            .default_backoff()
            .inspect(synced.on_init_done(Cache::Routes))
            .inspect(poke_on_rendered_change(poke.clone()))
            .applied_objects();
    let (credentials, w) = reflector::store();
    let credential_events = reflector::reflector(
        w,
        watcher(Api::<ProviderCredential>::all(client.clone()), wc.clone()),
    )
    .default_backoff()
    .inspect(synced.on_init_done(Cache::Credentials))
    .inspect(poke_on_rendered_change(poke.clone()))
    .applied_objects();
    let (clients, w) = reflector::store();
    let client_events = reflector::reflector(
        w,
        watcher(Api::<LLMClient>::all(client.clone()), wc.clone()),
    )
    .default_backoff()
    .inspect(synced.on_init_done(Cache::Clients))
    .inspect(poke_on_rendered_change(poke.clone()))
    .applied_objects();
    let (secrets, w) = reflector::store::<PartialObjectMeta<KubeSecret>>();
    let secret_events = {
        let poke = poke.clone();
        let credentials = credentials.clone();
        let clients = clients.clone();
        reflector::reflector(
            w,
            watcher(
                Api::<PartialObjectMeta<KubeSecret>>::all(client.clone()),
                wc.clone(),
            ),
        )
        .default_backoff()
        .inspect(synced.on_init_done(Cache::Secrets))
        .inspect(move |ev| {
            // Only Secrets some credential references matter.
            let touched = match ev {
                Ok(watcher::Event::Apply(s) | watcher::Event::Delete(s)) => {
                    let (ns, name) = (s.namespace(), s.name_any());
                    credentials
                        .state()
                        .iter()
                        .any(|c| c.namespace() == ns && c.spec.secret_ref.name == name)
                        || clients
                            .state()
                            .iter()
                            .any(|c| c.namespace() == ns && c.spec.key_secret_ref.name == name)
                }
                Ok(watcher::Event::InitDone) => true,
                _ => false,
            };
            if touched {
                poke.notify_one();
            }
        })
    };
    let (rendered_maps, w) = reflector::store();
    let map_events = reflector::reflector(
        w,
        watcher(
            Api::<ConfigMap>::namespaced(client.clone(), &gw),
            rendered.clone(),
        ),
    )
    .default_backoff()
    .inspect(synced.on_init_done(Cache::RenderedMaps))
    .inspect(poke_on(poke.clone()));
    let (rendered_secrets, w) = reflector::store();
    let key_events = reflector::reflector(
        w,
        watcher(Api::<KubeSecret>::namespaced(client.clone(), &gw), rendered),
    )
    .default_backoff()
    .inspect(synced.on_init_done(Cache::RenderedSecrets))
    .inspect(poke_on(poke.clone()));

    let (route_tx, route_rx) = mpsc::unbounded_channel();
    let (credential_tx, credential_rx) = mpsc::unbounded_channel();
    let (client_tx, client_rx) = mpsc::unbounded_channel();
    let stores = Stores {
        routes: routes.clone(),
        credentials: credentials.clone(),
        clients: clients.clone(),
        secrets,
        rendered_maps,
        rendered_secrets,
        synced,
    };
    let ctx = Arc::new(Context::new(
        client,
        settings,
        stores,
        metrics,
        recorder,
        Triggers {
            routes: route_tx,
            credentials: credential_tx,
            clients: client_tx,
            delivery: poke.clone(),
        },
    ));

    let background = vec![
        tokio::spawn(secret_events.for_each(|_| async {})),
        tokio::spawn(map_events.for_each(|_| async {})),
        tokio::spawn(key_events.for_each(|_| async {})),
        tokio::spawn(delivery_loop(ctx.clone(), poke.clone(), health)),
        tokio::spawn(scrape_loop(ctx.clone(), scrape)),
    ];
    let config = kube::runtime::controller::Config::default().concurrency(8);
    let route_controller = Controller::for_stream(route_events, routes)
        .reconcile_on(receiver_stream(route_rx))
        .with_config(config.clone())
        .shutdown_on_signal()
        .run(reconcile_route, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "llmroute controller");
            }
        });
    let client_controller = Controller::for_stream(client_events, clients)
        .reconcile_on(receiver_stream(client_rx))
        .with_config(config.clone())
        .shutdown_on_signal()
        .run(reconcile_client, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "llmclient controller");
            }
        });
    let credential_controller = Controller::for_stream(credential_events, credentials)
        .reconcile_on(receiver_stream(credential_rx))
        .with_config(config)
        .shutdown_on_signal()
        .run(reconcile_credential, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "providercredential controller");
            }
        });
    futures_util::join!(route_controller, credential_controller, client_controller);
    for task in background {
        task.abort();
    }
}

#[cfg(test)]
mod tests;

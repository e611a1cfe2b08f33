//! The operator's controllers: what reads the cluster and writes it back. One
//! [`Context`] shared by every reconciler, one [`Error`] with a metric label, one
//! [`error_policy`], in the style of kube-rs/controller-rs.
//!
//! - `watch` ([`run`]): the informer caches and their watch streams, wired to the
//!   delivery loop, one controller per kind and the scrape loop.
//! - `delivery`: level-triggered over the whole cluster, because `compile` is (a
//!   model name belongs to the oldest route in any namespace). Any change to an
//!   LLMRoute, ProviderCredential, LLMClient, referenced Secret or rendered object
//!   re-renders; only objects whose content differs are applied (server-side apply,
//!   field manager [`MANAGER`]), namespaces left without routes lose both objects.
//!   The result is kept as the `World`, and the objects whose facts changed are
//!   queued on their controllers (Secrets are mapped back to their users this way).
//! - `route`, `credential`, `client`: one controller per kind, writing status
//!   computed purely by [`crate::status`], only when it differs, within the write
//!   budget. The credential controller also holds deletion with a finalizer while
//!   routes reference it; the client's lays spent budgets over the rendered clients.
//! - `scrape`: the scrape loop, a round of proxy stats at a time: aggregate, queue
//!   the objects whose facts changed, lay over the clients' usage, publish circuit
//!   Events.
//!
//! It must not know how a status, a rendering or an aggregate is computed: `status`,
//! `render`, `aggregate`, `usage`, `budget` and `circuit_events` are pure, and none of
//! them imports this folder. Nor how a proxy replica is found or read: that is
//! [`crate::scrape`].
//!
//! Only the leader runs any of this (see `leader`).

mod client;
mod credential;
mod delivery;
mod route;
mod scrape;
mod watch;

pub use scrape::ScrapeOptions;
pub use watch::run;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource};
use serde_json::json;
use switchback_crds::config::ObjectId;
use switchback_crds::delivery::DeliveryError;
use switchback_crds::route::TotalStats;
use switchback_crds::{LLMClient, LLMRoute, ProviderCredential};
use tokio::sync::{Notify, mpsc};

use crate::aggregate::Snapshot;
use crate::budget::{Permit, Priority, StatusBudget};
use crate::metrics::{ControllerLabels, ErrorLabels, KindLabels, Metrics, ReasonLabels};
use crate::publish;
use crate::render::ClientOverlay;
use crate::synced::Synced;
use crate::usage::Seed;

use delivery::World;

/// Field manager of every write.
pub const MANAGER: &str = "switchback-operator";
/// Reconcile everything at least this often, whatever the watches say.
const RESYNC: Duration = Duration::from_secs(300);

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
    /// The namespaces whose routes, credentials, clients and Secrets are read.
    pub scope: crate::scope::Scope,
    pub status_interval: Duration,
    pub status_writes_per_second: f64,
    /// `--auth required`: model names resolve per client (docs/tenancy.md#tenancy).
    pub models_per_client: bool,
    /// With `--auth required`, what client keys are hashed with; without, rendered
    /// clients carry no hash and nobody authenticates with them.
    pub client_key_hasher: Option<Arc<switchback_crds::keyhash::KeyHasher>>,
    /// Where credentials may set `allowPrivateNetwork: true`
    /// (`--allow-private-network-namespaces`; docs/security.md#where-the-proxies-connect).
    pub private_networks: switchback_crds::network::PrivateNetworks,
    /// How a namespace's config is split into ConfigMaps (`--max-config-parts`).
    pub part_limits: switchback_crds::delivery::PartLimits,
    /// The Role in the gateway namespace whose rules the operator keeps to `get` on
    /// exactly the rendered objects (`--proxy-reader-role`); none: no Role is kept.
    pub proxy_reader_role: Option<String>,
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
    /// The namespaces whose last delivery failed, with their backoff.
    failures: Mutex<BTreeMap<String, crate::publish::Failure>>,
    /// The reader Role's rules as last applied, and when.
    reader_role: Mutex<Option<(Vec<PolicyRule>, tokio::time::Instant)>>,
    /// What this process delivered last: the index it wrote and the revision key of
    /// each namespace, ahead of the caches, which may not have seen them yet.
    delivered: Mutex<Option<publish::Written>>,
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
            failures: Mutex::new(BTreeMap::new()),
            reader_role: Mutex::new(None),
            delivered: Mutex::new(None),
        }
    }

    /// The namespaces whose last delivery failed.
    fn failures(&self) -> BTreeMap<String, crate::publish::Failure> {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
}

/// The `controller` label of kind `K`'s metrics and logs.
fn controller_of<K: Resource<DynamicType = ()>>() -> &'static str {
    match K::kind(&()).as_ref() {
        "LLMRoute" => "llmroute",
        "LLMClient" => "llmclient",
        _ => "providercredential",
    }
}

/// The cache key of the object `id` names.
fn object_ref<K: Resource<DynamicType = ()>>(id: &ObjectId) -> ObjectRef<K> {
    ObjectRef::new(&id.name).within(&id.namespace)
}

/// Now, to the second (the API stores times to the second).
fn now() -> Time {
    Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now()))
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

/// The one error policy: count, log, retry with a short delay (a 409 right away).
pub fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<K>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    ctx.failed(controller_of::<K>(), error);
    tracing::warn!(object = %ObjectId::of(&*obj), %error, "reconcile failed");
    match error {
        e if e.is_conflict() => Action::requeue(Duration::from_millis(200)),
        _ => Action::requeue(Duration::from_secs(5)),
    }
}

#[cfg(test)]
mod tests;

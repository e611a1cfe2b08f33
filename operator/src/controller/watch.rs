//! The watches and their wiring: one reflector per cached kind, the pokes that wake
//! delivery, and [`run`], which starts the delivery loop, one controller per kind and
//! the scrape loop on them.
//!
//! Which namespaces a kind is watched in is said in one place, [`watch_kind`]: those of
//! [`Settings::scope`] (every namespace, or `--watch-namespaces`).

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use kube::api::PartialObjectMeta;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use switchback_crds::delivery;
use switchback_crds::{LLMClient, LLMRoute, ProviderCredential};
use tokio::sync::{Notify, mpsc};

use super::client::reconcile_client;
use super::credential::reconcile_credential;
use super::delivery::delivery_loop;
use super::route::reconcile_route;
use super::scrape::{ScrapeOptions, scrape_loop};
use super::{Context, Error, Settings, Stores, Triggers, controller_of, error_policy};
use crate::metrics::{Health, Metrics};
use crate::scope::Scope;
use crate::synced::{Cache, Synced};

/// Runs every watch, the delivery loop, the three controllers and the scraper until a
/// shutdown signal.
pub async fn run(
    client: Client,
    settings: Settings,
    scrape: ScrapeOptions,
    metrics: Metrics,
    health: Arc<Health>,
    recorder: Recorder,
) {
    let poke = Arc::new(Notify::new());
    let synced = Synced::default();
    let watch = Watch {
        client: &client,
        scope: &settings.scope,
        synced: &synced,
    };
    let (routes, route_objects) = watch_reconciled::<LLMRoute>(&watch, Cache::Routes, &poke);
    let (credentials, credential_objects) =
        watch_reconciled::<ProviderCredential>(&watch, Cache::Credentials, &poke);
    let (clients, client_objects) = watch_reconciled::<LLMClient>(&watch, Cache::Clients, &poke);
    let (secrets, secret_events) = watch_referenced_secrets(&watch, &poke, &credentials, &clients);
    let gw = &settings.gateway_namespace;
    let (rendered_maps, map_events) =
        watch_rendered::<ConfigMap>(&client, gw, &synced, Cache::RenderedMaps, &poke);
    let (rendered_secrets, key_events) =
        watch_rendered::<KubeSecret>(&client, gw, &synced, Cache::RenderedSecrets, &poke);

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

    // A JoinSet aborts its tasks when dropped: a leader that stops leading drops this
    // future, and delivery and the scrape loop must stop with it
    // (docs/security.md#one-operator-acts-at-a-time: two leaders never act at once), not
    // run on as detached tasks.
    let mut background = tokio::task::JoinSet::new();
    background.spawn(secret_events.for_each(|_| async {}));
    background.spawn(map_events.for_each(|_| async {}));
    background.spawn(key_events.for_each(|_| async {}));
    background.spawn(delivery_loop(ctx.clone(), poke.clone(), health));
    background.spawn(scrape_loop(ctx.clone(), scrape));
    futures_util::join!(
        control(
            route_objects,
            routes,
            route_rx,
            reconcile_route,
            ctx.clone()
        ),
        control(
            credential_objects,
            credentials,
            credential_rx,
            reconcile_credential,
            ctx.clone()
        ),
        control(
            client_objects,
            clients,
            client_rx,
            reconcile_client,
            ctx.clone()
        ),
    );
    background.abort_all();
}

/// What a watched kind must be: a cached, deserialisable Kubernetes object.
trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// What the watches of the operator's own kinds (and their Secrets) share.
struct Watch<'a> {
    client: &'a Client,
    scope: &'a Scope,
    synced: &'a Synced,
}

/// The watch of every object of kind `K` the operator reads, in the namespaces of the
/// scope (one `Api` for the whole cluster, or one per watched namespace, merged). This
/// alone decides which namespaces a kind is watched in.
fn watch_kind<K: Watched<Scope = NamespaceResourceScope>>(
    watch: &Watch<'_>,
    cache: Cache,
) -> (
    Store<K>,
    impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K>,
) {
    let (store, writer) = reflector::store();
    let events = reflector::reflector(
        writer,
        watch
            .scope
            .watch::<K>(watch.client, watcher::Config::default()),
    )
    .default_backoff()
    .inspect(watch.synced.on_init_done(cache));
    (store, events)
}

/// A cache of what `api` lists under `config`, kept by its watch (retried with kube's
/// default backoff); each full list marks `cache` listed in `synced`.
fn reflect<K: Watched>(
    api: Api<K>,
    config: watcher::Config,
    synced: &Synced,
    cache: Cache,
) -> (
    Store<K>,
    impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K>,
) {
    let (store, writer) = reflector::store();
    let events = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .inspect(synced.on_init_done(cache));
    (store, events)
}

/// A kind with a controller (LLMRoute, ProviderCredential, LLMClient): its cache, and
/// its objects as they change, to drive the controller. An event pokes delivery only
/// when it can change what is rendered (see [`RenderedParts`]).
fn watch_reconciled<K: Watched<Scope = NamespaceResourceScope>>(
    watch: &Watch<'_>,
    cache: Cache,
    poke: &Arc<Notify>,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + use<K>,
) {
    let (store, events) = watch_kind(watch, cache);
    let objects = events
        .inspect(poke_on_rendered_change(poke.clone()))
        .applied_objects();
    (store, objects)
}

/// Secrets, metadata only (delivery fetches the data of referenced Secrets alone): a
/// change pokes delivery when a credential or client references the Secret.
fn watch_referenced_secrets(
    watch: &Watch<'_>,
    poke: &Arc<Notify>,
    credentials: &Store<ProviderCredential>,
    clients: &Store<LLMClient>,
) -> (
    Store<PartialObjectMeta<KubeSecret>>,
    impl Stream<Item = watcher::Result<watcher::Event<PartialObjectMeta<KubeSecret>>>> + Send + use<>,
) {
    let (store, events) = watch_kind::<PartialObjectMeta<KubeSecret>>(watch, Cache::Secrets);
    let poke = poke.clone();
    let credentials = credentials.clone();
    let clients = clients.clone();
    let events = events.inspect(move |ev| {
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
    });
    (store, events)
}

/// What delivery wrote into the gateway namespace (found by its label): any change
/// pokes delivery, which puts back what it did not write.
fn watch_rendered<K>(
    client: &Client,
    namespace: &str,
    synced: &Synced,
    cache: Cache,
    poke: &Arc<Notify>,
) -> (
    Store<K>,
    impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K>,
)
where
    K: Watched + Resource<Scope = NamespaceResourceScope>,
{
    let config = watcher::Config::default().labels(delivery::LABEL);
    let (store, events) = reflect(
        Api::namespaced(client.clone(), namespace),
        config,
        synced,
        cache,
    );
    (store, events.inspect(poke_on(poke.clone())))
}

/// Runs the controller of one kind until a shutdown signal: it reconciles an object
/// on its watch events and whenever delivery or the scrape loop queue it.
async fn control<K, F>(
    objects: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    store: Store<K>,
    queued: mpsc::UnboundedReceiver<ObjectRef<K>>,
    reconcile: impl FnMut(Arc<K>, Arc<Context>) -> F,
    ctx: Arc<Context>,
) where
    K: Watched,
    F: Future<Output = Result<Action, Error>> + Send + 'static,
{
    Controller::for_stream(objects, store)
        .reconcile_on(receiver_stream(queued))
        .with_config(Config::default().concurrency(8))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "{} controller", controller_of::<K>());
            }
        })
        .await;
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
pub(super) struct RenderedParts {
    seen: HashMap<(Option<String>, String), u64>,
    /// Filled during a relist; replaces `seen` when it completes, so objects deleted
    /// while the watch was down are forgotten.
    relist: Option<HashMap<(Option<String>, String), u64>>,
}

impl RenderedParts {
    /// Whether this event can change the rendering.
    pub(super) fn changes<K: Resource>(&mut self, event: &watcher::Event<K>) -> bool {
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

//! Delivery: renders the whole cluster into one ConfigMap and one keys Secret per
//! namespace with routes, applies what differs, deletes what is no longer wanted, and
//! keeps the result as the [`World`] the reconcilers read. Level-triggered, debounced
//! and retried with backoff by [`delivery_loop`]; what is rendered is
//! [`crate::render`]'s to decide.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use switchback_crds::compile::{Inputs, Kind};
use switchback_crds::config::{CompiledConfig, ObjectId};
use switchback_crds::delivery::{self, NamespaceConfig};
use switchback_crds::{LLMClient, LLMRoute, ProviderCredential};
use tokio::sync::{Notify, mpsc};

use super::credential::users;
use super::{Context, Error, MANAGER, RESYNC, object_ref};
use crate::metrics::Health;
use crate::render::{Rendering, render};

/// Quiet time collecting changes before one delivery.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// The longest quiet time a slow delivery sets for the next one.
const MAX_QUIET: Duration = Duration::from_secs(1);
/// Namespaces whose rendered objects are written at once.
const DELIVERY_WRITERS: usize = 8;

/// The last delivery: the rendering plus digests of each object's facts.
pub struct World {
    pub rendering: Rendering,
    route_digests: HashMap<ObjectId, u64>,
    credential_digests: HashMap<ObjectId, u64>,
    client_digests: HashMap<ObjectId, u64>,
    /// When each route's `Served` (generation and revision) was first delivered, to
    /// tell how long the proxies have had to load it.
    pub(super) served_since: HashMap<ObjectId, tokio::time::Instant>,
    /// The generation of each LLMRoute this rendering was computed from.
    pub(super) generations: HashMap<ObjectId, i64>,
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

/// Re-renders every namespace, applies what differs, deletes what is no longer wanted,
/// and queues the routes and credentials whose facts changed.
pub async fn deliver(ctx: &Context) -> Result<(), Error> {
    ctx.reconciled("delivery");
    let routes = cached(&ctx.stores.routes);
    let credentials = cached(&ctx.stores.credentials);
    let clients = cached(&ctx.stores.clients);
    let secrets = referenced_secrets(ctx, &credentials, &clients).await?;
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
            private_networks: &ctx.settings.private_networks,
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
    delete_stale(ctx, &rendering, &rendered_maps, &maps, &keys).await?;

    let world = World::new(rendering, &routes, &credentials, &clients)
        .dated(ctx.world().as_deref(), tokio::time::Instant::now());
    remember(ctx, world);
    Ok(())
}

/// A copy of everything a cache holds.
fn cached<K>(store: &Store<K>) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

/// Deletes the rendered objects (ours only) of namespaces no longer rendered.
async fn delete_stale(
    ctx: &Context,
    rendering: &Rendering,
    rendered_maps: &[Arc<ConfigMap>],
    maps: &Api<ConfigMap>,
    keys: &Api<KubeSecret>,
) -> Result<(), Error> {
    let stale = |name: &str, prefix: &'static str| {
        delivery::source_namespace(name, prefix)
            .map(|ns| !rendering.namespaces.contains_key(ns))
            .unwrap_or(false)
    };
    for cm in rendered_maps {
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
    Ok(())
}

/// Keeps `world` as the last delivery and queues the objects whose facts changed
/// since the one before (none on the first).
fn remember(ctx: &Context, world: World) {
    let world = Arc::new(world);
    let old = ctx
        .world
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .replace(world.clone());
    if let Some(old) = old {
        let (routes, credentials, clients) = world.changed(&old);
        queue(&ctx.triggers.clients, clients);
        queue(&ctx.triggers.routes, routes);
        queue(&ctx.triggers.credentials, credentials);
    }
}

fn queue<K: Resource<DynamicType = ()>>(
    controller: &mpsc::UnboundedSender<ObjectRef<K>>,
    ids: Vec<ObjectId>,
) {
    for id in ids {
        let _ = controller.send(object_ref(&id));
    }
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

/// Full copies of the Secrets the credentials and clients reference, fetched when
/// their resourceVersion changed; absent Secrets are left out.
async fn referenced_secrets(
    ctx: &Context,
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
        let mut cache = ctx.secret_cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|id, _| wanted.contains(id));
        for id in &wanted {
            let meta = ctx.stores.secrets.get(&object_ref(id));
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
        let api: Api<KubeSecret> = Api::namespaced(ctx.client.clone(), &id.namespace);
        let got = api.get_opt(&id.name).await?;
        let mut cache = ctx.secret_cache.lock().unwrap_or_else(|p| p.into_inner());
        match got {
            Some(secret) => cache.insert(id, secret),
            None => cache.remove(&id),
        };
    }
    let cache = ctx.secret_cache.lock().unwrap_or_else(|p| p.into_inner());
    Ok(cache.values().cloned().collect())
}

/// Waits for a poke (or the resync period), then delivers; retries failures with
/// backoff.
pub(super) async fn delivery_loop(ctx: Arc<Context>, poke: Arc<Notify>, health: Arc<Health>) {
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

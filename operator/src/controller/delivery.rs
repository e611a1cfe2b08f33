//! Delivery: renders the whole cluster, writes each namespace's objects (its parts and
//! keys Secret) on its own, names what was written in the index, deletes what is no
//! longer named, keeps the proxies' reader Role to exactly the named objects, and
//! keeps the result as the [`World`] the reconcilers read. Level-triggered, debounced
//! and retried with backoff by [`delivery_loop`]; what is rendered is
//! [`crate::render`]'s to decide, what is published [`crate::publish`]'s.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use switchback_crds::compile::{Inputs, Kind};
use switchback_crds::config::{CompiledConfig, ObjectId};
use switchback_crds::delivery::index::{self, Entry, Index};
use switchback_crds::delivery::{self, NamespaceObjects};
use switchback_crds::{LLMClient, LLMRoute, ProviderCredential};
use tokio::sync::{Notify, mpsc};

use super::credential::users;
use super::{Context, Error, MANAGER, RESYNC, object_ref};
use crate::metrics::Health;
use crate::publish::{self, Attempt};
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
    /// The namespaces whose rendering is not delivered (they keep their last delivered
    /// version), with why.
    pub(super) undelivered: BTreeMap<String, String>,
}

impl World {
    pub fn new(
        rendering: Rendering,
        routes: &[LLMRoute],
        credentials: &[ProviderCredential],
        clients: &[LLMClient],
        undelivered: BTreeMap<String, String>,
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
                // alone re-queues the routes using it, so Programmed is recomputed;
                // so does its namespace's delivery failing or recovering.
                let served = rendering.served.get(&id).copied();
                let failed = undelivered.get(&id.namespace);
                let d = digest(Kind::LLMRoute, &id, &|h| (served, failed).hash(h));
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
            undelivered,
        }
    }

    /// Why `namespace`'s rendering is not delivered, if it is not.
    pub fn undelivered(&self, namespace: &str) -> Option<&str> {
        self.undelivered.get(namespace).map(String::as_str)
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

/// Re-renders every namespace and publishes it: each namespace's new objects are
/// written on their own (a failure stays that namespace's: it keeps its index entry,
/// its last delivered version, and is retried after a backoff), then the index names
/// what was written, then what no longer is named is deleted. The proxies' reader Role
/// grants the new objects before the index names them. Queues the routes and
/// credentials whose facts changed. Fails only on what no namespace decides: reading
/// the referenced Secrets, the Role, the index, or a delete.
pub async fn deliver(ctx: &Context) -> Result<(), Error> {
    ctx.reconciled("delivery");
    let routes = cached(&ctx.stores.routes);
    let credentials = cached(&ctx.stores.credentials);
    let clients = cached(&ctx.stores.clients);
    let secrets = referenced_secrets(ctx, &credentials, &clients).await?;
    let rendered_maps = ctx.stores.rendered_maps.state();
    let rendered_secrets = ctx.stores.rendered_secrets.state();
    let written = ctx
        .delivered
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let delivered =
        publish::delivered(&rendered_maps, &rendered_secrets).with_written(written.as_ref());
    let namespaces: BTreeSet<String> = routes
        .iter()
        .filter_map(|r| r.namespace())
        .chain(clients.iter().filter_map(|c| c.namespace()))
        .collect();
    let revision_keys = publish::revision_keys(
        namespaces.iter().map(String::as_str),
        &delivered,
        written.as_ref(),
    );
    let previous: BTreeMap<String, CompiledConfig> = delivered
        .namespaces
        .iter()
        .map(|(ns, d)| (ns.clone(), d.config.clone()))
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
        &revision_keys,
    );
    rendering.lay_over(&ctx.overlay());

    let now = tokio::time::Instant::now();
    let attempts = publish::attempts(
        &ctx.settings.gateway_namespace,
        &rendering.namespaces,
        &ctx.failures(),
        ctx.settings.part_limits,
        now,
    );
    let wanted = Names::wanted(&attempts);
    let old_names = delivered.index.as_ref().map(Names::of).unwrap_or_default();
    // Before the index names a new object, the proxies may read it.
    ensure_reader_role(ctx, &old_names.union(&wanted)).await?;
    let outcomes = write_namespaces(ctx, &attempts).await;
    let written: BTreeMap<String, Entry> = outcomes
        .iter()
        .filter_map(|(ns, o)| o.as_ref().ok().map(|e| (ns.clone(), e.clone())))
        .collect();
    let index = publish::next_index(
        delivered.index.as_ref(),
        rendering.namespaces.keys(),
        &written,
    );
    if delivered.index.as_ref() != Some(&index) {
        let cm = index::index_config_map(&ctx.settings.gateway_namespace, &index);
        let api: Api<ConfigMap> =
            Api::namespaced(ctx.client.clone(), &ctx.settings.gateway_namespace);
        api.patch(index::INDEX_NAME, &apply(), &Patch::Apply(&cm))
            .await?;
        ctx.wrote(&ctx.metrics.config_writes, "Index");
    }
    *ctx.delivered.lock().unwrap_or_else(|p| p.into_inner()) = Some(publish::Written {
        index: index.clone(),
        revision_keys,
    });
    let named = Names::of(&index);
    delete_stale(
        ctx,
        &named.union(&wanted),
        &rendered_maps,
        &rendered_secrets,
    )
    .await?;
    ensure_reader_role(ctx, &named).await?;

    let failed = record_failures(ctx, &rendering, &attempts, outcomes, now);
    let world = World::new(rendering, &routes, &credentials, &clients, failed)
        .dated(ctx.world().as_deref(), tokio::time::Instant::now());
    remember(ctx, world);
    Ok(())
}

fn apply() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// A copy of everything a cache holds.
fn cached<K>(store: &Store<K>) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

/// Rendered objects by name: ConfigMaps (parts) and Secrets (keys) apart.
#[derive(Clone, Debug, Default, PartialEq)]
struct Names {
    maps: BTreeSet<String>,
    secrets: BTreeSet<String>,
}

impl Names {
    /// What `index` names.
    fn of(index: &Index) -> Names {
        let (maps, secrets) = index.names();
        Names {
            maps: maps.into_iter().map(str::to_string).collect(),
            secrets: secrets.into_iter().map(str::to_string).collect(),
        }
    }

    /// What this delivery's attempts write.
    fn wanted(attempts: &BTreeMap<String, Attempt>) -> Names {
        let mut names = Names::default();
        for attempt in attempts.values() {
            if let Attempt::Write(objects) = attempt {
                names
                    .maps
                    .extend(objects.parts.iter().map(|p| p.name_any()));
                names.secrets.insert(objects.keys.name_any());
            }
        }
        names
    }

    fn union(&self, other: &Names) -> Names {
        Names {
            maps: self.maps.union(&other.maps).cloned().collect(),
            secrets: self.secrets.union(&other.secrets).cloned().collect(),
        }
    }
}

/// Applies the proxies' reader Role (`--proxy-reader-role`) with `get` on exactly
/// `names`, when it differs from what was last applied or that was a resync period
/// ago (someone may have emptied it).
async fn ensure_reader_role(ctx: &Context, names: &Names) -> Result<(), Error> {
    let Some(role) = &ctx.settings.proxy_reader_role else {
        return Ok(());
    };
    let rules = publish::reader_rules(&names.maps, &names.secrets);
    let now = tokio::time::Instant::now();
    let fresh = ctx
        .reader_role
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|(applied, at)| applied == &rules && now.duration_since(*at) < RESYNC);
    if fresh {
        return Ok(());
    }
    let api: Api<Role> = Api::namespaced(ctx.client.clone(), &ctx.settings.gateway_namespace);
    // Only the rules: the Role itself (labels, its binding) is the chart's.
    let patch = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": role},
        "rules": rules,
    });
    api.patch(role, &apply(), &Patch::Apply(&patch)).await?;
    ctx.wrote(&ctx.metrics.config_writes, "Role");
    *ctx.reader_role.lock().unwrap_or_else(|p| p.into_inner()) = Some((rules, now));
    Ok(())
}

/// Writes each namespace's attempt, namespaces at once: per namespace, the index entry
/// of what it wrote, or why it failed.
async fn write_namespaces(
    ctx: &Context,
    attempts: &BTreeMap<String, Attempt>,
) -> BTreeMap<String, Result<Entry, (&'static str, String)>> {
    // Collected first: a lazy iterator of borrowing futures in a spawned task trips
    // the compiler's `Send` check.
    let writes: Vec<_> = attempts
        .iter()
        .filter_map(|(ns, attempt)| match attempt {
            Attempt::Write(objects) => Some(write_one(ctx, ns, objects)),
            Attempt::Wait | Attempt::Refused(..) => None,
        })
        .collect();
    let mut writes = futures_util::stream::iter(writes).buffer_unordered(DELIVERY_WRITERS);
    let mut outcomes = BTreeMap::new();
    while let Some((ns, outcome)) = writes.next().await {
        outcomes.insert(ns, outcome);
    }
    outcomes
}

async fn write_one(
    ctx: &Context,
    ns: &str,
    objects: &NamespaceObjects,
) -> (String, Result<Entry, (&'static str, String)>) {
    let written = write_namespace(ctx, objects).await;
    (ns.to_string(), written.map(|()| objects.entry()))
}

/// Writes one namespace's keys Secret, then its parts, each only when the cache does
/// not hold it already (a name stands for one content). The error: the metric reason
/// and the API's message, naming the object.
async fn write_namespace(
    ctx: &Context,
    objects: &NamespaceObjects,
) -> Result<(), (&'static str, String)> {
    let gw = &ctx.settings.gateway_namespace;
    let failed = |kind: &str, name: &str, e: kube::Error| {
        let (code, message) = match &e {
            kube::Error::Api(s) => (Some(s.code), s.message.clone()),
            other => (None, other.to_string()),
        };
        (
            publish::api_reason(code),
            format!("writing {kind} {gw}/{name}: {message}"),
        )
    };
    let keys: Api<KubeSecret> = Api::namespaced(ctx.client.clone(), gw);
    let name = objects.keys.name_any();
    let current = ctx
        .stores
        .rendered_secrets
        .get(&ObjectRef::new(&name).within(gw));
    if current.is_none_or(|c| c.data != objects.keys.data || !has_labels(&*c, &objects.keys)) {
        keys.patch(&name, &apply(), &Patch::Apply(&objects.keys))
            .await
            .map_err(|e| failed("Secret", &name, e))?;
        ctx.wrote(&ctx.metrics.config_writes, "Secret");
    }
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), gw);
    for part in &objects.parts {
        let name = part.name_any();
        let current = ctx
            .stores
            .rendered_maps
            .get(&ObjectRef::new(&name).within(gw));
        if current.is_none_or(|c| c.data != part.data || !has_labels(&*c, part)) {
            maps.patch(&name, &apply(), &Patch::Apply(part))
                .await
                .map_err(|e| failed("ConfigMap", &name, e))?;
            ctx.wrote(&ctx.metrics.config_writes, "ConfigMap");
        }
    }
    Ok(())
}

/// Deletes the rendered objects (ours only) that `keep` does not name: earlier
/// versions, namespaces no longer rendered, what a failed attempt left behind.
async fn delete_stale(
    ctx: &Context,
    keep: &Names,
    rendered_maps: &[Arc<ConfigMap>],
    rendered_secrets: &[Arc<KubeSecret>],
) -> Result<(), Error> {
    let gw = &ctx.settings.gateway_namespace;
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), gw);
    let keys: Api<KubeSecret> = Api::namespaced(ctx.client.clone(), gw);
    let ours = |name: &str, prefix: &'static str| delivery::source_namespace(name, prefix).is_ok();
    for cm in rendered_maps {
        let name = cm.name_any();
        if ours(&name, delivery::ROUTES_PREFIX) && managed(&**cm) && !keep.maps.contains(&name) {
            ignore_not_found(maps.delete(&name, &DeleteParams::default()).await)?;
            ctx.wrote(&ctx.metrics.config_writes, "ConfigMapDelete");
        }
    }
    for s in rendered_secrets {
        let name = s.name_any();
        if ours(&name, delivery::KEYS_PREFIX) && managed(&**s) && !keep.secrets.contains(&name) {
            ignore_not_found(keys.delete(&name, &DeleteParams::default()).await)?;
            ctx.wrote(&ctx.metrics.config_writes, "SecretDelete");
        }
    }
    Ok(())
}

/// Keeps each namespace's failure (or forgets it), counts it, and returns the message
/// of each namespace whose rendering is not delivered now.
fn record_failures(
    ctx: &Context,
    rendering: &Rendering,
    attempts: &BTreeMap<String, Attempt>,
    mut outcomes: BTreeMap<String, Result<Entry, (&'static str, String)>>,
    now: tokio::time::Instant,
) -> BTreeMap<String, String> {
    let mut failures = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
    let mut next = BTreeMap::new();
    for (ns, attempt) in attempts {
        let failed = match (attempt, outcomes.remove(ns)) {
            (Attempt::Wait, _) => {
                // Still waiting: the failure stands as it is.
                if let Some(f) = failures.remove(ns) {
                    next.insert(ns.clone(), f);
                }
                continue;
            }
            (Attempt::Refused(reason, message), _) => (*reason, message.clone()),
            (Attempt::Write(_), Some(Err(why))) => why,
            (Attempt::Write(_), _) => continue,
        };
        let (reason, message) = failed;
        let failure = publish::Failure::next(
            failures.get(ns),
            &rendering.namespaces[ns],
            reason,
            message,
            now,
        );
        ctx.metrics.delivery_failed(ns, failure.reason);
        tracing::warn!(
            namespace = %ns,
            reason = failure.reason,
            error = %failure.message,
            retry_in = ?failure.retry_at.saturating_duration_since(now),
            "namespace not delivered; it keeps its last delivered version"
        );
        next.insert(ns.clone(), failure);
    }
    *failures = next;
    ctx.metrics
        .namespaces_undelivered
        .set(i64::try_from(failures.len()).unwrap_or(i64::MAX));
    failures
        .iter()
        .map(|(ns, f)| (ns.clone(), f.message.clone()))
        .collect()
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

/// Waits for a poke (the resync period, or the end of a namespace's backoff), then
/// delivers; retries a failed delivery with backoff (a failed namespace has its own, in
/// `Context::failures`).
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
        // A namespace waiting out its backoff is tried again when it ends.
        let retry = ctx
            .failures()
            .values()
            .map(|f| f.retry_at)
            .min()
            .unwrap_or_else(|| tokio::time::Instant::now() + RESYNC);
        tokio::select! {
            _ = poke.notified() => {}
            _ = tokio::time::sleep_until(retry.min(tokio::time::Instant::now() + RESYNC)) => {}
        }
    }
}

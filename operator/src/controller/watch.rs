//! The watches and their wiring: one reflector per cached kind, the pokes that wake
//! delivery, and [`run`], which starts the delivery loop, one controller per kind
//! and the scrape loop on them.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use kube::api::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::events::Recorder;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use switchback_crds::delivery;
use switchback_crds::{LLMClient, LLMRoute, ProviderCredential};
use tokio::sync::{Notify, mpsc};

use super::client::reconcile_client;
use super::credential::reconcile_credential;
use super::delivery::delivery_loop;
use super::route::reconcile_route;
use super::scrape::{ScrapeOptions, scrape_loop};
use super::{Context, Settings, Stores, Triggers, error_policy};
use crate::metrics::{Health, Metrics};
use crate::synced::{Cache, Synced};

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

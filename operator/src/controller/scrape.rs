//! The scrape loop: a round at a time, reads every proxy replica's stats (found and
//! read by [`crate::scrape`]), aggregates them, and hands what changed to the
//! controllers: the routes and clients to re-queue, the overlay to re-deliver, the
//! circuit Events to publish; and writes the fleet's health view (`fleet`) when due.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use switchback_crds::config::ObjectId;
use switchback_crds::stats::CircuitState;

use super::client::refresh_overlay;
use super::{Context, object_ref};
use crate::aggregate::{Aggregator, Scrape, Snapshot, Transition};
use switchback_crds::admintoken::AdminToken;

use crate::circuit_events::CircuitEvents;
use crate::fleet;
use crate::metrics::ResultLabels;
use crate::scrape::{self, Found, Refusals, Replicas};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use switchback_crds::delivery;
use switchback_crds::fleet::{DATA_KEY, VIEW_NAME};

/// How the proxies are found and their stats read.
#[derive(Clone, Debug)]
pub struct ScrapeOptions {
    pub replicas: Replicas,
    pub interval: Duration,
    pub window: Duration,
    /// The proxies' admin token (a file or a Secret), sent on every scrape.
    pub admin_token: Option<crate::bootstrap::AdminTokenSource>,
    /// How long the fleet's health view holds (`--fleet-view-ttl`); zero: none is
    /// written.
    pub fleet_view_ttl: Duration,
}

/// Scrapes the proxies forever: aggregate, queue routes and clients whose facts
/// changed, lay the clients' usage over the rendering, publish circuit Events (as
/// `circuit_events` decides: every change, flapping held back).
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
    let mut refusals = Refusals::default();
    let mut fleet_written: Option<fleet::Written> = None;
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
        let token = opts.admin_token.as_ref().and_then(|t| t.current());
        // The round's id: this operator's clock at its start (later rounds, and a
        // later leader's, have larger ones).
        let round = Timestamp::now().as_millisecond().max(1) as u64;
        let scrapes = scrape_all(
            &ctx,
            &http,
            &endpoints,
            token.as_deref(),
            round,
            &mut refusals,
        )
        .await;
        let before = ctx.proxies();
        let transitions = agg.observe(Timestamp::now().as_millisecond() as u64, &scrapes);
        write_fleet_view(&ctx, &scrapes, opts.fleet_view_ttl, &mut fleet_written).await;
        forget_deleted(&ctx, &mut agg, &mut events);
        let mut after = agg.snapshot().clone();
        after.round = round;
        let after = Arc::new(after);
        *ctx.proxies.write().unwrap_or_else(|p| p.into_inner()) = after.clone();
        let overlay_changed = refresh_overlay(&ctx, &after);
        queue_changed(&ctx, &before, &after, overlay_changed);
        let transitions = events.observe(tokio::time::Instant::now(), transitions);
        publish_circuit_events(&ctx, transitions).await;
    }
}

/// Scrapes every replica at once in round `round`, counted by result (each scrape,
/// and the replicas of the round: `switchback_operator_proxy_replicas`); a replica
/// that starts refusing the token is logged once. A terminating replica is read for
/// its counts (its report marked draining); once it does not answer, it has exited
/// and is no replica any more.
async fn scrape_all(
    ctx: &Context,
    http: &reqwest::Client,
    endpoints: &[Found],
    token: Option<&AdminToken>,
    round: u64,
    refusals: &mut Refusals,
) -> Vec<Scrape> {
    let scrapes = futures_util::future::join_all(endpoints.iter().map(|e| async move {
        let mut s = scrape::scrape(http, &e.url, token, round).await;
        if e.terminating {
            match &mut s.result {
                Ok(report) => report.draining = true,
                Err(error) => {
                    tracing::debug!(replica = %e.url, %error, "a terminating proxy replica is gone");
                    return None;
                }
            }
        }
        Some(s)
    }))
    .await;
    let scrapes: Vec<Scrape> = scrapes.into_iter().flatten().collect();
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
    let read = scrapes.iter().filter(|s| s.result.is_ok()).count();
    ctx.metrics.proxy_replicas_seen(read, scrapes.len() - read);
    scrapes
}

/// Writes the fleet's health view ([`fleet`]) of this round's ready replicas when it
/// is due: changed, or to be refreshed before it expires. A failed write is tried
/// again next round.
pub(super) async fn write_fleet_view(
    ctx: &Context,
    scrapes: &[Scrape],
    ttl: Duration,
    written: &mut Option<fleet::Written>,
) {
    if ttl.is_zero() {
        return;
    }
    let reports: Vec<_> = scrapes
        .iter()
        .filter_map(|s| s.result.as_ref().ok())
        .filter(|r| !r.draining)
        .collect();
    let now_ms = Timestamp::now().as_millisecond() as u64;
    let ttl_ms = ttl.as_millis() as u64;
    let content = fleet::view(&reports, now_ms, written.as_ref().map(|w| &w.content));
    if !fleet::due(written.as_ref(), &content, now_ms, ttl_ms) {
        return;
    }
    let view = fleet::stamped(&content, now_ms, ttl_ms);
    let gw = &ctx.settings.gateway_namespace;
    let cm = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": VIEW_NAME,
            "namespace": gw,
            "labels": { delivery::MANAGED_BY_LABEL: delivery::MANAGED_BY },
        },
        "data": { DATA_KEY: serde_json::to_string(&view).unwrap_or_default() },
    });
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), gw);
    let params = PatchParams::apply(super::MANAGER).force();
    match api.patch(VIEW_NAME, &params, &Patch::Apply(&cm)).await {
        Ok(_) => {
            ctx.wrote(&ctx.metrics.config_writes, "FleetView");
            *written = Some(fleet::Written {
                content,
                at_ms: now_ms,
            });
        }
        Err(e) => tracing::warn!(error = %e, "writing the fleet's health view {VIEW_NAME}"),
    }
}

/// Forgets what is kept about deleted routes and clients, but only against synced
/// caches: an empty store at start-up would wipe the totals of every route.
fn forget_deleted(ctx: &Context, agg: &mut Aggregator, events: &mut CircuitEvents) {
    if !ctx.stores.synced.is_synced() {
        return;
    }
    let route_exists = |id: &ObjectId| exists(&ctx.stores.routes, id);
    agg.retain_routes(route_exists);
    ctx.metrics.route_programmed.retain(route_exists);
    retain(&ctx.seeds, route_exists);
    retain(&ctx.unrendered, route_exists);
    events.retain_routes(route_exists);
    let client_exists = |id: &ObjectId| exists(&ctx.stores.clients, id);
    agg.retain_clients(client_exists);
    retain(&ctx.client_seeds, client_exists);
}

fn exists<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>, id: &ObjectId) -> bool {
    store.get(&object_ref(id)).is_some()
}

fn retain<V>(kept: &Mutex<HashMap<ObjectId, V>>, exists: impl Fn(&ObjectId) -> bool) {
    kept.lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|id, _| exists(id));
}

/// Queues the clients and routes whose facts changed in this round: every client when
/// the overlay changed, every route when the ready replicas did (the shares of the
/// limits and `Programmed` move with them).
fn queue_changed(ctx: &Context, before: &Snapshot, after: &Snapshot, overlay_changed: bool) {
    for c in ctx.stores.clients.state() {
        let id = ObjectId::of(&*c);
        if overlay_changed || before.clients.get(&id) != after.clients.get(&id) {
            let _ = ctx.triggers.clients.send(ObjectRef::from_obj(&*c));
        }
    }
    // A credential's keys as the replicas see them: its status.keys.
    for c in ctx.stores.credentials.state() {
        let id = ObjectId::of(&*c);
        if before.credentials.get(&id) != after.credentials.get(&id) {
            let _ = ctx.triggers.credentials.send(ObjectRef::from_obj(&*c));
        }
    }
    let all = before.replicas != after.replicas;
    for route in ctx.stores.routes.state() {
        let id = ObjectId::of(&*route);
        if all || before.routes.get(&id) != after.routes.get(&id) {
            let _ = ctx.triggers.routes.send(ObjectRef::from_obj(&*route));
        }
    }
}

/// Publishes an Event on the route of each circuit transition (routes deleted since
/// get none).
async fn publish_circuit_events(ctx: &Context, transitions: Vec<Transition>) {
    for t in transitions {
        let Some(route) = ctx.stores.routes.get(&object_ref(&t.route)) else {
            continue;
        };
        let (event, reason) = circuit_event(&t);
        match ctx.recorder.publish(&event, &route.object_ref(&())).await {
            Ok(()) => ctx.published(reason),
            Err(e) => tracing::warn!(error = %e, "publishing a circuit Event"),
        }
    }
}

/// The Event a circuit transition is told by, and its reason.
fn circuit_event(t: &Transition) -> (Event, &'static str) {
    let target = match &t.model {
        Some(m) => format!("{} (model {m})", t.credential.name),
        None => t.credential.name.clone(),
    };
    let (type_, reason, note) = if t.to == CircuitState::Open {
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
    (event, reason)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use switchback_crds::route::TotalStats;

    use super::*;
    use crate::fixtures::route;
    use crate::synced::Cache;
    use crate::usage::Seed;

    #[tokio::test]
    async fn deleted_routes_and_clients_are_forgotten_only_against_synced_caches() {
        let mut t = Context::test();
        t.caches.add_route(route("team-a", "smart", 1, &["openai"]));
        let (kept, deleted) = (
            ObjectId::new("team-a", "smart"),
            ObjectId::new("team-a", "deleted"),
        );
        for id in [&kept, &deleted] {
            t.ctx
                .seeds
                .lock()
                .unwrap()
                .insert(id.clone(), TotalStats::default());
            t.ctx
                .unrendered
                .lock()
                .unwrap()
                .insert(id.clone(), (1, tokio::time::Instant::now()));
            t.ctx.metrics.route_programmed.set(id, true, "Programmed");
        }
        t.ctx
            .client_seeds
            .lock()
            .unwrap()
            .insert(ObjectId::new("team-a", "gone"), Seed::from_status(None));
        let mut agg = Aggregator::new(60_000, 0);
        let mut events = CircuitEvents::default();
        let routes_kept = |ctx: &Context| -> BTreeSet<ObjectId> {
            ctx.seeds.lock().unwrap().keys().cloned().collect()
        };

        // At start-up the caches may still be empty: nothing is forgotten.
        forget_deleted(&t.ctx, &mut agg, &mut events);
        assert_eq!(routes_kept(&t.ctx).len(), 2);
        assert_eq!(t.ctx.client_seeds.lock().unwrap().len(), 1);
        assert!(t.ctx.metrics.route_programmed.of(&deleted).is_some());

        for cache in Cache::EVERY {
            t.ctx.stores.synced.listed(cache);
        }
        forget_deleted(&t.ctx, &mut agg, &mut events);
        assert_eq!(routes_kept(&t.ctx), BTreeSet::from([kept.clone()]));
        let unrendered: Vec<ObjectId> = t.ctx.unrendered.lock().unwrap().keys().cloned().collect();
        assert_eq!(unrendered, std::slice::from_ref(&kept));
        assert!(t.ctx.client_seeds.lock().unwrap().is_empty());
        // Its Programmed series goes too: no alert on a route that is no more.
        assert!(t.ctx.metrics.route_programmed.of(&deleted).is_none());
        assert!(t.ctx.metrics.route_programmed.of(&kept).is_some());
    }

    #[tokio::test]
    async fn a_round_counts_the_replicas_read_and_not_read() {
        use switchback_crds::stats::{STATS_VERSION, StatsReport};
        let app = axum::Router::new().route(
            "/admin/v1/stats",
            axum::routing::get(|| async {
                serde_json::to_string(&StatsReport {
                    version: STATS_VERSION,
                    instance_id: "i".into(),
                    ..StatsReport::default()
                })
                .unwrap()
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        // A port nobody listens on any more: connection refused.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let down = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);

        let t = Context::test();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let replicas = |ctx: &Context, result| {
            ctx.metrics
                .proxy_replicas
                .get_or_create(&ResultLabels { result })
                .get()
        };
        let found = |url: &String, terminating| Found {
            url: url.clone(),
            terminating,
        };
        let scrapes = scrape_all(
            &t.ctx,
            &http,
            &[found(&up, false), found(&down, false)],
            None,
            1,
            &mut Refusals::default(),
        )
        .await;
        assert_eq!(scrapes.len(), 2);
        assert_eq!((replicas(&t.ctx, "ok"), replicas(&t.ctx, "error")), (1, 1));

        // A terminating replica is read, marked draining; one gone is no error.
        let scrapes = scrape_all(
            &t.ctx,
            &http,
            &[found(&up, true), found(&down, true)],
            None,
            2,
            &mut Refusals::default(),
        )
        .await;
        assert_eq!(scrapes.len(), 1);
        assert!(scrapes[0].result.as_ref().unwrap().draining);
        assert_eq!((replicas(&t.ctx, "ok"), replicas(&t.ctx, "error")), (1, 0));

        // No ready replica at all: 0 read, which the "no ready proxy" alert reads.
        scrape_all(&t.ctx, &http, &[], None, 3, &mut Refusals::default()).await;
        assert_eq!((replicas(&t.ctx, "ok"), replicas(&t.ctx, "error")), (0, 0));
    }

    #[test]
    fn a_circuit_event_names_the_target_its_model_and_the_replicas() {
        let opened = Transition {
            route: ObjectId::new("team-a", "smart"),
            credential: ObjectId::new("team-a", "openai"),
            model: Some("gpt-4o".into()),
            from: CircuitState::Closed,
            to: CircuitState::Open,
            open_replicas: 2,
        };
        let (event, reason) = circuit_event(&opened);
        assert_eq!((event.type_, reason), (EventType::Warning, "CircuitOpened"));
        assert_eq!(event.reason, reason);
        assert_eq!(
            event.note.as_deref(),
            Some("circuit of target openai (model gpt-4o) opened on 2 proxy replica(s)")
        );

        let closed = Transition {
            model: None,
            from: CircuitState::HalfOpen,
            to: CircuitState::Closed,
            open_replicas: 0,
            ..opened
        };
        let (event, reason) = circuit_event(&closed);
        assert_eq!((event.type_, reason), (EventType::Normal, "CircuitClosed"));
        assert_eq!(
            event.note.as_deref(),
            Some("circuit of target openai closed on every proxy replica")
        );
    }
}

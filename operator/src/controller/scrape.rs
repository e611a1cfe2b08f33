//! The scrape loop: a round at a time, reads every proxy replica's stats (found and
//! read by [`crate::scrape`]), aggregates them, and hands what changed to the
//! controllers: the routes and clients to re-queue, the overlay to re-deliver, the
//! circuit Events to publish.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use switchback_crds::admintoken::Refresh;
use switchback_crds::config::ObjectId;

use super::Context;
use super::client::client_overlay;
use crate::aggregate::Aggregator;
use crate::circuit_events::CircuitEvents;
use crate::metrics::ResultLabels;
use crate::scrape::{self, Replicas};

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

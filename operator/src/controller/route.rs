//! The LLMRoute controller: writes a route's status, holding a write that would only
//! say "not there yet" for a moment (see [`held`]).

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use switchback_crds::LLMRoute;
use switchback_crds::compile::Kind;
use switchback_crds::config::ObjectId;
use switchback_crds::route::LLMRouteStatus;

use super::delivery::World;
use super::{Context, Error, RESYNC, apply_status, now};
use crate::budget::{Permit, Priority};
use crate::status::{self, RouteFacts};

/// Longest a status write waits for a route's delivery and its loading by the
/// proxies (see `held`).
pub(super) const HOLD: Duration = Duration::from_secs(5);
/// How often a held route looks again.
pub(super) const HOLD_RECHECK: Duration = Duration::from_millis(500);

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
        undelivered: world.undelivered(&ns),
        proxies: &proxies,
        seed,
        now: now(),
    });
    if let Some(programmed) = desired
        .conditions
        .iter()
        .find(|c| c.type_ == status::types::PROGRAMMED)
    {
        // What the operator knows now, written or not yet (a write may be held or
        // wait for the budget): the alert on Programmed=False reads this.
        ctx.metrics
            .route_programmed
            .set(&id, programmed.status == "True", &programmed.reason);
    }
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
    report_delivery_failed(&ctx, &route, &current, &desired).await?;
    let api: Api<LLMRoute> = Api::namespaced(ctx.client.clone(), &ns);
    apply_status(&ctx, &api, &route.name_any(), "LLMRoute", &desired).await?;
    Ok(Action::requeue(RESYNC))
}

/// A Warning Event `DeliveryFailed` on the route when its Programmed condition turns
/// to DeliveryFailed (once per change of message, as the status write is).
async fn report_delivery_failed(
    ctx: &Context,
    route: &LLMRoute,
    current: &LLMRouteStatus,
    desired: &LLMRouteStatus,
) -> Result<(), Error> {
    let programmed = |s: &LLMRouteStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == status::types::PROGRAMMED)
            .filter(|c| c.reason == status::reasons::DELIVERY_FAILED)
            .map(|c| c.message.clone())
    };
    let Some(message) = programmed(desired) else {
        return Ok(());
    };
    if programmed(current).as_ref() == Some(&message) {
        return Ok(());
    }
    // An Event's note is limited to 1 kB; the condition keeps the whole message.
    let mut note = message;
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    ctx.recorder
        .publish(
            &Event {
                type_: EventType::Warning,
                reason: status::reasons::DELIVERY_FAILED.into(),
                note: Some(note),
                action: "Deliver".into(),
                secondary: None,
            },
            &route.object_ref(&()),
        )
        .await?;
    ctx.published(status::reasons::DELIVERY_FAILED);
    Ok(())
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

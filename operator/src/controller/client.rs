//! The LLMClient controller: writes a client's status (Ready, usage), and the client
//! overlay: after each scrape round, the clients' usage (their status' seed plus what
//! was counted, [`crate::usage`]) decides which budgets are spent; those, and the
//! ready replica count the limits are shared by, and what is left of each budget as
//! of the round (the proxies reserve against their share of it), are laid over the
//! rendered clients.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use switchback_crds::LLMClient;
use switchback_crds::compile::Kind;
use switchback_crds::config::ObjectId;

use super::{Context, Error, RESYNC, apply_status, now};
use crate::aggregate::Snapshot;
use crate::budget::{Permit, Priority};
use crate::render::ClientOverlay;
use crate::status::{self, ClientFacts};
use crate::usage::{self, Budget};

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

/// Lays what a scrape round found over the rendered clients: when it differs from
/// the overlay in use, it is kept and delivery is woken. Whether it changed.
pub(super) fn refresh_overlay(ctx: &Context, proxies: &Snapshot) -> bool {
    let now_ms = Timestamp::now().as_millisecond().max(0) as u64;
    let overlay = client_overlay(ctx, proxies, now_ms);
    if *ctx.overlay() == overlay {
        return false;
    }
    tracing::info!(
        replicas = overlay.replicas,
        exhausted = overlay.exhausted.len(),
        "client limits or spent budgets changed; re-delivering"
    );
    *ctx.overlay.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(overlay);
    ctx.triggers.delivery.notify_one();
    true
}

/// After a scrape round: the budgets spent (usage = each client's seed plus what was
/// counted), what is left of them as of this round (kept as rendered until it is
/// worth re-rendering, see [`usage::rerender`]), and the ready replicas, as laid
/// over the rendered clients.
pub(super) fn client_overlay(ctx: &Context, proxies: &Snapshot, now_ms: u64) -> ClientOverlay {
    let rendered = ctx.overlay();
    let replicas = u32::try_from(proxies.replicas.len()).unwrap_or(u32::MAX);
    let mut exhausted = BTreeMap::new();
    let mut left = BTreeMap::new();
    for client in ctx.stores.clients.state() {
        let budget = Budget::of(client.spec.budget.as_ref());
        if !budget.is_set() {
            continue;
        }
        let id = ObjectId::of(&*client);
        let counted = proxies.clients.get(&id).map(|v| &v.counted);
        let current = usage::current(&ctx.client_seed(&client), counted, now_ms);
        if let Some(spent) = budget.exhausted(&current, now_ms) {
            exhausted.insert(id.clone(), spent);
        }
        // Before the first round nothing is known of what is left.
        if proxies.round == 0 {
            continue;
        }
        let now = budget.left(&current, proxies.round, now_ms);
        let before = rendered
            .left
            .get(&id)
            .filter(|_| rendered.replicas == replicas);
        let keep = before.filter(|b| !usage::rerender(b, &now, replicas));
        left.insert(id, *keep.unwrap_or(&now));
    }
    ClientOverlay {
        replicas,
        exhausted,
        left,
    }
}

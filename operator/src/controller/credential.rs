//! The ProviderCredential controller: holds a credential's deletion with a finalizer
//! while LLMRoutes reference it, and writes its status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use switchback_crds::compile::Kind;
use switchback_crds::config::ObjectId;
use switchback_crds::{LLMRoute, ProviderCredential};

use super::{Context, Error, RESYNC, apply_status, now};
use crate::budget::{Permit, Priority};
use crate::status::{self, CredentialFacts};

/// Holds a ProviderCredential's deletion while routes reference it.
pub const FINALIZER: &str = "switchback.dev/credential-in-use";

/// LLMRoute names referencing each credential, sorted.
pub(super) fn users(routes: &[LLMRoute]) -> BTreeMap<ObjectId, Vec<String>> {
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
    let deleting = credential.meta().deletion_timestamp.is_some();
    if let Some(action) = finalize(&ctx, &api, &credential, &id, &users).await? {
        return Ok(action);
    }
    if deleting {
        report_blocked(&ctx, &credential, &id, &users).await?;
    }

    let proxies = ctx.proxies();
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
        keys: proxies.credentials.get(&id).map(Vec::as_slice),
        key_count: key_count(&credential),
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

/// How many keys a credential has: its pool's, or its one.
fn key_count(credential: &ProviderCredential) -> usize {
    credential.spec.secret_ref.keys.as_ref().map_or(1, Vec::len)
}

/// Adds the finalizer to a credential, or takes it off one being deleted that no route
/// uses any more. `Some` when that ends this reconcile: the patch comes back through
/// the watch and reconciles again, or there is nothing left to do.
async fn finalize(
    ctx: &Context,
    api: &Api<ProviderCredential>,
    credential: &ProviderCredential,
    id: &ObjectId,
    users: &[String],
) -> Result<Option<Action>, Error> {
    let finalizers = credential.finalizers();
    let has_finalizer = finalizers.iter().any(|f| f == FINALIZER);
    let deleting = credential.meta().deletion_timestamp.is_some();
    if deleting && !has_finalizer {
        return Ok(Some(Action::await_change()));
    }
    if deleting && users.is_empty() {
        let rest: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
        set_finalizers(api, credential, json!(rest)).await?;
        ctx.blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        return Ok(Some(Action::await_change()));
    }
    if !deleting && !has_finalizer {
        let mut all: Vec<&String> = finalizers.iter().collect();
        let ours = FINALIZER.to_string();
        all.push(&ours);
        set_finalizers(api, credential, json!(all)).await?;
        return Ok(Some(Action::await_change()));
    }
    Ok(None)
}

/// A DeletionBlocked Event naming the routes that hold a deletion, once per set of
/// routes.
async fn report_blocked(
    ctx: &Context,
    credential: &ProviderCredential,
    id: &ObjectId,
    users: &[String],
) -> Result<(), Error> {
    let new_set = {
        let mut blocked = ctx.blocked.lock().unwrap_or_else(|p| p.into_inner());
        blocked.insert(id.clone(), users.to_vec()).as_deref() != Some(users)
    };
    if !new_set {
        return Ok(());
    }
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
    Ok(())
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

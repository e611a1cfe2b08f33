//! Wiring tests: each reconcile against a scripted API server asserting the exact
//! calls (method, path and query, body), in the style of controller-rs.

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use switchback_crds::compile::{Inputs, Kind};
use switchback_crds::config::ObjectId;
use switchback_crds::delivery;
use switchback_crds::route::TotalStats;
use switchback_crds::{LLMClient, LLMRoute, ProviderCredential};

use super::client::{client_overlay, reconcile_client};
use super::credential::{FINALIZER, reconcile_credential};
use super::delivery::{World, deliver};
use super::route::{HOLD, HOLD_RECHECK, reconcile_route};
use super::watch::RenderedParts;
use super::{Context, RESYNC, error_policy};
use crate::aggregate::{Aggregator, Snapshot};
use crate::fixtures::{Expect, GATEWAY, client, credential, finish, route, secret};
use crate::metrics::ErrorLabels;
use crate::render::{Rendering, render};
use crate::status::{self, RouteFacts};
use crate::usage;

const SSA: &str = "?&force=true&fieldManager=switchback-operator";

/// Runs `fut`, failing if it blocks: a call the script did not expect never gets an
/// answer, so a stuck reconcile means an unexpected API call.
async fn quick<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .expect("the reconcile made an API call the script did not expect")
}

fn world_for(
    ctx: &Context,
    routes: &[LLMRoute],
    creds: &[ProviderCredential],
    secrets: &[KubeSecret],
) {
    let rendering = render(
        &Inputs {
            routes,
            credentials: creds,
            secrets,
            ..Default::default()
        },
        &BTreeMap::new(),
    );
    // Dated now, as delivery dates it: a Pending route is then held (see `held`).
    let world = World::new(rendering, routes, creds, &[]).dated(None, tokio::time::Instant::now());
    *ctx.world.write().unwrap() = Some(Arc::new(world));
}

/// The API server's answer to a status patch: the object with the status applied.
fn with_status(object: &Value, body: Option<Value>) -> (u16, Value) {
    let mut object = object.clone();
    object["status"] = body.unwrap()["status"].clone();
    (200, object)
}

fn echo(body: Option<Value>) -> (u16, Value) {
    (200, body.unwrap_or(Value::Null))
}

#[tokio::test]
async fn delivery_applies_keys_then_config_with_server_side_apply() {
    let mut t = Context::test();
    let keys = secret("team-a", "keys", &[("openai", "sk-a")]);
    t.caches.add_route(route("team-a", "smart", 2, &["openai"]));
    t.caches
        .add_credential(credential("team-a", "openai", "keys", "openai"));
    t.caches.add_secret(&keys);
    let server = t.api.run(vec![
        Expect::new(Method::GET, "/api/v1/namespaces/team-a/secrets/keys", {
            let keys = keys.clone();
            move |_| (200, serde_json::to_value(&keys).unwrap())
        }),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-a{SSA}"),
            |body| {
                let b = body.clone().unwrap();
                assert_eq!(b["apiVersion"], "v1");
                assert_eq!(b["kind"], "Secret");
                assert_eq!(b["metadata"]["labels"]["switchback.dev/config"], "keys");
                assert_eq!(
                    b["metadata"]["labels"]["switchback.dev/source-namespace"],
                    "team-a"
                );
                // base64("sk-a")
                assert_eq!(b["data"], json!({"openai": "c2stYQ=="}));
                echo(body)
            },
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-a{SSA}"),
            |body| {
                let b = body.clone().unwrap();
                assert_eq!(
                    (b["apiVersion"].as_str(), b["kind"].as_str()),
                    (Some("v1"), Some("ConfigMap"))
                );
                assert_eq!(b["metadata"]["labels"]["switchback.dev/config"], "routes");
                let config = b["data"]["config.json"].as_str().unwrap();
                assert!(!config.contains("sk-a"), "key material in a ConfigMap");
                let config = switchback_crds::delivery::decode_config("team-a", config).unwrap();
                assert_eq!(config.routes[0].generation, 2);
                echo(body)
            },
        ),
    ]);
    quick(deliver(&t.ctx)).await.unwrap();
    finish(server).await;
    let world = t.ctx.world().expect("delivery keeps the world");
    assert!(
        world
            .rendering
            .served
            .contains_key(&ObjectId::new("team-a", "smart"))
    );
}

#[tokio::test]
async fn delivery_writes_nothing_when_the_rendered_objects_match() {
    let mut t = Context::test();
    let keys = secret("team-a", "keys", &[("openai", "sk-a")]);
    let routes = [route("team-a", "smart", 2, &["openai"])];
    let creds = [credential("team-a", "openai", "keys", "openai")];
    for r in &routes {
        t.caches.add_route(r.clone());
    }
    t.caches.add_credential(creds[0].clone());
    t.caches.add_secret(&keys);
    let rendering = render(
        &Inputs {
            routes: &routes,
            credentials: &creds,
            secrets: std::slice::from_ref(&keys),
            ..Default::default()
        },
        &BTreeMap::new(),
    );
    let part = &rendering.namespaces["team-a"];
    t.caches
        .add_rendered_map(delivery::config_map(GATEWAY, "team-a", &part.config).unwrap());
    t.caches
        .add_rendered_secret(delivery::keys_secret(GATEWAY, "team-a", &part.keys).unwrap());
    let server = t.api.run(vec![Expect::new(
        Method::GET,
        "/api/v1/namespaces/team-a/secrets/keys",
        move |_| (200, serde_json::to_value(&keys).unwrap()),
    )]);
    quick(deliver(&t.ctx)).await.unwrap();
    finish(server).await;
    // A second pass reads the Secret from the cache (same resourceVersion): no call.
    quick(deliver(&t.ctx)).await.unwrap();
}

#[tokio::test]
async fn delivery_deletes_the_objects_of_a_namespace_without_routes() {
    let mut t = Context::test();
    let gone = switchback_crds::config::CompiledConfig::default();
    t.caches
        .add_rendered_map(delivery::config_map(GATEWAY, "team-z", &gone).unwrap());
    t.caches.add_rendered_secret(
        delivery::keys_secret(GATEWAY, "team-z", &Default::default()).unwrap(),
    );
    let status = |_| {
        (
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        )
    };
    let server = t.api.run(vec![
        Expect::new(
            Method::DELETE,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-z?"),
            status,
        ),
        Expect::new(
            Method::DELETE,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-z?"),
            status,
        ),
    ]);
    quick(deliver(&t.ctx)).await.unwrap();
    finish(server).await;
}

#[tokio::test]
async fn delivery_queues_the_users_of_a_changed_secret() {
    let mut t = Context::test();
    let keys = secret("team-a", "keys", &[("openai", "sk-a")]);
    let routes = [route("team-a", "smart", 1, &["openai"])];
    let creds = [credential("team-a", "openai", "keys", "openai")];
    // The world as it was while the Secret had the key...
    world_for(&t.ctx, &routes, &creds, std::slice::from_ref(&keys));
    // ...and now the Secret is gone.
    t.caches.add_route(routes[0].clone());
    t.caches.add_credential(creds[0].clone());
    let server = t.api.run(vec![
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-a{SSA}"),
            |body| {
                assert_eq!(body.as_ref().unwrap()["data"], json!({}));
                echo(body)
            },
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-a{SSA}"),
            echo,
        ),
    ]);
    quick(deliver(&t.ctx)).await.unwrap();
    finish(server).await;
    let queued = t.route_triggers.try_recv().expect("the route is queued");
    assert_eq!(queued.name, "smart");
    let queued = t
        .credential_triggers
        .try_recv()
        .expect("the credential is queued");
    assert_eq!(queued.name, "openai");
}

#[tokio::test]
async fn delivery_queues_the_users_of_a_rotated_key() {
    let mut t = Context::test();
    let routes = [route("team-a", "smart", 1, &["openai"])];
    let creds = [credential("team-a", "openai", "keys", "openai")];
    world_for(
        &t.ctx,
        &routes,
        &creds,
        &[secret("team-a", "keys", &[("openai", "sk-old")])],
    );
    // Same objects, same generations and diagnostics; only the key is new.
    let mut rotated = secret("team-a", "keys", &[("openai", "sk-new")]);
    rotated.metadata.resource_version = Some("2".into());
    t.caches.add_route(routes[0].clone());
    t.caches.add_credential(creds[0].clone());
    t.caches.add_secret(&rotated);
    let server = t.api.run(vec![
        Expect::new(Method::GET, "/api/v1/namespaces/team-a/secrets/keys", {
            let rotated = rotated.clone();
            move |_| (200, serde_json::to_value(&rotated).unwrap())
        }),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-a{SSA}"),
            echo,
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-a{SSA}"),
            echo,
        ),
    ]);
    quick(deliver(&t.ctx)).await.unwrap();
    finish(server).await;
    let queued = t.route_triggers.try_recv().expect("the route is queued");
    assert_eq!(queued.name, "smart");
    assert!(
        t.credential_triggers.try_recv().is_err(),
        "the credential's own facts did not change"
    );
}

#[tokio::test]
async fn route_status_goes_to_the_status_subresource_by_server_side_apply() {
    let t = Context::test();
    let keys = secret("team-a", "keys", &[("openai", "sk-a")]);
    let r = route("team-a", "smart", 3, &["openai"]);
    let answer = serde_json::to_value(&r).unwrap();
    world_for(
        &t.ctx,
        std::slice::from_ref(&r),
        &[credential("team-a", "openai", "keys", "openai")],
        &[keys],
    );
    let server = t.api.run(vec![Expect::new(
        Method::PATCH,
        format!("/apis/switchback.dev/v1alpha1/namespaces/team-a/llmroutes/smart/status{SSA}"),
        move |body| {
            let b = body.clone().unwrap();
            assert_eq!(b["apiVersion"], "switchback.dev/v1alpha1");
            assert_eq!(b["kind"], "LLMRoute");
            let s = &b["status"];
            assert_eq!(s["observedGeneration"], 3);
            assert_eq!(s["targetCount"], 1);
            let types: Vec<&str> = s["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["type"].as_str().unwrap())
                .collect();
            // Ready (and kstatus's Reconciling while it waits) after the three of
            // SPEC §2 (SPEC §11).
            assert_eq!(
                types,
                [
                    "Accepted",
                    "ResolvedRefs",
                    "Programmed",
                    "Ready",
                    "Reconciling"
                ]
            );
            assert_eq!(s["conditions"][2]["reason"], "NoReadyReplicas");
            assert_eq!(s["conditions"][3]["status"], "False");
            assert_eq!(s["conditions"][3]["reason"], "NoReadyReplicas");
            assert_eq!(s["conditions"][0]["observedGeneration"], 3);
            with_status(&answer, body)
        },
    )]);
    let action = quick(reconcile_route(Arc::new(r), t.ctx.clone()))
        .await
        .unwrap();
    finish(server).await;
    assert_eq!(action, Action::requeue(RESYNC));
    assert_eq!(
        t.ctx
            .metrics
            .route_programmed
            .of(&ObjectId::new("team-a", "smart")),
        Some(("NoReadyReplicas".into(), 0))
    );
}

#[tokio::test]
async fn an_unchanged_route_status_is_not_written() {
    let t = Context::test();
    let mut r = route("team-a", "smart", 3, &["openai"]);
    let creds = [credential("team-a", "openai", "keys", "openai")];
    world_for(&t.ctx, std::slice::from_ref(&r), &creds, &[]);
    let world = t.ctx.world().unwrap();
    let id = ObjectId::new("team-a", "smart");
    r.status = Some(status::route_status(&RouteFacts {
        route: &r,
        diagnostics: world.rendering.diagnostics(Kind::LLMRoute, &id).collect(),
        served: world.rendering.served.get(&id).copied(),
        proxies: &Snapshot::default(),
        seed: TotalStats::default(),
        now: crate::fixtures::time(0),
    }));
    // No script: any call would hang and fail `quick`.
    let _server = t.api.run(vec![]);
    quick(reconcile_route(Arc::new(r), t.ctx.clone()))
        .await
        .unwrap();
}

/// A route status PATCH whose Programmed condition has `reason`.
fn programmed_patch(r: &LLMRoute, reason: &'static str) -> Expect {
    let answer = serde_json::to_value(r).unwrap();
    Expect::new(
        Method::PATCH,
        format!("/apis/switchback.dev/v1alpha1/namespaces/team-a/llmroutes/smart/status{SSA}"),
        move |body| {
            assert_eq!(
                body.as_ref().unwrap()["status"]["conditions"][2]["reason"],
                reason
            );
            with_status(&answer, body)
        },
    )
}

#[tokio::test(start_paused = true)]
async fn a_route_not_rendered_yet_is_held_then_written_after_the_hold() {
    let t = Context::test();
    let r = route("team-a", "smart", 3, &["openai"]);
    // The last delivery predates the route: its status would say nothing yet.
    world_for(&t.ctx, &[], &[], &[]);
    // No API call may happen (nothing answers one: `quick` would fail).
    let action = quick(reconcile_route(Arc::new(r.clone()), t.ctx.clone()))
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(HOLD_RECHECK));
    // A delivery that never comes does not hide the route's status for long.
    tokio::time::advance(HOLD).await;
    let server = t.api.run(vec![programmed_patch(&r, "NotRendered")]);
    quick(reconcile_route(Arc::new(r), t.ctx.clone()))
        .await
        .unwrap();
    finish(server).await;
}

#[tokio::test(start_paused = true)]
async fn a_pending_route_is_held_until_the_proxies_serve_it_or_the_hold_ends() {
    let t = Context::test();
    let r = route("team-a", "smart", 3, &["openai"]);
    let keys = secret("team-a", "keys", &[("openai", "sk-a")]);
    let creds = [credential("team-a", "openai", "keys", "openai")];
    world_for(&t.ctx, std::slice::from_ref(&r), &creds, &[keys]);
    // One ready replica that does not serve the route yet: Programmed=Pending.
    *t.ctx.proxies.write().unwrap() = Arc::new(Snapshot {
        replicas: vec![crate::aggregate::Replica {
            endpoint: "127.0.0.1:9090".into(),
            error: None,
            config_error: None,
        }],
        ..Snapshot::default()
    });
    let action = quick(reconcile_route(Arc::new(r.clone()), t.ctx.clone()))
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(HOLD_RECHECK));
    // Held, not written, yet the metric the Programmed=False alert reads says it.
    let id = ObjectId::new("team-a", "smart");
    assert_eq!(
        t.ctx.metrics.route_programmed.of(&id),
        Some(("Pending".into(), 0))
    );
    tokio::time::advance(HOLD).await;
    let server = t.api.run(vec![
        programmed_patch(&r, "Pending"),
        programmed_patch(&r, "Programmed"),
    ]);
    quick(reconcile_route(Arc::new(r.clone()), t.ctx.clone()))
        .await
        .unwrap();

    // The replica loads it: Programmed=True, and the metric follows (one series).
    let served = t.ctx.world().unwrap().rendering.served[&id];
    let mut view = crate::aggregate::RouteView::default();
    view.generations.insert("127.0.0.1:9090".into(), 3);
    view.revisions
        .insert("127.0.0.1:9090".into(), served.revision);
    let mut proxies = (*t.ctx.proxies()).clone();
    proxies.routes.insert(id.clone(), view);
    *t.ctx.proxies.write().unwrap() = Arc::new(proxies);
    quick(reconcile_route(Arc::new(r), t.ctx.clone()))
        .await
        .unwrap();
    finish(server).await;
    assert_eq!(
        t.ctx.metrics.route_programmed.of(&id),
        Some(("Programmed".into(), 1))
    );
}

#[tokio::test]
async fn a_missing_secret_key_is_a_resolved_refs_condition() {
    let t = Context::test();
    let r = route("team-a", "smart", 1, &["openai"]);
    let answer = serde_json::to_value(&r).unwrap();
    world_for(
        &t.ctx,
        std::slice::from_ref(&r),
        &[credential("team-a", "openai", "keys", "openai")],
        &[secret("team-a", "keys", &[("other", "x")])],
    );
    let server = t.api.run(vec![Expect::new(
        Method::PATCH,
        format!("/apis/switchback.dev/v1alpha1/namespaces/team-a/llmroutes/smart/status{SSA}"),
        move |body| {
            let c = &body.as_ref().unwrap()["status"]["conditions"][1];
            assert_eq!(c["type"], "ResolvedRefs");
            assert_eq!(c["status"], "False");
            assert_eq!(c["reason"], "SecretKeyMissing");
            let message = c["message"].as_str().unwrap();
            assert!(
                message.starts_with("spec.targets[0].credentialRef.name: "),
                "{message}"
            );
            with_status(&answer, body)
        },
    )]);
    quick(reconcile_route(Arc::new(r), t.ctx.clone()))
        .await
        .unwrap();
    finish(server).await;
}

#[tokio::test]
async fn a_credential_gets_the_finalizer_by_merge_patch_with_its_resource_version() {
    let t = Context::test();
    let c = credential("team-a", "openai", "keys", "openai");
    let answer = serde_json::to_value(&c).unwrap();
    world_for(&t.ctx, &[], std::slice::from_ref(&c), &[]);
    let server = t.api.run(vec![Expect::new(
        Method::PATCH,
        "/apis/switchback.dev/v1alpha1/namespaces/team-a/providercredentials/openai?",
        move |body| {
            assert_eq!(
                body.as_ref().unwrap(),
                &json!({"metadata": {"finalizers": [FINALIZER], "resourceVersion": "7"}})
            );
            (200, answer)
        },
    )]);
    let action = quick(reconcile_credential(Arc::new(c), t.ctx.clone()))
        .await
        .unwrap();
    finish(server).await;
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn deleting_a_referenced_credential_is_held_with_an_event_naming_the_routes() {
    let mut t = Context::test();
    let mut c = credential("team-a", "openai", "keys", "openai");
    c.metadata.finalizers = Some(vec![FINALIZER.into()]);
    c.metadata.deletion_timestamp = Some(crate::fixtures::time(5));
    let users = [
        route("team-a", "smart", 1, &["openai"]),
        route("team-a", "fast", 1, &["other", "openai"]),
        route("team-b", "elsewhere", 1, &["openai"]),
    ];
    for r in &users {
        t.caches.add_route(r.clone());
    }
    world_for(&t.ctx, &users, std::slice::from_ref(&c), &[]);
    let answer = serde_json::to_value(&c).unwrap();
    let server = t.api.run(vec![
        Expect::new(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/team-a/events?",
            |body| {
                let b = body.clone().unwrap();
                assert_eq!(b["reason"], "DeletionBlocked");
                assert_eq!(b["type"], "Warning");
                assert_eq!(b["regarding"]["kind"], "ProviderCredential");
                assert!(b["note"].as_str().unwrap().ends_with(": fast, smart"), "{b}");
                echo(body)
            },
        ),
        Expect::new(
            Method::PATCH,
            format!(
                "/apis/switchback.dev/v1alpha1/namespaces/team-a/providercredentials/openai/status{SSA}"
            ),
            move |body| {
                let s = &body.as_ref().unwrap()["status"];
                assert_eq!(s["routes"], 2);
                assert_eq!(s["conditions"][0]["type"], "Ready");
                assert_eq!(s["conditions"][0]["reason"], "DeletionBlocked");
                with_status(&answer, body)
            },
        ),
    ]);
    let action = quick(reconcile_credential(Arc::new(c.clone()), t.ctx.clone()))
        .await
        .unwrap();
    finish(server).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
}

#[tokio::test]
async fn deleting_an_unreferenced_credential_releases_the_finalizer() {
    let t = Context::test();
    let mut c = credential("team-a", "openai", "keys", "openai");
    c.metadata.finalizers = Some(vec!["example.com/other".into(), FINALIZER.into()]);
    c.metadata.deletion_timestamp = Some(crate::fixtures::time(5));
    world_for(&t.ctx, &[], std::slice::from_ref(&c), &[]);
    let answer = serde_json::to_value(&c).unwrap();
    let server = t.api.run(vec![Expect::new(
        Method::PATCH,
        "/apis/switchback.dev/v1alpha1/namespaces/team-a/providercredentials/openai?",
        move |body| {
            assert_eq!(
                body.as_ref().unwrap(),
                &json!({"metadata": {"finalizers": ["example.com/other"], "resourceVersion": "7"}})
            );
            (200, answer)
        },
    )]);
    quick(reconcile_credential(Arc::new(c), t.ctx.clone()))
        .await
        .unwrap();
    finish(server).await;
}

#[tokio::test]
async fn a_conflict_is_retried_at_once_and_counted() {
    let t = Context::test();
    let c = credential("team-a", "openai", "keys", "openai");
    world_for(&t.ctx, &[], std::slice::from_ref(&c), &[]);
    let server = t.api.run(vec![Expect::new(
        Method::PATCH,
        "/apis/switchback.dev/v1alpha1/namespaces/team-a/providercredentials/openai?",
        |_| {
            (
                409,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict",
                       "message": "the object has been modified", "code": 409}),
            )
        },
    )]);
    let c = Arc::new(c);
    let err = quick(reconcile_credential(c.clone(), t.ctx.clone()))
        .await
        .unwrap_err();
    finish(server).await;
    assert_eq!(err.metric_label(), "conflict");
    assert_eq!(
        error_policy(c, &err, t.ctx.clone()),
        Action::requeue(Duration::from_millis(200))
    );
    let counted = t
        .ctx
        .metrics
        .errors
        .get_or_create(&ErrorLabels {
            controller: "providercredential",
            error: "conflict",
        })
        .get();
    assert_eq!(counted, 1);
}

#[test]
fn only_what_a_rendering_reads_pokes_delivery() {
    use watcher::Event as E;
    let mut parts = RenderedParts::default();
    let r = route("team-a", "smart", 1, &["openai"]);
    assert!(parts.changes(&E::Apply(r.clone())), "a new route");
    // The operator's own status write comes back through the watch: no re-render.
    let mut written = r.clone();
    written.status = Some(Default::default());
    written.metadata.resource_version = Some("2".into());
    assert!(!parts.changes(&E::Apply(written.clone())), "a status write");
    let mut edited = written.clone();
    edited.metadata.generation = Some(2);
    assert!(parts.changes(&E::Apply(edited.clone())), "a spec edit");
    let mut deleting = edited.clone();
    deleting.metadata.deletion_timestamp = Some(crate::fixtures::time(5));
    assert!(parts.changes(&E::Apply(deleting.clone())), "deletion began");
    assert!(parts.changes(&E::Delete(deleting)), "deleted");
    // Recreated with the same generation: a new object.
    let mut recreated = r.clone();
    recreated.metadata.uid = Some("another".into());
    assert!(parts.changes(&E::Apply(recreated.clone())), "recreated");

    // A relist: unchanged objects do not poke, a changed one does, and the end of the
    // relist always does (objects deleted meanwhile are only seen missing there).
    let other = route("team-a", "other", 1, &["openai"]);
    assert!(parts.changes(&E::Apply(other.clone())));
    assert!(!parts.changes(&E::<LLMRoute>::Init));
    assert!(
        !parts.changes(&E::InitApply(recreated.clone())),
        "unchanged"
    );
    assert!(parts.changes(&E::<LLMRoute>::InitDone));
    // `other` was not in the relist: forgotten, so seeing it again is news.
    assert!(
        parts.changes(&E::Apply(other)),
        "deleted while the watch was down"
    );
    let mut moved = recreated;
    moved.metadata.generation = Some(3);
    assert!(!parts.changes(&E::<LLMRoute>::Init));
    assert!(
        parts.changes(&E::InitApply(moved)),
        "changed while the watch was down"
    );
}

/// Scrape rounds in which `checkout` spent `tokens` (on one replica).
fn proxies_with_usage(tokens: u64) -> Snapshot {
    let now = Timestamp::now().as_millisecond() as u64;
    let mut agg = Aggregator::new(60_000, now - 60_000);
    let report = |t: u64| switchback_crds::stats::StatsReport {
        version: 1,
        instance_id: "i1".into(),
        started_at: usage::rfc3339(now - 30_000),
        clients: vec![switchback_crds::stats::ClientStats {
            client: ObjectId::new("team-a", "checkout"),
            requests: t / 100,
            input_tokens: t,
            last_request_at: Some(usage::rfc3339(now)),
            ..Default::default()
        }],
        ..Default::default()
    };
    let scrape = |t| crate::aggregate::Scrape {
        endpoint: "http://10.0.0.1:9090".into(),
        result: Ok(report(t)),
    };
    agg.observe(now - 1_000, &[scrape(0)]);
    agg.observe(now, &[scrape(tokens)]);
    agg.snapshot().clone()
}

/// `c` rendered with team-a's route `smart` on credential `openai` (keys in Secret
/// `keys`), and those two.
fn rendered_with_smart(c: &LLMClient) -> (Rendering, [LLMRoute; 1], [ProviderCredential; 1]) {
    let keys = secret(
        "team-a",
        "keys",
        &[("openai", "sk-a"), ("app", "0123456789abcdef-app")],
    );
    let routes = [route("team-a", "smart", 1, &["openai"])];
    let creds = [credential("team-a", "openai", "keys", "openai")];
    let rendering = render(
        &Inputs {
            routes: &routes,
            credentials: &creds,
            clients: std::slice::from_ref(c),
            secrets: std::slice::from_ref(&keys),
            ..Default::default()
        },
        &BTreeMap::new(),
    );
    (rendering, routes, creds)
}

#[tokio::test]
async fn a_spent_budget_is_laid_over_the_rendered_client_and_makes_it_not_ready() {
    let mut t = Context::test();
    let c = client("team-a", "checkout", "keys", "app", 1_000);
    t.caches.add_client(c.clone());
    let (rendering, routes, creds) = rendered_with_smart(&c);
    let world = World::new(rendering, &routes, &creds, std::slice::from_ref(&c));
    *t.ctx.world.write().unwrap() = Some(Arc::new(world));

    // Under budget: nothing is laid over but the replica count.
    let proxies = proxies_with_usage(999);
    let now = Timestamp::now().as_millisecond() as u64;
    let overlay = client_overlay(&t.ctx, &proxies, now);
    assert_eq!((overlay.replicas, overlay.exhausted.len()), (1, 0));

    // At the budget: exhausted until the next UTC midnight, on the rendered client.
    let proxies = proxies_with_usage(1_000);
    let overlay = client_overlay(&t.ctx, &proxies, now);
    let id = ObjectId::new("team-a", "checkout");
    let spent = overlay.exhausted.get(&id).expect("exhausted").clone();
    assert_eq!(spent.budget, "tokensPerDay");
    assert_eq!(
        spent.until,
        usage::rfc3339(usage::day_start(now) + 86_400_000)
    );
    let world = t.ctx.world.write().unwrap().take().unwrap();
    let mut rendering = Arc::try_unwrap(world).ok().unwrap().rendering;
    rendering.lay_over(&overlay);
    assert_eq!(
        rendering.client(&id).unwrap().exhausted.as_ref(),
        Some(&spent)
    );
    assert_eq!(
        rendering.namespaces["team-a"].config.clients[0]
            .exhausted
            .as_ref(),
        Some(&spent),
        "the ConfigMap of the client's namespace carries it"
    );
    let world = World::new(rendering, &routes, &creds, std::slice::from_ref(&c));
    *t.ctx.world.write().unwrap() = Some(Arc::new(world));
    *t.ctx.proxies.write().unwrap() = Arc::new(proxies);
    *t.ctx.overlay.write().unwrap() = Arc::new(overlay);

    let answer = serde_json::to_value(&c).unwrap();
    let server = t.api.run(vec![Expect::new(
        Method::PATCH,
        format!("/apis/switchback.dev/v1alpha1/namespaces/team-a/llmclients/checkout/status{SSA}"),
        move |body| {
            let b = body.clone().unwrap();
            assert_eq!(b["kind"], "LLMClient");
            let s = &b["status"];
            assert_eq!(s["conditions"][0]["type"], "Ready");
            assert_eq!(s["conditions"][0]["status"], "False");
            assert_eq!(s["conditions"][0]["reason"], "BudgetExhausted");
            assert_eq!(s["usage"]["today"]["tokens"], 1_000);
            assert_eq!(s["usage"]["today"]["requests"], 10);
            assert_eq!(s["budgetUsedPercent"], 100);
            assert_eq!(s["routes"], 1);
            assert!(s["lastRequestAt"].is_string());
            with_status(&answer, body)
        },
    )]);
    quick(reconcile_client(Arc::new(c), t.ctx.clone()))
        .await
        .unwrap();
    finish(server).await;
}

/// SPEC §15: what is left of a budget is rendered as of the scrape round that summed
/// it (the proxies reserve against their share of it), kept as rendered while it
/// barely moves, rendered again once half a share was spent, and laid over the
/// rendered client.
#[tokio::test]
async fn what_is_left_of_a_budget_is_rendered_as_of_its_round_while_it_matters() {
    let mut t = Context::test();
    let c = client("team-a", "checkout", "keys", "app", 1_000);
    t.caches.add_client(c.clone());
    let id = ObjectId::new("team-a", "checkout");
    let now = Timestamp::now().as_millisecond() as u64;
    let round = |tokens: u64, round: u64| {
        let mut p = proxies_with_usage(tokens);
        p.round = round;
        p
    };
    // No round yet: nothing is known of what is left.
    let overlay = client_overlay(&t.ctx, &proxies_with_usage(400), now);
    assert!(overlay.left.is_empty());

    let overlay = client_overlay(&t.ctx, &round(400, 42), now);
    let left = overlay.left[&id];
    assert_eq!(
        (left.round, left.day, left.tokens, left.micro_usd),
        (42, now / 86_400_000, Some(600), None)
    );
    *t.ctx.overlay.write().unwrap() = Arc::new(overlay.clone());
    // 100 more of a 600 share: the rendering stands (no ConfigMap write).
    let kept = client_overlay(&t.ctx, &round(500, 43), now);
    assert_eq!(kept, overlay);
    // 300 of it, half the share: rendered again.
    let moved = client_overlay(&t.ctx, &round(700, 44), now);
    assert_eq!(moved.left[&id].round, 44);
    assert_eq!(moved.left[&id].tokens, Some(300));

    let (mut rendering, _, _) = rendered_with_smart(&c);
    rendering.lay_over(&moved);
    assert_eq!(
        rendering.namespaces["team-a"].config.clients[0].budget.left,
        Some(moved.left[&id]),
        "the ConfigMap of the client's namespace carries it"
    );
}

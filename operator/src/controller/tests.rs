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
use crate::publish;
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
        &BTreeMap::new(),
    );
    // Dated now, as delivery dates it: a Pending route is then held (see `held`).
    let world = World::new(rendering, routes, creds, &[], BTreeMap::new())
        .dated(None, tokio::time::Instant::now());
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

/// What a call's body says, kept for later (the objects delivery wrote).
type Kept = Arc<std::sync::Mutex<Vec<Value>>>;

fn keep(kept: &Kept) -> impl FnOnce(Option<Value>) -> (u16, Value) + Send + 'static {
    let kept = kept.clone();
    move |body| {
        kept.lock().unwrap().push(body.clone().unwrap());
        echo(body)
    }
}

fn keep_and(
    kept: &Kept,
    check: impl FnOnce(&Value) + Send + 'static,
) -> impl FnOnce(Option<Value>) -> (u16, Value) + Send + 'static {
    let kept = kept.clone();
    move |body| {
        check(body.as_ref().unwrap());
        kept.lock().unwrap().push(body.clone().unwrap());
        echo(body)
    }
}

/// Feeds what delivery wrote back into the caches, as the watches would.
fn cache_written(t: &mut crate::fixtures::TestContext, kept: &Kept) {
    for body in kept.lock().unwrap().drain(..) {
        match body["kind"].as_str() {
            Some("ConfigMap") => t
                .caches
                .add_rendered_map(serde_json::from_value(body).unwrap()),
            Some("Secret") => t
                .caches
                .add_rendered_secret(serde_json::from_value(body).unwrap()),
            _ => {}
        }
    }
}

/// The index in a PATCH body.
fn index_in(body: &Value) -> switchback_crds::delivery::index::Index {
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(body.clone()).unwrap();
    switchback_crds::delivery::index::read_index(&cm).unwrap()
}

const ROLE: &str = "sb-proxy-reader";

#[tokio::test]
async fn delivery_grants_then_writes_keys_then_parts_then_names_them_in_the_index() {
    let mut t = Context::test_with(|s| s.proxy_reader_role = Some(ROLE.into()));
    let keys = secret("team-a", "keys", &[("openai", "sk-a")]);
    t.caches.add_route(route("team-a", "smart", 2, &["openai"]));
    t.caches
        .add_credential(credential("team-a", "openai", "keys", "openai"));
    t.caches.add_secret(&keys);
    let granted: Kept = Default::default();
    let kept: Kept = Default::default();
    let server = t.api.run(vec![
        Expect::new(Method::GET, "/api/v1/namespaces/team-a/secrets/keys", {
            let keys = keys.clone();
            move |_| (200, serde_json::to_value(&keys).unwrap())
        }),
        // Before the index names a new object, the proxies' Role lets them read it.
        Expect::new(
            Method::PATCH,
            format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{GATEWAY}/roles/{ROLE}{SSA}"),
            keep_and(&granted, |b| {
                assert_eq!(b["kind"], "Role");
                assert!(
                    b["metadata"].get("labels").is_none(),
                    "the chart's labels stay the chart's"
                );
                let rules = b["rules"].as_array().unwrap();
                assert_eq!(rules.len(), 2, "{b}");
                for rule in rules {
                    assert_eq!(rule["verbs"], json!(["get"]));
                    assert_eq!(rule["resourceNames"].as_array().unwrap().len(), 1, "{rule}");
                }
            }),
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-a.*"),
            keep_and(&kept, |b| {
                assert_eq!(b["apiVersion"], "v1");
                assert_eq!(b["metadata"]["labels"]["switchback.dev/config"], "keys");
                assert_eq!(
                    b["metadata"]["labels"]["switchback.dev/source-namespace"],
                    "team-a"
                );
                // base64("sk-a"), and the namespace's revision key (64 hex digits).
                assert_eq!(b["data"]["openai"], "c2stYQ==");
                assert_eq!(b["data"]["_revision-key"].as_str().unwrap().len(), 88);
            }),
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-a.*"),
            keep_and(&kept, |b| {
                assert_eq!(b["metadata"]["labels"]["switchback.dev/config"], "routes");
                let config = b["data"]["config.json"].as_str().unwrap();
                assert!(!config.contains("sk-a"), "key material in a ConfigMap");
                let name = b["metadata"]["name"].as_str().unwrap();
                let config = delivery::decode_config(name, "team-a", config).unwrap();
                assert_eq!(config.routes[0].generation, 2);
            }),
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-index{SSA}"),
            keep(&kept),
        ),
    ]);
    quick(deliver(&t.ctx)).await.unwrap();
    finish(server).await;
    let written = kept.lock().unwrap().clone();
    let index = index_in(&written[2]);
    let entry = &index.namespaces["team-a"];
    assert_eq!(entry.keys, written[0]["metadata"]["name"].as_str().unwrap());
    assert_eq!(
        entry.parts,
        [written[1]["metadata"]["name"].as_str().unwrap()]
    );
    // The Role granted exactly what the index names (and, unchanged, is not applied
    // again after it).
    let role = granted.lock().unwrap()[0].clone();
    assert_eq!(role["rules"][0]["resources"], json!(["configmaps"]));
    assert_eq!(role["rules"][0]["resourceNames"], json!(entry.parts));
    assert_eq!(role["rules"][1]["resourceNames"], json!([entry.keys]));
    let world = t.ctx.world().expect("delivery keeps the world");
    assert!(
        world
            .rendering
            .served
            .contains_key(&ObjectId::new("team-a", "smart"))
    );

    // Delivered and cached: the next delivery writes nothing, and keeps the
    // namespace's revision key (and so every revision).
    cache_written(&mut t, &kept);
    let before = world.rendering.served[&ObjectId::new("team-a", "smart")].revision;
    let _server = t.api.run(vec![]);
    quick(deliver(&t.ctx)).await.unwrap();
    let after = t.ctx.world().unwrap().rendering.served[&ObjectId::new("team-a", "smart")].revision;
    assert_eq!(after, before);
}

#[tokio::test]
async fn delivery_deletes_what_the_index_no_longer_names() {
    let mut t = Context::test();
    let gone = switchback_crds::config::CompiledConfig::default();
    // An older operator's ConfigMap, and a keys Secret of this one's.
    let mut old = k8s_openapi::api::core::v1::ConfigMap::default();
    old.metadata.name = Some("switchback-routes-team-z".into());
    old.metadata.namespace = Some(GATEWAY.into());
    old.metadata.labels = Some(
        [(
            delivery::MANAGED_BY_LABEL.to_string(),
            delivery::MANAGED_BY.to_string(),
        )]
        .into(),
    );
    old.data = Some(
        [(
            delivery::CONFIG_KEY.to_string(),
            delivery::encode_config("team-z", &gone).unwrap(),
        )]
        .into(),
    );
    t.caches.add_rendered_map(old);
    t.caches.add_rendered_secret(
        delivery::keys_secret(
            GATEWAY,
            "team-z",
            &Default::default(),
            &switchback_crds::revision::RevisionKey::random(),
        )
        .unwrap(),
    );
    let status = |_| {
        (
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        )
    };
    let server = t.api.run(vec![
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-index{SSA}"),
            |body| {
                assert!(index_in(body.as_ref().unwrap()).namespaces.is_empty());
                echo(body)
            },
        ),
        Expect::new(
            Method::DELETE,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-z?"),
            status,
        ),
        Expect::new(
            Method::DELETE,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-z.*"),
            status,
        ),
    ]);
    quick(deliver(&t.ctx)).await.unwrap();
    finish(server).await;
}

/// operator/README.md#what-it-writes: a namespace whose write the API server refuses keeps
/// its index entry (its last delivered version), is counted and shown on its routes, and
/// waits out a backoff; every other namespace is delivered as if it did not exist, stale
/// objects included; once the API accepts it, it is delivered and the failure is forgotten.
#[tokio::test(start_paused = true)]
async fn a_namespace_the_api_refuses_stops_no_other_and_is_retried_after_a_backoff() {
    let mut t = Context::test();
    let a_keys = secret("team-a", "keys", &[("openai", "sk-a")]);
    let b_keys = secret("team-b", "keys", &[("openai", "sk-b")]);
    t.caches.add_route(route("team-a", "smart", 1, &["openai"]));
    t.caches.add_route(route("team-b", "fast", 1, &["openai"]));
    for ns in ["team-a", "team-b"] {
        t.caches
            .add_credential(credential(ns, "openai", "keys", "openai"));
    }
    t.caches.add_secret(&a_keys);
    t.caches.add_secret(&b_keys);
    let get = |s: &KubeSecret| {
        let s = s.clone();
        let path = format!(
            "/api/v1/namespaces/{}/secrets/keys",
            s.metadata.namespace.clone().unwrap()
        );
        Expect::new(Method::GET, path, move |_| {
            (200, serde_json::to_value(&s).unwrap())
        })
    };
    // Both delivered.
    let kept: Kept = Default::default();
    let server = t.api.run(vec![
        get(&a_keys),
        get(&b_keys),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-a.*"),
            keep(&kept),
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-b.*"),
            keep(&kept),
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-a.*"),
            keep(&kept),
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-b.*"),
            keep(&kept),
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-index{SSA}"),
            keep(&kept),
        ),
    ]);
    quick(deliver(&t.ctx)).await.unwrap();
    finish(server).await;
    let first = index_in(kept.lock().unwrap().last().unwrap());
    let old_b_part = first.namespaces["team-b"].parts[0].clone();
    cache_written(&mut t, &kept);

    // team-a's key rotates, and the API server refuses its new keys Secret; team-b
    // gets a second route meanwhile.
    let mut rotated = secret("team-a", "keys", &[("openai", "sk-a2")]);
    rotated.metadata.resource_version = Some("2".into());
    t.caches.add_secret(&rotated);
    t.caches.add_route(route("team-b", "more", 1, &["openai"]));
    let refusal = "Secret \"switchback-keys-team-a.x\" is invalid: data: Too long: may not be more than 1048576 bytes";
    let server = t.api.run(vec![
        get(&rotated),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-a.*"),
            move |_| {
                (
                    422,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422, "message": refusal}),
                )
            },
        ),
        Expect::new(Method::PATCH, format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-b.*"), keep(&kept)),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-index{SSA}"),
            keep_and(&kept, {
                let first = first.clone();
                move |b| {
                    let index = index_in(b);
                    assert_eq!(index.namespaces["team-a"], first.namespaces["team-a"], "team-a keeps its last delivered version");
                    assert_ne!(index.namespaces["team-b"], first.namespaces["team-b"], "team-b moves on");
                }
            }),
        ),
        Expect::new(
            Method::DELETE,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/{old_b_part}?"),
            |_| (200, json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})),
        ),
    ]);
    quick(deliver(&t.ctx)).await.unwrap();
    finish(server).await;
    let world = t.ctx.world().unwrap();
    let why = world
        .undelivered("team-a")
        .expect("team-a is not delivered");
    assert!(
        why.contains("Too long") && why.contains("switchback-keys-team-a."),
        "{why}"
    );
    assert!(world.undelivered("team-b").is_none());
    let failures = t
        .ctx
        .metrics
        .delivery_failures
        .get_or_create(&crate::metrics::DeliveryLabels {
            namespace: "team-a".into(),
            reason: "invalid",
        })
        .get();
    assert_eq!(failures, 1);
    assert_eq!(t.ctx.metrics.namespaces_undelivered.get(), 1);
    // The written objects arrive in the caches; the deleted part goes.
    let mut old = k8s_openapi::api::core::v1::ConfigMap::default();
    old.metadata.name = Some(old_b_part);
    old.metadata.namespace = Some(GATEWAY.into());
    t.caches.remove_rendered_map(old);
    cache_written(&mut t, &kept);

    // Within the backoff, nothing is tried (no call at all).
    let _server = t.api.run(vec![]);
    quick(deliver(&t.ctx)).await.unwrap();
    assert_eq!(t.ctx.metrics.namespaces_undelivered.get(), 1);

    // After it, tried again; accepted now: delivered, the old keys Secret deleted,
    // the failure forgotten.
    tokio::time::advance(publish::backoff(1)).await;
    let old_a_keys = first.namespaces["team-a"].keys.clone();
    let server = t.api.run(vec![
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-a.*"),
            echo,
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-index{SSA}"),
            move |body| {
                let index = index_in(body.as_ref().unwrap());
                assert_ne!(index.namespaces["team-a"].keys, old_a_keys);
                echo(body)
            },
        ),
        Expect::new(
            Method::DELETE,
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-a.*"),
            |_| {
                (
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                )
            },
        ),
    ]);
    quick(deliver(&t.ctx)).await.unwrap();
    finish(server).await;
    assert!(t.ctx.world().unwrap().undelivered("team-a").is_none());
    assert_eq!(t.ctx.metrics.namespaces_undelivered.get(), 0);
}

/// A route of a namespace that is not delivered: Programmed=False DeliveryFailed with
/// the API's message, Ready=False with kstatus's Stalled, and a Warning Event.
#[tokio::test]
async fn a_route_of_an_undelivered_namespace_says_delivery_failed_with_an_event() {
    let t = Context::test();
    let r = route("team-a", "smart", 1, &["openai"]);
    let answer = serde_json::to_value(&r).unwrap();
    let creds = [credential("team-a", "openai", "keys", "openai")];
    let keys = [secret("team-a", "keys", &[("openai", "sk-a")])];
    let rendering = render(
        &Inputs {
            routes: std::slice::from_ref(&r),
            credentials: &creds,
            secrets: &keys,
            ..Default::default()
        },
        &BTreeMap::new(),
        &BTreeMap::new(),
    );
    let why = "writing Secret gw/switchback-keys-team-a.1: data: Too long";
    let undelivered = BTreeMap::from([("team-a".to_string(), why.to_string())]);
    let world = World::new(
        rendering,
        std::slice::from_ref(&r),
        &creds,
        &[],
        undelivered,
    )
    .dated(None, tokio::time::Instant::now());
    *t.ctx.world.write().unwrap() = Some(Arc::new(world));
    let server = t.api.run(vec![
        Expect::new(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/team-a/events?",
            move |body| {
                let b = body.clone().unwrap();
                assert_eq!(b["reason"], "DeliveryFailed");
                assert_eq!(b["type"], "Warning");
                assert_eq!(b["regarding"]["kind"], "LLMRoute");
                assert!(b["note"].as_str().unwrap().ends_with(why), "{b}");
                echo(body)
            },
        ),
        Expect::new(
            Method::PATCH,
            format!("/apis/switchback.dev/v1alpha1/namespaces/team-a/llmroutes/smart/status{SSA}"),
            move |body| {
                let s = &body.as_ref().unwrap()["status"];
                let c = |t: &str| {
                    s["conditions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|c| c["type"] == t)
                        .cloned()
                        .unwrap_or_else(|| panic!("{t} in {s}"))
                };
                assert_eq!(c("Programmed")["status"], "False");
                assert_eq!(c("Programmed")["reason"], "DeliveryFailed");
                assert!(
                    c("Programmed")["message"]
                        .as_str()
                        .unwrap()
                        .contains("Too long")
                );
                assert_eq!(c("Ready")["reason"], "DeliveryFailed");
                assert_eq!(c("Stalled")["status"], "True");
                with_status(&answer, body)
            },
        ),
    ]);
    quick(reconcile_route(Arc::new(r), t.ctx.clone()))
        .await
        .unwrap();
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
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-a.*"),
            |body| {
                let data = body.as_ref().unwrap()["data"].as_object().unwrap().clone();
                assert_eq!(data.keys().collect::<Vec<_>>(), ["_revision-key"], "no key");
                echo(body)
            },
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-a.*"),
            echo,
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-index{SSA}"),
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
            format!("/api/v1/namespaces/{GATEWAY}/secrets/switchback-keys-team-a.*"),
            echo,
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-routes-team-a.*"),
            echo,
        ),
        Expect::new(
            Method::PATCH,
            format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-index{SSA}"),
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
            // Ready (and kstatus's Reconciling while it waits) after the three conditions
            // of a route (operator/README.md#conditions).
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
        undelivered: None,
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
    let world = World::new(
        rendering,
        &routes,
        &creds,
        std::slice::from_ref(&c),
        BTreeMap::new(),
    );
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
    let world = World::new(
        rendering,
        &routes,
        &creds,
        std::slice::from_ref(&c),
        BTreeMap::new(),
    );
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

/// docs/tenancy.md#across-replicas: what is left of a budget is rendered as
/// of the scrape round that summed it (the proxies reserve against their share of it), kept
/// as rendered while it barely moves, rendered again once half a share was spent, and laid
/// over the rendered client.
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

/// One replica's report: route smart's target `team-a/openai` with its circuit open
/// since `since_ms`.
fn open_on_one_replica(since_ms: u64) -> crate::aggregate::Scrape {
    use switchback_crds::fleet::format_ms;
    use switchback_crds::stats::{CircuitState, RouteStats, StatsReport, TargetState, TargetStats};
    crate::aggregate::Scrape {
        endpoint: "http://10.0.0.1:9090".into(),
        result: Ok(StatsReport {
            instance_id: "replica-a".into(),
            routes: vec![RouteStats {
                route: ObjectId::new("team-a", "smart"),
                targets: vec![TargetStats {
                    credential: ObjectId::new("team-a", "openai"),
                    circuit: CircuitState::Open,
                    state: Some(TargetState::CircuitOpen),
                    circuit_since: Some(format_ms(since_ms)),
                    circuit_opened: 1,
                    ..TargetStats::default()
                }],
                ..RouteStats::default()
            }],
            ..StatsReport::default()
        }),
    }
}

/// One scrape round's write of the fleet's view, failing if it makes a call the
/// script does not expect.
async fn write_round(
    ctx: &Context,
    scrapes: &[crate::aggregate::Scrape],
    ttl: Duration,
    written: &mut Option<crate::fleet::Written>,
) {
    quick(super::scrape::write_fleet_view(ctx, scrapes, ttl, written)).await
}

/// The fleet's health view (`fleet`): one ConfigMap by server-side apply, written
/// when its content changes, not again while it holds; a failed write is tried again
/// next round.
#[tokio::test]
async fn the_fleet_view_is_applied_once_per_change_and_retried_after_a_failure() {
    use switchback_crds::fleet::{FleetCircuit, FleetView};
    let t = Context::test();
    let ttl = Duration::from_secs(20);
    let mut written = None;
    let scrapes = [open_on_one_replica(
        Timestamp::now().as_millisecond() as u64 - 1_000,
    )];
    let path = format!("/api/v1/namespaces/{GATEWAY}/configmaps/switchback-health{SSA}");
    // The API server fails the first write: nothing is taken as written.
    let server = t
        .api
        .run(vec![Expect::new(Method::PATCH, path.clone(), |_| {
            (
                500,
                json!({"kind": "Status", "status": "Failure", "code": 500}),
            )
        })]);
    write_round(&t.ctx, &scrapes, ttl, &mut written).await;
    finish(server).await;
    assert!(written.is_none());
    let server = t.api.run(vec![Expect::new(Method::PATCH, path, |body| {
        let b = body.unwrap();
        assert_eq!(b["kind"], "ConfigMap");
        assert_eq!(b["metadata"]["namespace"], GATEWAY);
        assert_eq!(
            b["metadata"]["labels"],
            json!({"app.kubernetes.io/managed-by": "switchback-operator"}),
            "not the delivery's label: the delivery neither watches nor deletes it"
        );
        let view: FleetView =
            serde_json::from_str(b["data"]["view.json"].as_str().unwrap()).unwrap();
        assert_eq!(view.targets.len(), 1);
        assert_eq!(view.targets[0].circuit, FleetCircuit::Open);
        assert_eq!(view.targets[0].prober.as_deref(), Some("replica-a"));
        assert!(!view.expires_at.is_empty());
        (200, b)
    })]);
    write_round(&t.ctx, &scrapes, ttl, &mut written).await;
    finish(server).await;
    assert!(written.is_some());
    // The same round again: nothing to write (no script: a call would hang).
    let server = t.api.run(vec![]);
    write_round(&t.ctx, &scrapes, ttl, &mut written).await;
    finish(server).await;
    // No view at all with a zero TTL.
    let mut none = None;
    write_round(&t.ctx, &scrapes, Duration::ZERO, &mut none).await;
    assert!(none.is_none());
}

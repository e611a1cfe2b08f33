//! What can be measured without a cluster for the benchmark size: 1,000
//! LLMRoutes in 50 namespaces. Render (compile + last-good + split), encoding the 100
//! rendered objects, decoding and merging them as the proxy does, aggregating a scrape
//! round of 3 replicas, and computing every route's status; plus peak heap.
//! The apply-to-Programmed time and status writes per second need an API server:
//! `SWITCHBACK_E2E=1 cargo test -p switchback-tests --test e2e -- --nocapture bench`.
//!
//! `cargo run --release -p switchback-operator --example scale`

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use switchback_crds::compile::{Inputs, Kind};
use switchback_crds::config::ObjectId;
use switchback_crds::credential::CredentialSecretRef;
use switchback_crds::delivery;
use switchback_crds::revision::RevisionKey;
use switchback_crds::route::{CredentialRef, TargetSpec, TotalStats};
use switchback_crds::stats::{RouteStats, StatsReport, TargetStats};
use switchback_crds::{LLMRoute, LLMRouteSpec, ProviderCredential, ProviderCredentialSpec};
use switchback_operator::aggregate::{Aggregator, Scrape};
use switchback_operator::render::render;
use switchback_operator::status::{RouteFacts, route_status};

/// The namespaces `routes` live in.
fn rendering_namespaces(routes: &[LLMRoute]) -> impl Iterator<Item = String> {
    routes
        .iter()
        .filter_map(|r| r.metadata.namespace.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
}

/// Counts live and peak heap bytes.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const NAMESPACES: usize = 50;
const ROUTES: usize = 1_000;
const REPLICAS: usize = 3;

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn time<T>(label: &str, runs: u32, mut f: impl FnMut() -> T) -> T {
    let mut out = f();
    let start = Instant::now();
    for _ in 0..runs {
        out = f();
    }
    let each = start.elapsed() / runs;
    println!("{label:<58} {:>9.2} ms", each.as_secs_f64() * 1e3);
    out
}

fn main() {
    let mut routes = Vec::new();
    let mut credentials = Vec::new();
    let mut secrets = Vec::new();
    for n in 0..NAMESPACES {
        let ns = format!("team-{n:02}");
        for c in ["openai", "anthropic"] {
            let mut cred = ProviderCredential::new(
                c,
                ProviderCredentialSpec {
                    provider: c.into(),
                    secret_ref: CredentialSecretRef {
                        name: "keys".into(),
                        key: c.into(),
                        keys: None,
                    },
                    ..Default::default()
                },
            );
            cred.metadata.namespace = Some(ns.clone());
            credentials.push(cred);
        }
        secrets.push(KubeSecret {
            metadata: ObjectMeta {
                name: Some("keys".into()),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            string_data: Some(BTreeMap::from([
                ("openai".into(), format!("sk-{n}")),
                ("anthropic".into(), format!("sk-ant-{n}")),
            ])),
            ..Default::default()
        });
    }
    for i in 0..ROUTES {
        let ns = format!("team-{:02}", i % NAMESPACES);
        let mut r = LLMRoute::new(
            &format!("route-{i}"),
            LLMRouteSpec {
                targets: ["openai", "anthropic"]
                    .iter()
                    .map(|c| TargetSpec {
                        credential_ref: CredentialRef {
                            name: c.to_string(),
                        },
                        model: Some(format!("{c}-model")),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
        );
        r.metadata.namespace = Some(ns);
        r.metadata.generation = Some(1);
        r.metadata.creation_timestamp = Some(Time(
            Timestamp::from_second(1_800_000_000 + i as i64).unwrap(),
        ));
        routes.push(r);
    }
    let inputs = Inputs {
        routes: &routes,
        credentials: &credentials,
        secrets: &secrets,
        ..Default::default()
    };
    println!(
        "{ROUTES} LLMRoutes, {} ProviderCredentials, {NAMESPACES} namespaces, {REPLICAS} proxy replicas\n",
        credentials.len()
    );
    let revision_keys: BTreeMap<String, RevisionKey> = rendering_namespaces(&routes)
        .map(|ns| (ns, RevisionKey::random()))
        .collect();
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);

    let rendering = time(
        "render (compile every namespace, split per namespace)",
        20,
        || render(&inputs, &BTreeMap::new(), &revision_keys),
    );
    assert_eq!(rendering.namespaces.len(), NAMESPACES);
    assert_eq!(rendering.served.len(), ROUTES);
    let previous: BTreeMap<_, _> = rendering
        .namespaces
        .iter()
        .map(|(ns, p)| (ns.clone(), p.config.clone()))
        .collect();
    time(
        "re-render with the rendered config as last good",
        20,
        || render(&inputs, &previous, &revision_keys),
    );
    let objects = time("encode 50 namespaces' parts + 50 Secrets", 20, || {
        rendering
            .namespaces
            .iter()
            .map(|(ns, p)| {
                let objects =
                    delivery::render_namespace("switchback", ns, p, Default::default()).unwrap();
                (ns.clone(), objects)
            })
            .collect::<Vec<_>>()
    });
    let sizes = || {
        objects
            .iter()
            .flat_map(|(_, o)| &o.parts)
            .map(|cm| cm.data.as_ref().unwrap()[delivery::CONFIG_KEY].len())
    };
    let bytes: usize = sizes().sum();
    let largest = sizes().max().unwrap();
    println!(
        "{:<58} {:>9.1} KiB total, {:.1} KiB largest part (limit 900 KiB)",
        "rendered config JSON",
        bytes as f64 / 1024.0,
        largest as f64 / 1024.0
    );
    time("proxy side: assemble 100 objects and merge", 20, || {
        let parts: Vec<_> = objects
            .iter()
            .map(|(ns, o)| {
                let read = delivery::assemble(
                    ns,
                    &o.entry(),
                    |n| {
                        o.parts
                            .iter()
                            .find(|p| p.metadata.name.as_deref() == Some(n))
                    },
                    |_| Some(&o.keys),
                );
                (ns.clone(), read.unwrap())
            })
            .collect();
        delivery::merge(parts.iter().map(|(ns, p)| (ns.as_str(), p)))
    });

    let report = |replica: usize, round: u64| StatsReport {
        credentials: Default::default(),
        version: 1,
        instance_id: format!("replica-{replica}"),
        started_at: "2027-01-01T00:00:00Z".into(),
        config_generation: 1,
        config_error: None,
        clients: Vec::new(),
        draining: false,
        routes: routes
            .iter()
            .map(|r| {
                let id = ObjectId::new(
                    r.metadata.namespace.clone().unwrap(),
                    r.metadata.name.clone().unwrap(),
                );
                RouteStats {
                    revision: rendering.served.get(&id).map(|s| s.revision),
                    route: id,
                    generation: 1,
                    requests: 100 * round,
                    attempts: 110 * round,
                    fallbacks: 3 * round,
                    failed: round,
                    resumed: 0,
                    cost_usd: Default::default(),
                    fallback_extra_usd: Default::default(),
                    order: Vec::new(),
                    targets: r
                        .spec
                        .targets
                        .iter()
                        .map(|t| TargetStats {
                            credential: ObjectId::new(
                                r.metadata.namespace.clone().unwrap(),
                                &t.credential_ref.name,
                            ),
                            model: t.model.clone(),
                            ..Default::default()
                        })
                        .collect(),
                }
            })
            .collect(),
    };
    let started = 1_800_000_000_000u64;
    let mut agg = Aggregator::new(300_000, started);
    let mut round = 0u64;
    time(
        "aggregate one scrape round (3 replicas x 1000 routes)",
        20,
        || {
            round += 1;
            let scrapes: Vec<Scrape> = (0..REPLICAS)
                .map(|i| Scrape {
                    endpoint: format!("http://10.0.0.{i}:9090"),
                    result: Ok(report(i, round)),
                })
                .collect();
            agg.observe(started + round * 2_000, &scrapes)
        },
    );
    let proxies = agg.snapshot().clone();
    let now = Time(Timestamp::from_second(1_900_000_000).unwrap());
    time("compute the status of every route", 20, || {
        routes
            .iter()
            .map(|r| {
                let id = ObjectId::new(
                    r.metadata.namespace.clone().unwrap(),
                    r.metadata.name.clone().unwrap(),
                );
                route_status(&RouteFacts {
                    route: r,
                    diagnostics: rendering.diagnostics(Kind::LLMRoute, &id).collect(),
                    served: rendering.served.get(&id).copied(),
                    undelivered: None,
                    proxies: &proxies,
                    seed: TotalStats::default(),
                    now: now.clone(),
                })
            })
            .collect::<Vec<_>>()
    });
    println!(
        "\n{:<58} {:>9.1} MiB",
        "peak heap above the inputs (all of the above)",
        mib(PEAK.load(Ordering::Relaxed).saturating_sub(base))
    );
    println!(
        "{:<58} {:>9.1} MiB",
        "live heap: inputs + rendering + aggregator",
        mib(LIVE.load(Ordering::Relaxed))
    );
}

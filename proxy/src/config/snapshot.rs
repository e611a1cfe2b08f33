//! The serving snapshot: a compiled config prepared for the request path (routes
//! indexed by model name, upstream URLs and auth headers built, HTTP clients chosen)
//! plus the per-target runtime state that outlives reloads.
//!
//! Preparing is fallible and happens off the request path; the result is swapped in
//! whole (see `reload`), and each request holds the one snapshot it started with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderValue};
use switchback_crds::compile::Compiled;
use switchback_crds::config::{Client, CompiledConfig, Credential, ObjectId, Route, Target};
use switchback_crds::keyhash::KeyHash;
use switchback_crds::revision::{Revision, Revisions};
use switchback_crds::secret::Secret;

use crate::limits::circuit::Breaker;
use crate::limits::clients::{
    ClientCounters, ClientRt, ClientUsage, Limits, RouteTokens, Shares, Spent, WallClock,
};
use crate::limits::concurrency::Limiter;
use crate::observe::counters::{Histogram, RouteCounters, RouteTargetCounters};
use crate::observe::reason::Reason;
use crate::providers::{self, Adapter, Endpoint, Kept};
use crate::upstream::{self, Clients};
use crate::wire::rewrite::JsonStr;
use crate::wire::surface::Surface;

/// Runtime facts about one target (credential + upstream model), shared by every
/// route and snapshot that uses it, updated from the request path without holding a
/// lock across an await.
#[derive(Debug, Default)]
pub struct TargetState {
    /// Milliseconds on the proxy clock until which the target is parked after a 429.
    parked_until_ms: AtomicU64,
    /// What the target was prepared from (URL, provider, headers, key), hashed: a
    /// reload that changes it clears the park, which was about the old target.
    fingerprint: AtomicU64,
    /// Smoothed latency in microseconds; 0 = never measured.
    latency_ewma_us: AtomicU64,
    pub breaker: Breaker,
    /// Latency of answered attempts (full answer, or first content event for streams).
    pub latency: Histogram,
    last_failure: Mutex<Option<FailureRecord>>,
}

/// The last failure of a target, for stats.
#[derive(Debug, Clone, Copy)]
pub struct FailureRecord {
    pub status: Option<u16>,
    pub reason: Reason,
    pub at: SystemTime,
}

impl TargetState {
    pub fn parked_until_ms(&self) -> u64 {
        self.parked_until_ms.load(Ordering::Relaxed)
    }

    /// Park until `until_ms`, never shortening an existing park.
    pub fn park_until(&self, until_ms: u64) {
        self.parked_until_ms.fetch_max(until_ms, Ordering::Relaxed);
    }

    /// Is the target parked at `now_ms` for a route whose `maxRetryAfter` is
    /// `cap_ms`? A park never outlives the cap: one set under a larger cap (another
    /// route, or before a reload lowered it) is cut down to it here.
    pub fn parked(&self, now_ms: u64, cap_ms: u64) -> bool {
        let until = self.parked_until_ms.load(Ordering::Relaxed);
        if until <= now_ms {
            return false;
        }
        let latest = now_ms.saturating_add(cap_ms);
        if until > latest {
            self.parked_until_ms.fetch_min(latest, Ordering::Relaxed);
            return latest > now_ms;
        }
        true
    }

    /// Record what the target is now prepared from; a change clears the park.
    fn adopt(&self, fingerprint: u64) {
        let old = self.fingerprint.swap(fingerprint, Ordering::Relaxed);
        if old != 0 && old != fingerprint {
            self.parked_until_ms.store(0, Ordering::Relaxed);
        }
    }

    pub fn latency_ewma_us(&self) -> u64 {
        self.latency_ewma_us.load(Ordering::Relaxed)
    }

    pub fn record_failure(&self, status: Option<u16>, reason: Reason) {
        let rec = FailureRecord {
            status,
            reason,
            at: SystemTime::now(),
        };
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(rec);
    }

    pub fn last_failure(&self) -> Option<FailureRecord> {
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fold one measurement in (weight 0.2 for the new sample).
    pub fn observe_latency(&self, sample: Duration) {
        let sample = (sample.as_micros() as u64).max(1);
        let _ = self
            .latency_ewma_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 {
                    sample
                } else {
                    (old * 4 + sample) / 5
                })
            });
    }
}

/// Identity of a target's runtime state: circuit, parking and latency belong to the
/// pair (credential, upstream model), whichever routes use it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TargetKey {
    pub credential: ObjectId,
    pub model: Option<String>,
    /// A `modelMap` target's map (empty otherwise): one state for the whole map.
    pub model_map: std::collections::BTreeMap<String, String>,
}

/// Everything that outlives a reload: target state, counters, concurrency limiters.
/// Only touched while preparing a snapshot; the request path holds `Arc`s.
#[derive(Debug, Default)]
pub struct Carried(Mutex<CarriedMaps>);

#[derive(Debug, Default)]
struct CarriedMaps {
    targets: HashMap<TargetKey, Arc<TargetState>>,
    routes: HashMap<ObjectId, Arc<RouteCounters>>,
    route_targets: HashMap<(ObjectId, TargetKey), Arc<RouteTargetCounters>>,
    /// Keyed by the limits too: changing them starts a fresh limiter.
    limiters: HashMap<(ObjectId, u32, u32), Arc<Limiter>>,
    /// Per LLMClient, never dropped: `/admin/v1/stats` reports every client seen
    /// since start, and a client whose key goes missing for a while must not come
    /// back with its counters reset (the operator sums per-instance deltas).
    clients: HashMap<ObjectId, Arc<ClientCounters>>,
    /// Per (client, route), for `switchback_client_tokens_total`; never dropped either.
    client_routes: HashMap<(ObjectId, ObjectId), Arc<RouteTokens>>,
    /// Keyed by the shares too: new shares (limits or replicas changed) start fresh.
    client_limits: HashMap<(ObjectId, Shares), Arc<Limits>>,
    /// What providers keep per credential and key across reloads (an OAuth token).
    kept: Kept,
}

impl Carried {
    /// Every client's counters, by client (for the stats document and metrics).
    pub fn clients(&self) -> Vec<(ObjectId, Arc<ClientCounters>)> {
        sorted(&self.0.lock().unwrap_or_else(|p| p.into_inner()).clients)
    }

    /// Every (client, route) token count.
    pub fn client_routes(&self) -> Vec<((ObjectId, ObjectId), Arc<RouteTokens>)> {
        sorted(
            &self
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .client_routes,
        )
    }
}

/// A copy of `map`'s entries, sorted by key (the order the reports list them in).
fn sorted<K: Clone + Ord, V>(map: &HashMap<K, Arc<V>>) -> Vec<(K, Arc<V>)> {
    let mut v: Vec<_> = map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// How the clients of a snapshot are served, fixed for the process.
#[derive(Debug, Clone, Copy)]
pub struct ClientEnv {
    /// No operator (manifests): budgets are enforced from this replica's own counts.
    pub standalone: bool,
    pub clock: WallClock,
}

fn carried<K: std::hash::Hash + Eq, V: Default>(map: &mut HashMap<K, Arc<V>>, key: K) -> Arc<V> {
    map.entry(key).or_default().clone()
}

/// Drop what no live object uses any more (the previous snapshot may still hold some
/// until its last request ends; they go at the next reload).
fn prune<K, V>(map: &mut HashMap<K, Arc<V>>) {
    map.retain(|_, v| Arc::strong_count(v) > 1);
}

#[derive(Debug)]
pub struct CredentialRt {
    pub spec: Credential,
    /// Its provider's adapter: how requests reach it (see `providers`).
    pub adapter: &'static dyn Adapter,
    /// Where its requests go and how each is authorised.
    pub endpoint: Box<dyn Endpoint>,
    /// Rendered `namespace/name`, the `x-switchback-target` value.
    pub target_header: HeaderValue,
    /// The host its requests go to (`server.address` of attempt spans).
    pub host: Box<str>,
    /// Static headers plus the key's; `None` when the key is missing or unusable.
    pub headers: Option<HeaderMap>,
    /// Key material, only to mask it in provider error bodies relayed to clients
    /// (some echo it back); `None` when missing.
    pub secret: Option<Secret<String>>,
    pub client: upstream::Lanes,
    /// `maxConcurrency` / `maxQueue`, when set.
    pub limiter: Option<Arc<Limiter>>,
}

impl std::fmt::Debug for dyn Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.system())
    }
}

/// A target's URLs for one model it names, by surface and streaming (see
/// [`TargetRt::url`]).
pub type ModelUrls = [Option<http::Uri>; 2 * Surface::ALL.len()];

fn url_slot(surface: Surface, stream: bool) -> usize {
    2 * surface.index() + usize::from(stream)
}

#[derive(Debug)]
pub struct TargetRt {
    pub spec: Target,
    pub credential: Arc<CredentialRt>,
    pub state: Arc<TargetState>,
    pub counters: Arc<RouteTargetCounters>,
    /// `namespace/name` of the credential, for attempt logs.
    pub label: String,
    /// The upstream model (`model`) as a JSON literal, spliced into request bodies.
    pub model_json: Option<JsonStr>,
    /// `modelMap` as JSON literals, by the name the client sent.
    pub model_map_json: HashMap<String, JsonStr>,
    /// For endpoints whose URLs name the model: the URLs of the models this target
    /// names (`model`, the `modelMap` values), made once. A model named by the
    /// client (neither set) is made per request.
    pub urls: HashMap<String, ModelUrls>,
}

impl TargetRt {
    /// The model this target is asked for: its own, the one `modelMap` gives the
    /// client's name, or the client's.
    pub fn model<'a>(&'a self, client_model: &'a str) -> &'a str {
        self.spec.upstream_model(client_model)
    }

    /// The upstream model to splice into a request body whose client sent
    /// `client_model`; `None`: leave the client's.
    pub fn upstream_model_json(&self, client_model: &str) -> Option<&JsonStr> {
        self.model_json
            .as_ref()
            .or_else(|| self.model_map_json.get(client_model))
    }

    /// Where a request of `surface` (the API called upstream) for `client_model`
    /// goes; `None` only for a model name no URL can carry.
    pub fn url(&self, surface: Surface, client_model: &str, stream: bool) -> Option<http::Uri> {
        let endpoint = &self.credential.endpoint;
        if !endpoint.url_names_model() {
            return endpoint.url(surface, client_model, stream);
        }
        let model = self.model(client_model);
        match self.urls.get(model) {
            Some(urls) => urls[url_slot(surface, stream)].clone(),
            None => endpoint.url(surface, model, stream),
        }
    }

    /// The URLs of `model` on `endpoint`, for [`TargetRt::urls`].
    pub fn model_urls(endpoint: &dyn Endpoint, model: &str) -> ModelUrls {
        let mut urls: ModelUrls = Default::default();
        for surface in Surface::ALL {
            for stream in [false, true] {
                urls[url_slot(surface, stream)] = endpoint.url(surface, model, stream);
            }
        }
        urls
    }
}

#[derive(Debug)]
pub struct RouteRt {
    pub spec: Route,
    /// Digest of the route, its credentials and keys as served, reported in
    /// `/admin/v1/stats` so the operator sees credential and key changes arrive.
    pub revision: Revision,
    pub route_header: HeaderValue,
    /// `metadata.generation` of the LLMRoute, the `x-switchback-generation` value.
    pub generation_header: HeaderValue,
    pub targets: Vec<TargetRt>,
    pub counters: Arc<RouteCounters>,
}

/// The route serving one model name, with that name ready to splice into answers.
#[derive(Debug, Clone)]
pub struct ModelRoute {
    pub route: Arc<RouteRt>,
    pub model_json: JsonStr,
    /// In a client's map: where its usage on this route is counted.
    pub client: Option<ClientUsage>,
}

/// One LLMClient as the request path sees it: who it is and the model names it may
/// call, resolved once per snapshot so a request does one hash-map lookup.
#[derive(Debug)]
pub struct Tenant {
    pub id: ObjectId,
    /// `namespace/name`, for the request log and spans.
    pub label: Arc<str>,
    pub key_hash: KeyHash,
    /// By model name, only among the routes this client may call.
    pub models: HashMap<String, ModelRoute>,
    /// The routes it may call, in config order (for `/v1/models`).
    pub route_list: Vec<Arc<RouteRt>>,
    /// Counters, limits and budgets.
    pub rt: Arc<ClientRt>,
}

/// The clients that can authenticate, by the HMAC of their key.
pub type Tenants = HashMap<KeyHash, Tenant, ByKeyHash>;

/// Hashes a [`KeyHash`] by its first 8 bytes, instead of SipHash over all 32 (about
/// 250 instructions per request). A key hash is an HMAC-SHA256 output: uniformly
/// distributed, and no caller can aim a presented key at a bucket (or learn more than
/// chance from which bucket its key's hash lands in) without the cluster secret, which
/// is what SipHash's random seed would otherwise guard against. Only for `KeyHash`
/// keys: the length prefix is ignored and only the first 8 bytes of a write count.
#[derive(Debug, Default, Clone, Copy)]
pub struct ByKeyHash;

impl std::hash::BuildHasher for ByKeyHash {
    type Hasher = KeyHashHasher;

    fn build_hasher(&self) -> KeyHashHasher {
        KeyHashHasher(0)
    }
}

/// See [`ByKeyHash`].
#[derive(Debug)]
pub struct KeyHashHasher(u64);

impl std::hash::Hasher for KeyHashHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut first = [0u8; 8];
        let n = bytes.len().min(8);
        first[..n].copy_from_slice(&bytes[..n]);
        self.0 ^= u64::from_le_bytes(first);
    }

    /// The slice length `Hash` writes before the bytes: the same for every key.
    fn write_usize(&mut self, _: usize) {}

    fn finish(&self) -> u64 {
        self.0
    }
}

/// What one request sees of the config.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub config: CompiledConfig,
    /// `--auth required`: requests are served only to [`Snapshot::tenants`], and
    /// [`Snapshot::routes`] is empty (model names are not global).
    pub auth_required: bool,
    /// By the model names clients send, with authentication off.
    pub routes: HashMap<String, ModelRoute>,
    /// With authentication required: the clients that can authenticate, by key hash.
    pub tenants: Tenants,
    /// Every route, in config order (for `/v1/models`).
    pub route_list: Vec<Arc<RouteRt>>,
    pub credentials: HashMap<ObjectId, Arc<CredentialRt>>,
    /// Which load this is (`configGeneration` of `/admin/v1/stats`, set when it is
    /// applied): the `x-switchback-generation` of answers given before a route is
    /// chosen.
    pub generation: ConfigGeneration,
}

/// The load count of a snapshot as a header value (`0` before the first load).
#[derive(Debug, Clone)]
pub struct ConfigGeneration(pub HeaderValue);

impl Default for ConfigGeneration {
    fn default() -> Self {
        Self(HeaderValue::from_static("0"))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("{credential}: {field}: {message}")]
    Credential {
        credential: ObjectId,
        field: &'static str,
        message: String,
    },
    #[error(
        "{route}: spec.targets[{index}].credentialRef: credential {credential} is not in the config"
    )]
    DanglingCredential {
        route: ObjectId,
        index: usize,
        credential: ObjectId,
    },
    #[error("model {model:?} is served by both {first} and {second}")]
    DuplicateModel {
        model: String,
        first: ObjectId,
        second: ObjectId,
    },
    #[error(
        "client {client} may call both {} and {}, which both serve the model {model:?}",
        .routes[0],
        .routes[1]
    )]
    ClientDuplicateModel {
        client: ObjectId,
        model: String,
        /// Boxed: keeps the error (returned by every prepare step) small.
        routes: Box<[ObjectId; 2]>,
    },
}

/// Build the serving snapshot. Fails without side effects on the live config.
///
/// `auth_required`: index the model names per client (the clients with a key hash),
/// not globally.
pub fn prepare(
    compiled: &Compiled,
    clients: &Clients,
    carried_state: &Carried,
    auth_required: bool,
    env: ClientEnv,
) -> Result<Snapshot, PrepareError> {
    let mut maps = carried_state.0.lock().unwrap_or_else(|p| p.into_inner());
    let mut credentials = HashMap::new();
    for c in &compiled.config.credentials {
        let limiter = c.max_concurrency.map(|max| {
            let queue = c.max_queue.unwrap_or(0);
            let key = (c.id.clone(), max, queue);
            maps.limiters
                .entry(key)
                .or_insert_with(|| Arc::new(Limiter::new(max, queue)))
                .clone()
        });
        credentials.insert(
            c.id.clone(),
            Arc::new(prepare_credential(
                c,
                compiled,
                clients,
                limiter,
                &mut maps.kept,
            )?),
        );
    }
    let mut routes = HashMap::new();
    let mut route_list = Vec::new();
    let revisions = Revisions::new(&compiled.config, &compiled.keys);
    for r in &compiled.config.routes {
        let mut targets = Vec::with_capacity(r.targets.len());
        for (index, t) in r.targets.iter().enumerate() {
            let credential = credentials.get(&t.credential).cloned().ok_or_else(|| {
                PrepareError::DanglingCredential {
                    route: r.id.clone(),
                    index,
                    credential: t.credential.clone(),
                }
            })?;
            let key = TargetKey {
                credential: t.credential.clone(),
                model: t.model.clone(),
                model_map: t.model_map.clone(),
            };
            let state = carried(&mut maps.targets, key.clone());
            state.adopt(fingerprint(&credential.spec, compiled));
            targets.push(TargetRt {
                spec: t.clone(),
                counters: carried(&mut maps.route_targets, (r.id.clone(), key.clone())),
                state,
                label: t.credential.to_string(),
                model_json: t.model.as_deref().map(JsonStr::new),
                model_map_json: t
                    .model_map
                    .iter()
                    .map(|(client, upstream)| (client.clone(), JsonStr::new(upstream)))
                    .collect(),
                urls: if credential.endpoint.url_names_model() {
                    t.model
                        .iter()
                        .chain(t.model_map.values())
                        .map(|m| (m.clone(), TargetRt::model_urls(&*credential.endpoint, m)))
                        .collect()
                } else {
                    HashMap::new()
                },
                credential,
            });
        }
        let route = Arc::new(RouteRt {
            counters: carried(&mut maps.routes, r.id.clone()),
            route_header: header_value(&r.id.to_string()),
            generation_header: HeaderValue::from(r.generation),
            revision: revisions.route(r),
            spec: r.clone(),
            targets,
        });
        for m in r.models.iter().filter(|_| !auth_required) {
            let entry = ModelRoute {
                route: route.clone(),
                model_json: JsonStr::new(m),
                client: None,
            };
            if let Some(prev) = routes.insert(m.clone(), entry) {
                return Err(PrepareError::DuplicateModel {
                    model: m.clone(),
                    first: prev.route.spec.id.clone(),
                    second: r.id.clone(),
                });
            }
        }
        route_list.push(route);
    }
    let tenants = if auth_required {
        prepare_tenants(&compiled.config.clients, &route_list, &mut maps, env)?
    } else {
        Tenants::default()
    };
    prune(&mut maps.targets);
    prune(&mut maps.routes);
    prune(&mut maps.route_targets);
    prune(&mut maps.limiters);
    prune(&mut maps.client_limits);
    maps.kept.prune();
    Ok(Snapshot {
        config: compiled.config.clone(),
        auth_required,
        routes,
        tenants,
        route_list,
        credentials,
        generation: ConfigGeneration::default(),
    })
}

/// A hash of what a target's requests are made from; never 0 (0 = not yet prepared).
fn fingerprint(c: &Credential, compiled: &Compiled) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (c.provider, &c.base_url, &c.headers, &c.api_version).hash(&mut h);
    compiled.keys.get(&c.id).map(|k| k.expose()).hash(&mut h);
    h.finish().max(1)
}

/// Each client that can authenticate, with the model names of the routes it may call.
/// A route the config does not hold, or that is not offered to the client's
/// namespace, is not callable; two callable routes serving one name refuse the config
/// (`compile` resolves that per client already, so only a foreign config gets here).
fn prepare_tenants(
    config_clients: &[Client],
    route_list: &[Arc<RouteRt>],
    maps: &mut CarriedMaps,
    env: ClientEnv,
) -> Result<Tenants, PrepareError> {
    let by_id: HashMap<&ObjectId, &Arc<RouteRt>> =
        route_list.iter().map(|r| (&r.spec.id, r)).collect();
    let mut tenants = Tenants::with_capacity_and_hasher(config_clients.len(), ByKeyHash);
    for c in config_clients {
        // Counted (and reported) even while the key is missing: zeros, not absent.
        let counters = carried(&mut maps.clients, c.id.clone());
        let Some(key_hash) = c.key_hash else { continue };
        let rt = Arc::new(client_rt(c, counters, maps, env));
        let mut models = HashMap::new();
        let mut callable: Vec<Arc<RouteRt>> = Vec::new();
        for id in &c.routes {
            let Some(route) = by_id.get(id) else { continue };
            if !route.spec.is_offered_to(&c.id.namespace) {
                continue;
            }
            for m in &route.spec.models {
                let entry = ModelRoute {
                    route: (*route).clone(),
                    model_json: JsonStr::new(m),
                    client: Some(ClientUsage {
                        client: rt.clone(),
                        route: carried(&mut maps.client_routes, (c.id.clone(), (*id).clone())),
                    }),
                };
                if let Some(prev) = models.insert(m.clone(), entry) {
                    return Err(PrepareError::ClientDuplicateModel {
                        client: c.id.clone(),
                        model: m.clone(),
                        routes: Box::new([prev.route.spec.id.clone(), id.clone()]),
                    });
                }
            }
            callable.push((*route).clone());
        }
        callable.sort_by_key(|r| {
            route_list
                .iter()
                .position(|x| Arc::ptr_eq(x, r))
                .unwrap_or(usize::MAX)
        });
        tenants.insert(
            key_hash,
            Tenant {
                id: c.id.clone(),
                label: rt.label.clone(),
                key_hash,
                models,
                route_list: callable,
                rt,
            },
        );
    }
    Ok(tenants)
}

/// One client's runtime: its counters, this replica's share of its limits, and its
/// budgets (the operator's verdict, or standalone the budget itself).
fn client_rt(
    c: &Client,
    counters: Arc<ClientCounters>,
    maps: &mut CarriedMaps,
    env: ClientEnv,
) -> ClientRt {
    let shares = Limits::shares(c);
    let limits = (shares != (None, None, None)).then(|| {
        maps.client_limits
            .entry((c.id.clone(), shares))
            .or_insert_with(|| Arc::new(Limits::new(shares)))
            .clone()
    });
    let exhausted =
        c.exhausted
            .as_ref()
            .and_then(|e| match humantime::parse_rfc3339_weak(&e.until) {
                Ok(until) => Some(Spent {
                    budget: e.budget.as_str().into(),
                    until,
                }),
                Err(err) => {
                    tracing::warn!(client = %c.id, until = %e.until, error = %err,
                    "exhausted.until is not an RFC 3339 time; the client is not held back");
                    None
                }
            });
    let budget = c.budget;
    let has_budget = budget.tokens_per_day.is_some() || budget.usd_per_month.is_some();
    ClientRt {
        id: c.id.clone(),
        label: c.id.to_string().into(),
        counters,
        limits,
        exhausted,
        standalone_budget: (env.standalone && has_budget).then_some(budget),
        standalone: env.standalone,
        clock: env.clock,
    }
}

fn header_value(s: &str) -> HeaderValue {
    // Object names are DNS labels: always valid header values.
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

fn prepare_credential(
    c: &Credential,
    compiled: &Compiled,
    clients: &Clients,
    limiter: Option<Arc<Limiter>>,
    kept: &mut Kept,
) -> Result<CredentialRt, PrepareError> {
    let adapter = providers::adapter(c.provider);
    let prepared = adapter
        .prepare(c, compiled.keys.get(&c.id), kept)
        .map_err(|e| PrepareError::Credential {
            credential: c.id.clone(),
            field: e.field,
            message: e.message,
        })?;
    let host = c
        .base_url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(Box::from))
        .unwrap_or_default();
    Ok(CredentialRt {
        adapter,
        endpoint: prepared.endpoint,
        target_header: header_value(&c.id.to_string()),
        host,
        headers: prepared.headers,
        secret: prepared.secret,
        client: if c.allow_private_network {
            clients.private.clone()
        } else {
            clients.public.clone()
        },
        limiter,
        spec: c.clone(),
    })
}

#[cfg(test)]
mod park_tests {
    use super::TargetState;

    #[test]
    fn a_park_never_outlives_the_cap_it_is_read_under() {
        let t = TargetState::default();
        // Parked for an hour, under a route (or a config) whose cap was larger.
        t.park_until(1_000 + 3_600_000);
        assert!(t.parked(1_000, 10_000));
        assert!(t.parked_until_ms() <= 11_000, "cut down to the cap");
        assert!(t.parked(10_999, 10_000));
        assert!(!t.parked(11_000, 10_000));
        // Absurd ends saturate instead of wrapping.
        t.park_until(u64::MAX);
        assert!(t.parked(20_000, u64::MAX));
        assert!(!t.parked(u64::MAX, 5));
    }

    #[test]
    fn a_target_made_from_something_else_is_no_longer_parked() {
        let t = TargetState::default();
        t.adopt(7);
        t.park_until(60_000);
        t.adopt(7); // a reload that kept the target as it was
        assert!(t.parked(0, u64::MAX));
        t.adopt(8); // its URL, headers or key changed
        assert!(!t.parked(0, u64::MAX));
    }
}

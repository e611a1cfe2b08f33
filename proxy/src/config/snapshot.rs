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

use http::header::{HeaderMap, HeaderName, HeaderValue};
use switchback_crds::compile::Compiled;
use switchback_crds::config::{
    AwsKeys, Client, CompiledConfig, Credential, ObjectId, Provider, Route, Target,
};
use switchback_crds::keyhash::KeyHash;
use switchback_crds::revision::{Revision, Revisions};
use switchback_crds::secret::Secret;

use crate::limits::circuit::Breaker;
use crate::limits::clients::{
    ClientCounters, ClientRt, ClientUsage, Limits, RouteTokens, Shares, Spent, WallClock,
};
use crate::limits::concurrency::Limiter;
use crate::observe::counters::{Histogram, RouteCounters, RouteTargetCounters};
use crate::pipeline::outcome::Reason;
use crate::providers::vertex;
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
    /// Vertex OAuth tokens, by credential and a hash of its service-account key: a
    /// reload that keeps the key keeps the token, a rotated key starts without one.
    tokens: HashMap<(ObjectId, u64), Arc<vertex::TokenCache>>,
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

/// One upstream URL per client surface, indexed by `Surface::index`.
pub type PerSurface = [http::Uri; Surface::ALL.len()];

/// The URL of every surface, or the first error making one.
fn per_surface<E>(mut url: impl FnMut(Surface) -> Result<http::Uri, E>) -> Result<PerSurface, E> {
    let mut urls: PerSurface = Default::default();
    for (slot, s) in urls.iter_mut().zip(Surface::ALL) {
        *slot = url(s)?;
    }
    Ok(urls)
}

#[derive(Debug)]
pub struct CredentialRt {
    pub spec: Credential,
    /// Rendered `namespace/name`, the `x-switchback-target` value.
    pub target_header: HeaderValue,
    /// Upstream URL per surface (indexed by `Surface::index`).
    pub urls: PerSurface,
    /// Static headers plus the auth header; `None` when the key is missing. (Vertex:
    /// without the auth header, which each request gets from `vertex`.)
    pub headers: Option<HeaderMap>,
    /// Vertex only, with its key: the signer and token cache that authorise requests.
    pub vertex: Option<vertex::Auth>,
    /// The key itself, only to mask it in provider error bodies relayed to clients
    /// (some echo it back); `None` when missing. For bedrock, the secret access key.
    pub key: Option<Secret<String>>,
    /// bedrock: signs each request (SigV4) with the keys from the Secret; `None`
    /// for other providers and when the keys are missing.
    pub signer: Option<crate::providers::bedrock::sigv4::Signer>,
    pub client: upstream::Lanes,
    /// `maxConcurrency` / `maxQueue`, when set.
    pub limiter: Option<Arc<Limiter>>,
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
    /// azure-openai with a dated `apiVersion`: the classic URLs (per surface) of the
    /// deployments this target names (`model`, the `modelMap` values), made once.
    /// A deployment named by the client (neither set) is made per request.
    pub deployment_urls: HashMap<String, PerSurface>,
    /// gemini, vertex and bedrock, whose URLs name the model: the unary and stream
    /// URLs (`generateContent` and `streamGenerateContent?alt=sse`; for Claude on
    /// vertex `rawPredict` and `streamRawPredict`; bedrock's `converse` and
    /// `converse-stream`) of the models this target names (`model`, the `modelMap`
    /// values), made once. A model named by the client (neither set) is made per
    /// request.
    pub model_urls: HashMap<String, [http::Uri; 2]>,
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

    /// Where a request of `surface` for `client_model` goes: the credential's URL,
    /// or for Azure's classic API the deployment's (`None` only for a deployment
    /// name no URL can carry).
    pub fn url(&self, surface: Surface, client_model: &str) -> Option<http::Uri> {
        if self.credential.spec.api_version.is_none() {
            return Some(self.credential.urls[surface.index()].clone());
        }
        let deployment = self.model(client_model);
        match self.deployment_urls.get(deployment) {
            Some(urls) => Some(urls[surface.index()].clone()),
            None => self.credential.deployment_url(surface, deployment),
        }
    }
}

impl TargetRt {
    /// Where a Gemini, Vertex or Bedrock request for `client_model` goes (see
    /// [`CredentialRt::model_url`]; `None` only for a model name no URL can carry).
    pub fn model_url(&self, client_model: &str, stream: bool) -> Option<http::Uri> {
        let model = self.model(client_model);
        match self.model_urls.get(model) {
            Some(urls) => Some(urls[usize::from(stream)].clone()),
            None => self.credential.model_url(model, stream),
        }
    }
}

/// `s` percent-encoded as one URL path segment (unreserved characters kept).
fn push_segment(url: &mut String, s: &str) {
    push_segment_keeping(url, s, b"");
}

/// [`push_segment`], also keeping the bytes of `keep` unescaped (Vertex's model
/// versions, `claude-x@20250101`, go in the path as they are).
pub(crate) fn push_segment_keeping(url: &mut String, s: &str, keep: &[u8]) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            url.push(b as char);
        } else {
            url.push_str(&format!("%{b:02X}"));
        }
    }
}

impl CredentialRt {
    /// The URL of a provider that names the model in it: Gemini's
    /// ([`CredentialRt::gemini_url`]), Vertex's ([`vertex::url`]) or Bedrock's
    /// ([`CredentialRt::bedrock_url`]). `None` for other providers.
    pub fn model_url(&self, model: &str, stream: bool) -> Option<http::Uri> {
        match self.spec.provider {
            Provider::Gemini => self.gemini_url(model, stream),
            Provider::Vertex => vertex::url(&self.spec, model, stream),
            Provider::Bedrock => self.bedrock_url(model, stream),
            _ => None,
        }
    }

    /// Bedrock's `{baseURL}/model/{modelId}/converse`, or `/converse-stream`. The
    /// model id (a name such as `anthropic.claude-3-5-sonnet-20240620-v1:0`, an
    /// inference profile, or an ARN with its colons and slashes) is one
    /// percent-encoded path segment.
    pub fn bedrock_url(&self, model: &str, stream: bool) -> Option<http::Uri> {
        let mut url = String::with_capacity(self.spec.base_url.len() + model.len() * 3 + 24);
        url.push_str(&self.spec.base_url);
        url.push_str("/model/");
        push_segment(&mut url, model);
        url.push_str(if stream {
            "/converse-stream"
        } else {
            "/converse"
        });
        url.parse().ok()
    }

    /// Gemini's `{baseURL}/models/{model}:generateContent`, or
    /// `:streamGenerateContent?alt=sse` (SSE framing; without it Google streams a
    /// JSON array). The model is one percent-encoded path segment; a leading
    /// `models/` (the resource name Google's own answers use) is taken as written
    /// twice and dropped.
    pub fn gemini_url(&self, model: &str, stream: bool) -> Option<http::Uri> {
        let model = model.strip_prefix("models/").unwrap_or(model);
        let mut url = String::with_capacity(self.spec.base_url.len() + model.len() + 48);
        url.push_str(&self.spec.base_url);
        url.push_str("/models/");
        push_segment(&mut url, model);
        url.push_str(if stream {
            ":streamGenerateContent?alt=sse"
        } else {
            ":generateContent"
        });
        url.parse().ok()
    }

    /// Azure OpenAI's classic path of `surface` for `deployment`:
    /// `{baseURL}/deployments/{deployment}/chat/completions?api-version=...`, the
    /// deployment percent-encoded as one path segment. `None` without an
    /// `apiVersion` (the v1 API has no deployment in its path).
    pub fn deployment_url(&self, surface: Surface, deployment: &str) -> Option<http::Uri> {
        let version = self.spec.api_version.as_deref()?;
        let mut url = String::with_capacity(self.spec.base_url.len() + deployment.len() + 64);
        url.push_str(&self.spec.base_url);
        url.push_str("/deployments/");
        push_segment(&mut url, deployment);
        url.push_str(surface.upstream_path());
        url.push_str("?api-version=");
        url.push_str(version);
        url.parse().ok()
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

const ANTHROPIC_VERSION: &str = "2023-06-01";

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
        let tokens = match compiled.keys.get(&c.id) {
            Some(key) if c.provider == Provider::Vertex => {
                let key = (c.id.clone(), key_hash(key.expose()));
                Some(carried(&mut maps.tokens, key))
            }
            _ => None,
        };
        credentials.insert(
            c.id.clone(),
            Arc::new(prepare_credential(c, compiled, clients, limiter, tokens)?),
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
                deployment_urls: t
                    .model
                    .iter()
                    .chain(t.model_map.values())
                    .filter_map(|d| {
                        let urls = per_surface(|s| credential.deployment_url(s, d).ok_or(()));
                        Some((d.clone(), urls.ok()?))
                    })
                    .collect(),
                model_urls: if matches!(
                    credential.spec.provider,
                    Provider::Gemini | Provider::Vertex | Provider::Bedrock
                ) {
                    t.model
                        .iter()
                        .chain(t.model_map.values())
                        .filter_map(|m| {
                            let url = |stream| credential.model_url(m, stream);
                            Some((m.clone(), [url(false)?, url(true)?]))
                        })
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
    prune(&mut maps.tokens);
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

/// A hash of a key's text, to tell a rotated key from the one a token was made with.
fn key_hash(key: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
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
    tokens: Option<Arc<vertex::TokenCache>>,
) -> Result<CredentialRt, PrepareError> {
    let err = |field: &'static str, message: String| PrepareError::Credential {
        credential: c.id.clone(),
        field,
        message,
    };
    // Azure's v1 API lives under `{baseURL}/v1`; its classic paths are made per
    // deployment (`TargetRt::url`), these then only name the host.
    let version_prefix = if c.provider == Provider::AzureOpenai {
        "/v1"
    } else {
        ""
    };
    let url = |s: Surface| {
        format!("{}{version_prefix}{}", c.base_url, s.upstream_path())
            .parse::<http::Uri>()
            .map_err(|e| {
                err(
                    "spec.baseURL",
                    format!("{:?} is not a valid URL: {e}", c.base_url),
                )
            })
    };
    let urls = per_surface(url)?;
    // A vertex key is a service-account JSON key, never a header: each request gets
    // an OAuth token for it (`vertex::Auth`). A key that cannot sign (compile checks
    // its shape, not that it is RSA) leaves the target without a key: skipped as
    // missingKey, the reason logged.
    let vertex = match (compiled.keys.get(&c.id), tokens) {
        (Some(key), Some(cache)) if c.provider == Provider::Vertex => {
            match vertex::Auth::new(key.expose(), cache) {
                Ok(auth) => Some(auth),
                Err(e) => {
                    tracing::warn!(credential = %c.id, error = %e,
                        "vertex credential skipped: its service-account key cannot sign");
                    None
                }
            }
        }
        _ => None,
    };
    // bedrock: the Secret's keys sign each request; there is no key header.
    let aws = match c.provider {
        Provider::Bedrock => compiled.keys.get(&c.id).and_then(AwsKeys::decode),
        _ => None,
    };
    let signer = aws.as_ref().map(|k| {
        crate::providers::bedrock::sigv4::Signer::new(k, c.region.as_deref().unwrap_or("us-east-1"))
    });
    let headers = match compiled.keys.get(&c.id) {
        None => None,
        Some(_) if c.provider == Provider::Vertex && vertex.is_none() => None,
        Some(_) if c.provider == Provider::Bedrock && aws.is_none() => None,
        Some(key) => {
            // Room for the auth headers, accept-encoding, and for what each upstream
            // request adds to its copy (x-request-id, forwarded client headers,
            // content-type, traceparent, tracestate, host):
            // a clone keeps the table size, so those inserts never rehash it.
            let mut h = HeaderMap::with_capacity(c.headers.len() + 3 + 8);
            for (name, value) in &c.headers {
                let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    err(
                        "spec.headers",
                        format!("{name:?} is not a valid header name"),
                    )
                })?;
                let v = HeaderValue::from_str(value).map_err(|_| {
                    err(
                        "spec.headers",
                        format!("the value of {name:?} is not a valid header value"),
                    )
                })?;
                h.insert(n, v);
            }
            let auth = match c.provider {
                Provider::Anthropic => {
                    h.insert(
                        "anthropic-version",
                        HeaderValue::from_static(ANTHROPIC_VERSION),
                    );
                    Some(("x-api-key", key.expose().clone()))
                }
                Provider::Openai | Provider::OpenaiCompatible => {
                    Some(("authorization", format!("Bearer {}", key.expose())))
                }
                // Azure OpenAI's key header; never `Authorization` (Azure reads that
                // as an Entra ID token and refuses a key there).
                Provider::AzureOpenai => Some(("api-key", key.expose().clone())),
                // Google AI's key header (never `?key=` in the URL, which would put
                // the key in access logs).
                Provider::Gemini => Some(("x-goog-api-key", key.expose().clone())),
                // Per request, from the token cache (`vertex` above).
                Provider::Vertex => None,
                // Signed per request (`crate::providers::bedrock::sigv4`): no key header.
                Provider::Bedrock => None,
            };
            if let Some((name, value)) = auth {
                // The message never includes the value: it is key material.
                let mut v = HeaderValue::from_str(&value).map_err(|_| {
                    err(
                        "secretRef",
                        "the key contains characters not allowed in a header".into(),
                    )
                })?;
                v.set_sensitive(true);
                h.insert(name, v);
            }
            // Whatever `spec.headers` says: the proxy rewrites answers, so it must
            // read them, and it does not decode (SPEC §8).
            h.insert(
                http::header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
            Some(h)
        }
    };
    Ok(CredentialRt {
        limiter,
        target_header: header_value(&c.id.to_string()),
        urls,
        headers,
        vertex,
        key: match &aws {
            Some(k) => Some(k.secret_access_key.clone()),
            None => compiled.keys.get(&c.id).cloned(),
        },
        signer,
        client: if c.allow_private_network {
            clients.private.clone()
        } else {
            clients.public.clone()
        },
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

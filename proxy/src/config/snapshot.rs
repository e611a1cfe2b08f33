//! The serving snapshot: what one request sees of the config, prepared for the
//! request path (`prepare`): routes indexed by model name (per client when
//! authentication is required), each target with its credential's adapter, endpoint
//! and headers, its runtime state and counters. Swapped in whole by the gateway;
//! each request holds the one it started with.

use std::collections::HashMap;
use std::sync::Arc;

use http::header::HeaderValue;
use switchback_crds::config::{CompiledConfig, Credential, ObjectId, Route, Target};
use switchback_crds::keyhash::KeyHash;
use switchback_crds::revision::Revision;

use super::target::TargetState;
use crate::limits::clients::{ClientRt, ClientUsage};
use crate::limits::concurrency::Limiter;
use crate::limits::hedge::HedgeBudget;
use crate::limits::keys::KeyPool;
use crate::observe::cost::Pricing;
use crate::observe::counters::{RouteCounters, RouteTargetCounters};
use crate::providers::{Adapter, Endpoint};
use crate::upstream;
use crate::wire::rewrite::JsonStr;
use crate::wire::surface::Surface;

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
    /// Its keys (one, or a pool), each with the static headers plus its own; empty
    /// when the key is missing or unusable.
    pub keys: KeyPool,
    pub client: upstream::Lanes,
    /// `maxConcurrency` / `maxQueue`, when set.
    pub limiter: Option<Arc<Limiter>>,
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
    /// The `x-switchback-model` values of the models it names (`model`, the
    /// `modelMap` values), made once; a model named by the client is made per request.
    pub model_headers: HashMap<String, HeaderValue>,
    /// For endpoints whose URLs name the model: the URLs of the models this target
    /// names (`model`, the `modelMap` values), made once. A model named by the
    /// client (neither set) is made per request.
    pub urls: HashMap<String, ModelUrls>,
    /// Its price and the route's first target's, ready to charge answers with.
    pub pricing: Pricing,
}

impl TargetRt {
    /// The model this target is asked for: its own, the one `modelMap` gives the
    /// client's name, or the client's.
    pub fn model<'a>(&'a self, client_model: &'a str) -> &'a str {
        self.spec.upstream_model(client_model)
    }

    /// The `x-switchback-model` value for a request whose client sent `client_model`;
    /// `None` for a name no header can carry.
    pub fn model_header(&self, client_model: &str) -> Option<HeaderValue> {
        let model = self.model(client_model);
        match self.model_headers.get(model) {
            Some(v) => Some(v.clone()),
            None => HeaderValue::from_str(model).ok(),
        }
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
    /// The share of its requests this replica may still hedge (`spec.hedge`), kept
    /// across reloads; `None` when the route does not hedge.
    pub hedge: Option<Arc<HedgeBudget>>,
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

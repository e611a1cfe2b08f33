//! A compiled config made the serving snapshot: each credential prepared by its
//! provider's adapter, each route's targets given their runtime state and counters,
//! model names indexed (per client with authentication), and what must outlive a
//! reload (target state, counters, concurrency limiters, client counters and
//! limits, providers' kept state) carried over, keyed so that a change starts
//! afresh. Fallible and off the request path: a config that cannot be prepared
//! changes nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::header::HeaderValue;
use switchback_crds::compile::Compiled;
use switchback_crds::config::{Client, Credential, KeyPool, ObjectId, Route};
use switchback_crds::revision::Revisions;
use switchback_crds::secret::Secret;

use super::snapshot::{
    ByKeyHash, ConfigGeneration, CredentialRt, ModelRoute, RouteRt, Snapshot, TargetRt, Tenant,
    Tenants,
};
use super::target::{TargetKey, TargetState};
use crate::limits::clients::{
    ClientCounters, ClientRt, ClientUsage, Limits, RouteTokens, Settling, Shares, Spent, WallClock,
};
use crate::limits::concurrency::Limiter;
use crate::limits::hedge::HedgeBudget;
use crate::limits::keys::{KeyPool as Pool, KeyState, PoolKey};
use crate::observe::cost::{Pricing, UsdCounter};
use crate::observe::counters::{RouteCounters, RouteTargetCounters};
use crate::providers::{self, Kept};
use crate::upstream::Clients;
use crate::wire::rewrite::JsonStr;

/// Everything that outlives a reload: target state, counters, concurrency limiters.
/// Only touched while preparing a snapshot; the request path holds `Arc`s.
#[derive(Debug, Default)]
pub struct Carried(Mutex<CarriedMaps>);

#[derive(Debug, Default)]
struct CarriedMaps {
    targets: HashMap<TargetKey, Arc<TargetState>>,
    routes: HashMap<ObjectId, Arc<RouteCounters>>,
    /// The hedge budgets of the routes that hedge.
    hedges: HashMap<ObjectId, Arc<HedgeBudget>>,
    route_targets: HashMap<(ObjectId, TargetKey), Arc<RouteTargetCounters>>,
    /// Keyed by the limits too: changing them starts a fresh limiter.
    limiters: HashMap<(ObjectId, u32, u32), Arc<Limiter>>,
    /// Per LLMClient, never dropped: `/admin/v1/stats` reports every client seen
    /// since start, and a client whose key goes missing for a while must not come
    /// back with its counters reset (the operator sums per-instance deltas).
    clients: HashMap<ObjectId, Arc<ClientCounters>>,
    /// Per (client, route), for `switchback_client_tokens_total`; never dropped either.
    client_routes: HashMap<(ObjectId, ObjectId), Arc<RouteTokens>>,
    /// Per (client, route, target credential and model), for
    /// `switchback_cost_usd_total`; never dropped either.
    client_costs: HashMap<ClientCostKey, Arc<UsdCounter>>,
    /// Keyed by the shares too: new shares (limits or replicas changed) start fresh.
    client_limits: HashMap<(ObjectId, Shares), Arc<Limits>>,
    /// What providers keep per credential and key across reloads (an OAuth token).
    kept: Kept,
    /// Each key's park and rejection, by credential, data-key name and a hash of its
    /// value: a rotated key starts afresh.
    keys: HashMap<(ObjectId, Box<str>, u64), Arc<KeyState>>,
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

/// Where an LLMClient's cost on one target of one route is counted: the client, the
/// route, the target's credential and upstream model.
pub type ClientCostKey = (ObjectId, ObjectId, ObjectId, Option<String>);

impl Carried {
    /// Every (client, route, target) cost.
    pub fn client_costs(&self) -> Vec<(ClientCostKey, Arc<UsdCounter>)> {
        sorted(
            &self
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .client_costs,
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
#[derive(Debug, Clone)]
pub struct ClientEnv {
    /// No operator (manifests): budgets are enforced from this replica's own counts.
    pub standalone: bool,
    /// Requests reserve their budget before they are sent (`--budget-reservation`).
    pub reserve: bool,
    pub clock: WallClock,
    pub settling: Arc<Settling>,
}

fn carried<K: std::hash::Hash + Eq, V: Default>(map: &mut HashMap<K, Arc<V>>, key: K) -> Arc<V> {
    map.entry(key).or_default().clone()
}

/// Drop what no live object uses any more (the previous snapshot may still hold some
/// until its last request ends; they go at the next reload).
fn prune<K, V>(map: &mut HashMap<K, Arc<V>>) {
    map.retain(|_, v| Arc::strong_count(v) > 1);
}

impl CarriedMaps {
    /// [`prune`] what targets, routes, limiters and providers keep; client counters
    /// stay (reported since start).
    fn prune(&mut self) {
        prune(&mut self.targets);
        prune(&mut self.routes);
        prune(&mut self.hedges);
        prune(&mut self.route_targets);
        prune(&mut self.limiters);
        prune(&mut self.client_limits);
        prune(&mut self.keys);
        self.kept.prune();
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
    let credentials = prepare_credentials(compiled, clients, &mut maps)?;
    let revisions = Revisions::new(&compiled.config, &compiled.keys, &compiled.revision_keys);
    let mut routes = HashMap::new();
    let mut route_list = Vec::new();
    // Targets whose probing the first route using them has set, this pass.
    let mut probed = std::collections::HashSet::new();
    for r in &compiled.config.routes {
        let route = Arc::new(RouteRt {
            counters: carried(&mut maps.routes, r.id.clone()),
            hedge: r
                .hedge
                .is_some()
                .then(|| carried(&mut maps.hedges, r.id.clone())),
            route_header: header_value(&r.id.to_string()),
            generation_header: HeaderValue::from(r.generation),
            revision: revisions.route(r),
            spec: r.clone(),
            targets: prepare_targets(r, &credentials, compiled, &mut maps, &mut probed)?,
        });
        if !auth_required {
            index_models(&mut routes, &route)?;
        }
        route_list.push(route);
    }
    let tenants = if auth_required {
        prepare_tenants(&compiled.config.clients, &route_list, &mut maps, env)?
    } else {
        Tenants::default()
    };
    maps.prune();
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

/// Every credential, prepared by its provider's adapter, with its concurrency
/// limiter (carried while its limits stay).
fn prepare_credentials(
    compiled: &Compiled,
    clients: &Clients,
    maps: &mut CarriedMaps,
) -> Result<HashMap<ObjectId, Arc<CredentialRt>>, PrepareError> {
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
        let rt = prepare_credential(c, compiled, clients, limiter, maps)?;
        credentials.insert(c.id.clone(), Arc::new(rt));
    }
    Ok(credentials)
}

/// A route's targets: each with its credential, its state and counters (carried),
/// its upstream model spelled as JSON, and the URLs of the models it names when its
/// endpoint's URLs name the model.
fn prepare_targets(
    r: &Route,
    credentials: &HashMap<ObjectId, Arc<CredentialRt>>,
    compiled: &Compiled,
    maps: &mut CarriedMaps,
    probed: &mut std::collections::HashSet<TargetKey>,
) -> Result<Vec<TargetRt>, PrepareError> {
    let mut targets = Vec::with_capacity(r.targets.len());
    let primary = r.targets.first().and_then(|t| t.price.as_ref());
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
        // One state per target, whichever routes use it: the first route's settings
        // decide how its open circuit is probed (as `health` probes it for that route).
        if probed.insert(key.clone()) {
            state.breaker.set_probing(crate::health::probe_every(r, t));
        }
        let named = t.model.iter().chain(t.model_map.values());
        let model_headers = named
            .clone()
            .filter_map(|m| Some((m.clone(), HeaderValue::from_str(m).ok()?)))
            .collect();
        targets.push(TargetRt {
            model_headers,
            spec: t.clone(),
            counters: carried(&mut maps.route_targets, (r.id.clone(), key)),
            state,
            label: t.credential.to_string(),
            model_json: t.model.as_deref().map(JsonStr::new),
            model_map_json: t
                .model_map
                .iter()
                .map(|(client, upstream)| (client.clone(), JsonStr::new(upstream)))
                .collect(),
            urls: match credential.endpoint.url_names_model() {
                true => named
                    .map(|m| (m.clone(), TargetRt::model_urls(&*credential.endpoint, m)))
                    .collect(),
                false => HashMap::new(),
            },
            credential,
            pricing: Pricing::new(t.price.as_ref(), primary, index),
        });
    }
    Ok(targets)
}

/// `route`'s model names, for everyone (authentication off): a name two routes
/// serve refuses the config.
fn index_models(
    routes: &mut HashMap<String, ModelRoute>,
    route: &Arc<RouteRt>,
) -> Result<(), PrepareError> {
    for m in &route.spec.models {
        let entry = ModelRoute {
            route: route.clone(),
            model_json: JsonStr::new(m),
            client: None,
        };
        if let Some(prev) = routes.insert(m.clone(), entry) {
            return Err(PrepareError::DuplicateModel {
                model: m.clone(),
                first: prev.route.spec.id.clone(),
                second: route.spec.id.clone(),
            });
        }
    }
    Ok(())
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
        let rt = Arc::new(client_rt(c, counters, maps, &env));
        let mut models = HashMap::new();
        let mut callable: Vec<Arc<RouteRt>> = Vec::new();
        for id in &c.routes {
            let Some(route) = by_id.get(id) else { continue };
            if !route.spec.is_offered_to(&c.id.namespace) {
                continue;
            }
            let usage = ClientUsage {
                client: rt.clone(),
                route: carried(&mut maps.client_routes, (c.id.clone(), (*id).clone())),
                costs: client_costs(&c.id, route, maps),
            };
            for m in &route.spec.models {
                let entry = ModelRoute {
                    route: (*route).clone(),
                    model_json: JsonStr::new(m),
                    client: Some(usage.clone()),
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

/// Where a client's cost on each target of `route` is counted, by target index.
fn client_costs(
    client: &ObjectId,
    route: &RouteRt,
    maps: &mut CarriedMaps,
) -> Arc<[Arc<UsdCounter>]> {
    route
        .targets
        .iter()
        .map(|t| {
            let key = (
                client.clone(),
                route.spec.id.clone(),
                t.spec.credential.clone(),
                t.spec.model.clone(),
            );
            carried(&mut maps.client_costs, key)
        })
        .collect()
}

/// One client's runtime: its counters, this replica's share of its limits, and its
/// budgets (the operator's verdict, or standalone the budget itself).
fn client_rt(
    c: &Client,
    counters: Arc<ClientCounters>,
    maps: &mut CarriedMaps,
    env: &ClientEnv,
) -> ClientRt {
    let replicas = c.replicas.max(1);
    let shares = Limits::shares(c, replicas);
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
    ClientRt {
        id: c.id.clone(),
        label: c.id.to_string().into(),
        counters,
        limits,
        exhausted,
        budget: c.budget.is_set().then_some(c.budget),
        replicas,
        reserve: env.reserve,
        standalone: env.standalone,
        clock: env.clock,
        settling: env.settling.clone(),
    }
}

/// A credential's keys: data-key name and value.
type KeyValues = Vec<(Box<str>, Secret<String>)>;

/// A credential's key values by data-key name, in declared order: a pool's (those its
/// Secret held), or its one key (`bedrock`'s key pair as one, by its access key id's
/// name). Empty while the key is missing.
fn key_values(c: &Credential, compiled: &Compiled) -> Result<KeyValues, PrepareError> {
    let Some(entry) = compiled.keys.get(&c.id) else {
        return Ok(Vec::new());
    };
    if c.secret_ref.keys.is_empty() {
        let name = c.key_names().first().copied().unwrap_or_default();
        return Ok(vec![(name.into(), entry.clone())]);
    }
    let mut pool = KeyPool::decode(entry).ok_or_else(|| PrepareError::Credential {
        credential: c.id.clone(),
        field: "secretRef.keys",
        message: "the delivered keys are not a key pool".into(),
    })?;
    Ok(c.secret_ref
        .keys
        .iter()
        .filter_map(|name| Some((name.as_str().into(), pool.0.remove(name)?)))
        .collect())
}

/// A key value's hash: which state it keeps (never shown anywhere).
fn value_hash(value: &Secret<String>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.expose().hash(&mut h);
    h.finish()
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
    maps: &mut CarriedMaps,
) -> Result<CredentialRt, PrepareError> {
    let adapter = providers::adapter(c.provider);
    let refused = |e: providers::CredentialError| PrepareError::Credential {
        credential: c.id.clone(),
        field: e.field,
        message: e.message,
    };
    let values = key_values(c, compiled)?;
    // Without a key: the endpoint alone (the target is skipped as `missingKey`).
    let mut endpoint = None;
    if values.is_empty() {
        endpoint = Some(
            adapter
                .prepare(c, None, &mut maps.kept)
                .map_err(refused)?
                .endpoint,
        );
    }
    let mut keys = Vec::with_capacity(values.len());
    for (name, value) in values {
        let prepared = adapter
            .prepare(c, Some(&value), &mut maps.kept)
            .map_err(refused)?;
        // Every key of a pool reaches the same endpoint: its URLs do not depend on
        // the key (providers whose authorisation does take the whole Secret, and no
        // pool).
        endpoint.get_or_insert(prepared.endpoint);
        let Some(headers) = prepared.headers else {
            continue;
        };
        let slot = (c.id.clone(), name.clone(), value_hash(&value));
        keys.push(PoolKey {
            name,
            headers,
            secret: prepared.secret,
            state: maps.keys.entry(slot).or_default().clone(),
        });
    }
    let Some(endpoint) = endpoint else {
        unreachable!("an endpoint is prepared with or without a key");
    };
    let host = c
        .base_url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(Box::from))
        .unwrap_or_default();
    Ok(CredentialRt {
        adapter,
        endpoint,
        target_header: header_value(&c.id.to_string()),
        host,
        keys: Pool::new(keys),
        client: if c.allow_private_network {
            clients.private.clone()
        } else {
            clients.public.clone()
        },
        limiter,
        spec: c.clone(),
    })
}

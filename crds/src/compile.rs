//! `compile`: the one pure function from raw resources (LLMRoute, ProviderCredential,
//! LLMClient, Secret) to the compiled config, shared by the operator and the proxy.
//!
//! It enforces every rule the CRD schema and its CEL rules enforce, and more: in
//! standalone mode there is no API server, and in a cluster the operator must not
//! trust that the CRD installed is the current one. Each object is checked on its own
//! first (`credential`, `route`, `client`, built from the per-field checks in
//! `fields`), then across objects: credential, Secret and route references, model names
//! claimed by two routes (the older route keeps them; per namespace and per client when
//! model names are resolved per client), and client keys used by two
//! clients (the older client keeps it). No IO, no clock: same inputs, same output.

mod client;
mod credential;
mod fields;
mod route;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

pub use client::MIN_KEY_LEN as MIN_CLIENT_KEY_LEN;

use crate::config::{Client, CompiledConfig, Keys, ObjectId, Route};
use crate::credential::SecretKeySelector;
use crate::keyhash::KeyHasher;
use crate::network::PrivateNetworks;
use crate::secret::Secret;
use crate::{LLMClient, LLMRoute, ProviderCredential};

/// What `compile` reads. Objects of any namespace may be mixed; a route only ever
/// sees credentials and Secrets of its own namespace, a client only Secrets of its own
/// namespace and routes of its own or offered to it by `sharedWith`.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub routes: &'a [LLMRoute],
    pub credentials: &'a [ProviderCredential],
    pub clients: &'a [LLMClient],
    pub secrets: &'a [KubeSecret],
    /// The per-cluster secret client keys are hashed with. `None` compiles and checks
    /// clients all the same but leaves every [`Client::key_hash`] empty, so nobody can
    /// authenticate with that config: for callers that do not serve clients.
    pub client_key_hasher: Option<&'a KeyHasher>,
    /// Model names are resolved per client (the proxy runs with `--auth required`,
    /// docs/tenancy.md#tenancy): two routes conflict over a model name only within one
    /// namespace, and a client that could reach two routes serving the same name keeps
    /// the first (its own namespace's, then by `namespace/name`) and gets a
    /// `ModelConflict` warning for the other. `false` (the default): model names are
    /// global, as for a proxy that serves everyone.
    pub models_per_client: bool,
    /// The namespaces whose credentials may set `allowPrivateNetwork: true`
    /// (docs/security.md#where-the-proxies-connect); elsewhere such a credential is refused
    /// (`PrivateNetworkNotAllowed`). Default: none. Standalone manifests pass
    /// [`PrivateNetworks::Everywhere`].
    pub private_networks: &'a PrivateNetworks,
}

/// No namespace may reach private networks: what [`Inputs::default`] says.
static NO_PRIVATE_NETWORKS: PrivateNetworks = PrivateNetworks::Namespaces(BTreeSet::new());

impl Default for Inputs<'_> {
    fn default() -> Self {
        Inputs {
            routes: &[],
            credentials: &[],
            clients: &[],
            secrets: &[],
            client_key_hasher: None,
            models_per_client: false,
            private_networks: &NO_PRIVATE_NETWORKS,
        }
    }
}

/// The compiled routes and credentials, the keys they need, and one diagnostic per
/// problem found. An object with an `Error` diagnostic is left out of `config`;
/// `Warning`s leave it in.
#[derive(Clone, Debug, Default)]
pub struct Compiled {
    pub config: CompiledConfig,
    pub keys: Keys,
    pub diagnostics: Vec<Diagnostic>,
    /// Each source namespace's revision key, where one was delivered (see
    /// [`crate::revision`]); `compile` sets none.
    pub revision_keys: std::collections::BTreeMap<String, crate::revision::RevisionKey>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    LLMRoute,
    ProviderCredential,
    LLMClient,
    Secret,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// The object was rejected and is not in the compiled config.
    Error,
    /// The object was kept; part of it will not work (e.g. a target whose key is missing).
    Warning,
}

/// One problem, naming the object and the field path:
/// `team-a/smart: spec.targets[1].retry.attempts: 7 is above the maximum 5`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub kind: Kind,
    pub object: ObjectId,
    pub severity: Severity,
    /// A constant CamelCase reason, usable as a Kubernetes condition reason.
    pub reason: &'static str,
    /// Field path from the object's root, e.g. `spec.targets[1].retry.attempts`.
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.field, self.message)
    }
}

/// Condition reasons, also the `reason` of every [`Diagnostic`].
pub mod reason {
    /// A field breaks a schema or cross-field rule.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Two objects of one kind share a namespace and name (standalone manifests); the
    /// first one is used.
    pub const DUPLICATE: &str = "Duplicate";
    /// A model name is already served by an older route (of the same namespace, with
    /// `Inputs.models_per_client`), or, on an LLMClient, by another route it reaches.
    pub const MODEL_CONFLICT: &str = "ModelConflict";
    /// A target names a ProviderCredential that does not exist in the route's namespace.
    pub const CREDENTIAL_NOT_FOUND: &str = "CredentialNotFound";
    /// A target names a ProviderCredential that was rejected.
    pub const INVALID_CREDENTIAL: &str = "InvalidCredential";
    /// The credential's Secret, or the key in it, is missing or unusable.
    pub const SECRET_KEY_MISSING: &str = "SecretKeyMissing";
    /// The credential's baseURL is a private address and allowPrivateNetwork is off.
    pub const PRIVATE_NETWORK: &str = "PrivateNetwork";
    /// The credential sets allowPrivateNetwork: true in a namespace the platform does
    /// not allow it in (the operator's --allow-private-network-namespaces); on a route,
    /// a target's credential was refused so.
    pub const PRIVATE_NETWORK_NOT_ALLOWED: &str = "PrivateNetworkNotAllowed";
    /// A client's key Secret, or the key in it, is missing, unusable or too short:
    /// nobody can authenticate as the client.
    pub const KEY_MISSING: &str = "KeyMissing";
    /// A client's key is already the key of an older client; a key identifies one
    /// client, so the newer one cannot authenticate with it.
    pub const KEY_CONFLICT: &str = "KeyConflict";
    /// A client names a route that does not exist or is not shared with its namespace
    /// (or its namespace has no route at all and it names none).
    pub const ROUTE_NOT_FOUND: &str = "RouteNotFound";
    /// A client spent a budget (set by the operator from usage, never by `compile`).
    pub const BUDGET_EXHAUSTED: &str = "BudgetExhausted";

    /// Every reason above: docs/troubleshooting.md names each (a test checks).
    pub const ALL: &[&str] = &[
        INVALID_SPEC,
        DUPLICATE,
        MODEL_CONFLICT,
        CREDENTIAL_NOT_FOUND,
        INVALID_CREDENTIAL,
        SECRET_KEY_MISSING,
        PRIVATE_NETWORK,
        PRIVATE_NETWORK_NOT_ALLOWED,
        KEY_MISSING,
        KEY_CONFLICT,
        ROUTE_NOT_FOUND,
        BUDGET_EXHAUSTED,
    ];
}

/// Namespace of an object whose metadata has none (a standalone manifest).
pub const DEFAULT_NAMESPACE: &str = "default";

/// Compiles raw resources into the config the proxy serves, the keys it needs, and a
/// diagnostic per problem. Pure and deterministic: routes and credentials come out
/// sorted by [`ObjectId`], diagnostics grouped by kind and object.
pub fn compile(inputs: &Inputs<'_>) -> Compiled {
    let mut diagnostics = Vec::new();

    let secrets = index_secrets(inputs.secrets, &mut diagnostics);

    // Credentials first: routes need to know which ones exist, were rejected, or
    // lack a key.
    let mut credentials: BTreeMap<ObjectId, credential::Outcome> = BTreeMap::new();
    for raw in inputs.credentials {
        let Some(id) = object_id(
            Kind::ProviderCredential,
            &raw.metadata,
            &credentials,
            &mut diagnostics,
        ) else {
            continue;
        };
        let outcome = credential::compile(&id, &raw.spec, &secrets, inputs.private_networks);
        diagnostics.extend(outcome.diagnostics.iter().cloned());
        credentials.insert(id, outcome);
    }

    let mut candidates: Vec<Candidate> = Vec::new();
    // Every route object, accepted or not, for the clients' `routes`.
    let mut seen_routes = client::RouteIndex::new();
    for (index, raw) in inputs.routes.iter().enumerate() {
        let Some(id) = object_id(
            Kind::LLMRoute,
            &raw.metadata,
            &seen_routes,
            &mut diagnostics,
        ) else {
            continue;
        };
        seen_routes.insert(id.clone(), raw.spec.shared_with.clone().unwrap_or_default());
        let generation = raw.metadata.generation.unwrap_or(0);
        let (route, route_diagnostics) = route::compile(&id, generation, &raw.spec, &credentials);
        diagnostics.extend(route_diagnostics);
        if let Some(route) = route {
            candidates.push(Candidate {
                index,
                created: raw.metadata.creation_timestamp.clone(),
                models_defaulted: raw.spec.models.is_none(),
                route,
            });
        }
    }

    let routes = resolve_model_conflicts(candidates, inputs.models_per_client, &mut diagnostics);

    let mut clients: Vec<ClientCandidate> = Vec::new();
    let mut seen_clients: BTreeMap<ObjectId, ()> = BTreeMap::new();
    for (index, raw) in inputs.clients.iter().enumerate() {
        let Some(id) = object_id(
            Kind::LLMClient,
            &raw.metadata,
            &seen_clients,
            &mut diagnostics,
        ) else {
            continue;
        };
        seen_clients.insert(id.clone(), ());
        let outcome = client::compile(
            &id,
            raw.metadata.generation.unwrap_or(0),
            &raw.spec,
            &seen_routes,
            &secrets,
            inputs.client_key_hasher,
        );
        diagnostics.extend(outcome.diagnostics);
        if let Some(client) = outcome.client {
            clients.push(ClientCandidate {
                index,
                created: raw.metadata.creation_timestamp.clone(),
                key: outcome.key,
                client,
            });
        }
    }
    let mut clients = resolve_key_conflicts(clients, &mut diagnostics);
    if inputs.models_per_client {
        resolve_client_model_conflicts(&mut clients, &routes, &mut diagnostics);
    }

    let mut keys = Keys::default();
    let mut config = CompiledConfig::default();
    for (id, outcome) in credentials {
        if let Some(credential) = outcome.credential {
            if let Some(key) = outcome.key {
                keys.0.insert(id, key);
            }
            config.credentials.push(credential);
        }
    }
    config.routes = routes;
    config.clients = clients;

    // Stable: within one object, diagnostics keep the order the fields were checked in.
    diagnostics.sort_by(|a, b| (kind_rank(a.kind), &a.object).cmp(&(kind_rank(b.kind), &b.object)));
    Compiled {
        config,
        keys,
        diagnostics,
        revision_keys: Default::default(),
    }
}

fn kind_rank(kind: Kind) -> u8 {
    match kind {
        Kind::LLMRoute => 0,
        Kind::ProviderCredential => 1,
        Kind::LLMClient => 2,
        Kind::Secret => 3,
    }
}

/// The object's id, or `None` (with a diagnostic) when it has no name or repeats one
/// already seen.
fn object_id<V>(
    kind: Kind,
    meta: &ObjectMeta,
    seen: &BTreeMap<ObjectId, V>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<ObjectId> {
    let namespace = meta
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .unwrap_or(DEFAULT_NAMESPACE);
    let name = meta.name.as_deref().unwrap_or_default();
    let id = ObjectId::new(namespace, name);
    let problem = if name.is_empty() {
        Some((reason::INVALID_SPEC, "is required"))
    } else if seen.contains_key(&id) {
        Some((
            reason::DUPLICATE,
            "is defined more than once; the first definition is used",
        ))
    } else {
        None
    };
    match problem {
        Some((reason, message)) => {
            diagnostics.push(Diagnostic {
                kind,
                object: id,
                severity: Severity::Error,
                reason,
                field: "metadata.name".to_string(),
                message: message.to_string(),
            });
            None
        }
        None => Some(id),
    }
}

/// A Secret's keys, `stringData` over `data` (as the API server merges them on write;
/// standalone manifests often use `stringData`).
pub(crate) type SecretIndex = BTreeMap<ObjectId, BTreeMap<String, Vec<u8>>>;

fn index_secrets(secrets: &[KubeSecret], diagnostics: &mut Vec<Diagnostic>) -> SecretIndex {
    let mut index = SecretIndex::new();
    for secret in secrets {
        let Some(id) = object_id(Kind::Secret, &secret.metadata, &index, diagnostics) else {
            continue;
        };
        let mut values: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (key, value) in secret.data.iter().flatten() {
            values.insert(key.clone(), value.0.clone());
        }
        for (key, value) in secret.string_data.iter().flatten() {
            values.insert(key.clone(), value.clone().into_bytes());
        }
        index.insert(id, values);
    }
    index
}

/// Why a Secret key reference gives no key: the field (`<path>.name` or `<path>.key`)
/// and the message of the diagnostic.
pub(crate) struct KeyProblem {
    pub(crate) field: String,
    pub(crate) message: String,
}

/// The value of the Secret key `selector` names in `namespace`, trimmed of surrounding
/// whitespace (a key written with `echo` into a file ends in a newline, which no HTTP
/// header carries). `path` is the selector's field path, e.g. `spec.secretRef`.
pub(crate) fn secret_key(
    namespace: &str,
    selector: &SecretKeySelector,
    path: &str,
    secrets: &SecretIndex,
) -> Result<String, KeyProblem> {
    let key = secret_text(namespace, selector, path, secrets)?;
    if !fields::is_header_value(&key) {
        return Err(KeyProblem {
            field: format!("{path}.key"),
            message: format!(
                "key {:?} of Secret {:?} has characters an HTTP header cannot carry",
                selector.key, selector.name
            ),
        });
    }
    Ok(key)
}

/// [`secret_key`] without the header check: for a key that is a document (vertex's
/// service-account JSON), not a header value.
pub(crate) fn secret_text(
    namespace: &str,
    selector: &SecretKeySelector,
    path: &str,
    secrets: &SecretIndex,
) -> Result<String, KeyProblem> {
    let problem = |field: &str, message: String| KeyProblem {
        field: format!("{path}.{field}"),
        message,
    };
    let secret_id = ObjectId::new(namespace, selector.name.clone());
    let Some(secret) = secrets.get(&secret_id) else {
        return Err(problem(
            "name",
            format!(
                "Secret {:?} not found in namespace {namespace}",
                selector.name
            ),
        ));
    };
    let Some(bytes) = secret.get(&selector.key) else {
        return Err(problem(
            "key",
            format!("Secret {:?} has no key {:?}", selector.name, selector.key),
        ));
    };
    let unusable = |what: &str| {
        problem(
            "key",
            format!(
                "key {:?} of Secret {:?} {what}",
                selector.key, selector.name
            ),
        )
    };
    let text = std::str::from_utf8(bytes).map_err(|_| unusable("is not UTF-8 text"))?;
    let key = text.trim();
    if key.is_empty() {
        return Err(unusable("is empty"));
    }
    Ok(key.to_string())
}

/// A client that passed its own checks, waiting for its key to be found unique.
struct ClientCandidate {
    /// Position in `Inputs.clients`: the tie-breaker between equal ages.
    index: usize,
    created: Option<Time>,
    key: Option<Secret<String>>,
    client: Client,
}

/// Gives each key to the oldest client that has it (age as for model conflicts); a
/// newer client with the same key keeps its place but loses the key (KeyConflict), so
/// a key always names exactly one client and a newcomer cannot lock the owner out.
/// Another namespace's client is not named in the message.
fn resolve_key_conflicts(
    mut candidates: Vec<ClientCandidate>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<Client> {
    candidates.sort_by(|a, b| {
        let age = |c: &ClientCandidate| (c.created.is_none(), c.created.clone(), c.index);
        age(a).cmp(&age(b))
    });
    let mut owners: HashMap<String, ObjectId> = HashMap::new();
    let mut clients = Vec::with_capacity(candidates.len());
    for candidate in candidates {
        let mut client = candidate.client;
        if let Some(key) = candidate.key {
            match owners.get(key.expose()) {
                None => {
                    owners.insert(key.expose().clone(), client.id.clone());
                }
                Some(owner) => {
                    let who = if owner.namespace == client.id.namespace {
                        format!("the older LLMClient {owner}")
                    } else {
                        "an older LLMClient of another namespace".to_string()
                    };
                    diagnostics.push(Diagnostic {
                        kind: Kind::LLMClient,
                        object: client.id.clone(),
                        severity: Severity::Warning,
                        reason: reason::KEY_CONFLICT,
                        field: "spec.keySecretRef".to_string(),
                        message: format!(
                            "the key is already used by {who}; a key identifies one client, so nobody can authenticate as this one until its key changes"
                        ),
                    });
                    client.key_hash = None;
                }
            }
        }
        clients.push(client);
    }
    clients.sort_by(|a, b| a.id.cmp(&b.id));
    clients
}

/// A route that passed every other check, waiting for its models.
struct Candidate {
    /// Position in `Inputs.routes`: the tie-breaker between equal ages.
    index: usize,
    created: Option<Time>,
    /// `spec.models` was unset, so the route serves `[metadata.name]`.
    models_defaulted: bool,
    route: Route,
}

/// Gives each model name to the oldest route claiming it and rejects the newer ones.
/// Age is `metadata.creationTimestamp`; routes without one count as newer than any
/// that has one, and ties go to the earlier position in `Inputs.routes`.
///
/// With `per_namespace` (models resolved per client), only routes of one namespace
/// compete for a name.
fn resolve_model_conflicts(
    mut candidates: Vec<Candidate>,
    per_namespace: bool,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<Route> {
    candidates.sort_by(|a, b| {
        let age = |c: &Candidate| (c.created.is_none(), c.created.clone(), c.index);
        age(a).cmp(&age(b))
    });

    let mut owners: HashMap<(String, String), ObjectId> = HashMap::new();
    let mut accepted = Vec::new();
    for candidate in candidates {
        let route = candidate.route;
        let scope = if per_namespace {
            route.id.namespace.clone()
        } else {
            String::new()
        };
        let conflicts: Vec<Diagnostic> = route
            .models
            .iter()
            .enumerate()
            .filter_map(|(i, model)| {
                let owner = owners.get(&(scope.clone(), model.clone()))?;
                Some(Diagnostic {
                    kind: Kind::LLMRoute,
                    object: route.id.clone(),
                    severity: Severity::Error,
                    reason: reason::MODEL_CONFLICT,
                    field: if candidate.models_defaulted {
                        "spec.models".to_string()
                    } else {
                        format!("spec.models[{i}]")
                    },
                    message: format!(
                        "model {model:?} is already served by the older route {owner}"
                    ),
                })
            })
            .collect();
        if conflicts.is_empty() {
            for model in &route.models {
                owners.insert((scope.clone(), model.clone()), route.id.clone());
            }
            accepted.push(route);
        } else {
            diagnostics.extend(conflicts);
        }
    }
    accepted.sort_by(|a, b| a.id.cmp(&b.id));
    accepted
}

/// Models resolved per client: a client reaching two routes that serve one model name
/// keeps the route of its own namespace, else the first by `namespace/name`, and the
/// other route is taken out of its `routes` with a `ModelConflict` warning (the client
/// stays: it has less, never more).
fn resolve_client_model_conflicts(
    clients: &mut [Client],
    routes: &[Route],
    diagnostics: &mut Vec<Diagnostic>,
) {
    let by_id: HashMap<&ObjectId, &Route> = routes.iter().map(|r| (&r.id, r)).collect();
    for client in clients {
        let mut order: Vec<ObjectId> = client.routes.clone();
        // Own namespace first, then by id (`routes` is sorted already).
        order.sort_by_key(|id| id.namespace != client.id.namespace);
        let mut owners: HashMap<&str, &ObjectId> = HashMap::new();
        let mut dropped = Vec::new();
        for id in &order {
            let Some(route) = by_id.get(id) else { continue };
            if let Some((model, owner)) = route
                .models
                .iter()
                .find_map(|m| owners.get(m.as_str()).map(|o| (m, *o)))
            {
                diagnostics.push(Diagnostic {
                    kind: Kind::LLMClient,
                    object: client.id.clone(),
                    severity: Severity::Warning,
                    reason: reason::MODEL_CONFLICT,
                    field: "spec.routes".to_string(),
                    message: format!(
                        "route {id} serves the model {model:?}, which route {owner} already \
                         serves to this client; {id} is left out"
                    ),
                });
                dropped.push(id.clone());
                continue;
            }
            for m in &route.models {
                owners.insert(m, id);
            }
        }
        client.routes.retain(|id| !dropped.contains(id));
    }
}

//! `compile`: the one pure function from raw resources (LLMRoute, ProviderCredential,
//! Secret) to the compiled config, shared by the operator and the proxy.
//!
//! It enforces every rule the CRD schema and its CEL rules enforce, and more: in
//! standalone mode there is no API server, and in a cluster the operator must not
//! trust that the CRD installed is the current one. Each object is checked on its own
//! first (`credential`, `route`, built from the per-field checks in `fields`), then
//! across objects: credential and Secret references, and model names claimed by two
//! routes (the older route keeps them). No IO, no clock: same inputs, same output.

mod credential;
mod fields;
mod route;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::config::{CompiledConfig, Keys, ObjectId, Route};
use crate::{LLMRoute, ProviderCredential};

/// What `compile` reads. Objects of any namespace may be mixed; a route only ever
/// sees credentials and Secrets of its own namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct Inputs<'a> {
    pub routes: &'a [LLMRoute],
    pub credentials: &'a [ProviderCredential],
    pub secrets: &'a [KubeSecret],
}

/// The compiled routes and credentials, the keys they need, and one diagnostic per
/// problem found. An object with an `Error` diagnostic is left out of `config`;
/// `Warning`s leave it in.
#[derive(Clone, Debug, Default)]
pub struct Compiled {
    pub config: CompiledConfig,
    pub keys: Keys,
    pub diagnostics: Vec<Diagnostic>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    LLMRoute,
    ProviderCredential,
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
    /// A model name is already served by an older route.
    pub const MODEL_CONFLICT: &str = "ModelConflict";
    /// A target names a ProviderCredential that does not exist in the route's namespace.
    pub const CREDENTIAL_NOT_FOUND: &str = "CredentialNotFound";
    /// A target names a ProviderCredential that was rejected.
    pub const INVALID_CREDENTIAL: &str = "InvalidCredential";
    /// The credential's Secret, or the key in it, is missing or unusable.
    pub const SECRET_KEY_MISSING: &str = "SecretKeyMissing";
    /// The credential's baseURL is a private address and allowPrivateNetwork is off.
    pub const PRIVATE_NETWORK: &str = "PrivateNetwork";
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
        let outcome = credential::compile(&id, &raw.spec, &secrets);
        diagnostics.extend(outcome.diagnostics.iter().cloned());
        credentials.insert(id, outcome);
    }

    let mut candidates: Vec<Candidate> = Vec::new();
    let mut seen_routes: BTreeMap<ObjectId, ()> = BTreeMap::new();
    for (index, raw) in inputs.routes.iter().enumerate() {
        let Some(id) = object_id(
            Kind::LLMRoute,
            &raw.metadata,
            &seen_routes,
            &mut diagnostics,
        ) else {
            continue;
        };
        seen_routes.insert(id.clone(), ());
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

    let routes = resolve_model_conflicts(candidates, &mut diagnostics);

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

    // Stable: within one object, diagnostics keep the order the fields were checked in.
    diagnostics.sort_by(|a, b| (kind_rank(a.kind), &a.object).cmp(&(kind_rank(b.kind), &b.object)));
    Compiled {
        config,
        keys,
        diagnostics,
    }
}

fn kind_rank(kind: Kind) -> u8 {
    match kind {
        Kind::LLMRoute => 0,
        Kind::ProviderCredential => 1,
        Kind::Secret => 2,
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
fn resolve_model_conflicts(
    mut candidates: Vec<Candidate>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<Route> {
    candidates.sort_by(|a, b| {
        let age = |c: &Candidate| (c.created.is_none(), c.created.clone(), c.index);
        age(a).cmp(&age(b))
    });

    let mut owners: HashMap<String, ObjectId> = HashMap::new();
    let mut accepted = Vec::new();
    for candidate in candidates {
        let route = candidate.route;
        let conflicts: Vec<Diagnostic> = route
            .models
            .iter()
            .enumerate()
            .filter_map(|(i, model)| {
                let owner = owners.get(model)?;
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
                owners.insert(model.clone(), route.id.clone());
            }
            accepted.push(route);
        } else {
            diagnostics.extend(conflicts);
        }
    }
    accepted.sort_by(|a, b| a.id.cmp(&b.id));
    accepted
}

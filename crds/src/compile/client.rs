//! LLMClient → [`Client`]: the key (hashed, never kept), the routes the client may
//! call, limits and budgets.
//!
//! Out-of-range limits, budgets and malformed route references reject the client
//! (Error). A missing or unusable key and a route that cannot be found keep it, with a
//! Warning: without a key nobody can authenticate as it (fail closed), and an unknown
//! route is simply not callable, so neither widens what the client can do, and the
//! client recovers by itself when the Secret or route appears.

use std::collections::{BTreeMap, BTreeSet};

use crate::client::{BudgetSpec, ClientLimitsSpec, LLMClientSpec};
use crate::compile::fields::{self, Checker};
use crate::compile::{Diagnostic, Kind, SecretIndex, reason};
use crate::config::{Client, ClientBudget, ClientLimits, ObjectId, SHARED_WITH_ALL, SecretKeyRef};
use crate::keyhash::KeyHasher;
use crate::schema::{
    MAX_CLIENT_CONCURRENCY, MAX_CLIENT_ROUTES, MAX_DEFAULT_RESERVATION, MAX_NAME_LEN,
    MAX_REQUESTS_PER_MINUTE, MAX_ROUTE_REF_LEN, MAX_TOKENS_PER_DAY, MAX_TOKENS_PER_MINUTE,
};
use crate::secret::Secret;

/// Shortest client key accepted, in characters: 16 random characters of a base62 or
/// hex alphabet are 64 to 95 bits, out of reach of online guessing.
pub const MIN_KEY_LEN: usize = 16;

/// Every LLMRoute object given to `compile`, valid or not (a rejected route may still
/// be served in its last good version), with its raw `spec.sharedWith`.
pub(crate) type RouteIndex = BTreeMap<ObjectId, Vec<String>>;

pub(crate) struct Outcome {
    /// `None` when the client was rejected.
    pub(crate) client: Option<Client>,
    /// The plain key, held only until key conflicts are resolved, never stored.
    pub(crate) key: Option<Secret<String>>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

pub(crate) fn compile(
    id: &ObjectId,
    generation: i64,
    spec: &LLMClientSpec,
    routes: &RouteIndex,
    secrets: &SecretIndex,
    hasher: Option<&KeyHasher>,
) -> Outcome {
    let mut c = Checker::new(Kind::LLMClient, id);

    let name_ok = fields::string_len(
        &mut c,
        "spec.keySecretRef.name",
        &spec.key_secret_ref.name,
        1,
        MAX_NAME_LEN as usize,
    );
    let key_ok = fields::string_len(
        &mut c,
        "spec.keySecretRef.key",
        &spec.key_secret_ref.key,
        1,
        MAX_NAME_LEN as usize,
    );

    let (allowed, not_found) = allowed_routes(&mut c, id, spec.routes.as_deref(), routes);
    let limits = limits(&mut c, spec.limits.as_ref());
    let budget = budget(&mut c, spec.budget.as_ref());

    // A rejected client reports its errors only: what it could or could not call, or
    // authenticate with, is moot until they are fixed.
    if c.has_errors() {
        return Outcome {
            client: None,
            key: None,
            diagnostics: c.diagnostics,
        };
    }
    for (field, message) in not_found {
        c.warning(reason::ROUTE_NOT_FOUND, field, message);
    }

    let key = if name_ok && key_ok {
        resolve_key(&mut c, id, spec, secrets)
    } else {
        None
    };
    let key_hash = key
        .as_ref()
        .zip(hasher)
        .map(|(key, hasher)| hasher.hash(key.expose().as_bytes()));

    Outcome {
        client: Some(Client {
            id: id.clone(),
            generation,
            key_hash,
            key_secret_ref: SecretKeyRef {
                name: spec.key_secret_ref.name.clone(),
                key: spec.key_secret_ref.key.clone(),
                keys: Vec::new(),
            },
            routes: allowed,
            limits,
            budget,
            replicas: 1,
            exhausted: None,
        }),
        key,
        diagnostics: c.diagnostics,
    }
}

/// The client's key, or `None` with a KeyMissing Warning saying why.
fn resolve_key(
    c: &mut Checker,
    id: &ObjectId,
    spec: &LLMClientSpec,
    secrets: &SecretIndex,
) -> Option<Secret<String>> {
    let selector = &spec.key_secret_ref;
    match super::secret_key(&id.namespace, selector, "spec.keySecretRef", secrets) {
        Err(problem) => {
            c.warning(
                reason::KEY_MISSING,
                problem.field,
                format!(
                    "{}; nobody can authenticate as this client",
                    problem.message
                ),
            );
            None
        }
        Ok(key) if key.chars().count() < MIN_KEY_LEN => {
            c.warning(
                reason::KEY_MISSING,
                "spec.keySecretRef.key",
                format!(
                    "key {:?} of Secret {:?} is {} characters long; at least {MIN_KEY_LEN} are required (e.g. `openssl rand -hex 24`); nobody can authenticate as this client",
                    selector.key,
                    selector.name,
                    key.chars().count()
                ),
            );
            None
        }
        Ok(key) => Some(Secret::new(key)),
    }
}

/// `spec.routes` resolved to route ids, or every route of the client's namespace when
/// unset. Malformed entries are errors; entries naming no route the client may be
/// given are left out and returned as (field, message) for RouteNotFound Warnings.
fn allowed_routes(
    c: &mut Checker,
    client: &ObjectId,
    spec: Option<&[String]>,
    routes: &RouteIndex,
) -> (Vec<ObjectId>, Vec<(String, String)>) {
    let own = client.namespace.as_str();
    let mut not_found = Vec::new();
    let Some(entries) = spec else {
        let all: Vec<ObjectId> = routes
            .keys()
            .filter(|r| r.namespace == own)
            .cloned()
            .collect();
        if all.is_empty() {
            not_found.push((
                "spec.routes".to_string(),
                format!(
                    "no LLMRoute in namespace {own}; this client can call none until one is created"
                ),
            ));
        }
        return (all, not_found);
    };

    fields::list_len(
        c,
        "spec.routes",
        entries.len(),
        1,
        MAX_CLIENT_ROUTES as usize,
        "routes",
    );
    let mut seen = BTreeSet::new();
    let mut allowed = BTreeSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let field = format!("spec.routes[{i}]");
        if !fields::string_len(c, &field, entry, 1, MAX_ROUTE_REF_LEN as usize) {
            continue;
        }
        if !seen.insert(entry.as_str()) {
            c.invalid(&field, format!("{entry:?} is listed more than once"));
            continue;
        }
        let (namespace, name) = match entry.split_once('/') {
            Some((namespace, name)) => (namespace, name),
            None => (own, entry.as_str()),
        };
        if !fields::is_dns_label(namespace) || !fields::is_dns_subdomain(name) {
            c.invalid(
                &field,
                format!(
                    "{entry:?} is neither an LLMRoute name nor namespace/name (lower-case RFC 1123 names)"
                ),
            );
            continue;
        }
        let route = ObjectId::new(namespace, name);
        let offered = routes.get(&route).is_some_and(|shared_with| {
            namespace == own
                || shared_with
                    .iter()
                    .any(|ns| ns == SHARED_WITH_ALL || ns == own)
        });
        if offered {
            allowed.insert(route);
        } else if namespace == own {
            not_found.push((
                field,
                format!("LLMRoute {name:?} not found in namespace {own}"),
            ));
        } else {
            // One message for both cases: a client's author may not learn which
            // routes other namespaces keep to themselves.
            not_found.push((
                field,
                format!("LLMRoute {route} not found, or not shared with namespace {own}"),
            ));
        }
    }
    (allowed.into_iter().collect(), not_found)
}

fn limits(c: &mut Checker, spec: Option<&ClientLimitsSpec>) -> ClientLimits {
    let Some(spec) = spec else {
        return ClientLimits::default();
    };
    let mut limit = |field: &str, value: Option<i32>, max: i32| {
        value.map(|v| fields::int_in_range(c, field, Some(v), 1, max, 1))
    };
    ClientLimits {
        requests_per_minute: limit(
            "spec.limits.requestsPerMinute",
            spec.requests_per_minute,
            MAX_REQUESTS_PER_MINUTE,
        ),
        tokens_per_minute: limit(
            "spec.limits.tokensPerMinute",
            spec.tokens_per_minute,
            MAX_TOKENS_PER_MINUTE,
        ),
        max_concurrency: limit(
            "spec.limits.maxConcurrency",
            spec.max_concurrency,
            MAX_CLIENT_CONCURRENCY,
        ),
    }
}

fn budget(c: &mut Checker, spec: Option<&BudgetSpec>) -> ClientBudget {
    let Some(spec) = spec else {
        return ClientBudget::default();
    };
    let tokens_per_day = fields::int64_in_range(
        c,
        "spec.budget.tokensPerDay",
        spec.tokens_per_day,
        1,
        MAX_TOKENS_PER_DAY,
    );
    let usd_per_month = spec.usd_per_month.as_deref().and_then(|text| {
        let field = "spec.budget.usdPerMonth";
        let errors = c.diagnostics.len();
        let usd = fields::decimal(c, field, text);
        if c.diagnostics.len() > errors {
            return None;
        }
        if usd <= 0.0 {
            c.invalid(field, format!("{text:?} must be above 0"));
            return None;
        }
        Some(usd)
    });
    let default_reservation = fields::int64_in_range(
        c,
        "spec.budget.defaultReservation",
        spec.default_reservation,
        1,
        MAX_DEFAULT_RESERVATION,
    );
    // The CRD's CEL rule, again: a request without a cap could never be admitted.
    if let (Some(r), Some(day)) = (default_reservation, tokens_per_day)
        && r > day
    {
        c.invalid(
            "spec.budget.defaultReservation",
            format!(
                "{r} is above tokensPerDay ({day}): a request without an output cap could \
                 never be admitted"
            ),
        );
    }
    ClientBudget {
        tokens_per_day,
        usd_per_month,
        default_reservation,
        left: None,
    }
}

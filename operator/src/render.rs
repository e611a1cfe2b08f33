//! Rendering, a pure function: the cluster's LLMRoutes, ProviderCredentials and Secrets
//! (plus what is rendered now) in, the config wanted per source namespace out, and
//! what became of each route.
//!
//! `compile` runs once over every namespace (a model name belongs to the oldest route
//! claiming it, cluster-wide); the result is split per namespace. A route whose new
//! version fails only on references (a credential missing or invalid) keeps serving the
//! version rendered now: its "last good" version is read back from the current
//! ConfigMap, so it survives operator restarts too.

use std::collections::{BTreeMap, BTreeSet};

use switchback_crds::compile::{Compiled, Diagnostic, Inputs, Kind, Severity, compile, reason};
use switchback_crds::config::{BudgetLeft, Client, CompiledConfig, Exhausted, ObjectId, Route};
use switchback_crds::delivery::{self, NamespaceConfig};
use switchback_crds::revision::{Revision, RevisionKey, Revisions};

/// What a route is served as in the rendered config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Served {
    /// The generation the rendered route was compiled from.
    pub generation: i64,
    /// True when it is an earlier version kept because the current one fails
    /// `ResolvedRefs`.
    pub last_good: bool,
    /// Targets in the rendered route.
    pub targets: usize,
    /// The route with its credentials and keys as rendered: what a proxy reports once
    /// it serves this very content, credential edits and rotated keys included.
    pub revision: Revision,
}

/// The outcome of one render.
#[derive(Debug, Default)]
pub struct Rendering {
    /// `compile`'s output over every namespace (its diagnostics drive conditions).
    pub compiled: Compiled,
    /// Desired config per source namespace; a namespace without routes is absent.
    pub namespaces: BTreeMap<String, NamespaceConfig>,
    /// Routes present in the rendered config.
    pub served: BTreeMap<ObjectId, Served>,
}

/// What the operator lays over the rendered clients from the proxies' traffic: the
/// ready replicas that share each limit and budget, the budgets spent, and what is
/// left of each budget (docs/tenancy.md#across-replicas).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientOverlay {
    /// Ready proxy replicas (0 before the first scrape: rendered as 1).
    pub replicas: u32,
    pub exhausted: BTreeMap<ObjectId, Exhausted>,
    pub left: BTreeMap<ObjectId, BudgetLeft>,
}

impl Rendering {
    /// The rendered client `id`, if it is in the config.
    pub fn client(&self, id: &ObjectId) -> Option<&Client> {
        self.compiled.config.clients.iter().find(|c| &c.id == id)
    }

    /// Lays `overlay` over every rendered client (the compiled config and the
    /// per-namespace parts alike).
    pub fn lay_over(&mut self, overlay: &ClientOverlay) {
        let apply = |c: &mut Client| {
            c.replicas = overlay.replicas.max(1);
            c.exhausted = overlay.exhausted.get(&c.id).cloned();
            c.budget.left = overlay.left.get(&c.id).copied();
        };
        self.compiled.config.clients.iter_mut().for_each(apply);
        for part in self.namespaces.values_mut() {
            part.config.clients.iter_mut().for_each(apply);
        }
    }

    /// Diagnostics about one object.
    pub fn diagnostics<'a>(
        &'a self,
        kind: Kind,
        id: &'a ObjectId,
    ) -> impl Iterator<Item = &'a Diagnostic> + 'a {
        self.compiled
            .diagnostics
            .iter()
            .filter(move |d| d.kind == kind && &d.object == id)
    }
}

/// Reasons that reject a route on its references only: the route keeps serving its
/// last good version (where that version's credentials are all still served: a
/// credential refused for its private network never is).
pub fn is_reference_reason(reason: &str) -> bool {
    matches!(
        reason,
        reason::CREDENTIAL_NOT_FOUND
            | reason::INVALID_CREDENTIAL
            | reason::SECRET_KEY_MISSING
            | reason::PRIVATE_NETWORK_NOT_ALLOWED
    )
}

/// Renders the wanted config. `previous` is the config rendered now per source
/// namespace (decoded from the ConfigMaps; unreadable ones are simply absent);
/// `revision_keys` the key each namespace's revisions are computed with (delivered with
/// its keys, so the proxies compute the same).
pub fn render(
    inputs: &Inputs<'_>,
    previous: &BTreeMap<String, CompiledConfig>,
    revision_keys: &BTreeMap<String, RevisionKey>,
) -> Rendering {
    let compiled = compile(inputs);
    let mut routes: Vec<Route> = compiled.config.routes.clone();
    let current: BTreeSet<&ObjectId> = compiled.config.routes.iter().map(|r| &r.id).collect();
    let mut last_good: BTreeSet<ObjectId> = BTreeSet::new();

    // Last good versions, for routes rejected on references only.
    let credentials: BTreeSet<&ObjectId> =
        compiled.config.credentials.iter().map(|c| &c.id).collect();
    let mut claimed: BTreeSet<String> = routes.iter().flat_map(|r| r.models.clone()).collect();
    let mut rejected: BTreeMap<&ObjectId, bool> = BTreeMap::new(); // id -> references only
    for d in compiled
        .diagnostics
        .iter()
        .filter(|d| d.kind == Kind::LLMRoute && d.severity == Severity::Error)
    {
        let only_refs = rejected.entry(&d.object).or_insert(true);
        *only_refs &= is_reference_reason(d.reason);
    }
    for (id, only_refs) in rejected {
        if !only_refs || current.contains(id) {
            continue;
        }
        let Some(old) = previous
            .get(&id.namespace)
            .and_then(|c| c.routes.iter().find(|r| &r.id == id))
        else {
            continue;
        };
        let usable = old
            .targets
            .iter()
            .all(|t| credentials.contains(&t.credential))
            && old.models.iter().all(|m| !claimed.contains(m));
        if usable {
            claimed.extend(old.models.iter().cloned());
            last_good.insert(id.clone());
            routes.push(old.clone());
        }
    }
    routes.sort_by(|a, b| a.id.cmp(&b.id));

    let with_last_good = Compiled {
        config: CompiledConfig {
            routes,
            ..compiled.config.clone()
        },
        keys: compiled.keys.clone(),
        diagnostics: Vec::new(),
        revision_keys: revision_keys.clone(),
    };
    let revisions = Revisions::new(
        &with_last_good.config,
        &with_last_good.keys,
        &with_last_good.revision_keys,
    );
    let served = with_last_good
        .config
        .routes
        .iter()
        .map(|r| {
            let served = Served {
                generation: r.generation,
                last_good: last_good.contains(&r.id),
                targets: r.targets.len(),
                revision: revisions.route(r),
            };
            (r.id.clone(), served)
        })
        .collect();
    Rendering {
        namespaces: delivery::split(&with_last_good),
        compiled,
        served,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{credential, route, secret};

    fn inputs_render(
        routes: &[switchback_crds::LLMRoute],
        credentials: &[switchback_crds::ProviderCredential],
        secrets: &[k8s_openapi::api::core::v1::Secret],
        previous: &BTreeMap<String, CompiledConfig>,
    ) -> Rendering {
        render(
            &Inputs {
                routes,
                credentials,
                secrets,
                ..Default::default()
            },
            previous,
            &keys(),
        )
    }

    /// A fixed revision key for each namespace the tests use.
    fn keys() -> BTreeMap<String, RevisionKey> {
        ["team-a", "team-b", "team-c"]
            .into_iter()
            .enumerate()
            .map(|(i, ns)| (ns.to_string(), format!("{i:064x}").parse().unwrap()))
            .collect()
    }

    fn previous_of(r: &Rendering) -> BTreeMap<String, CompiledConfig> {
        r.namespaces
            .iter()
            .map(|(ns, part)| (ns.clone(), part.config.clone()))
            .collect()
    }

    #[test]
    fn one_config_per_namespace_with_routes_and_keys_apart() {
        let r = inputs_render(
            &[
                route("team-a", "smart", 2, &["openai"]),
                route("team-b", "fast", 1, &["openai"]),
            ],
            &[
                credential("team-a", "openai", "keys", "openai"),
                credential("team-b", "openai", "keys", "openai"),
                credential("team-c", "lonely", "keys", "openai"),
            ],
            &[
                secret("team-a", "keys", &[("openai", "sk-a")]),
                secret("team-b", "keys", &[("openai", "sk-b")]),
            ],
            &BTreeMap::new(),
        );
        // team-c has a credential but no route: nothing rendered for it.
        assert_eq!(
            r.namespaces.keys().collect::<Vec<_>>(),
            ["team-a", "team-b"]
        );
        let a = &r.namespaces["team-a"];
        assert_eq!(a.config.routes[0].generation, 2);
        assert_eq!(a.keys.0.len(), 1);
        let s = r.served[&ObjectId::new("team-a", "smart")];
        assert_eq!((s.generation, s.last_good, s.targets), (2, false, 1));
    }

    #[test]
    fn the_revision_follows_the_credentials_and_keys_a_route_uses() {
        let id = ObjectId::new("team-a", "smart");
        let revision = |base_url: &str, key: &str, other_key: &str| {
            let mut openai = credential("team-a", "openai", "keys", "openai");
            openai.spec.base_url = Some(base_url.into());
            let r = inputs_render(
                &[
                    route("team-a", "smart", 1, &["openai"]),
                    route("team-a", "other", 1, &["other"]),
                ],
                &[openai, credential("team-a", "other", "keys", "other")],
                &[secret(
                    "team-a",
                    "keys",
                    &[("openai", key), ("other", other_key)],
                )],
                &BTreeMap::new(),
            );
            // What the proxy computes from the delivered objects: the same.
            let part = &r.namespaces["team-a"];
            let smart = part.config.routes.iter().find(|r| r.id == id).unwrap();
            let delivered = BTreeMap::from([(
                "team-a".to_string(),
                part.revision_key.clone().expect("delivered with its key"),
            )]);
            assert_eq!(
                Revisions::new(&part.config, &part.keys, &delivered).route(smart),
                r.served[&id].revision
            );
            r.served[&id].revision
        };
        let before = revision("https://api.openai.com/v1", "sk-a", "sk-o");
        assert_eq!(
            revision("https://api.openai.com/v1", "sk-a", "sk-o"),
            before
        );
        assert_ne!(
            revision("https://api.openai.com/v1", "sk-b", "sk-o"),
            before
        );
        assert_ne!(
            revision("https://gateway.example/v1", "sk-a", "sk-o"),
            before
        );
        assert_eq!(
            revision("https://api.openai.com/v1", "sk-a", "sk-other"),
            before,
            "a key another route uses"
        );
    }

    #[test]
    fn a_namespace_whose_last_route_is_gone_is_not_rendered() {
        let r = inputs_render(
            &[],
            &[credential("team-a", "openai", "keys", "openai")],
            &[secret("team-a", "keys", &[("openai", "sk-a")])],
            &BTreeMap::new(),
        );
        assert!(r.namespaces.is_empty());
    }

    #[test]
    fn unresolved_references_keep_the_last_good_version() {
        let creds = [credential("team-a", "openai", "keys", "openai")];
        let secrets = [secret("team-a", "keys", &[("openai", "sk-a")])];
        let v1 = inputs_render(
            &[route("team-a", "smart", 1, &["openai"])],
            &creds,
            &secrets,
            &BTreeMap::new(),
        );
        // Generation 2 points at a credential that does not exist.
        let v2 = inputs_render(
            &[route("team-a", "smart", 2, &["missing"])],
            &creds,
            &secrets,
            &previous_of(&v1),
        );
        let id = ObjectId::new("team-a", "smart");
        let s = v2.served[&id];
        assert_eq!((s.generation, s.last_good, s.targets), (1, true, 1));
        assert_eq!(s.revision, v1.served[&id].revision);
        assert_eq!(
            v2.namespaces["team-a"].config,
            v1.namespaces["team-a"].config
        );
        assert!(
            v2.diagnostics(Kind::LLMRoute, &id)
                .any(|d| d.reason == reason::CREDENTIAL_NOT_FOUND)
        );
        // Without a previous version there is nothing to serve.
        let fresh = inputs_render(
            &[route("team-a", "smart", 2, &["missing"])],
            &creds,
            &secrets,
            &BTreeMap::new(),
        );
        assert!(fresh.served.is_empty() && fresh.namespaces.is_empty());
    }

    #[test]
    fn the_last_good_version_goes_when_its_credential_goes() {
        let v1 = inputs_render(
            &[route("team-a", "smart", 1, &["openai"])],
            &[credential("team-a", "openai", "keys", "openai")],
            &[secret("team-a", "keys", &[("openai", "sk-a")])],
            &BTreeMap::new(),
        );
        let v2 = inputs_render(
            &[route("team-a", "smart", 1, &["openai"])],
            &[],
            &[],
            &previous_of(&v1),
        );
        assert!(v2.namespaces.is_empty());
    }

    /// A credential with `allowPrivateNetwork: true` (docs/security.md#where-the-proxies-connect).
    fn private_credential(ns: &str, name: &str) -> switchback_crds::ProviderCredential {
        let mut c = credential(ns, name, "keys", "openai");
        c.spec.provider = "openai-compatible".into();
        c.spec.base_url = Some("http://10.0.0.5:8000/v1".into());
        c.spec.allow_private_network = Some(true);
        c
    }

    /// A target added on a credential the platform refuses its private network: the
    /// route keeps its last good version, and the refused credential is not rendered.
    #[test]
    fn a_target_on_a_refused_private_network_keeps_the_last_good_version() {
        let creds = [
            credential("team-a", "openai", "keys", "openai"),
            private_credential("team-a", "vllm"),
        ];
        let secrets = [secret("team-a", "keys", &[("openai", "sk-a")])];
        let v1 = inputs_render(
            &[route("team-a", "smart", 1, &["openai"])],
            &creds,
            &secrets,
            &BTreeMap::new(),
        );
        let v2 = inputs_render(
            &[route("team-a", "smart", 2, &["openai", "vllm"])],
            &creds,
            &secrets,
            &previous_of(&v1),
        );
        let id = ObjectId::new("team-a", "smart");
        assert!(
            v2.diagnostics(Kind::LLMRoute, &id)
                .any(|d| d.reason == reason::PRIVATE_NETWORK_NOT_ALLOWED)
        );
        assert_eq!(
            (v2.served[&id].generation, v2.served[&id].last_good),
            (1, true)
        );
        let config = &v2.namespaces["team-a"].config;
        assert_eq!(config, &v1.namespaces["team-a"].config);
        assert!(config.credentials.iter().all(|c| c.id.name != "vllm"));
    }

    /// A route served through an allowed private network is no longer served once the
    /// platform withdraws the allowance: its last good version needs the credential,
    /// which is refused now.
    #[test]
    fn a_withdrawn_allowance_stops_the_route() {
        let creds = [private_credential("team-a", "vllm")];
        let secrets = [secret("team-a", "keys", &[("openai", "sk-a")])];
        let routes = [route("team-a", "smart", 1, &["vllm"])];
        let allowed = switchback_crds::network::PrivateNetworks::Everywhere;
        let v1 = render(
            &Inputs {
                routes: &routes,
                credentials: &creds,
                secrets: &secrets,
                private_networks: &allowed,
                ..Default::default()
            },
            &BTreeMap::new(),
            &BTreeMap::new(),
        );
        assert_eq!(v1.namespaces["team-a"].config.routes.len(), 1);
        let v2 = inputs_render(&routes, &creds, &secrets, &previous_of(&v1));
        assert!(v2.namespaces.is_empty(), "{:?}", v2.namespaces.keys());
        assert!(v2.served.is_empty());
    }

    #[test]
    fn invalid_specs_and_model_conflicts_do_not_keep_a_last_good_version() {
        let creds = [credential("team-a", "openai", "keys", "openai")];
        let secrets = [secret("team-a", "keys", &[("openai", "sk-a")])];
        let v1 = inputs_render(
            &[route("team-a", "smart", 1, &["openai"])],
            &creds,
            &secrets,
            &BTreeMap::new(),
        );
        let mut bad = route("team-a", "smart", 2, &["openai"]);
        bad.spec.timeout = Some("soon".into());
        let v2 = inputs_render(&[bad], &creds, &secrets, &previous_of(&v1));
        assert!(v2.served.is_empty());

        // Served, then an older route elsewhere claims its model name: it loses, and
        // its previous version is not kept either.
        let mut served = route("team-a", "shared", 1, &["openai"]);
        served.metadata.creation_timestamp = Some(crate::fixtures::time(200));
        let mut older = route("team-b", "shared", 1, &["openai"]);
        older.metadata.creation_timestamp = Some(crate::fixtures::time(100));
        let creds = [
            credential("team-a", "openai", "keys", "openai"),
            credential("team-b", "openai", "keys", "openai"),
        ];
        let secrets = [
            secret("team-a", "keys", &[("openai", "a")]),
            secret("team-b", "keys", &[("openai", "b")]),
        ];
        let v1 = inputs_render(&[served.clone()], &creds, &secrets, &BTreeMap::new());
        let loser = ObjectId::new("team-a", "shared");
        assert!(v1.served.contains_key(&loser));
        let v2 = inputs_render(&[served, older], &creds, &secrets, &previous_of(&v1));
        assert!(!v2.served.contains_key(&loser));
        assert_eq!(v2.namespaces.keys().collect::<Vec<_>>(), ["team-b"]);
        assert!(
            v2.diagnostics(Kind::LLMRoute, &loser)
                .any(|d| d.reason == reason::MODEL_CONFLICT)
        );
    }

    #[test]
    fn model_names_conflict_across_namespaces_older_wins() {
        let mut older = route("team-b", "shared", 1, &["openai"]);
        older.metadata.creation_timestamp = Some(crate::fixtures::time(100));
        let mut newer = route("team-a", "shared", 1, &["openai"]);
        newer.metadata.creation_timestamp = Some(crate::fixtures::time(200));
        let r = inputs_render(
            &[newer, older],
            &[
                credential("team-a", "openai", "keys", "openai"),
                credential("team-b", "openai", "keys", "openai"),
            ],
            &[
                secret("team-a", "keys", &[("openai", "a")]),
                secret("team-b", "keys", &[("openai", "b")]),
            ],
            &BTreeMap::new(),
        );
        assert_eq!(r.namespaces.keys().collect::<Vec<_>>(), ["team-b"]);
        let loser = ObjectId::new("team-a", "shared");
        assert!(
            r.diagnostics(Kind::LLMRoute, &loser)
                .any(|d| d.reason == reason::MODEL_CONFLICT)
        );
    }
}

//! Status, computed purely: conditions with constant reasons, observedGeneration,
//! `lastTransitionTime` kept while a condition's status holds, and the traffic facts
//! aggregated from the proxies. The controllers write the result only when it differs
//! from what the object already has.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use switchback_crds::client::{ClientUsage, LLMClientStatus};
use switchback_crds::compile::{Diagnostic, Severity, reason};
use switchback_crds::config::{Exhausted, ObjectId};
use switchback_crds::cost::Usd;
use switchback_crds::credential::KeyStatus;
use switchback_crds::route::{
    CircuitState, LLMRouteStatus, LastFailure, LastProbe, TargetStatus, TotalStats, WindowStats,
};
use switchback_crds::stats;
use switchback_crds::{LLMClient, LLMRoute, ProviderCredentialStatus};

use crate::aggregate::{ClientView, KeyView, RouteView, Snapshot, TargetView};
use crate::explain;
use crate::render::{Served, is_reference_reason};
use crate::usage::{self, Budget, Current};

/// Condition types.
pub mod types {
    pub const ACCEPTED: &str = "Accepted";
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    pub const PROGRAMMED: &str = "Programmed";
    pub const READY: &str = "Ready";
    pub const SECRET_RESOLVED: &str = "SecretResolved";
    /// kstatus's abnormal-true conditions: present (True) only while they hold.
    pub const RECONCILING: &str = "Reconciling";
    pub const STALLED: &str = "Stalled";
}

/// Condition reasons written by the operator, next to `switchback_crds::reason`'s
/// (InvalidSpec, ModelConflict, CredentialNotFound, InvalidCredential,
/// SecretKeyMissing, PrivateNetwork), which are used as they are.
pub mod reasons {
    /// Accepted=True.
    pub const ACCEPTED: &str = "Accepted";
    /// ResolvedRefs=True.
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    /// Programmed=True: every ready proxy replica serves observedGeneration, with the
    /// credentials and keys rendered now (the route's revision).
    pub const PROGRAMMED: &str = "Programmed";
    /// Programmed=False: rendered, not yet served by every ready replica (another
    /// generation, or this one with an older credential or key).
    pub const PENDING: &str = "Pending";
    /// Programmed=False: no ready proxy replica was found to serve it.
    pub const NO_READY_REPLICAS: &str = "NoReadyReplicas";
    /// Programmed=False: an earlier generation is served (this one has unresolved
    /// references).
    pub const SERVING_LAST_GOOD: &str = "ServingLastGood";
    /// Programmed=False: the route is not in the rendered config.
    pub const NOT_RENDERED: &str = "NotRendered";
    /// Programmed=False: its namespace's rendering could not be delivered (the API
    /// server refused a write, or it is over `--max-config-parts`); the proxies keep
    /// the namespace's last delivered version.
    pub const DELIVERY_FAILED: &str = "DeliveryFailed";
    /// Ready=True / SecretResolved=True.
    pub const READY: &str = "Ready";
    pub const SECRET_RESOLVED: &str = "SecretResolved";
    /// SecretResolved=Unknown: the credential is invalid, its Secret was not read.
    pub const NOT_CHECKED: &str = "NotChecked";
    /// Ready=False: deletion is held by the finalizer while routes reference it.
    pub const DELETION_BLOCKED: &str = "DeletionBlocked";

    /// Every reason above, for the check that each is documented.
    pub const ALL: &[&str] = &[
        ACCEPTED,
        RESOLVED_REFS,
        PROGRAMMED,
        PENDING,
        NO_READY_REPLICAS,
        SERVING_LAST_GOOD,
        NOT_RENDERED,
        DELIVERY_FAILED,
        READY,
        SECRET_RESOLVED,
        NOT_CHECKED,
        DELETION_BLOCKED,
    ];
}

/// What keeps an object from being Ready, as kstatus (Argo CD, Flux, `kubectl wait`)
/// reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotReady {
    /// Nothing: Ready=True, or Ready=False for a reason that is not about
    /// reconciling (a client's spent budget: its spec is fully served).
    No,
    /// The operator or the proxies are still at it (not programmed yet, deletion
    /// held): `Reconciling=True`.
    Yet,
    /// Only a change by the user helps (an invalid spec, a missing reference):
    /// `Stalled=True`.
    Stuck,
}

/// The kstatus conditions that go with `ready` (operator/README.md#conditions):
/// `Reconciling=True` or `Stalled=True` with Ready's reason and message, or none. kstatus
/// reads an object as Current when `status.observedGeneration` is its generation and
/// neither holds; so they are written only while True, and removed after, as Flux does with
/// its own.
fn kstatus(
    previous: &[Condition],
    ready: &Condition,
    why: NotReady,
    generation: Option<i64>,
    now: &Time,
) -> Option<Condition> {
    let type_ = match why {
        NotReady::No => return None,
        NotReady::Yet => types::RECONCILING,
        NotReady::Stuck => types::STALLED,
    };
    Some(condition(
        previous,
        type_,
        true,
        &ready.reason,
        ready.message.clone(),
        generation,
        now,
    ))
}

/// Reasons that make an LLMClient not Ready though it is in the config: nobody can
/// authenticate as it, or it cannot reach a route it names.
fn client_blocking(reason: &str) -> bool {
    matches!(
        reason,
        reason::KEY_MISSING | reason::KEY_CONFLICT | reason::ROUTE_NOT_FOUND
    )
}

/// The diagnostics that `keep` says.
fn pick<'a>(
    diagnostics: &[&'a Diagnostic],
    keep: impl Fn(&Diagnostic) -> bool,
) -> Vec<&'a Diagnostic> {
    diagnostics.iter().copied().filter(|d| keep(d)).collect()
}

/// The condition `wanted`, keeping the previous `lastTransitionTime` when its status
/// did not change (the Kubernetes convention: reason and message may change alone).
pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    tri_condition(
        previous,
        type_,
        if status { "True" } else { "False" },
        reason,
        message,
        generation,
        now,
    )
}

fn tri_condition(
    previous: &[Condition],
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: truncate(message),
        observed_generation: generation,
        last_transition_time,
    }
}

/// Condition messages are capped at 32768 bytes by the API; stay well below.
fn truncate(mut message: String) -> String {
    const MAX: usize = 4096;
    if message.len() > MAX {
        let mut cut = MAX;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push('…');
    }
    message
}

fn describe(diagnostics: &[&Diagnostic]) -> String {
    diagnostics
        .iter()
        .map(|d| format!("{}: {}", d.field, d.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What the route status is computed from.
pub struct RouteFacts<'a> {
    pub route: &'a LLMRoute,
    /// `compile`'s diagnostics about this route.
    pub diagnostics: Vec<&'a Diagnostic>,
    /// How it is in the rendered config, if at all.
    pub served: Option<Served>,
    /// Why its namespace's rendering is not delivered, if it is not
    /// (operator/README.md#what-it-writes).
    pub undelivered: Option<&'a str>,
    /// The last proxy scrape round.
    pub proxies: &'a Snapshot,
    /// Totals already in status when this operator first saw the route.
    pub seed: TotalStats,
    pub now: Time,
}

/// A route's conditions: Accepted, ResolvedRefs, Programmed, Ready, then kstatus's
/// Reconciling or Stalled when they apply.
fn route_conditions(f: &RouteFacts<'_>, view: Option<&RouteView>) -> Vec<Condition> {
    let generation = f.route.metadata.generation;
    let previous = f
        .route
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let errors = pick(&f.diagnostics, |d| {
        d.severity == Severity::Error && !is_reference_reason(d.reason)
    });
    let unresolved = pick(&f.diagnostics, |d| is_reference_reason(d.reason));

    let accepted = match errors.first() {
        None => condition(
            previous,
            types::ACCEPTED,
            true,
            reasons::ACCEPTED,
            "the spec is valid and its models are served by this route".into(),
            generation,
            &f.now,
        ),
        Some(first) => {
            // ModelConflict wins when present: it is the one the user must act on elsewhere.
            let reason = if errors.iter().any(|d| d.reason == reason::MODEL_CONFLICT) {
                reason::MODEL_CONFLICT
            } else {
                first.reason
            };
            condition(
                previous,
                types::ACCEPTED,
                false,
                reason,
                describe(&errors),
                generation,
                &f.now,
            )
        }
    };
    let resolved = match unresolved.first() {
        None => condition(
            previous,
            types::RESOLVED_REFS,
            true,
            reasons::RESOLVED_REFS,
            "every credential and key was found".into(),
            generation,
            &f.now,
        ),
        Some(first) => condition(
            previous,
            types::RESOLVED_REFS,
            false,
            first.reason,
            describe(&unresolved),
            generation,
            &f.now,
        ),
    };
    let (programmed, why, message) = programmed(f, generation, view);
    let programmed = condition(
        previous,
        types::PROGRAMMED,
        programmed,
        why,
        message,
        generation,
        &f.now,
    );
    // Ready (operator/README.md#conditions): this generation accepted, resolved and served
    // by every ready replica; otherwise the first of the three that is not, with its
    // reason.
    let (ready, not_ready) = match [&accepted, &resolved, &programmed]
        .into_iter()
        .find(|c| c.status != "True")
    {
        None => (
            condition(
                previous,
                types::READY,
                true,
                reasons::READY,
                programmed.message.clone(),
                generation,
                &f.now,
            ),
            NotReady::No,
        ),
        Some(first) => (
            condition(
                previous,
                types::READY,
                false,
                &first.reason,
                first.message.clone(),
                generation,
                &f.now,
            ),
            // A namespace the API server refuses waits for a change, like an invalid
            // spec: Stalled, where Reconciling would promise progress that is not
            // coming (the operator still retries it).
            if first.type_ == types::PROGRAMMED && first.reason != reasons::DELIVERY_FAILED {
                NotReady::Yet
            } else {
                NotReady::Stuck
            },
        ),
    };
    let kstatus = kstatus(previous, &ready, not_ready, generation, &f.now);
    [accepted, resolved, programmed, ready]
        .into_iter()
        .chain(kstatus)
        .collect()
}

/// The whole desired status of a route.
pub fn route_status(f: &RouteFacts<'_>) -> LLMRouteStatus {
    let generation = f.route.metadata.generation;
    let view = f.proxies.routes.get(&ObjectId::of(f.route));
    let conditions = route_conditions(f, view);

    let previous_targets = f
        .route
        .status
        .as_ref()
        .map(|s| s.targets.as_slice())
        .unwrap_or_default();
    let scraped = f
        .proxies
        .replicas
        .iter()
        .filter(|r| r.error.is_none())
        .count();
    let explained = view.filter(|_| f.served.is_some()).map(|v| {
        explain::explain(
            v,
            previous_targets,
            scraped,
            f.proxies.window_seconds,
            &f.now,
        )
    });
    let targets: Vec<TargetStatus> = view
        .filter(|_| f.served.is_some())
        .map(|v| {
            let explained = explained.as_ref();
            v.targets
                .iter()
                .enumerate()
                .map(|(i, t)| target_status(t, explained.and_then(|e| e.targets.get(i))))
                .collect()
        })
        .unwrap_or_default();
    let open = targets
        .iter()
        .filter(|t| t.circuit == CircuitState::Open)
        .count() as i32;
    let counters = view.map(|v| (v.window, v.totals)).unwrap_or_default();
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    LLMRouteStatus {
        observed_generation: generation,
        conditions,
        target_count: f.served.map(|s| s.targets as i32),
        open_circuits: f.served.map(|_| open),
        serving: explained.as_ref().and_then(|e| e.serving.clone()),
        summary: explained.as_ref().and_then(|e| e.summary.clone()),
        targets,
        window: Some(WindowStats {
            seconds: f.proxies.window_seconds as i64,
            requests: clamp(counters.0.requests),
            attempts: clamp(counters.0.attempts),
            fallbacks: clamp(counters.0.fallbacks),
            failed: clamp(counters.0.failed),
            fallbacks_by_reason: explained.map(|e| e.fallbacks_by_reason).unwrap_or_default(),
            cost_usd: Some(counters.0.cost.to_string()),
            fallback_extra_usd: Some(counters.0.fallback_extra.to_string()),
        }),
        totals: Some(TotalStats {
            requests: f.seed.requests.saturating_add(clamp(counters.1.requests)),
            attempts: f.seed.attempts.saturating_add(clamp(counters.1.attempts)),
            fallbacks: f.seed.fallbacks.saturating_add(clamp(counters.1.fallbacks)),
            failed: f.seed.failed.saturating_add(clamp(counters.1.failed)),
            resumed: f.seed.resumed.saturating_add(clamp(counters.1.resumed)),
            cost_usd: Some(seeded(&f.seed.cost_usd, counters.1.cost)),
            fallback_extra_usd: Some(seeded(
                &f.seed.fallback_extra_usd,
                counters.1.fallback_extra,
            )),
        }),
    }
}

/// A USD total of status: the amount it had when this operator first saw the route
/// (`seed`; one it cannot read counts as 0) plus what was counted since.
fn seeded(seed: &Option<String>, counted: Usd) -> String {
    let seed: Usd = seed
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or_default();
    seed.saturating_add(counted).to_string()
}

/// One target's status line: its state now as explained over the replicas (`e`), and
/// its circuit and last failure as the replicas report them.
fn target_status(t: &TargetView, e: Option<&explain::Explanation>) -> TargetStatus {
    TargetStatus {
        probing: t.probing.then_some(true),
        last_probe: t.last_probe.as_ref().map(|p| LastProbe {
            outcome: p.outcome.clone(),
            at: p.at.parse().ok().map(Time),
        }),
        credential: t.credential.name.clone(),
        model: t.model.clone(),
        state: e.map(|e| e.state.as_str().to_string()),
        since: e.and_then(|e| e.since.clone()),
        until: e.and_then(|e| e.until.clone()),
        replicas: e.map(|e| e.replicas as i32),
        share: e.and_then(|e| e.share),
        circuit: match t.circuit {
            stats::CircuitState::Closed => CircuitState::Closed,
            stats::CircuitState::Open => CircuitState::Open,
            stats::CircuitState::HalfOpen => CircuitState::HalfOpen,
        },
        open_replicas: t.open_replicas as i32,
        last_failure: t.last_failure.as_ref().map(|l| LastFailure {
            status: l.status.map(i32::from),
            reason: l.reason.clone(),
            at: l.at.parse().ok().map(Time),
        }),
    }
}

fn programmed(
    f: &RouteFacts<'_>,
    generation: Option<i64>,
    view: Option<&RouteView>,
) -> (bool, &'static str, String) {
    let Some(served) = f.served else {
        return (
            false,
            reasons::NOT_RENDERED,
            "the route is not in the rendered config (see Accepted and ResolvedRefs)".into(),
        );
    };
    if let Some(why) = f.undelivered {
        return (
            false,
            reasons::DELIVERY_FAILED,
            format!(
                "namespace {}'s rendering is not delivered; the proxies keep serving its \
                 last delivered version: {why}",
                f.route.metadata.namespace.as_deref().unwrap_or_default()
            ),
        );
    }
    if served.last_good {
        return (
            false,
            reasons::SERVING_LAST_GOOD,
            format!(
                "generation {} is still served: this generation has unresolved references",
                served.generation
            ),
        );
    }
    let wanted = generation.unwrap_or(served.generation);
    let total = f.proxies.replicas.len();
    if total == 0 {
        return (
            false,
            reasons::NO_READY_REPLICAS,
            "no ready proxy replica found to serve the route".into(),
        );
    }
    // The generation alone misses credential edits and rotated keys: the revision
    // covers them (see `switchback_crds::revision`).
    let revision = served.revision;
    let mut behind = Vec::new();
    for replica in &f.proxies.replicas {
        let endpoint = &replica.endpoint;
        let generation = view.and_then(|v| v.generations.get(endpoint));
        let serves = view.and_then(|v| v.revisions.get(endpoint));
        let refused = replica
            .config_error
            .as_deref()
            .map(|e| format!(" (it refused the last config: {e})"))
            .unwrap_or_default();
        match (&replica.error, generation, serves) {
            (Some(e), _, _) => behind.push(format!("{endpoint}: not scraped: {e}")),
            (None, Some(g), Some(r)) if *g == wanted && *r == revision => {}
            (None, Some(g), Some(r)) if *g == wanted => behind.push(format!(
                "{endpoint} serves generation {g} at revision {r}, not {revision} \
                 (a credential or key it uses changed){refused}"
            )),
            (None, Some(g), None) if *g == wanted => behind.push(format!(
                "{endpoint} serves generation {g} but reports no revision \
                 (a proxy older than this operator){refused}"
            )),
            (None, got, _) => {
                let got = got.map_or("no generation".to_string(), |g| format!("generation {g}"));
                behind.push(format!("{endpoint} serves {got}{refused}"));
            }
        }
    }
    if behind.is_empty() {
        (
            true,
            reasons::PROGRAMMED,
            format!(
                "all {total} ready proxy replicas serve generation {wanted} at revision {revision}"
            ),
        )
    } else {
        (
            false,
            reasons::PENDING,
            format!(
                "{} of {total} ready proxy replicas serve generation {wanted} at revision \
                 {revision}; {}",
                total - behind.len(),
                behind.join("; ")
            ),
        )
    }
}

/// True when `a` and `b` differ only in traffic facts (counters, circuits, last
/// failures): such changes wait for the per-route status interval.
pub fn only_traffic_changed(a: &LLMRouteStatus, b: &LLMRouteStatus) -> bool {
    let strip = |s: &LLMRouteStatus| LLMRouteStatus {
        targets: Vec::new(),
        window: None,
        totals: None,
        open_circuits: None,
        // What a request finds now moves with traffic: it waits for the status
        // interval like the counters, so a flapping target costs no write per change.
        serving: None,
        summary: None,
        ..s.clone()
    };
    strip(a) == strip(b)
}

/// What the credential status is computed from.
pub struct CredentialFacts<'a> {
    pub generation: Option<i64>,
    pub previous: &'a [Condition],
    /// `compile`'s diagnostics about this credential.
    pub diagnostics: Vec<&'a Diagnostic>,
    /// Names of the LLMRoutes referencing it (sorted).
    pub routes: &'a [String],
    /// Deletion requested and held by the finalizer.
    pub deleting: bool,
    pub now: Time,
    /// Its keys as the proxy replicas report them (`None` before they have), and how
    /// many keys it has (a pool's, or 1).
    pub keys: Option<&'a [KeyView]>,
    pub key_count: usize,
}

/// A credential's keys in status (docs/request-lifecycle.md#key-pools): each key's state
/// over the replicas, and how many are usable (Active on every replica that reports it) of
/// all its keys.
fn key_statuses(keys: &[KeyView], count: usize) -> (Option<String>, Vec<KeyStatus>) {
    let usable = keys
        .iter()
        .filter(|k| k.state == stats::KeyState::Active)
        .count();
    let statuses = keys
        .iter()
        .map(|k| KeyStatus {
            name: k.name.clone(),
            state: k.state.as_str().to_string(),
            until: k.until.as_ref().and_then(|u| u.parse().ok()).map(Time),
            replicas: Some(k.replicas as i32),
        })
        .collect();
    (
        Some(format!("{usable}/{}", count.max(keys.len()))),
        statuses,
    )
}

pub fn credential_status(f: &CredentialFacts<'_>) -> ProviderCredentialStatus {
    let errors = pick(&f.diagnostics, |d| d.severity == Severity::Error);
    let missing = pick(&f.diagnostics, |d| d.reason == reason::SECRET_KEY_MISSING);
    let c = |type_, status, reason, message| {
        condition(
            f.previous,
            type_,
            status,
            reason,
            message,
            f.generation,
            &f.now,
        )
    };
    let secret = if let Some(first) = errors.first() {
        tri_condition(
            f.previous,
            types::SECRET_RESOLVED,
            "Unknown",
            reasons::NOT_CHECKED,
            format!(
                "the credential is invalid ({}); its Secret was not read",
                first.reason
            ),
            f.generation,
            &f.now,
        )
    } else if let Some(first) = missing.first() {
        c(
            types::SECRET_RESOLVED,
            false,
            first.reason,
            describe(&missing),
        )
    } else {
        c(
            types::SECRET_RESOLVED,
            true,
            reasons::SECRET_RESOLVED,
            "the Secret and key exist".into(),
        )
    };
    let (ready, not_ready) = if f.deleting && !f.routes.is_empty() {
        (
            c(
                types::READY,
                false,
                reasons::DELETION_BLOCKED,
                format!(
                    "deletion is held while LLMRoutes reference it: {}",
                    f.routes.join(", ")
                ),
            ),
            NotReady::Yet,
        )
    } else if let Some(first) = errors.first() {
        (
            c(types::READY, false, first.reason, describe(&errors)),
            NotReady::Stuck,
        )
    } else if let Some(first) = missing.first() {
        (
            c(types::READY, false, first.reason, describe(&missing)),
            NotReady::Stuck,
        )
    } else {
        (
            c(
                types::READY,
                true,
                reasons::READY,
                "valid, and its key resolved".into(),
            ),
            NotReady::No,
        )
    };
    let kstatus = kstatus(f.previous, &ready, not_ready, f.generation, &f.now);
    let (usable_keys, keys) = match f.keys {
        Some(keys) => key_statuses(keys, f.key_count),
        None => (None, Vec::new()),
    };
    ProviderCredentialStatus {
        keys,
        usable_keys,
        observed_generation: f.generation,
        conditions: [ready, secret].into_iter().chain(kstatus).collect(),
        routes: Some(f.routes.len() as i32),
    }
}

/// What an LLMClient's status is computed from.
pub struct ClientFacts<'a> {
    pub client: &'a LLMClient,
    /// `compile`'s diagnostics about this client.
    pub diagnostics: Vec<&'a Diagnostic>,
    /// Routes the rendered client may call; `None` when it was rejected.
    pub routes: Option<usize>,
    /// Usage in the current periods (seed + what this operator counted).
    pub usage: Current,
    /// The budget it spent, as rendered to the proxies.
    pub exhausted: Option<&'a Exhausted>,
    pub view: Option<&'a ClientView>,
    pub window_seconds: u64,
    /// The proxies run with `--auth required` (keys are checked).
    pub auth_required: bool,
    pub now: Time,
}

pub fn client_status(f: &ClientFacts<'_>) -> LLMClientStatus {
    let generation = f.client.metadata.generation;
    let previous = f
        .client
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let errors = pick(&f.diagnostics, |d| d.severity == Severity::Error);
    let blocking = pick(&f.diagnostics, |d| {
        d.severity == Severity::Warning && client_blocking(d.reason)
    });
    let warnings = pick(&f.diagnostics, |d| {
        d.severity == Severity::Warning && !client_blocking(d.reason)
    });
    let c = |status, reason: &str, message| {
        condition(
            previous,
            types::READY,
            status,
            reason,
            message,
            generation,
            &f.now,
        )
    };
    let (ready, not_ready) = if let Some(first) = errors.first() {
        (c(false, first.reason, describe(&errors)), NotReady::Stuck)
    } else if let Some(first) = blocking.first() {
        (c(false, first.reason, describe(&blocking)), NotReady::Stuck)
    } else if let Some(spent) = f.exhausted {
        // Ready=False (docs/tenancy.md#budgets), but fully reconciled: a spent budget is the client
        // working as declared, not a sync for a GitOps tool to wait on or fail.
        (
            c(
                false,
                reason::BUDGET_EXHAUSTED,
                format!(
                    "budget.{} is spent: requests get 429 budget_exhausted until {}",
                    spent.budget, spent.until
                ),
            ),
            NotReady::No,
        )
    } else {
        let mut message = if f.auth_required {
            "valid; its key and every route it names resolved".to_string()
        } else {
            "valid, but the gateway runs with --auth off: its key is not checked and its limits and budgets are not enforced".to_string()
        };
        if !warnings.is_empty() {
            message = format!("{message}; {}", describe(&warnings));
        }
        (c(true, reasons::READY, message), NotReady::No)
    };
    let kstatus = kstatus(previous, &ready, not_ready, generation, &f.now);
    let budget = Budget::of(f.client.spec.budget.as_ref());
    let window = f.window_seconds.max(1);
    let rpm = f
        .view
        .map(|v| v.window_requests.saturating_mul(60) / window)
        .unwrap_or(0);
    LLMClientStatus {
        observed_generation: generation,
        conditions: std::iter::once(ready).chain(kstatus).collect(),
        routes: f.routes.map(|n| n as i32),
        requests_per_minute: Some(i64::try_from(rpm).unwrap_or(i64::MAX)),
        usage: Some(ClientUsage {
            today: Some(usage::usage_period(&f.usage.today)),
            this_month: Some(usage::usage_period(&f.usage.month)),
        }),
        budget_used_percent: budget.used_percent(&f.usage),
        throttled: Some(usage::throttled(&f.usage.throttled)),
        last_request_at: f.view.and_then(|v| v.last_request_ms).and_then(usage::at),
    }
}

/// Whether two client statuses differ only in traffic facts (usage, rate, throttles).
pub fn only_client_traffic_changed(a: &LLMClientStatus, b: &LLMClientStatus) -> bool {
    let strip = |s: &LLMClientStatus| LLMClientStatus {
        requests_per_minute: None,
        usage: None,
        budget_used_percent: None,
        throttled: None,
        last_request_at: None,
        ..s.clone()
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{Replica, TargetView};
    use crate::fixtures::{route, time};
    use std::collections::BTreeMap;
    use switchback_crds::compile::Kind;
    use switchback_crds::config::ObjectId;
    use switchback_crds::revision::Revision;

    fn diag(reason: &'static str, severity: Severity) -> Diagnostic {
        Diagnostic {
            kind: Kind::LLMRoute,
            object: ObjectId::new("team-a", "smart"),
            severity,
            reason,
            field: "spec.targets[0].credentialRef".into(),
            message: "ProviderCredential \"x\" not found in namespace team-a".into(),
        }
    }

    /// The revision the rendered route has in these tests.
    const REVISION: &str = "00000000000000aa";

    fn revision(hex: &str) -> Revision {
        hex.parse().unwrap()
    }

    /// Replicas serving these generations, every one at [`REVISION`].
    fn replicas(generations: &[(&str, i64)]) -> Snapshot {
        let mut view = RouteView::default();
        for (e, g) in generations {
            view.generations.insert(e.to_string(), *g);
            view.revisions.insert(e.to_string(), revision(REVISION));
        }
        view.targets.push(TargetView {
            credential: ObjectId::new("team-a", "openai"),
            model: None,
            circuit: stats::CircuitState::Open,
            open_replicas: 1,
            last_failure: None,
            ..TargetView::default()
        });
        view.window.requests = 7;
        view.totals.requests = 9;
        Snapshot {
            credentials: Default::default(),
            replicas: generations
                .iter()
                .map(|(e, _)| Replica {
                    endpoint: e.to_string(),
                    error: None,
                    config_error: None,
                })
                .collect(),
            routes: [(ObjectId::new("team-a", "smart"), view)].into(),
            clients: BTreeMap::new(),
            window_seconds: 300,
            draining: 0,
            round: 0,
        }
    }

    fn served(generation: i64) -> Option<Served> {
        Some(Served {
            generation,
            last_good: false,
            targets: 1,
            revision: revision(REVISION),
        })
    }

    fn get<'a>(s: &'a LLMRouteStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn cost_is_in_the_window_and_the_totals_that_continue_from_status() {
        let r = route("team-a", "smart", 4, &["openai"]);
        let mut proxies = replicas(&[("a", 4)]);
        let view = proxies
            .routes
            .get_mut(&ObjectId::new("team-a", "smart"))
            .unwrap();
        view.window.cost = "0.0225".parse().unwrap();
        view.window.fallback_extra = "0.02115".parse().unwrap();
        view.totals.cost = "0.04635".parse().unwrap();
        view.totals.fallback_extra = "0.0423".parse().unwrap();
        let facts = |seed| RouteFacts {
            route: &r,
            diagnostics: vec![],
            served: served(4),
            proxies: &proxies,
            seed,
            undelivered: None,
            now: time(10),
        };
        // What status said when this operator first saw the route, plus its counts.
        let s = route_status(&facts(TotalStats {
            cost_usd: Some("100.00".into()),
            fallback_extra_usd: Some("1.5".into()),
            ..TotalStats::default()
        }));
        let w = s.window.unwrap();
        assert_eq!(w.cost_usd.as_deref(), Some("0.0225"));
        assert_eq!(w.fallback_extra_usd.as_deref(), Some("0.02115"));
        let t = s.totals.unwrap();
        assert_eq!(t.cost_usd.as_deref(), Some("100.04635"));
        assert_eq!(t.fallback_extra_usd.as_deref(), Some("1.5423"));
        // A route status from before the field: counted from zero.
        let t = route_status(&facts(TotalStats::default())).totals.unwrap();
        assert_eq!(t.cost_usd.as_deref(), Some("0.04635"));
    }

    #[test]
    fn programmed_only_when_every_ready_replica_serves_the_generation() {
        let r = route("team-a", "smart", 4, &["openai"]);
        let proxies = replicas(&[("a", 4), ("b", 3)]);
        let facts = RouteFacts {
            route: &r,
            diagnostics: vec![],
            served: served(4),
            undelivered: None,
            proxies: &proxies,
            seed: TotalStats {
                requests: 100,
                resumed: 3,
                ..TotalStats::default()
            },
            now: time(10),
        };
        let s = route_status(&facts);
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!(get(&s, types::ACCEPTED).status, "True");
        assert_eq!(get(&s, types::RESOLVED_REFS).status, "True");
        let p = get(&s, types::PROGRAMMED);
        assert_eq!(
            (p.status.as_str(), p.reason.as_str()),
            ("False", reasons::PENDING)
        );
        assert!(p.message.contains("1 of 2"), "{}", p.message);
        assert_eq!(s.target_count, Some(1));
        assert_eq!(s.open_circuits, Some(1));
        assert_eq!(s.targets[0].circuit, CircuitState::Open);
        assert_eq!(s.window.as_ref().unwrap().requests, 7);
        assert_eq!(s.totals.as_ref().unwrap().requests, 109);
        assert_eq!(
            s.totals.as_ref().unwrap().resumed,
            3,
            "the seed, carried from status.totals"
        );

        let proxies = replicas(&[("a", 4), ("b", 4)]);
        let s = route_status(&RouteFacts {
            undelivered: None,
            proxies: &proxies,
            ..facts
        });
        assert_eq!(get(&s, types::PROGRAMMED).status, "True");
        assert_eq!(get(&s, types::PROGRAMMED).observed_generation, Some(4));
    }

    #[test]
    fn the_right_generation_at_an_older_revision_is_not_programmed() {
        let r = route("team-a", "smart", 4, &["openai"]);
        let mut proxies = replicas(&[("127.0.0.1:9090", 4), ("127.0.0.1:9091", 4)]);
        // 9091 still serves the key (or credential) from before the change.
        let view = proxies.routes.values_mut().next().unwrap();
        view.revisions
            .insert("127.0.0.1:9091".into(), revision("00000000000000bb"));
        let facts = RouteFacts {
            route: &r,
            diagnostics: vec![],
            served: served(4),
            undelivered: None,
            proxies: &proxies,
            seed: TotalStats::default(),
            now: time(10),
        };
        let s = route_status(&facts);
        let p = get(&s, types::PROGRAMMED);
        assert_eq!(
            (p.status.as_str(), p.reason.as_str()),
            ("False", reasons::PENDING)
        );
        assert_eq!(p.observed_generation, Some(4));
        assert_eq!(
            p.message,
            "1 of 2 ready proxy replicas serve generation 4 at revision 00000000000000aa; \
             127.0.0.1:9091 serves generation 4 at revision 00000000000000bb, not \
             00000000000000aa (a credential or key it uses changed)"
        );

        // A proxy that reports no revision at all cannot be shown to serve it.
        let mut older = replicas(&[("127.0.0.1:9090", 4)]);
        older.routes.values_mut().next().unwrap().revisions.clear();
        let s = route_status(&RouteFacts {
            undelivered: None,
            proxies: &older,
            ..facts
        });
        let p = get(&s, types::PROGRAMMED);
        assert_eq!(p.status, "False");
        assert!(p.message.contains("reports no revision"), "{}", p.message);

        // Once it serves the rendered revision: Programmed.
        let caught_up = replicas(&[("127.0.0.1:9090", 4), ("127.0.0.1:9091", 4)]);
        let s = route_status(&RouteFacts {
            route: &r,
            diagnostics: vec![],
            served: served(4),
            undelivered: None,
            proxies: &caught_up,
            seed: TotalStats::default(),
            now: time(20),
        });
        let p = get(&s, types::PROGRAMMED);
        assert_eq!(
            (p.status.as_str(), p.observed_generation),
            ("True", Some(4))
        );
        assert_eq!(
            p.message,
            "all 2 ready proxy replicas serve generation 4 at revision 00000000000000aa"
        );
    }

    fn has(s: &LLMRouteStatus, t: &str) -> bool {
        s.conditions.iter().any(|c| c.type_ == t)
    }

    /// operator/README.md#conditions: Ready=True only for the current generation accepted,
    /// resolved and programmed; otherwise Ready=False with the first failing condition's
    /// reason, and kstatus's Reconciling (the proxies have not caught up) or Stalled (the
    /// user must act), each present only while it holds.
    #[test]
    fn ready_follows_the_current_generation_with_kstatus_conditions() {
        let r = route("team-a", "smart", 4, &["openai"]);
        let facts = |proxies| RouteFacts {
            route: &r,
            diagnostics: vec![],
            served: served(4),
            undelivered: None,
            proxies,
            seed: TotalStats::default(),
            now: time(10),
        };
        let pending = replicas(&[("a", 4), ("b", 3)]);
        let s = route_status(&facts(&pending));
        let ready = get(&s, types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", reasons::PENDING)
        );
        assert_eq!(ready.message, get(&s, types::PROGRAMMED).message);
        assert_eq!(ready.observed_generation, Some(4));
        let reconciling = get(&s, types::RECONCILING);
        assert_eq!(
            (reconciling.status.as_str(), reconciling.reason.as_str()),
            ("True", reasons::PENDING)
        );
        assert!(!has(&s, types::STALLED));

        let served_everywhere = replicas(&[("a", 4), ("b", 4)]);
        let s = route_status(&facts(&served_everywhere));
        let ready = get(&s, types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", reasons::READY)
        );
        assert!(ready.message.contains("generation 4"), "{}", ready.message);
        assert!(!has(&s, types::RECONCILING) && !has(&s, types::STALLED));
        // The three conditions of before stay.
        for t in [types::ACCEPTED, types::RESOLVED_REFS, types::PROGRAMMED] {
            assert_eq!(get(&s, t).status, "True", "{t}");
        }

        // A missing credential: only the user can fix it; the last good version serves.
        let d = diag(reason::CREDENTIAL_NOT_FOUND, Severity::Error);
        let s = route_status(&RouteFacts {
            diagnostics: vec![&d],
            served: Some(Served {
                generation: 3,
                last_good: true,
                targets: 1,
                revision: revision(REVISION),
            }),
            ..facts(&served_everywhere)
        });
        let ready = get(&s, types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", reason::CREDENTIAL_NOT_FOUND)
        );
        assert_eq!(get(&s, types::STALLED).reason, reason::CREDENTIAL_NOT_FOUND);
        assert!(!has(&s, types::RECONCILING));

        // A model conflict: Accepted=False is the first thing to fix.
        let d = diag(reason::MODEL_CONFLICT, Severity::Error);
        let s = route_status(&RouteFacts {
            diagnostics: vec![&d],
            served: None,
            ..facts(&served_everywhere)
        });
        assert_eq!(get(&s, types::READY).reason, reason::MODEL_CONFLICT);
        assert_eq!(get(&s, types::STALLED).status, "True");
    }

    #[test]
    fn no_replicas_is_not_programmed() {
        let r = route("team-a", "smart", 1, &["openai"]);
        let s = route_status(&RouteFacts {
            route: &r,
            diagnostics: vec![],
            served: served(1),
            undelivered: None,
            proxies: &Snapshot::default(),
            seed: TotalStats::default(),
            now: time(1),
        });
        assert_eq!(
            get(&s, types::PROGRAMMED).reason,
            reasons::NO_READY_REPLICAS
        );
    }

    #[test]
    fn unresolved_refs_serve_the_last_good_version() {
        let r = route("team-a", "smart", 5, &["missing"]);
        let d = diag(reason::CREDENTIAL_NOT_FOUND, Severity::Error);
        let proxies = replicas(&[("a", 4)]);
        let s = route_status(&RouteFacts {
            route: &r,
            diagnostics: vec![&d],
            served: Some(Served {
                generation: 4,
                last_good: true,
                targets: 1,
                revision: revision(REVISION),
            }),
            undelivered: None,
            proxies: &proxies,
            seed: TotalStats::default(),
            now: time(1),
        });
        assert_eq!(get(&s, types::ACCEPTED).status, "True");
        let rr = get(&s, types::RESOLVED_REFS);
        assert_eq!(
            (rr.status.as_str(), rr.reason.as_str()),
            ("False", reason::CREDENTIAL_NOT_FOUND)
        );
        assert!(rr.message.contains("spec.targets[0].credentialRef"));
        let p = get(&s, types::PROGRAMMED);
        assert_eq!(p.reason, reasons::SERVING_LAST_GOOD);
        assert!(p.message.contains("generation 4"));
    }

    #[test]
    fn model_conflict_is_not_accepted() {
        let r = route("team-a", "smart", 1, &["openai"]);
        let d = diag(reason::MODEL_CONFLICT, Severity::Error);
        let s = route_status(&RouteFacts {
            route: &r,
            diagnostics: vec![&d],
            served: None,
            undelivered: None,
            proxies: &Snapshot::default(),
            seed: TotalStats::default(),
            now: time(1),
        });
        let a = get(&s, types::ACCEPTED);
        assert_eq!(
            (a.status.as_str(), a.reason.as_str()),
            ("False", "ModelConflict")
        );
        assert_eq!(get(&s, types::PROGRAMMED).reason, reasons::NOT_RENDERED);
        assert_eq!(s.target_count, None);
    }

    #[test]
    fn last_transition_time_is_kept_while_the_status_holds() {
        let mut r = route("team-a", "smart", 1, &["openai"]);
        let proxies = replicas(&[("a", 1)]);
        let first = route_status(&RouteFacts {
            route: &r,
            diagnostics: vec![],
            served: served(1),
            undelivered: None,
            proxies: &proxies,
            seed: TotalStats::default(),
            now: time(1),
        });
        r.status = Some(first.clone());
        // Later, same facts: identical status, nothing to write.
        let again = route_status(&RouteFacts {
            route: &r,
            diagnostics: vec![],
            served: served(1),
            undelivered: None,
            proxies: &proxies,
            seed: TotalStats::default(),
            now: time(50),
        });
        assert_eq!(again, first);
        // Generation 2 while replicas still serve 1: Programmed flips, the others keep
        // their time but carry the new observedGeneration.
        r.metadata.generation = Some(2);
        let next = route_status(&RouteFacts {
            route: &r,
            diagnostics: vec![],
            served: served(2),
            undelivered: None,
            proxies: &proxies,
            seed: TotalStats::default(),
            now: time(60),
        });
        assert_eq!(get(&next, types::ACCEPTED).last_transition_time, time(1));
        assert_eq!(get(&next, types::ACCEPTED).observed_generation, Some(2));
        assert_eq!(get(&next, types::PROGRAMMED).last_transition_time, time(60));
        assert!(!only_traffic_changed(&first, &next));
        let mut busier = first.clone();
        busier.window.as_mut().unwrap().requests += 1;
        assert!(only_traffic_changed(&first, &busier));
    }

    #[test]
    fn credential_conditions() {
        let missing = Diagnostic {
            kind: Kind::ProviderCredential,
            object: ObjectId::new("team-a", "openai"),
            severity: Severity::Warning,
            reason: reason::SECRET_KEY_MISSING,
            field: "spec.secretRef.key".into(),
            message: "key \"apiKey\" not found in Secret \"keys\"".into(),
        };
        let routes = vec!["a".to_string(), "b".to_string()];
        let s = credential_status(&CredentialFacts {
            key_count: 1,
            keys: None,
            generation: Some(1),
            previous: &[],
            diagnostics: vec![&missing],
            routes: &routes,
            deleting: false,
            now: time(1),
        });
        assert_eq!(s.routes, Some(2));
        assert_eq!(s.conditions[0].type_, types::READY);
        assert_eq!(s.conditions[0].reason, reason::SECRET_KEY_MISSING);
        assert_eq!(s.conditions[1].status, "False");
        let s = credential_status(&CredentialFacts {
            key_count: 1,
            keys: None,
            generation: Some(1),
            previous: &s.conditions,
            diagnostics: vec![],
            routes: &routes,
            deleting: true,
            now: time(2),
        });
        assert_eq!(s.conditions[0].reason, reasons::DELETION_BLOCKED);
        assert!(s.conditions[0].message.contains("a, b"));
        assert_eq!(s.conditions[1].status, "True");
        assert_eq!(s.conditions[1].last_transition_time, time(2));
        assert_eq!(s.conditions[0].last_transition_time, time(1));
        // Held deletion waits on routes going away: Reconciling, not Stalled.
        assert_eq!(s.conditions[2].type_, types::RECONCILING);
        assert_eq!(s.conditions[2].reason, reasons::DELETION_BLOCKED);
        assert_eq!(s.conditions.len(), 3);
    }

    #[test]
    fn credential_kstatus_conditions() {
        let missing = Diagnostic {
            kind: Kind::ProviderCredential,
            object: ObjectId::new("team-a", "openai"),
            severity: Severity::Warning,
            reason: reason::SECRET_KEY_MISSING,
            field: "spec.secretRef.key".into(),
            message: "key \"apiKey\" not found in Secret \"keys\"".into(),
        };
        let facts = |diagnostics| CredentialFacts {
            key_count: 1,
            keys: None,
            generation: Some(3),
            previous: &[],
            diagnostics,
            routes: &[],
            deleting: false,
            now: time(1),
        };
        let s = credential_status(&facts(vec![&missing]));
        assert_eq!(s.observed_generation, Some(3));
        let stalled = s.conditions.iter().find(|c| c.type_ == types::STALLED);
        assert_eq!(
            stalled.map(|c| (c.status.as_str(), c.reason.as_str())),
            Some(("True", reason::SECRET_KEY_MISSING))
        );
        let s = credential_status(&facts(vec![]));
        assert_eq!(s.conditions[0].status, "True");
        assert!(
            s.conditions
                .iter()
                .all(|c| c.type_ != types::STALLED && c.type_ != types::RECONCILING)
        );
    }

    /// docs/request-lifecycle.md#key-pools: `status.keys[]` by name with state, until and
    /// replicas, and how many of the credential's keys are usable (the `KEYS` printer
    /// column); nothing before the proxies have reported.
    #[test]
    fn a_credential_shows_its_keys_and_how_many_are_usable() {
        let keys = [
            KeyView {
                name: "k1".into(),
                state: stats::KeyState::Active,
                replicas: 3,
                until: None,
            },
            KeyView {
                name: "k3".into(),
                state: stats::KeyState::Rejected,
                replicas: 1,
                until: Some("2026-01-02T03:04:05Z".into()),
            },
        ];
        let facts = |keys| CredentialFacts {
            key_count: 3,
            keys,
            generation: Some(1),
            previous: &[],
            diagnostics: vec![],
            routes: &[],
            deleting: false,
            now: time(1),
        };
        let s = credential_status(&facts(Some(&keys)));
        assert_eq!(
            s.usable_keys.as_deref(),
            Some("1/3"),
            "k2 is not in the Secret"
        );
        assert_eq!(s.keys.len(), 2);
        assert_eq!(
            (
                s.keys[1].name.as_str(),
                s.keys[1].state.as_str(),
                s.keys[1].replicas
            ),
            ("k3", "Rejected", Some(1))
        );
        assert_eq!(
            s.keys[1].until.as_ref().map(|t| t.0.to_string()),
            Some("2026-01-02T03:04:05Z".to_string())
        );
        let s = credential_status(&facts(None));
        assert_eq!((s.usable_keys, s.keys.len()), (None, 0));
    }
}

#[cfg(test)]
mod client_tests {
    use super::*;
    use crate::fixtures::{client, time};
    use switchback_crds::compile::Kind;
    use switchback_crds::config::ObjectId;

    fn diag(reason: &'static str, severity: Severity, field: &str) -> Diagnostic {
        Diagnostic {
            kind: Kind::LLMClient,
            object: ObjectId::new("team-a", "checkout"),
            severity,
            reason,
            field: field.into(),
            message: "not found".into(),
        }
    }

    fn status_of(
        diagnostics: &[Diagnostic],
        exhausted: Option<&Exhausted>,
        auth_required: bool,
    ) -> LLMClientStatus {
        let c = client("team-a", "checkout", "keys", "app", 1_000);
        let view = ClientView {
            window_requests: 50,
            ..Default::default()
        };
        client_status(&ClientFacts {
            client: &c,
            diagnostics: diagnostics.iter().collect(),
            routes: Some(2),
            usage: Current::default(),
            exhausted,
            view: Some(&view),
            window_seconds: 300,
            auth_required,
            now: time(0),
        })
    }

    fn ready(s: &LLMClientStatus) -> (&str, &str, &str) {
        let c = &s.conditions[0];
        assert_eq!(c.type_, types::READY);
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn ready_names_what_keeps_a_client_from_working_first_things_first() {
        let missing = diag(reason::KEY_MISSING, Severity::Warning, "spec.keySecretRef");
        let route = diag(reason::ROUTE_NOT_FOUND, Severity::Warning, "spec.routes[1]");
        let invalid = diag(reason::INVALID_SPEC, Severity::Error, "spec.limits");
        let spent = Exhausted {
            budget: "tokensPerDay".into(),
            until: "2026-12-03T00:00:00Z".into(),
        };
        let s = status_of(
            &[missing.clone(), route.clone(), invalid],
            Some(&spent),
            true,
        );
        assert_eq!(ready(&s).1, reason::INVALID_SPEC);
        let s = status_of(&[route.clone(), missing], Some(&spent), true);
        let (status, reason, message) = ready(&s);
        assert_eq!((status, reason), ("False", reason::ROUTE_NOT_FOUND));
        assert!(message.contains("spec.routes[1]"), "{message}");
        let kstatus = |s: &LLMClientStatus| -> Vec<(String, String)> {
            s.conditions[1..]
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect()
        };
        assert_eq!(
            kstatus(&s),
            [(types::STALLED.to_string(), "True".to_string())],
            "a client naming a missing route waits for the user"
        );
        let s = status_of(&[], Some(&spent), true);
        let (status, reason, message) = ready(&s);
        assert_eq!((status, reason), ("False", reason::BUDGET_EXHAUSTED));
        assert!(message.contains("2026-12-03T00:00:00Z"), "{message}");
        // Not Ready, yet fully reconciled: a spent budget is no sync to wait on.
        assert_eq!(kstatus(&s), []);
        let s = status_of(&[], None, true);
        assert_eq!(ready(&s).0, "True");
        assert_eq!(s.routes, Some(2));
        assert_eq!(s.requests_per_minute, Some(10), "50 requests in 5 minutes");
        assert_eq!(s.budget_used_percent, Some(0));
    }

    #[test]
    fn with_auth_off_ready_says_the_key_is_not_checked() {
        let s = status_of(&[], None, false);
        let (status, _, message) = ready(&s);
        assert_eq!(status, "True");
        assert!(message.contains("--auth off"), "{message}");
    }

    #[test]
    fn usage_alone_is_a_traffic_change() {
        let a = status_of(&[], None, true);
        let mut b = a.clone();
        b.requests_per_minute = Some(99);
        assert!(only_client_traffic_changed(&a, &b));
        let c = status_of(&[], None, false);
        assert!(!only_client_traffic_changed(&a, &c));
    }

    /// Every reason the operator writes is in operator/README.md's condition tables, and
    /// the delivery failure a user must act on is on the troubleshooting page.
    #[test]
    fn every_reason_the_operator_writes_is_documented() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let readme = std::fs::read_to_string(root.join("operator/README.md")).unwrap();
        let missing: Vec<&str> = reasons::ALL
            .iter()
            .copied()
            .filter(|r| !readme.contains(&format!("`{r}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "operator/README.md does not name {missing:?}"
        );
        let page = std::fs::read_to_string(root.join("docs/troubleshooting.md")).unwrap();
        for named in [
            reasons::DELIVERY_FAILED,
            "switchback_operator_delivery_failures_total",
        ] {
            assert!(
                page.contains(named),
                "docs/troubleshooting.md does not name {named}"
            );
        }
    }
}

//! LLMRoute → [`Route`]: models, strategy, targets (retry, price, credential
//! reference), fallback, circuit breaker, budget and sharing, each field checked
//! against the same rule as the CRD schema and CEL, with every default of `config.rs`
//! applied.

use std::collections::{BTreeMap, HashSet};

use crate::compile::credential::Outcome;
use crate::compile::fields::{self, Checker};
use crate::compile::{Diagnostic, Kind, reason};
use crate::config::{
    CircuitBreaker, FailureClass, Fallback, HealthCheck, Hedge, ObjectId, Price, ResponseModel,
    Resume, Retry, Route, SHARED_WITH_ALL, Strategy, StreamPolicy, Target,
};
use crate::duration::format_ms;
use crate::route::{
    ByteSize, CircuitBreakerSpec, FallbackSpec, HedgeSpec, LLMRouteSpec, RetrySpec, StreamSpec,
    TargetSpec,
};
use crate::schema::{
    MAX_HELD_BYTES, MAX_MODEL_LEN, MAX_MODELS, MAX_NAME_LEN, MAX_SHARED_WITH, MAX_STATUS_CODES,
    MAX_TARGETS, MIN_HELD_BYTES,
};

const MODES: [(&str, Strategy); 4] = [
    ("fallback", Strategy::Fallback),
    ("loadbalance", Strategy::Loadbalance),
    ("least-latency", Strategy::LeastLatency),
    ("cost-optimized", Strategy::CostOptimized),
];

const FAILURE_CLASSES: [(&str, FailureClass); 8] = [
    ("status5xx", FailureClass::Status5xx),
    ("rateLimited", FailureClass::RateLimited),
    ("timeout", FailureClass::Timeout),
    ("connectionError", FailureClass::ConnectionError),
    ("contextLength", FailureClass::ContextLength),
    ("invalidResponse", FailureClass::InvalidResponse),
    ("authError", FailureClass::AuthError),
    ("contentFilter", FailureClass::ContentFilter),
];

const DEFAULT_TIMEOUT_MS: u64 = 60_000;

/// The route, or `None` when it has an error; plus its diagnostics either way.
pub(crate) fn compile(
    id: &ObjectId,
    generation: i64,
    spec: &LLMRouteSpec,
    credentials: &BTreeMap<ObjectId, Outcome>,
) -> (Option<Route>, Vec<Diagnostic>) {
    let mut c = Checker::new(Kind::LLMRoute, id);

    let models = models(&mut c, id, spec.models.as_deref());
    let strategy = match spec.strategy.as_ref().and_then(|s| s.mode.as_deref()) {
        Some(mode) => {
            fields::one_of(&mut c, "spec.strategy.mode", mode, &MODES).unwrap_or(Strategy::Fallback)
        }
        None => Strategy::Fallback,
    };

    fields::list_len(
        &mut c,
        "spec.targets",
        spec.targets.len(),
        1,
        MAX_TARGETS as usize,
        "targets",
    );
    let targets: Vec<Target> = spec
        .targets
        .iter()
        .enumerate()
        .map(|(i, target)| {
            self::target(
                &mut c,
                &format!("spec.targets[{i}]"),
                id,
                target,
                credentials,
                &models,
            )
        })
        .collect();

    let fallback = fallback(&mut c, spec.fallback.as_ref());
    if fallback.on_failures.contains(&FailureClass::AuthError) {
        let first = spec.targets.first().map(|t| t.credential_ref.name.as_str());
        let distinct = spec
            .targets
            .iter()
            .any(|t| Some(t.credential_ref.name.as_str()) != first);
        if !distinct {
            c.invalid(
                "spec.fallback.onFailures",
                "authError needs at least two targets on different credentials",
            );
        }
    }
    let circuit_breaker = circuit_breaker(&mut c, spec.circuit_breaker.as_ref());
    let timeout_ms = fields::duration_ms(
        &mut c,
        "spec.timeout",
        spec.timeout.as_deref(),
        DEFAULT_TIMEOUT_MS,
        true,
    );
    let shared_with = shared_with(&mut c, spec.shared_with.as_deref());
    let stream = stream(&mut c, spec.stream.as_ref());
    let hedge = hedge(&mut c, spec.hedge.as_ref());
    let response_model = match spec.response_model.as_deref() {
        Some(v) => {
            fields::one_of(&mut c, "spec.responseModel", v, &RESPONSE_MODELS).unwrap_or_default()
        }
        None => ResponseModel::Requested,
    };

    let route = (!c.has_errors()).then(|| Route {
        id: id.clone(),
        generation,
        models,
        strategy,
        targets,
        fallback,
        circuit_breaker,
        timeout_ms,
        shared_with,
        stream,
        hedge,
        response_model,
    });
    (route, c.diagnostics)
}

/// `spec.sharedWith`: at most 64 unique namespace names, or `*` alone; sorted.
fn shared_with(c: &mut Checker, spec: Option<&[String]>) -> Vec<String> {
    let Some(entries) = spec else {
        return Vec::new();
    };
    fields::list_len(
        c,
        "spec.sharedWith",
        entries.len(),
        0,
        MAX_SHARED_WITH as usize,
        "namespaces",
    );
    let mut seen = HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let field = format!("spec.sharedWith[{i}]");
        if entry != SHARED_WITH_ALL && !fields::is_dns_label(entry) {
            c.invalid(
                &field,
                format!("{entry:?} is not a namespace name (a lower-case RFC 1123 label) or \"*\""),
            );
        } else if !seen.insert(entry.as_str()) {
            c.invalid(&field, format!("{entry:?} is listed more than once"));
        }
    }
    if entries.len() > 1 && seen.contains(SHARED_WITH_ALL) {
        c.invalid(
            "spec.sharedWith",
            "\"*\" shares with every namespace and must be the only entry",
        );
    }
    let mut out = entries.to_vec();
    out.sort();
    out.dedup();
    out
}

/// `spec.models`, default `[metadata.name]`: 1..=32 unique names of 1..=256 characters.
fn models(c: &mut Checker, id: &ObjectId, models: Option<&[String]>) -> Vec<String> {
    let Some(models) = models else {
        return vec![id.name.clone()];
    };
    fields::list_len(
        c,
        "spec.models",
        models.len(),
        1,
        MAX_MODELS as usize,
        "models",
    );
    let mut seen = HashSet::new();
    for (i, model) in models.iter().enumerate() {
        let field = format!("spec.models[{i}]");
        fields::string_len(c, &field, model, 1, MAX_MODEL_LEN as usize);
        if !seen.insert(model.as_str()) {
            c.invalid(&field, format!("{model:?} is listed more than once"));
        }
    }
    models.to_vec()
}

fn target(
    c: &mut Checker,
    path: &str,
    route: &ObjectId,
    spec: &TargetSpec,
    credentials: &BTreeMap<ObjectId, Outcome>,
    models: &[String],
) -> Target {
    let credential = ObjectId::new(route.namespace.clone(), spec.credential_ref.name.clone());
    let name_field = format!("{path}.credentialRef.name");
    if fields::string_len(c, &name_field, &credential.name, 1, MAX_NAME_LEN as usize) {
        credential_ref(c, &name_field, &credential, credentials);
    }
    if let Some(model) = &spec.model {
        fields::string_len(
            c,
            &format!("{path}.model"),
            model,
            1,
            MAX_MODEL_LEN as usize,
        );
    }
    let model_map = model_map(c, path, spec, models);
    let weight = fields::int_in_range(c, &format!("{path}.weight"), spec.weight, 1, 100, 1);
    let timeout_ms =
        fields::optional_duration_ms(c, &format!("{path}.timeout"), spec.timeout.as_deref(), true);
    let retry = retry(c, &format!("{path}.retry"), spec.retry.as_ref());
    let price = spec.price.as_ref().map(|price| Price {
        input_per_million: fields::decimal(
            c,
            &format!("{path}.price.inputPerMillion"),
            &price.input_per_million,
        ),
        output_per_million: fields::decimal(
            c,
            &format!("{path}.price.outputPerMillion"),
            &price.output_per_million,
        ),
    });
    let health_check = spec.health_check.as_ref().and_then(|h| {
        let field = format!("{path}.healthCheck.interval");
        let ms = fields::optional_duration_ms(c, &field, Some(&h.interval), true)?;
        if !at_least(c, &field, ms, MIN_HEALTH_CHECK_MS) {
            return None;
        }
        at_most(c, &field, ms, MAX_HEALTH_CHECK_MS);
        Some(HealthCheck { interval_ms: ms })
    });
    Target {
        credential,
        model: spec.model.clone(),
        model_map,
        weight,
        timeout_ms,
        retry,
        price,
        health_check,
    }
}

/// `modelMap`: exclusive with `model`, and mapping exactly the route's model names
/// (`spec.models`, or `[metadata.name]` when unset): a name it misses would have no
/// upstream model, a name the route does not serve is a typo.
fn model_map(
    c: &mut Checker,
    path: &str,
    spec: &TargetSpec,
    models: &[String],
) -> BTreeMap<String, String> {
    let Some(map) = &spec.model_map else {
        return BTreeMap::new();
    };
    let field = format!("{path}.modelMap");
    if spec.model.is_some() {
        c.invalid(&field, "model and modelMap are mutually exclusive");
    }
    fields::list_len(c, &field, map.len(), 1, MAX_MODELS as usize, "entries");
    for (name, upstream) in map {
        let entry = format!("{field}[{name}]");
        fields::string_len(c, &entry, upstream, 1, MAX_MODEL_LEN as usize);
        if !models.contains(name) {
            c.invalid(
                &entry,
                format!(
                    "{name:?} is not a model name of this route ({})",
                    models.join(", ")
                ),
            );
        }
    }
    for name in models.iter().filter(|m| !map.contains_key(*m)) {
        c.invalid(
            &field,
            format!("maps no upstream model for {name:?}, a model name of this route"),
        );
    }
    map.clone()
}

/// The target's credential must exist in the route's namespace and be valid; one
/// without a key keeps the route (the proxy skips that target) with a Warning.
fn credential_ref(
    c: &mut Checker,
    field: &str,
    credential: &ObjectId,
    credentials: &BTreeMap<ObjectId, Outcome>,
) {
    let Some(outcome) = credentials.get(credential) else {
        c.error(
            reason::CREDENTIAL_NOT_FOUND,
            field,
            format!(
                "ProviderCredential {:?} not found in namespace {}",
                credential.name, credential.namespace
            ),
        );
        return;
    };
    if outcome.credential.is_none() {
        // The platform's refusal is the reason to show: no edit of the route fixes it.
        let (reason, first) = match outcome.policy_refusal() {
            Some(d) => (reason::PRIVATE_NETWORK_NOT_ALLOWED, Some(d)),
            None => (reason::INVALID_CREDENTIAL, outcome.first_error()),
        };
        let why = first
            .map(|d| format!(": {}: {}", d.field, d.message))
            .unwrap_or_default();
        c.error(
            reason,
            field,
            format!("ProviderCredential {:?} is invalid{why}", credential.name),
        );
    } else if let Some(problem) = &outcome.key_problem {
        c.warning(
            reason::SECRET_KEY_MISSING,
            field,
            format!(
                "ProviderCredential {:?} has no key ({problem}); this target is skipped",
                credential.name
            ),
        );
    } else if let Some(problem) = &outcome.pool_problem {
        c.warning(
            reason::SECRET_KEY_MISSING,
            field,
            format!(
                "ProviderCredential {:?} serves with only some of its keys ({problem})",
                credential.name
            ),
        );
    }
}

fn retry(c: &mut Checker, path: &str, spec: Option<&RetrySpec>) -> Retry {
    let defaults = Retry::default();
    let Some(spec) = spec else {
        return defaults;
    };
    let attempts = fields::int_in_range(
        c,
        &format!("{path}.attempts"),
        spec.attempts,
        1,
        5,
        defaults.attempts,
    );
    let on_status_codes = spec.on_status_codes.as_deref().map(|codes| {
        fields::status_codes(
            c,
            &format!("{path}.onStatusCodes"),
            codes,
            MAX_STATUS_CODES as usize,
        )
    });
    let initial_field = format!("{path}.initialBackoff");
    let max_field = format!("{path}.maxBackoff");
    let initial =
        fields::optional_duration_ms(c, &initial_field, spec.initial_backoff.as_deref(), false);
    let max = fields::optional_duration_ms(c, &max_field, spec.max_backoff.as_deref(), false);
    let initial_backoff_ms = initial.unwrap_or(defaults.initial_backoff_ms);
    let max_backoff_ms = max.unwrap_or(defaults.max_backoff_ms);
    // Compared on effective values (the CEL rule does the same): initialBackoff 5s
    // alone is refused rather than silently capped by the 2s default.
    let initial_ok = initial.is_some() || spec.initial_backoff.is_none();
    let max_ok = max.is_some() || spec.max_backoff.is_none();
    if initial_ok && max_ok && max_backoff_ms < initial_backoff_ms {
        let shown = |ms: u64, given: bool| {
            if given {
                format_ms(ms)
            } else {
                format!("{} (the default)", format_ms(ms))
            }
        };
        if spec.max_backoff.is_some() {
            c.invalid(
                max_field,
                format!(
                    "{} is below initialBackoff {}",
                    shown(max_backoff_ms, true),
                    shown(initial_backoff_ms, spec.initial_backoff.is_some())
                ),
            );
        } else {
            c.invalid(
                initial_field,
                format!(
                    "{} is above maxBackoff {}",
                    shown(initial_backoff_ms, true),
                    shown(max_backoff_ms, false)
                ),
            );
        }
    }
    Retry {
        attempts,
        on_status_codes,
        initial_backoff_ms,
        max_backoff_ms,
        honour_retry_after: spec
            .honour_retry_after
            .unwrap_or(defaults.honour_retry_after),
    }
}

fn fallback(c: &mut Checker, spec: Option<&FallbackSpec>) -> Fallback {
    let defaults = Fallback::default();
    let Some(spec) = spec else {
        return defaults;
    };
    let on = match &spec.on_failures {
        None => defaults.on_failures,
        Some(names) => {
            fields::list_len(
                c,
                "spec.fallback.onFailures",
                names.len(),
                0,
                FAILURE_CLASSES.len(),
                "failure classes",
            );
            let mut on: Vec<FailureClass> = Vec::with_capacity(names.len());
            for (i, name) in names.iter().enumerate() {
                let class = fields::one_of(
                    c,
                    &format!("spec.fallback.onFailures[{i}]"),
                    name,
                    &FAILURE_CLASSES,
                );
                // A repeated class changes nothing; keep the first.
                if let Some(class) = class
                    && !on.contains(&class)
                {
                    on.push(class);
                }
            }
            on
        }
    };
    let on_status_codes = spec
        .on_status_codes
        .as_deref()
        .map(|codes| {
            fields::status_codes(
                c,
                "spec.fallback.onStatusCodes",
                codes,
                MAX_STATUS_CODES as usize,
            )
        })
        .unwrap_or_default();
    let max_retry_after_ms = fields::duration_ms(
        c,
        "spec.fallback.maxRetryAfter",
        spec.max_retry_after.as_deref(),
        defaults.max_retry_after_ms,
        false,
    );
    Fallback {
        on_failures: on,
        on_status_codes,
        max_retry_after_ms,
    }
}

fn circuit_breaker(c: &mut Checker, spec: Option<&CircuitBreakerSpec>) -> CircuitBreaker {
    let defaults = CircuitBreaker::default();
    let Some(spec) = spec else {
        return defaults;
    };
    let ramp_up_ms = fields::optional_duration_ms(
        c,
        "spec.circuitBreaker.rampUp",
        spec.ramp_up.as_deref(),
        true,
    );
    if let Some(ms) = ramp_up_ms {
        at_most(c, "spec.circuitBreaker.rampUp", ms, MAX_RAMP_UP_MS);
    }
    let probe_field = "spec.circuitBreaker.probeInterval";
    let probe_interval_ms = fields::duration_ms(
        c,
        probe_field,
        spec.probe_interval.as_deref(),
        defaults.probe_interval_ms,
        false,
    );
    // 0s switches probing off; anything else is at least a second, so probes stay
    // cheap whatever the route says.
    if probe_interval_ms != 0
        && at_least(
            c,
            probe_field,
            probe_interval_ms,
            CircuitBreaker::MIN_PROBE_INTERVAL_MS,
        )
    {
        at_most(c, probe_field, probe_interval_ms, MAX_PROBE_INTERVAL_MS);
    }
    CircuitBreaker {
        probe_interval_ms,
        ramp_up_ms,
        consecutive_failures: fields::int_in_range(
            c,
            "spec.circuitBreaker.consecutiveFailures",
            spec.consecutive_failures,
            1,
            1000,
            defaults.consecutive_failures,
        ),
        open_for_ms: fields::duration_ms(
            c,
            "spec.circuitBreaker.openFor",
            spec.open_for.as_deref(),
            defaults.open_for_ms,
            true,
        ),
    }
}

const MAX_IDLE_TIMEOUT_MS: u64 = 10 * 60_000;
const MAX_RAMP_UP_MS: u64 = 60 * 60_000;
const MAX_PROBE_INTERVAL_MS: u64 = 60 * 60_000;
const MIN_HEALTH_CHECK_MS: u64 = 1_000;
const MAX_HEALTH_CHECK_MS: u64 = 60 * 60_000;
const RESPONSE_MODELS: [(&str, ResponseModel); 2] = [
    ("requested", ResponseModel::Requested),
    ("served", ResponseModel::Served),
];

/// A duration's lower bound (the CEL rule `duration(self) >= duration(...)`); whether
/// it holds.
fn at_least(c: &mut Checker, field: &str, ms: u64, min_ms: u64) -> bool {
    if ms < min_ms {
        c.invalid(
            field,
            format!(
                "{} is below the minimum {}{}",
                format_ms(ms),
                format_ms(min_ms),
                if field.ends_with("probeInterval") {
                    " (0s switches probing off)"
                } else {
                    ""
                }
            ),
        );
        return false;
    }
    true
}
const RESUME_MODES: [(&str, bool); 2] = [("Off", false), ("Continue", true)];

/// A duration's upper bound (the CEL rule `duration(self) <= duration(...)`).
fn at_most(c: &mut Checker, field: &str, ms: u64, max_ms: u64) {
    if ms > max_ms {
        c.invalid(
            field,
            format!(
                "{} is above the maximum {}",
                format_ms(ms),
                format_ms(max_ms)
            ),
        );
    }
}

/// `spec.stream`: `None` unless it asks for a stall limit or resume, so a route that
/// writes `stream: {}` or `resume: {mode: Off}` is served (and digested) as one that
/// does not.
fn stream(c: &mut Checker, spec: Option<&StreamSpec>) -> Option<StreamPolicy> {
    let spec = spec?;
    let idle_timeout_ms = fields::optional_duration_ms(
        c,
        "spec.stream.idleTimeout",
        spec.idle_timeout.as_deref(),
        true,
    );
    if let Some(ms) = idle_timeout_ms {
        at_most(c, "spec.stream.idleTimeout", ms, MAX_IDLE_TIMEOUT_MS);
    }
    let resume = spec.resume.as_ref().and_then(|r| {
        let on = match r.mode.as_deref() {
            Some(mode) => {
                fields::one_of(c, "spec.stream.resume.mode", mode, &RESUME_MODES).unwrap_or(false)
            }
            None => false,
        };
        let max_resumes = fields::int_in_range(
            c,
            "spec.stream.resume.maxResumes",
            r.max_resumes,
            1,
            5,
            Resume::DEFAULT_MAX_RESUMES,
        );
        let max_held_bytes = r
            .max_held_bytes
            .as_ref()
            .and_then(|size| held_bytes(c, "spec.stream.resume.maxHeldBytes", size))
            .unwrap_or(Resume::DEFAULT_MAX_HELD_BYTES);
        on.then_some(Resume {
            max_resumes,
            max_held_bytes,
        })
    });
    (idle_timeout_ms.is_some() || resume.is_some()).then_some(StreamPolicy {
        idle_timeout_ms,
        resume,
    })
}

/// A byte size (an integer, or a number with `Ki` or `Mi`) within the held-text range.
fn held_bytes(c: &mut Checker, field: &str, size: &ByteSize) -> Option<u64> {
    let bytes = match size {
        ByteSize::Bytes(n) => u64::try_from(*n).ok(),
        ByteSize::Quantity(text) => parse_byte_size(text),
    };
    let shown = match size {
        ByteSize::Bytes(n) => n.to_string(),
        ByteSize::Quantity(text) => format!("{text:?}"),
    };
    match bytes {
        None => {
            c.invalid(
                field,
                format!("{shown} is not a size in bytes like 262144, 256Ki or 1Mi"),
            );
            None
        }
        Some(n) if !(MIN_HELD_BYTES..=MAX_HELD_BYTES).contains(&n) => {
            c.invalid(
                field,
                format!("{shown} is not from 1Ki (1024) to 16Mi (16777216)"),
            );
            None
        }
        Some(n) => Some(n),
    }
}

/// `^[0-9]{1,9}(Ki|Mi)?$` (the schema's pattern), in bytes.
fn parse_byte_size(text: &str) -> Option<u64> {
    let (digits, unit) = if let Some(d) = text.strip_suffix("Ki") {
        (d, 1024)
    } else if let Some(d) = text.strip_suffix("Mi") {
        (d, 1024 * 1024)
    } else {
        (text, 1)
    };
    if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok().map(|n| n * unit)
}

/// `spec.hedge`.
fn hedge(c: &mut Checker, spec: Option<&HedgeSpec>) -> Option<Hedge> {
    let spec = spec?;
    let after_ms = fields::duration_ms(c, "spec.hedge.after", Some(&spec.after), 0, true);
    let max_percent = fields::int_in_range(
        c,
        "spec.hedge.maxPercent",
        spec.max_percent,
        1,
        100,
        Hedge::DEFAULT_MAX_PERCENT,
    );
    Some(Hedge {
        after_ms,
        max_percent,
    })
}

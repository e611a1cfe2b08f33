//! The `LLMRoute` custom resource: which model names a route serves and the ordered
//! provider targets behind them, with retries, fallback, circuit breaking and a budget,
//! and which other namespaces' clients may call it.
//!
//! These are the raw types, exactly as written in a manifest: optional fields stay
//! `Option` (unset is distinguishable from set), durations and prices stay strings.
//! `compile` turns them into [`crate::config::Route`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

/// An LLMRoute: the model names clients send and the ordered provider targets that
/// serve them.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "switchback.dev",
    version = "v1alpha1",
    kind = "LLMRoute",
    plural = "llmroutes",
    singular = "llmroute",
    shortname = "llmr",
    category = "switchback",
    namespaced,
    status = "LLMRouteStatus",
    derive = "PartialEq",
    doc = "LLMRoute declares how the model names clients send are served: an ordered set of provider targets with retries, fallback, circuit breaking and a time budget.",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.strategy.mode","description":"Target ordering strategy"}"#,
    printcolumn = r#"{"name":"Targets","type":"integer","jsonPath":".status.targetCount","description":"Targets in the programmed route"}"#,
    printcolumn = r#"{"name":"Programmed","type":"string","jsonPath":".status.conditions[?(@.type==\"Programmed\")].status","description":"Every ready proxy replica serves the observed generation"}"#,
    printcolumn = r#"{"name":"Serving","type":"string","jsonPath":".status.serving","description":"The target that answers first now"}"#,
    printcolumn = r#"{"name":"Open","type":"integer","jsonPath":".status.openCircuits","description":"Targets whose circuit is open on at least one replica"}"#,
    printcolumn = r#"{"name":"Requests","type":"integer","jsonPath":".status.window.requests","description":"Requests in the last stats window"}"#,
    printcolumn = r#"{"name":"Fallbacks","type":"integer","jsonPath":".status.window.fallbacks","description":"Requests answered by a target other than the first, last stats window"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new(
    "!has(self.fallback) || !has(self.fallback.onFailures) || !('authError' in self.fallback.onFailures) || self.targets.exists(t, t.credentialRef.name != self.targets[0].credentialRef.name)"
).message("authError in fallback.onFailures needs at least two targets on different credentials").field_path(".fallback.onFailures"))]
#[x_kube(validation = Rule::new(
    "!has(self.models) || self.targets.all(t, !has(t.modelMap) || (self.models.all(m, m in t.modelMap) && t.modelMap.all(k, k in self.models)))"
).message("a target's modelMap must map every model name of the route, and no other").field_path(".targets"))]
pub struct LLMRouteSpec {
    /// Model names clients send in the request's "model" field. Each name is served by
    /// one route only: when two routes claim a name, the older route keeps it and the
    /// newer one is not accepted (reason ModelConflict). Default: [metadata.name].
    /// 1 to 32 unique names, each 1 to 256 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::models")]
    #[x_kube(validation = Rule::new("self.all(m, self.exists_one(n, n == m))").message("model names must be unique"))]
    pub models: Option<Vec<String>>,

    /// How the order of targets is chosen for each request. Default: mode fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {}))]
    pub strategy: Option<Strategy>,

    /// Provider targets, 1 to 8. Declared order is the fallback order.
    #[schemars(length(min = 1, max = 8))]
    pub targets: Vec<TargetSpec>,

    /// When a failed target hands the request to the next one. Default: advance on
    /// status5xx, rateLimited, timeout, connectionError, contextLength and invalidResponse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackSpec>,

    /// Per-target circuit breaker, counted on each proxy replica. Default:
    /// consecutiveFailures 5, openFor 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerSpec>,

    /// Budget for the whole call: every attempt, backoff wait and fallback. A Gateway
    /// API duration (e.g. 250ms, 10s, 1m30s), above 0. Default: 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("must be above 0"))]
    pub timeout: Option<String>,

    /// Other namespaces whose LLMClients may call this route, naming it
    /// `<namespace>/<name>` in their spec.routes; "*" alone offers it to every
    /// namespace. Clients of the route's own namespace never need it. At most 64
    /// unique namespace names. Default: none (the route is private to its namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::shared_with")]
    #[x_kube(validation = Rule::new("self.all(m, self.exists_one(n, n == m))").message("namespaces must be unique"))]
    #[x_kube(validation = Rule::new("!('*' in self) || self.size() == 1").message("\"*\" shares with every namespace and must be the only entry"))]
    pub shared_with: Option<Vec<String>>,

    /// What happens to a stream after its first content event (the commit): a stall
    /// limit, and resuming a broken stream on the next target. Default: no stall limit,
    /// no resume (a stream that breaks after its commit ends with an SSE error event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamSpec>,

    /// First-token hedging: when the current attempt has produced no content after
    /// `after`, the next eligible target is started beside it and the first to answer
    /// wins; the other is cancelled at once. Default: none (no hedging).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeSpec>,

    /// What the "model" field of answers (every stream chunk too) says: requested, the
    /// name the client sent; served, the upstream model that answered. Either way the
    /// x-switchback-model response header names the upstream model. Default: requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::response_model")]
    pub response_model: Option<String>,
}

/// Committed streams: stall detection and resume after commit.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StreamSpec {
    /// A committed stream with no event from its provider for this long is a stall:
    /// it is resumed (see resume) or ended with an SSE error event. A Gateway API
    /// duration above 0 and at most 10m. Default: none (a silence longer than the
    /// attempt's timeout, the target's or else the route's, ends the stream as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('10m')").message("must be above 0 and at most 10m"))]
    pub idle_timeout: Option<String>,

    /// Resume after commit: a committed stream that breaks, stalls (idleTimeout) or
    /// gets an in-band error that would have failed over before the commit continues
    /// on the next eligible target, in the same client stream. Default: mode Off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeSpec>,
}

/// Resume after commit.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResumeSpec {
    /// Off: a committed stream that fails ends with an SSE error event. Continue: the
    /// next eligible target (anthropic, Claude on vertex or bedrock, openai-compatible
    /// with prefill: true; others are skipped as cannotResume) is asked to continue
    /// the answer from the text the client already has, and its continuation is
    /// relayed into the same stream after one SSE comment line
    /// `: switchback resumed <namespace>/<credential>`. Not resumed (error event as
    /// with Off): a tool call in progress, more than maxHeldBytes of text, maxResumes
    /// used, no eligible target left, or the route's timeout spent. Default: Off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::resume_mode")]
    pub mode: Option<String>,

    /// Resumes allowed per request, 1 to 5. Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 5))]
    pub max_resumes: Option<i32>,

    /// Most answer text held per stream to resume it, in bytes or as a quantity
    /// (256Ki, 1Mi): from 1Ki to 16Mi. A stream whose text grows past it is not
    /// resumed, and its held text is released. Default: 256Ki.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::byte_size")]
    #[x_kube(validation = Rule::new(schema::BYTE_SIZE_RANGE_RULE).message("must be from 1Ki (1024) to 16Mi (16777216)"))]
    pub max_held_bytes: Option<ByteSize>,
}

/// A size in bytes: an integer, or a quantity string with a binary suffix (`256Ki`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ByteSize {
    Bytes(i64),
    Quantity(String),
}

/// First-token hedging.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HedgeSpec {
    /// How long the current attempt may go without content (stream: its first
    /// content event; unary: its answer) before the next eligible target is started
    /// beside it. A Gateway API duration above 0. Required.
    #[schemars(schema_with = "schema::duration")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("must be above 0"))]
    pub after: String,

    /// At most this percentage of the route's requests started in the last 60 s
    /// (this one included) are hedged, per proxy replica. 1 to 100. Default: 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub max_percent: Option<i32>,
}

/// How the order of targets is chosen.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Strategy {
    /// fallback: declared order. loadbalance: first target drawn by weight, the rest in
    /// declared order. least-latency: by the smoothed latency each replica measured,
    /// unmeasured targets first. cost-optimized: cheapest price first, unpriced targets
    /// last. Default: fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::mode")]
    pub mode: Option<String>,
}

/// One provider target.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("!(has(self.model) && has(self.modelMap))").message("model and modelMap are mutually exclusive").field_path(".modelMap"))]
pub struct TargetSpec {
    /// The ProviderCredential (in the route's namespace) whose endpoint and key this
    /// target uses. Required.
    pub credential_ref: CredentialRef,

    /// Upstream model name sent to the provider; for azure-openai, the deployment
    /// name. Default: the name the client sent. 1 to 256 characters. Not with modelMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub model: Option<String>,

    /// Upstream model (azure-openai: deployment) by the name the client sent, for a
    /// route serving several names, e.g. {smart: gpt-4o, fast: gpt-4o-mini}. Must map
    /// every name in the route's models (metadata.name when models is unset) and no
    /// other. Not with model. At most 32 entries, values 1 to 256 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::model_map")]
    pub model_map: Option<std::collections::BTreeMap<String, String>>,

    /// Relative weight for mode loadbalance (ignored by the other modes). 1 to 100.
    /// Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<i32>,

    /// Time allowed for one attempt: a unary call's whole response, or a stream's first
    /// content event (the commit). A timeout advances to the next target at once. A Gateway API duration
    /// above 0. Default: none, only the route's timeout applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("must be above 0"))]
    pub timeout: Option<String>,

    /// Retries on this target before advancing. Default: attempts 1 (no retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,

    /// USD per million tokens, read by mode cost-optimized. Default: none (sorted last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<PriceSpec>,

    /// Opt-in health checks: the proxy sends this target a minimal request (one output
    /// token) every interval while its circuit is closed too; circuitBreaker's
    /// consecutiveFailures failed checks open the circuit, and the checks' latency
    /// feeds mode least-latency. Default: none (no checks while closed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheckSpec>,
}

/// A target's opt-in health check.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheckSpec {
    /// Time between two checks. A Gateway API duration from 1s to 1h. Required.
    #[schemars(schema_with = "schema::duration")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('1h')").message("must be from 1s to 1h"))]
    pub interval: String,
}

/// Names a ProviderCredential in the route's namespace.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialRef {
    /// Name of the ProviderCredential. Required, 1 to 253 characters.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Retries on one target. The wait before the Nth retry is drawn from
/// U[0, min(maxBackoff, initialBackoff * 2^(N-1))) (full jitter); an upstream
/// Retry-After replaces it when honourRetryAfter is true.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new(
    "duration(has(self.maxBackoff) ? self.maxBackoff : '2s') >= duration(has(self.initialBackoff) ? self.initialBackoff : '100ms')"
).message("maxBackoff (default 2s) must be at least initialBackoff (default 100ms)").field_path(".maxBackoff"))]
pub struct RetrySpec {
    /// Tries on this target, the first included. 1 to 5. Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 5))]
    pub attempts: Option<i32>,

    /// HTTP statuses retried on this target, each 100 to 599, at most 32. Transport
    /// errors are always retried. Default: 408, 429 and every 5xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::status_codes")]
    pub on_status_codes: Option<Vec<i32>>,

    /// Upper bound of the wait before the first retry. A Gateway API duration.
    /// Default: 100ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub initial_backoff: Option<String>,

    /// Cap on the backoff wait; at least initialBackoff. A Gateway API duration.
    /// Default: 2s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub max_backoff: Option<String>,

    /// Wait for the upstream's Retry-After instead of the computed backoff. Default: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honour_retry_after: Option<bool>,
}

/// Price of a target in USD per million tokens, as decimal strings (e.g. "2.50").
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriceSpec {
    /// USD per million input tokens, a decimal string like "2.50". Required, >= 0.
    #[schemars(schema_with = "schema::decimal")]
    pub input_per_million: String,
    /// USD per million output tokens, a decimal string like "10.00". Required, >= 0.
    #[schemars(schema_with = "schema::decimal")]
    pub output_per_million: String,
}

/// When a failure moves the request on to the next target.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FallbackSpec {
    /// Failure classes that advance to the next target: status5xx, rateLimited, timeout,
    /// connectionError, contextLength, invalidResponse (a 2xx that cannot be used),
    /// authError (401/403; needs two targets on
    /// different credentials), contentFilter (a provider's content filter refused the
    /// request: Azure OpenAI's 400 content_filter, a Gemini prompt blocked for safety).
    /// Any other failure is returned to
    /// the client. An empty list never advances. Default: all but authError and
    /// contentFilter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::failure_classes")]
    pub on_failures: Option<Vec<String>>,

    /// Extra HTTP statuses that advance to the next target, each 100 to 599, at most 32.
    /// Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::status_codes")]
    pub on_status_codes: Option<Vec<i32>>,

    /// A Retry-After (on a 429 or 503) longer than this abandons the target at once
    /// instead of waiting; a 429's park of the target for later requests never lasts
    /// longer. A Gateway API duration. Default: 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub max_retry_after: Option<String>,
}

/// Per-target circuit breaker.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CircuitBreakerSpec {
    /// Failover-eligible failures in a row that open the circuit. 1 to 1000. Default: 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub consecutive_failures: Option<i32>,

    /// How long an open circuit skips the target before it is probed. With
    /// probeInterval 0s the probe is one client request, and a failed one reopens the
    /// circuit for twice as long, capped at 5m. A Gateway API duration above 0.
    /// Default: 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("must be above 0"))]
    pub open_for: Option<String>,

    /// Failback ramp: after a circuit closes (its half-open probe succeeded), the
    /// target takes a share of the requests it would get that grows linearly from 10%
    /// to 100% over this time; the others go to the next target (skip reason
    /// rampingUp). A Gateway API duration above 0 and at most 1h. Default: none (the
    /// full share at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('1h')").message("must be above 0 and at most 1h"))]
    pub ramp_up: Option<String>,

    /// Probes of an open circuit: once openFor has passed, each proxy replica sends the
    /// target a minimal request of its own (one output token), then one every interval
    /// while they fail; a success closes the circuit (or starts rampUp), a failure
    /// keeps it open without doubling anything. No client request is used as a probe.
    /// 0s switches probing off: a client request is the half-open probe. A Gateway API
    /// duration: 0s, or from 1s to 1h. Default: 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    #[x_kube(validation = Rule::new("duration(self) == duration('0s') || (duration(self) >= duration('1s') && duration(self) <= duration('1h'))").message("must be 0s (probing off) or from 1s to 1h"))]
    pub probe_interval: Option<String>,
}

/// Observed state of an LLMRoute, written by the operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LLMRouteStatus {
    /// metadata.generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Accepted (the spec is valid and its models are not claimed by an older route),
    /// ResolvedRefs (every credential and key was found), Programmed (every ready proxy
    /// replica serves observedGeneration), Ready (all three, for this generation: what
    /// `kubectl wait --for=condition=Ready` waits on); while Ready is False, kstatus's
    /// Reconciling (the proxies are catching up) or Stalled (only an edit helps).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,

    /// Number of targets in the programmed route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_count: Option<i32>,

    /// Targets whose circuit is open on at least one proxy replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_circuits: Option<i32>,

    /// The target that answers first now: the first in the order a request takes that
    /// is Ready on the proxies (credential name, with the model when two targets share
    /// a credential). Absent when none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<String>,

    /// Why requests go where they go, in one sentence: the order a request takes now,
    /// each target skipped and why, the last window's fallbacks by reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,

    /// Per-target state, in declared order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetStatus>,

    /// Counters over the last stats window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowStats>,

    /// Counters since the route was created, monotonic across proxy restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub totals: Option<TotalStats>,
}

/// Observed state of one target, aggregated over proxy replicas.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetStatus {
    /// Name of the target's ProviderCredential.
    pub credential: String,
    /// Upstream model, when the target sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// What a request finds here now: Ready, CircuitOpen, HalfOpen, Parked, Saturated,
    /// NoKey or Unsupported. When replicas disagree, the state that keeps requests away
    /// the most, with `replicas` saying how many see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::target_state")]
    pub state: Option<String>,
    /// Since when it is in that state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// When the state ends on its own: an open circuit's next probe, a park's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
    /// Ready proxy replicas that see this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Fraction (0 to 1) of the last window's answers this target gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
    /// Closed, Open or HalfOpen; Open when open on any replica.
    pub circuit: CircuitState,
    /// Replicas on which the circuit is open.
    #[serde(default)]
    pub open_replicas: i32,
    /// The circuit is open and the proxies probe it in the background
    /// (circuitBreaker.probeInterval), or the target has a healthCheck: what the last
    /// probe found is in lastProbe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probing: Option<bool>,
    /// The most recent probe or health check of this target on any replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe: Option<LastProbe>,
    /// The most recent failed attempt on this target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<LastFailure>,
}

/// Circuit breaker state of a target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CircuitState {
    #[default]
    Closed,
    Open,
    HalfOpen,
}

/// The most recent failed attempt on a target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastFailure {
    /// Upstream HTTP status; absent for transport errors and timeouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<i32>,
    /// Failure class, e.g. status5xx, rateLimited, timeout, connectionError.
    pub reason: String,
    /// When it happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Time>,
}

/// The most recent probe of a target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastProbe {
    /// success, or the failure's reason (status5xx, timeout, connectionError, ...).
    pub outcome: String,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Time>,
}

/// Counters over the last stats window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowStats {
    /// Length of the window in seconds.
    pub seconds: i64,
    /// Client requests.
    pub requests: i64,
    /// Upstream requests sent, retries included.
    pub attempts: i64,
    /// Requests answered by a target other than the first in their order.
    pub fallbacks: i64,
    /// Requests that got an error answer after every target was tried or skipped.
    pub failed: i64,
    /// Requests that moved on from a target to a later one, by the reason they left it
    /// (status5xx, timeout, circuitOpen, parked, ...): why fallbacks happened.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub fallbacks_by_reason: std::collections::BTreeMap<String, i64>,
    /// What the window's answers cost at their targets' price (spec.targets[].price;
    /// reported and estimated usage; unpriced targets cost 0), in USD: an exact
    /// decimal string like "12.3456" (like an LLMClient's usd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<String>,
    /// Of costUsd, what answers by a target other than the first (in declared order)
    /// cost beyond what the first target's price would have charged for the same
    /// tokens, in USD. A fallback cheaper than the first adds nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_extra_usd: Option<String>,
}

/// Counters since the route was created, monotonic across proxy restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TotalStats {
    /// Client requests.
    pub requests: i64,
    /// Upstream requests sent, retries included.
    pub attempts: i64,
    /// Requests answered by a target other than the first in their order.
    pub fallbacks: i64,
    /// Requests that got an error answer after every target was tried or skipped.
    pub failed: i64,
    /// Streams that broke after their commit and were continued on another target
    /// (spec.stream.resume).
    #[serde(default)]
    pub resumed: i64,
    /// What the route's answers cost at their targets' price (spec.targets[].price;
    /// reported and estimated usage; unpriced targets cost 0), in USD: an exact
    /// decimal string like "1234.5678" (like an LLMClient's usd), monotonic across
    /// proxy restarts like the counters above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<String>,
    /// Of costUsd, what answers by a target other than the first (in declared order)
    /// cost beyond what the first target's price would have charged for the same
    /// tokens, in USD. A fallback cheaper than the first adds nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_extra_usd: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str = r#"
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: { name: smart, namespace: team-a }
spec:
  models: [smart]
  strategy: { mode: fallback }
  targets:
    - credentialRef: { name: openai-prod }
      model: gpt-4o
      weight: 1
      timeout: 20s
      retry: { attempts: 3, onStatusCodes: [429, 502, 503], initialBackoff: 100ms, maxBackoff: 2s, honourRetryAfter: true }
      price: { inputPerMillion: "2.50", outputPerMillion: "10.00" }
    - credentialRef: { name: anthropic-prod }
      model: claude-sonnet-4-5
  fallback:
    onFailures: [status5xx, rateLimited, timeout, connectionError, contextLength, invalidResponse]
    onStatusCodes: []
    maxRetryAfter: 30s
  circuitBreaker: { consecutiveFailures: 5, openFor: 30s }
  timeout: 60s
  sharedWith: [team-b]
"#;

    #[test]
    fn the_spec_example_parses() {
        let route: LLMRoute = serde_yaml_ng::from_str(ROUTE).expect("spec example parses");
        assert_eq!(route.spec.targets.len(), 2);
        assert_eq!(
            route.spec.targets[0]
                .retry
                .as_ref()
                .and_then(|r| r.attempts),
            Some(3)
        );
        assert_eq!(
            route
                .spec
                .circuit_breaker
                .as_ref()
                .and_then(|c| c.open_for.as_deref()),
            Some("30s")
        );
    }

    #[test]
    fn unknown_fields_are_rejected_at_every_level() {
        for (typo, fixed) in [
            ("  timeout: 60s", "  timeOut: 60s"),
            (
                "strategy: { mode: fallback }",
                "strategy: { mod: fallback }",
            ),
            (
                "credentialRef: { name: anthropic-prod }",
                "credentialRef: { nam: anthropic-prod }",
            ),
            ("      model: gpt-4o", "      modle: gpt-4o"),
            ("honourRetryAfter: true", "honorRetryAfter: true"),
            ("inputPerMillion", "inputPerMilion"),
            ("    maxRetryAfter: 30s", "    maxRetryAfer: 30s"),
            ("consecutiveFailures", "consecutiveFailure"),
            ("sharedWith", "sharedwith"),
        ] {
            let yaml = ROUTE.replacen(typo, fixed, 1);
            assert_ne!(yaml, ROUTE, "{typo} not found");
            let err = serde_yaml_ng::from_str::<LLMRoute>(&yaml).expect_err(fixed);
            assert!(err.to_string().contains("unknown field"), "{fixed}: {err}");
        }
    }

    #[test]
    fn status_round_trips() {
        let status: LLMRouteStatus = serde_yaml_ng::from_str(
            r#"
observedGeneration: 4
targets:
  - credential: openai-prod
    model: gpt-4o
    circuit: HalfOpen
    openReplicas: 1
    lastFailure: { status: 503, reason: status5xx, at: "2026-01-02T03:04:05Z" }
window: { seconds: 300, requests: 1200, attempts: 1260, fallbacks: 31, failed: 2 }
totals: { requests: 98000, attempts: 101200, fallbacks: 2100, failed: 40 }
"#,
        )
        .expect("status parses");
        assert_eq!(status.targets[0].circuit, CircuitState::HalfOpen);
        let back: LLMRouteStatus =
            serde_json::from_value(serde_json::to_value(&status).expect("to json"))
                .expect("from json");
        assert_eq!(back, status);
    }
}

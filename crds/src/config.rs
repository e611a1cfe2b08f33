//! The compiled config: the validated, defaulted form of routes, credentials and
//! clients that `compile` produces, the operator writes into ConfigMaps and the proxy
//! loads.
//!
//! Every default is already applied and every duration is in milliseconds, so a
//! consumer never re-validates or re-defaults. The shape is versioned
//! ([`CONFIG_VERSION`]): a proxy refuses a config whose version it does not know
//! instead of guessing. No key material ever lives here: provider keys travel
//! separately as [`Keys`], and a client is known only by the keyed hash of its key
//! ([`KeyHash`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::keyhash::KeyHash;
use crate::secret::Secret;

/// Version of the compiled config format. Bump on any incompatible change.
pub const CONFIG_VERSION: u32 = 1;

/// All routes, credentials and clients of one source (a namespace, or a standalone
/// manifest set).
///
/// `clients` is left out of the JSON when empty, so a config without LLMClients is
/// byte for byte what it was before clients existed (same [`CONFIG_VERSION`], same
/// route revisions); a proxy too old to know clients refuses a config that has them
/// (unknown field) instead of serving it without authentication.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompiledConfig {
    pub version: u32,
    pub routes: Vec<Route>,
    pub credentials: Vec<Credential>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<Client>,
}

impl Default for CompiledConfig {
    fn default() -> Self {
        Self {
            version: CONFIG_VERSION,
            routes: Vec::new(),
            credentials: Vec::new(),
            clients: Vec::new(),
        }
    }
}

/// Names a namespaced object: `namespace/name`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectId {
    pub namespace: String,
    pub name: String,
}

impl ObjectId {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The id of a Kubernetes object; a cluster-scoped or unnamed one has empty parts.
    pub fn of<K: kube::Resource>(obj: &K) -> Self {
        let meta = obj.meta();
        Self::new(
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One `LLMRoute`, validated and defaulted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Route {
    pub id: ObjectId,
    /// `metadata.generation` of the LLMRoute this was compiled from (0 when unknown,
    /// e.g. a standalone manifest).
    pub generation: i64,
    /// Model names clients send; never empty, unique across the whole config.
    pub models: Vec<String>,
    pub strategy: Strategy,
    /// 1..=8 targets, in declared order.
    pub targets: Vec<Target>,
    pub fallback: Fallback,
    pub circuit_breaker: CircuitBreaker,
    /// Budget for the whole call: every attempt, wait and fallback.
    pub timeout_ms: u64,
    /// Other namespaces whose clients may call this route (`spec.sharedWith`), sorted;
    /// `["*"]` = every namespace. Empty (and then absent from the JSON, so a route's
    /// revision does not change) = only clients of its own namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_with: Vec<String>,
    /// Committed streams (`spec.stream`,
    /// docs/streaming.md#streams-that-survive-their-provider): `None` (and then absent from
    /// the JSON, so existing revisions do not change) when neither a stall limit nor resume
    /// is asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamPolicy>,
    /// First-token hedging (`spec.hedge`, docs/streaming.md#first-token-hedging); `None`
    /// (absent from the JSON) = no hedging.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<Hedge>,
    /// The `model` answers carry (`spec.responseModel`, docs/request-lifecycle.md#headers):
    /// the name the client sent (the default, and then absent from the JSON) or the
    /// upstream model that answered.
    #[serde(default, skip_serializing_if = "ResponseModel::is_requested")]
    pub response_model: ResponseModel,
}

/// What an answer's `model` field (every stream chunk's too) says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ResponseModel {
    /// The name the client sent
    /// (docs/request-lifecycle.md#several-model-names-on-one-route-modelmap).
    #[default]
    Requested,
    /// The upstream model that answered.
    Served,
}

impl ResponseModel {
    pub fn is_requested(&self) -> bool {
        *self == Self::Requested
    }
}

/// What happens to a stream after its commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StreamPolicy {
    /// No event for this long after the commit is a stall. `None` = no stall limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Resume after commit (`mode: Continue`); `None` = `mode: Off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
}

/// Resume after commit: how often, and how much answer text may be held to do it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resume {
    /// Resumes per request: 1..=5.
    pub max_resumes: u32,
    /// Most answer text held per stream (1 KiB ..= 16 MiB).
    pub max_held_bytes: u64,
}

impl Resume {
    pub const DEFAULT_MAX_RESUMES: u32 = 1;
    pub const DEFAULT_MAX_HELD_BYTES: u64 = 256 * 1024;
}

/// First-token hedging.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hedge {
    /// No content from the current attempt by then starts the next eligible target.
    pub after_ms: u64,
    /// Most requests hedged, as a percentage of the route's requests started in the
    /// last 60 s on this replica: 1..=100.
    pub max_percent: u32,
}

impl Hedge {
    pub const DEFAULT_MAX_PERCENT: u32 = 10;
}

impl Route {
    /// Whether a client in `namespace` may be given this route: its own namespace, or
    /// one it is shared with.
    pub fn is_offered_to(&self, namespace: &str) -> bool {
        self.id.namespace == namespace
            || self
                .shared_with
                .iter()
                .any(|ns| ns == SHARED_WITH_ALL || ns == namespace)
    }
}

/// The `sharedWith` entry that offers a route to every namespace.
pub const SHARED_WITH_ALL: &str = "*";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    Fallback,
    Loadbalance,
    LeastLatency,
    CostOptimized,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    /// The ProviderCredential, always in the route's namespace.
    pub credential: ObjectId,
    /// Upstream model; `None` sends the name the client sent (or, with
    /// `model_map`, the name it maps to).
    pub model: Option<String>,
    /// Upstream model by the name the client sent (`spec.targets[].modelMap`): covers
    /// every model name of the route, and is exclusive with `model`. Empty (and then
    /// absent from the JSON, so existing revisions do not change) when not used.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_map: BTreeMap<String, String>,
    /// 1..=100, read by `loadbalance` only.
    pub weight: u32,
    /// One attempt: unary = whole response, stream = until the first content event.
    /// `None` = bounded only by the route's budget.
    pub timeout_ms: Option<u64>,
    pub retry: Retry,
    pub price: Option<Price>,
    /// Opt-in health checks (`healthCheck`, docs/request-lifecycle.md#probed-circuits):
    /// probed every interval while its circuit is closed too. `None` (and then absent from
    /// the JSON) = no checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
}

/// A target's opt-in health check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheck {
    /// One check every this long (1 s ..= 1 h).
    pub interval_ms: u64,
}

impl Target {
    /// The upstream model for a request whose client sent `client_model`: `model`,
    /// else the `modelMap` entry, else the client's own name.
    pub fn upstream_model<'a>(&'a self, client_model: &'a str) -> &'a str {
        match &self.model {
            Some(m) => m,
            None => self
                .model_map
                .get(client_model)
                .map_or(client_model, String::as_str),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retry {
    /// Tries on this target, the first included: 1..=5.
    pub attempts: u32,
    /// Statuses retried on this target. `None` = the default set: 408, 429 and 5xx.
    /// Transport errors are always retried.
    pub on_status_codes: Option<Vec<u16>>,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    pub honour_retry_after: bool,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            attempts: 1,
            on_status_codes: None,
            initial_backoff_ms: 100,
            max_backoff_ms: 2_000,
            honour_retry_after: true,
        }
    }
}

/// USD per million tokens, parsed from the decimal strings of the spec.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Price {
    pub input_per_million: f64,
    pub output_per_million: f64,
}

/// Failure classes a route may advance on (`spec.fallback.onFailures`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FailureClass {
    Status5xx,
    RateLimited,
    Timeout,
    ConnectionError,
    ContextLength,
    /// A 2xx that cannot be used: not the surface's JSON, a stream with no content
    /// event, or an answer over the response size limit.
    InvalidResponse,
    AuthError,
    /// A provider's content filter refused the request (Azure OpenAI's 400
    /// `content_filter`, Gemini's `promptFeedback.blockReason`). Opt-in, like `authError`: by default the answer is the
    /// request's fault and goes back to the client unchanged.
    ContentFilter,
}

impl FailureClass {
    /// The name used in `fallback.onFailures`, stats, logs and the `attempts` list.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Status5xx => "status5xx",
            Self::RateLimited => "rateLimited",
            Self::Timeout => "timeout",
            Self::ConnectionError => "connectionError",
            Self::ContextLength => "contextLength",
            Self::InvalidResponse => "invalidResponse",
            Self::AuthError => "authError",
            Self::ContentFilter => "contentFilter",
        }
    }

    /// `fallback.onFailures` when the route does not say.
    pub const DEFAULT_ON_FAILURES: [FailureClass; 6] = [
        Self::Status5xx,
        Self::RateLimited,
        Self::Timeout,
        Self::ConnectionError,
        Self::ContextLength,
        Self::InvalidResponse,
    ];
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fallback {
    pub on_failures: Vec<FailureClass>,
    /// Extra statuses that advance to the next target.
    pub on_status_codes: Vec<u16>,
    /// A longer Retry-After abandons the target at once.
    pub max_retry_after_ms: u64,
}

impl Default for Fallback {
    fn default() -> Self {
        Self {
            on_failures: FailureClass::DEFAULT_ON_FAILURES.to_vec(),
            on_status_codes: Vec::new(),
            max_retry_after_ms: 30_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CircuitBreaker {
    pub consecutive_failures: u32,
    pub open_for_ms: u64,
    /// Failback ramp (`rampUp`, docs/streaming.md#failback-ramp): after the circuit closes,
    /// the target's share grows from 10 % to 100 % over this time. `None` (absent from the
    /// JSON, so existing revisions do not change) = the full share at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp_up_ms: Option<u64>,
    /// Background probes of an open circuit (`probeInterval`,
    /// docs/request-lifecycle.md#probed-circuits): the first once `openFor` has passed,
    /// then one every this long while they fail. 0 = no probes (a client request is the
    /// half-open probe, docs/request-lifecycle.md#probed-circuits). Absent from the JSON at
    /// its default, so existing revisions do not change.
    #[serde(
        default = "CircuitBreaker::default_probe_interval_ms",
        skip_serializing_if = "CircuitBreaker::is_default_probe_interval"
    )]
    pub probe_interval_ms: u64,
}

impl CircuitBreaker {
    pub const DEFAULT_PROBE_INTERVAL_MS: u64 = 10_000;
    /// The shortest `probeInterval` other than 0.
    pub const MIN_PROBE_INTERVAL_MS: u64 = 1_000;

    fn default_probe_interval_ms() -> u64 {
        Self::DEFAULT_PROBE_INTERVAL_MS
    }

    fn is_default_probe_interval(ms: &u64) -> bool {
        *ms == Self::DEFAULT_PROBE_INTERVAL_MS
    }

    /// Whether open circuits are probed in the background (and so never by a client
    /// request).
    pub fn probes(&self) -> bool {
        self.probe_interval_ms > 0
    }
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            open_for_ms: 30_000,
            ramp_up_ms: None,
            probe_interval_ms: Self::DEFAULT_PROBE_INTERVAL_MS,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Provider {
    Openai,
    Anthropic,
    OpenaiCompatible,
    /// Azure OpenAI: the OpenAI wire with an `api-key` header, deployments for
    /// models, and either the classic `/deployments/{model}/...?api-version=` paths
    /// or the v1 API (see [`Credential::api_version`]).
    AzureOpenai,
    /// Google AI's native Gemini API (`generateContent` /
    /// `streamGenerateContent?alt=sse`, the model in the path, the key in
    /// `x-goog-api-key`): reached through translation from both client surfaces.
    Gemini,
    /// Google Cloud Vertex AI: a service-account JSON key exchanged for an OAuth
    /// token; Gemini models through `generateContent`, Anthropic (`claude-*`) models
    /// through `rawPredict` / `streamRawPredict`. Needs [`Credential::project`] and
    /// [`Credential::location`].
    Vertex,
    /// Amazon Bedrock's Converse API (`/model/{modelId}/converse`, ConverseStream in
    /// AWS event-stream framing), requests signed with SigV4 for the credential's
    /// `region` from the access key pair (and session token) in its Secret: reached
    /// through translation from both client surfaces.
    Bedrock,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::Anthropic => "anthropic",
            Self::OpenaiCompatible => "openai-compatible",
            Self::AzureOpenai => "azure-openai",
            Self::Gemini => "gemini",
            Self::Vertex => "vertex",
            Self::Bedrock => "bedrock",
        }
    }

    /// The base URL used when a credential does not set `baseURL`.
    /// `openai-compatible` and `azure-openai` (one host per resource) have none: it
    /// must be given; `bedrock`'s follows from its region ([`bedrock_base_url`]).
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            Self::Openai => Some("https://api.openai.com/v1"),
            Self::Anthropic => Some("https://api.anthropic.com/v1"),
            Self::Gemini => Some("https://generativelanguage.googleapis.com/v1beta"),
            // vertex's endpoint follows from its location (`vertex_base_url`).
            Self::OpenaiCompatible | Self::AzureOpenai | Self::Vertex | Self::Bedrock => None,
        }
    }

    /// Speaks the OpenAI wire (chat completions, embeddings, its SSE framing and
    /// error shapes), whatever its paths and auth header.
    pub fn speaks_openai(self) -> bool {
        matches!(
            self,
            Self::Openai | Self::OpenaiCompatible | Self::AzureOpenai
        )
    }
}

/// One `ProviderCredential`, validated and defaulted; the key itself is in [`Keys`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Credential {
    pub id: ObjectId,
    pub provider: Provider,
    /// Without a trailing slash; endpoint paths (`/chat/completions`, `/messages`, ...)
    /// are appended to it.
    pub base_url: String,
    /// Static headers sent with every request (no secrets).
    pub headers: BTreeMap<String, String>,
    pub max_concurrency: Option<u32>,
    pub max_queue: Option<u32>,
    pub allow_private_network: bool,
    pub secret_ref: SecretKeyRef,
    /// `azure-openai` only: the `api-version` of the classic deployment paths
    /// (`{baseURL}/deployments/{model}/chat/completions?api-version=...`). `None`
    /// (spec `apiVersion` absent or `v1`) = the v1 API (`{baseURL}/v1/chat/completions`,
    /// the deployment in the body's `model`). Always `None` for other providers, and
    /// then absent from the JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `openai-compatible` only (spec `responsesAPI: true`): the server answers the
    /// OpenAI Responses API too. Always `false` for other providers (whether they
    /// serve it follows from the provider), and then absent from the JSON.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub responses_api: bool,
    /// `openai-compatible` only (spec `prefill: true`): the server continues a final
    /// assistant message (`continue_final_message`), so it may resume a broken
    /// stream. Always `false` for other providers (whether they can follows from the
    /// provider), and then absent from the JSON.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefill: bool,
    /// `vertex` only (and always set there): the Google Cloud project ID. `None`
    /// for other providers, and then absent from the JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// `vertex` only (and always set there): the Vertex AI location, a region such
    /// as `us-east5` or `global`. `None` for other providers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// `bedrock` only: the AWS region requests are signed for (and whose runtime
    /// endpoint is the default `base_url`). `None` for other providers, and then
    /// absent from the JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// How long a key answered with 401 or 403 is set aside (`keyRejectedFor`,
    /// docs/request-lifecycle.md#key-pools). Absent from the JSON at its default, so
    /// existing revisions do not change.
    #[serde(
        default = "Credential::default_key_rejected_for_ms",
        skip_serializing_if = "Credential::is_default_key_rejected_for"
    )]
    pub key_rejected_for_ms: u64,
}

/// The Vertex AI endpoint of a location: `https://{location}-aiplatform.googleapis.com/v1`,
/// or `https://aiplatform.googleapis.com/v1` for `global`. Model paths
/// (`/projects/{project}/locations/{location}/publishers/...`) are appended to it.
pub fn vertex_base_url(location: &str) -> String {
    if location == "global" {
        "https://aiplatform.googleapis.com/v1".to_string()
    } else {
        format!("https://{location}-aiplatform.googleapis.com/v1")
    }
}

/// Amazon Bedrock's runtime endpoint in `region`.
pub fn bedrock_base_url(region: &str) -> String {
    format!("https://bedrock-runtime.{region}.amazonaws.com")
}

/// The Secret data keys a `bedrock` credential reads (the whole Secret, docs/providers.md#bedrock).
pub const AWS_ACCESS_KEY_ID: &str = "accessKeyId";
pub const AWS_SECRET_ACCESS_KEY: &str = "secretAccessKey";
pub const AWS_SESSION_TOKEN: &str = "sessionToken";

/// The Secret data key a `vertex` credential reads its service-account JSON key
/// from when `secretRef` names none (it takes the whole Secret, docs/providers.md#vertex).
pub const VERTEX_SERVICE_ACCOUNT_KEY: &str = "serviceAccount.json";

impl Credential {
    pub const DEFAULT_KEY_REJECTED_FOR_MS: u64 = 5 * 60_000;

    fn default_key_rejected_for_ms() -> u64 {
        Self::DEFAULT_KEY_REJECTED_FOR_MS
    }

    fn is_default_key_rejected_for(ms: &u64) -> bool {
        *ms == Self::DEFAULT_KEY_REJECTED_FOR_MS
    }

    /// The names of its keys, as stats, status and metrics show them (never a value):
    /// a pool's data keys in declared order, else its one data key (`bedrock`, which
    /// reads a key pair, by [`AWS_ACCESS_KEY_ID`]).
    pub fn key_names(&self) -> Vec<&str> {
        if !self.secret_ref.keys.is_empty() {
            return self.secret_ref.keys.iter().map(String::as_str).collect();
        }
        if self.secret_ref.key.is_empty() {
            return vec![AWS_ACCESS_KEY_ID];
        }
        vec![self.secret_ref.key.as_str()]
    }

    /// Can this credential answer the OpenAI Responses API (`POST /responses`)?
    /// openai and azure-openai on its v1 API do; openai-compatible when it declares
    /// it; anthropic, gemini, vertex and bedrock never. Azure's classic (dated `apiVersion`) paths are not used
    /// for it.
    pub fn serves_responses(&self) -> bool {
        match self.provider {
            Provider::Openai => true,
            Provider::AzureOpenai => self.api_version.is_none(),
            Provider::OpenaiCompatible => self.responses_api,
            Provider::Anthropic | Provider::Gemini | Provider::Vertex | Provider::Bedrock => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    pub name: String,
    /// Empty for a `bedrock` credential, which reads the whole Secret (and then
    /// absent from the JSON).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// A key pool (`secretRef.keys`, docs/request-lifecycle.md#key-pools): its data keys in
    /// declared order, and then `key` is empty. Empty (and absent from the JSON) for one
    /// key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
}

/// One `LLMClient`, validated and defaulted: who it is (the hash of its key), which
/// routes it may call, and its limits and budgets, cluster-wide (the operator renders
/// each replica's share).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Client {
    pub id: ObjectId,
    /// `metadata.generation` of the LLMClient (0 when unknown).
    pub generation: i64,
    /// HMAC-SHA256 of the key under the per-cluster secret. `None` when the key is
    /// missing or unusable, when an older client has the same key, or when `compile`
    /// was given no hasher: nobody can authenticate as this client (fail closed, so
    /// deleting the Secret revokes the key once the new config is delivered).
    pub key_hash: Option<KeyHash>,
    /// Where the key came from, for status and diagnostics (never the key).
    pub key_secret_ref: SecretKeyRef,
    /// Routes the client may call, sorted and unique: `spec.routes` resolved, or every
    /// LLMRoute of its namespace when unset. Only routes that exist and are offered to
    /// the client's namespace; the proxy checks [`Route::is_offered_to`] again on the
    /// route it serves.
    pub routes: Vec<ObjectId>,
    /// Cluster-wide limits, as written in `spec.limits`.
    pub limits: ClientLimits,
    pub budget: ClientBudget,
    /// How many proxy replicas share `limits`: each replica enforces
    /// `limit / replicas` (at least 1), so the cluster-wide rate stays within the
    /// limit without a shared store. The operator renders the ready replicas it
    /// scraped (at least 1); standalone it is 1. Left out of the JSON when 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub replicas: u32,
    /// Set by the operator once a budget is spent (from the usage summed over every
    /// replica): every replica answers 429 `budget_exhausted` until `until`. `None`
    /// while budget is left; standalone, the proxy decides from its own counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exhausted: Option<Exhausted>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Client {
    /// This replica's share of a cluster-wide limit: `limit / replicas`, at least 1.
    pub fn share(&self, limit: u32) -> u32 {
        (limit / self.replicas.max(1)).max(1)
    }
}

/// A spent budget, as the operator renders it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Exhausted {
    /// Which budget: `tokensPerDay` or `usdPerMonth`.
    pub budget: String,
    /// RFC 3339 UTC end of the period (the next UTC midnight, or the first of the next
    /// month): when requests are let through again.
    pub until: String,
}

/// Cluster-wide limits of one client; `None` = unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientLimits {
    pub requests_per_minute: Option<u32>,
    /// Input + output tokens per minute.
    pub tokens_per_minute: Option<u32>,
    /// Requests in flight at once.
    pub max_concurrency: Option<u32>,
}

/// Spending caps of one client; `None` = no cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientBudget {
    /// Input + output tokens per UTC day.
    pub tokens_per_day: Option<u64>,
    /// USD per UTC calendar month, from the targets' prices.
    pub usd_per_month: Option<f64>,
    /// Tokens a request without an output cap reserves (`budget.defaultReservation`);
    /// `None`: [`crate::schema::DEFAULT_RESERVATION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_reservation: Option<u64>,
    /// Rendered by the operator from the usage summed over every replica: what is left
    /// of each budget, cluster-wide, as of one scrape round. Each replica may spend
    /// `left / replicas` of it from that round on (see [`BudgetLeft`]). `None`
    /// standalone, and until the operator's first scrape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<BudgetLeft>,
}

impl ClientBudget {
    /// Whether any budget is set.
    pub fn is_set(&self) -> bool {
        self.tokens_per_day.is_some() || self.usd_per_month.is_some()
    }

    /// Tokens a request without an output cap reserves.
    pub fn default_reservation(&self) -> u64 {
        self.default_reservation
            .unwrap_or(crate::schema::DEFAULT_RESERVATION)
    }
}

/// What is left of a client's budgets cluster-wide, as the operator summed the usage
/// of scrape round `round` (the proxies' stats are read with `?round=`, and each
/// replica remembers its own counters at the rounds it answered). A replica may spend
/// `left / replicas` from its counters at that round on: the replicas together stay
/// within what was left, however stale the rendering is by the time it arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BudgetLeft {
    /// The scrape round (the operator's clock, ms since the Unix epoch, at its start).
    pub round: u64,
    /// The UTC day (days since 1970-01-01) the round fell in: `tokens` are that day's,
    /// `microUsd` that day's month's. Past it, a replica goes back to `budget /
    /// replicas` of its own counts until the next rendering.
    pub day: u64,
    /// Tokens of `tokensPerDay` left (0 when spent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Millionths of a USD of `usdPerMonth` left (0 when spent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_usd: Option<u64>,
}

/// A `bedrock` credential's AWS access key pair and optional session token, read from
/// its whole Secret. In [`Keys`] it travels as one entry like any key: the JSON object
/// `{"accessKeyId", "secretAccessKey", "sessionToken"?}` ([`AwsKeys::encode`]), so
/// the keys Secret and its delivery stay one value per credential. `Debug` prints no
/// secret part (the access key id is an identifier, not a secret, but is kept out
/// too).
#[derive(Clone, PartialEq, Eq)]
pub struct AwsKeys {
    pub access_key_id: Secret<String>,
    pub secret_access_key: Secret<String>,
    pub session_token: Option<Secret<String>>,
}

impl fmt::Debug for AwsKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsKeys")
            .field("session_token", &self.session_token.is_some())
            .finish_non_exhaustive()
    }
}

impl AwsKeys {
    /// The one [`Keys`] entry that carries them.
    pub fn encode(&self) -> Secret<String> {
        let mut v = serde_json::json!({
            AWS_ACCESS_KEY_ID: self.access_key_id.expose(),
            AWS_SECRET_ACCESS_KEY: self.secret_access_key.expose(),
        });
        if let Some(t) = &self.session_token {
            v[AWS_SESSION_TOKEN] = t.expose().clone().into();
        }
        Secret::new(v.to_string())
    }

    /// Reads a [`Keys`] entry made by [`AwsKeys::encode`]; `None` when it is not one.
    pub fn decode(entry: &Secret<String>) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(entry.expose()).ok()?;
        let text = |k: &str| {
            v.get(k)
                .and_then(serde_json::Value::as_str)
                .filter(|s| !s.is_empty())
                .map(|s| Secret::new(s.to_string()))
        };
        Some(Self {
            access_key_id: text(AWS_ACCESS_KEY_ID)?,
            secret_access_key: text(AWS_SECRET_ACCESS_KEY)?,
            session_token: text(AWS_SESSION_TOKEN),
        })
    }
}

/// A key pool's values by data-key name, as its credential's one [`Keys`] entry
/// travels: the JSON object `{"<name>": "<value>", ...}` ([`KeyPool::encode`]), so the
/// keys Secret and its delivery stay one value per credential, as for [`AwsKeys`]. Only
/// the keys the Secret holds are in it; which names the pool has and in what order is
/// the credential's `secretRef.keys`. `Debug` prints the names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KeyPool(pub BTreeMap<String, Secret<String>>);

impl fmt::Debug for KeyPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl KeyPool {
    /// The one [`Keys`] entry that carries them.
    pub fn encode(&self) -> Secret<String> {
        let v: serde_json::Map<String, serde_json::Value> = self
            .0
            .iter()
            .map(|(name, value)| (name.clone(), value.expose().clone().into()))
            .collect();
        Secret::new(serde_json::Value::Object(v).to_string())
    }

    /// Reads a [`Keys`] entry made by [`KeyPool::encode`]; `None` when it is not one.
    pub fn decode(entry: &Secret<String>) -> Option<Self> {
        let v: BTreeMap<String, String> = serde_json::from_str(entry.expose()).ok()?;
        Some(Self(
            v.into_iter().map(|(k, v)| (k, Secret::new(v))).collect(),
        ))
    }
}

/// API keys by credential (for `bedrock`, see [`AwsKeys`]; for a pool, [`KeyPool`]). Kept apart from [`CompiledConfig`] so the config can be
/// shown, logged and stored in a ConfigMap; `Debug` never prints a key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keys(pub BTreeMap<ObjectId, Secret<String>>);

impl Keys {
    pub fn get(&self, credential: &ObjectId) -> Option<&Secret<String>> {
        self.0.get(credential)
    }
}

/// Compiled objects for the tests of this crate, built field by field (a pinned
/// revision digests their JSON: change them and it changes).
#[cfg(test)]
pub(crate) mod samples {
    use std::collections::BTreeMap;

    use super::*;

    /// An `openai` credential `namespace/name`, key `name` of Secret `keys`.
    pub(crate) fn credential(namespace: &str, name: &str) -> Credential {
        Credential {
            key_rejected_for_ms: 300_000,
            api_version: None,
            responses_api: false,
            prefill: false,
            project: None,
            location: None,
            region: None,
            id: ObjectId::new(namespace, name),
            provider: Provider::Openai,
            base_url: "https://api.openai.com/v1".into(),
            headers: BTreeMap::new(),
            max_concurrency: None,
            max_queue: None,
            allow_private_network: false,
            secret_ref: SecretKeyRef {
                keys: Vec::new(),
                name: "keys".into(),
                key: name.into(),
            },
        }
    }

    /// A fallback route `namespace/name` serving `model` on `credentials` (of its own
    /// namespace), in that order, with every default.
    pub(crate) fn route(namespace: &str, name: &str, model: &str, credentials: &[&str]) -> Route {
        Route {
            response_model: Default::default(),
            id: ObjectId::new(namespace, name),
            generation: 1,
            models: vec![model.into()],
            strategy: Strategy::Fallback,
            targets: credentials
                .iter()
                .map(|c| Target {
                    health_check: None,
                    model_map: Default::default(),
                    credential: ObjectId::new(namespace, *c),
                    model: None,
                    weight: 1,
                    timeout_ms: None,
                    retry: Retry::default(),
                    price: None,
                })
                .collect(),
            fallback: Fallback::default(),
            circuit_breaker: CircuitBreaker::default(),
            timeout_ms: 60_000,
            shared_with: Vec::new(),
            stream: None,
            hedge: None,
        }
    }
}

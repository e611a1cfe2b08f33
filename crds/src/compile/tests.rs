//! One valid sample (two credentials, their Secrets, a full route and a minimal one,
//! three clients in two namespaces) compiled to the whole expected config; then one
//! test per rule, each breaking one field of the sample and asserting the exact
//! diagnostic.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;

use super::*;
use crate::client::{BudgetSpec, ClientLimitsSpec, LLMClientSpec};
use crate::config::{
    CircuitBreaker, ClientBudget, ClientLimits, Credential, FailureClass, Fallback, Price,
    Provider, Retry, SecretKeyRef, Strategy, Target,
};
use crate::credential::ProviderCredentialSpec;
use crate::keyhash::KeyHasher;
use crate::network::PrivateNetworks;
use crate::route::{FallbackSpec, LLMRouteSpec, RetrySpec, TargetSpec};

const SAMPLE: &str = r#"
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: openai-prod, namespace: team-a }
spec:
  provider: openai
  secretRef: { name: openai-key, key: apiKey }
  headers: { OpenAI-Organization: org-123 }
  maxConcurrency: 256
  maxQueue: 512
---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: anthropic-prod, namespace: team-a }
spec:
  provider: anthropic
  baseURL: https://api.anthropic.com/v1/
  secretRef: { name: anthropic-key, key: apiKey }
---
apiVersion: v1
kind: Secret
metadata: { name: openai-key, namespace: team-a }
stringData: { apiKey: "sk-openai\n" }
---
apiVersion: v1
kind: Secret
metadata: { name: anthropic-key, namespace: team-a }
data: { apiKey: c2stYW50 }
---
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: { name: smart, namespace: team-a, generation: 4 }
spec:
  models: [smart, smart-latest]
  strategy: { mode: fallback }
  targets:
    - credentialRef: { name: openai-prod }
      model: gpt-4o
      weight: 3
      timeout: 20s
      retry:
        attempts: 3
        onStatusCodes: [503, 429, 502]
        initialBackoff: 250ms
        maxBackoff: 1m30s
        honourRetryAfter: false
      price: { inputPerMillion: "2.50", outputPerMillion: "10.00" }
    - credentialRef: { name: anthropic-prod }
      model: claude-sonnet-4-5
  fallback:
    onFailures: [status5xx, timeout, authError]
    onStatusCodes: [404]
    maxRetryAfter: 10s
  circuitBreaker: { consecutiveFailures: 3, openFor: 1m }
  timeout: 45s
  sharedWith: [team-b]
---
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: { name: fast, namespace: team-a }
spec:
  targets:
    - credentialRef: { name: anthropic-prod }
---
apiVersion: v1
kind: Secret
metadata: { name: checkout-llm, namespace: team-a }
stringData: { apiKey: "sk-checkout-0123456789\n" }
---
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: { name: checkout, namespace: team-a, generation: 2 }
spec:
  keySecretRef: { name: checkout-llm, key: apiKey }
  routes: [smart, team-a/fast]
  limits: { requestsPerMinute: 600, tokensPerMinute: 200000, maxConcurrency: 50 }
  budget: { tokensPerDay: 5000000, usdPerMonth: "200.00" }
---
apiVersion: v1
kind: Secret
metadata: { name: batch-llm, namespace: team-a }
data: { apiKey: c2stYmF0Y2gtYWJjZGVmZ2hpamtsbW5vcA== }
---
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: { name: batch, namespace: team-a }
spec:
  keySecretRef: { name: batch-llm, key: apiKey }
---
apiVersion: v1
kind: Secret
metadata: { name: reports-llm, namespace: team-b }
stringData: { token: sk-reports-0123456789 }
---
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: { name: reports, namespace: team-b }
spec:
  keySecretRef: { name: reports-llm, key: token }
  routes: [team-a/smart]
"#;

/// The cluster secret of the tests that hash keys.
const HMAC_SECRET: &[u8] = b"switchback test cluster secret, 32+ bytes";

struct Sample {
    routes: Vec<LLMRoute>,
    credentials: Vec<ProviderCredential>,
    clients: Vec<LLMClient>,
    secrets: Vec<KubeSecret>,
    /// The platform's policy compiled with: none by default, as the operator's.
    private_networks: PrivateNetworks,
}

impl Sample {
    fn parse(yaml: &str) -> Self {
        let mut sample = Sample {
            routes: Vec::new(),
            credentials: Vec::new(),
            clients: Vec::new(),
            secrets: Vec::new(),
            private_networks: PrivateNetworks::default(),
        };
        for document in serde_yaml_ng::Deserializer::from_str(yaml) {
            let value = serde_yaml_ng::Value::deserialize(document).expect("sample is YAML");
            match value["kind"].as_str() {
                Some("LLMRoute") => sample
                    .routes
                    .push(serde_yaml_ng::from_value(value).expect("route")),
                Some("ProviderCredential") => sample
                    .credentials
                    .push(serde_yaml_ng::from_value(value).expect("credential")),
                Some("LLMClient") => sample
                    .clients
                    .push(serde_yaml_ng::from_value(value).expect("client")),
                Some("Secret") => sample
                    .secrets
                    .push(serde_yaml_ng::from_value(value).expect("secret")),
                other => panic!("unexpected kind {other:?}"),
            }
        }
        sample
    }

    fn compile(&self) -> Compiled {
        self.compile_with(None)
    }

    fn compile_with(&self, hasher: Option<&KeyHasher>) -> Compiled {
        self.compile_scoped(hasher, false)
    }

    fn compile_scoped(&self, hasher: Option<&KeyHasher>, models_per_client: bool) -> Compiled {
        compile(&Inputs {
            routes: &self.routes,
            credentials: &self.credentials,
            clients: &self.clients,
            secrets: &self.secrets,
            client_key_hasher: hasher,
            models_per_client,
            private_networks: &self.private_networks,
        })
    }

    fn client(&mut self, name: &str) -> &mut LLMClientSpec {
        &mut self
            .clients
            .iter_mut()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .expect("client in sample")
            .spec
    }

    fn secret(&mut self, name: &str) -> &mut KubeSecret {
        self.secrets
            .iter_mut()
            .find(|s| s.metadata.name.as_deref() == Some(name))
            .expect("secret in sample")
    }

    fn route(&mut self, name: &str) -> &mut LLMRouteSpec {
        &mut self
            .routes
            .iter_mut()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .expect("route in sample")
            .spec
    }

    fn smart(&mut self) -> &mut LLMRouteSpec {
        self.route("smart")
    }

    fn target(&mut self, i: usize) -> &mut TargetSpec {
        &mut self.smart().targets[i]
    }

    fn retry(&mut self, i: usize) -> &mut RetrySpec {
        self.target(i).retry.get_or_insert_with(Default::default)
    }

    fn credential(&mut self, name: &str) -> &mut ProviderCredentialSpec {
        &mut self
            .credentials
            .iter_mut()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .expect("credential in sample")
            .spec
    }
}

fn sample() -> Sample {
    Sample::parse(SAMPLE)
}

fn messages(compiled: &Compiled) -> Vec<String> {
    compiled
        .diagnostics
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn route_ids(compiled: &Compiled) -> Vec<String> {
    compiled
        .config
        .routes
        .iter()
        .map(|r| r.id.to_string())
        .collect()
}

fn client_ids(compiled: &Compiled) -> Vec<String> {
    compiled
        .config
        .clients
        .iter()
        .map(|c| c.id.to_string())
        .collect()
}

fn compiled_client<'a>(compiled: &'a Compiled, id: &str) -> &'a Client {
    compiled
        .config
        .clients
        .iter()
        .find(|c| c.id.to_string() == id)
        .unwrap_or_else(|| panic!("{id} not compiled"))
}

/// The diagnostics about credentials, as text.
fn credential_messages(compiled: &Compiled) -> Vec<String> {
    compiled
        .diagnostics
        .iter()
        .filter(|d| d.kind == Kind::ProviderCredential)
        .map(ToString::to_string)
        .collect()
}

fn credential_ids(compiled: &Compiled) -> Vec<String> {
    compiled
        .config
        .credentials
        .iter()
        .map(|c| c.id.to_string())
        .collect()
}

/// Compiles the sample after `change` and asserts it yields exactly one diagnostic,
/// an error whose text is `expected`, and that the broken object is left out.
fn rejects(change: impl FnOnce(&mut Sample), expected: &str) -> Compiled {
    let mut sample = sample();
    change(&mut sample);
    let compiled = sample.compile();
    assert_eq!(messages(&compiled), vec![expected.to_string()]);
    let diagnostic = &compiled.diagnostics[0];
    assert_eq!(diagnostic.severity, Severity::Error);
    let ids = match diagnostic.kind {
        Kind::LLMRoute => route_ids(&compiled),
        Kind::LLMClient => client_ids(&compiled),
        _ => credential_ids(&compiled),
    };
    assert!(
        !ids.contains(&diagnostic.object.to_string()),
        "{} was kept",
        diagnostic.object
    );
    compiled
}

fn id(name: &str) -> ObjectId {
    ObjectId::new("team-a", name)
}

#[test]
fn sample_compiles_to_the_expected_config() {
    let compiled = sample().compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());

    let openai = id("openai-prod");
    let anthropic = id("anthropic-prod");
    let expected = CompiledConfig {
        version: crate::config::CONFIG_VERSION,
        routes: vec![
            Route {
                response_model: Default::default(),
                id: id("fast"),
                generation: 0,
                models: vec!["fast".into()],
                strategy: Strategy::Fallback,
                targets: vec![Target {
                    health_check: None,
                    model_map: Default::default(),
                    credential: anthropic.clone(),
                    model: None,
                    weight: 1,
                    timeout_ms: None,
                    retry: Retry {
                        attempts: 1,
                        on_status_codes: None,
                        initial_backoff_ms: 100,
                        max_backoff_ms: 2_000,
                        honour_retry_after: true,
                    },
                    price: None,
                }],
                fallback: Fallback {
                    on_failures: vec![
                        FailureClass::Status5xx,
                        FailureClass::RateLimited,
                        FailureClass::Timeout,
                        FailureClass::ConnectionError,
                        FailureClass::ContextLength,
                        FailureClass::InvalidResponse,
                    ],
                    on_status_codes: vec![],
                    max_retry_after_ms: 30_000,
                },
                circuit_breaker: CircuitBreaker {
                    probe_interval_ms: 10_000,
                    consecutive_failures: 5,
                    open_for_ms: 30_000,
                    ramp_up_ms: None,
                },
                timeout_ms: 60_000,
                shared_with: vec![],
                stream: None,
                hedge: None,
            },
            Route {
                response_model: Default::default(),
                id: id("smart"),
                generation: 4,
                models: vec!["smart".into(), "smart-latest".into()],
                strategy: Strategy::Fallback,
                targets: vec![
                    Target {
                        health_check: None,
                        model_map: Default::default(),
                        credential: openai.clone(),
                        model: Some("gpt-4o".into()),
                        weight: 3,
                        timeout_ms: Some(20_000),
                        retry: Retry {
                            attempts: 3,
                            on_status_codes: Some(vec![429, 502, 503]),
                            initial_backoff_ms: 250,
                            max_backoff_ms: 90_000,
                            honour_retry_after: false,
                        },
                        price: Some(Price {
                            input_per_million: 2.5,
                            output_per_million: 10.0,
                        }),
                    },
                    Target {
                        health_check: None,
                        model_map: Default::default(),
                        credential: anthropic.clone(),
                        model: Some("claude-sonnet-4-5".into()),
                        weight: 1,
                        timeout_ms: None,
                        retry: Retry::default(),
                        price: None,
                    },
                ],
                fallback: Fallback {
                    on_failures: vec![
                        FailureClass::Status5xx,
                        FailureClass::Timeout,
                        FailureClass::AuthError,
                    ],
                    on_status_codes: vec![404],
                    max_retry_after_ms: 10_000,
                },
                circuit_breaker: CircuitBreaker {
                    probe_interval_ms: 10_000,
                    consecutive_failures: 3,
                    open_for_ms: 60_000,
                    ramp_up_ms: None,
                },
                timeout_ms: 45_000,
                shared_with: vec!["team-b".into()],
                stream: None,
                hedge: None,
            },
        ],
        credentials: vec![
            Credential {
                key_rejected_for_ms: 300_000,
                api_version: None,
                responses_api: false,
                prefill: false,
                project: None,
                location: None,
                region: None,
                id: anthropic.clone(),
                provider: Provider::Anthropic,
                base_url: "https://api.anthropic.com/v1".into(),
                headers: BTreeMap::new(),
                max_concurrency: None,
                max_queue: None,
                allow_private_network: false,
                secret_ref: SecretKeyRef {
                    keys: Vec::new(),
                    name: "anthropic-key".into(),
                    key: "apiKey".into(),
                },
            },
            Credential {
                key_rejected_for_ms: 300_000,
                api_version: None,
                responses_api: false,
                prefill: false,
                project: None,
                location: None,
                region: None,
                id: openai.clone(),
                provider: Provider::Openai,
                base_url: "https://api.openai.com/v1".into(),
                headers: BTreeMap::from([("OpenAI-Organization".into(), "org-123".into())]),
                max_concurrency: Some(256),
                max_queue: Some(512),
                allow_private_network: false,
                secret_ref: SecretKeyRef {
                    keys: Vec::new(),
                    name: "openai-key".into(),
                    key: "apiKey".into(),
                },
            },
        ],
        clients: vec![
            Client {
                id: id("batch"),
                generation: 0,
                key_hash: None,
                key_secret_ref: SecretKeyRef {
                    keys: Vec::new(),
                    name: "batch-llm".into(),
                    key: "apiKey".into(),
                },
                // Unset: every route of its namespace.
                routes: vec![id("fast"), id("smart")],
                limits: ClientLimits::default(),
                budget: ClientBudget::default(),
                replicas: 1,
                exhausted: None,
            },
            Client {
                id: id("checkout"),
                generation: 2,
                key_hash: None,
                key_secret_ref: SecretKeyRef {
                    keys: Vec::new(),
                    name: "checkout-llm".into(),
                    key: "apiKey".into(),
                },
                routes: vec![id("fast"), id("smart")],
                limits: ClientLimits {
                    requests_per_minute: Some(600),
                    tokens_per_minute: Some(200_000),
                    max_concurrency: Some(50),
                },
                budget: ClientBudget {
                    tokens_per_day: Some(5_000_000),
                    usd_per_month: Some(200.0),
                    ..Default::default()
                },
                replicas: 1,
                exhausted: None,
            },
            Client {
                id: ObjectId::new("team-b", "reports"),
                generation: 0,
                key_hash: None,
                key_secret_ref: SecretKeyRef {
                    keys: Vec::new(),
                    name: "reports-llm".into(),
                    key: "token".into(),
                },
                routes: vec![id("smart")],
                limits: ClientLimits::default(),
                budget: ClientBudget::default(),
                replicas: 1,
                exhausted: None,
            },
        ],
    };
    assert_eq!(compiled.config, expected);

    // stringData is trimmed (a trailing newline from `echo`); data is base64.
    let keys: Vec<(String, String)> = compiled
        .keys
        .0
        .iter()
        .map(|(id, key)| (id.to_string(), key.expose().clone()))
        .collect();
    assert_eq!(
        keys,
        vec![
            ("team-a/anthropic-prod".into(), "sk-ant".into()),
            ("team-a/openai-prod".into(), "sk-openai".into()),
        ]
    );
}

#[test]
fn compiled_config_round_trips_through_json() {
    let config = sample().compile().config;
    let json = serde_json::to_string(&config).expect("serializes");
    assert!(!json.contains("sk-"), "no key material in the config");
    let back: CompiledConfig = serde_json::from_str(&json).expect("deserializes");
    assert_eq!(back, config);
}

#[test]
fn output_does_not_depend_on_input_order() {
    let forward = sample().compile();
    let mut reversed = sample();
    reversed.routes.reverse();
    reversed.credentials.reverse();
    reversed.secrets.reverse();
    reversed.clients.reverse();
    assert_eq!(reversed.compile().config, forward.config);
}

#[test]
fn attempts_above_five() {
    rejects(
        |s| s.retry(1).attempts = Some(7),
        "team-a/smart: spec.targets[1].retry.attempts: 7 is above the maximum 5",
    );
}

#[test]
fn weight_zero() {
    rejects(
        |s| s.target(0).weight = Some(0),
        "team-a/smart: spec.targets[0].weight: 0 is below the minimum 1",
    );
}

#[test]
fn weight_above_hundred() {
    rejects(
        |s| s.target(1).weight = Some(101),
        "team-a/smart: spec.targets[1].weight: 101 is above the maximum 100",
    );
}

#[test]
fn bad_duration() {
    rejects(
        |s| s.target(0).timeout = Some("1.5s".into()),
        "team-a/smart: spec.targets[0].timeout: \"1.5s\" is not a duration like 250ms, 10s, 1m30s or 1h",
    );
}

#[test]
fn zero_timeout() {
    rejects(
        |s| s.smart().timeout = Some("0s".into()),
        "team-a/smart: spec.timeout: \"0s\" must be above 0",
    );
}

#[test]
fn max_backoff_below_initial_backoff() {
    rejects(
        |s| s.retry(0).max_backoff = Some("200ms".into()),
        "team-a/smart: spec.targets[0].retry.maxBackoff: 200ms is below initialBackoff 250ms",
    );
}

#[test]
fn initial_backoff_above_the_default_max_backoff() {
    rejects(
        |s| s.retry(1).initial_backoff = Some("5s".into()),
        "team-a/smart: spec.targets[1].retry.initialBackoff: 5s is above maxBackoff 2s (the default)",
    );
}

#[test]
fn duplicate_model() {
    rejects(
        |s| s.smart().models = Some(vec!["smart".into(), "gpt".into(), "smart".into()]),
        "team-a/smart: spec.models[2]: \"smart\" is listed more than once",
    );
}

#[test]
fn auth_error_with_one_credential() {
    rejects(
        |s| s.target(1).credential_ref.name = "openai-prod".into(),
        "team-a/smart: spec.fallback.onFailures: authError needs at least two targets on different credentials",
    );
}

#[test]
fn nine_targets() {
    rejects(
        |s| {
            let target = s.target(1).clone();
            s.smart().targets.resize(9, target);
        },
        "team-a/smart: spec.targets: has 9 targets; the maximum is 8",
    );
}

#[test]
fn no_targets() {
    rejects(
        |s| s.route("fast").targets.clear(),
        "team-a/fast: spec.targets: has no targets; at least 1 is required",
    );
}

#[test]
fn unknown_mode() {
    rejects(
        |s| {
            s.smart().strategy = Some(crate::route::Strategy {
                mode: Some("fastest".into()),
            })
        },
        "team-a/smart: spec.strategy.mode: \"fastest\" is not one of fallback, loadbalance, least-latency, cost-optimized",
    );
}

#[test]
fn unknown_failure_class() {
    rejects(
        |s| {
            s.smart().fallback = Some(FallbackSpec {
                on_failures: Some(vec!["status5xx".into(), "status4xx".into()]),
                ..Default::default()
            })
        },
        "team-a/smart: spec.fallback.onFailures[1]: \"status4xx\" is not one of status5xx, rateLimited, timeout, connectionError, contextLength, invalidResponse, authError, contentFilter",
    );
}

#[test]
fn status_code_out_of_range() {
    rejects(
        |s| s.retry(0).on_status_codes = Some(vec![429, 600]),
        "team-a/smart: spec.targets[0].retry.onStatusCodes[1]: 600 is above the maximum 599",
    );
}

#[test]
fn missing_credential() {
    rejects(
        |s| s.target(0).credential_ref.name = "openai-staging".into(),
        "team-a/smart: spec.targets[0].credentialRef.name: ProviderCredential \"openai-staging\" not found in namespace team-a",
    );
}

#[test]
fn credential_of_another_namespace_is_not_found() {
    let mut s = sample();
    s.credentials[0].metadata.namespace = Some("team-b".into());
    s.secrets[0].metadata.namespace = Some("team-b".into());
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-a/smart: spec.targets[0].credentialRef.name: ProviderCredential \"openai-prod\" not found in namespace team-a"
        ]
    );
    assert_eq!(compiled.diagnostics[0].reason, reason::CREDENTIAL_NOT_FOUND);
}

#[test]
fn missing_secret_key_warns_and_keeps_the_target() {
    let mut s = sample();
    s.secrets
        .retain(|secret| secret.metadata.name.as_deref() != Some("openai-key"));
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-a/smart: spec.targets[0].credentialRef.name: ProviderCredential \"openai-prod\" has no key (Secret \"openai-key\" not found in namespace team-a); this target is skipped",
            "team-a/openai-prod: spec.secretRef.name: Secret \"openai-key\" not found in namespace team-a",
        ]
    );
    assert!(
        compiled
            .diagnostics
            .iter()
            .all(|d| d.severity == Severity::Warning)
    );
    assert!(
        compiled
            .diagnostics
            .iter()
            .all(|d| d.reason == reason::SECRET_KEY_MISSING)
    );
    // Route and credential kept, target kept, no key.
    assert_eq!(route_ids(&compiled), vec!["team-a/fast", "team-a/smart"]);
    assert_eq!(
        credential_ids(&compiled),
        vec!["team-a/anthropic-prod", "team-a/openai-prod"]
    );
    let smart = &compiled.config.routes[1];
    assert_eq!(smart.targets[0].credential, id("openai-prod"));
    assert!(compiled.keys.get(&id("openai-prod")).is_none());
    assert!(compiled.keys.get(&id("anthropic-prod")).is_some());
}

#[test]
fn missing_key_in_an_existing_secret_warns() {
    let mut s = sample();
    s.credential("anthropic-prod").secret_ref.key = "token".into();
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled)[2],
        "team-a/anthropic-prod: spec.secretRef.key: Secret \"anthropic-key\" has no key \"token\""
    );
    assert_eq!(compiled.config.routes.len(), 2);
    assert!(compiled.keys.get(&id("anthropic-prod")).is_none());
}

#[test]
fn string_data_wins_over_data() {
    let mut s = sample();
    let secret = &mut s.secrets[1];
    secret.string_data = Some(BTreeMap::from([(
        "apiKey".into(),
        "sk-from-string-data".into(),
    )]));
    let compiled = s.compile();
    assert_eq!(
        compiled
            .keys
            .get(&id("anthropic-prod"))
            .map(|k| k.expose().as_str()),
        Some("sk-from-string-data")
    );
}

#[test]
fn openai_compatible_without_base_url() {
    let compiled = rejects(
        |s| {
            s.credential("anthropic-prod").provider = "openai-compatible".into();
            s.credential("anthropic-prod").base_url = None;
            s.route("fast").targets[0].credential_ref.name = "openai-prod".into();
            s.target(1).credential_ref.name = "openai-prod".into();
            s.smart().fallback = None;
        },
        "team-a/anthropic-prod: spec.baseURL: is required for provider openai-compatible",
    );
    assert_eq!(route_ids(&compiled), vec!["team-a/fast", "team-a/smart"]);
}

#[test]
fn route_on_a_rejected_credential_is_rejected() {
    let mut s = sample();
    s.credential("anthropic-prod").base_url = Some("ftp://api.anthropic.com".into());
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-a/fast: spec.targets[0].credentialRef.name: ProviderCredential \"anthropic-prod\" is invalid: spec.baseURL: \"ftp://api.anthropic.com\" is not an http or https URL",
            "team-a/smart: spec.targets[1].credentialRef.name: ProviderCredential \"anthropic-prod\" is invalid: spec.baseURL: \"ftp://api.anthropic.com\" is not an http or https URL",
            "team-a/anthropic-prod: spec.baseURL: \"ftp://api.anthropic.com\" is not an http or https URL",
        ]
    );
    assert_eq!(compiled.diagnostics[0].reason, reason::INVALID_CREDENTIAL);
    assert!(compiled.config.routes.is_empty());
    assert_eq!(credential_ids(&compiled), vec!["team-a/openai-prod"]);
}

#[test]
fn private_base_url_is_refused() {
    let mut s = sample();
    s.credential("anthropic-prod").base_url = Some("http://169.254.169.254/latest".into());
    let compiled = s.compile();
    let credential_errors: Vec<&Diagnostic> = compiled
        .diagnostics
        .iter()
        .filter(|d| d.kind == Kind::ProviderCredential)
        .collect();
    assert_eq!(credential_errors.len(), 1);
    assert_eq!(
        credential_errors[0].to_string(),
        "team-a/anthropic-prod: spec.baseURL: host 169.254.169.254 is a loopback, private or link-local address; set spec.allowPrivateNetwork: true to allow it"
    );
    assert_eq!(credential_errors[0].reason, reason::PRIVATE_NETWORK);
    assert_eq!(credential_ids(&compiled), vec!["team-a/openai-prod"]);
}

#[test]
fn private_base_url_is_refused_for_every_private_form() {
    for url in [
        "http://localhost:8000/v1",
        "http://127.0.0.1:11434/v1",
        "http://10.1.2.3/v1",
        "http://[::1]:8000",
        "http://[fd12::1]/v1",
        "http://100.64.0.7/v1",
        "http://0.0.0.0:8000",
    ] {
        let mut s = sample();
        s.credential("anthropic-prod").base_url = Some(url.into());
        let compiled = s.compile();
        assert!(
            compiled
                .diagnostics
                .iter()
                .any(|d| d.reason == reason::PRIVATE_NETWORK),
            "{url} was not refused"
        );
    }
}

#[test]
fn private_base_url_is_allowed_with_allow_private_network() {
    let mut s = sample();
    let credential = s.credential("anthropic-prod");
    credential.provider = "openai-compatible".into();
    credential.base_url = Some("http://10.0.0.5:8000/v1/".into());
    credential.allow_private_network = Some(true);
    s.private_networks = PrivateNetworks::from_list(&["team-a".into()]).unwrap();
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let credential = &compiled.config.credentials[0];
    assert_eq!(credential.base_url, "http://10.0.0.5:8000/v1");
    assert!(credential.allow_private_network);
}

/// docs/security.md#where-the-proxies-connect: `allowPrivateNetwork: true` is the
/// platform's to grant. In a namespace the policy does not name, the credential is refused
/// by that field (whatever its baseURL), nothing of it is compiled, and a route using it
/// says why with the same reason; the same credential in an allowed namespace is served.
#[test]
fn allow_private_network_is_refused_where_the_platform_does_not_allow_it() {
    for (base_url, policy) in [
        ("http://10.0.0.5:8000/v1", PrivateNetworks::default()),
        ("https://llm.example.com/v1", PrivateNetworks::default()),
        (
            "http://10.0.0.5:8000/v1",
            PrivateNetworks::from_list(&["team-b".into()]).unwrap(),
        ),
    ] {
        let mut s = sample();
        let credential = s.credential("anthropic-prod");
        credential.provider = "openai-compatible".into();
        credential.base_url = Some(base_url.into());
        credential.allow_private_network = Some(true);
        s.private_networks = policy.clone();
        let compiled = s.compile();
        let refused: Vec<&Diagnostic> = compiled
            .diagnostics
            .iter()
            .filter(|d| d.kind == Kind::ProviderCredential)
            .collect();
        assert_eq!(
            refused.len(),
            1,
            "{base_url} {policy:?}: {:?}",
            messages(&compiled)
        );
        assert_eq!(refused[0].reason, reason::PRIVATE_NETWORK_NOT_ALLOWED);
        assert_eq!(refused[0].severity, Severity::Error);
        assert_eq!(
            refused[0].to_string(),
            "team-a/anthropic-prod: spec.allowPrivateNetwork: true is not allowed in namespace \
             team-a: private networks are the platform's decision, and this namespace is not \
             among the operator's --allow-private-network-namespaces (chart value \
             egress.allowPrivateNetworkNamespaces); nothing is sent to this credential"
        );
        assert_eq!(credential_ids(&compiled), vec!["team-a/openai-prod"]);
        assert!(compiled.keys.get(&id("anthropic-prod")).is_none());
        // Both routes use it: `smart` as its second target, `fast` as its only one.
        let on_routes: Vec<&Diagnostic> = compiled
            .diagnostics
            .iter()
            .filter(|d| d.kind == Kind::LLMRoute)
            .collect();
        assert_eq!(on_routes.len(), 2, "{:?}", messages(&compiled));
        for d in on_routes {
            assert_eq!(d.reason, reason::PRIVATE_NETWORK_NOT_ALLOWED);
            assert!(d.field.ends_with(".credentialRef.name"), "{}", d.field);
            assert!(
                d.message
                    .contains("spec.allowPrivateNetwork: true is not allowed in namespace team-a"),
                "{d}"
            );
        }
        assert!(compiled.config.routes.is_empty());
    }
    // Allowed: by name, or every namespace.
    for policy in [
        PrivateNetworks::from_list(&["team-b".into(), "team-a".into()]).unwrap(),
        PrivateNetworks::Everywhere,
    ] {
        let mut s = sample();
        let credential = s.credential("anthropic-prod");
        credential.provider = "openai-compatible".into();
        credential.base_url = Some("http://10.0.0.5:8000/v1".into());
        credential.allow_private_network = Some(true);
        s.private_networks = policy;
        let compiled = s.compile();
        assert_eq!(messages(&compiled), Vec::<String>::new());
        assert_eq!(compiled.config.routes.len(), 2);
    }
}

/// `allowPrivateNetwork: false` (or unset) needs no policy: nothing is refused for it.
#[test]
fn allow_private_network_false_needs_no_policy() {
    let mut s = sample();
    s.credential("anthropic-prod").allow_private_network = Some(false);
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
}

#[test]
fn base_url_with_credentials_is_refused() {
    rejects(
        |s| {
            s.credential("openai-prod").base_url = Some("https://user:pw@api.openai.com/v1".into());
            s.smart().targets[0].credential_ref.name = "anthropic-prod".into();
            s.smart().targets.truncate(1);
            s.smart().fallback = None;
        },
        "team-a/openai-prod: spec.baseURL: must not contain a user name or password; the key comes from the Secret",
    );
}

fn created(seconds: i64) -> Option<Time> {
    Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(seconds).expect("valid timestamp"),
    ))
}

#[test]
fn model_conflict_older_route_wins() {
    let mut s = sample();
    // `fast` claims `smart` too, and is older: `smart` (listed first) loses.
    s.route("fast").models = Some(vec!["fast".into(), "smart".into()]);
    s.routes[0].metadata.creation_timestamp = created(2_000);
    s.routes[1].metadata.creation_timestamp = created(1_000);
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-a/smart: spec.models[0]: model \"smart\" is already served by the older route team-a/fast"
        ]
    );
    assert_eq!(compiled.diagnostics[0].reason, reason::MODEL_CONFLICT);
    assert_eq!(route_ids(&compiled), vec!["team-a/fast"]);
}

#[test]
fn model_conflict_without_timestamps_goes_by_input_order() {
    let mut s = sample();
    s.route("fast").models = Some(vec!["smart-latest".into()]);
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-a/fast: spec.models[0]: model \"smart-latest\" is already served by the older route team-a/smart"
        ]
    );
    assert_eq!(route_ids(&compiled), vec!["team-a/smart"]);
}

#[test]
fn model_conflict_across_namespaces() {
    let mut s = sample();
    let mut copy = s.routes[1].clone();
    copy.metadata.namespace = Some("team-b".into());
    copy.metadata.creation_timestamp = created(5);
    copy.spec.models = Some(vec!["fast".into()]);
    s.routes.push(copy);
    let compiled = s.compile();
    // team-b/fast references anthropic-prod, absent in team-b, so it is rejected
    // before it can claim anything.
    assert_eq!(
        messages(&compiled),
        vec![
            "team-b/fast: spec.targets[0].credentialRef.name: ProviderCredential \"anthropic-prod\" not found in namespace team-b"
        ]
    );
}

#[test]
fn bad_price() {
    rejects(
        |s| {
            s.target(0)
                .price
                .as_mut()
                .expect("sample has a price")
                .input_per_million = "2,50".into();
        },
        "team-a/smart: spec.targets[0].price.inputPerMillion: \"2,50\" is not a decimal number like \"2.50\"",
    );
}

#[test]
fn forbidden_header() {
    rejects(
        |s| {
            s.credential("openai-prod")
                .headers
                .get_or_insert_with(Default::default)
                .insert("Authorization".into(), "Bearer sk".into());
            s.smart().targets[0].credential_ref.name = "anthropic-prod".into();
            s.smart().targets.truncate(1);
            s.smart().fallback = None;
        },
        &format!("team-a/openai-prod: spec.headers[Authorization]: \"Authorization\" {KEY_HEADER}"),
    );
}

#[test]
fn forbidden_and_invalid_headers() {
    let mut s = sample();
    s.credential("openai-prod").headers = Some(BTreeMap::from([
        ("x-api-key".into(), "k".into()),
        ("bad name".into(), "v".into()),
        ("X-Trace".into(), "line\nbreak".into()),
        ("Content-Length".into(), "3".into()),
    ]));
    let compiled = s.compile();
    assert_eq!(
        credential_messages(&compiled),
        vec![
            "team-a/openai-prod: spec.headers[Content-Length]: \"Content-Length\" is set by the proxy; it cannot be a static header",
            "team-a/openai-prod: spec.headers[X-Trace]: value is not a valid HTTP header value (visible ASCII, spaces and tabs only)",
            "team-a/openai-prod: spec.headers[bad name]: \"bad name\" is not a valid HTTP header name",
            &format!("team-a/openai-prod: spec.headers[x-api-key]: \"x-api-key\" {KEY_HEADER}"),
        ]
    );
}

/// What `compile` says of a static header that may carry a key.
const KEY_HEADER: &str = "may carry a key, and static headers may not: they are rendered into a \
     ConfigMap and shown on /admin/v1/config; the key comes from the Secret (refused names: \
     authorization, proxy-authorization, cookie, and any name containing api-key, api_key, \
     apikey, token, secret, password, subscription-key)";

/// docs/security.md#keys-stay-in-secrets: static headers may not carry keys, refused by
/// name whatever the case; headers that carry none pass.
#[test]
fn static_headers_that_may_carry_keys_are_refused_by_name() {
    for name in [
        "x-goog-api-key",
        "X-Goog-Api-Key",
        "Cookie",
        "PROXY-AUTHORIZATION",
        "X-Amz-Security-Token",
        "Ocp-Apim-Subscription-Key",
        "x-client-secret",
        "X-Auth-Token",
        "openai_api_key",
        "x-apikey",
        "x-password",
    ] {
        let mut s = sample();
        s.credential("openai-prod").headers = map(&[(name, "v"), ("OpenAI-Project", "p")]);
        let compiled = s.compile();
        assert_eq!(
            credential_messages(&compiled),
            vec![format!(
                "team-a/openai-prod: spec.headers[{name}]: {name:?} {KEY_HEADER}"
            )],
            "{name}"
        );
        assert!(!credential_ids(&compiled).contains(&"team-a/openai-prod".to_string()));
    }
    for name in [
        "OpenAI-Organization",
        "OpenAI-Project",
        "anthropic-beta",
        "x-goog-user-project",
        "HTTP-Referer",
        "X-Title",
        "keyboard",
    ] {
        let mut s = sample();
        s.credential("openai-prod").headers = map(&[(name, "v")]);
        assert_eq!(messages(&s.compile()), Vec::<String>::new(), "{name}");
    }
}

#[test]
fn max_queue_needs_max_concurrency() {
    rejects(
        |s| {
            s.credential("openai-prod").max_concurrency = None;
            s.smart().targets[0].credential_ref.name = "anthropic-prod".into();
            s.smart().targets.truncate(1);
            s.smart().fallback = None;
        },
        "team-a/openai-prod: spec.maxQueue: needs maxConcurrency",
    );
}

#[test]
fn duplicate_objects_keep_the_first() {
    let mut s = sample();
    let mut copy = s.routes[1].clone();
    copy.spec.timeout = Some("5s".into());
    s.routes.push(copy);
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec!["team-a/fast: metadata.name: is defined more than once; the first definition is used"]
    );
    assert_eq!(compiled.diagnostics[0].reason, reason::DUPLICATE);
    assert_eq!(compiled.config.routes[0].timeout_ms, 60_000);
}

#[test]
fn namespace_defaults_to_default() {
    let mut s = sample();
    for route in &mut s.routes {
        route.metadata.namespace = None;
    }
    for credential in &mut s.credentials {
        credential.metadata.namespace = None;
    }
    for secret in &mut s.secrets {
        secret.metadata.namespace = None;
    }
    s.clients
        .retain(|c| c.metadata.namespace.as_deref() == Some("team-a"));
    for client in &mut s.clients {
        client.metadata.namespace = None;
    }
    // `team-a/fast` names a namespace explicitly; the defaulted one is `default`.
    s.client("checkout").routes = Some(vec!["smart".into(), "default/fast".into()]);
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    assert_eq!(route_ids(&compiled), vec!["default/fast", "default/smart"]);
    assert_eq!(
        compiled.config.routes[0].targets[0].credential,
        ObjectId::new("default", "anthropic-prod")
    );
    assert_eq!(
        client_ids(&compiled),
        vec!["default/batch", "default/checkout"]
    );
    assert_eq!(
        compiled.config.clients[0].routes,
        vec![
            ObjectId::new("default", "fast"),
            ObjectId::new("default", "smart")
        ]
    );
}

#[test]
fn every_problem_of_one_object_is_reported() {
    let mut s = sample();
    s.retry(0).attempts = Some(0);
    s.target(1).weight = Some(500);
    s.smart().timeout = Some("forever".into());
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-a/smart: spec.targets[0].retry.attempts: 0 is below the minimum 1",
            "team-a/smart: spec.targets[1].weight: 500 is above the maximum 100",
            "team-a/smart: spec.timeout: \"forever\" is not a duration like 250ms, 10s, 1m30s or 1h",
        ]
    );
}

#[test]
fn defaulted_fields_left_unset_in_a_target_spec() {
    let mut s = sample();
    s.smart().targets.push(TargetSpec {
        credential_ref: crate::route::CredentialRef {
            name: "openai-prod".into(),
        },
        ..Default::default()
    });
    let compiled = s.compile();
    let smart = &compiled.config.routes[1];
    assert_eq!(smart.targets[2].weight, 1);
    assert_eq!(smart.targets[2].retry, Retry::default());
}

// ---- sharedWith ----

#[test]
fn shared_with_is_sorted_and_deduplicated_nowhere_else() {
    let mut s = sample();
    s.smart().shared_with = Some(vec!["team-c".into(), "team-b".into()]);
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    assert_eq!(
        compiled.config.routes[1].shared_with,
        vec!["team-b", "team-c"]
    );
    assert!(compiled.config.routes[1].is_offered_to("team-c"));
    assert!(compiled.config.routes[1].is_offered_to("team-a"));
    assert!(!compiled.config.routes[1].is_offered_to("team-d"));
    assert!(!compiled.config.routes[0].is_offered_to("team-b"));
}

#[test]
fn shared_with_a_bad_namespace_name() {
    rejects(
        |s| s.smart().shared_with = Some(vec!["team-b".into(), "Team_C".into()]),
        "team-a/smart: spec.sharedWith[1]: \"Team_C\" is not a namespace name (a lower-case RFC 1123 label) or \"*\"",
    );
}

#[test]
fn shared_with_a_namespace_twice() {
    rejects(
        |s| s.smart().shared_with = Some(vec!["team-b".into(), "team-b".into()]),
        "team-a/smart: spec.sharedWith[1]: \"team-b\" is listed more than once",
    );
}

#[test]
fn shared_with_star_and_more() {
    rejects(
        |s| s.smart().shared_with = Some(vec!["*".into(), "team-b".into()]),
        "team-a/smart: spec.sharedWith: \"*\" shares with every namespace and must be the only entry",
    );
}

#[test]
fn shared_with_too_many() {
    rejects(
        |s| {
            let mut namespaces: Vec<String> = (0..64).map(|i| format!("ns-{i}")).collect();
            namespaces.push("team-b".into());
            s.smart().shared_with = Some(namespaces);
        },
        "team-a/smart: spec.sharedWith: has 65 namespaces; the maximum is 64",
    );
}

// ---- LLMClient ----

#[test]
fn client_keys_are_hashed_and_never_kept() {
    let hasher = KeyHasher::new(HMAC_SECRET).unwrap();
    let compiled = sample().compile_with(Some(&hasher));
    assert_eq!(messages(&compiled), Vec::<String>::new());
    // stringData trimmed, data decoded: the hash is of the key the app sends.
    for (client, key) in [
        ("team-a/checkout", "sk-checkout-0123456789"),
        ("team-a/batch", "sk-batch-abcdefghijklmnop"),
        ("team-b/reports", "sk-reports-0123456789"),
    ] {
        assert_eq!(
            compiled_client(&compiled, client).key_hash,
            Some(hasher.hash(key.as_bytes())),
            "{client}"
        );
    }
    let json = serde_json::to_string(&compiled.config).expect("serializes");
    assert!(!json.contains("sk-"), "no client key in the config: {json}");
    let back: CompiledConfig = serde_json::from_str(&json).expect("deserializes");
    assert_eq!(back, compiled.config);
    // Not in the provider keys either.
    assert_eq!(compiled.keys.0.len(), 2);
}

#[test]
fn client_limits_out_of_range() {
    fn limits(s: &mut Sample) -> &mut ClientLimitsSpec {
        s.client("checkout")
            .limits
            .get_or_insert_with(Default::default)
    }
    rejects(
        |s| limits(s).requests_per_minute = Some(0),
        "team-a/checkout: spec.limits.requestsPerMinute: 0 is below the minimum 1",
    );
    rejects(
        |s| limits(s).tokens_per_minute = Some(1_000_000_001),
        "team-a/checkout: spec.limits.tokensPerMinute: 1000000001 is above the maximum 1000000000",
    );
    rejects(
        |s| limits(s).max_concurrency = Some(100_001),
        "team-a/checkout: spec.limits.maxConcurrency: 100001 is above the maximum 100000",
    );
    rejects(
        |s| limits(s).max_concurrency = Some(-1),
        "team-a/checkout: spec.limits.maxConcurrency: -1 is below the minimum 1",
    );
}

#[test]
fn client_budget_out_of_range() {
    fn budget(s: &mut Sample) -> &mut BudgetSpec {
        s.client("checkout")
            .budget
            .get_or_insert_with(Default::default)
    }
    rejects(
        |s| budget(s).tokens_per_day = Some(0),
        "team-a/checkout: spec.budget.tokensPerDay: 0 is below the minimum 1",
    );
    rejects(
        |s| budget(s).tokens_per_day = Some(1_000_000_000_001),
        "team-a/checkout: spec.budget.tokensPerDay: 1000000000001 is above the maximum 1000000000000",
    );
    rejects(
        |s| budget(s).usd_per_month = Some("0.00".into()),
        "team-a/checkout: spec.budget.usdPerMonth: \"0.00\" must be above 0",
    );
    rejects(
        |s| budget(s).usd_per_month = Some("200,00".into()),
        "team-a/checkout: spec.budget.usdPerMonth: \"200,00\" is not a decimal number like \"2.50\"",
    );
    rejects(
        |s| budget(s).default_reservation = Some(-5),
        "team-a/checkout: spec.budget.defaultReservation: -5 is below the minimum 1",
    );
    rejects(
        |s| budget(s).default_reservation = Some(1_000_000_001),
        "team-a/checkout: spec.budget.defaultReservation: 1000000001 is above the maximum 1000000",
    );
    rejects(
        |s| {
            let b = budget(s);
            b.tokens_per_day = Some(500);
            b.default_reservation = Some(600);
        },
        "team-a/checkout: spec.budget.defaultReservation: 600 is above tokensPerDay (500): a \
         request without an output cap could never be admitted",
    );
}

#[test]
fn client_budget_and_limits_may_be_partial() {
    let mut s = sample();
    s.client("checkout").limits = Some(ClientLimitsSpec {
        max_concurrency: Some(1),
        ..Default::default()
    });
    s.client("checkout").budget = Some(BudgetSpec {
        usd_per_month: Some("0.01".into()),
        ..Default::default()
    });
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let checkout = compiled_client(&compiled, "team-a/checkout");
    assert_eq!(
        checkout.limits,
        ClientLimits {
            requests_per_minute: None,
            tokens_per_minute: None,
            max_concurrency: Some(1),
        }
    );
    assert_eq!(
        checkout.budget,
        ClientBudget {
            tokens_per_day: None,
            usd_per_month: Some(0.01),
            ..Default::default()
        }
    );
    assert_eq!(checkout.budget.default_reservation(), 1_000, "the default");
}

#[test]
fn client_names_an_unknown_route() {
    let mut s = sample();
    s.client("checkout").routes = Some(vec!["smart".into(), "smrt".into()]);
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec!["team-a/checkout: spec.routes[1]: LLMRoute \"smrt\" not found in namespace team-a"]
    );
    let d = &compiled.diagnostics[0];
    assert_eq!(
        (d.severity, d.reason),
        (Severity::Warning, reason::ROUTE_NOT_FOUND)
    );
    // Kept, with the routes that were found.
    assert_eq!(
        compiled_client(&compiled, "team-a/checkout").routes,
        vec![id("smart")]
    );
}

#[test]
fn client_names_a_route_of_another_namespace_not_shared_with_it() {
    for (route, shared_with) in [
        ("team-a/fast", None),
        ("team-a/smart", Some(vec!["team-c".to_string()])),
        ("team-a/nothing", None),
        ("team-c/smart", None),
    ] {
        let mut s = sample();
        s.smart().shared_with = shared_with;
        s.client("reports").routes = Some(vec![route.into()]);
        let compiled = s.compile();
        // The same words whether the route exists or not.
        assert_eq!(
            messages(&compiled),
            vec![format!(
                "team-b/reports: spec.routes[0]: LLMRoute {route} not found, or not shared with namespace team-b"
            )],
            "{route}"
        );
        assert_eq!(compiled.diagnostics[0].reason, reason::ROUTE_NOT_FOUND);
        assert_eq!(
            compiled_client(&compiled, "team-b/reports").routes,
            Vec::<ObjectId>::new()
        );
    }
}

#[test]
fn a_route_shared_with_every_namespace() {
    let mut s = sample();
    s.smart().shared_with = Some(vec!["*".into()]);
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    assert_eq!(
        compiled_client(&compiled, "team-b/reports").routes,
        vec![id("smart")]
    );
}

#[test]
fn the_default_routes_are_only_the_clients_own_namespace() {
    let mut s = sample();
    s.client("reports").routes = None;
    let compiled = s.compile();
    // team-a/smart is shared with team-b, but only an explicit entry takes it.
    assert_eq!(
        messages(&compiled),
        vec![
            "team-b/reports: spec.routes: no LLMRoute in namespace team-b; this client can call none until one is created"
        ]
    );
    assert_eq!(compiled.diagnostics[0].severity, Severity::Warning);
    assert!(
        compiled_client(&compiled, "team-b/reports")
            .routes
            .is_empty()
    );
}

#[test]
fn a_rejected_route_can_still_be_named() {
    // It may still serve its last good version; its own status tells why it is not
    // accepted, the client's does not repeat it.
    let mut s = sample();
    s.route("fast").targets.clear();
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec!["team-a/fast: spec.targets: has no targets; at least 1 is required"]
    );
    assert_eq!(
        compiled_client(&compiled, "team-a/checkout").routes,
        vec![id("fast"), id("smart")]
    );
}

#[test]
fn a_route_named_both_ways_is_listed_once() {
    let mut s = sample();
    s.client("checkout").routes = Some(vec!["smart".into(), "team-a/smart".into()]);
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    assert_eq!(
        compiled_client(&compiled, "team-a/checkout").routes,
        vec![id("smart")]
    );
}

#[test]
fn client_route_entry_malformed() {
    for (entry, message) in [
        (
            "Smart",
            "\"Smart\" is neither an LLMRoute name nor namespace/name (lower-case RFC 1123 names)",
        ),
        (
            "team-a/b/c",
            "\"team-a/b/c\" is neither an LLMRoute name nor namespace/name (lower-case RFC 1123 names)",
        ),
        (
            "/smart",
            "\"/smart\" is neither an LLMRoute name nor namespace/name (lower-case RFC 1123 names)",
        ),
        ("", "must not be empty"),
    ] {
        rejects(
            |s| s.client("checkout").routes = Some(vec!["smart".into(), entry.into()]),
            &format!("team-a/checkout: spec.routes[1]: {message}"),
        );
    }
}

#[test]
fn client_route_listed_twice() {
    rejects(
        |s| s.client("checkout").routes = Some(vec!["smart".into(), "smart".into()]),
        "team-a/checkout: spec.routes[1]: \"smart\" is listed more than once",
    );
}

#[test]
fn client_routes_empty_or_too_many() {
    rejects(
        |s| s.client("checkout").routes = Some(vec![]),
        "team-a/checkout: spec.routes: has no routes; at least 1 is required",
    );
    rejects(
        |s| s.client("checkout").routes = Some((0..65).map(|i| format!("r-{i}")).collect()),
        "team-a/checkout: spec.routes: has 65 routes; the maximum is 64",
    );
}

#[test]
fn client_key_secret_missing() {
    let hasher = KeyHasher::new(HMAC_SECRET).unwrap();
    let mut s = sample();
    s.secrets
        .retain(|secret| secret.metadata.name.as_deref() != Some("checkout-llm"));
    let compiled = s.compile_with(Some(&hasher));
    assert_eq!(
        messages(&compiled),
        vec![
            "team-a/checkout: spec.keySecretRef.name: Secret \"checkout-llm\" not found in namespace team-a; nobody can authenticate as this client"
        ]
    );
    let d = &compiled.diagnostics[0];
    assert_eq!(
        (d.severity, d.reason),
        (Severity::Warning, reason::KEY_MISSING)
    );
    // Kept (limits, routes, status go on), but without a key: fail closed.
    let checkout = compiled_client(&compiled, "team-a/checkout");
    assert_eq!(checkout.key_hash, None);
    assert_eq!(checkout.routes, vec![id("fast"), id("smart")]);
    assert!(
        compiled_client(&compiled, "team-a/batch")
            .key_hash
            .is_some()
    );
}

#[test]
fn client_key_missing_in_the_secret() {
    let mut s = sample();
    s.client("reports").key_secret_ref.key = "apiKey".into();
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-b/reports: spec.keySecretRef.key: Secret \"reports-llm\" has no key \"apiKey\"; nobody can authenticate as this client"
        ]
    );
    assert_eq!(compiled.diagnostics[0].reason, reason::KEY_MISSING);
}

#[test]
fn client_key_secret_of_another_namespace_is_not_found() {
    let mut s = sample();
    s.secret("reports-llm").metadata.namespace = Some("team-a".into());
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-b/reports: spec.keySecretRef.name: Secret \"reports-llm\" not found in namespace team-b; nobody can authenticate as this client"
        ]
    );
}

#[test]
fn client_key_too_short_or_unusable() {
    for (value, problem) in [
        (
            "sk-short\n",
            "is 8 characters long; at least 16 are required (e.g. `openssl rand -hex 24`)",
        ),
        ("   \n", "is empty"),
        (
            "sk-with-a\nline-break-inside",
            "has characters an HTTP header cannot carry",
        ),
    ] {
        let hasher = KeyHasher::new(HMAC_SECRET).unwrap();
        let mut s = sample();
        s.secret("checkout-llm").string_data =
            Some(BTreeMap::from([("apiKey".into(), value.into())]));
        let compiled = s.compile_with(Some(&hasher));
        assert_eq!(
            messages(&compiled),
            vec![format!(
                "team-a/checkout: spec.keySecretRef.key: key \"apiKey\" of Secret \"checkout-llm\" {problem}; nobody can authenticate as this client"
            )],
            "{value:?}"
        );
        assert_eq!(compiled.diagnostics[0].reason, reason::KEY_MISSING);
        assert_eq!(compiled_client(&compiled, "team-a/checkout").key_hash, None);
    }
}

#[test]
fn a_key_used_by_two_clients_stays_with_the_older() {
    let hasher = KeyHasher::new(HMAC_SECRET).unwrap();
    let mut s = sample();
    // batch (older) and checkout both use checkout's key.
    s.client("batch").key_secret_ref.name = "checkout-llm".into();
    s.clients[0].metadata.creation_timestamp = created(2_000);
    s.clients[1].metadata.creation_timestamp = created(1_000);
    let compiled = s.compile_with(Some(&hasher));
    assert_eq!(
        messages(&compiled),
        vec![
            "team-a/checkout: spec.keySecretRef: the key is already used by the older LLMClient team-a/batch; a key identifies one client, so nobody can authenticate as this one until its key changes"
        ]
    );
    let d = &compiled.diagnostics[0];
    assert_eq!(
        (d.severity, d.reason),
        (Severity::Warning, reason::KEY_CONFLICT)
    );
    assert_eq!(compiled_client(&compiled, "team-a/checkout").key_hash, None);
    assert_eq!(
        compiled_client(&compiled, "team-a/batch").key_hash,
        Some(hasher.hash(b"sk-checkout-0123456789"))
    );
}

#[test]
fn a_key_conflict_across_namespaces_does_not_name_the_other_client() {
    let mut s = sample();
    // Same key, after trimming, in team-b; no timestamps: input order decides.
    s.secret("reports-llm").string_data = Some(BTreeMap::from([(
        "token".into(),
        "  sk-checkout-0123456789 ".into(),
    )]));
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-b/reports: spec.keySecretRef: the key is already used by an older LLMClient of another namespace; a key identifies one client, so nobody can authenticate as this one until its key changes"
        ]
    );
}

#[test]
fn an_invalid_client_has_no_key_problems_reported() {
    // Like credentials: the key is resolved only for a client that is otherwise valid.
    let mut s = sample();
    s.secrets
        .retain(|secret| secret.metadata.name.as_deref() != Some("checkout-llm"));
    s.client("checkout").limits = Some(ClientLimitsSpec {
        requests_per_minute: Some(0),
        ..Default::default()
    });
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec!["team-a/checkout: spec.limits.requestsPerMinute: 0 is below the minimum 1"]
    );
    assert_eq!(
        client_ids(&compiled),
        vec!["team-a/batch", "team-b/reports"]
    );
}

#[test]
fn client_key_secret_ref_empty_fields() {
    rejects(
        |s| s.client("checkout").key_secret_ref.key = String::new(),
        "team-a/checkout: spec.keySecretRef.key: must not be empty",
    );
}

#[test]
fn duplicate_clients_keep_the_first() {
    let mut s = sample();
    let mut copy = s.clients[0].clone();
    copy.spec.routes = Some(vec!["fast".into()]);
    s.clients.push(copy);
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-a/checkout: metadata.name: is defined more than once; the first definition is used"
        ]
    );
    assert_eq!(compiled.diagnostics[0].kind, Kind::LLMClient);
    assert_eq!(
        compiled_client(&compiled, "team-a/checkout").routes,
        vec![id("fast"), id("smart")]
    );
}

#[test]
fn client_diagnostics_come_after_routes_and_credentials() {
    let mut s = sample();
    s.client("checkout").routes = Some(vec!["nope".into()]);
    s.credential("openai-prod").secret_ref.key = "missing".into();
    let kinds: Vec<Kind> = s.compile().diagnostics.iter().map(|d| d.kind).collect();
    assert_eq!(
        kinds,
        vec![Kind::LLMRoute, Kind::ProviderCredential, Kind::LLMClient]
    );
}

/// team-b gets its own `smart`, and its `reports` client names both it and the one
/// team-a shares with it.
const TEAM_B_SMART: &str = r#"
---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: openai-b, namespace: team-b }
spec:
  provider: openai
  secretRef: { name: openai-b, key: apiKey }
---
apiVersion: v1
kind: Secret
metadata: { name: openai-b, namespace: team-b }
stringData: { apiKey: sk-openai-b }
---
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: { name: smart, namespace: team-b }
spec:
  targets:
    - credentialRef: { name: openai-b }
"#;

#[test]
fn models_are_global_unless_resolved_per_client() {
    let text = format!("{SAMPLE}{TEAM_B_SMART}")
        .replace("routes: [team-a/smart]", "routes: [team-a/smart, smart]");
    let s = Sample::parse(&text);
    let global = s.compile();
    assert!(
        messages(&global)
            .iter()
            .any(|m| m.starts_with("team-b/smart: spec.models: model \"smart\" is already served")),
        "{:?}",
        messages(&global)
    );
    assert!(!route_ids(&global).contains(&"team-b/smart".to_string()));

    let scoped = s.compile_scoped(None, true);
    assert!(route_ids(&scoped).contains(&"team-b/smart".to_string()));
    let reports = scoped
        .config
        .clients
        .iter()
        .find(|c| c.id.to_string() == "team-b/reports")
        .expect("reports compiled");
    // Its own namespace's `smart` wins; team-a's is left out with a warning.
    assert_eq!(
        reports
            .routes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec!["team-b/smart"]
    );
    let d = scoped
        .diagnostics
        .iter()
        .find(|d| d.reason == reason::MODEL_CONFLICT)
        .expect("a ModelConflict on the client");
    assert_eq!(d.kind, Kind::LLMClient);
    assert_eq!(d.severity, Severity::Warning);
    assert_eq!(
        d.to_string(),
        "team-b/reports: spec.routes: route team-a/smart serves the model \"smart\", which route team-b/smart already serves to this client; team-a/smart is left out"
    );
}

// ---------------------------------------------------------------------------------
// azure-openai credentials and modelMap targets.
// ---------------------------------------------------------------------------------

fn map(entries: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// The sample's anthropic credential turned into an Azure one.
fn azure(s: &mut Sample, api_version: Option<&str>) {
    let c = s.credential("anthropic-prod");
    c.provider = "azure-openai".into();
    c.base_url = Some("https://contoso.openai.azure.com/openai".into());
    c.api_version = api_version.map(Into::into);
}

fn compiled_credential<'a>(compiled: &'a Compiled, name: &str) -> &'a Credential {
    compiled
        .config
        .credentials
        .iter()
        .find(|c| c.id == id(name))
        .unwrap_or_else(|| panic!("{name} not compiled"))
}

#[test]
fn azure_openai_compiles_with_a_dated_api_version() {
    let mut s = sample();
    azure(&mut s, Some("2024-10-21"));
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let c = compiled_credential(&compiled, "anthropic-prod");
    assert_eq!(c.provider, Provider::AzureOpenai);
    assert_eq!(c.base_url, "https://contoso.openai.azure.com/openai");
    assert_eq!(c.api_version.as_deref(), Some("2024-10-21"));
    for preview in ["2025-04-01-preview", "2024-06-01"] {
        let mut s = sample();
        azure(&mut s, Some(preview));
        let compiled = s.compile();
        let c = compiled_credential(&compiled, "anthropic-prod");
        assert_eq!(c.api_version.as_deref(), Some(preview));
    }
}

#[test]
fn azure_openai_v1_or_no_api_version_is_the_v1_api() {
    for v in [None, Some("v1")] {
        let mut s = sample();
        azure(&mut s, v);
        let compiled = s.compile();
        assert_eq!(messages(&compiled), Vec::<String>::new(), "{v:?}");
        assert_eq!(
            compiled_credential(&compiled, "anthropic-prod").api_version,
            None
        );
    }
}

#[test]
fn azure_openai_without_base_url() {
    rejects(
        |s| {
            azure(s, None);
            s.credential("anthropic-prod").base_url = None;
            s.route("fast").targets[0].credential_ref.name = "openai-prod".into();
            s.target(1).credential_ref.name = "openai-prod".into();
            s.smart().fallback = None;
        },
        "team-a/anthropic-prod: spec.baseURL: is required for provider azure-openai",
    );
}

#[test]
fn azure_openai_unknown_api_version() {
    rejects(
        |s| {
            azure(s, Some("2024-13"));
            s.route("fast").targets[0].credential_ref.name = "openai-prod".into();
            s.target(1).credential_ref.name = "openai-prod".into();
            s.smart().fallback = None;
        },
        "team-a/anthropic-prod: spec.apiVersion: \"2024-13\" is not an Azure OpenAI API version: v1, or a date like 2024-10-21 or 2025-04-01-preview",
    );
}

#[test]
fn api_version_on_another_provider() {
    rejects(
        |s| {
            s.credential("openai-prod").api_version = Some("2024-10-21".into());
            s.route("fast").targets[0].credential_ref.name = "anthropic-prod".into();
            s.target(0).credential_ref.name = "anthropic-prod".into();
            s.smart().fallback = None;
            s.clients.clear();
        },
        "team-a/openai-prod: spec.apiVersion: is only meaningful for provider azure-openai",
    );
}

#[test]
fn azure_key_header_cannot_be_a_static_header() {
    let mut s = sample();
    azure(&mut s, None);
    s.credential("anthropic-prod").headers = map(&[("api-key", "x")]);
    let compiled = s.compile();
    assert!(
        messages(&compiled).contains(&format!(
            "team-a/anthropic-prod: spec.headers[api-key]: \"api-key\" {KEY_HEADER}"
        )),
        "{:?}",
        messages(&compiled)
    );
}

#[test]
fn content_filter_is_an_opt_in_failure_class() {
    assert!(!FailureClass::DEFAULT_ON_FAILURES.contains(&FailureClass::ContentFilter));
    let mut s = sample();
    s.smart().fallback.as_mut().expect("fallback").on_failures =
        Some(vec!["status5xx".into(), "contentFilter".into()]);
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let route = &compiled.config.routes.iter().find(|r| r.id == id("smart"));
    assert_eq!(
        route.expect("smart").fallback.on_failures,
        vec![FailureClass::Status5xx, FailureClass::ContentFilter]
    );
}

#[test]
fn model_map_compiles_and_picks_by_client_name() {
    let mut s = sample();
    s.target(0).model = None;
    s.target(0).model_map = map(&[("smart", "gpt-4o"), ("smart-latest", "gpt-4o-mini")]);
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let route = compiled
        .config
        .routes
        .iter()
        .find(|r| r.id == id("smart"))
        .expect("smart");
    let t = &route.targets[0];
    assert_eq!(t.model, None);
    assert_eq!(t.upstream_model("smart"), "gpt-4o");
    assert_eq!(t.upstream_model("smart-latest"), "gpt-4o-mini");
    // Without a map the compiled JSON does not change (revisions stay put).
    let json = serde_json::to_string(&route.targets[1]).expect("json");
    assert!(!json.contains("modelMap"), "{json}");
}

#[test]
fn model_map_with_model() {
    rejects(
        |s| s.target(0).model_map = map(&[("smart", "a"), ("smart-latest", "b")]),
        "team-a/smart: spec.targets[0].modelMap: model and modelMap are mutually exclusive",
    );
}

#[test]
fn model_map_missing_a_route_model() {
    rejects(
        |s| {
            s.target(0).model = None;
            s.target(0).model_map = map(&[("smart", "gpt-4o")]);
        },
        "team-a/smart: spec.targets[0].modelMap: maps no upstream model for \"smart-latest\", a model name of this route",
    );
}

#[test]
fn model_map_with_a_name_the_route_does_not_serve() {
    rejects(
        |s| {
            s.target(0).model = None;
            s.target(0).model_map = map(&[
                ("smart", "gpt-4o"),
                ("smart-latest", "gpt-4o-mini"),
                ("smrt", "gpt-4o"),
            ]);
        },
        "team-a/smart: spec.targets[0].modelMap[smrt]: \"smrt\" is not a model name of this route (smart, smart-latest)",
    );
}

#[test]
fn model_map_covers_the_default_model_name() {
    let mut s = sample();
    s.route("fast").targets[0].model_map = map(&[("fast", "claude-haiku-4-5")]);
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let mut s = sample();
    s.route("fast").targets[0].model_map = map(&[("quick", "claude-haiku-4-5")]);
    let compiled = s.compile();
    assert_eq!(
        messages(&compiled),
        vec![
            "team-a/fast: spec.targets[0].modelMap[quick]: \"quick\" is not a model name of this route (fast)",
            "team-a/fast: spec.targets[0].modelMap: maps no upstream model for \"fast\", a model name of this route",
        ]
    );
    assert!(!route_ids(&compiled).contains(&"team-a/fast".to_string()));
}

#[test]
fn model_map_empty_value() {
    rejects(
        |s| {
            s.target(0).model = None;
            s.target(0).model_map = map(&[("smart", "gpt-4o"), ("smart-latest", "")]);
        },
        "team-a/smart: spec.targets[0].modelMap[smart-latest]: must not be empty",
    );
}

// ---------------------------------------------------------------------------------
// gemini credentials.
// ---------------------------------------------------------------------------------

#[test]
fn gemini_defaults_to_google_ais_v1beta_endpoint() {
    let mut s = sample();
    let c = s.credential("anthropic-prod");
    c.provider = "gemini".into();
    c.base_url = None;
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let c = compiled_credential(&compiled, "anthropic-prod");
    assert_eq!(c.provider, Provider::Gemini);
    assert_eq!(
        c.base_url,
        "https://generativelanguage.googleapis.com/v1beta"
    );
    assert_eq!(c.api_version, None);
    // apiVersion stays Azure's alone.
    let mut s = sample();
    let c = s.credential("anthropic-prod");
    c.provider = "gemini".into();
    c.api_version = Some("v1".into());
    let m = messages(&s.compile());
    assert!(
        m.contains(
            &"team-a/anthropic-prod: spec.apiVersion: is only meaningful for provider azure-openai"
                .to_string()
        ),
        "{m:?}"
    );
}

// ---------------------------------------------------------------------------------
// vertex credentials.
// ---------------------------------------------------------------------------------

const SERVICE_ACCOUNT: &str = r#"{
  "type": "service_account",
  "client_email": "gateway@my-project.iam.gserviceaccount.com",
  "private_key": "-----BEGIN PRIVATE KEY-----\nTUlJQ0tFWQ==\n-----END PRIVATE KEY-----\n",
  "token_uri": "https://oauth2.googleapis.com/token"
}"#;

/// The sample with anthropic-prod turned into a vertex credential whose Secret key
/// `serviceAccount.json` holds `key`.
fn vertex_sample(key: &str, location: &str) -> Sample {
    let mut s = sample();
    let c = s.credential("anthropic-prod");
    c.provider = "vertex".into();
    c.base_url = None;
    c.project = Some("my-project".into());
    c.location = Some(location.into());
    c.secret_ref.key = "serviceAccount.json".into();
    s.secret("anthropic-key").string_data =
        Some(BTreeMap::from([("serviceAccount.json".into(), key.into())]));
    s
}

#[test]
fn vertex_takes_project_location_and_the_service_account_json() {
    let compiled = vertex_sample(SERVICE_ACCOUNT, "us-east5").compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let c = compiled_credential(&compiled, "anthropic-prod");
    assert_eq!(c.provider, Provider::Vertex);
    assert_eq!(c.base_url, "https://us-east5-aiplatform.googleapis.com/v1");
    assert_eq!(c.project.as_deref(), Some("my-project"));
    assert_eq!(c.location.as_deref(), Some("us-east5"));
    // The whole JSON (multi-line: not a header value) is the key.
    assert_eq!(
        compiled
            .keys
            .get(&id("anthropic-prod"))
            .map(|k| k.expose().as_str()),
        Some(SERVICE_ACCOUNT)
    );
    // global has no regional host.
    let compiled = vertex_sample(SERVICE_ACCOUNT, "global").compile();
    let c = compiled_credential(&compiled, "anthropic-prod");
    assert_eq!(c.base_url, "https://aiplatform.googleapis.com/v1");
}

#[test]
fn vertex_needs_project_and_location_and_nobody_else_takes_them() {
    let mut s = vertex_sample(SERVICE_ACCOUNT, "us-east5");
    let c = s.credential("anthropic-prod");
    c.project = None;
    c.location = None;
    let m = messages(&s.compile());
    for expected in [
        "team-a/anthropic-prod: spec.project: is required for provider vertex",
        "team-a/anthropic-prod: spec.location: is required for provider vertex",
    ] {
        assert!(m.contains(&expected.to_string()), "{m:?}");
    }
    let mut s = sample();
    let c = s.credential("openai-prod");
    c.project = Some("my-project".into());
    c.location = Some("us-east5".into());
    let m = messages(&s.compile());
    for expected in [
        "team-a/openai-prod: spec.project: is only meaningful for provider vertex",
        "team-a/openai-prod: spec.location: is only meaningful for provider vertex",
    ] {
        assert!(m.contains(&expected.to_string()), "{m:?}");
    }
    let mut s = vertex_sample(SERVICE_ACCOUNT, "US_EAST");
    s.credential("anthropic-prod").project = Some("My Project".into());
    let m = messages(&s.compile());
    assert!(
        m.iter()
            .any(|m| m.starts_with("team-a/anthropic-prod: spec.project: \"My Project\" is not")),
        "{m:?}"
    );
    assert!(
        m.iter()
            .any(|m| m.starts_with("team-a/anthropic-prod: spec.location: \"US_EAST\" is not")),
        "{m:?}"
    );
}

#[test]
fn an_unusable_service_account_key_is_a_warning_naming_the_field_not_the_key() {
    let broken = SERVICE_ACCOUNT.replace("BEGIN PRIVATE KEY", "BEGIN RSA PRIVATE KEY");
    let compiled = vertex_sample(&broken, "us-east5").compile();
    assert!(compiled.keys.get(&id("anthropic-prod")).is_none());
    let m = messages(&compiled);
    let warning = m
        .iter()
        .find(|m| m.starts_with("team-a/anthropic-prod: spec.secretRef.key:"))
        .unwrap_or_else(|| panic!("{m:?}"));
    assert!(warning.contains("private_key"), "{warning}");
    assert!(!warning.contains("TUlJQ0tFWQ"), "{warning}");
    // The credential stays, without a key, like any credential whose key is missing.
    assert_eq!(
        compiled_credential(&compiled, "anthropic-prod").provider,
        Provider::Vertex
    );
    let compiled = vertex_sample("not json TUlJQ0tFWQ", "us-east5").compile();
    let m = messages(&compiled);
    assert!(m.iter().all(|m| !m.contains("TUlJQ0tFWQ")), "{m:?}");
    assert!(compiled.keys.get(&id("anthropic-prod")).is_none());
}

#[test]
fn a_private_token_uri_needs_allow_private_network_like_a_base_url() {
    let local = SERVICE_ACCOUNT.replace("https://oauth2.googleapis.com", "http://127.0.0.1:8443");
    let compiled = vertex_sample(&local, "us-east5").compile();
    assert!(compiled.keys.get(&id("anthropic-prod")).is_none());
    let m = messages(&compiled);
    assert!(
        m.iter().any(
            |m| m.starts_with("team-a/anthropic-prod: spec.secretRef.key:")
                && m.contains("token_uri's host 127.0.0.1 is a loopback")
                && m.contains("allowPrivateNetwork")
        ),
        "{m:?}"
    );
    let mut s = vertex_sample(&local, "us-east5");
    s.credential("anthropic-prod").allow_private_network = Some(true);
    s.private_networks = PrivateNetworks::Everywhere;
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    assert!(compiled.keys.get(&id("anthropic-prod")).is_some());
}

// ---------------------------------------------------------------------------------
// bedrock credentials.
// ---------------------------------------------------------------------------------

/// The sample's anthropic-prod turned into a bedrock credential in `region`, reading
/// the whole Secret anthropic-key, which holds `data`.
fn bedrock_sample(region: Option<&str>, data: &[(&str, &str)]) -> Sample {
    let mut s = sample();
    let c = s.credential("anthropic-prod");
    c.provider = "bedrock".into();
    c.base_url = None;
    c.secret_ref.key = String::new();
    c.region = region.map(str::to_owned);
    let secret = s.secret("anthropic-key");
    secret.data = None;
    secret.string_data = Some(
        data.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    s
}

#[test]
fn bedrock_reads_the_whole_secret_and_defaults_to_its_regions_runtime() {
    let compiled = bedrock_sample(
        Some("eu-central-1"),
        &[
            ("accessKeyId", "AKIDEXAMPLE\n"),
            ("secretAccessKey", "wJalrXUtnFEMI/K7MDENG"),
            ("sessionToken", "FwoGZXIvYXdzEXAMPLE"),
        ],
    )
    .compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let c = compiled_credential(&compiled, "anthropic-prod");
    assert_eq!(c.provider, Provider::Bedrock);
    assert_eq!(
        c.base_url,
        "https://bedrock-runtime.eu-central-1.amazonaws.com"
    );
    assert_eq!(c.region.as_deref(), Some("eu-central-1"));
    assert_eq!(c.secret_ref.key, "");
    let entry = compiled
        .keys
        .get(&id("anthropic-prod"))
        .expect("keys found");
    let keys = crate::config::AwsKeys::decode(entry).expect("an AWS key entry");
    assert_eq!(keys.access_key_id.expose(), "AKIDEXAMPLE", "trimmed");
    assert_eq!(keys.secret_access_key.expose(), "wJalrXUtnFEMI/K7MDENG");
    assert_eq!(
        keys.session_token.as_ref().map(|t| t.expose().as_str()),
        Some("FwoGZXIvYXdzEXAMPLE")
    );
    // Nothing of the Secret in the config that ConfigMaps and admin endpoints show.
    let shown = serde_json::to_string(&compiled.config).unwrap();
    assert!(
        !shown.contains("wJalr") && !shown.contains("FwoG"),
        "{shown}"
    );
    assert!(!format!("{keys:?}").contains("wJalr"));

    // Without a session token: long-term keys.
    let compiled = bedrock_sample(
        Some("us-east-1"),
        &[("accessKeyId", "AKID"), ("secretAccessKey", "secret")],
    )
    .compile();
    let entry = compiled
        .keys
        .get(&id("anthropic-prod"))
        .expect("keys found");
    assert!(
        crate::config::AwsKeys::decode(entry)
            .unwrap()
            .session_token
            .is_none()
    );
}

#[test]
fn bedrock_without_its_secret_keys_warns_and_keeps_the_credential() {
    let compiled = bedrock_sample(Some("us-east-1"), &[("accessKeyId", "AKID")]).compile();
    assert!(compiled.keys.get(&id("anthropic-prod")).is_none());
    let m = messages(&compiled);
    assert!(
        m.iter()
            .any(|m| m.contains("spec.secretRef.key")
                && m.contains("has no key \"secretAccessKey\"")),
        "{m:?}"
    );
}

#[test]
fn bedrock_fields_are_checked_with_their_paths() {
    let m = messages(&bedrock_sample(None, &[]).compile());
    assert!(
        m.contains(
            &"team-a/anthropic-prod: spec.region: is required for provider bedrock".to_string()
        ),
        "{m:?}"
    );
    let m = messages(&bedrock_sample(Some("Mars-1"), &[]).compile());
    assert!(
        m.iter()
            .any(|m| m.contains("spec.region: \"Mars-1\" is not an AWS region name")),
        "{m:?}"
    );
    let mut s = bedrock_sample(Some("us-east-1"), &[]);
    s.credential("anthropic-prod").secret_ref.key = "apiKey".into();
    let m = messages(&s.compile());
    assert!(
        m.iter()
            .any(|m| m.contains("spec.secretRef.key: provider bedrock takes the whole Secret")),
        "{m:?}"
    );
    let mut s = sample();
    s.credential("openai-prod").region = Some("us-east-1".into());
    let m = messages(&s.compile());
    assert!(
        m.contains(
            &"team-a/openai-prod: spec.region: is only meaningful for provider bedrock".to_string()
        ),
        "{m:?}"
    );
    let mut s = sample();
    s.credential("openai-prod").secret_ref.key = String::new();
    let m = messages(&s.compile());
    assert!(
        m.iter()
            .any(|m| m.starts_with("team-a/openai-prod: spec.secretRef.key:")),
        "{m:?}"
    );
}

// docs/streaming.md#streams-that-survive-their-provider: spec.stream, spec.hedge,
// circuitBreaker.rampUp and a credential's prefill.

fn smart_of(compiled: &Compiled) -> &Route {
    compiled
        .config
        .routes
        .iter()
        .find(|r| r.id == id("smart"))
        .expect("smart compiled")
}

fn stream_spec(yaml: &str) -> crate::route::StreamSpec {
    serde_yaml_ng::from_str(yaml).expect("stream spec")
}

#[test]
fn streams_hedging_and_ramp_are_off_unless_asked_for() {
    let compiled = sample().compile();
    let smart = &smart_of(&compiled);
    assert_eq!((&smart.stream, &smart.hedge), (&None, &None));
    assert_eq!(smart.circuit_breaker.ramp_up_ms, None);
    assert!(compiled.config.credentials.iter().all(|c| !c.prefill));

    // Written out but switched off: compiled (and digested) as not written at all.
    let mut s = sample();
    s.smart().stream = Some(stream_spec("{ resume: { mode: Off, maxResumes: 3 } }"));
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    assert_eq!(smart_of(&compiled).stream, None);
    let json = serde_json::to_string(&smart_of(&compiled)).unwrap();
    for field in ["stream", "hedge", "rampUp", "prefill"] {
        assert!(!json.contains(field), "{field} in {json}");
    }
}

#[test]
fn stream_resume_hedge_and_ramp_compile_with_their_defaults() {
    use crate::config::{Hedge, Resume, StreamPolicy};
    let mut s = sample();
    s.smart().stream = Some(stream_spec(
        "{ idleTimeout: 20s, resume: { mode: Continue } }",
    ));
    s.smart().hedge = Some(serde_yaml_ng::from_str("{ after: 1500ms }").unwrap());
    s.smart().circuit_breaker.as_mut().unwrap().ramp_up = Some("30s".into());
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let smart = &smart_of(&compiled);
    assert_eq!(
        smart.stream,
        Some(StreamPolicy {
            idle_timeout_ms: Some(20_000),
            resume: Some(Resume {
                max_resumes: 1,
                max_held_bytes: 256 * 1024
            }),
        })
    );
    assert_eq!(
        smart.hedge,
        Some(Hedge {
            after_ms: 1500,
            max_percent: 10
        })
    );
    assert_eq!(smart.circuit_breaker.ramp_up_ms, Some(30_000));

    for (size, bytes) in [
        ("1Ki", 1024),
        ("256Ki", 262_144),
        ("16Mi", 16 << 20),
        ("4096", 4096),
        ("8192", 8192),
    ] {
        let mut s = sample();
        let yaml =
            format!("{{ resume: {{ mode: Continue, maxResumes: 5, maxHeldBytes: {size} }} }}");
        s.smart().stream = Some(stream_spec(&yaml));
        let compiled = s.compile();
        assert_eq!(messages(&compiled), Vec::<String>::new(), "{size}");
        let resume = smart_of(&compiled)
            .stream
            .as_ref()
            .and_then(|p| p.resume)
            .expect("resume");
        assert_eq!(
            (resume.max_resumes, resume.max_held_bytes),
            (5, bytes),
            "{size}"
        );
    }
}

#[test]
fn stream_hedge_and_ramp_ranges() {
    type Case = (&'static str, fn(&mut Sample), &'static str);
    let cases: [Case; 9] = [
        (
            "idle timeout zero",
            |s| s.smart().stream = Some(stream_spec("{ idleTimeout: 0s }")),
            "team-a/smart: spec.stream.idleTimeout: \"0s\" must be above 0",
        ),
        (
            "idle timeout above 10m",
            |s| s.smart().stream = Some(stream_spec("{ idleTimeout: 11m }")),
            "team-a/smart: spec.stream.idleTimeout: 11m is above the maximum 10m",
        ),
        (
            "unknown mode",
            |s| s.smart().stream = Some(stream_spec("{ resume: { mode: continue } }")),
            "team-a/smart: spec.stream.resume.mode: \"continue\" is not one of Off, Continue",
        ),
        (
            "six resumes",
            |s| {
                s.smart().stream =
                    Some(stream_spec("{ resume: { mode: Continue, maxResumes: 6 } }"))
            },
            "team-a/smart: spec.stream.resume.maxResumes: 6 is above the maximum 5",
        ),
        (
            "held bytes below 1Ki",
            |s| {
                s.smart().stream = Some(stream_spec(
                    "{ resume: { mode: Continue, maxHeldBytes: 1023 } }",
                ))
            },
            "team-a/smart: spec.stream.resume.maxHeldBytes: 1023 is not from 1Ki (1024) to 16Mi (16777216)",
        ),
        (
            "held bytes above 16Mi",
            |s| {
                s.smart().stream = Some(stream_spec(
                    "{ resume: { mode: Continue, maxHeldBytes: 17Mi } }",
                ))
            },
            "team-a/smart: spec.stream.resume.maxHeldBytes: \"17Mi\" is not from 1Ki (1024) to 16Mi (16777216)",
        ),
        (
            "held bytes in gigabytes",
            |s| {
                s.smart().stream = Some(stream_spec(
                    "{ resume: { mode: Continue, maxHeldBytes: 1G } }",
                ))
            },
            "team-a/smart: spec.stream.resume.maxHeldBytes: \"1G\" is not a size in bytes like 262144, 256Ki or 1Mi",
        ),
        (
            "hedge percent above 100",
            |s| {
                s.smart().hedge =
                    Some(serde_yaml_ng::from_str("{ after: 1s, maxPercent: 101 }").unwrap())
            },
            "team-a/smart: spec.hedge.maxPercent: 101 is above the maximum 100",
        ),
        (
            "ramp above an hour",
            |s| s.smart().circuit_breaker.as_mut().unwrap().ramp_up = Some("61m".into()),
            "team-a/smart: spec.circuitBreaker.rampUp: 1h1m is above the maximum 1h",
        ),
    ];
    for (name, change, expected) in cases {
        let compiled = rejects(change, expected);
        assert_eq!(route_ids(&compiled), ["team-a/fast"], "{name}");
    }
    rejects(
        |s| s.smart().hedge = Some(serde_yaml_ng::from_str("{ after: 0ms }").unwrap()),
        "team-a/smart: spec.hedge.after: \"0ms\" must be above 0",
    );
}

#[test]
fn hedge_and_ramp_floors_are_refused_by_field() {
    rejects(
        |s| {
            s.smart().hedge = Some(serde_yaml_ng::from_str("{ after: 1s, maxPercent: 0 }").unwrap())
        },
        "team-a/smart: spec.hedge.maxPercent: 0 is below the minimum 1",
    );
    rejects(
        |s| s.smart().circuit_breaker.as_mut().unwrap().ramp_up = Some("0s".into()),
        "team-a/smart: spec.circuitBreaker.rampUp: \"0s\" must be above 0",
    );
    rejects(
        |s| s.smart().hedge = Some(serde_yaml_ng::from_str("{ after: soon }").unwrap()),
        "team-a/smart: spec.hedge.after: \"soon\" is not a duration like 250ms, 10s, 1m30s or 1h",
    );
}

#[test]
fn prefill_is_for_openai_compatible_only() {
    let mut s = sample();
    let c = s.credential("openai-prod");
    c.provider = "openai-compatible".into();
    c.base_url = Some("https://llm.example.com/v1".into());
    c.prefill = Some(true);
    let compiled = s.compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let credential = compiled
        .config
        .credentials
        .iter()
        .find(|c| c.id == id("openai-prod"))
        .expect("compiled");
    assert!(credential.prefill);

    let mut s = sample();
    s.credential("anthropic-prod").prefill = Some(true);
    let m = messages(&s.compile());
    let expected = "team-a/anthropic-prod: spec.prefill: is only meaningful for provider openai-compatible (anthropic, and Claude on vertex and bedrock, continue a prefilled answer already)";
    assert!(m.iter().any(|m| m == expected), "{m:?}");
}

/// The sample's openai credential as a pool over `keys` of its Secret, which holds
/// `held` (each key's value is `sk-<name>`).
fn pooled(keys: &[&str], held: &[&str]) -> Sample {
    let mut s = sample();
    let c = s.credential("openai-prod");
    c.secret_ref.key = String::new();
    c.secret_ref.keys = Some(keys.iter().map(|k| k.to_string()).collect());
    s.secret("openai-key").string_data = Some(
        held.iter()
            .map(|k| (k.to_string(), format!("sk-{k}")))
            .collect(),
    );
    s
}

#[test]
fn a_key_pool_travels_as_one_entry_with_its_names_in_order() {
    let compiled = pooled(&["b", "a", "c"], &["a", "b", "c"]).compile();
    assert_eq!(messages(&compiled), Vec::<String>::new());
    let credential = compiled_credential(&compiled, "openai-prod");
    assert_eq!(credential.secret_ref.keys, ["b", "a", "c"]);
    assert_eq!(credential.secret_ref.key, "");
    assert_eq!(credential.key_names(), ["b", "a", "c"]);
    let pool = crate::config::KeyPool::decode(compiled.keys.get(&id("openai-prod")).unwrap())
        .expect("a pool entry");
    let values: Vec<(&str, &str)> = pool
        .0
        .iter()
        .map(|(k, v)| (k.as_str(), v.expose().as_str()))
        .collect();
    assert_eq!(values, [("a", "sk-a"), ("b", "sk-b"), ("c", "sk-c")]);
    assert_eq!(
        format!("{pool:?}"),
        r#"{"a", "b", "c"}"#,
        "names, never values"
    );
    // One key stays as it was: no pool in the JSON, the default rejection time absent.
    let one = sample().compile();
    let json = serde_json::to_string(compiled_credential(&one, "anthropic-prod")).unwrap();
    assert!(
        !json.contains("keys") && !json.contains("keyRejectedFor"),
        "{json}"
    );
    assert_eq!(
        compiled_credential(&one, "anthropic-prod").key_names(),
        ["apiKey"]
    );
}

#[test]
fn a_pool_key_the_secret_lacks_names_its_field_and_the_rest_serve() {
    let compiled = pooled(&["a", "b", "c"], &["a", "c"]).compile();
    assert_eq!(
        messages(&compiled),
        [
            "team-a/smart: spec.targets[0].credentialRef.name: ProviderCredential \"openai-prod\" serves with only some of its keys (spec.secretRef.keys[1]: Secret \"openai-key\" has no key \"b\")",
            "team-a/openai-prod: spec.secretRef.keys[1]: Secret \"openai-key\" has no key \"b\"",
        ]
    );
    assert!(
        compiled
            .diagnostics
            .iter()
            .all(|d| d.reason == reason::SECRET_KEY_MISSING && d.severity == Severity::Warning),
        "ResolvedRefs=False on the route, the credential kept"
    );
    let pool =
        crate::config::KeyPool::decode(compiled.keys.get(&id("openai-prod")).unwrap()).unwrap();
    assert_eq!(pool.0.keys().collect::<Vec<_>>(), ["a", "c"]);

    // None of them: no key at all, the first missing one named.
    let compiled = pooled(&["x", "y"], &["a"]).compile();
    assert_eq!(
        messages(&compiled)[1..],
        [
            "team-a/openai-prod: spec.secretRef.keys[0]: Secret \"openai-key\" has no key \"x\"",
            "team-a/openai-prod: spec.secretRef.keys[1]: Secret \"openai-key\" has no key \"y\"",
        ]
    );
    assert!(compiled.keys.get(&id("openai-prod")).is_none());
}

#[test]
fn bad_key_pools_are_refused_naming_the_field() {
    let refused = |change: &dyn Fn(&mut ProviderCredentialSpec), expected: &str| {
        let mut s = pooled(&["a", "b"], &["a", "b"]);
        change(s.credential("openai-prod"));
        let m = messages(&s.compile());
        assert!(m.iter().any(|m| m == expected), "{m:?}");
    };
    refused(
        &|c| c.secret_ref.keys = Some(vec![]),
        "team-a/openai-prod: spec.secretRef.keys: has no keys; at least 1 is required",
    );
    refused(
        &|c| c.secret_ref.keys = Some(vec!["a".into(), "a".into()]),
        "team-a/openai-prod: spec.secretRef.keys[1]: \"a\" is listed more than once",
    );
    refused(
        &|c| c.secret_ref.keys = Some(vec!["a/b".into()]),
        "team-a/openai-prod: spec.secretRef.keys[0]: \"a/b\" is not a Secret data key name (letters, digits, '-', '_' and '.', at most 253 characters)",
    );
    refused(
        &|c| c.secret_ref.key = "apiKey".into(),
        "team-a/openai-prod: spec.secretRef.keys: secretRef.key (one key) and secretRef.keys (a pool) are mutually exclusive",
    );
    refused(
        &|c| {
            c.provider = "vertex".into();
            c.project = Some("my-project".into());
            c.location = Some("us-east5".into());
        },
        "team-a/openai-prod: spec.secretRef.keys: providers bedrock and vertex take the whole Secret: secretRef.keys (a key pool) is not supported for them",
    );
    refused(
        &|c| c.key_rejected_for = Some("500ms".into()),
        "team-a/openai-prod: spec.keyRejectedFor: \"500ms\" must be from 1s to 24h",
    );
    let mut s = sample();
    s.credential("openai-prod").key_rejected_for = Some("1m".into());
    assert_eq!(
        compiled_credential(&s.compile(), "openai-prod").key_rejected_for_ms,
        60_000
    );
}

#[test]
fn probe_interval_health_check_and_response_model() {
    let smart = |s: &Sample| -> Route {
        s.compile()
            .config
            .routes
            .into_iter()
            .find(|r| r.id == id("smart"))
            .expect("compiled")
    };
    let mut s = sample();
    let r = smart(&s);
    assert_eq!(r.circuit_breaker.probe_interval_ms, 10_000, "the default");
    assert_eq!(r.response_model, crate::config::ResponseModel::Requested);
    assert_eq!(r.targets[0].health_check, None);
    let json = serde_json::to_string(&r).unwrap();
    assert!(
        !json.contains("probeInterval") && !json.contains("responseModel"),
        "defaults stay out of the JSON (existing revisions do not change): {json}"
    );

    s.smart().circuit_breaker.as_mut().unwrap().probe_interval = Some("0s".into());
    s.smart().response_model = Some("served".into());
    s.target(1).health_check = Some(serde_yaml_ng::from_str("{ interval: 30s }").unwrap());
    let r = smart(&s);
    assert_eq!(r.circuit_breaker.probe_interval_ms, 0, "probing off");
    assert!(!r.circuit_breaker.probes());
    assert_eq!(r.response_model, crate::config::ResponseModel::Served);
    assert_eq!(
        r.targets[1].health_check,
        Some(crate::config::HealthCheck {
            interval_ms: 30_000
        })
    );
    let back: Route = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);

    rejects(
        |s| s.smart().circuit_breaker.as_mut().unwrap().probe_interval = Some("500ms".into()),
        "team-a/smart: spec.circuitBreaker.probeInterval: 500ms is below the minimum 1s (0s switches probing off)",
    );
    rejects(
        |s| s.smart().circuit_breaker.as_mut().unwrap().probe_interval = Some("2h".into()),
        "team-a/smart: spec.circuitBreaker.probeInterval: 2h is above the maximum 1h",
    );
    rejects(
        |s| {
            s.target(0).health_check = Some(serde_yaml_ng::from_str("{ interval: 100ms }").unwrap())
        },
        "team-a/smart: spec.targets[0].healthCheck.interval: 100ms is below the minimum 1s",
    );
    rejects(
        |s| s.smart().response_model = Some("upstream".into()),
        "team-a/smart: spec.responseModel: \"upstream\" is not one of requested, served",
    );
}

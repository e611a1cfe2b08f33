//! The `ProviderCredential` custom resource: one provider endpoint and the Secret key
//! used to call it, shared by every route in its namespace that references it.
//!
//! Raw types, exactly as written in a manifest; `compile` turns them into
//! [`crate::config::Credential`] plus the key in [`crate::config::Keys`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

/// A ProviderCredential: a provider endpoint and the Secret key used to call it.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "switchback.dev",
    version = "v1alpha1",
    kind = "ProviderCredential",
    plural = "providercredentials",
    singular = "providercredential",
    shortname = "pcred",
    category = "switchback",
    namespaced,
    status = "ProviderCredentialStatus",
    derive = "PartialEq",
    doc = "ProviderCredential is one LLM provider endpoint and the Secret key used to call it, referenced by LLMRoutes in the same namespace.",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider","description":"Provider API flavour"}"#,
    printcolumn = r#"{"name":"Secret","type":"string","jsonPath":".spec.secretRef.name","description":"Secret holding the API key"}"#,
    printcolumn = r#"{"name":"Keys","type":"string","jsonPath":".status.usableKeys","description":"Keys usable now on every proxy replica, of the credential's keys"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Valid and its key resolved"}"#,
    printcolumn = r#"{"name":"Routes","type":"integer","jsonPath":".status.routes","description":"LLMRoutes that reference it"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("self.provider != 'openai-compatible' || has(self.baseURL)").message("baseURL is required for provider openai-compatible").field_path(".baseURL"))]
#[x_kube(validation = Rule::new("self.provider != 'azure-openai' || has(self.baseURL)").message("baseURL is required for provider azure-openai (https://RESOURCE.openai.azure.com/openai)").field_path(".baseURL"))]
#[x_kube(validation = Rule::new("!has(self.apiVersion) || self.provider == 'azure-openai'").message("apiVersion is only meaningful for provider azure-openai").field_path(".apiVersion"))]
#[x_kube(validation = Rule::new("!has(self.responsesAPI) || self.provider == 'openai-compatible'").message("responsesAPI is only meaningful for provider openai-compatible (openai and azure-openai serve the Responses API already)").field_path(".responsesAPI"))]
#[x_kube(validation = Rule::new("!has(self.prefill) || self.provider == 'openai-compatible'").message("prefill is only meaningful for provider openai-compatible (anthropic, and Claude on vertex and bedrock, continue a prefilled answer already)").field_path(".prefill"))]
#[x_kube(validation = Rule::new("self.provider != 'vertex' || has(self.project)").message("project is required for provider vertex").field_path(".project"))]
#[x_kube(validation = Rule::new("self.provider != 'vertex' || has(self.location)").message("location is required for provider vertex").field_path(".location"))]
#[x_kube(validation = Rule::new("!has(self.project) || self.provider == 'vertex'").message("project is only meaningful for provider vertex").field_path(".project"))]
#[x_kube(validation = Rule::new("!has(self.location) || self.provider == 'vertex'").message("location is only meaningful for provider vertex").field_path(".location"))]
#[x_kube(validation = Rule::new("!has(self.maxQueue) || has(self.maxConcurrency)").message("maxQueue needs maxConcurrency").field_path(".maxQueue"))]
#[x_kube(validation = Rule::new("self.provider != 'bedrock' || has(self.region)").message("region is required for provider bedrock").field_path(".region"))]
#[x_kube(validation = Rule::new("!has(self.region) || self.provider == 'bedrock'").message("region is only meaningful for provider bedrock").field_path(".region"))]
#[x_kube(validation = Rule::new("self.provider in ['bedrock', 'vertex'] || has(self.secretRef.key) || has(self.secretRef.keys)").message("secretRef.key is required (it names the Secret key holding the API key), or secretRef.keys for a pool of keys").field_path(".secretRef.key"))]
#[x_kube(validation = Rule::new("!has(self.secretRef.key) || !has(self.secretRef.keys)").message("secretRef.key (one key) and secretRef.keys (a pool) are mutually exclusive").field_path(".secretRef.keys"))]
#[x_kube(validation = Rule::new("!has(self.secretRef.keys) || !(self.provider in ['bedrock', 'vertex'])").message("providers bedrock and vertex take the whole Secret: secretRef.keys (a key pool) is not supported for them").field_path(".secretRef.keys"))]
#[x_kube(validation = Rule::new("self.provider != 'bedrock' || !has(self.secretRef.key)").message("provider bedrock takes the whole Secret (accessKeyId, secretAccessKey, optional sessionToken): secretRef.key must not be set").field_path(".secretRef.key"))]
pub struct ProviderCredentialSpec {
    /// Provider API flavour: openai, anthropic, openai-compatible (any server speaking
    /// the OpenAI API: vLLM, Ollama, LiteLLM, ...), azure-openai (Azure OpenAI: the
    /// key goes in the api-key header and a target's model names the deployment) or
    /// gemini (Google AI's native Gemini API: generateContent, the key in the
    /// x-goog-api-key header), vertex (Google Cloud Vertex AI: project and location
    /// name the endpoint, the Secret key holds a service-account JSON key exchanged
    /// for an OAuth token; claude-* models through rawPredict, others through
    /// generateContent) or bedrock (Amazon Bedrock's Converse API, requests signed
    /// with SigV4 from the access key pair in the Secret). Required.
    #[schemars(schema_with = "schema::provider")]
    pub provider: String,

    /// Provider API base URL (http or https); endpoint paths such as /chat/completions
    /// are appended to it. Default: https://api.openai.com/v1 for openai,
    /// https://api.anthropic.com/v1 for anthropic,
    /// https://generativelanguage.googleapis.com/v1beta for gemini (where
    /// /models/MODEL:generateContent is appended), https://LOCATION-aiplatform.googleapis.com/v1
    /// for vertex (https://aiplatform.googleapis.com/v1 for location global; where
    /// /projects/PROJECT/locations/LOCATION/publishers/... is appended),
    /// https://bedrock-runtime.REGION.amazonaws.com for bedrock (where
    /// /model/MODEL/converse is appended); required for openai-compatible and
    /// for azure-openai, where it is the resource's
    /// https://RESOURCE.openai.azure.com/openai (deployment or /v1 paths are appended). A
    /// host that is a loopback, private, link-local or unspecified address, or
    /// localhost, is refused unless allowPrivateNetwork is true. At most 2048 characters.
    #[serde(rename = "baseURL", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^https?://"))]
    pub base_url: Option<String>,

    /// The Secret key holding the API key, in this credential's namespace. Required,
    /// except for vertex and bedrock, which take the whole Secret: vertex reads the
    /// service-account JSON key from key serviceAccount.json unless a key is named;
    /// bedrock names no key and reads accessKeyId, secretAccessKey and, for
    /// temporary credentials, sessionToken.
    pub secret_ref: CredentialSecretRef,

    /// Static headers sent with every request to this provider, e.g.
    /// OpenAI-Organization. No secrets here: they are rendered into a ConfigMap. Names
    /// that carry a key are refused, case-insensitively: authorization,
    /// proxy-authorization, cookie, and any name containing api-key, api_key, apikey,
    /// token, secret, password or subscription-key (x-api-key, api-key,
    /// x-goog-api-key, ...); the key comes from the Secret. At most 32. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::headers")]
    #[x_kube(validation = Rule::new(schema::KEY_HEADER_RULE).message(Message::Expression(schema::KEY_HEADER_MESSAGE.into())))]
    pub headers: Option<BTreeMap<String, String>>,

    /// Requests in flight to this provider per proxy replica, at least 1. Default:
    /// unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrency: Option<i32>,

    /// Requests that may wait for a slot once maxConcurrency are in flight, per proxy
    /// replica, at least 0; a request finding the queue full fails over at once. Needs
    /// maxConcurrency. Default: 0 (no waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_queue: Option<i32>,

    /// Allow a baseURL whose host is a loopback, private, link-local or unspecified
    /// address (checked on the literal host and again on every DNS answer). Honoured
    /// only in the namespaces the platform allows (the operator's
    /// --allow-private-network-namespaces); elsewhere true refuses the credential
    /// (reason PrivateNetworkNotAllowed). Default: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_private_network: Option<bool>,

    /// azure-openai only. "v1" (the default) calls Azure's v1 API,
    /// {baseURL}/v1/chat/completions, with the deployment as the body's model. A dated
    /// version such as 2024-10-21 or 2025-04-01-preview calls the classic
    /// {baseURL}/deployments/{model}/chat/completions?api-version={apiVersion}.
    /// Default: v1.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "schema::api_version")]
    pub api_version: Option<String>,

    /// openai-compatible only. true: the server also answers the OpenAI Responses
    /// API at {baseURL}/responses, so POST /v1/responses may be sent to it; false: it
    /// is skipped for that API (attempt reason unsupportedSurface). openai and
    /// azure-openai (v1 API) serve it without this field. Default: false.
    #[serde(
        rename = "responsesAPI",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub responses_api: Option<bool>,

    /// openai-compatible only. true: the server continues a final assistant message
    /// when asked with continue_final_message: true and add_generation_prompt: false
    /// (the vLLM and SGLang convention), so a route's stream.resume may continue a
    /// broken stream on it; false: it is skipped for resuming (reason cannotResume).
    /// anthropic, and Claude on vertex and bedrock, continue a prefilled answer
    /// without this field. Default: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<bool>,

    /// vertex only, and required there: the Google Cloud project ID (6 to 30
    /// lowercase letters, digits and hyphens, starting with a letter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$"))]
    pub project: Option<String>,

    /// vertex only, and required there: the Vertex AI location, a region such as
    /// us-east5 or europe-west1, or global (lowercase letters, digits and hyphens, at
    /// most 63 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z][a-z0-9-]{0,62}$"))]
    pub location: Option<String>,

    /// bedrock only, and required there: the AWS region whose Bedrock runtime is
    /// called (https://bedrock-runtime.REGION.amazonaws.com) and that requests are
    /// signed for, e.g. us-east-1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")
    )]
    pub region: Option<String>,

    /// How long a key the provider answered with 401 or 403 is set aside (state
    /// Rejected): requests use the credential's other keys meanwhile, and only when
    /// every key is set aside is one tried anyway. A Gateway API duration from 1s to
    /// 24h. Default: 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('24h')").message("must be from 1s to 24h"))]
    pub key_rejected_for: Option<String>,
}

/// Names one key of a Secret in the same namespace.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeySelector {
    /// Name of the Secret. Required, 1 to 253 characters.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key within the Secret's data whose value is the API key. Required, 1 to 253
    /// characters, except on a vertex ProviderCredential (default
    /// serviceAccount.json) and a bedrock one (which reads the whole Secret and must
    /// not set it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// A credential's Secret: one of its keys, or a pool of them (docs/request-lifecycle.md#key-pools).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialSecretRef {
    /// Name of the Secret. Required, 1 to 253 characters.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key within the Secret's data whose value is the API key. Required, 1 to 253
    /// characters, except on a vertex ProviderCredential (default
    /// serviceAccount.json) and a bedrock one (which reads the whole Secret and must
    /// not set it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
    /// A pool of keys instead of key: data keys of the Secret, each holding one API
    /// key of the same provider account kind. Requests are spread round-robin over the
    /// keys usable now; a key answered with 429 is parked for its Retry-After (or the
    /// retry backoff) and the same request is sent at once with the next usable key;
    /// one answered with 401 or 403 is set aside for keyRejectedFor. Only when every
    /// key is parked does the target count as rate limited. 1 to 32 unique Secret data
    /// key names. Not with key; not for bedrock or vertex (they take the whole Secret).
    /// Default: none (one key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::key_pool")]
    #[x_kube(validation = Rule::new("self.all(k, self.exists_one(n, n == k))").message("key names must be unique"))]
    pub keys: Option<Vec<String>>,
}

impl CredentialSecretRef {
    /// The one key it names, as a [`SecretKeySelector`].
    pub fn selector(&self) -> SecretKeySelector {
        SecretKeySelector {
            name: self.name.clone(),
            key: self.key.clone(),
        }
    }
}

/// Observed state of a ProviderCredential, written by the operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderCredentialStatus {
    /// metadata.generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Ready (the spec is valid and the key resolved) and SecretResolved (the Secret and
    /// key exist); while Ready is False, kstatus's Reconciling (deletion held while
    /// routes use it) or Stalled (invalid, or its key missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,

    /// Number of LLMRoutes that reference this credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<i32>,

    /// Its keys usable now (Active on every ready proxy replica) of all its keys, as
    /// "2/3". Absent until the proxies have reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usable_keys: Option<String>,

    /// Each key (by its Secret data-key name, never its value) as the proxy replicas
    /// see it now, in declared order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyStatus>,
}

/// One key of a credential, aggregated over the ready proxy replicas.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyStatus {
    /// The Secret data key that holds it.
    pub name: String,
    /// Active (used), Parked (answered 429: set aside until its Retry-After ends) or
    /// Rejected (answered 401 or 403: set aside for keyRejectedFor). When replicas
    /// disagree, the state that keeps requests away the most, with `replicas` saying
    /// how many see it.
    #[schemars(schema_with = "crate::schema::key_state")]
    pub state: String,
    /// When a Parked or Rejected key is used again, at the latest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Ready proxy replicas that see this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDENTIAL: &str = r#"
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: openai-prod, namespace: team-a }
spec:
  provider: openai
  baseURL: https://api.openai.com/v1
  secretRef: { name: openai-key, key: apiKey }
  headers: { OpenAI-Organization: org-123 }
  maxConcurrency: 256
  maxQueue: 512
  allowPrivateNetwork: false
"#;

    #[test]
    fn the_spec_example_parses() {
        let credential: ProviderCredential = serde_yaml_ng::from_str(CREDENTIAL).expect("parses");
        assert_eq!(
            credential.spec.base_url.as_deref(),
            Some("https://api.openai.com/v1")
        );
        assert_eq!(credential.spec.secret_ref.key, "apiKey");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        for (typo, fixed) in [
            ("baseURL", "baseUrl"),
            (
                "secretRef: { name: openai-key, key: apiKey }",
                "secretRef: { name: openai-key, kes: [apiKey] }",
            ),
            ("maxQueue", "maxQueued"),
        ] {
            let yaml = CREDENTIAL.replacen(typo, fixed, 1);
            let err = serde_yaml_ng::from_str::<ProviderCredential>(&yaml).expect_err(fixed);
            assert!(err.to_string().contains("unknown field"), "{fixed}: {err}");
        }
    }
}

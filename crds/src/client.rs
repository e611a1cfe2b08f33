//! The `LLMClient` custom resource
//! (docs/tenancy.md#clients-authentication-tenancy-limits-and-budgets): one application
//! allowed to call the gateway, the Secret key it authenticates with, the routes it may
//! call, and its rate limits and budgets.
//!
//! Raw types, exactly as written in a manifest; `compile` turns them into
//! [`crate::config::Client`], which holds only a keyed hash of the key.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::credential::SecretKeySelector;
use crate::schema;

/// An LLMClient: an application allowed to call the gateway with the key in a Secret.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "switchback.dev",
    version = "v1alpha1",
    kind = "LLMClient",
    plural = "llmclients",
    singular = "llmclient",
    shortname = "llmc",
    category = "switchback",
    namespaced,
    status = "LLMClientStatus",
    derive = "PartialEq",
    doc = "LLMClient is an application allowed to call the gateway: the key it sends (from a Secret), the LLMRoutes it may call, and its rate limits and budgets.",
    printcolumn = r#"{"name":"Routes","type":"integer","jsonPath":".status.routes","description":"LLMRoutes this client may call"}"#,
    printcolumn = r#"{"name":"RPM","type":"integer","jsonPath":".status.requestsPerMinute","description":"Requests per minute over the last stats window, all replicas"}"#,
    printcolumn = r#"{"name":"Tokens Today","type":"integer","jsonPath":".status.usage.today.tokens","description":"Input + output tokens this UTC day"}"#,
    printcolumn = r#"{"name":"USD Month","type":"string","jsonPath":".status.usage.thisMonth.usd","description":"Cost this UTC calendar month, from the targets' prices"}"#,
    printcolumn = r#"{"name":"Budget","type":"integer","jsonPath":".status.budgetUsedPercent","description":"Percent used of the budget closest to exhaustion"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Valid, its key resolved and every route found, budget left"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("has(self.keySecretRef.key)").message("keySecretRef.key is required").field_path(".keySecretRef.key"))]
pub struct LLMClientSpec {
    /// The Secret key holding the key this application sends (as Authorization: Bearer
    /// or x-api-key), in this client's namespace. The proxy only ever gets a keyed hash
    /// of it; changing the Secret rotates the key, deleting it revokes the key. At
    /// least 16 characters after trimming surrounding whitespace, and unique: a key
    /// another, older client already uses is refused (reason KeyConflict). Required.
    pub key_secret_ref: SecretKeySelector,

    /// LLMRoutes this client may call: a name (a route in this client's namespace) or
    /// namespace/name (a route of another namespace whose spec.sharedWith offers it to
    /// this one). A model name is looked up only among these routes. 1 to 64 unique
    /// entries. Default: every LLMRoute of this client's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::client_routes")]
    #[x_kube(validation = Rule::new("self.all(m, self.exists_one(n, n == m))").message("routes must be unique"))]
    pub routes: Option<Vec<String>>,

    /// Rate limits, for this client across all proxy replicas (each replica enforces its
    /// share). A request over a limit gets 429 rate_limited with Retry-After and is not
    /// sent upstream. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ClientLimitsSpec>,

    /// Spending caps counted from the providers' reported usage. Once one is spent,
    /// every replica answers 429 budget_exhausted until its period ends. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
}

/// Rate limits of one client, across all proxy replicas.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientLimitsSpec {
    /// Requests per minute. 1 to 1000000. Default: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub requests_per_minute: Option<i32>,

    /// Input + output tokens per minute, as the providers report them. 1 to
    /// 1000000000. Default: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000_000))]
    pub tokens_per_minute: Option<i32>,

    /// Requests in flight at once (a stream counts until it ends). 1 to 100000.
    /// Default: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000))]
    pub max_concurrency: Option<i32>,
}

/// Spending caps of one client.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("!has(self.defaultReservation) || !has(self.tokensPerDay) || self.defaultReservation <= self.tokensPerDay").message("defaultReservation must not exceed tokensPerDay: a request without an output cap could never be admitted").field_path(".defaultReservation"))]
pub struct BudgetSpec {
    /// Input + output tokens per UTC day. 1 to 1000000000000. Default: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000_000_000_i64))]
    pub tokens_per_day: Option<i64>,

    /// USD per UTC calendar month, priced with the targets' spec.targets[].price
    /// (an unpriced target costs nothing). A decimal string like "200.00", above 0.
    /// Default: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::decimal")]
    #[x_kube(validation = Rule::new("self.matches('[1-9]')").message("must be above 0"))]
    pub usd_per_month: Option<String>,

    /// Tokens a request reserves when it sets no output cap (max_tokens,
    /// max_completion_tokens or max_output_tokens), besides its input estimate (request
    /// bytes / 4). A request is sent upstream only while the budget left, less what
    /// the requests in flight reserved, covers its reservation; the reservation is
    /// settled to the usage the provider reports when the answer ends. Priced with the
    /// route's first target for usdPerMonth. 1 to 1000000, and at most tokensPerDay.
    /// Default: 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub default_reservation: Option<i64>,
}

/// Observed state of an LLMClient, written by the operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LLMClientStatus {
    /// metadata.generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Ready: True when the spec is valid, the key resolved, every route in spec.routes
    /// was found and no budget is spent; otherwise False with reason InvalidSpec,
    /// KeyMissing, KeyConflict, RouteNotFound or BudgetExhausted. Stalled (kstatus) while
    /// it is False for anything but a spent budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,

    /// Number of LLMRoutes this client may call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<i32>,

    /// Requests per minute over the last stats window, summed over proxy replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<i64>,

    /// Usage in the current budget periods, monotonic across proxy restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ClientUsage>,

    /// The larger of tokens today / budget.tokensPerDay and USD this month /
    /// budget.usdPerMonth, in percent (above 100 when the last requests before
    /// exhaustion overshot). Absent without a budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_used_percent: Option<i32>,

    /// Requests refused with 429 without going upstream, since the client was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttled: Option<Throttled>,

    /// When the last request of this client was seen by any replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request_at: Option<Time>,
}

/// Usage in the current UTC day and calendar month.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientUsage {
    /// The current UTC day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub today: Option<UsagePeriod>,
    /// The current UTC calendar month.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub this_month: Option<UsagePeriod>,
}

/// Counters of one budget period.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsagePeriod {
    /// Start of the period (UTC midnight, or the first of the month) the counters cover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// Requests sent upstream (refused ones are counted in throttled instead).
    pub requests: i64,
    /// Input (prompt) tokens reported by the providers.
    pub input_tokens: i64,
    /// Output (completion) tokens reported by the providers.
    pub output_tokens: i64,
    /// inputTokens + outputTokens: what budget.tokensPerDay counts.
    pub tokens: i64,
    /// Cost in USD from the targets' prices, a decimal string like "3.10".
    pub usd: String,
}

/// Requests refused without going upstream.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Throttled {
    /// Over requestsPerMinute, tokensPerMinute or maxConcurrency (429 rate_limited).
    pub rate_limited: i64,
    /// After a budget was spent (429 budget_exhausted).
    pub budget_exhausted: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = r#"
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: { name: checkout, namespace: team-a }
spec:
  keySecretRef: { name: checkout-llm, key: apiKey }
  routes: [smart, claude]
  limits:
    requestsPerMinute: 600
    tokensPerMinute: 200000
    maxConcurrency: 50
  budget:
    tokensPerDay: 5000000
    usdPerMonth: "200.00"
"#;

    #[test]
    fn the_spec_example_parses() {
        let client: LLMClient = serde_yaml_ng::from_str(CLIENT).expect("parses");
        assert_eq!(client.spec.key_secret_ref.name, "checkout-llm");
        assert_eq!(
            client.spec.routes.as_deref(),
            Some(&["smart".to_string(), "claude".to_string()][..])
        );
        let limits = client.spec.limits.as_ref().expect("limits");
        assert_eq!(limits.requests_per_minute, Some(600));
        assert_eq!(limits.max_concurrency, Some(50));
        let budget = client.spec.budget.as_ref().expect("budget");
        assert_eq!(budget.tokens_per_day, Some(5_000_000));
        assert_eq!(budget.usd_per_month.as_deref(), Some("200.00"));
    }

    #[test]
    fn unknown_fields_are_rejected_at_every_level() {
        for (typo, fixed) in [
            ("keySecretRef", "keySecret"),
            ("key: apiKey", "keys: apiKey"),
            ("requestsPerMinute", "requestPerMinute"),
            ("usdPerMonth", "dollarsPerMonth"),
            ("  routes:", "  route:"),
        ] {
            let yaml = CLIENT.replacen(typo, fixed, 1);
            assert_ne!(yaml, CLIENT, "{typo} not found");
            let err = serde_yaml_ng::from_str::<LLMClient>(&yaml).expect_err(fixed);
            assert!(err.to_string().contains("unknown field"), "{fixed}: {err}");
        }
    }

    #[test]
    fn the_spec_status_parses_and_round_trips() {
        let status: LLMClientStatus = serde_yaml_ng::from_str(
            r#"
observedGeneration: 2
routes: 2
requestsPerMinute: 40
usage:
  today:     { since: "2026-01-02T00:00:00Z", requests: 1200, inputTokens: 800000, outputTokens: 90000, tokens: 890000, usd: "3.10" }
  thisMonth: { since: "2026-01-01T00:00:00Z", requests: 31000, inputTokens: 20100000, outputTokens: 2300000, tokens: 22400000, usd: "79.55" }
budgetUsedPercent: 40
throttled: { rateLimited: 12, budgetExhausted: 0 }
lastRequestAt: "2026-01-02T03:04:05Z"
"#,
        )
        .expect("status parses");
        let usage = status.usage.as_ref().expect("usage");
        assert_eq!(
            usage.this_month.as_ref().map(|m| m.usd.as_str()),
            Some("79.55")
        );
        assert_eq!(status.throttled.as_ref().map(|t| t.rate_limited), Some(12));
        let back: LLMClientStatus =
            serde_json::from_value(serde_json::to_value(&status).expect("to json"))
                .expect("from json");
        assert_eq!(back, status);
    }
}

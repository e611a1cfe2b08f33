//! The CRD's CEL rules, evaluated client-side by kube's CEL engine, agree with
//! `compile` on the cross-field rules: each case is refused by both or by neither.
//! Also proves every rule parses and type-checks against the generated schema.

use kube::core::cel::validate_cel;

use crate::compile::{Inputs, compile};
use crate::{LLMClient, LLMRoute, ProviderCredential};

const ROUTE: &str = r#"
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: { name: smart, namespace: team-a }
spec:
  models: [smart, smart-latest]
  targets:
    - credentialRef: { name: openai-prod }
      timeout: 20s
      retry: { attempts: 3, initialBackoff: 100ms, maxBackoff: 1m30s }
    - credentialRef: { name: anthropic-prod }
  fallback: { onFailures: [status5xx, authError], maxRetryAfter: 30s }
  circuitBreaker: { openFor: 30s }
  timeout: 60s
"#;

const CREDENTIAL: &str = r#"
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: NAME, namespace: team-a }
spec:
  provider: openai
  secretRef: { name: key, key: apiKey }
"#;

const CLIENT: &str = r#"
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: { name: checkout, namespace: team-a }
spec:
  keySecretRef: { name: checkout-llm, key: apiKey }
  routes: [smart, team-b/shared]
  limits: { requestsPerMinute: 600 }
  budget: { tokensPerDay: 5000000, usdPerMonth: "200.00" }
"#;

fn credentials() -> Vec<ProviderCredential> {
    ["openai-prod", "anthropic-prod"]
        .into_iter()
        .map(|name| {
            serde_yaml_ng::from_str(&CREDENTIAL.replace("NAME", name)).expect("credential parses")
        })
        .collect()
}

/// (CEL accepts, compile accepts) for the route after `change`.
fn route_verdicts(change: impl FnOnce(&mut serde_yaml_ng::Value)) -> (bool, bool) {
    let mut value: serde_yaml_ng::Value = serde_yaml_ng::from_str(ROUTE).expect("route is YAML");
    change(&mut value["spec"]);
    let route: LLMRoute = serde_yaml_ng::from_value(value).expect("route parses");
    let cel = validate_cel(&route);
    let compiled = compile(&Inputs {
        routes: std::slice::from_ref(&route),
        credentials: &credentials(),
        ..Default::default()
    });
    (cel.is_ok(), compiled.config.routes.len() == 1)
}

fn credential_verdicts(change: impl FnOnce(&mut serde_yaml_ng::Value)) -> (bool, bool) {
    let mut value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&CREDENTIAL.replace("NAME", "c")).expect("credential is YAML");
    change(&mut value["spec"]);
    let credential: ProviderCredential =
        serde_yaml_ng::from_value(value).expect("credential parses");
    let cel = validate_cel(&credential);
    let compiled = compile(&Inputs {
        routes: &[],
        credentials: std::slice::from_ref(&credential),
        ..Default::default()
    });
    (cel.is_ok(), compiled.config.credentials.len() == 1)
}

fn client_verdicts(change: impl FnOnce(&mut serde_yaml_ng::Value)) -> (bool, bool) {
    let mut value: serde_yaml_ng::Value = serde_yaml_ng::from_str(CLIENT).expect("client is YAML");
    change(&mut value["spec"]);
    let client: LLMClient = serde_yaml_ng::from_value(value).expect("client parses");
    let cel = validate_cel(&client);
    let compiled = compile(&Inputs {
        clients: std::slice::from_ref(&client),
        ..Default::default()
    });
    (cel.is_ok(), compiled.config.clients.len() == 1)
}

/// A named change to a spec and whether the result must be accepted.
type Case = (
    &'static str,
    Box<dyn FnOnce(&mut serde_yaml_ng::Value)>,
    bool,
);

fn set(spec: &mut serde_yaml_ng::Value, path: &[&str], yaml: &str) {
    let mut node = spec;
    for key in path {
        node = &mut node[*key];
    }
    *node = serde_yaml_ng::from_str(yaml).expect("replacement is YAML");
}

#[test]
fn the_sample_passes_both() {
    assert_eq!(route_verdicts(|_| {}), (true, true));
    assert_eq!(credential_verdicts(|_| {}), (true, true));
    assert_eq!(client_verdicts(|_| {}), (true, true));
}

#[test]
fn route_rules_agree() {
    let cases: Vec<Case> = vec![
        (
            "maxBackoff below initialBackoff",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}, retry: {initialBackoff: 1s, maxBackoff: 500ms}}, {credentialRef: {name: anthropic-prod}}]",
                )
            }),
            false,
        ),
        (
            "initialBackoff above the default maxBackoff",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}, retry: {initialBackoff: 5s}}, {credentialRef: {name: anthropic-prod}}]",
                )
            }),
            false,
        ),
        (
            "maxBackoff below the default initialBackoff",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}, retry: {maxBackoff: 50ms}}, {credentialRef: {name: anthropic-prod}}]",
                )
            }),
            false,
        ),
        (
            "equal backoffs",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}, retry: {initialBackoff: 1m, maxBackoff: 60s}}, {credentialRef: {name: anthropic-prod}}]",
                )
            }),
            true,
        ),
        (
            "duplicate model",
            Box::new(|s| set(s, &["models"], "[a, b, a]")),
            false,
        ),
        (
            "authError with one credential",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}}, {credentialRef: {name: openai-prod}}]",
                )
            }),
            false,
        ),
        (
            "authError with a single target",
            Box::new(|s| set(s, &["targets"], "[{credentialRef: {name: openai-prod}}]")),
            false,
        ),
        (
            "one credential without authError",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}}, {credentialRef: {name: openai-prod}}]",
                );
                set(s, &["fallback", "onFailures"], "[status5xx]");
            }),
            true,
        ),
        (
            "zero route timeout",
            Box::new(|s| set(s, &["timeout"], "0s")),
            false,
        ),
        (
            "zero openFor",
            Box::new(|s| set(s, &["circuitBreaker", "openFor"], "0ms")),
            false,
        ),
        (
            "zero maxRetryAfter is allowed",
            Box::new(|s| set(s, &["fallback", "maxRetryAfter"], "0s")),
            true,
        ),
        (
            "sharedWith two namespaces",
            Box::new(|s| set(s, &["sharedWith"], "[team-b, team-c]")),
            true,
        ),
        (
            "sharedWith every namespace",
            Box::new(|s| set(s, &["sharedWith"], "['*']")),
            true,
        ),
        (
            "sharedWith a namespace twice",
            Box::new(|s| set(s, &["sharedWith"], "[team-b, team-c, team-b]")),
            false,
        ),
        (
            "sharedWith every namespace and one more",
            Box::new(|s| set(s, &["sharedWith"], "[team-b, '*']")),
            false,
        ),
        (
            "modelMap covering every model",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}, modelMap: {smart: gpt-4o, smart-latest: gpt-4o-mini}}, {credentialRef: {name: anthropic-prod}}]",
                )
            }),
            true,
        ),
        (
            "modelMap and model",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}, model: gpt-4o, modelMap: {smart: gpt-4o, smart-latest: gpt-4o-mini}}, {credentialRef: {name: anthropic-prod}}]",
                )
            }),
            false,
        ),
        (
            "modelMap missing a model",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}}, {credentialRef: {name: anthropic-prod}, modelMap: {smart: claude-sonnet-4-5}}]",
                )
            }),
            false,
        ),
        (
            "modelMap with a name the route does not serve",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}, modelMap: {smart: a, smart-latest: b, smrt: c}}, {credentialRef: {name: anthropic-prod}}]",
                )
            }),
            false,
        ),
        (
            "stream with every field",
            Box::new(|s| {
                set(
                    s,
                    &["stream"],
                    "{idleTimeout: 20s, resume: {mode: Continue, maxResumes: 2, maxHeldBytes: 256Ki}}",
                )
            }),
            true,
        ),
        (
            "maxHeldBytes in bytes",
            Box::new(|s| {
                set(
                    s,
                    &["stream"],
                    "{resume: {mode: Continue, maxHeldBytes: 4096}}",
                )
            }),
            true,
        ),
        (
            "maxHeldBytes of 16Mi",
            Box::new(|s| {
                set(
                    s,
                    &["stream"],
                    "{resume: {mode: Continue, maxHeldBytes: 16Mi}}",
                )
            }),
            true,
        ),
        (
            "maxHeldBytes below 1Ki",
            Box::new(|s| {
                set(
                    s,
                    &["stream"],
                    "{resume: {mode: Continue, maxHeldBytes: 1000}}",
                )
            }),
            false,
        ),
        (
            "maxHeldBytes above 16Mi, as a quantity",
            Box::new(|s| {
                set(
                    s,
                    &["stream"],
                    "{resume: {mode: Continue, maxHeldBytes: 17Mi}}",
                )
            }),
            false,
        ),
        (
            "maxHeldBytes above 16Mi, in bytes",
            Box::new(|s| {
                set(
                    s,
                    &["stream"],
                    "{resume: {mode: Continue, maxHeldBytes: 16777217}}",
                )
            }),
            false,
        ),
        (
            "zero idleTimeout",
            Box::new(|s| set(s, &["stream"], "{idleTimeout: 0s}")),
            false,
        ),
        (
            "idleTimeout above 10m",
            Box::new(|s| set(s, &["stream"], "{idleTimeout: 10m1s}")),
            false,
        ),
        (
            "idleTimeout of 10m",
            Box::new(|s| set(s, &["stream"], "{idleTimeout: 10m}")),
            true,
        ),
        (
            "hedge",
            Box::new(|s| set(s, &["hedge"], "{after: 1500ms, maxPercent: 10}")),
            true,
        ),
        (
            "zero hedge after",
            Box::new(|s| set(s, &["hedge"], "{after: 0s}")),
            false,
        ),
        (
            "rampUp",
            Box::new(|s| set(s, &["circuitBreaker", "rampUp"], "30s")),
            true,
        ),
        (
            "zero rampUp",
            Box::new(|s| set(s, &["circuitBreaker", "rampUp"], "0s")),
            false,
        ),
        (
            "rampUp above an hour",
            Box::new(|s| set(s, &["circuitBreaker", "rampUp"], "1h1s")),
            false,
        ),
        (
            "contentFilter in onFailures",
            Box::new(|s| set(s, &["fallback", "onFailures"], "[status5xx, contentFilter]")),
            true,
        ),
        (
            "probing off",
            Box::new(|s| set(s, &["circuitBreaker", "probeInterval"], "0s")),
            true,
        ),
        (
            "probeInterval of a second",
            Box::new(|s| set(s, &["circuitBreaker", "probeInterval"], "1s")),
            true,
        ),
        (
            "probeInterval under a second",
            Box::new(|s| set(s, &["circuitBreaker", "probeInterval"], "500ms")),
            false,
        ),
        (
            "probeInterval above an hour",
            Box::new(|s| set(s, &["circuitBreaker", "probeInterval"], "61m")),
            false,
        ),
        (
            "a health check",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}, healthCheck: {interval: 30s}}, {credentialRef: {name: anthropic-prod}}]",
                )
            }),
            true,
        ),
        (
            "a health check under a second",
            Box::new(|s| {
                set(
                    s,
                    &["targets"],
                    "[{credentialRef: {name: openai-prod}, healthCheck: {interval: 999ms}}, {credentialRef: {name: anthropic-prod}}]",
                )
            }),
            false,
        ),
    ];
    for (name, change, accepted) in cases {
        assert_eq!(route_verdicts(change), (accepted, accepted), "{name}");
    }
}

#[test]
fn credential_rules_agree() {
    let cases: Vec<Case> = vec![
        (
            "openai-compatible without baseURL",
            Box::new(|s| set(s, &["provider"], "openai-compatible")),
            false,
        ),
        (
            "openai-compatible with baseURL",
            Box::new(|s| {
                set(s, &["provider"], "openai-compatible");
                set(s, &["baseURL"], "https://llm.example.com/v1");
            }),
            true,
        ),
        (
            "azure-openai without baseURL",
            Box::new(|s| set(s, &["provider"], "azure-openai")),
            false,
        ),
        (
            "azure-openai with baseURL",
            Box::new(|s| {
                set(s, &["provider"], "azure-openai");
                set(s, &["baseURL"], "https://contoso.openai.azure.com/openai");
            }),
            true,
        ),
        (
            "azure-openai with a dated apiVersion",
            Box::new(|s| {
                set(s, &["provider"], "azure-openai");
                set(s, &["baseURL"], "https://contoso.openai.azure.com/openai");
                set(s, &["apiVersion"], "'2024-10-21'");
            }),
            true,
        ),
        (
            "openai-compatible declaring the Responses API",
            Box::new(|s| {
                set(s, &["provider"], "openai-compatible");
                set(s, &["baseURL"], "https://llm.example.com/v1");
                set(s, &["responsesAPI"], "true");
            }),
            true,
        ),
        (
            "responsesAPI on openai",
            Box::new(|s| set(s, &["responsesAPI"], "true")),
            false,
        ),
        (
            "gemini without baseURL (the default)",
            Box::new(|s| set(s, &["provider"], "gemini")),
            true,
        ),
        (
            "apiVersion on gemini",
            Box::new(|s| {
                set(s, &["provider"], "gemini");
                set(s, &["apiVersion"], "v1");
            }),
            false,
        ),
        (
            "vertex with project and location",
            Box::new(|s| {
                set(s, &["provider"], "vertex");
                set(s, &["project"], "my-project");
                set(s, &["location"], "us-east5");
            }),
            true,
        ),
        (
            "vertex reading the whole Secret (serviceAccount.json)",
            Box::new(|s| {
                set(s, &["provider"], "vertex");
                set(s, &["project"], "my-project");
                set(s, &["location"], "us-east5");
                s["secretRef"].as_mapping_mut().unwrap().remove("key");
            }),
            true,
        ),
        (
            "vertex without location",
            Box::new(|s| {
                set(s, &["provider"], "vertex");
                set(s, &["project"], "my-project");
            }),
            false,
        ),
        (
            "vertex without project",
            Box::new(|s| {
                set(s, &["provider"], "vertex");
                set(s, &["location"], "global");
            }),
            false,
        ),
        (
            "project on openai",
            Box::new(|s| set(s, &["project"], "my-project")),
            false,
        ),
        (
            "location on gemini",
            Box::new(|s| {
                set(s, &["provider"], "gemini");
                set(s, &["location"], "us-east5");
            }),
            false,
        ),
        (
            "bedrock with a region, whole Secret",
            Box::new(|s| {
                set(s, &["provider"], "bedrock");
                set(s, &["region"], "us-east-1");
                s["secretRef"].as_mapping_mut().unwrap().remove("key");
            }),
            true,
        ),
        (
            "bedrock without a region",
            Box::new(|s| {
                set(s, &["provider"], "bedrock");
                s["secretRef"].as_mapping_mut().unwrap().remove("key");
            }),
            false,
        ),
        (
            "bedrock naming a Secret key",
            Box::new(|s| {
                set(s, &["provider"], "bedrock");
                set(s, &["region"], "us-east-1");
            }),
            false,
        ),
        (
            "region on openai",
            Box::new(|s| set(s, &["region"], "us-east-1")),
            false,
        ),
        (
            "openai without a Secret key",
            Box::new(|s| {
                s["secretRef"].as_mapping_mut().unwrap().remove("key");
            }),
            false,
        ),
        (
            "region on vertex",
            Box::new(|s| {
                set(s, &["provider"], "vertex");
                set(s, &["project"], "my-project");
                set(s, &["location"], "us-east5");
                set(s, &["region"], "us-east-1");
            }),
            false,
        ),
        (
            "project and location on bedrock",
            Box::new(|s| {
                set(s, &["provider"], "bedrock");
                set(s, &["region"], "us-east-1");
                set(s, &["project"], "my-project");
                set(s, &["location"], "us-east5");
                s["secretRef"].as_mapping_mut().unwrap().remove("key");
            }),
            false,
        ),
        (
            "apiVersion on openai",
            Box::new(|s| set(s, &["apiVersion"], "v1")),
            false,
        ),
        (
            "openai-compatible declaring prefill",
            Box::new(|s| {
                set(s, &["provider"], "openai-compatible");
                set(s, &["baseURL"], "https://llm.example.com/v1");
                set(s, &["prefill"], "true");
            }),
            true,
        ),
        (
            "prefill on anthropic",
            Box::new(|s| {
                set(s, &["provider"], "anthropic");
                set(s, &["prefill"], "true");
            }),
            false,
        ),
        (
            "prefill false on openai",
            Box::new(|s| set(s, &["prefill"], "false")),
            false,
        ),
        (
            "maxQueue without maxConcurrency",
            Box::new(|s| set(s, &["maxQueue"], "10")),
            false,
        ),
        (
            "maxQueue with maxConcurrency",
            Box::new(|s| {
                set(s, &["maxQueue"], "10");
                set(s, &["maxConcurrency"], "4");
            }),
            true,
        ),
        (
            "a key pool",
            Box::new(|s| set(s, &["secretRef"], "{name: key, keys: [a, b]}")),
            true,
        ),
        (
            "a key pool and a key",
            Box::new(|s| set(s, &["secretRef"], "{name: key, key: apiKey, keys: [a, b]}")),
            false,
        ),
        (
            "neither a key nor a pool",
            Box::new(|s| set(s, &["secretRef"], "{name: key}")),
            false,
        ),
        (
            "a key named twice in a pool",
            Box::new(|s| set(s, &["secretRef"], "{name: key, keys: [a, b, a]}")),
            false,
        ),
        (
            "a key pool on vertex",
            Box::new(|s| {
                set(s, &["provider"], "vertex");
                set(s, &["project"], "my-project");
                set(s, &["location"], "us-east5");
                set(s, &["secretRef"], "{name: key, keys: [a, b]}");
            }),
            false,
        ),
        (
            "a key pool on bedrock",
            Box::new(|s| {
                set(s, &["provider"], "bedrock");
                set(s, &["region"], "us-east-1");
                set(s, &["secretRef"], "{name: key, keys: [a]}");
            }),
            false,
        ),
        (
            "keyRejectedFor",
            Box::new(|s| set(s, &["keyRejectedFor"], "10m")),
            true,
        ),
        (
            "keyRejectedFor under a second",
            Box::new(|s| set(s, &["keyRejectedFor"], "500ms")),
            false,
        ),
    ];
    // Static headers that may carry a key are refused by name, any case
    // (docs/security.md#keys-stay-in-secrets).
    let headers: Vec<Case> = [
        ("{OpenAI-Organization: org-1, OpenAI-Project: p}", true),
        (
            "{anthropic-beta: tools, x-goog-user-project: p, X-Title: t}",
            true,
        ),
        ("{x-goog-api-key: k}", false),
        ("{X-Goog-Api-Key: k}", false),
        ("{Authorization: Bearer k}", false),
        ("{proxy-authorization: k}", false),
        ("{Cookie: s=1}", false),
        ("{api-key: k}", false),
        ("{X-API-KEY: k}", false),
        ("{X-Amz-Security-Token: t}", false),
        ("{Ocp-Apim-Subscription-Key: k}", false),
        ("{x-client-secret: s, OpenAI-Project: p}", false),
        ("{openai_api_key: k}", false),
        ("{X-Password: p}", false),
    ]
    .into_iter()
    .map(|(yaml, accepted)| -> Case {
        (
            yaml,
            Box::new(move |s| set(s, &["headers"], yaml)),
            accepted,
        )
    })
    .collect();
    let cases = cases.into_iter().chain(headers);
    for (name, change, accepted) in cases {
        assert_eq!(credential_verdicts(change), (accepted, accepted), "{name}");
    }
}

#[test]
fn client_rules_agree() {
    let cases: Vec<Case> = vec![
        (
            "a route listed twice",
            Box::new(|s| set(s, &["routes"], "[smart, team-b/shared, smart]")),
            false,
        ),
        (
            "zero USD budget",
            Box::new(|s| set(s, &["budget", "usdPerMonth"], "'0.00'")),
            false,
        ),
        (
            "zero USD budget, no fraction",
            Box::new(|s| set(s, &["budget", "usdPerMonth"], "'0'")),
            false,
        ),
        (
            "one cent",
            Box::new(|s| set(s, &["budget", "usdPerMonth"], "'0.01'")),
            true,
        ),
        (
            "a whole number of dollars",
            Box::new(|s| set(s, &["budget", "usdPerMonth"], "'10'")),
            true,
        ),
        (
            "a default reservation within the day's tokens",
            Box::new(|s| set(s, &["budget", "defaultReservation"], "4000")),
            true,
        ),
        (
            "a default reservation over the day's tokens",
            Box::new(|s| {
                set(
                    s,
                    &["budget"],
                    "{ tokensPerDay: 500, defaultReservation: 600 }",
                )
            }),
            false,
        ),
        (
            "a default reservation with a cost budget only",
            Box::new(|s| {
                set(
                    s,
                    &["budget"],
                    "{ usdPerMonth: '10', defaultReservation: 900000 }",
                )
            }),
            true,
        ),
        (
            "no budget at all",
            Box::new(|s| {
                if let Some(spec) = s.as_mapping_mut() {
                    spec.remove("budget");
                }
            }),
            true,
        ),
    ];
    for (name, change, accepted) in cases {
        assert_eq!(client_verdicts(change), (accepted, accepted), "{name}");
    }
}

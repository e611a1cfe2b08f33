//! The generated CRD YAML: what `switchback-operator crds` prints and what the checked-in
//! `crds/*.yaml` files hold. A test fails when the checked-in files are stale.

use std::path::Path;

use kube::CustomResourceExt;

use crate::{LLMClient, LLMRoute, ProviderCredential};

/// The command that rewrites the checked-in files, quoted by the staleness test.
pub const REGENERATE: &str = "cargo run -p switchback-operator -- crds --write crds/";

/// One CRD per file, named `<plural>.<group>.yaml`, in alphabetical order.
pub fn crd_files() -> Vec<(String, String)> {
    vec![
        (
            format!("{}.yaml", LLMClient::crd_name()),
            document(&LLMClient::crd()),
        ),
        (
            format!("{}.yaml", LLMRoute::crd_name()),
            document(&LLMRoute::crd()),
        ),
        (
            format!("{}.yaml", ProviderCredential::crd_name()),
            document(&ProviderCredential::crd()),
        ),
    ]
}

/// Every CRD as one multi-document YAML stream: the exact concatenation of the
/// checked-in files.
pub fn crd_yaml() -> String {
    crd_files().into_iter().map(|(_, yaml)| yaml).collect()
}

/// Writes every CRD file into `dir`, returning the paths written.
pub fn write_crd_files(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut written = Vec::new();
    for (name, yaml) in crd_files() {
        let path = dir.join(name);
        std::fs::write(&path, yaml)?;
        written.push(path);
    }
    Ok(written)
}

fn document<T: serde::Serialize>(crd: &T) -> String {
    // Serializing a CRD built from our own types cannot fail: it is plain data with
    // string keys. A failure is a programming error caught by the tests.
    let body = serde_yaml_ng::to_string(crd).expect("a CRD serializes to YAML");
    format!("---\n{}", quote_yaml11_booleans(&body))
}

/// The scalars YAML 1.1 reads as booleans (kubectl and most GitOps tools read YAML
/// 1.1); the YAML 1.2 writer leaves them plain.
const YAML11_BOOLEANS: [&str; 22] = [
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
    "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF",
];

/// Quotes every plain string value (`key: Off`, `- Off`) that a YAML 1.1 reader would
/// take for a boolean, such as the resume mode `Off`. The writer emits real booleans
/// as `true`/`false` only, and the schema's booleans are never enum strings, so only
/// string values are touched: `true` and `false` are left alone.
fn quote_yaml11_booleans(yaml: &str) -> String {
    let mut out = String::with_capacity(yaml.len());
    // The indentation of the key whose block scalar (`|-`) the lines belong to.
    let mut block: Option<usize> = None;
    for line in yaml.split_inclusive('\n') {
        let text = line.trim_end_matches('\n');
        let indent = text.len() - text.trim_start().len();
        if let Some(key_indent) = block {
            if text.trim().is_empty() || indent > key_indent {
                out.push_str(line);
                continue;
            }
            block = None;
        }
        if text.ends_with(": |-") || text.ends_with(": |") || text.ends_with(": >-") {
            block = Some(indent);
        }
        let value_at = match text.trim_start().strip_prefix("- ") {
            Some(item) if !item.contains(": ") => Some(indent + 2),
            _ => text.find(": ").map(|i| i + 2),
        };
        match value_at {
            Some(at)
                if YAML11_BOOLEANS.contains(&&text[at..])
                    && !matches!(&text[at..], "true" | "false") =>
            {
                out.push_str(&text[..at]);
                out.push('\'');
                out.push_str(&text[at..]);
                out.push('\'');
                out.push_str(&line[text.len()..]);
            }
            _ => out.push_str(line),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn checked_in_files_are_current() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        for (name, expected) in crd_files() {
            let path = dir.join(&name);
            let actual = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                actual == expected,
                "crds/{name} is stale or missing: the Rust types generate a different CRD.\n\
                 Regenerate from the workspace root with:\n\n    {REGENERATE}\n"
            );
        }
    }

    /// kubectl reads YAML 1.1: a plain `Off` is the boolean false there, which the
    /// API server refuses as an enum value of a string field.
    #[test]
    fn no_string_value_reads_as_a_boolean_in_yaml_1_1() {
        for (name, yaml) in crd_files() {
            let mut block: Option<usize> = None;
            for line in yaml.lines() {
                let indent = line.len() - line.trim_start().len();
                if let Some(key) = block {
                    if line.trim().is_empty() || indent > key {
                        continue;
                    }
                    block = None;
                }
                if line.ends_with(": |-") {
                    block = Some(indent);
                }
                let value = line
                    .rsplit_once(": ")
                    .map(|(_, v)| v)
                    .or_else(|| line.trim_start().strip_prefix("- "));
                if let Some(v) = value {
                    assert!(
                        !YAML11_BOOLEANS.contains(&v) || matches!(v, "true" | "false"),
                        "{name}: {line}"
                    );
                }
            }
            assert!(
                yaml.contains("- 'Off'") || !name.starts_with("llmroutes"),
                "{name}"
            );
        }
        assert_eq!(
            quote_yaml11_booleans(
                "a:\n  - Off\n  - Continue\n  x: On\n  y: true\n  d: |-\n    z: no\n    - Off\n  e: no\n"
            ),
            "a:\n  - 'Off'\n  - Continue\n  x: 'On'\n  y: true\n  d: |-\n    z: no\n    - Off\n  e: 'no'\n"
        );
    }

    #[test]
    fn crd_yaml_is_the_files_in_order() {
        let files = crd_files();
        let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "llmclients.switchback.dev.yaml",
                "llmroutes.switchback.dev.yaml",
                "providercredentials.switchback.dev.yaml"
            ]
        );
        assert_eq!(
            crd_yaml(),
            format!("{}{}{}", files[0].1, files[1].1, files[2].1)
        );
        for (_, yaml) in &files {
            assert!(yaml.starts_with("---\n"));
            assert_eq!(yaml.matches("\n---\n").count(), 0, "one document per file");
        }
    }

    fn crd<T: CustomResourceExt>() -> Value {
        serde_json::to_value(T::crd()).expect("CRD is JSON")
    }

    fn spec_schema(crd: &Value) -> &Value {
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    }

    fn rules(schema: &Value) -> Vec<&str> {
        schema["x-kubernetes-validations"]
            .as_array()
            .map(|rules| rules.iter().filter_map(|r| r["rule"].as_str()).collect())
            .unwrap_or_default()
    }

    fn columns(crd: &Value) -> Vec<(String, String)> {
        crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .expect("printer columns")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap_or_default().to_uppercase(),
                    c["jsonPath"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    fn range(schema: &Value) -> (Value, Value) {
        (schema["minimum"].clone(), schema["maximum"].clone())
    }

    const DURATION: &str = "^([0-9]{1,5}(h|m|s|ms)){1,4}$";

    #[test]
    fn llmroute_schema() {
        let crd = crd::<LLMRoute>();
        assert_eq!(crd["metadata"]["name"], "llmroutes.switchback.dev");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["llmr"]));
        assert_eq!(crd["spec"]["versions"][0]["name"], "v1alpha1");
        assert_eq!(
            crd["spec"]["versions"][0]["subresources"],
            json!({ "status": {} })
        );
        assert_eq!(
            columns(&crd),
            [
                ("MODE", ".spec.strategy.mode"),
                ("TARGETS", ".status.targetCount"),
                (
                    "PROGRAMMED",
                    ".status.conditions[?(@.type==\"Programmed\")].status"
                ),
                ("SERVING", ".status.serving"),
                ("OPEN", ".status.openCircuits"),
                ("REQUESTS", ".status.window.requests"),
                ("FALLBACKS", ".status.window.fallbacks"),
                ("AGE", ".metadata.creationTimestamp"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );

        let spec = spec_schema(&crd);
        assert_eq!(spec["required"], json!(["targets"]));
        let p = &spec["properties"];
        assert_eq!(
            (&p["targets"]["minItems"], &p["targets"]["maxItems"]),
            (&json!(1), &json!(8))
        );
        assert_eq!(p["models"]["maxItems"], json!(32));
        assert_eq!(
            rules(&p["models"]),
            ["self.all(m, self.exists_one(n, n == m))"]
        );
        assert_eq!(
            p["strategy"]["properties"]["mode"]["enum"],
            json!(["fallback", "loadbalance", "least-latency", "cost-optimized"])
        );
        assert_eq!(p["timeout"]["pattern"], DURATION);
        assert_eq!(rules(&p["timeout"]), ["duration(self) > duration('0s')"]);

        let target = &p["targets"]["items"];
        assert_eq!(target["required"], json!(["credentialRef"]));
        let t = &target["properties"];
        assert_eq!(range(&t["weight"]), (json!(1.0), json!(100.0)));
        assert_eq!(t["timeout"]["pattern"], DURATION);
        assert_eq!(
            t["price"]["properties"]["inputPerMillion"]["pattern"],
            r"^[0-9]{1,9}(\.[0-9]{1,9})?$"
        );
        assert_eq!(
            t["price"]["required"],
            json!(["inputPerMillion", "outputPerMillion"])
        );
        let retry = &t["retry"];
        assert_eq!(
            range(&retry["properties"]["attempts"]),
            (json!(1.0), json!(5.0))
        );
        assert_eq!(
            range(&retry["properties"]["onStatusCodes"]["items"]),
            (json!(100.0), json!(599.0))
        );
        assert_eq!(retry["properties"]["initialBackoff"]["pattern"], DURATION);
        assert_eq!(retry["properties"]["maxBackoff"]["pattern"], DURATION);
        assert_eq!(
            rules(retry),
            [
                "duration(has(self.maxBackoff) ? self.maxBackoff : '2s') >= duration(has(self.initialBackoff) ? self.initialBackoff : '100ms')"
            ]
        );

        let fallback = &p["fallback"]["properties"];
        assert_eq!(
            fallback["onFailures"]["items"]["enum"],
            json!([
                "status5xx",
                "rateLimited",
                "timeout",
                "connectionError",
                "contextLength",
                "invalidResponse",
                "authError",
                "contentFilter"
            ])
        );
        assert_eq!(
            range(&fallback["onStatusCodes"]["items"]),
            (json!(100.0), json!(599.0))
        );
        assert_eq!(fallback["maxRetryAfter"]["pattern"], DURATION);
        let breaker = &p["circuitBreaker"]["properties"];
        assert_eq!(
            range(&breaker["consecutiveFailures"]),
            (json!(1.0), json!(1000.0))
        );
        assert_eq!(breaker["openFor"]["pattern"], DURATION);

        assert_eq!(
            rules(spec),
            [
                "!has(self.fallback) || !has(self.fallback.onFailures) || !('authError' in self.fallback.onFailures) || self.targets.exists(t, t.credentialRef.name != self.targets[0].credentialRef.name)",
                "!has(self.models) || self.targets.all(t, !has(t.modelMap) || (self.models.all(m, m in t.modelMap) && t.modelMap.all(k, k in self.models)))",
            ]
        );

        assert_eq!(breaker["rampUp"]["pattern"], DURATION);
        assert_eq!(
            rules(&breaker["rampUp"]),
            ["duration(self) > duration('0s') && duration(self) <= duration('1h')"]
        );
        let stream = &p["stream"]["properties"];
        assert_eq!(stream["idleTimeout"]["pattern"], DURATION);
        assert_eq!(
            rules(&stream["idleTimeout"]),
            ["duration(self) > duration('0s') && duration(self) <= duration('10m')"]
        );
        let resume = &stream["resume"]["properties"];
        assert_eq!(resume["mode"]["enum"], json!(["Off", "Continue"]));
        assert_eq!(resume["mode"]["default"], Value::Null, "absent is Off");
        assert_eq!(range(&resume["maxResumes"]), (json!(1.0), json!(5.0)));
        let held = &resume["maxHeldBytes"];
        assert_eq!(held["x-kubernetes-int-or-string"], true);
        assert_eq!(held["pattern"], "^[0-9]{1,9}(Ki|Mi)?$");
        assert_eq!(rules(held), [crate::schema::BYTE_SIZE_RANGE_RULE]);
        let hedge = &p["hedge"];
        assert_eq!(hedge["required"], json!(["after"]));
        assert_eq!(hedge["properties"]["after"]["pattern"], DURATION);
        assert_eq!(
            range(&hedge["properties"]["maxPercent"]),
            (json!(1.0), json!(100.0))
        );

        let shared_with = &p["sharedWith"];
        assert_eq!(shared_with["maxItems"], json!(64));
        assert_eq!(
            shared_with["items"]["pattern"],
            r"^(\*|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)$"
        );
        assert_eq!(
            rules(shared_with),
            [
                "self.all(m, self.exists_one(n, n == m))",
                "!('*' in self) || self.size() == 1"
            ]
        );

        let status =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
        assert_eq!(
            status["properties"]["conditions"]["x-kubernetes-list-type"],
            "map"
        );
        assert_eq!(
            status["properties"]["targets"]["items"]["properties"]["circuit"]["enum"],
            json!(["Closed", "Open", "HalfOpen"])
        );
    }

    #[test]
    fn llmclient_schema() {
        let crd = crd::<LLMClient>();
        assert_eq!(crd["metadata"]["name"], "llmclients.switchback.dev");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["llmc"]));
        assert_eq!(crd["spec"]["names"]["categories"], json!(["switchback"]));
        assert_eq!(crd["spec"]["versions"][0]["name"], "v1alpha1");
        assert_eq!(
            crd["spec"]["versions"][0]["subresources"],
            json!({ "status": {} })
        );
        assert_eq!(
            columns(&crd),
            [
                ("ROUTES", ".status.routes"),
                ("RPM", ".status.requestsPerMinute"),
                ("TOKENS TODAY", ".status.usage.today.tokens"),
                ("USD MONTH", ".status.usage.thisMonth.usd"),
                ("BUDGET", ".status.budgetUsedPercent"),
                ("READY", ".status.conditions[?(@.type==\"Ready\")].status"),
                ("AGE", ".metadata.creationTimestamp"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );

        let spec = spec_schema(&crd);
        assert_eq!(spec["required"], json!(["keySecretRef"]));
        let p = &spec["properties"];
        // `key` is required by a CEL rule (the selector type is shared with bedrock
        // credentials, which take the whole Secret).
        assert_eq!(p["keySecretRef"]["required"], json!(["name"]));
        let routes = &p["routes"];
        assert_eq!(
            (&routes["minItems"], &routes["maxItems"]),
            (&json!(1), &json!(64))
        );
        assert_eq!(routes["items"]["maxLength"], json!(317));
        assert_eq!(rules(routes), ["self.all(m, self.exists_one(n, n == m))"]);
        let limits = &p["limits"]["properties"];
        assert_eq!(
            range(&limits["requestsPerMinute"]),
            (json!(1.0), json!(1_000_000.0))
        );
        assert_eq!(
            range(&limits["tokensPerMinute"]),
            (json!(1.0), json!(1_000_000_000.0))
        );
        assert_eq!(
            range(&limits["maxConcurrency"]),
            (json!(1.0), json!(100_000.0))
        );
        let budget = &p["budget"]["properties"];
        assert_eq!(
            range(&budget["tokensPerDay"]),
            (json!(1.0), json!(1_000_000_000_000.0))
        );
        assert_eq!(budget["tokensPerDay"]["format"], "int64");
        assert_eq!(
            budget["usdPerMonth"]["pattern"],
            r"^[0-9]{1,9}(\.[0-9]{1,9})?$"
        );
        assert_eq!(rules(&budget["usdPerMonth"]), ["self.matches('[1-9]')"]);

        let status =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
        let s = &status["properties"];
        assert_eq!(s["conditions"]["x-kubernetes-list-type"], "map");
        for period in ["today", "thisMonth"] {
            assert_eq!(
                s["usage"]["properties"][period]["required"],
                json!(["inputTokens", "outputTokens", "requests", "tokens", "usd"]),
                "{period}"
            );
        }
        assert_eq!(
            s["throttled"]["required"],
            json!(["budgetExhausted", "rateLimited"])
        );
        assert_eq!(s["lastRequestAt"]["format"], "date-time");
    }

    #[test]
    fn provider_credential_schema() {
        let crd = crd::<ProviderCredential>();
        assert_eq!(
            crd["metadata"]["name"],
            "providercredentials.switchback.dev"
        );
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["pcred"]));
        assert_eq!(
            crd["spec"]["versions"][0]["subresources"],
            json!({ "status": {} })
        );
        assert_eq!(
            columns(&crd),
            [
                ("PROVIDER", ".spec.provider"),
                ("SECRET", ".spec.secretRef.name"),
                ("KEYS", ".status.usableKeys"),
                ("READY", ".status.conditions[?(@.type==\"Ready\")].status"),
                ("ROUTES", ".status.routes"),
                ("AGE", ".metadata.creationTimestamp"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        let spec = spec_schema(&crd);
        assert_eq!(spec["required"], json!(["provider", "secretRef"]));
        let p = &spec["properties"];
        assert_eq!(
            p["provider"]["enum"],
            json!([
                "openai",
                "anthropic",
                "openai-compatible",
                "azure-openai",
                "gemini",
                "vertex",
                "bedrock"
            ])
        );
        assert_eq!(
            p["apiVersion"]["pattern"],
            crate::schema::API_VERSION_PATTERN
        );
        assert_eq!(p["baseURL"]["pattern"], "^https?://");
        // `key` is required by a CEL rule, except for bedrock (the whole Secret).
        assert_eq!(p["secretRef"]["required"], json!(["name"]));
        assert_eq!(p["region"]["pattern"], "^[a-z]{2}(-[a-z]+)+-[0-9]+$");
        assert_eq!(p["maxConcurrency"]["minimum"], json!(1.0));
        assert_eq!(p["maxQueue"]["minimum"], json!(0.0));
        assert_eq!(p["headers"]["maxProperties"], json!(32));
        assert_eq!(p["allowPrivateNetwork"]["type"], "boolean");
        assert_eq!(p["responsesAPI"]["type"], "boolean");
        assert_eq!(p["prefill"]["type"], "boolean");
        assert_eq!(p["project"]["pattern"], "^[a-z][a-z0-9-]{4,28}[a-z0-9]$");
        assert_eq!(p["location"]["pattern"], "^[a-z][a-z0-9-]{0,62}$");
        assert_eq!(
            rules(spec),
            [
                "self.provider != 'openai-compatible' || has(self.baseURL)",
                "self.provider != 'azure-openai' || has(self.baseURL)",
                "!has(self.apiVersion) || self.provider == 'azure-openai'",
                "!has(self.responsesAPI) || self.provider == 'openai-compatible'",
                "!has(self.prefill) || self.provider == 'openai-compatible'",
                "self.provider != 'vertex' || has(self.project)",
                "self.provider != 'vertex' || has(self.location)",
                "!has(self.project) || self.provider == 'vertex'",
                "!has(self.location) || self.provider == 'vertex'",
                "!has(self.maxQueue) || has(self.maxConcurrency)",
                "self.provider != 'bedrock' || has(self.region)",
                "!has(self.region) || self.provider == 'bedrock'",
                "self.provider in ['bedrock', 'vertex'] || has(self.secretRef.key) || has(self.secretRef.keys)",
                "!has(self.secretRef.key) || !has(self.secretRef.keys)",
                "!has(self.secretRef.keys) || !(self.provider in ['bedrock', 'vertex'])",
                "self.provider != 'bedrock' || !has(self.secretRef.key)",
            ]
        );
        // A key pool: 1 to 32 Secret data key names, unique (docs/request-lifecycle.md#key-pools).
        let keys = &p["secretRef"]["properties"]["keys"];
        assert_eq!(
            (keys["minItems"].clone(), keys["maxItems"].clone()),
            (json!(1), json!(32))
        );
        assert_eq!(keys["items"]["pattern"], crate::schema::SECRET_KEY_PATTERN);
        assert_eq!(
            keys["x-kubernetes-validations"][0]["rule"],
            "self.all(k, self.exists_one(n, n == k))"
        );
        assert_eq!(
            p["keyRejectedFor"]["pattern"],
            crate::schema::DURATION_PATTERN
        );
    }

    #[test]
    fn every_spec_field_has_a_description() {
        fn walk(path: &str, schema: &Value, missing: &mut Vec<String>) {
            if let Some(properties) = schema["properties"].as_object() {
                for (name, property) in properties {
                    let path = format!("{path}.{name}");
                    if property["description"].as_str().is_none_or(str::is_empty) {
                        missing.push(path.clone());
                    }
                    walk(&path, property, missing);
                }
            }
            if schema["items"].is_object() {
                walk(&format!("{path}[]"), &schema["items"], missing);
            }
        }
        let mut missing = Vec::new();
        walk(
            "llmroute.spec",
            spec_schema(&crd::<LLMRoute>()),
            &mut missing,
        );
        walk(
            "providercredential.spec",
            spec_schema(&crd::<ProviderCredential>()),
            &mut missing,
        );
        walk(
            "llmclient.spec",
            spec_schema(&crd::<LLMClient>()),
            &mut missing,
        );
        assert_eq!(missing, Vec::<String>::new());
    }
}

//! The Helm chart (charts/switchback), checked with a real Helm where one is installed
//! (`helm` on PATH, or `SWITCHBACK_HELM`; `.ci/chart` fetches Helm 4 and `.ci/run`
//! exports it), and statically otherwise:
//!
//! - its CRDs are the generated ones, byte for byte;
//! - every value a template reads is in values.yaml, and values.yaml and
//!   values.schema.json declare the same keys;
//! - it is GitOps-stable: no template calls `lookup`, a random or a clock function,
//!   and two renders with the same values are the same bytes;
//! - the schema refuses a wrong enum, a string where a number belongs and a typo,
//!   naming the field;
//! - the operator's Secrets are the operator's to generate (flags, no mounts), the
//!   proxy mounts them as required volumes;
//! - RBAC: the exact rules of cluster mode and of namespaced mode (no cluster-wide
//!   grant to the operator there), the proxy's Role, the aggregated ClusterRoles;
//! - values reach their flags and fields; NOTES.txt renders; the helm test Pods render;
//! - egress (docs/security.md#where-the-proxies-connect): no namespace may reach private
//!   networks unless `egress.allowPrivateNetworkNamespaces` says so; the optional egress
//!   NetworkPolicy opens DNS, the API server and public addresses only;
//! - the alerts: each has a section in docs/runbooks.md, a `runbook_url` to it under
//!   `metrics.prometheusRule.runbookBaseURL`, and cases in tests/alerts/alerts.test.yaml
//!   where it fires and where it does not, which `promtool test rules` passes (with
//!   promtool: `SWITCHBACK_PROMTOOL`, on PATH, or the one `.ci/chart` fetches).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize;
use serde_yaml_ng::Value;

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/switchback")
}

// --- Static checks (no helm needed) ------------------------------------------------------

#[test]
fn chart_crds_are_the_generated_ones() {
    for (name, expected) in switchback_crds::crdgen::crd_files() {
        let path = chart().join("crds").join(&name);
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            actual == expected,
            "charts/switchback/crds/{name} differs from the generated CRD; regenerate with:\n\n    \
             cargo run -p switchback-operator -- crds --write charts/switchback/crds/\n"
        );
    }
}

/// Every file under templates/ (tests/ included), with its text.
fn templates() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }
    let mut out = Vec::new();
    walk(&chart().join("templates"), &mut out);
    assert!(out.len() > 10, "only {} template files found", out.len());
    out
}

fn values_yaml() -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap())
        .expect("values.yaml parses")
}

fn lookup<'a>(values: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(values, |v, key| v.get(key))
}

#[test]
fn every_value_a_template_reads_is_in_values_yaml() {
    let values = values_yaml();
    let mut checked = 0;
    for (path, text) in templates() {
        for (i, _) in text.match_indices(".Values.") {
            let rest = &text[i + ".Values.".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_'))
                .unwrap_or(rest.len());
            let key = rest[..end].trim_end_matches('.');
            assert!(
                lookup(&values, key).is_some(),
                "{}: .Values.{key} is not defined in values.yaml",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} value references found");
}

/// The schema of `node`, with a `$ref` to `#/definitions/NAME` resolved.
fn resolve<'a>(root: &'a serde_json::Value, node: &'a serde_json::Value) -> &'a serde_json::Value {
    match node.get("$ref").and_then(|r| r.as_str()) {
        Some(r) => {
            let name = r
                .strip_prefix("#/definitions/")
                .unwrap_or_else(|| panic!("unexpected $ref {r}"));
            resolve(root, &root["definitions"][name])
        }
        None => node,
    }
}

/// Walks values.yaml and the schema together: a key of values.yaml the schema does not
/// declare, or a required property values.yaml lacks (no default, no comment), is
/// reported.
fn compare_keys(
    root: &serde_json::Value,
    schema: &serde_json::Value,
    values: &Value,
    path: &str,
    problems: &mut Vec<String>,
) {
    let schema = resolve(root, schema);
    let Some(props) = schema.get("properties").and_then(|p| p.as_object()) else {
        return; // free-form (labels, affinity, ...): nothing declared to compare
    };
    let Some(map) = values.as_mapping() else {
        problems.push(format!(
            "{path}: the schema declares an object, values.yaml has {values:?}"
        ));
        return;
    };
    for (key, value) in map {
        let key = key.as_str().unwrap();
        match props.get(key) {
            Some(sub) => compare_keys(root, sub, value, &format!("{path}.{key}"), problems),
            None => problems.push(format!(
                "{path}.{key} is in values.yaml but not in values.schema.json"
            )),
        }
    }
    // Required keys must have a default (and so a comment) in values.yaml; optional
    // ones (a probe's fields, nullable values) need not.
    for key in schema["required"].as_array().into_iter().flatten() {
        let key = key.as_str().unwrap();
        if !map.contains_key(key) {
            problems.push(format!(
                "{path}.{key} is required by values.schema.json but not in values.yaml"
            ));
        }
    }
}

#[test]
fn values_yaml_and_the_schema_declare_the_same_keys() {
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart().join("values.schema.json")).unwrap())
            .expect("values.schema.json parses");
    assert_eq!(schema["additionalProperties"], serde_json::json!(false));
    let mut problems = Vec::new();
    compare_keys(&schema, &schema, &values_yaml(), "", &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Functions whose result is not a function of the values: a cluster read, random
/// values, the clock, keys and certificates, salts and IVs, and the release facts that
/// differ between an install and an upgrade. `rand*` covers randAlphaNum, randInt, ....
const UNSTABLE: &[&str] = &[
    "lookup",
    "now",
    "uuidv4",
    "shuffle",
    "genCA",
    "genCAWithKey",
    "genPrivateKey",
    "genSelfSignedCert",
    "genSelfSignedCertWithKey",
    "genSignedCert",
    "genSignedCertWithKey",
    "htpasswd",
    "bcrypt",
    "encryptAES",
    ".Release.Revision",
    ".Release.IsUpgrade",
    ".Release.IsInstall",
];

/// The non-deterministic calls in a template's actions (`{{ ... }}`), comments and
/// string literals left out.
fn unstable_calls(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let end = after.find("}}").unwrap_or(after.len());
        let action = &after[..end];
        rest = &after[end.min(after.len())..];
        if action
            .trim_start_matches('-')
            .trim_start()
            .starts_with("/*")
        {
            continue;
        }
        // Drop string literals ("..." and `...`).
        let mut code = String::new();
        let mut quote = None;
        let mut escaped = false;
        for c in action.chars() {
            match quote {
                Some(q) => {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' && q == '"' {
                        escaped = true;
                    } else if c == q {
                        quote = None;
                    }
                }
                None if c == '"' || c == '`' => quote = Some(c),
                None => code.push(c),
            }
        }
        for token in
            code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '$'))
        {
            if token.starts_with('$') || token.is_empty() {
                continue;
            }
            let bare = token.trim_end_matches('.');
            if UNSTABLE.contains(&bare) || (bare.starts_with("rand") && !bare.contains('.')) {
                found.push(bare.to_string());
            }
        }
    }
    found
}

#[test]
fn the_unstable_call_scanner_finds_what_it_must() {
    assert_eq!(
        unstable_calls("{{ randAlphaNum 64 | b64enc }}"),
        ["randAlphaNum"]
    );
    assert_eq!(
        unstable_calls("{{- $s := lookup \"v1\" \"Secret\" .Release.Namespace $n }}"),
        ["lookup"]
    );
    assert_eq!(unstable_calls("{{ now | date \"2006\" }}"), ["now"]);
    assert_eq!(
        unstable_calls("rev {{ .Release.Revision }}"),
        [".Release.Revision"]
    );
    assert_eq!(unstable_calls("{{ genCA \"x\" 365 }}"), ["genCA"]);
    // Words in text, strings, comments and variables are not calls.
    assert!(
        unstable_calls(
            "lookup now {{ \"randAlphaNum\" }} {{/* lookup */}} {{ $generated }} {{ .Values.x }}"
        )
        .is_empty()
    );
}

#[test]
fn no_template_calls_lookup_random_or_clock_functions() {
    for (path, text) in templates() {
        let found = unstable_calls(&text);
        assert!(
            found.is_empty(),
            "{}: {found:?}: a render must be a function of the values alone (GitOps tools \
             render with `helm template`, without a cluster, on every sync)",
            path.display()
        );
    }
}

// --- With helm ------------------------------------------------------------------------

struct Helm(String);

/// The helm binary, or None (the test then prints why it skipped).
fn helm() -> Option<Helm> {
    let bin = std::env::var("SWITCHBACK_HELM").unwrap_or_else(|_| "helm".into());
    match Command::new(&bin).arg("version").output() {
        Ok(out) if out.status.success() => Some(Helm(bin)),
        _ => {
            println!(
                "skipped: `{bin}` does not run (set SWITCHBACK_HELM to a helm binary; bash .ci/chart fetches one)"
            );
            None
        }
    }
}

const ALL_ON: &str = "ci/all-on-values.yaml";
const NAMESPACED: &[&str] = &["--set", "watchNamespaces={team-a,team-b}"];

impl Helm {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.0)
            .args(args)
            .current_dir(chart())
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    }

    /// `helm template sb . --namespace gw --include-crds ARGS`, which must succeed.
    fn template(&self, args: &[&str]) -> String {
        let mut all = vec!["template", "sb", ".", "--namespace", "gw", "--include-crds"];
        all.extend_from_slice(args);
        let out = self.run(&all);
        assert!(
            out.status.success(),
            "helm {all:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The stderr of a `helm template` that must fail.
    fn template_fails(&self, args: &[&str]) -> String {
        let mut all = vec!["template", "sb", ".", "--namespace", "gw"];
        all.extend_from_slice(args);
        let out = self.run(&all);
        assert!(!out.status.success(), "helm {all:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn objects(&self, args: &[&str]) -> Objects {
        Objects::parse(&self.template(args))
    }
}

struct Objects(Vec<Value>);

impl Objects {
    fn parse(text: &str) -> Objects {
        let mut docs = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            let v = Value::deserialize(doc).expect("rendered YAML parses");
            if v.get("kind").is_some() {
                docs.push(v);
            }
        }
        Objects(docs)
    }

    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.0
            .iter()
            .filter(|o| o["kind"].as_str() == Some(kind))
            .collect()
    }

    fn names(&self, kind: &str) -> BTreeSet<String> {
        self.of_kind(kind).into_iter().map(id).collect()
    }

    fn find(&self, kind: &str, name: &str) -> &Value {
        self.try_find(kind, name)
            .unwrap_or_else(|| panic!("no {kind} {name}; rendered: {:?}", self.names(kind)))
    }

    fn try_find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.of_kind(kind).into_iter().find(|o| id(o) == name)
    }
}

/// `NAMESPACE/NAME`, or `NAME` for a cluster-scoped object.
fn id(o: &Value) -> String {
    let name = o["metadata"]["name"].as_str().unwrap();
    match o["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| s.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn args(deployment: &Value) -> Vec<String> {
    strings(&container(deployment)["args"])
}

fn env(deployment: &Value, name: &str) -> Option<Value> {
    container(deployment)["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .cloned()
}

/// One rule: (apiGroups, resources, verbs, resourceNames).
type Rule = (Vec<String>, Vec<String>, Vec<String>, Vec<String>);

/// A rule list, sorted.
fn rules(role: &Value) -> Vec<Rule> {
    let mut out: Vec<_> = role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r.get("nonResourceURLs").is_none());
            (
                strings(&r["apiGroups"]),
                strings(&r["resources"]),
                strings(&r["verbs"]),
                strings(&r["resourceNames"]),
            )
        })
        .collect();
    out.sort();
    out
}

type Rules = Vec<Rule>;

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Rule {
    named(groups, resources, verbs, &[])
}

/// A rule on the objects of these names only.
fn named(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> Rule {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
    (v(groups), v(resources), v(verbs), v(names))
}

fn sorted(mut r: Rules) -> Rules {
    r.sort();
    r
}

/// What the operator calls where it watches (operator/src: reflectors, the credential
/// finalizer, status server-side apply, the Secret reads, the event recorder).
fn watch_rules() -> Rules {
    sorted(vec![
        rule(
            &["switchback.dev"],
            &["llmroutes", "providercredentials", "llmclients"],
            &["list", "watch"],
        ),
        rule(&["switchback.dev"], &["providercredentials"], &["patch"]),
        rule(
            &["switchback.dev"],
            &[
                "llmroutes/status",
                "providercredentials/status",
                "llmclients/status",
            ],
            &["patch"],
        ),
        rule(&[""], &["secrets"], &["get", "list", "watch"]),
        rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
    ])
}

/// What the operator calls in the gateway namespace: rendered objects, the generated
/// Secrets, the Lease, the admin Service's EndpointSlices, the proxies' reader Role.
fn gateway_rules() -> Rules {
    sorted(vec![
        rule(
            &[""],
            &["configmaps"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        named(
            &["rbac.authorization.k8s.io"],
            &["roles"],
            &["get", "patch"],
            &["sb-proxy-reader"],
        ),
        rule(
            &[""],
            &["secrets"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "create", "update"],
        ),
        rule(&["discovery.k8s.io"], &["endpointslices"], &["list"]),
    ])
}

fn binds_operator(binding: &Value) -> bool {
    binding["subjects"].as_sequence().unwrap().iter().any(|s| {
        s["kind"].as_str() == Some("ServiceAccount")
            && s["name"].as_str() == Some("sb-operator")
            && s["namespace"].as_str() == Some("gw")
    })
}

#[test]
fn helm_lints_strictly_and_renders_every_kind() {
    let Some(helm) = helm() else { return };
    for values in [&[][..], &["-f", ALL_ON][..], NAMESPACED] {
        let mut args = vec!["lint", "--strict", ".", "--namespace", "gw"];
        args.extend_from_slice(values);
        let out = helm.run(&args);
        assert!(
            out.status.success(),
            "helm {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let defaults = helm.objects(&[]);
    for kind in [
        "CustomResourceDefinition",
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Pod",
    ] {
        assert!(!defaults.of_kind(kind).is_empty(), "no {kind} rendered");
    }
    // No Secret at all: the generated ones are the operator's (GitOps-stable).
    assert!(
        defaults.names("Secret").is_empty(),
        "{:?}",
        defaults.names("Secret")
    );
    let all_on = helm.objects(&["-f", ALL_ON]);
    for kind in [
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
    ] {
        assert!(
            !all_on.of_kind(kind).is_empty(),
            "no {kind} rendered with {ALL_ON}"
        );
    }
}

#[test]
fn two_renders_with_the_same_values_are_the_same_bytes() {
    let Some(helm) = helm() else { return };
    for values in [&[][..], &["-f", ALL_ON][..], NAMESPACED] {
        let first = helm.template(values);
        let second = helm.template(values);
        assert!(
            first.len() > 10_000,
            "{values:?}: a render of {} bytes",
            first.len()
        );
        assert!(first == second, "{values:?}: two renders differ");
    }
}

/// `helm template` with ARGS fails, and its error names the field at PATH (Helm 4
/// writes a JSON pointer, Helm 3 a dotted path).
fn assert_refused(helm: &Helm, args: &[&str], path: &str) {
    let stderr = helm.template_fails(args);
    let pointer = format!("/{}", path.replace('.', "/"));
    assert!(
        stderr.contains(&pointer) || stderr.contains(path),
        "helm template {args:?} failed without naming {path}:\n{stderr}"
    );
}

#[test]
fn the_schema_refuses_wrong_values_naming_the_field() {
    let Some(helm) = helm() else { return };
    assert_refused(&helm, &["--set", "auth.mode=Required"], "auth.mode");
    assert_refused(
        &helm,
        &["--set-string", "proxy.limits.maxBodyBytes=lots"],
        "proxy.limits.maxBodyBytes",
    );
    assert_refused(
        &helm,
        &["--set-string", "proxy.replicas=two"],
        "proxy.replicas",
    );
    assert_refused(
        &helm,
        &["--set", "proxy.limits.maxConnections=0"],
        "proxy.limits.maxConnections",
    );
    assert_refused(
        &helm,
        &["--set", "proxy.limits.idleTimeout=1.5s"],
        "proxy.limits.idleTimeout",
    );
    assert_refused(
        &helm,
        &["--set", "proxy.limits.maxHops=0"],
        "proxy.limits.maxHops",
    );
    assert_refused(
        &helm,
        &["--set", "proxy.limits.maxHeaderBytes=4096"],
        "proxy.limits.maxHeaderBytes",
    );
    assert_refused(
        &helm,
        &["--set", "operator.logFormat=xml"],
        "operator.logFormat",
    );
    assert_refused(
        &helm,
        &["--set", "proxy.service.type=External"],
        "proxy.service.type",
    );
    assert_refused(
        &helm,
        &["--set", "watchNamespaces={Team-A}"],
        "watchNamespaces.0",
    );
    assert_refused(
        &helm,
        &["--set", "proxy.drain.extraGraceSeconds=1"],
        "proxy.drain.extraGraceSeconds",
    );
    // A typo is an unknown key: refused, naming the key and where it is.
    let stderr = helm.template_fails(&["--set", "proxy.limits.maxBodyByte=1"]);
    assert!(
        stderr.contains("maxBodyByte") && stderr.contains("proxy"),
        "{stderr}"
    );
    let stderr = helm.template_fails(&["--set", "tokenAuth=false"]);
    assert!(stderr.contains("tokenAuth"), "{stderr}");
    // The same values, well-formed, pass (the refusals above are about the values).
    helm.template(&[
        "--set",
        "auth.mode=off",
        "--set",
        "proxy.limits.maxBodyBytes=1048576",
        "--set",
        "proxy.limits.idleTimeout=1m30s",
        "--set",
        "watchNamespaces={team-a}",
        "--set",
        "global.anything=1",
    ]);
}

#[test]
fn the_operator_generates_the_secrets_and_the_proxy_waits_for_them() {
    let Some(helm) = helm() else { return };
    let o = helm.objects(&[]);
    let operator = o.find("Deployment", "gw/sb-operator");
    let proxy = o.find("Deployment", "gw/sb-proxy");
    let op_args = args(operator);
    for flag in [
        "--auth=required",
        "--client-key-hmac-secret=sb-client-key-hmac",
        "--client-key-hmac-secret-key=hmac",
        "--generate-client-key-hmac",
        "--admin-token-secret=sb-admin-token",
        "--admin-token-secret-key=token",
        "--generate-admin-token",
        "--gateway-namespace=gw",
    ] {
        assert!(
            op_args.iter().any(|a| a == flag),
            "operator lacks {flag}: {op_args:?}"
        );
    }
    // The operator mounts no Secret (it would wait for the Secret it creates) and uses
    // no file flags in the cluster.
    assert!(operator["spec"]["template"]["spec"]["volumes"].is_null());
    assert!(container(operator)["volumeMounts"].is_null());
    assert!(
        !op_args
            .iter()
            .any(|a| a.contains("-file=") || a.starts_with("--watch-namespaces"))
    );

    let px_args = args(proxy);
    for flag in [
        "--auth=required",
        "--client-key-hmac-file=/etc/switchback/client-key-hmac/hmac",
        "--admin-token-file=/etc/switchback/admin-token/token",
    ] {
        assert!(
            px_args.iter().any(|a| a == flag),
            "proxy lacks {flag}: {px_args:?}"
        );
    }
    let volumes = proxy["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap();
    let secrets: BTreeSet<&str> = volumes
        .iter()
        .map(|v| {
            assert!(
                v["secret"]["optional"].is_null(),
                "optional secret volume: {v:?}"
            );
            v["secret"]["secretName"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        secrets,
        BTreeSet::from(["sb-client-key-hmac", "sb-admin-token"])
    );

    // Named Secrets: used as they are, nothing generated.
    let o = helm.objects(&[
        "--set",
        "auth.existingSecret=my-hmac",
        "--set",
        "auth.secretKey=k",
        "--set",
        "admin.existingSecret=my-token",
    ]);
    let op_args = args(o.find("Deployment", "gw/sb-operator"));
    assert!(op_args.contains(&"--client-key-hmac-secret=my-hmac".to_string()));
    assert!(op_args.contains(&"--client-key-hmac-secret-key=k".to_string()));
    assert!(op_args.contains(&"--admin-token-secret=my-token".to_string()));
    assert!(
        !op_args.iter().any(|a| a.starts_with("--generate")),
        "{op_args:?}"
    );
    let proxy = o.find("Deployment", "gw/sb-proxy");
    assert!(
        args(proxy)
            .contains(&"--client-key-hmac-file=/etc/switchback/client-key-hmac/k".to_string())
    );
    let text = serde_yaml_ng::to_string(&proxy["spec"]["template"]["spec"]["volumes"]).unwrap();
    assert!(
        text.contains("secretName: my-hmac") && text.contains("secretName: my-token"),
        "{text}"
    );

    // Both off: no Secret anywhere.
    let o = helm.objects(&["--set", "auth.mode=off", "--set", "admin.tokenAuth=false"]);
    let op_args = args(o.find("Deployment", "gw/sb-operator"));
    assert!(op_args.contains(&"--auth=off".to_string()));
    assert!(
        !op_args
            .iter()
            .any(|a| a.contains("secret") || a.starts_with("--generate")),
        "{op_args:?}"
    );
    let proxy = o.find("Deployment", "gw/sb-proxy");
    assert!(proxy["spec"]["template"]["spec"]["volumes"].is_null());
    assert!(!args(proxy).iter().any(|a| a.contains("-file=")));
}

#[test]
fn cluster_mode_grants_exactly_what_the_operator_calls() {
    let Some(helm) = helm() else { return };
    let o = helm.objects(&[]);
    assert_eq!(
        o.names("ClusterRole"),
        BTreeSet::from([
            "sb-operator".into(),
            "switchback-view".into(),
            "switchback-edit".into()
        ])
    );
    assert_eq!(rules(o.find("ClusterRole", "sb-operator")), watch_rules());
    let binding = o.find("ClusterRoleBinding", "sb-operator");
    assert_eq!(binding["roleRef"]["name"].as_str(), Some("sb-operator"));
    assert!(binds_operator(binding));
    assert_eq!(o.names("ClusterRoleBinding").len(), 1);
    assert_eq!(rules(o.find("Role", "gw/sb-operator")), gateway_rules());
    assert!(binds_operator(o.find("RoleBinding", "gw/sb-operator")));
    proxy_reads_the_index_and_what_the_operator_grants(&o);
    assert_eq!(
        o.names("Role"),
        BTreeSet::from([
            "gw/sb-operator".into(),
            "gw/sb-proxy".into(),
            "gw/sb-proxy-reader".into()
        ])
    );
}

/// The proxy reads the index and the fleet's health view by name, and through the
/// reader Role (rules left to the operator, `--proxy-reader-role`) what the index
/// names: no Secret or other ConfigMap of its namespace.
fn proxy_reads_the_index_and_what_the_operator_grants(o: &Objects) {
    assert_eq!(
        rules(o.find("Role", "gw/sb-proxy")),
        vec![named(
            &[""],
            &["configmaps"],
            &["get", "list", "watch"],
            &["switchback-index", "switchback-health"]
        )]
    );
    let reader = o.find("Role", "gw/sb-proxy-reader");
    assert!(
        reader.get("rules").is_none(),
        "the operator's to fill: {reader:?}"
    );
    for name in ["gw/sb-proxy", "gw/sb-proxy-reader"] {
        let binding = o.find("RoleBinding", name);
        assert_eq!(
            binding["roleRef"]["name"].as_str(),
            name.strip_prefix("gw/")
        );
        let subject = &binding["subjects"][0];
        assert_eq!(subject["name"].as_str(), Some("sb-proxy"));
    }
    let operator = o.find("Deployment", "gw/sb-operator");
    assert!(args(operator).contains(&"--proxy-reader-role=sb-proxy-reader".to_string()));
}

#[test]
fn namespaced_mode_grants_the_same_rules_only_in_the_listed_namespaces() {
    let Some(helm) = helm() else { return };
    let o = helm.objects(NAMESPACED);
    let operator = o.find("Deployment", "gw/sb-operator");
    assert!(args(operator).contains(&"--watch-namespaces=team-a,team-b".to_string()));
    // Nothing cluster-wide for the operator: no ClusterRoleBinding at all; the only
    // ClusterRoles are the aggregated ones for people.
    assert!(
        o.names("ClusterRoleBinding").is_empty(),
        "{:?}",
        o.names("ClusterRoleBinding")
    );
    assert_eq!(
        o.names("ClusterRole"),
        BTreeSet::from(["switchback-view".into(), "switchback-edit".into()])
    );
    for ns in ["team-a", "team-b"] {
        assert_eq!(
            rules(o.find("Role", &format!("{ns}/sb-operator-watch"))),
            watch_rules()
        );
        let binding = o.find("RoleBinding", &format!("{ns}/sb-operator-watch"));
        assert_eq!(binding["roleRef"]["kind"].as_str(), Some("Role"));
        assert_eq!(
            binding["roleRef"]["name"].as_str(),
            Some("sb-operator-watch")
        );
        assert!(binds_operator(binding));
    }
    assert_eq!(rules(o.find("Role", "gw/sb-operator")), gateway_rules());
    proxy_reads_the_index_and_what_the_operator_grants(&o);
    assert_eq!(
        o.names("Role"),
        BTreeSet::from([
            "gw/sb-operator".into(),
            "gw/sb-proxy".into(),
            "gw/sb-proxy-reader".into(),
            "team-a/sb-operator-watch".into(),
            "team-b/sb-operator-watch".into(),
        ])
    );
    // The release namespace may be watched too: its two Roles do not collide.
    let o = helm.objects(&["--set", "watchNamespaces={gw,team-a}"]);
    assert_eq!(rules(o.find("Role", "gw/sb-operator-watch")), watch_rules());
    assert_eq!(rules(o.find("Role", "gw/sb-operator")), gateway_rules());
}

#[test]
fn aggregated_cluster_roles_let_namespace_users_view_and_edit() {
    let Some(helm) = helm() else { return };
    let o = helm.objects(&[]);
    let kinds = ["llmroutes", "providercredentials", "llmclients"];
    let view = o.find("ClusterRole", "switchback-view");
    assert_eq!(
        view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"].as_str(),
        Some("true")
    );
    assert_eq!(
        rules(view),
        vec![rule(&["switchback.dev"], &kinds, &["get", "list", "watch"])]
    );
    let edit = o.find("ClusterRole", "switchback-edit");
    for label in ["aggregate-to-edit", "aggregate-to-admin"] {
        assert_eq!(
            edit["metadata"]["labels"][format!("rbac.authorization.k8s.io/{label}").as_str()]
                .as_str(),
            Some("true")
        );
    }
    assert_eq!(
        rules(edit),
        vec![rule(
            &["switchback.dev"],
            &kinds,
            &[
                "get",
                "list",
                "watch",
                "create",
                "update",
                "patch",
                "delete",
                "deletecollection"
            ]
        )]
    );
    let o = helm.objects(&["--set", "rbac.aggregateToDefaultRoles=false"]);
    assert_eq!(
        o.names("ClusterRole"),
        BTreeSet::from(["sb-operator".into()])
    );
}

#[test]
fn values_reach_their_flags_and_fields() {
    let Some(helm) = helm() else { return };
    // Defaults: every limit at its default (docs/limits.md#the-limits); threads and tracing unset.
    let o = helm.objects(&[]);
    let proxy_args = args(o.find("Deployment", "gw/sb-proxy"));
    for flag in [
        "--max-body-bytes=33554432",
        "--max-inflight-body-bytes=268435456",
        "--max-response-bytes=33554432",
        "--max-inflight-response-bytes=134217728",
        "--max-event-bytes=1048576",
        "--max-connections=10000",
        "--header-read-timeout=10s",
        "--body-read-timeout=30s",
        "--idle-timeout=90s",
        "--max-header-bytes=65536",
        "--max-inflight-header-bytes=33554432",
        "--client-write-timeout=60s",
        "--max-hops=2",
        "--admin-max-connections=128",
        "--admin-idle-timeout=30s",
        "--drain-delay=0s",
        "--shutdown-grace=30s",
        "--usage-handover=10s",
    ] {
        assert!(
            proxy_args.iter().any(|a| a == flag),
            "proxy lacks {flag}: {proxy_args:?}"
        );
    }
    assert!(
        !proxy_args
            .iter()
            .any(|a| a.starts_with("--threads") || a.starts_with("--otlp"))
    );

    let o = helm.objects(&[
        "--set",
        "proxy.limits.maxConnections=123",
        "--set",
        "proxy.limits.maxBodyBytes=1048576",
        "--set",
        "proxy.limits.maxInflightBodyBytes=67108864",
        "--set",
        "proxy.limits.maxInflightResponseBytes=33554432",
        "--set",
        "proxy.limits.headerReadTimeout=5s",
        "--set",
        "proxy.limits.idleTimeout=2m",
        "--set",
        "proxy.limits.maxHops=4",
        "--set",
        "proxy.limits.clientWriteTimeout=15s",
        "--set",
        "proxy.limits.adminMaxConnections=16",
        "--set",
        "proxy.threads=3",
        "--set",
        "proxy.tracing.otlpEndpoint=http://otel.obs:4318",
        "--set",
        "proxy.tracing.otlpMetricsInterval=15s",
        "--set",
        "proxy.allowEmptyConfig=true",
        "--set",
        "proxy.extraArgs={--log-format=text}",
        "--set",
        "proxy.extraEnv[0].name=EXTRA,proxy.extraEnv[0].value=one",
        "--set",
        "proxy.podAnnotations.a=b",
        "--set",
        "proxy.podLabels.team=gw",
        "--set",
        "proxy.serviceAccount.annotations.iam=proxy-role",
        "--set",
        "proxy.probes.readiness.periodSeconds=7",
        "--set",
        "proxy.probes.startup.enabled=true",
        "--set",
        "proxy.probes.liveness.enabled=false",
        "--set",
        "operator.extraArgs={--leader-election=false}",
        "--set",
        "operator.extraEnv[0].name=OP_EXTRA,operator.extraEnv[0].value=two",
        "--set",
        "operator.podAnnotations.c=d",
        "--set",
        "operator.serviceAccount.annotations.iam=operator-role",
        "--set",
        "operator.statusInterval=30s",
        "--set",
        "operator.probes.liveness.failureThreshold=9",
    ]);
    let proxy = o.find("Deployment", "gw/sb-proxy");
    let proxy_args = args(proxy);
    for flag in [
        "--max-connections=123",
        "--max-body-bytes=1048576",
        "--max-inflight-body-bytes=67108864",
        "--max-inflight-response-bytes=33554432",
        "--header-read-timeout=5s",
        "--idle-timeout=2m",
        "--max-hops=4",
        "--client-write-timeout=15s",
        "--admin-max-connections=16",
        "--threads=3",
        "--otlp-endpoint=http://otel.obs:4318",
        "--otlp-metrics-interval=15s",
        "--allow-empty-config",
    ] {
        assert!(
            proxy_args.iter().any(|a| a == flag),
            "proxy lacks {flag}: {proxy_args:?}"
        );
    }
    // extraArgs come last, so they win over the chart's own flags where clap lets them.
    assert_eq!(
        proxy_args.last().map(String::as_str),
        Some("--log-format=text")
    );
    assert_eq!(env(proxy, "EXTRA").unwrap()["value"].as_str(), Some("one"));
    let pod = &proxy["spec"]["template"];
    assert_eq!(pod["metadata"]["annotations"]["a"].as_str(), Some("b"));
    assert_eq!(pod["metadata"]["labels"]["team"].as_str(), Some("gw"));
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/component"].as_str(),
        Some("proxy")
    );
    let c = container(proxy);
    assert_eq!(c["readinessProbe"]["periodSeconds"].as_i64(), Some(7));
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        c["startupProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert!(c["livenessProbe"].is_null());
    assert_eq!(
        o.find("ServiceAccount", "gw/sb-proxy")["metadata"]["annotations"]["iam"].as_str(),
        Some("proxy-role")
    );

    let operator = o.find("Deployment", "gw/sb-operator");
    let op_args = args(operator);
    assert_eq!(
        op_args.last().map(String::as_str),
        Some("--leader-election=false")
    );
    assert!(op_args.contains(&"--status-interval=30s".to_string()));
    assert_eq!(
        env(operator, "OP_EXTRA").unwrap()["value"].as_str(),
        Some("two")
    );
    assert_eq!(
        operator["spec"]["template"]["metadata"]["annotations"]["c"].as_str(),
        Some("d")
    );
    assert_eq!(
        container(operator)["livenessProbe"]["failureThreshold"].as_i64(),
        Some(9)
    );
    assert_eq!(
        o.find("ServiceAccount", "gw/sb-operator")["metadata"]["annotations"]["iam"].as_str(),
        Some("operator-role")
    );
    // A user's label never replaces the selector's.
    let o = helm.objects(&[
        "--set",
        "proxy.podLabels.app\\.kubernetes\\.io/component=other",
    ]);
    let pod = &o.find("Deployment", "gw/sb-proxy")["spec"]["template"];
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/component"].as_str(),
        Some("proxy")
    );
}

#[test]
fn notes_say_how_to_reach_the_proxy_make_a_key_and_find_the_admin_token() {
    let Some(helm) = helm() else { return };
    let install = |extra: &[&str]| {
        let mut args = vec![
            "install",
            "sb",
            ".",
            "--namespace",
            "gw",
            "--dry-run=client",
        ];
        args.extend_from_slice(extra);
        let out = helm.run(&args);
        assert!(
            out.status.success(),
            "helm {args:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        text.split_once("\nNOTES:\n")
            .unwrap_or_else(|| panic!("no NOTES in:\n{text}"))
            .1
            .to_string()
    };
    let notes = install(&[]);
    for want in [
        "auth.mode: required",
        "watchNamespaces: [] - cluster mode",
        "http://sb-proxy.gw.svc:8080/v1",
        "kubectl -n gw port-forward svc/sb-proxy 8080:8080",
        "kubectl create namespace team-a",
        "kubectl -n team-a create secret generic checkout-llm --from-literal=apiKey=$(openssl rand -hex 24)",
        "kind: LLMClient",
        "keySecretRef: { name: checkout-llm, key: apiKey }",
        "curl -H \"Authorization: Bearer $KEY\" http://127.0.0.1:8080/v1/models",
        "kubectl -n gw get secret sb-admin-token -o jsonpath='{.data.token}' | base64 -d",
        "sb-client-key-hmac and sb-admin-token",
        "helm test sb -n gw",
    ] {
        assert!(notes.contains(want), "NOTES lack {want:?}:\n{notes}");
    }
    let notes = install(&[
        "--set",
        "auth.mode=off",
        "--set",
        "watchNamespaces={team-b,team-c}",
        "--set",
        "admin.existingSecret=ops-token",
    ]);
    for want in [
        "auth.mode: off",
        "watchNamespaces: team-b, team-c",
        "kubectl -n gw get secret ops-token",
    ] {
        assert!(notes.contains(want), "NOTES lack {want:?}:\n{notes}");
    }
    for absent in [
        "create secret generic",
        "kubectl create namespace",
        "operator creates",
    ] {
        assert!(
            !notes.contains(absent),
            "NOTES say {absent:?} needlessly:\n{notes}"
        );
    }
}

#[test]
fn helm_test_pods_check_readyz_and_models_unprivileged() {
    let Some(helm) = helm() else { return };
    let o = helm.objects(&[]);
    assert_eq!(
        o.names("Pod"),
        BTreeSet::from(["gw/sb-test-models".into(), "gw/sb-test-readyz".into()])
    );
    for pod in o.of_kind("Pod") {
        let a = &pod["metadata"]["annotations"];
        assert_eq!(a["helm.sh/hook"].as_str(), Some("test"));
        assert_eq!(
            a["helm.sh/hook-delete-policy"].as_str(),
            Some("before-hook-creation,hook-succeeded")
        );
        let spec = &pod["spec"];
        assert_eq!(spec["restartPolicy"].as_str(), Some("Never"));
        assert_eq!(
            spec["securityContext"]["runAsNonRoot"].as_bool(),
            Some(true)
        );
        assert_eq!(spec["automountServiceAccountToken"].as_bool(), Some(false));
        let c = &spec["containers"][0];
        assert_eq!(c["image"].as_str(), Some("curlimages/curl:8.11.1"));
        assert_eq!(
            c["securityContext"]["readOnlyRootFilesystem"].as_bool(),
            Some(true)
        );
        assert_eq!(
            c["securityContext"]["allowPrivilegeEscalation"].as_bool(),
            Some(false)
        );
        assert_eq!(
            strings(&c["securityContext"]["capabilities"]["drop"]),
            ["ALL"]
        );
    }
    let readyz = o.find("Pod", "gw/sb-test-readyz");
    assert!(
        strings(&readyz["spec"]["containers"][0]["args"])
            .contains(&"http://sb-proxy-admin.gw.svc:9090/readyz".to_string())
    );
    let models = &o.find("Pod", "gw/sb-test-models")["spec"]["containers"][0];
    let env_of = |c: &Value, name: &str| {
        c["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .cloned()
    };
    assert_eq!(
        env_of(models, "URL").unwrap()["value"].as_str(),
        Some("http://sb-proxy.gw.svc:8080/v1/models")
    );
    assert_eq!(
        env_of(models, "WANT").unwrap()["value"].as_str(),
        Some("401")
    );
    assert!(env_of(models, "CLIENT_KEY").is_none());

    // A client key from a Secret: expect 200; the image from values.
    let o = helm.objects(&[
        "--set",
        "tests.clientKeySecret.name=smoke-key",
        "--set",
        "tests.image.repository=registry.example/curl",
        "--set-string",
        "tests.image.tag=1",
    ]);
    let models = &o.find("Pod", "gw/sb-test-models")["spec"]["containers"][0];
    assert_eq!(models["image"].as_str(), Some("registry.example/curl:1"));
    assert_eq!(
        env_of(models, "WANT").unwrap()["value"].as_str(),
        Some("200")
    );
    let key = env_of(models, "CLIENT_KEY").unwrap();
    assert_eq!(
        key["valueFrom"]["secretKeyRef"]["name"].as_str(),
        Some("smoke-key")
    );
    assert_eq!(
        key["valueFrom"]["secretKeyRef"]["key"].as_str(),
        Some("apiKey")
    );

    // The NetworkPolicy admits the test pods to the admin port.
    let policy =
        serde_yaml_ng::to_string(&helm.objects(&[]).find("NetworkPolicy", "gw/sb-proxy")["spec"])
            .unwrap();
    assert!(
        policy.contains("app.kubernetes.io/component: test"),
        "{policy}"
    );

    assert!(
        helm.objects(&["--set", "tests.enabled=false"])
            .names("Pod")
            .is_empty()
    );
}

// --- Egress (docs/security.md#where-the-proxies-connect) ---------------------------------------------------------------

/// `egress.allowPrivateNetworkNamespaces` reaches the operator's flag (none by
/// default); the schema refuses what is not a namespace or `*`, naming the value.
#[test]
fn private_networks_are_allowed_only_where_the_values_say() {
    let Some(helm) = helm() else { return };
    let flag = |args: &[&str]| -> Vec<String> {
        args_of_operator(&helm.objects(args))
            .into_iter()
            .filter(|a| a.starts_with("--allow-private-network-namespaces"))
            .collect()
    };
    assert_eq!(flag(&[]), Vec::<String>::new(), "none by default");
    assert_eq!(
        flag(&[
            "--set",
            "egress.allowPrivateNetworkNamespaces={team-a,ml-serving}"
        ]),
        ["--allow-private-network-namespaces=team-a,ml-serving"]
    );
    assert_eq!(
        flag(&["--set", "egress.allowPrivateNetworkNamespaces={*}"]),
        ["--allow-private-network-namespaces=*"]
    );
    assert_refused(
        &helm,
        &["--set", "egress.allowPrivateNetworkNamespaces={Team-A}"],
        "egress.allowPrivateNetworkNamespaces.0",
    );
    assert_refused(
        &helm,
        &["--set", "egress.networkPolicy.cidrs={10.0.0.0}"],
        "egress.networkPolicy.cidrs.0",
    );
}

fn args_of_operator(o: &Objects) -> Vec<String> {
    args(o.find("Deployment", "gw/sb-operator"))
}

/// The optional egress NetworkPolicy: off by default; on, the proxy pods may reach
/// DNS, the API server, public addresses (never loopback, private, CGNAT or
/// link-local ones) and the CIDRs and rules the values add, and nothing else; without
/// the API server's addresses it is refused, naming the value.
#[test]
fn the_egress_network_policy_opens_dns_the_api_server_and_public_addresses_only() {
    let Some(helm) = helm() else { return };
    assert!(
        helm.objects(&[])
            .try_find("NetworkPolicy", "gw/sb-proxy-egress")
            .is_none(),
        "off by default"
    );
    let stderr = helm.template_fails(&["--set", "egress.networkPolicy.enabled=true"]);
    assert!(
        stderr.contains("egress.networkPolicy.apiServer.cidrs is required"),
        "{stderr}"
    );

    let o = helm.objects(&["-f", ALL_ON]);
    let policy = o.find("NetworkPolicy", "gw/sb-proxy-egress");
    let spec = &policy["spec"];
    assert_eq!(strings(&spec["policyTypes"]), ["Egress"]);
    // The proxy pods, by the Deployment's own selector.
    assert_eq!(
        spec["podSelector"]["matchLabels"],
        o.find("Deployment", "gw/sb-proxy")["spec"]["selector"]["matchLabels"]
    );
    let rules = spec["egress"].as_sequence().unwrap();
    assert_eq!(rules.len(), 5, "{rules:?}");
    // DNS: UDP and TCP 53 to the cluster DNS pods.
    assert_eq!(
        rules[0]["to"][0]["podSelector"]["matchLabels"]["k8s-app"].as_str(),
        Some("kube-dns")
    );
    let ports: Vec<String> = rules[0]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}/{}",
                p["port"].as_u64().unwrap(),
                p["protocol"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(ports, ["53/UDP", "53/TCP"]);
    // The API server's addresses, on its ports only.
    let cidrs = |rule: &Value| -> Vec<String> {
        rule["to"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|peer| peer["ipBlock"]["cidr"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(cidrs(&rules[1]), ["10.0.0.1/32", "172.20.0.10/32"]);
    assert_eq!(rules[1]["ports"].as_sequence().unwrap().len(), 2);
    // Public addresses: everything but the ranges netguard refuses.
    assert_eq!(cidrs(&rules[2]), ["0.0.0.0/0", "::/0"]);
    assert!(rules[2].get("ports").is_none(), "any port");
    let except: Vec<String> = rules[2]["to"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|peer| strings(&peer["ipBlock"]["except"]))
        .collect();
    for private in [
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "::1/128",
        "::ffff:0:0/96",
        "fc00::/7",
        "fe80::/10",
    ] {
        assert!(
            except.iter().any(|e| e == private),
            "{private} is not excepted: {except:?}"
        );
    }
    // What the values add.
    assert_eq!(cidrs(&rules[3]), ["10.20.0.0/16"]);
    assert_eq!(rules[4]["ports"][0]["port"].as_u64(), Some(4318));

    // publicInternet off: DNS and the API server only.
    let o = helm.objects(&[
        "--set",
        "egress.networkPolicy.enabled=true",
        "--set",
        "egress.networkPolicy.apiServer.cidrs={10.0.0.1/32}",
        "--set",
        "egress.networkPolicy.publicInternet=false",
    ]);
    let rules = o.find("NetworkPolicy", "gw/sb-proxy-egress")["spec"]["egress"]
        .as_sequence()
        .unwrap()
        .len();
    assert_eq!(rules, 2);
}

// --- Alerts (templates/prometheusrule.yaml) ---------------------------------------------

/// The alert tests and the values they are written against (see its values.yaml).
fn alert_tests() -> PathBuf {
    chart().join("tests/alerts")
}

/// The alert names of templates/prometheusrule.yaml, in order.
fn alert_names() -> Vec<String> {
    let text = std::fs::read_to_string(chart().join("templates/prometheusrule.yaml")).unwrap();
    let names: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|n| n.trim().to_string())
        .collect();
    assert!(names.len() >= 11, "only {names:?} in prometheusrule.yaml");
    names
}

#[test]
fn every_alert_has_a_runbook_section_and_cases_that_fire_it_and_do_not() {
    let alerts = alert_names();
    let runbooks =
        std::fs::read_to_string(chart().join("../../docs/runbooks.md")).expect("docs/runbooks.md");
    let sections: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|s| s.trim().to_string())
        .collect();
    let tests: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(alert_tests().join("alerts.test.yaml")).unwrap(),
    )
    .expect("alerts.test.yaml parses");
    // (alert, whether the case expects it to fire)
    let mut cases = BTreeSet::new();
    for test in tests["tests"].as_sequence().expect("tests:") {
        for case in test["alert_rule_test"]
            .as_sequence()
            .expect("alert_rule_test:")
        {
            let alert = case["alertname"].as_str().unwrap().to_string();
            let fires = case["exp_alerts"]
                .as_sequence()
                .is_some_and(|a| !a.is_empty());
            cases.insert((alert, fires));
        }
    }
    let mut problems = Vec::new();
    for alert in &alerts {
        if !sections.contains(alert) {
            problems.push(format!(
                "{alert}: no `## {alert}` section in docs/runbooks.md"
            ));
        }
        for (fires, what) in [(true, "fires"), (false, "does not fire")] {
            if !cases.contains(&(alert.clone(), fires)) {
                problems.push(format!(
                    "{alert}: no case in tests/alerts/alerts.test.yaml where it {what}"
                ));
            }
        }
    }
    for section in &sections {
        if !alerts.contains(section) {
            problems.push(format!("docs/runbooks.md: `## {section}` is no alert"));
        }
    }
    for (alert, _) in &cases {
        if !alerts.contains(alert) {
            problems.push(format!("alerts.test.yaml tests {alert}, which is no alert"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// promtool (Prometheus's rule checker and unit tester): `SWITCHBACK_PROMTOOL`,
/// `promtool` on PATH, or the one `.ci/chart` extracted into its cache; else None
/// (the test then prints why it skipped).
fn promtool() -> Option<String> {
    let cache = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cache")))
        .map(|c| c.join("switchback/promtool/promtool"));
    let candidates: Vec<String> = match std::env::var("SWITCHBACK_PROMTOOL") {
        Ok(p) => vec![p],
        Err(_) => std::iter::once("promtool".to_string())
            .chain(cache.ok().map(|c| c.display().to_string()))
            .collect(),
    };
    for bin in &candidates {
        if let Ok(out) = Command::new(bin).arg("--version").output()
            && out.status.success()
        {
            return Some(bin.clone());
        }
    }
    println!(
        "skipped: no promtool runs (tried {candidates:?}; set SWITCHBACK_PROMTOOL, install the \
         Debian package prometheus, or run bash .ci/chart, which fetches one)"
    );
    None
}

/// The groups of the PrometheusRule rendered with tests/alerts/values.yaml and ARGS.
fn rendered_rules(helm: &Helm, args: &[&str]) -> Value {
    let mut all = vec![
        "-f",
        "tests/alerts/values.yaml",
        "--show-only",
        "templates/prometheusrule.yaml",
    ];
    all.extend_from_slice(args);
    let rule = Objects::parse(&helm.template(&all));
    let rule = rule.find("PrometheusRule", "gw/sb-switchback");
    rule["spec"].clone()
}

#[test]
fn every_alert_links_its_runbook_under_the_configured_base() {
    let Some(helm) = helm() else { return };
    let default_base = lookup(&values_yaml(), "metrics.prometheusRule.runbookBaseURL")
        .and_then(|v| v.as_str())
        .unwrap()
        .to_string();
    assert!(
        default_base.ends_with("/docs/runbooks.md"),
        "{default_base}"
    );
    let mirror = "https://wiki.example/ops/switchback-runbooks";
    for (args, base) in [
        (vec![], default_base.as_str()),
        (
            vec![
                "--set",
                "metrics.prometheusRule.runbookBaseURL=https://wiki.example/ops/switchback-runbooks",
            ],
            mirror,
        ),
    ] {
        let spec = rendered_rules(&helm, &args);
        let mut seen = Vec::new();
        for group in spec["groups"].as_sequence().unwrap() {
            for rule in group["rules"].as_sequence().unwrap() {
                let alert = rule["alert"].as_str().unwrap();
                assert_eq!(
                    rule["annotations"]["runbook_url"].as_str(),
                    Some(format!("{base}#{}", alert.to_lowercase()).as_str()),
                    "{alert}"
                );
                seen.push(alert.to_string());
            }
        }
        assert_eq!(seen, alert_names());
    }
    assert_refused(
        &helm,
        &[
            "--set",
            "metrics.prometheusRule.runbookBaseURL=wiki/runbooks#x",
        ],
        "metrics.prometheusRule.runbookBaseURL",
    );
}

#[test]
fn alerts_fire_on_the_samples_that_should_fire_them_and_only_those() {
    let Some(helm) = helm() else { return };
    let Some(promtool) = promtool() else { return };
    let dir = std::env::temp_dir().join(format!("switchback-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        serde_yaml_ng::to_string(&rendered_rules(&helm, &[])).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        alert_tests().join("alerts.test.yaml"),
        dir.join("alerts.test.yaml"),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = run(&["check", "rules", "rules.yaml"]);
    assert!(ok, "promtool check rules:\n{text}");
    println!("{text}");
    let (ok, text) = run(&["test", "rules", "alerts.test.yaml"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        ok,
        "promtool test rules charts/switchback/tests/alerts/alerts.test.yaml:\n{text}"
    );
    println!("{text}");
}

//! The YAML users copy and kubectl reads: every generated CRD, chart file, example
//! and README block.
//!
//! kubectl (and most GitOps tools) read YAML 1.1, where an unquoted `on`, `off`,
//! `yes`, `no`, `y` or `n` key is a boolean. A CRD property with such a name reaches the
//! API server as `"true"`, and a user's `on:` does not match the field, so no key
//! anywhere may be one of those words (crds/README.md#validation-who-enforces-what).
//! Example manifests also load and compile as they are, their LLMClients included.

use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;
use switchback_tests::binaries::workspace;

/// YAML 1.1's boolean words, in every case its resolver accepts.
const YAML_1_1_BOOLEANS: &[&str] = &[
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
    "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF",
];

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    out.sort();
    out
}

/// Every ```yaml block of a Markdown file, with the line it starts on.
fn yaml_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start();
        match &mut current {
            None if fence.starts_with("```yaml") => current = Some((i + 2, String::new())),
            Some(_) if fence.starts_with("```") => blocks.push(current.take().unwrap()),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// The path of every mapping key that YAML 1.1 would read as a boolean.
fn boolean_keys(value: &Value, path: &str, found: &mut Vec<String>) {
    match value {
        Value::Mapping(map) => {
            for (k, v) in map {
                let name = match k {
                    Value::String(s) => s.clone(),
                    Value::Bool(b) => b.to_string(),
                    other => format!("{other:?}"),
                };
                let here = format!("{path}.{name}");
                if matches!(k, Value::Bool(_)) || YAML_1_1_BOOLEANS.contains(&name.as_str()) {
                    found.push(here.clone());
                }
                boolean_keys(v, &here, found);
            }
        }
        Value::Sequence(items) => {
            for (i, v) in items.iter().enumerate() {
                boolean_keys(v, &format!("{path}[{i}]"), found);
            }
        }
        Value::Tagged(t) => boolean_keys(&t.value, path, found),
        _ => {}
    }
}

fn check(source: &str, text: &str, found: &mut Vec<String>) {
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = <Value as serde::Deserialize>::deserialize(doc)
            .unwrap_or_else(|e| panic!("{source}: document {}: {e}", i + 1));
        let mut keys = Vec::new();
        boolean_keys(&value, "", &mut keys);
        found.extend(
            keys.into_iter()
                .map(|k| format!("{source} (document {}): {k}", i + 1)),
        );
    }
}

#[test]
fn no_key_is_a_yaml_1_1_boolean() {
    let root = workspace();
    let mut files = Vec::new();
    for dir in [
        "crds",
        "crds/examples",
        "charts/switchback/crds",
        "charts/switchback",
    ] {
        files.extend(yaml_files(&root.join(dir)));
    }
    let ci_values = root.join("charts/switchback/ci");
    if ci_values.is_dir() {
        files.extend(yaml_files(&ci_values));
    }
    let mut found = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        check(&file.display().to_string(), &text, &mut found);
        checked += 1;
    }
    for md in [
        "README.md",
        "crds/README.md",
        "operator/README.md",
        "charts/switchback/README.md",
    ] {
        let Ok(text) = std::fs::read_to_string(root.join(md)) else {
            continue;
        };
        for (line, block) in yaml_blocks(&text) {
            check(&format!("{md}:{line}"), &block, &mut found);
            checked += 1;
        }
    }
    assert!(checked >= 6, "found only {checked} YAML sources: {files:?}");
    assert!(
        found.is_empty(),
        "keys YAML 1.1 reads as booleans:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_finds_an_unquoted_on_key() {
    let mut found = Vec::new();
    check(
        "inline",
        "spec:\n  fallback:\n    on: [timeout]\n",
        &mut found,
    );
    check("inline", "list:\n  - yes: 1\n", &mut found);
    assert_eq!(
        found,
        [
            "inline (document 1): .spec.fallback.on",
            "inline (document 1): .list[0].yes"
        ]
    );
}

#[test]
fn every_example_compiles() {
    let dir = workspace().join("crds/examples");
    let files = yaml_files(&dir);
    assert!(!files.is_empty(), "no examples in {}", dir.display());
    for file in files {
        // As a standalone proxy serves it: authentication (and model names per
        // client) required as soon as the file holds an LLMClient.
        let text = std::fs::read_to_string(&file).unwrap();
        let auth = if text.contains("\nkind: LLMClient\n") {
            switchback_proxy::config::keys::Auth {
                mode: switchback_proxy::config::keys::AuthMode::Required,
                hasher: Some(
                    switchback_crds::keyhash::KeyHasher::new(b"example-cluster-secret-0123456789")
                        .unwrap(),
                ),
            }
        } else {
            switchback_proxy::config::keys::Auth::default()
        };
        match switchback_proxy::sources::standalone::compile_manifests_for(&file, &auth) {
            Ok((compiled, warnings)) => {
                assert!(
                    !compiled.config.routes.is_empty(),
                    "{}: no route compiled",
                    file.display()
                );
                assert!(warnings.is_empty(), "{}: {warnings:?}", file.display());
                // Every LLMClient of the example compiled too, each with a route.
                let declared = text.matches("\nkind: LLMClient\n").count();
                assert_eq!(
                    compiled.config.clients.len(),
                    declared,
                    "{}: LLMClients compiled",
                    file.display()
                );
                for client in &compiled.config.clients {
                    assert!(
                        !client.routes.is_empty(),
                        "{}: {} may call no route",
                        file.display(),
                        client.id
                    );
                }
            }
            Err(problems) => panic!("{}: {problems:?}", file.display()),
        }
    }
}

/// The README's multi-team walkthrough says who may call what: each client's routes
/// as compiled from `crds/examples/multi-team.yaml`.
#[test]
fn the_multi_team_example_gives_each_client_the_routes_the_walkthrough_says() {
    let auth = switchback_proxy::config::keys::Auth {
        mode: switchback_proxy::config::keys::AuthMode::Required,
        hasher: Some(
            switchback_crds::keyhash::KeyHasher::new(b"example-cluster-secret-0123456789").unwrap(),
        ),
    };
    let file = workspace().join("crds/examples/multi-team.yaml");
    let (compiled, warnings) =
        switchback_proxy::sources::standalone::compile_manifests_for(&file, &auth)
            .expect("compiles");
    assert!(warnings.is_empty(), "{warnings:?}");
    let routes: Vec<(String, Vec<String>)> = compiled
        .config
        .clients
        .iter()
        .map(|c| {
            assert!(c.key_hash.is_some(), "{}: no key hash", c.id);
            (
                c.id.to_string(),
                c.routes.iter().map(|r| r.to_string()).collect(),
            )
        })
        .collect();
    let expect = |id: &str, r: &[&str]| (id.to_string(), r.iter().map(|s| s.to_string()).collect());
    assert_eq!(
        routes,
        [
            expect("team-a/batch", &["team-a/claude", "team-a/smart"]),
            expect("team-a/checkout", &["team-a/smart"]),
            expect("team-b/reports", &["team-a/claude", "team-b/smart"]),
        ]
    );
}

/// `crds/examples/azure-openai.yaml` compiles to what its comments say: Azure
/// credentials on the classic and the v1 API, a route whose targets map each model
/// name to a deployment, and contentFilter opted in.
#[test]
fn the_azure_example_compiles_to_azure_targets_with_model_maps() {
    use switchback_crds::config::{FailureClass, Provider};
    let file = workspace().join("crds/examples/azure-openai.yaml");
    let (compiled, warnings) = switchback_proxy::sources::standalone::compile_manifests_for(
        &file,
        &switchback_proxy::config::keys::Auth::default(),
    )
    .expect("compiles");
    assert!(warnings.is_empty(), "{warnings:?}");
    let by_name = |n: &str| {
        compiled
            .config
            .credentials
            .iter()
            .find(|c| c.id.name == n)
            .unwrap_or_else(|| panic!("{n}"))
    };
    let eastus = by_name("azure-eastus");
    assert_eq!(eastus.provider, Provider::AzureOpenai);
    assert_eq!(eastus.api_version.as_deref(), Some("2024-10-21"));
    let v1 = by_name("azure-v1");
    assert_eq!(v1.provider, Provider::AzureOpenai);
    assert_eq!(v1.api_version, None, "no apiVersion: the v1 API");
    assert_eq!(compiled.keys.0.len(), 3);
    let route = &compiled.config.routes[0];
    assert_eq!(route.models, ["smart", "fast"]);
    let first = &route.targets[0];
    assert_eq!(first.credential.name, "azure-eastus");
    assert_eq!(first.upstream_model("smart"), "gpt-4o-prod");
    assert_eq!(first.upstream_model("fast"), "gpt-4o-mini-prod");
    assert_eq!(route.targets[2].upstream_model("fast"), "gpt-4o-mini");
    assert!(
        route
            .fallback
            .on_failures
            .contains(&FailureClass::ContentFilter)
    );
}

/// `crds/examples/gemini.yaml` compiles to what its comments say: a gemini credential
/// on the default v1beta endpoint, Gemini models by the name the client sent, and
/// contentFilter left out (a blocked prompt is answered, not failed over).
#[test]
fn the_gemini_example_compiles_to_a_gemini_target_first() {
    use switchback_crds::config::{FailureClass, Provider};
    let file = workspace().join("crds/examples/gemini.yaml");
    let (compiled, warnings) = switchback_proxy::sources::standalone::compile_manifests_for(
        &file,
        &switchback_proxy::config::keys::Auth::default(),
    )
    .expect("compiles");
    assert!(warnings.is_empty(), "{warnings:?}");
    let gemini = compiled
        .config
        .credentials
        .iter()
        .find(|c| c.id.name == "gemini-prod")
        .expect("gemini-prod");
    assert_eq!(gemini.provider, Provider::Gemini);
    assert_eq!(
        gemini.base_url,
        "https://generativelanguage.googleapis.com/v1beta"
    );
    assert_eq!(compiled.keys.0.len(), 2);
    let route = &compiled.config.routes[0];
    assert_eq!(route.models, ["smart", "fast"]);
    let first = &route.targets[0];
    assert_eq!(first.credential.name, "gemini-prod");
    assert_eq!(first.upstream_model("smart"), "gemini-2.5-pro");
    assert_eq!(first.upstream_model("fast"), "gemini-2.5-flash");
    assert_eq!(route.targets[1].upstream_model("fast"), "claude-haiku-4-5");
    assert!(
        !route
            .fallback
            .on_failures
            .contains(&FailureClass::ContentFilter)
    );
    assert_eq!(route.fallback.max_retry_after_ms, 20_000);
}

/// `crds/examples/vertex.yaml` compiles: a vertex credential on its location's
/// endpoint, with project and location, and the service-account JSON as its key.
#[test]
fn the_vertex_example_compiles_to_a_vertex_credential() {
    use switchback_crds::config::Provider;
    use switchback_crds::service_account::ServiceAccount;
    let file = workspace().join("crds/examples/vertex.yaml");
    let (compiled, warnings) = switchback_proxy::sources::standalone::compile_manifests_for(
        &file,
        &switchback_proxy::config::keys::Auth::default(),
    )
    .expect("compiles");
    assert!(warnings.is_empty(), "{warnings:?}");
    let vertex = compiled
        .config
        .credentials
        .iter()
        .find(|c| c.id.name == "vertex-prod")
        .expect("vertex-prod");
    assert_eq!(vertex.provider, Provider::Vertex);
    assert_eq!(
        vertex.base_url,
        "https://us-east5-aiplatform.googleapis.com/v1"
    );
    assert_eq!(vertex.project.as_deref(), Some("my-project"));
    assert_eq!(vertex.location.as_deref(), Some("us-east5"));
    let key = compiled
        .keys
        .get(&vertex.id)
        .expect("the service-account key");
    let sa = ServiceAccount::parse(key.expose()).expect("parses");
    assert_eq!(sa.token_uri, "https://oauth2.googleapis.com/token");
    let route = &compiled.config.routes[0];
    assert_eq!(
        route.targets[0].upstream_model("smart"),
        "claude-sonnet-4-5"
    );
    assert_eq!(route.targets[0].upstream_model("fast"), "gemini-2.5-flash");
}

/// `crds/examples/bedrock.yaml` compiles to what its comments say: a bedrock
/// credential on its region's runtime endpoint, its keys read from the whole Secret
/// (and shown nowhere in the config), Bedrock model ids by the name the client sent.
#[test]
fn the_bedrock_example_compiles_to_a_bedrock_target_first() {
    use switchback_crds::config::{AwsKeys, Provider};
    let file = workspace().join("crds/examples/bedrock.yaml");
    let (compiled, warnings) = switchback_proxy::sources::standalone::compile_manifests_for(
        &file,
        &switchback_proxy::config::keys::Auth::default(),
    )
    .expect("compiles");
    assert!(warnings.is_empty(), "{warnings:?}");
    let bedrock = compiled
        .config
        .credentials
        .iter()
        .find(|c| c.id.name == "bedrock-us-east-1")
        .expect("bedrock-us-east-1");
    assert_eq!(bedrock.provider, Provider::Bedrock);
    assert_eq!(bedrock.region.as_deref(), Some("us-east-1"));
    assert_eq!(
        bedrock.base_url,
        "https://bedrock-runtime.us-east-1.amazonaws.com"
    );
    let keys = AwsKeys::decode(compiled.keys.get(&bedrock.id).expect("keys")).expect("AWS keys");
    assert_eq!(keys.access_key_id.expose(), "AKIAPLACEHOLDER00000");
    assert!(keys.session_token.is_none());
    let shown = serde_json::to_string(&compiled.config).unwrap();
    assert!(!shown.contains("placeholder/secret"), "{shown}");
    let route = &compiled.config.routes[0];
    assert_eq!(route.models, ["smart", "fast"]);
    let first = &route.targets[0];
    assert_eq!(first.credential.name, "bedrock-us-east-1");
    assert_eq!(
        first.upstream_model("smart"),
        "us.anthropic.claude-sonnet-4-20250514-v1:0"
    );
    assert_eq!(first.upstream_model("fast"), "amazon.nova-lite-v1:0");
}

/// `crds/examples/streams.yaml` compiles to what its comments say: a stall limit,
/// resume, hedging and a failback ramp on the route, and prefill declared on the
/// openai-compatible credential only.
#[test]
fn the_streams_example_compiles_with_resume_hedge_and_ramp() {
    use switchback_crds::config::{Hedge, Resume, StreamPolicy};
    let file = workspace().join("crds/examples/streams.yaml");
    let (compiled, warnings) = switchback_proxy::sources::standalone::compile_manifests_for(
        &file,
        &switchback_proxy::config::keys::Auth::default(),
    )
    .expect("compiles");
    assert!(warnings.is_empty(), "{warnings:?}");
    let prefill: Vec<(&str, bool)> = compiled
        .config
        .credentials
        .iter()
        .map(|c| (c.id.name.as_str(), c.prefill))
        .collect();
    assert_eq!(
        prefill,
        [
            ("anthropic-prod", false),
            ("openai-prod", false),
            ("vllm-claude-like", true)
        ]
    );
    let route = &compiled.config.routes[0];
    assert_eq!(
        route.stream,
        Some(StreamPolicy {
            idle_timeout_ms: Some(20_000),
            resume: Some(Resume {
                max_resumes: 1,
                max_held_bytes: 256 * 1024
            }),
        })
    );
    assert_eq!(
        route.hedge,
        Some(Hedge {
            after_ms: 1500,
            max_percent: 10
        })
    );
    assert_eq!(route.circuit_breaker.ramp_up_ms, Some(30_000));
}

//! The Helm chart: its CRDs are the generated ones, byte for byte; every value a
//! template reads is defined (and so documented) in values.yaml; and, when `helm` is
//! installed (or `SWITCHBACK_HELM` names it), the chart lints and renders.

use std::path::{Path, PathBuf};
use std::process::Command;

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/switchback")
}

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

fn lookup<'a>(values: &'a serde_yaml_ng::Value, path: &str) -> Option<&'a serde_yaml_ng::Value> {
    path.split('.').try_fold(values, |v, key| v.get(key))
}

#[test]
fn every_value_a_template_reads_is_in_values_yaml() {
    let values: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap())
            .expect("values.yaml parses");
    let mut checked = 0;
    for entry in std::fs::read_dir(chart().join("templates")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
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

#[test]
fn helm_lints_and_renders_the_chart() {
    let helm = std::env::var("SWITCHBACK_HELM").unwrap_or_else(|_| "helm".into());
    let Ok(out) = Command::new(&helm).arg("version").output() else {
        println!("skipped: `{helm}` is not installed (set SWITCHBACK_HELM to a helm binary)");
        return;
    };
    assert!(out.status.success());
    let lint = Command::new(&helm)
        .arg("lint")
        .arg(chart())
        .output()
        .unwrap();
    assert!(
        lint.status.success(),
        "helm lint:\n{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    let rendered = Command::new(&helm)
        .args(["template", "sb", "--namespace", "gw", "--include-crds"])
        .arg(chart())
        .output()
        .unwrap();
    assert!(
        rendered.status.success(),
        "helm template:\n{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let text = String::from_utf8(rendered.stdout).unwrap();
    let mut kinds = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = serde_yaml_ng::Value::deserialize(doc).expect("rendered YAML parses");
        if let Some(kind) = v.get("kind").and_then(|k| k.as_str()) {
            kinds.push(kind.to_string());
        }
    }
    for kind in [
        "CustomResourceDefinition",
        "Deployment",
        "Service",
        "Role",
        "ClusterRole",
        "ServiceAccount",
    ] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "no {kind} rendered: {kinds:?}"
        );
    }
    // The proxy's Role reads ConfigMaps and Secrets, nothing more.
    assert!(text.contains("verbs: [\"get\", \"list\", \"watch\"]"));
}

use serde::Deserialize;

//! The generated CRD YAML: what `switchback-operator crds` prints and what the checked-in
//! `crds/*.yaml` files hold. A test fails when the checked-in files are stale.

use std::path::Path;

use kube::CustomResourceExt;

use crate::{LLMRoute, ProviderCredential};

/// The command that rewrites the checked-in files, quoted by the staleness test.
pub const REGENERATE: &str = "cargo run -p switchback-operator -- crds --write crds/";

/// One CRD per file, named `<plural>.<group>.yaml`, in alphabetical order.
pub fn crd_files() -> Vec<(String, String)> {
    vec![
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

/// Both CRDs as one multi-document YAML stream: the exact concatenation of the
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
    format!("---\n{body}")
}

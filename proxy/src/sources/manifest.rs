//! Reading standalone manifests: a YAML file or a folder of them (LLMRoute,
//! ProviderCredential, LLMClient, and Secret with `data` or `stringData`), every object
//! remembered with the file and line it came from so that each error can point there.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use serde::de::DeserializeOwned;
use switchback_crds::compile::Kind;
use switchback_crds::config::ObjectId;
use switchback_crds::{LLMClient, LLMRoute, ProviderCredential};

const API_VERSION: &str = "switchback.dev/v1alpha1";
const DEFAULT_NAMESPACE: &str = "default";

/// Where an object was declared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub file: PathBuf,
    /// 1-based line of the document's first line.
    pub line: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// A manifest that could not be read, at `file:line`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}", self.file.display(), l, self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

#[derive(Debug, Default)]
pub struct ManifestSet {
    pub routes: Vec<LLMRoute>,
    pub credentials: Vec<ProviderCredential>,
    pub clients: Vec<LLMClient>,
    pub secrets: Vec<Secret>,
    pub origins: HashMap<(KindKey, ObjectId), Origin>,
    /// Documents of other kinds, skipped (a folder may hold unrelated manifests).
    pub skipped: Vec<String>,
}

/// `compile::Kind` as a hashable key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KindKey {
    Route,
    Credential,
    Client,
    Secret,
}

impl From<Kind> for KindKey {
    fn from(k: Kind) -> Self {
        match k {
            Kind::LLMRoute => Self::Route,
            Kind::ProviderCredential => Self::Credential,
            Kind::LLMClient => Self::Client,
            Kind::Secret => Self::Secret,
        }
    }
}

/// The manifest files under `path`: the file itself, or every `*.yaml` / `*.yml`
/// below the folder, sorted, skipping hidden entries (Kubernetes' `..data` links).
pub fn files(path: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let err = |e: std::io::Error| ManifestError {
        file: path.to_path_buf(),
        line: None,
        message: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(err)?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(err)? {
            let p = entry.map_err(err)?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') {
                continue;
            }
            if p.is_dir() {
                dirs.push(p);
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Read every manifest under `path`. All errors are collected, not just the first.
pub fn load(path: &Path) -> Result<ManifestSet, Vec<ManifestError>> {
    let files = files(path).map_err(|e| vec![e])?;
    let mut set = ManifestSet::default();
    let mut errors = Vec::new();
    for file in files {
        match std::fs::read_to_string(&file) {
            Ok(text) => load_text(&file, &text, &mut set, &mut errors),
            Err(e) => errors.push(ManifestError {
                file: file.clone(),
                line: None,
                message: e.to_string(),
            }),
        }
    }
    if errors.is_empty() {
        Ok(set)
    } else {
        Err(errors)
    }
}

/// The YAML documents of a file with the 1-based line each starts on.
fn documents(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_end();
        if t == "---" || t.starts_with("--- ") || t == "..." {
            docs.push((start, std::mem::take(&mut current)));
            start = i + 2;
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    docs.push((start, current));
    docs.retain(|(_, d)| {
        d.lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
    });
    docs
}

pub fn load_text(file: &Path, text: &str, set: &mut ManifestSet, errors: &mut Vec<ManifestError>) {
    for (start, doc) in documents(text) {
        let at = |line: Option<usize>, message: String| ManifestError {
            file: file.to_path_buf(),
            line: Some(line.map_or(start, |l| start + l.saturating_sub(1))),
            message,
        };
        let value: serde_yaml_ng::Value = match serde_yaml_ng::from_str(&doc) {
            Ok(v) => v,
            Err(e) => {
                errors.push(at(
                    e.location().map(|l| l.line()),
                    strip_location(&e.to_string()),
                ));
                continue;
            }
        };
        let s = |k: &str| value.get(k).and_then(|v| v.as_str()).unwrap_or("");
        let (api_version, kind) = (s("apiVersion"), s("kind"));
        let meta = |k: &str| {
            value
                .get("metadata")
                .and_then(|m| m.get(k))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        let id = ObjectId::new(
            meta("namespace").unwrap_or_else(|| DEFAULT_NAMESPACE.into()),
            meta("name").unwrap_or_default(),
        );
        let key = match (api_version, kind) {
            (API_VERSION, "LLMRoute") => KindKey::Route,
            (API_VERSION, "ProviderCredential") => KindKey::Credential,
            (API_VERSION, "LLMClient") => KindKey::Client,
            ("v1", "Secret") => KindKey::Secret,
            (v, k @ ("LLMRoute" | "ProviderCredential" | "LLMClient")) => {
                errors.push(at(
                    None,
                    format!("{k} {id}: apiVersion {v:?} is not {API_VERSION:?}"),
                ));
                continue;
            }
            (_, "") => {
                errors.push(at(None, "the document has no `kind`".into()));
                continue;
            }
            (v, k) => {
                set.skipped
                    .push(format!("{}:{start}: {v}/{k} {id}", file.display()));
                continue;
            }
        };
        if id.name.is_empty() {
            errors.push(at(None, format!("{kind}: metadata.name is required")));
            continue;
        }
        let origin = Origin {
            file: file.to_path_buf(),
            line: start,
        };
        if let Some(prev) = set.origins.get(&(key, id.clone())) {
            errors.push(at(None, format!("{kind} {id} is also declared at {prev}")));
            continue;
        }
        let parsed = match key {
            KindKey::Route => typed::<LLMRoute>(&doc, Redact::Never).map(|mut r| {
                r.metadata.namespace = Some(id.namespace.clone());
                set.routes.push(r)
            }),
            KindKey::Credential => {
                typed::<ProviderCredential>(&doc, Redact::KeyFields).map(|mut c| {
                    c.metadata.namespace = Some(id.namespace.clone());
                    set.credentials.push(c)
                })
            }
            KindKey::Client => typed::<LLMClient>(&doc, Redact::KeyFields).map(|mut c| {
                c.metadata.namespace = Some(id.namespace.clone());
                set.clients.push(c)
            }),
            KindKey::Secret => typed::<Secret>(&doc, Redact::Always).map(|mut s| {
                s.metadata.namespace = Some(id.namespace.clone());
                set.secrets.push(s)
            }),
        };
        match parsed {
            Ok(()) => {
                set.origins.insert((key, id), origin);
            }
            Err((line, message)) => errors.push(at(line, format!("{kind} {id}: {message}"))),
        }
    }
}

/// Which parse errors must not quote the value they found: a key pasted into the
/// wrong place (`stringData: sk-…`, `secretRef: sk-…`) would otherwise reach the log and
/// the unauthenticated `/admin/v1/config` verbatim.
#[derive(Clone, Copy)]
enum Redact {
    Never,
    /// Every field: Secrets hold nothing else.
    Always,
    /// `spec.secretRef`, `spec.keySecretRef`, `spec.headers`, or the whole spec of a
    /// ProviderCredential or LLMClient.
    KeyFields,
}

impl Redact {
    fn applies(self, path: &str) -> bool {
        match self {
            Redact::Never => false,
            Redact::Always => true,
            Redact::KeyFields => {
                matches!(path, "" | "." | "spec")
                    || path.starts_with("spec.secretRef")
                    || path.starts_with("spec.keySecretRef")
                    || path.starts_with("spec.headers")
            }
        }
    }
}

/// `msg` with every double-quoted string (serde's way of quoting what it found)
/// replaced by a placeholder; field names, which serde puts in backquotes, stay.
fn hide_values(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let mut close = None;
        let mut escaped = false;
        for (i, ch) in after.char_indices() {
            match ch {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    close = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        out.push_str("(value hidden)");
        match close {
            Some(i) => rest = &after[i + 1..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

/// Deserialize with the failing field's path and line.
fn typed<T: DeserializeOwned>(doc: &str, redact: Redact) -> Result<T, (Option<usize>, String)> {
    let de = serde_yaml_ng::Deserializer::from_str(doc);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let line = inner.location().map(|l| l.line());
        let msg = strip_location(&inner.to_string());
        // The message may already start with the path (serde_yaml_ng adds it).
        let msg = msg
            .strip_prefix(&format!("{path}: "))
            .unwrap_or(&msg)
            .to_string();
        let msg = if redact.applies(&path) {
            hide_values(&msg)
        } else {
            msg
        };
        let message = if path == "." || path.is_empty() {
            msg
        } else {
            format!("{path}: {msg}")
        };
        (line, message)
    })
}

fn strip_location(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_documents_and_remembers_lines() {
        let docs = documents("# c\n---\na: 1\n---\n# only a comment\n---\nb: 2\nc: 3\n");
        assert_eq!(
            docs,
            vec![(3, "a: 1\n".to_string()), (7, "b: 2\nc: 3\n".to_string())]
        );
    }

    #[test]
    fn syntax_errors_point_at_the_file_line() {
        let mut set = ManifestSet::default();
        let mut errors = Vec::new();
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\nkind: [\n";
        load_text(Path::new("m.yaml"), text, &mut set, &mut errors);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].file, Path::new("m.yaml"));
        // The parser notices the unclosed sequence at the end of the document.
        assert!(matches!(errors[0].line, Some(5 | 6)), "{errors:?}");
        let mut errors = Vec::new();
        load_text(
            Path::new("m.yaml"),
            "metadata: {name: a}\n",
            &mut set,
            &mut errors,
        );
        assert_eq!(
            errors[0].to_string(),
            "m.yaml:1: the document has no `kind`"
        );
    }

    #[test]
    fn other_kinds_are_skipped_and_secrets_read() {
        let mut set = ManifestSet::default();
        let mut errors = Vec::new();
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: k, namespace: team-a}\nstringData: {apiKey: sk-1}\n";
        load_text(Path::new("m.yaml"), text, &mut set, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(set.skipped.len(), 1);
        assert_eq!(set.secrets.len(), 1);
        assert_eq!(
            set.origins[&(KindKey::Secret, ObjectId::new("team-a", "k"))],
            Origin {
                file: "m.yaml".into(),
                line: 5
            }
        );
    }

    /// A key pasted where a map or name belongs is never quoted back (issue 11,
    /// item 6); route errors still quote what they found.
    #[test]
    fn parse_errors_never_quote_key_material() {
        let key = "sk-live-0123456789abcdef";
        for (doc, field) in [
            (
                format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: k}}\nstringData: {key}\n"),
                "stringData",
            ),
            (
                format!(
                    "apiVersion: v1\nkind: Secret\nmetadata: {{name: k}}\ndata: {{apiKey: [{key}]}}\n"
                ),
                "data",
            ),
            (
                format!(
                    "apiVersion: switchback.dev/v1alpha1\nkind: ProviderCredential\nmetadata: {{name: c}}\n\
                     spec: {{provider: openai, secretRef: {key}}}\n"
                ),
                "spec.secretRef",
            ),
            (
                format!(
                    "apiVersion: switchback.dev/v1alpha1\nkind: ProviderCredential\nmetadata: {{name: c}}\n\
                     spec: {key}\n"
                ),
                "spec",
            ),
            (
                format!(
                    "apiVersion: switchback.dev/v1alpha1\nkind: LLMClient\nmetadata: {{name: c}}\n\
                     spec: {{keySecretRef: {key}}}\n"
                ),
                "spec.keySecretRef",
            ),
            (
                format!(
                    "apiVersion: switchback.dev/v1alpha1\nkind: LLMClient\nmetadata: {{name: c}}\n\
                     spec: {key}\n"
                ),
                "spec",
            ),
        ] {
            let mut set = ManifestSet::default();
            let mut errors = Vec::new();
            load_text(Path::new("m.yaml"), &doc, &mut set, &mut errors);
            assert_eq!(errors.len(), 1, "{doc}: {errors:?}");
            let shown = errors[0].to_string();
            assert!(!shown.contains(key), "{shown}");
            assert!(shown.contains(field), "names the field {field}: {shown}");
        }
        let mut set = ManifestSet::default();
        let mut errors = Vec::new();
        let route = "apiVersion: switchback.dev/v1alpha1\nkind: LLMRoute\nmetadata: {name: r}\n\
                     spec: {targets: [{credentialRef: {name: c}, weight: sideways}]}\n";
        load_text(Path::new("m.yaml"), route, &mut set, &mut errors);
        assert!(errors[0].to_string().contains("sideways"), "{errors:?}");
    }

    #[test]
    fn llm_clients_are_read_into_their_namespace() {
        let mut set = ManifestSet::default();
        let mut errors = Vec::new();
        let text = "apiVersion: switchback.dev/v1alpha1\nkind: LLMClient\nmetadata: {name: app}\n\
                    spec: {keySecretRef: {name: k, key: apiKey}, routes: [smart]}\n---\n\
                    apiVersion: switchback.dev/v1\nkind: LLMClient\nmetadata: {name: old}\nspec: {}\n";
        load_text(Path::new("m.yaml"), text, &mut set, &mut errors);
        assert_eq!(set.clients.len(), 1);
        assert_eq!(
            set.clients[0].metadata.namespace.as_deref(),
            Some("default")
        );
        assert!(
            set.origins
                .contains_key(&(KindKey::Client, ObjectId::new("default", "app")))
        );
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            vec![
                "m.yaml:6: LLMClient default/old: apiVersion \"switchback.dev/v1\" is not \"switchback.dev/v1alpha1\""
            ]
        );
    }

    #[test]
    fn hide_values_keeps_field_names() {
        assert_eq!(
            hide_values(r#"invalid type: string "sk-1\"x", expected struct `SecretKeyRef`"#),
            "invalid type: string (value hidden), expected struct `SecretKeyRef`"
        );
        assert_eq!(hide_values(r#"cut "sk-1"#), "cut (value hidden)");
    }

    #[test]
    fn duplicates_name_both_places() {
        let mut set = ManifestSet::default();
        let mut errors = Vec::new();
        let s = "apiVersion: v1\nkind: Secret\nmetadata: {name: k}\nstringData: {a: b}\n";
        load_text(
            Path::new("m.yaml"),
            &format!("{s}---\n{s}"),
            &mut set,
            &mut errors,
        );
        assert_eq!(errors.len(), 1);
        assert_eq!(
            errors[0].to_string(),
            "m.yaml:6: Secret default/k is also declared at m.yaml:1"
        );
    }
}

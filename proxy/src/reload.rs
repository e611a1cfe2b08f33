//! Standalone config: load manifests, compile, apply; then watch the file or folder
//! and reload on change. A change that does not load (bad YAML, a rejected object,
//! a config that cannot be prepared) keeps the last good config and is reported, with
//! file, line and field, in the log and on `/admin/v1/config`.
//!
//! A change is applied whole or not at all: one broken route never takes the rest of
//! an edit with it half-applied.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use switchback_crds::compile::{Compiled, Inputs, Severity, compile};

use crate::gateway::{ApplyError, Gateway, Problem};
use crate::manifest::{self, ManifestSet};

/// Quiet time after the last file event before reloading: editors and
/// `kubectl cp`-style writers touch files several times per save.
const DEBOUNCE: Duration = Duration::from_millis(150);

/// A compiled manifest set, or every problem that stops it.
pub fn compile_manifests(path: &Path) -> Result<(Compiled, Vec<Problem>), Vec<Problem>> {
    let set = manifest::load(path).map_err(|errors| {
        errors
            .into_iter()
            .map(|e| Problem {
                file: Some(e.file.display().to_string()),
                line: e.line,
                object: None,
                field: None,
                message: e.message,
            })
            .collect::<Vec<_>>()
    })?;
    let compiled = compile(&Inputs {
        routes: &set.routes,
        credentials: &set.credentials,
        secrets: &set.secrets,
    });
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    for d in &compiled.diagnostics {
        let p = locate(&set, d);
        match d.severity {
            Severity::Error => errors.push(p),
            Severity::Warning => warnings.push(p),
        }
    }
    for s in &set.skipped {
        warnings.push(Problem {
            file: None,
            line: None,
            object: None,
            field: None,
            message: format!("skipped a document of a kind the proxy does not read: {s}"),
        });
    }
    if errors.is_empty() {
        Ok((compiled, warnings))
    } else {
        Err(errors)
    }
}

fn locate(set: &ManifestSet, d: &switchback_crds::Diagnostic) -> Problem {
    let origin = set.origins.get(&(d.kind.into(), d.object.clone()));
    Problem {
        file: origin.map(|o| o.file.display().to_string()),
        line: origin.map(|o| o.line),
        object: Some(d.object.to_string()),
        field: Some(d.field.clone()),
        message: d.message.clone(),
    }
}

/// Load once; on success the gateway serves it. Returns the problems otherwise.
pub fn load_once(gw: &Gateway, path: &Path) -> Result<(), Vec<Problem>> {
    let (compiled, warnings) = compile_manifests(path)?;
    for w in &warnings {
        tracing::warn!(problem = %w, "config warning");
    }
    gw.apply(&compiled, warnings).map_err(|e| {
        vec![Problem {
            // No route anywhere: the files read are what is wrong (a truncated file).
            file: matches!(e, ApplyError::NoRoute).then(|| path.display().to_string()),
            line: None,
            object: None,
            field: None,
            message: e.to_string(),
        }]
    })
}

/// Reload, logging and recording a refusal. Used by the watcher.
pub fn reload(gw: &Gateway, path: &Path) {
    match load_once(gw, path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), generation = gw.report().generation, "config reloaded")
        }
        Err(problems) => {
            for p in &problems {
                tracing::error!(problem = %p, "config refused; still serving the last good config");
            }
            gw.refuse(problems);
        }
    }
}

/// Watches the manifests and reloads on change. Dropping it stops watching.
pub struct ManifestWatcher {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ManifestWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Start watching. Call before the first load: nothing written after this call is missed.
pub fn watch(gw: Arc<Gateway>, path: PathBuf) -> notify::Result<ManifestWatcher> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            // A full channel already means "reload pending".
            let _ = tx.try_send(());
        }
    })?;
    // Watch the folder holding a single file: editors and ConfigMap mounts replace
    // files by rename, which a watch on the file itself would lose.
    let (watched, mode) = if path.is_dir() {
        (path.clone(), RecursiveMode::Recursive)
    } else {
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        (parent.to_path_buf(), RecursiveMode::NonRecursive)
    };
    watcher.watch(&watched, mode)?;
    // Taken now, before the caller's first load, so that an edit racing that load
    // still differs from it and is picked up.
    let mut last = fingerprint(&path);
    let task = tokio::spawn(async move {
        while rx.recv().await.is_some() {
            while tokio::time::timeout(DEBOUNCE, rx.recv())
                .await
                .is_ok_and(|m| m.is_some())
            {}
            let now = fingerprint(&path);
            if now == last {
                continue; // touched, not changed
            }
            last = now;
            let (gw, path) = (gw.clone(), path.clone());
            // Reading files and compiling is blocking work: keep it off the reactor.
            let _ = tokio::task::spawn_blocking(move || reload(&gw, &path)).await;
        }
    });
    Ok(ManifestWatcher {
        _watcher: watcher,
        task,
    })
}

/// A cheap identity of the manifests' content, to skip reloads that change nothing.
fn fingerprint(path: &Path) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if let Ok(files) = manifest::files(path) {
        for f in files {
            f.hash(&mut h);
            std::fs::read(&f).unwrap_or_default().hash(&mut h);
        }
    }
    h.finish()
}

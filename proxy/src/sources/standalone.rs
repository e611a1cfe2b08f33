//! Standalone config: load manifests, compile, apply; then watch the file or folder
//! and reload on change. A change that does not load (bad YAML, a rejected object,
//! a config that cannot be prepared) keeps the last good config and is reported, with
//! file, line and field, in the log and on `/admin/v1/config`.
//!
//! A change is applied whole or not at all: one broken route never takes the rest of
//! an edit with it half-applied.
//!
//! The watcher counts only the events of the manifests themselves (see `Manifests`:
//! not a log file written beside them) and reloads once they pause for `DEBOUNCE`,
//! or `MAX_WAIT` after the first one at the latest.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use switchback_crds::compile::{Compiled, Inputs, Severity, compile};
use switchback_crds::network::PrivateNetworks;

use crate::gateway::{ApplyError, Gateway, Problem};
use crate::sources::manifest::{self, ManifestSet};

/// Quiet time after the last manifest event before reloading: editors and
/// `kubectl cp`-style writers touch files several times per save.
const DEBOUNCE: Duration = Duration::from_millis(150);

/// The longest a reload waits after the first event for that quiet time: events that
/// never pause (a writer in a loop) still get the change loaded.
const MAX_WAIT: Duration = Duration::from_secs(1);

/// A compiled manifest set, or every problem that stops it, as a proxy with
/// authentication off compiles it (model names global, no client key hashed).
pub fn compile_manifests(path: &Path) -> Result<(Compiled, Vec<Problem>), Vec<Problem>> {
    compile_manifests_for(path, &crate::config::keys::Auth::default())
}

/// A compiled manifest set as a proxy with these auth settings serves it: with
/// `--auth required`, client keys are hashed with its secret (and then dropped) and
/// model names are resolved per client.
pub fn compile_manifests_for(
    path: &Path,
    auth: &crate::config::keys::Auth,
) -> Result<(Compiled, Vec<Problem>), Vec<Problem>> {
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
        clients: &set.clients,
        secrets: &set.secrets,
        // With `--auth off`, LLMClients are compiled and checked (their diagnostics
        // are reported) but not enforced: without a hasher no client gets a key hash.
        client_key_hasher: if auth.required() {
            auth.hasher.as_ref()
        } else {
            None
        },
        models_per_client: auth.required(),
        // The manifests are the platform's own file
        // (docs/security.md#where-the-proxies-connect): each credential's
        // allowPrivateNetwork is honoured as written.
        private_networks: &PrivateNetworks::Everywhere,
    });
    // The plain client keys lived only in `set.secrets`, dropped with `set` here.
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
pub(crate) fn load_once(gw: &Gateway, path: &Path) -> Result<(), Vec<Problem>> {
    let (mut compiled, warnings) = compile_manifests_for(path, &gw.auth)?;
    // No operator renders the replicas sharing each client's limits and budgets:
    // `--replicas` says how many serve these manifests.
    for c in &mut compiled.config.clients {
        c.replicas = gw.standalone_replicas;
    }
    for w in &warnings {
        tracing::warn!(problem = %w, "config warning");
    }
    let clients = &compiled.config.clients;
    if gw.auth.required() {
        let usable = clients.iter().filter(|c| c.key_hash.is_some()).count();
        if usable == 0 {
            tracing::warn!(
                clients = clients.len(),
                "--auth required and no LLMClient has a usable key: every request gets 401"
            );
        } else {
            tracing::info!(clients = usable, "authenticating LLMClients");
        }
        let budgets = clients
            .iter()
            .filter(|c| c.budget.tokens_per_day.is_some() || c.budget.usd_per_month.is_some())
            .count();
        if gw.standalone
            && budgets > 0
            && !gw
                .said_standalone_budgets
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                clients = budgets,
                replicas = gw.standalone_replicas,
                "standalone (no operator): LLMClient budgets are enforced from this process's \
                 own usage since it started, each request reserving its share before it is sent; \
                 this replica takes 1/--replicas of each budget, other replicas' and earlier \
                 processes' usage is not counted, and a restart starts from zero"
            );
        }
    } else if !clients.is_empty() {
        tracing::warn!(
            clients = clients.len(),
            "the manifests hold LLMClients but --auth is off: they are checked, not enforced; every caller is served"
        );
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
pub(crate) struct ManifestWatcher {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ManifestWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Start watching. Call before the first load: nothing written after this call is missed.
pub(crate) fn watch(gw: Arc<Gateway>, path: PathBuf) -> notify::Result<ManifestWatcher> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let manifests = Manifests::new(&path)?;
    // Watch the folder holding a single file: editors and ConfigMap mounts replace
    // files by rename, which a watch on the file itself would lose.
    let (watched, mode) = if manifests.folder {
        (manifests.root.clone(), RecursiveMode::Recursive)
    } else {
        let parent = manifests.root.parent().unwrap_or(Path::new("/"));
        (parent.to_path_buf(), RecursiveMode::NonRecursive)
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access() && manifests.concerned_by(&e)) {
            // A full channel already means "reload pending".
            let _ = tx.try_send(());
        }
    })?;
    watcher.watch(&watched, mode)?;
    // Taken now, before the caller's first load, so that an edit racing that load
    // still differs from it and is picked up.
    let mut last = fingerprint(&path);
    let task = tokio::spawn(async move {
        while rx.recv().await.is_some() {
            if !settle(&mut rx).await {
                return;
            }
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

/// After a first event: waits until events pause for [`DEBOUNCE`], or [`MAX_WAIT`]
/// after that first event at the latest. False when the watcher is gone.
async fn settle(rx: &mut tokio::sync::mpsc::Receiver<()>) -> bool {
    let latest = tokio::time::Instant::now() + MAX_WAIT;
    loop {
        let quiet = (tokio::time::Instant::now() + DEBOUNCE).min(latest);
        match tokio::time::timeout_at(quiet, rx.recv()).await {
            // An event is taken before the timer is looked at: past `latest`, stop
            // waiting even when one is always there.
            Ok(Some(())) if tokio::time::Instant::now() < latest => {}
            Ok(Some(())) | Err(_) => return true,
            Ok(None) => return false,
        }
    }
}

/// What the watcher reacts to: events on the manifest files themselves, not on
/// other files of their folder (a log written beside the manifest would otherwise
/// keep restarting the quiet time).
#[derive(Debug)]
struct Manifests {
    /// The file or folder given, absolute (as notify reports paths).
    root: PathBuf,
    folder: bool,
}

impl Manifests {
    fn new(path: &Path) -> notify::Result<Self> {
        let root = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(notify::Error::io)?
                .join(path)
        };
        Ok(Self {
            folder: path.is_dir(),
            root,
        })
    }

    fn concerned_by(&self, event: &notify::Event) -> bool {
        event.paths.iter().any(|p| self.concerns(p))
    }

    /// True when `changed` is (or may hold) one of the manifests: the file itself;
    /// in a folder, a `*.yaml`/`*.yml` file or a folder (what [`manifest::files`]
    /// reads); and the `..data`-style entries by which a mounted ConfigMap or Secret
    /// swaps all its files at once.
    fn concerns(&self, changed: &Path) -> bool {
        let name = changed.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !self.folder {
            return changed == self.root
                || (name.starts_with("..") && changed.parent() == self.root.parent());
        }
        let Ok(inside) = changed.strip_prefix(&self.root) else {
            return false;
        };
        let mut hidden = false;
        for c in inside.components() {
            let c = c.as_os_str().to_str().unwrap_or("");
            if c.starts_with("..") {
                return true;
            }
            hidden |= c.starts_with('.');
        }
        if hidden {
            return false;
        }
        // A folder, or one that was just moved or removed (so not known any more):
        // the manifests in it may have come or gone with it.
        name.ends_with(".yaml")
            || name.ends_with(".yml")
            || changed.extension().is_none()
            || changed.is_dir()
    }
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

#[cfg(test)]
mod tests {
    use notify::event::{DataChange, EventKind, ModifyKind, RenameMode};
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use super::*;

    /// The watcher's loop: the first event is taken, then `settle` waits.
    async fn settled_after_first(rx: &mut mpsc::Receiver<()>) -> (bool, Duration) {
        rx.recv().await.unwrap();
        let started = Instant::now();
        // On the paused clock: a minute is a bound that cannot flake, and a failure
        // rather than a hang when events would hold the reload back for ever.
        let open = tokio::time::timeout(Duration::from_secs(60), settle(rx))
            .await
            .expect("settled");
        (open, started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_waits_for_a_pause_in_the_events() {
        let (tx, mut rx) = mpsc::channel(1);
        tx.send(()).await.unwrap();
        let writer = tokio::spawn(async move {
            // Three more events, 100 ms apart: each restarts the quiet time.
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                tx.send(()).await.unwrap();
            }
            tx
        });
        let (open, took) = settled_after_first(&mut rx).await;
        assert!(open);
        assert_eq!(took, Duration::from_millis(300) + DEBOUNCE);
        drop(writer.await.unwrap());
        assert!(!settle(&mut rx).await, "the watcher is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn events_that_never_pause_hold_a_reload_back_for_a_second_at_most() {
        let (tx, mut rx) = mpsc::channel(1);
        tx.send(()).await.unwrap();
        let _writer = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if tx.send(()).await.is_err() {
                    return;
                }
            }
        });
        let (open, took) = settled_after_first(&mut rx).await;
        assert!(open);
        assert_eq!(took, MAX_WAIT);
        // And the next change is loaded within a second again.
        let (_, took) = settled_after_first(&mut rx).await;
        assert_eq!(took, MAX_WAIT);
    }

    fn event(paths: &[&str]) -> notify::Event {
        paths.iter().fold(
            notify::Event::new(EventKind::Modify(ModifyKind::Data(DataChange::Content))),
            |e, p| e.add_path(PathBuf::from(p)),
        )
    }

    #[test]
    fn only_events_of_the_manifest_file_count() {
        let m = Manifests {
            root: "/srv/sb/switchback.yaml".into(),
            folder: false,
        };
        assert!(m.concerned_by(&event(&["/srv/sb/switchback.yaml"])));
        // A log written beside it, an editor's swap file, other files: not counted.
        for other in [
            "/srv/sb/proxy.log",
            "/srv/sb/.switchback.yaml.swp",
            "/srv/sb/other.yaml",
            "/srv/switchback.yaml",
            "/srv/sb",
        ] {
            assert!(!m.concerned_by(&event(&[other])), "{other}");
        }
        // Saved by rename from a temporary file, as editors and `sed -i` do.
        let renamed = notify::Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
            .add_path("/srv/sb/.switchback.yaml.tmp".into())
            .add_path("/srv/sb/switchback.yaml".into());
        assert!(m.concerned_by(&renamed));
        // A mounted ConfigMap swaps its files by renaming `..data`.
        assert!(m.concerned_by(&event(&["/srv/sb/..data_tmp"])));
        assert!(m.concerned_by(&event(&["/srv/sb/..data"])));
    }

    #[test]
    fn in_a_folder_only_events_of_manifests_count() {
        let m = Manifests {
            root: "/srv/sb".into(),
            folder: true,
        };
        for counted in [
            "/srv/sb/routes.yaml",
            "/srv/sb/team-a/keys.yml",
            "/srv/sb/team-b",
            "/srv/sb/..data",
            "/srv/sb/..2026_12_01_22_44_16.123/routes.yaml",
        ] {
            assert!(m.concerned_by(&event(&[counted])), "{counted}");
        }
        for other in [
            "/srv/sb/proxy.log",
            "/srv/sb/team-a/notes.txt",
            "/srv/sb/.hidden.yaml",
            "/srv/sb/.git/config",
            "/srv/other/routes.yaml",
        ] {
            assert!(!m.concerned_by(&event(&[other])), "{other}");
        }
    }

    const GEMINI: &str = "apiVersion: v1
kind: Secret
metadata: { name: keys, namespace: team-a }
stringData: { gemini: k }
---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: gem, namespace: team-a }
spec:
  provider: gemini
  secretRef: { name: keys, key: gemini }
  HEADERS
---
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: { name: smart, namespace: team-a }
spec:
  targets: [ { credentialRef: { name: gem } } ]
";

    fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("switchback.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// docs/security.md#keys-stay-in-secrets: standalone refuses a static header that may
    /// carry a key as the CRD and the operator do, naming the file, the line of the object
    /// and the field.
    #[test]
    fn a_static_header_that_may_carry_a_key_is_refused_with_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            &GEMINI.replace(
                "HEADERS",
                "headers: { X-Goog-Api-Key: k, OpenAI-Project: p }",
            ),
        );
        let problems = compile_manifests(&path).unwrap_err();
        let refused: Vec<String> = problems
            .iter()
            .filter(|p| p.field.as_deref() == Some("spec.headers[X-Goog-Api-Key]"))
            .map(ToString::to_string)
            .collect();
        assert_eq!(refused.len(), 1, "{problems:?}");
        let expected = format!(
            "{}:6: team-a/gem: spec.headers[X-Goog-Api-Key]: \"X-Goog-Api-Key\" may carry a key",
            path.display()
        );
        assert!(refused[0].starts_with(&expected), "{}", refused[0]);
        // The same credential without it loads.
        let path = write(
            &dir,
            &GEMINI.replace("HEADERS", "headers: { OpenAI-Project: p }"),
        );
        assert!(compile_manifests(&path).is_ok());
    }

    /// docs/security.md#where-the-proxies-connect: standalone manifests are the platform's
    /// own file: a credential's `allowPrivateNetwork: true` is honoured as written, in any
    /// namespace.
    #[test]
    fn standalone_honours_allow_private_network_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let text = GEMINI
            .replace("provider: gemini", "provider: openai-compatible")
            .replace(
                "  HEADERS",
                "  baseURL: http://127.0.0.1:8000/v1\n  allowPrivateNetwork: true",
            );
        let (compiled, _) = compile_manifests(&write(&dir, &text)).unwrap();
        assert!(compiled.config.credentials[0].allow_private_network);
        assert_eq!(compiled.config.routes.len(), 1);
    }
}

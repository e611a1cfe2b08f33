//! Standalone reloads: a good edit is served, in-flight requests finish on the config
//! they started with, a bad edit keeps the last good config and reports file, line
//! and field, and a rotated Secret's new key is used (and changes the route's
//! revision in `/admin/v1/stats`). Real clock: these wait on the file watcher.

use std::time::Duration;

use switchback_crds::revision::Revisions;
use switchback_tests::harness::{TestProxy, credential, header, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};

async fn two() -> (SimProvider, SimProvider) {
    (
        SimProvider::start_named("primary", Flavor::OpenAi).await,
        SimProvider::start_named("backup", Flavor::OpenAi).await,
    )
}

fn manifests(
    primary: &SimProvider,
    backup: &SimProvider,
    first: &str,
    key: &str,
    extra: &str,
) -> String {
    format!(
        "{}{}{}",
        credential("primary", "openai", &primary.base_url(), key),
        credential("backup", "openai", &backup.base_url(), "sk-backup"),
        route(
            "smart",
            &format!("  targets:\n    - credentialRef: {{ name: {first} }}\n{extra}")
        )
    )
}

/// Poll until `check` holds, for at most 5 s (the watcher debounces for 150 ms).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

async fn target_of(proxy: &TestProxy) -> String {
    let r = proxy.chat("smart", false).await;
    header(&r, "x-switchback-target").to_string()
}

#[tokio::test]
async fn a_good_edit_is_served_and_in_flight_requests_finish_on_their_config() {
    let (primary, backup) = two().await;
    let proxy = TestProxy::start(&manifests(&primary, &backup, "primary", "sk-1", "")).await;
    assert_eq!(target_of(&proxy).await, "team-a/primary");
    assert_eq!(proxy.admin_config().await["load"]["generation"], 1);

    primary.push(Behavior::Answer.after(Duration::from_millis(1500)));
    let slow = proxy.spawn_chat("smart");
    primary.wait_hits(2).await;
    proxy.rewrite(&manifests(&primary, &backup, "backup", "sk-1", ""));
    eventually("the edit is served", || async {
        target_of(&proxy).await == "team-a/backup"
    })
    .await;
    assert_eq!(proxy.admin_config().await["load"]["generation"], 2);
    let r = slow.await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "x-switchback-target"),
        "team-a/primary",
        "finished on the config it started with"
    );
}

#[tokio::test]
async fn a_bad_edit_keeps_the_last_good_config_and_says_where() {
    let (primary, backup) = two().await;
    let proxy = TestProxy::start(&manifests(&primary, &backup, "primary", "sk-1", "")).await;
    let bad = manifests(
        &primary,
        &backup,
        "backup",
        "sk-1",
        "      retry: { attempts: 7 }\n",
    );
    proxy.rewrite(&bad);
    eventually("the refusal is reported", || async {
        !proxy.admin_config().await["load"]["lastError"].is_null()
    })
    .await;
    let config = proxy.admin_config().await;
    let problem = &config["load"]["lastError"]["problems"][0];
    assert_eq!(problem["file"], proxy.manifest.display().to_string());
    let route_line = bad.lines().position(|l| l == "kind: LLMRoute").unwrap(); // 0-based line of `kind`
    assert_eq!(
        problem["line"], route_line,
        "the route document starts the line before `kind`"
    );
    assert_eq!(problem["object"], "team-a/smart");
    assert_eq!(problem["field"], "spec.targets[0].retry.attempts");
    assert!(
        problem["message"].as_str().unwrap().contains("7"),
        "{problem}"
    );
    assert_eq!(config["load"]["generation"], 1);
    assert_eq!(
        config["routes"][0]["targets"][0]["credential"]["name"],
        "primary"
    );
    assert_eq!(
        target_of(&proxy).await,
        "team-a/primary",
        "the last good config is still served"
    );

    // A YAML typo in a field name is refused the same way, naming the field.
    let typo = manifests(
        &primary,
        &backup,
        "backup",
        "sk-1",
        "      retyr: { attempts: 2 }\n",
    );
    proxy.rewrite(&typo);
    eventually("the typo is reported", || async {
        proxy.admin_config().await["load"]["lastError"]["problems"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("retyr"))
    })
    .await;
    let problem = proxy.admin_config().await["load"]["lastError"]["problems"][0].clone();
    assert!(
        problem["message"]
            .as_str()
            .unwrap()
            .contains("spec.targets[0]"),
        "{problem}"
    );
    assert_eq!(target_of(&proxy).await, "team-a/primary");

    // Fixing it clears the error.
    proxy.rewrite(&manifests(&primary, &backup, "backup", "sk-1", ""));
    eventually("the fix is served", || async {
        target_of(&proxy).await == "team-a/backup"
    })
    .await;
    assert!(proxy.admin_config().await["load"]["lastError"].is_null());
}

#[tokio::test]
async fn a_rotated_secret_is_used_for_the_next_request() {
    let (primary, backup) = two().await;
    let proxy = TestProxy::start(&manifests(&primary, &backup, "primary", "sk-old", "")).await;
    proxy.chat("smart", false).await;
    assert_eq!(
        primary.received()[0].header("authorization"),
        Some("Bearer sk-old")
    );
    proxy.rewrite(&manifests(&primary, &backup, "primary", "sk-new", ""));
    eventually("the new key is used", || async {
        proxy.chat("smart", false).await;
        primary.received().last().unwrap().header("authorization") == Some("Bearer sk-new")
    })
    .await;
}

/// The revision `/admin/v1/stats` reports for the one route.
async fn revision(proxy: &TestProxy) -> String {
    let stats: serde_json::Value = proxy.admin_stats().await;
    stats["routes"][0]["revision"].as_str().unwrap().to_string()
}

/// The revision the operator would expect: the same function over the same manifests.
fn expected(proxy: &TestProxy) -> String {
    let (compiled, _) =
        switchback_proxy::sources::standalone::compile_manifests(&proxy.manifest).unwrap();
    Revisions::new(&compiled.config, &compiled.keys, &compiled.revision_keys)
        .route(&compiled.config.routes[0])
        .to_string()
}

#[tokio::test]
async fn stats_report_the_revision_served_which_a_key_rotation_changes() {
    let (primary, backup) = two().await;
    let proxy = TestProxy::start(&manifests(&primary, &backup, "primary", "sk-old", "")).await;
    let first = revision(&proxy).await;
    assert_eq!(first, expected(&proxy));

    // Same route, same generation, new key: only the revision tells.
    proxy.rewrite(&manifests(&primary, &backup, "primary", "sk-new", ""));
    eventually("the rotated key's revision is reported", || async {
        revision(&proxy).await != first
    })
    .await;
    assert_eq!(revision(&proxy).await, expected(&proxy));

    // A key the route does not use (backup's) reloads without changing it.
    let rotated = revision(&proxy).await;
    let loaded = proxy.admin_config().await["load"]["generation"]
        .as_u64()
        .unwrap();
    let unrelated = manifests(&primary, &backup, "primary", "sk-new", "")
        .replace("apiKey: sk-backup", "apiKey: sk-backup-2");
    proxy.rewrite(&unrelated);
    eventually("the unrelated edit is loaded", || async {
        proxy.admin_config().await["load"]["generation"].as_u64() > Some(loaded)
    })
    .await;
    assert_eq!(revision(&proxy).await, rotated);
}

#[tokio::test]
async fn the_admin_config_never_shows_key_material() {
    let (primary, backup) = two().await;
    let proxy = TestProxy::start(&manifests(
        &primary,
        &backup,
        "primary",
        "sk-very-secret",
        "",
    ))
    .await;
    let text = proxy.admin_text("/admin/v1/config").await;
    assert!(!text.contains("sk-very-secret"), "{text}");
    assert!(text.contains("\"keyPresent\": true"), "{text}");
}

#[tokio::test]
async fn a_broken_config_at_startup_is_refused_with_file_line_and_field() {
    let (primary, backup) = two().await;
    let bad = manifests(&primary, &backup, "primary", "sk-1", "      weight: 0\n");
    let err = match TestProxy::try_start(&bad, 1024).await {
        Ok(_) => panic!("a broken config must not start"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("switchback.yaml:"), "{err}");
    assert!(
        err.contains("team-a/smart: spec.targets[0].weight:"),
        "{err}"
    );
}

#[tokio::test]
async fn admin_health_and_readiness() {
    let (primary, backup) = two().await;
    let proxy = TestProxy::start(&manifests(&primary, &backup, "primary", "sk-1", "")).await;
    for path in ["/healthz", "/readyz"] {
        let r = proxy.http.get(proxy.admin_url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
}

/// Writes in a loop on a thread of its own until dropped.
struct Writer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Writer {
    fn start(mut write: impl FnMut(usize) + Send + 'static) -> Writer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                write(n);
                n += 1;
                // Well under the watcher's quiet time.
                std::thread::sleep(Duration::from_millis(20));
            }
            n
        });
        Writer {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops it; how many writes it made.
    fn stop(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Issue 11 item 11: the proxy's own log written beside the manifest (`> proxy.log`)
/// used to restart the watcher's quiet time for ever, so no edit was ever loaded.
#[tokio::test]
async fn a_file_beside_the_manifest_that_keeps_changing_does_not_hold_edits_back() {
    use std::io::Write;
    let (primary, backup) = two().await;
    let proxy = TestProxy::start(&manifests(&primary, &backup, "primary", "sk-1", "")).await;
    let mut log = std::fs::File::create(proxy.dir.path().join("proxy.log")).unwrap();
    let writer = Writer::start(move |n| {
        writeln!(log, "line {n}").unwrap();
        log.flush().unwrap();
    });
    proxy.rewrite(&manifests(&primary, &backup, "backup", "sk-1", ""));
    eventually("the edit is served while the log keeps growing", || async {
        target_of(&proxy).await == "team-a/backup"
    })
    .await;
    proxy.rewrite(&manifests(&primary, &backup, "primary", "sk-2", ""));
    eventually("the key rotation is used", || async {
        proxy.chat("smart", false).await;
        primary.received().last().unwrap().header("authorization") == Some("Bearer sk-2")
    })
    .await;
    assert!(writer.stop() > 0);
    assert_eq!(proxy.admin_config().await["load"]["generation"], 3);
}

/// A writer that never pauses on the manifest itself: the change is loaded anyway
/// (at most a second after the first event), not once the writes stop.
#[tokio::test]
async fn a_manifest_written_without_pause_is_still_reloaded() {
    let (primary, backup) = two().await;
    let proxy = TestProxy::start(&manifests(&primary, &backup, "primary", "sk-1", "")).await;
    let edit = manifests(&primary, &backup, "backup", "sk-1", "");
    let (dir, manifest) = (proxy.dir.path().to_path_buf(), proxy.manifest.clone());
    // Replaced whole by rename each time, as editors save: never seen half-written.
    let writer = Writer::start(move |n| {
        let tmp = dir.join(format!(".switchback.yaml.{n}"));
        std::fs::write(&tmp, &edit).unwrap();
        std::fs::rename(&tmp, &manifest).unwrap();
    });
    eventually("the edit is served while the writes go on", || async {
        target_of(&proxy).await == "team-a/backup"
    })
    .await;
    assert!(writer.stop() > 0);
    assert!(proxy.admin_config().await["load"]["lastError"].is_null());
}

/// Issue 11 item 10: a manifest truncated to nothing used to be applied, serving no
/// route while `/readyz` stayed ready.
#[tokio::test]
async fn an_emptied_manifest_is_refused_and_the_last_good_config_keeps_serving() {
    let (primary, backup) = two().await;
    let proxy = TestProxy::start(&manifests(&primary, &backup, "primary", "sk-1", "")).await;
    proxy.rewrite("");
    eventually("the empty manifest is refused", || async {
        !proxy.admin_config().await["load"]["lastError"].is_null()
    })
    .await;
    let config = proxy.admin_config().await;
    let problem = &config["load"]["lastError"]["problems"][0];
    assert_eq!(problem["file"], proxy.manifest.display().to_string());
    let message = problem["message"].as_str().unwrap();
    assert!(message.contains("no LLMRoute"), "{message}");
    assert!(message.contains("--allow-empty-config"), "{message}");
    assert_eq!(config["load"]["generation"], 1);
    assert_eq!(target_of(&proxy).await, "team-a/primary");
    let ready = proxy
        .http
        .get(proxy.admin_url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "still ready on the last good config");

    // Credentials alone are no route either.
    proxy.rewrite(&credential(
        "primary",
        "openai",
        &primary.base_url(),
        "sk-1",
    ));
    eventually("the route-less manifest is refused", || async {
        proxy.admin_config().await["load"]["lastError"]["at"] != config["load"]["lastError"]["at"]
    })
    .await;
    assert_eq!(proxy.admin_config().await["load"]["generation"], 1);
    assert_eq!(target_of(&proxy).await, "team-a/primary");
}

#[tokio::test]
async fn with_allow_empty_config_an_emptied_manifest_is_served() {
    let (primary, backup) = two().await;
    let proxy =
        TestProxy::start_configured(&manifests(&primary, &backup, "primary", "sk-1", ""), |o| {
            o.allow_empty_config = true
        })
        .await;
    proxy.rewrite("");
    eventually("the empty manifest is served", || async {
        proxy.admin_config().await["load"]["generation"] == 2
    })
    .await;
    assert_eq!(proxy.chat("smart", false).await.status(), 404);
    let ready = proxy
        .http
        .get(proxy.admin_url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
}

#[tokio::test]
async fn an_empty_manifest_at_startup_is_refused_saying_why() {
    let err = match TestProxy::try_start("", 1024).await {
        Ok(_) => panic!("an empty manifest must not start a proxy"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("switchback.yaml: "), "{err}");
    assert!(err.contains("no LLMRoute"), "{err}");
    assert!(err.contains("--allow-empty-config"), "{err}");

    let proxy = TestProxy::start_configured("", |o| o.allow_empty_config = true).await;
    let ready = proxy
        .http
        .get(proxy.admin_url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let models: serde_json::Value = proxy
        .http
        .get(proxy.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"], serde_json::json!([]));
}

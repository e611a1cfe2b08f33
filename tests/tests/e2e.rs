//! End-to-end tests against a real API server (SPEC §7), run only with
//! `SWITCHBACK_E2E=1`; otherwise each test prints why it skipped.
//!
//! They use the API server KUBECONFIG names (kubectl's current context), create their
//! own namespaces, apply `crds/*.yaml` with kubectl, run the real `switchback-operator`
//! and `switchback-proxy` binaries as local processes (the operator reaches the proxy
//! with `--proxy-admin-url`, the proxy watches its namespace through the API), use the
//! simulated providers of `switchback_tests::sim` on loopback, and clean up after
//! themselves. The cluster must not run another switchback operator (the operator
//! watches every namespace); a throwaway kind/k3d/minikube cluster is the intended
//! target:
//!
//! ```sh
//! SWITCHBACK_E2E=1 cargo test -p switchback-tests --test e2e -- --nocapture --test-threads=1
//! ```
//!
//! `bench_1000_routes_in_50_namespaces` is the issue's benchmark (apply to all
//! Programmed, status writes per second, operator memory); set
//! `SWITCHBACK_E2E_BENCH_ROUTES` to change its size.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchback_tests::binaries::{Process, workspace};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};

/// One operator at a time: it watches every namespace.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn enabled(test: &str) -> bool {
    if std::env::var("SWITCHBACK_E2E").as_deref() == Ok("1") {
        return true;
    }
    println!(
        "skipped {test}: set SWITCHBACK_E2E=1 to run the end-to-end tests against the API server \
         KUBECONFIG names (they need kubectl and create, then delete, their own namespaces)"
    );
    false
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn suffix() -> String {
    uuid_like()[..6].to_string()
}

fn uuid_like() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
    .chars()
    .rev()
    .collect()
}

/// Runs kubectl; returns (success, stdout, stderr).
fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new("kubectl");
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl is installed");
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
fn ok(args: &[&str]) -> String {
    let (success, out, err) = kubectl(args, None);
    assert!(success, "kubectl {}: {err}", args.join(" "));
    out
}

#[track_caller]
fn apply(yaml: &str) {
    // Server-side apply, strict field validation: what GitOps tools do.
    let (success, _, err) = kubectl(
        &[
            "apply",
            "--server-side",
            "--field-manager=e2e",
            "--validate=strict",
            "-f",
            "-",
        ],
        Some(yaml),
    );
    assert!(success, "kubectl apply: {err}\n{yaml}");
}

fn get_json(args: &[&str]) -> Option<Value> {
    let mut full = vec!["get"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", "json"]);
    let (success, out, _) = kubectl(&full, None);
    success.then(|| serde_json::from_str(&out).unwrap())
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Polls `check` until it returns Some, or fails with `what` after `timeout`.
async fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Like [`eventually`], for checks that need to await (traffic).
async fn eventually_async<T, Fut: std::future::Future<Output = Option<T>>>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Fut,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Namespaces created by a test, deleted (finalizers released) on drop.
struct Namespaces(Vec<String>);

impl Namespaces {
    fn create(names: &[String]) -> Namespaces {
        for ns in names {
            ok(&["create", "namespace", ns]);
            ok(&["label", "namespace", ns, "switchback.dev/e2e=true"]);
        }
        Namespaces(names.to_vec())
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            // If the operator is gone, nothing releases the credential finalizer.
            if let Some(list) = get_json(&["providercredentials", "-n", ns]) {
                for item in list["items"].as_array().into_iter().flatten() {
                    let name = item["metadata"]["name"].as_str().unwrap_or_default();
                    let _ = kubectl(
                        &[
                            "patch",
                            "providercredential",
                            name,
                            "-n",
                            ns,
                            "--type=merge",
                            "-p",
                            r#"{"metadata":{"finalizers":null}}"#,
                        ],
                        None,
                    );
                }
            }
            let _ = kubectl(&["delete", "namespace", ns, "--wait=false"], None);
        }
    }
}

fn install_crds() {
    let dir = workspace().join("crds");
    ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        dir.to_str().unwrap(),
    ]);
    ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/llmroutes.switchback.dev",
        "crd/providercredentials.switchback.dev",
    ]);
}

struct Stack {
    bin: PathBuf,
    gateway: String,
    data: u16,
    admin: u16,
    operator_admin: u16,
    proxy: Process,
    operator: Process,
    http: reqwest::Client,
}

impl Stack {
    fn start(gateway: &str, extra_operator_args: &[&str]) -> Stack {
        let bin = switchback_tests::binaries::build();
        let (data, admin, operator_admin) = (free_port(), free_port(), free_port());
        let proxy = Self::proxy(&bin, gateway, data, admin);
        let mut args: Vec<String> = [
            "--gateway-namespace",
            gateway,
            "--proxy-admin-url",
            &format!("http://127.0.0.1:{admin}"),
            "--scrape-interval",
            "500ms",
            "--status-interval",
            "1s",
            "--lease-name",
            "switchback-e2e",
            "--admin-listen",
            &format!("127.0.0.1:{operator_admin}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra_operator_args.iter().map(|s| s.to_string()));
        let operator = Process::start(
            "switchback-operator",
            &bin.join("switchback-operator"),
            &args,
        );
        Stack {
            bin,
            gateway: gateway.to_string(),
            data,
            admin,
            operator_admin,
            proxy,
            operator,
            http: reqwest::Client::new(),
        }
    }

    fn proxy(bin: &Path, gateway: &str, data: u16, admin: u16) -> Process {
        Process::start(
            "switchback-proxy",
            &bin.join("switchback-proxy"),
            &[
                "--namespace".into(),
                gateway.into(),
                "--listen".into(),
                format!("127.0.0.1:{data}"),
                "--admin-listen".into(),
                format!("127.0.0.1:{admin}"),
            ],
        )
    }

    fn restart_proxy(&mut self) {
        self.proxy.stop();
        self.proxy = Self::proxy(&self.bin, &self.gateway, self.data, self.admin);
    }

    async fn chat(&self, model: &str) -> reqwest::Response {
        self.http
            .post(format!(
                "http://127.0.0.1:{}/v1/chat/completions",
                self.data
            ))
            .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("the proxy answers")
    }

    async fn operator_metric(&self, name: &str) -> f64 {
        let text = self
            .http
            .get(format!("http://127.0.0.1:{}/metrics", self.operator_admin))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

fn secret(ns: &str, key: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{ name: provider-keys, namespace: {ns} }}\nstringData: {{ steady: {key}, flaky: flaky-key }}\n"
    )
}

fn credential(ns: &str, name: &str, base_url: &str) -> String {
    format!(
        "---\napiVersion: switchback.dev/v1alpha1\nkind: ProviderCredential\nmetadata: {{ name: {name}, namespace: {ns} }}\n\
         spec: {{ provider: openai-compatible, baseURL: \"{base_url}\", secretRef: {{ name: provider-keys, key: {name} }}, allowPrivateNetwork: true }}\n"
    )
}

fn route(ns: &str, name: &str, models: &str, targets: &str) -> String {
    format!(
        "---\napiVersion: switchback.dev/v1alpha1\nkind: LLMRoute\nmetadata: {{ name: {name}, namespace: {ns} }}\n\
         spec:\n  models: [{models}]\n  targets: {targets}\n  circuitBreaker: {{ consecutiveFailures: 2, openFor: 5m }}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn operator_and_proxy_against_a_real_api_server() {
    if !enabled("operator_and_proxy_against_a_real_api_server") {
        return;
    }
    let _serial = SERIAL.lock().await;
    install_crds();
    let id = suffix();
    let (gw, a, b) = (
        format!("sb-e2e-gw-{id}"),
        format!("sb-e2e-a-{id}"),
        format!("sb-e2e-b-{id}"),
    );
    let _namespaces = Namespaces::create(&[gw.clone(), a.clone(), b.clone()]);
    let steady = SimProvider::start_named("steady", Flavor::OpenAi).await;
    let flaky = SimProvider::start_named("flaky", Flavor::OpenAi).await;
    let mut stack = Stack::start(&gw, &[]);

    // 1. Apply a Secret, two credentials and a route; wait for Programmed.
    apply(&format!(
        "{}{}{}{}",
        secret(&a, "key-1"),
        credential(&a, "steady", &steady.base_url()),
        credential(&a, "flaky", &flaky.base_url()),
        route(
            &a,
            "smart",
            "smart",
            "[ { credentialRef: { name: flaky } }, { credentialRef: { name: steady } } ]"
        ),
    ));
    ok(&[
        "wait",
        "-n",
        &a,
        "--for=condition=Programmed",
        "--timeout=60s",
        "llmroute/smart",
    ]);
    let cm = get_json(&["configmap", "-n", &gw, &format!("switchback-routes-{a}")])
        .expect("the rendered ConfigMap exists");
    assert_eq!(cm["metadata"]["labels"]["switchback.dev/config"], "routes");
    assert!(
        !cm.to_string().contains("key-1"),
        "key material in a ConfigMap"
    );
    let pcred = get_json(&["providercredential", "-n", &a, "steady"]).unwrap();
    assert_eq!(condition(&pcred, "Ready").unwrap()["status"], "True");
    assert_eq!(pcred["status"]["routes"], 1);

    // 2. Traffic, with the first target failing: fallbacks, then an open circuit.
    flaky.set_default(Behavior::ServerError(503));
    for _ in 0..6 {
        let r = stack.chat("smart").await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["x-switchback-target"],
            format!("{a}/steady").as_str()
        );
    }
    let route_json = eventually(
        "attempts, fallbacks and an open circuit in status",
        Duration::from_secs(30),
        || {
            let r = get_json(&["llmroute", "-n", &a, "smart"])?;
            let s = &r["status"];
            (s["totals"]["requests"].as_i64()? >= 6
                && s["window"]["fallbacks"].as_i64()? >= 1
                && s["targets"][0]["circuit"] == "Open"
                && s["openCircuits"].as_i64()? == 1)
                .then_some(r)
        },
    )
    .await;
    assert!(route_json["status"]["totals"]["attempts"].as_i64().unwrap() >= 8);
    let table = ok(&["get", "llmroutes", "-n", &a]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "MODE",
            "TARGETS",
            "PROGRAMMED",
            "OPEN",
            "REQUESTS",
            "FALLBACKS",
            "AGE"
        ]
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..5],
        ["smart", "fallback", "2", "True", "1"],
        "{table}"
    );
    let events = ok(&[
        "get",
        "events",
        "-n",
        &a,
        "--field-selector",
        "reason=CircuitOpened",
    ]);
    assert!(events.contains("CircuitOpened"), "{events}");

    // 3. Restart the proxy: totals keep growing.
    let before = route_json["status"]["totals"]["requests"].as_i64().unwrap();
    stack.restart_proxy();
    eventually(
        "the restarted proxy to be ready",
        Duration::from_secs(30),
        || std::net::TcpStream::connect(("127.0.0.1", stack.data)).ok(),
    )
    .await;
    ok(&[
        "wait",
        "-n",
        &a,
        "--for=condition=Programmed",
        "--timeout=60s",
        "llmroute/smart",
    ]);
    for _ in 0..3 {
        assert_eq!(stack.chat("smart").await.status(), 200);
    }
    eventually(
        "totals to grow past the restart",
        Duration::from_secs(30),
        || {
            let r = get_json(&["llmroute", "-n", &a, "smart"])?;
            (r["status"]["totals"]["requests"].as_i64()? >= before + 3).then_some(())
        },
    )
    .await;

    // 4. Rotate the Secret: the new key is used.
    apply(&secret(&a, "key-2"));
    eventually_async(
        "the rotated key upstream",
        Duration::from_secs(20),
        || async {
            stack.chat("smart").await;
            let last = steady.received().last().cloned()?;
            (last.header("authorization") == Some("Bearer key-2")).then_some(())
        },
    )
    .await;

    // 5. Invalid routes: refused by the API server, or a condition.
    let bad = route(
        &a,
        "bad",
        "bad",
        "[ { credentialRef: { name: steady }, retry: { attempts: 7 } } ]",
    );
    let (accepted, _, err) = kubectl(&["apply", "--server-side", "-f", "-"], Some(&bad));
    assert!(
        !accepted && err.contains("attempts"),
        "schema refuses attempts 7: {err}"
    );
    apply(&route(
        &a,
        "dangling",
        "dangling",
        "[ { credentialRef: { name: nope } } ]",
    ));
    ok(&[
        "wait",
        "-n",
        &a,
        "--timeout=30s",
        "--for=jsonpath={.status.conditions[?(@.type==\"ResolvedRefs\")].reason}=CredentialNotFound",
        "llmroute/dangling",
    ]);
    apply(&format!(
        "{}{}{}",
        secret(&b, "key-b"),
        credential(&b, "steady", &steady.base_url()),
        route(
            &b,
            "copycat",
            "smart",
            "[ { credentialRef: { name: steady } } ]"
        ),
    ));
    ok(&[
        "wait",
        "-n",
        &b,
        "--timeout=30s",
        "--for=jsonpath={.status.conditions[?(@.type==\"Accepted\")].reason}=ModelConflict",
        "llmroute/copycat",
    ]);

    // 6. Delete a referenced credential: held by the finalizer, with an Event.
    ok(&[
        "delete",
        "providercredential",
        "-n",
        &a,
        "steady",
        "--wait=false",
    ]);
    eventually(
        "DeletionBlocked on the credential",
        Duration::from_secs(20),
        || {
            let c = get_json(&["providercredential", "-n", &a, "steady"])?;
            let ready = condition(&c, "Ready")?;
            (c["metadata"]["deletionTimestamp"].is_string()
                && ready["reason"] == "DeletionBlocked"
                && ready["message"].as_str()?.contains("smart"))
            .then_some(())
        },
    )
    .await;
    let events = ok(&[
        "get",
        "events",
        "-n",
        &a,
        "--field-selector",
        "reason=DeletionBlocked",
    ]);
    assert!(events.contains("smart"), "{events}");
    assert_eq!(
        stack.chat("smart").await.status(),
        200,
        "still serving while held"
    );

    // 7. Delete the routes: the credential goes, then the namespace's rendered objects.
    ok(&["delete", "llmroute", "-n", &a, "smart", "dangling"]);
    ok(&[
        "wait",
        "-n",
        &a,
        "--for=delete",
        "--timeout=30s",
        "providercredential/steady",
    ]);
    eventually(
        "the rendered objects of a namespace without routes to go",
        Duration::from_secs(20),
        || {
            let cm = get_json(&["configmap", "-n", &gw, &format!("switchback-routes-{a}")]);
            let s = get_json(&["secret", "-n", &gw, &format!("switchback-keys-{a}")]);
            (cm.is_none() && s.is_none()).then_some(())
        },
    )
    .await;
    eventually_async(
        "the proxy to stop serving the deleted route",
        Duration::from_secs(10),
        || async { (stack.chat("smart").await.status() == 404).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bench_1000_routes_in_50_namespaces() {
    if !enabled("bench_1000_routes_in_50_namespaces") {
        return;
    }
    let _serial = SERIAL.lock().await;
    install_crds();
    let routes: usize = std::env::var("SWITCHBACK_E2E_BENCH_ROUTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let namespaces = 50.min(routes.max(1));
    let id = suffix();
    let gw = format!("sb-bench-gw-{id}");
    let names: Vec<String> = (0..namespaces)
        .map(|i| format!("sb-bench-{i:02}-{id}"))
        .collect();
    let mut all = vec![gw.clone()];
    all.extend(names.iter().cloned());
    let _namespaces = Namespaces::create(&all);
    let sim = SimProvider::start_named("bench", Flavor::OpenAi).await;
    let budget = 20.0;
    let stack = Stack::start(&gw, &["--status-writes-per-second", "20"]);

    let mut yaml = String::new();
    for ns in &names {
        yaml.push_str(&secret(ns, "key"));
        yaml.push_str(&credential(ns, "steady", &sim.base_url()));
    }
    for i in 0..routes {
        let ns = &names[i % namespaces];
        yaml.push_str(&route(
            ns,
            &format!("r{i}"),
            &format!("m{i}"),
            "[ { credentialRef: { name: steady } } ]",
        ));
    }
    let writes_before = stack
        .operator_metric("switchback_operator_status_writes_total")
        .await;
    let start = Instant::now();
    apply(&yaml);
    let applied = start.elapsed();
    let programmed = eventually("every route Programmed", Duration::from_secs(600), || {
        let mut count = 0;
        for ns in &names {
            let list = get_json(&["llmroutes", "-n", ns])?;
            count += list["items"]
                .as_array()?
                .iter()
                .filter(|r| condition(r, "Programmed").is_some_and(|c| c["status"] == "True"))
                .count();
        }
        (count == routes).then(|| start.elapsed())
    })
    .await;
    let writes = stack
        .operator_metric("switchback_operator_status_writes_total")
        .await
        - writes_before;
    let rate = writes / programmed.as_secs_f64();
    let rss_kib = std::fs::read_to_string(format!("/proc/{}/status", stack.operator.pid()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    println!("bench: {routes} routes in {namespaces} namespaces");
    println!("bench: kubectl apply took {:.1} s", applied.as_secs_f64());
    println!(
        "bench: apply to all Programmed {:.1} s",
        programmed.as_secs_f64()
    );
    println!("bench: {writes} status writes, {rate:.1} per second (budget {budget})");
    println!("bench: operator RSS {:.1} MiB", rss_kib as f64 / 1024.0);
    // The budget holds, allowing its one-second burst.
    assert!(
        writes <= budget * (programmed.as_secs_f64() + 1.0),
        "{writes} writes"
    );
}

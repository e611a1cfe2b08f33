//! The chart installed the way a platform team installs it
//! (docs/development.md#the-end-to-end-suite, README.md#in-a-cluster-the-quickstart),
//! against the API server KUBECONFIG names, with `SWITCHBACK_E2E=1` (otherwise each test
//! prints why it skipped).
//!
//! `helm install` with a real Helm (`SWITCHBACK_HELM`, or `helm` on PATH; `.ci/chart`
//! fetches one), then the chart's Deployments run by [`Kubelet`] as a cluster would run
//! them: each container's own arguments, environment and mounted Secrets, as its
//! Deployment's ServiceAccount (impersonated), so a permission the chart's RBAC does
//! not grant fails here with the server's 403, as it would in a cluster. On the loopback
//! API server of `../shared/k8s` the tests also read its log and fail on any RBAC
//! denial of the chart's ServiceAccounts.
//!
//! - `the_readme_quickstart_on_a_helm_install` runs the README's cluster quickstart
//!   verbatim, block by block in one shell, except for what it says it replaces: the
//!   provider block (a simulated provider, on loopback: a private address, so the
//!   helm install gets `egress.allowPrivateNetworkNamespaces={team-a}`,
//!   docs/security.md#where-the-proxies-connect) and the port-forward (a loopback port the
//!   test forwards to a proxy pod).
//! - `namespaced_mode_reads_only_its_namespaces` installs with `watchNamespaces`.
//!
//! They use fixed namespaces (`switchback-system`, `team-a`, and `sb-nsmode-*`),
//! remove what an earlier run left there, and clean up after themselves. Like the rest
//! of the end-to-end suite they need a cluster that runs no other switchback operator.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchback_tests::binaries::{self, workspace};
use switchback_tests::kubectl::{condition, get_json, kubectl_ok, release_credentials, rendered};
use switchback_tests::kubelet::Kubelet;
use switchback_tests::sim::{Flavor, SimProvider};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// One install at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn enabled(test: &str) -> bool {
    if std::env::var("SWITCHBACK_E2E").as_deref() == Ok("1") {
        return true;
    }
    println!(
        "skipped {test}: set SWITCHBACK_E2E=1 (and SWITCHBACK_HELM or helm on PATH) to install \
         the chart into the API server KUBECONFIG names"
    );
    false
}

/// The Helm binary: `SWITCHBACK_HELM`, or `helm` on PATH.
fn helm() -> PathBuf {
    if let Ok(path) = std::env::var("SWITCHBACK_HELM") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("helm"))
            .find(|p| p.is_file())
    });
    found.expect(
        "SWITCHBACK_E2E=1 installs the chart with Helm: set SWITCHBACK_HELM or put helm on PATH \
         (bash .ci/chart fetches one)",
    )
}

/// Runs a command; returns (success, stdout + stderr).
fn run(program: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(workspace())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// kubectl's success and its stdout and stderr together.
fn kubectl(args: &[&str]) -> (bool, String) {
    let (ok, out, err) = switchback_tests::kubectl::kubectl(args, None);
    (ok, out + &err)
}

/// Removes a release and its namespaces (what an earlier run may have left), waiting
/// until the namespaces are gone.
fn uninstall(helm: &Path, release: &str, namespace: &str, others: &[&str]) {
    let _ = run(helm, &["uninstall", release, "-n", namespace, "--wait"]);
    let mut all = vec![namespace];
    all.extend_from_slice(others);
    for ns in &all {
        // Credentials hold a finalizer the (gone) operator would release.
        release_credentials(ns);
        let _ = kubectl(&[
            "delete",
            "namespace",
            ns,
            "--wait=false",
            "--ignore-not-found",
        ]);
    }
    let start = Instant::now();
    while all.iter().any(|ns| kubectl(&["get", "namespace", ns]).0) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "namespaces {all:?} are still there after 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The loopback API server's log (`../shared/k8s`), where every RBAC denial is written;
/// None on another cluster.
fn apiserver_log() -> Option<PathBuf> {
    let dir = std::env::var("K8S_DIR").unwrap_or_else(|_| "/tmp/k8s".into());
    let log = Path::new(&dir).join("log/kube-apiserver.log");
    let config = std::env::var("KUBECONFIG").unwrap_or_default();
    (log.is_file() && config.starts_with(&dir)).then_some(log)
}

/// The RBAC denials of ServiceAccounts of `namespace` logged after byte `from`.
///
/// One line is not a denial of anything asked for, and is left out: before it checks
/// that a Role's rules grant no more than their writer holds, the API server asks
/// whether the writer may `escalate` (kube-apiserver does the same, logging the
/// answer at -v=5). The operator may not (it writes the proxies' reader Role and may
/// grant only what it holds), so each write of that Role logs this "no".
fn denials(log: &Path, from: u64, namespace: &str) -> Vec<String> {
    let text = std::fs::read(log).unwrap_or_default();
    let fresh = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default()).into_owned();
    let who = format!("no rules authorize user \"system:serviceaccount:{namespace}:");
    let escalate_probe = |l: &str| {
        l.contains("to \"escalate\" resource \"roles.rbac.authorization.k8s.io\" named \"")
            && l.contains("-proxy-reader\"")
    };
    fresh
        .lines()
        .filter(|l| l.contains(&who) && !escalate_probe(l))
        .map(str::to_string)
        .collect()
}

/// Where the pods' folders and logs go.
fn pods_dir(name: &str) -> PathBuf {
    let dir = workspace().join("target/e2e-logs").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A loopback port forwarded to `port` of the first pod of `deployment`, in place of
/// `kubectl port-forward` (nothing runs pods here).
async fn forward(kubelet: Arc<Kubelet>, deployment: String, port: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let Some(target) = kubelet.port(&deployment, port) else {
                continue;
            };
            tokio::spawn(async move {
                if let Ok(mut outbound) =
                    tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    local
}

/// One bash, fed block after block as a user pastes them: variables carry over, and
/// the first failing command (`-e`) ends it, failing the block.
struct Shell {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

const DONE: &str = "quickstart-block-done-7f3a";

impl Shell {
    async fn start(helm: &Path) -> Shell {
        let path = format!(
            "{}:{}",
            helm.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = tokio::process::Command::new("bash")
            .args(["--noprofile", "--norc", "-e"])
            .env("PATH", path)
            .current_dir(workspace())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("bash runs");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"exec 2>&1\n").await.unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Shell {
            child,
            stdin,
            lines,
        }
    }

    /// Runs `block`; its output, or Err with the output when a command failed.
    async fn run(&mut self, block: &str, within: Duration) -> Result<String, String> {
        let script = format!("{block}\necho {DONE}\n");
        self.stdin.write_all(script.as_bytes()).await.unwrap();
        let mut out = String::new();
        let read = async {
            loop {
                match self.lines.next_line().await {
                    // After output with no final newline (curl's body), on its line.
                    Ok(Some(line)) if line.ends_with(DONE) => {
                        let rest = line.trim_end_matches(DONE);
                        if !rest.is_empty() {
                            out.push_str(rest);
                            out.push('\n');
                        }
                        return true;
                    }
                    Ok(Some(line)) => {
                        out.push_str(&line);
                        out.push('\n');
                    }
                    _ => return false,
                }
            }
        };
        match tokio::time::timeout(within, read).await {
            Ok(true) => Ok(out),
            Ok(false) => {
                let status = self.child.wait().await.ok();
                Err(format!(
                    "{out}(the shell ended: a command failed, {status:?})"
                ))
            }
            Err(_) => Err(format!("{out}(still running after {within:?})")),
        }
    }
}

/// The `sh` blocks of the README's quickstart, in order.
fn quickstart_blocks(readme: &str) -> Vec<String> {
    let start = readme
        .find("<!-- quickstart:start")
        .expect("README.md has a <!-- quickstart:start marker");
    let end = readme[start..]
        .find("<!-- quickstart:end -->")
        .map(|e| start + e)
        .expect("README.md has a <!-- quickstart:end --> marker");
    let mut blocks = Vec::new();
    let mut rest = &readme[start..end];
    while let Some(open) = rest.find("```sh\n") {
        let body = &rest[open + "```sh\n".len()..];
        let close = body.find("\n```").expect("a closed sh block");
        blocks.push(body[..close].to_string());
        rest = &body[close + 4..];
    }
    blocks
}

/// The value the install test adds to the quickstart's `helm install`: its simulated
/// provider is on loopback, a private network the platform must allow
/// (docs/security.md#where-the-proxies-connect).
const ALLOW_TEAM_A: &str = "--set 'egress.allowPrivateNetworkNamespaces={team-a}'";

/// What the test replaces in the quickstart, each exactly once: the provider block
/// (a simulated provider on loopback in place of yours, which the helm install then
/// allows by [`ALLOW_TEAM_A`]), the port-forward line and the port it makes (a loopback
/// port the test forwards to a proxy pod).
fn substitute(blocks: &[String], provider_url: &str, port: u16) -> Vec<String> {
    let mut provider = 0;
    let mut forwards = 0;
    let mut installs = 0;
    let out: Vec<String> = blocks
        .iter()
        .map(|block| {
            if block.starts_with("helm install switchback ") && !block.contains('\n') {
                installs += 1;
                return format!("{block} {ALLOW_TEAM_A}");
            }
            if block.starts_with("# Your provider") {
                provider += 1;
                return format!(
                    "# tests/tests/install.rs: a simulated provider on loopback in place of yours.\n\
                     PROVIDER_URL={provider_url}\nPROVIDER_MODEL=gpt-4o-mini\n\
                     PROVIDER_KEY=sk-quickstart-test\nPROVIDER_IN_MY_NETWORK=true"
                );
            }
            block
                .lines()
                .map(|line| {
                    if line.starts_with("kubectl -n switchback-system port-forward") {
                        forwards += 1;
                        format!(
                            "# tests/tests/install.rs: localhost:{port} forwards to a proxy pod \
                             in place of this port-forward."
                        )
                    } else {
                        line.replace("localhost:8080", &format!("localhost:{port}"))
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    assert_eq!(
        provider, 1,
        "the quickstart has one '# Your provider' block"
    );
    assert_eq!(forwards, 1, "the quickstart has one port-forward");
    assert_eq!(installs, 1, "the quickstart has one one-line helm install");
    out
}

/// Columns of a `kubectl get` table by header name, for the row starting with `name`.
fn table_row(out: &str, name: &str) -> std::collections::BTreeMap<String, String> {
    let mut lines = out.lines().skip_while(|l| !l.starts_with("NAME"));
    let header = lines.next().unwrap_or_default();
    let row = lines
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_default();
    header
        .split_whitespace()
        .zip(row.split_whitespace())
        .map(|(h, v)| (h.to_string(), v.to_string()))
        .collect()
}

/// Fails with the pods' logs' tails.
fn pod_logs(kubelet: &Kubelet) -> String {
    kubelet
        .logs()
        .iter()
        .map(|log| format!("--- {}\n{}\n", log.display(), binaries::tail(log, 30)))
        .collect()
}

#[test]
fn the_quickstart_has_the_blocks_the_install_test_runs() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let blocks = quickstart_blocks(&readme);
    assert!(
        blocks[0].starts_with("helm install switchback charts/switchback"),
        "{}",
        blocks[0]
    );
    assert!(blocks[0].contains("--wait"));
    let run = substitute(&blocks, "http://127.0.0.1:1/v1", 4242);
    let all = run.join("\n");
    assert!(all.contains("PROVIDER_URL=http://127.0.0.1:1/v1"));
    assert!(all.contains("curl -si localhost:4242/v1/chat/completions"));
    assert!(!all.contains("port-forward svc"), "{all}");
    assert!(all.contains("Authorization: Bearer $KEY"));
    assert!(all.contains("kind: LLMClient"));
    assert!(all.contains("kubectl get llmroutes -n team-a"));
    assert!(
        run[0].ends_with(ALLOW_TEAM_A),
        "the simulated provider is allowed by the platform: {}",
        run[0]
    );
    // From a fresh install, the quickstart as written needs no private network: its
    // target that is down is a name that never resolves, and only your provider may
    // ask for a private network (PROVIDER_IN_MY_NETWORK).
    let verbatim = blocks.join("\n");
    assert!(!blocks[0].contains("allowPrivateNetwork"), "{}", blocks[0]);
    assert!(
        verbatim.contains("baseURL: https://down.invalid/v1"),
        "{verbatim}"
    );
    assert!(
        !verbatim.contains("allowPrivateNetwork: true"),
        "the quickstart allows a private network by itself:\n{verbatim}"
    );
    assert!(
        verbatim.contains("PROVIDER_IN_MY_NETWORK=false"),
        "{verbatim}"
    );
}

/// The one command of README.md#in-a-cluster-the-quickstart, verbatim: a fresh install is
/// healthy with no route (`helm install --wait` returns), a route reaches Ready, a
/// client key gets 200, the first target being down shows as a fallback in the
/// response and in `kubectl get llmroutes`; every process runs as the chart's
/// ServiceAccounts and the API server denies them nothing.
#[tokio::test(flavor = "multi_thread")]
async fn the_readme_quickstart_on_a_helm_install() {
    if !enabled("the_readme_quickstart_on_a_helm_install") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let helm = helm();
    let bin = binaries::build();
    let (release, ns) = ("switchback", "switchback-system");
    uninstall(&helm, release, ns, &["team-a"]);
    let log = apiserver_log();
    let log_from = log.as_deref().map(binaries::log_len).unwrap_or(0);
    let client = kube::Client::try_default()
        .await
        .expect("KUBECONFIG names a cluster");
    let sim = SimProvider::start_named("quickstart", Flavor::OpenAi).await;
    let kubelet = Arc::new(Kubelet::start(client, ns, &bin, &pods_dir("quickstart")));
    let port = forward(kubelet.clone(), format!("{release}-proxy"), "http").await;

    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let blocks = substitute(&quickstart_blocks(&readme), &sim.base_url(), port);
    let mut shell = Shell::start(&helm).await;
    let mut outputs = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        println!("--- quickstart block {i}:\n{block}");
        let started = Instant::now();
        match shell.run(block, Duration::from_secs(300)).await {
            Ok(out) => {
                println!("{out}(block {i}: {:.1?})", started.elapsed());
                outputs.push(out);
            }
            Err(out) => {
                kubelet.check();
                panic!(
                    "quickstart block {i} failed:\n{out}\n{}",
                    pod_logs(&kubelet)
                );
            }
        }
        if i == 0 {
            fresh_install_is_healthy(&kubelet, release).await;
        }
    }
    kubelet.check();

    // helm install --wait returned on a fresh install, with the chart's NOTES.
    assert!(outputs[0].contains("STATUS: deployed"), "{}", outputs[0]);
    // The request: the provider's answer through the second target.
    let answer = outputs
        .iter()
        .find(|o| o.contains("HTTP/1.1"))
        .expect("the curl block's output");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let header = |name: &str| {
        answer
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map(str::trim)
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(header("x-switchback-target"), "team-a/main", "{answer}");
    assert_eq!(header("x-switchback-fallbacks"), "1", "{answer}");
    let received = sim.received();
    assert_eq!(received.len(), 1, "one request reached the provider");
    assert_eq!(received[0].model(), Some("gpt-4o-mini"));
    assert_eq!(
        received[0].header("authorization"),
        Some("Bearer sk-quickstart-test"),
        "the credential's key, not the client's"
    );
    // kubectl get llmroutes shows the fallback.
    let table = outputs.last().unwrap();
    let row = table_row(table, "smart");
    assert_eq!(
        row.get("FALLBACKS").map(String::as_str),
        Some("1"),
        "{table}"
    );
    assert_eq!(
        row.get("PROGRAMMED").map(String::as_str),
        Some("True"),
        "{table}"
    );
    // SERVING (docs/troubleshooting.md#target-states): the first target is tried but
    // answers nothing.
    assert_eq!(
        row.get("SERVING").map(String::as_str),
        Some("main"),
        "{table}"
    );

    // Ready with kstatus's observedGeneration, on every kind.
    for (kind, name) in [
        ("llmroute", "smart"),
        ("providercredential", "main"),
        ("llmclient", "checkout"),
    ] {
        let obj = get_json(&[kind, "-n", "team-a", name]).unwrap();
        let ready = condition(&obj, "Ready").unwrap_or_else(|| panic!("{kind} has Ready: {obj}"));
        assert_eq!(ready["status"], "True", "{kind}: {ready}");
        assert_eq!(
            obj["status"]["observedGeneration"], obj["metadata"]["generation"],
            "{kind}"
        );
        assert!(condition(&obj, "Reconciling").is_none() && condition(&obj, "Stalled").is_none());
    }
    // The generated Secrets: the operator's, the proxies mount them.
    for (secret, key, len) in [
        (format!("{release}-client-key-hmac"), "hmac", 64),
        (format!("{release}-admin-token"), "token", 48),
    ] {
        let s = get_json(&["secret", "-n", ns, &secret]).expect("the operator created it");
        assert_eq!(
            s["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "switchback-operator"
        );
        assert!(s["metadata"]["ownerReferences"].is_null());
        let encoded = s["data"][key].as_str().unwrap();
        assert!(encoded.len() >= len * 4 / 3, "{secret}.{key}");
    }
    a_rotated_key_reaches_the_proxies(&mut shell, &sim, port).await;
    the_fleets_view_reaches_the_proxies(&kubelet, release, ns).await;
    // Every process ran as its Deployment's ServiceAccount, and was denied nothing.
    kubelet.with_pods(&format!("{release}-operator"), |pods| {
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].service_account, format!("{release}-operator"));
        // The chart value reached the operator's flag (docs/security.md#where-the-proxies-connect).
        assert!(
            pods[0]
                .args
                .iter()
                .any(|a| a == "--allow-private-network-namespaces=team-a"),
            "{:?}",
            pods[0].args
        );
    });
    kubelet.with_pods(&format!("{release}-proxy"), |pods| {
        assert_eq!(pods.len(), 2, "the chart's two proxy replicas");
        assert!(
            pods.iter()
                .all(|p| p.service_account == format!("{release}-proxy"))
        );
    });
    match &log {
        Some(log) => {
            let denied = denials(log, log_from, ns);
            assert!(
                denied.is_empty(),
                "RBAC denied the chart's ServiceAccounts:\n{}",
                denied.join("\n")
            );
        }
        None => println!("not the loopback API server: its RBAC denials are not read from a log"),
    }
    // After the denials are read: the access reviews below are logged as denials too.
    the_proxy_reads_only_what_it_serves(ns, release, "team-a");

    drop(shell);
    drop(kubelet);
    uninstall(&helm, release, ns, &["team-a"]);
}

/// The fleet's health view reaches the proxies running as their ServiceAccount, which
/// watch it by name (issue 32 item 5): a view written by hand that opens the healthy
/// `team-a/main` target's circuit, its probes left to a replica that does not exist,
/// is adopted by both replicas within 10 s.
async fn the_fleets_view_reaches_the_proxies(kubelet: &Kubelet, release: &str, ns: &str) {
    use base64::Engine;
    use switchback_crds::fleet::{FleetCircuit, FleetView, TargetView, VIEW_VERSION, format_ms};
    let secret = get_json(&["secret", "-n", ns, &format!("{release}-admin-token")])
        .expect("the admin token");
    let token = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["token"].as_str().unwrap())
        .unwrap();
    let token = String::from_utf8(token).unwrap().trim().to_string();
    let admins: Vec<u16> = kubelet.with_pods(&format!("{release}-proxy"), |pods| {
        pods.iter().map(|p| p.port("admin")).collect()
    });
    let http = reqwest::Client::new();
    // The `main` target of route smart, as replica `port` reports it.
    let main_target = |port: u16| {
        let (http, token) = (http.clone(), token.clone());
        async move {
            let url = format!("http://127.0.0.1:{port}/admin/v1/stats");
            let stats: Value = http
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let route = stats["routes"]
                .as_array()?
                .iter()
                .find(|r| r["route"]["name"] == "smart")?;
            route["targets"]
                .as_array()?
                .iter()
                .find(|t| t["credential"]["name"] == "main")
                .cloned()
        }
    };
    let main = main_target(admins[0])
        .await
        .expect("route smart's target main");
    for &port in &admins {
        let t = main_target(port).await.expect("route smart's target main");
        assert_eq!(t["circuit"], "Closed", "before the view: {t}");
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let view = FleetView {
        version: VIEW_VERSION,
        expires_at: format_ms(now + 60_000),
        targets: vec![TargetView {
            credential: serde_json::from_value(main["credential"].clone()).unwrap(),
            model: main["model"].as_str().map(str::to_string),
            circuit: FleetCircuit::Open,
            since: format_ms(now),
            until: Some(format_ms(now + 60_000)),
            prober: Some("a-replica-that-does-not-exist".into()),
        }],
        keys: Vec::new(),
    };
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "switchback-health", "namespace": ns},
        "data": {"view.json": serde_json::to_string(&view).unwrap()},
    });
    let (applied, _, err) =
        switchback_tests::kubectl::kubectl(&["apply", "-f", "-"], Some(&cm.to_string()));
    assert!(applied, "{err}");
    let start = Instant::now();
    for &port in &admins {
        loop {
            let t = main_target(port).await.unwrap_or_default();
            if t["circuit"] == "Open" {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "replica on admin port {port} did not adopt the view: {t}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    println!("the view reached both replicas in {:?}", start.elapsed());
    kubectl_ok(&["delete", "configmap", "-n", ns, "switchback-health"]);
}

/// A provider key rotated in the user's Secret is served: the operator writes a new
/// keys Secret, grants the proxies `get` on it, then names it in the index
/// (operator/README.md#what-it-writes, docs/security.md#what-the-proxy-can-read); the
/// proxies, which may read nothing else, fetch it by name.
async fn a_rotated_key_reaches_the_proxies(shell: &mut Shell, sim: &SimProvider, port: u16) {
    let patch = r#"kubectl -n team-a patch secret provider-keys --type=merge -p '{"stringData":{"apiKey":"sk-quickstart-rotated"}}'"#;
    shell.run(patch, Duration::from_secs(30)).await.unwrap();
    let key = shell
        .run("echo \"$KEY\"", Duration::from_secs(5))
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let start = Instant::now();
    loop {
        let r = http
            .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .bearer_auth(key.trim())
            .json(&serde_json::json!({"model": "smart", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let sent = sim
            .received()
            .last()
            .unwrap()
            .header("authorization")
            .map(str::to_string);
        if sent.as_deref() == Some("Bearer sk-quickstart-rotated") {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the rotated key is not served after 30 s (still {sent:?})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// docs/security.md#what-the-proxy-can-read, "each component reads only what it serves": as
/// its ServiceAccount, the proxy may get the index and the objects it names, and nothing
/// else of its namespace: not the Helm release Secret, not the operator's generated
/// Secrets, no list of Secrets or ConfigMaps.
fn the_proxy_reads_only_what_it_serves(ns: &str, release: &str, team: &str) {
    let proxy = format!("system:serviceaccount:{ns}:{release}-proxy");
    let helm_secret = format!("sh.helm.release.v1.{release}.v1");
    assert!(
        get_json(&["secret", "-n", ns, &helm_secret]).is_some(),
        "the Helm release Secret exists: the question below is about a real object"
    );
    let index = get_json(&["configmap", "-n", ns, "switchback-index"]).expect("the index");
    let index: Value = serde_json::from_str(index["data"]["index.json"].as_str().unwrap()).unwrap();
    let entry = &index["namespaces"][team];
    let keys = format!("secret/{}", entry["keys"].as_str().unwrap());
    let part = format!("configmap/{}", entry["parts"][0].as_str().unwrap());
    let can = |verb: &str, what: &str| {
        let (_, out) = kubectl(&["auth", "can-i", verb, what, "-n", ns, "--as", &proxy]);
        out.trim().to_string()
    };
    for (verb, what, want) in [
        ("get", format!("secret/{helm_secret}"), "no"),
        ("list", "secrets".to_string(), "no"),
        ("watch", "secrets".to_string(), "no"),
        ("get", format!("secret/{release}-client-key-hmac"), "no"),
        ("get", format!("secret/{release}-admin-token"), "no"),
        ("list", "configmaps".to_string(), "no"),
        ("get", "configmap/kube-root-ca.crt".to_string(), "no"),
        ("get", "configmap/switchback-index".to_string(), "yes"),
        // The fleet's health view: read and watched by name, never written.
        ("get", "configmap/switchback-health".to_string(), "yes"),
        ("watch", "configmap/switchback-health".to_string(), "yes"),
        ("update", "configmap/switchback-health".to_string(), "no"),
        ("get", keys.clone(), "yes"),
        ("get", part.clone(), "yes"),
        ("update", part, "no"),
        ("delete", keys, "no"),
    ] {
        assert_eq!(
            can(verb, &what),
            want,
            "kubectl auth can-i {verb} {what} as the proxy"
        );
    }
}

/// Right after `helm install --wait`: both proxies ready with no route
/// (docs/proxy.md#loading-and-reloading-config).
async fn fresh_install_is_healthy(kubelet: &Kubelet, release: &str) {
    let http = reqwest::Client::new();
    let admin_ports: Vec<u16> = kubelet.with_pods(&format!("{release}-proxy"), |pods| {
        pods.iter().map(|p| p.port("admin")).collect()
    });
    assert_eq!(admin_ports.len(), 2);
    for admin in admin_ports {
        let r = http
            .get(format!("http://127.0.0.1:{admin}/readyz"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "a fresh install's proxy is ready");
    }
}

/// `watchNamespaces`: Roles in the listed namespaces only. A route there is served; a
/// route in another namespace is never reconciled, and nothing is denied (the operator
/// never even asks).
#[tokio::test(flavor = "multi_thread")]
async fn namespaced_mode_reads_only_its_namespaces() {
    if !enabled("namespaced_mode_reads_only_its_namespaces") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let helm = helm();
    let bin = binaries::build();
    let (release, ns) = ("sb-nsmode", "sb-nsmode-system");
    let (a, b, outside) = ("sb-nsmode-a", "sb-nsmode-b", "sb-nsmode-c");
    uninstall(&helm, release, ns, &[a, b, outside]);
    for team in [a, b, outside] {
        kubectl_ok(&["create", "namespace", team]);
    }
    // The user's own client-key HMAC secret (auth.existingSecret): read, never replaced,
    // and nothing generated in its place.
    kubectl_ok(&["create", "namespace", ns]);
    let hmac = "an-hmac-secret-the-platform-team-keeps-in-its-vault-0123456789";
    kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "team-hmac",
        "-n",
        ns,
        &format!("--from-literal=hmac={hmac}"),
    ]);
    let log = apiserver_log();
    let log_from = log.as_deref().map(binaries::log_len).unwrap_or(0);
    let client = kube::Client::try_default()
        .await
        .expect("KUBECONFIG names a cluster");
    let sim = SimProvider::start_named("nsmode", Flavor::OpenAi).await;
    let kubelet = Kubelet::start(client, ns, &bin, &pods_dir("nsmode"));
    let chart = workspace().join("charts/switchback");
    let (ok, out) = run(
        &helm,
        &[
            "install",
            release,
            chart.to_str().unwrap(),
            "-n",
            ns,
            "--create-namespace",
            "--wait",
            "--timeout=3m",
            &format!("--set=watchNamespaces={{{a},{b}}}"),
            "--set=proxy.replicas=1",
            "--set=proxy.threads=1",
            "--set=proxy.limits.maxConnections=321",
            "--set=proxy.limits.maxBodyBytes=65536",
            "--set=auth.existingSecret=team-hmac",
            // Its simulated provider is on loopback
            // (docs/security.md#where-the-proxies-connect: the platform's decision).
            &format!("--set=egress.allowPrivateNetworkNamespaces={{{a}}}"),
        ],
    );
    assert!(ok, "helm install:\n{out}\n{}", pod_logs(&kubelet));
    kubelet
        .wait_ready(&format!("{release}-proxy"), 1, Duration::from_secs(60))
        .await;

    for team in [a, outside] {
        let manifest = format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{ name: keys, namespace: {team} }}\n\
             stringData: {{ provider: sk-nsmode, client: client-key-{team} }}\n---\n\
             apiVersion: switchback.dev/v1alpha1\nkind: ProviderCredential\n\
             metadata: {{ name: sim, namespace: {team} }}\n\
             spec: {{ provider: openai-compatible, baseURL: \"{}\", secretRef: {{ name: keys, key: provider }}, allowPrivateNetwork: true }}\n---\n\
             apiVersion: switchback.dev/v1alpha1\nkind: LLMRoute\nmetadata: {{ name: smart, namespace: {team} }}\n\
             spec: {{ targets: [ {{ credentialRef: {{ name: sim }}, model: m }} ] }}\n---\n\
             apiVersion: switchback.dev/v1alpha1\nkind: LLMClient\nmetadata: {{ name: app, namespace: {team} }}\n\
             spec: {{ keySecretRef: {{ name: keys, key: client }} }}\n",
            sim.base_url()
        );
        let mut child = std::process::Command::new("kubectl")
            .args(["apply", "--server-side", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(manifest.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());
    }
    kubectl_ok(&[
        "wait",
        "-n",
        a,
        "--for=condition=Ready",
        "--timeout=120s",
        "llmroute/smart",
        "llmclient/app",
    ]);
    let data = kubelet.port(&format!("{release}-proxy"), "http").unwrap();
    let http = reqwest::Client::new();
    let r = http
        .post(format!("http://127.0.0.1:{data}/v1/chat/completions"))
        .bearer_auth(format!("client-key-{a}"))
        .json(
            &serde_json::json!({"model": "smart", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        200,
        "the key hashed with the user's HMAC secret authenticates"
    );
    let kept = get_json(&["secret", "-n", ns, "team-hmac"]).unwrap();
    assert!(kept["metadata"]["labels"]["app.kubernetes.io/managed-by"].is_null());
    assert!(
        get_json(&["secret", "-n", ns, &format!("{release}-client-key-hmac")]).is_none(),
        "nothing generated in place of an existingSecret"
    );
    // The outside namespace's client key is unknown: its objects were never read.
    let r = http
        .post(format!("http://127.0.0.1:{data}/v1/chat/completions"))
        .bearer_auth(format!("client-key-{outside}"))
        .json(
            &serde_json::json!({"model": "smart", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // A few seconds more for anything the outside route could get: nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let route = get_json(&["llmroute", "-n", outside, "smart"]).unwrap();
    assert!(route["status"].is_null(), "never reconciled: {route}");
    assert!(
        rendered("configmaps", ns, outside).is_empty()
            && rendered("secrets", ns, outside).is_empty(),
        "nothing rendered for {outside}"
    );
    // No 403 storm: the operator never asked for what it may not have (read before the
    // access reviews below, which the API server logs as denials too).
    let operator_log =
        kubelet.with_pods(&format!("{release}-operator"), |pods| pods[0].log.clone());
    let text = std::fs::read_to_string(&operator_log).unwrap_or_default();
    assert!(
        !text.contains("forbidden"),
        "the operator was refused something:\n{text}"
    );
    if let Some(log) = &log {
        let denied = denials(log, log_from, ns);
        assert!(denied.is_empty(), "RBAC denied:\n{}", denied.join("\n"));
    }
    // Nothing cluster-wide for the operator, and no Secret outside the list.
    let operator = format!("system:serviceaccount:{ns}:{release}-operator");
    for (namespace, allowed) in [(a, "yes"), (b, "yes"), (outside, "no")] {
        let (_, out) = kubectl(&[
            "auth", "can-i", "list", "secrets", "-n", namespace, "--as", &operator,
        ]);
        assert_eq!(out.trim(), allowed, "list secrets in {namespace}");
    }
    let (_, out) = kubectl(&[
        "auth",
        "can-i",
        "list",
        "llmroutes.switchback.dev",
        "-A",
        "--as",
        &operator,
    ]);
    assert_eq!(out.trim(), "no", "no cluster-wide reads");
    the_proxy_reads_only_what_it_serves(ns, release, a);
    // The values reached the proxy's flags.
    let admin = kubelet.port(&format!("{release}-proxy"), "admin").unwrap();
    let token = kubectl_ok(&[
        "get",
        "secret",
        "-n",
        ns,
        &format!("{release}-admin-token"),
        "-o",
        "jsonpath={.data.token}",
    ]);
    let token = {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(token.trim())
            .expect("a Secret's data is base64");
        String::from_utf8(bytes).unwrap()
    };
    let config: Value = http
        .get(format!("http://127.0.0.1:{admin}/admin/v1/config"))
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(config["settings"]["threads"], 1, "{}", config["settings"]);
    assert_eq!(config["settings"]["maxConnections"], 321);
    assert_eq!(config["settings"]["maxBodyBytes"], 65536);
    assert_eq!(config["auth"], "required");
    kubelet.check();
    drop(kubelet);
    uninstall(&helm, release, ns, &[a, b, outside]);
}

//! The operator hands over cleanly (docs/security.md#one-operator-acts-at-a-time), against
//! the API server KUBECONFIG names with `SWITCHBACK_E2E=1` (otherwise each test prints why
//! it skipped): two `switchback-operator` processes elect a leader on one Lease.
//!
//! - `a_leader_whose_api_stops_answering_stops_before_the_standby_leads`: the leader
//!   reaches the API server through a TCP forwarder of the test's, which is then
//!   paused (bytes no longer forwarded, sockets kept open: an API server that stops
//!   answering, as a network partition looks to a client). The leader must stop its
//!   controllers (its log line, with its timestamp) before the standby takes the
//!   Lease (the standby's own log line), never after.
//! - `sigterm_hands_over_within_seconds`: on SIGTERM the leader releases the Lease and
//!   exits within 10 s, and a standby leads within 5 s of the release.
//!
//! They run the operators with `--log-format json` and read the timestamps the
//! processes wrote themselves (one clock: the same machine). Like the rest of the
//! end-to-end suite they need a cluster that runs no other switchback operator.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use switchback_tests::binaries::{self, Process, workspace};
use switchback_tests::kubectl::{get_json, kubectl, kubectl_ok};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// One test at a time: each runs operators that watch every namespace.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LEADING: &str = "leading: starting the controllers";
const STOPPED: &str = "stopped leading: the controllers are stopped";
const RELEASED: &str = "released the leader Lease";
const WAITING: &str = "waiting to lead";

fn enabled(test: &str) -> bool {
    if std::env::var("SWITCHBACK_E2E").as_deref() == Ok("1") {
        return true;
    }
    println!(
        "skipped {test}: set SWITCHBACK_E2E=1 to run two operators against the API server \
         KUBECONFIG names"
    );
    false
}

fn log_dir() -> PathBuf {
    let dir = workspace().join("target/e2e-logs");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A TCP forwarder to `target` that can be paused: while paused, bytes already read
/// wait and nothing more is read or written, but every socket stays open, so a client
/// sees an API server that stopped answering (not a refused or reset connection).
struct Forwarder {
    port: u16,
    paused: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    async fn start(target: (String, u16)) -> Forwarder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (paused, _) = watch::channel(false);
        let gate = paused.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(target.clone()).await else {
                    continue;
                };
                let (in_r, in_w) = inbound.into_split();
                let (out_r, out_w) = outbound.into_split();
                tokio::spawn(pump(in_r, out_w, gate.subscribe()));
                tokio::spawn(pump(out_r, in_w, gate.subscribe()));
            }
        });
        Forwarder { port, paused, task }
    }

    fn pause(&self, paused: bool) {
        self.paused.send_replace(paused);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding while the gate says paused (before reading and
/// before writing what was read).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if gate.wait_for(|paused| !paused).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if gate.wait_for(|paused| !paused).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The API server's host and port, from the kubeconfig.
fn api_server(config: &Value) -> (String, u16) {
    let server = config["clusters"][0]["cluster"]["server"].as_str().unwrap();
    let rest = server.trim_start_matches("https://");
    let authority = rest.split('/').next().unwrap();
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "443"));
    (
        host.trim_matches(['[', ']']).to_string(),
        port.parse().unwrap(),
    )
}

/// A kubeconfig like the admin's, reaching the API server through `port` on loopback
/// (the same certificate holds: the server is still 127.0.0.1 to TLS).
fn kubeconfig_through(config: &Value, port: u16, path: &Path) {
    let mut config = config.clone();
    for cluster in config["clusters"].as_array_mut().unwrap() {
        cluster["cluster"]["server"] = Value::String(format!("https://127.0.0.1:{port}"));
    }
    std::fs::write(path, serde_json::to_vec(&config).unwrap()).unwrap();
}

/// One operator process, leader candidate on `lease` in `gateway`.
struct Operator {
    name: String,
    process: Process,
    log: PathBuf,
}

impl Operator {
    fn start(name: &str, gateway: &str, lease: &str, kubeconfig: Option<&Path>) -> Operator {
        let log = log_dir().join(format!("handover-{name}.log"));
        let _ = std::fs::remove_file(&log);
        let [admin] = binaries::free_ports::<1>();
        let args: Vec<String> = [
            "--gateway-namespace",
            gateway,
            "--lease-name",
            lease,
            "--log-format",
            "json",
            "--proxy-admin-url",
            "http://127.0.0.1:9",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--admin-listen=127.0.0.1:{admin}")])
        .collect();
        let config = kubeconfig.map(|p| p.display().to_string());
        let env: Vec<(&str, &str)> = config
            .as_deref()
            .map(|c| vec![("KUBECONFIG", c)])
            .unwrap_or_default();
        let process = Process::spawn(
            "switchback-operator",
            &binaries::build().join("switchback-operator"),
            &args,
            &env,
            Some(&log),
        );
        Operator {
            name: name.to_string(),
            process,
            log,
        }
    }

    /// When the operator logged a line whose message starts with `message` (its own
    /// timestamp), if it did.
    fn logged(&self, message: &str) -> Option<Timestamp> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().find_map(|line| {
            let v: Value = serde_json::from_str(line).ok()?;
            let m = v["fields"]["message"].as_str()?;
            if !m.starts_with(message) {
                return None;
            }
            v["timestamp"].as_str()?.parse().ok()
        })
    }

    /// Waits (polling its log) until it logged `message`; fails with its log's tail.
    async fn wait_logged(&self, message: &str, within: Duration) -> Timestamp {
        let start = Instant::now();
        loop {
            if let Some(at) = self.logged(message) {
                return at;
            }
            assert!(
                start.elapsed() < within,
                "{} did not log {message:?} within {within:?}:\n{}",
                self.name,
                binaries::tail(&self.log, 30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the process exited; its exit status.
    async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.process.exited() {
                // Its exit is what the test waited for: no news on drop.
                self.process.stop();
                return status;
            }
            assert!(
                start.elapsed() < within,
                "{} still runs after {within:?}:\n{}",
                self.name,
                binaries::tail(&self.log, 30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn sigterm(&self) {
        let pid = self.process.pid().to_string();
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM {pid}");
    }
}

/// The holder of `lease` in `namespace`, as the API server has it.
fn holder(namespace: &str, lease: &str) -> Option<String> {
    let l = get_json(&["lease", "-n", namespace, lease])?;
    l["spec"]["holderIdentity"].as_str().map(str::to_string)
}

/// A gateway namespace of the test's, deleted on drop.
struct Gateway(String);

impl Gateway {
    fn create(prefix: &str) -> Gateway {
        let id = format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        let name = format!("{prefix}-{id}");
        kubectl_ok(&["create", "namespace", &name]);
        Gateway(name)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = kubectl(&["delete", "namespace", &self.0, "--wait=false"], None);
    }
}

fn install_crds() {
    let dir = workspace().join("crds");
    kubectl_ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        dir.to_str().unwrap(),
    ]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_whose_api_stops_answering_stops_before_the_standby_leads() {
    if !enabled("a_leader_whose_api_stops_answering_stops_before_the_standby_leads") {
        return;
    }
    let _serial = SERIAL.lock().await;
    install_crds();
    let gw = Gateway::create("sb-handover");
    let lease = "sb-handover";
    let admin = switchback_tests::kubelet::admin_kubeconfig();
    let forwarder = Arc::new(Forwarder::start(api_server(&admin)).await);
    let through = log_dir().join(format!("{}-kubeconfig.json", gw.0));
    kubeconfig_through(&admin, forwarder.port, &through);

    let mut leader = Operator::start("leader", &gw.0, lease, Some(&through));
    leader.wait_logged(LEADING, Duration::from_secs(60)).await;
    let standby = Operator::start("standby", &gw.0, lease, None);
    standby.wait_logged(WAITING, Duration::from_secs(60)).await;
    // The standby has seen the Lease held (a few renewals) and waits.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        standby.logged(LEADING).is_none(),
        "two leaders before any fault"
    );
    let held_by = holder(&gw.0, lease).expect("the Lease exists");

    // The API stops answering the leader: its renewals hang.
    forwarder.pause(true);
    let paused_at = Timestamp::now();
    let took_over = standby.wait_logged(LEADING, Duration::from_secs(60)).await;
    let stopped = leader.logged(STOPPED).unwrap_or_else(|| {
        panic!(
            "the standby leads since {took_over} while the old leader never stopped acting \
             (paused at {paused_at}):\n--- leader\n{}",
            binaries::tail(&leader.log, 20)
        )
    });
    println!(
        "paused {paused_at}; the leader stopped {stopped} ({:.1} s later); the standby led \
         {took_over} ({:.1} s after the stop)",
        stopped.duration_since(paused_at).as_secs_f64(),
        took_over.duration_since(stopped).as_secs_f64()
    );
    assert!(
        stopped < took_over,
        "the leader stopped at {stopped}, after the standby took over at {took_over}"
    );
    // It stopped within the renew deadline (10 s) of its last renewal (at most one
    // renew interval, 2 s, before the pause), with a margin for a loaded machine.
    assert!(
        stopped.duration_since(paused_at).as_secs_f64() < 12.0,
        "stopped {stopped}, paused {paused_at}"
    );
    let now_held = holder(&gw.0, lease).expect("the Lease exists");
    assert_ne!(now_held, held_by, "the standby holds the Lease now");
    // The old leader exits to be restarted as a candidate, saying why.
    let status = leader.wait_exit(Duration::from_secs(15)).await;
    assert!(!status.success(), "{status}");
    forwarder.pause(false);
    drop(standby);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_hands_over_within_seconds() {
    if !enabled("sigterm_hands_over_within_seconds") {
        return;
    }
    let _serial = SERIAL.lock().await;
    install_crds();
    let gw = Gateway::create("sb-sigterm");
    let lease = "sb-sigterm";
    let mut leader = Operator::start("sigterm-leader", &gw.0, lease, None);
    leader.wait_logged(LEADING, Duration::from_secs(60)).await;
    let standby = Operator::start("sigterm-standby", &gw.0, lease, None);
    standby.wait_logged(WAITING, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(standby.logged(LEADING).is_none());

    let sent = Instant::now();
    leader.sigterm();
    let status = leader.wait_exit(Duration::from_secs(10)).await;
    let exited_after = sent.elapsed();
    assert!(status.success(), "{status}");
    let released = leader
        .logged(RELEASED)
        .expect("the leader released the Lease");
    let took_over = standby.wait_logged(LEADING, Duration::from_secs(10)).await;
    let handover = took_over.duration_since(released).as_secs_f64();
    println!(
        "SIGTERM: exited after {exited_after:.1?}; the standby led {handover:.2} s after the release"
    );
    assert!(handover > 0.0 && handover < 5.0, "{handover} s");
}

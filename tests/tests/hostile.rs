//! Hostile clients are bounded before authentication
//! (docs/security.md#what-a-hostile-client-can-and-cannot-do), on the real
//! `switchback-proxy` binary: headers over `--max-header-bytes` get 431; connections that
//! never finish their headers are cut at the header deadline and keep the replica's memory
//! bounded meanwhile; clients that stop reading their answer are disconnected after
//! `--client-write-timeout` and give back what they held; the admin port caps its
//! connections and closes idle ones, and `/healthz` answers throughout. And restarts
//! (`docs/proxy.md`: "Ports"): a second proxy started on the ports of a draining one waits
//! for them and takes both, or exits having bound neither.
//!
//! The limits are set short by flag so each test takes seconds; the assertions are on
//! behaviour (answered, closed, released), with generous bounds for a shared machine.
//! Hundreds of sockets at once: the file-descriptor limit is raised (soft to hard)
//! first, and a test says so and stops if it is still too low.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use switchback_tests::binaries::{Process, build, free_ports, metric, proxy_args, scrape, tail};
use switchback_tests::harness::{chat_body, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

/// Generous: the tests share two cores with each other and with cargo.
const PROMPTLY: Duration = Duration::from_secs(10);

struct Proxy {
    process: Process,
    data: u16,
    admin: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The real binary on free loopback ports, serving one route `m` to `sim`, with
/// `extra` flags.
fn start(sim: &SimProvider, extra: &[&str]) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("switchback.yaml");
    std::fs::write(&manifest, manifests(sim)).unwrap();
    let log = dir.path().join("proxy.log");
    let bin = build().join("switchback-proxy");
    let (process, [data, admin]) = Process::start_listening(
        "switchback-proxy",
        &bin,
        |[data, admin]: [u16; 2]| proxy_args(&manifest, data, admin, extra),
        &log,
        "switchback-proxy serving",
    );
    Proxy {
        process,
        data,
        admin,
        log,
        _dir: dir,
    }
}

fn manifests(sim: &SimProvider) -> String {
    [
        credential("p", "openai", &sim.base_url(), "sk-p"),
        route(
            "r",
            "  models: [m]\n  targets:\n    - credentialRef: { name: p }\n",
        ),
    ]
    .concat()
}

impl Proxy {
    fn data_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.data))
    }

    fn admin_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.admin))
    }

    async fn metric(&self, name: &str) -> u64 {
        let text = scrape(self.admin).await;
        metric(&text, name).unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
    }

    async fn refusals(&self, limit: &str) -> u64 {
        self.metric(&format!(
            "switchback_limit_refusals_total{{limit=\"{limit}\"}}"
        ))
        .await
    }

    /// A well-behaved client on a new connection: 200 within [`PROMPTLY`].
    async fn serves(&self) {
        let r = timeout(
            PROMPTLY,
            fresh_client()
                .post(format!("http://{}/v1/chat/completions", self.data_addr()))
                .json(&chat_body("m", false))
                .send(),
        )
        .await
        .expect("the data port answers in time")
        .expect("the data port answers");
        assert_eq!(r.status(), 200, "{}", tail(&self.log, 20));
    }

    /// `/healthz` on a new connection: 200 within [`PROMPTLY`].
    async fn healthy(&self) {
        let h = timeout(
            PROMPTLY,
            fresh_client()
                .get(format!("http://{}/healthz", self.admin_addr()))
                .send(),
        )
        .await
        .expect("/healthz answers in time")
        .expect("/healthz answers");
        assert_eq!(h.status(), 200);
    }

    /// The peak resident memory of the process so far, in bytes (`VmHWM`).
    fn peak_rss(&self) -> u64 {
        status_kib(self.process.pid(), "VmHWM:") * 1024
    }
}

/// A line of /proc/PID/status, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A client that opens a new connection for every request (never a pooled one the
/// proxy may have closed as idle).
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// Raises this process's soft file-descriptor limit to its hard one (children inherit
/// it); true when at least `needed` descriptors are then allowed.
fn enough_fds(needed: u64) -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return false;
        }
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
    }
    if lim.rlim_cur < needed {
        eprintln!(
            "this test needs {needed} file descriptors and `ulimit -n` allows {}: not run",
            lim.rlim_cur
        );
        return false;
    }
    true
}

/// Reads until the peer closes (or resets) the connection; the bytes it sent.
async fn until_closed(tcp: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    read_to_end(tcp, &mut got).await;
    got
}

/// Reads into `got` until the peer closes (or resets) the connection.
async fn read_to_end(tcp: &mut TcpStream, got: &mut Vec<u8>) {
    let mut buf = [0u8; 16 << 10];
    loop {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A request head of about `n` bytes, padded with header lines of `line` bytes (far
/// fewer than hyper's 100 headers), unfinished (no blank line) unless `finished`.
fn head(n: usize, line: usize, finished: bool) -> Vec<u8> {
    let mut h =
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            .to_vec();
    let mut i = 0;
    while h.len() < n {
        let value = "a".repeat(line.min(n - h.len()));
        h.extend_from_slice(format!("x-pad-{i:05}: {value}\r\n").as_bytes());
        i += 1;
    }
    if finished {
        h.extend_from_slice(b"content-length: 2\r\n\r\n{}");
    }
    h
}

#[tokio::test]
async fn a_header_over_max_header_bytes_gets_431_and_never_reaches_authentication() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    // Every request needs a client key: a request that reached authentication
    // would get 401.
    let p = start(&sim, &["--auth", "required"]);
    // One header of 60 KiB is within the default 64 KiB: authentication answers.
    let mut tcp = TcpStream::connect(p.data_addr()).await.unwrap();
    tcp.write_all(&head(60 << 10, 60 << 10, true))
        .await
        .unwrap();
    let answer = timeout(PROMPTLY, until_closed(&mut tcp)).await.unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");

    // 100 KiB: 431, and the connection is closed, before authentication.
    let mut tcp = TcpStream::connect(p.data_addr()).await.unwrap();
    // The proxy may answer and close before it has read all of it.
    let _ = tcp.write_all(&head(100 << 10, 100 << 10, true)).await;
    let answer = timeout(PROMPTLY, until_closed(&mut tcp))
        .await
        .expect("answered and closed");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    assert!(!text.contains("invalid_api_key"), "{text}");
    assert_eq!(p.refusals("max_header_bytes").await, 1);
    p.healthy().await;
}

/// 1,500 connections each trickle 60 KiB of headers (under the 64 KiB limit) in 4 KiB
/// pieces and never end them, on a proxy with `extra` flags; a real client is served
/// meanwhile; every one of them is closed without a byte (at the header deadline, or
/// at once when its head does not fit in the head budget). The proxy's peak RSS, and
/// the head bytes it held then, and the proxy, are returned.
async fn unfinished_heads(sim: &SimProvider, extra: &[&str]) -> (u64, u64, Proxy) {
    const CONNECTIONS: usize = 1500;
    let header_timeout = Duration::from_secs(15);
    let mut flags = vec!["--header-read-timeout", "15s", "--idle-timeout", "15s"];
    flags.extend_from_slice(extra);
    let p = start(sim, &flags);
    let before = p.peak_rss();
    let addr = p.data_addr();
    let padding = head(60 << 10, 4 << 10, false);
    let opened = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let padding = padding.clone();
        clients.push(tokio::spawn(async move {
            let mut tcp = TcpStream::connect(addr).await.expect("connect");
            for piece in padding.chunks(4 << 10) {
                if tcp.write_all(piece).await.is_err() {
                    break;
                }
                sleep(Duration::from_millis(20)).await;
            }
            tcp
        }));
    }
    let mut sockets = Vec::new();
    for c in clients {
        sockets.push(c.await.unwrap());
    }
    let sent_in = opened.elapsed();
    assert!(
        sent_in < header_timeout,
        "the test could not open its connections within the header timeout ({sent_in:?})"
    );
    p.serves().await;
    p.healthy().await;
    let held = p.metric("switchback_header_bytes_held").await;
    let peak = p.peak_rss();
    eprintln!(
        "{extra:?}: peak RSS {} MiB before, {} MiB with {CONNECTIONS} unfinished heads of \
         60 KiB ({} MiB of them held)",
        before >> 20,
        peak >> 20,
        held >> 20
    );
    let deadline = opened + header_timeout + PROMPTLY;
    for mut tcp in sockets {
        let rest = tokio::time::timeout_at(deadline, until_closed(&mut tcp))
            .await
            .expect("every unfinished head is cut");
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    }
    let cut =
        p.refusals("header_read_timeout").await + p.refusals("max_inflight_header_bytes").await;
    assert!(cut >= CONNECTIONS as u64, "{cut}");
    assert_eq!(p.metric("switchback_header_bytes_held").await, 0);
    p.serves().await;
    (peak, held, p)
}

/// Each unfinished head holds at most `--max-header-bytes` (hyper's buffer stops
/// growing there): with a head budget large enough for all of them, 1,500 heads of
/// 60 KiB stay under 200 MiB, and the header deadline cuts them (the issue measured
/// 264 MiB before the limit).
#[tokio::test]
async fn unfinished_heads_each_hold_at_most_max_header_bytes_and_are_cut_at_the_deadline() {
    if !enough_fds(5000) {
        return;
    }
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let (peak, held, p) =
        unfinished_heads(&sim, &["--max-inflight-header-bytes", "268435456"]).await;
    assert!(peak < 200 << 20, "peak RSS {} MiB", peak >> 20);
    assert!(held > 32 << 20, "every head was held: {held}");
    assert!(p.refusals("header_read_timeout").await >= 1500);
    assert_eq!(p.refusals("max_inflight_header_bytes").await, 0);
}

/// With the default head budget (32 MiB) the same flood holds no more than that:
/// heads that do not fit are closed at once, the others at the header deadline.
#[tokio::test]
async fn unfinished_heads_together_hold_at_most_the_head_budget() {
    if !enough_fds(5000) {
        return;
    }
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let (peak, held, p) = unfinished_heads(&sim, &[]).await;
    assert!(peak < 200 << 20, "peak RSS {} MiB", peak >> 20);
    assert!(held <= 32 << 20, "{held}");
    assert!(p.refusals("max_inflight_header_bytes").await >= 1);
    assert!(p.refusals("header_read_timeout").await >= 1);
}

#[tokio::test]
async fn clients_that_never_read_their_answer_are_disconnected_and_release_what_they_held() {
    const READERS: usize = 40;
    if !enough_fds(500) {
        return;
    }
    let sim = SimProvider::start(Flavor::OpenAi).await;
    // 4 MiB answers: 32 of them fill the default 128 MiB answer budget.
    sim.set_default(Behavior::AnswerText("x".repeat(4 << 20)));
    let p = start(&sim, &["--client-write-timeout", "2s"]);
    let body = serde_json::to_vec(&chat_body("m", false)).unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut stalled = Vec::new();
    for _ in 0..READERS {
        // A small receive window: the answer cannot all sit in the kernel's buffers.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut tcp = socket.connect(p.data_addr()).await.unwrap();
        tcp.write_all(request.as_bytes()).await.unwrap();
        tcp.write_all(&body).await.unwrap();
        stalled.push(tcp);
    }
    // The answers are being held for them...
    let started = Instant::now();
    loop {
        let held = p.metric("switchback_response_bytes_held").await;
        if held >= 16 << 20 {
            break;
        }
        assert!(started.elapsed() < PROMPTLY, "answers never held: {held}");
        sleep(Duration::from_millis(50)).await;
    }
    // ... until the write timeout disconnects them and gives every byte back.
    let started = Instant::now();
    loop {
        let held = p.metric("switchback_response_bytes_held").await;
        if held == 0 {
            break;
        }
        assert!(
            started.elapsed() < PROMPTLY + Duration::from_secs(2),
            "{held} bytes still held for clients that do not read"
        );
        sleep(Duration::from_millis(100)).await;
    }
    // Others are served again, at once.
    for _ in 0..3 {
        p.serves().await;
    }
    assert!(p.refusals("client_write_timeout").await >= 1);
    // The stalled clients that were given an answer to hold were disconnected (their
    // sockets read to an end, short of the answer); the others were refused whole,
    // 503 `overloaded` while the budget was full, and wait on keep-alive like any
    // client that has its answer.
    let mut disconnected = 0;
    for (i, mut tcp) in stalled.into_iter().enumerate() {
        let mut got = Vec::new();
        if timeout(PROMPTLY, read_to_end(&mut tcp, &mut got))
            .await
            .is_ok()
        {
            assert!(got.len() < 4 << 20, "client {i} was sent its whole answer");
            disconnected += 1;
            continue;
        }
        let got = String::from_utf8_lossy(&got);
        assert!(
            got.starts_with("HTTP/1.1 503") && got.contains("overloaded"),
            "client {i} is neither disconnected nor refused: {}",
            &got[..got.len().min(300)]
        );
    }
    assert!(
        disconnected >= READERS / 2,
        "only {disconnected} of {READERS} stalled clients were disconnected"
    );
    p.healthy().await;
}

#[tokio::test]
async fn idle_admin_connections_are_capped_and_closed_while_healthz_answers() {
    const IDLE: usize = 2000;
    if !enough_fds(3 * IDLE as u64 + 500) {
        return;
    }
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let p = start(
        &sim,
        &[
            "--admin-max-connections",
            "64",
            "--admin-idle-timeout",
            "3s",
        ],
    );
    let opened = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(p.admin_addr()).await.expect("connect"));
    }
    // Probes keep answering while the idle ones come and go.
    for _ in 0..5 {
        p.healthy().await;
        sleep(Duration::from_millis(200)).await;
    }
    // Each idle connection is closed by the proxy, without a byte: past the cap at
    // once, the others after the idle timeout.
    let deadline = opened + Duration::from_secs(3) + PROMPTLY * 2;
    for mut tcp in idle {
        let rest = tokio::time::timeout_at(deadline, until_closed(&mut tcp))
            .await
            .expect("every idle admin connection is closed");
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    }
    p.healthy().await;
    // Each was closed for one reason or the other, and both happened.
    let (capped, idled) = (
        p.refusals("admin_max_connections").await,
        p.refusals("admin_idle_timeout").await,
    );
    eprintln!("{IDLE} idle admin connections: {capped} closed at the cap, {idled} idle");
    assert!(capped >= 1 && idled >= 1, "{capped} {idled}");
    assert!(capped + idled >= IDLE as u64, "{capped} + {idled}");
    let config: Value = fresh_client()
        .get(format!("http://{}/admin/v1/config", p.admin_addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(config["settings"]["adminMaxConnections"], 64);
}

/// Starts the binary on given ports (no retry on other ports: the test is about
/// these).
fn start_on(dir: &Path, name: &str, data: u16, admin: u16, extra: &[&str]) -> (Process, PathBuf) {
    let manifest = dir.join("switchback.yaml");
    let log = dir.join(format!("{name}.log"));
    let bin = build().join("switchback-proxy");
    let process = Process::start_logged(
        "switchback-proxy",
        &bin,
        &proxy_args(&manifest, data, admin, extra),
        &log,
    );
    (process, log)
}

/// True when a plain socket (no `SO_REUSEPORT`) can bind `port` now: nobody listens
/// on it.
fn free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

#[tokio::test]
async fn a_proxy_started_on_the_ports_of_a_draining_one_waits_and_takes_both_over() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let stuck = SimProvider::start_named("stuck", Flavor::OpenAi).await;
    stuck.set_default(Behavior::StallMidStream { chunks: 2 });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("switchback.yaml"),
        [
            manifests(&sim),
            credential("stuck", "openai", &stuck.base_url(), "sk-stuck"),
            route(
                "stuck",
                "  models: [stuck]\n  targets:\n    - credentialRef: { name: stuck }\n",
            ),
        ]
        .concat(),
    )
    .unwrap();
    let [data, admin] = free_ports::<2>();
    let drain = ["--drain-delay", "1s", "--shutdown-grace", "4s"];
    let (mut old, _) = start_on(dir.path(), "old", data, admin, &drain);
    old.wait_for_log(0, "switchback-proxy serving", PROMPTLY)
        .unwrap_or_else(|e| panic!("{e}"));
    // A stream that never ends keeps the old one draining for the whole grace.
    let stream = tokio::spawn(
        fresh_client()
            .post(format!("http://127.0.0.1:{data}/v1/chat/completions"))
            .json(&chat_body("stuck", true))
            .send(),
    );
    stuck.wait_hits(1).await;
    old.signal("TERM");
    old.wait_for_log(0, "stopped accepting", PROMPTLY)
        .unwrap_or_else(|e| panic!("{e}"));

    let (mut new, new_log) = start_on(dir.path(), "new", data, admin, &["--listen-wait", "30s"]);
    new.wait_for_log(0, "waiting", PROMPTLY)
        .unwrap_or_else(|e| panic!("the new proxy does not wait for the ports: {e}"));
    // While it waits it holds neither port: once the old one has closed its data
    // listeners (it stopped accepting), nobody listens there.
    let started = Instant::now();
    while !free(data) {
        assert!(
            started.elapsed() < PROMPTLY,
            "someone listens on the data port while the old one drains"
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert!(new.exited().is_none(), "{}", tail(&new_log, 20));

    // The old one exits after its grace; the new one takes both ports and serves.
    assert!(old.wait_exit(PROMPTLY).success());
    new.wait_for_log(0, "switchback-proxy serving", PROMPTLY)
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = stream.await;
    let r = fresh_client()
        .post(format!("http://127.0.0.1:{data}/v1/chat/completions"))
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = fresh_client()
        .get(format!("http://127.0.0.1:{admin}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status(), 200);
    assert!(!free(data) && !free(admin));
    assert!(new.exited().is_none());
}

#[tokio::test]
async fn a_proxy_that_cannot_get_its_admin_port_exits_having_bound_neither() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("switchback.yaml"), manifests(&sim)).unwrap();
    let [data, admin] = free_ports::<2>();
    // Somebody else holds the admin port for good.
    let holder = std::net::TcpListener::bind(("127.0.0.1", admin)).unwrap();
    let (mut p, log) = start_on(dir.path(), "p", data, admin, &["--listen-wait", "2s"]);
    p.wait_for_log(0, "waiting", PROMPTLY)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        free(data),
        "the data port is held while the admin port is awaited"
    );
    assert!(!p.wait_exit(PROMPTLY).success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("cannot listen on 127.0.0.1:{admin}")) && text.contains("2s"),
        "{text}"
    );
    assert!(free(data));
    drop(holder);
}

//! Proxy overhead benchmark: what does putting `switchback-proxy` in front of a provider
//! cost, in throughput, latency and memory?
//!
//! Run it with (one command, release mode only):
//!
//! ```text
//! cargo run --release -p switchback-tests --example bench
//! ```
//!
//! What it does:
//!
//! 1. starts a simulated OpenAI provider on loopback, in this process, on its own tokio
//!    runtime, with request recording off;
//! 2. writes a manifest (route `bench` → that provider) into a temporary folder, builds
//!    the release `switchback-proxy` binary if needed (`cargo build --release -p
//!    switchback-proxy`, a no-op when it is fresh) and starts it as a child process on
//!    two free loopback ports, then waits for its `/readyz`;
//! 3. drives `POST /v1/chat/completions` from an in-process load generator (its own
//!    tokio runtime; HTTP/1.1 keep-alive, one connection per worker, each worker sends
//!    its next request as soon as the previous one ends) for every cell of
//!    {unary, streaming} × {concurrency 1, 64, 256} × {DIRECT to the simulator,
//!    THROUGH the proxy}. Streams are `Behavior::Stream { chunks: 20, interval: 0 }`,
//!    so they are compute-bound, not timer-bound;
//! 4. stops the proxy (by the pid of the child it started) and prints the tables.
//!
//! Each cell runs 1 s of warm-up, then `BENCH_SECONDS` (default 3) of measurement, and
//! also stops after [`MAX_REQUESTS_PER_CELL`] requests, so the run always ends by itself.
//! Only requests that complete inside the measurement window count.
//!
//! How to read the output:
//!
//! - `req/s`: completed 200 responses per second; `p50`/`p99`: latency percentiles in
//!   µs, time to the last byte of the body (for streams, a second table gives the time
//!   to the first body byte, i.e. the first SSE event);
//! - `thru %`: proxy throughput as a percentage of direct throughput at the same
//!   concurrency; `+p50`/`+p99`: latency the proxy adds (proxy minus direct, µs; small
//!   negative values are noise);
//! - `errors`: non-200 answers and transport errors during the window (should be 0);
//! - the proxy's peak RSS is `VmHWM` of the child process after all cells;
//! - the verdict compares the unary cells with the budget: added p99 at concurrency
//!   64 < 1 ms, and throughput through the proxy >= 50% of direct.
//!
//! The generator, the simulator and the proxy share the machine's cores, so the
//! absolute figures are those of a crowded box: direct cells measure generator +
//! simulator, proxy cells measure generator + proxy + simulator on the same cores.
//! Read the ratios, not the capacity.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use switchback_tests::harness::{chat_body, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout_at};

/// Concurrency levels (simultaneous workers, one connection each).
const CONCURRENCY: [usize; 3] = [1, 64, 256];
/// Warm-up before each cell's measurement window.
const WARMUP: Duration = Duration::from_secs(1);
/// Measurement window when `BENCH_SECONDS` is not set.
const DEFAULT_SECONDS: f64 = 3.0;
/// Hard stop per cell, whatever the clock says.
const MAX_REQUESTS_PER_CELL: u64 = 2_000_000;
/// A request slower than this counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the proxy may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// SSE events per simulated stream.
const STREAM_CHUNKS: usize = 20;
/// The route (and so the model name) the proxy serves.
const ROUTE: &str = "bench";
const CHAT_PATH: &str = "/v1/chat/completions";
/// Budget the unary cells are judged against.
const BUDGET_ADDED_P99_C64: Duration = Duration::from_millis(1);
const BUDGET_THROUGHPUT_PCT: f64 = 50.0;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Unary,
    Stream,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Unary => "unary",
            Mode::Stream => "stream",
        }
    }
}

fn run() -> Result<(), String> {
    if cfg!(debug_assertions) {
        return Err("debug build: benchmark numbers would be meaningless; run \
             `cargo run --release -p switchback-tests --example bench`"
            .into());
    }
    let measure = measure_window()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load_before = load_average();

    // The simulator lives on its own runtime so that its threads are not the generator's.
    let sim_rt = runtime("sim", cores)?;
    let sim = sim_rt.block_on(SimProvider::start_named("bench", Flavor::OpenAi));
    sim.set_recording(false);

    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let manifest = dir.path().join("switchback.yaml");
    let manifests = format!(
        "{}{}",
        credential("sim", "openai", &sim.base_url(), "sk-bench"),
        route(ROUTE, "  targets:\n    - credentialRef: { name: sim }\n"),
    );
    std::fs::write(&manifest, manifests).map_err(|e| format!("write manifest: {e}"))?;

    let bin = proxy_binary()?;
    let (data_addr, admin_addr) = free_ports()?;
    let mut proxy = ProxyChild::spawn(&bin, &manifest, data_addr, admin_addr, dir.path())?;

    let gen_rt = runtime("load", cores)?;
    gen_rt.block_on(wait_ready(admin_addr, &mut proxy))?;
    gen_rt.block_on(smoke_test(sim.addr(), data_addr, &proxy))?;

    eprintln!(
        "bench: {cores} cores; {} s warm-up + {:.1} s per cell; 12 cells",
        WARMUP.as_secs(),
        measure.as_secs_f64()
    );
    let mut rows = Vec::new();
    for mode in [Mode::Unary, Mode::Stream] {
        sim.set_default(match mode {
            Mode::Unary => Behavior::Answer,
            Mode::Stream => Behavior::Stream {
                chunks: STREAM_CHUNKS,
                interval: Duration::ZERO,
            },
        });
        for conc in CONCURRENCY {
            let direct = gen_rt.block_on(run_cell(sim.addr(), mode, conc, measure));
            eprintln!(
                "bench: {:>6} c={conc:<3} direct  {}",
                mode.name(),
                direct.brief()
            );
            let proxied = gen_rt.block_on(run_cell(data_addr, mode, conc, measure));
            eprintln!(
                "bench: {:>6} c={conc:<3} proxy   {}",
                mode.name(),
                proxied.brief()
            );
            if !proxy.is_running() {
                return Err(format!(
                    "the proxy exited during the run\n{}",
                    proxy.log_tail()
                ));
            }
            rows.push(Row {
                mode,
                conc,
                direct,
                proxied,
            });
        }
    }
    let peak_rss_kib = proxy.peak_rss_kib();
    let rss_now_kib = proxy.status_kib("VmRSS:");
    proxy.stop();
    let load_after = load_average();

    print!(
        "{}",
        report(&Report {
            cores,
            measure,
            bin: &bin,
            peak_rss_kib,
            rss_now_kib,
            load: [load_before, load_after],
            rows: &rows,
        })
    );
    Ok(())
}

fn measure_window() -> Result<Duration, String> {
    match std::env::var("BENCH_SECONDS") {
        Err(_) => Ok(Duration::from_secs_f64(DEFAULT_SECONDS)),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s <= 600.0 => Ok(Duration::from_secs_f64(s)),
            _ => Err(format!(
                "BENCH_SECONDS={v:?}: expected seconds, a number in (0, 600]"
            )),
        },
    }
}

/// The 1, 5 and 15 minute load averages: other work on the machine skews the figures.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

fn runtime(name: &str, threads: usize) -> Result<Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(format!("bench-{name}"))
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

// ---------------------------------------------------------------------------------
// The proxy child process
// ---------------------------------------------------------------------------------

/// `target/<profile>/switchback-proxy`, next to this example's `examples/` folder,
/// built (or confirmed fresh) with cargo first.
fn proxy_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected example location {}", exe.display()))?;
    let bin = profile_dir.join("switchback-proxy");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("bench: cargo build --release -p switchback-proxy (a no-op when fresh)");
    let built = Command::new(&cargo)
        .args(["build", "--release", "-p", "switchback-proxy"])
        .current_dir(workspace)
        .status();
    match built {
        Ok(s) if s.success() => {}
        Ok(s) if bin.exists() => {
            eprintln!(
                "bench: warning: cargo build {s}; using the existing {}",
                bin.display()
            );
        }
        Err(e) if bin.exists() => {
            eprintln!(
                "bench: warning: cannot run cargo ({e}); using the existing {}",
                bin.display()
            );
        }
        Ok(s) => {
            return Err(format!(
                "`cargo build --release -p switchback-proxy` failed: {s}"
            ));
        }
        Err(e) => {
            return Err(format!(
                "cannot run cargo ({e}) and {} does not exist: run \
                 `cargo build --release -p switchback-proxy` first",
                bin.display()
            ));
        }
    }
    if !bin.exists() {
        return Err(format!(
            "{} not found after the build (is CARGO_TARGET_DIR or --target-dir set \
             differently for the build and the example?)",
            bin.display()
        ));
    }
    Ok(bin)
}

/// Two distinct free loopback ports (bound together, released just before use).
fn free_ports() -> Result<(SocketAddr, SocketAddr), String> {
    let bind = || {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| Ok((l.local_addr()?, l)))
            .map_err(|e| format!("bind 127.0.0.1:0: {e}"))
    };
    let (a, _la) = bind()?;
    let (b, _lb) = bind()?;
    Ok((a, b))
}

/// The proxy process this benchmark started; killed (by its pid) when dropped.
struct ProxyChild {
    child: Child,
    log: PathBuf,
}

impl ProxyChild {
    fn spawn(
        bin: &Path,
        manifest: &Path,
        data: SocketAddr,
        admin: SocketAddr,
        dir: &Path,
    ) -> Result<ProxyChild, String> {
        let log = dir.join("proxy.log");
        let out = std::fs::File::create(&log).map_err(|e| format!("proxy log: {e}"))?;
        let err = out.try_clone().map_err(|e| format!("proxy log: {e}"))?;
        let child = Command::new(bin)
            .arg("--manifests")
            .arg(manifest)
            .arg("--listen")
            .arg(data.to_string())
            .arg("--admin-listen")
            .arg(admin.to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        Ok(ProxyChild { child, log })
    }

    fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// A `kB` field of `/proc/<pid>/status`.
    fn status_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        line[field.len()..].split_whitespace().next()?.parse().ok()
    }

    fn peak_rss_kib(&self) -> Option<u64> {
        self.status_kib("VmHWM:")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(30)..];
        format!(
            "--- proxy log (last {} lines) ---\n{}",
            tail.len(),
            tail.join("\n")
        )
    }

    fn stop(&mut self) {
        // Child::kill signals exactly this pid; wait() reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ProxyChild {
    fn drop(&mut self) {
        if self.is_running() {
            self.stop();
        }
    }
}

async fn wait_ready(admin: SocketAddr, proxy: &mut ProxyChild) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(Ok(status)) = timeout_at(deadline, get_status(admin, "/readyz")).await
            && status == StatusCode::OK
        {
            return Ok(());
        }
        if !proxy.is_running() {
            return Err(format!(
                "the proxy exited before it was ready\n{}",
                proxy.log_tail()
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the proxy was not ready within {READY_TIMEOUT:?}\n{}",
                proxy.log_tail()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get_status(addr: SocketAddr, path: &str) -> Result<StatusCode, BoxError> {
    let mut sender = connect(addr).await?;
    let req = Request::get(path)
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    resp.into_body().collect().await?;
    Ok(status)
}

/// One request each way before measuring, so a broken setup fails loudly instead of
/// producing a table of errors.
async fn smoke_test(
    direct: SocketAddr,
    proxy: SocketAddr,
    child: &ProxyChild,
) -> Result<(), String> {
    for (name, addr) in [("simulator", direct), ("proxy", proxy)] {
        let mut sender = connect(addr)
            .await
            .map_err(|e| format!("connect to the {name} at {addr}: {e}"))?;
        let body = Bytes::from(chat_body(ROUTE, false).to_string());
        let (status, text) = async {
            sender.ready().await?;
            let resp = sender.send_request(chat_request(addr, body)?).await?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>((status, String::from_utf8_lossy(&bytes).into_owned()))
        }
        .await
        .map_err(|e| format!("request to the {name}: {e}\n{}", child.log_tail()))?;
        if status != StatusCode::OK || !text.contains("chat.completion") {
            return Err(format!(
                "the {name} answered {status}: {text}\n{}",
                child.log_tail()
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Load generator
// ---------------------------------------------------------------------------------

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, BoxError> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        // Ends when the sender is dropped or the server closes; nothing to report.
        let _ = conn.await;
    });
    Ok(sender)
}

fn chat_request(addr: SocketAddr, body: Bytes) -> Result<Request<Full<Bytes>>, BoxError> {
    Ok(Request::builder()
        .method(Method::POST)
        .uri(CHAT_PATH)
        .header(HOST, addr.to_string())
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))?)
}

/// Latencies (ns) of one cell's requests that completed inside the window.
#[derive(Default)]
struct Samples {
    ttfb: Vec<u64>,
    ttlb: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

struct Cell {
    window: Duration,
    /// Sorted ascending.
    ttfb: Vec<u64>,
    /// Sorted ascending.
    ttlb: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl Cell {
    fn ok(&self) -> u64 {
        self.ttlb.len() as u64
    }

    fn rps(&self) -> f64 {
        self.ok() as f64 / self.window.as_secs_f64()
    }

    fn brief(&self) -> String {
        let mut s = format!(
            "{:>9.0} req/s  p50 {:>7} µs  p99 {:>7} µs  errors {}",
            self.rps(),
            us(percentile(&self.ttlb, 0.50)),
            us(percentile(&self.ttlb, 0.99)),
            self.errors
        );
        if let Some(e) = &self.first_error {
            let _ = write!(s, " (first: {e})");
        }
        s
    }
}

/// Nearest-rank percentile of sorted samples (ns).
fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn us(ns: Option<u64>) -> String {
    ns.map_or_else(|| "-".into(), |n| format!("{:.0}", n as f64 / 1e3))
}

async fn run_cell(addr: SocketAddr, mode: Mode, conc: usize, measure: Duration) -> Cell {
    let body = Bytes::from(chat_body(ROUTE, mode == Mode::Stream).to_string());
    let from = Instant::now() + WARMUP;
    let until = from + measure;
    let issued = Arc::new(AtomicU64::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..conc {
        workers.spawn(worker(addr, body.clone(), from, until, issued.clone()));
    }
    let mut all = Samples::default();
    while let Some(done) = workers.join_next().await {
        let Ok(s) = done else { continue };
        all.ttfb.extend(s.ttfb);
        all.ttlb.extend(s.ttlb);
        all.errors += s.errors;
        all.first_error = all.first_error.or(s.first_error);
    }
    all.ttfb.sort_unstable();
    all.ttlb.sort_unstable();
    // The window is cut short when the request cap is reached first.
    let last = Instant::now().min(until);
    Cell {
        window: last
            .saturating_duration_since(from)
            .max(Duration::from_millis(1)),
        ttfb: all.ttfb,
        ttlb: all.ttlb,
        errors: all.errors,
        first_error: all.first_error,
    }
}

/// One closed-loop client: one keep-alive connection, the next request as soon as the
/// previous response has been read to its end.
async fn worker(
    addr: SocketAddr,
    body: Bytes,
    from: Instant,
    until: Instant,
    issued: Arc<AtomicU64>,
) -> Samples {
    let mut s = Samples::default();
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    let fail = |s: &mut Samples, at: Instant, e: String| {
        if at >= from && at <= until {
            s.errors += 1;
            s.first_error.get_or_insert(e);
        }
    };
    while Instant::now() < until {
        if issued.fetch_add(1, Ordering::Relaxed) >= MAX_REQUESTS_PER_CELL {
            break;
        }
        let conn = match sender.as_mut() {
            Some(c) => c,
            None => match connect(addr).await {
                Ok(c) => sender.insert(c),
                Err(e) => {
                    fail(&mut s, Instant::now(), format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let started = Instant::now();
        // Stop waiting shortly after the window: later answers would not count anyway.
        let deadline = (started + REQUEST_TIMEOUT).min(until + Duration::from_secs(1));
        let result = timeout_at(deadline, exchange(conn, addr, body.clone())).await;
        let done = Instant::now();
        match result {
            Ok(Ok((StatusCode::OK, first))) => {
                if done >= from && done <= until {
                    s.ttfb.push(nanos(first.unwrap_or(done) - started));
                    s.ttlb.push(nanos(done - started));
                }
            }
            Ok(Ok((status, _))) => fail(&mut s, done, format!("status {status}")),
            Ok(Err(e)) => {
                sender = None;
                fail(&mut s, done, e.to_string());
            }
            Err(_) => {
                sender = None;
                fail(&mut s, done, "timed out".into());
            }
        }
    }
    s
}

/// Sends one request and reads the response to its end; returns the status and when
/// the first non-empty body chunk arrived.
async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    body: Bytes,
) -> Result<(StatusCode, Option<Instant>), BoxError> {
    sender.ready().await?;
    let resp = sender.send_request(chat_request(addr, body)?).await?;
    let status = resp.status();
    let mut body = resp.into_body();
    let mut first = None;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if first.is_none() && frame.data_ref().is_some_and(|d| !d.is_empty()) {
            first = Some(Instant::now());
        }
    }
    Ok((status, first))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------

struct Row {
    mode: Mode,
    conc: usize,
    direct: Cell,
    proxied: Cell,
}

impl Row {
    fn throughput_pct(&self) -> f64 {
        100.0 * self.proxied.rps() / self.direct.rps().max(f64::MIN_POSITIVE)
    }
}

struct Report<'a> {
    cores: usize,
    measure: Duration,
    bin: &'a Path,
    peak_rss_kib: Option<u64>,
    rss_now_kib: Option<u64>,
    /// Load averages before and after the run.
    load: [String; 2],
    rows: &'a [Row],
}

/// `proxy - direct` in µs, signed.
fn added(direct: Option<u64>, proxy: Option<u64>) -> Option<f64> {
    Some((proxy? as f64 - direct? as f64) / 1e3)
}

fn signed(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:+.0}"))
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(
        || "unknown".into(),
        |k| format!("{:.1} MiB", k as f64 / 1024.0),
    )
}

fn report(r: &Report<'_>) -> String {
    let mut o = String::new();
    let _ = writeln!(o);
    let _ = writeln!(o, "Switchback proxy overhead benchmark");
    let _ = writeln!(
        o,
        "machine: {} cores, shared by the load generator, the simulator and the proxy \
         (figures are relative, not capacity)",
        r.cores
    );
    let _ = writeln!(
        o,
        "load average (1/5/15 min): {} before the run, {} after it (the benchmark's own \
         load included); other work on these cores skews every figure",
        r.load[0], r.load[1]
    );
    let _ = writeln!(
        o,
        "method: closed loop, HTTP/1.1 keep-alive, one connection per worker, loopback; \
         {} s warm-up + {:.1} s measured per cell",
        WARMUP.as_secs(),
        r.measure.as_secs_f64()
    );
    let _ = writeln!(
        o,
        "proxy: {} (child process), peak RSS (VmHWM) {}, RSS at end {}",
        r.bin.display(),
        mib(r.peak_rss_kib),
        mib(r.rss_now_kib)
    );
    let _ = writeln!(
        o,
        "streams: {STREAM_CHUNKS} SSE chunks, no interval; latency = time to last byte"
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<6} {:>4} | {:>9} {:>7} {:>7} | {:>9} {:>7} {:>7} | {:>6} {:>7} {:>7} | {:>6}",
        "mode",
        "conc",
        "direct/s",
        "p50 µs",
        "p99 µs",
        "proxy/s",
        "p50 µs",
        "p99 µs",
        "thru %",
        "+p50 µs",
        "+p99 µs",
        "errors"
    );
    let _ = writeln!(o, "{}", "-".repeat(105));
    for row in r.rows {
        let (d, p) = (&row.direct, &row.proxied);
        let _ = writeln!(
            o,
            "{:<6} {:>4} | {:>9.0} {:>7} {:>7} | {:>9.0} {:>7} {:>7} | {:>6.1} {:>7} {:>7} | {:>6}",
            row.mode.name(),
            row.conc,
            d.rps(),
            us(percentile(&d.ttlb, 0.50)),
            us(percentile(&d.ttlb, 0.99)),
            p.rps(),
            us(percentile(&p.ttlb, 0.50)),
            us(percentile(&p.ttlb, 0.99)),
            row.throughput_pct(),
            signed(added(percentile(&d.ttlb, 0.50), percentile(&p.ttlb, 0.50))),
            signed(added(percentile(&d.ttlb, 0.99), percentile(&p.ttlb, 0.99))),
            d.errors + p.errors
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "stream time to first byte (first SSE event):");
    let _ = writeln!(
        o,
        "{:<6} {:>4} | {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7}",
        "mode", "conc", "dir p50", "dir p99", "prx p50", "prx p99", "+p50 µs", "+p99 µs"
    );
    let _ = writeln!(o, "{}", "-".repeat(68));
    for row in r.rows.iter().filter(|row| row.mode == Mode::Stream) {
        let (d, p) = (&row.direct.ttfb, &row.proxied.ttfb);
        let _ = writeln!(
            o,
            "{:<6} {:>4} | {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7}",
            row.mode.name(),
            row.conc,
            us(percentile(d, 0.50)),
            us(percentile(d, 0.99)),
            us(percentile(p, 0.50)),
            us(percentile(p, 0.99)),
            signed(added(percentile(d, 0.50), percentile(p, 0.50))),
            signed(added(percentile(d, 0.99), percentile(p, 0.99)))
        );
    }
    let _ = writeln!(o);
    o.push_str(&verdict(r.rows));
    o
}

fn verdict(rows: &[Row]) -> String {
    let mut o = String::new();
    let unary = || rows.iter().filter(|row| row.mode == Mode::Unary);
    let pass = |ok: bool| if ok { "PASS" } else { "MISS" };
    let _ = writeln!(o, "budget (unary):");
    match unary().find(|row| row.conc == 64) {
        Some(row) => {
            let add = added(
                percentile(&row.direct.ttlb, 0.99),
                percentile(&row.proxied.ttlb, 0.99),
            );
            let ok = add.is_some_and(|a| a < BUDGET_ADDED_P99_C64.as_secs_f64() * 1e6)
                && row.proxied.errors == 0;
            let _ = writeln!(
                o,
                "  added p99 at concurrency 64 < 1 ms:            {} µs -> {}",
                signed(add),
                pass(ok)
            );
        }
        None => {
            let _ = writeln!(
                o,
                "  added p99 at concurrency 64 < 1 ms:            not measured"
            );
        }
    }
    let pcts: Vec<String> = unary()
        .map(|row| format!("c={} {:.1}%", row.conc, row.throughput_pct()))
        .collect();
    let ok = unary().all(|row| row.throughput_pct() >= BUDGET_THROUGHPUT_PCT);
    let _ = writeln!(
        o,
        "  throughput through the proxy >= 50% of direct: {} -> {}",
        pcts.join(", "),
        pass(ok)
    );
    let errors: u64 = rows.iter().map(|row| row.proxied.errors).sum();
    if errors > 0 {
        let _ = writeln!(
            o,
            "  note: {errors} errors through the proxy during measurement"
        );
    }
    o
}

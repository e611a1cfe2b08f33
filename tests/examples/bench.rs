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
//! 3. when an `nginx` program is found (`BENCH_NGINX=PATH` names one, `BENCH_NGINX=off`
//!    skips it), starts it as a plain reverse proxy to the same simulator (upstream
//!    keep-alive, `proxy_buffering off`, buffered access log): the REFERENCE the budget
//!    is set against ("a plain nginx reverse proxy reaches about 95% of direct here"),
//!    measured in the same run on the same cores;
//! 4. by default pins the processes (`taskset`): this process (load generator and
//!    simulator) on the first half of the cores, the proxy and nginx on the other half,
//!    as in production, where a proxy does not share its cores with its clients and
//!    providers (`BENCH_PIN=off` shares every core; see [`Layout`] for why pinning is
//!    the default);
//! 5. drives `POST /v1/chat/completions` from an in-process load generator (its own
//!    tokio runtime; HTTP/1.1 keep-alive, one connection per worker, each worker sends
//!    its next request as soon as the previous one ends) for every cell of
//!    {paced, instant provider} × {unary, streaming} × {concurrency 1, 64, 256} ×
//!    {DIRECT to the simulator, THROUGH the proxy, through NGINX}:
//!    - `paced`: the simulator answers after `BENCH_PROVIDER_MS` (default 10 ms), and a
//!      stream sends its first event after that delay, then the rest 1 ms apart (23
//!      SSE events: a role event, 20 text chunks, a stop event and `[DONE]`). Any
//!      hosted model takes far longer than that (hundreds of ms to a first token), so
//!      this is a provider that is fast beyond any real one: it still drives thousands
//!      of requests per second through the proxy, and it is the setting in which the
//!      issue's reference holds (nginx within a few percent of direct);
//!    - `instant`: the simulator answers at once and streams its 23 events without a
//!      gap: the worst case for any proxy, nginx included. At concurrency 64 and 256
//!      the middle's CPU per request decides; at concurrency 1 the latency of its two
//!      extra loopback hops does (one request in flight, answered in ~30 µs direct, so
//!      each wake-up of the middle's core counts);
//!
//!    right after the unary proxied cell at concurrency 1 and 64, a FAILOVER cell: route
//!    `bench-failover` whose first target is a second simulator answering 503 to
//!    everything, with `circuitBreaker: { consecutiveFailures: 1, openFor: 5m }`, and whose
//!    second target is the healthy simulator. Before the cell one request (at most three)
//!    opens that circuit; during the cell every request skips the open target and goes
//!    straight to the backup. A sample request in the middle of the measurement window
//!    checks it from the response headers (`x-switchback-attempts: 1`,
//!    `x-switchback-target` = the backup), and the failing simulator's hit counter must
//!    not move during the cell;
//! 6. reads the proxy's `/metrics`, stops the proxy and nginx (by the pids of the
//!    children it started), counts the proxy's per-request log lines and prints one set
//!    of tables per profile.
//!
//! The proxy runs with its default observability: metrics are always on, and it logs one
//! line per request at `info` (the default when `SWITCHBACK_LOG` is unset; the child
//! inherits this process's environment, so `SWITCHBACK_LOG=warn` turns request logging
//! off for a comparison). Its output goes to a file in the temporary folder. The report
//! prints the logging state and how many request lines were written.
//!
//! Each cell runs 0.5 s of warm-up, then `BENCH_SECONDS` (default 3) of measurement, and
//! also stops after [`MAX_REQUESTS_PER_CELL`] requests, so the run always ends by itself.
//! Only requests that complete inside the measurement window count.
//!
//! How to read the output:
//!
//! - `req/s`: completed 200 responses per second; `p50`/`p99`: latency percentiles in
//!   µs, time to the last byte of the body (for streams, a second table gives the time
//!   to the first text, i.e. the first SSE event with content: the role-only chunk
//!   before it is held back by the proxy, so the first byte would not compare);
//! - `thru %`: proxy throughput as a percentage of direct throughput at the same
//!   concurrency; `+p50`/`+p99`: latency the proxy adds (proxy minus direct, µs; small
//!   negative values are noise);
//! - `errors`: non-200 answers and transport errors during the window (should be 0);
//! - the proxy's peak RSS is `VmHWM` of the child process after all cells;
//! - the failover table compares the failover route with the healthy single-target
//!   route through the same proxy at the same concurrency (the unary proxied cell just
//!   before it): `thru %` is failover / healthy, `+p50`/`+p99` the latency added beyond
//!   one skipped (open-circuit) target;
//! - the CPU table gives on-CPU µs per request (all threads, from the scheduler's
//!   accounting in `/proc/<pid>/task/*/schedstat`) of this process (generator plus
//!   simulator) and of the proxy, during each measurement window. On saturated cores,
//!   `direct/total` (direct gen+sim CPU over proxied gen+sim+proxy CPU) predicts the
//!   throughput ratio, and the proxy column is its cost per request, less noisy than
//!   wall-clock figures on a shared box;
//! - `nginx/s`, `thru %`, `+p99 µs` after the proxy's columns: the same cell through
//!   nginx, against the same direct cell;
//! - the verdict, per profile, compares the unary cells with the budget: added p99 at
//!   concurrency 64 < 1 ms, and throughput through the proxy >= 50% of direct, and
//!   prints nginx's throughput beside it;
//! - `proxy memory`, last: the proxy's `VmRSS` and `VmHWM` at rest (after `/readyz`,
//!   before any request), then with `BENCH_OPEN_STREAMS` streams (default 1,000; `0`
//!   skips it) open at once after all cells: each on its own connection, the simulator
//!   sending an event every 500 ms, read once every stream has its first text (so each
//!   is committed: client connection, upstream connection and relay all live).
//!
//! Two switches for working on one figure: `BENCH_ONLY=instant,unary,64` runs a subset of
//! the cells (profiles, modes and/or concurrency levels), `BENCH_AUTH=on` adds an
//! LLMClient (the proxy then runs with `--auth required`) and sends its key with every
//! request, and `BENCH_PROXY_WRAPPER` starts the proxy
//! under a profiler, e.g. `BENCH_PROXY_WRAPPER="valgrind --tool=callgrind"` for
//! instruction counts per request (`callgrind_control -z` / `-d` around a window).
//!
//! `BENCH_VERSUS=PATH` compares two builds instead of measuring the cells: a second
//! proxy binary (an older commit's, or the same binary for the noise floor) runs beside
//! this one on the same cores, and each of `BENCH_ROUNDS` rounds (default 10) per
//! selected cell gives half the workers to each, at the same time; the report gives each
//! round's CPU per request of both, and per cell the paired ratio (median, quartiles),
//! how many rounds this binary was the dearer and a sign test. See [`Versus`].
//! `BENCH_VERSUS=nginx` does the same with nginx as the other half: the paired CPU
//! ratio to the reference, which the one-after-the-other cells above give only
//! through whatever the neighbours did in between.
//!
//! Everything runs on one small machine, so the absolute figures are those of a
//! crowded box: direct cells measure generator + simulator, proxy cells generator +
//! proxy + simulator. Read the ratios, not the capacity.

use std::fmt::Write as _;
use std::io::BufRead as _;
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
use switchback_tests::harness::{NS, chat_body, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout_at};

/// Concurrency levels (simultaneous workers, one connection each).
const CONCURRENCY: [usize; 3] = [1, 64, 256];
/// Warm-up before each cell's measurement window.
const WARMUP: Duration = Duration::from_millis(500);
/// Measurement window when `BENCH_SECONDS` is not set.
const DEFAULT_SECONDS: f64 = 3.0;
/// Hard stop per cell, whatever the clock says.
const MAX_REQUESTS_PER_CELL: u64 = 2_000_000;
/// A request slower than this counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the proxy may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Text chunks per simulated stream.
const STREAM_CHUNKS: usize = 20;
/// SSE events per simulated stream: the simulator's OpenAI stream sends a role event
/// before the text chunks, and a stop event and `data: [DONE]` after them.
const STREAM_EVENTS: usize = STREAM_CHUNKS + 3;
/// The route (and so the model name) the proxy serves.
const ROUTE: &str = "bench";
/// The failover route: a failing first target with a circuit breaker, then `sim`.
const FAILOVER_ROUTE: &str = "bench-failover";
/// Concurrency levels of the failover cells (unary only).
const FAILOVER_CONCURRENCY: [usize; 2] = [1, 64];
/// Requests allowed to open the failing target's circuit before a failover cell.
const OPEN_CIRCUIT_TRIES: usize = 3;
const CHAT_PATH: &str = "/v1/chat/completions";
/// How long the paced provider takes before its answer (or first stream event) when
/// `BENCH_PROVIDER_MS` is not set.
const DEFAULT_PROVIDER_MS: u64 = 10;
/// Gap between the paced provider's stream events.
const PACED_EVENT_INTERVAL: Duration = Duration::from_millis(1);
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
    let only = Only::from_env()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let layout = Layout::from_env()?;
    // The cores left to the generator and the simulator (all of them when shared).
    let end_cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load_before = load_average();

    // The simulator lives on its own runtime so that its threads are not the generator's.
    let sim_rt = runtime("sim", end_cores)?;
    let sim = sim_rt.block_on(SimProvider::start_named("bench", Flavor::OpenAi));
    sim.set_recording(false);
    // The failover route's first target: fails everything, so its circuit opens.
    let broken = sim_rt.block_on(SimProvider::start_named("broken", Flavor::OpenAi));
    broken.set_recording(false);
    broken.set_default(Behavior::ServerError(503));

    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let manifest = dir.path().join("switchback.yaml");
    let manifests = format!(
        "{}{}{}{}",
        credential("sim", "openai", &sim.base_url(), "sk-bench"),
        credential("broken", "openai", &broken.base_url(), "sk-bench"),
        route(ROUTE, "  targets:\n    - credentialRef: { name: sim }\n"),
        route(
            FAILOVER_ROUTE,
            "  circuitBreaker: { consecutiveFailures: 1, openFor: 5m }\n  targets:\n    \
             - credentialRef: { name: broken }\n    - credentialRef: { name: sim }\n"
        ),
    );
    // `BENCH_AUTH=on`: an LLMClient (so the proxy runs with `--auth required`, its
    // default then), and every request carries its key.
    let manifests = if *BENCH_AUTH {
        format!(
            "{manifests}---
apiVersion: v1
kind: Secret
metadata: {{ name: bench-llm, namespace: {NS} }}
stringData: {{ apiKey: \"{BENCH_KEY}\" }}
---
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: {{ name: bench, namespace: {NS} }}
spec:
  keySecretRef: {{ name: bench-llm, key: apiKey }}
"
        )
    } else {
        manifests
    };
    // `x-switchback-target` of an answer from the healthy simulator.
    let backup = format!("{NS}/sim");
    let logging = LoggingState::from_env();
    std::fs::write(&manifest, manifests).map_err(|e| format!("write manifest: {e}"))?;

    let bin = proxy_binary()?;
    let (data_addr, admin_addr) = free_ports()?;
    let mut proxy = ProxyChild::spawn(&layout, &bin, &manifest, data_addr, admin_addr, dir.path())?;
    let pid = proxy.child.id();

    let gen_rt = runtime("load", end_cores)?;
    gen_rt.block_on(wait_ready(admin_addr, &mut proxy))?;
    // Before any request: what the proxy holds at rest.
    let idle = Memory::read(&proxy);
    gen_rt.block_on(smoke_test(sim.addr(), data_addr, &proxy))?;
    if let Some(other) = Versus::from_env()? {
        let mut other = other.start(&layout, &manifest, dir.path(), &gen_rt, sim.addr())?;
        eprintln!(
            "bench: side by side: {} against {}, both {}; {:.1} s warm-up + {:.1} s per round",
            bin.display(),
            other.name,
            layout.describe(),
            WARMUP.as_secs_f64(),
            measure.as_secs_f64(),
        );
        let mut report = String::new();
        for profile in &only.profiles {
            for mode in [Mode::Unary, Mode::Stream]
                .into_iter()
                .filter(|m| only.modes.contains(m))
            {
                sim.set_default(profile.behavior(mode));
                for conc in CONCURRENCY
                    .into_iter()
                    .filter(|c| only.concurrency.contains(c))
                {
                    let cell = CellName {
                        profile: profile.name,
                        mode,
                        conc,
                    };
                    let rounds = gen_rt.block_on(other.rounds(
                        cell,
                        (data_addr, pid),
                        measure,
                        &mut proxy,
                    ))?;
                    report.push_str(&versus_report(cell, &rounds));
                }
            }
        }
        other.stop();
        proxy.stop();
        print!("{report}");
        return Ok(());
    }
    let nginx = match NginxChild::wanted()? {
        Some(program) => {
            let n = NginxChild::spawn(&layout, &program, sim.addr(), dir.path())?;
            gen_rt.block_on(n.wait_ready())?;
            Some(n)
        }
        None => None,
    };

    eprintln!(
        "bench: {cores} cores, {}; {:.1} s warm-up + {:.1} s per cell; {} cells; proxy logging: {}; \
         reference: {}",
        layout.describe(),
        WARMUP.as_secs_f64(),
        measure.as_secs_f64(),
        only.cells(nginx.is_some()),
        logging.describe(),
        nginx
            .as_ref()
            .map_or_else(|| NginxChild::absent().to_owned(), NginxChild::describe)
    );
    let mut runs = Vec::new();
    for profile in &only.profiles {
        let mut rows = Vec::new();
        let mut failover = Vec::new();
        for mode in [Mode::Unary, Mode::Stream]
            .into_iter()
            .filter(|m| only.modes.contains(m))
        {
            sim.set_default(profile.behavior(mode));
            for conc in CONCURRENCY
                .into_iter()
                .filter(|c| only.concurrency.contains(c))
            {
                let label = format!("{:>7} {:>6} c={conc:<3}", profile.name, mode.name());
                let direct =
                    gen_rt.block_on(run_cell(sim.addr(), ROUTE, mode, conc, measure, &[pid]));
                eprintln!("bench: {label} direct   {}", direct.brief());
                let proxied =
                    gen_rt.block_on(run_cell(data_addr, ROUTE, mode, conc, measure, &[pid]));
                eprintln!("bench: {label} proxy    {}", proxied.brief());
                let reference = nginx.as_ref().map(|n| {
                    let cell =
                        gen_rt.block_on(run_cell(n.addr, ROUTE, mode, conc, measure, &n.pids()));
                    eprintln!("bench: {label} nginx    {}", cell.brief());
                    cell
                });
                if mode == Mode::Unary && FAILOVER_CONCURRENCY.contains(&conc) {
                    let row = gen_rt.block_on(run_failover_cell(
                        data_addr, &broken, &backup, conc, measure, pid,
                    ))?;
                    eprintln!(
                        "bench: {label} failover {}  [{}]",
                        row.cell.brief(),
                        row.check.describe()
                    );
                    failover.push(row);
                }
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
                    nginx: reference,
                });
            }
        }
        runs.push(ProfileRun {
            profile: *profile,
            rows,
            failover,
        });
    }
    let peak_rss_kib = proxy.peak_rss_kib();
    let rss_now_kib = proxy.status_kib("VmRSS:");
    let metric_requests = gen_rt.block_on(requests_metric(admin_addr));
    // Counted before the memory check's streams add theirs.
    let log_lines = proxy.request_log_lines();
    let open = match open_streams_wanted()? {
        0 => None,
        n => Some(gen_rt.block_on(open_streams(&sim, data_addr, n, &proxy))?),
    };
    let memory = memory_report(&idle, open.as_ref());
    proxy.stop();
    let nginx_line = nginx.map(|mut n| {
        n.stop();
        n.describe()
    });
    let load_after = load_average();

    print!(
        "{}",
        report(&Report {
            cores,
            layout: &layout,
            measure,
            bin: &bin,
            peak_rss_kib,
            rss_now_kib,
            load: [load_before, load_after],
            runs: &runs,
            nginx: nginx_line,
            observability: Observability {
                logging,
                log_lines,
                metric_requests,
            },
        })
    );
    println!("\nproxy memory: {memory}");
    Ok(())
}

/// `BENCH_ONLY`: a subset of the cells while working on one of them, e.g.
/// `unary`, `64`, `instant` or `unary,64` (profiles, modes and concurrency levels,
/// comma-separated; each axis not named runs in full). The budget verdict needs every
/// unary cell of a profile.
struct Only {
    profiles: Vec<Profile>,
    modes: Vec<Mode>,
    concurrency: Vec<usize>,
}

impl Only {
    fn from_env() -> Result<Only, String> {
        let all = Profile::all()?;
        let mut only = Only {
            profiles: Vec::new(),
            modes: Vec::new(),
            concurrency: Vec::new(),
        };
        let spec = std::env::var("BENCH_ONLY").unwrap_or_default();
        for word in spec.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "unary" => only.modes.push(Mode::Unary),
                "stream" => only.modes.push(Mode::Stream),
                n => match (n.parse::<usize>(), all.iter().find(|p| p.name == n)) {
                    (Ok(c), _) if CONCURRENCY.contains(&c) => only.concurrency.push(c),
                    (_, Some(profile)) => only.profiles.push(*profile),
                    _ => {
                        return Err(format!(
                            "BENCH_ONLY={spec:?}: {word:?} is not `paced`, `instant`, \
                             `unary`, `stream` or one of the concurrency levels \
                             {CONCURRENCY:?}"
                        ));
                    }
                },
            }
        }
        if only.profiles.is_empty() {
            only.profiles = all.to_vec();
        }
        if only.modes.is_empty() {
            only.modes = vec![Mode::Unary, Mode::Stream];
        }
        if only.concurrency.is_empty() {
            only.concurrency = CONCURRENCY.to_vec();
        }
        Ok(only)
    }

    fn cells(&self, nginx: bool) -> usize {
        let failover = if self.modes.contains(&Mode::Unary) {
            FAILOVER_CONCURRENCY
                .iter()
                .filter(|c| self.concurrency.contains(c))
                .count()
        } else {
            0
        };
        let per_level = if nginx { 3 } else { 2 };
        self.profiles.len() * (per_level * self.modes.len() * self.concurrency.len() + failover)
    }
}

/// How the simulated provider paces its answers.
#[derive(Clone, Copy)]
struct Profile {
    name: &'static str,
    /// Before the unary answer and before the first stream event.
    delay: Duration,
    /// Between stream events.
    interval: Duration,
}

impl Profile {
    /// `paced` (a provider that takes `BENCH_PROVIDER_MS`, default
    /// [`DEFAULT_PROVIDER_MS`], to answer: far faster than any hosted model, so still
    /// hundreds of requests per second per connection) and `instant` (answers at once:
    /// nothing but the three processes' CPU, the worst case for the proxy's share).
    fn all() -> Result<[Profile; 2], String> {
        let ms = match std::env::var("BENCH_PROVIDER_MS") {
            Err(_) => DEFAULT_PROVIDER_MS,
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(ms) if (1..=10_000).contains(&ms) => ms,
                _ => {
                    return Err(format!(
                        "BENCH_PROVIDER_MS={v:?}: expected milliseconds, 1 to 10000"
                    ));
                }
            },
        };
        Ok([
            Profile {
                name: "paced",
                delay: Duration::from_millis(ms),
                interval: PACED_EVENT_INTERVAL,
            },
            Profile {
                name: "instant",
                delay: Duration::ZERO,
                interval: Duration::ZERO,
            },
        ])
    }

    fn behavior(&self, mode: Mode) -> Behavior {
        let b = match mode {
            Mode::Unary => Behavior::Answer,
            Mode::Stream => Behavior::Stream {
                chunks: STREAM_CHUNKS,
                interval: self.interval,
            },
        };
        if self.delay.is_zero() {
            b
        } else {
            b.after(self.delay)
        }
    }

    fn describe(&self) -> String {
        if self.delay.is_zero() {
            format!(
                "provider answers at once; streams: {STREAM_EVENTS} SSE events \
                 ({STREAM_CHUNKS} of text), no gap \
                 (the middle's own cost is all that differs: CPU at concurrency 64 and \
                 256, the extra hops' latency at 1)"
            )
        } else {
            format!(
                "provider answers after {} ms; streams: {STREAM_EVENTS} SSE events \
                 ({STREAM_CHUNKS} of text), the first after {} ms, then {} ms apart",
                self.delay.as_millis(),
                self.delay.as_millis(),
                self.interval.as_millis()
            )
        }
    }
}

/// One profile's cells.
struct ProfileRun {
    profile: Profile,
    rows: Vec<Row>,
    failover: Vec<FailoverRow>,
}

/// Which cores run what. By default the process in the middle (the proxy, or nginx)
/// gets half the cores and the two ends (this process: load generator and simulator)
/// the other half, as in production, where the proxy never shares its cores with its
/// clients or its providers. Sharing them measures the scheduler's interference
/// between three busy processes more than the middle's cost: in a shared run the
/// proxy's added latency fell from +0.6 ms p50 to +0.08 ms once it had a core of its
/// own, and nginx reached only 50-65% of direct with the instant provider (90-99% with
/// the paced one). `BENCH_PIN=off` shares every core.
#[derive(Clone, Debug)]
enum Layout {
    Pinned { ends: String, middle: String },
    Shared { why: &'static str },
}

impl Layout {
    fn from_env() -> Result<Layout, String> {
        if std::env::var("BENCH_PIN").is_ok_and(|v| v == "off") {
            return Ok(Layout::Shared {
                why: "BENCH_PIN=off",
            });
        }
        let Some(cpus) = allowed_cpus() else {
            return Ok(Layout::Shared {
                why: "taskset not found or unreadable affinity, so not pinned",
            });
        };
        if cpus.len() < 2 {
            return Ok(Layout::Shared {
                why: "one core only, so not pinned",
            });
        }
        let half = cpus.len() / 2;
        let list = |ids: &[u32]| ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let (ends, middle) = (list(&cpus[..half]), list(&cpus[half..]));
        // Before any runtime exists: every thread made later inherits it.
        let pid = std::process::id().to_string();
        let pinned = Command::new("taskset")
            .args(["-a", "-c", "-p", &ends, &pid])
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("taskset: {e}"))?;
        if !pinned.success() {
            return Err(format!("taskset -a -c -p {ends} {pid}: {pinned}"));
        }
        Ok(Layout::Pinned { ends, middle })
    }

    /// The command that starts `program` on the middle's cores.
    fn command(&self, program: &Path) -> Command {
        match self {
            Layout::Pinned { middle, .. } => {
                let mut c = Command::new("taskset");
                c.args(["-c", middle]).arg(program);
                c
            }
            Layout::Shared { .. } => Command::new(program),
        }
    }

    fn describe(&self) -> String {
        match self {
            Layout::Pinned { ends, middle } => format!(
                "pinned: load generator and simulator on cpu {ends}, the proxy (or nginx) \
                 on cpu {middle}"
            ),
            Layout::Shared { why } => {
                format!("shared: generator, simulator and proxy on every core ({why})")
            }
        }
    }
}

/// The CPUs this process may run on, from `taskset -c -p` ("...: 0-3,6").
fn allowed_cpus() -> Option<Vec<u32>> {
    let out = Command::new("taskset")
        .args(["-c", "-p", &std::process::id().to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let list = text.rsplit(':').next()?.trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.trim().parse::<u32>().ok()?..=b.trim().parse().ok()?),
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
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

/// The proxy's logging configuration, as the child inherits it from this process.
struct LoggingState {
    /// `SWITCHBACK_LOG`, when set.
    filter: Option<String>,
    /// `SWITCHBACK_LOG_FORMAT`, when set (text otherwise).
    format: Option<String>,
}

impl LoggingState {
    fn from_env() -> LoggingState {
        LoggingState {
            filter: std::env::var("SWITCHBACK_LOG").ok(),
            format: std::env::var("SWITCHBACK_LOG_FORMAT").ok(),
        }
    }

    fn describe(&self) -> String {
        let filter = match &self.filter {
            Some(f) => format!("SWITCHBACK_LOG={f}"),
            None => "SWITCHBACK_LOG unset, so `info`: one line per request".into(),
        };
        let format = self.format.as_deref().unwrap_or("text");
        format!("{filter}, {format} format, to a file")
    }
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
        layout: &Layout,
        bin: &Path,
        manifest: &Path,
        data: SocketAddr,
        admin: SocketAddr,
        dir: &Path,
    ) -> Result<ProxyChild, String> {
        let log = dir.join("proxy.log");
        let out = std::fs::File::create(&log).map_err(|e| format!("proxy log: {e}"))?;
        let err = out.try_clone().map_err(|e| format!("proxy log: {e}"))?;
        // `BENCH_PROXY_WRAPPER`, e.g. `valgrind --tool=callgrind`: run the proxy under
        // a profiler (the pid then is the wrapper's, which becomes the proxy for valgrind).
        let wrapper = std::env::var("BENCH_PROXY_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut command = match words.next() {
            Some(program) => {
                let mut c = layout.command(Path::new(program));
                c.args(words).arg(bin);
                c
            }
            None => layout.command(bin),
        };
        let child = command
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

    /// Per-request log lines (target `switchback::request`) the proxy wrote. Its log
    /// writer drops lines rather than block a request, so this can be below the number
    /// of requests served.
    fn request_log_lines(&self) -> Option<u64> {
        let file = std::fs::File::open(&self.log).ok()?;
        let needle = b"switchback::request";
        let mut n = 0;
        for line in std::io::BufReader::new(file).split(b'\n') {
            if line.ok()?.windows(needle.len()).any(|w| w == needle) {
                n += 1;
            }
        }
        Some(n)
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

// ---------------------------------------------------------------------------------
// Side by side: two proxy binaries under one load
// ---------------------------------------------------------------------------------

/// Rounds per cell when `BENCH_ROUNDS` is not set.
const DEFAULT_ROUNDS: usize = 10;

/// `BENCH_VERSUS=PATH`: a second proxy binary (an older build, or the same one for the
/// noise floor) run beside the bench's own, both on the middle's cores, against the same
/// simulator, in the same windows: each round gives half the cell's workers to each and
/// reads both proxies' CPU per request. Alternating runs of one binary then the other
/// (ABBA) were what this replaced: on a shared host the same binary's CPU per request
/// moved by half between runs, more than any difference looked for. Side by side, both
/// meet the same neighbours at the same moment, and each round is one paired ratio.
///
/// `BENCH_VERSUS=nginx` puts the reference there instead of a second proxy: nginx
/// (`BENCH_NGINX`, else found on `PATH`) takes the other half of the workers in the
/// same windows, so the CPU ratio to nginx is a paired one too.
struct Versus {
    /// `None`: nginx.
    bin: Option<PathBuf>,
    rounds: usize,
}

/// The second proxy (or nginx), started and ready.
struct Other {
    name: String,
    child: OtherChild,
    addr: SocketAddr,
    rounds: usize,
}

enum OtherChild {
    Proxy(ProxyChild),
    Nginx(NginxChild),
}

impl Other {
    /// Whose CPU the other half's windows count.
    fn pids(&self) -> Vec<u32> {
        match &self.child {
            OtherChild::Proxy(p) => vec![p.child.id()],
            OtherChild::Nginx(n) => n.pids(),
        }
    }

    fn is_running(&mut self) -> bool {
        match &mut self.child {
            OtherChild::Proxy(p) => p.is_running(),
            OtherChild::Nginx(n) => matches!(n.child.try_wait(), Ok(None)),
        }
    }

    fn stop(&mut self) {
        match &mut self.child {
            OtherChild::Proxy(p) => p.stop(),
            OtherChild::Nginx(n) => n.stop(),
        }
    }
}

#[derive(Clone, Copy)]
struct CellName {
    profile: &'static str,
    mode: Mode,
    conc: usize,
}

/// One round: each proxy's CPU per request and throughput, measured together.
struct Round {
    ours: (f64, f64),
    other: (f64, f64),
}

impl Versus {
    fn from_env() -> Result<Option<Versus>, String> {
        let Some(bin) = std::env::var_os("BENCH_VERSUS").map(PathBuf::from) else {
            return Ok(None);
        };
        let bin = if bin.as_os_str() == "nginx" {
            None
        } else if bin.is_file() {
            Some(bin)
        } else {
            return Err(format!("BENCH_VERSUS={}: no such file", bin.display()));
        };
        let rounds = match std::env::var("BENCH_ROUNDS") {
            Err(_) => DEFAULT_ROUNDS,
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n @ 1..=1000) => n,
                _ => return Err(format!("BENCH_ROUNDS={v:?}: expected a count, 1 to 1000")),
            },
        };
        Ok(Some(Versus { bin, rounds }))
    }

    fn start(
        self,
        layout: &Layout,
        manifest: &Path,
        dir: &Path,
        rt: &Runtime,
        sim: SocketAddr,
    ) -> Result<Other, String> {
        // Its own folder: its log is not the first proxy's.
        let own = dir.join("versus");
        std::fs::create_dir_all(&own).map_err(|e| format!("{}: {e}", own.display()))?;
        let Some(bin) = self.bin else {
            let program = NginxChild::wanted()?
                .ok_or_else(|| format!("BENCH_VERSUS=nginx: {}", NginxChild::absent()))?;
            let nginx = NginxChild::spawn(layout, &program, sim, &own)?;
            rt.block_on(nginx.wait_ready())?;
            return Ok(Other {
                name: nginx.describe(),
                addr: nginx.addr,
                child: OtherChild::Nginx(nginx),
                rounds: self.rounds,
            });
        };
        let (addr, admin) = free_ports()?;
        let mut proxy = ProxyChild::spawn(layout, &bin, manifest, addr, admin, &own)?;
        rt.block_on(wait_ready(admin, &mut proxy))?;
        rt.block_on(smoke_test(sim, addr, &proxy))?;
        Ok(Other {
            name: bin.display().to_string(),
            child: OtherChild::Proxy(proxy),
            addr,
            rounds: self.rounds,
        })
    }
}

impl Other {
    /// `rounds` windows of one cell, each proxy taking half the workers (at least one).
    async fn rounds(
        &mut self,
        cell: CellName,
        (ours, our_pid): (SocketAddr, u32),
        measure: Duration,
        our_proxy: &mut ProxyChild,
    ) -> Result<Vec<Round>, String> {
        let half = (cell.conc / 2).max(1);
        let mut rounds = Vec::with_capacity(self.rounds);
        for n in 1..=self.rounds {
            let (our_pids, other_pids) = ([our_pid], self.pids());
            let (a, b) = tokio::join!(
                run_cell(ours, ROUTE, cell.mode, half, measure, &our_pids),
                run_cell(self.addr, ROUTE, cell.mode, half, measure, &other_pids),
            );
            if !our_proxy.is_running() || !self.is_running() {
                return Err("a proxy (or nginx) exited during the run".into());
            }
            let (Some(a_cpu), Some(b_cpu)) = (a.cpu_per_request().1, b.cpu_per_request().1) else {
                return Err(format!(
                    "round {n} of {}: no CPU figure (requests: {} and {}; errors: {} {:?}, {} {:?})",
                    cell.label(),
                    a.ok(),
                    b.ok(),
                    a.errors,
                    a.first_error,
                    b.errors,
                    b.first_error
                ));
            };
            let round = Round {
                ours: (a_cpu, a.rps()),
                other: (b_cpu, b.rps()),
            };
            eprintln!(
                "bench: {} round {n:>2}: this {:>6.1} µs/req {:>7.0} req/s, other {:>6.1} µs/req \
                 {:>7.0} req/s, CPU ratio {:.3}, errors {} {}",
                cell.label(),
                a_cpu,
                a.rps(),
                b_cpu,
                b.rps(),
                round.cpu_ratio(),
                a.errors,
                b.errors
            );
            rounds.push(round);
        }
        Ok(rounds)
    }
}

impl CellName {
    fn label(self) -> String {
        format!(
            "{:>7} {:>6} c={:<3}",
            self.profile,
            self.mode.name(),
            self.conc
        )
    }
}

impl Round {
    /// This binary's CPU per request over the other's.
    fn cpu_ratio(&self) -> f64 {
        self.ours.0 / self.other.0
    }

    fn rps_ratio(&self) -> f64 {
        self.ours.1 / self.other.1
    }
}

/// Median and quartiles (nearest rank) of unsorted values.
fn quartiles(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (at(0.5), at(0.25), at(0.75))
}

/// Two-sided sign test: the chance of a split at least as uneven as `k` of `n` when
/// either binary is as likely to be the dearer one in a round.
fn sign_test(k: usize, n: usize) -> f64 {
    let extreme = k.max(n - k);
    // C(n, i) / 2^n summed over the tail, in floating point (n is at most 1000).
    let mut tail = 0.0;
    let mut c = 1.0_f64;
    for i in 0..=n {
        if i >= extreme {
            tail += c;
        }
        c = c * (n - i) as f64 / (i + 1) as f64;
    }
    (2.0 * tail / 2f64.powi(n as i32)).min(1.0)
}

/// A p-value as read: two decimals, or the order of magnitude when that would print 0.00.
fn p_value(p: f64) -> String {
    if p >= 0.01 {
        format!("{p:.2}")
    } else {
        format!("{p:.0e}")
    }
}

fn versus_report(cell: CellName, rounds: &[Round]) -> String {
    let cpu: Vec<f64> = rounds.iter().map(Round::cpu_ratio).collect();
    let rps: Vec<f64> = rounds.iter().map(Round::rps_ratio).collect();
    let ours: Vec<f64> = rounds.iter().map(|r| r.ours.0).collect();
    let other: Vec<f64> = rounds.iter().map(|r| r.other.0).collect();
    let dearer = cpu.iter().filter(|r| **r > 1.0).count();
    let (m, q1, q3) = quartiles(&cpu);
    let (t, _, _) = quartiles(&rps);
    format!(
        "{}: {} rounds; proxy CPU µs per request, median: this {:.1}, other {:.1}; \
         paired ratio this/other: median {m:.3} (IQR {q1:.3}-{q3:.3}), this dearer in \
         {dearer} of {} (sign test p = {}); throughput ratio median {t:.3}\n",
        cell.label(),
        rounds.len(),
        quartiles(&ours).0,
        quartiles(&other).0,
        rounds.len(),
        p_value(sign_test(dearer, rounds.len())),
    )
}

// ---------------------------------------------------------------------------------
// The reference: nginx as a plain reverse proxy
// ---------------------------------------------------------------------------------

/// nginx proxying to the same simulator, measured in the same run: the yardstick the
/// budget is set against. Used when an `nginx` program is found (`BENCH_NGINX=PATH`
/// names one, `BENCH_NGINX=off` skips it).
struct NginxChild {
    child: Child,
    addr: SocketAddr,
    program: PathBuf,
    version: String,
}

impl NginxChild {
    fn wanted() -> Result<Option<PathBuf>, String> {
        match std::env::var("BENCH_NGINX") {
            Ok(v) if v == "off" => Ok(None),
            Ok(v) => {
                let p = PathBuf::from(v);
                if p.exists() {
                    Ok(Some(p))
                } else {
                    Err(format!("BENCH_NGINX={}: no such program", p.display()))
                }
            }
            Err(_) => {
                let path = std::env::var_os("PATH").unwrap_or_default();
                let found = std::env::split_paths(&path)
                    .chain([PathBuf::from("/usr/sbin")])
                    .map(|d| d.join("nginx"))
                    .find(|p| p.is_file());
                Ok(found)
            }
        }
    }

    fn absent() -> &'static str {
        "no nginx found (install Debian's nginx-light, or set BENCH_NGINX=PATH), so no \
         reference cells"
    }

    fn describe(&self) -> String {
        format!(
            "{} ({}) as a plain reverse proxy: one worker per core it runs on, upstream \
             keep-alive, proxy_buffering off, access log on (buffered)",
            self.program.display(),
            self.version
        )
    }

    fn spawn(
        layout: &Layout,
        program: &Path,
        upstream: SocketAddr,
        dir: &Path,
    ) -> Result<NginxChild, String> {
        let prefix = dir.join("nginx");
        std::fs::create_dir_all(prefix.join("logs")).map_err(|e| format!("nginx dir: {e}"))?;
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind 127.0.0.1:0: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("local_addr: {e}"))?;
        drop(listener);
        let p = prefix.display();
        // The same job the proxy does, done the way an nginx operator would: keep-alive
        // to the upstream, streams passed on as they arrive, one access-log line per
        // request (buffered, as production configurations do). `keepalive_requests`
        // lifted from its default 1000, which would close the generator's connections
        // mid-cell (the proxy never closes a client connection on its own).
        // One worker per core it may use (`auto` counts the machine's, not its own).
        let workers = match layout {
            Layout::Pinned { middle, .. } => middle.split(',').count(),
            Layout::Shared { .. } => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let conf = format!(
            "worker_processes {workers};\n\
             error_log {p}/logs/error.log warn;\n\
             pid {p}/nginx.pid;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n\
             \x20 access_log {p}/logs/access.log combined buffer=64k flush=1s;\n\
             \x20 client_body_temp_path {p}/body; proxy_temp_path {p}/proxy;\n\
             \x20 fastcgi_temp_path {p}/fcgi; uwsgi_temp_path {p}/uwsgi; scgi_temp_path {p}/scgi;\n\
             \x20 upstream sim {{ server {upstream}; keepalive 1024; keepalive_requests 100000000; }}\n\
             \x20 server {{\n\
             \x20   listen {addr};\n\
             \x20   keepalive_requests 100000000;\n\
             \x20   location / {{\n\
             \x20     proxy_pass http://sim;\n\
             \x20     proxy_http_version 1.1;\n\
             \x20     proxy_set_header Connection \"\";\n\
             \x20     proxy_buffering off;\n\
             \x20   }}\n\
             \x20 }}\n\
             }}\n"
        );
        let conf_path = prefix.join("nginx.conf");
        std::fs::write(&conf_path, conf).map_err(|e| format!("nginx.conf: {e}"))?;
        let version = Command::new(program)
            .arg("-v")
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .trim_start_matches("nginx version: ")
                    .to_owned()
            })
            .unwrap_or_else(|_| "version unknown".into());
        let out = std::fs::File::create(prefix.join("logs/stderr.log"))
            .map_err(|e| format!("nginx log: {e}"))?;
        let child = layout
            .command(program)
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf_path)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .map_err(|e| format!("start {}: {e}", program.display()))?;
        Ok(NginxChild {
            child,
            addr,
            program: program.to_owned(),
            version,
        })
    }

    async fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match timeout_at(deadline, chat_once(self.addr)).await {
                Ok(Ok((StatusCode::OK, _))) => return Ok(()),
                Ok(Ok((status, _))) => return Err(format!("nginx answered {status}")),
                Ok(Err(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => return Err(format!("nginx was not ready within {READY_TIMEOUT:?}")),
            }
        }
    }

    /// The master and its workers: whose CPU the reference cells count.
    fn pids(&self) -> Vec<u32> {
        let master = self.child.id();
        let children = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
            .unwrap_or_default();
        std::iter::once(master)
            .chain(children.split_whitespace().filter_map(|p| p.parse().ok()))
            .collect()
    }

    /// SIGTERM to the master (the process this benchmark started), which stops its
    /// workers; SIGKILL would leave them behind.
    fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let _ = self.child.wait();
        }
    }
}

impl Drop for NginxChild {
    fn drop(&mut self) {
        self.stop();
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
    Ok(get(addr, path).await?.0)
}

async fn get(addr: SocketAddr, path: &str) -> Result<(StatusCode, Bytes), BoxError> {
    let mut sender = connect(addr).await?;
    let req = Request::get(path)
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// The sum of `switchback_requests_total` on the proxy's `/metrics`: shows metrics were
/// on and counting during the run.
async fn requests_metric(admin: SocketAddr) -> Option<u64> {
    let (status, body) = get(admin, "/metrics").await.ok()?;
    if status != StatusCode::OK {
        return None;
    }
    let text = String::from_utf8_lossy(&body);
    let mut total = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("switchback_requests_total") else {
            continue;
        };
        if !rest.starts_with(['{', ' ']) {
            continue;
        }
        let Some(Ok(value)) = rest.rsplit(' ').next().map(str::parse::<f64>) else {
            continue;
        };
        *total.get_or_insert(0) += value as u64;
    }
    total
}

/// One unary chat request on route [`ROUTE`], on a connection of its own: status and body.
async fn chat_once(addr: SocketAddr) -> Result<(StatusCode, Bytes), BoxError> {
    let mut sender = connect(addr).await?;
    let body = Bytes::from(chat_body(ROUTE, false).to_string());
    sender.ready().await?;
    let resp = sender.send_request(chat_request(addr, body)?).await?;
    let status = resp.status();
    Ok((status, resp.into_body().collect().await?.to_bytes()))
}

/// One request each way before measuring, so a broken setup fails loudly instead of
/// producing a table of errors.
async fn smoke_test(
    direct: SocketAddr,
    proxy: SocketAddr,
    child: &ProxyChild,
) -> Result<(), String> {
    for (name, addr) in [("simulator", direct), ("proxy", proxy)] {
        let (status, body) = chat_once(addr)
            .await
            .map_err(|e| format!("request to the {name} at {addr}: {e}\n{}", child.log_tail()))?;
        let text = String::from_utf8_lossy(&body);
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

/// `BENCH_AUTH=on`: run the proxy with an LLMClient (`--auth required`) and send its
/// key with every request, to measure what authentication and the client's
/// accounting cost.
static BENCH_AUTH: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var("BENCH_AUTH").is_ok_and(|v| v == "on"));
const BENCH_KEY: &str = "sk-bench-client-0123456789abcdef";
const BENCH_BEARER: &str = "Bearer sk-bench-client-0123456789abcdef";

fn chat_request(addr: SocketAddr, body: Bytes) -> Result<Request<Full<Bytes>>, BoxError> {
    let mut r = Request::builder()
        .method(Method::POST)
        .uri(CHAT_PATH)
        .header(HOST, addr.to_string())
        .header(CONTENT_TYPE, "application/json");
    if *BENCH_AUTH {
        r = r.header(hyper::header::AUTHORIZATION, BENCH_BEARER);
    }
    Ok(r.body(Full::new(body))?)
}

/// Latencies (ns) of one cell's requests that completed inside the window.
#[derive(Default)]
struct Samples {
    first_text: Vec<u64>,
    ttlb: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

struct Cell {
    window: Duration,
    /// Sorted ascending.
    first_text: Vec<u64>,
    /// Sorted ascending.
    ttlb: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
    cpu: CpuUse,
}

impl Cell {
    /// On-CPU µs per completed request: (load generator + simulator, proxy).
    fn cpu_per_request(&self) -> (Option<f64>, Option<f64>) {
        let per = |ns: Option<u64>| {
            let ok = self.ok();
            (ok > 0)
                .then(|| ns.map(|ns| ns as f64 / 1e3 / ok as f64))
                .flatten()
        };
        (per(self.cpu.bench_ns), per(self.cpu.proxy_ns))
    }

    /// The middle process's sleeps (wake-ups) per completed request.
    fn sleeps_per_request(&self) -> Option<f64> {
        let ok = self.ok();
        (ok > 0)
            .then(|| self.cpu.proxy_sleeps.map(|n| n as f64 / ok as f64))
            .flatten()
    }

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

/// A table's column heads, then a rule as wide as they are.
fn heads(o: &mut String, heads: &str) {
    let _ = writeln!(o, "{heads}\n{}", "-".repeat(heads.chars().count()));
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

async fn run_cell(
    addr: SocketAddr,
    model: &str,
    mode: Mode,
    conc: usize,
    measure: Duration,
    middle: &[u32],
) -> Cell {
    let body = Bytes::from(chat_body(model, mode == Mode::Stream).to_string());
    let from = Instant::now() + WARMUP;
    let until = from + measure;
    let middle = middle.to_vec();
    let meter = tokio::spawn(async move {
        sleep_until(from).await;
        let start = CpuUse::now(&middle);
        sleep_until(until).await;
        CpuUse::now(&middle).since(start)
    });
    let issued = Arc::new(AtomicU64::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..conc {
        workers.spawn(worker(addr, body.clone(), from, until, issued.clone()));
    }
    let mut all = Samples::default();
    while let Some(done) = workers.join_next().await {
        let Ok(s) = done else { continue };
        all.first_text.extend(s.first_text);
        all.ttlb.extend(s.ttlb);
        all.errors += s.errors;
        all.first_error = all.first_error.or(s.first_error);
    }
    all.first_text.sort_unstable();
    all.ttlb.sort_unstable();
    let cpu = meter.await.unwrap_or_default();
    // The window is cut short when the request cap is reached first.
    let last = Instant::now().min(until);
    Cell {
        window: last
            .saturating_duration_since(from)
            .max(Duration::from_millis(1)),
        first_text: all.first_text,
        ttlb: all.ttlb,
        errors: all.errors,
        first_error: all.first_error,
        cpu,
    }
}

/// On-CPU time during a cell's measurement window, from the scheduler's own
/// accounting (`/proc/<pid>/task/*/schedstat`, ns): of this process (load generator
/// plus simulator) and of the proxy (or nginx's processes, in reference cells). CPU per request is what a crowded box divides
/// between them, so it predicts the throughput ratio better than the wall clock does.
#[derive(Clone, Copy, Default)]
struct CpuUse {
    bench_ns: Option<u64>,
    proxy_ns: Option<u64>,
    /// Times the proxy's (or nginx's) threads went to sleep waiting for something
    /// (`voluntary_ctxt_switches`): each one is a wake-up later, the cost that
    /// dominates at light load.
    proxy_sleeps: Option<u64>,
}

impl CpuUse {
    fn now(middle: &[u32]) -> CpuUse {
        CpuUse {
            bench_ns: cpu_ns("self"),
            proxy_ns: middle
                .iter()
                .map(|pid| cpu_ns(&pid.to_string()))
                .sum::<Option<u64>>(),
            proxy_sleeps: middle
                .iter()
                .map(|pid| sleeps(&pid.to_string()))
                .sum::<Option<u64>>(),
        }
    }

    fn since(self, start: CpuUse) -> CpuUse {
        let d = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_sub(b?));
        CpuUse {
            bench_ns: d(self.bench_ns, start.bench_ns),
            proxy_ns: d(self.proxy_ns, start.proxy_ns),
            proxy_sleeps: d(self.proxy_sleeps, start.proxy_sleeps),
        }
    }
}

/// Sum of the on-CPU ns of every thread of `/proc/<pid>`; None when unreadable.
/// A thread that ends during the window takes its time with it (tokio's workers
/// live for the whole run; only idle blocking-pool threads come and go).
fn cpu_ns(pid: &str) -> Option<u64> {
    per_thread_sum(pid, "schedstat", |stat| stat.split_whitespace().next())
}

/// Sum of `voluntary_ctxt_switches` of every thread of `/proc/<pid>`.
fn sleeps(pid: &str) -> Option<u64> {
    per_thread_sum(pid, "status", |status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .map(str::trim)
    })
}

/// Sums the number `field` finds in `/proc/<pid>/task/*/<file>`.
fn per_thread_sum(pid: &str, file: &str, field: impl Fn(&str) -> Option<&str>) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        // Gone between the listing and the read: nothing to count.
        let Ok(text) = std::fs::read_to_string(task.path().join(file)) else {
            continue;
        };
        total += field(&text)?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// What one chat request through the failover route said about its path.
struct Sample {
    status: StatusCode,
    /// `x-switchback-attempts` (upstream requests sent), "" when absent.
    attempts: String,
    /// `x-switchback-target` (who answered), "" when absent.
    target: String,
}

impl Sample {
    /// Answered by `backup` after one upstream request: the failing target was skipped.
    fn skipped_primary(&self, backup: &str) -> bool {
        self.status == StatusCode::OK && self.attempts == "1" && self.target == backup
    }

    fn describe(&self) -> String {
        format!(
            "{} x-switchback-attempts: {} x-switchback-target: {}",
            self.status.as_u16(),
            or_dash(&self.attempts),
            or_dash(&self.target)
        )
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

async fn failover_sample(proxy: SocketAddr) -> Result<Sample, BoxError> {
    let mut sender = connect(proxy).await?;
    let body = Bytes::from(chat_body(FAILOVER_ROUTE, false).to_string());
    sender.ready().await?;
    let resp = sender.send_request(chat_request(proxy, body)?).await?;
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let sample = Sample {
        status: resp.status(),
        attempts: header("x-switchback-attempts"),
        target: header("x-switchback-target"),
    };
    resp.into_body().collect().await?;
    Ok(sample)
}

/// How the failover cell checked that the failing target's circuit was open.
struct CircuitCheck {
    /// Requests it took to see the failing target skipped before the cell (1 when the
    /// circuit was already open, 2 when the first request opened it).
    opened_after: usize,
    /// The sample request sent in the middle of the measurement window.
    mid_window: Result<Sample, String>,
    /// Requests the failing simulator received from the start of warm-up to the end of
    /// the cell (0 when every request skipped it).
    primary_hits: usize,
    backup: String,
}

impl CircuitCheck {
    fn open(&self) -> bool {
        self.primary_hits == 0
            && self
                .mid_window
                .as_ref()
                .is_ok_and(|s| s.skipped_primary(&self.backup))
    }

    fn describe(&self) -> String {
        let sample = match &self.mid_window {
            Ok(s) => s.describe(),
            Err(e) => format!("failed: {e}"),
        };
        format!(
            "mid-window sample: {sample}; primary hit {} times during the cell -> {}",
            self.primary_hits,
            if self.open() {
                "circuit OPEN, backup only"
            } else {
                "NOT as expected"
            }
        )
    }
}

struct FailoverRow {
    conc: usize,
    cell: Cell,
    check: CircuitCheck,
}

/// Opens the failing target's circuit (or confirms it is open), then measures the
/// failover route with a header check in the middle of the window.
async fn run_failover_cell(
    proxy: SocketAddr,
    broken: &SimProvider,
    backup: &str,
    conc: usize,
    measure: Duration,
    proxy_pid: u32,
) -> Result<FailoverRow, String> {
    let mut opened_after = None;
    let mut seen = Vec::new();
    for i in 1..=OPEN_CIRCUIT_TRIES {
        let sample = failover_sample(proxy)
            .await
            .map_err(|e| format!("request to {FAILOVER_ROUTE}: {e}"))?;
        if sample.status != StatusCode::OK {
            return Err(format!(
                "{FAILOVER_ROUTE} answered {} (it should fall back to the backup)",
                sample.describe()
            ));
        }
        if sample.skipped_primary(backup) {
            opened_after = Some(i);
            break;
        }
        seen.push(sample.describe());
    }
    let opened_after = opened_after.ok_or_else(|| {
        format!(
            "the failing target's circuit did not open after {OPEN_CIRCUIT_TRIES} requests: {}",
            seen.join("; ")
        )
    })?;
    let hits_before = broken.hits();
    let mid = Instant::now() + WARMUP + measure / 2;
    let pids = [proxy_pid];
    let (cell, mid_window) = tokio::join!(
        run_cell(proxy, FAILOVER_ROUTE, Mode::Unary, conc, measure, &pids),
        async {
            sleep_until(mid).await;
            failover_sample(proxy).await.map_err(|e| e.to_string())
        }
    );
    Ok(FailoverRow {
        conc,
        cell,
        check: CircuitCheck {
            opened_after,
            mid_window,
            primary_hits: broken.hits() - hits_before,
            backup: backup.to_owned(),
        },
    })
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
                    s.first_text.push(nanos(first.unwrap_or(done) - started));
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
/// the first text arrived (the first `"content":"` with something in it).
///
/// Text, not the first byte: the direct stream's first event is the simulator's
/// role-only chunk, which the proxy holds back until the first event with content
/// (the commit point, docs/request-lifecycle.md#streams-the-commit-point), so a first-byte
/// figure would compare the role chunk against the first text and charge the proxy the
/// provider's gap between them.
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
    let mut watch = TextWatch::default();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if first.is_none() && frame.data_ref().is_some_and(|d| watch.push(d)) {
            first = Some(Instant::now());
        }
    }
    Ok((status, first))
}

/// Finds the first text of an answer fed chunk by chunk: a `"content":"` whose string
/// is not empty (the role chunk's `"content":""` is not text).
#[derive(Default)]
struct TextWatch {
    /// The end of the previous chunks, so a marker split across chunks is still seen.
    carry: Vec<u8>,
}

impl TextWatch {
    const MARKER: &[u8] = br#""content":""#;

    /// Whether the chunks so far hold text.
    fn push(&mut self, chunk: &[u8]) -> bool {
        self.carry.extend_from_slice(chunk);
        let found = self
            .carry
            .windows(Self::MARKER.len() + 1)
            .any(|w| w.starts_with(Self::MARKER) && w[Self::MARKER.len()] != b'"');
        let keep = self.carry.len().saturating_sub(Self::MARKER.len());
        self.carry.drain(..keep);
        found
    }
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
    /// The same cell through nginx, when it ran.
    nginx: Option<Cell>,
}

impl Row {
    fn throughput_pct(&self) -> f64 {
        pct_of(&self.proxied, &self.direct)
    }

    fn nginx_pct(&self) -> Option<f64> {
        self.nginx.as_ref().map(|n| pct_of(n, &self.direct))
    }
}

fn pct_of(cell: &Cell, direct: &Cell) -> f64 {
    100.0 * cell.rps() / direct.rps().max(f64::MIN_POSITIVE)
}

struct Report<'a> {
    cores: usize,
    layout: &'a Layout,
    measure: Duration,
    bin: &'a Path,
    peak_rss_kib: Option<u64>,
    rss_now_kib: Option<u64>,
    /// Load averages before and after the run.
    load: [String; 2],
    runs: &'a [ProfileRun],
    /// nginx as the reference, or why it did not run.
    nginx: Option<String>,
    observability: Observability,
}

/// The proxy's logging and metrics during the run.
struct Observability {
    logging: LoggingState,
    /// Per-request log lines in the proxy's output.
    log_lines: Option<u64>,
    /// `switchback_requests_total` (all routes and outcomes) at the end.
    metric_requests: Option<u64>,
}

fn count(n: Option<u64>) -> String {
    n.map_or_else(|| "unknown".into(), |n| n.to_string())
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
        "machine: {} cores; layout {} (figures are relative, not capacity)",
        r.cores,
        r.layout.describe()
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
         {:.1} s warm-up + {:.1} s measured per cell",
        WARMUP.as_secs_f64(),
        r.measure.as_secs_f64()
    );
    let _ = writeln!(
        o,
        "proxy: {} (child process), peak RSS (VmHWM) {}, RSS at end {}",
        r.bin.display(),
        mib(r.peak_rss_kib),
        mib(r.rss_now_kib)
    );
    let obs = &r.observability;
    let _ = writeln!(
        o,
        "proxy logging: {}; {} request lines written",
        obs.logging.describe(),
        count(obs.log_lines)
    );
    let _ = writeln!(
        o,
        "proxy metrics: always on; switchback_requests_total = {} at the end",
        count(obs.metric_requests)
    );
    let _ = writeln!(
        o,
        "reference: {}",
        r.nginx.as_deref().unwrap_or(NginxChild::absent())
    );
    let _ = writeln!(o, "latency = time to the last byte of the answer");
    for run in r.runs {
        o.push_str(&profile_report(run));
    }
    o
}

fn profile_report(run: &ProfileRun) -> String {
    let mut o = String::new();
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "=== profile {}: {}",
        run.profile.name,
        run.profile.describe()
    );
    let _ = writeln!(o);
    heads(
        &mut o,
        &format!(
            "{:<6} {:>4} | {:>9} {:>7} {:>7} | {:>9} {:>7} {:>7} | {:>6} {:>7} {:>7} | {:>9} {:>7} {:>7} | {:>6}",
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
            "nginx/s",
            "thru %",
            "+p99 µs",
            "errors"
        ),
    );
    for row in &run.rows {
        let (d, p) = (&row.direct, &row.proxied);
        let n = row.nginx.as_ref();
        let _ = writeln!(
            o,
            "{:<6} {:>4} | {:>9.0} {:>7} {:>7} | {:>9.0} {:>7} {:>7} | {:>6.1} {:>7} {:>7} | {:>9} {:>7} {:>7} | {:>6}",
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
            n.map_or_else(|| "-".into(), |n| format!("{:.0}", n.rps())),
            row.nginx_pct()
                .map_or_else(|| "-".into(), |v| format!("{v:.1}")),
            signed(n.and_then(|n| added(percentile(&d.ttlb, 0.99), percentile(&n.ttlb, 0.99)))),
            d.errors + p.errors + n.map_or(0, |n| n.errors)
        );
    }
    if run.rows.iter().any(|row| row.mode == Mode::Stream) {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "stream time to first text (the first event with content; the proxy holds back the role-only chunk until then):"
        );
        heads(
            &mut o,
            &format!(
                "{:<6} {:>4} | {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7}",
                "mode", "conc", "dir p50", "dir p99", "prx p50", "prx p99", "+p50 µs", "+p99 µs"
            ),
        );
        for row in run.rows.iter().filter(|row| row.mode == Mode::Stream) {
            let (d, p) = (&row.direct.first_text, &row.proxied.first_text);
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
    }
    let _ = writeln!(o);
    o.push_str(&cpu_table(&run.rows));
    if !run.failover.is_empty() {
        let _ = writeln!(o);
        o.push_str(&failover_table(&run.rows, &run.failover));
    }
    let _ = writeln!(o);
    o.push_str(&verdict(run));
    o
}

/// Where the CPU went, per request: the proxy's own share, and the total the proxied
/// path costs against the direct one (on saturated cores, throughput through the
/// proxy tends to direct total / proxied total).
fn cpu_table(rows: &[Row]) -> String {
    let f = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
    let mut o = String::new();
    let _ = writeln!(
        o,
        "CPU per request (on-CPU µs, all threads; gen+sim = this process: load generator \
         and simulator; proxy and nginx: their own processes; sleeps = times their \
         threads blocked waiting, per request, each a wake-up later):"
    );
    heads(
        &mut o,
        &format!(
            "{:<6} {:>4} | {:>11} | {:>11} {:>9} {:>9} | {:>12} | {:>9} | {:>12} {:>12}",
            "mode",
            "conc",
            "dir gen+sim",
            "prx gen+sim",
            "proxy",
            "total",
            "direct/total",
            "nginx",
            "proxy sleeps",
            "nginx sleeps"
        ),
    );
    for row in rows {
        let (d_bench, _) = row.direct.cpu_per_request();
        let (p_bench, p_proxy) = row.proxied.cpu_per_request();
        let total = p_bench.zip(p_proxy).map(|(a, b)| a + b);
        let ratio = d_bench
            .zip(total)
            .map_or_else(|| "-".into(), |(d, t)| format!("{:.1} %", 100.0 * d / t));
        let nginx = row.nginx.as_ref().and_then(|n| n.cpu_per_request().1);
        let f2 = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
        let _ = writeln!(
            o,
            "{:<6} {:>4} | {:>11} | {:>11} {:>9} {:>9} | {:>12} | {:>9} | {:>12} {:>12}",
            row.mode.name(),
            row.conc,
            f(d_bench),
            f(p_bench),
            f(p_proxy),
            f(total),
            ratio,
            f(nginx),
            f2(row.proxied.sleeps_per_request()),
            f2(row.nginx.as_ref().and_then(Cell::sleeps_per_request))
        );
    }
    o
}

fn failover_table(rows: &[Row], failover: &[FailoverRow]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "failover (primary circuit open):");
    let _ = writeln!(
        o,
        "  route {FAILOVER_ROUTE}: targets [broken (503 to everything; circuitBreaker \
         consecutiveFailures 1, openFor 5m), sim]; healthy = route {ROUTE} [sim], the \
         unary proxied cell run just before; +p50/+p99 = added latency beyond one \
         skipped target"
    );
    heads(
        &mut o,
        &format!(
            "{:<6} {:>4} | {:>9} {:>7} {:>7} | {:>10} {:>7} {:>7} | {:>6} {:>7} {:>7} | {:>6} | circuit",
            "mode",
            "conc",
            "healthy/s",
            "p50 µs",
            "p99 µs",
            "failover/s",
            "p50 µs",
            "p99 µs",
            "thru %",
            "+p50 µs",
            "+p99 µs",
            "errors"
        ),
    );
    for f in failover {
        let healthy = rows
            .iter()
            .find(|row| row.mode == Mode::Unary && row.conc == f.conc)
            .map(|row| &row.proxied);
        let (h, c) = (healthy.map(|h| h.ttlb.as_slice()).unwrap_or(&[]), &f.cell);
        let pct = healthy.map(|h| pct_of(c, h));
        let _ = writeln!(
            o,
            "{:<6} {:>4} | {:>9} {:>7} {:>7} | {:>10.0} {:>7} {:>7} | {:>6} {:>7} {:>7} | {:>6} | {}",
            Mode::Unary.name(),
            f.conc,
            healthy.map_or_else(|| "-".into(), |h| format!("{:.0}", h.rps())),
            us(percentile(h, 0.50)),
            us(percentile(h, 0.99)),
            c.rps(),
            us(percentile(&c.ttlb, 0.50)),
            us(percentile(&c.ttlb, 0.99)),
            pct.map_or_else(|| "-".into(), |p| format!("{p:.1}")),
            signed(added(percentile(h, 0.50), percentile(&c.ttlb, 0.50))),
            signed(added(percentile(h, 0.99), percentile(&c.ttlb, 0.99))),
            c.errors,
            if f.check.open() { "open" } else { "CHECK" }
        );
    }
    let _ = writeln!(
        o,
        "circuit checks (x-switchback-target of the backup: {}):",
        { failover.first().map_or("-", |f| f.check.backup.as_str()) }
    );
    for f in failover {
        let before = match f.check.opened_after {
            1 => "already open before the cell".to_owned(),
            n => format!(
                "opened just before the cell ({} request(s) fell back, then skipped)",
                n - 1
            ),
        };
        let _ = writeln!(o, "  c={:<3} {before}; {}", f.conc, f.check.describe());
    }
    o
}

fn verdict(run: &ProfileRun) -> String {
    let rows = &run.rows;
    let mut o = String::new();
    let unary = || rows.iter().filter(|row| row.mode == Mode::Unary);
    let pass = |ok: bool| if ok { "PASS" } else { "MISS" };
    let _ = writeln!(o, "budget (unary, profile {}):", run.profile.name);
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
    let all_levels = unary().count() == CONCURRENCY.len();
    let _ = writeln!(
        o,
        "  throughput through the proxy >= 50% of direct: {} -> {}",
        if pcts.is_empty() {
            "not measured".to_string()
        } else {
            pcts.join(", ")
        },
        match (ok, all_levels) {
            (false, _) => "MISS",
            (true, true) => "PASS",
            // A subset (BENCH_ONLY) passing says nothing about the levels not run.
            (true, false) => "not judged (not every concurrency level was run)",
        }
    );
    let nginx: Vec<String> = unary()
        .filter_map(|row| Some(format!("c={} {:.1}%", row.conc, row.nginx_pct()?)))
        .collect();
    if !nginx.is_empty() {
        let _ = writeln!(
            o,
            "  reference, nginx's throughput (% of direct):   {}",
            nginx.join(", ")
        );
    }
    let errors: u64 = rows.iter().map(|row| row.proxied.errors).sum();
    if errors > 0 {
        let _ = writeln!(
            o,
            "  note: {errors} errors through the proxy during measurement"
        );
    }
    o
}

// ---------------------------------------------------------------------------------
// Memory: at rest, and with many streams open
// ---------------------------------------------------------------------------------

/// The proxy's resident memory at one moment: now (`VmRSS`) and its peak so far
/// (`VmHWM`), in KiB.
struct Memory {
    rss_kib: Option<u64>,
    peak_kib: Option<u64>,
}

impl Memory {
    fn read(proxy: &ProxyChild) -> Memory {
        Memory {
            rss_kib: proxy.status_kib("VmRSS:"),
            peak_kib: proxy.peak_rss_kib(),
        }
    }

    fn describe(&self) -> String {
        format!(
            "RSS {}, peak (VmHWM) {}",
            mib(self.rss_kib),
            mib(self.peak_kib)
        )
    }
}

/// `BENCH_OPEN_STREAMS`: how many streams the memory check holds open at once
/// (default [`DEFAULT_OPEN_STREAMS`]; `0` skips the check).
fn open_streams_wanted() -> Result<usize, String> {
    match std::env::var("BENCH_OPEN_STREAMS") {
        Err(_) => Ok(DEFAULT_OPEN_STREAMS),
        Ok(v) => v
            .parse()
            .map_err(|_| format!("BENCH_OPEN_STREAMS={v:?}: expected a number of streams")),
    }
}

/// The issue's figure: the proxy's memory with 1,000 streams in flight.
const DEFAULT_OPEN_STREAMS: usize = 1000;

/// A stream slow enough to stay open while every other one is opened and the
/// memory read: one event every [`OPEN_STREAM_INTERVAL`].
const OPEN_STREAM_INTERVAL: Duration = Duration::from_millis(500);

/// Opens `n` streams through the proxy at once (one connection each), waits until
/// every one has its first text (so each is committed: its client connection, its
/// upstream connection and its relay are all live), reads the proxy's memory, then
/// drops them all.
async fn open_streams(
    sim: &SimProvider,
    data: SocketAddr,
    n: usize,
    proxy: &ProxyChild,
) -> Result<(usize, Memory), String> {
    sim.set_default(Behavior::Stream {
        chunks: STREAM_CHUNKS,
        interval: OPEN_STREAM_INTERVAL,
    });
    let body = Bytes::from(chat_body(ROUTE, true).to_string());
    let (opened, mut all_open) = tokio::sync::mpsc::channel::<()>(n);
    let release = Arc::new(tokio::sync::Notify::new());
    let mut streams = JoinSet::new();
    for _ in 0..n {
        let (body, opened, release) = (body.clone(), opened.clone(), release.clone());
        streams.spawn(async move {
            let mut conn = connect(data).await?;
            let response = conn.send_request(chat_request(data, body)?).await?;
            if response.status() != StatusCode::OK {
                return Err(format!("status {}", response.status()).into());
            }
            let mut body = response.into_body();
            // The first frame with bytes: the stream is committed.
            while let Some(frame) = body.frame().await {
                if frame?.data_ref().is_some_and(|d| !d.is_empty()) {
                    break;
                }
            }
            let _ = opened.send(()).await;
            release.notified().await;
            Ok::<(), BoxError>(())
        });
    }
    drop(opened);
    let deadline = Instant::now() + Duration::from_secs(10) * STREAM_CHUNKS as u32 / 2;
    let mut open = 0;
    while open < n {
        match timeout_at(deadline, all_open.recv()).await {
            Ok(Some(())) => open += 1,
            // Every task ended (or the time ran out) before all were open.
            Ok(None) | Err(_) => break,
        }
    }
    let memory = Memory::read(proxy);
    release.notify_waiters();
    streams.abort_all();
    while streams.join_next().await.is_some() {}
    Ok((open, memory))
}

fn memory_report(idle: &Memory, open: Option<&(usize, Memory)>) -> String {
    let mut s = format!("at rest after start: {}", idle.describe());
    match open {
        Some((n, m)) => {
            let _ = write!(s, "; with {n} streams open at once: {}", m.describe());
        }
        None => s.push_str("; open streams not measured (BENCH_OPEN_STREAMS=0)"),
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{TextWatch, quartiles, sign_test};

    #[test]
    fn the_sign_test_matches_the_binomial_tails() {
        // 8 of 8 one way: 2 * (1/2)^8.
        assert!((sign_test(8, 8) - 2.0 / 256.0).abs() < 1e-12);
        assert!((sign_test(0, 8) - 2.0 / 256.0).abs() < 1e-12);
        // An even split is no evidence either way.
        assert_eq!(sign_test(5, 10), 1.0);
        // 9 of 10: 2 * (C(10,9) + C(10,10)) / 1024 = 22 / 1024.
        assert!((sign_test(9, 10) - 22.0 / 1024.0).abs() < 1e-12);
        assert!((sign_test(1, 10) - 22.0 / 1024.0).abs() < 1e-12);
    }

    #[test]
    fn quartiles_are_nearest_rank_of_the_sorted_values() {
        let (m, q1, q3) = quartiles(&[4.0, 1.0, 3.0, 2.0, 8.0, 6.0, 7.0, 5.0]);
        assert_eq!((m, q1, q3), (4.0, 2.0, 6.0));
        assert_eq!(quartiles(&[1.5]), (1.5, 1.5, 1.5));
    }

    #[test]
    fn the_role_chunk_is_not_text_and_the_first_piece_is() {
        let mut w = TextWatch::default();
        assert!(!w.push(br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#));
        assert!(w.push(br#"data: {"choices":[{"delta":{"content":"Hel"}}]}"#));
    }

    #[test]
    fn a_marker_split_across_chunks_is_found_once_its_next_byte_arrives() {
        let mut w = TextWatch::default();
        assert!(!w.push(br#"data: {"choices":[{"delta":{"con"#));
        assert!(!w.push(br#"tent":""#));
        assert!(w.push(br#"x"}}]}"#));
        // An empty string split after its opening quote is still not text.
        let mut w = TextWatch::default();
        assert!(!w.push(br#"{"content":""#));
        assert!(!w.push(br#""}"#));
    }
}

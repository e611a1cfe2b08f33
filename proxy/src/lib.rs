//! Switchback's data plane: an OpenAI- and Anthropic-compatible gateway that walks
//! each route's targets with retries, backoff, fallbacks and a time budget.
//!
//! [`start`] runs a proxy in-process (the binary, tests, the demo and the benchmark
//! all use it); nothing here touches global state.
//!
//! # Public surface
//!
//! Only what the binary (`src/main.rs`), the benches (`benches/`), the crate's own
//! integration tests (`tests/`) and the `switchback-tests` crate (its tests, examples and
//! harness) use is `pub`; everything else is crate-private: `pub(crate)`, or `pub` inside
//! a `pub(crate)` module (`admin`, `gateway`, `health` and `upstream` as a whole, and most
//! submodules of the others: `sources::cluster` and `sources::fleet_view` among them).
//!
//! - Running a proxy: [`start`], [`Options`], [`Source`], [`BudgetOptions`],
//!   [`Running`], [`StartError`]; `cli::Cli` (the binary's flags);
//!   `front::ClientLimits` and `limits::answers::UpstreamLimits` (the limits of
//!   [`Options`]); `pipeline::fetch::{FetchLimits, MediaFetch}` (media fetching).
//! - Logs and traces: `observe::telemetry` (`init`, `dispatch`, `LogFormat`,
//!   `BatchedWriter`, `tracer_provider`, `trace_layer`).
//! - Config as the tests compile it: `sources::standalone::{compile_manifests,
//!   compile_manifests_for}`, `sources::manifest::ManifestSet`,
//!   `config::keys::{Auth, AuthMode}`, `config::snapshot::ByKeyHash`.
//! - Pieces the benches and property tests measure or check alone: the translation
//!   (`providers::translate`: `Direction`, `Defaults`, `StreamTranslator`),
//!   `providers::classify::is_context_length`, `providers::vertex::{Signer, unix_now,
//!   anthropic_body}`; the wire (`wire::sse::{Framer, fields}`, `wire::rewrite`,
//!   `wire::json`, `wire::surface::{Surface, Wire}`, `wire::usage::Usage`); metering
//!   (`observe::counters::RouteTargetCounters`, `observe::genai::{GenAi, Streamed}`,
//!   `observe::cost::{Pricing, UsdCounter}`, `observe::reason::Reason`); keys and
//!   clients (`limits::keys::{KeyPool, PoolKey}`, `limits::clients::{ClientCounters,
//!   ClientRt, Need, WallClock}`, `http::auth::presented_key`).
//!
//! Types these name in their signatures are `pub` too. A new use from outside the
//! crate widens an item here, deliberately.

pub(crate) mod admin;
pub mod cli;
pub mod config;
pub mod front;
pub(crate) mod gateway;
pub(crate) mod health;
pub mod http;
pub mod limits;
pub mod observe;
pub mod pipeline;
pub mod providers;
pub mod sources;
pub(crate) mod upstream;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use config::keys as auth;
use front::lanes;
use gateway::{Gateway, Problem};
use observe::telemetry::otlp_metrics;
use sources::{cluster, manifest, standalone as reload};

/// Where the config comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A manifest file or folder, reloaded on change.
    Manifests(PathBuf),
    /// The rendered ConfigMaps and Secrets of a namespace, watched through the API.
    Cluster { namespace: String },
}

#[derive(Clone, Debug)]
pub struct Options {
    pub source: Source,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub max_body_bytes: usize,
    /// `--max-event-bytes`, `--max-response-bytes`, `--max-inflight-response-bytes`.
    pub upstream_limits: limits::answers::UpstreamLimits,
    /// Data-port serving threads. 0 serves on the caller's runtime (tests, the demo);
    /// N > 0 starts N threads, each with its own single-threaded runtime, its own
    /// listening socket on the data address (`SO_REUSEPORT`: the kernel spreads
    /// connections) and its own upstream pool, so a request never changes threads;
    /// they serve for the rest of the process's life.
    pub threads: usize,
    /// Client-side limits: timeouts, the connection cap, the in-flight body budget.
    pub limits: front::ClientLimits,
    /// Serve a manifest set with no LLMRoute instead of refusing it.
    pub allow_empty_config: bool,
    /// How LLMClient budgets are kept (docs/tenancy.md#budgets).
    pub budgets: BudgetOptions,
    /// `--auth`; `None` decides: standalone, `required` when the manifests hold an
    /// LLMClient at start, else `off`; in a cluster `off` (the chart sets the operator's
    /// and the proxies' `--auth` together).
    pub auth: Option<auth::AuthMode>,
    /// `--client-key-hmac-file`: the per-cluster secret client keys are hashed with.
    /// Standalone without it, a random one is drawn at start.
    pub client_key_hmac_file: Option<PathBuf>,
    /// `--admin-token-file`: the admin port's bearer token (docs/proxy.md#admin-port).
    /// `None`: the admin port is open to whoever reaches it (said at start-up).
    pub admin_token_file: Option<PathBuf>,
    /// `--fetch-media`: which image and document URLs the gateway fetches for targets
    /// that cannot (docs/translation.md#documents-and-media).
    pub fetch_media: pipeline::fetch::MediaFetch,
    /// `--fetch-media-timeout`, `--max-fetched-urls`.
    pub fetch_limits: pipeline::fetch::FetchLimits,
    /// `--listen-wait`: how long to wait for a port in use (a replica draining on it
    /// gives it up when it exits). The ports are taken all or none: see `bind`.
    pub listen_wait: Duration,
}

/// How LLMClient budgets are kept (docs/tenancy.md#reserve-before-sending):
/// `--budget-reservation`, and standalone `--replicas`.
#[derive(Clone, Debug)]
pub struct BudgetOptions {
    /// Requests reserve before they are sent.
    pub reservation: bool,
    /// Standalone: the replicas sharing every client's limits and budgets.
    pub replicas: u32,
}

impl Default for BudgetOptions {
    fn default() -> Self {
        Self {
            reservation: true,
            replicas: 1,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the config could not be loaded:\n{}", .0.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Config(Vec<Problem>),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "cannot listen on {addr}: still in use after waiting {} (--listen-wait); no port \
         was kept", humantime::format_duration(*.waited)
    )]
    ListenBusy { addr: SocketAddr, waited: Duration },
    #[error("cannot build the upstream HTTP client: {0}")]
    Client(#[from] std::io::Error),
    #[error("cannot watch {path}: {source}")]
    Watch {
        path: PathBuf,
        source: notify::Error,
    },
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
    #[error("authentication: {0}")]
    Auth(String),
    #[error("--admin-token-file: {0}")]
    AdminToken(String),
}

/// A running proxy. Dropping it stops serving.
pub struct Running {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub gateway: Arc<Gateway>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _watcher: Option<reload::ManifestWatcher>,
}

impl Running {
    /// Serve until one of the listeners stops (normally never).
    pub async fn wait(mut self) {
        self.stopped().await;
    }

    /// Ends when the data listener stops (normally never, except by [`Running::drain_and_hand_over`]).
    pub async fn stopped(&mut self) {
        if let Some(t) = self.tasks.first_mut() {
            let _ = t.await;
        }
    }

    /// Export the OpenTelemetry GenAI metrics over OTLP/HTTP to `endpoint` every
    /// `interval` while the returned exporter lives (see
    /// [`observe::telemetry::otlp_metrics`]).
    pub fn export_otlp_metrics(
        &self,
        endpoint: &str,
        interval: std::time::Duration,
    ) -> Result<otlp_metrics::Exporting, observe::telemetry::TelemetryError> {
        let gw = self.gateway.clone();
        let source: otlp_metrics::Source =
            Arc::new(move || admin::metrics::genai::series(&gw.snapshot()));
        let exporter = otlp_metrics::OtlpMetrics::new(
            endpoint,
            source,
            &self.gateway.instance_id,
            self.gateway.started_at,
        )?;
        Ok(exporter.start(interval))
    }

    /// Shut down gracefully (docs/limits.md#shutdown, `front::drain`): not ready at once,
    /// stop accepting after `delay`, let requests in flight finish, end the streams still
    /// open after `grace` with the error event; then hand over the final usage counts: up
    /// to `handover` for the operator to read them (`admin::handover`). The admin port
    /// answers until the returned future ends (and `self` is dropped).
    pub async fn drain_and_hand_over(
        self,
        delay: std::time::Duration,
        grace: std::time::Duration,
        handover: std::time::Duration,
    ) {
        front::drain::drain(&self.gateway.front, delay, grace).await;
        admin::handover::hand_over(&self.gateway, handover).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Load the config (it must load: a proxy never starts on a broken config), bind
/// both listeners and serve.
pub async fn start(opts: Options) -> Result<Running, StartError> {
    let source = match &opts.source {
        Source::Manifests(path) => format!("manifests:{}", path.display()),
        Source::Cluster { namespace } => format!("cluster:{namespace}"),
    };
    let mut gw = Gateway::new(opts.max_body_bytes, source, opts.threads)?;
    gw.front = Arc::new(front::Front::new(opts.limits.clone(), opts.threads));
    gw.admin_front = Arc::new(front::Front::admin(&opts.limits));
    gw.allow_empty_config = opts.allow_empty_config;
    gw.reserve_budgets = opts.budgets.reservation;
    gw.standalone_replicas = opts.budgets.replicas.max(1);
    gw.empty_until_routed = matches!(opts.source, Source::Cluster { .. });
    gw.set_upstream_limits(opts.upstream_limits);
    gw.media_fetch = opts.fetch_media;
    gw.fetch_limits = opts.fetch_limits;
    gw.auth = auth_settings(&opts)?;
    let admin_token = admin_token(&opts)?;
    // Manifests have no operator to sum usage and render spent budgets.
    gw.standalone = matches!(opts.source, Source::Manifests(_));
    match gw.auth.mode {
        auth::AuthMode::Off => tracing::warn!(
            "authentication is off (--auth off): every caller is served, with every route"
        ),
        auth::AuthMode::Required => {
            tracing::info!("authentication required (--auth required): LLMClient keys only")
        }
    }
    let gw = Arc::new(gw);
    let (watcher, watch_tasks) = match &opts.source {
        Source::Manifests(path) => {
            let watcher =
                reload::watch(gw.clone(), path.clone()).map_err(|source| StartError::Watch {
                    path: path.clone(),
                    source,
                })?;
            {
                let (gw, path) = (gw.clone(), path.clone());
                tokio::task::spawn_blocking(move || reload::load_once(&gw, &path))
                    .await
                    .map_err(|e| StartError::Config(vec![problem(e.to_string())]))?
                    .map_err(StartError::Config)?;
            }
            (Some(watcher), Vec::new())
        }
        // Serves (not ready) at once; ready when the rendered objects are applied.
        Source::Cluster { namespace } => {
            let client = cluster::connect().await?;
            (
                None,
                cluster::watch(gw.clone(), client, namespace).into_tasks(),
            )
        }
    };
    let data_app = http::data_router(gw.clone());
    let admin_app = admin::router(gw.clone(), admin_token);
    let ports = bind(&opts).await?;
    let (admin_addr, data_addr) = (ports.admin_addr, ports.data_addr);
    let admin_task = tokio::spawn(front::conn::serve_admin(
        ports.admin,
        admin_app,
        gw.admin_front.clone(),
    ));
    let data_task = match ports.data {
        Data::One(data) => tokio::spawn(front::conn::serve(
            data,
            data_app,
            Some(gw.clone()),
            gw.front.clone(),
        )),
        Data::Lanes(listeners) => {
            let stopped = lanes::serve(listeners, data_app, Some(gw.clone()), gw.front.clone())
                .map_err(|source| StartError::Listen {
                    addr: opts.listen,
                    source,
                })?;
            // Ends when the first serving thread does (normally never).
            tokio::spawn(stopped)
        }
    };
    let mut tasks = vec![data_task, admin_task];
    // Probes of open circuits and health checks (docs/request-lifecycle.md#probed-circuits).
    tasks.push(tokio::spawn(health::run(gw.clone())));
    tasks.extend(watch_tasks);
    Ok(Running {
        data_addr,
        admin_addr,
        gateway: gw,
        tasks,
        _watcher: watcher,
    })
}

/// `--auth` (or its default) and the HMAC secret.
fn auth_settings(opts: &Options) -> Result<auth::Auth, StartError> {
    let mode = match (opts.auth, &opts.source) {
        (Some(mode), _) => mode,
        // A manifest set that does not load fails the start right after; `off` here
        // only decides how it is reported.
        (None, Source::Manifests(path)) => match manifest::load(path) {
            Ok(set) if !set.clients.is_empty() => auth::AuthMode::Required,
            _ => auth::AuthMode::Off,
        },
        (None, Source::Cluster { .. }) => auth::AuthMode::Off,
    };
    if mode == auth::AuthMode::Off {
        return Ok(auth::Auth { mode, hasher: None });
    }
    let hasher = match (&opts.client_key_hmac_file, &opts.source) {
        (Some(path), _) => auth::read_hmac_file(path).map_err(StartError::Auth)?,
        (None, Source::Manifests(_)) => auth::random_hasher(),
        (None, Source::Cluster { .. }) => {
            return Err(StartError::Auth(
                "--auth required in cluster mode needs --client-key-hmac-file (the secret the \
                 delivered key hashes were made with)"
                    .into(),
            ));
        }
    };
    Ok(auth::Auth {
        mode,
        hasher: Some(hasher),
    })
}

/// The admin token file, read once now (a missing, empty or too short token stops the
/// start, naming the file); without one, a warning that the admin port is open.
fn admin_token(
    opts: &Options,
) -> Result<Option<Arc<switchback_crds::admintoken::AdminTokenFile>>, StartError> {
    match &opts.admin_token_file {
        Some(path) => {
            let file = switchback_crds::admintoken::AdminTokenFile::open(path)
                .map_err(StartError::AdminToken)?;
            tracing::info!(
                file = %path.display(),
                "admin port: /admin/v1/* and /metrics need the admin token (Authorization: Bearer)"
            );
            Ok(Some(Arc::new(file)))
        }
        None => {
            tracing::warn!(
                admin = %opts.admin_listen,
                "admin port unauthenticated: /admin/v1/* and /metrics are served to anyone who \
                 reaches it; set --admin-token-file"
            );
            Ok(None)
        }
    }
}

/// The two ports, bound.
struct Ports {
    admin: tokio::net::TcpListener,
    admin_addr: SocketAddr,
    data: Data,
    data_addr: SocketAddr,
}

/// The data port: one listener served on the caller's runtime, or one per lane.
enum Data {
    One(tokio::net::TcpListener),
    Lanes(Vec<std::net::TcpListener>),
}

/// How often a port in use is tried again.
const LISTEN_RETRY: Duration = Duration::from_millis(100);

/// Binds both ports, all or none (docs/proxy.md, "Ports"): the admin port first, then
/// the data port (`SO_REUSEPORT` when served by lanes, so a second process could share
/// it); if either is in use, neither is kept, and both are tried again every 100 ms
/// for up to `--listen-wait`. A replica started on the ports of one that drains thus
/// waits, holding nothing, and takes both once the old one exits; it never serves the
/// data port without its admin port (probes would fail it while it takes traffic).
async fn bind(opts: &Options) -> Result<Ports, StartError> {
    let started = tokio::time::Instant::now();
    let mut said = false;
    loop {
        let error = match bind_once(opts) {
            Ok(ports) => {
                if said {
                    tracing::info!(
                        waited_ms = started.elapsed().as_millis() as u64,
                        "ports free: listening"
                    );
                }
                return Ok(ports);
            }
            Err(e) => e,
        };
        let StartError::Listen { addr, source } = &error else {
            return Err(error);
        };
        if source.kind() != std::io::ErrorKind::AddrInUse {
            return Err(error);
        }
        if started.elapsed() >= opts.listen_wait {
            return Err(match said {
                true => StartError::ListenBusy {
                    addr: *addr,
                    waited: opts.listen_wait,
                },
                false => error,
            });
        }
        if !said {
            said = true;
            tracing::warn!(
                addr = %addr,
                listen_wait = %humantime::format_duration(opts.listen_wait),
                "{addr} is in use; waiting for it, holding no port (a replica draining on \
                 these ports gives them up when it exits)"
            );
        }
        tokio::time::sleep(LISTEN_RETRY).await;
    }
}

/// One try at both ports; on an error nothing stays bound (dropped on return).
fn bind_once(opts: &Options) -> Result<Ports, StartError> {
    let listen_error = |addr| move |source| StartError::Listen { addr, source };
    let std_admin = listener(opts.admin_listen).map_err(listen_error(opts.admin_listen))?;
    let admin_addr = std_admin
        .local_addr()
        .map_err(listen_error(opts.admin_listen))?;
    let (data, data_addr) = if opts.threads == 0 {
        let l = listener(opts.listen).map_err(listen_error(opts.listen))?;
        let addr = l.local_addr().map_err(listen_error(opts.listen))?;
        (
            Data::One(tokio_listener(l).map_err(listen_error(opts.listen))?),
            addr,
        )
    } else {
        let ls = lanes::listeners(opts.listen, opts.threads).map_err(listen_error(opts.listen))?;
        let addr = ls[0].local_addr().map_err(listen_error(opts.listen))?;
        (Data::Lanes(ls), addr)
    };
    Ok(Ports {
        admin: tokio_listener(std_admin).map_err(listen_error(opts.admin_listen))?,
        admin_addr,
        data,
        data_addr,
    })
}

/// A listening socket as tokio's `bind` makes one (`SO_REUSEADDR`, a backlog of
/// 1024), not yet registered with a runtime.
fn listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

fn tokio_listener(l: std::net::TcpListener) -> std::io::Result<tokio::net::TcpListener> {
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

fn problem(message: String) -> Problem {
    Problem {
        file: None,
        line: None,
        object: None,
        field: None,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use auth::AuthMode;

    fn options(source: Source, auth: Option<AuthMode>, hmac: Option<PathBuf>) -> Options {
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        Options {
            source,
            listen: loopback,
            admin_listen: loopback,
            max_body_bytes: 1024,
            threads: 0,
            limits: Default::default(),
            allow_empty_config: false,
            budgets: Default::default(),
            upstream_limits: Default::default(),
            auth,
            client_key_hmac_file: hmac,
            fetch_media: Default::default(),
            fetch_limits: Default::default(),
            admin_token_file: None,
            listen_wait: Duration::ZERO,
        }
    }

    const CLIENT: &str = "apiVersion: switchback.dev/v1alpha1\nkind: LLMClient\n\
                          metadata: {name: app}\nspec:\n  keySecretRef: {name: app, key: k}\n";

    #[test]
    fn auth_defaults_follow_the_source_and_the_manifests() {
        let dir = tempfile::tempdir().unwrap();
        let with = dir.path().join("with.yaml");
        let without = dir.path().join("without.yaml");
        std::fs::write(&with, CLIENT).unwrap();
        std::fs::write(&without, "").unwrap();
        let mode = |source, auth| auth_settings(&options(source, auth, None)).unwrap();

        let a = mode(Source::Manifests(with.clone()), None);
        assert_eq!(a.mode, AuthMode::Required);
        assert!(a.hasher.is_some(), "a random secret is drawn");
        let a = mode(Source::Manifests(without.clone()), None);
        assert_eq!(a.mode, AuthMode::Off);
        assert!(a.hasher.is_none());
        let a = mode(Source::Manifests(with), Some(AuthMode::Off));
        assert_eq!(a.mode, AuthMode::Off);
        let a = mode(Source::Manifests(without), Some(AuthMode::Required));
        assert_eq!(a.mode, AuthMode::Required);

        let cluster = || Source::Cluster {
            namespace: "gw".into(),
        };
        assert_eq!(mode(cluster(), None).mode, AuthMode::Off);
        let err = auth_settings(&options(cluster(), Some(AuthMode::Required), None))
            .expect_err("no secret to check keys with");
        assert!(err.to_string().contains("--client-key-hmac-file"), "{err}");
        let hmac = dir.path().join("hmac");
        std::fs::write(&hmac, "0123456789abcdef0123456789abcdef\n").unwrap();
        let a = auth_settings(&options(cluster(), Some(AuthMode::Required), Some(hmac))).unwrap();
        assert_eq!(a.mode, AuthMode::Required);
        assert!(a.hasher.is_some());
    }

    fn ports(listen: SocketAddr, admin: SocketAddr, threads: usize, wait: Duration) -> Options {
        Options {
            listen,
            admin_listen: admin,
            threads,
            listen_wait: wait,
            ..options(Source::Manifests("x".into()), None, None)
        }
    }

    fn free_port() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    /// A busy data port: the admin port, bound first, is let go again, and after the
    /// wait the error says what was waited for.
    #[tokio::test]
    async fn the_ports_are_taken_all_or_none() {
        for threads in [0, 2] {
            let data = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let admin = free_port();
            let opts = ports(
                data.local_addr().unwrap(),
                admin,
                threads,
                Duration::from_millis(300),
            );
            let err = bind(&opts).await.err().expect("the data port is busy");
            assert!(
                matches!(err, StartError::ListenBusy { addr, .. } if addr == data.local_addr().unwrap()),
                "{err}"
            );
            assert!(err.to_string().contains("300ms"), "{err}");
            assert!(err.to_string().contains("--listen-wait"), "{err}");
            std::net::TcpListener::bind(admin).expect("the admin port was let go");
        }
        // Without a wait, the plain error at once.
        let data = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let opts = ports(data.local_addr().unwrap(), free_port(), 0, Duration::ZERO);
        assert!(matches!(bind(&opts).await, Err(StartError::Listen { .. })));
    }

    /// A port freed within the wait is taken, with the other.
    #[tokio::test]
    async fn a_port_freed_within_the_wait_is_taken() {
        let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let data = free_port();
        let opts = ports(data, admin_addr, 2, Duration::from_secs(30));
        let freed = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(admin);
        });
        let bound = bind(&opts).await.expect("taken once free");
        freed.await.unwrap();
        assert_eq!((bound.admin_addr, bound.data_addr), (admin_addr, data));
    }
}

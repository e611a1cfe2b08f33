//! The `switchback-proxy` command line. Every flag can also be set from the
//! environment as `SWITCHBACK_<FLAG>`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::observe::telemetry::LogFormat;

#[derive(Debug, Parser)]
#[command(
    name = "switchback-proxy",
    version,
    about = "OpenAI- and Anthropic-compatible LLM gateway with retries, fallbacks and time budgets",
    long_about = "Serves POST /v1/chat/completions, /v1/embeddings, /v1/messages and GET /v1/models on the data \
port, and /healthz, /readyz, /admin/v1/config, /admin/v1/stats, /metrics on the admin port (all but /healthz and /readyz \
behind the bearer token of --admin-token-file when it is set).\n\nRun standalone with --manifests (the same \
LLMRoute, ProviderCredential and Secret manifests you would kubectl apply), or in a cluster with --namespace.\n\n\
New here? `cargo run -p switchback-tests --example demo` starts simulated providers next to a proxy and shows \
a fallback happen."
)]
pub struct Cli {
    /// Standalone mode: a manifest file or a folder of them (LLMRoute, ProviderCredential,
    /// and Secret with `data` or `stringData`). Reloaded when it changes; an edit that does
    /// not load keeps the last good config and reports the error with file and line.
    #[arg(
        long,
        env = "SWITCHBACK_MANIFESTS",
        value_name = "PATH",
        conflicts_with = "namespace",
        required_unless_present = "namespace"
    )]
    pub manifests: Option<PathBuf>,

    /// Cluster mode: watch the index ConfigMap `switchback-index` in this namespace
    /// (rendered by switchback-operator) through the API, with the in-cluster config or
    /// KUBECONFIG, and fetch the ConfigMaps and Secrets it names. Needs only get, list
    /// and watch on that ConfigMap by name and get on the objects it names.
    #[arg(long, env = "SWITCHBACK_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,

    /// Address of the data port (the OpenAI/Anthropic-compatible API).
    #[arg(
        long,
        env = "SWITCHBACK_LISTEN",
        value_name = "ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub listen: SocketAddr,

    /// Address of the admin port (/healthz, /readyz, /admin/v1/config, /admin/v1/stats, /metrics).
    #[arg(
        long,
        env = "SWITCHBACK_ADMIN_LISTEN",
        value_name = "ADDR",
        default_value = "0.0.0.0:9090"
    )]
    pub admin_listen: SocketAddr,

    /// Largest request body accepted, in bytes; larger ones get 413.
    #[arg(long, env = "SWITCHBACK_MAX_BODY_BYTES", value_name = "BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Time a client has from a request's first byte to the end of its headers; past
    /// it the connection is closed.
    #[arg(long, env = "SWITCHBACK_HEADER_READ_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,

    /// Time a client has from the end of the headers to the end of the request body;
    /// past it the answer is 408.
    #[arg(long, env = "SWITCHBACK_BODY_READ_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub body_read_timeout: Duration,

    /// A keep-alive client connection with no request in progress is closed after this long.
    #[arg(long, env = "SWITCHBACK_IDLE_TIMEOUT", value_name = "DURATION", default_value = "90s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// Open client connections on the data port; past it new connections wait in the
    /// kernel's accept queue until one closes.
    #[arg(long, env = "SWITCHBACK_MAX_CONNECTIONS", value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Request body bytes held in memory at once, all requests together; a request
    /// whose body does not fit gets 503 `overloaded` with `Retry-After: 1`.
    #[arg(long, env = "SWITCHBACK_MAX_INFLIGHT_BODY_BYTES", value_name = "BYTES", default_value_t = 256 * 1024 * 1024)]
    pub max_inflight_body_bytes: usize,

    /// Largest request head (request line and headers), in bytes, at least 8192; a
    /// larger one is answered 431 and the connection closed, before authentication.
    #[arg(long, env = "SWITCHBACK_MAX_HEADER_BYTES", value_name = "BYTES", default_value_t = 64 * 1024, value_parser = clap::value_parser!(u32).range(8192..=16 * 1024 * 1024))]
    pub max_header_bytes: u32,

    /// Bytes of request heads still being received (heads that did not arrive in one
    /// read), all connections together; a head that does not fit closes its
    /// connection. Bounds the memory slow heads hold, whatever --max-connections.
    #[arg(long, env = "SWITCHBACK_MAX_INFLIGHT_HEADER_BYTES", value_name = "BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_inflight_header_bytes: usize,

    /// A client that takes no byte of its answer for this long (it stopped reading) is
    /// disconnected, and what its request held (answer bytes, concurrency slots) given
    /// back. Applies to both ports.
    #[arg(long, env = "SWITCHBACK_CLIENT_WRITE_TIMEOUT", value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    pub client_write_timeout: Duration,

    /// Loops: every upstream request carries `x-switchback-hops` (the incoming count
    /// plus one); a request arriving with this many or more is answered 508
    /// `loop_detected` and not sent on. 2 lets one gateway call another once.
    #[arg(long, env = "SWITCHBACK_MAX_HOPS", value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=crate::wire::hops::MAX as i64))]
    pub max_hops: u8,

    /// Open connections on the admin port; past it the connection with no request in
    /// progress for the longest is closed to make room (when all are busy, the new one
    /// is), so probes always get in.
    #[arg(long, env = "SWITCHBACK_ADMIN_MAX_CONNECTIONS", value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub admin_max_connections: u32,

    /// An admin-port connection with no request in progress is closed after this long.
    #[arg(long, env = "SWITCHBACK_ADMIN_IDLE_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub admin_idle_timeout: Duration,

    /// How long to wait at start for a port in use (a replica draining on the same
    /// ports gives them up when it exits). The proxy takes both ports or none: while
    /// it waits it holds neither; past this it exits with an error.
    #[arg(long, env = "SWITCHBACK_LISTEN_WAIT", value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    pub listen_wait: Duration,

    /// Largest SSE event relayed from a provider, in bytes. Before commit, a larger
    /// one fails the attempt over (invalidResponse); after, the stream ends with the
    /// error event. The proxy never holds more of a stream than this.
    #[arg(long, env = "SWITCHBACK_MAX_EVENT_BYTES", value_name = "BYTES", default_value_t = crate::wire::sse::DEFAULT_MAX_EVENT_BYTES)]
    pub max_event_bytes: usize,

    /// Largest unary provider answer read, in bytes; a larger one is an
    /// invalidResponse failure (responseTooLarge in the attempt log) that fails over.
    #[arg(long, env = "SWITCHBACK_MAX_RESPONSE_BYTES", value_name = "BYTES", default_value_t = crate::limits::answers::DEFAULT_MAX_RESPONSE_BYTES)]
    pub max_response_bytes: usize,

    /// Unary provider answer bytes held in memory at once, all requests together
    /// (being read, or on their way to the client). An answer that does not fit is
    /// not read: the request gets 503 `overloaded` with `Retry-After: 1`, without
    /// failing over (the replica is short of memory, not the provider of health).
    #[arg(long, env = "SWITCHBACK_MAX_INFLIGHT_RESPONSE_BYTES", value_name = "BYTES", default_value_t = crate::limits::answers::DEFAULT_MAX_INFLIGHT_RESPONSE_BYTES)]
    pub max_inflight_response_bytes: usize,

    /// On SIGTERM/SIGINT, /readyz turns 503 at once, and the data port keeps accepting
    /// for this long (for endpoints to notice) before it stops.
    #[arg(long, env = "SWITCHBACK_DRAIN_DELAY", value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    pub drain_delay: Duration,

    /// After the drain delay, the time requests in flight have to finish; streams still
    /// open then are ended with the error event, and the process exits 0.
    #[arg(long, env = "SWITCHBACK_SHUTDOWN_GRACE", value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// Serve a config with no LLMRoute at all. Without it such a load is refused like
    /// any broken edit (standalone, the proxy does not start; on reload the last good
    /// config keeps serving). In cluster mode a config with no route is served while no
    /// route has been (a fresh install is ready and answers 404 `model_not_found`), but
    /// an edit that would empty a config with routes is refused unless this is set.
    #[arg(long, env = "SWITCHBACK_ALLOW_EMPTY_CONFIG")]
    pub allow_empty_config: bool,

    /// OpenTelemetry: send traces over OTLP/HTTP to this collector base URL (spans are
    /// posted to URL/v1/traces): one span per request, one per upstream attempt, with
    /// GenAI semantic-convention attributes. Off when unset.
    #[arg(long, env = "SWITCHBACK_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// With --otlp-endpoint: send the OpenTelemetry GenAI semantic conventions'
    /// metrics (gen_ai.client.token.usage, gen_ai.client.operation.duration, ...) to
    /// URL/v1/metrics this often, and once more at shutdown. 0s: traces only.
    #[arg(long, env = "SWITCHBACK_OTLP_METRICS_INTERVAL", value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    pub otlp_metrics_interval: Duration,

    /// Client authentication on the data port (docs/tenancy.md#modes). `required`: every request
    /// must carry an LLMClient's key (Authorization: Bearer or x-api-key), else 401,
    /// and model names are resolved among the routes that client may call. `off`:
    /// everyone is served with every route, said at start-up. Default: standalone,
    /// `required` when the manifests hold an LLMClient at start, else `off`; in cluster
    /// mode `off`. In a cluster, give it the operator's `--auth` (the Helm chart sets
    /// both to `required` by default and mounts the client-key HMAC secret for it).
    #[arg(long, env = "SWITCHBACK_AUTH", value_enum, value_name = "MODE")]
    pub auth: Option<crate::config::keys::AuthMode>,

    /// File holding the per-cluster secret client keys are hashed with (HMAC-SHA256;
    /// at least 32 bytes, surrounding whitespace trimmed, e.g. `openssl rand -hex 32`).
    /// Standalone without it, a random secret is drawn at start (the proxy hashes its
    /// own manifests' keys). Required for `--auth required` in cluster mode.
    #[arg(long, env = "SWITCHBACK_CLIENT_KEY_HMAC_FILE", value_name = "PATH")]
    pub client_key_hmac_file: Option<PathBuf>,

    /// File holding the admin port's bearer token (surrounding whitespace trimmed, at
    /// least 16 visible ASCII characters, e.g. `openssl rand -hex 24`). When set,
    /// /admin/v1/* and /metrics answer 401 unless the request carries
    /// `Authorization: Bearer <token>`; /healthz and /readyz stay open. Re-read when the
    /// file changes (a rotated Secret). Unset: the admin port is open to anyone who
    /// reaches it, and the proxy warns at start-up.
    #[arg(long, env = "SWITCHBACK_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,

    /// Images and documents a client sends by URL to a target that reads only inline
    /// bytes (Bedrock) are fetched by the proxy: `public` addresses only (names
    /// resolving to, and IP literals of, private, loopback or link-local networks are
    /// refused), `any` address, or `off` (such targets are then skipped as
    /// unsupportedFeature). Each fetch is capped by --max-response-bytes, held in
    /// --max-inflight-response-bytes, given at most 30 s, and follows no redirect.
    #[arg(long, env = "SWITCHBACK_FETCH_MEDIA", value_enum, value_name = "WHICH", default_value_t = crate::pipeline::fetch::MediaFetch::Public)]
    pub fetch_media: crate::pipeline::fetch::MediaFetch,

    /// The longest one fetch of --fetch-media may take (less when the call's budget
    /// ends sooner); past it the target that needed it is skipped as
    /// unsupportedFeature.
    #[arg(long, env = "SWITCHBACK_FETCH_MEDIA_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub fetch_media_timeout: Duration,

    /// URLs one request may have fetched by --fetch-media at most; past it the targets
    /// that needed more are skipped as unsupportedFeature.
    #[arg(long, env = "SWITCHBACK_MAX_FETCHED_URLS", value_name = "N", default_value_t = crate::pipeline::fetch::DEFAULT_MAX_FETCHED_URLS)]
    pub max_fetched_urls: usize,

    /// Log format: human-readable text or one JSON object per line.
    #[arg(long, env = "SWITCHBACK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// LLMClient budgets (docs/tenancy.md#reserve-before-sending): a request is sent
    /// upstream only once it has reserved its output cap (or the client's
    /// budget.defaultReservation) plus its input estimate against what is left of the
    /// budget; settled to the real usage when the answer ends. `off`: budgets are checked
    /// against what was counted only, so requests in flight together can overshoot them.
    #[arg(long, env = "SWITCHBACK_BUDGET_RESERVATION", value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub budget_reservation: bool,

    /// Standalone (`--manifests`): how many replicas of this proxy serve the same
    /// clients (behind one load balancer, without an operator); each enforces 1/N of
    /// every LLMClient's limits and budgets, from its own counts. In a cluster the
    /// operator renders the ready replicas instead.
    #[arg(long, env = "SWITCHBACK_REPLICAS", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub replicas: u32,

    /// At shutdown, after the drain: how long to wait for the operator to read this
    /// replica's final usage counts (and for the counting of answers clients walked
    /// away from to finish), so that nothing counted while draining is lost from
    /// LLMClient status.usage. Only once an operator has read this replica's stats;
    /// 0s exits at once.
    #[arg(long, env = "SWITCHBACK_USAGE_HANDOVER", value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub usage_handover: Duration,

    /// Threads serving the data port, each with its own event loop, listening socket
    /// and upstream connections, so a request stays on one thread from start to end.
    /// Default: one per CPU core available to the process.
    #[arg(long, env = "SWITCHBACK_THREADS", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
}

/// `on` or `off` (also `true`/`false`).
fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}

impl Cli {
    /// The client-side limits given by the flags.
    pub fn client_limits(&self) -> crate::front::ClientLimits {
        crate::front::ClientLimits {
            header_read_timeout: self.header_read_timeout,
            body_read_timeout: self.body_read_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections as usize,
            max_inflight_body_bytes: self.max_inflight_body_bytes,
            max_header_bytes: self.max_header_bytes as usize,
            max_inflight_header_bytes: self.max_inflight_header_bytes,
            client_write_timeout: self.client_write_timeout,
            max_hops: self.max_hops,
            admin_max_connections: self.admin_max_connections as usize,
            admin_idle_timeout: self.admin_idle_timeout,
        }
    }

    /// The limits on provider answers given by the flags.
    pub fn upstream_limits(&self) -> crate::limits::answers::UpstreamLimits {
        crate::limits::answers::UpstreamLimits {
            max_event_bytes: self.max_event_bytes,
            max_response_bytes: self.max_response_bytes,
            max_inflight_response_bytes: self.max_inflight_response_bytes,
        }
    }

    /// The limits on fetching media for targets that cannot
    /// (docs/translation.md#documents-and-media).
    pub fn fetch_limits(&self) -> crate::pipeline::fetch::FetchLimits {
        crate::pipeline::fetch::FetchLimits {
            timeout: self.fetch_media_timeout,
            max_urls: self.max_fetched_urls,
        }
    }

    /// `--threads`, or the number of cores available.
    pub fn threads(&self) -> usize {
        self.threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            usize::from,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent_and_needs_a_source() {
        Cli::command().debug_assert();
        assert!(Cli::try_parse_from(["switchback-proxy"]).is_err());
        let cli = Cli::try_parse_from(["switchback-proxy", "--manifests", "x.yaml"]).unwrap();
        assert_eq!(cli.listen.to_string(), "0.0.0.0:8080");
        assert_eq!(cli.admin_listen.to_string(), "0.0.0.0:9090");
        assert_eq!(cli.upstream_limits(), Default::default());
        let cli = Cli::try_parse_from([
            "switchback-proxy",
            "--manifests",
            "x",
            "--max-event-bytes",
            "4096",
            "--max-response-bytes",
            "65536",
            "--max-inflight-response-bytes",
            "1048576",
        ])
        .unwrap();
        assert_eq!(cli.upstream_limits().max_inflight_response_bytes, 1 << 20);
        assert_eq!(cli.upstream_limits().max_event_bytes, 4096);
        assert_eq!(cli.upstream_limits().max_response_bytes, 65536);
        assert!(
            Cli::try_parse_from(["switchback-proxy", "--manifests", "x", "--namespace", "n"])
                .is_err()
        );
    }

    #[test]
    fn every_flag_has_an_env_var() {
        for arg in Cli::command().get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("--{id} has no env var"));
            let want = format!("SWITCHBACK_{}", id.to_uppercase());
            assert_eq!(env.to_str(), Some(want.as_str()), "--{id}");
        }
    }

    #[test]
    fn the_hostile_client_limits_have_bounds() {
        let parse = |flag: &str, v: &str| {
            Cli::try_parse_from(["switchback-proxy", "--manifests", "x", flag, v])
        };
        assert!(
            parse("--max-header-bytes", "4096").is_err(),
            "under hyper's 8 KiB"
        );
        assert!(parse("--max-hops", "0").is_err());
        assert!(parse("--max-hops", "33").is_err());
        assert!(parse("--admin-max-connections", "0").is_err());
        let cli = parse("--max-hops", "5").unwrap();
        assert_eq!(cli.client_limits().max_hops, 5);
        let cli = parse("--client-write-timeout", "250ms").unwrap();
        assert_eq!(
            cli.client_limits().client_write_timeout,
            Duration::from_millis(250)
        );
    }

    #[test]
    fn auth_is_decided_unless_given() {
        use crate::config::keys::AuthMode;
        let cli = Cli::try_parse_from(["switchback-proxy", "--manifests", "x.yaml"]).unwrap();
        assert_eq!(cli.auth, None);
        assert_eq!(cli.client_key_hmac_file, None);
        for (flag, mode) in [("required", AuthMode::Required), ("off", AuthMode::Off)] {
            let cli = Cli::try_parse_from([
                "switchback-proxy",
                "--manifests",
                "x.yaml",
                "--auth",
                flag,
                "--client-key-hmac-file",
                "/s/hmac",
            ])
            .unwrap();
            assert_eq!(cli.auth, Some(mode));
            assert_eq!(cli.client_key_hmac_file, Some(PathBuf::from("/s/hmac")));
        }
        assert!(
            Cli::try_parse_from(["switchback-proxy", "--manifests", "x", "--auth", "on"]).is_err()
        );
    }

    #[test]
    fn the_admin_token_file_is_optional() {
        let cli = Cli::try_parse_from(["switchback-proxy", "--manifests", "x.yaml"]).unwrap();
        assert_eq!(cli.admin_token_file, None);
        let cli = Cli::try_parse_from([
            "switchback-proxy",
            "--manifests",
            "x.yaml",
            "--admin-token-file",
            "/var/run/switchback/admin-token/token",
        ])
        .unwrap();
        assert_eq!(
            cli.admin_token_file,
            Some(PathBuf::from("/var/run/switchback/admin-token/token"))
        );
    }

    #[test]
    fn limit_defaults_are_the_specs() {
        let cli = Cli::try_parse_from(["switchback-proxy", "--manifests", "x.yaml"]).unwrap();
        let l = cli.client_limits();
        let d = crate::front::ClientLimits::default();
        assert_eq!(l.header_read_timeout, Duration::from_secs(10));
        assert_eq!(l.body_read_timeout, Duration::from_secs(30));
        assert_eq!(l.idle_timeout, Duration::from_secs(90));
        assert_eq!(l.max_connections, 10_000);
        assert_eq!(l.max_inflight_body_bytes, 256 << 20);
        let u = cli.upstream_limits();
        assert_eq!(
            (
                u.max_event_bytes,
                u.max_response_bytes,
                u.max_inflight_response_bytes
            ),
            (1 << 20, 32 << 20, 128 << 20)
        );
        assert_eq!(
            (l.header_read_timeout, l.body_read_timeout, l.idle_timeout),
            (d.header_read_timeout, d.body_read_timeout, d.idle_timeout)
        );
        assert_eq!(l.max_header_bytes, 64 << 10);
        assert_eq!(l.max_inflight_header_bytes, 32 << 20);
        assert_eq!(l.client_write_timeout, Duration::from_secs(60));
        assert_eq!(l.max_hops, 2);
        assert_eq!(l.admin_max_connections, 128);
        assert_eq!(l.admin_idle_timeout, Duration::from_secs(30));
        assert_eq!(cli.listen_wait, Duration::from_secs(60));
        assert_eq!(
            (
                l.max_header_bytes,
                l.client_write_timeout,
                l.max_hops,
                l.admin_max_connections,
                l.admin_idle_timeout
            ),
            (
                d.max_header_bytes,
                d.client_write_timeout,
                d.max_hops,
                d.admin_max_connections,
                d.admin_idle_timeout
            )
        );
        assert_eq!(cli.drain_delay, Duration::from_secs(5));
        assert_eq!(cli.otlp_metrics_interval, Duration::from_secs(60));
        assert_eq!(cli.shutdown_grace, Duration::from_secs(30));
        assert!(!cli.allow_empty_config);
        assert!(cli.budget_reservation);
        assert_eq!(cli.replicas, 1);
        assert_eq!(cli.usage_handover, Duration::from_secs(10));
        let cli = Cli::try_parse_from([
            "switchback-proxy",
            "--manifests",
            "x.yaml",
            "--header-read-timeout",
            "250ms",
            "--shutdown-grace",
            "1m",
            "--allow-empty-config",
            "--budget-reservation",
            "off",
            "--replicas",
            "3",
            "--usage-handover",
            "0s",
        ])
        .unwrap();
        assert!(!cli.budget_reservation);
        assert_eq!(cli.replicas, 3);
        assert_eq!(cli.usage_handover, Duration::ZERO);
        for bad in [["--budget-reservation", "maybe"], ["--replicas", "0"]] {
            let e =
                Cli::try_parse_from(["switchback-proxy", "--manifests", "x.yaml", bad[0], bad[1]])
                    .unwrap_err()
                    .to_string();
            assert!(e.contains(bad[0]), "{e}");
        }
        assert_eq!(cli.header_read_timeout, Duration::from_millis(250));
        assert_eq!(cli.shutdown_grace, Duration::from_secs(60));
        assert!(cli.allow_empty_config);
    }
}

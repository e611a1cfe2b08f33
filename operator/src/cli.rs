//! The `switchback-operator` command line (operator/README.md#running-it). Every flag can
//! also be set from the environment as `SWITCHBACK_<FLAG>`; `--help` explains each.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use switchback_crds::network::PrivateNetworks;

#[derive(Debug, Parser)]
#[command(
    name = "switchback-operator",
    version,
    about = "Reconciles LLMRoute and ProviderCredential resources into the config the Switchback proxy hot-reloads, and writes status back",
    long_about = "Watches LLMRoutes, ProviderCredentials, LLMClients and the Secrets they reference in every namespace \
(or those of --watch-namespaces), renders each source namespace into the gateway namespace as ConfigMaps \
`switchback-routes-<ns>.<digest>` (as many as its size needs) and a Secret `switchback-keys-<ns>.<digest>`, named by the \
index ConfigMap `switchback-index` (server-side apply, field manager `switchback-operator`), scrapes the proxies' /admin/v1/stats and writes conditions, \
circuit state and traffic counters into status. Creates the client-key HMAC secret and the proxies' admin token \
when asked to (--generate-*) and they are absent; never overwrites them.\n\nWithout a subcommand it runs the operator; `crds` prints the CRDs.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the CustomResourceDefinitions (the same bytes as `crds/*.yaml`).
    Crds {
        /// Instead of printing, write one `<plural>.<group>.yaml` file per CRD into DIR.
        #[arg(long, value_name = "DIR")]
        write: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Namespace the rendered ConfigMaps and Secrets are written to (where the proxy
    /// runs). Default: the operator's own namespace (its service account's, or the
    /// kubeconfig context's when run outside a cluster).
    #[arg(long, env = "SWITCHBACK_GATEWAY_NAMESPACE", value_name = "NS")]
    pub gateway_namespace: Option<String>,

    /// Base URL of a proxy's admin port to scrape (`http://127.0.0.1:9090`), for a
    /// proxy run outside the cluster. Repeatable; the environment variable takes a
    /// comma-separated list. When given, the admin Service is not used.
    #[arg(
        long = "proxy-admin-url",
        env = "SWITCHBACK_PROXY_ADMIN_URL",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub proxy_admin_urls: Vec<String>,

    /// The proxy's admin Service in the gateway namespace: its ready endpoints (from
    /// EndpointSlices) are the replicas scraped, on the port named `admin`.
    #[arg(
        long,
        env = "SWITCHBACK_PROXY_ADMIN_SERVICE",
        value_name = "NAME",
        default_value = "switchback-proxy-admin"
    )]
    pub proxy_admin_service: String,

    /// Name of the admin Service's port to scrape.
    #[arg(
        long,
        env = "SWITCHBACK_PROXY_ADMIN_PORT_NAME",
        value_name = "NAME",
        default_value = "admin"
    )]
    pub proxy_admin_port_name: String,

    /// File holding the proxies' admin token (the content of their
    /// `--admin-token-file`), sent as `Authorization: Bearer` on every scrape. Re-read
    /// when it changes. A proxy that answers 401 is logged once, as a token mismatch.
    #[arg(
        long,
        env = "SWITCHBACK_PROXY_ADMIN_TOKEN_FILE",
        value_name = "PATH",
        conflicts_with = "admin_token_secret"
    )]
    pub proxy_admin_token_file: Option<PathBuf>,

    /// The proxies' admin token from a Secret of the gateway namespace (the one they
    /// mount for their `--admin-token-file`), read through the API and watched: a
    /// rotated token is used from the next scrape. See `--generate-admin-token`.
    #[arg(long, env = "SWITCHBACK_ADMIN_TOKEN_SECRET", value_name = "NAME")]
    pub admin_token_secret: Option<String>,

    /// The data key of `--admin-token-secret` holding the token.
    #[arg(
        long,
        env = "SWITCHBACK_ADMIN_TOKEN_SECRET_KEY",
        value_name = "KEY",
        default_value = "token"
    )]
    pub admin_token_secret_key: String,

    /// Create `--admin-token-secret` with 48 random characters when it does not exist;
    /// one that exists is never overwritten.
    #[arg(
        long,
        env = "SWITCHBACK_GENERATE_ADMIN_TOKEN",
        requires = "admin_token_secret"
    )]
    pub generate_admin_token: bool,

    /// How often the proxies' /admin/v1/stats are scraped. Bounds how soon
    /// `Programmed` follows a change. A Gateway API duration (`2s`, `500ms`).
    #[arg(long, env = "SWITCHBACK_SCRAPE_INTERVAL", value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub scrape_interval: Duration,

    /// How long the fleet's health view (ConfigMap switchback-health: circuits and
    /// keys one replica found, told to all) holds once written; refreshed every half
    /// of it while it says anything. A proxy that holds an older one goes by its own
    /// findings. `0s`: no view is written. A Gateway API duration.
    #[arg(long, env = "SWITCHBACK_FLEET_VIEW_TTL", value_name = "DURATION", default_value = "20s", value_parser = parse_duration)]
    pub fleet_view_ttl: Duration,

    /// Minimum time between two status writes of one route whose conditions did not
    /// change (traffic counters and circuit state only). Condition changes are written
    /// at once, within the global budget.
    #[arg(long, env = "SWITCHBACK_STATUS_INTERVAL", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub status_interval: Duration,

    /// Global budget of status writes per second (LLMRoute and ProviderCredential
    /// together), so a large fleet never floods the API server. When it runs short,
    /// route condition changes go first; traffic facts and credential status take
    /// what they leave over.
    #[arg(
        long,
        env = "SWITCHBACK_STATUS_WRITES_PER_SECOND",
        value_name = "N",
        default_value_t = 20.0
    )]
    pub status_writes_per_second: f64,

    /// Whether the proxies authenticate clients: set it as the proxies' own `--auth`.
    /// `required`: LLMClients are rendered with keyed hashes of their keys (never the
    /// keys), and model names resolve per client (two namespaces may each serve one).
    /// `off`: model names are global, and LLMClients are checked but carry no key hash,
    /// so no key authenticates against that config.
    #[arg(long, env = "SWITCHBACK_AUTH", value_enum, default_value_t = AuthMode::Off)]
    pub auth: AuthMode,

    /// The per-cluster secret client keys are hashed with (HMAC-SHA256, at least 32
    /// bytes, surrounding whitespace trimmed), from a file: the same file the proxies
    /// read. With `--auth required`, this or `--client-key-hmac-secret` is required.
    #[arg(
        long,
        env = "SWITCHBACK_CLIENT_KEY_HMAC_FILE",
        value_name = "PATH",
        conflicts_with = "client_key_hmac_secret"
    )]
    pub client_key_hmac_file: Option<PathBuf>,

    /// The per-cluster secret client keys are hashed with, from a Secret of the gateway
    /// namespace, read through the API (the proxies mount the same Secret). The
    /// operator waits until it exists, not ready meanwhile; see
    /// `--generate-client-key-hmac`.
    #[arg(long, env = "SWITCHBACK_CLIENT_KEY_HMAC_SECRET", value_name = "NAME")]
    pub client_key_hmac_secret: Option<String>,

    /// The data key of `--client-key-hmac-secret` holding the secret.
    #[arg(
        long,
        env = "SWITCHBACK_CLIENT_KEY_HMAC_SECRET_KEY",
        value_name = "KEY",
        default_value = "hmac"
    )]
    pub client_key_hmac_secret_key: String,

    /// Create `--client-key-hmac-secret` with 64 random characters when it does not
    /// exist; one that exists is never overwritten (docs/chart.md#generated-secrets: the
    /// chart renders no random value, so that GitOps tools see the same bytes at every
    /// sync).
    #[arg(
        long,
        env = "SWITCHBACK_GENERATE_CLIENT_KEY_HMAC",
        requires = "client_key_hmac_secret"
    )]
    pub generate_client_key_hmac: bool,

    /// Watch LLMRoutes, ProviderCredentials, LLMClients and their Secrets only in these
    /// namespaces (comma-separated or repeated): with Roles granted there alone, the
    /// operator reads no Secret elsewhere. Empty: every namespace (a ClusterRole).
    #[arg(
        long = "watch-namespaces",
        env = "SWITCHBACK_WATCH_NAMESPACES",
        value_name = "NS",
        value_delimiter = ','
    )]
    pub watch_namespaces: Vec<String>,

    /// Namespaces whose ProviderCredentials may set `allowPrivateNetwork: true`
    /// (comma-separated or repeated; `*` alone: every namespace): a baseURL on a
    /// loopback, private, CGNAT or link-local address, such as a vLLM in the cluster.
    /// Elsewhere such a credential is refused (reason PrivateNetworkNotAllowed) and
    /// nothing is sent to it. Empty (the default): no namespace; the proxies then
    /// reach public addresses only.
    #[arg(
        long = "allow-private-network-namespaces",
        env = "SWITCHBACK_ALLOW_PRIVATE_NETWORK_NAMESPACES",
        value_name = "NS",
        value_delimiter = ','
    )]
    pub allow_private_network_namespaces: Vec<String>,

    /// Length of the rolling window reported in `status.window`.
    #[arg(long, env = "SWITCHBACK_STATS_WINDOW", value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub stats_window: Duration,

    /// Address of the operator's own HTTP port: /healthz, /readyz, /metrics.
    #[arg(
        long,
        env = "SWITCHBACK_ADMIN_LISTEN",
        value_name = "ADDR",
        default_value = "0.0.0.0:8081"
    )]
    pub admin_listen: SocketAddr,

    /// Elect a leader on a coordination.k8s.io Lease so that only one replica writes.
    /// Turn off only when exactly one replica can ever run.
    #[arg(long, env = "SWITCHBACK_LEADER_ELECTION", value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,

    /// Name of the leader-election Lease (in the gateway namespace).
    #[arg(
        long,
        env = "SWITCHBACK_LEASE_NAME",
        value_name = "NAME",
        default_value = "switchback-operator"
    )]
    pub lease_name: String,

    /// Log format: human-readable text or one JSON object per line. `SWITCHBACK_LOG`
    /// sets the filter (`info`, `debug`, ...).
    #[arg(long, env = "SWITCHBACK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Most ConfigMaps one source namespace's config may be split over (each holds at
    /// most 900 KiB of JSON: some 600 routes). A namespace that needs more is not
    /// delivered (it keeps its last delivered version) and its routes say
    /// `Programmed=False`, reason `DeliveryFailed`, naming this limit.
    #[arg(
        long,
        env = "SWITCHBACK_MAX_CONFIG_PARTS",
        value_name = "N",
        default_value_t = switchback_crds::delivery::parts::DEFAULT_MAX_PARTS as u16,
        value_parser = clap::value_parser!(u16).range(1..=1024)
    )]
    pub max_config_parts: u16,

    /// The Role in the gateway namespace whose rules the operator keeps to `get` on
    /// exactly the rendered ConfigMaps and Secrets the index names, so that the
    /// proxies bound to it read nothing else (the chart creates it, binds it to the
    /// proxies' ServiceAccount and lets the operator patch this one name). Unset: no
    /// Role is kept (for proxies given their reads otherwise).
    #[arg(long, env = "SWITCHBACK_PROXY_READER_ROLE", value_name = "NAME")]
    pub proxy_reader_role: Option<String>,
}

impl RunArgs {
    /// What clap cannot say: `--auth required` needs the HMAC secret from somewhere,
    /// and `--allow-private-network-namespaces` names namespaces or `*` alone.
    pub fn check(&self) -> Result<(), String> {
        if let Err(e) = PrivateNetworks::from_list(&self.allow_private_network_namespaces) {
            return Err(format!("--allow-private-network-namespaces: {e}"));
        }
        if self.auth == AuthMode::Required
            && self.client_key_hmac_file.is_none()
            && self.client_key_hmac_secret.is_none()
        {
            return Err(
                "--auth required needs --client-key-hmac-secret (a Secret of the \
                        gateway namespace) or --client-key-hmac-file"
                    .into(),
            );
        }
        Ok(())
    }

    /// `--allow-private-network-namespaces` (checked by [`RunArgs::check`]; a list it
    /// refuses allows nothing).
    pub fn private_networks(&self) -> PrivateNetworks {
        PrivateNetworks::from_list(&self.allow_private_network_namespaces).unwrap_or_default()
    }
}

/// `--auth`, as the proxies' flag of that name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    Required,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// A Gateway API duration (`250ms`, `10s`, `1m30s`), above 0.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    match switchback_crds::duration::parse_ms(text) {
        Some(0) => Err("must be above 0".to_string()),
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Err(format!(
            "{text:?} is not a duration like 500ms, 10s or 1m30s"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent_with_spec_defaults() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["switchback-operator"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.status_interval, Duration::from_secs(10));
        assert_eq!(cli.run.scrape_interval, Duration::from_secs(2));
        assert_eq!(cli.run.fleet_view_ttl, Duration::from_secs(20));
        assert_eq!(cli.run.stats_window, Duration::from_secs(300));
        assert!(cli.run.leader_election);
        let cli = Cli::try_parse_from([
            "switchback-operator",
            "--proxy-admin-url",
            "http://127.0.0.1:9090",
            "--proxy-admin-url",
            "http://127.0.0.1:9091",
            "--status-interval",
            "1m30s",
            "--leader-election",
            "false",
        ])
        .unwrap();
        assert_eq!(cli.run.proxy_admin_urls.len(), 2);
        assert_eq!(cli.run.proxy_admin_token_file, None);
        let with_token = Cli::try_parse_from([
            "switchback-operator",
            "--proxy-admin-token-file",
            "/var/run/switchback/admin-token/token",
        ])
        .unwrap();
        assert_eq!(
            with_token.run.proxy_admin_token_file.as_deref(),
            Some(std::path::Path::new(
                "/var/run/switchback/admin-token/token"
            ))
        );
        assert_eq!(cli.run.status_interval, Duration::from_secs(90));
        assert!(!cli.run.leader_election);
        assert!(Cli::try_parse_from(["switchback-operator", "--status-interval", "0s"]).is_err());
        let cli = Cli::try_parse_from(["switchback-operator", "crds", "--write", "x"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Crds { write: Some(_) })
        ));
    }

    #[test]
    fn secrets_from_files_or_from_the_api() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("switchback-operator").chain(args.iter().copied()))
        };
        let cli = parse(&["--auth", "required"]).unwrap();
        let e = cli.run.check().unwrap_err();
        assert!(e.contains("--client-key-hmac-secret"), "{e}");
        let cli = parse(&[
            "--auth",
            "required",
            "--client-key-hmac-secret",
            "sb-client-key-hmac",
            "--generate-client-key-hmac",
            "--admin-token-secret=sb-admin-token",
            "--generate-admin-token",
            "--watch-namespaces=team-a,team-b",
        ])
        .unwrap();
        cli.run.check().unwrap();
        assert_eq!(cli.run.client_key_hmac_secret_key, "hmac");
        assert_eq!(cli.run.admin_token_secret_key, "token");
        assert!(cli.run.generate_client_key_hmac && cli.run.generate_admin_token);
        assert_eq!(cli.run.watch_namespaces, ["team-a", "team-b"]);
        assert!(
            parse(&["--auth", "required", "--client-key-hmac-file", "/f"])
                .unwrap()
                .run
                .check()
                .is_ok()
        );
        // One source each, and nothing to generate without a name.
        assert!(parse(&["--client-key-hmac-file=/f", "--client-key-hmac-secret=s"]).is_err());
        assert!(parse(&["--proxy-admin-token-file=/f", "--admin-token-secret=s"]).is_err());
        assert!(parse(&["--generate-admin-token"]).is_err());
        assert!(parse(&["--generate-client-key-hmac"]).is_err());
        assert!(parse(&[]).unwrap().run.watch_namespaces.is_empty());
    }

    #[test]
    fn private_networks_are_allowed_only_in_the_listed_namespaces() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("switchback-operator").chain(args.iter().copied()))
                .unwrap()
                .run
        };
        let none = parse(&[]);
        none.check().unwrap();
        assert_eq!(none.private_networks(), PrivateNetworks::default());
        assert!(!none.private_networks().allows("default"));
        let some = parse(&["--allow-private-network-namespaces=team-a,platform"]);
        some.check().unwrap();
        assert!(some.private_networks().allows("platform"));
        assert!(!some.private_networks().allows("team-b"));
        let all = parse(&["--allow-private-network-namespaces", "*"]);
        assert_eq!(all.private_networks(), PrivateNetworks::Everywhere);
        let e = parse(&["--allow-private-network-namespaces=*,team-a"])
            .check()
            .unwrap_err();
        assert!(e.starts_with("--allow-private-network-namespaces: "), "{e}");
        let e = parse(&["--allow-private-network-namespaces=Team_A"])
            .check()
            .unwrap_err();
        assert!(e.contains("\"Team_A\""), "{e}");
    }

    #[test]
    fn every_flag_has_an_environment_variable() {
        let cmd = Cli::command();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("--{id} has no environment variable"));
            let expected = format!(
                "SWITCHBACK_{}",
                arg.get_long().unwrap().to_uppercase().replace('-', "_")
            );
            assert_eq!(env.to_str(), Some(expected.as_str()));
        }
    }
}

//! The `switchback-operator` command line (SPEC §6). Every flag can also be set from
//! the environment as `SWITCHBACK_<FLAG>`; `--help` explains each.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "switchback-operator",
    version,
    about = "Reconciles LLMRoute and ProviderCredential resources into the config the Switchback proxy hot-reloads, and writes status back",
    long_about = "Watches LLMRoutes, ProviderCredentials, LLMClients and the Secrets they reference in every namespace, renders one \
ConfigMap `switchback-routes-<ns>` and one Secret `switchback-keys-<ns>` per source namespace into the gateway namespace \
(server-side apply, field manager `switchback-operator`), scrapes the proxies' /admin/v1/stats and writes conditions, \
circuit state and traffic counters into status.\n\nWithout a subcommand it runs the operator; `crds` prints the CRDs.",
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
    #[arg(long, env = "SWITCHBACK_PROXY_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub proxy_admin_token_file: Option<PathBuf>,

    /// How often the proxies' /admin/v1/stats are scraped. Bounds how soon
    /// `Programmed` follows a change. A Gateway API duration (`2s`, `500ms`).
    #[arg(long, env = "SWITCHBACK_SCRAPE_INTERVAL", value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub scrape_interval: Duration,

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
    /// bytes, surrounding whitespace trimmed): the same file the proxies read. Required
    /// with `--auth required`.
    #[arg(
        long,
        env = "SWITCHBACK_CLIENT_KEY_HMAC_FILE",
        value_name = "PATH",
        required_if_eq("auth", "required")
    )]
    pub client_key_hmac_file: Option<PathBuf>,

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

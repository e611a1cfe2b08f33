//! The `switchback-proxy` command line. Every flag can also be set from the
//! environment as `SWITCHBACK_<FLAG>`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "switchback-proxy",
    version,
    about = "OpenAI- and Anthropic-compatible LLM gateway with retries, fallbacks and time budgets",
    long_about = "Serves POST /v1/chat/completions, /v1/embeddings, /v1/messages and GET /v1/models on the data \
port, and /healthz, /readyz, /admin/v1/config, /admin/v1/stats, /metrics on the admin port.\n\nRun standalone with --manifests (the same \
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

    /// Cluster mode: watch the ConfigMaps and Secrets labelled `switchback.dev/config` in
    /// this namespace (rendered by switchback-operator) through the API, with the
    /// in-cluster config or KUBECONFIG. Needs only get/list/watch on ConfigMaps and
    /// Secrets of this namespace.
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

    /// OpenTelemetry: send traces over OTLP/HTTP to this collector base URL (spans are
    /// posted to URL/v1/traces): one span per request, one per upstream attempt, with
    /// GenAI semantic-convention attributes. Off when unset.
    #[arg(long, env = "SWITCHBACK_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// Log format: human-readable text or one JSON object per line.
    #[arg(long, env = "SWITCHBACK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Threads serving the data port, each with its own event loop, listening socket
    /// and upstream connections, so a request stays on one thread from start to end.
    /// Default: one per CPU core available to the process.
    #[arg(long, env = "SWITCHBACK_THREADS", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
}

impl Cli {
    /// `--threads`, or the number of cores available.
    pub fn threads(&self) -> usize {
        self.threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            usize::from,
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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
        assert!(
            Cli::try_parse_from(["switchback-proxy", "--manifests", "x", "--namespace", "n"])
                .is_err()
        );
    }
}

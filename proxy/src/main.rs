//! `switchback-proxy`: parse flags, set up logging, run the gateway.

use clap::Parser;
use switchback_proxy::cli::{Cli, LogFormat};
use switchback_proxy::{Options, Source, start};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let filter =
        EnvFilter::try_from_env("SWITCHBACK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Log lines are written by a background thread: a slow stdout never blocks a request.
    let (writer, _flush_on_exit) = tracing_appender::non_blocking(std::io::stdout());
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match cli.log_format {
        LogFormat::Text => fmt.init(),
        LogFormat::Json => fmt.json().flatten_event(true).init(),
    }
    let source = match (cli.manifests, cli.namespace) {
        (Some(path), _) => Source::Manifests(path),
        (None, Some(ns)) => {
            eprintln!(
                "error: --namespace {ns}: cluster mode (watching rendered ConfigMaps) is not built yet; \
                 run standalone with --manifests PATH"
            );
            return std::process::ExitCode::from(2);
        }
        (None, None) => unreachable!("clap requires one of --manifests / --namespace"),
    };
    let opts = Options {
        source,
        listen: cli.listen,
        admin_listen: cli.admin_listen,
        max_body_bytes: cli.max_body_bytes,
    };
    match start(opts).await {
        Ok(running) => {
            tracing::info!(data = %running.data_addr, admin = %running.admin_addr, "switchback-proxy serving");
            running.wait().await;
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

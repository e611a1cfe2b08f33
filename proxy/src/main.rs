//! `switchback-proxy`: parse flags, set up logging, run the gateway.

use clap::Parser;
use switchback_proxy::cli::Cli;
use switchback_proxy::{Options, Source, start, telemetry};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The one process-wide rustls provider (the workspace compiles in only aws-lc-rs),
    // installed before kube or any upstream client builds a TLS config.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let _telemetry = match telemetry::init(cli.log_format, cli.otlp_endpoint.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let threads = cli.threads();
    let source = match (cli.manifests, cli.namespace) {
        (Some(path), _) => Source::Manifests(path),
        (None, Some(namespace)) => Source::Cluster { namespace },
        (None, None) => unreachable!("clap requires one of --manifests / --namespace"),
    };
    let opts = Options {
        source,
        listen: cli.listen,
        admin_listen: cli.admin_listen,
        max_body_bytes: cli.max_body_bytes,
        threads,
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

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

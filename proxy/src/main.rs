//! `switchback-proxy`: parse flags, set up logging, run the gateway.

use clap::Parser;
use switchback_proxy::cli::Cli;
use switchback_proxy::observe::telemetry;
use switchback_proxy::{Options, Source, start};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Before anything else: a SIGTERM during start-up is a shutdown too, not a kill.
    let mut shutdown = match ShutdownSignals::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot listen for signals: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
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
    let limits = cli.client_limits();
    let (drain_delay, shutdown_grace) = (cli.drain_delay, cli.shutdown_grace);
    let usage_handover = cli.usage_handover;
    let otlp_metrics = cli
        .otlp_endpoint
        .clone()
        .filter(|_| !cli.otlp_metrics_interval.is_zero())
        .map(|endpoint| (endpoint, cli.otlp_metrics_interval));
    let upstream_limits = cli.upstream_limits();
    let fetch_limits = cli.fetch_limits();
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
        upstream_limits,
        threads,
        limits,
        allow_empty_config: cli.allow_empty_config,
        budgets: switchback_proxy::BudgetOptions {
            reservation: cli.budget_reservation,
            replicas: cli.replicas,
        },
        auth: cli.auth,
        client_key_hmac_file: cli.client_key_hmac_file,
        admin_token_file: cli.admin_token_file,
        fetch_media: cli.fetch_media,
        fetch_limits,
        listen_wait: cli.listen_wait,
    };
    let started = tokio::select! {
        r = start(opts) => r,
        () = shutdown.next() => return std::process::ExitCode::SUCCESS,
    };
    match started {
        Ok(mut running) => {
            tracing::info!(data = %running.data_addr, admin = %running.admin_addr, "switchback-proxy serving");
            let metrics = match otlp_metrics.map(|(e, i)| running.export_otlp_metrics(&e, i)) {
                None => None,
                Some(Ok(m)) => Some(m),
                Some(Err(e)) => {
                    eprintln!("error: {e}");
                    return std::process::ExitCode::from(2);
                }
            };
            tokio::select! {
                () = running.stopped() => {
                    tracing::error!("the data listener stopped");
                    return std::process::ExitCode::FAILURE;
                }
                () = shutdown.next() => {}
            }
            tokio::select! {
                () = running.drain_and_hand_over(drain_delay, shutdown_grace, usage_handover) => {}
                () = shutdown.next() => tracing::warn!("second signal: exiting without waiting"),
            }
            // The last counts, which the next interval would have sent.
            if let Some(m) = &metrics
                && let Err(e) = m.exporter.export().await
            {
                tracing::warn!(error = %e, "the last OTLP metrics export failed");
            }
            // `_telemetry` is dropped on the way out: the request log is flushed.
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// SIGTERM (what Kubernetes sends) and SIGINT (Ctrl-C).
struct ShutdownSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM"),
            _ = self.int.recv() => tracing::info!("SIGINT"),
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

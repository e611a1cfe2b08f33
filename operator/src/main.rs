//! `switchback-operator`: parse flags, set up logging, metrics and leader election,
//! then run the controllers; or `crds` to print/write the CRD YAML.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use switchback_crds::admintoken::{AdminToken, AdminTokenFile};
use switchback_crds::keyhash::KeyHasher;
use switchback_operator::bootstrap::{AdminTokenSource, Generated, WatchedToken};
use switchback_operator::cli::{AuthMode, Cli, Command, LogFormat, RunArgs};
use switchback_operator::controller::{self, ScrapeOptions, Settings};
use switchback_operator::leader::Elector;
use switchback_operator::metrics::{Health, Metrics};
use switchback_operator::scope::Scope;
use switchback_operator::scrape::Replicas;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Crds { write: None }) => {
            print!("{}", switchback_crds::crd_yaml());
            ExitCode::SUCCESS
        }
        Some(Command::Crds { write: Some(dir) }) => {
            match switchback_crds::crdgen::write_crd_files(&dir) {
                Ok(paths) => {
                    for path in paths {
                        eprintln!("wrote {}", path.display());
                    }
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("error: writing CRDs into {}: {err}", dir.display());
                    ExitCode::FAILURE
                }
            }
        }
        None => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            runtime.block_on(run(cli.run))
        }
    }
}

/// Logs go to stderr as text or JSON, filtered by `SWITCHBACK_LOG` (default `info`).
fn init_logging(format: LogFormat) {
    let filter =
        EnvFilter::try_from_env("SWITCHBACK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    match format {
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init(),
    }
}

/// Start-up in order: flags, the admin token file, the API, the generated Secrets,
/// the Lease (when electing), then the controllers until a signal or a lost Lease.
async fn run(args: RunArgs) -> ExitCode {
    init_logging(args.log_format);
    // The one process-wide rustls provider (the workspace compiles in only aws-lc-rs),
    // installed before kube or reqwest builds a TLS config.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    if let Err(e) = args.check() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    // Read before anything else: a standby with an unusable token would only fail
    // once it leads.
    let token_file = match &args.proxy_admin_token_file {
        Some(path) => match AdminTokenFile::open(path) {
            Ok(f) => Some(Arc::new(f)),
            Err(e) => {
                eprintln!("error: --proxy-admin-token-file: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "error: no Kubernetes API to talk to ({e}); run in a cluster or set KUBECONFIG"
            );
            return ExitCode::FAILURE;
        }
    };
    let gateway_namespace = args
        .gateway_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let identity = format!(
        "{}-{}",
        std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "switchback-operator".into()),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );

    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let health = Arc::new(Health {
        registry,
        ready: Default::default(),
    });
    let admin = {
        let health = health.clone();
        let addr = args.admin_listen;
        tokio::spawn(async move {
            if let Err(e) = switchback_operator::metrics::serve(addr, health).await {
                tracing::error!(%addr, error = %e, "the health/metrics listener stopped");
            }
        })
    };

    // The generated Secrets first, on every replica (creating is a race the loser
    // reads), so a standby that comes to lead has them; not ready until then.
    let bootstrap = tokio::select! {
        b = bootstrap_secrets(&client, &gateway_namespace, &args, token_file) => b,
        _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
    };
    let (client_key_hasher, admin_token) = match bootstrap {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };

    let elector = args.leader_election.then(|| {
        Elector::new(
            Api::<Lease>::namespaced(client.clone(), &gateway_namespace),
            args.lease_name.clone(),
            identity.clone(),
        )
    });
    let mut since = tokio::time::Instant::now();
    if let Some(elector) = &elector {
        // A standby is healthy and ready: it only waits.
        health.ready.store(true, Ordering::Release);
        tracing::info!(%identity, lease = %args.lease_name, namespace = %gateway_namespace, "waiting to lead");
        since = tokio::select! {
            started = elector.acquire() => started,
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
        };
        health.ready.store(false, Ordering::Release);
    }
    metrics.leader.set(1);
    tracing::info!(%identity, gateway_namespace = %gateway_namespace, "leading: starting the controllers");

    let (settings, scrape) = settings(&args, &gateway_namespace, client_key_hasher, admin_token);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: controller::MANAGER.into(),
            instance: Some(identity.clone()),
        },
    );
    let controllers = controller::run(client, settings, scrape, metrics.clone(), health, recorder);
    let code = match &elector {
        // `select!` drops the controllers (and with them every task they spawned)
        // before a branch's handler runs: the line below is logged once they stopped.
        Some(elector) => tokio::select! {
            _ = controllers => ExitCode::SUCCESS,
            lost = elector.hold(since) => {
                metrics.leader.set(0);
                tracing::error!(
                    %identity,
                    ?lost,
                    "stopped leading: the controllers are stopped; exiting so that a standby takes over"
                );
                ExitCode::FAILURE
            }
        },
        None => {
            controllers.await;
            ExitCode::SUCCESS
        }
    };
    metrics.leader.set(0);
    if let Some(elector) = &elector
        && code == ExitCode::SUCCESS
    {
        elector.release().await;
    }
    admin.abort();
    code
}

/// What the controllers are told by the flags: where the proxies' admin endpoints
/// are, and the status and scrape settings.
fn settings(
    args: &RunArgs,
    gateway_namespace: &str,
    client_key_hasher: Option<Arc<KeyHasher>>,
    admin_token: Option<AdminTokenSource>,
) -> (Settings, ScrapeOptions) {
    let replicas = if args.proxy_admin_urls.is_empty() {
        Replicas::Service {
            namespace: gateway_namespace.to_string(),
            name: args.proxy_admin_service.clone(),
            port_name: args.proxy_admin_port_name.clone(),
        }
    } else {
        Replicas::Urls(args.proxy_admin_urls.clone())
    };
    let settings = Settings {
        gateway_namespace: gateway_namespace.to_string(),
        scope: Scope::from_list(&args.watch_namespaces),
        status_interval: args.status_interval,
        status_writes_per_second: args.status_writes_per_second,
        models_per_client: args.auth == AuthMode::Required,
        client_key_hasher,
        private_networks: args.private_networks(),
        part_limits: switchback_crds::delivery::PartLimits {
            max_parts: usize::from(args.max_config_parts),
            ..Default::default()
        },
        proxy_reader_role: args.proxy_reader_role.clone(),
    };
    let scrape = ScrapeOptions {
        replicas,
        interval: args.scrape_interval,
        window: args.stats_window,
        admin_token,
        fleet_view_ttl: args.fleet_view_ttl,
    };
    (settings, scrape)
}

/// How often a Secret the operator waits for (a user's `existingSecret`) is looked for.
const SECRET_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// The client-key hasher (with `--auth required`) and the admin token source, each
/// from its file or from its Secret in the gateway namespace (created first with
/// `--generate-*`; waited for otherwise). Errors only on a bad file.
async fn bootstrap_secrets(
    client: &Client,
    namespace: &str,
    args: &RunArgs,
    token_file: Option<Arc<AdminTokenFile>>,
) -> Result<(Option<Arc<KeyHasher>>, Option<AdminTokenSource>), String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let hasher = match (
        args.auth,
        &args.client_key_hmac_file,
        &args.client_key_hmac_secret,
    ) {
        (AuthMode::Off, _, _) => None,
        (AuthMode::Required, Some(path), _) => Some(Arc::new(
            KeyHasher::from_file(path).map_err(|e| format!("--client-key-hmac-file: {e}"))?,
        )),
        (AuthMode::Required, None, Some(name)) => {
            let secret = Generated {
                namespace: namespace.to_string(),
                name: name.clone(),
                key: args.client_key_hmac_secret_key.clone(),
                generate: args.generate_client_key_hmac,
                purpose: "client-key HMAC secret",
                length: 64,
            };
            let hasher = secret
                .wait_for(&secrets, SECRET_RETRY, |v| {
                    KeyHasher::new(v.trim_ascii()).map_err(|e| e.to_string())
                })
                .await;
            Some(Arc::new(hasher))
        }
        (AuthMode::Required, None, None) => unreachable!("RunArgs::check"),
    };
    let token = match (token_file, &args.admin_token_secret) {
        (Some(file), _) => Some(AdminTokenSource::File(file)),
        (None, Some(name)) => {
            let secret = Generated {
                namespace: namespace.to_string(),
                name: name.clone(),
                key: args.admin_token_secret_key.clone(),
                generate: args.generate_admin_token,
                purpose: "proxy admin token",
                length: 48,
            };
            let first = secret
                .wait_for(&secrets, SECRET_RETRY, |v| {
                    AdminToken::new(v).map_err(|e| e.to_string())
                })
                .await;
            Some(AdminTokenSource::Secret(Arc::new(WatchedToken::start(
                client.clone(),
                secret,
                first,
            ))))
        }
        (None, None) => {
            tracing::info!(
                "no --proxy-admin-token-file or --admin-token-secret: scraping the proxies \
                 without the admin token (proxies started with --admin-token-file will answer 401)"
            );
            None
        }
    };
    Ok((hasher, token))
}

//! The gateway's shared state: the live snapshot (swapped atomically), the upstream
//! HTTP clients, per-target runtime state, and the report of the last config load.
//!
//! Constructing a `Gateway` has no side effects: no listener, no task, no global.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use serde::Serialize;
use switchback_crds::compile::Compiled;

use crate::config::prepare::{Carried, ClientEnv, PrepareError, prepare};
use crate::config::snapshot::{ConfigGeneration, Snapshot};
use crate::limits::answers::{DEFAULT_MAX_INFLIGHT_RESPONSE_BYTES, Refusals, UpstreamLimits};
use crate::limits::bytes::Budget;
use crate::limits::clients::{Settling, WallClock};
use crate::upstream::Clients;

/// One problem with a config, located as precisely as known.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}:")?;
            if let Some(l) = self.line {
                write!(f, "{l}:")?;
            }
            f.write_str(" ")?;
        }
        if let Some(o) = &self.object {
            write!(f, "{o}: ")?;
        }
        if let Some(fld) = &self.field {
            write!(f, "{fld}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// What `/admin/v1/config` reports about loading.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadReport {
    pub source: String,
    /// Configs applied so far (1 after the first successful load).
    pub generation: u64,
    #[serde(serialize_with = "ser_time")]
    pub loaded_at: Option<SystemTime>,
    /// Problems of the config being served that did not stop it (e.g. a missing key).
    pub warnings: Vec<Problem>,
    /// The last config that was refused; the previous one is still served.
    pub last_error: Option<LoadError>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadError {
    #[serde(serialize_with = "ser_time")]
    pub at: Option<SystemTime>,
    pub problems: Vec<Problem>,
}

fn ser_time<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&humantime::format_rfc3339_millis(*t).to_string()),
        None => s.serialize_none(),
    }
}

/// Why a config was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Most likely a truncated file or a lost delivery, not a wish to serve nothing:
    /// refused like any broken edit (docs/proxy.md#loading-and-reloading-config).
    #[error(
        "the config has no LLMRoute, so every request would get 404; refused (start the \
         proxy with --allow-empty-config to serve an empty config)"
    )]
    NoRoute,
    #[error(transparent)]
    Prepare(#[from] PrepareError),
}

pub struct Gateway {
    live: ArcSwap<Snapshot>,
    clients: Clients,
    carried: Carried,
    epoch: tokio::time::Instant,
    ready: AtomicBool,
    report: Mutex<LoadReport>,
    pub max_body_bytes: usize,
    pub upstream_limits: UpstreamLimits,
    /// Unary answer bytes held now (`max_inflight_response_bytes`); a reservation
    /// travels with the answer's body to the client, hence the `Arc`.
    pub answers: Arc<Budget>,
    pub refused: Arc<Refusals>,
    /// Answer text held now to resume broken streams
    /// (docs/streaming.md#resume-after-commit): each resumable stream holds what its client
    /// received, up to its route's `maxHeldBytes`.
    pub resume_held: std::sync::atomic::AtomicUsize,
    /// Data-port serving threads (`--threads`), each with its own upstream pool.
    pub lanes: usize,
    /// Random per process: lets the operator tell a restarted replica from a live one.
    pub instance_id: String,
    pub started_at: SystemTime,
    pub reloads_applied: std::sync::atomic::AtomicU64,
    pub reloads_refused: std::sync::atomic::AtomicU64,
    /// The client-side limits and the drain state, shared by every serving lane.
    pub front: Arc<crate::front::Front>,
    /// The admin port's connections: its cap, idle timeout and what they refused.
    pub admin_front: Arc<crate::front::Front>,
    /// Serve a config with no LLMRoute instead of refusing it (`--allow-empty-config`).
    pub allow_empty_config: bool,
    /// Cluster mode: a config with no LLMRoute is served while none has been (a fresh
    /// install is ready and answers 404 until routes arrive); one that would empty a
    /// config with routes is still refused (docs/proxy.md#loading-and-reloading-config,
    /// docs/chart.md#generated-secrets).
    pub empty_until_routed: bool,
    /// `--auth` and the HMAC secret client keys are hashed with.
    pub auth: crate::config::keys::Auth,
    /// No operator renders budget verdicts (manifests): budgets are enforced from
    /// this replica's own counts.
    pub standalone: bool,
    /// Said once that standalone budgets count only this process's usage.
    pub said_standalone_budgets: AtomicBool,
    /// Standalone: how many replicas share every client's limits and budgets
    /// (`--replicas`).
    pub standalone_replicas: u32,
    /// Requests reserve their client's budget before they are sent
    /// (`--budget-reservation`).
    pub reserve_budgets: bool,
    /// Continuations counting what clients walked away from
    /// (docs/tenancy.md#a-client-that-leaves-still-pays).
    pub settling: Arc<Settling>,
    /// What the operator last read of the clients' counters, for the handover at
    /// shutdown.
    pub handover: crate::admin::handover::Handover,
    /// Which URLs of images and documents the gateway fetches for targets that
    /// cannot (`--fetch-media`, docs/translation.md#documents-and-media).
    pub media_fetch: crate::pipeline::fetch::MediaFetch,
    /// `--fetch-media-timeout`, `--max-fetched-urls`.
    pub fetch_limits: crate::pipeline::fetch::FetchLimits,
    /// The background prober's schedule (docs/request-lifecycle.md#probed-circuits): woken
    /// when a circuit opens or a config is applied.
    pub health: crate::health::Health,
}

impl Gateway {
    /// `lanes`: serving threads, one upstream pool each (see [`crate::upstream`]).
    /// Fails only when the upstream clients' TLS verifier cannot be set up.
    pub fn new(max_body_bytes: usize, source: String, lanes: usize) -> std::io::Result<Self> {
        Ok(Self {
            live: ArcSwap::from_pointee(Snapshot::default()),
            clients: Clients::new(lanes)?,
            carried: Carried::default(),
            epoch: tokio::time::Instant::now(),
            ready: AtomicBool::new(false),
            report: Mutex::new(LoadReport {
                source,
                ..LoadReport::default()
            }),
            max_body_bytes,
            upstream_limits: UpstreamLimits::default(),
            answers: Arc::new(Budget::new(DEFAULT_MAX_INFLIGHT_RESPONSE_BYTES)),
            refused: Arc::default(),
            resume_held: Default::default(),
            lanes,
            instance_id: uuid::Uuid::new_v4().to_string(),
            started_at: SystemTime::now(),
            reloads_applied: Default::default(),
            reloads_refused: Default::default(),
            front: Arc::new(crate::front::Front::new(Default::default(), lanes)),
            admin_front: Arc::new(crate::front::Front::admin(&Default::default())),
            allow_empty_config: false,
            empty_until_routed: false,
            auth: Default::default(),
            standalone: false,
            said_standalone_budgets: AtomicBool::new(false),
            standalone_replicas: 1,
            reserve_budgets: true,
            settling: Arc::default(),
            handover: Default::default(),
            media_fetch: Default::default(),
            fetch_limits: Default::default(),
            health: Default::default(),
        })
    }

    /// The calling thread's upstream client for fetching a client's URL: the one
    /// that refuses private networks unless `private`.
    pub fn media_client(&self, private: bool) -> &crate::upstream::Client {
        if private {
            self.clients.private.here()
        } else {
            self.clients.public.here()
        }
    }

    /// Set the limits on provider answers (and size the answer budget by them).
    pub fn set_upstream_limits(&mut self, limits: UpstreamLimits) {
        self.upstream_limits = limits;
        self.answers = Arc::new(Budget::new(limits.max_inflight_response_bytes));
    }

    /// The snapshot a request runs on from start to finish.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.live.load_full()
    }

    /// Milliseconds since the gateway started, on tokio's clock (so tests can pause it).
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The wall clock budgets are read on: the start time plus tokio's clock since.
    pub fn clock(&self) -> WallClock {
        WallClock::new(self.started_at, self.epoch)
    }

    /// Counters that outlive reloads (per-client usage).
    pub fn carried(&self) -> &Carried {
        &self.carried
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Prepare then swap: a config that cannot be prepared, or that has no LLMRoute
    /// (unless [`Gateway::allow_empty_config`], or [`Gateway::empty_until_routed`] while
    /// no route is served), changes nothing.
    pub fn apply(&self, compiled: &Compiled, warnings: Vec<Problem>) -> Result<(), ApplyError> {
        if compiled.config.routes.is_empty() && !self.may_serve_empty() {
            return Err(ApplyError::NoRoute);
        }
        let env = ClientEnv {
            standalone: self.standalone,
            reserve: self.reserve_budgets,
            clock: self.clock(),
            settling: self.settling.clone(),
        };
        let mut snapshot = prepare(
            compiled,
            &self.clients,
            &self.carried,
            self.auth.required(),
            env,
        )?;
        // Under the report's lock: the snapshot carries the generation it is reported as.
        let mut r = self.report.lock().unwrap_or_else(|p| p.into_inner());
        r.generation += 1;
        snapshot.generation = ConfigGeneration(r.generation.into());
        self.live.store(Arc::new(snapshot));
        self.ready.store(true, Ordering::Release);
        self.reloads_applied.fetch_add(1, Ordering::Relaxed);
        r.loaded_at = Some(SystemTime::now());
        r.warnings = warnings;
        r.last_error = None;
        self.health.wake();
        Ok(())
    }

    /// Whether a config with no LLMRoute may replace the live one.
    fn may_serve_empty(&self) -> bool {
        self.allow_empty_config
            || (self.empty_until_routed && self.live.load().config.routes.is_empty())
    }

    /// Record a refused config; the live one stays.
    pub fn refuse(&self, problems: Vec<Problem>) {
        self.reloads_refused.fetch_add(1, Ordering::Relaxed);
        let mut r = self.report.lock().unwrap_or_else(|p| p.into_inner());
        r.last_error = Some(LoadError {
            at: Some(SystemTime::now()),
            problems,
        });
    }

    pub fn report(&self) -> LoadReport {
        self.report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

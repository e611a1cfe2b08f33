//! `switchback-proxy`: parse flags, set up logging, run the gateway.

use clap::Parser;
use switchback_proxy::cli::Cli;
use switchback_proxy::observe::telemetry;
use switchback_proxy::{Options, Source, start};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    no_huge_pages();
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

/// The heap in 4 KiB pages, not transparent huge pages: mimalloc asks the kernel for
/// 2 MiB pages on its arenas (`madvise`), and a 2 MiB page is resident whole once one
/// block in it is touched. With 1,000 streams open, 80 of the proxy's 104 MiB were
/// huge pages and issue 33's 100 MiB target was missed; without them it holds
/// 65-72 MiB (20 at rest, not 27), for about 1 % more CPU per request
/// (docs/benchmark.md#memory). mimalloc's own `MIMALLOC_ALLOW_THP`, when an operator
/// sets it, still decides.
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: a plain prctl on this process; it takes no pointers. On a kernel
        // without it the call fails and nothing changes.
        unsafe {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        }
    }
}

#[global_allocator]
static GLOBAL: Allocator = Allocator;

/// mimalloc, asked for an alignment only when malloc's own does not do. The
/// `mimalloc` crate's allocator calls `mi_malloc_aligned` for every allocation, and
/// mimalloc 3 serves that from its fast path only when a free block happens to be
/// aligned and under 1 KiB; any other (a request's larger futures and buffers) is
/// over-allocated and marked for an unaligning free: ~9 a request, ~4k instructions
/// (docs/benchmark.md#where-a-requests-cpu-goes). `mi_malloc` aligns every block of
/// at least 16 bytes to 16, and a smaller one to its size rounded up to 8, so an
/// alignment of at most 16 that the size is a multiple of needs nothing more.
struct Allocator;

/// The alignment every `mi_malloc` block of at least this size has.
const MI_MAX_ALIGN: usize = 16;

/// Whether `mi_malloc` (or `mi_realloc`) of `size` bytes is aligned to `align`.
#[inline]
fn malloc_aligns(size: usize, align: usize) -> bool {
    align <= MI_MAX_ALIGN && align <= size
}

// SAFETY: every block comes from mimalloc and goes back to it; the aligned calls are
// used whenever `mi_malloc`'s own alignment would not satisfy the layout.
unsafe impl std::alloc::GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_malloc, mi_malloc_aligned};
        // SAFETY: plain mimalloc calls with the layout's size (and alignment).
        unsafe {
            if malloc_aligns(layout.size(), layout.align()) {
                mi_malloc(layout.size()).cast()
            } else {
                mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_zalloc, mi_zalloc_aligned};
        // SAFETY: as `alloc`.
        unsafe {
            if malloc_aligns(layout.size(), layout.align()) {
                mi_zalloc(layout.size()).cast()
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        use libmimalloc_sys::{mi_realloc, mi_realloc_aligned};
        // SAFETY: `ptr` came from this allocator; the new block keeps the alignment.
        unsafe {
            if malloc_aligns(new_size, layout.align()) {
                mi_realloc(ptr.cast(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast()
            }
        }
    }
}

//! The fleet's health view in cluster mode (issue 32 item 5,
//! `docs/request-lifecycle.md#one-view-across-replicas`): watches the one ConfigMap
//! `switchback-health` of the gateway namespace by name (the chart's proxy Role grants
//! get, list and watch on that name alone) and lays it over this replica's state
//! (`health::fleet`) on every change, and every second besides, so that the view
//! lapses at its expiry even when nothing more arrives (the operator or the API server
//! gone) and reaches the targets a reload adds.
//!
//! No view, one that does not read, or one that cannot be watched (an older chart's
//! Role): this replica goes by its own findings, as it did before the view existed.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use switchback_crds::fleet::{DATA_KEY, FleetView, VIEW_NAME};
use tokio::sync::Notify;

use crate::gateway::Gateway;
use crate::health::fleet::apply;

/// How often the view is laid over the state again without news.
const EVERY: Duration = Duration::from_secs(1);

/// The watch and the loop applying it.
pub fn watch(
    gw: Arc<Gateway>,
    client: Client,
    namespace: &str,
) -> Vec<tokio::task::JoinHandle<()>> {
    let config = watcher::Config::default().fields(&format!("metadata.name={VIEW_NAME}"));
    let changed = Arc::new(Notify::new());
    let (store, writer) = reflector::store::<ConfigMap>();
    let events = reflector::reflector(writer, watcher(Api::namespaced(client, namespace), config))
        .default_backoff();
    let signal = changed.clone();
    let watching = events.for_each(move |event| {
        match event {
            Ok(_) => signal.notify_one(),
            Err(e) => {
                tracing::warn!(error = %e, "watching the fleet's health view ConfigMap {VIEW_NAME}")
            }
        }
        std::future::ready(())
    });
    vec![
        tokio::spawn(watching),
        tokio::spawn(apply_loop(gw, store, changed)),
    ]
}

async fn apply_loop(gw: Arc<Gateway>, store: Store<ConfigMap>, changed: Arc<Notify>) {
    let mut text: Option<String> = None;
    let mut view: Option<FleetView> = None;
    let mut held = false;
    loop {
        // The watch selects the one name: the store holds it or nothing.
        let now_text = store
            .state()
            .first()
            .and_then(|cm| cm.data.as_ref()?.get(DATA_KEY).cloned());
        if now_text != text {
            view = now_text.as_deref().and_then(|t| match serde_json::from_str(t) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(error = %e, "the fleet's health view {VIEW_NAME} does not read; going by this replica's own findings");
                    None
                }
            });
            text = now_text;
        }
        let applied = apply(&gw, view.as_ref(), tokio::time::Instant::now());
        if applied.holds != held {
            held = applied.holds;
            if held {
                tracing::info!(
                    "the fleet's health view {VIEW_NAME} holds: circuits and keys are shared with the other replicas"
                );
            } else {
                tracing::warn!(
                    "the fleet's health view {VIEW_NAME} lapsed (expired or gone): going by this replica's own findings"
                );
            }
        }
        if applied.opened + applied.closed > 0 {
            tracing::info!(
                opened = applied.opened,
                closed = applied.closed,
                delegated = applied.delegated,
                "circuits adopted from the fleet's health view"
            );
        }
        tokio::select! {
            () = changed.notified() => {}
            () = tokio::time::sleep(EVERY) => {}
        }
    }
}

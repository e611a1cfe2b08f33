//! When every informer cache has listed once: one signal that any number of tasks
//! can await.
//!
//! kube-runtime's `Store::wait_until_ready` wakes only the task that polled it last:
//! its `DelayedInit` holds one futures `oneshot::Receiver`, which keeps one waker.
//! Each `Controller` already waits on its own store, so a second waiter on that
//! store (the delivery loop, or `now_or_never` in the scrape loop, which registers a
//! no-op waker) can take the wake-up from the other and sleep forever. So nothing
//! here awaits a `Store`: each watch stream reports its `InitDone` to one
//! [`Synced`], which publishes through a `tokio::sync::watch` that wakes every
//! waiter.

use std::sync::Arc;

use kube::runtime::watcher;
use tokio::sync::watch;

/// The operator's informer caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    Routes,
    Credentials,
    Clients,
    Secrets,
    RenderedMaps,
    RenderedSecrets,
}

impl Cache {
    /// Every cache, in the order of their bits.
    pub const EVERY: [Cache; 6] = [
        Cache::Routes,
        Cache::Credentials,
        Cache::Clients,
        Cache::Secrets,
        Cache::RenderedMaps,
        Cache::RenderedSecrets,
    ];
    const ALL: u8 = 0b11_1111;

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Which caches have listed once; cloning shares the signal.
#[derive(Clone, Debug)]
pub struct Synced(Arc<watch::Sender<u8>>);

impl Default for Synced {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }
}

impl Synced {
    /// Records that `cache` finished its (first or a later) initial list.
    pub fn listed(&self, cache: Cache) {
        self.0.send_if_modified(|bits| {
            let before = *bits;
            *bits |= cache.bit();
            *bits != before
        });
    }

    /// An `inspect` callback for `cache`'s watch stream: marks it on `InitDone`.
    pub fn on_init_done<K>(
        &self,
        cache: Cache,
    ) -> impl FnMut(&watcher::Result<watcher::Event<K>>) + use<K> {
        let synced = self.clone();
        move |event| {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                synced.listed(cache);
            }
        }
    }

    /// Every cache has listed once.
    pub fn is_synced(&self) -> bool {
        *self.0.borrow() == Cache::ALL
    }

    /// Resolves once every cache has listed; at once if they have.
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|bits| *bits == Cache::ALL).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;
    use tokio::sync::mpsc;

    use super::*;

    const CACHES: [Cache; 6] = Cache::EVERY;

    /// What `run` wires: a reflector whose stream reports `InitDone`, a task awaiting
    /// the store itself (as a `Controller` does) and two awaiting [`Synced`] (the
    /// delivery loop and anything else). Readiness arrives after all three polled.
    /// Awaiting the store from two tasks instead hangs one of them: kube-runtime
    /// wakes the last poller only.
    #[tokio::test]
    async fn every_waiter_wakes_when_readiness_arrives_after_they_polled() {
        let synced = Synced::default();
        for cache in &CACHES[1..] {
            synced.listed(*cache);
        }
        let (store, writer) = reflector::store::<ConfigMap>();
        let (tx, rx) = mpsc::unbounded_channel();
        let events = reflector::reflector(
            writer,
            futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|e| (Ok(e), rx))
            }),
        )
        .inspect(synced.on_init_done(Cache::Routes));
        let drive = tokio::spawn(events.for_each(|_| async {}));

        let controller = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await.is_ok() }
        });
        let delivery = tokio::spawn({
            let synced = synced.clone();
            async move { synced.wait().await }
        });
        let scrape = tokio::spawn({
            let synced = synced.clone();
            async move { synced.wait().await }
        });
        // Let all three register their wakers before the list completes.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!synced.is_synced());

        tx.send(watcher::Event::Init).unwrap();
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("switchback-routes-team-a".into());
        cm.metadata.namespace = Some("switchback".into());
        tx.send(watcher::Event::InitApply(cm)).unwrap();
        tx.send(watcher::Event::InitDone).unwrap();

        let all = async {
            assert!(controller.await.unwrap(), "the store's own waiter");
            delivery.await.unwrap();
            scrape.await.unwrap();
        };
        tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .expect("every waiter woke");
        assert!(synced.is_synced());
        drive.abort();
    }

    /// Why this module exists: two tasks awaiting one kube-runtime `Store`, readiness
    /// arriving after both polled, and only the later poller wakes. When kube-runtime
    /// fixes this, this test fails, and the workaround can go.
    #[tokio::test(start_paused = true)]
    async fn a_kube_store_wakes_only_its_last_waiter() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let first = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await }
        });
        tokio::task::yield_now().await;
        let second = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let woke = |task: tokio::task::JoinHandle<_>| async move {
            tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .is_ok()
        };
        assert!(woke(second).await, "the last poller wakes");
        assert!(!woke(first).await, "the earlier poller sleeps on");
    }

    #[test]
    fn synced_needs_every_cache() {
        let synced = Synced::default();
        for cache in &CACHES[..5] {
            synced.listed(*cache);
            assert!(!synced.is_synced(), "{cache:?}");
        }
        synced.listed(Cache::RenderedSecrets);
        assert!(synced.is_synced());
        // A later relist changes nothing.
        synced.listed(Cache::Routes);
        assert!(synced.is_synced());
    }
}

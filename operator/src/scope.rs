//! Which namespaces the operator watches (operator/README.md#running-it,
//! `--watch-namespaces`): every namespace (cluster mode, one cluster-wide watch per kind),
//! or a list (namespaced mode: the chart grants Roles in those namespaces only, so no
//! Secret elsewhere is ever read, and nothing outside the list is even listed).
//!
//! A reflector store takes one watch stream. In namespaced mode each namespace has
//! its own watch, and each of those relists on its own schedule; [`Merge`] turns them
//! into one stream with the store's semantics: one initial list that completes when
//! every namespace has listed, then plain `Apply`/`Delete` events, a namespace's later
//! relist included (what it no longer lists is deleted, in that namespace alone). The
//! store's own `Init`..`InitDone` would otherwise replace every namespace's objects
//! with the relisting one's.

use std::collections::BTreeMap;

use futures_util::stream::{self, BoxStream, StreamExt};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// The namespaces whose objects the operator reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (cluster mode).
    All,
    /// Only these, sorted and without duplicates (never empty).
    Namespaces(Vec<String>),
}

impl Scope {
    /// `--watch-namespaces`: empty means every namespace.
    pub fn from_list(list: &[String]) -> Scope {
        let mut names: Vec<String> = list
            .iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        names.sort();
        names.dedup();
        if names.is_empty() {
            Scope::All
        } else {
            Scope::Namespaces(names)
        }
    }

    pub fn includes(&self, namespace: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Namespaces(names) => names.iter().any(|n| n == namespace),
        }
    }

    /// One watch stream of `K` over the scope, for one reflector store.
    pub fn watch<K>(
        &self,
        client: &Client,
        config: watcher::Config,
    ) -> BoxStream<'static, watcher::Result<Event<K>>>
    where
        K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        match self {
            Scope::All => watcher::watcher(Api::<K>::all(client.clone()), config).boxed(),
            Scope::Namespaces(names) if names.len() == 1 => {
                watcher::watcher(Api::<K>::namespaced(client.clone(), &names[0]), config).boxed()
            }
            Scope::Namespaces(names) => {
                let streams = names.iter().enumerate().map(|(i, ns)| {
                    watcher::watcher(Api::<K>::namespaced(client.clone(), ns), config.clone())
                        .map(move |event| (i, event))
                        .boxed()
                });
                merge(names.len(), stream::select_all(streams)).boxed()
            }
        }
    }
}

/// Merges the tagged watch streams of `parts` namespaces into one (see the module
/// header).
pub fn merge<K, S>(
    parts: usize,
    tagged: S,
) -> impl futures_util::Stream<Item = watcher::Result<Event<K>>>
where
    K: Resource + Clone,
    S: futures_util::Stream<Item = (usize, watcher::Result<Event<K>>)>,
{
    tagged
        .scan(Merge::new(parts), |merge, (part, event)| {
            let out: Vec<_> = match event {
                Ok(event) => merge.event(part, event).into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            std::future::ready(Some(stream::iter(out)))
        })
        .flatten()
}

/// The state of [`merge`]: what each namespace has listed, and its relist in progress.
pub struct Merge<K> {
    /// The objects each namespace's watch has shown, by name.
    known: Vec<BTreeMap<String, K>>,
    /// A relist in progress per namespace: what it has listed so far.
    relisting: Vec<Option<BTreeMap<String, K>>>,
    /// Until every namespace has listed once: which have.
    listed: Option<Vec<bool>>,
}

impl<K: Resource + Clone> Merge<K> {
    pub fn new(parts: usize) -> Self {
        Self {
            known: vec![BTreeMap::new(); parts],
            relisting: vec![None; parts],
            listed: Some(vec![false; parts]),
        }
    }

    /// The events one namespace's event becomes on the merged stream.
    pub fn event(&mut self, part: usize, event: Event<K>) -> Vec<Event<K>> {
        match event {
            Event::Init => {
                self.relisting[part] = Some(BTreeMap::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                self.relisting[part]
                    .get_or_insert_with(BTreeMap::new)
                    .insert(obj.name_any(), obj);
                Vec::new()
            }
            Event::InitDone => self.listed(part),
            Event::Apply(obj) => {
                self.known[part].insert(obj.name_any(), obj.clone());
                if self.listed.is_some() {
                    // Shown with the initial list, which is not out yet.
                    return Vec::new();
                }
                vec![Event::Apply(obj)]
            }
            Event::Delete(obj) => {
                self.known[part].remove(&obj.name_any());
                if self.listed.is_some() {
                    return Vec::new();
                }
                vec![Event::Delete(obj)]
            }
        }
    }

    /// Namespace `part` finished a list.
    fn listed(&mut self, part: usize) -> Vec<Event<K>> {
        let fresh = self.relisting[part].take().unwrap_or_default();
        let old = std::mem::replace(&mut self.known[part], fresh);
        match &mut self.listed {
            Some(listed) => {
                listed[part] = true;
                if !listed.iter().all(|l| *l) {
                    return Vec::new();
                }
                // Every namespace has listed: the merged stream's one initial list.
                self.listed = None;
                let objects = self
                    .known
                    .iter()
                    .flat_map(|objects| objects.values().cloned().map(Event::InitApply));
                std::iter::once(Event::Init)
                    .chain(objects)
                    .chain(std::iter::once(Event::InitDone))
                    .collect()
            }
            None => {
                let known = &self.known[part];
                let gone = old
                    .into_iter()
                    .filter(|(name, _)| !known.contains_key(name))
                    .map(|(_, obj)| Event::Delete(obj));
                gone.chain(known.values().cloned().map(Event::Apply))
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector;

    fn cm(ns: &str, name: &str, version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    /// The (namespace/name@version) a store holds, sorted.
    fn contents(store: &reflector::Store<ConfigMap>) -> Vec<String> {
        let mut out: Vec<String> = store
            .state()
            .iter()
            .map(|c| {
                format!(
                    "{}/{}@{}",
                    c.namespace().unwrap_or_default(),
                    c.name_any(),
                    c.resource_version().unwrap_or_default()
                )
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn scope_from_the_flag() {
        assert_eq!(Scope::from_list(&[]), Scope::All);
        assert_eq!(Scope::from_list(&[" ".into()]), Scope::All);
        let s = Scope::from_list(&["team-b".into(), "team-a".into(), "team-b".into()]);
        assert_eq!(s, Scope::Namespaces(vec!["team-a".into(), "team-b".into()]));
        assert!(s.includes("team-a") && !s.includes("team-c"));
        assert!(Scope::All.includes("anything"));
    }

    /// Two namespaces feeding one store: the store is ready only when both listed,
    /// holds both, and a relist of one (after its watch broke) deletes what that one
    /// no longer has and leaves the other namespace alone.
    #[tokio::test]
    async fn two_namespaces_feed_one_store_through_relists() {
        let (store, writer) = reflector::store::<ConfigMap>();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let rx = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
        let merged = merge(2, rx);
        let mut merged = Box::pin(reflector::reflector(writer, merged));
        let send = |part: usize, event: Event<ConfigMap>| {
            tx.send((part, Ok(event))).unwrap();
        };
        // Namespace a lists two objects; b is still listing.
        send(0, Event::Init);
        send(0, Event::InitApply(cm("a", "x", "1")));
        send(0, Event::InitApply(cm("a", "y", "1")));
        send(0, Event::InitDone);
        send(1, Event::Init);
        send(1, Event::InitApply(cm("b", "z", "1")));
        // An event of a's before b is done goes out with the initial list.
        send(0, Event::Apply(cm("a", "x", "2")));
        send(1, Event::InitDone);
        let mut seen = Vec::new();
        while seen.last().is_none_or(|e| !matches!(e, Event::InitDone)) {
            seen.push(merged.next().await.unwrap().unwrap());
        }
        assert!(matches!(seen[0], Event::Init));
        assert_eq!(seen.len(), 5, "Init, three objects, InitDone: {seen:?}");
        assert_eq!(contents(&store), ["a/x@2", "a/y@1", "b/z@1"]);

        // Live events pass through.
        send(1, Event::Apply(cm("b", "w", "1")));
        assert!(matches!(
            merged.next().await.unwrap().unwrap(),
            Event::Apply(_)
        ));
        send(0, Event::Delete(cm("a", "y", "1")));
        assert!(matches!(
            merged.next().await.unwrap().unwrap(),
            Event::Delete(_)
        ));
        assert_eq!(contents(&store), ["a/x@2", "b/w@1", "b/z@1"]);

        // b's watch broke and relists: z was deleted meanwhile, w changed.
        send(1, Event::Init);
        send(1, Event::InitApply(cm("b", "w", "2")));
        send(1, Event::InitDone);
        let delete = merged.next().await.unwrap().unwrap();
        assert!(
            matches!(&delete, Event::Delete(o) if o.name_any() == "z"),
            "{delete:?}"
        );
        let apply = merged.next().await.unwrap().unwrap();
        assert!(
            matches!(&apply, Event::Apply(o) if o.name_any() == "w"),
            "{apply:?}"
        );
        assert_eq!(contents(&store), ["a/x@2", "b/w@2"]);

        // An error passes through (the watcher retries on its own).
        tx.send((0, Err(watcher::Error::NoResourceVersion)))
            .unwrap();
        assert!(merged.next().await.unwrap().is_err());
        assert_eq!(contents(&store), ["a/x@2", "b/w@2"]);
    }

    /// A namespace that relists before the others have listed: its first, partial
    /// list does not linger in the initial one.
    #[test]
    fn a_relist_during_the_initial_list_replaces_the_partial_one() {
        let mut m = Merge::new(2);
        assert!(m.event(0, Event::Init).is_empty());
        assert!(
            m.event(0, Event::InitApply(cm("a", "gone", "1")))
                .is_empty()
        );
        assert!(m.event(0, Event::Init).is_empty());
        assert!(
            m.event(0, Event::InitApply(cm("a", "kept", "1")))
                .is_empty()
        );
        assert!(m.event(0, Event::InitDone).is_empty());
        let out = m.event(1, Event::InitDone);
        let names: Vec<String> = out
            .iter()
            .filter_map(|e| match e {
                Event::InitApply(o) => Some(o.name_any()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["kept"]);
        assert!(matches!(out.first(), Some(Event::Init)));
        assert!(matches!(out.last(), Some(Event::InitDone)));
    }
}

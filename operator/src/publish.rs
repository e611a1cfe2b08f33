//! What one delivery publishes, decided purely (operator/README.md#what-it-writes): which
//! namespaces are written and which wait out a backoff, what the index names afterwards,
//! and which objects the proxies' reader Role grants.
//!
//! - [`delivered`] reads the version delivered now back from the cached objects (the
//!   index and what it names): the last good versions `render` keeps, and each
//!   namespace's revision key.
//! - [`attempts`] renders each namespace into its objects, or refuses it (too large for
//!   `--max-config-parts`), or leaves it alone while it waits out the backoff of an
//!   earlier failure with the same content.
//! - [`next_index`]: a namespace written whole gets its new entry; one that failed or
//!   waits keeps its old entry (its last delivered version), if it had one; a namespace
//!   no longer rendered goes.
//! - [`reader_rules`]: `get` on exactly the named objects, never an empty
//!   `resourceNames` (which RBAC reads as every name).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::ResourceExt;
use switchback_crds::delivery::index::{self, Entry, Index};
use switchback_crds::delivery::{
    self, DeliveryError, NamespaceConfig, NamespaceObjects, PartLimits,
};
use switchback_crds::revision::RevisionKey;

/// The version delivered now, as read from the cached rendered objects.
#[derive(Debug, Default)]
pub struct Delivered {
    /// The index, if there is one that reads.
    pub index: Option<Index>,
    /// Each indexed namespace that reads back whole.
    pub namespaces: BTreeMap<String, NamespaceConfig>,
}

/// Reads what is delivered: the index, and each namespace it names from the objects
/// `maps` and `secrets` hold. A namespace that does not read back whole is left out
/// (it is rendered afresh, with a new revision key).
pub fn delivered(maps: &[Arc<ConfigMap>], secrets: &[Arc<KubeSecret>]) -> Delivered {
    let Some(index) = maps
        .iter()
        .find(|cm| cm.name_any() == index::INDEX_NAME)
        .and_then(|cm| index::read_index(cm).ok())
    else {
        return Delivered::default();
    };
    let maps: HashMap<String, &ConfigMap> = maps.iter().map(|m| (m.name_any(), &**m)).collect();
    let secrets: HashMap<String, &KubeSecret> =
        secrets.iter().map(|s| (s.name_any(), &**s)).collect();
    let namespaces = index
        .namespaces
        .iter()
        .filter_map(|(ns, entry)| {
            let read = delivery::assemble(
                ns,
                entry,
                |n| maps.get(n).copied(),
                |n| secrets.get(n).copied(),
            );
            read.ok().map(|config| (ns.clone(), config))
        })
        .collect();
    Delivered {
        index: Some(index),
        namespaces,
    }
}

/// What this process wrote last: the index, and the revision key of each namespace
/// rendered. The caches catch up with it a moment later; until they do, a delivery
/// that read them would name an older index (objects already deleted) and draw new
/// revision keys.
#[derive(Clone, Debug, Default)]
pub struct Written {
    pub index: Index,
    pub revision_keys: BTreeMap<String, RevisionKey>,
}

impl Delivered {
    /// With the index this process wrote last, which the caches may lag behind.
    pub fn with_written(mut self, written: Option<&Written>) -> Delivered {
        if let Some(w) = written {
            self.index = Some(w.index.clone());
        }
        self
    }
}

/// The revision key of each of `namespaces`: the one this process used last, else the
/// one delivered (kept so that revisions stay put across deliveries and operator
/// restarts), else a fresh random one.
pub fn revision_keys<'a>(
    namespaces: impl IntoIterator<Item = &'a str>,
    delivered: &Delivered,
    written: Option<&Written>,
) -> BTreeMap<String, RevisionKey> {
    namespaces
        .into_iter()
        .map(|ns| {
            let key = written
                .and_then(|w| w.revision_keys.get(ns).cloned())
                .or_else(|| {
                    delivered
                        .namespaces
                        .get(ns)
                        .and_then(|d| d.revision_key.clone())
                })
                .unwrap_or_else(RevisionKey::random);
            (ns.to_string(), key)
        })
        .collect()
}

/// A namespace whose delivery failed: why, and when it is tried again with the same
/// content (a changed rendering is tried at once).
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The `reason` label of `switchback_operator_delivery_failures_total`.
    pub reason: &'static str,
    /// What the API server (or the size check) said: shown in the routes' status.
    pub message: String,
    /// Failed attempts in a row.
    pub attempts: u32,
    pub retry_at: tokio::time::Instant,
    /// The content that failed.
    pub wanted: NamespaceConfig,
}

/// The wait after `attempts` failures in a row: 1 s, doubling, at most a minute.
pub fn backoff(attempts: u32) -> Duration {
    Duration::from_secs(1 << attempts.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}

impl Failure {
    /// The failure after `previous` (if the content is the same) for `wanted`.
    pub fn next(
        previous: Option<&Failure>,
        wanted: &NamespaceConfig,
        reason: &'static str,
        message: String,
        now: tokio::time::Instant,
    ) -> Failure {
        let attempts = previous
            .filter(|p| &p.wanted == wanted)
            .map_or(1, |p| p.attempts + 1);
        Failure {
            reason,
            message,
            attempts,
            retry_at: now + backoff(attempts),
            wanted: wanted.clone(),
        }
    }
}

/// What a delivery does with one namespace.
#[derive(Debug, PartialEq)]
pub enum Attempt {
    /// Write these objects (those not already there).
    Write(Box<NamespaceObjects>),
    /// Waiting out the backoff of the same content's failure: nothing is written.
    Wait,
    /// Refused before any write: the reason label and the message.
    Refused(&'static str, String),
}

/// Each rendered namespace's attempt.
pub fn attempts(
    gateway_namespace: &str,
    namespaces: &BTreeMap<String, NamespaceConfig>,
    failures: &BTreeMap<String, Failure>,
    limits: PartLimits,
    now: tokio::time::Instant,
) -> BTreeMap<String, Attempt> {
    namespaces
        .iter()
        .map(|(ns, part)| {
            let waiting = failures
                .get(ns)
                .is_some_and(|f| &f.wanted == part && now < f.retry_at);
            let attempt = if waiting {
                Attempt::Wait
            } else {
                match delivery::render_namespace(gateway_namespace, ns, part, limits) {
                    Ok(objects) => Attempt::Write(Box::new(objects)),
                    Err(e) => Attempt::Refused(refusal_reason(&e), e.to_string()),
                }
            };
            (ns.clone(), attempt)
        })
        .collect()
}

/// The metric reason of a refusal before any write.
fn refusal_reason(error: &DeliveryError) -> &'static str {
    match error {
        DeliveryError::TooManyParts { .. } | DeliveryError::ObjectTooLarge { .. } => "too_large",
        _ => "invalid",
    }
}

/// The metric reason of a write the API server refused, by its status code.
pub fn api_reason(code: Option<u16>) -> &'static str {
    match code {
        Some(409) => "conflict",
        Some(413) => "too_large",
        Some(400 | 422) => "invalid",
        Some(401 | 403) => "forbidden",
        Some(404) => "not_found",
        _ => "unavailable",
    }
}

/// The index after a delivery: `written` namespaces (every object of their attempt
/// written) get their new entry; the other rendered namespaces keep their old one, if
/// `old` has one; namespaces no longer rendered go.
pub fn next_index<'a>(
    old: Option<&Index>,
    rendered: impl IntoIterator<Item = &'a String>,
    written: &BTreeMap<String, Entry>,
) -> Index {
    let namespaces = rendered
        .into_iter()
        .filter_map(|ns| {
            let entry = written
                .get(ns)
                .or_else(|| old.and_then(|o| o.namespaces.get(ns)))?;
            Some((ns.clone(), entry.clone()))
        })
        .collect();
    Index {
        namespaces,
        ..Index::default()
    }
}

/// The rules of the proxies' reader Role: `get` on each named ConfigMap and Secret, by
/// name. A kind with no name gets no rule: an empty `resourceNames` would grant every
/// object of that kind.
pub fn reader_rules(maps: &BTreeSet<String>, secrets: &BTreeSet<String>) -> Vec<PolicyRule> {
    [("configmaps", maps), ("secrets", secrets)]
        .into_iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(resource, names)| PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec![resource.to_string()]),
            verbs: vec!["get".to_string()],
            resource_names: Some(names.iter().cloned().collect()),
            ..PolicyRule::default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{credential, route, secret};
    use crate::render::render;
    use switchback_crds::compile::Inputs;

    const GW: &str = "gw";

    /// team-a and team-b rendered, each with a fresh revision key.
    fn rendered(keys: &BTreeMap<String, RevisionKey>) -> BTreeMap<String, NamespaceConfig> {
        let routes = [
            route("team-a", "smart", 1, &["openai"]),
            route("team-b", "fast", 1, &["openai"]),
        ];
        let creds = [
            credential("team-a", "openai", "keys", "openai"),
            credential("team-b", "openai", "keys", "openai"),
        ];
        let secrets = [
            secret("team-a", "keys", &[("openai", "sk-a")]),
            secret("team-b", "keys", &[("openai", "sk-b")]),
        ];
        let inputs = Inputs {
            routes: &routes,
            credentials: &creds,
            secrets: &secrets,
            ..Default::default()
        };
        render(&inputs, &BTreeMap::new(), keys).namespaces
    }

    fn fresh_keys() -> BTreeMap<String, RevisionKey> {
        revision_keys(["team-a", "team-b"], &Delivered::default(), None)
    }

    /// The cached objects after every attempt was written and indexed.
    fn cache(
        attempts: &BTreeMap<String, Attempt>,
        index: &Index,
    ) -> (Vec<Arc<ConfigMap>>, Vec<Arc<KubeSecret>>) {
        let mut maps = vec![Arc::new(index::index_config_map(GW, index))];
        let mut secrets = Vec::new();
        for attempt in attempts.values() {
            if let Attempt::Write(o) = attempt {
                maps.extend(o.parts.iter().cloned().map(Arc::new));
                secrets.push(Arc::new(o.keys.clone()));
            }
        }
        (maps, secrets)
    }

    fn entries(attempts: &BTreeMap<String, Attempt>) -> BTreeMap<String, Entry> {
        attempts
            .iter()
            .filter_map(|(ns, a)| match a {
                Attempt::Write(o) => Some((ns.clone(), o.entry())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn what_is_delivered_reads_back_with_its_revision_keys() {
        let keys = fresh_keys();
        let namespaces = rendered(&keys);
        let now = tokio::time::Instant::now();
        let attempts = attempts(
            GW,
            &namespaces,
            &BTreeMap::new(),
            PartLimits::default(),
            now,
        );
        let index = next_index(None, namespaces.keys(), &entries(&attempts));
        assert_eq!(index.namespaces.len(), 2);
        let (maps, secrets) = cache(&attempts, &index);
        let back = delivered(&maps, &secrets);
        assert_eq!(back.index.as_ref(), Some(&index));
        assert_eq!(back.namespaces, namespaces);
        // The delivered keys are kept; a namespace seen for the first time gets its own.
        let again = revision_keys(["team-a", "team-b", "team-c"], &back, None);
        assert_eq!(again["team-a"], keys["team-a"]);
        assert_eq!(again["team-b"], keys["team-b"]);
        assert_ne!(again["team-c"], keys["team-a"]);
        // What this process wrote last goes before caches that lag behind it.
        let written = Written {
            index: Index::default(),
            revision_keys: BTreeMap::from([("team-c".to_string(), keys["team-a"].clone())]),
        };
        let lagging = revision_keys(["team-a", "team-c"], &Delivered::default(), Some(&written));
        assert_eq!(lagging["team-c"], keys["team-a"]);
        assert_ne!(
            lagging["team-a"], keys["team-a"],
            "neither written nor delivered"
        );
        let laid = delivered(&maps, &secrets).with_written(Some(&written));
        assert_eq!(laid.index, Some(Index::default()));
        // Nothing delivered: nothing read.
        assert!(delivered(&maps[1..], &secrets).index.is_none());
    }

    #[test]
    fn a_failed_or_waiting_namespace_keeps_its_old_entry_and_a_gone_one_goes() {
        let keys = fresh_keys();
        let v1 = rendered(&keys);
        let now = tokio::time::Instant::now();
        let first = attempts(GW, &v1, &BTreeMap::new(), PartLimits::default(), now);
        let old = next_index(None, v1.keys(), &entries(&first));

        // team-a's new version fails; team-b's is written; team-c is new and fails.
        let mut written = BTreeMap::new();
        written.insert(
            "team-b".to_string(),
            Entry {
                parts: vec!["switchback-routes-team-b.1111111111111111".into()],
                keys: "switchback-keys-team-b.2222222222222222".into(),
            },
        );
        let rendered: Vec<String> = ["team-a", "team-b", "team-c"].map(String::from).into();
        let index = next_index(Some(&old), &rendered, &written);
        assert_eq!(index.namespaces["team-a"], old.namespaces["team-a"]);
        assert_eq!(index.namespaces["team-b"], written["team-b"]);
        assert!(!index.namespaces.contains_key("team-c"));
        // team-b no longer rendered: its entry goes.
        let index = next_index(Some(&old), &rendered[..1], &BTreeMap::new());
        assert_eq!(index.namespaces.keys().collect::<Vec<_>>(), ["team-a"]);
    }

    #[test]
    fn a_failure_waits_out_its_backoff_unless_the_content_changes() {
        let keys = fresh_keys();
        let v1 = rendered(&keys);
        let now = tokio::time::Instant::now();
        let failure = Failure::next(None, &v1["team-a"], "invalid", "no".into(), now);
        assert_eq!((failure.attempts, failure.retry_at), (1, now + backoff(1)));
        let failures = BTreeMap::from([("team-a".to_string(), failure.clone())]);
        let tried = attempts(GW, &v1, &failures, PartLimits::default(), now);
        assert_eq!(tried["team-a"], Attempt::Wait);
        assert!(matches!(tried["team-b"], Attempt::Write(_)));
        // Its backoff over: tried again.
        let later = attempts(GW, &v1, &failures, PartLimits::default(), failure.retry_at);
        assert!(matches!(later["team-a"], Attempt::Write(_)));
        // Changed content: tried at once, and a new failure starts over.
        let mut v2 = v1.clone();
        v2.get_mut("team-a").unwrap().config.routes[0].timeout_ms = 1;
        let changed = attempts(GW, &v2, &failures, PartLimits::default(), now);
        assert!(matches!(changed["team-a"], Attempt::Write(_)));
        let again = Failure::next(Some(&failure), &v1["team-a"], "invalid", "no".into(), now);
        assert_eq!(again.attempts, 2);
        let fresh = Failure::next(Some(&failure), &v2["team-a"], "invalid", "no".into(), now);
        assert_eq!(fresh.attempts, 1);
        assert_eq!(
            (1..=9)
                .map(backoff)
                .map(|d| d.as_secs())
                .collect::<Vec<_>>(),
            [1, 2, 4, 8, 16, 32, 60, 60, 60]
        );
    }

    #[test]
    fn a_namespace_over_the_part_limit_is_refused_before_any_write() {
        let keys = fresh_keys();
        let namespaces = rendered(&keys);
        let tiny = PartLimits {
            max_parts: 1,
            max_part_bytes: 100,
        };
        let tried = attempts(
            GW,
            &namespaces,
            &BTreeMap::new(),
            tiny,
            tokio::time::Instant::now(),
        );
        let Attempt::Refused(reason, message) = &tried["team-a"] else {
            panic!("{:?}", tried["team-a"]);
        };
        assert_eq!(*reason, "too_large");
        // (The message naming `--max-config-parts` is `switchback_crds`'s test.)
        assert!(message.contains("at most 100 bytes"), "{message}");
        assert!(matches!(tried["team-b"], Attempt::Refused(..)));
    }

    #[test]
    fn the_reader_role_names_exactly_the_objects_and_never_all() {
        let maps = BTreeSet::from(["switchback-routes-a.1".to_string()]);
        let rules = reader_rules(&maps, &BTreeSet::new());
        assert_eq!(rules.len(), 1, "no Secret named: no rule for Secrets");
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["configmaps".to_string()][..])
        );
        assert_eq!(rules[0].verbs, ["get"]);
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&maps.iter().cloned().collect::<Vec<_>>()[..])
        );
        assert!(reader_rules(&BTreeSet::new(), &BTreeSet::new()).is_empty());
        assert_eq!(
            [Some(409), Some(422), Some(403), Some(500), None].map(api_reason),
            [
                "conflict",
                "invalid",
                "forbidden",
                "unavailable",
                "unavailable"
            ]
        );
    }
}

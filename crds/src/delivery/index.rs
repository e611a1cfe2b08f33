//! The index: one ConfigMap, [`INDEX_NAME`], naming for every source namespace the
//! parts and the keys Secret of the version the proxies are to serve.
//!
//! It is what makes delivery atomic per namespace and readable with least privilege.
//! The operator writes a namespace's new objects first and the index after: a proxy
//! that reads the index fetches exactly the objects it names (by name: the proxy may
//! read nothing else, see `docs/security.md`) and swaps the namespace only when all of
//! them arrived and read well. A namespace whose new objects could not be written keeps
//! its entry, and the proxies their last delivered version of it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::{
    DeliveryError, KEYS_PREFIX, LABEL, MANAGED_BY, MANAGED_BY_LABEL, ROUTES_PREFIX,
    source_namespace,
};

/// The index ConfigMap's name (fixed: the proxy's Role names it).
pub const INDEX_NAME: &str = "switchback-index";
/// Its data key.
pub const INDEX_KEY: &str = "index.json";
/// [`LABEL`] value of the index.
pub const INDEX: &str = "index";
/// The index format this build writes and reads.
pub const INDEX_VERSION: u32 = 1;

/// What the proxies are to serve, per source namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Index {
    pub version: u32,
    pub namespaces: BTreeMap<String, Entry>,
}

impl Default for Index {
    fn default() -> Self {
        Self {
            version: INDEX_VERSION,
            namespaces: BTreeMap::new(),
        }
    }
}

/// One namespace's delivered version: its parts and its keys Secret, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    pub parts: Vec<String>,
    pub keys: String,
}

impl Entry {
    /// Every object it names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.parts
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(self.keys.as_str()))
    }
}

impl Index {
    /// Every object named, ConfigMaps and Secrets apart.
    pub fn names(&self) -> (Vec<&str>, Vec<&str>) {
        let maps = self
            .namespaces
            .values()
            .flat_map(|e| e.parts.iter().map(String::as_str))
            .collect();
        let secrets = self.namespaces.values().map(|e| e.keys.as_str()).collect();
        (maps, secrets)
    }
}

/// The index ConfigMap, ready for server-side apply (deterministic JSON).
pub fn index_config_map(gateway_namespace: &str, index: &Index) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(INDEX_NAME.to_string()),
            namespace: Some(gateway_namespace.to_string()),
            labels: Some(BTreeMap::from([
                (LABEL.to_string(), INDEX.to_string()),
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            INDEX_KEY.to_string(),
            // Plain data with string keys: serializing cannot fail.
            serde_json::to_string_pretty(index).expect("an index serializes"),
        )])),
        ..ConfigMap::default()
    }
}

/// Reads the index, checking its version and that each entry names only objects of its
/// own namespace.
pub fn read_index(cm: &ConfigMap) -> Result<Index, DeliveryError> {
    let object = cm
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| INDEX_NAME.to_string());
    let fail = |message: String| DeliveryError::Index {
        object: object.clone(),
        key: INDEX_KEY,
        message,
    };
    let json = cm
        .data
        .as_ref()
        .and_then(|d| d.get(INDEX_KEY))
        .ok_or_else(|| fail("missing".into()))?;
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| fail(format!("not JSON: {e}")))?;
    match value.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(INDEX_VERSION) => {}
        Some(v) => {
            return Err(fail(format!(
                "index format version {v} is not supported (this build reads version \
                 {INDEX_VERSION}); upgrade the proxy and operator together"
            )));
        }
        None => return Err(fail("field `version` is missing or not a number".into())),
    }
    let index: Index =
        serde_json::from_value(value).map_err(|e| fail(format!("not an index: {e}")))?;
    for (ns, entry) in &index.namespaces {
        let named = entry
            .parts
            .iter()
            .map(|p| (p, ROUTES_PREFIX))
            .chain(std::iter::once((&entry.keys, KEYS_PREFIX)));
        for (name, prefix) in named {
            if source_namespace(name, prefix).ok() != Some(ns.as_str()) || !name.contains('.') {
                return Err(fail(format!(
                    "namespace {ns} names {name:?}, which is not one of its rendered objects \
                     ({prefix}{ns}.<digest>)"
                )));
            }
        }
        if entry.parts.is_empty() {
            return Err(fail(format!("namespace {ns} names no part")));
        }
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ns: &str) -> Entry {
        Entry {
            parts: vec![
                format!("switchback-routes-{ns}.0123456789abcdef"),
                format!("switchback-routes-{ns}.fedcba9876543210"),
            ],
            keys: format!("switchback-keys-{ns}.00112233aabbccdd"),
        }
    }

    #[test]
    fn round_trips_and_lists_every_name() {
        let index = Index {
            namespaces: BTreeMap::from([
                ("team-a".to_string(), entry("team-a")),
                ("team-b".to_string(), entry("team-b")),
            ]),
            ..Index::default()
        };
        let cm = index_config_map("gw", &index);
        assert_eq!(cm.metadata.name.as_deref(), Some(INDEX_NAME));
        assert_eq!(cm.metadata.labels.as_ref().unwrap()[LABEL], INDEX);
        assert_eq!(read_index(&cm).unwrap(), index);
        let (maps, secrets) = index.names();
        assert_eq!(maps.len(), 4);
        assert_eq!(
            secrets,
            [
                "switchback-keys-team-a.00112233aabbccdd",
                "switchback-keys-team-b.00112233aabbccdd"
            ]
        );
    }

    #[test]
    fn an_entry_naming_another_namespaces_objects_is_refused() {
        let index = Index {
            namespaces: BTreeMap::from([("team-a".to_string(), entry("team-b"))]),
            ..Index::default()
        };
        let err = read_index(&index_config_map("gw", &index)).unwrap_err();
        assert!(
            err.to_string()
                .contains("namespace team-a names \"switchback-routes-team-b."),
            "{err}"
        );
        // Nor may it name some other object of the gateway namespace.
        let mut sneaky = entry("team-a");
        sneaky.keys = "sh.helm.release.v1.switchback.v1".into();
        let index = Index {
            namespaces: BTreeMap::from([("team-a".to_string(), sneaky)]),
            ..Index::default()
        };
        assert!(read_index(&index_config_map("gw", &index)).is_err());
    }

    #[test]
    fn another_version_or_no_json_is_refused() {
        let mut cm = index_config_map("gw", &Index::default());
        cm.data.as_mut().unwrap().insert(
            INDEX_KEY.into(),
            r#"{"version": 2, "namespaces": {}}"#.into(),
        );
        let err = read_index(&cm).unwrap_err();
        assert!(err.to_string().contains("upgrade"), "{err}");
        cm.data = None;
        assert!(read_index(&cm).unwrap_err().to_string().contains("missing"));
    }
}

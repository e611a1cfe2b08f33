//! How config travels from the operator to the proxy (operator/README.md#what-it-writes):
//! the names, labels and data keys of the rendered objects, and the functions that write
//! and read them.
//!
//! Per *source* namespace (the namespace the LLMRoutes live in) the operator renders,
//! into the gateway namespace:
//!
//! - ConfigMaps `switchback-routes-<ns>.<digest>` ([`parts`]): that namespace's
//!   [`CompiledConfig`], split over as many ConfigMaps as its size needs, each holding a
//!   share of its routes, credentials and clients as JSON under [`CONFIG_KEY`]. A part
//!   is named after its content, so it never changes once written: a new version of a
//!   namespace is new parts, never an edit of parts a proxy may be reading. No key
//!   material, ever.
//! - Secret `switchback-keys-<ns>.<digest>`: one data key per credential, named after the
//!   ProviderCredential (credential names are DNS subdomains, valid Secret keys), and
//!   [`REVISION_KEY`], the namespace's [`RevisionKey`].
//! - One ConfigMap [`index::INDEX_NAME`] ([`index`]): per source namespace, the parts and
//!   keys Secret of the version delivered. Writing it is the commit point: the proxy
//!   reads it (watched by name), fetches what it names by name, and swaps a namespace
//!   only when all of it arrived. A namespace whose new version could not be written
//!   keeps its entry, and so its last delivered version.
//!
//! Every object carries [`LABEL`] (value [`ROUTES`], [`KEYS`] or [`index::INDEX`]),
//! [`SOURCE_NAMESPACE_LABEL`] and [`MANAGED_BY_LABEL`]. Reading checks the format
//! version, that a part's content is the one its name stands for, and that every
//! object in a namespace's config really belongs to that namespace, so a hand-edited
//! object is refused with a message saying why instead of being served.

pub mod index;
pub mod parts;

use std::collections::BTreeMap;

use k8s_openapi::ByteString;

use crate::compile::Compiled;
use crate::config::{CONFIG_VERSION, CompiledConfig, Keys, ObjectId};
use crate::revision::RevisionKey;
use crate::secret::Secret;

pub use parts::{
    NamespaceObjects, PartLimits, assemble, keys_name, keys_secret, part_name, read_keys_secret,
    render_namespace,
};

/// Label on every rendered object.
pub const LABEL: &str = "switchback.dev/config";
/// [`LABEL`] value of a routes ConfigMap (a part).
pub const ROUTES: &str = "routes";
/// [`LABEL`] value of a keys Secret.
pub const KEYS: &str = "keys";
/// Label naming the source namespace of a rendered object.
pub const SOURCE_NAMESPACE_LABEL: &str = "switchback.dev/source-namespace";
/// Label naming who manages the object (`app.kubernetes.io/managed-by`).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "switchback-operator";
/// The ConfigMap data key holding the compiled config JSON.
pub const CONFIG_KEY: &str = "config.json";
/// Name prefix of a routes ConfigMap.
pub const ROUTES_PREFIX: &str = "switchback-routes-";
/// Name prefix of a keys Secret.
pub const KEYS_PREFIX: &str = "switchback-keys-";
/// The keys Secret's data key holding the namespace's revision key (64 hex digits).
/// Not a credential name: those are DNS subdomains, which never hold `_`.
pub const REVISION_KEY: &str = "_revision-key";

/// Why a rendered object cannot be read (or written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    #[error("{object}: the name does not start with {prefix:?}")]
    Name {
        object: String,
        prefix: &'static str,
    },
    #[error("{object}: data key {CONFIG_KEY:?} is missing")]
    MissingConfig { object: String },
    #[error("{object}: {CONFIG_KEY}: not a compiled config: {message}")]
    Json { object: String, message: String },
    #[error(
        "{object}: {CONFIG_KEY}: config format version {found} is not supported (this build reads version {CONFIG_VERSION}); upgrade the proxy and operator together"
    )]
    Version { object: String, found: u64 },
    #[error("{object}: {what} {id} is not in namespace {namespace}")]
    ForeignObject {
        object: String,
        what: &'static str,
        id: ObjectId,
        namespace: String,
    },
    #[error("{object}: key {key:?} is not valid UTF-8")]
    KeyEncoding { object: String, key: String },
    #[error("{object}: {REVISION_KEY} is missing or not 64 lowercase hex digits")]
    RevisionKey { object: String },
    #[error(
        "{object}: its content is not the one its name stands for (edited in place, or of another generation); the namespace keeps its last good config"
    )]
    Content { object: String },
    #[error("{object}, named by the index for namespace {namespace}, is missing")]
    Missing { object: String, namespace: String },
    #[error(
        "namespace {namespace}: its {routes} routes, {credentials} credentials and {clients} clients take {bytes} bytes as JSON, more than {max_parts} ConfigMaps of at most {max_part_bytes} bytes hold (--max-config-parts={max_parts}); split them over more namespaces or raise the limit"
    )]
    TooManyParts {
        namespace: String,
        routes: usize,
        credentials: usize,
        clients: usize,
        bytes: usize,
        max_parts: usize,
        max_part_bytes: usize,
    },
    #[error(
        "namespace {namespace}: {what} {id} alone takes {bytes} bytes as JSON, more than one ConfigMap of at most {max_part_bytes} bytes holds"
    )]
    ObjectTooLarge {
        namespace: String,
        what: &'static str,
        id: ObjectId,
        bytes: usize,
        max_part_bytes: usize,
    },
    #[error("{object}: {key}: {message}")]
    Index {
        object: String,
        key: &'static str,
        message: String,
    },
}

/// One source namespace's share of a compiled config: its routes, the credentials
/// those routes use, their keys, and the key revisions are computed with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NamespaceConfig {
    pub config: CompiledConfig,
    pub keys: Keys,
    /// The namespace's revision key ([`crate::revision`]); `None` before one is given.
    pub revision_key: Option<RevisionKey>,
}

/// Splits a compiled config by source namespace. Only namespaces with at least one
/// route appear, and each carries only the credentials (and keys) its routes use, so a
/// key is delivered only where it is needed, and its revision key, if it has one.
pub fn split(compiled: &Compiled) -> BTreeMap<String, NamespaceConfig> {
    let mut out: BTreeMap<String, NamespaceConfig> = BTreeMap::new();
    for route in &compiled.config.routes {
        out.entry(route.id.namespace.clone())
            .or_default()
            .config
            .routes
            .push(route.clone());
    }
    // A client travels with its own namespace, which may have no route of its own (its
    // routes are shared by other namespaces): such a namespace gets a config too.
    for client in &compiled.config.clients {
        out.entry(client.id.namespace.clone())
            .or_default()
            .config
            .clients
            .push(client.clone());
    }
    for (namespace, part) in &mut out {
        let used: std::collections::BTreeSet<&ObjectId> = part
            .config
            .routes
            .iter()
            .flat_map(|r| r.targets.iter().map(|t| &t.credential))
            .collect();
        part.config.credentials = compiled
            .config
            .credentials
            .iter()
            .filter(|c| &c.id.namespace == namespace && used.contains(&c.id))
            .cloned()
            .collect();
        for c in &part.config.credentials {
            if let Some(key) = compiled.keys.get(&c.id) {
                part.keys.0.insert(c.id.clone(), key.clone());
            }
        }
        part.revision_key = compiled.revision_keys.get(namespace).cloned();
    }
    out
}

/// Merges namespaces' configs into one (the proxy serves them all). Routes and
/// credentials come out sorted by id, as `compile` would produce them.
pub fn merge<'a>(parts: impl IntoIterator<Item = (&'a str, &'a NamespaceConfig)>) -> Compiled {
    let mut compiled = Compiled::default();
    for (namespace, part) in parts {
        compiled
            .config
            .routes
            .extend(part.config.routes.iter().cloned());
        compiled
            .config
            .credentials
            .extend(part.config.credentials.iter().cloned());
        compiled
            .config
            .clients
            .extend(part.config.clients.iter().cloned());
        for (id, key) in &part.keys.0 {
            compiled.keys.0.insert(id.clone(), key.clone());
        }
        if let Some(key) = &part.revision_key {
            compiled
                .revision_keys
                .insert(namespace.to_string(), key.clone());
        }
    }
    compiled.config.routes.sort_by(|a, b| a.id.cmp(&b.id));
    compiled.config.credentials.sort_by(|a, b| a.id.cmp(&b.id));
    compiled.config.clients.sort_by(|a, b| a.id.cmp(&b.id));
    compiled
}

/// The config JSON of (a part of) one namespace: pretty-printed, deterministic.
pub fn encode_config(
    source_namespace: &str,
    config: &CompiledConfig,
) -> Result<String, DeliveryError> {
    check_namespace(
        &format!("{ROUTES_PREFIX}{source_namespace}"),
        source_namespace,
        config,
    )?;
    // Plain data with string keys and sorted collections: serializing cannot fail.
    Ok(serde_json::to_string_pretty(config).expect("a compiled config serializes"))
}

/// Reads the config JSON of the object `object` of one namespace, checking the version
/// first (so an unknown version says so instead of failing on a field).
pub fn decode_config(
    object: &str,
    source_namespace: &str,
    json: &str,
) -> Result<CompiledConfig, DeliveryError> {
    let object = object.to_string();
    let value: serde_json::Value = serde_json::from_str(json).map_err(|e| DeliveryError::Json {
        object: object.clone(),
        message: e.to_string(),
    })?;
    let found = value.get("version").and_then(serde_json::Value::as_u64);
    match found {
        Some(v) if v == u64::from(CONFIG_VERSION) => {}
        Some(v) => return Err(DeliveryError::Version { object, found: v }),
        None => {
            return Err(DeliveryError::Json {
                object,
                message: "field `version` is missing or not a number".to_string(),
            });
        }
    }
    let config: CompiledConfig =
        serde_json::from_value(value).map_err(|e| DeliveryError::Json {
            object: object.clone(),
            message: e.to_string(),
        })?;
    check_namespace(&object, source_namespace, &config)?;
    Ok(config)
}

/// The keys Secret's data: one entry per credential name, and the revision key.
pub fn encode_keys(
    object: &str,
    source_namespace: &str,
    keys: &Keys,
    revision_key: &RevisionKey,
) -> Result<BTreeMap<String, ByteString>, DeliveryError> {
    let mut data = BTreeMap::new();
    for (id, key) in &keys.0 {
        if id.namespace != source_namespace {
            return Err(DeliveryError::ForeignObject {
                object: object.to_string(),
                what: "key of credential",
                id: id.clone(),
                namespace: source_namespace.to_string(),
            });
        }
        data.insert(
            id.name.clone(),
            ByteString(key.expose().clone().into_bytes()),
        );
    }
    data.insert(
        REVISION_KEY.to_string(),
        ByteString(revision_key.to_hex().into_bytes()),
    );
    Ok(data)
}

/// Reads the keys Secret's data back: the credentials' keys and the revision key.
pub fn decode_keys(
    object: &str,
    source_namespace: &str,
    data: &BTreeMap<String, ByteString>,
) -> Result<(Keys, RevisionKey), DeliveryError> {
    let mut keys = Keys::default();
    let mut revision_key = None;
    for (name, value) in data {
        let text = String::from_utf8(value.0.clone()).map_err(|_| DeliveryError::KeyEncoding {
            object: object.to_string(),
            key: name.clone(),
        })?;
        if name == REVISION_KEY {
            revision_key = Some(text.parse().map_err(|_| DeliveryError::RevisionKey {
                object: object.to_string(),
            })?);
            continue;
        }
        keys.0
            .insert(ObjectId::new(source_namespace, name), Secret::new(text));
    }
    let revision_key = revision_key.ok_or_else(|| DeliveryError::RevisionKey {
        object: object.to_string(),
    })?;
    Ok((keys, revision_key))
}

fn labels(source_namespace: &str, kind: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL.to_string(), kind.to_string()),
        (
            SOURCE_NAMESPACE_LABEL.to_string(),
            source_namespace.to_string(),
        ),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ])
}

/// The source namespace a rendered object's name stands for: what follows `prefix`, up
/// to the `.` before its digest (namespace names never hold a `.`).
pub fn source_namespace<'a>(name: &'a str, prefix: &'static str) -> Result<&'a str, DeliveryError> {
    name.strip_prefix(prefix)
        .map(|rest| rest.split_once('.').map_or(rest, |(ns, _)| ns))
        .filter(|ns| !ns.is_empty())
        .ok_or_else(|| DeliveryError::Name {
            object: name.to_string(),
            prefix,
        })
}

fn check_namespace(
    object: &str,
    namespace: &str,
    config: &CompiledConfig,
) -> Result<(), DeliveryError> {
    let foreign = |what: &'static str, id: &ObjectId| DeliveryError::ForeignObject {
        object: object.to_string(),
        what,
        id: id.clone(),
        namespace: namespace.to_string(),
    };
    for route in &config.routes {
        if route.id.namespace != namespace {
            return Err(foreign("route", &route.id));
        }
        for target in &route.targets {
            if target.credential.namespace != namespace {
                return Err(foreign("target credential", &target.credential));
            }
        }
    }
    for credential in &config.credentials {
        if credential.id.namespace != namespace {
            return Err(foreign("credential", &credential.id));
        }
    }
    // A client belongs to its own namespace's config; the routes it may call can be
    // in other namespaces (sharedWith).
    for client in &config.clients {
        if client.id.namespace != namespace {
            return Err(foreign("client", &client.id));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret as KubeSecret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::{Inputs, LLMRoute, ProviderCredential, compile};

    const MANIFESTS: &str = r#"
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: openai-prod, namespace: team-a }
spec: { provider: openai, secretRef: { name: keys, key: openai } }
---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: unused, namespace: team-a }
spec: { provider: openai, secretRef: { name: keys, key: other } }
---
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: { name: smart, namespace: team-a, generation: 3 }
spec: { targets: [ { credentialRef: { name: openai-prod }, model: gpt-4o } ] }
---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: anthropic, namespace: team-b }
spec: { provider: anthropic, secretRef: { name: keys, key: anthropic } }
---
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: { name: fast, namespace: team-b, generation: 1 }
spec: { targets: [ { credentialRef: { name: anthropic } } ] }
"#;

    fn compiled() -> Compiled {
        let mut routes = Vec::new();
        let mut credentials = Vec::new();
        for doc in MANIFESTS.split("\n---\n") {
            if doc.contains("kind: LLMRoute") {
                routes.push(serde_yaml_ng::from_str::<LLMRoute>(doc).unwrap());
            } else {
                credentials.push(serde_yaml_ng::from_str::<ProviderCredential>(doc).unwrap());
            }
        }
        let secret = |ns: &str, data: &[(&str, &str)]| KubeSecret {
            metadata: ObjectMeta {
                name: Some("keys".into()),
                namespace: Some(ns.into()),
                ..ObjectMeta::default()
            },
            string_data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..KubeSecret::default()
        };
        let secrets = [
            secret("team-a", &[("openai", "sk-a"), ("other", "sk-other")]),
            secret("team-b", &[("anthropic", "sk-ant")]),
        ];
        let out = compile(&Inputs {
            routes: &routes,
            credentials: &credentials,
            secrets: &secrets,
            ..Default::default()
        });
        assert!(out.diagnostics.is_empty(), "{:?}", out.diagnostics);
        out
    }

    #[test]
    fn clients_travel_with_their_namespace_and_merge_back() {
        let mut compiled = compiled();
        let client = |ns: &str, name: &str| crate::config::Client {
            id: ObjectId::new(ns, name),
            generation: 1,
            key_hash: None,
            key_secret_ref: crate::config::SecretKeyRef {
                keys: Vec::new(),
                name: "app-llm".into(),
                key: "apiKey".into(),
            },
            routes: Vec::new(),
            limits: Default::default(),
            budget: Default::default(),
            replicas: 1,
            exhausted: None,
        };
        // team-c has no route of its own: its client calls shared ones.
        compiled.config.clients = vec![client("team-a", "app"), client("team-c", "app")];
        let parts = split(&compiled);
        assert_eq!(parts["team-a"].config.clients, [client("team-a", "app")]);
        assert_eq!(parts["team-b"].config.clients, []);
        assert_eq!(parts["team-c"].config.clients, [client("team-c", "app")]);
        assert!(parts["team-c"].config.routes.is_empty());
        for (ns, part) in &parts {
            encode_config(ns, &part.config).expect("each part passes the namespace check");
        }
        assert_eq!(
            merge(parts.iter().map(|(ns, p)| (ns.as_str(), p)))
                .config
                .clients,
            compiled.config.clients
        );
    }

    #[test]
    fn split_then_merge_round_trips_without_unused_credentials() {
        let mut compiled = compiled();
        let key = RevisionKey::random();
        compiled
            .revision_keys
            .insert("team-a".to_string(), key.clone());
        let parts = split(&compiled);
        assert_eq!(parts.keys().collect::<Vec<_>>(), ["team-a", "team-b"]);
        let a = &parts["team-a"];
        assert_eq!(a.config.routes.len(), 1);
        // `unused` is referenced by no route: neither it nor its key is delivered.
        assert_eq!(a.config.credentials.len(), 1);
        assert_eq!(a.keys.0.len(), 1);
        assert_eq!(a.revision_key.as_ref(), Some(&key));
        assert_eq!(parts["team-b"].revision_key, None);
        let merged = merge(parts.iter().map(|(ns, p)| (ns.as_str(), p)));
        assert_eq!(merged.config.routes, compiled.config.routes);
        assert_eq!(merged.config.credentials.len(), 2);
        assert_eq!(merged.keys.0.len(), 2);
        assert_eq!(merged.revision_keys, compiled.revision_keys);
    }

    /// team-a rendered as objects, with its revision key.
    fn team_a() -> (NamespaceConfig, NamespaceObjects) {
        let mut part = split(&compiled()).remove("team-a").unwrap();
        let key = RevisionKey::random();
        part.revision_key = Some(key.clone());
        let objects =
            render_namespace("switchback", "team-a", &part, PartLimits::default()).unwrap();
        (part, objects)
    }

    #[test]
    fn objects_round_trip_and_keep_keys_out_of_the_config_maps() {
        let (a, objects) = team_a();
        assert_eq!(objects.parts.len(), 1, "a small namespace is one part");
        let cm = &objects.parts[0];
        let name = cm.metadata.name.as_deref().unwrap();
        assert!(name.starts_with("switchback-routes-team-a."), "{name}");
        assert_eq!(source_namespace(name, ROUTES_PREFIX), Ok("team-a"));
        assert_eq!(cm.metadata.labels.as_ref().unwrap()[LABEL], ROUTES);
        let json = &cm.data.as_ref().unwrap()[CONFIG_KEY];
        assert!(
            !json.contains("sk-a"),
            "key material in the ConfigMap: {json}"
        );
        // Deterministic: same input, same bytes, same names.
        assert_eq!(json, &encode_config("team-a", &a.config).unwrap());
        let key = a.revision_key.clone().unwrap();
        assert_eq!(
            render_namespace("switchback", "team-a", &a, PartLimits::default()).unwrap(),
            objects
        );

        let secret = &objects.keys;
        let name = secret.metadata.name.as_deref().unwrap();
        assert!(name.starts_with("switchback-keys-team-a."), "{name}");
        let data = secret.data.as_ref().unwrap();
        assert_eq!(data["openai-prod"], ByteString(b"sk-a".to_vec()));
        assert_eq!(data[REVISION_KEY], ByteString(key.to_hex().into_bytes()));
        // The keys Secret's name is keyed: the same keys under another revision key
        // give another name (no plain digest of keys in a name anyone may list).
        let other = keys_secret("switchback", "team-a", &a.keys, &RevisionKey::random()).unwrap();
        assert_ne!(other.metadata.name, secret.metadata.name);

        let entry = objects.entry();
        let back = assemble(
            "team-a",
            &entry,
            |n| {
                objects
                    .parts
                    .iter()
                    .find(|p| p.metadata.name.as_deref() == Some(n))
            },
            |n| (secret.metadata.name.as_deref() == Some(n)).then_some(secret),
        )
        .unwrap();
        assert_eq!(back, a);
    }

    #[test]
    fn a_config_of_another_version_is_refused_by_version() {
        let parts = split(&compiled());
        let json = encode_config("team-a", &parts["team-a"].config)
            .unwrap()
            .replacen("\"version\": 1", "\"version\": 2", 1);
        let err = decode_config("cm", "team-a", &json).unwrap_err();
        assert!(
            matches!(err, DeliveryError::Version { found: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("upgrade"), "{err}");
    }

    #[test]
    fn broken_or_foreign_configs_are_refused_with_the_reason() {
        let parts = split(&compiled());
        let json = encode_config("team-a", &parts["team-a"].config).unwrap();
        let err = decode_config("cm", "team-b", &json).unwrap_err();
        assert!(
            err.to_string()
                .contains("route team-a/smart is not in namespace team-b"),
            "{err}"
        );
        let err = decode_config("cm", "team-a", "{ not json").unwrap_err();
        assert!(matches!(err, DeliveryError::Json { .. }), "{err}");
        let err = decode_config("cm", "team-a", r#"{"routes": []}"#).unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
        assert!(encode_config("team-b", &parts["team-a"].config).is_err());
        assert!(matches!(
            source_namespace("something-else", ROUTES_PREFIX),
            Err(DeliveryError::Name { .. })
        ));
        assert!(source_namespace("switchback-routes-", ROUTES_PREFIX).is_err());
    }

    #[test]
    fn keys_must_be_utf8_and_carry_a_revision_key() {
        let data = BTreeMap::from([("c".to_string(), ByteString(vec![0xff, 0xfe]))]);
        let err = decode_keys("s", "team-a", &data).unwrap_err();
        assert!(matches!(err, DeliveryError::KeyEncoding { .. }));
        let data = BTreeMap::from([("c".to_string(), ByteString(b"sk".to_vec()))]);
        let err = decode_keys("s", "team-a", &data).unwrap_err();
        assert!(matches!(err, DeliveryError::RevisionKey { .. }), "{err}");
        let data = BTreeMap::from([(REVISION_KEY.to_string(), ByteString(b"12".to_vec()))]);
        let err = decode_keys("s", "team-a", &data).unwrap_err();
        assert!(matches!(err, DeliveryError::RevisionKey { .. }), "{err}");
    }
}

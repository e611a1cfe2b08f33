//! How config travels from the operator to the proxy (SPEC §4): the names, labels and
//! data keys of the rendered objects, and the functions that write and read them.
//!
//! Per *source* namespace (the namespace the LLMRoutes live in) the operator renders,
//! into the gateway namespace:
//!
//! - ConfigMap `switchback-routes-<ns>`: data key [`CONFIG_KEY`] holds that namespace's
//!   [`CompiledConfig`] as JSON (deterministic: same config, same bytes). No key
//!   material, ever.
//! - Secret `switchback-keys-<ns>`: one data key per credential, named after the
//!   ProviderCredential (credential names are DNS subdomains, valid Secret keys).
//!
//! Both carry the label [`LABEL`] (value [`ROUTES`] or [`KEYS`]) that the proxy
//! selects on, and [`SOURCE_NAMESPACE_LABEL`]. Reading checks the format version and
//! that every object in a namespace's config really belongs to that namespace, so a
//! hand-edited ConfigMap is refused with a message saying why instead of being served.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::compile::Compiled;
use crate::config::{CONFIG_VERSION, CompiledConfig, Keys, ObjectId};
use crate::secret::Secret;

/// Label on every rendered object; the proxy watches `LABEL` (any value).
pub const LABEL: &str = "switchback.dev/config";
/// [`LABEL`] value of a routes ConfigMap.
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
}

/// `switchback-routes-<ns>`.
pub fn routes_name(source_namespace: &str) -> String {
    format!("{ROUTES_PREFIX}{source_namespace}")
}

/// `switchback-keys-<ns>`.
pub fn keys_name(source_namespace: &str) -> String {
    format!("{KEYS_PREFIX}{source_namespace}")
}

/// One source namespace's share of a compiled config: its routes, the credentials
/// those routes use, and their keys.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NamespaceConfig {
    pub config: CompiledConfig,
    pub keys: Keys,
}

/// Splits a compiled config by source namespace. Only namespaces with at least one
/// route appear, and each carries only the credentials (and keys) its routes use, so a
/// key is delivered only where it is needed.
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
    }
    out
}

/// Merges namespaces' configs into one (the proxy serves them all). Routes and
/// credentials come out sorted by id, as `compile` would produce them.
pub fn merge<'a>(parts: impl IntoIterator<Item = &'a NamespaceConfig>) -> Compiled {
    let mut compiled = Compiled::default();
    for part in parts {
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
    }
    compiled.config.routes.sort_by(|a, b| a.id.cmp(&b.id));
    compiled.config.credentials.sort_by(|a, b| a.id.cmp(&b.id));
    compiled.config.clients.sort_by(|a, b| a.id.cmp(&b.id));
    compiled
}

/// The config JSON for one namespace: pretty-printed, deterministic.
pub fn encode_config(
    source_namespace: &str,
    config: &CompiledConfig,
) -> Result<String, DeliveryError> {
    check_namespace(&routes_name(source_namespace), source_namespace, config)?;
    // Plain data with string keys and sorted collections: serializing cannot fail.
    Ok(serde_json::to_string_pretty(config).expect("a compiled config serializes"))
}

/// Reads one namespace's config JSON, checking the version first (so an unknown
/// version says so instead of failing on a field).
pub fn decode_config(source_namespace: &str, json: &str) -> Result<CompiledConfig, DeliveryError> {
    let object = routes_name(source_namespace);
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

/// The keys Secret's data: one entry per credential name.
pub fn encode_keys(
    source_namespace: &str,
    keys: &Keys,
) -> Result<BTreeMap<String, ByteString>, DeliveryError> {
    let object = keys_name(source_namespace);
    let mut data = BTreeMap::new();
    for (id, key) in &keys.0 {
        if id.namespace != source_namespace {
            return Err(DeliveryError::ForeignObject {
                object,
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
    Ok(data)
}

/// Reads the keys Secret's data back.
pub fn decode_keys(
    source_namespace: &str,
    data: &BTreeMap<String, ByteString>,
) -> Result<Keys, DeliveryError> {
    let mut keys = Keys::default();
    for (name, value) in data {
        let key = String::from_utf8(value.0.clone()).map_err(|_| DeliveryError::KeyEncoding {
            object: keys_name(source_namespace),
            key: name.clone(),
        })?;
        keys.0
            .insert(ObjectId::new(source_namespace, name), Secret::new(key));
    }
    Ok(keys)
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

/// The routes ConfigMap for one source namespace, ready for server-side apply.
pub fn config_map(
    gateway_namespace: &str,
    source_namespace: &str,
    config: &CompiledConfig,
) -> Result<ConfigMap, DeliveryError> {
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(routes_name(source_namespace)),
            namespace: Some(gateway_namespace.to_string()),
            labels: Some(labels(source_namespace, ROUTES)),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            CONFIG_KEY.to_string(),
            encode_config(source_namespace, config)?,
        )])),
        ..ConfigMap::default()
    })
}

/// The keys Secret for one source namespace, ready for server-side apply.
pub fn keys_secret(
    gateway_namespace: &str,
    source_namespace: &str,
    keys: &Keys,
) -> Result<KubeSecret, DeliveryError> {
    Ok(KubeSecret {
        metadata: ObjectMeta {
            name: Some(keys_name(source_namespace)),
            namespace: Some(gateway_namespace.to_string()),
            labels: Some(labels(source_namespace, KEYS)),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(encode_keys(source_namespace, keys)?),
        ..KubeSecret::default()
    })
}

/// The source namespace a rendered object's name stands for.
pub fn source_namespace<'a>(name: &'a str, prefix: &'static str) -> Result<&'a str, DeliveryError> {
    name.strip_prefix(prefix)
        .filter(|ns| !ns.is_empty())
        .ok_or_else(|| DeliveryError::Name {
            object: name.to_string(),
            prefix,
        })
}

/// Reads a routes ConfigMap: its source namespace and config.
pub fn read_config_map(cm: &ConfigMap) -> Result<(String, CompiledConfig), DeliveryError> {
    let name = cm.metadata.name.as_deref().unwrap_or_default();
    let ns = source_namespace(name, ROUTES_PREFIX)?;
    let json = cm
        .data
        .as_ref()
        .and_then(|d| d.get(CONFIG_KEY))
        .ok_or_else(|| DeliveryError::MissingConfig {
            object: name.to_string(),
        })?;
    Ok((ns.to_string(), decode_config(ns, json)?))
}

/// Reads a keys Secret: its source namespace and keys.
pub fn read_keys_secret(secret: &KubeSecret) -> Result<(String, Keys), DeliveryError> {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let ns = source_namespace(name, KEYS_PREFIX)?;
    let empty = BTreeMap::new();
    let keys = decode_keys(ns, secret.data.as_ref().unwrap_or(&empty))?;
    Ok((ns.to_string(), keys))
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
            merge(parts.values()).config.clients,
            compiled.config.clients
        );
    }

    #[test]
    fn split_then_merge_round_trips_without_unused_credentials() {
        let compiled = compiled();
        let parts = split(&compiled);
        assert_eq!(parts.keys().collect::<Vec<_>>(), ["team-a", "team-b"]);
        let a = &parts["team-a"];
        assert_eq!(a.config.routes.len(), 1);
        // `unused` is referenced by no route: neither it nor its key is delivered.
        assert_eq!(a.config.credentials.len(), 1);
        assert_eq!(a.keys.0.len(), 1);
        let merged = merge(parts.values());
        assert_eq!(merged.config.routes, compiled.config.routes);
        assert_eq!(merged.config.credentials.len(), 2);
        assert_eq!(merged.keys.0.len(), 2);
    }

    #[test]
    fn objects_round_trip_and_keep_keys_out_of_the_config_map() {
        let parts = split(&compiled());
        let a = &parts["team-a"];
        let cm = config_map("switchback", "team-a", &a.config).unwrap();
        assert_eq!(
            cm.metadata.name.as_deref(),
            Some("switchback-routes-team-a")
        );
        assert_eq!(cm.metadata.labels.as_ref().unwrap()[LABEL], ROUTES);
        let json = &cm.data.as_ref().unwrap()[CONFIG_KEY];
        assert!(
            !json.contains("sk-a"),
            "key material in the ConfigMap: {json}"
        );
        // Deterministic: same input, same bytes.
        assert_eq!(json, &encode_config("team-a", &a.config).unwrap());
        assert_eq!(
            read_config_map(&cm).unwrap(),
            ("team-a".to_string(), a.config.clone())
        );

        let secret = keys_secret("switchback", "team-a", &a.keys).unwrap();
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("switchback-keys-team-a")
        );
        assert_eq!(
            secret.data.as_ref().unwrap()["openai-prod"],
            ByteString(b"sk-a".to_vec())
        );
        let (ns, keys) = read_keys_secret(&secret).unwrap();
        assert_eq!(ns, "team-a");
        assert_eq!(keys, a.keys);
    }

    #[test]
    fn a_config_of_another_version_is_refused_by_version() {
        let parts = split(&compiled());
        let json = encode_config("team-a", &parts["team-a"].config)
            .unwrap()
            .replacen("\"version\": 1", "\"version\": 2", 1);
        let err = decode_config("team-a", &json).unwrap_err();
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
        let err = decode_config("team-b", &json).unwrap_err();
        assert!(
            err.to_string()
                .contains("route team-a/smart is not in namespace team-b"),
            "{err}"
        );
        let err = decode_config("team-a", "{ not json").unwrap_err();
        assert!(matches!(err, DeliveryError::Json { .. }), "{err}");
        let err = decode_config("team-a", r#"{"routes": []}"#).unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
        assert!(encode_config("team-b", &parts["team-a"].config).is_err());

        let mut cm = config_map("gw", "team-a", &parts["team-a"].config).unwrap();
        cm.data = None;
        assert!(matches!(
            read_config_map(&cm),
            Err(DeliveryError::MissingConfig { .. })
        ));
        cm.metadata.name = Some("something-else".into());
        assert!(matches!(
            read_config_map(&cm),
            Err(DeliveryError::Name { .. })
        ));
    }

    #[test]
    fn keys_must_be_utf8() {
        let data = BTreeMap::from([("c".to_string(), ByteString(vec![0xff, 0xfe]))]);
        let err = decode_keys("team-a", &data).unwrap_err();
        assert!(matches!(err, DeliveryError::KeyEncoding { .. }));
    }
}

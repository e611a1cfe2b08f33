//! One namespace's rendering as objects, and back: its config split over as many
//! ConfigMaps ("parts") as its size needs, its keys Secret, and [`assemble`], which
//! reads them back whole or not at all.
//!
//! Each object is named after its content (`<prefix><ns>.<16 hex digits>`), so a name
//! stands for one content for ever: a changed namespace is written as new objects
//! beside the old ones, the index then names the new ones (the commit point), and the
//! old ones are deleted after. A reader holding the index of one generation therefore
//! never gets a part of another: what it fetches is what was named, or it is missing,
//! or (hand-edited) its content no longer matches its name and it is refused.
//!
//! A part's digest is FNV-1a 64 over its JSON (no secret in it). A keys Secret's is
//! keyed (HMAC-SHA256 under the namespace's revision key, which the Secret carries):
//! object names are listed by anyone who may list the gateway namespace's objects, and
//! a plain digest of keys would let them test guessed keys.
//!
//! Splitting is stable: an object goes to bucket `fnv(name) mod n`, so editing one
//! route rewrites one part, not the namespace. `n` is the smallest count (from an
//! estimate of half-full parts, doubled while a part is over the size limit) within
//! [`PartLimits::max_parts`]; past it the namespace is refused with a message naming
//! the limit.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::index::Entry;
use super::{
    CONFIG_KEY, DeliveryError, KEYS, KEYS_PREFIX, NamespaceConfig, REVISION_KEY, ROUTES,
    ROUTES_PREFIX, decode_config, decode_keys, encode_config, encode_keys, labels,
    source_namespace,
};
use crate::config::{CompiledConfig, ObjectId};
use crate::keyhash::to_hex;
use crate::revision::{Fnv1a, RevisionKey};

/// How big a part may be, and how many one namespace may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartLimits {
    /// Parts per namespace (`--max-config-parts`).
    pub max_parts: usize,
    /// Bytes of JSON per part: under the API's 1 MiB for a ConfigMap's data, with room
    /// for its metadata.
    pub max_part_bytes: usize,
}

/// The default [`PartLimits::max_parts`]: 32 parts, about 28 MiB of JSON, some 18,000
/// routes of a typical size in one namespace.
pub const DEFAULT_MAX_PARTS: usize = 32;
/// The default [`PartLimits::max_part_bytes`]: 900 KiB.
pub const DEFAULT_MAX_PART_BYTES: usize = 900 * 1024;

impl Default for PartLimits {
    fn default() -> Self {
        Self {
            max_parts: DEFAULT_MAX_PARTS,
            max_part_bytes: DEFAULT_MAX_PART_BYTES,
        }
    }
}

/// Everything written for one namespace: its parts and its keys Secret.
#[derive(Clone, Debug, PartialEq)]
pub struct NamespaceObjects {
    pub parts: Vec<ConfigMap>,
    pub keys: KubeSecret,
}

impl NamespaceObjects {
    /// The index entry naming these objects.
    pub fn entry(&self) -> Entry {
        Entry {
            parts: self
                .parts
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect(),
            keys: self.keys.metadata.name.clone().unwrap_or_default(),
        }
    }
}

/// `switchback-routes-<ns>.<digest of json>`.
pub fn part_name(source_namespace: &str, json: &str) -> String {
    format!(
        "{ROUTES_PREFIX}{source_namespace}.{:016x}",
        Fnv1a::of(json.as_bytes())
    )
}

/// `switchback-keys-<ns>.<digest>`.
pub fn keys_name(source_namespace: &str, digest: &str) -> String {
    format!("{KEYS_PREFIX}{source_namespace}.{digest}")
}

/// The keyed digest of a keys Secret's credential entries (the revision key keys it).
fn keys_digest(revision_key: &RevisionKey, data: &BTreeMap<String, ByteString>) -> String {
    let mut canonical = Vec::new();
    for (name, value) in data.iter().filter(|(k, _)| *k != REVISION_KEY) {
        for bytes in [name.as_bytes(), &value.0] {
            canonical.extend((bytes.len() as u64).to_le_bytes());
            canonical.extend(bytes);
        }
    }
    to_hex(&revision_key.mac(&canonical)[..8])
}

/// Renders one namespace: its config in parts within `limits`, and its keys Secret
/// with its revision key (which it must have). Fails when the namespace does not fit.
pub fn render_namespace(
    gateway_namespace: &str,
    source_namespace: &str,
    part: &NamespaceConfig,
    limits: PartLimits,
) -> Result<NamespaceObjects, DeliveryError> {
    let revision_key = part
        .revision_key
        .as_ref()
        .ok_or_else(|| DeliveryError::RevisionKey {
            object: format!("{KEYS_PREFIX}{source_namespace}"),
        })?;
    let parts = split_config(source_namespace, &part.config, limits)?
        .into_iter()
        .map(|json| ConfigMap {
            metadata: ObjectMeta {
                name: Some(part_name(source_namespace, &json)),
                namespace: Some(gateway_namespace.to_string()),
                labels: Some(labels(source_namespace, ROUTES)),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(CONFIG_KEY.to_string(), json)])),
            ..ConfigMap::default()
        })
        .collect();
    Ok(NamespaceObjects {
        parts,
        keys: keys_secret(
            gateway_namespace,
            source_namespace,
            &part.keys,
            revision_key,
        )?,
    })
}

/// The keys Secret for one source namespace, ready for server-side apply.
pub fn keys_secret(
    gateway_namespace: &str,
    source_namespace: &str,
    keys: &crate::config::Keys,
    revision_key: &RevisionKey,
) -> Result<KubeSecret, DeliveryError> {
    let object = format!("{KEYS_PREFIX}{source_namespace}");
    let data = encode_keys(&object, source_namespace, keys, revision_key)?;
    let name = keys_name(source_namespace, &keys_digest(revision_key, &data));
    Ok(KubeSecret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(gateway_namespace.to_string()),
            labels: Some(labels(source_namespace, KEYS)),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(data),
        ..KubeSecret::default()
    })
}

/// Reads a keys Secret: its source namespace, keys and revision key, refusing one whose
/// content is not the one its name stands for.
pub fn read_keys_secret(
    secret: &KubeSecret,
) -> Result<(String, crate::config::Keys, RevisionKey), DeliveryError> {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let ns = source_namespace(name, KEYS_PREFIX)?;
    let empty = BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    let (keys, revision_key) = decode_keys(name, ns, data)?;
    if keys_name(ns, &keys_digest(&revision_key, data)) != name {
        return Err(DeliveryError::Content {
            object: name.to_string(),
        });
    }
    Ok((ns.to_string(), keys, revision_key))
}

/// The bucket of the object named `name` among `n`.
fn bucket(name: &str, n: usize) -> usize {
    (Fnv1a::of(name.as_bytes()) % n as u64) as usize
}

/// `config` as the JSON of each of its parts (at least one).
pub fn split_config(
    source_namespace: &str,
    config: &CompiledConfig,
    limits: PartLimits,
) -> Result<Vec<String>, DeliveryError> {
    let max_parts = limits.max_parts.max(1);
    let whole = encode_config(source_namespace, config)?;
    if whole.len() <= limits.max_part_bytes {
        return Ok(vec![whole]);
    }
    // Half-full parts leave room for the buckets' uneven shares.
    let mut n = (2 * whole.len())
        .div_ceil(limits.max_part_bytes)
        .max(2)
        .min(max_parts);
    loop {
        let parts = split_in(source_namespace, config, n)?;
        if parts.iter().all(|p| p.len() <= limits.max_part_bytes) {
            return Ok(parts);
        }
        if n >= max_parts {
            return Err(too_large(source_namespace, config, whole.len(), limits));
        }
        n = (n * 2).min(max_parts);
    }
}

/// `config` in `n` buckets, empty ones left out (all of them empty: one empty part).
fn split_in(
    source_namespace: &str,
    config: &CompiledConfig,
    n: usize,
) -> Result<Vec<String>, DeliveryError> {
    let mut buckets = vec![CompiledConfig::default(); n];
    for r in &config.routes {
        buckets[bucket(&r.id.name, n)].routes.push(r.clone());
    }
    for c in &config.credentials {
        buckets[bucket(&c.id.name, n)].credentials.push(c.clone());
    }
    for c in &config.clients {
        buckets[bucket(&c.id.name, n)].clients.push(c.clone());
    }
    let mut parts = buckets
        .iter()
        .filter(|b| !(b.routes.is_empty() && b.credentials.is_empty() && b.clients.is_empty()))
        .map(|b| encode_config(source_namespace, b))
        .collect::<Result<Vec<_>, _>>()?;
    if parts.is_empty() {
        parts.push(encode_config(source_namespace, &CompiledConfig::default())?);
    }
    Ok(parts)
}

/// Why `config` fits in no `limits`: one object too large for any part, or the whole.
fn too_large(
    namespace: &str,
    config: &CompiledConfig,
    bytes: usize,
    limits: PartLimits,
) -> DeliveryError {
    let objects = config
        .routes
        .iter()
        .map(|r| ("route", &r.id, pretty_len(r)))
        .chain(
            config
                .credentials
                .iter()
                .map(|c| ("credential", &c.id, pretty_len(c))),
        )
        .chain(
            config
                .clients
                .iter()
                .map(|c| ("client", &c.id, pretty_len(c))),
        );
    if let Some((what, id, size)) = objects.max_by_key(|(_, _, size)| *size)
        && size > limits.max_part_bytes / 2
    {
        return DeliveryError::ObjectTooLarge {
            namespace: namespace.to_string(),
            what,
            id: id.clone(),
            bytes: size,
            max_part_bytes: limits.max_part_bytes,
        };
    }
    DeliveryError::TooManyParts {
        namespace: namespace.to_string(),
        routes: config.routes.len(),
        credentials: config.credentials.len(),
        clients: config.clients.len(),
        bytes,
        max_parts: limits.max_parts,
        max_part_bytes: limits.max_part_bytes,
    }
}

/// The size of one compiled object's JSON.
fn pretty_len<T: serde::Serialize>(value: &T) -> usize {
    serde_json::to_string_pretty(value).map_or(0, |s| s.len())
}

/// Reads namespace `source_namespace` back from the objects `entry` names, found with
/// `map` and `secret`: whole, or an error naming the first object that is missing,
/// unreadable or not the content its name stands for. Never a mix of two generations.
pub fn assemble<'a>(
    source_namespace: &str,
    entry: &Entry,
    map: impl Fn(&str) -> Option<&'a ConfigMap>,
    secret: impl FnOnce(&str) -> Option<&'a KubeSecret>,
) -> Result<NamespaceConfig, DeliveryError> {
    let missing = |object: &str| DeliveryError::Missing {
        object: object.to_string(),
        namespace: source_namespace.to_string(),
    };
    let mut config = CompiledConfig::default();
    for name in &entry.parts {
        let cm = map(name).ok_or_else(|| missing(name))?;
        let json = cm
            .data
            .as_ref()
            .and_then(|d| d.get(CONFIG_KEY))
            .ok_or_else(|| DeliveryError::MissingConfig {
                object: name.clone(),
            })?;
        if &part_name(source_namespace, json) != name {
            return Err(DeliveryError::Content {
                object: name.clone(),
            });
        }
        let part = decode_config(name, source_namespace, json)?;
        config.routes.extend(part.routes);
        config.credentials.extend(part.credentials);
        config.clients.extend(part.clients);
    }
    config.routes.sort_by(|a, b| a.id.cmp(&b.id));
    config.credentials.sort_by(|a, b| a.id.cmp(&b.id));
    config.clients.sort_by(|a, b| a.id.cmp(&b.id));
    let secret = secret(&entry.keys).ok_or_else(|| missing(&entry.keys))?;
    let (ns, keys, revision_key) = read_keys_secret(secret)?;
    if ns != source_namespace {
        return Err(DeliveryError::ForeignObject {
            object: entry.keys.clone(),
            what: "keys Secret",
            id: ObjectId::new(ns, &entry.keys),
            namespace: source_namespace.to_string(),
        });
    }
    Ok(NamespaceConfig {
        config,
        keys,
        revision_key: Some(revision_key),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Keys, Route, samples};
    use crate::secret::Secret;

    const NS: &str = "team-big";

    /// `routes` routes on one credential, as a namespace's config and keys.
    fn namespace(routes: usize) -> NamespaceConfig {
        // Sorted by id, as `compile` gives them.
        let mut routes: Vec<Route> = (0..routes)
            .map(|i| samples::route(NS, &format!("route-{i}"), &format!("m{i}"), &["openai"]))
            .collect();
        routes.sort_by(|a, b| a.id.cmp(&b.id));
        NamespaceConfig {
            config: CompiledConfig {
                routes,
                credentials: vec![samples::credential(NS, "openai")],
                ..CompiledConfig::default()
            },
            keys: Keys(BTreeMap::from([(
                ObjectId::new(NS, "openai"),
                Secret::new("sk-big".to_string()),
            )])),
            revision_key: None,
        }
    }

    /// Small parts, so that a few hundred routes need several.
    const SMALL: PartLimits = PartLimits {
        max_parts: 64,
        max_part_bytes: 64 * 1024,
    };

    fn render(ns: &NamespaceConfig, key: &RevisionKey, limits: PartLimits) -> NamespaceObjects {
        let ns = NamespaceConfig {
            revision_key: Some(key.clone()),
            ..ns.clone()
        };
        render_namespace("gw", NS, &ns, limits).unwrap()
    }

    fn read(objects: &NamespaceObjects, entry: &Entry) -> Result<NamespaceConfig, DeliveryError> {
        assemble(
            NS,
            entry,
            |n| {
                objects
                    .parts
                    .iter()
                    .find(|p| p.metadata.name.as_deref() == Some(n))
            },
            |n| (objects.keys.metadata.name.as_deref() == Some(n)).then_some(&objects.keys),
        )
    }

    #[test]
    fn two_thousand_routes_split_within_the_limits_and_read_back_whole() {
        let ns = namespace(2_000);
        let key = RevisionKey::random();
        let objects = render(&ns, &key, PartLimits::default());
        let sizes: Vec<usize> = objects
            .parts
            .iter()
            .map(|p| p.data.as_ref().unwrap()[CONFIG_KEY].len())
            .collect();
        let whole = encode_config(NS, &ns.config).unwrap().len();
        assert!(
            whole > DEFAULT_MAX_PART_BYTES,
            "the test needs more than one part: {whole}"
        );
        assert!(objects.parts.len() > 1 && objects.parts.len() <= DEFAULT_MAX_PARTS);
        assert!(
            sizes.iter().all(|s| *s <= DEFAULT_MAX_PART_BYTES),
            "{sizes:?}"
        );
        // Every route in exactly one part, and all of them back, in order.
        let back = read(&objects, &objects.entry()).unwrap();
        assert!(back.config == ns.config, "read back as it was");
        assert_eq!(back.keys, ns.keys);
        assert_eq!(back.revision_key, Some(key.clone()));
        // Deterministic.
        assert!(render(&ns, &key, PartLimits::default()) == objects);
    }

    #[test]
    fn editing_one_route_rewrites_one_part() {
        let ns = namespace(600);
        let key = RevisionKey::random();
        let before = render(&ns, &key, SMALL);
        assert!(before.parts.len() >= 4, "{}", before.parts.len());
        let mut edited = ns.clone();
        edited.config.routes[123].timeout_ms = 1_000;
        let after = render(&edited, &key, SMALL);
        let (old, new) = (before.entry(), after.entry());
        assert_eq!(old.parts.len(), new.parts.len());
        let changed = old
            .parts
            .iter()
            .zip(&new.parts)
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(changed, 1, "{old:?}\n{new:?}");
        assert_eq!(old.keys, new.keys, "same keys, same Secret");
    }

    #[test]
    fn a_namespace_over_the_part_limit_is_refused_naming_the_limit() {
        let ns = namespace(600);
        let limits = PartLimits {
            max_parts: 3,
            ..SMALL
        };
        let mut ns = ns;
        ns.revision_key = Some(RevisionKey::random());
        let err = render_namespace("gw", NS, &ns, limits).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, DeliveryError::TooManyParts { .. }), "{text}");
        assert!(text.contains("--max-config-parts=3"), "{text}");
        assert!(text.contains("600 routes"), "{text}");
        assert!(text.contains("namespace team-big"), "{text}");

        // One route no part can hold: named.
        let mut huge = namespace(1);
        huge.config.routes[0].models = (0..5_000).map(|i| format!("model-{i}")).collect();
        huge.revision_key = Some(RevisionKey::random());
        let err = render_namespace("gw", NS, &huge, SMALL).unwrap_err();
        assert!(
            err.to_string()
                .contains("route team-big/route-0 alone takes"),
            "{err}"
        );
    }

    #[test]
    fn a_mix_of_two_generations_is_refused() {
        let key = RevisionKey::random();
        let old = render(&namespace(600), &key, SMALL);
        let mut edited = namespace(600);
        edited.config.routes[7].timeout_ms = 1;
        let new = render(&edited, &key, SMALL);
        let entry = new.entry();
        let changed = entry
            .parts
            .iter()
            .position(|n| !old.entry().parts.contains(n))
            .unwrap();

        // The new index, the old content under the new part's name (an object edited
        // in place, or a generation that is neither): refused, naming it.
        let mut mixed = new.clone();
        let old_data = old.parts[changed].data.clone();
        mixed.parts[changed].data = old_data;
        let err = read(&mixed, &entry).unwrap_err();
        assert_eq!(
            err,
            DeliveryError::Content {
                object: entry.parts[changed].clone()
            }
        );
        // The new index with only the old objects at hand: the new part is missing.
        let err = read(&old, &entry).unwrap_err();
        assert!(matches!(err, DeliveryError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("namespace team-big"), "{err}");
        // Each generation reads back whole on its own.
        assert!(read(&old, &old.entry()).unwrap().config == namespace(600).config);
        assert!(read(&new, &entry).unwrap().config == edited.config);

        // A keys Secret edited in place no longer matches its name.
        let mut rotated = new.clone();
        rotated
            .keys
            .data
            .as_mut()
            .unwrap()
            .insert("openai".into(), ByteString(b"sk-other".to_vec()));
        let err = read(&rotated, &entry).unwrap_err();
        assert!(matches!(err, DeliveryError::Content { .. }), "{err}");
    }
}

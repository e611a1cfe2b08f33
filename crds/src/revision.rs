//! [`Revision`]: a digest of everything one route is served with (the compiled route,
//! the credentials its targets use, and their keys), computed the same way by the
//! operator from what it renders and by the proxy from what it serves, so the
//! operator can tell that a proxy serves a credential edit or a rotated key, which the
//! route's `metadata.generation` alone cannot show.
//!
//! The digest is FNV-1a 64 over the canonical JSON of the compiled objects (field order
//! fixed by the types, maps sorted), so it is identical across processes, builds and
//! platforms; `std`'s hashers are seeded or free to change between releases.
//!
//! Key material enters only as `HMAC-SHA256(revision key, key)`
//! (docs/security.md#keys-stay-in-secrets: hashes shown to users are keyed): a revision is
//! shown in status and on the admin port, and a plain digest over a key would let anyone
//! who reads it test guessed keys offline. The [`RevisionKey`] is per source namespace: the
//! operator draws one at random, keeps it in that namespace's rendered keys Secret (so it
//! survives operator restarts and the proxies read it with the keys it covers), and never
//! shows it. A config that comes with no key for a namespace (standalone `--manifests`)
//! uses the process's own random key ([`RevisionKey::process`]): there the proxy alone
//! computes revisions.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use aws_lc_rs::hmac;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::{CompiledConfig, Credential, Keys, ObjectId, Route};
use crate::keyhash::{from_hex32, to_hex};

/// The digest of one route as served; shown (and serialized) as 16 hex digits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Revision(u64);

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A revision string that is not 16 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a revision (16 hex digits)")]
pub struct BadRevision(String);

impl FromStr for Revision {
    type Err = BadRevision;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 16 {
            return Err(BadRevision(s.to_string()));
        }
        u64::from_str_radix(s, 16)
            .map(Revision)
            .map_err(|_| BadRevision(s.to_string()))
    }
}

impl Serialize for Revision {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Revision {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The secret that key material is digested with in a revision: 32 random bytes,
/// written as 64 hex digits where it is delivered. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct RevisionKey([u8; 32]);

/// A delivered revision key that is not 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a revision key (64 lowercase hex digits)")]
pub struct BadRevisionKey;

impl RevisionKey {
    /// A fresh key from the system's CSPRNG.
    pub fn random() -> Self {
        let mut bytes = [0u8; 32];
        // Fails only when the OS has no randomness to give: nothing can run then.
        aws_lc_rs::rand::fill(&mut bytes).expect("the system random number generator");
        Self(bytes)
    }

    /// This process's own key, drawn once: for configs that carry none (standalone).
    pub fn process() -> &'static RevisionKey {
        static KEY: OnceLock<RevisionKey> = OnceLock::new();
        KEY.get_or_init(RevisionKey::random)
    }

    /// HMAC-SHA256 of `data` under this key.
    pub fn mac(&self, data: &[u8]) -> [u8; 32] {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let mut out = [0u8; 32];
        // Fails only for a buffer shorter than the tag: SHA-256's is 32 bytes.
        if hmac::sign_to_buffer(&key, data, &mut out).is_err() {
            unreachable!("an HMAC-SHA256 tag is 32 bytes");
        }
        out
    }

    /// The key as delivered: 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }
}

impl FromStr for RevisionKey {
    type Err = BadRevisionKey;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        from_hex32(s).map(Self).ok_or(BadRevisionKey)
    }
}

impl fmt::Debug for RevisionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RevisionKey(*****)")
    }
}

/// A config's credentials indexed once, to compute the revision of each of its routes.
pub struct Revisions<'a> {
    credentials: BTreeMap<&'a ObjectId, &'a Credential>,
    /// Each keyed credential's key material, already digested with its namespace's
    /// revision key (once per credential, not once per route using it).
    keys: BTreeMap<&'a ObjectId, [u8; 32]>,
}

impl<'a> Revisions<'a> {
    /// `revision_keys`: the revision key of each source namespace; a namespace
    /// without one uses [`RevisionKey::process`].
    pub fn new(
        config: &'a CompiledConfig,
        keys: &'a Keys,
        revision_keys: &BTreeMap<String, RevisionKey>,
    ) -> Self {
        let keyed = keys
            .0
            .iter()
            .map(|(id, key)| {
                let revision_key = revision_keys
                    .get(&id.namespace)
                    .unwrap_or_else(|| RevisionKey::process());
                (id, revision_key.mac(key.expose().as_bytes()))
            })
            .collect();
        Self {
            credentials: config.credentials.iter().map(|c| (&c.id, c)).collect(),
            keys: keyed,
        }
    }

    /// The revision of `route`: a digest of the compiled route, of every credential its
    /// targets reference (in first-reference order) and of those credentials' keys.
    /// Any other credential or key leaves it unchanged.
    ///
    /// Keys are included because rotating one changes what the route sends upstream
    /// without changing any generation; it is the only way the operator can see that a
    /// proxy serves the new key. A key enters only as its HMAC under the namespace's
    /// revision key: without that key, a revision neither gives a key back nor lets
    /// anyone confirm a guessed one.
    pub fn route(&self, route: &Route) -> Revision {
        let mut h = Fnv1a::default();
        h.part(&json(route));
        let mut seen: Vec<&ObjectId> = Vec::with_capacity(route.targets.len());
        for target in &route.targets {
            let id = &target.credential;
            if seen.contains(&id) {
                continue;
            }
            seen.push(id);
            match self.credentials.get(id) {
                Some(c) => h.part(&json(c)),
                None => h.part(b"no credential"),
            }
            // Tagged, so a missing key never digests like some key's bytes.
            match self.keys.get(id) {
                Some(mac) => {
                    h.part(b"key");
                    h.part(mac);
                }
                None => h.part(b"no key"),
            }
        }
        Revision(h.0)
    }
}

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    // Plain data with string keys: serializing cannot fail.
    serde_json::to_vec(value).expect("compiled config serializes")
}

/// FNV-1a, 64 bits.
pub(crate) struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    /// The digest of `bytes` alone.
    pub(crate) fn of(bytes: &[u8]) -> u64 {
        let mut h = Self::default();
        h.write(bytes);
        h.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// One length-prefixed part, so that parts never run into each other.
    fn part(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::samples;
    use crate::secret::Secret;

    fn credential(name: &str) -> Credential {
        samples::credential("team-a", name)
    }

    fn route(name: &str, credentials: &[&str]) -> Route {
        samples::route("team-a", name, name, credentials)
    }

    /// Route `smart` on credentials a and b; route `other` on c; keys for all three.
    fn sample() -> (CompiledConfig, Keys) {
        let config = CompiledConfig {
            routes: vec![route("smart", &["a", "b"]), route("other", &["c"])],
            credentials: vec![credential("a"), credential("b"), credential("c")],
            ..CompiledConfig::default()
        };
        let keys = Keys(
            ["a", "b", "c"]
                .into_iter()
                .map(|c| (ObjectId::new("team-a", c), Secret::new(format!("sk-{c}"))))
                .collect(),
        );
        (config, keys)
    }

    /// team-a's revision key in these tests: fixed, so a digest can be pinned.
    fn team_key() -> BTreeMap<String, RevisionKey> {
        BTreeMap::from([("team-a".to_string(), RevisionKey([7; 32]))])
    }

    fn smart(config: &CompiledConfig, keys: &Keys) -> Revision {
        Revisions::new(config, keys, &team_key()).route(&config.routes[0])
    }

    /// The revision as it was computed before it was keyed: the key's bytes
    /// themselves in the FNV digest.
    fn unkeyed(config: &CompiledConfig, keys: &Keys) -> Revision {
        let route = &config.routes[0];
        let mut h = Fnv1a::default();
        h.part(&json(route));
        let mut seen = Vec::new();
        for t in &route.targets {
            if seen.contains(&&t.credential) {
                continue;
            }
            seen.push(&t.credential);
            let c = config.credentials.iter().find(|c| c.id == t.credential);
            h.part(&json(c.unwrap()));
            h.part(b"key");
            h.part(keys.get(&t.credential).unwrap().expose().as_bytes());
        }
        Revision(h.0)
    }

    #[test]
    fn key_material_enters_only_keyed() {
        let (config, keys) = sample();
        let keyed = smart(&config, &keys);
        // What a reader of status could once test a guessed key against.
        assert_ne!(keyed, unkeyed(&config, &keys));

        // Two keys of the same length: different revisions, under any revision key.
        let mut other = keys.clone();
        other
            .0
            .insert(ObjectId::new("team-a", "a"), Secret::new("sk-x".into()));
        assert_eq!("sk-x".len(), "sk-a".len());
        assert_ne!(smart(&config, &other), keyed);

        // The revision key decides: another one, another revision; the same one (the
        // operator's and the proxy's, read from the same Secret), the same revision.
        let another = BTreeMap::from([("team-a".to_string(), RevisionKey([8; 32]))]);
        let route = &config.routes[0];
        assert_ne!(Revisions::new(&config, &keys, &another).route(route), keyed);
        let delivered: RevisionKey = RevisionKey([7; 32]).to_hex().parse().unwrap();
        let read_back = BTreeMap::from([("team-a".to_string(), delivered)]);
        assert_eq!(
            Revisions::new(&config, &keys, &read_back).route(route),
            keyed
        );
        // Without a key for the namespace: the process's own, stable within it.
        let none = BTreeMap::new();
        let process = Revisions::new(&config, &keys, &none).route(route);
        assert_eq!(Revisions::new(&config, &keys, &none).route(route), process);
        assert_ne!(process, keyed);
    }

    #[test]
    fn revision_keys_parse_and_never_show() {
        let key = RevisionKey::random();
        assert_ne!(key, RevisionKey::random());
        let text = key.to_hex();
        assert_eq!(text.len(), 64);
        assert_eq!(text.parse::<RevisionKey>().unwrap(), key);
        assert_eq!(format!("{key:?}"), "RevisionKey(*****)");
        for bad in ["", "00", &"g".repeat(64), &"A".repeat(64)] {
            assert_eq!(bad.parse::<RevisionKey>(), Err(BadRevisionKey), "{bad}");
        }
        // HMAC-SHA256 (RFC 4231 test case 2's key is too short for us: check against
        // aws-lc-rs's own HMAC instead).
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &[7; 32]), b"sk-a");
        assert_eq!(RevisionKey([7; 32]).mac(b"sk-a").as_slice(), tag.as_ref());
    }

    #[test]
    fn deterministic_and_rendered_as_sixteen_hex_digits() {
        let (config, keys) = sample();
        let r = smart(&config, &keys);
        assert_eq!(r, smart(&config.clone(), &keys.clone()));
        // The published FNV-1a 64 test vectors: no seed, no per-build state.
        for (input, digest) in [("", 0xcbf2_9ce4_8422_2325), ("a", 0xaf63_dc4c_8601_ec8c)] {
            let mut h = Fnv1a::default();
            h.write(input.as_bytes());
            assert_eq!(h.0, digest, "{input:?}");
        }
        let text = r.to_string();
        assert_eq!(text.len(), 16);
        assert_eq!(text.parse::<Revision>().unwrap(), r);
        assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{text}\""));
        assert!("xyz".parse::<Revision>().is_err());
        assert!("0123456789abcdefg".parse::<Revision>().is_err());
    }

    #[test]
    fn changes_with_the_route_a_referenced_credential_or_its_key() {
        let (config, keys) = sample();
        let before = smart(&config, &keys);

        let mut edited = config.clone();
        edited.routes[0].timeout_ms = 30_000;
        assert_ne!(smart(&edited, &keys), before, "route edit");

        let mut edited = config.clone();
        edited.credentials[1].base_url = "https://proxy.example/v1".into();
        assert_ne!(smart(&edited, &keys), before, "second target's credential");

        let mut edited = config.clone();
        edited.routes[0].shared_with = vec!["team-b".into()];
        assert_ne!(smart(&edited, &keys), before, "sharedWith");

        let mut rotated = keys.clone();
        rotated
            .0
            .insert(ObjectId::new("team-a", "b"), Secret::new("sk-new".into()));
        assert_ne!(smart(&config, &rotated), before, "rotated key");

        let mut removed = keys.clone();
        removed.0.remove(&ObjectId::new("team-a", "a"));
        assert_ne!(smart(&config, &removed), before, "missing key");
    }

    #[test]
    fn unchanged_by_unrelated_credentials_and_keys() {
        let (config, keys) = sample();
        let before = smart(&config, &keys);

        let mut edited = config.clone();
        edited.credentials[2].base_url = "https://elsewhere.example/v1".into();
        edited.routes[1].timeout_ms = 1;
        assert_eq!(smart(&edited, &keys), before, "credential of another route");

        let mut rotated = keys.clone();
        rotated
            .0
            .insert(ObjectId::new("team-a", "c"), Secret::new("sk-new".into()));
        rotated
            .0
            .insert(ObjectId::new("team-a", "zzz"), Secret::new("sk-z".into()));
        assert_eq!(
            smart(&config, &rotated),
            before,
            "keys of other credentials"
        );
    }

    #[test]
    fn a_route_without_sharing_serializes_as_before_sharing_existed() {
        // Revisions of routes that do not use sharedWith survive the upgrade that
        // added it: their JSON, and so their digest, is unchanged.
        let (config, _) = sample();
        let json = String::from_utf8(json(&config.routes[0])).unwrap();
        assert!(!json.contains("sharedWith"), "{json}");
        assert!(!serde_json::to_string(&config).unwrap().contains("clients"));
    }

    #[test]
    fn a_route_without_stream_hedge_or_ramp_digests_as_before_they_existed() {
        // The fields of docs/streaming.md#streams-that-survive-their-provider are left out
        // of the JSON when unset: the revision of every route that does not use them is the
        // one an older operator computed. The digest below is that of `sample()`'s `smart`
        // before the fields existed.
        let (config, keys) = sample();
        let route = String::from_utf8(json(&config.routes[0])).unwrap();
        let credential = String::from_utf8(json(&config.credentials[0])).unwrap();
        for field in ["stream", "hedge", "rampUp", "prefill"] {
            assert!(!route.contains(field), "{route}");
            assert!(!credential.contains(field), "{credential}");
        }
        // The JSON digested is byte for byte what it was before those fields existed
        // (the unkeyed digest of then), and the keyed revision is pinned too.
        assert_eq!(unkeyed(&config, &keys).to_string(), PRE_STREAMS_REVISION);
        assert_eq!(smart(&config, &keys).to_string(), KEYED_REVISION);

        let mut edited = config.clone();
        edited.routes[0].circuit_breaker.ramp_up_ms = Some(30_000);
        assert_ne!(smart(&edited, &keys), smart(&config, &keys), "rampUp");
        let mut edited = config.clone();
        edited.credentials[0].prefill = true;
        assert_ne!(smart(&edited, &keys), smart(&config, &keys), "prefill");
    }

    /// `smart`'s revision in `sample()`, computed (unkeyed, as revisions then were)
    /// before `stream`, `hedge`, `rampUp` and `prefill` were added.
    const PRE_STREAMS_REVISION: &str = "3dc4e4d65183c173";
    /// `smart`'s keyed revision in `sample()` under team-a's key `[7; 32]`.
    const KEYED_REVISION: &str = "706dd78df2c72458";
}

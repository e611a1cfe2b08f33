//! [`Revision`]: a digest of everything one route is served with (the compiled route,
//! the credentials its targets use, and their keys), computed the same way by the
//! operator from what it renders and by the proxy from what it serves, so the
//! operator can tell that a proxy serves a credential edit or a rotated key, which the
//! route's `metadata.generation` alone cannot show.
//!
//! The digest is FNV-1a 64 over the canonical JSON of the compiled objects (field order
//! fixed by the types, maps sorted), so it is identical across processes, builds and
//! platforms; `std`'s hashers are seeded or free to change between releases.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::{CompiledConfig, Credential, Keys, ObjectId, Route};

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

/// A config's credentials indexed once, to compute the revision of each of its routes.
pub struct Revisions<'a> {
    credentials: BTreeMap<&'a ObjectId, &'a Credential>,
    keys: &'a Keys,
}

impl<'a> Revisions<'a> {
    pub fn new(config: &'a CompiledConfig, keys: &'a Keys) -> Self {
        Self {
            credentials: config.credentials.iter().map(|c| (&c.id, c)).collect(),
            keys,
        }
    }

    /// The revision of `route`: a digest of the compiled route, of every credential its
    /// targets reference (in first-reference order) and of those credentials' keys.
    /// Any other credential or key leaves it unchanged.
    ///
    /// Keys are included because rotating one changes what the route sends upstream
    /// without changing any generation; it is the only way the operator can see that a
    /// proxy serves the new key. The revision is a one-way digest: the key enters only
    /// through the hash and is never serialized, and 64 bits cannot give it back
    /// (though, like any digest, one could confirm a guessed key: fine for the random
    /// keys providers issue).
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
                Some(key) => {
                    h.part(b"key");
                    h.part(key.expose().as_bytes());
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
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
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
    use crate::config::{
        CircuitBreaker, Fallback, Provider, Retry, SecretKeyRef, Strategy, Target,
    };
    use crate::secret::Secret;

    fn credential(name: &str) -> Credential {
        Credential {
            key_rejected_for_ms: 300_000,
            api_version: None,
            responses_api: false,
            prefill: false,
            project: None,
            location: None,
            region: None,
            id: ObjectId::new("team-a", name),
            provider: Provider::Openai,
            base_url: "https://api.openai.com/v1".into(),
            headers: BTreeMap::new(),
            max_concurrency: None,
            max_queue: None,
            allow_private_network: false,
            secret_ref: SecretKeyRef {
                keys: Vec::new(),
                name: "keys".into(),
                key: name.into(),
            },
        }
    }

    fn route(name: &str, credentials: &[&str]) -> Route {
        Route {
            response_model: Default::default(),
            id: ObjectId::new("team-a", name),
            generation: 1,
            models: vec![name.into()],
            strategy: Strategy::Fallback,
            targets: credentials
                .iter()
                .map(|c| Target {
                    health_check: None,
                    model_map: Default::default(),
                    credential: ObjectId::new("team-a", *c),
                    model: None,
                    weight: 1,
                    timeout_ms: None,
                    retry: Retry::default(),
                    price: None,
                })
                .collect(),
            fallback: Fallback::default(),
            circuit_breaker: CircuitBreaker::default(),
            timeout_ms: 60_000,
            shared_with: Vec::new(),
            stream: None,
            hedge: None,
        }
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

    fn smart(config: &CompiledConfig, keys: &Keys) -> Revision {
        Revisions::new(config, keys).route(&config.routes[0])
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
        // SPEC §13's fields are left out of the JSON when unset: the revision of every
        // route that does not use them is the one an older operator computed. The
        // digest below is that of `sample()`'s `smart` before the fields existed.
        let (config, keys) = sample();
        let route = String::from_utf8(json(&config.routes[0])).unwrap();
        let credential = String::from_utf8(json(&config.credentials[0])).unwrap();
        for field in ["stream", "hedge", "rampUp", "prefill"] {
            assert!(!route.contains(field), "{route}");
            assert!(!credential.contains(field), "{credential}");
        }
        assert_eq!(smart(&config, &keys).to_string(), PRE_STREAMS_REVISION);

        let mut edited = config.clone();
        edited.routes[0].circuit_breaker.ramp_up_ms = Some(30_000);
        assert_ne!(smart(&edited, &keys), smart(&config, &keys), "rampUp");
        let mut edited = config.clone();
        edited.credentials[0].prefill = true;
        assert_ne!(smart(&edited, &keys), smart(&config, &keys), "prefill");
    }

    /// `smart`'s revision in `sample()`, computed before `stream`, `hedge`, `rampUp`
    /// and `prefill` were added.
    const PRE_STREAMS_REVISION: &str = "3dc4e4d65183c173";
}

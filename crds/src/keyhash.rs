//! Client keys as keyed hashes (docs/tenancy.md#keys): the proxy never holds an application's plain
//! key, only `HMAC-SHA256(cluster secret, key)`, and hashes each presented key the same
//! way to find the client.
//!
//! Why keyed and not a plain SHA-256: the hashes travel in ConfigMaps and show in
//! `/admin/v1/config`; without the cluster secret a hash can neither be presented as a
//! key (the proxy hashes what it is sent) nor tested against guessed keys offline.
//!
//! Where the secret comes from is the caller's business ([`KeyHasher::new`] takes the
//! bytes): the operator and the proxy read one per-cluster Secret, a standalone proxy
//! may draw a random one at start (it both hashes and checks). `compile` only uses it.

use std::fmt;
use std::str::FromStr;

use aws_lc_rs::hmac;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Shortest cluster secret accepted: 32 bytes (256 bits, SHA-256's output size, what
/// `openssl rand 32` gives), so the secret itself is never the thing worth guessing.
pub const MIN_SECRET_LEN: usize = 32;

/// The per-cluster secret client keys are hashed with.
pub struct KeyHasher {
    key: hmac::Key,
}

/// A cluster secret shorter than [`MIN_SECRET_LEN`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the client key hashing secret is {0} bytes long; at least {MIN_SECRET_LEN} are required")]
pub struct ShortSecret(pub usize);

impl KeyHasher {
    pub fn new(secret: &[u8]) -> Result<Self, ShortSecret> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(ShortSecret(secret.len()));
        }
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        })
    }

    /// The hash of one client key, as delivered in the compiled config and as the
    /// proxy computes it for a presented key.
    ///
    /// Per call, aws-lc-rs copies the keyed HMAC state (the padded secret's two
    /// SHA-256 blocks are hashed once, in [`KeyHasher::new`]) and runs two SHA-256
    /// blocks for a key of up to 55 bytes: HMAC's minimum. Its API has no way to
    /// reuse one context across calls; `sign_to_buffer` at least writes the tag
    /// straight into the hash instead of through a 64-byte `Tag`.
    pub fn hash(&self, client_key: &[u8]) -> KeyHash {
        let mut out = [0u8; 32];
        // Fails only for a buffer shorter than the tag: SHA-256's is 32 bytes.
        if hmac::sign_to_buffer(&self.key, client_key, &mut out).is_err() {
            unreachable!("an HMAC-SHA256 tag is 32 bytes");
        }
        KeyHash(out)
    }
}

impl KeyHasher {
    /// The secret of a `--client-key-hmac-file` (the proxy's and the operator's: both
    /// must hash alike): the file's bytes, surrounding ASCII whitespace (a trailing
    /// newline) trimmed, at least [`MIN_SECRET_LEN`] of them. The error names the file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::new(bytes.trim_ascii()).map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHasher(*****)")
    }
}

/// HMAC-SHA256 of a client key. Serialized as 64 lowercase hex digits; `Debug` shows
/// only the first 8, enough to tell two keys apart in a log.
///
/// Equality is not constant-time, and need not be: what an attacker controls is the
/// presented key, and the timing of comparing its HMAC says nothing usable about the
/// stored hashes without the cluster secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Equality in constant time (aws-lc-rs's `CRYPTO_memcmp`): what the proxy uses to
    /// confirm a presented key's hash against a client's.
    pub fn ct_eq(&self, other: &KeyHash) -> bool {
        aws_lc_rs::constant_time::verify_slices_are_equal(&self.0, &other.0).is_ok()
    }

    fn hex(&self) -> String {
        to_hex(&self.0)
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// 32 bytes from exactly 64 lowercase hex digits.
pub(crate) fn from_hex32(s: &str) -> Option<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyHash({}…)", &self.hex()[..8])
    }
}

/// A key hash string that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a key hash (64 hex digits)")]
pub struct BadKeyHash;

impl FromStr for KeyHash {
    type Err = BadKeyHash;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        from_hex32(s).map(Self).ok_or(BadKeyHash)
    }
}

impl Serialize for KeyHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for KeyHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn is_hmac_sha256() {
        // RFC 4231 test case 6 (its key is long enough for our length rule).
        let hasher = KeyHasher::new(&[0xaa; 131]).unwrap();
        let hash = hasher.hash(b"Test Using Larger Than Block-Size Key - Hash Key First");
        assert_eq!(
            hash.hex(),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn same_key_same_hash_and_the_secret_matters() {
        let a = KeyHasher::new(SECRET).unwrap();
        let b = KeyHasher::new(b"another secret, 32 bytes or more!").unwrap();
        assert_eq!(a.hash(b"sk-client-1"), a.hash(b"sk-client-1"));
        assert_ne!(a.hash(b"sk-client-1"), a.hash(b"sk-client-2"));
        assert_ne!(a.hash(b"sk-client-1"), b.hash(b"sk-client-1"));
        assert!(a.hash(b"sk-client-1").ct_eq(&a.hash(b"sk-client-1")));
        assert!(!a.hash(b"sk-client-1").ct_eq(&a.hash(b"sk-client-2")));
    }

    #[test]
    fn short_secrets_are_refused() {
        assert_eq!(
            KeyHasher::new(b"too short").unwrap_err().to_string(),
            "the client key hashing secret is 9 bytes long; at least 32 are required"
        );
    }

    #[test]
    fn serializes_as_hex_and_debug_shows_a_prefix() {
        let hash = KeyHasher::new(SECRET).unwrap().hash(b"sk-client-1");
        let json = serde_json::to_string(&hash).unwrap();
        assert_eq!(json.len(), 66);
        let back: KeyHash = serde_json::from_str(&json).unwrap();
        assert_eq!(back, hash);
        let debug = format!("{hash:?}");
        assert!(
            debug.starts_with("KeyHash(") && debug.ends_with("…)"),
            "{debug}"
        );
        assert_eq!(debug.chars().count(), "KeyHash(".len() + 8 + 2);
        assert_eq!(
            format!("{:?}", KeyHasher::new(SECRET).unwrap()),
            "KeyHasher(*****)"
        );
        for bad in ["", "00", &"g".repeat(64), &"A".repeat(64)] {
            assert!(bad.parse::<KeyHash>().is_err(), "{bad}");
        }
    }
}

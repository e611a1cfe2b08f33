//! Client authentication on the data port (SPEC §9): the key an application sends in
//! `Authorization: Bearer` (OpenAI SDKs) or `x-api-key` (Anthropic SDKs), hashed with
//! the per-cluster HMAC secret and looked up among the clients of the snapshot.
//!
//! The proxy never holds a plain client key: standalone, `compile` hashes the keys of
//! the manifests' Secrets and drops them; the snapshot keeps only the hashes.

use std::path::Path;

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName};
use switchback_crds::keyhash::{KeyHasher, MIN_SECRET_LEN};

use crate::config::snapshot::{Snapshot, Tenant};

/// `--auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Every data-port request must carry the key of an LLMClient; model names are
    /// resolved among the routes that client may call.
    Required,
    /// Everyone is served, with every route; LLMClients are not enforced.
    Off,
}

impl AuthMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::Required => "required",
            AuthMode::Off => "off",
        }
    }
}

/// The gateway's authentication settings, fixed for the life of the process.
#[derive(Debug)]
pub struct Auth {
    pub mode: AuthMode,
    /// The per-cluster secret presented keys are hashed with; `None` with `--auth off`.
    pub hasher: Option<KeyHasher>,
}

impl Default for Auth {
    fn default() -> Self {
        Self {
            mode: AuthMode::Off,
            hasher: None,
        }
    }
}

impl Auth {
    pub fn required(&self) -> bool {
        self.mode == AuthMode::Required
    }
}

/// Why a request was not authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer` nor `x-api-key`.
    Missing,
    /// A key no client has.
    Unknown,
}

impl Denied {
    pub fn message(self) -> &'static str {
        match self {
            Denied::Missing => {
                "no API key: send the key of an LLMClient as Authorization: Bearer <key> or x-api-key"
            }
            Denied::Unknown => "the API key is not the key of any LLMClient of this gateway",
        }
    }
}

/// Anthropic SDKs' key header. A constant: looking up a `&str` name parses and
/// lower-cases it first, on every request.
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The key a request presents: `x-api-key`, else the token of `Authorization: Bearer`.
pub fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get(&X_API_KEY) {
        let v = v.as_bytes().trim_ascii();
        if !v.is_empty() {
            return Some(v);
        }
    }
    let v = headers.get(AUTHORIZATION)?.as_bytes();
    let (scheme, token) = v.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = token.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// The client a request comes from. `Ok(None)` when authentication is off.
///
/// The hash map finds the candidate by the HMAC of the presented key (its first 8
/// bytes pick the bucket: without the cluster secret a caller can neither choose nor
/// predict them, see [`crate::config::snapshot::ByKeyHash`]); the candidate is then confirmed
/// with a constant-time comparison of the two HMACs.
pub fn authenticate<'s>(
    auth: &Auth,
    snapshot: &'s Snapshot,
    headers: &HeaderMap,
) -> Result<Option<&'s Tenant>, Denied> {
    if !snapshot.auth_required {
        return Ok(None);
    }
    let key = presented_key(headers).ok_or(Denied::Missing)?;
    let hasher = auth.hasher.as_ref().ok_or(Denied::Unknown)?;
    let hash = hasher.hash(key);
    let tenant = snapshot.tenants.get(&hash).ok_or(Denied::Unknown)?;
    if !tenant.key_hash.ct_eq(&hash) {
        return Err(Denied::Unknown);
    }
    Ok(Some(tenant))
}

/// Read the HMAC secret of `--client-key-hmac-file` (see [`KeyHasher::from_file`]: the
/// operator reads its copy the same way).
pub fn read_hmac_file(path: &Path) -> Result<KeyHasher, String> {
    KeyHasher::from_file(path)
}

/// A random secret, for a standalone proxy that both hashes its manifests' keys and
/// checks presented ones (no other process needs the same secret).
pub fn random_hasher() -> KeyHasher {
    let secret: [u8; MIN_SECRET_LEN] = rand::random();
    match KeyHasher::new(&secret) {
        Ok(h) => h,
        Err(_) => unreachable!("MIN_SECRET_LEN bytes are enough"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn keys_come_from_bearer_or_x_api_key() {
        assert_eq!(
            presented_key(&headers(&[("authorization", "Bearer sk-1")])),
            Some(&b"sk-1"[..])
        );
        assert_eq!(
            presented_key(&headers(&[("authorization", "bearer  sk-1 ")])),
            Some(&b"sk-1"[..])
        );
        assert_eq!(
            presented_key(&headers(&[("x-api-key", "sk-2")])),
            Some(&b"sk-2"[..])
        );
        assert_eq!(
            presented_key(&headers(&[
                ("x-api-key", "sk-2"),
                ("authorization", "Bearer sk-1")
            ])),
            Some(&b"sk-2"[..])
        );
        for none in [
            headers(&[]),
            headers(&[("authorization", "Basic dXNlcjpwYXNz")]),
            headers(&[("authorization", "Bearer ")]),
            headers(&[("authorization", "Bear")]),
            headers(&[("x-api-key", " ")]),
        ] {
            assert_eq!(presented_key(&none), None, "{none:?}");
        }
    }

    #[test]
    fn the_hmac_file_is_trimmed_and_must_be_long_enough() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, format!("{}\n", "k".repeat(32))).unwrap();
        let a = read_hmac_file(&good).unwrap();
        let b = KeyHasher::new("k".repeat(32).as_bytes()).unwrap();
        assert_eq!(a.hash(b"sk-x"), b.hash(b"sk-x"));
        let short = dir.path().join("short");
        std::fs::write(&short, "short\n").unwrap();
        assert!(read_hmac_file(&short).unwrap_err().contains("5 bytes long"));
        assert!(read_hmac_file(&dir.path().join("absent")).is_err());
        assert_ne!(random_hasher().hash(b"k"), random_hasher().hash(b"k"));
    }
}

//! Client authentication on the data port (docs/tenancy.md#modes): the key an application sends in
//! `Authorization: Bearer` (OpenAI SDKs) or `x-api-key` (Anthropic SDKs), hashed with
//! the per-cluster HMAC secret and looked up among the clients of the snapshot.
//!
//! The proxy never holds a plain client key: standalone, `compile` hashes the keys of
//! the manifests' Secrets and drops them; the snapshot keeps only the hashes.

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName};

use crate::config::keys::Auth;
use crate::config::snapshot::{Snapshot, Tenant};

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
}

//! Vertex AI's OAuth token: a service-account key signs a JWT (RS256), exchanged at
//! the key's `token_uri` for an access token by the JWT bearer grant (RFC 7523), then
//! cached per credential and refreshed [`REFRESH_EARLY`] before it expires.
//!
//! [`TokenCache::token`] reads the cached token without a lock (an `ArcSwap` load);
//! only a missing or stale token takes the refresh lock, and whoever finds the token
//! already refreshed behind it returns that one: concurrent requests share one
//! exchange. A failed exchange is an `authError` for the attempt (SPEC §10).
//!
//! The private key, the assertion and the access token are held as [`Secret`]s and
//! never appear in a message.
//!
//! Status: the JWT, the grant's form body, the answer's parsing and the cache are
//! here and unit-tested; the attempt path does not call them yet (a vertex target is
//! skipped as `missingKey`, see `snapshot`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use switchback_crds::secret::Secret;
use switchback_crds::service_account::ServiceAccount;
use tokio::time::Instant;

/// The scope Vertex AI needs.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The grant type of the token request.
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Lifetime asked for in the JWT (Google's maximum).
pub const ASSERTION_LIFETIME: Duration = Duration::from_secs(3600);
/// A token is refreshed this long before it expires.
pub const REFRESH_EARLY: Duration = Duration::from_secs(300);

/// Why no token could be had: every one is an `authError` for the attempt. The
/// messages name what failed, never key material or the token endpoint's body.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the service-account key is unusable: {0}")]
    Key(String),
    #[error("the token endpoint answered {0}")]
    Status(u16),
    #[error("the token endpoint's answer is not an OAuth token")]
    BadAnswer,
    #[error("the token exchange failed: {0}")]
    Transport(String),
}

/// A signer made once per credential from its service-account key.
pub struct Signer {
    key: RsaKeyPair,
    client_email: String,
    token_uri: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").finish_non_exhaustive()
    }
}

impl Signer {
    pub fn new(sa: &ServiceAccount) -> Result<Self, TokenError> {
        let der = sa.private_key_der().map_err(TokenError::Key)?;
        let key = RsaKeyPair::from_pkcs8(&der)
            .map_err(|_| TokenError::Key("private_key is not an RSA PKCS#8 key".into()))?;
        Ok(Self {
            key,
            client_email: sa.client_email.clone(),
            token_uri: sa.token_uri.clone(),
        })
    }

    pub fn token_uri(&self) -> &str {
        &self.token_uri
    }

    /// The signed JWT: `iss` the service account, `scope` cloud-platform, `aud` the
    /// token URI, issued at `now` (seconds since the epoch) for one hour.
    pub fn assertion(&self, now: u64) -> Result<Secret<String>, TokenError> {
        let header = base64url(br#"{"alg":"RS256","typ":"JWT"}"#);
        let claims = serde_json::json!({
            "iss": self.client_email,
            "scope": SCOPE,
            "aud": self.token_uri,
            "iat": now,
            "exp": now + ASSERTION_LIFETIME.as_secs(),
        });
        let signing_input = format!("{header}.{}", base64url(claims.to_string().as_bytes()));
        let mut sig = vec![0; self.key.public_modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signing_input.as_bytes(),
                &mut sig,
            )
            .map_err(|_| TokenError::Key("signing failed".into()))?;
        Ok(Secret::new(format!("{signing_input}.{}", base64url(&sig))))
    }

    /// The token request's `application/x-www-form-urlencoded` body, for `now`.
    pub fn form_body(&self, now: u64) -> Result<Secret<String>, TokenError> {
        // The grant type's ':' are percent-encoded; a JWT is base64url and dots only.
        let assertion = self.assertion(now)?;
        Ok(Secret::new(format!(
            "grant_type={}&assertion={}",
            GRANT_TYPE.replace(':', "%3A"),
            assertion.expose()
        )))
    }
}

/// Seconds since the epoch, for a JWT's `iat`.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An access token and how long it is good for.
#[derive(Clone, Debug)]
pub struct Token {
    pub access_token: Secret<String>,
    pub expires_in: Duration,
}

/// Parses the token endpoint's 2xx body: `{access_token, expires_in, token_type}`
/// (`token_type` Bearer).
pub fn parse_token(body: &[u8]) -> Result<Token, TokenError> {
    #[derive(serde::Deserialize)]
    struct Answer {
        access_token: String,
        expires_in: u64,
        #[serde(default)]
        token_type: Option<String>,
    }
    let a: Answer = serde_json::from_slice(body).map_err(|_| TokenError::BadAnswer)?;
    if a.access_token.is_empty()
        || a.expires_in == 0
        || a.token_type
            .as_deref()
            .is_some_and(|t| !t.eq_ignore_ascii_case("bearer"))
    {
        return Err(TokenError::BadAnswer);
    }
    Ok(Token {
        access_token: Secret::new(a.access_token),
        expires_in: Duration::from_secs(a.expires_in),
    })
}

struct Cached {
    access_token: Secret<String>,
    /// When it must no longer be used (its expiry less [`REFRESH_EARLY`]).
    refresh_at: Instant,
}

/// One credential's token. A new credential snapshot (key rotation) makes a new
/// cache, so a rotated key never serves the old key's token.
#[derive(Default)]
pub struct TokenCache {
    current: ArcSwapOption<Cached>,
    refresh: tokio::sync::Mutex<()>,
}

impl TokenCache {
    /// The cached token while it is fresh; otherwise one `exchange` (shared by every
    /// caller waiting meanwhile) and its token. A failed exchange is returned to the
    /// callers that waited for it and caches nothing: the next request tries again.
    pub async fn token<F, Fut>(&self, exchange: F) -> Result<Secret<String>, TokenError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Token, TokenError>>,
    {
        if let Some(t) = self.fresh() {
            return Ok(t);
        }
        let _guard = self.refresh.lock().await;
        // Refreshed by whoever held the lock before us.
        if let Some(t) = self.fresh() {
            return Ok(t);
        }
        let token = exchange().await?;
        let refresh_at = Instant::now() + token.expires_in.saturating_sub(REFRESH_EARLY);
        self.current.store(Some(Arc::new(Cached {
            access_token: token.access_token.clone(),
            refresh_at,
        })));
        Ok(token.access_token)
    }

    fn fresh(&self) -> Option<Secret<String>> {
        let c = self.current.load();
        c.as_ref()
            .filter(|c| Instant::now() < c.refresh_at)
            .map(|c| c.access_token.clone())
    }
}

/// Unpadded base64url (RFC 7515's JWT encoding).
fn base64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests;

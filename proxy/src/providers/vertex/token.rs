//! Vertex AI's OAuth tokens: a service-account key signs a JWT (RS256), exchanged at
//! the key's `token_uri` for an access token by the JWT bearer grant (RFC 7523),
//! through the credential's own upstream client (so its network guard: a private
//! `token_uri` needs `allowPrivateNetwork`), then cached per credential and
//! refreshed before it expires ([`REFRESH_EARLY`], or half its life for a
//! short-lived token).
//!
//! [`TokenCache::token`] reads the cached token without a lock (an `ArcSwap` load).
//! A token due for refresh but not expired still serves: the first request to see it
//! due starts one exchange in the background and nobody waits for it; should that
//! exchange fail, the token serves on until it expires and the refresh is tried again
//! [`REFRESH_RETRY`] later (a warning says so). Only a missing or expired token makes
//! requests wait, for one exchange they share (the refresh lock; whoever finds the
//! token refreshed behind it returns that one). A failed exchange then (an error
//! status, an answer that is not a token, a transport error or timeout) is an
//! `authError` for the attempt (docs/providers.md#vertex) and caches nothing.
//!
//! The private key, the assertion and the access token are held as [`Secret`]s and
//! never appear in a message; a token exchange's error names the status or the
//! transport failure, never the endpoint's body.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use switchback_crds::secret::Secret;
use switchback_crds::service_account::ServiceAccount;
use tokio::time::Instant;

use crate::upstream;

/// The scope Vertex AI needs.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The grant type of the token request.
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Lifetime asked for in the JWT (Google's maximum).
pub const ASSERTION_LIFETIME: Duration = Duration::from_secs(3600);
/// A token is refreshed this long before it expires (a token that lives less than
/// twice this is refreshed at half its life).
pub const REFRESH_EARLY: Duration = Duration::from_secs(300);
/// A background refresh that failed is tried again this much later (while the
/// current token still serves).
pub const REFRESH_RETRY: Duration = Duration::from_secs(10);
/// The longest one token exchange may take (request and answer): past it, the
/// attempt is an `authError`.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// The token endpoint's answers are read up to this many bytes (a token answer is
/// well under 4 KiB).
const MAX_TOKEN_ANSWER: usize = 64 * 1024;

/// The longest a token is trusted for, whatever `expires_in` says: Google's access
/// tokens live an hour (12 h at most). Bounding it keeps `Instant + expires_in` from
/// overflowing on a hostile answer (docs/providers.md#vertex: an `expires_in` above 12
/// hours is taken as 12 hours).
pub const MAX_TOKEN_LIFE: Duration = Duration::from_secs(12 * 3600);
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
    pub(crate) fn assertion(&self, now: u64) -> Result<Secret<String>, TokenError> {
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
        expires_in: Duration::from_secs(a.expires_in).min(MAX_TOKEN_LIFE),
    })
}

struct Cached {
    access_token: Secret<String>,
    /// When a new one is fetched in the background (its expiry less
    /// [`REFRESH_EARLY`], or less half its life when that is shorter; after a failed
    /// refresh, [`REFRESH_RETRY`] later).
    refresh_at: Instant,
    /// When it must no longer be used.
    expires_at: Instant,
}

/// One credential's token. A new credential snapshot (key rotation) makes a new
/// cache, so a rotated key never serves the old key's token.
#[derive(Default)]
pub struct TokenCache {
    current: ArcSwapOption<Cached>,
    /// Held by the one exchange in flight (foreground or background).
    refresh: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache").finish_non_exhaustive()
    }
}

impl TokenCache {
    /// The cached token while it has not expired; otherwise one `exchange` (shared
    /// by every caller waiting meanwhile) and its token. A token due for refresh is
    /// returned at once and `exchange` runs in the background (once, however many
    /// callers see it due). A failed exchange with no token left is returned to the
    /// callers that waited for it and caches nothing: the next request tries again.
    pub async fn token<F, Fut>(self: &Arc<Self>, exchange: F) -> Result<Secret<String>, TokenError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Token, TokenError>> + Send + 'static,
    {
        let now = Instant::now();
        if let Some(c) = self.current.load().as_ref()
            && now < c.expires_at
        {
            if now >= c.refresh_at
                && let Ok(lock) = Arc::clone(&self.refresh).try_lock_owned()
            {
                self.refresh_in_background(lock, exchange());
            }
            return Ok(c.access_token.clone());
        }
        let _lock = self.refresh.lock().await;
        // Fetched by whoever held the lock before us.
        if let Some(t) = self.valid() {
            return Ok(t);
        }
        let token = exchange().await?;
        self.store(&token);
        Ok(token.access_token)
    }

    /// One exchange on its own task, holding the refresh lock: callers keep the
    /// current token meanwhile.
    fn refresh_in_background(
        self: &Arc<Self>,
        lock: tokio::sync::OwnedMutexGuard<()>,
        exchange: impl Future<Output = Result<Token, TokenError>> + Send + 'static,
    ) {
        let cache = Arc::clone(self);
        tokio::spawn(async move {
            let _lock = lock;
            match exchange.await {
                Ok(token) => cache.store(&token),
                Err(e) => {
                    tracing::warn!(error = %e, retry_in_s = REFRESH_RETRY.as_secs(),
                        "vertex token refresh failed; the current token serves until it expires");
                    cache.retry_later();
                }
            }
        });
    }

    fn store(&self, token: &Token) {
        let now = Instant::now();
        let life = token.expires_in.min(MAX_TOKEN_LIFE);
        let early = REFRESH_EARLY.min(life / 2);
        self.current.store(Some(Arc::new(Cached {
            access_token: token.access_token.clone(),
            refresh_at: now + life.saturating_sub(early),
            expires_at: now + life,
        })));
    }

    /// After a failed background refresh: the same token, due again in
    /// [`REFRESH_RETRY`] (never past its expiry).
    fn retry_later(&self) {
        let current = self.current.load_full();
        if let Some(c) = current {
            self.current.store(Some(Arc::new(Cached {
                access_token: c.access_token.clone(),
                refresh_at: (Instant::now() + REFRESH_RETRY).min(c.expires_at),
                expires_at: c.expires_at,
            })));
        }
    }

    fn valid(&self) -> Option<Secret<String>> {
        let c = self.current.load();
        c.as_ref()
            .filter(|c| Instant::now() < c.expires_at)
            .map(|c| c.access_token.clone())
    }
}

/// A vertex credential's authorisation: its signer, and its token cache (carried
/// across reloads that keep the key, see `adapter::Kept`).
pub struct Auth {
    signer: Arc<Signer>,
    cache: Arc<TokenCache>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").finish_non_exhaustive()
    }
}

impl Auth {
    /// From the Secret's service-account JSON (already checked by `compile`; a key
    /// that is not RSA is only found here).
    pub fn new(service_account_json: &str, cache: Arc<TokenCache>) -> Result<Self, TokenError> {
        let sa = ServiceAccount::parse(service_account_json).map_err(TokenError::Key)?;
        Ok(Self {
            signer: Arc::new(Signer::new(&sa)?),
            cache,
        })
    }

    /// The `authorization` header of a request: the cached token, or one exchange
    /// (shared with every request waiting for it) through `client`.
    pub async fn bearer(&self, client: &upstream::Client) -> Result<HeaderValue, TokenError> {
        let (signer, client) = (Arc::clone(&self.signer), client.clone());
        let token = self.cache.token(|| exchange(signer, client)).await?;
        let mut v = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
            .map_err(|_| TokenError::BadAnswer)?;
        v.set_sensitive(true);
        Ok(v)
    }
}

/// One JWT bearer grant at the key's `token_uri`, within [`EXCHANGE_TIMEOUT`]. Owns
/// what it uses: a background refresh runs it on its own task.
async fn exchange(signer: Arc<Signer>, client: upstream::Client) -> Result<Token, TokenError> {
    let uri: http::Uri = signer
        .token_uri()
        .parse()
        .map_err(|_| TokenError::Key("token_uri is not a valid URL".into()))?;
    let form = signer.form_body(unix_now())?;
    let mut request = hyper::Request::new(upstream::Body::new(Bytes::from(form.expose().clone())));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    let h = request.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded"),
    );
    h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    h.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| TokenError::Transport(error_chain(&e)))?;
        let status = response.status();
        let body = upstream::read_cut(response.into_body(), MAX_TOKEN_ANSWER)
            .await
            .map_err(|e| TokenError::Transport(error_chain(&e)))?;
        if !status.is_success() {
            return Err(TokenError::Status(status.as_u16()));
        }
        parse_token(&body)
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            TokenError::Transport(format!("no answer within {}s", EXCHANGE_TIMEOUT.as_secs()))
        })?
}

/// An error and its causes, `: `-separated (hyper's own message is only its kind;
/// the cause says what failed, e.g. the network guard's refusal).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// Unpadded base64url (RFC 7515's JWT encoding).
pub(super) fn base64url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

//! The interface through which the request path reaches every provider: an
//! [`Adapter`] per `provider:` value says how a request is carried to it (relayed in
//! the client's own API, or translated into the dialect its upstream answers in),
//! how bodies, errors and headers differ from the plain wire, and prepares each
//! credential's [`Endpoint`]: where its requests go and how they are authorised.
//!
//! Nothing here knows a provider; each implements these in its own folder and is
//! registered once (`providers::adapter`).

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use switchback_crds::config::{Credential, ObjectId};
use switchback_crds::secret::Secret;

use super::dialect::{Defaults, Dialect};
use crate::observe::reason::Reason;
use crate::upstream;
use crate::wire::rewrite::{JsonStr, replace_top_level_model};
use crate::wire::surface::Surface;

/// One kind of provider (`provider: openai`, `vertex`, ...): what the request path
/// asks of it beyond the plain wire of its dialect.
pub trait Adapter: Sync {
    /// Its `gen_ai.provider.name` (OpenTelemetry's GenAI name) on attempt spans.
    fn system(&self) -> &'static str;

    /// The API its upstream answers in for `model`.
    fn dialect(&self, model: &str) -> &'static dyn Dialect;

    /// Whether it serves `surface` beyond chat (embeddings, the Responses API),
    /// relayed as the client sent it. Chat surfaces are always served (translated
    /// where the dialect is not the client's).
    fn relays(&self, _surface: Surface, _credential: &Credential) -> bool {
        false
    }

    /// Why it cannot serve `surface`, for the error that says no target of a route
    /// can: its provider, and what would make it serve it if anything.
    fn refusal(&self, _surface: Surface, credential: &Credential) -> String {
        credential.provider.as_str().to_owned()
    }

    /// Choices the dialects leave open, for the requests translated for it.
    fn defaults(&self) -> Defaults {
        Defaults::default()
    }

    /// The body of a request relayed in the client's own API: the target's model,
    /// when it names one, in place of the client's. `None`: it cannot be sent (the
    /// target is skipped, nothing was sent).
    fn relay_body(&self, body: &Bytes, model: Option<&JsonStr>) -> Option<Bytes> {
        Some(match model {
            Some(m) => replace_top_level_model(body, m).unwrap_or_else(|| body.clone()),
            None => body.clone(),
        })
    }

    /// An error body relayed in the client's own API, as the client reads it.
    fn relay_error(&self, _status: u16, body: Bytes) -> Bytes {
        body
    }

    /// Whether the client header `name` (one of the few the proxy passes on) goes to
    /// an upstream answering in `dialect`: by default, the dialect's own headers.
    fn forwards(&self, dialect: &dyn Dialect, name: &HeaderName) -> bool {
        dialect.forwards(name)
    }

    /// Prepares one credential: its endpoint, headers and key, made once per config.
    /// `key` is the credential's Secret as compiled (`None` while it is missing);
    /// `kept` holds what outlives a reload that keeps the key.
    fn prepare(
        &self,
        credential: &Credential,
        key: Option<&Secret<String>>,
        kept: &mut Kept,
    ) -> Result<Prepared, CredentialError>;

    /// The upstream `body` (in the dialect it answers `model` in, as any attempt is
    /// sent) asking it to continue an answer whose client has received `text`
    /// (resume after commit, docs/streaming.md#resume-after-commit): the text as the final
    /// assistant message, by the provider's own rules. `None`: it cannot continue a
    /// prefilled answer (the target is skipped as `cannotResume`).
    fn prefill(
        &self,
        _body: &Bytes,
        _text: &str,
        _model: &str,
        _credential: &Credential,
    ) -> Option<Prefilled> {
        None
    }

    /// A background probe of one of its models (docs/request-lifecycle.md#probed-circuits):
    /// the cheapest request that proves the model answers, in a client surface's API, its
    /// `model` left to the prober. It is carried like any request (translated where the
    /// upstream answers in another API). Default: a chat completion of one user word asking
    /// for one output token.
    fn probe(&self) -> ProbeRequest {
        ProbeRequest {
            surface: Surface::ChatCompletions,
            body: PROBE_CHAT,
        }
    }

    /// How a request of `surface` for the upstream `model` reaches it; `None` when
    /// it does not serve the surface.
    fn exchange(&self, surface: Surface, model: &str, credential: &Credential) -> Option<Exchange> {
        let dialect = self.dialect(model);
        match surface {
            Surface::ChatCompletions | Surface::Messages => Some(Exchange {
                dialect,
                translated: dialect.surface() != Some(surface),
            }),
            other => self.relays(other, credential).then_some(Exchange {
                dialect,
                translated: false,
            }),
        }
    }
}

/// An adapter shows as its provider's name (in a credential's `Debug`).
impl std::fmt::Debug for dyn Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.system())
    }
}

/// A background probe's request (see [`Adapter::probe`]).
#[derive(Clone, Copy, Debug)]
pub struct ProbeRequest {
    /// The client API `body` is in.
    pub surface: Surface,
    /// With an empty `model`, which the prober sets.
    pub body: &'static str,
}

/// [`Adapter::probe`]'s default: one word in, one token out (`max_tokens: 1`).
pub const PROBE_CHAT: &str =
    r#"{"model":"","messages":[{"role":"user","content":"ping"}],"max_tokens":1}"#;

/// How one request reaches a target.
#[derive(Clone, Copy)]
pub struct Exchange {
    /// The API the upstream answers in.
    pub dialect: &'static dyn Dialect,
    /// The client speaks another: its body, answers, errors and stream are
    /// translated.
    pub translated: bool,
}

impl Exchange {
    /// The client surface called upstream, for a client of `client`: the dialect's
    /// own when translated into a surface's API, else the client's.
    pub fn upstream_surface(self, client: Surface) -> Surface {
        match self.dialect.surface() {
            Some(s) if self.translated => s,
            _ => client,
        }
    }
}

/// A request that continues an answer (see [`Adapter::prefill`]).
#[derive(Debug)]
pub struct Prefilled {
    pub body: Bytes,
    /// Bytes of the client's text the prefill carries (its start): the rest (trailing
    /// whitespace a provider refuses) the client has, and is not sent again.
    pub sent: usize,
}

/// A credential made ready for requests.
pub struct Prepared {
    pub endpoint: Box<dyn Endpoint>,
    /// Static headers and the key's, copied into every request; `None` while the
    /// key is missing or unusable (the target is skipped as `missingKey`).
    pub headers: Option<HeaderMap>,
    /// Key material a provider's error body may echo, masked before it is relayed.
    pub secret: Option<Secret<String>>,
}

impl Prepared {
    /// A credential whose key travels in a header, `name: {prefix}{key}`, after the
    /// `fixed` headers: no key, no headers (the target is skipped as `missingKey`).
    pub fn keyed(
        credential: &Credential,
        key: Option<&Secret<String>>,
        endpoint: Box<dyn Endpoint>,
        fixed: &[(&'static str, &'static str)],
        (name, prefix): (&'static str, &str),
    ) -> Result<Self, CredentialError> {
        let headers = match key {
            Some(k) => {
                let value = format!("{prefix}{}", k.expose());
                Some(headers(credential, fixed, Some((name, &value)))?)
            }
            None => None,
        };
        Ok(Self {
            endpoint,
            headers,
            secret: key.cloned(),
        })
    }
}

/// Where one credential's requests go, and how each is authorised.
pub trait Endpoint: Send + Sync + std::fmt::Debug {
    /// The URL of a request of `surface` for `model` (`stream`: streamed, for APIs
    /// whose URL says so). `None` for a name no URL can carry.
    fn url(&self, surface: Surface, model: &str, stream: bool) -> Option<Uri>;

    /// Whether [`Endpoint::url`] depends on the model (targets then make the URLs of
    /// the models they name once).
    fn url_names_model(&self) -> bool {
        false
    }

    /// Authorises one request whose URL, headers and body are final (a token, a
    /// signature). A failure is the attempt's reason; nothing was sent.
    fn authorise<'a>(&'a self, _request: Unsigned<'a>) -> Authorising<'a> {
        Authorising::Done(Ok(()))
    }
}

/// A request about to be sent, for [`Endpoint::authorise`].
pub struct Unsigned<'a> {
    pub uri: &'a Uri,
    pub headers: &'a mut HeaderMap,
    pub body: &'a Bytes,
    /// The credential's own upstream client (its network guard), for an exchange
    /// the authorisation needs.
    pub client: &'a upstream::Client,
}

/// An authorisation done at once, or one that must wait (a token exchange): only
/// the latter is boxed.
pub enum Authorising<'a> {
    Done(Result<(), Reason>),
    Pending(Pin<Box<dyn Future<Output = Result<(), Reason>> + Send + 'a>>),
}

/// A credential that cannot be prepared: the config is refused, naming the field.
#[derive(Debug)]
pub struct CredentialError {
    pub field: &'static str,
    pub message: String,
}

/// State a provider keeps for a credential across reloads that keep its key (a
/// cached OAuth token): one value per (credential, key, type). A rotated key starts
/// afresh; what no live credential uses any more is dropped at the next reload.
#[derive(Default)]
pub struct Kept(HashMap<(ObjectId, u64), Arc<dyn Any + Send + Sync>>);

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("entries", &self.0.len())
            .finish()
    }
}

impl Kept {
    /// The `T` kept for `credential` with `key`, made now if there is none.
    pub fn get<T: Default + Send + Sync + 'static>(
        &mut self,
        credential: &ObjectId,
        key: &str,
    ) -> Arc<T> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (key, std::any::type_name::<T>()).hash(&mut h);
        let slot = (credential.clone(), h.finish());
        if let Some(kept) = self
            .0
            .get(&slot)
            .and_then(|v| v.clone().downcast::<T>().ok())
        {
            return kept;
        }
        let fresh = Arc::new(T::default());
        self.0.insert(slot, fresh.clone());
        fresh
    }

    /// Drops what no live credential holds any more.
    pub fn prune(&mut self) {
        self.0.retain(|_, v| Arc::strong_count(v) > 1);
    }
}

/// The usual headers: the credential's static `headers`, `fixed` ones, the key's
/// header (marked sensitive: never logged), and `accept-encoding: identity` (the
/// proxy rewrites answers, so it must read them, and it does not decode,
/// docs/request-lifecycle.md#of-a-providers-answer). Room is left for what each request
/// adds to its copy (x-request-id, x-switchback-hops, forwarded client headers,
/// content-type, traceparent, tracestate, host): a clone keeps the table size, so those
/// inserts never rehash it.
pub fn headers(
    credential: &Credential,
    fixed: &[(&'static str, &'static str)],
    key: Option<(&'static str, &str)>,
) -> Result<HeaderMap, CredentialError> {
    let mut h = HeaderMap::with_capacity(credential.headers.len() + 3 + 9);
    for (name, value) in &credential.headers {
        let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| CredentialError {
            field: "spec.headers",
            message: format!("{name:?} is not a valid header name"),
        })?;
        let v = HeaderValue::from_str(value).map_err(|_| CredentialError {
            field: "spec.headers",
            message: format!("the value of {name:?} is not a valid header value"),
        })?;
        h.insert(n, v);
    }
    for (name, value) in fixed {
        h.insert(*name, HeaderValue::from_static(value));
    }
    if let Some((name, value)) = key {
        // The message never includes the value: it is key material.
        let mut v = HeaderValue::from_str(value).map_err(|_| CredentialError {
            field: "secretRef",
            message: "the key contains characters not allowed in a header".into(),
        })?;
        v.set_sensitive(true);
        h.insert(name, v);
    }
    h.insert(
        http::header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    Ok(h)
}

/// One URL per client surface, `{base}{prefix}{surface path}`, for APIs whose paths
/// name neither model nor method.
#[derive(Debug)]
pub struct SurfaceUrls([Uri; Surface::ALL.len()]);

impl SurfaceUrls {
    pub fn new(base: &str, prefix: &str) -> Result<Self, CredentialError> {
        let mut urls: [Uri; Surface::ALL.len()] = Default::default();
        for (slot, s) in urls.iter_mut().zip(Surface::ALL) {
            *slot = format!("{base}{prefix}{}", s.upstream_path())
                .parse()
                .map_err(|e| CredentialError {
                    field: "spec.baseURL",
                    message: format!("{base:?} is not a valid URL: {e}"),
                })?;
        }
        Ok(Self(urls))
    }

    pub fn get(&self, surface: Surface) -> Uri {
        self.0[surface.index()].clone()
    }
}

impl Endpoint for SurfaceUrls {
    fn url(&self, surface: Surface, _model: &str, _stream: bool) -> Option<Uri> {
        Some(self.get(surface))
    }
}

/// `s` percent-encoded as one URL path segment (unreserved characters kept).
pub fn push_segment(url: &mut String, s: &str) {
    push_segment_keeping(url, s, b"");
}

/// [`push_segment`], also keeping the bytes of `keep` unescaped.
pub fn push_segment_keeping(url: &mut String, s: &str, keep: &[u8]) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            url.push(b as char);
        } else {
            url.push_str(&format!("%{b:02X}"));
        }
    }
}

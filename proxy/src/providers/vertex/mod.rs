//! Vertex AI (`provider: vertex`): which API a model answers in, where its requests
//! go and how they are authorised. Its dialects are Anthropic's and Gemini's; what it
//! adds is here.
//!
//! * **Publishers.** A model named `claude*` is Anthropic's, served through
//!   `rawPredict` / `streamRawPredict` with the Anthropic Messages wire (the body
//!   carries `anthropic_version` and no `model`: the model is in the URL, see
//!   `anthropic::to_raw_predict`); any other model is Google's, served through
//!   `generateContent` / `streamGenerateContent?alt=sse` with the Gemini wire.
//!   `Publisher` says which, [`url`] where it goes. Vertex's own refusals are
//!   Google-shaped whichever publisher's model was called: relayed to an Anthropic
//!   client in Anthropic's shape ([`anthropic_error`]).
//! * **Tokens.** A service-account key (the Secret's `serviceAccount.json` unless
//!   `secretRef.key` names another) is exchanged for an OAuth token, cached and
//!   refreshed before it expires (`token`); each request is authorised with it
//!   ([`Endpoint::authorise`]). A failed exchange is an `authError`.
//! * **Prefills.** Claude continues a broken stream's answer as on Anthropic's API
//!   (`anthropic::prefill`); Google's models cannot (docs/streaming.md#resume-after-commit).

mod token;

use bytes::Bytes;
use http::header::{self, HeaderName};
use switchback_crds::config::Credential;
use switchback_crds::secret::Secret;

pub use token::{Auth, Signer, TokenCache, TokenError, unix_now};

use super::adapter::{
    Adapter, Authorising, CredentialError, Endpoint, Kept, Prefilled, Prepared, Unsigned, headers,
    push_segment_keeping,
};
use super::dialect::{Defaults, Dialect};
use super::{anthropic, gemini};
use crate::observe::reason::Reason;
use crate::wire::surface::Surface;

/// Whose model a Vertex target names: it decides the URL and the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Publisher {
    /// `claude*`: `publishers/anthropic`, Anthropic Messages through `rawPredict`.
    Anthropic,
    /// Everything else (`gemini-*`): `publishers/google`, `generateContent`.
    Google,
}

impl Publisher {
    pub fn of(model: &str) -> Self {
        if model.starts_with("claude") {
            Self::Anthropic
        } else {
            Self::Google
        }
    }
}

/// `{baseURL}/projects/{project}/locations/{location}/publishers/{publisher}/models/{model}:{method}`:
/// `rawPredict` / `streamRawPredict` for Claude, `generateContent` /
/// `streamGenerateContent?alt=sse` for Google's models. The model is one path
/// segment, percent-encoded but for `@` (Claude's version suffix,
/// `claude-sonnet-4-5@20250929`, which a path segment may hold). `None` for a
/// credential without project or location (never a compiled vertex one) or a name
/// no URL can carry.
pub fn url(credential: &Credential, model: &str, stream: bool) -> Option<http::Uri> {
    let project = credential.project.as_deref()?;
    let location = credential.location.as_deref()?;
    let (publisher, method) = match (Publisher::of(model), stream) {
        (Publisher::Anthropic, false) => ("anthropic", ":rawPredict"),
        (Publisher::Anthropic, true) => ("anthropic", ":streamRawPredict"),
        (Publisher::Google, false) => ("google", ":generateContent"),
        (Publisher::Google, true) => ("google", ":streamGenerateContent?alt=sse"),
    };
    let mut url = String::with_capacity(credential.base_url.len() + model.len() + 128);
    url.push_str(&credential.base_url);
    for (name, value) in [("/projects/", project), ("/locations/", location)] {
        url.push_str(name);
        push_segment_keeping(&mut url, value, b"@");
    }
    url.push_str("/publishers/");
    url.push_str(publisher);
    url.push_str("/models/");
    push_segment_keeping(&mut url, model, b"@");
    url.push_str(method);
    url.parse().ok()
}

/// An Anthropic Messages body made a Vertex `rawPredict` body (see
/// `anthropic::to_raw_predict`), without unsigned thinking (see
/// `anthropic::drop_unsigned_thinking`). `None` for a body that is not a JSON object.
pub fn anthropic_body(body: &[u8]) -> Option<Bytes> {
    let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    anthropic::to_raw_predict(&mut v);
    anthropic::drop_unsigned_thinking(&mut v);
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// A Google-shaped error body (`{"error":{"code","message","status"}}`, what Vertex
/// AI answers for its own refusals whichever publisher's model was called) in
/// Anthropic's shape, message kept; `None` when the body is not Google's (an
/// Anthropic error is relayed as it is).
pub fn anthropic_error(status: u16, body: &[u8]) -> Option<Bytes> {
    anthropic::is_google_error(body).then(|| {
        let e = gemini::decode_error(status, body);
        Bytes::from(serde_json::to_vec(&anthropic::encode_error(&e)).unwrap_or_default())
    })
}

/// `provider: vertex`.
pub(crate) struct Vertex;

pub(crate) static VERTEX: Vertex = Vertex;

impl Adapter for Vertex {
    fn system(&self) -> &'static str {
        "gcp.vertex_ai"
    }

    fn dialect(&self, model: &str) -> &'static dyn Dialect {
        match Publisher::of(model) {
            Publisher::Anthropic => &anthropic::MESSAGES,
            Publisher::Google => &gemini::GENERATE_CONTENT,
        }
    }

    fn defaults(&self) -> Defaults {
        Defaults {
            anthropic_on_vertex: true,
            ..Defaults::default()
        }
    }

    /// Claude for an Anthropic client: the model is in the URL.
    fn relay_body(
        &self,
        body: &Bytes,
        _model: Option<&crate::wire::rewrite::JsonStr>,
    ) -> Option<Bytes> {
        anthropic_body(body)
    }

    fn relay_error(&self, status: u16, body: Bytes) -> Bytes {
        anthropic_error(status, &body).unwrap_or(body)
    }

    /// Claude continues a prefill as on Anthropic's API; Google's models are not
    /// asked to.
    fn prefill(
        &self,
        body: &Bytes,
        text: &str,
        model: &str,
        _credential: &Credential,
    ) -> Option<Prefilled> {
        match Publisher::of(model) {
            Publisher::Anthropic => anthropic::prefill::prefilled(body, text),
            Publisher::Google => None,
        }
    }

    /// Claude on Vertex takes its version in the body: of Anthropic's headers only
    /// `anthropic-beta`.
    fn forwards(&self, dialect: &dyn Dialect, name: &HeaderName) -> bool {
        match dialect.surface() {
            Some(Surface::Messages) => name == "anthropic-beta",
            _ => dialect.forwards(name),
        }
    }

    /// A key that cannot sign (compile checks its shape, not that it is RSA) leaves
    /// the target without a key: skipped as `missingKey`, the reason logged. The
    /// token cache is kept across reloads that keep the key.
    fn prepare(
        &self,
        credential: &Credential,
        key: Option<&Secret<String>>,
        kept: &mut Kept,
    ) -> Result<Prepared, CredentialError> {
        let auth = key.and_then(|key| {
            let cache = kept.get::<TokenCache>(&credential.id, key.expose());
            Auth::new(key.expose(), cache)
                .inspect_err(|e| {
                    tracing::warn!(credential = %credential.id, error = %e,
                        "vertex credential skipped: its service-account key cannot sign")
                })
                .ok()
        });
        let headers = match auth {
            Some(_) => Some(headers(credential, &[], None)?),
            None => None,
        };
        Ok(Prepared {
            endpoint: Box::new(VertexEndpoint {
                credential: credential.clone(),
                label: credential.id.to_string(),
                auth,
            }),
            headers,
            secret: key.cloned(),
        })
    }
}

/// One vertex credential: its project and location, and its token.
#[derive(Debug)]
struct VertexEndpoint {
    credential: Credential,
    /// `namespace/name`, for the warning a failed exchange logs.
    label: String,
    auth: Option<Auth>,
}

impl Endpoint for VertexEndpoint {
    fn url(&self, _surface: Surface, model: &str, stream: bool) -> Option<http::Uri> {
        url(&self.credential, model, stream)
    }

    fn url_names_model(&self) -> bool {
        true
    }

    /// The credential's token, cached or exchanged (through the credential's own
    /// client, so its network guard). Any failure to get one is an `authError`
    /// (docs/providers.md#vertex), logged without key material. Boxed: the exchange is a large
    /// future, and held inline it would grow every attempt's state for the one
    /// provider that needs it.
    fn authorise<'a>(&'a self, request: Unsigned<'a>) -> Authorising<'a> {
        let Some(auth) = &self.auth else {
            return Authorising::Done(Err(Reason::MissingKey));
        };
        Authorising::Pending(Box::pin(async move {
            match auth.bearer(request.client).await {
                Ok(bearer) => {
                    request.headers.insert(header::AUTHORIZATION, bearer);
                    Ok(())
                }
                Err(e) => {
                    tracing::warn!(target_credential = %self.label, error = %e,
                        "vertex token exchange failed");
                    Err(Reason::AuthError)
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests;

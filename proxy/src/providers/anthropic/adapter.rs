//! `provider: anthropic`: the Messages API at `{baseURL}/messages`, the key as
//! `x-api-key` with the `anthropic-version` it speaks.

use bytes::Bytes;
use switchback_crds::config::Credential;
use switchback_crds::secret::Secret;

use super::super::adapter::{
    Adapter, CredentialError, Kept, Prefilled, Prepared, ProbeRequest, SurfaceUrls,
};
use super::super::dialect::Dialect;
use crate::wire::rewrite::{JsonStr, replace_top_level_model};
use crate::wire::surface::Surface;

/// The `anthropic-version` header sent with every request.
const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `provider: anthropic`.
pub(crate) struct Anthropic;

pub(crate) static ANTHROPIC: Anthropic = Anthropic;

impl Adapter for Anthropic {
    fn system(&self) -> &'static str {
        "anthropic"
    }

    fn dialect(&self, _model: &str) -> &'static dyn Dialect {
        &super::MESSAGES
    }

    /// The client's body with the target's model, and without thinking blocks that
    /// carry no signature (another provider's reasoning, see
    /// `shapes::drop_unsigned_thinking`).
    fn relay_body(&self, body: &Bytes, model: Option<&JsonStr>) -> Option<Bytes> {
        let body = super::without_unsigned_thinking(body).unwrap_or_else(|| body.clone());
        Some(match model {
            Some(m) => replace_top_level_model(&body, m).unwrap_or(body),
            None => body,
        })
    }

    /// A message of one user word and `max_tokens: 1`, in its own API.
    fn probe(&self) -> ProbeRequest {
        ProbeRequest {
            surface: Surface::Messages,
            body: r#"{"model":"","max_tokens":1,"messages":[{"role":"user","content":"ping"}]}"#,
        }
    }

    /// Every Anthropic model continues a prefill (trailing whitespace left out).
    fn prefill(
        &self,
        body: &Bytes,
        text: &str,
        _model: &str,
        _credential: &Credential,
    ) -> Option<Prefilled> {
        super::prefill::prefilled(body, text)
    }

    fn prepare(
        &self,
        credential: &Credential,
        key: Option<&Secret<String>>,
        _kept: &mut Kept,
    ) -> Result<Prepared, CredentialError> {
        let endpoint = Box::new(SurfaceUrls::new(&credential.base_url, "")?);
        let version = [("anthropic-version", ANTHROPIC_VERSION)];
        Prepared::keyed(credential, key, endpoint, &version, ("x-api-key", ""))
    }
}

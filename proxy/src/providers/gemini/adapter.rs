//! `provider: gemini`: Google AI's `generateContent` at
//! `{baseURL}/models/{model}:generateContent` (or `:streamGenerateContent?alt=sse`),
//! the key in `x-goog-api-key` (never `?key=` in the URL, which would put it in
//! access logs).

use switchback_crds::config::Credential;
use switchback_crds::secret::Secret;

use super::super::adapter::{Adapter, CredentialError, Endpoint, Kept, Prepared, push_segment};
use super::super::dialect::Dialect;
use crate::wire::surface::Surface;

/// `provider: gemini`.
pub(crate) struct Gemini;

pub(crate) static GEMINI: Gemini = Gemini;

impl Adapter for Gemini {
    fn system(&self) -> &'static str {
        "gcp.gemini"
    }

    fn dialect(&self, _model: &str) -> &'static dyn Dialect {
        &super::GENERATE_CONTENT
    }

    fn prepare(
        &self,
        credential: &Credential,
        key: Option<&Secret<String>>,
        _kept: &mut Kept,
    ) -> Result<Prepared, CredentialError> {
        let endpoint = Box::new(ModelUrls {
            base: credential.base_url.clone(),
        });
        Prepared::keyed(credential, key, endpoint, &[], ("x-goog-api-key", ""))
    }
}

/// URLs that name the model and the method.
#[derive(Debug)]
struct ModelUrls {
    base: String,
}

impl Endpoint for ModelUrls {
    /// `{baseURL}/models/{model}:generateContent`, or
    /// `:streamGenerateContent?alt=sse` (SSE framing; without it Google streams a
    /// JSON array). The model is one percent-encoded path segment; a leading
    /// `models/` (the resource name Google's own answers use) is taken as written
    /// twice and dropped.
    fn url(&self, _surface: Surface, model: &str, stream: bool) -> Option<http::Uri> {
        let model = model.strip_prefix("models/").unwrap_or(model);
        let mut url = String::with_capacity(self.base.len() + model.len() + 48);
        url.push_str(&self.base);
        url.push_str("/models/");
        push_segment(&mut url, model);
        url.push_str(if stream {
            ":streamGenerateContent?alt=sse"
        } else {
            ":generateContent"
        });
        url.parse().ok()
    }

    fn url_names_model(&self) -> bool {
        true
    }
}

//! Azure OpenAI (`provider: azure-openai`): the OpenAI wire with Azure's habits.
//!
//! * **Endpoints.** `baseURL` is the resource's `https://RESOURCE.openai.azure.com/openai`.
//!   Without `apiVersion` (or `v1`) the v1 API: `{baseURL}/v1` plus each surface's
//!   path, the Responses API included. With a dated `apiVersion` the classic paths:
//!   `{baseURL}/deployments/{deployment}/chat/completions?api-version=...`, the
//!   target's `model` naming the deployment (no Responses API there).
//! * **Auth.** The key goes in `api-key`, never `Authorization` (Azure reads that as
//!   an Entra ID token and refuses a key there).
//! * Its 429s carry `retry-after-ms` / `x-ms-retry-after-ms`, and its content filter
//!   refuses with a 400 `content_filter`: both are read by `classify` like every
//!   provider's words.

use switchback_crds::config::Credential;
use switchback_crds::secret::Secret;

use super::adapter::{
    Adapter, CredentialError, Endpoint, Kept, Prepared, SurfaceUrls, push_segment,
};
use super::dialect::{Defaults, Dialect};
use super::openai;
use crate::wire::surface::Surface;

/// `provider: azure-openai`.
pub(crate) struct Azure;

pub(crate) static AZURE: Azure = Azure;

impl Adapter for Azure {
    fn system(&self) -> &'static str {
        "azure.ai.openai"
    }

    fn dialect(&self, _model: &str) -> &'static dyn Dialect {
        &openai::CHAT
    }

    /// Embeddings always; the Responses API on the v1 API only.
    fn relays(&self, surface: Surface, credential: &Credential) -> bool {
        match surface {
            Surface::Embeddings => true,
            Surface::Responses => credential.serves_responses(),
            Surface::ChatCompletions | Surface::Messages => false,
        }
    }

    fn refusal(&self, surface: Surface, credential: &Credential) -> String {
        let provider = credential.provider.as_str();
        match (surface, &credential.api_version) {
            (Surface::Responses, Some(version)) => format!(
                "{provider} on the dated apiVersion {version} (the Responses API needs the v1 API)"
            ),
            _ => provider.to_owned(),
        }
    }

    /// Azure OpenAI takes `max_completion_tokens` too (the v1 API, and dated
    /// versions since 2024-09-01-preview), and its reasoning deployments need it.
    fn defaults(&self) -> Defaults {
        Defaults {
            openai_max_completion_tokens: true,
            ..Defaults::default()
        }
    }

    fn prepare(
        &self,
        credential: &Credential,
        key: Option<&Secret<String>>,
        _kept: &mut Kept,
    ) -> Result<Prepared, CredentialError> {
        // The v1 API lives under `{baseURL}/v1`; checked whatever the version, as the
        // base URL's validity is.
        let v1 = SurfaceUrls::new(&credential.base_url, "/v1")?;
        let endpoint: Box<dyn Endpoint> = match &credential.api_version {
            None => Box::new(v1),
            Some(version) => Box::new(Deployments {
                base: credential.base_url.clone(),
                version: version.clone(),
            }),
        };
        Prepared::keyed(credential, key, endpoint, &[], ("api-key", ""))
    }
}

/// The classic API of a dated `apiVersion`: a path per deployment.
#[derive(Debug)]
struct Deployments {
    base: String,
    version: String,
}

impl Endpoint for Deployments {
    /// `{baseURL}/deployments/{deployment}/chat/completions?api-version=...` (the
    /// surface's path), the deployment percent-encoded as one path segment.
    fn url(&self, surface: Surface, deployment: &str, _stream: bool) -> Option<http::Uri> {
        let mut url = String::with_capacity(self.base.len() + deployment.len() + 64);
        url.push_str(&self.base);
        url.push_str("/deployments/");
        push_segment(&mut url, deployment);
        url.push_str(surface.upstream_path());
        url.push_str("?api-version=");
        url.push_str(&self.version);
        url.parse().ok()
    }

    fn url_names_model(&self) -> bool {
        true
    }
}

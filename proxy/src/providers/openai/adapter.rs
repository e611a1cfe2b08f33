//! `provider: openai` and `openai-compatible`: the OpenAI wire at `{baseURL}` plus
//! each surface's path, the key as `Authorization: Bearer`. Both relay embeddings;
//! openai relays the Responses API, openai-compatible when it declares it
//! (`responsesAPI: true`).

use bytes::Bytes;
use switchback_crds::config::{Credential, Provider};
use switchback_crds::secret::Secret;

use super::super::adapter::{
    Adapter, CredentialError, Kept, Prefilled, Prepared, ProbeRequest, SurfaceUrls,
};
use super::super::dialect::{Defaults, Dialect};
use crate::wire::surface::Surface;

/// `provider: openai` ([`OPENAI`]) or `openai-compatible` ([`COMPATIBLE`]).
pub(crate) struct OpenAi {
    /// Send an Anthropic client's `max_tokens` as `max_completion_tokens`: OpenAI's
    /// reasoning models refuse `max_tokens`, many compatible servers read only it.
    max_completion_tokens: bool,
}

pub(crate) static OPENAI: OpenAi = OpenAi {
    max_completion_tokens: true,
};

pub(crate) static COMPATIBLE: OpenAi = OpenAi {
    max_completion_tokens: false,
};

impl Adapter for OpenAi {
    fn system(&self) -> &'static str {
        "openai"
    }

    fn dialect(&self, _model: &str) -> &'static dyn Dialect {
        &super::CHAT
    }

    fn relays(&self, surface: Surface, credential: &Credential) -> bool {
        match surface {
            Surface::Embeddings => true,
            Surface::Responses => credential.serves_responses(),
            Surface::ChatCompletions | Surface::Messages => false,
        }
    }

    fn refusal(&self, surface: Surface, credential: &Credential) -> String {
        let provider = credential.provider.as_str();
        match (surface, credential.provider) {
            (Surface::Responses, Provider::OpenaiCompatible) => {
                format!("{provider} without responsesAPI: true")
            }
            _ => provider.to_owned(),
        }
    }

    fn defaults(&self) -> Defaults {
        Defaults {
            openai_max_completion_tokens: self.max_completion_tokens,
            ..Defaults::default()
        }
    }

    /// One token asked for the way the API reads it: OpenAI's own as
    /// `max_completion_tokens` (its reasoning models refuse `max_tokens`), compatible
    /// servers as `max_tokens`.
    fn probe(&self) -> ProbeRequest {
        ProbeRequest {
            surface: Surface::ChatCompletions,
            body: match self.max_completion_tokens {
                true => {
                    r#"{"model":"","messages":[{"role":"user","content":"ping"}],"max_completion_tokens":1}"#
                }
                false => super::super::adapter::PROBE_CHAT,
            },
        }
    }

    /// Only a server that declares it (`prefill: true`, openai-compatible only): the
    /// vLLM and SGLang convention. OpenAI's own API has none.
    fn prefill(
        &self,
        body: &Bytes,
        text: &str,
        _model: &str,
        credential: &Credential,
    ) -> Option<Prefilled> {
        credential
            .prefill
            .then(|| super::prefill::prefilled(body, text))
            .flatten()
    }

    fn prepare(
        &self,
        credential: &Credential,
        key: Option<&Secret<String>>,
        _kept: &mut Kept,
    ) -> Result<Prepared, CredentialError> {
        let endpoint = Box::new(SurfaceUrls::new(&credential.base_url, "")?);
        Prepared::keyed(credential, key, endpoint, &[], ("authorization", "Bearer "))
    }
}

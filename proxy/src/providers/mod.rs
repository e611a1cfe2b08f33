//! Everything the proxy knows about each provider, one folder per provider, behind
//! one interface: the request path asks an [`Adapter`] (which API, which body, which
//! headers) and a credential's [`Endpoint`] (which URL, which authorisation), and
//! reads the upstream's wire through its `Dialect`; it never names a provider.
//!
//! | folder | owns |
//! |---|---|
//! | `openai/` | the OpenAI chat completions dialect (a client surface too); `openai` and `openai-compatible` targets (Bearer key) |
//! | `anthropic/` | the Anthropic messages dialect (a client surface too, and its Vertex `rawPredict` form); `anthropic` targets (`x-api-key`) |
//! | `azure/` | `azure-openai` targets: v1 or dated deployment paths, the `api-key` header |
//! | `gemini/` | Google AI's `generateContent` dialect; `gemini` targets (`x-goog-api-key`) |
//! | `bedrock/` | the Converse dialect, ConverseStream's event-stream framing, SigV4; `bedrock` targets |
//! | `vertex/` | `vertex` targets: publishers, paths, the OAuth token exchange |
//! | `translate/` | the pairing of a client's API with an upstream's (requests, answers, errors, streams) |
//! | `form`, `dialect` | the internal form every dialect speaks, and what a dialect is |
//! | `schema` | what each target can express of a client's JSON Schema (structured answers) |
//! | `adapter` | what an adapter and an endpoint are (a prefill that continues an answer included), and the pieces most are made of |
//! | `classify` | every provider's words for failures and Retry-After |
//!
//! Adding a provider is a folder here with its adapter (and a dialect if it speaks
//! a new API) and one line in `adapter()`. Nothing here knows routes, the walk, the
//! gateway's limits or its clients.

pub(crate) mod adapter;
pub(crate) mod anthropic;
pub(crate) mod azure;
pub(crate) mod bedrock;
pub mod classify;
pub(crate) mod dialect;
mod error_body;
pub(crate) mod form;
pub(crate) mod gemini;
pub(crate) mod openai;
mod schema;
pub mod translate;
pub mod vertex;
mod vocab;

use switchback_crds::config::Provider;

pub use adapter::{
    Adapter, Authorising, CredentialError, Endpoint, Exchange, Kept, Prefilled, Prepared,
    ProbeRequest, Unsigned,
};
pub(crate) use dialect::Dialect;
pub(crate) use vocab::media_type_of_url;

/// The adapter of each `provider:` value: the one place a provider is registered.
pub(crate) fn adapter(provider: Provider) -> &'static dyn Adapter {
    match provider {
        Provider::Openai => &openai::adapter::OPENAI,
        Provider::OpenaiCompatible => &openai::adapter::COMPATIBLE,
        Provider::Anthropic => &anthropic::adapter::ANTHROPIC,
        Provider::AzureOpenai => &azure::AZURE,
        Provider::Gemini => &gemini::adapter::GEMINI,
        Provider::Bedrock => &bedrock::adapter::BEDROCK,
        Provider::Vertex => &vertex::VERTEX,
    }
}

#[cfg(test)]
mod tests {
    use switchback_crds::config::Credential;

    use super::*;
    use crate::wire::surface::{Surface, Wire};

    /// What the registered adapters say of a surface, as the surface would.
    trait Served {
        /// The credential speaks the surface natively (relayed, not translated).
        fn served_by(self, credential: &Credential) -> bool;
        fn refusal(self, credential: &Credential) -> String;
    }

    impl Served for Surface {
        fn served_by(self, c: &Credential) -> bool {
            adapter(c.provider)
                .exchange(self, "m", c)
                .is_some_and(|e| !e.translated)
        }

        fn refusal(self, c: &Credential) -> String {
            adapter(c.provider).refusal(self, c)
        }
    }

    fn credential(
        provider: Provider,
        api_version: Option<&str>,
        responses_api: bool,
    ) -> Credential {
        Credential {
            key_rejected_for_ms: 300_000,
            id: switchback_crds::config::ObjectId::new("team-a", "c"),
            provider,
            base_url: "https://llm.example.com/v1".into(),
            headers: Default::default(),
            max_concurrency: None,
            max_queue: None,
            allow_private_network: false,
            secret_ref: switchback_crds::config::SecretKeyRef {
                keys: Vec::new(),
                name: "k".into(),
                key: "apiKey".into(),
            },
            api_version: api_version.map(str::to_owned),
            responses_api,
            prefill: false,
            project: None,
            location: None,
            region: None,
        }
    }

    #[test]
    fn surfaces_map_to_credentials() {
        let c = |p| credential(p, None, false);
        assert!(Surface::ChatCompletions.served_by(&c(Provider::OpenaiCompatible)));
        assert!(!Surface::ChatCompletions.served_by(&c(Provider::Anthropic)));
        assert!(Surface::Messages.served_by(&c(Provider::Anthropic)));
        assert!(!Surface::Messages.served_by(&c(Provider::Openai)));
        for (i, s) in Surface::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
    }

    /// The Responses API: openai, azure-openai on its v1 API, openai-compatible that
    /// declares it; the refusal says why the others cannot.
    #[test]
    fn the_responses_api_is_served_where_the_credential_says() {
        let r = Surface::Responses;
        assert!(r.served_by(&credential(Provider::Openai, None, false)));
        assert!(r.served_by(&credential(Provider::AzureOpenai, None, false)));
        assert!(r.served_by(&credential(Provider::OpenaiCompatible, None, true)));
        let dated = credential(Provider::AzureOpenai, Some("2024-10-21"), false);
        assert!(!r.served_by(&dated));
        assert!(
            r.refusal(&dated).contains("2024-10-21"),
            "{}",
            r.refusal(&dated)
        );
        let undeclared = credential(Provider::OpenaiCompatible, None, false);
        assert!(!r.served_by(&undeclared));
        assert_eq!(
            r.refusal(&undeclared),
            "openai-compatible without responsesAPI: true"
        );
        let anthropic = credential(Provider::Anthropic, None, false);
        assert!(!r.served_by(&anthropic));
        assert_eq!(r.refusal(&anthropic), "anthropic");
        let gemini = credential(Provider::Gemini, None, false);
        assert!(!r.served_by(&gemini));
        assert_eq!(r.refusal(&gemini), "gemini");
        assert_eq!(r.upstream_path(), "/responses");
        assert_eq!(r.wire(), Wire::OpenAi);
    }
}

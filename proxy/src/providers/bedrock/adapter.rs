//! `provider: bedrock`: Converse at `{baseURL}/model/{modelId}/converse` (or
//! `/converse-stream`), `baseURL` the region's runtime endpoint by default; no key
//! header: each request is signed with SigV4 (`sigv4`) from the access key pair,
//! and session token, the whole Secret holds.

use std::time::SystemTime;

use bytes::Bytes;

use switchback_crds::config::{AwsKeys, Credential};
use switchback_crds::secret::Secret;

use super::super::adapter::{
    Adapter, Authorising, CredentialError, Endpoint, Kept, Prefilled, Prepared, Unsigned, headers,
    push_segment,
};
use super::super::dialect::Dialect;
use super::sigv4::Signer;
use crate::observe::reason::Reason;
use crate::wire::surface::Surface;

/// `provider: bedrock`.
pub(crate) struct Bedrock;

pub(crate) static BEDROCK: Bedrock = Bedrock;

impl Adapter for Bedrock {
    fn system(&self) -> &'static str {
        "aws.bedrock"
    }

    fn dialect(&self, _model: &str) -> &'static dyn Dialect {
        &super::CONVERSE
    }

    /// Claude models continue a prefill (trailing whitespace left out); others are
    /// not asked to.
    fn prefill(
        &self,
        body: &Bytes,
        text: &str,
        model: &str,
        _credential: &Credential,
    ) -> Option<Prefilled> {
        super::prefill::is_claude(model)
            .then(|| super::prefill::prefilled(body, text))
            .flatten()
    }

    /// Keys that do not decode leave the target without a key (skipped as
    /// `missingKey`). The secret access key is what an error body could echo.
    fn prepare(
        &self,
        credential: &Credential,
        key: Option<&Secret<String>>,
        _kept: &mut Kept,
    ) -> Result<Prepared, CredentialError> {
        let keys = key.and_then(AwsKeys::decode);
        let region = credential.region.as_deref().unwrap_or("us-east-1");
        let headers = match &keys {
            Some(_) => Some(headers(credential, &[], None)?),
            None => None,
        };
        Ok(Prepared {
            endpoint: Box::new(Converse {
                base: credential.base_url.clone(),
                label: credential.id.to_string(),
                signer: keys.as_ref().map(|k| Signer::new(k, region)),
            }),
            headers,
            secret: match keys {
                Some(k) => Some(k.secret_access_key),
                None => key.cloned(),
            },
        })
    }
}

/// One bedrock credential: its endpoint and its signer.
#[derive(Debug)]
struct Converse {
    base: String,
    /// `namespace/name`, for the log line of a request that could not be signed.
    label: String,
    signer: Option<Signer>,
}

impl Endpoint for Converse {
    /// `{baseURL}/model/{modelId}/converse`, or `/converse-stream`. The model id (a
    /// name such as `anthropic.claude-3-5-sonnet-20240620-v1:0`, an inference
    /// profile, or an ARN with its colons and slashes) is one percent-encoded path
    /// segment.
    fn url(&self, _surface: Surface, model: &str, stream: bool) -> Option<http::Uri> {
        let mut url = String::with_capacity(self.base.len() + model.len() * 3 + 24);
        url.push_str(&self.base);
        url.push_str("/model/");
        push_segment(&mut url, model);
        url.push_str(if stream {
            "/converse-stream"
        } else {
            "/converse"
        });
        url.parse().ok()
    }

    fn url_names_model(&self) -> bool {
        true
    }

    /// SigV4 over the final URL, headers and body, signed now (the signature is
    /// valid for minutes; each retry signs anew).
    fn authorise<'a>(&'a self, request: Unsigned<'a>) -> Authorising<'a> {
        let Some(signer) = &self.signer else {
            return Authorising::Done(Err(Reason::MissingKey));
        };
        let signed = signer.sign(
            request.uri,
            request.headers,
            request.body,
            SystemTime::now(),
        );
        Authorising::Done(signed.map_err(|e| {
            tracing::debug!(target = %self.label, error = %e, "request not signed");
            Reason::UnsupportedParameter
        }))
    }
}

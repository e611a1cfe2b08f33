//! SigV4 for bedrock targets: each upstream request is signed (service `bedrock`,
//! the credential's region) with the access key pair, and session token, from the
//! credential's Secret, by the `aws-sigv4` crate. Signed: `host`, `content-type`,
//! `x-amz-date`, and `x-amz-security-token` when there is a session token; the
//! body's SHA-256 is part of the signature.
//!
//! The keys live in [`Signer`] only; its `Debug` shows none of them, and the headers
//! it adds are marked sensitive (never logged by hyper or the proxy).

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use http::{HeaderMap, HeaderName, HeaderValue, Uri, header};
use switchback_crds::config::AwsKeys;

/// The SigV4 service name of Bedrock's runtime API.
pub const SERVICE: &str = "bedrock";

/// Signs requests for one bedrock credential.
pub struct Signer {
    identity: Identity,
    region: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// Why a request could not be signed (a URL without a host; nothing secret in it).
#[derive(Debug, thiserror::Error)]
#[error("the request cannot be signed: {0}")]
pub struct SignError(String);

impl Signer {
    pub fn new(keys: &AwsKeys, region: &str) -> Self {
        let credentials = Credentials::new(
            keys.access_key_id.expose(),
            keys.secret_access_key.expose(),
            keys.session_token.as_ref().map(|t| t.expose().clone()),
            None,
            "switchback-credential",
        );
        Self {
            identity: credentials.into(),
            region: region.to_string(),
        }
    }

    /// Adds `host`, `x-amz-date`, `authorization` (and `x-amz-security-token`) to
    /// `headers` for a POST of `body` to `uri`, signed at `time`.
    pub fn sign(
        &self,
        uri: &Uri,
        headers: &mut HeaderMap,
        body: &[u8],
        time: SystemTime,
    ) -> Result<(), SignError> {
        let authority = uri.authority().ok_or_else(|| SignError("no host".into()))?;
        // The host as hyper will send it (the port only when not the scheme's own),
        // set here so the signed value and the sent one are one.
        let default_port = match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        };
        let host = match authority.port_u16() {
            Some(p) if p != default_port => authority.as_str().to_string(),
            _ => authority.host().to_string(),
        };
        let host_value = HeaderValue::from_str(&host).map_err(|e| SignError(e.to_string()))?;
        headers.insert(header::HOST, host_value);
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_string();
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name(SERVICE)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| SignError(e.to_string()))?
            .into();
        let uri_text = uri.to_string();
        let signable = SignableRequest::new(
            "POST",
            &uri_text,
            [
                ("host", host.as_str()),
                ("content-type", content_type.as_str()),
            ]
            .into_iter(),
            SignableBody::Bytes(body),
        )
        .map_err(|e| SignError(e.to_string()))?;
        let (instructions, _) = sign(signable, &params)
            .map_err(|e| SignError(e.to_string()))?
            .into_parts();
        let (added, _) = instructions.into_parts();
        for h in added {
            let name = HeaderName::from_static(h.name());
            let mut value =
                HeaderValue::from_str(h.value()).map_err(|e| SignError(e.to_string()))?;
            value.set_sensitive(h.sensitive() || name == header::AUTHORIZATION);
            headers.insert(name, value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchback_crds::secret::Secret;

    fn keys(token: Option<&str>) -> AwsKeys {
        AwsKeys {
            access_key_id: Secret::new("AKIDEXAMPLE".into()),
            secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into()),
            session_token: token.map(|t| Secret::new(t.into())),
        }
    }

    #[test]
    fn signs_host_content_type_date_and_token() {
        let uri: Uri = "http://127.0.0.1:4000/model/anthropic.claude-3%3A0/converse"
            .parse()
            .unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        Signer::new(&keys(Some("TOKEN")), "us-east-1")
            .sign(&uri, &mut h, b"{}", t)
            .unwrap();
        assert_eq!(h["host"], "127.0.0.1:4000");
        assert_eq!(h["x-amz-date"], "20270115T080000Z");
        assert_eq!(h["x-amz-security-token"], "TOKEN");
        let auth = h["authorization"].to_str().unwrap();
        assert!(
            auth.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20270115/us-east-1/bedrock/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, Signature="
            ),
            "{auth}"
        );
        assert!(h["authorization"].is_sensitive());
        let debug = format!("{:?}", Signer::new(&keys(Some("TOKEN")), "us-east-1"));
        assert!(
            !debug.contains("wJalr") && !debug.contains("TOKEN"),
            "{debug}"
        );
    }
}

//! A Google Cloud service-account JSON key (vertex credentials): the fields the
//! proxy needs to sign its OAuth token request. Parsed once at compile time, to
//! refuse an unusable key with a message naming the field, and again by the proxy.
//!
//! No error message ever quotes the key's content: only field names.

use serde::Deserialize;

use crate::secret::Secret;

/// The parts of a service-account key the JWT bearer grant uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccount {
    /// The JWT's `iss` (not secret, but not printed in messages either).
    pub client_email: String,
    /// PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), as Google issues it.
    pub private_key: Secret<String>,
    /// Where the assertion is exchanged, and the JWT's `aud`.
    pub token_uri: String,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    token_uri: Option<String>,
}

const PEM_BEGIN: &str = "-----BEGIN PRIVATE KEY-----";
const PEM_END: &str = "-----END PRIVATE KEY-----";

impl ServiceAccount {
    /// Parses a service-account JSON key; the error names what is wrong (a field),
    /// never what the key holds.
    pub fn parse(text: &str) -> Result<Self, String> {
        // serde_json's error would quote the input near the fault: not used.
        let raw: Raw = serde_json::from_str(text)
            .map_err(|_| "is not a JSON object (a service-account key file)".to_string())?;
        if let Some(kind) = raw.kind.as_deref()
            && kind != "service_account"
        {
            return Err("type is not service_account".into());
        }
        let client_email = raw
            .client_email
            .filter(|e| e.contains('@'))
            .ok_or("client_email is missing or not an email address")?;
        let private_key = raw
            .private_key
            .filter(|k| k.trim_start().starts_with(PEM_BEGIN) && k.contains(PEM_END))
            .ok_or("private_key is missing or not a PKCS#8 PEM key (BEGIN PRIVATE KEY)")?;
        let token_uri = raw
            .token_uri
            .filter(|u| u.starts_with("https://") || u.starts_with("http://"))
            .ok_or("token_uri is missing or not an http(s) URL")?;
        url::Url::parse(&token_uri).map_err(|_| "token_uri is not a valid URL".to_string())?;
        Ok(Self {
            client_email,
            private_key: Secret::new(private_key),
            token_uri,
        })
    }

    /// The DER bytes of the PEM private key.
    pub fn private_key_der(&self) -> Result<Vec<u8>, String> {
        let pem = self.private_key.expose();
        let body = pem
            .split(PEM_BEGIN)
            .nth(1)
            .and_then(|rest| rest.split(PEM_END).next())
            .ok_or("private_key is not a PEM key")?;
        let b64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| "private_key is not valid base64 PEM".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(private_key: &str) -> String {
        serde_json::json!({
            "type": "service_account",
            "client_email": "gw@proj.iam.gserviceaccount.com",
            "private_key": private_key,
            "token_uri": "https://oauth2.googleapis.com/token",
        })
        .to_string()
    }

    #[test]
    fn parses_a_key_and_decodes_its_pem() {
        let sa = ServiceAccount::parse(&key(
            "-----BEGIN PRIVATE KEY-----\nAAECAw==\n-----END PRIVATE KEY-----\n",
        ))
        .unwrap();
        assert_eq!(sa.client_email, "gw@proj.iam.gserviceaccount.com");
        assert_eq!(sa.token_uri, "https://oauth2.googleapis.com/token");
        assert_eq!(sa.private_key_der().unwrap(), vec![0, 1, 2, 3]);
        assert!(!format!("{sa:?}").contains("AAEC"));
    }

    #[test]
    fn errors_name_the_field_never_the_content() {
        let secret = "-----BEGIN RSA PRIVATE KEY-----\nSECRETSTUFF\n-----END RSA PRIVATE KEY-----";
        let err = ServiceAccount::parse(&key(secret)).unwrap_err();
        assert!(err.starts_with("private_key is missing"), "{err}");
        assert!(!err.contains("SECRETSTUFF"));
        let err = ServiceAccount::parse("{\"private_key\": \"SECRETSTUFF\"").unwrap_err();
        assert!(!err.contains("SECRETSTUFF"), "{err}");
        let err = ServiceAccount::parse("{}").unwrap_err();
        assert!(err.starts_with("client_email"), "{err}");
    }
}

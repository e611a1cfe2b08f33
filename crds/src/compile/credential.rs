//! ProviderCredential → [`Credential`]: provider, base URL (with the private-network
//! guard, and the platform's say on `allowPrivateNetwork`), static headers (never one
//! that carries a key), concurrency limits, and the key from its Secret (for
//! vertex: its project, location and service-account JSON key; for bedrock: its region
//! and the access key pair read from the whole Secret).
//!
//! A missing Secret or key does not reject the credential: it is kept with a Warning
//! and no key, so routes keep their other targets and pick this one up as soon as the
//! Secret appears.

use std::collections::BTreeMap;

use crate::compile::fields::{self, Checker};
use crate::compile::{Diagnostic, Kind, SecretIndex, Severity, reason};
use crate::config::{
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AwsKeys, Credential, KeyPool,
    ObjectId, Provider, SecretKeyRef, VERTEX_SERVICE_ACCOUNT_KEY, bedrock_base_url,
    vertex_base_url,
};
use crate::credential::ProviderCredentialSpec;
use crate::network::{self, PrivateNetworks};
use crate::schema::{MAX_HEADER_VALUE_LEN, MAX_HEADERS, MAX_NAME_LEN, MAX_POOL_KEYS, MAX_URL_LEN};
use crate::secret::Secret;
use crate::service_account::ServiceAccount;

/// What routes need to know about one credential.
pub(crate) struct Outcome {
    /// `None` when the credential was rejected.
    pub(crate) credential: Option<Credential>,
    pub(crate) key: Option<Secret<String>>,
    /// Why a kept credential has no key (its Warning's text).
    pub(crate) key_problem: Option<String>,
    /// A pool that serves without some of its keys: the first one missing, with its
    /// field.
    pub(crate) pool_problem: Option<String>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

impl Outcome {
    /// The first error, quoted by routes that reference a rejected credential.
    pub(crate) fn first_error(&self) -> Option<&Diagnostic> {
        self.diagnostics
            .iter()
            .find(|d| d.severity == Severity::Error)
    }

    /// The platform's refusal of `allowPrivateNetwork`, when the credential got one.
    pub(crate) fn policy_refusal(&self) -> Option<&Diagnostic> {
        self.diagnostics
            .iter()
            .find(|d| d.reason == reason::PRIVATE_NETWORK_NOT_ALLOWED)
    }
}

const PROVIDERS: [(&str, Provider); 7] = [
    ("openai", Provider::Openai),
    ("anthropic", Provider::Anthropic),
    ("openai-compatible", Provider::OpenaiCompatible),
    ("azure-openai", Provider::AzureOpenai),
    ("gemini", Provider::Gemini),
    ("vertex", Provider::Vertex),
    ("bedrock", Provider::Bedrock),
];

/// `apiVersion` that selects Azure's v1 API (also the default).
const AZURE_V1: &str = "v1";

/// Header names that carry a key or a session, refused in `headers` by name, case
/// insensitively (docs/security.md#keys-stay-in-secrets): keys come from the Secret, while
/// static headers are rendered into the ConfigMap and shown on the proxies'
/// `/admin/v1/config`. These names exactly...
const KEY_HEADERS: [&str; 3] = ["authorization", "proxy-authorization", "cookie"];
/// ...and every name holding one of these (`x-api-key`, `api-key`, `x-goog-api-key`,
/// `x-amz-security-token`, `ocp-apim-subscription-key`, `x-client-secret`, ...).
const KEY_HEADER_PARTS: [&str; 7] = [
    "api-key",
    "api_key",
    "apikey",
    "token",
    "secret",
    "password",
    "subscription-key",
];

/// Whether a static header named `name` would carry a key. The CRD says the same in
/// CEL ([`crate::schema::KEY_HEADER_RULE`]; `crate::cel_parity` keeps them in step).
fn is_key_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    KEY_HEADERS.contains(&lower.as_str()) || KEY_HEADER_PARTS.iter().any(|p| lower.contains(p))
}
/// Header names the proxy's HTTP client owns: setting them would break framing.
const TRANSPORT_HEADERS: [&str; 7] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "upgrade",
];

pub(crate) fn compile(
    id: &ObjectId,
    spec: &ProviderCredentialSpec,
    secrets: &SecretIndex,
    private_networks: &PrivateNetworks,
) -> Outcome {
    let mut c = Checker::new(Kind::ProviderCredential, id);

    let provider = fields::one_of(&mut c, "spec.provider", &spec.provider, &PROVIDERS);
    // A refused allowPrivateNetwork rejects the credential; its hosts are still judged
    // as if allowed, so that the one error names the one thing to change.
    let allow_private_network = spec.allow_private_network.unwrap_or(false);
    if allow_private_network && !private_networks.allows(&id.namespace) {
        c.error(
            reason::PRIVATE_NETWORK_NOT_ALLOWED,
            "spec.allowPrivateNetwork",
            format!(
                "true is not allowed in namespace {}: private networks are the platform's \
                 decision, and this namespace is not among the operator's \
                 --allow-private-network-namespaces (chart value \
                 egress.allowPrivateNetworkNamespaces); nothing is sent to this credential",
                id.namespace
            ),
        );
    }
    let bedrock = provider == Some(Provider::Bedrock);
    let region = region(&mut c, provider, spec.region.as_deref());
    let (project, location) = vertex_place(&mut c, provider, spec);
    let base_url = match (&spec.base_url, provider) {
        (Some(raw), _) => base_url(&mut c, "spec.baseURL", raw, allow_private_network),
        (None, Some(Provider::Vertex)) => {
            location.as_deref().map(vertex_base_url).unwrap_or_default()
        }
        (None, Some(Provider::Bedrock)) => {
            region.as_deref().map(bedrock_base_url).unwrap_or_default()
        }
        (None, Some(provider)) => match provider.default_base_url() {
            Some(default) => default.to_string(),
            None => {
                c.invalid(
                    "spec.baseURL",
                    format!("is required for provider {}", provider.as_str()),
                );
                String::new()
            }
        },
        (None, None) => String::new(),
    };

    fields::string_len(
        &mut c,
        "spec.secretRef.name",
        &spec.secret_ref.name,
        1,
        MAX_NAME_LEN as usize,
    );
    // vertex takes the whole Secret too: without a key, its `serviceAccount.json`.
    let mut secret_ref = spec.secret_ref.selector();
    if provider == Some(Provider::Vertex) && secret_ref.key.is_empty() {
        secret_ref.key = VERTEX_SERVICE_ACCOUNT_KEY.to_string();
    }
    let pool = key_pool(&mut c, provider, spec);
    if pool.is_some() {
        // Checked in `key_pool`.
    } else if bedrock {
        if !spec.secret_ref.key.is_empty() {
            c.invalid(
                "spec.secretRef.key",
                "provider bedrock takes the whole Secret (accessKeyId, secretAccessKey, optional sessionToken): secretRef.key must not be set",
            );
        }
    } else {
        fields::string_len(
            &mut c,
            "spec.secretRef.key",
            &secret_ref.key,
            1,
            MAX_NAME_LEN as usize,
        );
    }

    let headers = headers(&mut c, spec.headers.as_ref());
    let api_version = api_version(&mut c, provider, spec.api_version.as_deref());
    if spec.responses_api.is_some() && provider.is_some_and(|p| p != Provider::OpenaiCompatible) {
        c.invalid(
            "spec.responsesAPI",
            "is only meaningful for provider openai-compatible (openai and azure-openai serve the Responses API already)",
        );
    }

    if spec.prefill.is_some() && provider.is_some_and(|p| p != Provider::OpenaiCompatible) {
        c.invalid(
            "spec.prefill",
            "is only meaningful for provider openai-compatible (anthropic, and Claude on vertex and bedrock, continue a prefilled answer already)",
        );
    }

    let key_rejected_for_ms = match spec.key_rejected_for.as_deref() {
        Some(text) => {
            let ms = fields::duration_ms(
                &mut c,
                "spec.keyRejectedFor",
                Some(text),
                Credential::DEFAULT_KEY_REJECTED_FOR_MS,
                true,
            );
            if !(MIN_KEY_REJECTED_FOR_MS..=MAX_KEY_REJECTED_FOR_MS).contains(&ms) {
                c.invalid(
                    "spec.keyRejectedFor",
                    format!("{text:?} must be from 1s to 24h"),
                );
            }
            ms
        }
        None => Credential::DEFAULT_KEY_REJECTED_FOR_MS,
    };

    let max_concurrency = spec
        .max_concurrency
        .map(|v| fields::int_in_range(&mut c, "spec.maxConcurrency", Some(v), 1, i32::MAX, 1));
    let max_queue = spec
        .max_queue
        .map(|v| fields::int_in_range(&mut c, "spec.maxQueue", Some(v), 0, i32::MAX, 0));
    if spec.max_queue.is_some() && spec.max_concurrency.is_none() {
        c.invalid("spec.maxQueue", "needs maxConcurrency");
    }

    let (Some(provider), false) = (provider, c.has_errors()) else {
        return Outcome {
            credential: None,
            key: None,
            key_problem: None,
            pool_problem: None,
            diagnostics: c.diagnostics,
        };
    };

    let (namespace, selector, path) = (&id.namespace, &secret_ref, "spec.secretRef");
    let mut pool_problems = Vec::new();
    let found = match (provider, &pool) {
        (_, Some(names)) => {
            let (found, problems) = pool_keys(namespace, &selector.name, names, secrets);
            pool_problems = problems;
            found
        }
        (Provider::Bedrock, None) => {
            aws_keys(namespace, &selector.name, secrets).map(|k| k.encode())
        }
        (Provider::Vertex, None) => {
            vertex_key(namespace, selector, path, secrets, allow_private_network).map(Secret::new)
        }
        (_, None) => super::secret_key(namespace, selector, path, secrets).map(Secret::new),
    };
    let (key, key_problem) = match found {
        Ok(key) => (Some(key), None),
        Err(problem) => {
            c.warning(
                reason::SECRET_KEY_MISSING,
                problem.field,
                problem.message.clone(),
            );
            (None, Some(problem.message))
        }
    };
    // A pool missing some of its keys serves with the others; each missing one is a
    // Warning here, and its routes say so (ResolvedRefs=False).
    let pool_problem = pool_problems
        .first()
        .map(|p| format!("{}: {}", p.field, p.message));
    for problem in pool_problems {
        c.warning(reason::SECRET_KEY_MISSING, problem.field, problem.message);
    }

    Outcome {
        credential: Some(Credential {
            id: id.clone(),
            provider,
            base_url,
            headers,
            max_concurrency,
            max_queue,
            allow_private_network,
            secret_ref: SecretKeyRef {
                name: secret_ref.name,
                key: if pool.is_some() {
                    String::new()
                } else {
                    secret_ref.key
                },
                keys: pool.unwrap_or_default(),
            },
            api_version,
            responses_api: spec.responses_api.unwrap_or(false),
            prefill: spec.prefill.unwrap_or(false),
            project,
            location,
            region,
            key_rejected_for_ms,
        }),
        key,
        key_problem,
        pool_problem,
        diagnostics: c.diagnostics,
    }
}

const MIN_KEY_REJECTED_FOR_MS: u64 = 1_000;
const MAX_KEY_REJECTED_FOR_MS: u64 = 24 * 3_600_000;

/// `spec.secretRef.keys`, a pool (docs/request-lifecycle.md#key-pools): 1 to 32 unique
/// Secret data key names, not with `key`, not for bedrock or vertex (they take the whole
/// Secret; the CRD's CEL rules say the same). `None` when the credential has one key.
fn key_pool(
    c: &mut Checker,
    provider: Option<Provider>,
    spec: &ProviderCredentialSpec,
) -> Option<Vec<String>> {
    let names = spec.secret_ref.keys.as_ref()?;
    let field = "spec.secretRef.keys";
    if !spec.secret_ref.key.is_empty() {
        c.invalid(
            field,
            "secretRef.key (one key) and secretRef.keys (a pool) are mutually exclusive",
        );
    }
    if matches!(provider, Some(Provider::Bedrock | Provider::Vertex)) {
        c.invalid(
            field,
            "providers bedrock and vertex take the whole Secret: secretRef.keys (a key pool) is not supported for them",
        );
    }
    fields::list_len(c, field, names.len(), 1, MAX_POOL_KEYS as usize, "keys");
    let mut seen = std::collections::HashSet::new();
    for (i, name) in names.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if !is_secret_data_key(name) {
            c.invalid(
                &at,
                format!("{name:?} is not a Secret data key name (letters, digits, '-', '_' and '.', at most {MAX_NAME_LEN} characters)"),
            );
        } else if !seen.insert(name.as_str()) {
            c.invalid(&at, format!("{name:?} is listed more than once"));
        }
    }
    Some(names.clone())
}

/// Kubernetes' rule for a Secret data key: `[-._a-zA-Z0-9]+`, at most 253 characters.
fn is_secret_data_key(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN as usize
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
}

/// A pool's keys from Secret `name`, as one [`KeyPool`] entry, and a problem per key
/// the Secret lacks (or holds unusable), each naming its `spec.secretRef.keys[i]` (or
/// `spec.secretRef.name` when the Secret itself is missing): the pool serves with the
/// keys found. With none found it has no key at all (`Err`, the first problem).
fn pool_keys(
    namespace: &str,
    name: &str,
    names: &[String],
    secrets: &SecretIndex,
) -> (
    Result<Secret<String>, super::KeyProblem>,
    Vec<super::KeyProblem>,
) {
    let mut pool = KeyPool::default();
    let mut problems = Vec::new();
    for (i, key) in names.iter().enumerate() {
        let selector = crate::credential::SecretKeySelector {
            name: name.to_string(),
            key: key.clone(),
        };
        match super::secret_key(namespace, &selector, "spec.secretRef", secrets) {
            Ok(value) => {
                pool.0.insert(key.clone(), Secret::new(value));
            }
            // The Secret itself is missing: one problem says so.
            Err(problem) if problem.field.ends_with(".name") => {
                return (Err(problem), Vec::new());
            }
            // `secret_key` names `.key`; a pool's key is `.keys[i]`.
            Err(problem) => problems.push(super::KeyProblem {
                field: format!("spec.secretRef.keys[{i}]"),
                message: problem.message,
            }),
        }
    }
    if pool.0.is_empty() {
        let mut problems = problems.into_iter();
        let first = problems.next().unwrap_or(super::KeyProblem {
            field: "spec.secretRef.keys".to_string(),
            message: "the pool names no key".to_string(),
        });
        return (Err(first), problems.collect());
    }
    (Ok(pool.encode()), problems)
}

/// `spec.project` and `spec.location`: required for vertex, refused elsewhere (the
/// CRD's CEL rules and patterns say the same).
fn vertex_place(
    c: &mut Checker,
    provider: Option<Provider>,
    spec: &ProviderCredentialSpec,
) -> (Option<String>, Option<String>) {
    let vertex = provider == Some(Provider::Vertex);
    let mut field = |name: &str, raw: Option<&String>, valid: fn(&str) -> bool, what: &str| {
        let path = format!("spec.{name}");
        match raw {
            None if vertex => {
                c.invalid(&path, "is required for provider vertex");
                None
            }
            None => None,
            Some(_) if !vertex => {
                if provider.is_some() {
                    c.invalid(&path, "is only meaningful for provider vertex");
                }
                None
            }
            Some(v) if !valid(v) => {
                c.invalid(&path, format!("{v:?} is not {what}"));
                None
            }
            Some(v) => Some(v.clone()),
        }
    };
    let project = field(
        "project",
        spec.project.as_ref(),
        is_project_id,
        "a Google Cloud project ID (6 to 30 lowercase letters, digits and hyphens, starting with a letter)",
    );
    let location = field(
        "location",
        spec.location.as_ref(),
        is_location,
        "a Vertex AI location such as us-east5 or global",
    );
    (project, location)
}

/// `^[a-z][a-z0-9-]{4,28}[a-z0-9]$`, the schema's pattern.
fn is_project_id(v: &str) -> bool {
    let b = v.as_bytes();
    (6..=30).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || *ch == b'-')
}

/// `^[a-z][a-z0-9-]{0,62}$`, the schema's pattern.
fn is_location(v: &str) -> bool {
    let b = v.as_bytes();
    (1..=63).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || *ch == b'-')
}

/// A vertex credential's key: the whole service-account JSON, which must parse
/// (the problem names the field, never the key's content), and whose `token_uri`
/// is not a private address unless the credential allows private networks (as for
/// `baseURL`: the token is fetched through the credential's own guarded client,
/// whose resolver only sees host names, never IP literals).
fn vertex_key(
    namespace: &str,
    selector: &crate::credential::SecretKeySelector,
    path: &str,
    secrets: &SecretIndex,
    allow_private_network: bool,
) -> Result<String, super::KeyProblem> {
    let text = super::secret_text(namespace, selector, path, secrets)?;
    let checked = ServiceAccount::parse(&text).and_then(|sa| {
        let url = url::Url::parse(&sa.token_uri).map_err(|_| "token_uri is not a valid URL")?;
        match url.host() {
            Some(host) if !allow_private_network && network::is_private_host(&host) => Err(
                format!(
                    "token_uri's host {host} is a loopback, private or link-local address; set spec.allowPrivateNetwork: true to allow it"
                ),
            ),
            Some(_) => Ok(()),
            None => Err("token_uri has no host".to_string()),
        }
    });
    match checked {
        Ok(()) => Ok(text),
        Err(why) => Err(super::KeyProblem {
            field: format!("{path}.key"),
            message: format!(
                "key {:?} of Secret {:?} is not a usable service-account JSON key: {why}",
                selector.key, selector.name
            ),
        }),
    }
}

/// `spec.region`: required for bedrock, refused elsewhere; an AWS region name
/// (`us-east-1`, `eu-central-2`, `us-gov-west-1`), checked without a regex.
fn region(c: &mut Checker, provider: Option<Provider>, raw: Option<&str>) -> Option<String> {
    let field = "spec.region";
    match (provider, raw) {
        (Some(Provider::Bedrock), None) => {
            c.invalid(field, "is required for provider bedrock");
            None
        }
        (Some(Provider::Bedrock), Some(r)) if !is_region(r) => {
            c.invalid(
                field,
                format!("{r:?} is not an AWS region name such as us-east-1"),
            );
            None
        }
        (Some(Provider::Bedrock) | None, Some(r)) => Some(r.to_string()),
        (Some(_), Some(_)) => {
            c.invalid(field, "is only meaningful for provider bedrock");
            None
        }
        (_, None) => None,
    }
}

/// `^[a-z]{2}(-[a-z]+)+-[0-9]+$`, at most 32 characters (the schema's pattern).
fn is_region(r: &str) -> bool {
    let parts: Vec<&str> = r.split('-').collect();
    r.len() <= 32
        && parts.len() >= 3
        && parts[0].len() == 2
        && parts[..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts[parts.len() - 1].bytes().all(|b| b.is_ascii_digit())
        && !parts[parts.len() - 1].is_empty()
}

/// A bedrock credential's keys: the whole Secret `name` (docs/providers.md#bedrock), its
/// `accessKeyId` and `secretAccessKey` required, `sessionToken` optional, each
/// trimmed and checked as [`super::secret_key`] checks one key.
fn aws_keys(
    namespace: &str,
    name: &str,
    secrets: &super::SecretIndex,
) -> Result<AwsKeys, super::KeyProblem> {
    let read = |key: &str| {
        let selector = crate::credential::SecretKeySelector {
            name: name.to_string(),
            key: key.to_string(),
        };
        super::secret_key(namespace, &selector, "spec.secretRef", secrets)
    };
    let access_key_id = Secret::new(read(AWS_ACCESS_KEY_ID)?);
    let secret_access_key = Secret::new(read(AWS_SECRET_ACCESS_KEY)?);
    // Absent is fine (long-term keys); present and unusable is not.
    let has_token = secrets
        .get(&ObjectId::new(namespace, name))
        .is_some_and(|s| s.contains_key(AWS_SESSION_TOKEN));
    let session_token = match has_token {
        true => Some(Secret::new(read(AWS_SESSION_TOKEN)?)),
        false => None,
    };
    Ok(AwsKeys {
        access_key_id,
        secret_access_key,
        session_token,
    })
}

/// `spec.apiVersion`: only for azure-openai; `v1` or absent selects the v1 API
/// (`None`), a dated version the classic deployment paths.
fn api_version(c: &mut Checker, provider: Option<Provider>, raw: Option<&str>) -> Option<String> {
    let raw = raw?;
    let field = "spec.apiVersion";
    if provider.is_some_and(|p| p != Provider::AzureOpenai) {
        c.invalid(field, "is only meaningful for provider azure-openai");
        return None;
    }
    if raw == AZURE_V1 {
        return None;
    }
    if !is_dated_api_version(raw) {
        c.invalid(
            field,
            format!(
                "{raw:?} is not an Azure OpenAI API version: v1, or a date like 2024-10-21 or 2025-04-01-preview"
            ),
        );
        return None;
    }
    Some(raw.to_string())
}

/// `YYYY-MM-DD` or `YYYY-MM-DD-preview` (the schema's pattern, without a regex).
fn is_dated_api_version(v: &str) -> bool {
    let date = v.strip_suffix("-preview").unwrap_or(v);
    let b = date.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, ch)| match i {
            4 | 7 => *ch == b'-',
            _ => ch.is_ascii_digit(),
        })
}

/// An absolute http(s) URL without credentials, query or fragment, whose host is not
/// private unless allowed; returned without its trailing slash.
fn base_url(c: &mut Checker, field: &str, raw: &str, allow_private_network: bool) -> String {
    if !fields::string_len(c, field, raw, 1, MAX_URL_LEN as usize) {
        return String::new();
    }
    let url = match url::Url::parse(raw) {
        Ok(url) => url,
        Err(err) => {
            c.invalid(field, format!("{raw:?} is not a valid URL: {err}"));
            return String::new();
        }
    };
    if url.scheme() != "http" && url.scheme() != "https" {
        c.invalid(field, format!("{raw:?} is not an http or https URL"));
        return String::new();
    }
    if !url.username().is_empty() || url.password().is_some() {
        c.invalid(
            field,
            "must not contain a user name or password; the key comes from the Secret",
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        c.invalid(
            field,
            "must not have a query or fragment; endpoint paths are appended to it",
        );
    }
    match url.host() {
        None => c.invalid(field, format!("{raw:?} has no host")),
        Some(host) if !allow_private_network && network::is_private_host(&host) => c.error(
            reason::PRIVATE_NETWORK,
            field,
            format!(
                "host {host} is a loopback, private or link-local address; set spec.allowPrivateNetwork: true to allow it"
            ),
        ),
        Some(_) => {}
    }
    url.as_str().trim_end_matches('/').to_string()
}

fn headers(
    c: &mut Checker,
    headers: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let Some(headers) = headers else {
        return BTreeMap::new();
    };
    fields::list_len(
        c,
        "spec.headers",
        headers.len(),
        0,
        MAX_HEADERS as usize,
        "headers",
    );
    for (name, value) in headers {
        let field = format!("spec.headers[{name}]");
        let lower = name.to_ascii_lowercase();
        if !is_header_name(name) {
            c.invalid(&field, format!("{name:?} is not a valid HTTP header name"));
        } else if is_key_header(name) {
            c.invalid(
                &field,
                format!(
                    "{name:?} may carry a key, and static headers may not: they are rendered \
                     into a ConfigMap and shown on /admin/v1/config; the key comes from the \
                     Secret (refused names: {})",
                    refused_names()
                ),
            );
        } else if TRANSPORT_HEADERS.contains(&lower.as_str()) {
            c.invalid(
                &field,
                format!("{name:?} is set by the proxy; it cannot be a static header"),
            );
        }
        if value.len() > MAX_HEADER_VALUE_LEN as usize {
            c.invalid(
                &field,
                format!(
                    "value is {} bytes long; the maximum is {MAX_HEADER_VALUE_LEN}",
                    value.len()
                ),
            );
        } else if !fields::is_header_value(value) {
            c.invalid(
                &field,
                "value is not a valid HTTP header value (visible ASCII, spaces and tabs only)",
            );
        }
    }
    headers.clone()
}

/// The refused header names, as the messages and the docs say them.
fn refused_names() -> String {
    format!(
        "{}, and any name containing {}",
        KEY_HEADERS.join(", "),
        KEY_HEADER_PARTS.join(", ")
    )
}

/// RFC 9110 token: the characters an HTTP field name may have.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

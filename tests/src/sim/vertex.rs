//! The strict Vertex AI flavor ([`Flavor::Vertex`](super::Flavor::Vertex)): Google
//! Cloud's OAuth token endpoint and Vertex AI's model endpoints, as the real services
//! take and answer them.
//!
//! **Token endpoint** `POST /token` (the `token_uri` of
//! [`SimProvider::service_account_json`](super::SimProvider::service_account_json)):
//! a form body with `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer` and an
//! `assertion` JWT, verified as Google does: `alg` RS256, the signature against the
//! test service account's public key, `iss` the account's email, `aud` the token URI,
//! `scope` cloud-platform, `exp` in the future and at most an hour after `iat`. A
//! refused grant is 400 `{"error":"invalid_grant","error_description":...}`. A valid
//! one takes the next [`TokenBehavior`] (issue a token good for the configured
//! lifetime, fail with a status, answer garbage, hang). Token requests are counted
//! apart ([`SimProvider::token_requests`](super::SimProvider::token_requests)), not
//! as hits, and take no [`Behavior`](super::Behavior).
//!
//! **Model endpoints**, under `/v1/projects/{project}/locations/{location}/publishers/`
//! (project [`VERTEX_PROJECT`], location [`VERTEX_LOCATION`]), refused before any
//! behaviour is taken (the request is still recorded and counted):
//!
//! * other paths, projects, locations, publishers or methods: 404 in Google's shape;
//! * no `authorization: Bearer`, a token this simulator never issued, or one past
//!   its lifetime (on tokio's clock, so a paused clock expires it): 401
//!   `UNAUTHENTICATED`;
//! * `anthropic/models/{model}:rawPredict` and `:streamRawPredict`: the Anthropic
//!   Messages body with `anthropic_version` [`VERTEX_ANTHROPIC_VERSION`] and without
//!   `model` (the model is in the path), `messages` and `max_tokens` present, and
//!   `stream: true` exactly on `streamRawPredict`: otherwise 400
//!   `invalid_request_error` (Anthropic's shape, as Vertex relays Claude's own
//!   validation);
//! * `google/models/{model}:generateContent` and `:streamGenerateContent?alt=sse`:
//!   the body rules of the Gemini flavor (every content with its `role`).
//!
//! Answers are rendered by the publisher's flavor (Anthropic's messages and SSE,
//! Gemini's `GenerateContentResponse`s and chunks); errors from behaviours (429, 5xx,
//! 401, ...) are Google's `{"error":{"code","message","status"}}`, for both
//! publishers, as Vertex wraps them; in-band stream errors stay the publisher's.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::{KeyPair as _, RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
use axum::body::Body;
use axum::http::{HeaderValue, Method, Response, StatusCode, header};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Value, json};

use super::gemini::{check_body, gemini_error};
use super::{Endpoint, Flavor, anthropic_error, lock};

/// The project every Vertex simulator serves.
pub const VERTEX_PROJECT: &str = "sim-project";
/// The location every Vertex simulator serves.
pub const VERTEX_LOCATION: &str = "us-east5";
/// The test service account's email: the JWT's `iss`.
pub const VERTEX_CLIENT_EMAIL: &str = "switchback@sim-project.iam.gserviceaccount.com";
/// The `anthropic_version` a Claude body must carry.
pub const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";
/// The OAuth scope the JWT must ask for.
pub const VERTEX_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Lifetime (`expires_in`, seconds) of issued tokens until told otherwise: Google's.
pub const VERTEX_TOKEN_LIFETIME: u64 = 3600;
const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// What the token endpoint does with a valid grant.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenBehavior {
    /// 200 with a new access token good for the configured lifetime.
    Issue,
    /// [`TokenBehavior::Issue`] after a wait (tokio timer): exchanges that overlap.
    IssueAfter(Duration),
    /// This status with Google's OAuth error body.
    Status(u16),
    /// 200 whose body is not a token answer (an HTML page).
    NotJson,
    /// Never answers.
    Hang,
}

/// The test service account's key, made once per test process (RSA key generation
/// is slow): its PKCS#8 PEM and its public half.
struct TestKey {
    pem: String,
    public: Vec<u8>,
}

static KEY: LazyLock<TestKey> = LazyLock::new(|| {
    let key = KeyPair::generate(KeySize::Rsa2048).expect("sim: RSA key");
    let der = AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&key).expect("sim: PKCS#8");
    let b64 = STANDARD.encode(der.as_ref());
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    TestKey {
        pem,
        public: key.public_key().as_ref().to_vec(),
    }
});

/// A Vertex simulator's token side.
pub(super) struct VertexState {
    token_uri: String,
    /// Issued tokens and when they expire (tokio's clock).
    tokens: Mutex<HashMap<String, tokio::time::Instant>>,
    queue: Mutex<VecDeque<TokenBehavior>>,
    default: Mutex<TokenBehavior>,
    lifetime: AtomicU64,
    requests: AtomicUsize,
}

impl VertexState {
    pub(super) fn new(addr: std::net::SocketAddr) -> Self {
        Self {
            token_uri: format!("http://{addr}/token"),
            tokens: Mutex::new(HashMap::new()),
            queue: Mutex::new(VecDeque::new()),
            default: Mutex::new(TokenBehavior::Issue),
            lifetime: AtomicU64::new(VERTEX_TOKEN_LIFETIME),
            requests: AtomicUsize::new(0),
        }
    }

    pub(super) fn token_uri(&self) -> &str {
        &self.token_uri
    }

    /// A service-account JSON key file for this simulator.
    pub(super) fn service_account_json(&self) -> String {
        json!({
            "type": "service_account",
            "project_id": VERTEX_PROJECT,
            "private_key_id": "sim-key-1",
            "private_key": KEY.pem,
            "client_email": VERTEX_CLIENT_EMAIL,
            "client_id": "100000000000000000001",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": self.token_uri,
        })
        .to_string()
    }

    pub(super) fn push(&self, b: TokenBehavior) {
        lock(&self.queue).push_back(b);
    }

    pub(super) fn set_default(&self, b: TokenBehavior) {
        *lock(&self.default) = b;
    }

    pub(super) fn set_lifetime(&self, secs: u64) {
        self.lifetime.store(secs, Ordering::Relaxed);
    }

    pub(super) fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    pub(super) fn issued(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.tokens).keys().cloned().collect();
        v.sort();
        v
    }

    /// `POST /token`.
    pub(super) async fn token(
        &self,
        method: &Method,
        headers: &axum::http::HeaderMap,
        body: &[u8],
    ) -> Response<Body> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if method != Method::POST {
            return oauth_error(405, "invalid_request", "POST only");
        }
        let form = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
        if !form {
            return oauth_error(400, "invalid_request", "Invalid content type");
        }
        let fields = parse_form(body);
        if fields.get("grant_type").map(String::as_str) != Some(GRANT_TYPE) {
            return oauth_error(400, "unsupported_grant_type", "Invalid grant_type");
        }
        let Some(assertion) = fields.get("assertion") else {
            return oauth_error(
                400,
                "invalid_request",
                "Missing required parameter: assertion",
            );
        };
        if let Err(why) = self.verify(assertion) {
            return oauth_error(400, "invalid_grant", why);
        }
        let mut behavior = lock(&self.queue)
            .pop_front()
            .unwrap_or_else(|| lock(&self.default).clone());
        if let TokenBehavior::IssueAfter(wait) = behavior {
            tokio::time::sleep(wait).await;
            behavior = TokenBehavior::Issue;
        }
        match behavior {
            TokenBehavior::Issue | TokenBehavior::IssueAfter(_) => {
                let lifetime = self.lifetime.load(Ordering::Relaxed);
                let n = lock(&self.tokens).len() + 1;
                let token = format!("ya29.sim-vertex-token-{n}-{}", self.requests());
                let expires = tokio::time::Instant::now() + Duration::from_secs(lifetime);
                lock(&self.tokens).insert(token.clone(), expires);
                let body = json!({"access_token": token, "expires_in": lifetime,
                    "token_type": "Bearer"});
                json_body(200, &body)
            }
            TokenBehavior::Status(s) => oauth_error(s, "internal_failure", "simulated failure"),
            TokenBehavior::NotJson => Response::builder()
                .status(200)
                .header(header::CONTENT_TYPE, "text/html")
                .body(Body::from("<html><body>Sign in</body></html>"))
                .expect("sim: valid response"),
            TokenBehavior::Hang => std::future::pending().await,
        }
    }

    /// Google's checks of a JWT bearer assertion; the error is its description.
    fn verify(&self, jwt: &str) -> Result<(), &'static str> {
        let parts: Vec<&str> = jwt.split('.').collect();
        let [h, c, s] = parts[..] else {
            return Err(
                "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe",
            );
        };
        let decode = |p: &str| {
            URL_SAFE_NO_PAD
                .decode(p)
                .map_err(|_| "Invalid JWT encoding.")
        };
        let header: Value =
            serde_json::from_slice(&decode(h)?).map_err(|_| "Invalid JWT header.")?;
        if header["alg"] != "RS256" {
            return Err("Invalid JWT: alg must be RS256.");
        }
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &KEY.public)
            .verify(format!("{h}.{c}").as_bytes(), &decode(s)?)
            .map_err(|_| "Invalid JWT Signature.")?;
        let claims: Value =
            serde_json::from_slice(&decode(c)?).map_err(|_| "Invalid JWT payload.")?;
        if claims["iss"] != VERTEX_CLIENT_EMAIL {
            return Err("Invalid JWT: iss is not a known service account.");
        }
        if claims["aud"] != self.token_uri.as_str() {
            return Err("Invalid JWT: aud is not the token URI.");
        }
        let scopes = claims["scope"].as_str().unwrap_or("");
        if !scopes.split(' ').any(|s| s == VERTEX_SCOPE) {
            return Err("Invalid JWT: scope does not include cloud-platform.");
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (Some(iat), Some(exp)) = (claims["iat"].as_u64(), claims["exp"].as_u64()) else {
            return Err("Invalid JWT: iat and exp are required.");
        };
        if exp <= now || iat > now + 60 || exp < iat || exp - iat > 3600 {
            return Err(
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.",
            );
        }
        Ok(())
    }

    /// Is this `authorization` header a live token of ours?
    fn authorised(&self, authorization: Option<&str>) -> bool {
        let Some(token) = authorization.and_then(|v| v.strip_prefix("Bearer ")) else {
            return false;
        };
        lock(&self.tokens)
            .get(token)
            .is_some_and(|expires| tokio::time::Instant::now() < *expires)
    }
}

/// Which model endpoint a request is for, as the rest of the simulator renders it.
pub(super) struct Routed {
    pub endpoint: Endpoint,
    /// The publisher's flavor: how answers are rendered.
    pub render: Flavor,
    pub model: String,
    pub stream: bool,
    pub refusal: Option<(u16, Value)>,
}

/// A model endpoint request: which it is, and the refusal (status, body) Vertex would
/// answer it with, if any. See the module's header.
pub(super) fn route(
    state: &VertexState,
    parts: &axum::http::request::Parts,
    json: Option<&Value>,
) -> Routed {
    let mut r = Routed {
        endpoint: Endpoint::Unknown,
        render: Flavor::Gemini,
        model: String::new(),
        stream: false,
        refusal: None,
    };
    let prefix = format!("/v1/projects/{VERTEX_PROJECT}/locations/{VERTEX_LOCATION}/publishers/");
    let rest = parts
        .uri
        .path()
        .strip_prefix(&prefix)
        .filter(|_| parts.method == Method::POST);
    let query = parts.uri.query().unwrap_or("");
    let found = rest.and_then(|rest| {
        let (publisher, rest) = rest.split_once("/models/")?;
        let (model, method) = rest.rsplit_once(':')?;
        Some((publisher, super::percent_decode(model), method))
    });
    let Some((publisher, model, method)) = found else {
        r.refusal = Some((404, not_found()));
        return r;
    };
    r.model = model;
    match (publisher, method) {
        ("anthropic", "rawPredict") => {
            (r.endpoint, r.render) = (Endpoint::Messages, Flavor::Anthropic)
        }
        ("anthropic", "streamRawPredict") => {
            (r.endpoint, r.render, r.stream) = (Endpoint::Messages, Flavor::Anthropic, true);
        }
        ("google", "generateContent") => r.endpoint = Endpoint::Generate,
        ("google", "streamGenerateContent") if query.split('&').any(|kv| kv == "alt=sse") => {
            (r.endpoint, r.stream) = (Endpoint::Generate, true);
        }
        _ => {
            r.refusal = Some((404, not_found()));
            return r;
        }
    }
    let authorization = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if !state.authorised(authorization) {
        r.refusal = Some((
            401,
            gemini_error(
                401,
                "UNAUTHENTICATED",
                "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.",
            ),
        ));
        return r;
    }
    let Some(body) = json.and_then(Value::as_object) else {
        r.refusal = Some((
            400,
            gemini_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received."),
        ));
        return r;
    };
    r.refusal = if r.render == Flavor::Anthropic {
        let invalid = |m: &str| Some((400, anthropic_error("invalid_request_error", m)));
        if body.contains_key("model") {
            invalid("model: Extra inputs are not permitted")
        } else if body.get("anthropic_version").and_then(Value::as_str)
            != Some(VERTEX_ANTHROPIC_VERSION)
        {
            invalid("anthropic_version: Input should be 'vertex-2023-10-16'")
        } else if !body.get("messages").is_some_and(Value::is_array) {
            invalid("messages: Field required")
        } else if !body.get("max_tokens").is_some_and(Value::is_u64) {
            invalid("max_tokens: Field required")
        } else if body.get("stream").and_then(Value::as_bool).unwrap_or(false) != r.stream {
            invalid(
                "sim: stream must be true on streamRawPredict and absent or false on rawPredict",
            )
        } else {
            None
        }
    } else {
        check_body(body).map(|m| (400, gemini_error(400, "INVALID_ARGUMENT", &m)))
    };
    r
}

/// The error Vertex answers with `status` (its own, Google-shaped, whichever
/// publisher's model was called).
pub fn vertex_error_body(status: u16) -> Value {
    match status {
        429 => json!({"error": {
            "code": 429,
            "message": "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model with base model: sim. Please submit a quota increase request.",
            "status": "RESOURCE_EXHAUSTED"
        }}),
        404 => not_found(),
        s => super::gemini_error_body(s),
    }
}

fn not_found() -> Value {
    gemini_error(404, "NOT_FOUND", "Requested entity was not found.")
}

fn oauth_error(status: u16, error: &str, description: &str) -> Response<Body> {
    json_body(
        status,
        &json!({"error": error, "error_description": description}),
    )
}

fn json_body(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(status).expect("sim: status"))
        .header(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        )
        .body(Body::from(body.to_string()))
        .expect("sim: valid response")
}

/// An `application/x-www-form-urlencoded` body's fields, decoded.
fn parse_form(body: &[u8]) -> HashMap<String, String> {
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let decode = |s: &str| super::percent_decode(&s.replace('+', " "));
            (decode(k), decode(v))
        })
        .collect()
}

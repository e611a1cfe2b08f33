use std::sync::atomic::{AtomicUsize, Ordering};

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::{KeyPair as _, RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};

use base64::Engine as _;

use std::sync::Arc;
use std::time::Duration;

use switchback_crds::service_account::ServiceAccount;

use super::token::*;
use super::*;
use crate::providers::Adapter;

/// A throwaway service-account key, made at test time, and its public half.
fn service_account() -> (ServiceAccount, Vec<u8>) {
    let key = KeyPair::generate(KeySize::Rsa2048).unwrap();
    let der = AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&key).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let pem = format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n");
    let json = serde_json::json!({
        "type": "service_account",
        "client_email": "gw@my-project.iam.gserviceaccount.com",
        "private_key": pem,
        "token_uri": "https://oauth2.googleapis.com/token",
    });
    let sa = ServiceAccount::parse(&json.to_string()).unwrap();
    (sa, key.public_key().as_ref().to_vec())
}

fn base64url_decode(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap()
}

#[test]
fn base64url_matches_rfc_4648_vectors() {
    assert_eq!(base64url(b""), "");
    assert_eq!(base64url(b"f"), "Zg");
    assert_eq!(base64url(b"fo"), "Zm8");
    assert_eq!(base64url(b"foo"), "Zm9v");
    assert_eq!(base64url(b"foobar"), "Zm9vYmFy");
    assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
}

#[test]
fn the_assertion_is_an_rs256_jwt_with_the_grants_claims() {
    let (sa, public) = service_account();
    let signer = Signer::new(&sa).unwrap();
    let jwt = signer.assertion(1_700_000_000).unwrap();
    let parts: Vec<&str> = jwt.expose().split('.').collect();
    assert_eq!(parts.len(), 3);
    let header: serde_json::Value = serde_json::from_slice(&base64url_decode(parts[0])).unwrap();
    assert_eq!(header, serde_json::json!({"alg": "RS256", "typ": "JWT"}));
    let claims: serde_json::Value = serde_json::from_slice(&base64url_decode(parts[1])).unwrap();
    assert_eq!(
        claims,
        serde_json::json!({
            "iss": "gw@my-project.iam.gserviceaccount.com",
            "scope": "https://www.googleapis.com/auth/cloud-platform",
            "aud": "https://oauth2.googleapis.com/token",
            "iat": 1_700_000_000u64,
            "exp": 1_700_003_600u64,
        })
    );
    let signed = format!("{}.{}", parts[0], parts[1]);
    UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &public)
        .verify(signed.as_bytes(), &base64url_decode(parts[2]))
        .expect("signature verifies against the key's public half");
    // Another key's public half does not verify it.
    let (_, other) = service_account();
    assert!(
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &other)
            .verify(signed.as_bytes(), &base64url_decode(parts[2]))
            .is_err()
    );
    let body = signer.form_body(1_700_000_000).unwrap();
    assert!(
        body.expose().starts_with(
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=ey"
        ),
        "form body"
    );
    assert_eq!(format!("{jwt:?} {body}"), "***** *****");
}

#[test]
fn a_key_that_is_not_rsa_pkcs8_is_refused_without_quoting_it() {
    let json = serde_json::json!({
        "client_email": "a@b",
        "private_key": "-----BEGIN PRIVATE KEY-----\nU0VDUkVU\n-----END PRIVATE KEY-----",
        "token_uri": "https://x/",
    });
    let err = Signer::new(&ServiceAccount::parse(&json.to_string()).unwrap()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the service-account key is unusable: private_key is not an RSA PKCS#8 key"
    );
}

#[test]
fn token_answers_parse_and_bad_ones_are_refused() {
    let t = parse_token(br#"{"access_token":"ya29.x","expires_in":3599,"token_type":"Bearer"}"#)
        .unwrap();
    assert_eq!(t.access_token.expose(), "ya29.x");
    assert_eq!(t.expires_in, Duration::from_secs(3599));
    // An absurd lifetime is cut to the cap, not added to an Instant as it is.
    let t = parse_token(br#"{"access_token":"x","expires_in":18446744073709551615}"#).unwrap();
    assert_eq!(t.expires_in, MAX_TOKEN_LIFE);
    for bad in [
        &b"not json"[..],
        br#"{"expires_in":3599}"#,
        br#"{"access_token":"","expires_in":3599}"#,
        br#"{"access_token":"x","expires_in":0}"#,
        br#"{"access_token":"x","expires_in":60,"token_type":"MAC"}"#,
    ] {
        assert_eq!(parse_token(bad).unwrap_err(), TokenError::BadAnswer);
    }
}

fn answer(token: &str, secs: u64) -> Result<Token, TokenError> {
    Ok(Token {
        access_token: Secret::new(token.into()),
        expires_in: Duration::from_secs(secs),
    })
}

/// A cache and an exchange that counts its calls and answers what `next` holds (a
/// token name, or `None` for a 503), after `delay`.
struct Exchanges {
    cache: Arc<TokenCache>,
    calls: Arc<AtomicUsize>,
    next: Arc<std::sync::Mutex<Option<&'static str>>>,
    life: u64,
    delay: Duration,
}

impl Exchanges {
    fn new(life: u64, delay: Duration) -> Self {
        Self {
            cache: Arc::new(TokenCache::default()),
            calls: Arc::new(AtomicUsize::new(0)),
            next: Arc::new(std::sync::Mutex::new(None)),
            life,
            delay,
        }
    }

    fn answer_with(&self, token: Option<&'static str>) {
        *self.next.lock().unwrap() = token;
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    async fn get(&self) -> Result<String, TokenError> {
        let (calls, next, life, delay) =
            (self.calls.clone(), self.next.clone(), self.life, self.delay);
        self.cache
            .token(|| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                let name = *next.lock().unwrap();
                match name {
                    Some(name) => answer(name, life),
                    None => Err(TokenError::Status(503)),
                }
            })
            .await
            .map(|t| t.expose().clone())
    }

    /// Lets a background refresh run to its end (the paused clock advances only
    /// when every task waits).
    async fn settle(&self) {
        tokio::time::sleep(self.delay + Duration::from_millis(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_token_is_reused_then_refreshed_in_the_background_five_minutes_before_expiry() {
    let x = Exchanges::new(3600, Duration::from_secs(1));
    x.answer_with(Some("first"));
    assert_eq!(x.get().await.unwrap(), "first");
    x.answer_with(Some("second"));
    // The token was stored when its exchange ended, 1 s in.
    tokio::time::advance(Duration::from_secs(3600 - 300 - 1)).await;
    assert_eq!(x.get().await.unwrap(), "first", "still fresh");
    assert_eq!(x.calls(), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    // Due: the old token answers at once, without waiting for the exchange it started.
    let before = tokio::time::Instant::now();
    assert_eq!(x.get().await.unwrap(), "first");
    assert_eq!(x.get().await.unwrap(), "first");
    assert_eq!(tokio::time::Instant::now(), before, "nobody waited");
    x.settle().await;
    assert_eq!(
        x.calls(),
        2,
        "one background exchange however many saw it due"
    );
    assert_eq!(x.get().await.unwrap(), "second");
    assert_eq!(x.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failed_background_refresh_keeps_the_token_until_it_expires_and_is_retried() {
    let x = Exchanges::new(3600, Duration::ZERO);
    x.answer_with(Some("first"));
    assert_eq!(x.get().await.unwrap(), "first");
    x.answer_with(None);
    tokio::time::advance(Duration::from_secs(3600 - 300)).await;
    assert_eq!(x.get().await.unwrap(), "first");
    x.settle().await;
    assert_eq!(x.calls(), 2);
    // Not tried again on every request: REFRESH_RETRY later.
    assert_eq!(x.get().await.unwrap(), "first");
    x.settle().await;
    assert_eq!(x.calls(), 2);
    tokio::time::advance(REFRESH_RETRY).await;
    assert_eq!(x.get().await.unwrap(), "first");
    x.settle().await;
    assert_eq!(x.calls(), 3);
    // Past its expiry the token is not used: a failed exchange is the caller's error.
    tokio::time::advance(Duration::from_secs(300)).await;
    let err = x.get().await.unwrap_err();
    assert_eq!(err.to_string(), "the token endpoint answered 503");
    x.answer_with(Some("second"));
    assert_eq!(x.get().await.unwrap(), "second");
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_share_one_exchange() {
    let x = Arc::new(Exchanges::new(3600, Duration::from_millis(200)));
    x.answer_with(Some("shared"));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let x = x.clone();
            tokio::spawn(async move { x.get().await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), "shared");
    }
    assert_eq!(x.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_exchange_caches_nothing_and_the_next_request_tries_again() {
    let x = Exchanges::new(3600, Duration::ZERO);
    let err = x.get().await.unwrap_err();
    assert_eq!(err.to_string(), "the token endpoint answered 503");
    x.answer_with(Some("later"));
    assert_eq!(x.get().await.unwrap(), "later");
    assert_eq!(x.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_short_lived_token_is_refreshed_at_half_its_life() {
    let x = Exchanges::new(60, Duration::ZERO);
    x.answer_with(Some("short"));
    assert_eq!(x.get().await.unwrap(), "short");
    x.answer_with(Some("next"));
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(x.get().await.unwrap(), "short", "still fresh");
    x.settle().await;
    assert_eq!(x.calls(), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        x.get().await.unwrap(),
        "short",
        "due: served while refreshed"
    );
    x.settle().await;
    assert_eq!(x.get().await.unwrap(), "next");
    assert_eq!(x.calls(), 2);
}

fn credential(location: &str, base_url: &str) -> Credential {
    use switchback_crds::config::{ObjectId, Provider, SecretKeyRef};
    Credential {
        key_rejected_for_ms: 300_000,
        id: ObjectId::new("team-a", "vtx"),
        provider: Provider::Vertex,
        base_url: base_url.into(),
        headers: Default::default(),
        max_concurrency: None,
        max_queue: None,
        allow_private_network: false,
        secret_ref: SecretKeyRef {
            keys: Vec::new(),
            name: "sa".into(),
            key: "serviceAccount.json".into(),
        },
        api_version: None,
        responses_api: false,
        prefill: false,
        project: Some("my-project".into()),
        location: Some(location.into()),
        region: None,
    }
}

#[test]
fn urls_follow_the_models_publisher() {
    let c = credential(
        "us-east5",
        &switchback_crds::config::vertex_base_url("us-east5"),
    );
    let base = "https://us-east5-aiplatform.googleapis.com/v1/projects/my-project/locations/us-east5/publishers";
    let url = |m, s| url(&c, m, s).unwrap().to_string();
    assert_eq!(
        url("claude-sonnet-4-5@20250929", false),
        format!("{base}/anthropic/models/claude-sonnet-4-5@20250929:rawPredict")
    );
    assert_eq!(
        url("claude-haiku-4-5", true),
        format!("{base}/anthropic/models/claude-haiku-4-5:streamRawPredict")
    );
    assert_eq!(
        url("gemini-2.5-flash", false),
        format!("{base}/google/models/gemini-2.5-flash:generateContent")
    );
    assert_eq!(
        url("gemini-2.5-flash", true),
        format!("{base}/google/models/gemini-2.5-flash:streamGenerateContent?alt=sse")
    );
    // A name that is not one path segment is encoded as one.
    assert_eq!(
        url("a/b c", false),
        format!("{base}/google/models/a%2Fb%20c:generateContent")
    );
    let global = credential(
        "global",
        &switchback_crds::config::vertex_base_url("global"),
    );
    assert_eq!(
        super::url(&global, "gemini-2.5-pro", false)
            .unwrap()
            .to_string(),
        "https://aiplatform.googleapis.com/v1/projects/my-project/locations/global/publishers/google/models/gemini-2.5-pro:generateContent"
    );
}

/// The translation a vertex target needs for `surface` and `model`, by name.
fn direction(
    surface: crate::wire::surface::Surface,
    model: &str,
) -> Option<crate::providers::translate::Direction> {
    use crate::providers::translate::Direction;
    let c = credential("us-east5", "https://vertex.example");
    let exchange = VERTEX.exchange(surface, model, &c)?;
    let upstream = exchange.dialect.target().name;
    [
        Direction::OpenAiToAnthropic,
        Direction::OpenAiToGemini,
        Direction::AnthropicToGemini,
    ]
    .into_iter()
    .find(|d| {
        exchange.translated
            && d.client_wire() == surface.wire()
            && d.translation().upstream().target().name == upstream
    })
}

/// Whether a vertex target serves `surface` at all.
fn serves(surface: crate::wire::surface::Surface) -> bool {
    let c = credential("us-east5", "https://vertex.example");
    VERTEX.exchange(surface, "gemini-2.5-pro", &c).is_some()
}

#[test]
fn each_surface_gets_its_publishers_wire() {
    use crate::providers::translate::Direction;
    use crate::wire::surface::Surface;
    assert_eq!(
        direction(Surface::ChatCompletions, "claude-opus-4-1"),
        Some(Direction::OpenAiToAnthropic)
    );
    assert_eq!(direction(Surface::Messages, "claude-opus-4-1"), None);
    assert_eq!(
        direction(Surface::ChatCompletions, "gemini-2.5-pro"),
        Some(Direction::OpenAiToGemini)
    );
    assert_eq!(
        direction(Surface::Messages, "gemini-2.5-pro"),
        Some(Direction::AnthropicToGemini)
    );
    assert!(serves(Surface::Messages) && serves(Surface::ChatCompletions));
    assert!(!serves(Surface::Embeddings) && !serves(Surface::Responses));
}

#[test]
fn a_claude_body_loses_its_model_and_gains_the_vertex_version() {
    let body = anthropic_body(
        br#"{"model":"claude","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"metadata":{"model":"kept"}}"#,
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"anthropic_version": "vertex-2023-10-16", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}], "metadata": {"model": "kept"}})
    );
    assert!(anthropic_body(b"[1]").is_none());
    // The translated body of an OpenAI client, the same way.
    let out = crate::providers::translate::request(
        crate::providers::translate::Direction::OpenAiToAnthropic,
        br#"{"model":"smart","messages":[{"role":"user","content":"hi"}]}"#,
        "claude-haiku-4-5",
        &crate::providers::translate::Defaults {
            anthropic_on_vertex: true,
            ..Default::default()
        },
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert!(v.get("model").is_none(), "{v}");
    assert_eq!(v["anthropic_version"], "vertex-2023-10-16");
    assert_eq!(v["max_tokens"], 4096);
}

#[test]
fn google_shaped_errors_reach_anthropic_clients_in_anthropics_shape() {
    let quota = br#"{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model","status":"RESOURCE_EXHAUSTED"}}"#;
    let out = anthropic_error(429, quota).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Quota exceeded")
    );
    let denied =
        br#"{"error":{"code":403,"message":"Permission denied","status":"PERMISSION_DENIED"}}"#;
    let v: serde_json::Value =
        serde_json::from_slice(&anthropic_error(403, denied).unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "permission_error");
    // Claude's own errors are Anthropic's already: relayed as they are.
    let overloaded =
        br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    assert!(anthropic_error(529, overloaded).is_none());
}

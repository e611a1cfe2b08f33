//! Client authentication and tenancy on the data port (docs/tenancy.md#modes), standalone: 401 in
//! each surface's shape, keys from `Authorization: Bearer` and `x-api-key`, model
//! names resolved among the routes a client may call, `sharedWith`, `--auth off`, and
//! the client's key never reaching a provider.

use serde_json::Value;
use switchback_proxy::config::keys::AuthMode;
use switchback_tests::harness::{TestProxy, chat_body, header, json_of, messages_body};
use switchback_tests::sim::{Flavor, SimProvider};

const A_KEY: &str = "sk-team-a-app-0123456789";
const B_KEY: &str = "sk-team-b-app-0123456789";
const B_DEFAULT_KEY: &str = "sk-team-b-default-0123456789";

fn credential(ns: &str, name: &str, base_url: &str, key: &str) -> String {
    format!(
        "---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: {{ name: {name}, namespace: {ns} }}
spec:
  provider: openai
  baseURL: {base_url}
  secretRef: {{ name: {name}-key, key: apiKey }}
  allowPrivateNetwork: true
---
apiVersion: v1
kind: Secret
metadata: {{ name: {name}-key, namespace: {ns} }}
stringData: {{ apiKey: {key} }}
"
    )
}

fn route(ns: &str, name: &str, extra: &str, credential: &str) -> String {
    format!(
        "---
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: {{ name: {name}, namespace: {ns} }}
spec:
{extra}  targets:
    - credentialRef: {{ name: {credential} }}
"
    )
}

fn client(ns: &str, name: &str, key: &str, routes: Option<&str>) -> String {
    let routes = routes.map_or(String::new(), |r| format!("  routes: {r}\n"));
    format!(
        "---
apiVersion: v1
kind: Secret
metadata: {{ name: {name}-llm, namespace: {ns} }}
stringData: {{ apiKey: \"{key}\" }}
---
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: {{ name: {name}, namespace: {ns} }}
spec:
  keySecretRef: {{ name: {name}-llm, key: apiKey }}
{routes}"
    )
}

/// team-a: `smart`, `private` and `shared` (offered to team-b); team-b: its own
/// `smart`. Clients: team-a/app (every team-a route), team-b/app (its `smart` and
/// team-a's `shared`, and team-a's `private`, which is not offered to it),
/// team-b/default (every team-b route).
struct Teams {
    a: SimProvider,
    b: SimProvider,
    manifests: String,
}

async fn teams() -> Teams {
    let a = SimProvider::start_named("provider-a", Flavor::OpenAi).await;
    let b = SimProvider::start_named("provider-b", Flavor::OpenAi).await;
    let manifests = [
        credential("team-a", "openai-a", &a.base_url(), "sk-provider-a"),
        credential("team-b", "openai-b", &b.base_url(), "sk-provider-b"),
        route("team-a", "smart", "", "openai-a"),
        route("team-a", "private", "", "openai-a"),
        route(
            "team-a",
            "shared",
            "  models: [shared-model]\n  sharedWith: [team-b]\n",
            "openai-a",
        ),
        route("team-b", "smart", "", "openai-b"),
        client("team-a", "app", A_KEY, None),
        client(
            "team-b",
            "app",
            B_KEY,
            Some("[smart, team-a/shared, team-a/private]"),
        ),
        client("team-b", "default", B_DEFAULT_KEY, None),
    ]
    .concat();
    Teams { a, b, manifests }
}

async fn chat_as(proxy: &TestProxy, key: &str, model: &str) -> reqwest::Response {
    proxy
        .http
        .post(proxy.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat_body(model, false))
        .send()
        .await
        .expect("proxy answers")
}

#[tokio::test]
async fn missing_or_unknown_keys_get_401_in_each_surfaces_shape() {
    let t = teams().await;
    // No --auth: the manifests hold LLMClients, so authentication is required.
    let proxy = TestProxy::start(&t.manifests).await;

    let missing_openai = proxy.chat("smart", false).await;
    assert_eq!(missing_openai.status(), 401);
    assert_eq!(header(&missing_openai, "www-authenticate"), "Bearer");
    // No route was chosen: the generation is the config's (its first load).
    assert_eq!(header(&missing_openai, "x-switchback-generation"), "1");
    let body = json_of(missing_openai).await;
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no API key")
    );

    let missing_anthropic = proxy.messages("smart", false).await;
    assert_eq!(missing_anthropic.status(), 401);
    let body = json_of(missing_anthropic).await;
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");

    // Unknown keys, through each header and surface.
    let unknown = "sk-nobody-0123456789";
    for (path, body, bearer) in [
        ("/v1/chat/completions", chat_body("smart", false), true),
        ("/v1/chat/completions", chat_body("smart", false), false),
        ("/v1/messages", messages_body("smart", false), true),
        ("/v1/messages", messages_body("smart", false), false),
    ] {
        let req = proxy.http.post(proxy.url(path)).json(&body);
        let req = if bearer {
            req.bearer_auth(unknown)
        } else {
            req.header("x-api-key", unknown)
        };
        let r = req.send().await.expect("proxy answers");
        assert_eq!(r.status(), 401, "{path} bearer={bearer}");
        let v = json_of(r).await;
        let message = if path == "/v1/messages" {
            assert_eq!(v["error"]["type"], "authentication_error", "{v}");
            &v["error"]["message"]
        } else {
            assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
            &v["error"]["message"]
        };
        assert!(
            message.as_str().unwrap().contains("not the key of any"),
            "{v}"
        );
    }
    // A Basic header is no key.
    let r = proxy
        .http
        .post(proxy.url("/v1/chat/completions"))
        .basic_auth("user", Some(A_KEY))
        .json(&chat_body("smart", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    let r = proxy
        .http
        .get(proxy.url("/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "/v1/models needs a key too");
    assert_eq!(header(&r, "x-switchback-generation"), "1");
    assert!(r.headers().contains_key("x-request-id"));
    assert_eq!(t.a.hits() + t.b.hits(), 0, "nothing went upstream");
}

#[tokio::test]
async fn both_headers_authenticate_and_the_clients_key_never_reaches_a_provider() {
    let t = teams().await;
    let proxy = TestProxy::start(&t.manifests).await;

    let r = chat_as(&proxy, A_KEY, "smart").await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-route"), "team-a/smart");

    let r = proxy
        .http
        .post(proxy.url("/v1/messages"))
        .header("x-api-key", A_KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&messages_body("smart", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-route"), "team-a/smart");

    let got = t.a.received();
    assert_eq!(got.len(), 2);
    for rec in &got {
        assert_eq!(rec.header("authorization"), Some("Bearer sk-provider-a"));
        assert_eq!(rec.header("x-api-key"), None);
        for (name, value) in &rec.headers {
            assert!(
                !String::from_utf8_lossy(value.as_bytes()).contains(A_KEY),
                "the client's key reached the provider in {name}"
            );
        }
        assert!(!String::from_utf8_lossy(&rec.body).contains(A_KEY));
    }
}

#[tokio::test]
async fn model_names_resolve_among_the_routes_a_client_may_call() {
    let t = teams().await;
    let proxy = TestProxy::start(&t.manifests).await;

    // Two namespaces each serve `smart`; each team's clients get their own.
    let r = chat_as(&proxy, A_KEY, "smart").await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-route"), "team-a/smart");
    for key in [B_KEY, B_DEFAULT_KEY] {
        let r = chat_as(&proxy, key, "smart").await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-switchback-route"), "team-b/smart");
    }
    assert_eq!(t.a.hits(), 1);
    assert_eq!(t.b.hits(), 2);

    // A route shared with team-b, named as namespace/name in routes.
    let r = chat_as(&proxy, B_KEY, "shared-model").await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-route"), "team-a/shared");
    // team-b/default has no `routes`: only its own namespace's.
    let not_listed = json_of(chat_as(&proxy, B_DEFAULT_KEY, "shared-model").await).await;
    assert_eq!(not_listed["error"]["code"], "model_not_found");

    // A route the client may not call answers exactly like a model nobody serves.
    let forbidden = chat_as(&proxy, B_KEY, "private").await;
    let unknown = chat_as(&proxy, B_KEY, "no-such-model").await;
    assert_eq!(forbidden.status(), 404);
    assert_eq!(unknown.status(), 404);
    let (forbidden, unknown) = (json_of(forbidden).await, json_of(unknown).await);
    assert_eq!(
        serde_json::to_string(&forbidden)
            .unwrap()
            .replace("private", "X"),
        serde_json::to_string(&unknown)
            .unwrap()
            .replace("no-such-model", "X")
    );
    assert_eq!(forbidden["error"]["code"], "model_not_found");
    // team-a's own client may call it.
    assert_eq!(chat_as(&proxy, A_KEY, "private").await.status(), 200);

    // /v1/models lists what the client may call, nothing else.
    let models = |key: &'static str| {
        let req = proxy.http.get(proxy.url("/v1/models")).bearer_auth(key);
        async move {
            let v: Value = req.send().await.unwrap().json().await.unwrap();
            let mut ids: Vec<String> = v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_string())
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(models(B_KEY).await, ["shared-model", "smart"]);
    assert_eq!(models(B_DEFAULT_KEY).await, ["smart"]);
    assert_eq!(models(A_KEY).await, ["private", "shared-model", "smart"]);

    // The unshared route is reported where it was named.
    let config = proxy.admin_config().await;
    let warnings = config["load"]["warnings"].to_string() + &config.to_string();
    assert!(warnings.contains("team-a/private"), "{config}");
    // The config shows key hashes, never keys.
    assert!(!config.to_string().contains(A_KEY));
}

#[tokio::test]
async fn with_auth_off_everyone_is_served_as_before() {
    let a = SimProvider::start_named("provider-a", Flavor::OpenAi).await;
    let manifests = [
        credential("team-a", "openai-a", &a.base_url(), "sk-provider-a"),
        credential("team-b", "openai-b", &a.base_url(), "sk-provider-b"),
        route("team-a", "smart", "", "openai-a"),
        route("team-b", "other", "", "openai-b"),
        client("team-a", "app", A_KEY, None),
    ]
    .concat();
    let proxy = TestProxy::start_configured(&manifests, |o| o.auth = Some(AuthMode::Off)).await;
    // No key, any namespace's model: model names are global.
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-route"), "team-a/smart");
    let r = proxy.chat("other", false).await;
    assert_eq!(header(&r, "x-switchback-route"), "team-b/other");
    // A key is accepted and ignored, and still not forwarded.
    let r = chat_as(&proxy, "sk-anything-at-all", "smart").await;
    assert_eq!(r.status(), 200);
    let got = a.received();
    assert_eq!(got.len(), 3);
    assert_eq!(got[2].header("authorization"), Some("Bearer sk-provider-a"));
    assert_eq!(proxy.admin_config().await["auth"], "off");

    // Manifests without an LLMClient default to off.
    let manifests = [
        credential("team-a", "openai-a", &a.base_url(), "sk-provider-a"),
        route("team-a", "smart", "", "openai-a"),
    ]
    .concat();
    let proxy = TestProxy::start(&manifests).await;
    assert_eq!(proxy.chat("smart", false).await.status(), 200);
    assert_eq!(proxy.messages("smart", false).await.status(), 200);
}

#[tokio::test]
async fn required_without_clients_refuses_everyone_and_the_hmac_file_is_used() {
    let a = SimProvider::start_named("provider-a", Flavor::OpenAi).await;
    let manifests = [
        credential("team-a", "openai-a", &a.base_url(), "sk-provider-a"),
        route("team-a", "smart", "", "openai-a"),
    ]
    .concat();
    let proxy =
        TestProxy::start_configured(&manifests, |o| o.auth = Some(AuthMode::Required)).await;
    assert_eq!(proxy.chat("smart", false).await.status(), 401);
    assert_eq!(chat_as(&proxy, A_KEY, "smart").await.status(), 401);

    let dir = tempfile::tempdir().unwrap();
    let hmac = dir.path().join("hmac");
    std::fs::write(&hmac, format!("{}\n", "s".repeat(64))).unwrap();
    let with_client = format!("{manifests}{}", client("team-a", "app", A_KEY, None));
    let proxy = TestProxy::start_configured(&with_client, |o| {
        o.client_key_hmac_file = Some(hmac.clone());
    })
    .await;
    assert_eq!(chat_as(&proxy, A_KEY, "smart").await.status(), 200);
    // The hash in the config is the HMAC under the file's secret.
    let want = switchback_crds::keyhash::KeyHasher::new("s".repeat(64).as_bytes())
        .unwrap()
        .hash(A_KEY.as_bytes());
    let config = proxy.admin_config().await;
    assert!(
        config.to_string().contains(
            &serde_json::to_value(want)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        ),
        "{config}"
    );

    std::fs::write(&hmac, "too short").unwrap();
    let err = TestProxy::try_start_configured(&with_client, |o| {
        o.client_key_hmac_file = Some(hmac.clone());
    })
    .await
    .err()
    .expect("a short secret is refused");
    assert!(err.to_string().contains("at least 32"), "{err}");
}

#[tokio::test]
async fn changing_the_key_secret_rotates_the_key_on_reload() {
    let t = teams().await;
    let proxy = TestProxy::start(&t.manifests).await;
    assert_eq!(chat_as(&proxy, A_KEY, "smart").await.status(), 200);

    let rotated = "sk-team-a-app-rotated-987654";
    proxy.rewrite(&t.manifests.replace(A_KEY, rotated));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while proxy.admin_config().await["load"]["generation"] != 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the edit was not loaded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(chat_as(&proxy, A_KEY, "smart").await.status(), 401);
    assert_eq!(chat_as(&proxy, rotated, "smart").await.status(), 200);
    // The other clients' keys are untouched.
    assert_eq!(chat_as(&proxy, B_KEY, "smart").await.status(), 200);

    // Deleting the client revokes its key; the mode stays `required`.
    let without_a = t
        .manifests
        .split("\n---\n")
        .filter(|doc| {
            !doc.contains("name: app, namespace: team-a")
                && !doc.contains("app-llm, namespace: team-a")
        })
        .collect::<Vec<_>>()
        .join("\n---\n");
    proxy.rewrite(&without_a);
    while proxy.admin_config().await["load"]["generation"] != 3 {
        assert!(
            tokio::time::Instant::now() < deadline + std::time::Duration::from_secs(5),
            "the edit was not loaded: {}",
            proxy.admin_config().await["load"]
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(chat_as(&proxy, rotated, "smart").await.status(), 401);
    assert_eq!(proxy.chat("smart", false).await.status(), 401);
    assert_eq!(proxy.admin_config().await["auth"], "required");
}

#[tokio::test]
async fn a_large_body_with_a_wrong_key_still_gets_its_401() {
    let t = teams().await;
    let proxy = TestProxy::start(&t.manifests).await;
    let mut body = chat_body("smart", false);
    body["padding"] = Value::String("x".repeat(8 << 20));
    for _ in 0..3 {
        let r = proxy
            .http
            .post(proxy.url("/v1/chat/completions"))
            .bearer_auth("sk-nobody-0123456789")
            .json(&body)
            .send()
            .await
            .expect("the 401 arrives, not a reset");
        assert_eq!(r.status(), 401);
        assert_eq!(json_of(r).await["error"]["code"], "invalid_api_key");
    }
}

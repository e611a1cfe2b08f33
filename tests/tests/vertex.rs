//! `provider: vertex` through the whole proxy, as far as this release goes (vertex is
//! partial, README "Providers"): a vertex credential compiles and loads, and since the
//! proxy does not send requests to Vertex yet, a vertex target is skipped without a
//! request reaching it and the route fails over to its next target.

use serde_json::json;
use switchback_tests::harness::{TestProxy, credential, header, route};
use switchback_tests::sim::{Flavor, SimProvider};

/// A vertex credential whose baseURL points at `base_url`, with a service-account key
/// (placeholder PEM: compile checks its shape, nothing signs with it here).
fn vertex_credential(name: &str, base_url: &str) -> String {
    format!(
        r#"---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: {{ name: {name}, namespace: team-a }}
spec:
  provider: vertex
  project: my-project
  location: us-east5
  baseURL: {base_url}
  secretRef: {{ name: {name}-sa, key: serviceAccount.json }}
  allowPrivateNetwork: true
---
apiVersion: v1
kind: Secret
metadata: {{ name: {name}-sa, namespace: team-a }}
stringData:
  serviceAccount.json: |
    {{"type": "service_account",
     "client_email": "gw@my-project.iam.gserviceaccount.com",
     "private_key": "-----BEGIN PRIVATE KEY-----\ncGxhY2Vob2xkZXI=\n-----END PRIVATE KEY-----\n",
     "token_uri": "{base_url}/token"}}
"#
    )
}

#[tokio::test]
async fn a_vertex_target_is_skipped_for_now_and_the_route_fails_over() {
    let vertex = SimProvider::start_named("vertex", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let mut manifests = vertex_credential("vtx", &vertex.base_url());
    manifests += &credential(
        "backup",
        "openai",
        &backup.base_url(),
        "sk-backup-0123456789",
    );
    manifests += &route(
        "smart",
        "  targets:\n    - credentialRef: { name: vtx }\n      model: gemini-2.5-flash\n    - credentialRef: { name: backup }\n      model: backup-model\n",
    );
    let proxy = TestProxy::start(&manifests).await;
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(vertex.hits(), 0, "nothing is sent to a vertex target yet");
    assert_eq!(backup.hits(), 1);
}

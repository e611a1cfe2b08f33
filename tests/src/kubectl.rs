//! `kubectl` as the end-to-end tests use it, against the cluster KUBECONFIG names:
//! run a command, read an object as JSON, find a condition, and release the
//! credential finalizers an operator that is gone would have released.

use std::process::{Command, Stdio};

use serde_json::Value;

/// Runs kubectl with `stdin` (if any); returns (success, stdout, stderr).
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new("kubectl");
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl is installed");
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// kubectl's stdout; fails the test with its stderr when it fails.
#[track_caller]
pub fn kubectl_ok(args: &[&str]) -> String {
    let (success, out, err) = kubectl(args, None);
    assert!(success, "kubectl {}: {err}", args.join(" "));
    out
}

/// `kubectl get ARGS -o json`, or None when it fails (say, the object is not there).
pub fn get_json(args: &[&str]) -> Option<Value> {
    let mut full = vec!["get"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", "json"]);
    let (success, out, _) = kubectl(&full, None);
    success.then(|| serde_json::from_str(&out).ok()).flatten()
}

/// The condition `type_` of an object's status.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Clears the finalizer of every ProviderCredential in `namespace`: with the operator
/// gone, nothing would, and the namespace could not be deleted.
pub fn release_credentials(namespace: &str) {
    let Some(list) = get_json(&["providercredentials", "-n", namespace]) else {
        return;
    };
    for item in list["items"].as_array().into_iter().flatten() {
        let name = item["metadata"]["name"].as_str().unwrap_or_default();
        let _ = kubectl(
            &[
                "patch",
                "providercredential",
                name,
                "-n",
                namespace,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ],
            None,
        );
    }
}

/// The objects of `kind` (`configmaps`: the parts, `secrets`: the keys Secret) the
/// operator rendered into `gateway` for source namespace `source` (selected by label:
/// their names carry a content digest).
pub fn rendered(kind: &str, gateway: &str, source: &str) -> Vec<Value> {
    let selector = format!("switchback.dev/source-namespace={source}");
    get_json(&[kind, "-n", gateway, "-l", &selector])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
}

//! Runs a chart's Deployments the way a cluster would, on loopback
//! (docs/development.md#the-end-to-end-suite). Nothing runs pods on the test API server, so
//! this stands in for the kubelet, the Deployment and disruption controllers and the
//! EndpointSlice controller, for the workspace's own two binaries only.
//!
//! For every Deployment of one namespace whose image is `…/operator` or `…/proxy`, it
//! starts `spec.replicas` processes, each as the pod template says: the container's
//! `args` and `env` as written (`fieldRef` values filled in as the kubelet fills them),
//! its Secret and ConfigMap volumes written to a folder with the mount paths mapped
//! there (like the kubelet, it waits while a required Secret does not exist), each
//! declared `containerPort` that the arguments bind on `0.0.0.0` moved to a free
//! loopback port, and a kubeconfig that impersonates the pod's ServiceAccount, so the
//! API server's RBAC applies to it exactly as to a pod. Once a process's readiness
//! probe answers, an EndpointSlice is published for each Service selecting it, and the
//! Deployment's (and PodDisruptionBudget's) status says what is ready: what
//! `helm install --wait`, kstatus and the operator's replica discovery read.
//!
//! What it does not do: restart a process that exits (the test fails instead), roll
//! out a changed template, or run anything that is not one of the two binaries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, PodSpec, Secret, Service, Volume};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::binaries::{Process, free_ports};

/// The field manager of everything this writes.
const MANAGER: &str = "switchback-tests-kubelet";

/// One running "pod": a process started from a Deployment's template.
pub struct Pod {
    pub deployment: String,
    pub name: String,
    pub service_account: String,
    /// The pod template's labels (what Services select).
    pub labels: BTreeMap<String, String>,
    /// The loopback port of each declared container port, by the port's name.
    pub ports: BTreeMap<String, u16>,
    /// The same, by container port number.
    pub port_numbers: BTreeMap<i32, u16>,
    /// The arguments it was started with, after the mappings.
    pub args: Vec<String>,
    pub log: PathBuf,
    process: Process,
    readiness: Option<(String, u16)>,
    ready: bool,
}

impl Pod {
    /// The loopback port of the container port named `name`.
    pub fn port(&self, name: &str) -> u16 {
        *self
            .ports
            .get(name)
            .unwrap_or_else(|| panic!("pod {} has no port named {name}", self.name))
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// The pods of one namespace, kept in step with its Deployments by a background task.
pub struct Kubelet {
    pods: Arc<Mutex<Vec<Pod>>>,
    /// Why the background task stopped (a pod exited, a template it cannot run).
    failed: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
    abort: tokio::task::AbortHandle,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.abort.abort();
        self.task.abort();
        // Processes are killed as the pods drop.
        self.pods.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// What a pod needs from outside this module.
#[derive(Clone)]
struct Env {
    client: Client,
    namespace: String,
    /// The folder holding the workspace's binaries.
    bin: PathBuf,
    /// Where pods' folders and logs go.
    dir: PathBuf,
    /// The admin kubeconfig, as JSON, to derive the impersonating ones from.
    kubeconfig: serde_json::Value,
}

impl Kubelet {
    /// Starts watching `namespace` (which need not exist yet) with the admin
    /// `client`; pods' files and logs go under `dir`.
    pub fn start(client: Client, namespace: &str, bin: &Path, dir: &Path) -> Kubelet {
        std::fs::create_dir_all(dir).unwrap();
        let env = Env {
            client,
            namespace: namespace.to_string(),
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            kubeconfig: admin_kubeconfig(),
        };
        let pods = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(Mutex::new(None));
        let inner = tokio::spawn(run(env, pods.clone()));
        let abort = inner.abort_handle();
        let task = {
            let failed = failed.clone();
            tokio::spawn(async move {
                // A panic in there is a failure too, not a silent stop.
                let why = match inner.await {
                    Ok(why) => why,
                    Err(e) => format!("it panicked: {e}"),
                };
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            })
        };
        Kubelet {
            pods,
            failed,
            task,
            abort,
        }
    }

    /// Panics with the reason the pods stopped being run, if they did.
    pub fn check(&self) {
        if let Some(why) = self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            panic!("the loopback kubelet stopped: {why}");
        }
    }

    /// Calls `f` with the pods of `deployment` (started so far).
    pub fn with_pods<T>(&self, deployment: &str, f: impl FnOnce(&[&Pod]) -> T) -> T {
        let pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        let of: Vec<&Pod> = pods.iter().filter(|p| p.deployment == deployment).collect();
        f(&of)
    }

    /// Waits until `deployment` has `n` ready pods.
    pub async fn wait_ready(&self, deployment: &str, n: usize, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            self.check();
            let ready = self.with_pods(deployment, |pods| pods.iter().filter(|p| p.ready).count());
            if ready >= n {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{deployment}: {ready} of {n} pods ready after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The loopback port of `port` on the first pod of `deployment`.
    pub fn port(&self, deployment: &str, port: &str) -> Option<u16> {
        self.with_pods(deployment, |pods| pods.first().map(|p| p.port(port)))
    }

    /// The log of every pod, for a failing test to print.
    pub fn logs(&self) -> Vec<PathBuf> {
        let pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        pods.iter().map(|p| p.log.clone()).collect()
    }
}

/// Every half second: start the pods of new Deployments, probe, publish. Returns why
/// it cannot go on.
async fn run(env: Env, pods: Arc<Mutex<Vec<Pod>>>) -> String {
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    let mut unpublished = false;
    loop {
        let listed = deployments.list(&ListParams::default()).await;
        if let Err(e) = &listed {
            eprintln!("kubelet: listing the Deployments of {}: {e}", env.namespace);
        }
        if let Ok(list) = listed {
            for d in list.items {
                let name = d.name_any();
                let started = pods
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .filter(|p| p.deployment == name)
                    .count();
                let wanted = d.spec.replicas.unwrap_or(1).max(0) as usize;
                for i in started..wanted {
                    match start_pod(&env, &d, i).await {
                        Ok(Some(pod)) => {
                            pods.lock().unwrap_or_else(|p| p.into_inner()).push(pod);
                            unpublished = true;
                        }
                        // A required volume's Secret does not exist yet: the kubelet waits.
                        Ok(None) => break,
                        Err(e) => return format!("starting a pod of Deployment {name}: {e}"),
                    }
                }
            }
        }
        match probe(&pods).await {
            Ok(changed) => unpublished |= changed,
            Err(why) => return why,
        }
        if unpublished {
            match publish(&env, &pods).await {
                Ok(()) => unpublished = false,
                Err(e) => eprintln!("kubelet: publishing pod readiness: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The admin kubeconfig KUBECONFIG names, flattened, as JSON.
pub fn admin_kubeconfig() -> serde_json::Value {
    let out = std::process::Command::new("kubectl")
        .args([
            "config",
            "view",
            "--raw",
            "--minify",
            "--flatten",
            "-o",
            "json",
        ])
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl config view: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("kubectl config view gives JSON")
}

/// `admin` impersonating ServiceAccount `namespace/name`, in that namespace (a pod's
/// default namespace), as `kubectl --as` does: the API server adds the
/// ServiceAccount's groups.
pub fn impersonating(admin: &serde_json::Value, namespace: &str, name: &str) -> serde_json::Value {
    let mut config = admin.clone();
    for user in config["users"].as_array_mut().expect("kubeconfig users") {
        user["user"]["as"] = json!(format!("system:serviceaccount:{namespace}:{name}"));
    }
    for context in config["contexts"]
        .as_array_mut()
        .expect("kubeconfig contexts")
    {
        context["context"]["namespace"] = json!(namespace);
    }
    config
}

/// The binary of `image` (`…/operator:tag` -> `switchback-operator`), or None for an
/// image this does not run.
pub fn binary_of(image: &str) -> Option<&'static str> {
    let repository = image.rsplit_once(':').map_or(image, |(r, tag)| {
        // `host:port/repo` has no tag after its last colon.
        if tag.contains('/') { image } else { r }
    });
    match repository.rsplit('/').next()? {
        "operator" => Some("switchback-operator"),
        "proxy" => Some("switchback-proxy"),
        _ => None,
    }
}

/// Starts pod `index` of `d`; None while a required Secret is missing.
async fn start_pod(env: &Env, d: &Deployment, index: usize) -> Result<Option<Pod>, String> {
    let deployment = d.name_any();
    let template = &d.spec.template;
    let spec = template.spec.as_ref().ok_or("no template spec")?;
    let container = spec.containers.first().ok_or("no container")?;
    let image = container.image.clone().unwrap_or_default();
    let binary = binary_of(&image).ok_or_else(|| format!("not one of ours: image {image}"))?;
    let name = format!("{deployment}-loopback-{index}");
    let dir = env.dir.join(&name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let Some(mounts) = write_volumes(env, spec, container, &dir).await? else {
        return Ok(None);
    };
    let service_account = spec
        .service_account_name
        .clone()
        .unwrap_or_else(|| "default".into());
    let declared: Vec<(Option<String>, i32)> = container
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.container_port))
        .collect();
    let fresh = free_ports::<8>();
    assert!(declared.len() <= fresh.len(), "more than 8 ports");
    let port_numbers: BTreeMap<i32, u16> = declared
        .iter()
        .zip(fresh)
        .map(|((_, number), host)| (*number, host))
        .collect();
    let ports: BTreeMap<String, u16> = declared
        .iter()
        .filter_map(|(n, number)| Some((n.clone()?, port_numbers[number])))
        .collect();
    let map = |text: &str| -> String {
        let mut out = text.to_string();
        // Longest mount path first: /etc/a/b before /etc/a.
        for (path, local) in &mounts {
            out = out.replace(path.as_str(), &local.display().to_string());
        }
        for (number, host) in &port_numbers {
            out = out.replace(&format!("0.0.0.0:{number}"), &format!("127.0.0.1:{host}"));
        }
        out
    };
    let args: Vec<String> = container.args.iter().flatten().map(|a| map(a)).collect();
    let mut vars = Vec::new();
    for var in container.env.iter().flatten() {
        vars.push((
            var.name.clone(),
            map(&env_value(env, var, &name, spec).await?),
        ));
    }
    let kubeconfig = dir.join("kubeconfig.json");
    std::fs::write(
        &kubeconfig,
        serde_json::to_vec_pretty(&impersonating(
            &env.kubeconfig,
            &env.namespace,
            &service_account,
        ))
        .unwrap(),
    )
    .unwrap();
    let log = env.dir.join(format!("{name}.log"));
    let mut cmd = std::process::Command::new(env.bin.join(binary));
    // A container starts with its own environment only.
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", &kubeconfig)
        .env("HOSTNAME", &name)
        .envs(vars)
        .args(&args)
        .current_dir(&dir);
    let process = Process::spawn_command(
        if binary == "switchback-operator" {
            "switchback-operator"
        } else {
            "switchback-proxy"
        },
        cmd,
        &log,
    );
    let readiness = container
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .map(|g| {
            let port = match &g.port {
                IntOrString::Int(n) => port_numbers.get(n).copied(),
                IntOrString::String(s) => ports.get(s).copied(),
            };
            (
                g.path.clone().unwrap_or_else(|| "/".into()),
                port.expect("the readiness probe's port is declared"),
            )
        });
    Ok(Some(Pod {
        deployment,
        name,
        service_account,
        labels: template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default(),
        ports,
        port_numbers,
        args,
        log,
        process,
        readiness,
        ready: false,
    }))
}

/// An env var's value as the kubelet resolves it.
async fn env_value(env: &Env, var: &EnvVar, pod: &str, spec: &PodSpec) -> Result<String, String> {
    if let Some(v) = &var.value {
        return Ok(v.clone());
    }
    let Some(from) = &var.value_from else {
        return Ok(String::new());
    };
    if let Some(field) = &from.field_ref {
        return match field.field_path.as_str() {
            "metadata.name" => Ok(pod.to_string()),
            "metadata.namespace" => Ok(env.namespace.clone()),
            "spec.serviceAccountName" => Ok(spec.service_account_name.clone().unwrap_or_default()),
            "spec.nodeName" => Ok("loopback".into()),
            "status.podIP" | "status.hostIP" => Ok("127.0.0.1".into()),
            other => Err(format!(
                "env {}: fieldRef {other} is not filled here",
                var.name
            )),
        };
    }
    if let Some(s) = &from.secret_key_ref {
        let api: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
        let secret = api.get(&s.name).await.map_err(|e| e.to_string())?;
        let bytes = secret
            .data
            .and_then(|d| d.get(&s.key).cloned())
            .ok_or_else(|| format!("env {}: Secret {} has no {}", var.name, s.name, s.key))?;
        return Ok(String::from_utf8_lossy(&bytes.0).into_owned());
    }
    if let Some(c) = &from.config_map_key_ref {
        let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
        let map = api.get(&c.name).await.map_err(|e| e.to_string())?;
        return map
            .data
            .and_then(|d| d.get(&c.key).cloned())
            .ok_or_else(|| format!("env {}: ConfigMap {} has no {}", var.name, c.name, c.key));
    }
    Err(format!("env {}: unsupported valueFrom", var.name))
}

/// Writes the container's Secret/ConfigMap/emptyDir volumes under `dir`; returns the
/// mount paths and their folders, longest path first, or None while a required
/// Secret or ConfigMap does not exist (the kubelet holds such a pod).
async fn write_volumes(
    env: &Env,
    spec: &PodSpec,
    container: &Container,
    dir: &Path,
) -> Result<Option<Vec<(String, PathBuf)>>, String> {
    let volumes: BTreeMap<&str, &Volume> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = volumes
            .get(mount.name.as_str())
            .ok_or_else(|| format!("volumeMount {} has no volume", mount.name))?;
        let local = dir.join("volumes").join(&volume.name);
        let _ = std::fs::remove_dir_all(&local);
        std::fs::create_dir_all(&local).unwrap();
        // (key, bytes) of the volume's source, and its items.
        let (data, items, optional): (BTreeMap<String, Vec<u8>>, _, bool) =
            if let Some(s) = &volume.secret {
                let name = s.secret_name.clone().unwrap_or_default();
                let optional = s.optional.unwrap_or(false);
                match secrets.get_opt(&name).await.map_err(|e| e.to_string())? {
                    Some(found) => (
                        found
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0))
                            .collect(),
                        s.items.clone(),
                        optional,
                    ),
                    None if optional => (BTreeMap::new(), None, true),
                    None => return Ok(None),
                }
            } else if let Some(c) = &volume.config_map {
                let optional = c.optional.unwrap_or(false);
                match maps.get_opt(&c.name).await.map_err(|e| e.to_string())? {
                    Some(found) => (
                        found
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.into_bytes()))
                            .collect(),
                        c.items.clone(),
                        optional,
                    ),
                    None if optional => (BTreeMap::new(), None, true),
                    None => return Ok(None),
                }
            } else if volume.empty_dir.is_some() {
                (BTreeMap::new(), None, true)
            } else {
                return Err(format!(
                    "volume {}: only secret, configMap and emptyDir",
                    volume.name
                ));
            };
        let files: Vec<(String, &Vec<u8>)> = match &items {
            Some(items) => {
                let mut files = Vec::new();
                for item in items {
                    match data.get(&item.key) {
                        Some(bytes) => files.push((item.path.clone(), bytes)),
                        // A missing key of a required source holds the pod, as a missing Secret does.
                        None if !optional => return Ok(None),
                        None => {}
                    }
                }
                files
            }
            None => data.iter().map(|(k, v)| (k.clone(), v)).collect(),
        };
        for (path, bytes) in files {
            let file = local.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, bytes).unwrap();
        }
        let target = match &mount.sub_path {
            Some(sub) if !sub.is_empty() => local.join(sub),
            _ => local,
        };
        mounts.push((mount.mount_path.trim_end_matches('/').to_string(), target));
    }
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    Ok(Some(mounts))
}

/// Probes every pod: whether a readiness changed, or Err when a pod exited.
async fn probe(pods: &Arc<Mutex<Vec<Pod>>>) -> Result<bool, String> {
    let probes: Vec<(usize, Option<(String, u16)>)> = pods
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .enumerate()
        .map(|(i, p)| (i, p.readiness.clone()))
        .collect();
    let http = reqwest::Client::new();
    let mut changed = false;
    for (i, readiness) in probes {
        let ready = match readiness {
            None => true,
            Some((path, port)) => http
                .get(format!("http://127.0.0.1:{port}{path}"))
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success() || r.status().is_redirection()),
        };
        let mut all = pods.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pod) = all.get_mut(i) {
            if let Some(status) = pod.process.exited() {
                return Err(format!(
                    "pod {} exited ({status}):\n{}",
                    pod.name,
                    crate::binaries::tail(&pod.log, 40)
                ));
            }
            if pod.ready != ready {
                pod.ready = ready;
                changed = true;
            }
        }
    }
    Ok(changed)
}

/// EndpointSlices for the Services selecting each pod, and the readiness counts in the
/// Deployments' and PodDisruptionBudgets' status.
async fn publish(env: &Env, pods: &Arc<Mutex<Vec<Pod>>>) -> Result<(), kube::Error> {
    struct View {
        deployment: String,
        name: String,
        labels: BTreeMap<String, String>,
        ports: BTreeMap<String, u16>,
        port_numbers: BTreeMap<i32, u16>,
        ready: bool,
    }
    let views: Vec<View> = pods
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|p| View {
            deployment: p.deployment.clone(),
            name: p.name.clone(),
            labels: p.labels.clone(),
            ports: p.ports.clone(),
            port_numbers: p.port_numbers.clone(),
            ready: p.ready,
        })
        .collect();
    let ssa = PatchParams::apply(MANAGER).force();
    let services: Api<Service> = Api::namespaced(env.client.clone(), &env.namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(env.client.clone(), &env.namespace);
    for service in services.list(&ListParams::default()).await?.items {
        let Some(selector) = service.spec.as_ref().and_then(|s| s.selector.clone()) else {
            continue;
        };
        let svc = service.name_any();
        for pod in &views {
            if !selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v)) {
                continue;
            }
            // One slice per pod: a slice's ports are shared by its endpoints, and every
            // pod here has its own loopback ports.
            let ports: Vec<serde_json::Value> = service
                .spec
                .as_ref()
                .and_then(|s| s.ports.clone())
                .unwrap_or_default()
                .iter()
                .filter_map(|p| {
                    let host = match p.target_port.as_ref() {
                        Some(IntOrString::String(name)) => pod.ports.get(name).copied(),
                        Some(IntOrString::Int(n)) => pod.port_numbers.get(n).copied(),
                        None => pod.port_numbers.get(&p.port).copied(),
                    }?;
                    Some(json!({"name": p.name, "port": host, "protocol": "TCP"}))
                })
                .collect();
            let slice = json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": format!("{svc}-{}", pod.name),
                    "labels": {
                        "kubernetes.io/service-name": svc,
                        "endpointslice.kubernetes.io/managed-by": MANAGER,
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{
                    "addresses": ["127.0.0.1"],
                    "conditions": {"ready": pod.ready, "serving": pod.ready, "terminating": false},
                    "targetRef": {"kind": "Pod", "name": pod.name, "namespace": env.namespace},
                }],
                "ports": ports,
            });
            slices
                .patch(&format!("{svc}-{}", pod.name), &ssa, &Patch::Apply(&slice))
                .await?;
        }
    }
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    for d in deployments.list(&ListParams::default()).await?.items {
        let name = d.name_any();
        let wanted = d.spec.replicas.unwrap_or(1);
        let started = views.iter().filter(|v| v.deployment == name).count() as i32;
        let ready = views
            .iter()
            .filter(|v| v.deployment == name && v.ready)
            .count() as i32;
        let available = if ready >= wanted { "True" } else { "False" };
        let status = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "status": {
                "observedGeneration": d.metadata.generation,
                "replicas": started,
                "updatedReplicas": started,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "conditions": [
                    {"type": "Available", "status": available, "reason": "MinimumReplicasAvailable"},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
                ],
            },
        });
        deployments
            .patch_status(&name, &ssa, &Patch::Apply(&status))
            .await?;
    }
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.namespace);
    for pdb in budgets.list(&ListParams::default()).await?.items {
        let selected = |v: &&View| {
            pdb.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .and_then(|s| s.match_labels.as_ref())
                .is_some_and(|m| m.iter().all(|(k, val)| v.labels.get(k) == Some(val)))
        };
        let expected = views.iter().filter(selected).count() as i32;
        let healthy = views.iter().filter(selected).filter(|v| v.ready).count() as i32;
        let spec = pdb.spec.clone().unwrap_or_default();
        let desired = match (&spec.min_available, &spec.max_unavailable) {
            (Some(IntOrString::Int(n)), _) => *n,
            (_, Some(IntOrString::Int(n))) => (expected - n).max(0),
            _ => expected,
        };
        let status = json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "status": {
                "observedGeneration": pdb.metadata.generation,
                "currentHealthy": healthy,
                "desiredHealthy": desired,
                "expectedPods": expected,
                "disruptionsAllowed": (healthy - desired).max(0),
            },
        });
        budgets
            .patch_status(&pdb.name_any(), &ssa, &Patch::Apply(&status))
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_name_their_binaries() {
        assert_eq!(
            binary_of("switchback/proxy:0.1.0"),
            Some("switchback-proxy")
        );
        assert_eq!(
            binary_of("registry.local:5000/switchback/operator:0.1.0"),
            Some("switchback-operator")
        );
        assert_eq!(
            binary_of("registry.local:5000/team/proxy"),
            Some("switchback-proxy")
        );
        assert_eq!(binary_of("curlimages/curl:8.11.1"), None);
    }

    #[test]
    fn a_kubeconfig_impersonates_a_service_account_in_its_namespace() {
        let admin = json!({
            "users": [{"name": "admin", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "admin"}}],
        });
        let sa = impersonating(&admin, "switchback-system", "switchback-proxy");
        assert_eq!(
            sa["users"][0]["user"]["as"],
            "system:serviceaccount:switchback-system:switchback-proxy"
        );
        assert_eq!(sa["users"][0]["user"]["token"], "t");
        assert_eq!(
            sa["contexts"][0]["context"]["namespace"],
            "switchback-system"
        );
    }
}

//! A real kubelet joined to the local cluster: the `kubelet` binary built from the same Kubernetes module as the
//! control plane (`E2E_KUBELET_BIN`), talking CRI to `tests/fake-cri` (`E2E_FAKE_CRI_BIN`), the fake runtime of
//! k8s.io/cri-client, because this machine has no container runtime. Registration with the API server, node
//! status and allocatable, pod admission, the device manager (plugin registration, ListAndWatch, Allocate, its
//! checkpoint) and the pod-resources API are the kubelet's own code; only containers are not real processes.
//!
//! What a device plugin's Allocate answer turned into is visible in the runtime's records: one JSON line per
//! created container with its environment, CDI devices and mounts ([`Kubelet::created`]).
//!
//! Its configuration is the harness's, as for the real node (see `harness::cluster::kubelet` for the limits of this
//! machine it is set around), serving on loopback with no client trusted. Test pods should set
//! `automountServiceAccountToken: false`, since mounting a token volume needs a tmpfs mount. The kubelet's
//! device-plugin directory is fixed at `/var/lib/kubelet/device-plugins` (not under `--root-dir`), so one real
//! kubelet can run on a machine at a time: starting fails if another one answers on that socket.

use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use harness::cluster::kubelet::KubeletConfig;
use serde_json::Value;

use crate::{clean_up, eventually, free_port, kubectl, kubectl_json, run};

/// Where every kubelet serves device-plugin registration, whatever its `--root-dir`.
pub const DEVICE_PLUGIN_ROOT: &str = "/var/lib/kubelet";

/// How long the kubelet gets to register its node and become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

fn binary(env_var: &str, what: &str) -> PathBuf {
    std::env::var_os(env_var).map_or_else(
        || panic!("{env_var} is not set: {what} is built by `cargo xtask e2e`"),
        PathBuf::from,
    )
}

/// A kubelet and its fake runtime for one node; both stopped, and the Node deleted, when dropped.
#[derive(Debug)]
pub struct Kubelet {
    node: String,
    dir: PathBuf,
    /// The running kubelet process and how many have been started (their logs are numbered).
    kubelet: Mutex<(Option<Child>, u32)>,
    runtime: Child,
}

impl Kubelet {
    /// Starts the runtime and a kubelet that registers node `node` with `labels`, keeping its state, config and
    /// logs in `dir`; returns once the Node is Ready.
    pub fn start(node: &str, dir: &Path, labels: &[(&str, &str)]) -> Self {
        Self::start_with(node, dir, labels, None)
    }

    /// As [`start`](Self::start), with a runtime that resolves CDI devices against the specs in `cdi_dir`, as a
    /// CDI-enabled containerd or CRI-O does (a DRA driver's per-claim specs).
    pub fn start_resolving_cdi(
        node: &str,
        dir: &Path,
        labels: &[(&str, &str)],
        cdi_dir: &Path,
    ) -> Self {
        Self::start_with(node, dir, labels, Some(cdi_dir))
    }

    fn start_with(node: &str, dir: &Path, labels: &[(&str, &str)], cdi_dir: Option<&Path>) -> Self {
        let registration = Path::new(DEVICE_PLUGIN_ROOT).join("device-plugins");
        assert!(
            UnixStream::connect(registration.join("kubelet.sock")).is_err(),
            "another kubelet serves {}: the device-plugin tests need this machine's kubelet socket to themselves",
            registration.display()
        );
        std::fs::create_dir_all(&registration).expect("the kubelet's device-plugin directory");
        // A previous run's device assignments would be restored for pods that no longer exist.
        let _ = std::fs::remove_file(registration.join("kubelet_internal_checkpoint"));
        std::fs::create_dir_all(dir).expect("the kubelet's directory");

        let socket = dir.join("cri.sock");
        let mut runtime = Command::new(binary("E2E_FAKE_CRI_BIN", "fake-cri"));
        runtime
            .arg("--socket")
            .arg(&socket)
            .arg("--records")
            .arg(dir.join("containers.jsonl"));
        if let Some(cdi_dir) = cdi_dir {
            runtime.arg("--cdi-dir").arg(cdi_dir);
        }
        let runtime = runtime
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(log_file(&dir.join("fake-cri.log")))
            .spawn()
            .expect("start fake-cri");
        eventually(Duration::from_secs(10), || {
            Ok(UnixStream::connect(&socket).is_ok().then_some(()))
        })
        .expect("fake-cri serves its socket");

        let config = dir.join("kubelet.yaml");
        std::fs::write(
            &config,
            KubeletConfig {
                address: Ipv4Addr::LOCALHOST,
                port: free_port(),
                healthz_port: free_port(),
                runtime_socket: &socket,
                pod_logs: &dir.join("logs"),
                client_ca: None,
            }
            .render(),
        )
        .expect("kubelet config");
        let labels = labels
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(",");
        std::fs::write(dir.join("node-labels"), labels).expect("node labels");
        let kubelet = Self {
            node: node.to_owned(),
            dir: dir.to_owned(),
            kubelet: Mutex::default(),
            runtime,
        };
        kubelet.start_kubelet();
        kubelet
    }

    /// Starts the kubelet process and waits until the Node is Ready.
    fn start_kubelet(&self) {
        let mut process = self.kubelet.lock().expect("kubelet lock");
        process.1 += 1;
        let log = self.dir.join(format!("kubelet-{}.log", process.1));
        let labels = std::fs::read_to_string(self.dir.join("node-labels")).unwrap_or_default();
        let kubeconfig =
            std::env::var_os("KUBECONFIG").expect("KUBECONFIG is set by cargo xtask e2e");
        let child = Command::new(binary("E2E_KUBELET_BIN", "the kubelet"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--config")
            .arg(self.dir.join("kubelet.yaml"))
            .arg("--root-dir")
            .arg(self.root())
            .arg("--cert-dir")
            .arg(self.dir.join("pki"))
            .args(["--hostname-override", &self.node])
            .arg(format!("--node-labels={labels}"))
            // It deletes container logs by path; a path the runtime got wrong must not reach the checkout.
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(log_file(&log))
            .spawn()
            .expect("start the kubelet");
        process.0 = Some(child);
        drop(process);
        let node = self.node.clone();
        eventually(READY_TIMEOUT, || {
            let got = run("kubectl", &["get", "node", &node, "-o", "json"]);
            if !got.success {
                return Ok(None);
            }
            let node: Value = serde_json::from_str(&got.stdout)?;
            let ready = node["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|condition| condition["type"] == "Ready" && condition["status"] == "True");
            Ok(ready.then_some(()))
        })
        .unwrap_or_else(|error| {
            panic!(
                "node {node} never became Ready: {error:#}\n{}",
                self.output()
            )
        });
    }

    /// Stops the kubelet (the runtime and its pods stay) and starts it again, as a kubelet upgrade or crash does.
    pub fn restart(&self) {
        self.stop_kubelet();
        self.start_kubelet();
    }

    fn stop_kubelet(&self) {
        if let Some(mut child) = self.kubelet.lock().expect("kubelet lock").0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The kubelet's `--root-dir` (pods, pod-resources socket).
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// Every container the kubelet created, oldest first: `{namespace, pod, container, env, cdiDevices, mounts}`.
    pub fn created(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("containers.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The newest container the kubelet created for pod `name` (namespace `default`), once there is one.
    pub fn container_of(&self, pod: &str) -> Option<Value> {
        self.created()
            .into_iter()
            .rev()
            .find(|created| created["pod"] == pod && created["namespace"] == "default")
    }

    /// The current kubelet's log (its last 60 lines) and the runtime's, for failure messages.
    pub fn output(&self) -> String {
        let read = |name: String| std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        let starts = self.kubelet.lock().map_or(0, |process| process.1);
        let kubelet = read(format!("kubelet-{starts}.log"));
        let lines: Vec<&str> = kubelet.lines().collect();
        format!(
            "kubelet log (tail):\n{}\nfake-cri log:\n{}",
            lines[lines.len().saturating_sub(60)..].join("\n"),
            read("fake-cri.log".into())
        )
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop_kubelet();
        let _ = self.runtime.kill();
        let _ = self.runtime.wait();
        clean_up(&["node", &self.node, "--wait=false"]);
    }
}

/// A pod asking for `count` of `resource` on `node`, left to the scheduler and the kubelet. It mounts no
/// ServiceAccount token (see the module docs) and stops at once when deleted.
pub fn gpu_pod(name: &str, node: &str, resource: &str, count: u32) -> String {
    pod_on(
        name,
        node,
        &serde_json::json!({"limits": {resource: count}}),
        &[],
    )
}

/// A pod on `node` whose one container has `resources`, with `claims` (name, ResourceClaimTemplate) as its
/// `resourceClaims`, as [`gpu_pod`] makes it.
pub fn pod_on(name: &str, node: &str, resources: &Value, claims: &[(&str, &str)]) -> String {
    let claims: Vec<Value> = claims
        .iter()
        .map(|(claim, template)| serde_json::json!({"name": claim, "resourceClaimTemplateName": template}))
        .collect();
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": false,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": claims,
            "containers": [{"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                            "resources": resources}]
        }
    })
    .to_string()
}

/// Pod `name` (namespace `default`) once Running, else a panic with its description and `logs`.
pub fn wait_running(name: &str, timeout: Duration, logs: &dyn Fn() -> String) -> Value {
    eventually(timeout, || {
        let pod = kubectl_json(&["get", "pod", name, "-n", "default"]);
        Ok((pod["status"]["phase"] == "Running").then_some(pod))
    })
    .unwrap_or_else(|error| {
        let pod = run("kubectl", &["describe", "pod", name, "-n", "default"]);
        panic!(
            "pod {name} never ran: {error:#}\n{}\n{}",
            pod.stdout,
            logs()
        )
    })
}

/// Deletes pod `name` (namespace `default`) and waits until it is gone.
pub fn delete_pod(name: &str) {
    kubectl(&[
        "delete",
        "pod",
        name,
        "-n",
        "default",
        "--wait=true",
        "--timeout=60s",
    ]);
}

/// The node's allocatable amount of `resource`, as the scheduler sees it.
pub fn allocatable(node: &str, resource: &str) -> Option<String> {
    kubectl_json(&["get", "node", node])["status"]["allocatable"][resource]
        .as_str()
        .map(str::to_owned)
}

fn log_file(path: &Path) -> Stdio {
    Stdio::from(std::fs::File::create(path).expect("log file"))
}

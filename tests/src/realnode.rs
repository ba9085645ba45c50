//! The real node: a kubelet on containerd, added by `cargo xtask e2e --real-node` (`cluster add-real-node`), whose
//! pods are real containers from the images `cargo xtask images` built. The suite gets:
//! - `E2E_REAL_NODE`: the node's name;
//! - `E2E_REAL_NODE_KUBELET_ROOT`: its kubelet's `--root-dir`;
//! - `E2E_IMAGES_JSON`: what `cargo xtask images` built (reference, archive, digest of each image).
//!
//! Images are never pulled (no registry is reachable): pods use `imagePullPolicy: Never`.

use std::time::Duration;

use serde_json::Value;

use crate::{eventually, kubectl, kubectl_json, run};

/// The real node's name.
pub fn node() -> String {
    std::env::var("E2E_REAL_NODE").unwrap_or_else(|_| {
        panic!("E2E_REAL_NODE is not set: run the suite with `cargo xtask e2e --real-node`")
    })
}

/// The real node's kubelet `--root-dir`.
pub fn kubelet_root() -> String {
    std::env::var("E2E_REAL_NODE_KUBELET_ROOT").unwrap_or_else(|_| {
        panic!("E2E_REAL_NODE_KUBELET_ROOT is not set: run the suite with `cargo xtask e2e --real-node`")
    })
}

/// One image of `cargo xtask images`.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub reference: String,
    pub digest: String,
}

impl BuiltImage {
    /// `<repository>@<digest>`: what the kubelet reports as a container's `imageID` (the real node tags every
    /// imported image so, as a pull would).
    pub fn digest_reference(&self) -> String {
        let (repository, _tag) = self
            .reference
            .rsplit_once(':')
            .expect("references carry a tag");
        format!("{repository}@{}", self.digest)
    }
}

/// The image whose reference is `<repository>/<name>:<version>`.
pub fn image(name: &str) -> BuiltImage {
    let path = std::env::var("E2E_IMAGES_JSON").unwrap_or_else(|_| {
        panic!("E2E_IMAGES_JSON is not set: run the suite with `cargo xtask e2e --real-node`")
    });
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {path}: {error}"));
    let built: Vec<Value> = serde_json::from_str(&text).expect("images.json is a JSON list");
    built
        .iter()
        .find_map(|entry| {
            let reference = entry["reference"].as_str()?;
            let (repository, _) = reference.rsplit_once(':')?;
            repository
                .ends_with(&format!("/{name}"))
                .then(|| BuiltImage {
                    reference: reference.to_owned(),
                    digest: entry["digest"].as_str().unwrap_or_default().to_owned(),
                })
        })
        .unwrap_or_else(|| panic!("{path} lists no image {name}"))
}

/// A pod of one container from a local image on the real node, with `env`; it stops at once when deleted.
pub fn pod(name: &str, image: &str, env: &[(&str, &str)]) -> String {
    let env: Vec<Value> = env
        .iter()
        .map(|(name, value)| serde_json::json!({"name": name, "value": value}))
        .collect();
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node()},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "env": env}]
        }
    })
    .to_string()
}

/// What the kubelet reports about one container of a running pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningContainer {
    pub pod: String,
    pub container: String,
    /// `status.containerStatuses[].imageID`: the digest containerd ran.
    pub image_id: String,
    pub restarts: u64,
    pub ready: bool,
}

/// Waits until pod `namespace/name` is Running with every container ready, and returns its containers; the
/// failure message has the pod's status and events.
pub fn wait_running(namespace: &str, name: &str, timeout: Duration) -> Vec<RunningContainer> {
    eventually(timeout, || {
        let pod = kubectl_json(&["get", "pod", "-n", namespace, name]);
        let running = pod["status"]["phase"] == "Running";
        let containers = containers_of(&pod);
        Ok((running
            && !containers.is_empty()
            && containers.iter().all(|container| container.ready))
        .then_some(containers))
    })
    .unwrap_or_else(|error| {
        panic!(
            "pod {namespace}/{name} is not Running and ready: {error:#}\n{}",
            run("kubectl", &["describe", "pod", "-n", namespace, name]).stdout
        )
    })
}

/// The containers in a Pod's status.
pub fn containers_of(pod: &Value) -> Vec<RunningContainer> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|status| RunningContainer {
            pod: name.to_owned(),
            container: status["name"].as_str().unwrap_or_default().to_owned(),
            image_id: status["imageID"].as_str().unwrap_or_default().to_owned(),
            restarts: status["restartCount"].as_u64().unwrap_or_default(),
            ready: status["ready"].as_bool().unwrap_or_default(),
        })
        .collect()
}

/// `kubectl logs` of a pod's (only) container, once it has printed `line`.
pub fn logs_with(namespace: &str, pod: &str, line: &str, timeout: Duration) -> String {
    eventually(timeout, || {
        let logs = run("kubectl", &["logs", "-n", namespace, pod]);
        Ok(
            (logs.success && logs.stdout.lines().any(|printed| printed == line))
                .then_some(logs.stdout),
        )
    })
    .unwrap_or_else(|error| {
        panic!(
            "pod {namespace}/{pod} never printed {line:?}: {error:#}\nlast logs:\n{}",
            run("kubectl", &["logs", "-n", namespace, pod]).stderr
        )
    })
}

/// Deletes a pod and waits until the kubelet has stopped it and the API server forgot it.
pub fn delete_pod(namespace: &str, name: &str) {
    kubectl(&[
        "delete",
        "pod",
        "-n",
        namespace,
        name,
        "--wait=true",
        "--timeout=60s",
    ]);
}

/// The last lines of the logs of the pods labelled `app=<app>`, for a failure message.
pub fn app_logs(namespace: &str, app: &str) -> String {
    let selector = format!("app={app}");
    run(
        "kubectl",
        &["logs", "-n", namespace, "-l", &selector, "--tail=40"],
    )
    .stdout
}

//! The real node: a kubelet on containerd, added by `cargo xtask e2e --real-node` (`cluster add-real-node`), whose
//! pods are real containers from the images `cargo xtask images --push` built and pushed to the cluster's local
//! registry, from which containerd pulls them as a user's node pulls from a registry. The suite gets:
//! - `E2E_REAL_NODE`: the node's name;
//! - `E2E_REAL_NODE_KUBELET_ROOT`: its kubelet's `--root-dir`;
//! - `E2E_REAL_NODE_CONTAINERD_SOCKET`: its containerd's socket, for `ctr`;
//! - `E2E_IMAGES_JSON`: what `cargo xtask images` built and pushed (reference, index digest, platforms of each);
//! - `E2E_IMAGE_REGISTRY`: the local registry (`127.0.0.1:<port>`), the chart's `global.imageRegistry`.

use std::path::Path;
use std::time::Duration;

use harness::images::Built;
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

/// The local registry the images were pushed to, `127.0.0.1:<port>`.
pub fn registry() -> String {
    std::env::var("E2E_IMAGE_REGISTRY").unwrap_or_else(|_| {
        panic!("E2E_IMAGE_REGISTRY is not set: run the suite with `cargo xtask e2e --real-node`")
    })
}

/// The image `cargo xtask images --push` built and pushed whose name is `name`.
pub fn image(name: &str) -> Built {
    let path = std::env::var("E2E_IMAGES_JSON").unwrap_or_else(|_| {
        panic!("E2E_IMAGES_JSON is not set: run the suite with `cargo xtask e2e --real-node`")
    });
    Built::read_all(Path::new(&path))
        .unwrap_or_else(|error| panic!("{error:#}"))
        .into_iter()
        .find(|built| built.name() == name)
        .unwrap_or_else(|| panic!("{path} lists no image {name}"))
}

/// One image in containerd's list (`ctr -n k8s.io images ls`) on the real node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeImage {
    pub reference: String,
    /// The media type of what the reference resolved to (an image index for ours).
    pub media_type: String,
    pub digest: String,
    /// The platforms the image names, as ctr prints them (`linux/amd64,linux/arm64`).
    pub platforms: String,
    /// The line as ctr printed it.
    pub line: String,
}

/// The images containerd holds for the kubelet (namespace `k8s.io`), as `ctr images ls` lists them.
pub fn node_images() -> Vec<NodeImage> {
    let socket = std::env::var("E2E_REAL_NODE_CONTAINERD_SOCKET").unwrap_or_else(|_| {
        panic!("E2E_REAL_NODE_CONTAINERD_SOCKET is not set: run the suite with `cargo xtask e2e --real-node`")
    });
    let listing = run(
        "ctr",
        &["--address", &socket, "-n", "k8s.io", "images", "ls"],
    );
    assert!(listing.success, "ctr images ls failed: {}", listing.stderr);
    parse_image_list(&listing.stdout)
}

/// `ctr images ls` lines: REF TYPE DIGEST SIZE PLATFORMS LABELS, where SIZE is two words (`10.2 MiB`).
fn parse_image_list(listing: &str) -> Vec<NodeImage> {
    listing
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // After REF (itself a digest for the image's ID entry) and TYPE.
            let digest = 2 + fields
                .iter()
                .skip(2)
                .position(|field| field.starts_with("sha256:"))?;
            Some(NodeImage {
                reference: fields.first()?.to_string(),
                media_type: fields.get(1)?.to_string(),
                digest: fields[digest].to_string(),
                platforms: fields
                    .iter()
                    .skip(digest + 1)
                    .find(|field| field.contains('/'))
                    .map_or_else(String::new, |field| field.to_string()),
                line: line.to_owned(),
            })
        })
        .collect()
}

/// Checks that containerd pulled `image` by its pushed reference and holds it with the pushed index's digest and
/// both platforms; prints containerd's line for it.
pub fn assert_pulled(image: &Built) {
    let images = node_images();
    let pulled = images
        .iter()
        .find(|listed| listed.reference == image.reference)
        .unwrap_or_else(|| {
            panic!(
                "containerd holds no {}: {:#?}",
                image.reference,
                images.iter().map(|listed| &listed.line).collect::<Vec<_>>()
            )
        });
    println!("containerd: {}", pulled.line);
    assert_eq!(
        pulled.media_type, "application/vnd.oci.image.index.v1+json",
        "{pulled:?}"
    );
    assert_eq!(pulled.digest, image.digest, "{pulled:?}");
    for platform in ["linux/amd64", "linux/arm64"] {
        assert!(
            image
                .platform_names()
                .iter()
                .any(|pushed| pushed == platform),
            "the pushed index of {} has no {platform}: {:?}",
            image.reference,
            image.platform_names()
        );
        assert!(
            pulled.platforms.split(',').any(|listed| listed == platform),
            "containerd's index of {} names no {platform}: {pulled:?}",
            image.reference
        );
    }
}

/// A pod of one container on the real node, with `env`, its image pulled from the registry if the node lacks
/// it; it stops at once when deleted.
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
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "IfNotPresent", "env": env}]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ctr_image_lists() {
        let listing = "\
REF                                                  TYPE                                    DIGEST                  SIZE     PLATFORMS                   LABELS
127.0.0.1:40001/gpu-operator-rs/pause:0.1.0          application/vnd.oci.image.index.v1+json sha256:aa               297.5 KiB linux/amd64,linux/arm64 io.cri-containerd.image=managed
sha256:bb                                            application/vnd.oci.image.index.v1+json sha256:aa               297.5 KiB linux/amd64,linux/arm64 io.cri-containerd.image=managed
";
        let images = parse_image_list(listing);
        assert_eq!(images.len(), 2);
        assert_eq!(
            images[0].reference,
            "127.0.0.1:40001/gpu-operator-rs/pause:0.1.0"
        );
        assert_eq!(
            images[0].media_type,
            "application/vnd.oci.image.index.v1+json"
        );
        assert_eq!(images[0].digest, "sha256:aa");
        assert_eq!(images[0].platforms, "linux/amd64,linux/arm64");
        assert_eq!(images[1].digest, "sha256:aa");
    }
}

//! Test fixtures for rendering: specs written as users write them (JSON of the ClusterPolicy spec), validated
//! with example default images, GPU nodes from a small builder, and golden snapshots under `snapshots/`.

use serde_json::Value;

use super::{RenderedObject, render};
use crate::model::{
    ClusterFacts, Component, ContainerRuntime, DefaultImages, GpuNodeFacts, OsPool,
    ValidatedPolicy, validate,
};

pub(super) const NAMESPACE: &str = "gpu-operator";

/// An example image for every variable the operator reads, shaped like the real ones.
pub(crate) fn default_images() -> DefaultImages {
    let images = [
        ("DRIVER_IMAGE", "nvcr.io/nvidia/driver:570.172.08"),
        (
            "CONTAINER_TOOLKIT_IMAGE",
            "nvcr.io/nvidia/k8s/container-toolkit:v1.17.8-ubuntu20.04",
        ),
        (
            "DEVICE_PLUGIN_IMAGE",
            "registry.example/gpu-operator/device-plugin:0.1.0",
        ),
        (
            "DCGM_EXPORTER_IMAGE",
            "registry.example/gpu-operator/node-agent:0.1.0",
        ),
        (
            "DCGM_IMAGE",
            "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
        ),
        (
            "GFD_IMAGE",
            "registry.example/gpu-operator/node-agent:0.1.0",
        ),
        (
            "VALIDATOR_IMAGE",
            "registry.example/gpu-operator/node-agent:0.1.0",
        ),
        (
            "MIG_MANAGER_IMAGE",
            "registry.example/gpu-operator/node-agent:0.1.0",
        ),
        (
            "DRIVER_MANAGER_IMAGE",
            "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.0",
        ),
        (
            "DRA_DRIVER_IMAGE",
            "registry.example/gpu-operator/dra-driver:0.1.0",
        ),
    ];
    assert_eq!(
        images.len(),
        DefaultImages::VARIABLES.len(),
        "an image for every variable"
    );
    DefaultImages(
        images
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect(),
    )
}

/// A policy from a spec written as JSON, as in a ClusterPolicy's `spec`.
pub(super) fn policy(spec: Value) -> ValidatedPolicy {
    policy_with(spec, &default_images())
}

pub(super) fn policy_with(spec: Value, images: &DefaultImages) -> ValidatedPolicy {
    let spec = serde_json::from_value(spec).expect("the test spec is a valid ClusterPolicy spec");
    validate(&spec, images).expect("the test spec validates")
}

/// A GPU node: ubuntu 22.04, kernel 5.15.0-119-generic, containerd, unless changed.
#[derive(Clone, Debug)]
pub(super) struct Node(GpuNodeFacts);

pub(super) fn node(name: &str) -> Node {
    Node(GpuNodeFacts {
        name: name.into(),
        os: Some(OsPool {
            id: "ubuntu".into(),
            version_id: "22.04".into(),
        }),
        kernel: Some("5.15.0-119-generic".into()),
        runtime: ContainerRuntime::Containerd,
    })
}

impl Node {
    pub(super) fn os(mut self, id: &str, version_id: &str) -> Self {
        self.0.os = Some(OsPool {
            id: id.into(),
            version_id: version_id.into(),
        });
        self
    }

    pub(super) fn kernel(mut self, kernel: &str) -> Self {
        self.0.kernel = Some(kernel.into());
        self
    }

    pub(super) fn runtime(mut self, runtime: ContainerRuntime) -> Self {
        self.0.runtime = runtime;
        self
    }
}

pub(super) fn facts(nodes: impl IntoIterator<Item = Node>) -> ClusterFacts {
    ClusterFacts {
        namespace: NAMESPACE.into(),
        gpu_nodes: nodes.into_iter().map(|n| n.0).collect(),
        nvidia_drivers: Vec::new(),
        nvidia_driver_pool: None,
    }
}

/// One ubuntu22.04 containerd GPU node.
pub(super) fn one_node() -> ClusterFacts {
    facts([node("gpu-0")])
}

/// The rendered objects of one component, as the JSON the apply layer sends.
pub(super) fn objects_of(objects: &[RenderedObject], component: Component) -> Vec<Value> {
    objects
        .iter()
        .filter(|o| o.component() == component)
        .map(RenderedObject::to_json)
        .collect()
}

/// Renders `spec` on `facts` and returns the objects of `component` as JSON.
pub(super) fn render_component(
    spec: Value,
    facts: &ClusterFacts,
    component: Component,
) -> Vec<Value> {
    objects_of(&render(&policy(spec), facts), component)
}

/// The names of the objects of `component`.
pub(super) fn names(objects: &[Value]) -> Vec<&str> {
    objects
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap_or_default())
        .collect()
}

/// The first container named `name` (init or main) of a rendered DaemonSet.
pub(super) fn container<'a>(daemonset: &'a Value, name: &str) -> &'a Value {
    let pod = &daemonset["spec"]["template"]["spec"];
    ["initContainers", "containers"]
        .iter()
        .filter_map(|key| pod[key].as_array())
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in {}", daemonset["metadata"]["name"]))
}

/// The host path of a DaemonSet's volume `name`.
pub(super) fn host_path_of<'a>(daemonset: &'a Value, name: &str) -> &'a str {
    daemonset["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|volume| volume["name"] == name)
        .and_then(|volume| volume["hostPath"]["path"].as_str())
        .unwrap_or_else(|| panic!("no hostPath volume {name}"))
}

/// The value of env var `name` in a rendered container.
pub(super) fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

/// A golden snapshot in `snapshots/<name>.snap`.
pub(super) fn snapshot(name: &str, objects: &[Value]) {
    insta::with_settings!({ prepend_module_to_snapshot => false, omit_expression => true }, {
        insta::assert_yaml_snapshot!(name, objects);
    });
}

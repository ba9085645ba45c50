//! The DRA driver (`gpu-node-agent dra-driver`, ClusterPolicy `draDriver`, ours): the kubelet plugin of driver
//! `gpu.nvidia.com`. It registers in the kubelet's plugin registry, serves in the kubelet's plugins directory,
//! writes per-claim CDI specs where the runtime reads them, and keeps claims' MPS pipes in a host directory that
//! containers mount.

use crd::paths::{CDI_DIR, MPS_ROOT};

use super::RenderedObject;
use super::common::{
    Awaits, HostMount, OperandDaemonSet, container, env, node_name_env, privileged,
};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

/// Where the host's `/dev` is mounted: device nodes found there go into the CDI specs.
const HOST_DEV: &str = "/host/dev";

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let spec = &policy.spec.dra_driver;
    let kubelet_root = policy.spec.host_paths.kubelet_root_dir.as_str();
    let registry = format!("{}/plugins_registry", kubelet_root.trim_end_matches('/'));
    let plugins = format!("{}/plugins", kubelet_root.trim_end_matches('/'));
    let command = vec![
        "gpu-node-agent",
        "dra-driver",
        "--kubelet-root",
        kubelet_root,
        "--cdi-root",
        CDI_DIR,
        "--mps-root",
        MPS_ROOT,
        "--dev-root",
        HOST_DEV,
    ];
    let mut ds = OperandDaemonSet::new(policy, facts, Component::DraDriver);
    ds.main = container(Component::DraDriver.app_name(), command);
    ds.main.env = Some(vec![
        node_name_env(),
        env("DRA_GPUS", spec.gpus()),
        env("DRA_SHARED_GPUS", spec.shared_gpus()),
    ]);
    // Privileged: it starts MPS control daemons for claims on shared GPUs, which open the GPUs' device nodes.
    ds.main.security_context = privileged();
    ds.mount(&HostMount::same("plugins-registry", &registry));
    ds.mount(&HostMount::same("plugins", &plugins));
    ds.mount(&HostMount::same("cdi-root", CDI_DIR).create());
    ds.mount(&HostMount::same("mps-root", MPS_ROOT).create());
    ds.mount(&HostMount::new("host-dev", "/dev", HOST_DEV).read_only());
    ds.await_validation(Awaits::DriverAndToolkit);
    vec![ds.build().into()]
}

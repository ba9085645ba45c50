//! The DRA driver (`gpu-dra-driver run`, its own image, ClusterPolicy `draDriver`, ours): the kubelet plugin of driver
//! `gpu.nvidia.com`. It registers in the kubelet's plugin registry, serves in the kubelet's plugins directory,
//! writes per-claim CDI specs where the runtime reads them, keeps claims' MPS pipes in a host directory that
//! containers mount, and its checkpoint in a host directory of its own.

use crd::paths::{CDI_DIR, DRA_STATE_DIR, MPS_ROOT};

use super::RenderedObject;
use super::common::{
    Awaits, HostMount, OperandDaemonSet, RootFs, container, env, gpu_access_env, node_name_env,
    privileged,
};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

/// Where the host's `/dev` is mounted: device nodes found there go into the CDI specs.
const HOST_DEV: &str = "/host/dev";

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let spec = &policy.spec.dra_driver;
    let kubelet_root = policy.spec.host_paths.kubelet_root_dir.as_str();
    let registry = format!("{}/plugins_registry", kubelet_root.trim_end_matches('/'));
    // Its own folder under the kubelet's plugins (its socket, and where 0.1.0 kept its checkpoint), not the other
    // drivers'.
    let plugin = format!(
        "{}/plugins/{}",
        kubelet_root.trim_end_matches('/'),
        crd::dra::DRIVER
    );
    let command = vec![
        "gpu-dra-driver",
        "run",
        "--kubelet-root",
        kubelet_root,
        "--cdi-root",
        CDI_DIR,
        "--mps-root",
        MPS_ROOT,
        "--state-dir",
        DRA_STATE_DIR,
        "--dev-root",
        HOST_DEV,
    ];
    let mut ds = OperandDaemonSet::new(policy, facts, Component::DraDriver);
    ds.main = container(Component::DraDriver.app_name(), command);
    let mut env = vec![
        node_name_env(),
        env("DRA_GPUS", spec.gpus()),
        env("DRA_SHARED_GPUS", spec.shared_gpus()),
        env("DRA_DYNAMIC_MIG_GPUS", spec.dynamic_mig()),
    ];
    // Where the toolkit this operator installs can apply GPU memory limits (1.20.1+), the driver holds shared claims'
    // memory through its hook on R615+ GPUs.
    if policy.is_enabled(Component::ContainerToolkit)
        && let Some(hook) = policy
            .spec
            .toolkit
            .memory_limit_hook(policy.image(Component::ContainerToolkit))
    {
        env.push(self::env("MEMORY_LIMIT_HOOK", hook));
    }
    env.extend(gpu_access_env());
    ds.main.env = Some(env);
    // Privileged, as NVIDIA's DRA kubelet plugin, for a reason that holds on real GPUs: preparing a claim for a MIG
    // device creates it (CAP_SYS_ADMIN and the MIG configuration capability device of every GPU), and claims on
    // shared GPUs get MPS control daemons, which open the GPUs' device nodes.
    ds.main.security_context = privileged(RootFs::ReadOnly);
    ds.mount(&HostMount::same("plugins-registry", &registry));
    ds.mount(&HostMount::same("plugin", &plugin).create());
    ds.mount(&HostMount::same("cdi-root", CDI_DIR).create());
    ds.mount(&HostMount::same("mps-root", MPS_ROOT).create());
    // Its checkpoint of prepared claims, on the host's tmpfs: state of this boot, written at every prepare.
    ds.mount(&HostMount::same("state", DRA_STATE_DIR).create());
    // The host's /dev, read-only: device nodes made after the container started (a new MIG device's) appear
    // there, not in the container's own /dev.
    ds.mount(&HostMount::new("host-dev", "/dev", HOST_DEV).read_only());
    ds.await_validation(Awaits::DriverAndToolkit);
    vec![ds.build().into()]
}

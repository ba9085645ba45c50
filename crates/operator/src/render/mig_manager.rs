//! The MIG manager (`gpu-node-agent mig`): applies the geometry each node's `nvidia.com/mig.config` label names,
//! from the mig-parted ConfigMap. `WITH_REBOOT=true` reaches it through `migManager.env`, which the shared
//! builder layers over the operator's env. It asks the kubelet's pod-resources socket which pods hold the GPUs a
//! change disturbs, so that only those are evicted.

use super::RenderedObject;
use super::common::{
    Awaits, HostMount, NODE_AGENT, OperandDaemonSet, config_map_name, container, namespace_env,
    node_name_env, privileged,
};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let spec = &policy.spec.mig_manager;
    let kubelet_root = policy.spec.host_paths.kubelet_root_dir.as_str();
    // Without a `config` section, the schema's defaults: the built-in geometries, all-disabled. An empty name is
    // the built-in geometries too (NVIDIA's chart writes `name: ""`).
    let config = spec.config.clone().unwrap_or_default();
    let (config_map, default) = (config.config_map_name(), config.default.as_str());
    let mut command = vec![
        NODE_AGENT,
        "mig",
        "--config-map",
        config_map,
        "--kubelet-root",
        kubelet_root,
    ];
    // An empty default leaves unlabelled nodes alone: no flag.
    if !default.is_empty() {
        command.extend(["--default-config", default]);
    }
    if let Some(clients) = config_map_name(spec.gpu_clients_config.as_ref()) {
        command.extend(["--gpu-clients-config-map", clients]);
    }

    let mut ds = OperandDaemonSet::new(policy, facts, Component::MigManager);
    ds.main = container("nvidia-mig-manager", command);
    ds.main.env = Some(vec![node_name_env(), namespace_env(facts)]);
    // Privileged, host PID and IPC: MIG changes need every GPU process in sight, and with WITH_REBOOT the
    // manager reboots the node and stops GPU clients (systemd services) through the host's root.
    ds.main.security_context = privileged();
    ds.host_pid = true;
    ds.host_ipc = true;
    ds.mount(&HostMount::same("sys", "/sys"));
    ds.mount(&HostMount::validations());
    // At the same path, so that `--kubelet-root` names it inside the container too. Read-only: the agent only
    // connects to the socket, which a read-only mount allows.
    ds.mount(&HostMount::pod_resources(policy));
    ds.mount(
        &HostMount::new("host-root", &policy.spec.host_paths.root_fs, "/host")
            .propagation("HostToContainer"),
    );
    ds.await_validation(Awaits::DriverAndToolkit);
    vec![ds.build().into()]
}

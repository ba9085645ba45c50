//! The MIG manager (`gpu-node-agent mig`): applies the geometry each node's `nvidia.com/mig.config` label names,
//! from the mig-parted ConfigMap. `WITH_REBOOT=true` reaches it through `migManager.env`, which the shared
//! builder layers over the operator's env, and with it the pod shares the host's PID namespace (the reboot signals
//! the host's systemd). It asks the kubelet's pod-resources socket which pods hold the GPUs a
//! change disturbs, so that only those are evicted.

use crd::cluster_policy::EnvVar;

use super::RenderedObject;
use super::common::{
    Awaits, HostMount, NODE_AGENT, OperandDaemonSet, RootFs, config_map_name, container,
    gpu_access_env, namespace_env, node_name_env, privileged,
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
    let mut env = vec![node_name_env(), namespace_env(facts)];
    env.extend(gpu_access_env());
    let dra = &policy.spec.dra_driver;
    if dra.is_enabled() {
        // The DRA driver's GPUs served as MIG on demand, whose instances a config leaves to it.
        env.push(super::common::env("DRA_GPUS", dra.gpus()));
        env.push(super::common::env(
            "DRA_DYNAMIC_MIG_GPUS",
            dra.dynamic_mig(),
        ));
    }
    ds.main.env = Some(env);
    // Privileged, as NVIDIA's MIG manager, for a reason that holds on real GPUs: changing MIG geometry needs
    // CAP_SYS_ADMIN and the MIG configuration capability device of every GPU (/dev/nvidia-caps), and a GPU reset
    // (`nvidia-smi --gpu-reset`) needs every GPU's device nodes and the host's sysfs writable.
    ds.main.security_context = privileged(RootFs::ReadOnly);
    // The reboot signals the host's systemd (PID 1 of the host's PID namespace): only when it may reboot.
    ds.host_pid = with_reboot(&spec.container.env);
    // At the same path, so that `--kubelet-root` names it inside the container too. Read-only: the agent only
    // connects to the socket, which a read-only mount allows.
    ds.mount(&HostMount::pod_resources(policy));
    ds.await_validation(Awaits::DriverAndToolkit);
    vec![ds.build().into()]
}

/// Whether `migManager.env` lets the manager reboot: `WITH_REBOOT` as the agent reads it (the last one set wins,
/// and only `true` is true).
fn with_reboot(env: &[EnvVar]) -> bool {
    env.iter()
        .rev()
        .find(|var| var.name == "WITH_REBOOT")
        .is_some_and(|var| var.value.as_deref() == Some("true"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(value: &str) -> EnvVar {
        EnvVar {
            name: "WITH_REBOOT".into(),
            value: Some(value.into()),
        }
    }

    #[test]
    fn only_the_last_with_reboot_counts_and_only_true_is_true() {
        assert!(with_reboot(&[var("false"), var("true")]));
        assert!(!with_reboot(&[var("true"), var("false")]));
        assert!(
            !with_reboot(&[var("yes")]),
            "the agent accepts only true and false"
        );
        assert!(!with_reboot(&[]));
    }
}

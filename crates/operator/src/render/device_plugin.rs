//! The device plugin (`gpu-device-plugin`): registers GPUs, MIG devices and shared replicas with the kubelet.
//! It reads its named configurations from the ConfigMap itself and follows edits without a restart, so the
//! DaemonSet only names the ConfigMap and the default key.

use crd::ClusterPolicySpec;
use crd::paths::{CDI_DIR, DEVICE_PLUGINS_DIR, MPS_ROOT};

use super::RenderedObject;
use super::common::{
    Awaits, HostMount, OperandDaemonSet, RootFs, container, gpu_access_env, namespace_env,
    node_name_env, privileged,
};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let spec = &policy.spec;
    let mps_root = spec
        .device_plugin
        .mps
        .as_ref()
        // The section's own default when it is set.
        .map_or(MPS_ROOT, |mps| mps.root.as_str());
    let mut command = vec!["gpu-device-plugin".to_owned(), "run".into()];
    command.extend(mig_strategy_flag(policy));
    command.extend(["--mps-root".into(), mps_root.into()]);
    command.extend(config_flags(spec, "--config-map"));
    if spec.cdi.enabled.unwrap_or(true) {
        command.push("--cdi".into());
    }

    let mut ds = OperandDaemonSet::new(policy, facts, Component::DevicePlugin);
    ds.main = container("nvidia-device-plugin", command);
    let mut env = vec![node_name_env(), namespace_env(facts)];
    env.extend(gpu_access_env());
    if spec.dra_driver.is_enabled() {
        // The GPUs the DRA driver takes, which the plugin leaves out (a node's label may override both alike).
        env.push(super::common::env("DRA_GPUS", spec.dra_driver.gpus()));
    }
    ds.main.env = Some(env);
    // Privileged, as NVIDIA's device plugin in its operator, for a reason that holds on real GPUs: listing MIG
    // devices needs the MIG capability device nodes (/dev/nvidia-caps), which the runtime gives only to a container
    // with CAP_SYS_ADMIN, and whether a node uses MIG is its config's choice at run time; the plugin also checks
    // every GPU's health and starts MPS control daemons on them.
    ds.main.security_context = privileged(RootFs::ReadOnly);
    ds.mount(&HostMount::same("device-plugins", DEVICE_PLUGINS_DIR));
    ds.mount(&HostMount::same("mps-root", mps_root).create());
    ds.mount(&HostMount::same("cdi-root", CDI_DIR).create());
    ds.await_validation(Awaits::DriverAndToolkit);
    vec![ds.build().into()]
}

/// `--mig-strategy <mig.strategy>` for the device plugin and for feature discovery alike, so that both apply the
/// same precedence to the same input (`crd::config::device_plugin::node_config`). Nothing when `mig.strategy` is
/// unset, as NVIDIA's operator leaves `MIG_STRATEGY` unset then: both take the config file's `flags.migStrategy`,
/// else none.
pub(super) fn mig_strategy_flag(policy: &ValidatedPolicy) -> Vec<String> {
    policy
        .mig_strategy
        .map(|strategy| vec!["--mig-strategy".to_owned(), strategy.as_str().to_owned()])
        .unwrap_or_default()
}

/// `<map_flag> <devicePlugin.config.name>` and `--default-config <devicePlugin.config.default>`, for the device
/// plugin and for feature discovery (sharing changes the labels it writes). Nothing when no ConfigMap is named:
/// an empty name is how users turn time-slicing off.
pub(super) fn config_flags(spec: &ClusterPolicySpec, map_flag: &str) -> Vec<String> {
    let Some(config) = spec.device_plugin.config.as_ref() else {
        return Vec::new();
    };
    let Some(name) = config.name.as_deref().filter(|name| !name.is_empty()) else {
        return Vec::new();
    };
    let mut flags = vec![map_flag.to_owned(), name.to_owned()];
    if let Some(default) = config
        .default
        .as_deref()
        .filter(|default| !default.is_empty())
    {
        flags.extend(["--default-config".to_owned(), default.to_owned()]);
    }
    flags
}

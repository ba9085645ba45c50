//! GPU feature discovery (`gpu-node-agent discovery`): publishes the `nvidia.com/gpu.*` node labels. It reads
//! the device-plugin configuration too, because sharing changes the labels (replicas, `-SHARED` products).

use super::RenderedObject;
use super::common::{
    Awaits, NODE_AGENT, OperandDaemonSet, RootFs, User, confined, container, gpu_access_env,
    namespace_env, node_name_env,
};
use super::device_plugin::{config_flags, mig_strategy_flag};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let mut command: Vec<String> = [NODE_AGENT, "discovery"].map(String::from).into();
    command.extend(mig_strategy_flag(policy));
    command.extend(config_flags(&policy.spec, "--device-plugin-config-map"));

    let mut ds = OperandDaemonSet::new(policy, facts, Component::GpuFeatureDiscovery);
    ds.main = container(Component::GpuFeatureDiscovery.app_name(), command);
    // The namespace of the device-plugin ConfigMap it reads.
    let mut env = vec![node_name_env(), namespace_env(facts)];
    env.extend(gpu_access_env());
    ds.main.env = Some(env);
    // Root without capabilities: NVML lists MIG devices (the `mig-*` labels) only to holders of the MIG monitor
    // capability device (/dev/nvidia-caps), which is root's only. Its DMI and PCI files are the container's own
    // read-only sysfs.
    ds.main.security_context = confined(User::Root, &[], RootFs::ReadOnly);
    ds.await_validation(Awaits::DriverAndToolkit);
    vec![ds.build().into()]
}

//! GPU feature discovery (`gpu-node-agent discovery`): publishes the `nvidia.com/gpu.*` node labels. It reads
//! the device-plugin configuration too, because sharing changes the labels (replicas, `-SHARED` products).

use super::RenderedObject;
use super::common::{
    Awaits, NODE_AGENT, OperandDaemonSet, container, namespace_env, node_name_env,
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
    ds.main.env = Some(vec![node_name_env(), namespace_env(facts)]);
    ds.await_validation(Awaits::DriverAndToolkit);
    vec![ds.build().into()]
}

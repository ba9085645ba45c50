//! The per-node agent, `gpu-node-agent`: one binary, several roles, each a subcommand the operator's DaemonSets
//! run (`crates/operator/src/render/` fixes their command lines).
//!
//! - [`mig`]: the MIG manager, which applies the geometry the node's `nvidia.com/mig.config` label names, never
//!   leaving GPU clients paused, and its admin CLI (`mig plan|apply|assert`).
//! - [`discovery`]: GPU feature discovery, the `nvidia.com/gpu.*` node labels.
//! - [`node_facts`]: Node Feature Discovery's PCI, OS and kernel labels, for clusters without NFD.
//! - [`validate`]: the validator's steps, ready files that operands' init containers wait for.
//! - [`exporter`]: DCGM-exporter compatible GPU metrics, attributed to pods through the kubelet, with each pod's
//!   own GPU memory from [`accounting`].
//! - [`watchdog`]: the GPU memory watchdog, which signals the processes of a pod over its budget on a shared GPU.
//! - [`accounting`]: which pod and container each GPU process belongs to (its cgroup, the node's pods).
//! - [`simulator_tool`]: for tests, faults injected into a simulated node and its MIG devices listed.
//!
//! Every role that talks to the cluster keeps the node's GPUNode status current. What the roles share with the
//! device plugin and the DRA driver (GPU source and inventory, own-Node and GPUNode I/O, the run loop, logging) is the `node-runtime`
//! crate. Decisions are pure functions (`mig::state`, `mig::assess`, `mig::clients`, `mig::holders`,
//! `discovery::labels`, `exporter::config`, `exporter::families`, `accounting::cgroup`, `watchdog::budget`,
//! `watchdog::assess`, `watchdog::decide`); I/O sits in `mig::drain`, `pod_resources` (the
//! kubelet's PodResources API), `exporter::collect`, `exporter::server` and the runners.

pub mod accounting;
pub mod cli;
pub mod discovery;
pub mod exporter;
pub mod mig;
pub mod node_facts;
mod pod_resources;
pub mod simulator_tool;
pub mod status_exporter;
pub mod validate;
pub mod watchdog;

#[cfg(test)]
mod dashboard_tests;

/// Builders the unit tests of several roles share.
#[cfg(test)]
pub(crate) mod test_support {
    use k8s_openapi::api::core::v1::ConfigMap;

    /// A ConfigMap holding `data`, key by key.
    pub fn config_map(data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            data: Some(
                data.iter()
                    .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                    .collect(),
            ),
            ..ConfigMap::default()
        }
    }
}

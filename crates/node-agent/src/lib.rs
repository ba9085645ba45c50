//! The per-node agent, `gpu-node-agent`: one binary, several roles, each a subcommand the operator's DaemonSets
//! run (`crates/operator/src/render/` fixes their command lines).
//!
//! - [`mig`]: the MIG manager, which applies the geometry the node's `nvidia.com/mig.config` label names, never
//!   leaving GPU clients paused, and its admin CLI (`mig plan|apply|assert`).
//! - [`discovery`]: GPU feature discovery, the `nvidia.com/gpu.*` node labels.
//! - [`node_facts`]: Node Feature Discovery's PCI, OS and kernel labels, for clusters without NFD.
//! - [`validate`]: the validator's steps, ready files that operands' init containers wait for.
//! - [`exporter`]: DCGM-exporter compatible GPU metrics, attributed to pods through the kubelet.
//! - [`simulator_tool`]: for tests, faults injected into a simulated node and its MIG devices listed.
//!
//! Every role that talks to the cluster keeps the node's GPUNode status current ([`gpunode`]). GPUs come from
//! NVML or the simulator ([`backend`]). Decisions are pure functions (`mig::state`, `mig::assess`,
//! `mig::clients`, `mig::holders`, `discovery::labels`, `exporter::config`, `exporter::families`); I/O sits in
//! `kube_io`, `gpunode`, `mig::drain`, `pod_resources` (the kubelet's PodResources API), `exporter::collect`,
//! `exporter::server` and the runners.

pub mod backend;
pub mod cli;
pub mod discovery;
pub mod exporter;
pub mod gpunode;
pub mod inventory;
pub mod kube_io;
pub mod mig;
pub mod node_facts;
pub mod node_patch;
pub mod pod_resources;
pub mod simulator_tool;
pub mod status_exporter;
pub mod validate;

use std::time::Duration;

/// Growing waits between retries of something that failed (1 s doubling to 30 s), so that an API server outage
/// is neither hammered nor waited out for long once it ends.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);

    /// The wait before the next retry; each call doubles the following one.
    pub fn delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    /// Waits for the next retry.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.delay()).await;
    }

    /// Waits for the next retry, or less when `sooner` completes first (new input makes retrying worthwhile).
    pub async fn wait_or<F: Future>(&mut self, sooner: F) {
        tokio::select! {
            () = self.wait() => {}
            _ = sooner => {}
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_limit_and_resets() {
        let mut backoff = Backoff::default();
        let delays: Vec<u64> = (0..7).map(|_| backoff.delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        backoff.reset();
        assert_eq!(backoff.delay().as_secs(), 1);
    }
}

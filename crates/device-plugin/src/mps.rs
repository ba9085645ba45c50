//! MPS control daemons, one per MPS-shared resource, with the per-replica limits set as the daemon's defaults, so
//! that every client of the resource is held to its share of device memory and SMs (memory isolation without
//! LD_PRELOAD). Allocate hands the same limits to the container as environment (see `allocate`), which a client
//! can only lower.
//!
//! [`daemons`] decides what should run (pure); [`MpsDaemons`] starts and stops them through `node_runtime::mps`,
//! which needs the driver: with simulated GPUs nothing is started and the plugin says so once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crd::config::device_plugin::{ResourceName, SharingStrategy};
use node_runtime::mps::{self, Daemon};
use tracing::{info, warn};

use crate::allocate::mps_pipe_dir;
use crate::plan::Plan;

/// The daemons `plan` needs: one per resource shared with MPS, over its replicated devices.
#[must_use]
pub fn daemons(plan: &Plan) -> BTreeMap<ResourceName, Daemon> {
    plan.iter()
        .filter(|(_, resource)| {
            resource
                .shared
                .is_some_and(|shared| shared.strategy == SharingStrategy::Mps)
        })
        .filter_map(|(name, resource)| {
            let mut daemon = Daemon {
                uuids: Vec::new(),
                thread_percentage: 100,
                memory_limits_mib: Vec::new(),
            };
            for device in resource.devices.iter().filter(|device| device.replicas > 1) {
                if !daemon.uuids.contains(&device.uuid) {
                    daemon.uuids.push(device.uuid.clone());
                    daemon
                        .memory_limits_mib
                        .push(device.memory_mib / u64::from(device.replicas));
                    daemon.thread_percentage = daemon.thread_percentage.min(100 / device.replicas);
                }
            }
            (!daemon.uuids.is_empty()).then(|| (name.clone(), daemon))
        })
        .collect()
}

/// The running control daemons.
#[derive(Debug)]
pub struct MpsDaemons {
    root: PathBuf,
    /// False on simulated GPUs: there is no driver to start a daemon for.
    enabled: bool,
    running: BTreeMap<ResourceName, Daemon>,
}

impl MpsDaemons {
    /// Daemons under `root` (`<root>/<resource>/pipe` and `/log`); none are started unless `enabled`.
    #[must_use]
    pub fn new(root: &Path, enabled: bool) -> Self {
        Self {
            root: root.to_owned(),
            enabled,
            running: BTreeMap::new(),
        }
    }

    /// Stops the daemons that are no longer wanted or changed, and starts the wanted ones that do not run.
    pub async fn reconcile(&mut self, wanted: BTreeMap<ResourceName, Daemon>) {
        if !self.enabled {
            if !wanted.is_empty() && self.running.is_empty() {
                warn!(
                    "MPS sharing on simulated GPUs: no control daemon is started (it needs the driver); Allocate still sets the limits"
                );
            }
            self.running = wanted;
            return;
        }
        let stale: Vec<ResourceName> = self
            .running
            .iter()
            .filter(|(name, daemon)| wanted.get(*name) != Some(daemon))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            self.running.remove(&name);
            if let Err(error) = mps::stop(&mps_pipe_dir(&self.root, &name)).await {
                warn!(resource = %name, %error, "cannot stop the MPS daemon");
            }
        }
        for (name, daemon) in wanted {
            if self.running.contains_key(&name) {
                continue;
            }
            let log = self.root.join(name.short_name()).join("log");
            match mps::start(&mps_pipe_dir(&self.root, &name), &log, &daemon).await {
                Ok(()) => {
                    info!(resource = %name, devices = daemon.uuids.len(), "MPS control daemon started with per-client limits");
                    self.running.insert(name, daemon);
                }
                Err(error) => {
                    warn!(resource = %name, %error, "cannot start the MPS control daemon")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crd::config::device_plugin::{MigStrategy, parse};
    use node_runtime::testing::simulated;

    use super::*;
    use crate::plan::advertise;
    use crate::plan::tests::planned;

    #[test]
    fn one_daemon_per_mps_resource_with_the_replica_share() {
        let (_dir, simulator) = simulated("a100-40gb:2", &[]);
        let config = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      devices: [1]\n      replicas: 4\n";
        let plan = advertise(
            &planned(&simulator),
            &parse(config).unwrap(),
            MigStrategy::None,
        )
        .unwrap();
        let wanted = daemons(&plan);
        let daemon = &wanted[&"nvidia.com/gpu".parse().unwrap()];
        assert_eq!(daemon.uuids.len(), 1, "only the shared GPU");
        assert_eq!(
            (
                daemon.thread_percentage,
                daemon.memory_limits_mib.as_slice()
            ),
            (25, &[10_240][..])
        );
        let sliced = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";
        let plan = advertise(
            &planned(&simulator),
            &parse(sliced).unwrap(),
            MigStrategy::None,
        )
        .unwrap();
        assert!(daemons(&plan).is_empty());
    }
}

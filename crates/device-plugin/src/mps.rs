//! MPS control daemons, one per MPS-shared resource, with the per-replica limits set as the daemon's defaults, so
//! that every client of the resource is held to its share of device memory and SMs (memory isolation without
//! LD_PRELOAD). Allocate hands the same limits to the container as environment (see `allocate`), which a client
//! can only lower.
//!
//! [`daemons`] decides what should run (pure); [`MpsDaemons`] starts and stops `nvidia-cuda-mps-control`, which
//! needs the driver: with simulated GPUs nothing is started and the plugin says so once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crd::config::device_plugin::{ResourceName, SharingStrategy};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tracing::{info, warn};

use crate::allocate::{MPS_PIPE_ENV, mps_pipe_dir};
use crate::plan::Plan;

/// The MPS control program of the driver.
const CONTROL: &str = "nvidia-cuda-mps-control";

/// What one resource's control daemon runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// The GPUs or MIG devices it serves (its `CUDA_VISIBLE_DEVICES`), by UUID.
    pub uuids: Vec<String>,
    /// Default share of the SMs per client, in percent.
    pub thread_percentage: u32,
    /// Default pinned device memory per client, in MiB, by position in `uuids`.
    pub memory_limits_mib: Vec<u64>,
}

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
            self.control(&name, "quit").await;
        }
        for (name, daemon) in wanted {
            if self.running.contains_key(&name) {
                continue;
            }
            if self.start(&name, &daemon).await {
                self.running.insert(name, daemon);
            }
        }
    }

    /// Starts a daemon and sets its default limits; false when it could not be started.
    async fn start(&self, name: &ResourceName, daemon: &Daemon) -> bool {
        let pipe = mps_pipe_dir(&self.root, name);
        let log = self.root.join(name.short_name()).join("log");
        for dir in [&pipe, &log] {
            if let Err(error) = std::fs::create_dir_all(dir) {
                warn!(resource = %name, %error, dir = %dir.display(), "cannot create the MPS directory");
                return false;
            }
        }
        let started = Command::new(CONTROL)
            .arg("-d")
            .env("CUDA_VISIBLE_DEVICES", daemon.uuids.join(","))
            .env(MPS_PIPE_ENV, &pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &log)
            .status()
            .await;
        if !started
            .as_ref()
            .is_ok_and(std::process::ExitStatus::success)
        {
            warn!(resource = %name, result = ?started, "cannot start the MPS control daemon");
            return false;
        }
        let mut commands = vec![format!(
            "set_default_active_thread_percentage {}",
            daemon.thread_percentage
        )];
        commands.extend(
            daemon
                .memory_limits_mib
                .iter()
                .enumerate()
                .map(|(position, limit)| {
                    format!("set_default_device_pinned_mem_limit {position} {limit}M")
                }),
        );
        self.control(name, &commands.join("\n")).await;
        info!(resource = %name, devices = daemon.uuids.len(), "MPS control daemon started with per-client limits");
        true
    }

    /// Sends commands to a resource's running daemon through `nvidia-cuda-mps-control`'s standard input.
    async fn control(&self, name: &ResourceName, commands: &str) {
        let child = Command::new(CONTROL)
            .env(MPS_PIPE_ENV, mps_pipe_dir(&self.root, name))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn();
        let sent = match child {
            Ok(mut child) => {
                let written = match child.stdin.take() {
                    Some(mut stdin) => stdin.write_all(format!("{commands}\n").as_bytes()).await,
                    None => Ok(()),
                };
                written.and(child.wait().await.map(drop))
            }
            Err(error) => Err(error),
        };
        if let Err(error) = sent {
            warn!(resource = %name, %error, "cannot control the MPS daemon");
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

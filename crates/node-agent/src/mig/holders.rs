//! Which pods may stay through a MIG change: those the kubelet's pod-resources answer shows holding GPU devices on
//! GPUs the change leaves alone, and only those. Pure, from one answer and one reading of the GPUs.
//!
//! A device ID (a GPU or MIG device UUID, with or without a replica suffix: see [`device_uuid`]) is traced to its
//! GPU through the UUIDs the agent read. Wherever the answer leaves a doubt, the pod counts as using a disturbed
//! GPU: an ID that matches no GPU read, or a pod that holds no GPU device in the answer (not admitted yet, so it
//! may still get one there, or unknown to the kubelet). Evicting a pod needlessly costs a restart; resetting a GPU or
//! destroying a MIG device under a running pod costs its work.

use std::collections::{BTreeMap, BTreeSet};

use crd::config::device_plugin::device_uuid;
use node_runtime::inventory::GpuView;

use crate::pod_resources::PodDevices;

/// Whether a resource is one of our GPU resources: whole or shared GPUs (`nvidia.com/gpu`,
/// `nvidia.com/gpu.shared`, ...) or MIG devices (`nvidia.com/mig-1g.10gb`, ...).
#[must_use]
pub fn is_gpu_resource(name: &str) -> bool {
    name.starts_with("nvidia.com/gpu") || name.starts_with("nvidia.com/mig-")
}

/// The GPUs a change disturbs, and which GPU each device UUID of the node is on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disturbed {
    gpus: BTreeSet<u32>,
    /// GPU UUIDs and MIG device UUIDs, to the GPU's index.
    owners: BTreeMap<String, u32>,
}

impl Disturbed {
    /// GPUs `gpus` (indexes) disturbed, on a node whose GPUs read as `views` before the change (the MIG device
    /// UUIDs the pods hold are those that exist before it).
    #[must_use]
    pub fn new(views: &[GpuView], gpus: impl IntoIterator<Item = u32>) -> Self {
        let owners = views
            .iter()
            .flat_map(|view| {
                let index = view.inventory.index;
                std::iter::once((view.inventory.uuid.clone(), index)).chain(
                    view.devices
                        .iter()
                        .map(move |(_, device)| (device.uuid.clone(), index)),
                )
            })
            .collect();
        Self {
            gpus: gpus.into_iter().collect(),
            owners,
        }
    }

    /// The disturbed GPUs' indexes.
    #[must_use]
    pub fn gpus(&self) -> &BTreeSet<u32> {
        &self.gpus
    }

    /// Whether a device ID is on a disturbed GPU; an ID of no GPU read counts as on one.
    fn touches(&self, device_id: &str) -> bool {
        self.owners
            .get(device_uuid(device_id))
            .is_none_or(|gpu| self.gpus.contains(gpu))
    }

    /// The pods (`namespace/name`) that may stay: the answer shows them holding GPU devices, none of them on a
    /// disturbed GPU. Every other pod that uses GPUs must leave.
    #[must_use]
    pub fn spared(&self, answer: &[PodDevices]) -> BTreeSet<String> {
        let (mut holding, mut touching) = (BTreeSet::new(), BTreeSet::new());
        for pod in answer {
            // Other device plugins' devices (NICs, FPGAs) say nothing about the GPUs.
            let mut ids = pod
                .devices()
                .filter(|(resource, _)| is_gpu_resource(resource))
                .map(|(_, id)| id)
                .peekable();
            if ids.peek().is_none() {
                continue;
            }
            holding.insert(pod.pod.clone());
            if ids.any(|id| self.touches(id)) {
                touching.insert(pod.pod.clone());
            }
        }
        // A pod listed twice is spared only if no entry touches a disturbed GPU.
        holding.difference(&touching).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use node_runtime::inventory::read;
    use node_runtime::testing::simulated;

    use super::*;
    use crate::pod_resources::ContainerDevices;

    fn pod(name: &str, devices: &[(&str, &[&str])]) -> PodDevices {
        PodDevices {
            pod: format!("default/{name}"),
            containers: vec![ContainerDevices {
                name: "main".into(),
                devices: devices
                    .iter()
                    .map(|(resource, ids)| {
                        (
                            (*resource).to_owned(),
                            ids.iter().map(|id| (*id).to_owned()).collect(),
                        )
                    })
                    .collect(),
                claims: Vec::new(),
            }],
        }
    }

    fn names(pods: &[&str]) -> BTreeSet<String> {
        pods.iter().map(|pod| format!("default/{pod}")).collect()
    }

    #[test]
    fn replicas_of_whole_gpus_are_traced_to_their_gpu() {
        let (_dir, simulator) = simulated("a100-80gb:3", &[]);
        let views = read(simulator.as_ref()).unwrap();
        let gpu = |index: usize| views[index].inventory.uuid.clone();
        let disturbed = Disturbed::new(&views, [1]);
        assert_eq!(disturbed.gpus(), &BTreeSet::from([1]));
        let answer = [
            pod("on-0", &[("nvidia.com/gpu", &[&format!("{}::3", gpu(0))])]),
            pod("on-1", &[("nvidia.com/gpu", &[&format!("{}::0", gpu(1))])]),
            pod("whole-1", &[("nvidia.com/gpu", &[&gpu(1)])]),
            pod(
                "on-0-and-1",
                &[(
                    "nvidia.com/gpu.shared",
                    &[&format!("{}::1", gpu(0)), &format!("{}::7", gpu(1))],
                )],
            ),
            pod("whole-2", &[("nvidia.com/gpu", &[&gpu(2)])]),
        ];
        assert_eq!(disturbed.spared(&answer), names(&["on-0", "whole-2"]));
    }

    #[test]
    fn mig_devices_are_traced_to_their_gpu() {
        let (_dir, simulator) = simulated("a100-80gb:2", &[("1g.10gb", 2)]);
        let views = read(simulator.as_ref()).unwrap();
        let mig = |gpu: usize, device: usize| views[gpu].devices[device].1.uuid.clone();
        assert!(mig(0, 0).starts_with("MIG-"), "{}", mig(0, 0));
        let answer = [
            pod("mig-0", &[("nvidia.com/mig-1g.10gb", &[&mig(0, 1)])]),
            pod("mig-1", &[("nvidia.com/mig-1g.10gb", &[&mig(1, 0)])]),
            // The single strategy advertises MIG devices as `nvidia.com/gpu`, replicated when shared.
            pod(
                "single-1",
                &[("nvidia.com/gpu", &[&format!("{}::2", mig(1, 1))])],
            ),
        ];
        assert_eq!(
            Disturbed::new(&views, [0]).spared(&answer),
            names(&["mig-1", "single-1"])
        );
        assert_eq!(
            Disturbed::new(&views, [1]).spared(&answer),
            names(&["mig-0"])
        );
        assert_eq!(
            Disturbed::new(&views, [0, 1]).spared(&answer),
            BTreeSet::new()
        );
    }

    #[test]
    fn doubts_count_as_using_a_disturbed_gpu() {
        let (_dir, simulator) = simulated("a100-80gb:2", &[]);
        let views = read(simulator.as_ref()).unwrap();
        let untouched = views[1].inventory.uuid.clone();
        let disturbed = Disturbed::new(&views, [0]);
        let answer = [
            pod("fine", &[("nvidia.com/gpu", &[&untouched])]),
            // A device no GPU read answers to (a MIG device made since, another plugin's naming).
            pod("unknown-id", &[("nvidia.com/gpu", &["GPU-nobody::1"])]),
            pod(
                "partly-unknown",
                &[("nvidia.com/gpu", &[&untouched, "MIG-nobody"])],
            ),
            // Listed but holding no GPU device yet: not admitted, it may still get GPU 0.
            pod("pending", &[]),
            // Other resources say nothing about the GPUs, even with IDs that look like ours.
            pod("nic-only", &[("example.com/nic", &[&untouched])]),
        ];
        let spared = disturbed.spared(&answer);
        assert_eq!(spared, names(&["fine"]));
        // A pod missing from the answer is not spared either.
        assert!(!spared.contains("default/not-listed"));
    }

    #[test]
    fn a_pod_listed_twice_is_spared_only_if_both_entries_are_clear() {
        let (_dir, simulator) = simulated("a100-80gb:2", &[]);
        let views = read(simulator.as_ref()).unwrap();
        let (zero, one) = (
            views[0].inventory.uuid.clone(),
            views[1].inventory.uuid.clone(),
        );
        let answer = [
            pod("twice", &[("nvidia.com/gpu", &[&one])]),
            pod("twice", &[("nvidia.com/gpu", &[&zero])]),
        ];
        assert!(Disturbed::new(&views, [0]).spared(&answer).is_empty());
    }

    #[test]
    fn gpu_resources_are_told_apart() {
        assert!(is_gpu_resource("nvidia.com/gpu.shared"));
        assert!(is_gpu_resource("nvidia.com/mig-3g.40gb"));
        assert!(!is_gpu_resource("nvidia.com/nic"));
    }
}

//! GetPreferredAllocation: which of the available devices a container should get. Pure.
//!
//! Replicas are packed onto as few GPUs as possible, so that whole GPUs stay free for containers that need them and
//! a container's replicas share one GPU's memory rather than several. Where NUMA nodes are known, devices on the
//! NUMA node of the devices that must be included (or else the node with the most free devices) come first, so
//! that a multi-GPU container does not cross the socket boundary.

use std::collections::BTreeMap;

use crate::plan::{Device, Resource};

/// The preferred `size` devices among `available`, including `must_include` first. IDs the resource does not know
/// are passed over; fewer than `size` come back only when fewer are available.
#[must_use]
pub fn preferred(
    resource: &Resource,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let known = |id: &String| resource.devices.iter().find(|device| &device.id == id);
    let mut chosen: Vec<&Device> = must_include.iter().filter_map(known).take(size).collect();
    let mut candidates: Vec<&Device> = available
        .iter()
        .filter_map(known)
        .filter(|device| !chosen.iter().any(|taken| taken.id == device.id))
        .collect();

    let numa = chosen
        .iter()
        .find_map(|device| device.numa_node)
        .or_else(|| busiest_numa_node(&candidates));
    // Free replicas per GPU: a GPU with more of them free takes a whole request sooner.
    let mut free: BTreeMap<&str, usize> = BTreeMap::new();
    for device in &candidates {
        *free.entry(device.uuid.as_str()).or_default() += 1;
    }
    while chosen.len() < size && !candidates.is_empty() {
        let best = (0..candidates.len())
            .min_by_key(|&position| {
                let device = candidates[position];
                let same_gpu = chosen.iter().any(|taken| taken.uuid == device.uuid);
                (
                    numa.is_some() && device.numa_node != numa,
                    !same_gpu,
                    std::cmp::Reverse(free[device.uuid.as_str()]),
                    device.gpu_index,
                    device.mig_index,
                    device.id.as_str(),
                )
            })
            .unwrap_or(0);
        chosen.push(candidates.remove(best));
    }
    chosen.into_iter().map(|device| device.id.clone()).collect()
}

/// The NUMA node with the most candidate devices, when any is known.
fn busiest_numa_node(candidates: &[&Device]) -> Option<i64> {
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for node in candidates.iter().filter_map(|device| device.numa_node) {
        *counts.entry(node).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(node, count)| (*count, std::cmp::Reverse(*node)))
        .map(|(node, _)| node)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `replicas` replicas of each of `gpus` GPUs, GPU `n` on NUMA node `numa(n)`.
    fn resource(gpus: u32, replicas: u32, numa: impl Fn(u32) -> Option<i64>) -> Resource {
        let devices = (0..gpus)
            .flat_map(|gpu| {
                let numa_node = numa(gpu);
                (0..replicas).map(move |replica| Device {
                    id: if replicas > 1 {
                        format!("GPU-{gpu}::{replica}")
                    } else {
                        format!("GPU-{gpu}")
                    },
                    uuid: format!("GPU-{gpu}"),
                    gpu_index: gpu,
                    mig_index: None,
                    memory_mib: 40_960,
                    replicas,
                    numa_node,
                })
            })
            .collect();
        Resource {
            devices,
            shared: None,
        }
    }

    fn ids(resource: &Resource) -> Vec<String> {
        resource
            .devices
            .iter()
            .map(|device| device.id.clone())
            .collect()
    }

    #[test]
    fn replicas_pack_onto_the_fullest_free_gpu() {
        let shared = resource(3, 4, |_| None);
        // GPU 0 has one replica left, GPU 1 all four, GPU 2 two: a request of 3 fits GPU 1 alone.
        let available: Vec<String> = ids(&shared)
            .into_iter()
            .filter(|id| {
                !["GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-2::0", "GPU-2::1"].contains(&id.as_str())
            })
            .collect();
        assert_eq!(
            preferred(&shared, &available, &[], 3),
            ["GPU-1::0", "GPU-1::1", "GPU-1::2"]
        );
        // A must-include replica pulls the rest onto its GPU.
        assert_eq!(
            preferred(&shared, &available, &["GPU-2::3".into()], 2),
            ["GPU-2::3", "GPU-2::2"]
        );
    }

    #[test]
    fn whole_gpus_stay_on_one_numa_node() {
        let gpus = resource(4, 1, |gpu| Some(i64::from(gpu % 2)));
        let all = ids(&gpus);
        assert_eq!(
            preferred(&gpus, &all, &["GPU-1".into()], 2),
            ["GPU-1", "GPU-3"]
        );
        let without_zero: Vec<String> = all.iter().filter(|id| *id != "GPU-0").cloned().collect();
        // NUMA node 1 has two free GPUs, node 0 one: a request of two goes to node 1.
        assert_eq!(preferred(&gpus, &without_zero, &[], 2), ["GPU-1", "GPU-3"]);
        // More than are available: all of them, nothing invented.
        assert_eq!(preferred(&gpus, &without_zero, &[], 5).len(), 3);
    }
}

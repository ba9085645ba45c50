//! GetPreferredAllocation: which of the available devices a container should get. Pure.
//!
//! Replicas of shared devices follow `flags.plugin.sharedDevicesAllocationPolicy` as NVIDIA's plugin does: one
//! replica at a time, from the physical device with the fewest replicas in use (`distributed`, the default: load
//! spreads over the GPUs) or the most (`packed`: load consolidates, whole GPUs stay free); on a tie, from the one
//! this request has taken the fewest from. Unshared devices (whole GPUs, MIG devices) ignore the policy, as in
//! NVIDIA's plugin: where NUMA nodes are known, devices on the NUMA node of the devices that must be included (or
//! else the node with the most free devices) come first, so that a multi-GPU container does not cross the socket
//! boundary.

use std::collections::BTreeMap;

use crd::config::device_plugin::AllocationPolicy;

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
    let candidates: Vec<&Device> = available
        .iter()
        .filter_map(known)
        .filter(|device| !chosen.iter().any(|taken| taken.id == device.id))
        .collect();
    match resource.shared {
        Some(shared) if resource.devices.iter().any(|device| device.replicas > 1) => {
            by_policy(
                resource,
                shared.allocation_policy,
                &mut chosen,
                candidates,
                size,
            );
        }
        _ => by_numa_node(&mut chosen, candidates, size),
    }
    chosen.into_iter().map(|device| device.id.clone()).collect()
}

/// Replicas one at a time by `policy`. A replica in use is one of the resource's that is neither available nor
/// already chosen, so must-include replicas count as in use, as in NVIDIA's plugin.
fn by_policy<'r>(
    resource: &'r Resource,
    policy: AllocationPolicy,
    chosen: &mut Vec<&'r Device>,
    mut candidates: Vec<&'r Device>,
    size: usize,
) {
    let mut free: BTreeMap<&str, usize> = BTreeMap::new();
    for device in &candidates {
        *free.entry(device.uuid.as_str()).or_default() += 1;
    }
    let mut total: BTreeMap<&str, usize> = BTreeMap::new();
    for device in &resource.devices {
        *total.entry(device.uuid.as_str()).or_default() += 1;
    }
    let mut in_use: BTreeMap<&str, usize> = free
        .iter()
        .map(|(uuid, free)| (*uuid, total[uuid].saturating_sub(*free)))
        .collect();
    let mut taken: BTreeMap<&str, usize> = BTreeMap::new();
    while chosen.len() < size && !candidates.is_empty() {
        let rank = |device: &'r Device| {
            let used = in_use[device.uuid.as_str()];
            let preference = match policy {
                AllocationPolicy::Distributed => used,
                AllocationPolicy::Packed => usize::MAX - used,
            };
            (
                preference,
                taken.get(device.uuid.as_str()).copied().unwrap_or(0),
                device.gpu_index,
                device.mig_index,
                device.id.as_str(),
            )
        };
        let best = (0..candidates.len())
            .min_by_key(|&position| rank(candidates[position]))
            .unwrap_or(0);
        let device = candidates.remove(best);
        *in_use.entry(device.uuid.as_str()).or_insert(0) += 1;
        *taken.entry(device.uuid.as_str()).or_insert(0) += 1;
        chosen.push(device);
    }
}

/// Unshared devices: the NUMA node of the chosen ones (or the one with the most candidates) first, then by index.
fn by_numa_node<'r>(chosen: &mut Vec<&'r Device>, mut candidates: Vec<&'r Device>, size: usize) {
    let numa = chosen
        .iter()
        .find_map(|device| device.numa_node)
        .or_else(|| busiest_numa_node(&candidates));
    while chosen.len() < size && !candidates.is_empty() {
        let best = (0..candidates.len())
            .min_by_key(|&position| {
                let device = candidates[position];
                (
                    numa.is_some() && device.numa_node != numa,
                    device.gpu_index,
                    device.mig_index,
                    device.id.as_str(),
                )
            })
            .unwrap_or(0);
        chosen.push(candidates.remove(best));
    }
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
    use crd::config::device_plugin::replica_id;

    use super::*;

    /// `replicas` replicas of each of `gpus` GPUs, GPU `n` on NUMA node `numa(n)`.
    fn resource(gpus: u32, replicas: u32, numa: impl Fn(u32) -> Option<i64>) -> Resource {
        let devices = (0..gpus)
            .flat_map(|gpu| {
                let numa_node = numa(gpu);
                (0..replicas).map(move |replica| Device {
                    id: if replicas > 1 {
                        replica_id(&format!("GPU-{gpu}"), replica)
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

    /// `resource` shared by time-slicing with `policy`.
    fn with_policy(mut resource: Resource, policy: AllocationPolicy) -> Resource {
        resource.shared = Some(crate::plan::Shared {
            strategy: crd::config::device_plugin::SharingStrategy::TimeSlicing,
            fail_requests_greater_than_one: false,
            allocation_policy: policy,
        });
        resource
    }

    fn ids(resource: &Resource) -> Vec<String> {
        resource
            .devices
            .iter()
            .map(|device| device.id.clone())
            .collect()
    }

    /// The replicas of `resource` without those taken.
    fn free(resource: &Resource, taken: &[&str]) -> Vec<String> {
        ids(resource)
            .into_iter()
            .filter(|id| !taken.contains(&id.as_str()))
            .collect()
    }

    /// GPU 0 has three of its four replicas in use, GPU 1 none, GPU 2 two.
    const IN_USE: [&str; 5] = ["GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-2::0", "GPU-2::1"];

    #[test]
    fn distributed_takes_from_the_least_used_gpus() {
        let shared = with_policy(resource(3, 4, |_| None), AllocationPolicy::Distributed);
        assert_eq!(
            preferred(&shared, &free(&shared, &IN_USE), &[], 3),
            ["GPU-1::0", "GPU-1::1", "GPU-2::2"],
            "GPU 1 until it is as used as GPU 2, then the one taken from least"
        );
        assert_eq!(
            preferred(&shared, &ids(&shared), &[], 3),
            ["GPU-0::0", "GPU-1::0", "GPU-2::0"],
            "an idle node: one replica per GPU"
        );
        // A must-include replica counts as in use: the next one comes from another GPU.
        assert_eq!(
            preferred(&shared, &ids(&shared), &["GPU-1::0".into()], 2),
            ["GPU-1::0", "GPU-0::0"]
        );
    }

    #[test]
    fn packed_fills_the_most_used_gpus_first() {
        let shared = with_policy(resource(3, 4, |_| None), AllocationPolicy::Packed);
        assert_eq!(
            preferred(&shared, &free(&shared, &IN_USE), &[], 3),
            ["GPU-0::3", "GPU-2::2", "GPU-2::3"],
            "GPU 0's last replica, then GPU 2, the next most used"
        );
        assert_eq!(
            preferred(&shared, &ids(&shared), &[], 3),
            ["GPU-0::0", "GPU-0::1", "GPU-0::2"],
            "an idle node: one GPU"
        );
    }

    #[test]
    fn the_policy_leaves_unshared_gpus_to_numa_locality() {
        let gpus = with_policy(
            resource(4, 1, |gpu| Some(i64::from(gpu % 2))),
            AllocationPolicy::Packed,
        );
        assert_eq!(
            preferred(&gpus, &ids(&gpus), &["GPU-1".into()], 2),
            ["GPU-1", "GPU-3"]
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

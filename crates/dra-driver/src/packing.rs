//! Packing, not scattering (pure): a replay of MIG claims arriving and leaving against the scheduler's first-fit
//! allocation, on N GPUs of one model served as MIG on demand, with exactly the devices and counters
//! [`dynamic_mig`] publishes ([`dynamic_mig::placements`], [`dynamic_mig::counter_set`]); only the order of the
//! devices differs between [`Order::Ours`] and [`Order::Nvidia`]. `cargo xtask bench` runs it on 100 H100-80GB.
//!
//! # The scheduler, as modelled
//! - **Devices**: the DRA allocator takes, for a request, the first device of the pool, in slice and device order,
//!   that the request's selector matches and whose counters its counter set still has (KEP-4815;
//!   reference/dra.md §3.4 and §10). A request here selects one profile (`profile == "1g.10gb"`, as the
//!   `mig.nvidia.com` claims of both drivers do), so only the devices of that profile compete, in their order.
//! - **Nodes**: `gpus_per_node` GPUs to a node (8 in the bench: 100 GPUs are 12 nodes of 8 and one of 4), each node
//!   its own pool; the GPUs of a node are numbered 0.. as its driver numbers them. A pod goes to the **first node,
//!   in node order, on which the allocator finds a device**. This stands for a bin-packing node score (the
//!   scheduler's `MostAllocated`): nodes already in use come first. The default `LeastAllocated` would spread pods
//!   over nodes; both orders are replayed under the same rule, so the rule shapes the totals, not the comparison.
//! - **Refusals**: a pod no node has a device for is refused and leaves the trace (no retry queue), so that both
//!   orders replay exactly the same arrivals and departures.
//!
//! # The two orders
//! [`Order::Ours`] is what the driver ships: GPU by GPU, smallest profile first, each profile's placements from the
//! highest start down ([`dynamic_mig::placements`], concatenated over the GPUs in index order as `slices` does).
//!
//! [`Order::Nvidia`] is NVIDIA's DynamicMIG order, read from kubernetes-sigs/dra-driver-nvidia-gpu at commit
//! `95932046683719c43b6a0dd9613c2e5aad5d6703` (2026-08-07):
//! - `cmd/gpu-kubelet-plugin/driver.go`, `generateSplitResourceSlices` (Kubernetes 1.35 and later) and
//!   `generateCombinedResourceSlices` (1.34): one ResourceSlice per physical GPU, the GPUs taken in the order of
//!   `slices.Sorted(maps.Keys(perGPUAllocatable.allocatablesMap))`, a map keyed by PCI bus ID; within a GPU's slice
//!   the devices in `slices.Sorted(maps.Keys(allocatable))`, that is sorted by device name as a string (its comment:
//!   "Stable sort order by devicename"). The split form puts one slice of all counter sets first.
//! - `cmd/gpu-kubelet-plugin/mig.go`, `MigSpecTuple.ToCanonicalName`: a placement's device is named
//!   `gpu-<minor>-mig-<profile>-<profile id>-<placement start>`, the profile being go-nvlib's name without its dots
//!   through `toRFC1123Compliant` (lower case, `+` → `-`): `gpu-0-mig-1g10gb-19-0`, `gpu-0-mig-1g10gb-me-20-0`. Its
//!   comment says the profile name in the device name "is relied upon for _sorting_ devices within a resource
//!   slice, and that order is relevant for the k8s scheduler".
//! - `cmd/gpu-kubelet-plugin/partitions.go`: each placement device consumes its profile's capacities and the
//!   counters `memory-slice-<start>` .. `memory-slice-<start+size-1>` of the GPU's set `gpu-<minor>-counter-set`;
//!   the whole GPU (`gpu-<minor>`, sorted first) consumes everything.
//!
//! So, for a request of one profile, NVIDIA's order is GPU by GPU (PCI bus ID, which is NVML's index order) and each
//! profile's placements from the **lowest** start up (the start is compared as text; every start of a model with 8
//! memory slices is one digit). [`Order::Nvidia`] is our devices sorted stably by (GPU, [`nvidia_device_name`]).
//! Assumed, not read: that the slices reach the allocator in the order the plugin helper publishes them (the
//! helper's comment says the allocator uses that order), and that a GPU's index is its PCI bus ID order. Left out:
//! NVIDIA's whole-GPU device, which no MIG profile request selects, and NVIDIA's engine counters (copy engines,
//! decoders, ...), which our catalog does not have; both orders consume our counters, so the comparison is of the
//! order alone.
//!
//! # What is measured ([`Outcome`])
//! Pods placed and refused; of the refused, those **refused for fragmentation**: some single GPU has, free, at
//! least the profile's memory slices in number (anywhere on the GPU) and every other counter its placements
//! consume (multiprocessors, compute slices, the `+me` instance limit), yet no placement of the profile fits on any
//! GPU: only where the free memory slices lie stood in the way. GPUs in use (holding at least one instance), most and
//! mean; compute slices held, mean; and how many GPUs could still take one more instance of each profile of the mix.
//! Means are over the arrivals after the trace's warm-up (one arrival per tick, so per unit of time).

use std::collections::{BTreeMap, BinaryHeap};

use crd::mig::{GpuInstanceProfile, GpuInstanceProfileName, GpuModel};
use serde::{Deserialize, Serialize};

use crate::dynamic_mig::{self, DynamicGpu, OnDemand, PlacementDevice};

/// The order the devices of a node are published in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Order {
    /// Ours: GPU by GPU, smallest profile first, each profile's placements from the highest start down.
    Ours,
    /// NVIDIA's DynamicMIG: GPU by GPU, devices sorted by NVIDIA's device name (placements from the lowest start).
    Nvidia,
}

impl Order {
    /// Both orders, ours first.
    pub const ALL: [Self; 2] = [Self::Ours, Self::Nvidia];

    /// How a report names it.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Ours => "ours (highest placement first)",
            Self::Nvidia => "NVIDIA's (by device name, lowest placement first)",
        }
    }

    /// The devices of a node's GPUs in this order, from [`dynamic_mig::placements`] of each.
    #[must_use]
    pub fn devices(self, gpus: &[DynamicGpu]) -> Vec<PlacementDevice> {
        let mut devices: Vec<PlacementDevice> =
            gpus.iter().flat_map(dynamic_mig::placements).collect();
        match self {
            Self::Ours => {}
            Self::Nvidia => {
                devices.sort_by_cached_key(|device| {
                    (device.on_demand.gpu, nvidia_device_name(device))
                });
            }
        }
        devices
    }
}

/// NVIDIA's name of a placement device (`MigSpecTuple.ToCanonicalName` in its `cmd/gpu-kubelet-plugin/mig.go`):
/// `gpu-<minor>-mig-<profile without dots, RFC 1123>-<profile id>-<placement start>`.
#[must_use]
pub fn nvidia_device_name(device: &PlacementDevice) -> String {
    let profile = device.profile.name.to_string().replace('.', "");
    format!(
        "gpu-{}-mig-{}-{}-{}",
        device.on_demand.gpu,
        rfc1123_compliant(&profile),
        device.profile.id,
        device.on_demand.placement.start
    )
}

/// NVIDIA's `toRFC1123Compliant`: lower case, anything but `[a-z0-9-.]` made `-`, `-` trimmed from both ends and
/// one `.` from the end.
fn rfc1123_compliant(name: &str) -> String {
    let name: String = name
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches('-');
    name.strip_suffix('.').unwrap_or(name).to_owned()
}

/// The cluster the replay runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    /// The GPUs' model (every GPU has all its profiles, as NVML confirms them on the simulator).
    pub model: &'static GpuModel,
    /// GPUs in all.
    pub gpus: u32,
    /// GPUs per node; the last node has the rest.
    pub gpus_per_node: u32,
}

/// One arrival or departure of a pod with one MIG claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A pod asks for an instance of the profile.
    Arrive {
        /// The pod's number, unique in the trace.
        pod: u32,
        /// The profile its claim selects.
        profile: &'static GpuInstanceProfile,
    },
    /// The pod leaves (a pod that was refused has nothing to give back).
    Depart {
        /// The pod's number.
        pod: u32,
    },
}

/// A trace of arrivals and departures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The events, in time order.
    pub events: Vec<Event>,
    /// The arrivals before the measured window (the GPUs fill up during them).
    pub warmup: u32,
}

/// What a trace is generated from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSpec {
    /// The generator's seed.
    pub seed: u64,
    /// Arrivals in all, one per tick.
    pub arrivals: u32,
    /// A pod's mean lifetime in ticks; each lives uniformly 1 to `2 * mean - 1` ticks. With one arrival per tick
    /// this is also the mean number of pods asking to run at once.
    pub mean_lifetime: u32,
    /// Arrivals before the measured window.
    pub warmup: u32,
    /// Profiles and their weights.
    pub mix: Vec<(&'static GpuInstanceProfile, u32)>,
}

/// The profiles of `model` named in `weights`, with their weights.
///
/// # Errors
/// A name that is no profile name, or one the model does not have.
pub fn mix(
    model: &'static GpuModel,
    weights: &[(&str, u32)],
) -> Result<Vec<(&'static GpuInstanceProfile, u32)>, String> {
    weights
        .iter()
        .map(|&(name, weight)| {
            let parsed: GpuInstanceProfileName =
                name.parse().map_err(|error| format!("{name}: {error}"))?;
            let profile = model
                .profile(parsed)
                .ok_or_else(|| format!("{} has no MIG profile {name}", model.simulator_name))?;
            Ok((profile, weight))
        })
        .collect()
}

/// A 64-bit linear congruential generator (Knuth's MMIX constants): deterministic, and no dependency.
#[derive(Debug, Clone)]
struct Lcg(u64);

impl Lcg {
    fn new(seed: u64) -> Self {
        let mut lcg = Self(seed ^ 0x9E37_79B9_7F4A_7C15);
        lcg.next();
        lcg
    }

    /// The next 32 high bits.
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }

    /// Uniform in `0..bound` (`bound` > 0).
    fn below(&mut self, bound: u32) -> u32 {
        ((u64::from(self.next()) * u64::from(bound)) >> 32) as u32
    }
}

/// The trace of `spec`: at each tick the pods whose time is up leave (in the order they arrived), then one pod
/// arrives with a profile drawn from the mix and a lifetime drawn uniformly; after the last arrival the pods still
/// running leave in the order of their times, so that every trace ends with the GPUs empty.
#[must_use]
pub fn trace(spec: &TraceSpec) -> Trace {
    let mut lcg = Lcg::new(spec.seed);
    let total: u32 = spec.mix.iter().map(|(_, weight)| weight).sum();
    let mean = spec.mean_lifetime.max(1);
    let mut leaving = BinaryHeap::new();
    let mut events = Vec::with_capacity(spec.arrivals as usize * 2);
    for (tick, pod) in (0..spec.arrivals).map(|pod| (u64::from(pod), pod)) {
        while let Some(&std::cmp::Reverse((at, leaver))) = leaving.peek() {
            if at > tick {
                break;
            }
            leaving.pop();
            events.push(Event::Depart { pod: leaver });
        }
        let mut draw = lcg.below(total.max(1));
        let profile = spec
            .mix
            .iter()
            .find(|(_, weight)| {
                let found = draw < *weight;
                draw = draw.saturating_sub(*weight);
                found
            })
            .map(|(profile, _)| *profile);
        let Some(profile) = profile else {
            continue;
        };
        let lifetime = 1 + u64::from(lcg.below(2 * mean - 1));
        events.push(Event::Arrive { pod, profile });
        leaving.push(std::cmp::Reverse((tick + lifetime, pod)));
    }
    while let Some(std::cmp::Reverse((_, pod))) = leaving.pop() {
        events.push(Event::Depart { pod });
    }
    Trace {
        events,
        warmup: spec.warmup,
    }
}

/// One device of a node as the allocator sees it.
#[derive(Debug, Clone)]
struct Candidate {
    /// The GPU (of the node).
    gpu: usize,
    /// Position of its profile in the model's profiles.
    profile: usize,
    on_demand: OnDemand,
    /// (counter, amount) it consumes of its GPU's set.
    consumes: Vec<(usize, i64)>,
}

/// One node: its GPUs' free counters and its devices in published order.
#[derive(Debug, Clone)]
struct Node {
    free: Vec<Vec<i64>>,
    instances: Vec<u32>,
    devices: Vec<Candidate>,
    taken: Vec<bool>,
    /// Per profile, its devices' positions in published order.
    by_profile: Vec<Vec<usize>>,
}

/// Where a pod's instance went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The node, in node order.
    pub node: usize,
    /// The device's position in the node's published order.
    pub device: usize,
    /// The instance: GPU (of the node), profile, placement.
    pub on_demand: OnDemand,
}

/// What a profile takes of a GPU, memory slices counted, not placed.
#[derive(Debug, Clone, Default)]
struct Demand {
    memory_slices: i64,
    others: Vec<(usize, i64)>,
}

/// The GPUs of a [`Setup`] under one [`Order`], with the allocator's first fit.
#[derive(Debug, Clone)]
pub struct Cluster {
    model: &'static GpuModel,
    /// Counter names, the same for every GPU of the model (the set's name aside).
    counters: Vec<String>,
    capacity: Vec<i64>,
    memory_slices: Vec<usize>,
    nodes: Vec<Node>,
    demand: Vec<Demand>,
}

fn value(counter: &k8s_openapi::api::resource::v1::Counter) -> i64 {
    // The driver publishes whole numbers only.
    counter.value.0.parse().unwrap_or(i64::MAX)
}

impl Cluster {
    /// Empty GPUs, their devices in `order`.
    #[must_use]
    pub fn new(setup: &Setup, order: Order) -> Self {
        let model = setup.model;
        let profile_position = |id: u32| {
            model
                .profiles
                .iter()
                .position(|profile| profile.id == id)
                .unwrap_or(0)
        };
        let template = DynamicGpu {
            index: 0,
            model,
            profiles: model.profiles.iter().collect(),
        };
        let set = dynamic_mig::counter_set(&template);
        let counters: Vec<String> = set.counters.keys().cloned().collect();
        let capacity: Vec<i64> = set.counters.values().map(value).collect();
        let position = |name: &str| counters.iter().position(|counter| counter == name);
        let memory_slices = counters
            .iter()
            .enumerate()
            .filter(|(_, name)| name.starts_with("memory-slice-"))
            .map(|(index, _)| index)
            .collect::<Vec<_>>();
        let per_node = setup.gpus_per_node.max(1);
        let mut nodes = Vec::new();
        let mut demand = vec![Demand::default(); model.profiles.len()];
        let mut left = setup.gpus;
        while left > 0 {
            let count = left.min(per_node);
            left -= count;
            let gpus: Vec<DynamicGpu> = (0..count)
                .map(|index| DynamicGpu {
                    index,
                    ..template.clone()
                })
                .collect();
            let devices: Vec<Candidate> = order
                .devices(&gpus)
                .into_iter()
                .map(|device| Candidate {
                    gpu: device.on_demand.gpu as usize,
                    profile: profile_position(device.profile.id),
                    on_demand: device.on_demand,
                    consumes: device
                        .consumes
                        .counters
                        .iter()
                        .filter_map(|(name, counter)| Some((position(name)?, value(counter))))
                        .collect(),
                })
                .collect();
            let mut by_profile = vec![Vec::new(); model.profiles.len()];
            for (index, device) in devices.iter().enumerate() {
                by_profile[device.profile].push(index);
                demand[device.profile] = Demand {
                    memory_slices: device.on_demand.placement.size.into(),
                    others: device
                        .consumes
                        .iter()
                        .copied()
                        .filter(|(counter, _)| !memory_slices.contains(counter))
                        .collect(),
                };
            }
            nodes.push(Node {
                free: vec![capacity.clone(); count as usize],
                instances: vec![0; count as usize],
                taken: vec![false; devices.len()],
                devices,
                by_profile,
            });
        }
        Self {
            model,
            counters,
            capacity,
            memory_slices,
            nodes,
            demand,
        }
    }

    fn profile_position(&self, profile: &GpuInstanceProfile) -> Option<usize> {
        self.model
            .profiles
            .iter()
            .position(|known| known.id == profile.id)
    }

    fn fits(node: &Node, device: usize) -> bool {
        let candidate = &node.devices[device];
        let free = &node.free[candidate.gpu];
        !node.taken[device]
            && candidate
                .consumes
                .iter()
                .all(|&(counter, amount)| free[counter] >= amount)
    }

    /// The allocator's first fit for a claim of `profile`: the first node, in node order, with a device of the
    /// profile whose counters are free, and on it the first such device in published order. `None`: refused.
    pub fn place(&mut self, profile: &GpuInstanceProfile) -> Option<Allocation> {
        let wanted = self.profile_position(profile)?;
        for (index, node) in self.nodes.iter_mut().enumerate() {
            let Some(device) = node.by_profile[wanted]
                .iter()
                .copied()
                .find(|&device| Self::fits(node, device))
            else {
                continue;
            };
            let candidate = &node.devices[device];
            for &(counter, amount) in &candidate.consumes {
                node.free[candidate.gpu][counter] -= amount;
            }
            node.instances[candidate.gpu] += 1;
            node.taken[device] = true;
            return Some(Allocation {
                node: index,
                device,
                on_demand: candidate.on_demand,
            });
        }
        None
    }

    /// Gives an allocation's counters back (the claim's pod has left and its instance is destroyed).
    ///
    /// # Panics
    /// When the allocation does not hold its device: a replay that gives back twice is wrong.
    pub fn release(&mut self, allocation: &Allocation) {
        let node = &mut self.nodes[allocation.node];
        assert!(node.taken[allocation.device], "{allocation:?} is not held");
        node.taken[allocation.device] = false;
        let candidate = &node.devices[allocation.device];
        for &(counter, amount) in &candidate.consumes {
            node.free[candidate.gpu][counter] += amount;
        }
        node.instances[candidate.gpu] -= 1;
    }

    /// Whether a claim of `profile` would be refused for fragmentation alone: no device of the profile fits
    /// anywhere, yet some GPU has free as many memory slices as a placement takes (wherever they lie) and every
    /// other counter the profile consumes.
    #[must_use]
    pub fn fragmented(&self, profile: &GpuInstanceProfile) -> bool {
        let Some(wanted) = self.profile_position(profile) else {
            return false;
        };
        let demand = &self.demand[wanted];
        let fits_anywhere = self.nodes.iter().any(|node| {
            node.by_profile[wanted]
                .iter()
                .any(|&device| Self::fits(node, device))
        });
        let enough_in_total = self.nodes.iter().flat_map(|node| &node.free).any(|free| {
            let slices: i64 = self
                .memory_slices
                .iter()
                .map(|&counter| free[counter])
                .sum();
            slices >= demand.memory_slices
                && demand
                    .others
                    .iter()
                    .all(|&(counter, amount)| free[counter] >= amount)
        });
        !fits_anywhere && enough_in_total
    }

    /// GPUs holding at least one instance.
    #[must_use]
    pub fn gpus_in_use(&self) -> u32 {
        self.nodes
            .iter()
            .flat_map(|node| &node.instances)
            .filter(|&&instances| instances > 0)
            .count() as u32
    }

    /// Compute slices held, over all the GPUs' compute slices.
    #[must_use]
    pub fn busy(&self) -> f64 {
        let Some(counter) = self
            .counters
            .iter()
            .position(|name| name == dynamic_mig::COUNTER_COMPUTE_SLICES)
        else {
            return 0.0;
        };
        let (mut held, mut all) = (0, 0);
        for free in self.nodes.iter().flat_map(|node| &node.free) {
            held += self.capacity[counter] - free[counter];
            all += self.capacity[counter];
        }
        held as f64 / all.max(1) as f64
    }

    /// GPUs on which one more instance of `profile` would fit.
    #[must_use]
    pub fn gpus_that_can_take(&self, profile: &GpuInstanceProfile) -> u32 {
        let Some(wanted) = self.profile_position(profile) else {
            return 0;
        };
        let mut count = 0;
        for node in &self.nodes {
            let mut can = vec![false; node.free.len()];
            for &device in &node.by_profile[wanted] {
                if Self::fits(node, device) {
                    can[node.devices[device].gpu] = true;
                }
            }
            count += can.iter().filter(|&&can| can).count() as u32;
        }
        count
    }

    /// The free counters of one GPU, by name.
    #[must_use]
    pub fn free(&self, node: usize, gpu: usize) -> BTreeMap<String, i64> {
        self.counters
            .iter()
            .cloned()
            .zip(self.nodes[node].free[gpu].iter().copied())
            .collect()
    }

    /// Checks the counters against the devices held: every counter of every GPU is its capacity less what the
    /// held devices consume, never below zero; each GPU's instance count is its held devices.
    ///
    /// # Errors
    /// The first counter or count that is off.
    pub fn check(&self) -> Result<(), String> {
        for (index, node) in self.nodes.iter().enumerate() {
            let mut expected = vec![self.capacity.clone(); node.free.len()];
            let mut instances = vec![0; node.free.len()];
            for (device, candidate) in node.devices.iter().enumerate() {
                if node.taken[device] {
                    instances[candidate.gpu] += 1;
                    for &(counter, amount) in &candidate.consumes {
                        expected[candidate.gpu][counter] -= amount;
                    }
                }
            }
            for (gpu, (free, expected)) in node.free.iter().zip(&expected).enumerate() {
                for (counter, (&free, &expected)) in free.iter().zip(expected).enumerate() {
                    if free != expected || free < 0 {
                        return Err(format!(
                            "node {index} GPU {gpu}: counter {} is {free}, the held devices leave {expected}",
                            self.counters[counter]
                        ));
                    }
                }
            }
            if instances != node.instances {
                return Err(format!(
                    "node {index}: instances {:?}, held devices {instances:?}",
                    node.instances
                ));
            }
        }
        Ok(())
    }
}

/// What one order made of one trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The order replayed.
    pub order: Order,
    /// Pods that arrived.
    pub arrivals: u32,
    /// Pods given an instance.
    pub placed: u32,
    /// Pods refused: no node had a device of their profile with its counters free.
    pub refused: u32,
    /// Of the refused, those refused for fragmentation (see the module's comment).
    pub refused_fragmented: u32,
    /// Refused pods by profile.
    pub refused_by_profile: BTreeMap<String, u32>,
    /// The most GPUs in use at once.
    pub gpus_used_max: u32,
    /// GPUs in use, mean over the measured window.
    pub gpus_used_mean: f64,
    /// Compute slices held over all compute slices, mean over the measured window.
    pub busy_mean: f64,
    /// Per profile of the trace, the GPUs that could take one more instance of it, mean over the measured window.
    pub can_take_mean: BTreeMap<String, f64>,
}

/// Replays `trace` on `setup` with the devices in `order`.
#[must_use]
pub fn replay(setup: &Setup, order: Order, trace: &Trace) -> Outcome {
    let mut cluster = Cluster::new(setup, order);
    let mut profiles: Vec<&'static GpuInstanceProfile> = Vec::new();
    for event in &trace.events {
        if let Event::Arrive { profile, .. } = event
            && !profiles.iter().any(|known| known.id == profile.id)
        {
            profiles.push(profile);
        }
    }
    profiles.sort_by_key(|profile| (profile.name.slices, profile.memory_mib, profile.id));
    let mut held: BTreeMap<u32, Allocation> = BTreeMap::new();
    let mut outcome = Outcome {
        order,
        arrivals: 0,
        placed: 0,
        refused: 0,
        refused_fragmented: 0,
        refused_by_profile: BTreeMap::new(),
        gpus_used_max: 0,
        gpus_used_mean: 0.0,
        busy_mean: 0.0,
        can_take_mean: BTreeMap::new(),
    };
    let (mut samples, mut gpus_sum, mut busy_sum) = (0u32, 0u64, 0.0);
    let mut can_take_sum = vec![0u64; profiles.len()];
    for event in &trace.events {
        match *event {
            Event::Arrive { pod, profile } => {
                outcome.arrivals += 1;
                if let Some(allocation) = cluster.place(profile) {
                    outcome.placed += 1;
                    held.insert(pod, allocation);
                } else {
                    outcome.refused += 1;
                    *outcome
                        .refused_by_profile
                        .entry(profile.name.to_string())
                        .or_default() += 1;
                    if cluster.fragmented(profile) {
                        outcome.refused_fragmented += 1;
                    }
                }
                let in_use = cluster.gpus_in_use();
                outcome.gpus_used_max = outcome.gpus_used_max.max(in_use);
                if outcome.arrivals > trace.warmup {
                    samples += 1;
                    gpus_sum += u64::from(in_use);
                    busy_sum += cluster.busy();
                    for (sum, profile) in can_take_sum.iter_mut().zip(&profiles) {
                        *sum += u64::from(cluster.gpus_that_can_take(profile));
                    }
                }
            }
            Event::Depart { pod } => {
                if let Some(allocation) = held.remove(&pod) {
                    cluster.release(&allocation);
                }
            }
        }
    }
    let window = f64::from(samples.max(1));
    outcome.gpus_used_mean = gpus_sum as f64 / window;
    outcome.busy_mean = busy_sum / window;
    outcome.can_take_mean = profiles
        .iter()
        .zip(can_take_sum)
        .map(|(profile, sum)| (profile.name.to_string(), sum as f64 / window))
        .collect();
    outcome
}

#[cfg(test)]
#[path = "packing_tests.rs"]
mod tests;

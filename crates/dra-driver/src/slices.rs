//! What the DRA driver publishes for its node (pure): a pool named after the node, with a device per GPU the node's
//! partition gives the driver, per MIG device where MIG is on, or per MIG placement on the GPUs it serves as MIG on
//! demand ([`crate::dynamic_mig`]). Without MIG on demand the pool is one ResourceSlice; with it, the devices that
//! consume counters go 64 to a slice and the counter sets into slices of their own (the API allows no more, and
//! no slice holds both).
//!
//! Device names and attributes follow NVIDIA's DRA driver, so claims and DeviceClasses written for it select the same
//! devices here: whole GPUs `gpu-<index>`, MIG devices `gpu-<index>-mig-<gpu instance>-<compute instance>`.
//! Shared GPUs allow multiple allocations and make `memory` (bytes) and `cores` (percent of the SMs) consumable:
//! - a claim that does not ask for memory gets the whole of it (no claim is handed memory nobody promised it);
//! - a claim that does not ask for cores consumes none, so memory-only claims pack (a default of 100 would make every
//!   memory-only claim take the GPU's compute; reference/dra.md §3.4).

use std::collections::BTreeMap;

use crd::dra::{
    ATTRIBUTE_ARCHITECTURE, ATTRIBUTE_CUDA_COMPUTE_CAPABILITY, ATTRIBUTE_CUDA_DRIVER_VERSION,
    ATTRIBUTE_DRIVER_VERSION, ATTRIBUTE_INDEX, ATTRIBUTE_MIG_PROFILE, ATTRIBUTE_PARENT_UUID,
    ATTRIBUTE_PRODUCT_NAME, ATTRIBUTE_TYPE, ATTRIBUTE_UUID, CAPACITY_CORES, CAPACITY_MEMORY,
    CORES_TOTAL, DRIVER, DeviceName, MEMORY_STEP_BYTES, Partition, TYPE_GPU, TYPE_MIG,
    profile_label,
};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, CounterSet, Device, DeviceAttribute,
    DeviceCapacity, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use node_runtime::inventory::GpuView;

use crate::dynamic_mig::{self, COUNTER_MULTIPROCESSORS, DynamicGpu, OnDemand};

/// Devices in one slice when any of them consumes counters (`ResourceSliceMaxDevicesWithAdvancedFeatures`).
const DEVICES_PER_SLICE_WITH_COUNTERS: usize = 64;
/// Counter sets in one slice (`ResourceSliceMaxCounterSets`).
const COUNTER_SETS_PER_SLICE: usize = 8;

/// One device the driver publishes, with what preparing it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverDevice {
    /// The device's name in the slice.
    pub name: String,
    /// The GPU's or MIG device's UUID (`NVIDIA_VISIBLE_DEVICES`).
    pub uuid: String,
    /// The index of the GPU it is (or is carved from): its `/dev/nvidia<index>` node.
    pub gpu_index: u32,
    /// Its memory in MiB.
    pub memory_mib: u64,
    /// Whether it allows multiple allocations with consumable memory and cores.
    pub shared: bool,
    /// A MIG placement whose instance is created when a claim is prepared (its `uuid` is the parent GPU's until
    /// then).
    pub on_demand: Option<OnDemand>,
    /// The slice entry.
    pub device: Device,
}

/// The devices the node's GPUs give the driver under `partition`, in index order (the scheduler allocates first
/// fit in this order, so fractional claims fill a node's first shared GPU before the next). The GPUs in `dynamic`
/// are published as their MIG placements.
#[must_use]
pub fn devices(
    gpus: &[GpuView],
    partition: &Partition,
    dynamic: &[DynamicGpu],
) -> Vec<DriverDevice> {
    let mut devices = Vec::new();
    for gpu in gpus {
        let inventory = &gpu.inventory;
        if !partition.dra.contains(inventory.index) {
            continue;
        }
        let mut common = BTreeMap::from([
            (ATTRIBUTE_PRODUCT_NAME, text(&inventory.product_name)),
            (
                ATTRIBUTE_ARCHITECTURE,
                text(inventory.compute_capability.family()),
            ),
            (
                ATTRIBUTE_CUDA_COMPUTE_CAPABILITY,
                version(&inventory.compute_capability.to_string()),
            ),
            (ATTRIBUTE_DRIVER_VERSION, version(&inventory.driver_version)),
            (
                ATTRIBUTE_CUDA_DRIVER_VERSION,
                version(&format!(
                    "{}.{}",
                    inventory.cuda_driver_version.major, inventory.cuda_driver_version.minor
                )),
            ),
            (ATTRIBUTE_INDEX, integer(inventory.index)),
        ]);
        if let Some(dynamic) = dynamic.iter().find(|gpu| gpu.index == inventory.index) {
            common.insert(ATTRIBUTE_TYPE, text(TYPE_MIG));
            common.insert(ATTRIBUTE_PARENT_UUID, text(&inventory.uuid));
            for placement in dynamic_mig::placements(dynamic) {
                let profile = placement.profile.name.to_string();
                let mut attributes = common.clone();
                attributes.insert(ATTRIBUTE_MIG_PROFILE, text(&profile));
                let name = DeviceName::MigPlacement {
                    gpu: inventory.index,
                    profile: profile_label(&profile),
                    profile_id: placement.on_demand.profile_id,
                    start: placement.on_demand.placement.start,
                }
                .to_string();
                // Shared instances: memory and cores consumable inside the instance, as on a shared GPU. The
                // scheduler charges the GPU's counters once, for the instance's first claim.
                let shared = partition.shares(inventory.index);
                let mut capacity = memory(placement.profile.memory_mib, shared);
                if shared {
                    capacity.insert(CAPACITY_CORES.to_owned(), cores());
                } else {
                    capacity.insert(
                        COUNTER_MULTIPROCESSORS.to_owned(),
                        DeviceCapacity {
                            value: Quantity(placement.profile.sm_count.to_string()),
                            request_policy: None,
                        },
                    );
                }
                let mut entry = device(&name, attributes, capacity, shared);
                entry.consumes_counters = Some(vec![placement.consumes]);
                devices.push(DriverDevice {
                    device: entry,
                    name,
                    uuid: inventory.uuid.clone(),
                    gpu_index: inventory.index,
                    memory_mib: placement.profile.memory_mib,
                    shared,
                    on_demand: Some(placement.on_demand),
                });
            }
            continue;
        }
        if inventory.mig_mode.is_some_and(|mode| mode.current) {
            common.insert(ATTRIBUTE_TYPE, text(TYPE_MIG));
            common.insert(ATTRIBUTE_PARENT_UUID, text(&inventory.uuid));
            for (profile, mig) in &gpu.devices {
                let mut attributes = common.clone();
                attributes.insert(ATTRIBUTE_UUID, text(&mig.uuid));
                if let Some(profile) = profile {
                    attributes.insert(ATTRIBUTE_MIG_PROFILE, text(&profile.to_string()));
                }
                let name = DeviceName::Mig {
                    gpu: inventory.index,
                    gpu_instance: mig.gpu_instance_id,
                    compute_instance: mig.compute_instance_id,
                }
                .to_string();
                devices.push(DriverDevice {
                    device: device(&name, attributes, memory(mig.memory_mib, false), false),
                    name,
                    uuid: mig.uuid.clone(),
                    gpu_index: inventory.index,
                    memory_mib: mig.memory_mib,
                    shared: false,
                    on_demand: None,
                });
            }
            continue;
        }
        let shared = partition.shares(inventory.index);
        common.insert(ATTRIBUTE_TYPE, text(TYPE_GPU));
        common.insert(ATTRIBUTE_UUID, text(&inventory.uuid));
        let mut capacity = memory(inventory.memory_mib, shared);
        if shared {
            capacity.insert(CAPACITY_CORES.to_owned(), cores());
        }
        let name = DeviceName::Gpu(inventory.index).to_string();
        devices.push(DriverDevice {
            device: device(&name, common, capacity, shared),
            name,
            uuid: inventory.uuid.clone(),
            gpu_index: inventory.index,
            memory_mib: inventory.memory_mib,
            shared,
            on_demand: None,
        });
    }
    devices
}

/// The driver's slices for `node`, all in pool `<node>` at `generation`, owned by the Node (deleted with it). The
/// first is `<node>-gpu.nvidia.com` and holds the first devices (all of them without MIG on demand); more devices
/// go to `<node>-gpu.nvidia.com-<nn>`, and the counter sets to `<node>-gpu.nvidia.com-counters[-<nn>]`.
#[must_use]
pub fn slices(
    node: &str,
    node_uid: &str,
    generation: i64,
    devices: &[DriverDevice],
    counter_sets: &[CounterSet],
) -> Vec<ResourceSlice> {
    let entries: Vec<Device> = devices.iter().map(|device| device.device.clone()).collect();
    let device_chunks: Vec<Vec<Device>> = if counter_sets.is_empty() || entries.is_empty() {
        vec![entries]
    } else {
        entries
            .chunks(DEVICES_PER_SLICE_WITH_COUNTERS)
            .map(<[Device]>::to_vec)
            .collect()
    };
    let counter_chunks: Vec<Vec<CounterSet>> = counter_sets
        .chunks(COUNTER_SETS_PER_SLICE)
        .map(<[CounterSet]>::to_vec)
        .collect();
    let count = i64::try_from(device_chunks.len() + counter_chunks.len()).unwrap_or(i64::MAX);
    let mut slices = Vec::new();
    for (index, chunk) in device_chunks.into_iter().enumerate() {
        // Two digits, so that names sort as the slices are ordered: the allocator takes a pool's slices by name.
        let name = match index {
            0 => slice_name(node),
            n => format!("{}-{n:02}", slice_name(node)),
        };
        let mut slice = slice(node, node_uid, &name, generation, count);
        slice.spec.devices = Some(chunk);
        slices.push(slice);
    }
    for (index, chunk) in counter_chunks.into_iter().enumerate() {
        let name = match index {
            0 => format!("{}-counters", slice_name(node)),
            n => format!("{}-counters-{n:02}", slice_name(node)),
        };
        let mut slice = slice(node, node_uid, &name, generation, count);
        slice.spec.shared_counters = Some(chunk);
        slices.push(slice);
    }
    slices
}

fn slice(node: &str, node_uid: &str, name: &str, generation: i64, count: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_owned(),
                uid: node_uid.to_owned(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.to_owned(),
            node_name: Some(node.to_owned()),
            pool: ResourcePool {
                name: node.to_owned(),
                generation,
                resource_slice_count: count,
            },
            ..ResourceSliceSpec::default()
        },
    }
}

/// Whether the stored slice publishes what `wanted` does, so that it need not be written (each write is a new pool
/// generation, after which the scheduler waits for the pool to settle). The API server writes quantities back in
/// canonical form (`40960Mi` is stored as `40Gi`) and stamps taints with the time it saw them, so capacities are
/// compared by value and taints without their time; the rest as is.
#[must_use]
pub fn same_slice(stored: &ResourceSlice, wanted: &ResourceSlice) -> bool {
    let devices = |slice: &ResourceSlice| -> Vec<Device> {
        slice.spec.devices.iter().flatten().map(canonical).collect()
    };
    devices(stored) == devices(wanted)
        && canonical_counters(stored) == canonical_counters(wanted)
        && stored.spec.pool.resource_slice_count == wanted.spec.pool.resource_slice_count
        && stored.metadata.owner_references == wanted.metadata.owner_references
}

/// The slice's counter sets with every value as a plain number.
fn canonical_counters(slice: &ResourceSlice) -> Vec<CounterSet> {
    let mut sets = slice.spec.shared_counters.clone().unwrap_or_default();
    for counter in sets.iter_mut().flat_map(|set| set.counters.values_mut()) {
        counter.value = number(&counter.value);
    }
    sets
}

fn number(quantity: &Quantity) -> Quantity {
    Quantity(
        crd::quantity::parse_bytes(&quantity.0)
            .map_or_else(|_| quantity.0.clone(), |value| value.to_string()),
    )
}

/// A device with every capacity quantity written as a plain number, and its taints without the time they were added.
fn canonical(device: &Device) -> Device {
    let mut device = device.clone();
    for taint in device.taints.iter_mut().flatten() {
        taint.time_added = None;
    }
    for counter in device
        .consumes_counters
        .iter_mut()
        .flatten()
        .flat_map(|consumption| consumption.counters.values_mut())
    {
        counter.value = number(&counter.value);
    }
    for capacity in device.capacity.iter_mut().flat_map(BTreeMap::values_mut) {
        capacity.value = number(&capacity.value);
        if let Some(policy) = capacity.request_policy.as_mut() {
            policy.default = policy.default.as_ref().map(number);
            if let Some(range) = policy.valid_range.as_mut() {
                range.min = number(&range.min);
                range.max = range.max.as_ref().map(number);
                range.step = range.step.as_ref().map(number);
            }
        }
    }
    device
}

/// The name of the driver's slice for `node`.
#[must_use]
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER}")
}

fn device(
    name: &str,
    attributes: BTreeMap<&str, DeviceAttribute>,
    capacity: BTreeMap<String, DeviceCapacity>,
    shared: bool,
) -> Device {
    Device {
        name: name.to_owned(),
        attributes: Some(
            attributes
                .into_iter()
                .map(|(key, value)| (key.to_owned(), value))
                .collect(),
        ),
        capacity: Some(capacity),
        allow_multiple_allocations: shared.then_some(true),
        ..Device::default()
    }
}

/// The `cores` capacity of a shared device: percent of its SMs, consumable, none by default (a memory-only claim
/// takes no cores).
fn cores() -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(CORES_TOTAL.to_string()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity("0".into())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity("0".into()),
                max: Some(Quantity(CORES_TOTAL.to_string())),
                step: Some(Quantity("1".into())),
            }),
            valid_values: None,
        }),
    }
}

/// The `memory` capacity: the whole memory; on a shared GPU consumable in steps of 1 MiB, the whole by default.
fn memory(mib: u64, shared: bool) -> BTreeMap<String, DeviceCapacity> {
    let total = Quantity(format!("{mib}Mi"));
    let request_policy = shared.then(|| CapacityRequestPolicy {
        default: Some(total.clone()),
        valid_range: Some(CapacityRequestPolicyRange {
            min: Quantity(MEMORY_STEP_BYTES.to_string()),
            max: Some(total.clone()),
            step: Some(Quantity(MEMORY_STEP_BYTES.to_string())),
        }),
        valid_values: None,
    });
    BTreeMap::from([(
        CAPACITY_MEMORY.to_owned(),
        DeviceCapacity {
            value: total,
            request_policy,
        },
    )])
}

fn text(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_owned()),
        ..DeviceAttribute::default()
    }
}

fn integer(value: u32) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i64::from(value)),
        ..DeviceAttribute::default()
    }
}

/// A version attribute: semver wants exactly three numbers without leading zeros, and NVIDIA's versions have two
/// (`12.4`, `8.0`) or leading zeros (`535.104.05`).
fn version(value: &str) -> DeviceAttribute {
    let mut numbers: Vec<String> = value
        .split('.')
        .map(|part| {
            part.parse::<u64>()
                .map_or_else(|_| "0".to_owned(), |n| n.to_string())
        })
        .collect();
    numbers.resize(3, "0".to_owned());
    DeviceAttribute {
        version: Some(numbers[..3].join(".")),
        ..DeviceAttribute::default()
    }
}

#[cfg(test)]
mod tests {
    use crd::dra::GpuSet;
    use node_runtime::testing::simulated;

    use super::*;

    fn read(spec: &str, mig: &[(&str, u32)]) -> Vec<GpuView> {
        let (_dir, simulator) = simulated(spec, mig);
        node_runtime::inventory::read(simulator.as_ref()).unwrap()
    }

    fn attribute<'a>(device: &'a Device, name: &str) -> &'a DeviceAttribute {
        &device.attributes.as_ref().unwrap()[name]
    }

    #[test]
    fn shared_gpus_make_memory_and_cores_consumable_and_whole_gpus_do_not() {
        let gpus = read("a100-40gb:2", &[]);
        let partition = Partition {
            dra: GpuSet::All,
            shared: "1".parse().unwrap(),
            dynamic_mig: GpuSet::None,
        };
        let devices = devices(&gpus, &partition, &[]);
        assert_eq!(devices.len(), 2);
        let (whole, shared) = (&devices[0], &devices[1]);
        assert_eq!((whole.name.as_str(), whole.shared), ("gpu-0", false));
        assert_eq!(whole.device.allow_multiple_allocations, None);
        let capacity = whole.device.capacity.as_ref().unwrap();
        assert_eq!(capacity[CAPACITY_MEMORY].value.0, "40960Mi");
        assert!(capacity[CAPACITY_MEMORY].request_policy.is_none());
        assert!(!capacity.contains_key(CAPACITY_CORES));

        assert_eq!(shared.device.allow_multiple_allocations, Some(true));
        let capacity = shared.device.capacity.as_ref().unwrap();
        let memory = capacity[CAPACITY_MEMORY].request_policy.as_ref().unwrap();
        assert_eq!(memory.default.as_ref().unwrap().0, "40960Mi");
        let range = memory.valid_range.as_ref().unwrap();
        assert_eq!(
            (
                range.min.0.as_str(),
                range.step.as_ref().unwrap().0.as_str()
            ),
            ("1048576", "1048576")
        );
        let cores = &capacity[CAPACITY_CORES];
        assert_eq!(cores.value.0, "100");
        assert_eq!(
            cores
                .request_policy
                .as_ref()
                .unwrap()
                .default
                .as_ref()
                .unwrap()
                .0,
            "0",
            "a memory-only claim must not take the GPU's cores"
        );
        assert_eq!(
            attribute(&shared.device, ATTRIBUTE_TYPE).string.as_deref(),
            Some("gpu")
        );
        assert_eq!(
            attribute(&shared.device, ATTRIBUTE_PRODUCT_NAME)
                .string
                .as_deref(),
            Some("NVIDIA A100-SXM4-40GB")
        );
        assert_eq!(
            attribute(&shared.device, ATTRIBUTE_ARCHITECTURE)
                .string
                .as_deref(),
            Some("ampere")
        );
        assert_eq!(
            attribute(&shared.device, ATTRIBUTE_CUDA_COMPUTE_CAPABILITY)
                .version
                .as_deref(),
            Some("8.0.0")
        );
        assert_eq!(
            attribute(&shared.device, ATTRIBUTE_UUID).string.as_deref(),
            Some(shared.uuid.as_str())
        );
    }

    #[test]
    fn gpus_outside_the_partition_are_not_published() {
        let gpus = read("a100-40gb:4", &[]);
        let partition = Partition {
            dra: "2-3".parse().unwrap(),
            shared: GpuSet::All,
            dynamic_mig: GpuSet::None,
        };
        let names: Vec<String> = devices(&gpus, &partition, &[])
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(names, ["gpu-2", "gpu-3"]);
    }

    #[test]
    fn mig_gpus_publish_their_mig_devices_never_shared() {
        let gpus = read("a100-40gb:1", &[("1g.5gb", 7)]);
        let partition = Partition {
            dra: GpuSet::All,
            shared: GpuSet::All,
            dynamic_mig: GpuSet::None,
        };
        let devices = devices(&gpus, &partition, &[]);
        assert_eq!(devices.len(), 7);
        let first = &devices[0];
        assert!(first.name.starts_with("gpu-0-mig-"), "{}", first.name);
        assert!(!first.shared);
        assert_eq!(
            attribute(&first.device, ATTRIBUTE_TYPE).string.as_deref(),
            Some("mig")
        );
        assert_eq!(
            attribute(&first.device, ATTRIBUTE_MIG_PROFILE)
                .string
                .as_deref(),
            Some("1g.5gb")
        );
        assert_eq!(
            attribute(&first.device, ATTRIBUTE_PARENT_UUID)
                .string
                .as_deref(),
            Some(gpus[0].inventory.uuid.as_str())
        );
        assert!(first.uuid.starts_with("MIG-"));
    }

    #[test]
    fn a_slice_read_back_in_canonical_form_with_stamped_taints_is_the_same() {
        let gpus = read("a100-40gb:1", &[]);
        let mut devices = devices(
            &gpus,
            &Partition {
                dra: GpuSet::All,
                shared: GpuSet::All,
                dynamic_mig: GpuSet::None,
            },
            &[],
        );
        devices[0].device.taints = Some(vec![crate::health::taint(Some(79))]);
        let wanted = slices("node-a", "uid-a", 3, &devices, &[]).remove(0);
        let mut stored = wanted.clone();
        let device = &mut stored.spec.devices.as_mut().unwrap()[0];
        let memory = device
            .capacity
            .as_mut()
            .unwrap()
            .get_mut(CAPACITY_MEMORY)
            .unwrap();
        memory.value = Quantity("40Gi".into());
        let policy = memory.request_policy.as_mut().unwrap();
        policy.default = Some(Quantity("40Gi".into()));
        policy.valid_range.as_mut().unwrap().step = Some(Quantity("1Mi".into()));
        device.taints.as_mut().unwrap()[0].time_added = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert!(same_slice(&stored, &wanted));

        let mut smaller = stored.clone();
        smaller.spec.devices.as_mut().unwrap()[0]
            .capacity
            .as_mut()
            .unwrap()
            .get_mut(CAPACITY_MEMORY)
            .unwrap()
            .value = Quantity("39Gi".into());
        assert!(!same_slice(&smaller, &wanted));
        let mut healed = stored.clone();
        healed.spec.devices.as_mut().unwrap()[0].taints = None;
        assert!(!same_slice(&healed, &wanted));
        let mut orphan = stored;
        orphan.metadata.owner_references = None;
        assert!(!same_slice(&orphan, &wanted));
    }

    /// Four H100s served on demand and one published whole: the placements go 64 to a slice (the API's limit for
    /// devices that consume counters), the four counter sets into a slice of their own, and every slice of the
    /// pool says how many there are.
    #[test]
    fn gpus_served_on_demand_publish_placements_over_several_slices_and_their_counters_apart() {
        use gpu::GpuBackend as _;
        let (_dir, simulator) = simulated("h100-80gb:5", &[]);
        for gpu in 0..4 {
            simulator.set_mig_mode(gpu, true).unwrap();
            simulator.reset(gpu).unwrap();
        }
        let gpus = node_runtime::inventory::read(simulator.as_ref()).unwrap();
        let partition = Partition {
            dra: GpuSet::All,
            shared: GpuSet::None,
            dynamic_mig: GpuSet::All,
        };
        let (dynamic, warnings) =
            dynamic_mig::observe(simulator.as_ref(), &gpus, &partition).unwrap();
        assert_eq!(warnings.len(), 1, "GPU 4 has MIG off: {warnings:?}");
        let devices = devices(&gpus, &partition, &dynamic);
        let per_gpu = dynamic_mig::placements(&dynamic[0]).len();
        assert_eq!(devices.len(), 4 * per_gpu + 1);
        let first = &devices[0];
        assert_eq!(first.name, "gpu-0-mig-1g10gb-19-6");
        assert_eq!(
            first.on_demand.unwrap().placement,
            gpu::Placement { start: 6, size: 1 }
        );
        assert_eq!(
            attribute(&first.device, ATTRIBUTE_MIG_PROFILE)
                .string
                .as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(
            first.device.consumes_counters.as_ref().unwrap()[0].counter_set,
            "gpu-0-counter-set"
        );
        assert!(devices[4 * per_gpu].on_demand.is_none(), "GPU 4 is whole");
        assert_eq!(devices[4 * per_gpu].name, "gpu-4");

        let counter_sets: Vec<CounterSet> = dynamic.iter().map(dynamic_mig::counter_set).collect();
        let published = slices("node-a", "uid-a", 2, &devices, &counter_sets);
        let device_slices = (devices.len()).div_ceil(DEVICES_PER_SLICE_WITH_COUNTERS);
        assert_eq!(published.len(), device_slices + 1);
        let names: Vec<&str> = published
            .iter()
            .map(|slice| slice.metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(names[0], "node-a-gpu.nvidia.com");
        assert_eq!(names[1], "node-a-gpu.nvidia.com-01");
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, names, "the allocator takes slices by name");
        assert_eq!(*names.last().unwrap(), "node-a-gpu.nvidia.com-counters");
        for slice in &published {
            assert_eq!(
                slice.spec.pool.resource_slice_count,
                i64::try_from(published.len()).unwrap()
            );
            assert_eq!(slice.spec.node_name.as_deref(), Some("node-a"));
            let devices = slice.spec.devices.as_ref().map_or(0, Vec::len);
            let sets = slice.spec.shared_counters.as_ref().map_or(0, Vec::len);
            assert!(
                (devices == 0) != (sets == 0),
                "a slice holds devices or counters"
            );
            assert!(devices <= DEVICES_PER_SLICE_WITH_COUNTERS);
        }
        assert!(same_slice(&published[1], &published[1].clone()));

        // Shared too: each placement allows multiple allocations, memory and cores consumable inside it.
        let shared = Partition {
            shared: GpuSet::All,
            ..partition
        };
        let shared_devices = super::devices(&gpus, &shared, &dynamic);
        let first = &shared_devices[0];
        assert!(first.shared && first.on_demand.is_some());
        assert_eq!(first.device.allow_multiple_allocations, Some(true));
        let capacity = first.device.capacity.as_ref().unwrap();
        assert_eq!(capacity[CAPACITY_MEMORY].value.0, "9984Mi");
        assert!(capacity[CAPACITY_MEMORY].request_policy.is_some());
        assert_eq!(capacity[CAPACITY_CORES].value.0, "100");
        assert!(first.device.consumes_counters.is_some());
        let mut fewer = published.last().unwrap().clone();
        fewer.spec.shared_counters.as_mut().unwrap().pop();
        assert!(!same_slice(&fewer, published.last().unwrap()));
    }

    #[test]
    fn versions_become_semver() {
        assert_eq!(version("535.104.05").version.as_deref(), Some("535.104.5"));
        assert_eq!(version("12.4").version.as_deref(), Some("12.4.0"));
    }

    #[test]
    fn the_slice_is_the_nodes_pool_owned_by_the_node() {
        let gpus = read("h100-80gb:1", &[]);
        let devices = devices(
            &gpus,
            &Partition {
                dra: GpuSet::All,
                shared: GpuSet::None,
                dynamic_mig: GpuSet::None,
            },
            &[],
        );
        let slice = slices("node-a", "uid-1", 3, &devices, &[]).remove(0);
        assert_eq!(
            slice.metadata.name.as_deref(),
            Some("node-a-gpu.nvidia.com")
        );
        assert_eq!(slice.spec.pool.name, "node-a");
        assert_eq!(slice.spec.pool.generation, 3);
        assert_eq!(slice.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(slice.metadata.owner_references.unwrap()[0].uid, "uid-1");
        assert_eq!(slice.spec.devices.unwrap().len(), 1);
    }
}

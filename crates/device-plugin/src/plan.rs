//! What the node advertises: from the GPUs (as one reading of the backend) and a device-plugin config, every
//! resource name with its devices. Pure, so that the guides' numbers are unit tests and `plan` prints exactly what
//! `run` would register.
//!
//! Two steps, as in NVIDIA's plugin: the MIG strategy and the `resources` patterns decide which physical devices
//! (whole GPUs, MIG devices) go under which name; then the sharing section replaces selected devices by replicas
//! (`<uuid>::<n>`), under the same name or a renamed one.

use std::collections::BTreeMap;

use crd::config::device_plugin::{
    AllocationPolicy, DevicePluginConfig, DeviceRef, MigStrategy, ReplicatedDevices,
    ReplicatedResource, ResourceMapping, ResourceName, SharingStrategy, mig_resource_name,
    replica_id,
};
use node_runtime::inventory::GpuView;

/// The resource whole GPUs are advertised under unless a `resources.gpus` pattern says otherwise.
const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// One GPU as the planner needs it: the backend's reading, and its NUMA node when the platform says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedGpu {
    /// Inventory and MIG devices.
    pub view: GpuView,
    /// NUMA node of the GPU's PCI device; `None` where unknown (the simulator, single-socket machines).
    pub numa_node: Option<i64>,
}

/// One device the kubelet sees: a whole GPU, a MIG device, or a replica of either.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// The ID the kubelet allocates: the UUID, or `<uuid>::<n>` for a replica.
    pub id: String,
    /// UUID of the GPU or MIG device behind it (what the container gets).
    pub uuid: String,
    /// Index of the GPU (the parent GPU of a MIG device): health and device nodes are per GPU.
    pub gpu_index: u32,
    /// Position of a MIG device on its GPU (the `<gpu>:<mig>` index form); `None` for a whole GPU.
    pub mig_index: Option<u32>,
    /// Memory of the GPU or MIG device, in MiB.
    pub memory_mib: u64,
    /// How many replicas its physical device was split into (1 when not shared).
    pub replicas: u32,
    /// NUMA node, when known.
    pub numa_node: Option<i64>,
}

/// How a resource's devices are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shared {
    /// Time-slicing or MPS.
    pub strategy: SharingStrategy,
    /// Whether a container may ask for only one replica.
    pub fail_requests_greater_than_one: bool,
    /// How GetPreferredAllocation picks replicas (`flags.plugin.sharedDevicesAllocationPolicy`).
    pub allocation_policy: AllocationPolicy,
}

/// One resource the plugin registers, with its devices in the order they are listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// The devices; at least one.
    pub devices: Vec<Device>,
    /// Set when (some of) its devices are replicas.
    pub shared: Option<Shared>,
}

/// Everything a node advertises, by resource name.
pub type Plan = BTreeMap<ResourceName, Resource>;

/// Why a config cannot be planned on these GPUs. Each says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Single strategy with MIG on some GPUs and off on others.
    #[error(
        "migStrategy single needs MIG on all GPUs or none, but it is on for GPUs {enabled} and off for GPUs {disabled} \
         (use migStrategy mixed, or give every GPU the same MIG config)"
    )]
    SingleMixedMode {
        /// GPUs with MIG on.
        enabled: String,
        /// GPUs with MIG off.
        disabled: String,
    },
    /// Single strategy with MIG devices of different profiles.
    #[error(
        "migStrategy single needs every MIG device to have the same profile, but the node has {0} \
         (use migStrategy mixed, or a MIG config with one profile)"
    )]
    SingleMixedProfiles(String),
    /// A MIG device whose profile the catalog does not know, so it has no resource name.
    #[error("MIG device {0} has a profile this plugin does not know, so it cannot be named")]
    UnknownProfile(String),
    /// A sharing `devices` entry names a device the resource does not have.
    #[error("sharing {resource}: device {device} is not a device of {resource} on this node")]
    NoSuchDevice {
        /// The shared resource.
        resource: ResourceName,
        /// The device as written.
        device: String,
    },
    /// A sharing `devices` count larger than the resource.
    #[error(
        "sharing {resource}: devices: {count}, but the node has only {available} of {resource}"
    )]
    TooFewDevices {
        /// The shared resource.
        resource: ResourceName,
        /// The count asked for.
        count: u32,
        /// The devices there are.
        available: usize,
    },
}

/// The resources a node advertises with `config` on `gpus`. `strategy` is the MIG strategy in effect
/// ([`NodeConfig::mig_strategy`](crd::config::device_plugin::NodeConfig::mig_strategy)).
///
/// # Errors
/// A [`PlanError`] when the config does not fit the GPUs; nothing is advertised from a config that does not fit.
pub fn advertise(
    gpus: &[PlannedGpu],
    config: &DevicePluginConfig,
    strategy: MigStrategy,
) -> Result<Plan, PlanError> {
    let mut physical = physical_devices(gpus, config, strategy)?;
    let mut plan = Plan::new();
    if let Some((sharing, shared)) = config.sharing.as_ref().and_then(|sharing| sharing.active()) {
        let mode = Shared {
            strategy: sharing,
            fail_requests_greater_than_one: shared.fails_requests_greater_than_one(sharing),
            allocation_policy: config
                .flags
                .as_ref()
                .and_then(|flags| flags.plugin.as_ref())
                .and_then(|plugin| plugin.shared_devices_allocation_policy)
                .unwrap_or_default(),
        };
        for resource in &shared.resources {
            let Some(devices) = physical.get_mut(&resource.name) else {
                // A config written for another node shape (e.g. whole GPUs on a MIG node): nothing to share here.
                continue;
            };
            let selected = select(resource, devices)?;
            let replicas = selected
                .iter()
                .flat_map(|device| replicate(device, resource.replicas));
            let entry = plan
                .entry(shared.advertised_name(resource))
                .or_insert_with(|| Resource {
                    devices: Vec::new(),
                    shared: Some(mode),
                });
            entry.devices.extend(replicas);
        }
    }
    for (name, devices) in physical {
        if !devices.is_empty() {
            plan.entry(name)
                .or_insert_with(|| Resource {
                    devices: Vec::new(),
                    shared: None,
                })
                .devices
                .extend(devices);
        }
    }
    Ok(plan)
}

/// Whole GPUs and MIG devices under the names the strategy and `resources` patterns give them.
fn physical_devices(
    gpus: &[PlannedGpu],
    config: &DevicePluginConfig,
    strategy: MigStrategy,
) -> Result<BTreeMap<ResourceName, Vec<Device>>, PlanError> {
    let patterns = config.resources.clone().unwrap_or_default();
    let (mig_on, mig_off): (Vec<&PlannedGpu>, Vec<&PlannedGpu>) = gpus
        .iter()
        .partition(|gpu| gpu.view.inventory.mig_mode.is_some_and(|mode| mode.current));
    let mut devices: BTreeMap<ResourceName, Vec<Device>> = BTreeMap::new();
    if strategy == MigStrategy::Single && !mig_on.is_empty() && !mig_off.is_empty() {
        let indices = |gpus: &[&PlannedGpu]| {
            gpus.iter()
                .map(|gpu| gpu.view.inventory.index.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        return Err(PlanError::SingleMixedMode {
            enabled: indices(&mig_on),
            disabled: indices(&mig_off),
        });
    }
    for gpu in mig_off {
        let inventory = &gpu.view.inventory;
        let name = named(&patterns.gpus, &inventory.product_name).unwrap_or_else(gpu_resource);
        devices.entry(name).or_default().push(Device {
            id: inventory.uuid.clone(),
            uuid: inventory.uuid.clone(),
            gpu_index: inventory.index,
            mig_index: None,
            memory_mib: inventory.memory_mib,
            replicas: 1,
            numa_node: gpu.numa_node,
        });
    }
    if strategy == MigStrategy::None {
        return Ok(devices);
    }
    let mut profiles = Vec::new();
    for gpu in mig_on {
        for (position, (profile, mig)) in (0u32..).zip(&gpu.view.devices) {
            let profile = profile.ok_or_else(|| PlanError::UnknownProfile(mig.uuid.clone()))?;
            let name = match strategy {
                MigStrategy::Single => gpu_resource(),
                _ => named(&patterns.mig, &profile.to_string())
                    .unwrap_or_else(|| mig_resource_name(&profile)),
            };
            if !profiles.contains(&profile) {
                profiles.push(profile);
            }
            devices.entry(name).or_default().push(Device {
                id: mig.uuid.clone(),
                uuid: mig.uuid.clone(),
                gpu_index: gpu.view.inventory.index,
                mig_index: Some(position),
                memory_mib: mig.memory_mib,
                replicas: 1,
                numa_node: gpu.numa_node,
            });
        }
    }
    if strategy == MigStrategy::Single && profiles.len() > 1 {
        let names: Vec<String> = profiles.iter().map(ToString::to_string).collect();
        return Err(PlanError::SingleMixedProfiles(names.join(", ")));
    }
    Ok(devices)
}

/// `nvidia.com/gpu`.
fn gpu_resource() -> ResourceName {
    GPU_RESOURCE
        .parse()
        .expect("nvidia.com/gpu is a valid resource name")
}

/// The name of the first pattern that matches `subject` (a product or MIG profile name).
fn named(mappings: &[ResourceMapping], subject: &str) -> Option<ResourceName> {
    mappings
        .iter()
        .find(|mapping| glob_matches(&mapping.pattern, subject))
        .map(|mapping| mapping.name.clone())
}

/// `*` matches any run of characters, everything else itself: the pattern language of `resources`.
///
/// Linear in the lengths of both: the literal runs between stars are found left to right, each at its first
/// occurrence after the previous one. Taking the first occurrence never loses a match (a later one leaves less room
/// for what follows), so no position is ever tried twice, and a pattern of many stars cannot backtrack
/// exponentially as a recursive matcher does.
fn glob_matches(pattern: &str, subject: &str) -> bool {
    let mut literals = pattern.split('*');
    let first = literals.next().unwrap_or_default();
    let Some(mut rest) = subject.strip_prefix(first) else {
        return false;
    };
    let Some(last) = literals.next_back() else {
        // No star: the pattern is one literal, which must be the whole subject.
        return rest.is_empty();
    };
    for literal in literals {
        match rest.find(literal) {
            Some(start) => rest = &rest[start + literal.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Takes the devices `resource.devices` selects out of `devices` (the rest stay unshared).
fn select(
    resource: &ReplicatedResource,
    devices: &mut Vec<Device>,
) -> Result<Vec<Device>, PlanError> {
    let chosen: Vec<bool> = match &resource.devices {
        ReplicatedDevices::All => vec![true; devices.len()],
        ReplicatedDevices::Count(count) => {
            let count_usize = usize::try_from(*count).unwrap_or(usize::MAX);
            if count_usize > devices.len() {
                return Err(PlanError::TooFewDevices {
                    resource: resource.name.clone(),
                    count: *count,
                    available: devices.len(),
                });
            }
            (0..devices.len())
                .map(|position| position < count_usize)
                .collect()
        }
        ReplicatedDevices::List(references) => {
            let mut chosen = vec![false; devices.len()];
            for reference in references {
                let position = devices
                    .iter()
                    .position(|device| refers_to(reference, device))
                    .ok_or_else(|| PlanError::NoSuchDevice {
                        resource: resource.name.clone(),
                        device: describe(reference),
                    })?;
                chosen[position] = true;
            }
            chosen
        }
    };
    let mut selected = Vec::new();
    let mut kept = Vec::new();
    for (device, chosen) in devices.drain(..).zip(chosen) {
        if chosen {
            selected.push(device)
        } else {
            kept.push(device)
        }
    }
    *devices = kept;
    Ok(selected)
}

/// Whether a `devices` list entry names this device.
fn refers_to(reference: &DeviceRef, device: &Device) -> bool {
    match reference {
        DeviceRef::Index(index) => device.mig_index.is_none() && device.gpu_index == *index,
        DeviceRef::MigIndex { gpu, mig } => {
            device.gpu_index == *gpu && device.mig_index == Some(*mig)
        }
        DeviceRef::Uuid(uuid) => device.uuid == *uuid,
    }
}

/// A `devices` list entry as the config writes it.
fn describe(reference: &DeviceRef) -> String {
    match reference {
        DeviceRef::Index(index) => index.to_string(),
        DeviceRef::MigIndex { gpu, mig } => format!("{gpu}:{mig}"),
        DeviceRef::Uuid(uuid) => uuid.clone(),
    }
}

/// The replicas of one device, `<uuid>::0` to `<uuid>::<replicas-1>`.
fn replicate(device: &Device, replicas: u32) -> impl Iterator<Item = Device> + '_ {
    (0..replicas).map(move |replica| Device {
        id: replica_id(&device.uuid, replica),
        replicas,
        ..device.clone()
    })
}

#[cfg(test)]
#[path = "plan_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "plan_properties.rs"]
mod properties;

//! Names the DRA driver, the chart's DeviceClasses, the HAMi admission webhook, the watchdog and the exporter agree
//! on. The driver, attribute and class names are NVIDIA's DRA driver's (`gpu.nvidia.com`), so that claims written
//! for it work here; the shared class and the `cores` capacity are ours. Also the one decision both the device plugin
//! and the DRA driver make about a node, so that they never hand out the same GPU: [`partition`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};

/// The DRA driver's name: ResourceSlices' `spec.driver`, allocation results' `driver`, and the attribute domain.
pub const DRIVER: &str = "gpu.nvidia.com";

/// Device attribute: `gpu` for a whole GPU (shared or not), `mig` for a MIG device.
pub const ATTRIBUTE_TYPE: &str = "type";
/// Device attribute: the GPU's or MIG device's UUID.
pub const ATTRIBUTE_UUID: &str = "uuid";
/// Device attribute: NVML's product name, e.g. `NVIDIA A100-SXM4-40GB`.
pub const ATTRIBUTE_PRODUCT_NAME: &str = "productName";
/// Device attribute: the GPU family, e.g. `ampere`.
pub const ATTRIBUTE_ARCHITECTURE: &str = "architecture";
/// Device attribute (version): the CUDA compute capability, e.g. `8.0.0`.
pub const ATTRIBUTE_CUDA_COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
/// Device attribute (version): the kernel driver's version, e.g. `550.54.15`.
pub const ATTRIBUTE_DRIVER_VERSION: &str = "driverVersion";
/// Device attribute (version): the CUDA version the driver supports, e.g. `12.4.0`.
pub const ATTRIBUTE_CUDA_DRIVER_VERSION: &str = "cudaDriverVersion";
/// MIG device attribute: its profile, e.g. `1g.5gb`.
pub const ATTRIBUTE_MIG_PROFILE: &str = "profile";
/// MIG device attribute: the UUID of the GPU it is carved from.
pub const ATTRIBUTE_PARENT_UUID: &str = "parentUUID";
/// Device attribute (int): the GPU's index on its node (NVML's).
pub const ATTRIBUTE_INDEX: &str = "index";

/// `type` of a whole GPU.
pub const TYPE_GPU: &str = "gpu";
/// `type` of a MIG device.
pub const TYPE_MIG: &str = "mig";

/// Capacity: device memory in bytes. On shared GPUs it is consumable.
pub const CAPACITY_MEMORY: &str = "memory";
/// Capacity of shared GPUs: percent of the GPU's streaming multiprocessors, 0–100, consumable.
pub const CAPACITY_CORES: &str = "cores";
/// The whole of `cores`.
pub const CORES_TOTAL: u64 = 100;
/// Memory requests on shared GPUs are rounded up to a multiple of this (1 MiB): HAMi counts memory in MiB.
pub const MEMORY_STEP_BYTES: u64 = 1 << 20;

/// DeviceClass of whole GPUs, NVIDIA's name and selector: every `type == "gpu"` device, shared or not.
pub const CLASS_GPU: &str = "gpu.nvidia.com";
/// DeviceClass of MIG devices, NVIDIA's name and selector.
pub const CLASS_MIG: &str = "mig.nvidia.com";
/// DeviceClass of shared GPUs, ours: `type == "gpu"` devices that allow multiple allocations.
pub const CLASS_SHARED_GPU: &str = "shared.gpu.nvidia.com";

/// The CEL expression of an attribute of this driver's devices, e.g. `device.attributes["gpu.nvidia.com"].uuid`.
#[must_use]
pub fn attribute_expression(attribute: &str) -> String {
    format!("device.attributes[\"{DRIVER}\"].{attribute}")
}

/// The CEL expression of a capacity of this driver's devices, e.g. `device.capacity["gpu.nvidia.com"].memory`.
#[must_use]
pub fn capacity_expression(capacity: &str) -> String {
    format!("device.capacity[\"{DRIVER}\"].{capacity}")
}

/// Every device of this driver in `slices`, with the slice that publishes it.
pub fn driver_devices<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) -> impl Iterator<Item = (&'a ResourceSlice, &'a Device)> {
    slices
        .into_iter()
        .filter(|slice| slice.spec.driver == DRIVER)
        .flat_map(|slice| {
            slice
                .spec
                .devices
                .iter()
                .flatten()
                .map(move |device| (slice, device))
        })
}

/// A text attribute of a device, e.g. its `uuid`.
#[must_use]
pub fn text_attribute<'a>(device: &'a Device, name: &str) -> Option<&'a str> {
    device.attributes.as_ref()?.get(name)?.string.as_deref()
}

/// What holds a shared claim to the memory it was allocated.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum MemoryEnforcement {
    /// The claim's MPS control daemon pins each client's device memory (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`): the
    /// CUDA client library refuses allocations past it.
    #[default]
    MpsPinned,
    /// The driver caps the container's cgroup (R615+, `nvmlDeviceSetMemoryLimits`), set by the container
    /// toolkit's `apply-cuda-memory-limits` CDI hook from `NVIDIA_GPU_MEMORY_LIMIT`: allocations past it fail in
    /// the driver, whatever the process loads.
    Driver,
}

/// The first driver branch that enforces per-cgroup GPU memory limits (R615, CUDA 13.4).
pub const DRIVER_MEMORY_LIMITS_BRANCH: u32 = 615;

/// Whether the driver `driver_version` (`615.10.02`) caps cgroups' GPU memory.
#[must_use]
pub fn driver_caps_memory(driver_version: &str) -> bool {
    driver_version
        .split('.')
        .next()
        .and_then(|major| major.parse::<u32>().ok())
        .is_some_and(|branch| branch >= DRIVER_MEMORY_LIMITS_BRANCH)
}

/// How a shared claim's memory is enforced on a device of `device_type` (`gpu` or `mig`) whose driver is
/// `driver_version`, on a host where the toolkit's memory-limit hook is `hook_available`: by the driver where it
/// can (a whole GPU, R615+, the hook installed, cgroup v2), else by MPS. The driver's limits do not apply to MIG
/// devices.
#[must_use]
pub fn memory_enforcement(
    device_type: &str,
    driver_version: &str,
    hook_available: bool,
) -> MemoryEnforcement {
    if hook_available && device_type == TYPE_GPU && driver_caps_memory(driver_version) {
        MemoryEnforcement::Driver
    } else {
        MemoryEnforcement::MpsPinned
    }
}

/// Node label naming the GPUs of the node the DRA driver takes (the device plugin advertises the others); it
/// overrides the ClusterPolicy's `draDriver.gpus`.
pub const LABEL_DRA_GPUS: &str = "nvidia.com/dra.gpus";
/// Node label naming which of the DRA driver's GPUs are shared (consumable memory and cores); it overrides the
/// ClusterPolicy's `draDriver.sharedGPUs`.
pub const LABEL_DRA_SHARED_GPUS: &str = "nvidia.com/dra.shared-gpus";
/// Node label naming which of the DRA driver's GPUs it serves as MIG on demand (every profile and placement
/// published, instances made at prepare); it overrides the ClusterPolicy's `draDriver.dynamicMIG`.
pub const LABEL_DRA_DYNAMIC_MIG_GPUS: &str = "nvidia.com/dra.dynamic-mig-gpus";

/// A set of a node's GPUs by index: `all`, `none`, or a list of indices and ranges such as `0,2-3`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GpuSet {
    /// Every GPU of the node.
    All,
    /// No GPU.
    #[default]
    None,
    /// These indices.
    Indices(BTreeSet<u32>),
}

impl GpuSet {
    /// Whether the GPU with this index is in the set.
    #[must_use]
    pub fn contains(&self, index: u32) -> bool {
        match self {
            Self::All => true,
            Self::None => false,
            Self::Indices(indices) => indices.contains(&index),
        }
    }
}

/// The highest GPU index a set may name. Nodes have at most a few dozen GPUs, numbered from 0 as NVML numbers them;
/// the bound is checked before a range is expanded, so that a label such as `0-4294967295` is an error, not four
/// billion entries in the memory of the device plugin and the DRA driver.
pub const MAX_GPU_INDEX: u32 = 1023;

/// A GPU set that is not `all`, `none` or a list of indices and ranges.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{value:?} is not a GPU set: write `all`, `none`, or GPU indices and ranges such as `0,2-3` ({reason})"
)]
pub struct GpuSetError {
    value: String,
    reason: &'static str,
}

impl FromStr for GpuSet {
    type Err = GpuSetError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let error = |reason| GpuSetError {
            value: value.to_owned(),
            reason,
        };
        match value.trim() {
            "all" => return Ok(Self::All),
            "none" | "" => return Ok(Self::None),
            _ => {}
        }
        let mut indices = BTreeSet::new();
        for part in value.split(',').map(str::trim) {
            let index = |text: &str| {
                let index = text
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| error("an index is not a number"))?;
                if index > MAX_GPU_INDEX {
                    return Err(error(
                        "an index is above 1023, the highest GPU index a set may name",
                    ));
                }
                Ok(index)
            };
            match part.split_once('-') {
                Some((first, last)) => {
                    let (first, last) = (index(first)?, index(last)?);
                    if first > last {
                        return Err(error("a range ends before it starts"));
                    }
                    indices.extend(first..=last);
                }
                None => {
                    indices.insert(index(part)?);
                }
            }
        }
        Ok(Self::Indices(indices))
    }
}

impl fmt::Display for GpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("all"),
            Self::None => f.write_str("none"),
            Self::Indices(indices) => {
                let parts: Vec<String> = indices.iter().map(u32::to_string).collect();
                f.write_str(&parts.join(","))
            }
        }
    }
}

/// Which of a node's GPUs the DRA driver takes, which of those it shares, and which it serves as MIG on demand.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Partition {
    /// GPUs the DRA driver publishes; the device plugin leaves them out.
    pub dra: GpuSet,
    /// GPUs of `dra` published as shared (consumable memory and cores).
    pub shared: GpuSet,
    /// GPUs of `dra` published as MIG on demand: every profile and placement, consuming the GPU's counters. On a
    /// GPU also in `shared`, each instance is shared (consumable memory and cores inside it).
    pub dynamic_mig: GpuSet,
}

impl Partition {
    /// Whether the device plugin may advertise this GPU: it is not the DRA driver's.
    #[must_use]
    pub fn plugin_owns(&self, index: u32) -> bool {
        !self.dra.contains(index)
    }

    /// Whether the DRA driver publishes this GPU as shared: the whole GPU, or each MIG instance made on demand.
    #[must_use]
    pub fn shares(&self, index: u32) -> bool {
        self.dra.contains(index) && self.shared.contains(index)
    }

    /// Whether the DRA driver serves this GPU as MIG on demand (when its MIG mode is on).
    #[must_use]
    pub fn dynamic_mig(&self, index: u32) -> bool {
        self.dra.contains(index) && self.dynamic_mig.contains(index)
    }
}

/// A node's partition: its labels override the ClusterPolicy's defaults (which the operator passes to both the
/// device plugin and the DRA driver). A label that is not a GPU set is ignored in favour of the default, the same
/// way by both, so they never disagree about a GPU; the error says which label to fix.
#[must_use]
pub fn partition(
    defaults: &Partition,
    labels: &BTreeMap<String, String>,
) -> (Partition, Vec<(&'static str, GpuSetError)>) {
    let mut errors = Vec::new();
    let mut pick = |label: &'static str, default: &GpuSet| match labels.get(label) {
        None => default.clone(),
        Some(value) => value.parse().unwrap_or_else(|error| {
            errors.push((label, error));
            default.clone()
        }),
    };
    let chosen = Partition {
        dra: pick(LABEL_DRA_GPUS, &defaults.dra),
        shared: pick(LABEL_DRA_SHARED_GPUS, &defaults.shared),
        dynamic_mig: pick(LABEL_DRA_DYNAMIC_MIG_GPUS, &defaults.dynamic_mig),
    };
    (chosen, errors)
}

/// What a device of the DRA driver's slices is, by its name: a whole GPU `gpu-<index>`, a MIG device that exists
/// `gpu-<index>-mig-<gpu instance>-<compute instance>`, or a MIG placement made on demand
/// `gpu-<index>-mig-<profile>-<profile id>-<placement start>` (NVIDIA's DRA driver's form, the profile without its
/// dots and plus sign: `gpu-0-mig-1g10gbme-20-3`). The exporter reads names back into GPUs this way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceName {
    /// A whole GPU, by index.
    Gpu(u32),
    /// A MIG device: its GPU's index, its GPU instance and compute instance.
    Mig {
        /// The GPU's index.
        gpu: u32,
        /// The GPU instance.
        gpu_instance: u32,
        /// The compute instance.
        compute_instance: u32,
    },
    /// A MIG placement, whose instance exists while a claim holds it.
    MigPlacement {
        /// The GPU's index.
        gpu: u32,
        /// The profile's name as a DNS label part: `1g.10gb+me` is `1g10gbme`.
        profile: String,
        /// The GPU-instance profile id.
        profile_id: u32,
        /// The first memory slice of the placement.
        start: u32,
    },
}

/// A MIG profile's name as it may appear in a device name (a DNS label): its letters and digits.
#[must_use]
pub fn profile_label(profile: &str) -> String {
    profile
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect()
}

impl DeviceName {
    /// Reads a device name this driver wrote; `None` for any other.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("gpu-")?;
        match rest.split_once("-mig-") {
            None => rest.parse().ok().map(Self::Gpu),
            Some((gpu, rest)) => {
                let gpu = gpu.parse().ok()?;
                let parts: Vec<&str> = rest.split('-').collect();
                match parts[..] {
                    [gpu_instance, compute_instance] => Some(Self::Mig {
                        gpu,
                        gpu_instance: gpu_instance.parse().ok()?,
                        compute_instance: compute_instance.parse().ok()?,
                    }),
                    [profile, profile_id, start]
                        if !profile.is_empty()
                            && profile.chars().all(|c| c.is_ascii_alphanumeric()) =>
                    {
                        Some(Self::MigPlacement {
                            gpu,
                            profile: profile.to_owned(),
                            profile_id: profile_id.parse().ok()?,
                            start: start.parse().ok()?,
                        })
                    }
                    _ => None,
                }
            }
        }
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gpu(index) => write!(f, "gpu-{index}"),
            Self::Mig {
                gpu,
                gpu_instance,
                compute_instance,
            } => write!(f, "gpu-{gpu}-mig-{gpu_instance}-{compute_instance}"),
            Self::MigPlacement {
                gpu,
                profile,
                profile_id,
                start,
            } => write!(f, "gpu-{gpu}-mig-{profile}-{profile_id}-{start}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn device_names_read_back() {
        for name in ["gpu-3", "gpu-0-mig-7-0", "gpu-2-mig-1g10gbme-20-3"] {
            assert_eq!(DeviceName::parse(name).unwrap().to_string(), name);
        }
        assert_eq!(
            DeviceName::parse("gpu-1-mig-2-0"),
            Some(DeviceName::Mig {
                gpu: 1,
                gpu_instance: 2,
                compute_instance: 0
            })
        );
        assert_eq!(
            DeviceName::parse("gpu-1-mig-3g40gb-9-4"),
            Some(DeviceName::MigPlacement {
                gpu: 1,
                profile: "3g40gb".into(),
                profile_id: 9,
                start: 4
            })
        );
        assert_eq!(profile_label("1g.10gb+me"), "1g10gbme");
        for other in [
            "gpu",
            "gpu-x",
            "nic-0",
            "gpu-1-mig-2",
            "gpu-1-mig-1g.5gb-9-4",
            "gpu-1-mig-a-b-c-d",
        ] {
            assert_eq!(DeviceName::parse(other), None, "{other}");
        }
    }

    use super::*;

    #[test]
    fn gpu_sets_parse_and_print() {
        assert_eq!("all".parse::<GpuSet>().unwrap(), GpuSet::All);
        assert_eq!("none".parse::<GpuSet>().unwrap(), GpuSet::None);
        let set: GpuSet = "0, 2-4".parse().unwrap();
        assert_eq!(set.to_string(), "0,2,3,4");
        assert!(set.contains(3) && !set.contains(1));
        let error = "2-1".parse::<GpuSet>().unwrap_err().to_string();
        assert!(error.contains("a range ends before it starts"), "{error}");
        assert!("gpu0".parse::<GpuSet>().is_err());
    }

    /// A range is bounded before it is expanded: a label of four billion GPUs is an error naming the bound.
    #[test]
    fn ranges_beyond_the_highest_index_are_refused_before_expansion() {
        for value in ["0-4294967295", "4294967295", "1024", "5,0-1024"] {
            let error = value.parse::<GpuSet>().unwrap_err().to_string();
            assert!(
                error.contains(&format!(
                    "an index is above {MAX_GPU_INDEX}, the highest GPU index a set may name"
                )),
                "{error}"
            );
        }
        let widest: GpuSet = format!("0-{MAX_GPU_INDEX}").parse().unwrap();
        assert!(widest.contains(MAX_GPU_INDEX) && !widest.contains(MAX_GPU_INDEX + 1));
    }

    #[test]
    fn labels_override_the_defaults_and_bad_labels_fall_back_to_them() {
        let defaults = Partition {
            dra: GpuSet::All,
            shared: GpuSet::None,
            dynamic_mig: GpuSet::None,
        };
        let labels = BTreeMap::from([
            (LABEL_DRA_GPUS.to_owned(), "1-3".to_owned()),
            (LABEL_DRA_SHARED_GPUS.to_owned(), "three".to_owned()),
        ]);
        let (chosen, errors) = partition(&defaults, &labels);
        assert_eq!(chosen.dra.to_string(), "1,2,3");
        assert_eq!(chosen.shared, GpuSet::None);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, LABEL_DRA_SHARED_GPUS);
        assert!(chosen.plugin_owns(0) && !chosen.plugin_owns(2));
        let shared = Partition {
            dra: "1-2".parse().unwrap(),
            shared: GpuSet::All,
            dynamic_mig: "2".parse().unwrap(),
        };
        assert!(shared.shares(1) && !shared.shares(0));
        assert!(
            shared.shares(2) && shared.dynamic_mig(2) && !shared.dynamic_mig(1),
            "a GPU served as MIG on demand may share its instances"
        );
        let labels = BTreeMap::from([(LABEL_DRA_DYNAMIC_MIG_GPUS.to_owned(), "0".to_owned())]);
        let (chosen, errors) = partition(&defaults, &labels);
        assert!(errors.is_empty() && chosen.dynamic_mig(0) && !chosen.dynamic_mig(1));
    }

    #[test]
    fn expressions_name_the_driver_domain() {
        assert_eq!(
            attribute_expression(ATTRIBUTE_PRODUCT_NAME),
            r#"device.attributes["gpu.nvidia.com"].productName"#
        );
        assert_eq!(
            capacity_expression(CAPACITY_MEMORY),
            r#"device.capacity["gpu.nvidia.com"].memory"#
        );
    }

    #[test]
    fn the_driver_enforces_memory_on_whole_gpus_from_r615_with_the_hook() {
        use super::{MemoryEnforcement::*, TYPE_GPU, TYPE_MIG, memory_enforcement};
        assert_eq!(memory_enforcement(TYPE_GPU, "615.10.02", true), Driver);
        assert_eq!(memory_enforcement(TYPE_GPU, "620.1", true), Driver);
        // R580 has no per-cgroup limits; MIG devices are not capped by the driver; no hook, no limit.
        assert_eq!(memory_enforcement(TYPE_GPU, "580.159.04", true), MpsPinned);
        assert_eq!(memory_enforcement(TYPE_MIG, "615.10.02", true), MpsPinned);
        assert_eq!(memory_enforcement(TYPE_GPU, "615.10.02", false), MpsPinned);
        assert_eq!(memory_enforcement(TYPE_GPU, "unknown", true), MpsPinned);
    }
}

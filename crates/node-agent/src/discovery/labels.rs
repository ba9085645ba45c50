//! The GPU feature discovery labels, as a pure function of one reading of the GPUs, the MIG strategy, the
//! device plugin's sharing settings and the machine type. The names and values are NVIDIA's (reference:
//! nvidia-compat.md, "GPU feature discovery labels"), so that node selectors written for their GFD keep working.
//!
//! By strategy: `none` labels the full GPUs; `single` labels the MIG devices as if they were the GPUs (product
//! `<product>-MIG-<profile>`, their count, memory and slices), which needs every GPU in MIG mode with one profile;
//! `mixed` labels the full GPUs plus `nvidia.com/mig-<profile>.*` for each profile present.

use std::collections::BTreeMap;

use crd::config::device_plugin::{
    DevicePluginConfig, MigStrategy, SharingStrategy, mig_resource_name,
};
use crd::labels::NVIDIA_PREFIX;
use crd::mig::{ComputeCapability, MigProfileName};
use gpu::MigDevice;

use crate::inventory::GpuView;
use crate::node_patch::MetadataPatch;

/// Labels this role owns besides the `nvidia.com/mig-<profile>.*` family: it removes any of them that no longer
/// applies, and never touches other `nvidia.com/` labels (the operator's, the MIG manager's, an admin's).
const OWNED: [&str; 27] = [
    "gpu.product",
    "gpu.memory",
    "gpu.count",
    "gpu.family",
    "gpu.compute.major",
    "gpu.compute.minor",
    "gpu.machine",
    "gpu.replicas",
    "gpu.sharing-strategy",
    "gpu.multiprocessors",
    "gpu.slices.gi",
    "gpu.slices.ci",
    "gpu.engines.copy",
    "gpu.engines.decoder",
    "gpu.engines.encoder",
    "gpu.engines.jpeg",
    "gpu.engines.ofa",
    "cuda.driver-version.major",
    "cuda.driver-version.minor",
    "cuda.driver-version.revision",
    "cuda.driver-version.full",
    "cuda.runtime-version.major",
    "cuda.runtime-version.minor",
    "cuda.runtime-version.full",
    "mig.capable",
    "mps.capable",
    "mig.strategy",
];

/// Whether `key` is a label this role writes.
#[must_use]
pub fn is_owned(key: &str) -> bool {
    key.strip_prefix(NVIDIA_PREFIX).is_some_and(|name| {
        OWNED.contains(&name) || (name.starts_with("mig-") && name.contains('.'))
    })
}

/// How one resource is replicated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replication {
    /// Replicas per device.
    pub replicas: u32,
    /// Whether the replicas are advertised under another name (`rename`, or `<name>.shared`).
    pub renamed: bool,
}

/// The sharing the device plugin's config sets up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharing {
    /// Time-slicing or MPS.
    pub strategy: SharingStrategy,
    /// Replicated resources by name (`nvidia.com/gpu`, `nvidia.com/mig-1g.5gb`, ...).
    pub resources: BTreeMap<String, Replication>,
}

impl Sharing {
    /// The sharing of a device-plugin config; `None` when it replicates nothing.
    #[must_use]
    pub fn of(config: &DevicePluginConfig) -> Option<Self> {
        let (strategy, shared) = config.sharing.as_ref()?.active()?;
        let resources = shared
            .resources
            .iter()
            .map(|resource| {
                let replication = Replication {
                    replicas: resource.replicas,
                    renamed: shared.advertised_name(resource) != resource.name,
                };
                (resource.name.as_str().to_owned(), replication)
            })
            .collect();
        Some(Self {
            strategy,
            resources,
        })
    }
}

/// Everything the labels derive from.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The GPUs.
    pub gpus: &'a [GpuView],
    /// The MIG strategy.
    pub strategy: MigStrategy,
    /// The sharing in effect, if any.
    pub sharing: Option<&'a Sharing>,
    /// The machine type (`gpu.machine`).
    pub machine: &'a str,
}

/// Why no labels can be computed; the role reports it and leaves the labels as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// The driver sees no GPU.
    #[error("no GPUs found")]
    NoGpus,
    /// The `single` strategy needs one profile on MIG GPUs only.
    #[error(
        "MIG strategy single needs every GPU in MIG mode with MIG devices of one profile; found {found} \
         (use the mixed strategy, or a config with one profile for all GPUs)"
    )]
    NotSingle {
        /// What the GPUs have.
        found: String,
    },
}

/// The labels, by full name.
///
/// # Errors
/// No GPUs, or GPUs the `single` strategy cannot describe.
pub fn labels(facts: Facts<'_>) -> Result<BTreeMap<String, String>, LabelError> {
    let first = &facts.gpus.first().ok_or(LabelError::NoGpus)?.inventory;
    let mut labels = Labels::default();
    let driver: Vec<&str> = first.driver_version.split('.').collect();
    for (part, value) in ["major", "minor", "revision"].iter().zip(&driver) {
        labels.set(&format!("cuda.driver-version.{part}"), value);
    }
    labels.set("cuda.driver-version.full", &first.driver_version);
    let cuda = first.cuda_driver_version;
    labels.set("cuda.runtime-version.major", cuda.major);
    labels.set("cuda.runtime-version.minor", cuda.minor);
    labels.set("cuda.runtime-version.full", cuda);
    labels.set("gpu.machine", facts.machine);
    let mig_capable = facts.gpus.iter().any(|gpu| gpu.inventory.mig_capable());
    labels.set("mig.capable", mig_capable);
    labels.set("mig.strategy", strategy_name(facts.strategy));
    let sharing = facts.sharing;
    labels.set(
        "gpu.sharing-strategy",
        sharing.map_or("none", |sharing| sharing.strategy.label_value()),
    );
    labels.set(
        "mps.capable",
        sharing.is_some_and(|sharing| sharing.strategy == SharingStrategy::Mps),
    );
    labels.set("gpu.family", family(first.compute_capability));
    labels.set("gpu.compute.major", first.compute_capability.major);
    labels.set("gpu.compute.minor", first.compute_capability.minor);

    let gpu_resource = replication(sharing, "nvidia.com/gpu");
    let devices = mig_devices(facts.gpus);
    if facts.strategy == MigStrategy::Single && facts.gpus.iter().any(mig_on) {
        let profile = single_profile(facts.gpus, &devices)?;
        let (_, example) = devices[0];
        labels.set(
            "gpu.product",
            product(&first.product_name, Some(&profile), gpu_resource),
        );
        labels.set("gpu.count", devices.len());
        labels.device("gpu", &profile, example);
        labels.set("gpu.replicas", gpu_resource.map_or(1, |r| r.replicas));
        return Ok(labels.0);
    }
    labels.set(
        "gpu.product",
        product(&first.product_name, None, gpu_resource),
    );
    labels.set("gpu.count", facts.gpus.len());
    labels.set("gpu.memory", first.memory_mib);
    labels.set("gpu.replicas", gpu_resource.map_or(1, |r| r.replicas));
    if facts.strategy == MigStrategy::Mixed {
        let mut by_profile: BTreeMap<MigProfileName, Vec<&MigDevice>> = BTreeMap::new();
        for (profile, device) in &devices {
            by_profile.entry(*profile).or_default().push(device);
        }
        for (profile, found) in by_profile {
            let resource = mig_resource_name(&profile);
            let prefix = resource.short_name();
            let shared = replication(sharing, resource.as_str());
            labels.set(&format!("{prefix}.count"), found.len());
            labels.set(
                &format!("{prefix}.replicas"),
                shared.map_or(1, |r| r.replicas),
            );
            labels.set(
                &format!("{prefix}.product"),
                product(&first.product_name, Some(&profile), shared),
            );
            labels.device(prefix, &profile, found[0]);
        }
    }
    Ok(labels.0)
}

/// The patch that brings the node's labels to `desired`: changed values set, owned labels that no longer apply
/// removed, every other label untouched.
#[must_use]
pub fn patch(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> MetadataPatch {
    let mut patch = MetadataPatch::default();
    for (key, value) in desired {
        patch = patch.label(key.clone(), value.clone());
    }
    for key in current
        .keys()
        .filter(|key| is_owned(key) && !desired.contains_key(*key))
    {
        patch.labels.insert(key.clone(), None);
    }
    patch.minus(current, &BTreeMap::new())
}

/// Label values by full name, sanitised to what a label value may hold.
#[derive(Debug, Default)]
struct Labels(BTreeMap<String, String>);

impl Labels {
    fn set(&mut self, name: &str, value: impl ToString) {
        self.0.insert(
            format!("{NVIDIA_PREFIX}{name}"),
            label_value(&value.to_string()),
        );
    }

    /// The attributes of one MIG device under `prefix` (`gpu` or `mig-<profile>`).
    fn device(&mut self, prefix: &str, profile: &MigProfileName, device: &MigDevice) {
        self.set(&format!("{prefix}.memory"), device.memory_mib);
        self.set(
            &format!("{prefix}.multiprocessors"),
            device.multiprocessor_count,
        );
        self.set(&format!("{prefix}.slices.gi"), profile.gpu_instance.slices);
        self.set(&format!("{prefix}.slices.ci"), profile.compute_slices);
        // Only a backend that counts them (NVML) gives engine labels; they are never guessed.
        if let Some(engines) = device.engines {
            for (engine, count) in [
                ("copy", engines.copy),
                ("decoder", engines.decoder),
                ("encoder", engines.encoder),
                ("jpeg", engines.jpeg),
                ("ofa", engines.ofa),
            ] {
                self.set(&format!("{prefix}.engines.{engine}"), count);
            }
        }
    }
}

fn mig_on(gpu: &GpuView) -> bool {
    gpu.inventory.mig_mode.is_some_and(|mode| mode.current)
}

/// Every named MIG device of the node.
fn mig_devices(gpus: &[GpuView]) -> Vec<(MigProfileName, &MigDevice)> {
    gpus.iter()
        .flat_map(|gpu| &gpu.devices)
        .filter_map(|(name, device)| Some(((*name)?, device)))
        .collect()
}

/// The one profile of the `single` strategy.
fn single_profile(
    gpus: &[GpuView],
    devices: &[(MigProfileName, &MigDevice)],
) -> Result<MigProfileName, LabelError> {
    let mut profiles: Vec<String> = devices.iter().map(|(name, _)| name.to_string()).collect();
    profiles.sort();
    profiles.dedup();
    let full = gpus.iter().filter(|gpu| !mig_on(gpu)).count();
    match (devices.first(), profiles.len(), full) {
        (Some((profile, _)), 1, 0) => Ok(*profile),
        _ => Err(LabelError::NotSingle {
            found: format!(
                "{full} GPUs with MIG off and MIG devices of [{}]",
                profiles.join(", ")
            ),
        }),
    }
}

/// How a resource is replicated, if it is.
fn replication<'s>(sharing: Option<&'s Sharing>, resource: &str) -> Option<&'s Replication> {
    sharing?.resources.get(resource)
}

/// `NVIDIA-A100-SXM4-40GB`, `...-MIG-1g.5gb`, with `-SHARED` when replicas are advertised under the original name.
fn product(name: &str, profile: Option<&MigProfileName>, shared: Option<&Replication>) -> String {
    let mut product = name.replace(' ', "-");
    if let Some(profile) = profile {
        product.push_str(&format!("-MIG-{profile}"));
    }
    if shared.is_some_and(|replication| !replication.renamed) {
        product.push_str("-SHARED");
    }
    product
}

fn strategy_name(strategy: MigStrategy) -> &'static str {
    match strategy {
        MigStrategy::None => "none",
        MigStrategy::Single => "single",
        MigStrategy::Mixed => "mixed",
    }
}

/// The architecture name for a compute capability.
#[must_use]
pub fn family(capability: ComputeCapability) -> &'static str {
    match (capability.major, capability.minor) {
        (3, _) => "kepler",
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, 0..=4) => "volta",
        (7, _) => "turing",
        (8, 9) => "ada-lovelace",
        (8, _) => "ampere",
        (9, _) => "hopper",
        (10 | 12, _) => "blackwell",
        _ => "undefined",
    }
}

/// A valid label value: at most 63 characters of letters, digits, `-`, `_` and `.`, starting and ending with a
/// letter or digit (anything else becomes `-`, ends are trimmed).
#[must_use]
pub fn label_value(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    cleaned
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

#[cfg(test)]
#[path = "labels_tests.rs"]
mod tests;

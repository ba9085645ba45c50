//! The GPU feature discovery labels, as a pure function of one reading of the GPUs, the MIG strategy, the
//! device plugin's sharing settings, the machine type and the GPUs' PCI classes. Names, values and the rules
//! that compute them are those of NVIDIA's GFD (k8s-device-plugin `internal/lm`), so that node selectors written
//! for it keep working; `tests/fixtures/nvidia/gfd-expected-output*.txt` holds its expected label formats.
//!
//! By strategy: `none` labels the full GPUs; `single` labels the MIG devices as if they were the GPUs (product
//! `<product>-MIG-<profile>`, their count, memory and slices), which needs every GPU in MIG mode with one profile
//! (else the product is `<product>-MIG-INVALID` with a count of 0); `mixed` labels the full GPUs plus
//! `nvidia.com/mig-<profile>.*` for each profile present. `mig.strategy` is written for `single` and `mixed`
//! only. A resource's `sharing-strategy` is that of the config when the resource has more than one replica, else
//! `none`; GPUs with MIG on are labelled without sharing (replicas 0).

use std::collections::BTreeMap;
use std::time::Duration;

use crd::config::device_plugin::{
    DevicePluginConfig, MigStrategy, SharingStrategy, mig_resource_name,
};
use crd::labels::{NVIDIA_PREFIX, written_by_feature_discovery};
use crd::mig::MigProfileName;
use crd::node_patch::MetadataPatch;
use gpu::{CudaVersion, MigDevice};
use node_runtime::host::{PCI_CLASS_3D, PCI_CLASS_VGA};
use node_runtime::inventory::GpuView;

/// The label with the time of the last labelling pass, in Unix seconds.
pub const TIMESTAMP: &str = "nvidia.com/gfd.timestamp";

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
    /// The PCI class of each GPU (`0x0302`, `0x0300`) by PCI address, for `gpu.mode`; a GPU missing here makes the
    /// mode `unknown`, as GFD does when it cannot read a class.
    pub pci_classes: &'a BTreeMap<String, u32>,
}

/// Why no labels can be computed; the role reports it and leaves the labels as they are (GFD exits on these).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// The driver sees no GPU.
    #[error("no GPUs found")]
    NoGpus,
    /// The driver version is not `X.Y[.Z]`.
    #[error("driver version {0:?} is not of the form X.Y or X.Y.Z")]
    DriverVersion(String),
    /// MPS sharing configured on a node whose GPUs have MIG on.
    #[error(
        "MPS sharing is not supported for MIG devices: GPU {gpu} has MIG enabled (use time-slicing, or a MIG \
         config with MIG disabled)"
    )]
    MpsWithMig {
        /// The first GPU with MIG on.
        gpu: u32,
    },
}

/// Why the `single` strategy cannot describe the node. GFD then labels the node `<product>-MIG-INVALID` with a
/// count of 0, so that nothing gets scheduled on a wrong device; so do we, and the role reports this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "MIG strategy single needs every GPU in MIG mode with MIG devices of one profile; found {found} (use the \
     mixed strategy, or a config with one profile for all GPUs)"
)]
pub struct NotSingle {
    /// What the GPUs have.
    pub found: String,
}

/// The labels of one pass, and the problem that made the `single` strategy's labels invalid, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labelled {
    /// The labels, by full name, without the timestamp (see [`patch`]).
    pub labels: BTreeMap<String, String>,
    /// Set when the `single` strategy labelled the node invalid.
    pub invalid: Option<NotSingle>,
}

/// The labels, by full name, computed as NVIDIA's GPU feature discovery computes them.
///
/// # Errors
/// No GPUs, a driver version that is not `X.Y[.Z]`, or MPS sharing with MIG on.
pub fn labels(facts: Facts<'_>) -> Result<Labelled, LabelError> {
    let first = &facts.gpus.first().ok_or(LabelError::NoGpus)?.inventory;
    let mut labels = Labels::default();
    labels.versions(&first.driver_version, first.cuda_driver_version)?;
    labels.set("gpu.machine", sanitise(facts.machine));
    let mig_capable = facts.gpus.iter().any(|gpu| gpu.inventory.mig_capable());
    labels.set("mig.capable", mig_capable);
    labels.set("mps.capable", mps_capable(&facts)?);
    labels.set("gpu.mode", gpu_mode(facts.gpus, facts.pci_classes));

    // Whole GPUs. GFD labels GPUs with MIG on without the sharing settings (no replicas), and lets those with MIG
    // off, which the device plugin does share, override them.
    let whole = Resource {
        name: FULL_GPU,
        sharing: facts
            .gpus
            .iter()
            .any(|gpu| !mig_on(gpu))
            .then_some(facts.sharing),
    };
    labels.base(&whole, &[&first.product_name], facts.gpus.len());
    if first.memory_mib != 0 {
        labels.set("gpu.memory", first.memory_mib);
    }
    if first.compute_capability.major != 0 {
        labels.set("gpu.family", first.compute_capability.family());
        labels.set("gpu.compute.major", first.compute_capability.major);
        labels.set("gpu.compute.minor", first.compute_capability.minor);
    }

    let invalid = match facts.strategy {
        MigStrategy::None => None,
        MigStrategy::Single => {
            labels.set("mig.strategy", "single");
            labels.single(&facts).err()
        }
        MigStrategy::Mixed => {
            labels.set("mig.strategy", "mixed");
            labels.mixed(&facts);
            None
        }
    };
    Ok(Labelled {
        labels: labels.0,
        invalid,
    })
}

/// `mps.capable`: false unless the config shares with MPS; then true, and an error when a GPU has MIG on (GFD
/// refuses to label such a node, as the device plugin refuses to start).
fn mps_capable(facts: &Facts<'_>) -> Result<bool, LabelError> {
    if facts.sharing.map(|sharing| sharing.strategy) != Some(SharingStrategy::Mps) {
        return Ok(false);
    }
    match facts.gpus.iter().find(|gpu| mig_on(gpu)) {
        Some(gpu) => Err(LabelError::MpsWithMig {
            gpu: gpu.inventory.index,
        }),
        None => Ok(true),
    }
}

/// `gpu.mode`: `compute` when every GPU is a 3D controller, `graphics` when every one is a VGA controller,
/// otherwise (mixed classes, a class not read) `unknown`.
#[must_use]
pub fn gpu_mode(gpus: &[GpuView], classes: &BTreeMap<String, u32>) -> &'static str {
    let found: Option<Vec<u32>> = gpus
        .iter()
        .map(|gpu| {
            classes
                .get(&pci_address(&gpu.inventory.pci_bus_id))
                .copied()
        })
        .collect();
    let Some(mut found) = found else {
        return "unknown";
    };
    found.sort_unstable();
    found.dedup();
    match found.as_slice() {
        [PCI_CLASS_3D] => "compute",
        [PCI_CLASS_VGA] => "graphics",
        _ => "unknown",
    }
}

/// A PCI address as sysfs names it (`0000:3b:00.0`), from NVML's form (`00000000:3B:00.0`).
#[must_use]
pub fn pci_address(bus_id: &str) -> String {
    let lower = bus_id.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

/// The full-GPU resource name, under which whole GPUs (and MIG devices with the single strategy) are labelled.
const FULL_GPU: &str = "nvidia.com/gpu";

/// One resource being labelled: its name and the sharing that applies to it (`None`: labelled without sharing,
/// replicas 0, as GFD does for GPUs with MIG on).
struct Resource<'a> {
    name: &'a str,
    sharing: Option<Option<&'a Sharing>>,
}

impl Resource<'_> {
    /// The label prefix: `gpu`, `mig-1g.5gb`.
    fn prefix(&self) -> &str {
        self.name.strip_prefix(NVIDIA_PREFIX).unwrap_or(self.name)
    }

    fn replication(&self) -> Option<&Replication> {
        self.sharing??.resources.get(self.name)
    }

    /// 0 without sharing settings; else the configured replicas, 1 when not replicated.
    fn replicas(&self) -> u32 {
        match self.sharing {
            None => 0,
            Some(_) => self.replication().map_or(1, |r| r.replicas.max(1)),
        }
    }

    fn shared(&self) -> bool {
        self.replication().is_some_and(|r| r.replicas > 1)
    }

    /// `none` unless replicated more than once.
    fn sharing_strategy(&self) -> &'static str {
        match self.sharing.flatten() {
            Some(sharing) if self.shared() => sharing.strategy.label_value(),
            _ => "none",
        }
    }

    /// The parts joined with `-`, with `-SHARED` when replicated under the original name.
    fn product(&self, parts: &[&str]) -> String {
        let mut parts: Vec<String> = parts
            .iter()
            .map(|part| sanitise(part))
            .filter(|part| !part.is_empty())
            .collect();
        if self.shared() && !self.replication().is_some_and(|r| r.renamed) {
            parts.push("SHARED".to_owned());
        }
        parts.join("-")
    }
}

/// How often the timestamp label is renewed when nothing else changes: GFD's default labelling interval. Renewing
/// it on every pass would patch the Node every `--interval`, and each patch wakes this role's own Node watch.
pub const TIMESTAMP_REFRESH: Duration = Duration::from_secs(60);

/// The patch that brings the node's labels to `desired`: changed values set, owned labels that no longer apply
/// removed, every other label untouched. With `now` (Unix seconds; `None` when timestamps are off, which removes
/// the label), `gfd.timestamp` is set to it whenever another label changes, or when it is missing or older than
/// [`TIMESTAMP_REFRESH`].
#[must_use]
pub fn patch(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
    now: Option<u64>,
) -> MetadataPatch {
    let mut patch = MetadataPatch::default();
    for (key, value) in desired {
        patch = patch.label(key.clone(), value.clone());
    }
    for key in current.keys().filter(|key| {
        written_by_feature_discovery(key) && !desired.contains_key(*key) && *key != TIMESTAMP
    }) {
        patch.labels.insert(key.clone(), None);
    }
    let mut patch = patch.minus(current, &BTreeMap::new());
    match now {
        None => {
            if current.contains_key(TIMESTAMP) {
                patch.labels.insert(TIMESTAMP.to_owned(), None);
            }
        }
        Some(now) => {
            let stale = current
                .get(TIMESTAMP)
                .and_then(|value| value.parse::<u64>().ok())
                .is_none_or(|then| now.saturating_sub(then) >= TIMESTAMP_REFRESH.as_secs());
            if stale || !patch.is_empty() {
                patch = patch.label(TIMESTAMP, now.to_string());
            }
        }
    }
    patch
}

/// Label values by full name.
#[derive(Debug, Default)]
struct Labels(BTreeMap<String, String>);

impl Labels {
    fn set(&mut self, name: &str, value: impl ToString) {
        self.0.insert(
            format!("{NVIDIA_PREFIX}{name}"),
            label_value(&value.to_string()),
        );
    }

    /// The driver and CUDA versions, under both the current names and the deprecated ones GFD still writes (the
    /// operator itself reads `cuda.driver.major`).
    fn versions(&mut self, driver: &str, cuda: CudaVersion) -> Result<(), LabelError> {
        let parts: Vec<&str> = driver.split('.').collect();
        let (major, minor, revision) = match parts.as_slice() {
            [major, minor] => (*major, *minor, ""),
            [major, minor, revision] => (*major, *minor, *revision),
            _ => return Err(LabelError::DriverVersion(driver.to_owned())),
        };
        for (name, value) in [
            ("cuda.driver.major", major),
            ("cuda.driver.minor", minor),
            ("cuda.driver.rev", revision),
            ("cuda.driver-version.major", major),
            ("cuda.driver-version.minor", minor),
            ("cuda.driver-version.revision", revision),
            ("cuda.driver-version.full", driver),
        ] {
            self.set(name, value);
        }
        for (name, value) in [
            ("cuda.runtime.major", cuda.major),
            ("cuda.runtime.minor", cuda.minor),
            ("cuda.runtime-version.major", cuda.major),
            ("cuda.runtime-version.minor", cuda.minor),
        ] {
            self.set(name, value);
        }
        self.set("cuda.runtime-version.full", cuda);
        Ok(())
    }

    /// Product, count, replicas and sharing strategy of a resource.
    fn base(&mut self, resource: &Resource<'_>, product: &[&str], count: usize) {
        let prefix = resource.prefix();
        self.set(&format!("{prefix}.product"), resource.product(product));
        self.set(&format!("{prefix}.count"), count);
        self.set(&format!("{prefix}.replicas"), resource.replicas());
        self.set(
            &format!("{prefix}.sharing-strategy"),
            resource.sharing_strategy(),
        );
    }

    /// One MIG resource: its base labels with the parent's product and the profile, and the attributes of one of
    /// its devices.
    fn mig(
        &mut self,
        resource: &Resource<'_>,
        parent: &str,
        profile: &MigProfileName,
        devices: &[&MigDevice],
    ) {
        let profile_name = profile.to_string().replace('+', ".");
        self.base(resource, &[parent, "MIG", &profile_name], devices.len());
        let prefix = resource.prefix();
        let device = devices[0];
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

    /// The `single` strategy: the MIG devices labelled as `nvidia.com/gpu`, when every GPU has MIG on with
    /// devices of one profile; nothing more when no GPU has MIG on; else the invalid labels.
    fn single(&mut self, facts: &Facts<'_>) -> Result<(), NotSingle> {
        let enabled: Vec<&GpuView> = facts.gpus.iter().filter(|gpu| mig_on(gpu)).collect();
        let Some(first) = enabled.first() else {
            return Ok(());
        };
        let devices = mig_devices(facts.gpus);
        let mut profiles: Vec<String> = devices
            .iter()
            .map(|(_, name, _)| name.to_string())
            .collect();
        profiles.sort();
        profiles.dedup();
        let full = facts.gpus.len() - enabled.len();
        let empty = enabled.iter().filter(|gpu| gpu.devices.is_empty()).count();
        let unnamed = enabled
            .iter()
            .flat_map(|gpu| &gpu.devices)
            .filter(|(name, _)| name.is_none())
            .count();
        if full > 0 || empty > 0 || unnamed > 0 || profiles.len() != 1 {
            let resource = Resource {
                name: FULL_GPU,
                sharing: None,
            };
            self.set(
                "gpu.product",
                resource.product(&[&first.inventory.product_name, "MIG", "INVALID"]),
            );
            self.set("gpu.count", 0);
            self.set("gpu.replicas", 0);
            self.set("gpu.sharing-strategy", "");
            self.set("gpu.memory", 0);
            return Err(NotSingle {
                found: format!(
                    "{full} GPUs with MIG off, {empty} with MIG on and no MIG devices, MIG devices of [{}]",
                    profiles.join(", ")
                ),
            });
        }
        let (parent, profile, _) = devices[0];
        let all: Vec<&MigDevice> = devices.iter().map(|(_, _, device)| *device).collect();
        let resource = Resource {
            name: FULL_GPU,
            sharing: Some(facts.sharing),
        };
        self.mig(&resource, parent, &profile, &all);
        Ok(())
    }

    /// The `mixed` strategy: `nvidia.com/mig-<profile>.*` for each profile present.
    fn mixed(&mut self, facts: &Facts<'_>) {
        let mut by_profile: BTreeMap<MigProfileName, (&str, Vec<&MigDevice>)> = BTreeMap::new();
        for (parent, profile, device) in mig_devices(facts.gpus) {
            by_profile
                .entry(profile)
                .or_insert_with(|| (parent, Vec::new()))
                .1
                .push(device);
        }
        for (profile, (parent, devices)) in by_profile {
            let name = mig_resource_name(&profile);
            let resource = Resource {
                name: name.as_str(),
                sharing: Some(facts.sharing),
            };
            self.mig(&resource, parent, &profile, &devices);
        }
    }
}

fn mig_on(gpu: &GpuView) -> bool {
    gpu.inventory.mig_mode.is_some_and(|mode| mode.current)
}

/// Every named MIG device of the node, with its GPU's product name.
fn mig_devices(gpus: &[GpuView]) -> Vec<(&str, MigProfileName, &MigDevice)> {
    gpus.iter()
        .flat_map(|gpu| {
            gpu.devices.iter().filter_map(|(name, device)| {
                Some((gpu.inventory.product_name.as_str(), (*name)?, device))
            })
        })
        .collect()
}

/// A name part as GFD cleans it: characters other than letters, digits, `-`, `_`, `.` and space dropped, runs of
/// spaces turned into one `-` (`NVIDIA A100-SXM4-40GB` -> `NVIDIA-A100-SXM4-40GB`).
#[must_use]
pub fn sanitise(text: &str) -> String {
    let kept: String = text
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
        .collect();
    kept.split_whitespace().collect::<Vec<_>>().join("-")
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

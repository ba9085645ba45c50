//! The device-plugin config file, version v1: flags, resource naming and GPU sharing (time-slicing, MPS).
//!
//! ```yaml
//! version: v1
//! flags:
//!   migStrategy: none
//! sharing:
//!   timeSlicing:
//!     renameByDefault: true
//!     resources:
//!       - name: nvidia.com/gpu
//!         replicas: 4
//! ```
//!
//! Field names and optionality follow NVIDIA's `api/config/v1` (including GFD's flags, which share the file), so
//! every file their plugin reads, this reads. Keys this version does not know are ignored, as NVIDIA's plugin
//! ignores them, but never silently: [`parse_tolerant`] returns them, and the device plugin logs them and shows
//! them in GPUNode status (`status.devicePlugin.configWarnings`), so that a misspelt `replica` is seen.
//!
//! Every typed field has its effect, except these, which are accepted and ignored (each one's doc says why):
//! `flags.failOnInitError`, `flags.restartOnDeviceUnhealthy`, `flags.mpsRoot`, `flags.nvidiaDriverRoot`,
//! `flags.nvidiaDevRoot`, `flags.gdrcopyEnabled`, `flags.gdsEnabled`, `flags.mofedEnabled`,
//! `flags.useNodeFeatureAPI`, `flags.deviceDiscoveryStrategy`, `flags.plugin.nvidiaCTKPath`,
//! `flags.plugin.containerDriverRoot`, `flags.plugin.kubeletSocket`, `flags.plugin.cdiFeatureFlags`,
//! `flags.gfd.oneshot`, `flags.gfd.sleepInterval`, `flags.gfd.outputFile`, `flags.gfd.machineTypeFile`, `imex`.

mod config_map;
mod devices;
mod duration;
mod node_config;
mod resource_name;
mod validate;

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use config_map::{ParsedConfigMap, parse_config_map};
pub use devices::{
    DeviceRef, MAX_MPS_REPLICAS, MAX_REPLICAS, ReplicatedDevices, device_uuid, is_replica,
    replica_id,
};
pub use duration::GoDuration;
pub use node_config::{ChoiceError, CommandLine, ConfigInputs, NodeConfig, node_config};
pub use resource_name::{ResourceName, ResourceNameError, mig_resource_name};

use serde_json::Value;
use serde_path_to_error::{Path, Segment};

use super::ConfigVersion;
use super::decode::{VersionField, document, path_error};
use super::error::ConfigError;

/// A whole device-plugin config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicePluginConfig {
    /// `v1`; NVIDIA's plugin reads a missing version as `v1`, and so do we.
    #[serde(default)]
    pub version: ConfigVersion,
    /// Settings that are also command-line flags of the plugin and GFD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<Flags>,
    /// Custom resource names by product-name pattern.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// GPU sharing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
    /// IMEX channels injected into containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imex: Option<Imex>,
}

/// Flags common to the plugin and GFD. Every field is optional: unset means the command line or the default decides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Flags {
    /// How MIG devices are advertised; wins over the command line in the device plugin and feature discovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_strategy: Option<MigStrategy>,
    /// Whether the plugin exits when NVML cannot be initialized. Accepted and ignored: the plugin always reports
    /// the failure in GPUNode status and retries, which is what `false` does in NVIDIA's plugin, without exiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_on_init_error: Option<bool>,
    /// Whether the plugin restarts when a device turns unhealthy. Accepted and ignored: devices recover here
    /// without a restart once their GPU has been quiet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_on_device_unhealthy: Option<bool>,
    /// Root of the MPS control daemon's files on the host. Accepted and ignored: the plugin's `--mps-root`, which
    /// the operator renders together with the matching host mount, decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_root: Option<String>,
    /// Root of the driver installation on the host. Accepted and ignored: device nodes and libraries reach
    /// containers through the container toolkit (or CDI), which has its own driver root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvidia_driver_root: Option<String>,
    /// Root of the device nodes on the host (defaults to the driver root). Accepted and ignored, as
    /// `nvidiaDriverRoot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvidia_dev_root: Option<String>,
    /// Whether GDRCopy devices are injected. Accepted and ignored: this plugin injects GPU devices only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdrcopy_enabled: Option<bool>,
    /// Whether GPUDirect Storage devices are injected. Accepted and ignored, as `gdrcopyEnabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gds_enabled: Option<bool>,
    /// Whether MOFED devices are injected. Accepted and ignored, as `gdrcopyEnabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mofed_enabled: Option<bool>,
    /// Whether GFD writes NodeFeature objects instead of a features file. Accepted and ignored: feature discovery
    /// here patches the Node's labels itself and needs neither NFD nor its API.
    #[serde(
        rename = "useNodeFeatureAPI",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub use_node_feature_api: Option<bool>,
    /// How devices are discovered. Accepted and ignored: devices always come from NVML (Tegra integrated GPUs are
    /// not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_discovery_strategy: Option<DeviceDiscoveryStrategy>,
    /// Flags of the plugin alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<PluginFlags>,
    /// Flags of GPU feature discovery alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gfd: Option<GfdFlags>,
}

/// Flags of the device plugin alone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginFlags {
    /// Whether device specs are passed to the kubelet in Allocate responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_device_specs: Option<bool>,
    /// How allocated devices reach the container; one value or a list. Empty when unset.
    #[serde(
        default,
        deserialize_with = "crate::config::de::one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub device_list_strategy: Vec<DeviceListStrategy>,
    /// How devices are named in the list passed to the container.
    #[serde(
        rename = "deviceIDStrategy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub device_id_strategy: Option<DeviceIdStrategy>,
    /// Annotation prefix for the `cdi-annotations` strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdi_annotation_prefix: Option<String>,
    /// Path of `nvidia-ctk` (the CDI hook) on the host. Accepted and ignored: the CDI spec written here names
    /// device nodes only and needs no hook.
    #[serde(
        rename = "nvidiaCTKPath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nvidia_ctk_path: Option<String>,
    /// Where the driver root is mounted in the plugin's container. Accepted and ignored, as
    /// `flags.nvidiaDriverRoot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_driver_root: Option<String>,
    /// Path of the kubelet's device-plugin socket. Accepted and ignored: the plugin's `--plugin-dir`, rendered with
    /// the kubelet root the operator knows, decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_socket: Option<String>,
    /// CDI feature flags, comma separated. Accepted and ignored: they tune NVIDIA's CDI spec generator, not used
    /// here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdi_feature_flags: Option<String>,
    /// Which replicas GetPreferredAllocation picks for shared (time-sliced or MPS) devices and MIG devices:
    /// `distributed` (NVIDIA's default) spreads a request over the GPUs with the fewest replicas in use,
    /// `packed` fills the GPUs with the most in use first. Whole GPUs are picked by NUMA locality either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_devices_allocation_policy: Option<AllocationPolicy>,
}

/// How GetPreferredAllocation picks among shared devices (NVIDIA's `sharedDevicesAllocationPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllocationPolicy {
    /// Fewest replicas in use first: workloads spread over the GPUs.
    #[default]
    Distributed,
    /// Most replicas in use first: workloads consolidate on few GPUs, leaving others free.
    Packed,
}

/// Flags of GPU feature discovery alone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GfdFlags {
    /// Label once and exit. Accepted and ignored: feature discovery runs as a DaemonSet and keeps labels current.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oneshot: Option<bool>,
    /// Leave out the `nvidia.com/gfd.timestamp` label (as the `--no-timestamp` flag does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_timestamp: Option<bool>,
    /// Time between labelling passes. Accepted and ignored: feature discovery's `--interval` decides, and it also
    /// runs on every Node and ConfigMap change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep_interval: Option<GoDuration>,
    /// Where the features file is written. Accepted and ignored: labels are patched onto the Node, no file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
    /// File holding the machine type. Accepted and ignored: the `--machine-type-file` flag decides, with the
    /// host mount the DaemonSet has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_type_file: Option<String>,
}

/// How MIG devices are advertised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    /// MIG devices are not advertised.
    None,
    /// Every MIG device as `nvidia.com/gpu`; all must have the same profile.
    Single,
    /// One resource per profile, `nvidia.com/mig-<profile>`.
    Mixed,
}

impl MigStrategy {
    /// The value as the file, the command line and the ClusterPolicy (`mig.strategy`) write it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Single => "single",
            Self::Mixed => "mixed",
        }
    }
}

impl std::fmt::Display for MigStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A MIG strategy that is none of NVIDIA's three.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected none, single or mixed, got {0:?}")]
pub struct MigStrategyError(pub String);

impl std::str::FromStr for MigStrategy {
    type Err = MigStrategyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [Self::None, Self::Single, Self::Mixed]
            .into_iter()
            .find(|strategy| strategy.as_str() == text)
            .ok_or_else(|| MigStrategyError(text.to_owned()))
    }
}

/// How allocated devices reach the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES`.
    Envvar,
    /// Volume mounts under `/var/run/nvidia-container-devices`.
    VolumeMounts,
    /// CDI annotations.
    CdiAnnotations,
    /// CDI device names in the CRI response.
    CdiCri,
}

/// How devices are named in the list passed to the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceIdStrategy {
    /// By UUID.
    Uuid,
    /// By index.
    Index,
}

/// How devices are discovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceDiscoveryStrategy {
    /// NVML where it works, else Tegra.
    Auto,
    /// NVML.
    Nvml,
    /// Tegra (integrated GPUs).
    Tegra,
}

/// Custom resource names: devices whose product name matches `pattern` are advertised as `name`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// For full GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<ResourceMapping>,
    /// For MIG devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<ResourceMapping>,
}

/// One pattern -> name rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceMapping {
    /// A product-name pattern where `*` matches anything.
    pub pattern: String,
    /// The resource name matching devices get.
    pub name: ResourceName,
}

/// GPU sharing: time-slicing, MPS, or both configured (MPS then wins, as in NVIDIA's plugin).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Sharing {
    /// Replicas that take turns on the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<ReplicatedResources>,
    /// Replicas that run concurrently under the MPS control daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<ReplicatedResources>,
}

/// The sharing strategy in effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SharingStrategy {
    /// Time-slicing.
    TimeSlicing,
    /// MPS.
    Mps,
}

impl SharingStrategy {
    /// The value of the `nvidia.com/gpu.sharing-strategy` label.
    #[must_use]
    pub const fn label_value(self) -> &'static str {
        match self {
            Self::TimeSlicing => "time-slicing",
            Self::Mps => "mps",
        }
    }
}

impl Sharing {
    /// The strategy in effect and its resources: MPS if it replicates anything, else time-slicing if it does, else
    /// none (the order NVIDIA's plugin applies).
    #[must_use]
    pub fn active(&self) -> Option<(SharingStrategy, &ReplicatedResources)> {
        [
            (SharingStrategy::Mps, &self.mps),
            (SharingStrategy::TimeSlicing, &self.time_slicing),
        ]
        .into_iter()
        .find_map(|(strategy, shared)| {
            shared
                .as_ref()
                .filter(|shared| !shared.resources.is_empty())
                .map(|shared| (strategy, shared))
        })
    }
}

/// The resources one sharing strategy replicates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReplicatedResources {
    /// Advertise `<name>.shared` instead of `<name>` when a resource has no `rename`.
    #[serde(default)]
    pub rename_by_default: bool,
    /// Refuse requests for more than one replica. Unset means false for time-slicing and true for MPS, as in
    /// NVIDIA's plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_requests_greater_than_one: Option<bool>,
    /// The resources to replicate.
    #[serde(default)]
    pub resources: Vec<ReplicatedResource>,
}

impl ReplicatedResources {
    /// The name `resource` is advertised under: its `rename`, else `<name>.shared` when `renameByDefault`, else
    /// its `name`. Validation has checked that `<name>.shared` is a valid name whenever it is used.
    #[must_use]
    pub fn advertised_name(&self, resource: &ReplicatedResource) -> ResourceName {
        match (&resource.rename, self.rename_by_default) {
            (Some(rename), _) => rename.clone(),
            (None, true) => resource
                .name
                .shared()
                .unwrap_or_else(|_| resource.name.clone()),
            (None, false) => resource.name.clone(),
        }
    }

    /// Whether a request for more than one replica fails, with the default of `strategy` when unset.
    #[must_use]
    pub fn fails_requests_greater_than_one(&self, strategy: SharingStrategy) -> bool {
        self.fail_requests_greater_than_one
            .unwrap_or(strategy == SharingStrategy::Mps)
    }
}

/// One replicated resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicatedResource {
    /// The resource whose devices are replicated, e.g. `nvidia.com/gpu`.
    pub name: ResourceName,
    /// The name the replicas are advertised under instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename: Option<ResourceName>,
    /// Which devices are replicated (all when unset).
    #[serde(default)]
    pub devices: ReplicatedDevices,
    /// Replicas per device: from 2 to [`MAX_REPLICAS`], and at most [`MAX_MPS_REPLICAS`] under MPS.
    #[serde(deserialize_with = "devices::replicas")]
    pub replicas: u32,
}

/// IMEX channels (multi-node NVLink). Accepted and ignored: no IMEX channel is injected into containers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Imex {
    /// Channel ids injected into containers: none or `[0]`.
    #[serde(rename = "channelIDs", default, skip_serializing_if = "Vec::is_empty")]
    pub channel_ids: Vec<u32>,
    /// Whether a missing channel is an error.
    #[serde(default)]
    pub required: bool,
}

/// The most keys this version does not know that one file may have and still be read (NVIDIA's own files have
/// none; a newer plugin version adds a few).
const MAX_UNKNOWN_KEYS: usize = 64;

/// A config as parsed, with the keys it ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// The config.
    pub config: DevicePluginConfig,
    /// The path of each key this version does not know (`flags.plugin.newFlag`), in the order found.
    pub unknown_keys: Vec<String>,
}

impl Parsed {
    /// One warning per ignored key.
    #[must_use]
    pub fn warnings(&self) -> Vec<String> {
        self.unknown_keys
            .iter()
            .map(|path| format!("{path}: unknown key, ignored"))
            .collect()
    }
}

/// Parses a device-plugin config from YAML or JSON text, and checks it. Keys it does not know are left out and
/// listed, as NVIDIA's plugin ignores them; everything else that is wrong is an error.
///
/// # Errors
/// A [`ConfigError`] naming the first bad field.
pub fn parse_tolerant(text: &str) -> Result<Parsed, ConfigError> {
    let mut document = document(text, VersionField::Optional)?;
    let mut unknown_keys = Vec::new();
    // Each round removes one unknown key, so the loop ends; the structs deny unknown fields precisely so that
    // each one is found with its path. Each round reads the whole document again, so the rounds are bounded: a
    // file of thousands of unknown keys would otherwise cost time in the square of its size.
    let config: DevicePluginConfig = loop {
        match serde_path_to_error::deserialize(document.clone()) {
            Ok(config) => break config,
            Err(error)
                if error.inner().to_string().starts_with("unknown field")
                    && unknown_keys.len() == MAX_UNKNOWN_KEYS =>
            {
                return Err(ConfigError::invalid(
                    error.path().to_string(),
                    format!(
                        "unknown key, and more than {MAX_UNKNOWN_KEYS} keys this version does not know: is this a \
                         device-plugin config (version v1)?"
                    ),
                ));
            }
            Err(error)
                if error.inner().to_string().starts_with("unknown field")
                    && remove(&mut document, error.path()) =>
            {
                unknown_keys.push(error.path().to_string());
            }
            Err(error) => return Err(path_error(&error)),
        }
    };
    validate::validate(&config)?;
    Ok(Parsed {
        config,
        unknown_keys,
    })
}

/// Parses a device-plugin config as [`parse_tolerant`] does, without the list of ignored keys.
///
/// # Errors
/// A [`ConfigError`] naming the first bad field.
pub fn parse(text: &str) -> Result<DevicePluginConfig, ConfigError> {
    parse_tolerant(text).map(|parsed| parsed.config)
}

/// Removes the key at `path` from `document`; false when the path does not lead to a key.
fn remove(document: &mut Value, path: &Path) -> bool {
    let segments: Vec<&Segment> = path.iter().collect();
    let Some((Segment::Map { key }, parents)) = segments.split_last() else {
        return false;
    };
    let mut node = document;
    for segment in parents {
        let next = match (segment, node) {
            (Segment::Map { key }, Value::Object(fields)) => fields.get_mut(key),
            (Segment::Seq { index }, Value::Array(items)) => items.get_mut(*index),
            _ => None,
        };
        let Some(next) = next else { return false };
        node = next;
    }
    match node {
        Value::Object(fields) => fields.remove(key).is_some(),
        _ => false,
    }
}

//! `GPUNode` (`nvidia.com/v1alpha1`): one per GPU node, named after the Node, written by that node's agent
//! only. It is where a node's truth lives: its GPUs, MIG geometry, what the device plugin advertises, health
//! and the last error. The operator reads these to build the ClusterPolicy status.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// GPUNode has no desired state of its own: a node's desired MIG geometry and device-plugin config come from
/// its labels and the ClusterPolicy. The spec is empty and the status holds everything.
// Each printcolumn repeats `type_`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "nvidia.com",
    version = "v1alpha1",
    kind = "GPUNode",
    plural = "gpunodes",
    shortname = "gpun",
    status = "GpuNodeStatus",
    doc = "GPUNode reports the GPUs of one node, named after the Node: inventory, MIG geometry and its state, advertised resources, health and the last error.",
    printcolumn(
        name = "Product",
        type_ = "string",
        json_path = ".status.product",
        description = "GPU product (mixed when a node has several)"
    ),
    printcolumn(
        name = "GPUs",
        type_ = "integer",
        json_path = ".status.gpuCount",
        description = "Number of GPUs"
    ),
    printcolumn(
        name = "MIG Config",
        type_ = "string",
        json_path = ".status.mig.config",
        description = "Desired MIG geometry name"
    ),
    printcolumn(
        name = "MIG State",
        type_ = "string",
        json_path = ".status.mig.state",
        description = "pending, rebooting, success or failed"
    ),
    printcolumn(
        name = "Health",
        type_ = "string",
        json_path = ".status.health",
        description = "Healthy, Degraded or Unhealthy"
    ),
    printcolumn(
        name = "Driver Upgrade",
        type_ = "string",
        json_path = ".status.driverUpgrade.state",
        description = "The node's driver upgrade state, as in the nvidia.com/gpu-driver-upgrade-state label"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct GpuNodeSpec {}

/// Observed state of a node's GPUs.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    /// GPU product of the node, or `mixed` when its GPUs differ (the PRODUCT column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// Number of GPUs on the node (the GPUS column).
    #[serde(default)]
    pub gpu_count: i32,
    /// Every GPU of the node, by index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuInfo>,
    /// MIG geometry: the desired config, the state of applying it, and the geometry per GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigStatus>,
    /// What the device plugin advertises to the kubelet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_plugin: Option<DevicePluginStatus>,
    /// What the DRA driver publishes, and what the claims prepared on this node hold of each device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra: Option<DraStatus>,
    /// Healthy when the device plugin offers every GPU, Degraded when a critical XID made some Unhealthy (they
    /// recover after a quiet period), Unhealthy when none are usable. Empty while no device plugin runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    /// The node's driver upgrade: its state and why (written by the operator's upgrade controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_upgrade: Option<crate::driver_upgrade::NodeUpgradeStatus>,
    /// Pods whose processes use the node's GPUs (the driver's process list traced through cgroups to pods),
    /// whatever they requested: the GPU users a driver upgrade must wait for or evict besides those holding devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_process_pods: Vec<crate::driver_upgrade::GpuProcessPod>,
    /// The most recent error any agent on the node hit, kept until a later success of the same component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<NodeError>,
    /// When the node agent last wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Time>,
}

/// The field managers that write GPUNode status by server-side apply, one per node role: each role's fields stay
/// its own, and a field one role stops sending is removed without touching the others'.
pub mod field_manager {
    /// The MIG manager (`gpu-node-agent mig`).
    pub const MIG_MANAGER: &str = "gpu-node-agent-mig";
    /// GPU feature discovery (`gpu-node-agent discovery`).
    pub const DISCOVERY: &str = "gpu-node-agent-discovery";
    /// The device plugin (`gpu-device-plugin run`); also the reporter of its Events.
    pub const DEVICE_PLUGIN: &str = "gpu-device-plugin";
    /// The DRA driver (`gpu-dra-driver run`); also the manager of its ResourceSlices and reporter of its Events.
    pub const DRA_DRIVER: &str = "gpu-dra-driver";
    /// The exporter (`gpu-node-agent exporter`): the pods whose processes use the GPUs.
    pub const EXPORTER: &str = "gpu-node-agent-exporter";
}

/// The state of applying the node's MIG config: pending, rebooting, success or failed, as in the
/// nvidia.com/mig.config.state label.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum MigState {
    /// A change is being applied.
    Pending,
    /// The node reboots so that a MIG mode change takes effect.
    Rebooting,
    /// The GPUs have the configured geometry.
    Success,
    /// The configured geometry could not be applied; the reason is in GPUNode status.
    Failed,
}

impl MigState {
    /// The label value.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Rebooting => "rebooting",
            Self::Success => "success",
            Self::Failed => "failed",
        }
    }
}

impl std::fmt::Display for MigState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Healthy when the device plugin offers every GPU, Degraded when a critical XID made some Unhealthy (they recover
/// after a quiet period), Unhealthy when none are usable.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum Health {
    /// Every GPU is offered.
    Healthy,
    /// Some GPUs are Unhealthy after a critical XID; they recover after a quiet period.
    Degraded,
    /// No GPU is usable.
    Unhealthy,
}

impl Health {
    /// The health of a node with `gpus` GPUs of which `unhealthy` are Unhealthy.
    #[must_use]
    pub fn of(gpus: usize, unhealthy: usize) -> Self {
        match unhealthy {
            0 => Self::Healthy,
            some if some < gpus => Self::Degraded,
            _ => Self::Unhealthy,
        }
    }

    /// The value as status shows it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "Healthy",
            Self::Degraded => "Degraded",
            Self::Unhealthy => "Unhealthy",
        }
    }
}

/// One GPU as the driver reports it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// NVML index of the GPU on its node.
    pub index: u32,
    /// GPU UUID, e.g. GPU-5ba4cd2e-....
    pub uuid: String,
    /// Product name, e.g. NVIDIA A100-SXM4-40GB.
    pub product: String,
    /// PCI bus id, e.g. 00000000:07:00.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// Total memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// CUDA compute capability, e.g. 8.0.
    pub compute_capability: String,
    /// Whether the GPU supports MIG.
    pub mig_capable: bool,
    /// MIG mode now and after the next GPU reset; absent on GPUs without MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<MigMode>,
}

/// MIG mode of one GPU: a change stays pending until the GPU is reset or the node rebooted.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub struct MigMode {
    /// Mode in effect: enabled or disabled.
    pub current: String,
    /// Mode after the next reset: enabled or disabled.
    pub pending: String,
}

/// MIG state of a node.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MigStatus {
    /// Desired geometry name, from the nvidia.com/mig.config label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// pending, rebooting, success or failed, as in the nvidia.com/mig.config.state label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<MigState>,
    /// MIG devices per GPU now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub current: Vec<GpuMigGeometry>,
    /// MIG devices per GPU the config asks for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub desired: Vec<GpuMigGeometry>,
    /// When state last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// The MIG devices of one GPU, as profile name to count.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GpuMigGeometry {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// Whether MIG is enabled on the GPU in this geometry.
    pub mig_enabled: bool,
    /// Profile name to number of devices, e.g. {"1g.10gb": 7}.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub devices: BTreeMap<String, u32>,
}

/// What the device plugin advertises.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DevicePluginStatus {
    /// The device-plugin config key in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// Each advertised resource with its healthy device count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<AdvertisedResource>,
    /// Indexes of the GPUs whose devices are reported Unhealthy to the kubelet after a critical XID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_gpus: Vec<u32>,
    /// What the config in use has that is ignored, e.g. `flags.plugin.someFlag: unknown key, ignored` (NVIDIA's
    /// plugin ignores unknown keys too; this says which).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_warnings: Vec<String>,
}

/// The DRA driver's part of the status.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DraStatus {
    /// Each device of the driver's ResourceSlice, with what prepared claims hold of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DraDevice>,
    /// How shared claims' limits are enforced here: by a per-claim MPS control daemon, or, on simulated GPUs,
    /// by none (the limits are still in the containers' environment, and the memory watchdog still applies).
    pub enforcement: String,
    /// Node labels that could not be read, and what was used instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One device the DRA driver publishes.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DraDevice {
    /// The device's name in the slice, e.g. gpu-0.
    pub name: String,
    /// The index of its GPU.
    pub gpu: u32,
    /// Its UUID.
    pub uuid: String,
    /// Whether claims share it (consumable memory and cores).
    pub shared: bool,
    /// Claims prepared on it.
    pub claims: u32,
    /// Its memory, in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Memory prepared claims hold, in MiB (a whole device's claim holds all of it).
    #[serde(rename = "memoryAllocatedMiB")]
    pub memory_allocated_mib: u64,
    /// Memory left for new claims, in MiB.
    #[serde(rename = "memoryFreeMiB")]
    pub memory_free_mib: u64,
    /// Percent of the SMs prepared claims hold (shared devices).
    pub cores_allocated: u64,
    /// Percent of the SMs left for new claims (shared devices).
    pub cores_free: u64,
    /// What holds new claims on a shared device to their memory: the driver (R615+, through the container
    /// toolkit's hook) or MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_enforcement: Option<crate::dra::MemoryEnforcement>,
    /// Why the device takes no new claims: its GPU's last critical XID, until the GPU has been quiet for the
    /// recovery period (the device is tainted in the slice meanwhile; pods that use it keep running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<String>,
}

/// One extended resource registered with the kubelet.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub struct AdvertisedResource {
    /// Resource name, e.g. nvidia.com/gpu.shared or nvidia.com/mig-1g.5gb.
    pub name: String,
    /// Healthy devices advertised (the node's allocatable for this resource).
    pub count: u32,
}

/// An error an agent on the node reported.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct NodeError {
    /// The part that failed: mig-manager, device-plugin, discovery, exporter or validator.
    pub component: String,
    /// What went wrong and what to do about it.
    pub message: String,
    /// When it happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_unhealthy_gpus() {
        assert_eq!(Health::of(4, 0), Health::Healthy);
        assert_eq!(Health::of(4, 1), Health::Degraded);
        assert_eq!(Health::of(4, 4), Health::Unhealthy);
        assert_eq!(Health::of(0, 1), Health::Unhealthy, "no GPUs read");
    }

    /// Status carries NVIDIA's label values and the PascalCase health that `kubectl get gpunodes` shows.
    #[test]
    fn enums_serialize_as_status_shows_them() {
        let status = GpuNodeStatus {
            health: Some(Health::Degraded),
            mig: Some(MigStatus {
                state: Some(MigState::Rebooting),
                ..MigStatus::default()
            }),
            ..GpuNodeStatus::default()
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["health"], "Degraded");
        assert_eq!(json["mig"]["state"], "rebooting");
        assert_eq!(
            serde_json::from_value::<GpuNodeStatus>(json).unwrap(),
            status
        );
        for state in [
            MigState::Pending,
            MigState::Rebooting,
            MigState::Success,
            MigState::Failed,
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
    }
}

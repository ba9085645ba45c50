//! `ClusterPolicy` (`nvidia.com/v1`): the one cluster-scoped resource through which users steer the operator.
//! Drop-in compatible with NVIDIA's: every field of the sections the operator implements is typed, the other
//! sections are kept as written, and unknown fields are preserved and reported rather than pruned.

mod cluster;
mod common;
mod dra_driver;
mod operands;
mod status;
mod watchdog;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use cluster::{
    CdiSpec, DaemonsetsSpec, HostPathsSpec, MigSpec, OperatorSpec, RollingUpdateSpec,
    UnsupportedSection,
};
pub use common::{
    ConfigMapRef, ContainerProbeSpec, ContainerSpec, EnvVar, ImageSpec, PULL_POLICIES,
    ResourceRequirements, UnknownFields,
};
pub use dra_driver::DraDriverSpec;
pub use operands::{
    DEFAULT_MIG_CONFIG_MAP, DcgmExporterSpec, DcgmSpec, DevicePluginConfigRef, DevicePluginSpec,
    DrainSpec, DriverLicensingConfigSpec, DriverRepoConfigSpec, DriverSpec,
    DriverUpgradePolicySpec, ExporterServiceSpec, GpuDirectRdmaSpec, HpcJobMappingSpec,
    ImageAndEnvSpec, MigManagerSpec, MigPartedConfigRef, MpsSpec, PlainOperandSpec,
    PodDeletionSpec, ServiceMonitorSpec, ToolkitSpec, ValidationStepSpec, ValidatorSpec,
    VirtualTopologyConfigSpec, WaitForCompletionSpec,
};
pub use status::{ClusterPolicyStatus, ComponentStatus, PolicyState};
pub use watchdog::{
    DEFAULT_GRACE_PERIOD_SECONDS, DEFAULT_INTERVAL_SECONDS, DEFAULT_KILL_GRACE_PERIOD_SECONDS,
    WatchdogSpec,
};

/// The name of the ClusterPolicy the Helm chart creates.
pub const DEFAULT_NAME: &str = "cluster-policy";

/// Desired state of the GPU stack on every GPU node of the cluster.
// Each printcolumn repeats `type_`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[kube(
    group = "nvidia.com",
    version = "v1",
    kind = "ClusterPolicy",
    plural = "clusterpolicies",
    status = "ClusterPolicyStatus",
    doc = "ClusterPolicy configures the GPU operator for the whole cluster: which operands run on GPU nodes, their images and settings, MIG and sharing.",
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.state",
        description = "ready, notReady or ignored"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.ready",
        description = "Ready components over enabled components"
    ),
    printcolumn(
        name = "GPU Nodes",
        type_ = "integer",
        json_path = ".status.gpuNodes",
        description = "Nodes with NVIDIA GPUs"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPolicySpec {
    /// Settings of the operator itself: default container runtime, runtime class, init container image.
    #[serde(default, skip_serializing_if = "is_default")]
    pub operator: OperatorSpec,
    /// Settings applied to every operand DaemonSet: tolerations, priority class, update strategy, node selector.
    #[serde(default, skip_serializing_if = "is_default")]
    pub daemonsets: DaemonsetsSpec,
    /// The NVIDIA driver container (one DaemonSet per operating-system pool).
    #[serde(default, skip_serializing_if = "is_default")]
    pub driver: DriverSpec,
    /// The NVIDIA container toolkit, which makes the container runtime GPU-aware.
    #[serde(default, skip_serializing_if = "is_default")]
    pub toolkit: ToolkitSpec,
    /// The device plugin: whole GPUs, MIG devices, time-slicing and MPS replicas.
    #[serde(default, skip_serializing_if = "is_default")]
    pub device_plugin: DevicePluginSpec,
    /// The DCGM-style metrics exporter on port 9400.
    #[serde(default, skip_serializing_if = "is_default")]
    pub dcgm_exporter: DcgmExporterSpec,
    /// A standalone DCGM host engine (not needed by this operator's exporter).
    #[serde(default, skip_serializing_if = "is_default")]
    pub dcgm: DcgmSpec,
    /// The node status exporter (default off).
    #[serde(default, skip_serializing_if = "is_default")]
    pub node_status_exporter: PlainOperandSpec,
    /// GPU feature discovery: nvidia.com/gpu.* node labels.
    #[serde(default, skip_serializing_if = "is_default")]
    pub gfd: PlainOperandSpec,
    /// How MIG devices are advertised (the MIG strategy).
    #[serde(default, skip_serializing_if = "is_default")]
    pub mig: MigSpec,
    /// The MIG manager, which applies the geometry named by each node's nvidia.com/mig.config label.
    #[serde(default, skip_serializing_if = "is_default")]
    pub mig_manager: MigManagerSpec,
    /// The validator, which checks driver, toolkit, device plugin and CUDA on each node.
    #[serde(default, skip_serializing_if = "is_default")]
    pub validator: ValidatorSpec,
    /// How the Container Device Interface is used.
    #[serde(default, skip_serializing_if = "is_default")]
    pub cdi: CdiSpec,
    /// Paths on the host that operands mount.
    #[serde(default, skip_serializing_if = "is_default")]
    pub host_paths: HostPathsSpec,
    /// The GPU memory watchdog (ours, not NVIDIA's; off by default).
    #[serde(default, skip_serializing_if = "is_default")]
    pub watchdog: WatchdogSpec,
    /// The DRA driver gpu.nvidia.com, with fractional GPUs (ours, not NVIDIA's; off by default).
    #[serde(default, skip_serializing_if = "is_default")]
    pub dra_driver: DraDriverSpec,
    /// Pod Security Admission labels for the operator's namespace. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psa: Option<UnsupportedSection>,
    /// Deprecated PodSecurityPolicy settings. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psp: Option<UnsupportedSection>,
    /// GPUDirect Storage. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gds: Option<UnsupportedSection>,
    /// GDRCopy. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdrcopy: Option<UnsupportedSection>,
    /// Sandbox (virtual machine) workloads. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_workloads: Option<UnsupportedSection>,
    /// VFIO-PCI manager for GPU passthrough. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio_manager: Option<UnsupportedSection>,
    /// Device plugin for sandboxed workloads. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_device_plugin: Option<UnsupportedSection>,
    /// vGPU host manager. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu_manager: Option<UnsupportedSection>,
    /// vGPU device manager. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu_device_manager: Option<UnsupportedSection>,
    /// Kata containers manager. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kata_manager: Option<UnsupportedSection>,
    /// Confidential computing manager. Accepted, not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cc_manager: Option<UnsupportedSection>,
}

/// Whether a section equals its defaults, so that an omitted section stays omitted when written back and the
/// schema does not default whole sections into every resource.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl ClusterPolicySpec {
    /// The unimplemented sections the user enabled, by their field names, for the status to name. The parts of
    /// sandbox workloads (VFIO, vGPU, Kata, confidential computing) count only when `sandboxWorkloads.enabled`
    /// is true: NVIDIA's operator deploys them only then, and its chart enables several of them by default.
    pub fn enabled_unsupported_sections(&self) -> Vec<&'static str> {
        let enabled = |section: &Option<UnsupportedSection>| {
            section.as_ref().and_then(|s| s.enabled) == Some(true)
        };
        let sandbox = enabled(&self.sandbox_workloads);
        [
            ("psa", &self.psa, true),
            ("psp", &self.psp, true),
            ("gds", &self.gds, true),
            ("gdrcopy", &self.gdrcopy, true),
            ("sandboxWorkloads", &self.sandbox_workloads, true),
            ("vfioManager", &self.vfio_manager, sandbox),
            ("sandboxDevicePlugin", &self.sandbox_device_plugin, sandbox),
            ("vgpuManager", &self.vgpu_manager, sandbox),
            ("vgpuDeviceManager", &self.vgpu_device_manager, sandbox),
            ("kataManager", &self.kata_manager, sandbox),
            ("ccManager", &self.cc_manager, sandbox),
        ]
        .into_iter()
        .filter(|(_, section, deployable)| *deployable && enabled(section))
        .map(|(name, _, _)| name)
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_parts_count_only_with_sandbox_workloads() {
        // NVIDIA's chart enables vfioManager, sandboxDevicePlugin, vgpuDeviceManager and ccManager by default,
        // with sandboxWorkloads disabled: nothing is deployed, so nothing is unsupported.
        let mut spec: ClusterPolicySpec = serde_json::from_value(serde_json::json!({
            "sandboxWorkloads": {"enabled": false, "defaultWorkload": "container"},
            "vfioManager": {"enabled": true},
            "sandboxDevicePlugin": {"enabled": true},
            "vgpuDeviceManager": {"enabled": true},
            "ccManager": {"enabled": true},
            "gds": {"enabled": true},
        }))
        .unwrap();
        assert_eq!(spec.enabled_unsupported_sections(), ["gds"]);
        spec.sandbox_workloads.as_mut().unwrap().enabled = Some(true);
        assert_eq!(
            spec.enabled_unsupported_sections(),
            [
                "gds",
                "sandboxWorkloads",
                "vfioManager",
                "sandboxDevicePlugin",
                "vgpuDeviceManager",
                "ccManager"
            ]
        );
    }

    #[test]
    fn empty_mig_config_name_means_the_builtin_geometries() {
        let config: MigPartedConfigRef =
            serde_json::from_value(serde_json::json!({"name": "", "default": "all-disabled"}))
                .unwrap();
        assert_eq!(config.config_map_name(), DEFAULT_MIG_CONFIG_MAP);
        assert_eq!(
            MigPartedConfigRef::default().config_map_name(),
            DEFAULT_MIG_CONFIG_MAP
        );
        let named: MigPartedConfigRef =
            serde_json::from_value(serde_json::json!({"name": "custom"})).unwrap();
        assert_eq!(named.config_map_name(), "custom");
        assert_eq!(named.default, "all-disabled");
    }

    #[test]
    fn upgrade_policy_defaults_are_nvidias() {
        let policy: DriverUpgradePolicySpec =
            serde_json::from_value(serde_json::json!({"podDeletion": {}, "drain": {}})).unwrap();
        assert!(!policy.auto_upgrade);
        assert_eq!(policy.max_parallel_upgrades, 1);
        assert_eq!(
            policy.max_unavailable,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("25%".into())
        );
        assert_eq!(policy.pod_deletion.unwrap().timeout_seconds, 300);
        assert_eq!(policy.drain.unwrap().timeout_seconds, 300);
    }

    #[test]
    fn omitted_mig_strategy_stays_omitted() {
        let spec: ClusterPolicySpec = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(spec.mig.strategy, None);
        assert_eq!(serde_json::to_value(&spec).unwrap(), serde_json::json!({}));
    }
}

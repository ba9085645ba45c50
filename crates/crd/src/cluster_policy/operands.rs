//! The ClusterPolicy sections that each deploy one operand DaemonSet: driver, container toolkit, device
//! plugin, DCGM and its exporter, feature discovery, MIG manager, node status exporter and validator.
//! Field names and meanings follow NVIDIA's ClusterPolicy so that existing resources apply unchanged.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{
    ConfigMapRef, ContainerProbeSpec, ContainerSpec, EnvVar, ImageSpec, serde_defaults,
};

/// NVIDIA driver containers, one DaemonSet per operating-system pool.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DriverSpec {
    /// Deploy the driver container on GPU nodes (default true). Set false where the driver is pre-installed on
    /// the host, as on most managed clouds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Let NVIDIADriver objects (nvidia.com/v1alpha1) run the drivers instead of this section: one driver
    /// version per node pool (default false).
    #[serde(
        default,
        rename = "useNvidiaDriverCRD",
        skip_serializing_if = "Option::is_none"
    )]
    pub use_nvidia_driver_crd: Option<bool>,
    /// Use driver images with precompiled kernel modules: one DaemonSet per kernel version (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_precompiled: Option<bool>,
    /// Deprecated: use kernelModuleType: open instead. Kept so that older resources still apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_open_kernel_modules: Option<bool>,
    /// Which kernel modules the driver loads: auto (chosen from the GPUs and driver branch), open or proprietary.
    // Kept: NVIDIA's CRD declares the same enum, so its API server refuses any other value too.
    #[serde(default = "default_kernel_module_type")]
    #[x_kube(validation = Rule::new("self in ['auto', 'open', 'proprietary']").message("driver.kernelModuleType must be auto, open or proprietary"))]
    pub kernel_module_type: String,
    /// Startup probe of the driver container (driver builds can take minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_probe: Option<ContainerProbeSpec>,
    /// Liveness probe of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<ContainerProbeSpec>,
    /// Readiness probe of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<ContainerProbeSpec>,
    /// GPUDirect RDMA (nvidia-peermem) settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<GpuDirectRdmaSpec>,
    /// How driver upgrades roll across nodes: how many at once, and how GPU pods are drained first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<DriverUpgradePolicySpec>,
    /// Driver image. The OS pool is appended to the version as a tag suffix, e.g. `550.127.05-ubuntu22.04`.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Driver container resources, arguments and environment.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// The driver manager init container, which evicts GPU pods before a driver is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<ImageAndEnvSpec>,
    /// ConfigMap with package repository files for driver builds behind a proxy or mirror.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_config: Option<DriverRepoConfigSpec>,
    /// ConfigMap with extra CA certificates for the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config: Option<ConfigMapRef>,
    /// vGPU guest driver licensing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub licensing_config: Option<DriverLicensingConfigSpec>,
    /// vGPU virtual topology daemon configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_topology: Option<VirtualTopologyConfigSpec>,
    /// ConfigMap with kernel module parameters for the driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_module_config: Option<ConfigMapRef>,
    /// Name of a Secret whose keys become environment variables of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
}

fn default_kernel_module_type() -> String {
    "auto".into()
}

/// GPUDirect RDMA settings of the driver.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuDirectRdmaSpec {
    /// Load nvidia-peermem for GPUDirect RDMA (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Use the MOFED drivers installed on the host rather than a MOFED container.
    #[serde(
        default,
        rename = "useHostMofed",
        skip_serializing_if = "Option::is_none"
    )]
    pub use_host_mofed: Option<bool>,
}

/// How driver upgrades proceed across the cluster. The defaults are NVIDIA's (its CRD's): no automatic
/// upgrade, one node at a time, at most 25% of the nodes unavailable, 300 seconds for pod deletion and drain.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(UPGRADE_MAX_UNAVAILABLE_RULE).message("driver.upgradePolicy.maxUnavailable must be a whole number of nodes such as 1, or a percentage of nodes such as 25%"))]
pub struct DriverUpgradePolicySpec {
    /// Upgrade drivers automatically when the driver version changes (default false: pods are replaced only when
    /// deleted, the OnDelete strategy). NVIDIA's Helm chart sets true. When false the other fields are ignored.
    #[serde(default)]
    pub auto_upgrade: bool,
    /// How many nodes may upgrade at once; 0 means no limit (default 1).
    #[serde(default = "default_max_parallel_upgrades")]
    #[schemars(range(min = 0))]
    pub max_parallel_upgrades: i32,
    /// How many nodes may be unavailable during the upgrade: a number (e.g. 1) or a percentage (e.g. 25%, the
    /// default).
    #[serde(default = "default_upgrade_max_unavailable")]
    pub max_unavailable: IntOrString,
    /// Wait for pods matching a selector to complete before upgrading a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_completion: Option<WaitForCompletionSpec>,
    /// How pods using GPUs are deleted before a node's driver is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_deletion: Option<PodDeletionSpec>,
    /// Whether and how the node is drained before its driver is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSpec>,
}

fn default_max_parallel_upgrades() -> i32 {
    1
}

fn default_upgrade_max_unavailable() -> IntOrString {
    IntOrString::String("25%".into())
}

fn default_timeout_seconds() -> i32 {
    300
}

/// CEL rule on `driver.upgradePolicy`: with automatic upgrades on, `maxUnavailable` is a number or a percentage.
/// Kept because NVIDIA's operator fails on the same input: its upgrade controller
/// (controllers/upgrade_controller.go) reads the value with `intstr.GetScaledValueFromIntOrPercent` only when
/// autoUpgrade is true, and that returns an error for a string that is not a percentage, so no driver is ever
/// upgraded. (A string of digits, which NVIDIA refuses there, is accepted here as that number; a negative number,
/// which NVIDIA's CRD lets through but which no DaemonSet accepts, is refused.)
const UPGRADE_MAX_UNAVAILABLE_RULE: &str = "!has(self.autoUpgrade) || !self.autoUpgrade || !has(self.maxUnavailable) \
     || (type(self.maxUnavailable) == int ? self.maxUnavailable >= 0 : string(self.maxUnavailable).matches('^[0-9]+%?$'))";

/// Waiting for jobs to finish before a driver upgrade.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WaitForCompletionSpec {
    /// Label selector of the pods to wait for, e.g. `app=training`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<String>,
    /// Seconds to wait before going on anyway; 0 (the default) waits forever.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub timeout_seconds: i32,
}

/// Deleting GPU pods before a driver upgrade.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodDeletionSpec {
    /// Delete pods that no controller manages (they are not recreated; default false).
    #[serde(default)]
    pub force: bool,
    /// Seconds to wait for the deletion (default 300); 0 waits forever.
    #[serde(default = "default_timeout_seconds")]
    #[schemars(range(min = 0))]
    pub timeout_seconds: i32,
    /// Delete pods that use emptyDir volumes, whose data is lost (default false).
    #[serde(default)]
    pub delete_empty_dir: bool,
}

/// Draining a node before a driver upgrade.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Drain the node before upgrading its driver (default false).
    #[serde(default)]
    pub enable: bool,
    /// Drain even pods that no controller manages (default false).
    #[serde(default)]
    pub force: bool,
    /// Label selector limiting which pods are drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<String>,
    /// Seconds to wait for the drain (default 300); 0 waits forever.
    #[serde(default = "default_timeout_seconds")]
    #[schemars(range(min = 0))]
    pub timeout_seconds: i32,
    /// Drain pods that use emptyDir volumes, whose data is lost (default false).
    #[serde(default)]
    pub delete_empty_dir: bool,
}

/// An auxiliary container's image and environment (the driver manager).
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageAndEnvSpec {
    /// The container's image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Extra environment variables for the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

/// Package repository configuration for driver builds.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DriverRepoConfigSpec {
    /// Name of the ConfigMap holding the repository files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<String>,
}

/// vGPU licensing of the driver.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DriverLicensingConfigSpec {
    /// Deprecated: use secretName. ConfigMap holding the licensing configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<String>,
    /// Secret holding the licensing token and configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// License through the NVIDIA Licensing System.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nls_enabled: Option<bool>,
}

/// vGPU virtual topology daemon settings.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
pub struct VirtualTopologyConfigSpec {
    /// Name of the ConfigMap holding nvidia-topologyd.conf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
}

/// The NVIDIA container toolkit, which configures the node's container runtime for GPUs.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolkitSpec {
    /// Deploy the container toolkit on GPU nodes (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Container toolkit image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Toolkit container resources, arguments and environment.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// Directory on the host where the toolkit installs its runtime binaries.
    #[serde(default = "default_toolkit_install_dir")]
    pub install_dir: String,
}

fn default_toolkit_install_dir() -> String {
    "/usr/local/nvidia".into()
}

/// The first toolkit release whose CDI hook applies GPU memory limits (`apply-cuda-memory-limits`).
const MEMORY_LIMIT_HOOK_SINCE: (u32, u32, u32) = (1, 20, 1);

impl ToolkitSpec {
    /// The toolkit's CDI hook program on the host (`<installDir>/toolkit/nvidia-cdi-hook`), when the toolkit image
    /// `image` (a full reference) is a release whose hook applies GPU memory limits; `None` for older releases and
    /// for tags that name no release (a digest, `latest`).
    #[must_use]
    pub fn memory_limit_hook(&self, image: &str) -> Option<String> {
        let tag = image.split('@').next()?.rsplit_once(':')?.1;
        let release = tag.trim_start_matches('v').split('-').next()?;
        let mut numbers = release.split('.').map(|number| number.parse::<u32>().ok());
        let version = (numbers.next()??, numbers.next()??, numbers.next()??);
        (version >= MEMORY_LIMIT_HOOK_SINCE).then(|| {
            format!(
                "{}/toolkit/nvidia-cdi-hook",
                self.install_dir.trim_end_matches('/')
            )
        })
    }
}

/// The device plugin, which advertises GPUs, MIG devices and shared replicas to the kubelet.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DevicePluginSpec {
    /// Deploy the device plugin on GPU nodes (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Device plugin image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Device plugin container resources, arguments and environment.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// Named device-plugin configurations (time-slicing, MPS, MIG strategy) kept in a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<DevicePluginConfigRef>,
    /// MPS settings of the device plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsSpec>,
}

/// Where the device plugin finds its named configurations.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
pub struct DevicePluginConfigRef {
    /// Name of the ConfigMap (in the operator's namespace) whose keys are device-plugin configurations, one
    /// version v1 file per key. Empty: the plugin runs with its built-in defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Key of the ConfigMap used on nodes without the nvidia.com/device-plugin.config label. Ignored without a
    /// name, as in NVIDIA's operator (the status warns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// MPS settings.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
pub struct MpsSpec {
    /// Directory on the host where the MPS control daemons keep their pipes and logs.
    #[serde(default = "default_mps_root")]
    pub root: String,
}

fn default_mps_root() -> String {
    crate::paths::MPS_ROOT.into()
}

/// The DCGM-style exporter, which serves GPU metrics on port 9400 for Prometheus.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DcgmExporterSpec {
    /// Deploy the metrics exporter on GPU nodes (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Exporter image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Exporter container resources, arguments and environment.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// Annotations added to the exporter pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// Labels added to the exporter pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
    /// ConfigMap holding dcgm-metrics.csv, the metrics to collect (`field, type, help` per line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigMapRef>,
    /// A Prometheus-operator ServiceMonitor for the exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<ServiceMonitorSpec>,
    /// The Service in front of the exporter pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ExporterServiceSpec>,
    /// Run the exporter in the host's PID namespace, needed to attribute GPU processes to pods.
    #[serde(default, rename = "hostPID", skip_serializing_if = "Option::is_none")]
    pub host_pid: Option<bool>,
    /// Serve metrics on the host's network namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
    /// HPC job mapping: label metrics with job ids from files written by the workload manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hpc_job_mapping: Option<HpcJobMappingSpec>,
}

/// ServiceMonitor settings of the exporter.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    /// Create a ServiceMonitor (needs the Prometheus operator's CRDs; default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Scrape interval such as 15s; Prometheus' global interval when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// Keep the metric's labels when they collide with target labels. Default true (NVIDIA's: false): the series
    /// carry the `pod` and `namespace` of the workload using the GPU, which would otherwise become exported_pod
    /// and exported_namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honor_labels: Option<bool>,
    /// Labels added to the ServiceMonitor, e.g. the release label your Prometheus selects.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_labels: BTreeMap<String, String>,
    /// Prometheus relabel configs applied to the scraped series.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("items" = {"type": "object", "x-kubernetes-preserve-unknown-fields": true}))]
    pub relabelings: Vec<Value>,
}

/// The exporter's Service.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExporterServiceSpec {
    /// Service type: ClusterIP (default), NodePort or LoadBalancer.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Internal traffic policy of the Service: Cluster or Local.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
}

/// HPC job mapping of the exporter.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
pub struct HpcJobMappingSpec {
    /// Label metrics with HPC job ids (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Directory where the workload manager writes job mapping files (default /var/lib/dcgm-exporter/job-mapping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<String>,
}

/// A standalone DCGM host engine. This operator's exporter reads the GPUs directly and needs no host engine;
/// the section is accepted so existing resources apply, and the component is reported when enabled.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DcgmSpec {
    /// Deploy a standalone DCGM host engine (default true in NVIDIA's operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// DCGM image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// DCGM container resources, arguments and environment.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// Deprecated: host port of the DCGM host engine (5555).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_port: Option<i32>,
}

/// An operand that takes no settings beyond whether it runs and its container: node status exporter and
/// GPU feature discovery.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlainOperandSpec {
    /// Deploy this operand on GPU nodes (GPU feature discovery: default true; node status exporter: default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Operand image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Operand container resources, arguments and environment.
    #[serde(flatten)]
    pub container: ContainerSpec,
}

/// The MIG manager, which applies the MIG geometry named by each node's nvidia.com/mig.config label.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MigManagerSpec {
    /// Deploy the MIG manager on MIG-capable GPU nodes (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// MIG manager image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// MIG manager container resources, arguments and environment. Set WITH_REBOOT=true where GPUs cannot
    /// be reset (most VMs): the node reboots to apply a MIG mode change.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// The mig-parted configuration file and the default geometry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<MigPartedConfigRef>,
    /// ConfigMap listing the GPU clients (systemd services) to stop during a MIG change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_clients_config: Option<ConfigMapRef>,
}

/// Where the MIG manager finds its geometries.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
pub struct MigPartedConfigRef {
    /// Name of the ConfigMap holding config.yaml in mig-parted v1 format. Empty or unset: this operator's
    /// built-in geometries, the ConfigMap default-mig-parted-config the chart installs (NVIDIA's operator
    /// generates its default from the hardware; ours covers every MIG-capable GPU of NVIDIA's default config).
    /// Null is taken as unset, as NVIDIA's schema takes it (its chart writes `name: null` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Geometry for MIG-capable nodes without an nvidia.com/mig.config label: all-disabled, or empty to leave
    /// such nodes unlabelled.
    // Kept: NVIDIA's CRD declares the same enum, so its API server refuses any other value too.
    #[serde(default = "default_mig_config")]
    #[x_kube(validation = Rule::new("self in ['all-disabled', '']").message("migManager.config.default must be all-disabled or empty; pick other geometries per node with the nvidia.com/mig.config label"))]
    pub default: String,
}

/// The ConfigMap of built-in MIG geometries, used when `migManager.config.name` is empty.
pub const DEFAULT_MIG_CONFIG_MAP: &str = "default-mig-parted-config";

impl MigPartedConfigRef {
    /// The ConfigMap the MIG manager reads: the named one, else [`DEFAULT_MIG_CONFIG_MAP`].
    pub fn config_map_name(&self) -> &str {
        self.name
            .as_deref()
            .filter(|name| !name.is_empty())
            .unwrap_or(DEFAULT_MIG_CONFIG_MAP)
    }
}

fn default_mig_config() -> String {
    "all-disabled".into()
}

/// The validator, which checks each node's driver, toolkit, device plugin and CUDA in init containers.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValidatorSpec {
    /// Validator image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Validator container resources, arguments and environment.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// Environment of the device-plugin validation step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<ValidationStepSpec>,
    /// Environment of the container-toolkit validation step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolkit: Option<ValidationStepSpec>,
    /// Environment of the driver validation step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<ValidationStepSpec>,
    /// Environment of the CUDA workload validation step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<ValidationStepSpec>,
    /// Environment of the VFIO-PCI validation step (sandbox workloads; not implemented by this operator).
    #[serde(default, rename = "vfioPCI", skip_serializing_if = "Option::is_none")]
    pub vfio_pci: Option<ValidationStepSpec>,
    /// Environment of the vGPU manager validation step (not implemented by this operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu_manager: Option<ValidationStepSpec>,
    /// Environment of the vGPU devices validation step (not implemented by this operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu_devices: Option<ValidationStepSpec>,
}

/// Settings of one validation step.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
pub struct ValidationStepSpec {
    /// Environment variables for this step, e.g. WITH_WORKLOAD=false.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

impl Default for DriverSpec {
    fn default() -> Self {
        serde_defaults()
    }
}

impl Default for ToolkitSpec {
    fn default() -> Self {
        serde_defaults()
    }
}

impl Default for DriverUpgradePolicySpec {
    fn default() -> Self {
        serde_defaults()
    }
}

impl Default for PodDeletionSpec {
    fn default() -> Self {
        serde_defaults()
    }
}

impl Default for DrainSpec {
    fn default() -> Self {
        serde_defaults()
    }
}

impl Default for MpsSpec {
    fn default() -> Self {
        serde_defaults()
    }
}

impl Default for MigPartedConfigRef {
    fn default() -> Self {
        serde_defaults()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toolkits_memory_limit_hook_comes_with_release_1_20_1() {
        let toolkit: ToolkitSpec = serde_json::from_value(serde_json::json!({})).unwrap();
        let hook = |image: &str| toolkit.memory_limit_hook(image);
        // NVIDIA's v26.7.0 chart pins v1.20.0, whose hook has no memory limits.
        assert_eq!(hook("nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"), None);
        assert_eq!(
            hook("nvcr.io/nvidia/k8s/container-toolkit:v1.20.1-ubuntu20.04").as_deref(),
            Some("/usr/local/nvidia/toolkit/nvidia-cdi-hook")
        );
        assert!(hook("registry.local:5000/container-toolkit:1.21.0").is_some());
        assert_eq!(hook("nvcr.io/nvidia/k8s/container-toolkit:latest"), None);
        assert_eq!(hook("container-toolkit@sha256:abc"), None);
        let elsewhere: ToolkitSpec =
            serde_json::from_value(serde_json::json!({"installDir": "/opt/nvidia/"})).unwrap();
        assert_eq!(
            elsewhere.memory_limit_hook("x:v1.20.1").as_deref(),
            Some("/opt/nvidia/toolkit/nvidia-cdi-hook")
        );
    }
}

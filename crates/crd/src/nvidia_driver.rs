//! `NVIDIADriver` (`nvidia.com/v1alpha1`), NVIDIA's per-pool driver resource, drop-in. With the ClusterPolicy's
//! `driver.useNvidiaDriverCRD: true` the ClusterPolicy's own driver section is not rendered; each NVIDIADriver
//! object drives the GPU nodes its `nodeSelector` picks instead, one DaemonSet per object and OS pool (and kernel,
//! for precompiled drivers), so that node pools can run different driver versions.
//!
//! The field names, defaults, enums and immutability rules are NVIDIA's (`api/nvidia/v1alpha1/nvidiadriver_types.go`
//! in NVIDIA/gpu-operator), so that NVIDIA's sample objects apply unchanged. A `default` object drives the GPU
//! nodes that no other object picks; each object's `upgradePolicy` (or NVIDIA's default for the type) governs the
//! upgrades of its own nodes, not the ClusterPolicy's `driver.upgradePolicy`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeAffinity, PodSecurityContext, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cluster_policy::{
    ConfigMapRef, ContainerProbeSpec, ContainerSpec, DriverUpgradePolicySpec, GpuDirectRdmaSpec,
    ImageAndEnvSpec, ImageSpec, UnsupportedSection,
};
use crate::labels::GPU_PRESENT;

/// The driver of the GPU nodes that `nodeSelector` picks.
// Each printcolumn repeats `type_`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[kube(
    group = "nvidia.com",
    version = "v1alpha1",
    kind = "NVIDIADriver",
    plural = "nvidiadrivers",
    shortname = "nvd",
    shortname = "nvdriver",
    shortname = "nvdrivers",
    status = "NvidiaDriverStatus",
    doc = "NVIDIADriver runs one NVIDIA driver version on the GPU nodes its nodeSelector picks, with driver.useNvidiaDriverCRD true in the ClusterPolicy.",
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.state",
        description = "ready, notReady, disabled, or ignored"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.default) && self.default ? !has(self.nodeSelector) || size(self.nodeSelector) == 0 : true").message("a default NVIDIADriver drives the GPU nodes no other NVIDIADriver picks, so it has no nodeSelector: remove spec.nodeSelector, or set spec.default to false"))]
pub struct NvidiaDriverSpec {
    /// Drive every GPU node that no other NVIDIADriver's nodeSelector picks (no nodeSelector of its own). One
    /// default object is accepted; a second is refused.
    #[serde(default)]
    pub default: bool,
    /// The kind of driver: gpu (default), vgpu (a vGPU guest) or vgpu-host-manager. Immutable: create another
    /// NVIDIADriver to change it.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("driverType is immutable: create another NVIDIADriver to change it"))]
    pub driver_type: DriverType,
    /// Use a driver image with modules precompiled for the node's kernel (one DaemonSet per kernel). Immutable:
    /// create another NVIDIADriver to change it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("usePrecompiled is immutable: create another NVIDIADriver to change it"))]
    pub use_precompiled: Option<bool>,
    /// Deprecated by NVIDIA in favour of kernelModuleType, and not read by either operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_open_kernel_modules: Option<bool>,
    /// Which kernel modules the driver container loads: auto (default: the recommended type for the GPUs and
    /// driver branch), open or proprietary.
    #[serde(default)]
    pub kernel_module_type: KernelModuleType,
    /// Startup probe of the driver container (default: NVIDIA's, 20 minutes for a driver build).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_probe: Option<ContainerProbeSpec>,
    /// Liveness probe of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<ContainerProbeSpec>,
    /// Readiness probe of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<ContainerProbeSpec>,
    /// GPUDirect RDMA (nvidia-peermem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<GpuDirectRdmaSpec>,
    /// GPUDirect Storage. Accepted, not implemented (as in the ClusterPolicy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gds: Option<UnsupportedSection>,
    /// GDRCopy. Accepted, not implemented (as in the ClusterPolicy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdrcopy: Option<UnsupportedSection>,
    /// The driver image: `repository/image:version-<os>` (`version-<kernel>-<os>` when precompiled), or the
    /// image as given when version is a `sha256:` digest. NVIDIA's default image is `nvcr.io/nvidia/driver`.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Resources, arguments and environment of the driver container.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// The driver manager init container, which stops the driver's users and unloads the old driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<ImageAndEnvSpec>,
    /// A ConfigMap of package repository files for driver builds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_config: Option<ConfigMapRef>,
    /// A ConfigMap of certificates for the driver build's package repositories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config: Option<ConfigMapRef>,
    /// vGPU licensing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub licensing_config: Option<LicensingConfigSpec>,
    /// A ConfigMap with nvidia-topologyd.conf for vGPU drivers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_topology_config: Option<ConfigMapRef>,
    /// A ConfigMap of kernel module parameters (e.g. nvidia.conf).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_module_config: Option<ConfigMapRef>,
    /// A Secret whose keys become environment variables of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
    /// How this driver's upgrades roll across its nodes, as the ClusterPolicy's `driver.upgradePolicy`. Unset,
    /// NVIDIA's default for NVIDIADriver objects: automatic, one node at a time, at most 25% unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<DriverUpgradePolicySpec>,
    /// The GPU nodes this driver runs on. Empty means every GPU node (`nvidia.com/gpu.present: "true"`). No two
    /// NVIDIADriver objects may pick the same node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Node affinity of the driver pods, narrowing the nodes that nodeSelector picks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<NodeAffinity>,
    /// Labels added to the driver DaemonSet and its pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to the driver DaemonSet and its pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Tolerations of the driver pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// PriorityClass of the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Security context of the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
}

impl NvidiaDriverSpec {
    /// The upgrade policy, with NVIDIA's default for an NVIDIADriver where it is unset (which, unlike the
    /// ClusterPolicy's, upgrades automatically).
    pub fn upgrade_policy_or_default(&self) -> DriverUpgradePolicySpec {
        self.upgrade_policy.clone().unwrap_or_else(|| {
            serde_json::from_value(serde_json::json!({"autoUpgrade": true}))
                .expect("the other fields have serde defaults")
        })
    }

    /// The labels a node needs to be driven by this object: the nodeSelector, or every GPU node when it is
    /// empty (NVIDIA's default).
    pub fn node_selector(&self) -> BTreeMap<String, String> {
        if self.node_selector.is_empty() {
            BTreeMap::from([(GPU_PRESENT.to_owned(), "true".to_owned())])
        } else {
            self.node_selector.clone()
        }
    }
}

/// The kind of NVIDIA driver.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum DriverType {
    /// The data-center GPU driver.
    #[default]
    #[serde(rename = "gpu")]
    Gpu,
    /// The vGPU guest driver.
    #[serde(rename = "vgpu")]
    Vgpu,
    /// The vGPU host manager.
    #[serde(rename = "vgpu-host-manager")]
    VgpuHostManager,
}

/// Which kernel modules the driver container loads.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KernelModuleType {
    /// The recommended type for the node's GPUs and the driver branch.
    #[default]
    Auto,
    /// The open GPU kernel modules.
    Open,
    /// The proprietary kernel modules.
    Proprietary,
}

impl KernelModuleType {
    /// The value of the driver container's `KERNEL_MODULE_TYPE`.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelModuleType::Auto => "auto",
            KernelModuleType::Open => "open",
            KernelModuleType::Proprietary => "proprietary",
        }
    }
}

/// vGPU licensing of an NVIDIADriver (NVIDIA names the ConfigMap `name` here, `configMapName` in the
/// ClusterPolicy).
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LicensingConfigSpec {
    /// Secret holding the licensing token and configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Deprecated: use secretName. ConfigMap holding the licensing configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// License through the NVIDIA Licensing System.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nls_enabled: Option<bool>,
}

/// What became of an NVIDIADriver.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NvidiaDriverStatus {
    /// ready once the driver pods of every node it picks are ready; notReady while they are not, or while the
    /// object is refused (the conditions say why); disabled when the ClusterPolicy does not hand drivers to
    /// NVIDIADriver objects.
    pub state: NvidiaDriverState,
    /// The namespace of the operator and of the driver DaemonSets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `Ready` (with reason and message when false) and `Error` conditions, as NVIDIA writes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The state of an NVIDIADriver, NVIDIA's enum.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum NvidiaDriverState {
    /// Not handled at all.
    #[serde(rename = "ignored")]
    Ignored,
    /// Every driver pod of the object is ready.
    #[serde(rename = "ready")]
    Ready,
    /// Not (yet) ready, or refused.
    #[default]
    #[serde(rename = "notReady")]
    NotReady,
    /// The ClusterPolicy does not use NVIDIADriver objects.
    #[serde(rename = "disabled")]
    Disabled,
}

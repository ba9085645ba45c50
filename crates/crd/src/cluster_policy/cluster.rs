//! The ClusterPolicy sections that shape every operand at once (operator, daemonsets, MIG strategy, CDI,
//! host paths) and the sections this operator accepts but does not implement.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, PodSecurityContext, Toleration};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::common::{ImageSpec, UnknownFields, serde_defaults};

/// Settings of the operator itself.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OperatorSpec {
    /// Container runtime assumed where a node does not report one: containerd, crio or docker. NVIDIA's operator
    /// no longer reads it and accepts any value; another value here means containerd, and the status says so.
    #[serde(default = "default_runtime")]
    pub default_runtime: String,
    /// Name of the RuntimeClass created for GPU pods.
    #[serde(default = "default_runtime_class")]
    pub runtime_class: String,
    /// Image of the init container operands use to wait for the driver and toolkit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_container: Option<ImageSpec>,
    /// Labels added to the objects the operator creates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to the objects the operator creates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// OpenShift only: build drivers with the Driver Toolkit image (accepted for compatibility).
    #[serde(
        default,
        rename = "use_ocp_driver_toolkit",
        skip_serializing_if = "Option::is_none"
    )]
    pub use_ocp_driver_toolkit: Option<bool>,
}

fn default_runtime() -> String {
    "containerd".into()
}

fn default_runtime_class() -> String {
    "nvidia".into()
}

/// Settings applied to every operand DaemonSet.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(ROLLING_MAX_UNAVAILABLE_RULE).message("daemonsets.rollingUpdate.maxUnavailable must be a whole number of nodes such as 1, or a percentage of nodes such as 25%"))]
pub struct DaemonsetsSpec {
    /// Labels added to every operand DaemonSet and its pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to every operand DaemonSet and its pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Tolerations of every operand pod, e.g. for a GPU pool tainted `sku=gpu:NoSchedule`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// PriorityClass of every operand pod (e.g. system-node-critical).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Update strategy of the operand DaemonSets: RollingUpdate or OnDelete. The driver always uses OnDelete
    /// unless its upgrade policy says otherwise.
    // Kept: NVIDIA's CRD declares the same enum, so its API server refuses any other value too.
    #[serde(default = "default_update_strategy")]
    #[x_kube(validation = Rule::new("self in ['RollingUpdate', 'OnDelete']").message("daemonsets.updateStrategy must be RollingUpdate or OnDelete"))]
    pub update_strategy: String,
    /// Rolling update settings of the operand DaemonSets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdateSpec>,
    /// Security context of every operand pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
    /// Extra node selector ANDed with each operand's own placement (its `nvidia.com/gpu.deploy.<component>`
    /// rule, which an entry for that label does not change), to limit the operator to some GPU nodes. Not in
    /// NVIDIA's operator.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Affinity of every operand pod, to keep operands on or off some nodes. Not in NVIDIA's operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
}

fn default_update_strategy() -> String {
    "RollingUpdate".into()
}

/// CEL rule on `daemonsets`: with RollingUpdate, a set `rollingUpdate.maxUnavailable` is a number or a
/// percentage. Kept because NVIDIA's operator fails on the same input: its `applyUpdateStrategyConfig`
/// (controllers/object_controls.go) parses any value without `%` as an integer and returns "failed to apply
/// rolling update config" when it is not one, and passes a negative number or a bad percentage to a DaemonSet
/// the API server refuses. Like NVIDIA's, it does not look at the value under OnDelete, nor at an empty one.
const ROLLING_MAX_UNAVAILABLE_RULE: &str = "self.updateStrategy == 'OnDelete' || !has(self.rollingUpdate) \
     || !has(self.rollingUpdate.maxUnavailable) \
     || (type(self.rollingUpdate.maxUnavailable) == int ? self.rollingUpdate.maxUnavailable >= 0 \
         : string(self.rollingUpdate.maxUnavailable).matches('^([0-9]+%?)?$'))";

/// Rolling update settings of the operand DaemonSets.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateSpec {
    /// How many nodes may update an operand at once: a number (e.g. 1) or a percentage (e.g. 25%). Default 1;
    /// empty means the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// How MIG devices are advertised.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
pub struct MigSpec {
    /// MIG strategy of the device plugin and feature discovery: none (MIG devices not advertised), single (every
    /// MIG device as nvidia.com/gpu; all of a node's MIG devices must be one profile) or mixed (one resource per
    /// profile, e.g. nvidia.com/mig-1g.5gb). Unset, as in NVIDIA's operator: the device-plugin config file's
    /// `flags.migStrategy` decides, else none. (The Helm chart sets single.)
    // Kept: NVIDIA's CRD declares the same enum, so its API server refuses any other value too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['none', 'single', 'mixed']").message("mig.strategy must be none, single or mixed: single advertises MIG devices as nvidia.com/gpu, mixed as nvidia.com/mig-<profile>"))]
    pub strategy: Option<String>,
}

/// How the Container Device Interface is used.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    /// Hand GPUs to containers through CDI device names (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Deprecated and ignored; kept so that older resources still apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<bool>,
    /// Inject CDI devices into the operator's own GPU containers through an NRI plugin (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nri_plugin_enabled: Option<bool>,
}

/// Paths on the host that operands mount.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostPathsSpec {
    /// The host's root filesystem, chroot-able, for operands that manage host services.
    #[serde(default = "default_root_fs", rename = "rootFS")]
    pub root_fs: String,
    /// Where the driver's libraries, binaries and configuration are installed on the host.
    #[serde(default = "default_driver_install_dir")]
    pub driver_install_dir: String,
    /// The kubelet's root directory (its `--root-dir`), where the exporter and the MIG manager reach its
    /// pod-resources socket. Device plugins register in `/var/lib/kubelet/device-plugins` whatever this is: the
    /// kubelet fixes that path.
    #[serde(default = "default_kubelet_root_dir")]
    pub kubelet_root_dir: String,
}

fn default_root_fs() -> String {
    "/".into()
}

fn default_driver_install_dir() -> String {
    "/run/nvidia/driver".into()
}

fn default_kubelet_root_dir() -> String {
    crate::paths::KUBELET_ROOT.into()
}

/// A section of NVIDIA's ClusterPolicy that this operator accepts and keeps but does not implement (vGPU,
/// sandbox workloads, Kata, confidential computing, GPUDirect Storage, GDRCopy, PSA, PSP). Every field is kept
/// as written; when `enabled` is true the status names the section as unsupported.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
pub struct UnsupportedSection {
    /// Whether the user asked for this part. This operator does not deploy it either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Every other field of the section, kept as written.
    #[serde(flatten)]
    pub fields: UnknownFields,
}

impl Default for OperatorSpec {
    fn default() -> Self {
        serde_defaults()
    }
}

impl Default for DaemonsetsSpec {
    fn default() -> Self {
        serde_defaults()
    }
}

impl Default for HostPathsSpec {
    fn default() -> Self {
        serde_defaults()
    }
}

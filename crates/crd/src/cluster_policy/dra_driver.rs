//! `spec.draDriver`: ours, not NVIDIA's. The DRA driver `gpu.nvidia.com` publishes each node's GPUs as a
//! ResourceSlice for Dynamic Resource Allocation; on shared GPUs claims consume memory and cores, enforced by a
//! per-claim MPS control daemon. NVIDIA's ClusterPolicy has no such section (NVIDIA ships its DRA driver as a
//! separate chart), so its rules refuse only our own field's bad values.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::common::{ContainerSpec, ImageSpec};

/// GPU set written as `all`, `none`, or indices and ranges: the CEL rule the GPU fields share.
const GPU_SET_RULE: &str =
    "self == 'all' || self == 'none' || self.matches('^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$')";

/// The DRA driver (this operator's own, not part of NVIDIA's ClusterPolicy; off by default).
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DraDriverSpec {
    /// Deploy the DRA driver on GPU nodes (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The GPUs of each node the DRA driver takes, by index: all (the default), none, or a list such as 0,2-3.
    /// The device plugin advertises only the others, so the two never hand out the same GPU. A node's
    /// nvidia.com/dra.gpus label overrides this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(GPU_SET_RULE).message("draDriver.gpus must be all, none, or GPU indices and ranges such as 0,2-3"))]
    pub gpus: Option<String>,
    /// Which of the driver's GPUs are shared: claims of the shared.gpu.nvidia.com class take part of their memory
    /// and cores. all (the default), none, or indices. A node's nvidia.com/dra.shared-gpus label overrides this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(GPU_SET_RULE).message("draDriver.sharedGPUs must be all, none, or GPU indices and ranges such as 0,2-3"))]
    #[serde(rename = "sharedGPUs")]
    pub shared_gpus: Option<String>,
    /// MIG on demand: which of the driver's GPUs it publishes as MIG partitions (every profile and placement,
    /// consuming the GPU's shared counters) and whose instances it creates when a claim is prepared and destroys
    /// when it is unprepared. none (the default), all, or indices. The GPUs need MIG mode on (for example the node
    /// label nvidia.com/mig.config=all-enabled); a GPU with MIG off is published whole. A node's
    /// nvidia.com/dra.dynamic-mig-gpus label overrides this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(GPU_SET_RULE).message("draDriver.dynamicMIG must be all, none, or GPU indices and ranges such as 0,2-3"))]
    #[serde(rename = "dynamicMIG")]
    pub dynamic_mig: Option<String>,
    /// DRA driver image (this operator's gpu-dra-driver unless set).
    #[serde(flatten)]
    pub image: ImageSpec,
    /// DRA driver container resources, arguments and environment.
    #[serde(flatten)]
    pub container: ContainerSpec,
}

impl DraDriverSpec {
    /// Whether the driver runs.
    #[must_use]
    pub fn is_enabled(&self) -> bool {
        self.enabled == Some(true)
    }

    /// The GPUs the driver takes, as its flag and the device plugin's take them.
    #[must_use]
    pub fn gpus(&self) -> &str {
        self.gpus.as_deref().unwrap_or("all")
    }

    /// The shared GPUs, as the driver's flag takes them.
    #[must_use]
    pub fn shared_gpus(&self) -> &str {
        self.shared_gpus.as_deref().unwrap_or("all")
    }

    /// The GPUs served as MIG on demand, as the driver's flag takes them.
    #[must_use]
    pub fn dynamic_mig(&self) -> &str {
        self.dynamic_mig.as_deref().unwrap_or("none")
    }
}

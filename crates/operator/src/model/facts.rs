//! What the operator observes of the cluster, reduced to the facts rendering needs: which nodes have GPUs,
//! their operating-system pools, kernels and container runtimes, and which NVIDIADriver drives which of them. Built by pure functions from Node objects, so
//! that rendering never touches the API.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crd::labels;
use crd::nvidia_driver::NvidiaDriverSpec;
use k8s_openapi::api::core::v1::Node;

/// The cluster as rendering sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterFacts {
    /// Namespace the operator and its operands run in.
    pub namespace: String,
    /// Nodes with NVIDIA GPUs, by name.
    pub gpu_nodes: Vec<GpuNodeFacts>,
    /// The NVIDIADriver objects accepted by the node assignment (`plan::driver_assignment`), by name.
    pub nvidia_drivers: Vec<AssignedDriver>,
    /// The OS pool whose driver DaemonSet keeps the name of NVIDIA's (`nvidia-driver-daemonset`), which it takes
    /// over in place after a switch from NVIDIA's operator (see `handover`); `None` when there is none to take over.
    pub nvidia_driver_pool: Option<OsPool>,
}

/// An accepted NVIDIADriver and the GPU nodes it drives.
#[derive(Clone, Debug, PartialEq)]
pub struct AssignedDriver {
    pub name: String,
    pub spec: NvidiaDriverSpec,
    pub nodes: BTreeSet<String>,
}

/// One GPU node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuNodeFacts {
    pub name: String,
    /// Operating system from the NFD labels; `None` when NFD has not labelled the node yet.
    pub os: Option<OsPool>,
    /// Full kernel version from the NFD label.
    pub kernel: Option<String>,
    pub runtime: ContainerRuntime,
}

/// Nodes sharing an operating system get one driver DaemonSet.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OsPool {
    /// os-release ID, e.g. ubuntu, rhel.
    pub id: String,
    /// os-release VERSION_ID, e.g. 22.04, 9.4.
    pub version_id: String,
}

impl fmt::Display for OsPool {
    /// The driver image tag suffix, e.g. ubuntu22.04, rhel9.4.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.id, self.version_id)
    }
}

/// The container runtime of a node, with the distribution-specific containerd layouts of k3s and RKE2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ContainerRuntime {
    Containerd,
    K3sContainerd,
    Rke2Containerd,
    CriO,
    Docker,
}

impl ContainerRuntime {
    pub const ALL: [Self; 5] = [
        Self::Containerd,
        Self::K3sContainerd,
        Self::Rke2Containerd,
        Self::CriO,
        Self::Docker,
    ];

    /// From `status.nodeInfo`: the runtime scheme of containerRuntimeVersion (`containerd://2.1.4`), and the
    /// kubelet version for k3s (`v1.33.1+k3s1`) and RKE2 (`v1.33.1+rke2r1`), which run their own containerd.
    pub fn detect(runtime_version: &str, kubelet_version: &str) -> Option<Self> {
        let scheme = runtime_version.split("://").next()?;
        match scheme {
            "containerd" if kubelet_version.contains("+rke2") => Some(Self::Rke2Containerd),
            "containerd" if kubelet_version.contains("+k3s") => Some(Self::K3sContainerd),
            "containerd" => Some(Self::Containerd),
            "cri-o" => Some(Self::CriO),
            "docker" => Some(Self::Docker),
            _ => None,
        }
    }

    /// The runtime as the default in `operator.defaultRuntime` names it.
    pub fn from_default(name: &str) -> Self {
        match name {
            "crio" => Self::CriO,
            "docker" => Self::Docker,
            _ => Self::Containerd,
        }
    }

    /// Short name, used in object names and the runtime node label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Containerd => "containerd",
            Self::K3sContainerd => "k3s",
            Self::Rke2Containerd => "rke2",
            Self::CriO => "crio",
            Self::Docker => "docker",
        }
    }

    /// The runtime kind the container toolkit configures.
    pub fn toolkit_runtime(self) -> &'static str {
        match self {
            Self::Containerd | Self::K3sContainerd | Self::Rke2Containerd => "containerd",
            Self::CriO => "crio",
            Self::Docker => "docker",
        }
    }

    /// The runtime's configuration file on the host.
    pub fn config_path(self) -> &'static str {
        match self {
            Self::Containerd => "/etc/containerd/config.toml",
            Self::K3sContainerd => "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
            Self::Rke2Containerd => "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
            Self::CriO => "/etc/crio/crio.conf",
            Self::Docker => "/etc/docker/daemon.json",
        }
    }

    /// The runtime's socket on the host.
    pub fn socket_path(self) -> &'static str {
        match self {
            Self::Containerd => "/run/containerd/containerd.sock",
            Self::K3sContainerd | Self::Rke2Containerd => "/run/k3s/containerd/containerd.sock",
            Self::CriO => "/var/run/crio/crio.sock",
            Self::Docker => "/var/run/docker.sock",
        }
    }
}

/// Label the operator writes with each GPU node's runtime, so that one toolkit DaemonSet per runtime can select
/// its nodes (a DaemonSet cannot select on `status.nodeInfo`).
pub const RUNTIME_LABEL: &str = "nvidia.com/gpu.container-runtime";

/// The labels of which any one, `true`, marks a node as having an NVIDIA PCI device (NFD's, or node facts' where
/// NFD is not installed, or an admin's).
pub const NVIDIA_PCI_LABELS: [&str; 3] = [
    labels::NFD_PCI_NVIDIA,
    labels::NFD_PCI_NVIDIA_3D,
    labels::NFD_PCI_NVIDIA_VGA,
];

/// Whether NFD (or an admin) marked the node as having an NVIDIA PCI device.
pub fn has_nvidia_gpu(labels: &BTreeMap<String, String>) -> bool {
    NVIDIA_PCI_LABELS
        .iter()
        .any(|label| labels.get(*label).is_some_and(|value| value == "true"))
}

impl ClusterFacts {
    /// Facts from the cluster's Nodes; `default_runtime` applies where a node reports no runtime.
    pub fn from_nodes<'a>(
        namespace: &str,
        nodes: impl IntoIterator<Item = &'a Node>,
        default_runtime: ContainerRuntime,
    ) -> Self {
        let mut gpu_nodes: Vec<GpuNodeFacts> = nodes
            .into_iter()
            .filter_map(|node| GpuNodeFacts::from_node(node, default_runtime))
            .collect();
        gpu_nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            namespace: namespace.into(),
            gpu_nodes,
            nvidia_drivers: Vec::new(),
            nvidia_driver_pool: None,
        }
    }

    /// The OS pools present among GPU nodes (one driver DaemonSet each).
    pub fn os_pools(&self) -> BTreeSet<OsPool> {
        self.os_pools_among(|_| true)
    }

    /// The OS pools with their kernels, for precompiled drivers (one DaemonSet per pool and kernel).
    pub fn os_kernel_pools(&self) -> BTreeSet<(OsPool, String)> {
        self.os_kernel_pools_among(|_| true)
    }

    /// The OS pools among the GPU nodes `include` picks by name.
    pub fn os_pools_among(&self, include: impl Fn(&str) -> bool) -> BTreeSet<OsPool> {
        self.gpu_nodes
            .iter()
            .filter(|node| include(&node.name))
            .filter_map(|node| node.os.clone())
            .collect()
    }

    /// The OS pools with their kernels among the GPU nodes `include` picks by name.
    pub fn os_kernel_pools_among(
        &self,
        include: impl Fn(&str) -> bool,
    ) -> BTreeSet<(OsPool, String)> {
        self.gpu_nodes
            .iter()
            .filter(|node| include(&node.name))
            .filter_map(|node| Some((node.os.clone()?, node.kernel.clone()?)))
            .collect()
    }

    /// The container runtimes present among GPU nodes (one toolkit DaemonSet each).
    pub fn runtimes(&self) -> BTreeSet<ContainerRuntime> {
        self.gpu_nodes.iter().map(|node| node.runtime).collect()
    }
}

impl GpuNodeFacts {
    fn from_node(node: &Node, default_runtime: ContainerRuntime) -> Option<Self> {
        // Borrowed, not copied: every reconcile reads every node, and these copies showed in the operator's CPU
        // profile at 1000 nodes.
        let no_labels = BTreeMap::new();
        let labels = node.metadata.labels.as_ref().unwrap_or(&no_labels);
        if !has_nvidia_gpu(labels) {
            return None;
        }
        let info = node
            .status
            .as_ref()
            .and_then(|status| status.node_info.as_ref());
        let runtime = info
            .and_then(|info| {
                ContainerRuntime::detect(&info.container_runtime_version, &info.kubelet_version)
            })
            .unwrap_or(default_runtime);
        let os = match (
            labels.get(labels::NFD_OS_ID),
            labels.get(labels::NFD_OS_VERSION_ID),
        ) {
            (Some(id), Some(version_id)) => Some(OsPool {
                id: id.clone(),
                version_id: version_id.clone(),
            }),
            _ => None,
        };
        Some(Self {
            name: node.metadata.name.clone()?,
            os,
            kernel: labels.get(labels::NFD_KERNEL_VERSION).cloned(),
            runtime,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeStatus, NodeSystemInfo};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    pub(crate) fn node(name: &str, labels: &[(&str, &str)], runtime: &str, kubelet: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                node_info: Some(NodeSystemInfo {
                    container_runtime_version: runtime.into(),
                    kubelet_version: kubelet.into(),
                    ..NodeSystemInfo::default()
                }),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn runtime_detection_covers_k3s_and_rke2() {
        assert_eq!(
            ContainerRuntime::detect("containerd://2.1.4", "v1.37.1"),
            Some(ContainerRuntime::Containerd)
        );
        assert_eq!(
            ContainerRuntime::detect("containerd://1.7.23-k3s2", "v1.31.4+k3s1"),
            Some(ContainerRuntime::K3sContainerd)
        );
        assert_eq!(
            ContainerRuntime::detect("containerd://1.7.23-k3s2", "v1.31.4+rke2r1"),
            Some(ContainerRuntime::Rke2Containerd)
        );
        assert_eq!(
            ContainerRuntime::detect("cri-o://1.31.0", "v1.31.0"),
            Some(ContainerRuntime::CriO)
        );
        assert_eq!(
            ContainerRuntime::detect("docker://27.0.1", "v1.31.0"),
            Some(ContainerRuntime::Docker)
        );
        assert_eq!(ContainerRuntime::detect("", "v1.31.0"), None);
    }

    #[test]
    fn facts_keep_only_gpu_nodes_and_group_pools() {
        let gpu = [
            (labels::NFD_PCI_NVIDIA, "true"),
            (labels::NFD_OS_ID, "ubuntu"),
            (labels::NFD_OS_VERSION_ID, "22.04"),
            (labels::NFD_KERNEL_VERSION, "5.15.0-119-generic"),
        ];
        let rhel = [
            (labels::NFD_PCI_NVIDIA_3D, "true"),
            (labels::NFD_OS_ID, "rhel"),
            (labels::NFD_OS_VERSION_ID, "9.4"),
        ];
        let nodes = [
            node("b", &gpu, "containerd://2.1.4", "v1.37.1"),
            node("a", &rhel, "cri-o://1.31.0", "v1.37.1"),
            node(
                "cpu",
                &[(labels::NFD_OS_ID, "ubuntu")],
                "containerd://2.1.4",
                "v1.37.1",
            ),
            node("c", &gpu, "", "v1.37.1"),
        ];
        let facts = ClusterFacts::from_nodes("gpu-operator", &nodes, ContainerRuntime::Docker);
        let names: Vec<_> = facts.gpu_nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        let pools: Vec<String> = facts.os_pools().iter().map(ToString::to_string).collect();
        assert_eq!(pools, ["rhel9.4", "ubuntu22.04"]);
        assert_eq!(
            facts.gpu_nodes[2].runtime,
            ContainerRuntime::Docker,
            "default runtime where none is reported"
        );
        assert_eq!(
            facts.os_kernel_pools().len(),
            1,
            "rhel node has no kernel label"
        );
    }
}

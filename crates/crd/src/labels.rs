//! Names of the node labels and annotations that the operator, the node agents, the device plugin and
//! users agree on. Most are NVIDIA's, so that existing scripts and node pools keep working.

/// Prefix of every NVIDIA label.
pub const NVIDIA_PREFIX: &str = "nvidia.com/";

/// Set by Node Feature Discovery on nodes with an NVIDIA PCI device (vendor 10de).
pub const NFD_PCI_NVIDIA: &str = "feature.node.kubernetes.io/pci-10de.present";
/// NFD label for NVIDIA 3D controllers (class 0302), the usual class of data-centre GPUs.
pub const NFD_PCI_NVIDIA_3D: &str = "feature.node.kubernetes.io/pci-0302_10de.present";
/// NFD label for NVIDIA VGA controllers (class 0300).
pub const NFD_PCI_NVIDIA_VGA: &str = "feature.node.kubernetes.io/pci-0300_10de.present";
/// NFD label with the operating system id, e.g. ubuntu.
pub const NFD_OS_ID: &str = "feature.node.kubernetes.io/system-os_release.ID";
/// NFD label with the operating system version, e.g. 22.04.
pub const NFD_OS_VERSION_ID: &str = "feature.node.kubernetes.io/system-os_release.VERSION_ID";
/// NFD label with the full kernel version, e.g. 5.15.0-119-generic.
pub const NFD_KERNEL_VERSION: &str = "feature.node.kubernetes.io/kernel-version.full";

/// Written by the operator: whether the node has NVIDIA GPUs.
pub const GPU_PRESENT: &str = "nvidia.com/gpu.present";
/// Set to `false` by an admin to remove every operand from a node.
pub const DEPLOY_OPERANDS: &str = "nvidia.com/gpu.deploy.operands";
/// Value of a component deploy label while the MIG manager reconfigures the node.
pub const PAUSED_FOR_MIG_CHANGE: &str = "paused-for-mig-change";

/// The deploy label of one component: operands select nodes where it is `true`.
pub fn deploy_label(component: &str) -> String {
    format!("nvidia.com/gpu.deploy.{component}")
}

/// Desired MIG geometry of the node, a name in the MIG manager's config.
pub const MIG_CONFIG: &str = "nvidia.com/mig.config";
/// State of applying the MIG geometry: pending, rebooting, success or failed.
pub const MIG_CONFIG_STATE: &str = "nvidia.com/mig.config.state";
/// Key of the device-plugin ConfigMap to use on this node.
pub const DEVICE_PLUGIN_CONFIG: &str = "nvidia.com/device-plugin.config";
/// GPU product as feature discovery writes it, e.g. NVIDIA-A100-SXM4-40GB.
pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// The NVIDIADriver object that drives a node (NVIDIA's name): the operator writes it on each GPU node it assigns
/// to an object, and the object's driver DaemonSets select their nodes by it (and carry it themselves).
pub const DRIVER_OWNER: &str = "nvidia.com/gpu-operator.driver.owner";

/// Labels GPU feature discovery writes besides the `nvidia.com/mig-<profile>.*` family, without the prefix. Feature
/// discovery removes any of them that no longer applies, and the operator removes them all when its ClusterPolicy
/// is deleted; other `nvidia.com/` labels (the operator's, the MIG manager's, an admin's) are not feature
/// discovery's to touch.
const FEATURE_DISCOVERY_LABELS: [&str; 34] = [
    "gfd.timestamp",
    "gpu.product",
    "gpu.memory",
    "gpu.count",
    "gpu.family",
    "gpu.compute.major",
    "gpu.compute.minor",
    "gpu.machine",
    "gpu.mode",
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
    "cuda.driver.major",
    "cuda.driver.minor",
    "cuda.driver.rev",
    "cuda.runtime.major",
    "cuda.runtime.minor",
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

/// Whether `key` is a label GPU feature discovery writes.
#[must_use]
pub fn written_by_feature_discovery(key: &str) -> bool {
    key.strip_prefix(NVIDIA_PREFIX).is_some_and(|name| {
        FEATURE_DISCOVERY_LABELS.contains(&name) || (name.starts_with("mig-") && name.contains('.'))
    })
}

/// Annotation on simulated nodes naming the GPUs the simulator gives them, e.g. `a100-40gb:4`. Node agents
/// started with `--simulate` read it; real nodes never carry it.
pub const SIMULATED_GPUS_ANNOTATION: &str = "nvidia.com/gpu.simulator";

/// Pod annotation (ours): the most GPU memory the pod may use on each shared GPU it holds, as a quantity (`8Gi`).
/// It can only lower the budget the watchdog gives the pod (a replica's share, a DRA claim's memory), never raise
/// it; on a GPU the pod holds whole, or a MIG device, it changes nothing.
pub const GPU_MEMORY_LIMIT_ANNOTATION: &str = "nvidia.com/gpu-memory-limit";

#[cfg(test)]
#[path = "labels_properties.rs"]
mod properties;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploy_labels_use_nvidia_names() {
        assert_eq!(
            deploy_label("device-plugin"),
            "nvidia.com/gpu.deploy.device-plugin"
        );
        assert!(MIG_CONFIG.starts_with(NVIDIA_PREFIX));
    }
}

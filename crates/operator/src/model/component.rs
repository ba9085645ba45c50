//! The operands the operator deploys, with the names users already select them by: the deploy label
//! (`nvidia.com/gpu.deploy.<label>`), the DaemonSet name and its `app` label, as in NVIDIA's operator.

use std::fmt;
use std::sync::LazyLock;

/// One operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    Driver,
    ContainerToolkit,
    OperatorValidator,
    DevicePlugin,
    GpuFeatureDiscovery,
    Dcgm,
    DcgmExporter,
    MigManager,
    NodeStatusExporter,
    Watchdog,
    DraDriver,
}

impl Component {
    /// Every component, in the order they come up on a node (status lists them in this order).
    pub const ALL: [Component; 11] = [
        Component::Driver,
        Component::ContainerToolkit,
        Component::OperatorValidator,
        Component::DevicePlugin,
        Component::GpuFeatureDiscovery,
        Component::Dcgm,
        Component::DcgmExporter,
        Component::MigManager,
        Component::NodeStatusExporter,
        Component::Watchdog,
        Component::DraDriver,
    ];

    /// The name in deploy labels and in `status.components`.
    pub fn label_name(self) -> &'static str {
        match self {
            Component::Driver => "driver",
            Component::ContainerToolkit => "container-toolkit",
            Component::OperatorValidator => "operator-validator",
            Component::DevicePlugin => "device-plugin",
            Component::GpuFeatureDiscovery => "gpu-feature-discovery",
            Component::Dcgm => "dcgm",
            Component::DcgmExporter => "dcgm-exporter",
            Component::MigManager => "mig-manager",
            Component::NodeStatusExporter => "node-status-exporter",
            Component::Watchdog => "watchdog",
            Component::DraDriver => "dra-driver",
        }
    }

    /// The DaemonSet name and its pods' `app` label, which users' scripts and dashboards select on.
    pub fn app_name(self) -> &'static str {
        match self {
            Component::Driver => "nvidia-driver-daemonset",
            Component::ContainerToolkit => "nvidia-container-toolkit-daemonset",
            Component::OperatorValidator => "nvidia-operator-validator",
            Component::DevicePlugin => "nvidia-device-plugin-daemonset",
            Component::GpuFeatureDiscovery => "gpu-feature-discovery",
            Component::Dcgm => "nvidia-dcgm",
            Component::DcgmExporter => "nvidia-dcgm-exporter",
            Component::MigManager => "nvidia-mig-manager",
            Component::NodeStatusExporter => "nvidia-node-status-exporter",
            Component::Watchdog => "nvidia-gpu-watchdog",
            Component::DraDriver => "nvidia-dra-driver-gpu",
        }
    }

    /// The node label that selects this component's nodes. Made once: the label planner reads it for every node
    /// in every reconcile.
    pub fn deploy_label(self) -> &'static str {
        static LABELS: LazyLock<Vec<(Component, String)>> = LazyLock::new(|| {
            Component::ALL
                .iter()
                .map(|component| {
                    (
                        *component,
                        crd::labels::deploy_label(component.label_name()),
                    )
                })
                .collect()
        });
        LABELS
            .iter()
            .find(|(component, _)| *component == self)
            .map(|(_, label)| label.as_str())
            .expect("Component::ALL lists every component")
    }

    /// Clients of the GPUs that the MIG manager pauses while it reconfigures a node.
    pub fn is_gpu_client(self) -> bool {
        matches!(
            self,
            Component::DevicePlugin
                | Component::GpuFeatureDiscovery
                | Component::Dcgm
                | Component::DcgmExporter
                | Component::DraDriver
        )
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_nvidias() {
        assert_eq!(
            Component::DevicePlugin.deploy_label(),
            "nvidia.com/gpu.deploy.device-plugin"
        );
        assert_eq!(Component::DcgmExporter.app_name(), "nvidia-dcgm-exporter");
        for component in Component::ALL {
            assert_eq!(
                component.deploy_label(),
                crd::labels::deploy_label(component.label_name())
            );
        }
        let labels: std::collections::BTreeSet<_> =
            Component::ALL.iter().map(|c| c.label_name()).collect();
        assert_eq!(
            labels.len(),
            Component::ALL.len(),
            "label names are distinct"
        );
    }
}

//! The vocabulary of driver upgrades: NVIDIA's per-node state label and its values, the labels and annotations an
//! admin and NVIDIA's tooling already use (names read from NVIDIA's k8s-operator-libs `pkg/upgrade/consts.go`,
//! with the driver name `gpu` that NVIDIA's GPU Operator gives them), the few annotations of this operator's own,
//! and what the upgrade controller reports in GPUNode and ClusterPolicy status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Node label: the node's driver upgrade state (NVIDIA's name and values).
pub const STATE_LABEL: &str = "nvidia.com/gpu-driver-upgrade-state";
/// Node label an admin sets to `true` so that the upgrade controller leaves the node alone (NVIDIA's name).
pub const SKIP_LABEL: &str = "nvidia.com/gpu-driver-upgrade.skip";
/// Pod label: `true` keeps the pod out of the upgrade's drain (NVIDIA's name).
pub const DRAIN_SKIP_LABEL: &str = "nvidia.com/gpu-driver-upgrade-drain.skip";
/// Node annotation `true`: the node was unschedulable (cordoned by the admin) when its upgrade began, so it stays
/// cordoned afterwards (NVIDIA's name).
pub const INITIAL_UNSCHEDULABLE_ANNOTATION: &str =
    "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable";
/// Node annotation `true`: an admin asks for the node's driver pod to be replaced even though it runs the current
/// revision (NVIDIA's name).
pub const REQUESTED_ANNOTATION: &str = "nvidia.com/gpu-driver-upgrade-requested";
/// Node annotation: when the node entered its current state (RFC 3339). Timeouts count from it, so an operator
/// that restarts resumes each wait where it was instead of starting it again.
pub const STATE_SINCE_ANNOTATION: &str = "nvidia.com/gpu-driver-upgrade-state-since";
/// Node annotation: why the node is in `upgrade-failed`, kept with the node so that it survives a restart and
/// shows on nodes without a GPUNode.
pub const REASON_ANNOTATION: &str = "nvidia.com/gpu-driver-upgrade-reason";
/// Node annotation: the driver DaemonSet revision (`controller-revision-hash`) a node failed to upgrade to. A
/// later revision resumes the node; the same one does not start the same failure again.
pub const FAILED_REVISION_ANNOTATION: &str = "nvidia.com/gpu-driver-upgrade-failed-revision";
/// Every node annotation the upgrade reads or writes: a Node cache may drop all others.
pub const NODE_ANNOTATIONS: [&str; 5] = [
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    REQUESTED_ANNOTATION,
    STATE_SINCE_ANNOTATION,
    REASON_ANNOTATION,
    FAILED_REVISION_ANNOTATION,
];

/// The field manager of what the upgrade controller writes into GPUNode and ClusterPolicy status: its own, so
/// that the node agents' and the policy reconcile's server-side applies neither remove nor fight over it.
pub const FIELD_MANAGER: &str = "gpu-operator-driver-upgrade";

/// A node's driver upgrade state, NVIDIA's values of [`STATE_LABEL`].
#[derive(
    Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeState {
    /// The node's driver pod runs an old revision; it waits for a free upgrade slot.
    UpgradeRequired,
    /// The node is to be cordoned.
    CordonRequired,
    /// Waiting for the pods of `waitForCompletion.podSelector` to finish.
    WaitForJobsRequired,
    /// The pods that use the GPUs are being evicted.
    PodDeletionRequired,
    /// The node is being drained (`drain.enable`).
    DrainRequired,
    /// The old driver pod is deleted and the new one awaited.
    PodRestartRequired,
    /// The new driver runs; waiting for the validator to find it working.
    ValidationRequired,
    /// The node is to be made schedulable again.
    UncordonRequired,
    /// The node runs the current driver revision.
    UpgradeDone,
    /// The upgrade stopped; the reason is in the node's annotation, its GPUNode and the ClusterPolicy status.
    UpgradeFailed,
}

impl UpgradeState {
    /// Every state, in upgrade order.
    pub const ALL: [Self; 10] = [
        Self::UpgradeRequired,
        Self::CordonRequired,
        Self::WaitForJobsRequired,
        Self::PodDeletionRequired,
        Self::DrainRequired,
        Self::PodRestartRequired,
        Self::ValidationRequired,
        Self::UncordonRequired,
        Self::UpgradeDone,
        Self::UpgradeFailed,
    ];

    /// The label value.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::UpgradeRequired => "upgrade-required",
            Self::CordonRequired => "cordon-required",
            Self::WaitForJobsRequired => "wait-for-jobs-required",
            Self::PodDeletionRequired => "pod-deletion-required",
            Self::DrainRequired => "drain-required",
            Self::PodRestartRequired => "pod-restart-required",
            Self::ValidationRequired => "validation-required",
            Self::UncordonRequired => "uncordon-required",
            Self::UpgradeDone => "upgrade-done",
            Self::UpgradeFailed => "upgrade-failed",
        }
    }

    /// The state a label value names; `None` for any other value.
    #[must_use]
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == value)
    }

    /// Whether a node in this state is being upgraded: it holds one of the `maxParallelUpgrades` slots.
    #[must_use]
    pub const fn in_flight(self) -> bool {
        !matches!(
            self,
            Self::UpgradeRequired | Self::UpgradeDone | Self::UpgradeFailed
        )
    }
}

impl std::fmt::Display for UpgradeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The upgrade controller's part of a GPUNode's status.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeUpgradeStatus {
    /// The node's state, as in the nvidia.com/gpu-driver-upgrade-state label (the DRIVER UPGRADE column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<UpgradeState>,
    /// Why the node is in this state: what it waits for, or why its upgrade failed and how to resume it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the node entered the state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// One pod whose processes use a node's GPUs, as the driver lists the GPU's processes and their cgroups name the
/// pod: a GPU user whatever it requested.
#[derive(
    Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct GpuProcessPod {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID (a pod of the same name made again is another pod).
    pub uid: String,
    /// Indexes of the GPUs its processes use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
}

/// The driver upgrade across the cluster, in the ClusterPolicy status.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterUpgradeStatus {
    /// Whether automatic upgrades are on (`driver.upgradePolicy.autoUpgrade`).
    pub auto_upgrade: bool,
    /// Nodes being upgraded now (cordon-required to uncordon-required).
    pub in_progress: i32,
    /// Nodes that run the current driver (upgrade-done).
    pub done: i32,
    /// Nodes whose upgrade failed.
    pub failed: i32,
    /// Nodes waiting for a slot (upgrade-required).
    pub pending: i32,
    /// Nodes the upgrade leaves alone (nvidia.com/gpu-driver-upgrade.skip=true).
    #[serde(default)]
    pub skipped: i32,
    /// Each failed node and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<NodeFailure>,
}

/// A node whose driver upgrade failed.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub struct NodeFailure {
    /// The node.
    pub node: String,
    /// Why, and how to resume it.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_nvidias_label_values_and_serialize_as_them() {
        let values: Vec<&str> = UpgradeState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            values,
            [
                "upgrade-required",
                "cordon-required",
                "wait-for-jobs-required",
                "pod-deletion-required",
                "drain-required",
                "pod-restart-required",
                "validation-required",
                "uncordon-required",
                "upgrade-done",
                "upgrade-failed"
            ]
        );
        for state in UpgradeState::ALL {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
            assert_eq!(UpgradeState::parse(state.as_str()), Some(state));
        }
        assert_eq!(UpgradeState::parse("upgrade-in-progress"), None);
    }

    #[test]
    fn only_the_states_between_required_and_done_hold_a_slot() {
        let in_flight: Vec<UpgradeState> = UpgradeState::ALL
            .into_iter()
            .filter(|s| s.in_flight())
            .collect();
        assert_eq!(in_flight.len(), 7);
        assert!(!UpgradeState::UpgradeFailed.in_flight());
        assert!(UpgradeState::CordonRequired.in_flight());
        assert!(UpgradeState::UncordonRequired.in_flight());
    }
}

//! What the operator reports on a ClusterPolicy: overall state, conditions, and one entry per component.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state of the ClusterPolicy, written by the operator only.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPolicyStatus {
    /// ready when every enabled component is rolled out and available on every GPU node, notReady otherwise,
    /// ignored when another ClusterPolicy is the active one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PolicyState>,
    /// Namespace the operator and its operands run in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Ready and Error conditions with their reasons (Reconciled, ReconcileFailed, NoGPUNodes, OperandNotReady, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// One entry per operand: whether it is enabled, on how many nodes it should run and is ready, and why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ComponentStatus>,
    /// Ready components over enabled components, e.g. 6/7 (the READY column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// Number of nodes with NVIDIA GPUs (the GPU NODES column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_nodes: Option<i32>,
    /// The driver upgrade across the GPU nodes: counts per state and each failed node with its reason (written by
    /// the operator's upgrade controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_upgrade: Option<crate::driver_upgrade::ClusterUpgradeStatus>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Overall state of a ClusterPolicy, spelled as NVIDIA's operator spells it.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum PolicyState {
    /// Every enabled component is ready.
    Ready,
    /// Some enabled component is not ready yet, or reconciling failed; the conditions say why.
    NotReady,
    /// Another, older ClusterPolicy is active; this one is not acted on.
    Ignored,
}

/// Status of one operand.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    /// Component name as in the deploy labels, e.g. device-plugin, driver, mig-manager.
    pub name: String,
    /// Whether the policy enables this component.
    pub enabled: bool,
    /// Nodes the component should run on.
    #[serde(default)]
    pub desired_nodes: i32,
    /// Nodes where the component is up to date and available.
    #[serde(default)]
    pub ready_nodes: i32,
    /// ready, notReady, disabled or unsupported.
    pub state: String,
    /// Why the component is not ready, naming the nodes concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where the component runs other than the spec says, one line each naming the field, e.g. an NVIDIA
    /// image replaced by this operator's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

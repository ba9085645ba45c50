//! Node labels the operator owns, planned as a pure function of the policy and each node's current labels.
//!
//! Rules, as users of NVIDIA's operator expect them:
//! - GPU nodes get `nvidia.com/gpu.present=true` and `nvidia.com/gpu.deploy.<component>=true` for every enabled
//!   component, and for NVIDIA's own operands (driver, toolkit, device plugin, feature discovery, DCGM, exporter,
//!   node status exporter, validator) whether enabled or not, as NVIDIA's operator labels them. A deploy label
//!   that already holds another non-empty value is an admin's (`false` pauses a component on that node) or the MIG
//!   manager's (`paused-for-mig-change`) and is left alone.
//! - `nvidia.com/gpu.deploy.operands=false` removes every operand: the operator's `true` deploy labels go.
//! - The MIG manager is deployed only where feature discovery found MIG-capable GPUs (`nvidia.com/mig.capable`),
//!   and such nodes without a `nvidia.com/mig.config` get `all-disabled` when that is the configured default.
//! - A node that no longer has GPUs gets `gpu.present=false` and loses the operator's deploy labels.
//! - With NVIDIADriver objects, each GPU node they drive names its object in `nvidia.com/gpu-operator.driver.owner`
//!   (NVIDIA's label), which their DaemonSets select; no other node has it.
//! - On deletion of the policy (`cleanup`), every label the operator and its operands wrote goes.
//!
//! A plan holds only the labels that must change, so nodes are patched only when something changes.

use std::collections::{BTreeMap, BTreeSet};

use crd::labels;
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};

use crate::model::facts::{NVIDIA_PCI_LABELS, RUNTIME_LABEL, has_nvidia_gpu};
use crate::model::{Component, ContainerRuntime, ValidatedPolicy};

/// Label set by feature discovery on nodes whose GPUs support MIG.
pub const MIG_CAPABLE: &str = "nvidia.com/mig.capable";

/// The value the operator writes on deploy labels.
const DEPLOY: &str = "true";

/// Labels to set (`Some`) or remove (`None`) on one node: exactly a JSON merge patch of `metadata.labels`.
pub type LabelChanges = BTreeMap<String, Option<String>>;

/// The label changes for one node under an active policy.
pub fn plan_node(
    policy: &ValidatedPolicy,
    current: &BTreeMap<String, String>,
    runtime: ContainerRuntime,
) -> LabelChanges {
    let mut plan = Changes::from(current);
    let gpu = has_nvidia_gpu(current);
    let was_ours = current
        .get(labels::GPU_PRESENT)
        .is_some_and(|v| v == DEPLOY);
    if !gpu {
        if was_ours {
            plan.set(labels::GPU_PRESENT, Some("false"));
            remove_deploy_labels(&mut plan);
            plan.set(RUNTIME_LABEL, None);
        }
        return plan.changes;
    }
    plan.set(labels::GPU_PRESENT, Some(DEPLOY));
    plan.set(RUNTIME_LABEL, Some(runtime.name()));
    let operands_off = current
        .get(labels::DEPLOY_OPERANDS)
        .is_some_and(|v| v == "false");
    let mig_capable = current.get(MIG_CAPABLE).is_some_and(|v| v == DEPLOY);
    for component in Component::ALL {
        let wanted = !operands_off
            && (labelled_by_nvidia_whatever_runs(component) || policy.is_enabled(component))
            && (component != Component::MigManager || mig_capable);
        let label = component.deploy_label();
        match current.get(label).map(String::as_str) {
            // Someone else's value: an admin pausing the component, or the MIG manager mid-change.
            Some(value) if !value.is_empty() && value != DEPLOY => {}
            Some(DEPLOY) if !wanted => plan.set(label, None),
            _ if wanted => plan.set(label, Some(DEPLOY)),
            _ => {}
        }
    }
    let mig_default = policy
        .spec
        .mig_manager
        .config
        .as_ref()
        .map_or("all-disabled", |c| c.default.as_str());
    let wants_default_mig =
        policy.is_enabled(Component::MigManager) && mig_capable && mig_default == "all-disabled";
    if wants_default_mig
        && current
            .get(labels::MIG_CONFIG)
            .is_none_or(|value| value.is_empty())
    {
        plan.set(labels::MIG_CONFIG, Some("all-disabled"));
    }
    plan.changes
}

/// Where a component's pods may run, as required node affinity terms (any one suffices): the rule of [`plan_node`]
/// for its deploy label, read from the labels a node has before the operator wrote any, so that the DaemonSet
/// controller places a GPU node's pods at once instead of after its label write (at 1000 nodes the writes queue
/// behind the DaemonSet controller's pod creations for up to 43 s).
/// - The deploy label is `true`: the operator's, or the MIG manager's once a change is done.
/// - Or it is not there yet, and the node has an NVIDIA GPU (one term per PCI label), operands are not turned off
///   on it, and for the MIG manager its GPUs are MIG-capable.
///
/// Any other value (an admin's `false`, the MIG manager's pause) keeps the pods off, as it keeps the label unwritten.
pub fn deploy_terms(component: Component) -> Vec<NodeSelectorTerm> {
    let label = component.deploy_label();
    let written = NodeSelectorTerm {
        match_expressions: Some(vec![requirement(label, "In", &[DEPLOY])]),
        match_fields: None,
    };
    let unwritten = NVIDIA_PCI_LABELS.iter().map(|gpu| {
        let mut expressions = vec![
            requirement(label, "DoesNotExist", &[]),
            requirement(gpu, "In", &[DEPLOY]),
            requirement(labels::DEPLOY_OPERANDS, "NotIn", &["false"]),
        ];
        if component == Component::MigManager {
            expressions.push(requirement(MIG_CAPABLE, "In", &[DEPLOY]));
        }
        NodeSelectorTerm {
            match_expressions: Some(expressions),
            match_fields: None,
        }
    });
    std::iter::once(written).chain(unwritten).collect()
}

/// Which nodes' runtime label lets a toolkit DaemonSet for `runtime` run there, when the cluster's GPU nodes run
/// `present`.
/// - One runtime in the cluster (the usual case): the label is that runtime's or not written yet, so the toolkit's
///   pods schedule at once, as the other operands' do, instead of after the operator's label write. A node of
///   another runtime joining later changes the facts, and with them this rule, before the toolkit's pod gets past
///   its wait for the driver.
/// - Several: only that runtime's label, since an unlabelled node could be either.
pub fn runtime_requirement(
    runtime: ContainerRuntime,
    present: &BTreeSet<ContainerRuntime>,
) -> NodeSelectorRequirement {
    if present.len() > 1 {
        return requirement(RUNTIME_LABEL, "In", &[runtime.name()]);
    }
    let others: Vec<&str> = ContainerRuntime::ALL
        .iter()
        .filter(|other| **other != runtime)
        .map(|other| other.name())
        .collect();
    requirement(RUNTIME_LABEL, "NotIn", &others)
}

fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

/// The change of a node's driver owner label to `owner` (removed for `None`), if it changes.
pub fn plan_driver_owner(current: &BTreeMap<String, String>, owner: Option<&str>) -> LabelChanges {
    let mut plan = Changes::from(current);
    plan.set(labels::DRIVER_OWNER, owner);
    plan.changes
}

/// Whether NVIDIA's operator sets the component's deploy label on every GPU node, whether or not its ClusterPolicy
/// enables the component (its `gpuStateLabels` for container workloads): the labels say where an operand may run,
/// the policy whether it does. Setting them alike keeps a node's labels unchanged across a switch between the two
/// operators, and tools that read them see what they see under NVIDIA's.
fn labelled_by_nvidia_whatever_runs(component: Component) -> bool {
    matches!(
        component,
        Component::Driver
            | Component::GpuFeatureDiscovery
            | Component::ContainerToolkit
            | Component::DevicePlugin
            | Component::Dcgm
            | Component::DcgmExporter
            | Component::NodeStatusExporter
            | Component::OperatorValidator
    )
}

/// The label changes that undo what the operator and its operands wrote, when its ClusterPolicy is deleted
/// (after the operands stopped, so that none writes them again): the operator's own labels, feature discovery's,
/// the MIG manager's state and its pauses. An admin's labels stay, `nvidia.com/mig.config` included unless it holds
/// the operator's default.
pub fn plan_cleanup(current: &BTreeMap<String, String>) -> LabelChanges {
    let mut plan = Changes::from(current);
    for key in [
        labels::GPU_PRESENT,
        RUNTIME_LABEL,
        labels::DRIVER_OWNER,
        labels::MIG_CONFIG_STATE,
        // The driver upgrade's state: no upgrade runs without the policy (the admin's skip label stays).
        crd::driver_upgrade::STATE_LABEL,
    ] {
        plan.set(key, None);
    }
    for key in current
        .keys()
        .filter(|key| labels::written_by_feature_discovery(key))
    {
        plan.set(key, None);
    }
    for component in Component::ALL {
        let label = component.deploy_label();
        if current
            .get(label)
            .is_some_and(|value| value == labels::PAUSED_FOR_MIG_CHANGE)
        {
            plan.set(label, None);
        }
    }
    remove_deploy_labels(&mut plan);
    if current
        .get(labels::MIG_CONFIG)
        .is_some_and(|v| v == "all-disabled")
    {
        plan.set(labels::MIG_CONFIG, None);
    }
    plan.changes
}

/// Removes the deploy labels that hold the operator's own value.
fn remove_deploy_labels(plan: &mut Changes<'_>) {
    for component in Component::ALL {
        let label = component.deploy_label();
        if plan.current.get(label).is_some_and(|v| v == DEPLOY) {
            plan.set(label, None);
        }
    }
}

/// A node's label changes, planned one label at a time against its current labels. Only a label whose value
/// differs is copied into the changes: every reconcile plans every node, and nearly always nothing changes.
struct Changes<'a> {
    current: &'a BTreeMap<String, String>,
    changes: LabelChanges,
}

impl<'a> From<&'a BTreeMap<String, String>> for Changes<'a> {
    fn from(current: &'a BTreeMap<String, String>) -> Self {
        Self {
            current,
            changes: LabelChanges::new(),
        }
    }
}

impl Changes<'_> {
    /// `key` set to `value`, or removed for `None`, if that changes it.
    fn set(&mut self, key: &str, value: Option<&str>) {
        if self.current.get(key).map(String::as_str) != value {
            self.changes
                .insert(key.to_owned(), value.map(str::to_owned));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DefaultImages, validate};
    use crd::ClusterPolicySpec;

    fn policy(edit: impl FnOnce(&mut ClusterPolicySpec)) -> ValidatedPolicy {
        let mut spec = ClusterPolicySpec::default();
        edit(&mut spec);
        let images = DefaultImages(
            DefaultImages::VARIABLES
                .iter()
                .map(|v| (v.to_string(), format!("x/{v}:1")))
                .collect(),
        );
        validate(&spec, &images).expect("valid spec")
    }

    fn node(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn set<'a>(changes: &'a LabelChanges, key: &str) -> Option<Option<&'a str>> {
        changes.get(key).map(|v| v.as_deref())
    }

    const GPU: (&str, &str) = (labels::NFD_PCI_NVIDIA, "true");

    #[test]
    fn gpu_node_gets_presence_and_deploy_labels_of_enabled_components() {
        let changes = plan_node(&policy(|_| {}), &node(&[GPU]), ContainerRuntime::Containerd);
        assert_eq!(set(&changes, labels::GPU_PRESENT), Some(Some("true")));
        assert_eq!(
            set(&changes, "nvidia.com/gpu.deploy.device-plugin"),
            Some(Some("true"))
        );
        assert_eq!(
            set(&changes, "nvidia.com/gpu.deploy.dcgm-exporter"),
            Some(Some("true"))
        );
        assert_eq!(set(&changes, RUNTIME_LABEL), Some(Some("containerd")));
        assert_eq!(
            set(&changes, "nvidia.com/gpu.deploy.node-status-exporter"),
            Some(Some("true")),
            "off by default, and labelled as NVIDIA's operator labels it"
        );
        assert_eq!(
            set(&changes, "nvidia.com/gpu.deploy.watchdog"),
            None,
            "ours, off by default: not labelled"
        );
        assert_eq!(
            set(&changes, "nvidia.com/gpu.deploy.mig-manager"),
            None,
            "not MIG-capable (yet)"
        );
        assert_eq!(set(&changes, labels::MIG_CONFIG), None);
    }

    #[test]
    fn admin_values_are_never_overwritten_and_unchanged_nodes_get_no_patch() {
        let current = node(&[
            GPU,
            ("nvidia.com/gpu.deploy.device-plugin", "false"),
            (
                "nvidia.com/gpu.deploy.dcgm-exporter",
                "paused-for-mig-change",
            ),
        ]);
        let changes = plan_node(&policy(|_| {}), &current, ContainerRuntime::Containerd);
        assert_eq!(set(&changes, "nvidia.com/gpu.deploy.device-plugin"), None);
        assert_eq!(set(&changes, "nvidia.com/gpu.deploy.dcgm-exporter"), None);
        let mut applied = current.clone();
        for (key, value) in changes {
            match value {
                Some(value) => applied.insert(key, value),
                None => applied.remove(&key),
            };
        }
        assert!(
            plan_node(&policy(|_| {}), &applied, ContainerRuntime::Containerd).is_empty(),
            "second pass is a no-op"
        );
    }

    #[test]
    fn operands_false_and_disabled_components_remove_only_our_labels() {
        let current = node(&[
            GPU,
            (labels::DEPLOY_OPERANDS, "false"),
            ("nvidia.com/gpu.deploy.device-plugin", "true"),
            ("nvidia.com/gpu.deploy.driver", "false"),
        ]);
        let changes = plan_node(&policy(|_| {}), &current, ContainerRuntime::Containerd);
        assert_eq!(
            set(&changes, "nvidia.com/gpu.deploy.device-plugin"),
            Some(None)
        );
        assert_eq!(
            set(&changes, "nvidia.com/gpu.deploy.driver"),
            None,
            "admin's false stays"
        );
        // A disabled operand of NVIDIA's keeps its label, as under NVIDIA's operator; one of ours loses it.
        let current = node(&[
            GPU,
            ("nvidia.com/gpu.deploy.dcgm-exporter", "true"),
            ("nvidia.com/gpu.deploy.watchdog", "true"),
        ]);
        let changes = plan_node(
            &policy(|s| s.dcgm_exporter.enabled = Some(false)),
            &current,
            ContainerRuntime::Containerd,
        );
        assert_eq!(set(&changes, "nvidia.com/gpu.deploy.dcgm-exporter"), None);
        assert_eq!(set(&changes, "nvidia.com/gpu.deploy.watchdog"), Some(None));
    }

    #[test]
    fn mig_capable_nodes_get_the_mig_manager_and_the_default_geometry() {
        let changes = plan_node(
            &policy(|_| {}),
            &node(&[GPU, (MIG_CAPABLE, "true")]),
            ContainerRuntime::Containerd,
        );
        assert_eq!(
            set(&changes, "nvidia.com/gpu.deploy.mig-manager"),
            Some(Some("true"))
        );
        assert_eq!(
            set(&changes, labels::MIG_CONFIG),
            Some(Some("all-disabled"))
        );
        let chosen = node(&[
            GPU,
            (MIG_CAPABLE, "true"),
            (labels::MIG_CONFIG, "all-1g.10gb"),
        ]);
        assert_eq!(
            set(
                &plan_node(&policy(|_| {}), &chosen, ContainerRuntime::Containerd),
                labels::MIG_CONFIG
            ),
            None
        );
    }

    #[test]
    fn nodes_without_gpus_are_left_alone_unless_they_had_ours() {
        assert!(plan_node(&policy(|_| {}), &node(&[]), ContainerRuntime::Containerd).is_empty());
        let former = node(&[
            (labels::GPU_PRESENT, "true"),
            ("nvidia.com/gpu.deploy.driver", "true"),
        ]);
        let changes = plan_node(&policy(|_| {}), &former, ContainerRuntime::Containerd);
        assert_eq!(set(&changes, labels::GPU_PRESENT), Some(Some("false")));
        assert_eq!(set(&changes, "nvidia.com/gpu.deploy.driver"), Some(None));
    }

    #[test]
    fn the_driver_owner_label_names_the_object_and_goes_with_it() {
        let owner = labels::DRIVER_OWNER;
        let unowned = node(&[GPU]);
        assert_eq!(
            set(&plan_driver_owner(&unowned, Some("a100")), owner),
            Some(Some("a100"))
        );
        assert!(plan_driver_owner(&unowned, None).is_empty());
        let owned = node(&[GPU, (owner, "a100")]);
        assert!(plan_driver_owner(&owned, Some("a100")).is_empty());
        assert_eq!(
            set(&plan_driver_owner(&owned, Some("default")), owner),
            Some(Some("default"))
        );
        assert_eq!(set(&plan_driver_owner(&owned, None), owner), Some(None));
        assert_eq!(set(&plan_cleanup(&owned), owner), Some(None));
    }

    #[test]
    fn cleanup_removes_what_the_operator_wrote() {
        let current = node(&[
            GPU,
            (labels::GPU_PRESENT, "true"),
            ("nvidia.com/gpu.deploy.driver", "true"),
            ("nvidia.com/gpu.deploy.device-plugin", "false"),
            (labels::MIG_CONFIG, "all-disabled"),
            (RUNTIME_LABEL, "containerd"),
            (
                "nvidia.com/gpu.deploy.dcgm-exporter",
                labels::PAUSED_FOR_MIG_CHANGE,
            ),
            (labels::MIG_CONFIG_STATE, "success"),
            (labels::GPU_PRODUCT, "NVIDIA-A100-SXM4-40GB"),
            ("nvidia.com/mig-1g.5gb.count", "7"),
            ("nvidia.com/gpu.clique", "admin-set"),
            (crd::driver_upgrade::STATE_LABEL, "upgrade-done"),
            (crd::driver_upgrade::SKIP_LABEL, "true"),
        ]);
        let changes = plan_cleanup(&current);
        assert_eq!(set(&changes, crd::driver_upgrade::STATE_LABEL), Some(None));
        assert_eq!(set(&changes, crd::driver_upgrade::SKIP_LABEL), None);
        assert_eq!(
            set(&changes, "nvidia.com/gpu.deploy.dcgm-exporter"),
            Some(None)
        );
        assert_eq!(set(&changes, labels::MIG_CONFIG_STATE), Some(None));
        assert_eq!(set(&changes, labels::GPU_PRODUCT), Some(None));
        assert_eq!(set(&changes, "nvidia.com/mig-1g.5gb.count"), Some(None));
        assert_eq!(set(&changes, "nvidia.com/gpu.clique"), None);
        assert_eq!(set(&changes, labels::GPU_PRESENT), Some(None));
        assert_eq!(set(&changes, "nvidia.com/gpu.deploy.driver"), Some(None));
        assert_eq!(set(&changes, "nvidia.com/gpu.deploy.device-plugin"), None);
        assert_eq!(set(&changes, labels::MIG_CONFIG), Some(None));
        assert_eq!(set(&changes, RUNTIME_LABEL), Some(None));
    }

    /// The affinity and the label plan are one rule: on every combination of the labels either reads, once the plan
    /// is written a pod is placed exactly where the deploy label is `true`, and on a node the operator has not
    /// labelled yet, exactly where it will be. (An empty deploy label is left out: the plan writes `true` over it,
    /// and the pod waits for that write.)
    #[test]
    fn deploy_affinity_places_pods_where_the_written_plan_deploys() {
        let policy = policy(|_| {});
        let mut checked = 0;
        for component in Component::ALL
            .into_iter()
            .filter(|c| policy.is_enabled(*c) || labelled_by_nvidia_whatever_runs(*c))
        {
            let label = component.deploy_label();
            let pod = k8s_openapi::api::core::v1::PodSpec {
                affinity: Some(k8s_openapi::api::core::v1::Affinity {
                    node_affinity: Some(k8s_openapi::api::core::v1::NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(
                            k8s_openapi::api::core::v1::NodeSelector {
                                node_selector_terms: deploy_terms(component),
                            },
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            // Each label either reads, with the values that matter to it (absent, or a value).
            let dimensions: [Vec<Option<(&str, &str)>>; 5] = [
                [
                    None,
                    Some("true"),
                    Some("false"),
                    Some(labels::PAUSED_FOR_MIG_CHANGE),
                ]
                .map(|value| value.map(|value| (label, value)))
                .into(),
                vec![
                    None,
                    Some((labels::NFD_PCI_NVIDIA, "true")),
                    Some((labels::NFD_PCI_NVIDIA_3D, "true")),
                    Some((labels::NFD_PCI_NVIDIA_VGA, "true")),
                    Some((labels::NFD_PCI_NVIDIA, "false")),
                ],
                vec![
                    None,
                    Some((labels::DEPLOY_OPERANDS, "false")),
                    Some((labels::DEPLOY_OPERANDS, "true")),
                ],
                vec![
                    None,
                    Some((MIG_CAPABLE, "true")),
                    Some((MIG_CAPABLE, "false")),
                ],
                vec![None, Some((labels::GPU_PRESENT, "true"))],
            ];
            let every_node = dimensions
                .iter()
                .fold(vec![BTreeMap::new()], |nodes, values| {
                    nodes
                        .iter()
                        .flat_map(|node| {
                            values.iter().map(move |value| {
                                let mut node: BTreeMap<String, String> = node.clone();
                                if let Some((key, value)) = value {
                                    node.insert((*key).to_owned(), (*value).to_owned());
                                }
                                node
                            })
                        })
                        .collect()
                });
            let places = |labels: &BTreeMap<String, String>| {
                crate::model::placement::places_on(&pod, "node", labels)
            };
            for labels in every_node {
                let mut written = labels.clone();
                for (key, value) in plan_node(&policy, &labels, ContainerRuntime::Containerd) {
                    match value {
                        Some(value) => written.insert(key, value),
                        None => written.remove(&key),
                    };
                }
                let deployed = written.get(label).is_some_and(|v| v == DEPLOY);
                assert_eq!(places(&written), deployed, "{component:?} on {written:?}");
                if !labels.contains_key(label) {
                    assert_eq!(
                        places(&labels),
                        deployed,
                        "{component:?} before the write, on {labels:?}"
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 1000, "{checked} cases");
    }
}

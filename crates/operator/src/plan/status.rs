//! status: the ClusterPolicy status as a pure function of what was rendered and what the cluster reports.
//! A component is ready only when every one of its DaemonSets has rolled out the current template and is
//! available on exactly the nodes the operator's labels select for it — not merely when its pods that exist
//! are up (the reference operator reports Ready while a component is missing).

use std::collections::BTreeMap;
use std::sync::Arc;

use crd::GPUNode;
use crd::cluster_policy::{ClusterPolicyStatus, ComponentStatus, PolicyState};
use crd::gpu_node::MigState;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::model::{Component, ValidatedPolicy};
use crate::plan::configs::ConfigFindings;

/// What the status is computed from.
#[derive(Debug)]
pub struct Observed<'a> {
    pub policy: &'a ValidatedPolicy,
    pub generation: Option<i64>,
    pub namespace: &'a str,
    pub gpu_node_count: usize,
    /// For each enabled component: the names of the DaemonSets rendered for it.
    pub rendered: BTreeMap<Component, Vec<String>>,
    /// For each enabled component: on how many nodes its deploy label is `true` after labelling.
    pub expected_nodes: BTreeMap<Component, usize>,
    /// The DaemonSets that exist, by name.
    pub daemonsets: BTreeMap<String, &'a DaemonSet>,
    pub gpu_nodes: &'a [Arc<GPUNode>],
    /// Fields of the stored spec that the schema does not define (kept, but ignored).
    pub unknown_fields: &'a [String],
    /// What the checks of the ConfigMaps the policy names found, by the component that reads them.
    pub configs: ConfigFindings,
}

/// Condition types and reasons, spelled as NVIDIA's operator spells them.
pub mod reason {
    pub const READY: &str = "Ready";
    pub const ERROR: &str = "Error";
    pub const UNSUPPORTED: &str = "Unsupported";
    pub const UNKNOWN_FIELDS: &str = "UnknownFields";
    pub const WARNINGS: &str = "Warnings";
    pub const TOLERATED_AS_NVIDIA_DOES: &str = "ToleratedAsNvidiaDoes";
    pub const FIELDS_IGNORED: &str = "FieldsIgnored";
    pub const RECONCILED: &str = "Reconciled";
    pub const RECONCILE_FAILED: &str = "ReconcileFailed";
    pub const NO_GPU_NODES: &str = "NoGPUNodes";
    pub const OPERAND_NOT_READY: &str = "OperandNotReady";
    pub const SECTIONS_NOT_IMPLEMENTED: &str = "SectionsNotImplemented";
    pub const ACTIVE_POLICY: &str = "AnotherPolicyIsActive";
}

/// The status of the active policy after a successful apply.
pub fn compute(observed: &Observed<'_>, previous: &[Condition], now: &Time) -> ClusterPolicyStatus {
    let components: Vec<ComponentStatus> = Component::ALL
        .iter()
        .map(|c| component_status(*c, observed))
        .collect();
    let enabled: Vec<&ComponentStatus> = components.iter().filter(|c| c.enabled).collect();
    let ready_count = enabled.iter().filter(|c| c.state == "ready").count();
    let (ready, reason, message) = if observed.gpu_node_count == 0 {
        (false, reason::NO_GPU_NODES, "no node has an NVIDIA GPU (label feature.node.kubernetes.io/pci-10de.present=true, set by Node Feature Discovery)".to_string())
    } else if ready_count < enabled.len() {
        let waiting: Vec<String> = enabled
            .iter()
            .filter(|c| c.state != "ready")
            .map(|c| {
                format!(
                    "{}: {}",
                    c.name,
                    c.message.as_deref().unwrap_or("not ready")
                )
            })
            .collect();
        (false, reason::OPERAND_NOT_READY, waiting.join("; "))
    } else {
        (
            true,
            reason::RECONCILED,
            format!(
                "all {} enabled components are ready on {} GPU nodes",
                enabled.len(),
                observed.gpu_node_count
            ),
        )
    };
    let mut conditions = vec![
        condition(
            previous,
            reason::READY,
            ready,
            reason,
            &message,
            observed.generation,
            now,
        ),
        condition(
            previous,
            reason::ERROR,
            false,
            reason::RECONCILED,
            "",
            observed.generation,
            now,
        ),
    ];
    conditions.extend(unsupported_condition(
        observed.policy,
        previous,
        observed.generation,
        now,
    ));
    if !observed.policy.warnings.is_empty() {
        conditions.push(condition(
            previous,
            reason::WARNINGS,
            true,
            reason::TOLERATED_AS_NVIDIA_DOES,
            &observed.policy.warnings.join("; "),
            observed.generation,
            now,
        ));
    }
    if !observed.unknown_fields.is_empty() {
        let message = format!(
            "{} {} not defined by this operator's ClusterPolicy schema: kept as written but ignored (a typo, or a field of a newer NVIDIA release)",
            observed.unknown_fields.join(", "),
            if observed.unknown_fields.len() == 1 {
                "is"
            } else {
                "are"
            },
        );
        conditions.push(condition(
            previous,
            reason::UNKNOWN_FIELDS,
            true,
            reason::FIELDS_IGNORED,
            &message,
            observed.generation,
            now,
        ));
    }
    ClusterPolicyStatus {
        state: Some(if ready {
            PolicyState::Ready
        } else {
            PolicyState::NotReady
        }),
        namespace: Some(observed.namespace.into()),
        conditions,
        ready: Some(format!("{ready_count}/{}", enabled.len())),
        gpu_nodes: Some(observed.gpu_node_count as i32),
        observed_generation: observed.generation,
        components,
        // The upgrade controller's, under its own field manager.
        driver_upgrade: None,
    }
}

/// The status when the policy could not be reconciled: what was known before stays, the error is named.
pub fn failed(
    previous: &ClusterPolicyStatus,
    error: &str,
    generation: Option<i64>,
    now: &Time,
) -> ClusterPolicyStatus {
    let mut status = previous.clone();
    status.state = Some(PolicyState::NotReady);
    status.observed_generation = generation;
    let kept: Vec<Condition> = previous
        .conditions
        .iter()
        .filter(|c| {
            [
                reason::UNSUPPORTED,
                reason::UNKNOWN_FIELDS,
                reason::WARNINGS,
            ]
            .contains(&c.type_.as_str())
        })
        .cloned()
        .collect();
    status.conditions = vec![
        condition(
            &previous.conditions,
            reason::READY,
            false,
            reason::RECONCILE_FAILED,
            error,
            generation,
            now,
        ),
        condition(
            &previous.conditions,
            reason::ERROR,
            true,
            reason::RECONCILE_FAILED,
            error,
            generation,
            now,
        ),
    ];
    status.conditions.extend(kept);
    status
}

/// The status of a policy that is not the active one.
pub fn ignored(
    active: &str,
    previous: &[Condition],
    generation: Option<i64>,
    now: &Time,
) -> ClusterPolicyStatus {
    let message = format!(
        "ClusterPolicy {active} is the active one (the oldest); this one is ignored. Delete it, or delete {active} to make this one active"
    );
    ClusterPolicyStatus {
        state: Some(PolicyState::Ignored),
        conditions: vec![condition(
            previous,
            reason::READY,
            false,
            reason::ACTIVE_POLICY,
            &message,
            generation,
            now,
        )],
        observed_generation: generation,
        ..ClusterPolicyStatus::default()
    }
}

fn component_status(component: Component, observed: &Observed<'_>) -> ComponentStatus {
    let name = component.label_name().to_string();
    if !observed.policy.is_enabled(component) {
        return ComponentStatus {
            name,
            enabled: false,
            state: "disabled".into(),
            ..ComponentStatus::default()
        };
    }
    let expected = observed
        .expected_nodes
        .get(&component)
        .copied()
        .unwrap_or(0);
    let mut desired = 0;
    let mut ready = 0;
    let mut problems = Vec::new();
    for ds_name in observed.rendered.get(&component).into_iter().flatten() {
        let progress = rollout(ds_name, observed.daemonsets.get(ds_name).copied());
        desired += progress.desired;
        ready += progress.ready;
        problems.extend(progress.problem);
    }
    if problems.is_empty() && desired as usize != expected {
        problems.push(format!(
            "scheduled on {desired} nodes, {expected} labelled for it"
        ));
    }
    if component == Component::MigManager {
        problems.extend(mig_problems(observed.gpu_nodes));
    }
    problems.extend(
        observed
            .configs
            .problems
            .get(&component)
            .cloned()
            .unwrap_or_default(),
    );
    ComponentStatus {
        name,
        enabled: true,
        desired_nodes: expected as i32,
        ready_nodes: ready,
        state: if problems.is_empty() {
            "ready"
        } else {
            "notReady"
        }
        .into(),
        message: (!problems.is_empty()).then(|| problems.join("; ")),
        warnings: [
            &observed.policy.component_warnings,
            &observed.configs.warnings,
        ]
        .into_iter()
        .filter_map(|warnings| warnings.get(&component))
        .flatten()
        .cloned()
        .collect(),
    }
}

/// How far one rendered DaemonSet has rolled out.
pub(crate) struct Rollout {
    /// Nodes it should run on, as the DaemonSet controller counts them.
    pub desired: i32,
    /// Nodes where the current template's pod is available.
    pub ready: i32,
    /// What is missing, when anything is.
    pub problem: Option<String>,
}

/// The rollout of the DaemonSet `name` (`None`: it does not exist yet). Done only when the DaemonSet controller
/// has seen the latest template and every desired pod is updated and available.
pub(crate) fn rollout(name: &str, daemonset: Option<&DaemonSet>) -> Rollout {
    let Some(ds) = daemonset else {
        return Rollout {
            desired: 0,
            ready: 0,
            problem: Some(format!("DaemonSet {name} does not exist yet")),
        };
    };
    let status = ds.status.clone().unwrap_or_default();
    let current_generation =
        status.observed_generation.unwrap_or(0) >= ds.metadata.generation.unwrap_or(0);
    let updated = status.updated_number_scheduled.unwrap_or(0);
    let available = status.number_available.unwrap_or(0);
    let problem = if !current_generation {
        Some(format!(
            "{name}: the DaemonSet controller has not seen the latest template yet"
        ))
    } else if updated < status.desired_number_scheduled
        || available < status.desired_number_scheduled
    {
        Some(format!(
            "{name}: {available} of {} nodes available, {updated} updated",
            status.desired_number_scheduled
        ))
    } else {
        None
    };
    Rollout {
        desired: status.desired_number_scheduled,
        ready: available.min(updated),
        problem,
    }
}

/// MIG changes in progress or failed, from the nodes' GPUNode status.
fn mig_problems(gpu_nodes: &[Arc<GPUNode>]) -> Vec<String> {
    let state_of = |node: &GPUNode| {
        node.status
            .as_ref()
            .and_then(|s| s.mig.as_ref())
            .and_then(|m| m.state)
    };
    let names_in = |state: MigState| -> Vec<String> {
        gpu_nodes
            .iter()
            .filter(|node| state_of(node) == Some(state))
            .map(|node| {
                let error = node
                    .status
                    .as_ref()
                    .and_then(|s| s.last_error.as_ref())
                    .map(|e| format!(" ({})", e.message));
                format!(
                    "{}{}",
                    node.metadata.name.clone().unwrap_or_default(),
                    error.unwrap_or_default()
                )
            })
            .collect()
    };
    let mut problems = Vec::new();
    for state in [MigState::Pending, MigState::Rebooting, MigState::Failed] {
        let names = names_in(state);
        if !names.is_empty() {
            problems.push(format!(
                "MIG config {state} on {} node(s): {}",
                names.len(),
                names.join(", ")
            ));
        }
    }
    problems
}

fn unsupported_condition(
    policy: &ValidatedPolicy,
    previous: &[Condition],
    generation: Option<i64>,
    now: &Time,
) -> Option<Condition> {
    (!policy.unsupported.is_empty()).then(|| {
        let message = format!(
            "spec.{} enabled, but this operator does not implement {}; nothing is deployed for {}",
            policy.unsupported.join(", spec."),
            if policy.unsupported.len() == 1 {
                "it"
            } else {
                "them"
            },
            if policy.unsupported.len() == 1 {
                "it"
            } else {
                "them"
            },
        );
        condition(
            previous,
            reason::UNSUPPORTED,
            true,
            reason::SECTIONS_NOT_IMPLEMENTED,
            &message,
            generation,
            now,
        )
    })
}

/// A condition that keeps its previous transition time when its status did not change.
pub(crate) fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DefaultImages, validate};
    use crd::ClusterPolicySpec;
    use crd::gpu_node::{GpuNodeSpec, GpuNodeStatus, MigStatus, NodeError};
    use k8s_openapi::api::apps::v1::DaemonSetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::Timestamp;

    fn policy() -> ValidatedPolicy {
        let enabled = || {
            Some(crd::cluster_policy::UnsupportedSection {
                enabled: Some(true),
                ..Default::default()
            })
        };
        // vGPU is deployed only for sandbox workloads, in NVIDIA's operator too.
        let spec = ClusterPolicySpec {
            sandbox_workloads: enabled(),
            vgpu_manager: enabled(),
            ..ClusterPolicySpec::default()
        };
        let images = DefaultImages(
            DefaultImages::VARIABLES
                .iter()
                .map(|v| (v.to_string(), format!("x/{v}:1")))
                .collect(),
        );
        validate(&spec, &images).unwrap()
    }

    fn ds(name: &str, desired: i32, updated: i32, available: i32) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                generation: Some(2),
                ..ObjectMeta::default()
            },
            status: Some(DaemonSetStatus {
                desired_number_scheduled: desired,
                updated_number_scheduled: Some(updated),
                number_available: Some(available),
                observed_generation: Some(2),
                ..DaemonSetStatus::default()
            }),
            ..DaemonSet::default()
        }
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_800_000_000).unwrap())
    }

    fn observe<'a>(
        policy: &'a ValidatedPolicy,
        sets: &'a [DaemonSet],
        gpu_nodes: &'a [Arc<GPUNode>],
        nodes: usize,
    ) -> Observed<'a> {
        let mut rendered = BTreeMap::new();
        let mut expected = BTreeMap::new();
        for component in policy.enabled() {
            rendered.insert(component, vec![component.app_name().to_string()]);
            expected.insert(
                component,
                if component == Component::MigManager {
                    0
                } else {
                    nodes
                },
            );
        }
        Observed {
            policy,
            generation: Some(3),
            namespace: "gpu-operator",
            gpu_node_count: nodes,
            rendered,
            expected_nodes: expected,
            daemonsets: sets
                .iter()
                .map(|d| (d.metadata.name.clone().unwrap(), d))
                .collect(),
            gpu_nodes,
            unknown_fields: &[],
            configs: ConfigFindings::default(),
        }
    }

    fn all_ready(nodes: i32) -> Vec<DaemonSet> {
        policy()
            .enabled()
            .into_iter()
            .map(|c| {
                if c == Component::MigManager {
                    ds(c.app_name(), 0, 0, 0)
                } else {
                    ds(c.app_name(), nodes, nodes, nodes)
                }
            })
            .collect()
    }

    #[test]
    fn ready_only_when_every_enabled_component_is_rolled_out() {
        let policy = policy();
        let sets = all_ready(2);
        let status = compute(&observe(&policy, &sets, &[], 2), &[], &now());
        assert_eq!(status.state, Some(PolicyState::Ready));
        assert_eq!(status.ready.as_deref(), Some("8/8"));
        assert_eq!(status.gpu_nodes, Some(2));
        assert_eq!(status.conditions[0].reason, reason::RECONCILED);
        let unsupported = status
            .conditions
            .iter()
            .find(|c| c.type_ == reason::UNSUPPORTED)
            .expect("unsupported condition");
        assert!(
            unsupported.message.contains("spec.vgpuManager enabled"),
            "{}",
            unsupported.message
        );
    }

    /// A ConfigMap warning (an invalid named MIG config among valid ones) is listed on its component, which
    /// stays ready; a ConfigMap problem makes it not ready.
    #[test]
    fn config_warnings_keep_the_component_ready_and_problems_do_not() {
        let policy = policy();
        let sets = all_ready(2);
        let mut observed = observe(&policy, &sets, &[], 2);
        observed.configs.warnings.insert(
            Component::MigManager,
            vec!["MIG config x cannot be applied".into()],
        );
        let status = compute(&observed, &[], &now());
        let mig = |status: &ClusterPolicyStatus| {
            status
                .components
                .iter()
                .find(|c| c.name == "mig-manager")
                .cloned()
                .unwrap()
        };
        assert_eq!(mig(&status).state, "ready");
        assert_eq!(mig(&status).warnings, ["MIG config x cannot be applied"]);
        assert_eq!(status.state, Some(PolicyState::Ready));

        observed
            .configs
            .problems
            .insert(Component::MigManager, vec!["ConfigMap gone".into()]);
        let status = compute(&observed, &[], &now());
        assert_eq!(mig(&status).state, "notReady");
        assert_eq!(mig(&status).message.as_deref(), Some("ConfigMap gone"));
    }

    #[test]
    fn a_missing_or_partial_component_is_named() {
        let policy = policy();
        let mut sets = all_ready(2);
        sets.retain(|d| d.metadata.name.as_deref() != Some("nvidia-dcgm-exporter"));
        sets.iter_mut()
            .find(|d| d.metadata.name.as_deref() == Some("nvidia-device-plugin-daemonset"))
            .unwrap()
            .status = ds("x", 2, 1, 1).status;
        let status = compute(&observe(&policy, &sets, &[], 2), &[], &now());
        assert_eq!(status.state, Some(PolicyState::NotReady));
        assert_eq!(status.ready.as_deref(), Some("6/8"));
        let message = &status.conditions[0].message;
        assert!(
            message.contains(
                "device-plugin: nvidia-device-plugin-daemonset: 1 of 2 nodes available, 1 updated"
            ),
            "{message}"
        );
        assert!(
            message.contains("dcgm-exporter: DaemonSet nvidia-dcgm-exporter does not exist yet"),
            "{message}"
        );
    }

    #[test]
    fn a_daemonset_that_has_not_reached_all_labelled_nodes_is_not_ready() {
        let policy = policy();
        let sets = all_ready(1);
        let status = compute(&observe(&policy, &sets, &[], 2), &[], &now());
        let plugin = status
            .components
            .iter()
            .find(|c| c.name == "device-plugin")
            .unwrap();
        assert_eq!(plugin.state, "notReady");
        assert_eq!(
            plugin.message.as_deref(),
            Some("scheduled on 1 nodes, 2 labelled for it")
        );
    }

    #[test]
    fn no_gpu_nodes_and_failed_mig_are_reported() {
        let policy = policy();
        let status = compute(&observe(&policy, &all_ready(0), &[], 0), &[], &now());
        assert_eq!(status.conditions[0].reason, reason::NO_GPU_NODES);
        let failed = GPUNode {
            metadata: ObjectMeta {
                name: Some("gpu-1".into()),
                ..ObjectMeta::default()
            },
            spec: GpuNodeSpec {},
            status: Some(GpuNodeStatus {
                mig: Some(MigStatus {
                    state: Some(MigState::Failed),
                    ..MigStatus::default()
                }),
                last_error: Some(NodeError {
                    component: "mig-manager".into(),
                    message: "3g.20gb x3 does not fit".into(),
                    time: None,
                }),
                ..GpuNodeStatus::default()
            }),
        };
        let nodes = [Arc::new(failed)];
        let status = compute(&observe(&policy, &all_ready(1), &nodes, 1), &[], &now());
        let mig = status
            .components
            .iter()
            .find(|c| c.name == "mig-manager")
            .unwrap();
        assert_eq!(
            mig.message.as_deref(),
            Some("MIG config failed on 1 node(s): gpu-1 (3g.20gb x3 does not fit)")
        );
    }

    #[test]
    fn transition_times_survive_unchanged_conditions() {
        let policy = policy();
        let sets = all_ready(1);
        let first = compute(&observe(&policy, &sets, &[], 1), &[], &now());
        let later = Time(Timestamp::from_second(1_900_000_000).unwrap());
        let second = compute(&observe(&policy, &sets, &[], 1), &first.conditions, &later);
        assert_eq!(
            first.conditions[0].last_transition_time,
            second.conditions[0].last_transition_time
        );
        let failed = failed(&second, "boom", Some(4), &later);
        assert_eq!(failed.conditions[0].last_transition_time, later);
        assert_eq!(failed.conditions[1].status, "True");
    }

    #[test]
    fn unknown_fields_get_a_condition_naming_them() {
        let policy = policy();
        let sets = all_ready(1);
        let unknown = ["spec.devicePlugin.confg".to_string()];
        let observed = Observed {
            unknown_fields: &unknown,
            ..observe(&policy, &sets, &[], 1)
        };
        let status = compute(&observed, &[], &now());
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == reason::UNKNOWN_FIELDS)
            .expect("condition");
        assert!(
            condition
                .message
                .starts_with("spec.devicePlugin.confg is not defined"),
            "{}",
            condition.message
        );
        assert_eq!(
            status.state,
            Some(PolicyState::Ready),
            "unknown fields do not block readiness"
        );
    }

    #[test]
    fn ignored_policies_name_the_active_one() {
        let status = ignored("cluster-policy", &[], Some(1), &now());
        assert_eq!(status.state, Some(PolicyState::Ignored));
        assert!(
            status.conditions[0]
                .message
                .contains("ClusterPolicy cluster-policy is the active one")
        );
    }

    #[test]
    fn tolerated_settings_and_replaced_images_are_reported() {
        let spec: ClusterPolicySpec = serde_json::from_value(serde_json::json!({
            "devicePlugin": {"repository": "nvcr.io/nvidia", "image": "k8s-device-plugin", "version": "v0.20.0",
                             "config": {"default": "any"}},
        }))
        .unwrap();
        let images = DefaultImages(
            DefaultImages::VARIABLES
                .iter()
                .map(|v| (v.to_string(), format!("x/{v}:1")))
                .collect(),
        );
        let policy = validate(&spec, &images).unwrap();
        let sets = all_ready(2);
        let status = compute(&observe(&policy, &sets, &[], 2), &[], &now());
        // Warnings do not hold readiness back.
        assert_eq!(status.state, Some(PolicyState::Ready));
        let warnings = status
            .conditions
            .iter()
            .find(|c| c.type_ == reason::WARNINGS)
            .expect("warnings condition");
        assert_eq!(warnings.status, "True");
        assert!(
            warnings
                .message
                .starts_with("spec.devicePlugin.config.default is \"any\" but spec.devicePlugin.config.name is empty"),
            "{}",
            warnings.message
        );
        let plugin = status
            .components
            .iter()
            .find(|c| c.name == "device-plugin")
            .unwrap();
        assert_eq!(plugin.state, "ready");
        assert_eq!(
            plugin.warnings,
            [
                "spec.devicePlugin names NVIDIA's image nvcr.io/nvidia/k8s-device-plugin:v0.20.0; this operator runs its own device-plugin image x/DEVICE_PLUGIN_IMAGE:1 instead (clear spec.devicePlugin.repository, image and version, or name one of this operator's images)"
            ]
        );
        // A failed reconcile keeps the warnings in sight.
        let failed = failed(&status, "boom", Some(3), &now());
        assert!(
            failed
                .conditions
                .iter()
                .any(|c| c.type_ == reason::WARNINGS)
        );
    }
}

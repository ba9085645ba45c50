//! The upgrade's state where users look: Events, each GPUNode's `status.driverUpgrade`, the ClusterPolicy's
//! `status.driverUpgrade`, and the metrics.

use crd::driver_upgrade::{
    ClusterUpgradeStatus, FIELD_MANAGER, NodeFailure, NodeUpgradeStatus, UpgradeState,
};
use crd::{ClusterPolicy, GPUNode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::{info, warn};

use super::controller::{Context, UpgradeError};
use super::decide::{self, NodeFacts};
use crate::controller::publish_event;

pub(super) async fn publish(
    context: &Context,
    object: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    publish_event(
        &context.recorder,
        object,
        "DriverUpgrade",
        type_,
        reason,
        note,
    )
    .await;
}

/// The upgrade's state where users look: each GPUNode's `status.driverUpgrade`, the ClusterPolicy's
/// `status.driverUpgrade`, and the metrics. Each written only when it changed.
pub(super) async fn report(
    policy: &ClusterPolicy,
    auto_upgrade: bool,
    facts: &[NodeFacts],
    plan: &decide::Plan,
    context: &Context,
) -> Result<(), UpgradeError> {
    let summary = &plan.summary;
    context.metrics.record_upgrades(auto_upgrade, summary);
    let gpu_nodes = Api::<GPUNode>::all(context.client.clone());
    for node in facts {
        let Some(stored) = context.gpu_nodes.get(&ObjectRef::new(&node.name)) else {
            continue;
        };
        let step = plan.steps.iter().find(|s| s.node == node.name);
        let transition = step.and_then(|s| s.transition.as_ref());
        let state = transition.map_or(node.state(), |t| t.to);
        let current = stored
            .status
            .as_ref()
            .and_then(|s| s.driver_upgrade.clone());
        // What the pass found to say, else what was said before: a node at rest keeps its last reason.
        let reason = match state {
            Some(UpgradeState::UpgradeFailed) => transition
                .map(|t| t.reason.clone())
                .or_else(|| node.reason.clone()),
            _ => step
                .and_then(|s| s.waiting.clone())
                .or_else(|| transition.map(|t| t.reason.clone()))
                .or_else(|| current.as_ref().and_then(|c| c.reason.clone())),
        };
        let since = if transition.is_some_and(|t| t.from != t.to) {
            Some(Timestamp::now())
        } else {
            node.since
        };
        let status = state.map(|state| NodeUpgradeStatus {
            state: Some(state),
            reason,
            since: since.map(Time),
        });
        if current.as_ref().map(|c| (c.state, &c.reason))
            == status.as_ref().map(|s| (s.state, &s.reason))
        {
            continue;
        }
        let patch = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNode", "status": {"driverUpgrade": status}});
        if let Err(error) = gpu_nodes
            .patch_status(
                &node.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            // The node's label and the ClusterPolicy status still say it; the next change writes it again.
            warn!(%error, node = %node.name, "writing the GPUNode's driver upgrade status failed");
        }
    }
    let status = ClusterUpgradeStatus {
        auto_upgrade,
        in_progress: count(summary.in_progress),
        done: count(summary.done),
        failed: count(summary.failed),
        pending: count(summary.pending),
        skipped: count(summary.skipped),
        failures: summary
            .failures
            .iter()
            .map(|(node, reason)| NodeFailure {
                node: node.clone(),
                reason: reason.clone(),
            })
            .collect(),
    };
    let current = policy
        .status
        .as_ref()
        .and_then(|s| s.driver_upgrade.as_ref());
    let nothing_to_say = !auto_upgrade && facts.iter().all(|n| n.label.is_none());
    let wanted = (!nothing_to_say).then_some(&status);
    if current == wanted {
        return Ok(());
    }
    if summary.in_progress + summary.pending > 0 {
        info!(
            in_progress = summary.in_progress,
            pending = summary.pending,
            done = summary.done,
            failed = summary.failed,
            "driver upgrade progress"
        );
    }
    let patch = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "status": {"driverUpgrade": wanted}});
    Api::<ClusterPolicy>::all(context.client.clone())
        .patch_status(
            &policy.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(UpgradeError::Status)?;
    Ok(())
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

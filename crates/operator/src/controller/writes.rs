//! The controller's writes besides apply: node labels, the ClusterPolicy status, Events. Each writes only when
//! something changed.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use crd::ClusterPolicy;
use crd::cluster_policy::{ClusterPolicyStatus, PolicyState};
use crd::node_patch::MetadataPatch;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::info;

use super::nvidia_drivers::DriverObjects;
use super::{Context, ReconcileError, publish_event};
use crate::crd_install::FIELD_MANAGER;
use crate::model::{ContainerRuntime, ValidatedPolicy};
use crate::plan::labels::{LabelChanges, plan_driver_owner, plan_node};

/// How many node label patches are in flight at once: one at a time, 1000 nodes took 10 s before the first
/// DaemonSet was applied; the API server takes these small patches in parallel.
const LABEL_PATCHES_IN_FLIGHT: usize = 32;

/// A node's name, its labels as planned from, and the changes planned.
type Planned<'a> = (&'a str, Cow<'a, BTreeMap<String, String>>, LabelChanges);

/// Applies the label plan to every node that needs a change; returns every node's labels after it, in the order
/// of `nodes`, borrowed from the cache where the plan changed nothing (each reconcile reads every node).
pub(super) async fn label_nodes<'a>(
    policy: &ValidatedPolicy,
    nodes: &'a [Arc<Node>],
    default_runtime: ContainerRuntime,
    drivers: &DriverObjects,
    context: &Context,
) -> Result<Vec<Cow<'a, BTreeMap<String, String>>>, ReconcileError> {
    let api = Api::<Node>::all(context.client.clone());
    let in_flight = &context.labels_in_flight;
    let name = |node: &'a Node| node.meta().name.as_deref().unwrap_or_default();
    in_flight.retain(&nodes.iter().map(|node| name(node)).collect());
    let planned: Vec<Planned<'a>> = nodes
        .iter()
        .map(|node| {
            let labels = in_flight.labels(
                name(node),
                node.meta().resource_version.as_deref(),
                node.labels(),
            );
            let runtime = node
                .status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .and_then(|i| {
                    ContainerRuntime::detect(&i.container_runtime_version, &i.kubelet_version)
                })
                .unwrap_or(default_runtime);
            let mut changes = plan_node(policy, &labels, runtime);
            let owner = drivers.owner(name(node), &labels);
            changes.extend(plan_driver_owner(&labels, owner.as_deref()));
            (name(node), labels, changes)
        })
        .collect();
    // Futures that own what they send, so that the controller's reconcile future stays `Send`.
    let patches: Vec<_> = planned
        .iter()
        .filter(|(_, _, changes)| !changes.is_empty())
        .map(|(name, _, changes)| {
            let (api, name, changes) = (api.clone(), (*name).to_owned(), changes.clone());
            async move { patch_labels(&api, &name, &changes).await }
        })
        .collect();
    futures::stream::iter(patches)
        .buffer_unordered(LABEL_PATCHES_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(planned
        .into_iter()
        .zip(nodes)
        .map(|((name, mut labels, changes), node)| {
            if !changes.is_empty() {
                apply_changes(labels.to_mut(), changes);
                in_flight.record(
                    name,
                    node.meta().resource_version.as_deref(),
                    labels.as_ref().clone(),
                );
            }
            labels
        })
        .collect())
}

pub(super) async fn patch_labels(
    api: &Api<Node>,
    node: &str,
    changes: &LabelChanges,
) -> Result<(), ReconcileError> {
    if changes.is_empty() {
        return Ok(());
    }
    let patch = MetadataPatch {
        labels: changes.clone(),
        ..MetadataPatch::default()
    };
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(&patch.to_json()),
    )
    .await
    .map_err(|source| ReconcileError::Label {
        node: node.into(),
        source,
    })?;
    info!(%node, ?changes, "node labels updated");
    Ok(())
}

fn apply_changes(labels: &mut BTreeMap<String, String>, changes: LabelChanges) {
    for (key, value) in changes {
        match value {
            Some(value) => labels.insert(key, value),
            None => labels.remove(&key),
        };
    }
}

/// Events on state transitions, so `kubectl describe clusterpolicy` tells the story.
pub(super) async fn announce_transition(
    policy: &ClusterPolicy,
    previous: &ClusterPolicyStatus,
    status: &ClusterPolicyStatus,
    context: &Context,
) {
    if previous.state == status.state {
        return;
    }
    let message = status
        .conditions
        .first()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    match status.state {
        Some(PolicyState::Ready) => {
            publish(policy, context, EventType::Normal, "Ready", &message).await
        }
        Some(PolicyState::NotReady) => {
            publish(policy, context, EventType::Normal, "NotReady", &message).await
        }
        _ => {}
    }
}

pub(super) async fn publish(
    policy: &ClusterPolicy,
    context: &Context,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    publish_event(
        &context.recorder,
        &policy.object_ref(&()),
        "Reconcile",
        type_,
        reason,
        note,
    )
    .await;
}

/// Writes the status only when it changed, under the operator's field manager.
pub(super) async fn write_status(
    policy: &ClusterPolicy,
    previous: &ClusterPolicyStatus,
    status: ClusterPolicyStatus,
    context: &Context,
) -> Result<(), ReconcileError> {
    // `driverUpgrade` is the upgrade controller's, written under its own field manager: not compared here, or
    // every reconcile would find the status changed.
    let unchanged = ClusterPolicyStatus {
        driver_upgrade: status.driver_upgrade.clone(),
        ..previous.clone()
    } == status;
    if unchanged {
        return Ok(());
    }
    let api = Api::<ClusterPolicy>::all(context.client.clone());
    let patch = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "status": status});
    api.patch_status(
        &policy.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(ReconcileError::Status)?;
    Ok(())
}

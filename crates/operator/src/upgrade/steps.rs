//! A node's step carried out: the actions [`decide::plan`] asks for (cordon, evictions, driver and validator pod
//! deletions, uncordon), then the node's next state in one merge patch of its label and annotations, with an Event
//! on each transition users care about.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, debug, info, info_span, warn};

use super::controller::{Context, UpgradeError};
use super::decide::{Action, NodeStep, PodKey, Transition};
use super::report::publish;
use crd::driver_upgrade::UpgradeState;

/// Does one node's step: its actions, then its state.
pub(super) async fn carry_out(
    step: &NodeStep,
    node: &Node,
    context: &Context,
) -> Result<(), UpgradeError> {
    let span = info_span!("node", node = %step.node);
    async move {
        for action in &step.actions {
            act(action, &step.node, context).await;
        }
        if let Some(why) = &step.waiting {
            let changed = context
                .waiting
                .lock()
                .map(|mut waiting| {
                    waiting.insert(step.node.clone(), why.clone()).as_ref() != Some(why)
                })
                .unwrap_or(true);
            if changed {
                info!(state = ?node.labels().get(crd::driver_upgrade::STATE_LABEL), "{why}");
            }
        }
        if let Some(transition) = &step.transition {
            write_state(transition, node, context).await?;
        }
        Ok(())
    }
    .instrument(span)
    .await
}

async fn act(action: &Action, node: &str, context: &Context) {
    let nodes = Api::<Node>::all(context.client.clone());
    let result = match action {
        Action::Cordon | Action::Uncordon => {
            let unschedulable = matches!(action, Action::Cordon);
            let patch = json!({"spec": {"unschedulable": unschedulable}});
            nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| info!(unschedulable, "node cordon changed"))
        }
        Action::Evict(pod) => {
            let api = Api::<Pod>::namespaced(context.client.clone(), &pod.namespace);
            match api.evict(&pod.name, &EvictParams::default()).await {
                Ok(_) => {
                    info!(pod = %pod, "evicted");
                    forget_refusal(context, pod);
                    Ok(())
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    forget_refusal(context, pod);
                    Ok(())
                }
                // A PodDisruptionBudget: tried again on the next look until the state's timeout.
                Err(kube::Error::Api(status)) if status.code == 429 => {
                    debug!(pod = %pod, message = %status.message, "eviction refused");
                    if let Ok(mut refusals) = context.refusals.lock() {
                        refusals.insert(pod.clone(), status.message.clone());
                    }
                    Ok(())
                }
                Err(error) => Err(error),
            }
        }
        Action::DeleteDriverPod(name) | Action::DeleteValidatorPod(name) => {
            let api = Api::<Pod>::namespaced(context.client.clone(), &context.namespace);
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    info!(pod = %name, "deleted, for the DaemonSet to start it at its current revision");
                    Ok(())
                }
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                Err(error) => Err(error),
            }
        }
    };
    // Not fatal to the pass: the node stays in its state and the action is decided again on the next look.
    if let Err(error) = result {
        warn!(%error, ?action, "a driver upgrade action failed; it is tried again");
    }
}

fn forget_refusal(context: &Context, pod: &PodKey) {
    if let Ok(mut refusals) = context.refusals.lock() {
        refusals.remove(pod);
    }
}

/// Writes the node's next state: one merge patch of its label and annotations, leaving out what holds already.
async fn write_state(
    transition: &Transition,
    node: &Node,
    context: &Context,
) -> Result<(), UpgradeError> {
    let patch = transition
        .patch
        .clone()
        .minus(node.labels(), node.annotations());
    if patch.is_empty() {
        return Ok(());
    }
    let name = node.name_any();
    Api::<Node>::all(context.client.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&patch.to_json()),
        )
        .await
        .map_err(|source| UpgradeError::NodeWrite {
            node: name.clone(),
            source,
        })?;
    if transition.from == transition.to {
        return Ok(());
    }
    let from = transition.from.map_or("none", UpgradeState::as_str);
    let to = transition.to.map_or("none", UpgradeState::as_str);
    info!(from, to, reason = %transition.reason, "driver upgrade state changed");
    if let Ok(mut waiting) = context.waiting.lock() {
        waiting.remove(&name);
    }
    let (type_, reason) = match transition.to {
        Some(UpgradeState::UpgradeFailed) => (EventType::Warning, "DriverUpgradeFailed"),
        Some(UpgradeState::UpgradeRequired) => (EventType::Normal, "DriverUpgradeRequired"),
        Some(UpgradeState::CordonRequired) => (EventType::Normal, "DriverUpgradeStarted"),
        Some(UpgradeState::UpgradeDone) if transition.from.is_some() => {
            (EventType::Normal, "DriverUpgradeDone")
        }
        _ => return Ok(()),
    };
    publish(
        context,
        &node.object_ref(&()),
        type_,
        reason,
        &format!("{from} -> {to}: {}", transition.reason),
    )
    .await;
    Ok(())
}

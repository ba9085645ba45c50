//! The driver upgrade state machine: pure, from what one pass observed of every GPU node and the time. For each
//! node it returns what to do (cordon, evict, delete the old driver pod, restart the validator, uncordon) and the
//! state to write next; for the cluster, which waiting nodes may start and when to look again.
//!
//! Every decision is a function of the node's label, annotations and what runs on it, never of memory: an
//! operator that restarts decides the same, and each action is taken only while the node shows it is still
//! needed (a cordoned node is not cordoned again, a terminating pod is not evicted again, a driver pod of the
//! current revision is not deleted), so nothing is done twice. Every state has an exit: its work done, its
//! timeout (to `upgrade-failed`, with the reason), or the driver DaemonSet gone (the node is released).

use std::time::Duration;

use crd::driver_upgrade::{
    FAILED_REVISION_ANNOTATION, INITIAL_UNSCHEDULABLE_ANNOTATION, REASON_ANNOTATION,
    REQUESTED_ANNOTATION, STATE_LABEL, STATE_SINCE_ANNOTATION, UpgradeState,
};
use crd::node_patch::MetadataPatch;
use k8s_openapi::jiff::Timestamp;

use super::settings::Settings;
use super::states::{Outcome, decide};

/// How often a node waiting for pods to go is looked at again: pods on GPU nodes are not watched (a cluster's
/// every pod would be), so their departure is polled, and only while a node waits for it.
pub const POD_POLL: Duration = Duration::from_secs(2);

/// What one pass observed of a GPU node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeFacts {
    /// The node's name.
    pub name: String,
    /// The value of the state label, as written (an unknown value is reported and treated as no state).
    pub label: Option<String>,
    /// The admin's skip label is `true`.
    pub skip: bool,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// The node's Ready condition is True.
    pub ready: bool,
    /// [`INITIAL_UNSCHEDULABLE_ANNOTATION`] is `true`.
    pub initially_unschedulable: bool,
    /// [`REQUESTED_ANNOTATION`] is `true`.
    pub upgrade_requested: bool,
    /// [`STATE_SINCE_ANNOTATION`], when it parses.
    pub since: Option<Timestamp>,
    /// [`FAILED_REVISION_ANNOTATION`].
    pub failed_revision: Option<String>,
    /// [`REASON_ANNOTATION`].
    pub reason: Option<String>,
    /// The driver DaemonSet that selects the node; `None` when none does.
    pub driver: Option<Driver>,
    /// The validator on the node.
    pub validator: Validator,
    /// The pods on the node, read only for nodes in the states that handle pods ([`handles_pods`]).
    pub pods: Vec<PodFacts>,
}

/// The node's driver DaemonSet and its pod there.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Driver {
    /// The DaemonSet's current revision (`controller-revision-hash`).
    pub revision: String,
    /// Its pod on the node, if any.
    pub pod: Option<DriverPod>,
}

/// A driver pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DriverPod {
    /// The pod's name.
    pub name: String,
    /// Its `controller-revision-hash` label.
    pub revision: Option<String>,
    /// Its Ready condition is True.
    pub ready: bool,
    /// It is being deleted.
    pub terminating: bool,
    /// When it was created.
    pub created: Option<Timestamp>,
}

/// The validator on a node: its pod becomes Ready only once its driver check has written the driver-ready mark.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Validator {
    /// No validator DaemonSet selects the node: the driver pod's readiness is the whole validation.
    #[default]
    NotDeployed,
    /// A validator DaemonSet selects the node but has no pod there now.
    Missing,
    /// Its pod.
    Pod(ValidatorPod),
}

/// The validator pod on a node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ValidatorPod {
    /// The pod's name.
    pub name: String,
    /// Its Ready condition is True.
    pub ready: bool,
    /// It is being deleted.
    pub terminating: bool,
    /// When it was created.
    pub created: Option<Timestamp>,
}

/// `namespace/name` of a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PodKey {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A pod on a node, as the upgrade sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    /// The pod.
    pub key: PodKey,
    /// Why the pod counts as a GPU user (it holds a device, a DRA claim on our driver, or its processes use a
    /// GPU); `None` when it does not.
    pub gpu_use: Option<String>,
    /// A DaemonSet owns it.
    pub daemon_set: bool,
    /// A controller (ReplicaSet, Job, StatefulSet, ...) owns it, so it is made again elsewhere.
    pub controlled: bool,
    /// It has emptyDir volumes, whose data eviction loses.
    pub empty_dir: bool,
    /// It has finished (Succeeded or Failed).
    pub finished: bool,
    /// It is being deleted.
    pub terminating: bool,
    /// A static pod the kubelet runs from a file; the API cannot remove it.
    pub mirror: bool,
    /// Never evicted by the upgrade: the operator's own operands (NVIDIA's driver manager stops those it must),
    /// and pods labelled [`crd::driver_upgrade::DRAIN_SKIP_LABEL`].
    pub protected: bool,
    /// It matches `waitForCompletion.podSelector`.
    pub awaited: bool,
    /// It matches `drain.podSelector` (or the drain has none).
    pub drain_selected: bool,
    /// When it was created.
    pub created: Option<Timestamp>,
    /// Why its last eviction was refused (a PodDisruptionBudget), if it was.
    pub refusal: Option<String>,
}

/// One thing to do on a node, before its next state is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Mark the node unschedulable.
    Cordon,
    /// Mark it schedulable again.
    Uncordon,
    /// Evict the pod through the Eviction API (PodDisruptionBudgets hold).
    Evict(PodKey),
    /// Delete the driver pod of an old revision, so that the OnDelete DaemonSet makes the new one.
    DeleteDriverPod(String),
    /// Delete the validator pod that validated the old driver, so that a new one validates the new driver.
    DeleteValidatorPod(String),
}

/// A change of the node's state label and annotations, written after the step's actions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: Option<UpgradeState>,
    /// The state after; `None` removes the label (the node leaves the upgrade).
    pub to: Option<UpgradeState>,
    /// Why, for the log, the Event and the status.
    pub reason: String,
    /// The label and annotation changes.
    pub patch: MetadataPatch,
}

/// What to do on one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeStep {
    /// The node.
    pub node: String,
    /// Actions, in order.
    pub actions: Vec<Action>,
    /// The state to write after them.
    pub transition: Option<Transition>,
    /// What the node waits for, when it stays in its state.
    pub waiting: Option<String>,
}

/// How many nodes are in each part of the upgrade, NVIDIA's metric names' counts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// Nodes holding an upgrade slot (cordon-required to uncordon-required), after this pass.
    pub in_progress: usize,
    /// Nodes in upgrade-done.
    pub done: usize,
    /// Nodes in upgrade-failed.
    pub failed: usize,
    /// Nodes in upgrade-required.
    pub pending: usize,
    /// Nodes that could start now within maxParallelUpgrades and maxUnavailable.
    pub available: usize,
    /// Nodes with the skip label.
    pub skipped: usize,
    /// Failed nodes and why.
    pub failures: Vec<(String, String)>,
}

/// The pass's decisions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// One step per node that has something to do or wait for.
    pub steps: Vec<NodeStep>,
    /// When to look again although nothing changes: the earliest timeout, or the next look at pods.
    pub wake_at: Option<Timestamp>,
    /// The counts after this pass.
    pub summary: Summary,
}

impl Plan {
    /// Adds the plan of another group of nodes (another upgrade policy's): its steps and counts, and the earlier
    /// wake-up.
    pub fn merge(&mut self, other: Plan) {
        self.steps.extend(other.steps);
        self.wake_at = match (self.wake_at, other.wake_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let (total, more) = (&mut self.summary, other.summary);
        total.in_progress += more.in_progress;
        total.done += more.done;
        total.failed += more.failed;
        total.pending += more.pending;
        total.available += more.available;
        total.skipped += more.skipped;
        total.failures.extend(more.failures);
    }
}

/// Whether a node in `state` needs the pods on it read for its decision.
#[must_use]
pub fn handles_pods(state: Option<UpgradeState>) -> bool {
    matches!(
        state,
        Some(
            UpgradeState::WaitForJobsRequired
                | UpgradeState::PodDeletionRequired
                | UpgradeState::DrainRequired
        )
    )
}

impl NodeFacts {
    /// The node's state, `None` when it has none or an unknown one.
    #[must_use]
    pub fn state(&self) -> Option<UpgradeState> {
        self.label.as_deref().and_then(UpgradeState::parse)
    }

    /// Whether the driver pod on the node runs the DaemonSet's current revision.
    pub(super) fn driver_current(&self) -> Option<&DriverPod> {
        let driver = self.driver.as_ref()?;
        driver
            .pod
            .as_ref()
            .filter(|pod| pod.revision.as_deref() == Some(driver.revision.as_str()))
    }

    /// Whether the driver pod runs an old revision (a pod that is missing is not old: it is made at the
    /// current one).
    pub(super) fn driver_outdated(&self) -> bool {
        self.driver.as_ref().is_some_and(|driver| {
            driver
                .pod
                .as_ref()
                .is_some_and(|pod| pod.revision.as_deref() != Some(driver.revision.as_str()))
        })
    }

    /// Whether the node was cordoned by the upgrade (rather than by the admin before it).
    pub(super) fn cordoned_by_upgrade(&self) -> bool {
        self.unschedulable && !self.initially_unschedulable
    }

    /// Time in the current state; zero when the state's start is not recorded (it is recorded now).
    pub(super) fn elapsed(&self, now: Timestamp) -> Duration {
        self.since
            .and_then(|since| Duration::try_from(now.duration_since(since)).ok())
            .unwrap_or_default()
    }

    /// The new driver is validated: its pod runs the current revision and is Ready, and the validator (where one is
    /// deployed) became Ready in a pod started after the driver pod, that is, after checking the new driver.
    /// `Err` says what is missing.
    pub(super) fn validated(&self) -> Result<(), String> {
        let Some(driver) = self.driver.as_ref() else {
            return Err("no driver DaemonSet selects the node".into());
        };
        let Some(pod) = self.driver_current() else {
            return Err(format!(
                "no driver pod of revision {} runs on the node",
                driver.revision
            ));
        };
        if !pod.ready {
            return Err(format!("driver pod {} is not ready", pod.name));
        }
        match &self.validator {
            Validator::NotDeployed => Ok(()),
            Validator::Missing => Err("the validator has no pod on the node".into()),
            Validator::Pod(validator) => {
                if validator.created < pod.created || validator.terminating {
                    Err(format!(
                        "validator pod {} has not checked the new driver yet",
                        validator.name
                    ))
                } else if !validator.ready {
                    Err(format!(
                        "validator pod {} has not found the new driver working yet",
                        validator.name
                    ))
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// Decides every node's next step.
#[must_use]
pub fn plan(settings: &Settings, nodes: &[NodeFacts], now: Timestamp) -> Plan {
    let mut plan = Plan::default();
    let managed: Vec<&NodeFacts> = nodes
        .iter()
        .filter(|node| node.driver.is_some() || node.state().is_some())
        .collect();
    plan.summary.skipped = managed.iter().filter(|node| node.skip).count();
    let active: Vec<&NodeFacts> = managed.iter().copied().filter(|node| !node.skip).collect();

    let mut outcomes: Vec<(&NodeFacts, Outcome)> = active
        .iter()
        .map(|node| (*node, decide(settings, node, now)))
        .collect();
    let available = grant_slots(settings, &active, &mut outcomes);
    plan.summary.available = available;

    for (node, outcome) in outcomes {
        let state = node.state();
        let step = match outcome {
            Outcome::Idle | Outcome::WantsSlot => None,
            Outcome::Wait {
                actions,
                why,
                wake_at,
                stamp,
            } => {
                plan.wake_at = earliest(plan.wake_at, wake_at);
                let transition = stamp.then(|| Transition {
                    from: state,
                    to: state,
                    reason: format!("recorded when {} began", node.name),
                    patch: MetadataPatch::default()
                        .annotation(STATE_SINCE_ANNOTATION, Some(now.to_string())),
                });
                Some(NodeStep {
                    node: node.name.clone(),
                    actions,
                    transition,
                    waiting: Some(why),
                })
            }
            Outcome::Go {
                actions,
                to,
                reason,
            } => {
                // The next state is looked at at once: its own decision runs on the write's watch event.
                Some(NodeStep {
                    node: node.name.clone(),
                    actions,
                    transition: Some(transition(node, to, reason, now)),
                    waiting: None,
                })
            }
        };
        let after = step
            .as_ref()
            .and_then(|step| step.transition.as_ref())
            .map_or(state, |transition| transition.to);
        count(&mut plan.summary, node, after, step.as_ref());
        plan.steps.extend(step);
    }
    plan
}

pub(super) fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn count(
    summary: &mut Summary,
    node: &NodeFacts,
    state: Option<UpgradeState>,
    step: Option<&NodeStep>,
) {
    match state {
        Some(UpgradeState::UpgradeDone) => summary.done += 1,
        Some(UpgradeState::UpgradeRequired) => summary.pending += 1,
        Some(UpgradeState::UpgradeFailed) => {
            summary.failed += 1;
            let reason = step
                .and_then(|step| step.transition.as_ref())
                .filter(|t| t.to == Some(UpgradeState::UpgradeFailed))
                .map(|t| t.reason.clone())
                .or_else(|| node.reason.clone())
                .unwrap_or_else(|| "no reason recorded".into());
            summary.failures.push((node.name.clone(), reason));
        }
        Some(state) if state.in_flight() => summary.in_progress += 1,
        _ => {}
    }
}

/// The label and annotation changes of moving `node` to `to`.
fn transition(
    node: &NodeFacts,
    to: Option<UpgradeState>,
    reason: String,
    now: Timestamp,
) -> Transition {
    let from = node.state();
    let mut patch = MetadataPatch::default();
    match to {
        Some(state) => {
            patch = patch
                .label(STATE_LABEL, state.as_str())
                .annotation(STATE_SINCE_ANNOTATION, Some(now.to_string()));
        }
        None => {
            patch.labels.insert(STATE_LABEL.into(), None);
            patch = patch.annotation(STATE_SINCE_ANNOTATION, None);
        }
    }
    let leaves_upgrade = matches!(to, None | Some(UpgradeState::UpgradeDone));
    match to {
        Some(UpgradeState::UpgradeFailed) => {
            patch = patch
                .annotation(REASON_ANNOTATION, Some(reason.clone()))
                .annotation(
                    FAILED_REVISION_ANNOTATION,
                    node.driver.as_ref().map(|d| d.revision.clone()),
                );
        }
        _ => patch = patch.annotation(REASON_ANNOTATION, None),
    }
    if leaves_upgrade {
        patch = patch
            .annotation(FAILED_REVISION_ANNOTATION, None)
            .annotation(INITIAL_UNSCHEDULABLE_ANNOTATION, None)
            .annotation(REQUESTED_ANNOTATION, None);
    }
    // A node whose upgrade begins remembers whether the admin had cordoned it, so that it stays cordoned after.
    // Only from outside an upgrade: a failed node that resumes is cordoned by the upgrade itself.
    let begins = to == Some(UpgradeState::UpgradeRequired)
        && matches!(from, None | Some(UpgradeState::UpgradeDone));
    if begins {
        patch = patch
            .annotation(
                INITIAL_UNSCHEDULABLE_ANNOTATION,
                node.unschedulable.then(|| "true".to_owned()),
            )
            .annotation(REQUESTED_ANNOTATION, None);
    }
    Transition {
        from,
        to,
        reason,
        patch,
    }
}

/// Hands upgrade slots to the nodes that want one, in name order, within `maxParallelUpgrades` and
/// `maxUnavailable`; returns how many more could start.
fn grant_slots(
    settings: &Settings,
    active: &[&NodeFacts],
    outcomes: &mut [(&NodeFacts, Outcome)],
) -> usize {
    let in_flight = active
        .iter()
        .filter(|node| node.state().is_some_and(UpgradeState::in_flight))
        .count();
    // Unavailable: cordoned or not Ready, and those about to be cordoned.
    let mut unavailable = active
        .iter()
        .filter(|node| {
            node.unschedulable || !node.ready || node.state() == Some(UpgradeState::CordonRequired)
        })
        .count();
    let max_unavailable = settings.max_unavailable.of(active.len());
    let mut parallel_left = settings
        .max_parallel
        .map_or(usize::MAX, |max| max.saturating_sub(in_flight));
    let mut order: Vec<usize> = (0..outcomes.len())
        .filter(|i| matches!(outcomes[*i].1, Outcome::WantsSlot))
        .collect();
    order.sort_by(|a, b| outcomes[*a].0.name.cmp(&outcomes[*b].0.name));
    for index in order {
        let node = outcomes[index].0;
        // A node that is unavailable already makes nothing more unavailable by starting.
        let adds = usize::from(node.ready && !node.unschedulable);
        if parallel_left == 0 || unavailable + adds > max_unavailable {
            let limit = if parallel_left == 0 {
                format!("maxParallelUpgrades: {in_flight} nodes are upgrading")
            } else {
                format!(
                    "maxUnavailable: {unavailable} of at most {max_unavailable} GPU nodes are unavailable"
                )
            };
            outcomes[index].1 = Outcome::Wait {
                actions: Vec::new(),
                why: format!("waiting for an upgrade slot ({limit})"),
                wake_at: None,
                stamp: false,
            };
            continue;
        }
        parallel_left -= 1;
        unavailable += adds;
        outcomes[index].1 = Outcome::go(
            UpgradeState::CordonRequired,
            "an upgrade slot is free: the node is cordoned next",
        );
    }
    parallel_left.min(max_unavailable.saturating_sub(unavailable))
}

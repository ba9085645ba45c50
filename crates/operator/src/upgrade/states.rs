//! One node's decision in its upgrade state, slots aside: what it waits for, what to do, where it goes next. Pure;
//! [`super::decide::plan`] hands out the slots and turns each outcome into a step.

use std::time::Duration;

use crd::driver_upgrade::UpgradeState;
use k8s_openapi::jiff::Timestamp;

use super::decide::{Action, NodeFacts, POD_POLL, PodFacts, Validator, earliest};
use super::settings::{Eviction, Settings};

/// The outcome of one node's state, before slots are handed out.
pub(super) enum Outcome {
    /// Nothing to do or wait for.
    Idle,
    /// Stay, waiting; look again at `wake_at`.
    Wait {
        actions: Vec<Action>,
        why: String,
        wake_at: Option<Timestamp>,
        /// Record the state's start time (it was not recorded).
        stamp: bool,
    },
    /// Go to `to` after `actions`.
    Go {
        actions: Vec<Action>,
        to: Option<UpgradeState>,
        reason: String,
    },
    /// Waiting for a slot to start.
    WantsSlot,
}

impl Outcome {
    pub(super) fn go(to: UpgradeState, reason: impl Into<String>) -> Self {
        Self::Go {
            actions: Vec::new(),
            to: Some(to),
            reason: reason.into(),
        }
    }

    pub(super) fn fail(reason: impl Into<String>) -> Self {
        Self::go(UpgradeState::UpgradeFailed, reason)
    }
}

/// How to resume a failed node, appended to every failure reason.
pub(super) const RESUME: &str = "fix the cause, then change the driver version (a new revision resumes the node) or label the node nvidia.com/gpu-driver-upgrade-state=upgrade-required";

/// One node's decision, slots aside.
pub(super) fn decide(settings: &Settings, node: &NodeFacts, now: Timestamp) -> Outcome {
    let state = node.state();
    if node.driver.is_none() {
        return release(node, "no driver DaemonSet selects the node any more");
    }
    if !settings.auto_upgrade {
        // Nodes in the middle of an upgrade finish it; no other starts, and idle nodes drop the label.
        return match state {
            None => Outcome::Idle,
            Some(UpgradeState::UpgradeDone | UpgradeState::UpgradeRequired) => Outcome::Go {
                actions: Vec::new(),
                to: None,
                reason: "automatic upgrades are off".into(),
            },
            Some(UpgradeState::UpgradeFailed) => Outcome::Idle,
            Some(_) => in_upgrade(settings, node, now),
        };
    }
    match state {
        None | Some(UpgradeState::UpgradeDone) => idle(node, state),
        Some(UpgradeState::UpgradeRequired) => required(node),
        Some(UpgradeState::UpgradeFailed) => failed(node),
        Some(_) => in_upgrade(settings, node, now),
    }
}

/// A node leaves the upgrade: uncordoned if the upgrade cordoned it, its label and annotations removed.
fn release(node: &NodeFacts, why: &str) -> Outcome {
    if node.state().is_none() {
        return Outcome::Idle;
    }
    let actions = if node.cordoned_by_upgrade() && node.state() != Some(UpgradeState::UpgradeDone) {
        vec![Action::Uncordon]
    } else {
        Vec::new()
    };
    Outcome::Go {
        actions,
        to: None,
        reason: why.into(),
    }
}

/// No state or upgrade-done: an outdated driver pod (or the admin's request) begins an upgrade.
fn idle(node: &NodeFacts, state: Option<UpgradeState>) -> Outcome {
    if node.driver_outdated() || node.upgrade_requested {
        let why = if node.upgrade_requested && !node.driver_outdated() {
            "the admin requested an upgrade".to_owned()
        } else {
            format!(
                "the driver pod runs an old revision; the DaemonSet's is {}",
                node.driver.as_ref().map_or("", |d| d.revision.as_str())
            )
        };
        return Outcome::go(UpgradeState::UpgradeRequired, why);
    }
    match (state, node.driver_current()) {
        (None, Some(_)) => Outcome::go(
            UpgradeState::UpgradeDone,
            "the driver pod runs the current revision",
        ),
        _ => Outcome::Idle,
    }
}

/// upgrade-required: waits for a slot, unless the node's driver is current and validated already (someone
/// replaced the pod), which needs none.
fn required(node: &NodeFacts) -> Outcome {
    if !node.upgrade_requested && node.validated().is_ok() {
        return Outcome::go(
            UpgradeState::UncordonRequired,
            "the driver pod already runs the current revision and is validated",
        );
    }
    Outcome::WantsSlot
}

/// upgrade-failed: stays until a new driver revision (or the admin's label) resumes it, or until the driver of
/// the current revision turns out validated after all. Never upgrade-done without that validation.
fn failed(node: &NodeFacts) -> Outcome {
    let revision = node.driver.as_ref().map(|d| d.revision.as_str());
    if node.failed_revision.is_some() && node.failed_revision.as_deref() != revision {
        return Outcome::go(
            UpgradeState::UpgradeRequired,
            format!(
                "a new driver revision {} resumes the failed upgrade",
                revision.unwrap_or_default()
            ),
        );
    }
    if node.validated().is_ok() {
        return Outcome::go(
            UpgradeState::UncordonRequired,
            "the new driver validated after the failure",
        );
    }
    Outcome::Idle
}

/// A state with a timeout: `Wait` until `timeout` after the state began, then `on_timeout`.
fn wait_or(
    node: &NodeFacts,
    now: Timestamp,
    timeout: Option<Duration>,
    actions: Vec<Action>,
    why: String,
    poll: bool,
    on_timeout: impl FnOnce(String) -> Outcome,
) -> Outcome {
    let elapsed = node.elapsed(now);
    if let Some(timeout) = timeout
        && node.since.is_some()
        && elapsed >= timeout
    {
        return on_timeout(format!("{why} after {}s", timeout.as_secs()));
    }
    let deadline = timeout.and_then(|timeout| {
        let since = node.since.unwrap_or(now);
        since.checked_add(timeout).ok()
    });
    let next_poll = poll.then(|| now.checked_add(POD_POLL).ok()).flatten();
    Outcome::Wait {
        actions,
        why,
        wake_at: earliest(deadline, next_poll),
        stamp: node.since.is_none(),
    }
}

/// The states between cordon-required and uncordon-required.
fn in_upgrade(settings: &Settings, node: &NodeFacts, now: Timestamp) -> Outcome {
    let Some(state) = node.state() else {
        return Outcome::Idle;
    };
    match state {
        UpgradeState::CordonRequired => {
            let actions = if node.unschedulable {
                Vec::new()
            } else {
                vec![Action::Cordon]
            };
            Outcome::Go {
                actions,
                to: Some(UpgradeState::WaitForJobsRequired),
                reason: "cordoned".into(),
            }
        }
        UpgradeState::WaitForJobsRequired => wait_for_jobs(settings, node, now),
        UpgradeState::PodDeletionRequired => pod_deletion(settings, node, now),
        UpgradeState::DrainRequired => drain(settings, node, now),
        UpgradeState::PodRestartRequired => pod_restart(settings, node, now),
        UpgradeState::ValidationRequired => validation(settings, node, now),
        UpgradeState::UncordonRequired => {
            let actions = if node.cordoned_by_upgrade() {
                vec![Action::Uncordon]
            } else {
                Vec::new()
            };
            let reason = if node.initially_unschedulable {
                "upgraded; the node stays cordoned as the admin left it"
            } else {
                "upgraded and uncordoned"
            };
            Outcome::Go {
                actions,
                to: Some(UpgradeState::UpgradeDone),
                reason: reason.into(),
            }
        }
        UpgradeState::UpgradeRequired | UpgradeState::UpgradeDone | UpgradeState::UpgradeFailed => {
            Outcome::Idle
        }
    }
}

/// The pods a driver restart must not run under: those that use the GPUs and still run.
fn gpu_users(node: &NodeFacts, since: Option<Timestamp>) -> impl Iterator<Item = &PodFacts> {
    node.pods.iter().filter(move |pod| {
        // A DaemonSet pod made again after its eviction: the DaemonSet places it on the cordoned node at once,
        // so evicting it again would never end. Its old pod was evicted; the new one starts on the new driver.
        let replacement = pod.daemon_set && since.is_some() && pod.created > since;
        let leaves = pod.finished || pod.mirror || pod.protected || replacement;
        pod.gpu_use.is_some() && !leaves
    })
}

fn wait_for_jobs(settings: &Settings, node: &NodeFacts, now: Timestamp) -> Outcome {
    let Some(wait) = &settings.wait_for_completion else {
        return Outcome::go(UpgradeState::PodDeletionRequired, "no jobs to wait for");
    };
    let running: Vec<String> = node
        .pods
        .iter()
        .filter(|pod| pod.awaited && !pod.finished)
        .map(|pod| pod.key.to_string())
        .collect();
    if running.is_empty() {
        return Outcome::go(
            UpgradeState::PodDeletionRequired,
            format!("no pod matching {} runs on the node", wait.pod_selector),
        );
    }
    wait_or(
        node,
        now,
        wait.timeout,
        Vec::new(),
        format!("waiting for {} to complete", running.join(", ")),
        true,
        // NVIDIA's semantics: the wait's timeout ends the wait, not the upgrade; the pods are evicted next.
        |why| Outcome::go(UpgradeState::PodDeletionRequired, format!("stopped {why}")),
    )
}

/// Why `pod` may not be evicted under `rules`, if it may not.
fn refused_by_policy(pod: &PodFacts, rules: Eviction, section: &str) -> Option<String> {
    if !pod.controlled && !pod.daemon_set && !rules.force {
        return Some(format!(
            "{} has no controller, so eviction would lose it; set driver.upgradePolicy.{section}.force to evict it",
            pod.key
        ));
    }
    if pod.empty_dir && !rules.delete_empty_dir {
        return Some(format!(
            "{} has emptyDir volumes whose data eviction loses; set driver.upgradePolicy.{section}.deleteEmptyDir to evict it",
            pod.key
        ));
    }
    None
}

/// Evicts `pods` under `rules`: the next state once they are gone, a failure (`on_stuck`) when one may not be
/// evicted or the timeout passes.
fn evict(
    node: &NodeFacts,
    now: Timestamp,
    pods: &[&PodFacts],
    rules: Eviction,
    section: &str,
    next: (UpgradeState, &str),
    on_stuck: impl FnOnce(String) -> Outcome,
) -> Outcome {
    if pods.is_empty() {
        return Outcome::go(next.0, next.1);
    }
    if let Some(refusal) = pods
        .iter()
        .find_map(|pod| refused_by_policy(pod, rules, section))
    {
        return on_stuck(refusal);
    }
    let actions = pods
        .iter()
        .filter(|pod| !pod.terminating)
        .map(|pod| Action::Evict(pod.key.clone()))
        .collect();
    let names: Vec<String> = pods
        .iter()
        .map(|pod| match &pod.refusal {
            Some(refusal) => format!("{} ({refusal})", pod.key),
            None => pod.key.to_string(),
        })
        .collect();
    wait_or(
        node,
        now,
        rules.timeout,
        actions,
        format!("evicting {}", names.join(", ")),
        true,
        |why| on_stuck(format!("{why}: the pods did not leave")),
    )
}

fn pod_deletion(settings: &Settings, node: &NodeFacts, now: Timestamp) -> Outcome {
    let users: Vec<&PodFacts> = gpu_users(node, node.since).collect();
    let next = match settings.drain {
        Some(_) => (
            UpgradeState::DrainRequired,
            "no pod uses the GPUs any more; the node is drained next",
        ),
        None => (
            UpgradeState::PodRestartRequired,
            "no pod uses the GPUs any more",
        ),
    };
    let drains = settings.drain.is_some();
    evict(
        node,
        now,
        &users,
        settings.pod_deletion,
        "podDeletion",
        next,
        |why| {
            // NVIDIA's order: what pod deletion cannot do, the drain may (it has its own force and timeout).
            if drains {
                Outcome::go(
                    UpgradeState::DrainRequired,
                    format!("pod deletion stopped ({why}); draining the node instead"),
                )
            } else {
                Outcome::fail(format!("pod deletion failed: {why}; {RESUME}"))
            }
        },
    )
}

fn drain(settings: &Settings, node: &NodeFacts, now: Timestamp) -> Outcome {
    let Some(drain) = &settings.drain else {
        return Outcome::go(UpgradeState::PodRestartRequired, "drain is not enabled");
    };
    // As `kubectl drain --ignore-daemonsets`: DaemonSet pods stay (those that use the GPUs were evicted before).
    let mut pods: Vec<&PodFacts> = node
        .pods
        .iter()
        .filter(|pod| {
            pod.drain_selected && !pod.daemon_set && !pod.mirror && !pod.protected && !pod.finished
        })
        .collect();
    pods.extend(
        gpu_users(node, node.since)
            .filter(|p| !pods.contains(p))
            .collect::<Vec<_>>(),
    );
    evict(
        node,
        now,
        &pods,
        drain.eviction(),
        "drain",
        (UpgradeState::PodRestartRequired, "the node is drained"),
        |why| Outcome::fail(format!("drain failed: {why}; {RESUME}")),
    )
}

fn pod_restart(settings: &Settings, node: &NodeFacts, now: Timestamp) -> Outcome {
    let Some(driver) = node.driver.as_ref() else {
        return Outcome::Idle;
    };
    let mut actions = Vec::new();
    let why = match (&driver.pod, node.driver_current()) {
        (_, Some(pod)) if pod.ready => {
            return Outcome::go(
                UpgradeState::ValidationRequired,
                format!(
                    "driver pod {} of revision {} is ready",
                    pod.name, driver.revision
                ),
            );
        }
        (_, Some(pod)) => format!(
            "waiting for driver pod {} of revision {} to become ready",
            pod.name, driver.revision
        ),
        (Some(old), None) if !old.terminating => {
            actions.push(Action::DeleteDriverPod(old.name.clone()));
            format!("deleted the old driver pod {}", old.name)
        }
        (Some(old), None) => format!("waiting for the old driver pod {} to stop", old.name),
        (None, None) => format!(
            "waiting for the DaemonSet to start a driver pod of revision {}",
            driver.revision
        ),
    };
    wait_or(
        node,
        now,
        Some(settings.restart_timeout),
        actions,
        why,
        false,
        |why| Outcome::fail(format!("the new driver did not start: {why}; {RESUME}")),
    )
}

fn validation(settings: &Settings, node: &NodeFacts, now: Timestamp) -> Outcome {
    if node.driver_outdated() {
        // A newer revision arrived while this one was validated: the node is drained already, restart again.
        return Outcome::go(
            UpgradeState::PodRestartRequired,
            "a newer driver revision replaces the one being validated",
        );
    }
    let why = match node.validated() {
        Ok(()) => {
            return Outcome::go(
                UpgradeState::UncordonRequired,
                "the validator found the new driver working",
            );
        }
        Err(why) => why,
    };
    let mut actions = Vec::new();
    // The validator pod that runs checked the old driver: started again, its checks run on the new one.
    if let (Validator::Pod(validator), Some(pod)) = (&node.validator, node.driver_current())
        && pod.ready
        && validator.created < pod.created
        && !validator.terminating
    {
        actions.push(Action::DeleteValidatorPod(validator.name.clone()));
    }
    wait_or(
        node,
        now,
        Some(settings.validation_timeout),
        actions,
        why,
        false,
        |why| Outcome::fail(format!("validation failed: {why}; {RESUME}")),
    )
}

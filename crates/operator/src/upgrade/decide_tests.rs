//! Every transition and every exit of the state machine, and the rules across nodes (slots, unavailability),
//! restarts and repeated passes.

use std::time::Duration;

use crd::driver_upgrade::{
    FAILED_REVISION_ANNOTATION, INITIAL_UNSCHEDULABLE_ANNOTATION, REASON_ANNOTATION, STATE_LABEL,
    STATE_SINCE_ANNOTATION, UpgradeState,
};
use k8s_openapi::jiff::Timestamp;

use super::decide::*;
use super::settings::{Drain, Eviction, MaxUnavailable, Settings, StepTimeouts, WaitForCompletion};

use UpgradeState::*;

fn t(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn settings() -> Settings {
    Settings {
        auto_upgrade: true,
        max_parallel: Some(1),
        max_unavailable: MaxUnavailable::Percent(100),
        wait_for_completion: None,
        pod_deletion: Eviction::default(),
        drain: None,
        restart_timeout: StepTimeouts::default().restart,
        validation_timeout: StepTimeouts::default().validation,
    }
}

/// A Ready, schedulable node whose driver pod runs revision `pod_revision` of a DaemonSet at `new`.
fn node(name: &str, state: Option<UpgradeState>, pod_revision: &str) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        label: state.map(|s| s.as_str().to_owned()),
        ready: true,
        since: state.map(|_| t(0)),
        driver: Some(Driver {
            revision: "new".into(),
            pod: Some(DriverPod {
                name: format!("driver-{name}"),
                revision: Some(pod_revision.into()),
                ready: true,
                terminating: false,
                created: Some(t(0)),
            }),
        }),
        ..NodeFacts::default()
    }
}

fn gpu_pod(name: &str) -> PodFacts {
    PodFacts {
        key: PodKey {
            namespace: "ml".into(),
            name: name.into(),
        },
        gpu_use: Some("requests nvidia.com/gpu".into()),
        controlled: true,
        drain_selected: true,
        created: Some(t(-100)),
        ..PodFacts::default()
    }
}

fn step<'a>(plan: &'a Plan, node: &str) -> Option<&'a NodeStep> {
    plan.steps.iter().find(|s| s.node == node)
}

fn next_state(plan: &Plan, node: &str) -> Option<Option<UpgradeState>> {
    step(plan, node)
        .and_then(|s| s.transition.as_ref())
        .map(|t| t.to)
}

fn actions(plan: &Plan, node: &str) -> Vec<Action> {
    step(plan, node)
        .map(|s| s.actions.clone())
        .unwrap_or_default()
}

fn one(settings: &Settings, node: &NodeFacts, now: Timestamp) -> Plan {
    plan(settings, std::slice::from_ref(node), now)
}

/// Applies a step to the facts as the cluster would: the label, annotations and cordon change.
fn apply(node: &mut NodeFacts, step: &NodeStep) {
    for action in &step.actions {
        match action {
            Action::Cordon => node.unschedulable = true,
            Action::Uncordon => node.unschedulable = false,
            _ => {}
        }
    }
    if let Some(transition) = &step.transition {
        node.label = transition.to.map(|s| s.as_str().to_owned());
        for (key, value) in &transition.patch.annotations {
            match key.as_str() {
                STATE_SINCE_ANNOTATION => node.since = value.as_ref().map(|v| v.parse().unwrap()),
                INITIAL_UNSCHEDULABLE_ANNOTATION => {
                    node.initially_unschedulable = value.as_deref() == Some("true");
                }
                FAILED_REVISION_ANNOTATION => node.failed_revision = value.clone(),
                REASON_ANNOTATION => node.reason = value.clone(),
                _ => {}
            }
        }
    }
}

#[test]
fn a_node_without_state_is_done_when_current_and_required_when_outdated() {
    let current = node("a", None, "new");
    assert_eq!(
        next_state(&one(&settings(), &current, t(0)), "a"),
        Some(Some(UpgradeDone))
    );
    let outdated = node("b", None, "old");
    let plan = one(&settings(), &outdated, t(0));
    assert_eq!(next_state(&plan, "b"), Some(Some(UpgradeRequired)));
    let patch = &step(&plan, "b").unwrap().transition.as_ref().unwrap().patch;
    assert_eq!(
        patch.labels[STATE_LABEL].as_deref(),
        Some("upgrade-required")
    );
    assert_eq!(
        patch.annotations[STATE_SINCE_ANNOTATION].as_deref(),
        Some(t(0).to_string().as_str())
    );
    assert_eq!(
        patch.annotations[INITIAL_UNSCHEDULABLE_ANNOTATION], None,
        "was schedulable"
    );
    let done_outdated = node("c", Some(UpgradeDone), "old");
    assert_eq!(
        next_state(&one(&settings(), &done_outdated, t(0)), "c"),
        Some(Some(UpgradeRequired))
    );
    let done_current = node("d", Some(UpgradeDone), "new");
    assert!(
        one(&settings(), &done_current, t(0)).steps.is_empty(),
        "nothing to do at rest"
    );
}

#[test]
fn a_node_the_admin_cordoned_is_remembered_and_stays_cordoned() {
    let mut facts = node("a", None, "old");
    facts.unschedulable = true;
    let plan = one(&settings(), &facts, t(0));
    let patch = &step(&plan, "a").unwrap().transition.as_ref().unwrap().patch;
    assert_eq!(
        patch.annotations[INITIAL_UNSCHEDULABLE_ANNOTATION].as_deref(),
        Some("true")
    );
    apply(&mut facts, step(&plan, "a").unwrap());
    let mut facts = NodeFacts {
        label: Some("uncordon-required".into()),
        ..facts
    };
    let plan = one(&settings(), &facts, t(10));
    assert_eq!(actions(&plan, "a"), [], "not uncordoned");
    assert_eq!(next_state(&plan, "a"), Some(Some(UpgradeDone)));
    apply(&mut facts, step(&plan, "a").unwrap());
    assert!(facts.unschedulable);
    assert!(
        !facts.initially_unschedulable,
        "the record goes with the upgrade"
    );
}

#[test]
fn the_admin_can_request_an_upgrade_of_a_current_driver() {
    let mut facts = node("a", Some(UpgradeDone), "new");
    facts.upgrade_requested = true;
    assert_eq!(
        next_state(&one(&settings(), &facts, t(0)), "a"),
        Some(Some(UpgradeRequired))
    );
}

#[test]
fn a_skipped_node_is_left_alone_and_counted() {
    let mut facts = node("a", None, "old");
    facts.skip = true;
    let plan = one(&settings(), &facts, t(0));
    assert!(plan.steps.is_empty());
    assert_eq!(plan.summary.skipped, 1);
    assert_eq!(plan.summary.pending, 0);
}

#[test]
fn cordon_then_wait_for_jobs_and_nothing_cordoned_twice() {
    let mut facts = node("a", Some(UpgradeRequired), "old");
    let plan = one(&settings(), &facts, t(0));
    assert_eq!(next_state(&plan, "a"), Some(Some(CordonRequired)));
    apply(&mut facts, step(&plan, "a").unwrap());
    let plan = one(&settings(), &facts, t(1));
    assert_eq!(actions(&plan, "a"), [Action::Cordon]);
    assert_eq!(next_state(&plan, "a"), Some(Some(WaitForJobsRequired)));
    // A restart between the cordon and the label write: the node is cordoned already.
    facts.unschedulable = true;
    let again = one(&settings(), &facts, t(2));
    assert_eq!(actions(&again, "a"), []);
    assert_eq!(next_state(&again, "a"), Some(Some(WaitForJobsRequired)));
}

#[test]
fn wait_for_jobs_waits_for_the_selected_pods_then_times_out_into_pod_deletion() {
    let mut s = settings();
    assert_eq!(
        next_state(
            &one(&s, &node("a", Some(WaitForJobsRequired), "old"), t(0)),
            "a"
        ),
        Some(Some(PodDeletionRequired)),
        "no selector: nothing to wait for"
    );
    s.wait_for_completion = Some(WaitForCompletion {
        pod_selector: "app=train".into(),
        timeout: Some(Duration::from_secs(60)),
    });
    let mut facts = node("a", Some(WaitForJobsRequired), "old");
    facts.unschedulable = true;
    facts.pods = vec![PodFacts {
        awaited: true,
        ..gpu_pod("job")
    }];
    let plan = one(&s, &facts, t(30));
    assert_eq!(next_state(&plan, "a"), None, "still running");
    let waiting = step(&plan, "a").unwrap().waiting.clone().unwrap();
    assert!(waiting.contains("ml/job"), "{waiting}");
    assert_eq!(plan.wake_at, Some(t(30) + POD_POLL), "polls the pods");
    let timed_out = one(&s, &facts, t(60));
    assert_eq!(next_state(&timed_out, "a"), Some(Some(PodDeletionRequired)));
    facts.pods[0].finished = true;
    assert_eq!(
        next_state(&one(&s, &facts, t(31)), "a"),
        Some(Some(PodDeletionRequired))
    );
    // No timeout: waits for as long as the job runs.
    s.wait_for_completion.as_mut().unwrap().timeout = None;
    facts.pods[0].finished = false;
    assert_eq!(next_state(&one(&s, &facts, t(100_000)), "a"), None);
}

#[test]
fn pod_deletion_evicts_every_gpu_user_and_no_other_pod() {
    let mut facts = node("a", Some(PodDeletionRequired), "old");
    facts.unschedulable = true;
    let by_process = PodFacts {
        gpu_use: Some("its processes use GPU 0".into()),
        daemon_set: true,
        controlled: true,
        ..gpu_pod("monitor")
    };
    let web = PodFacts {
        gpu_use: None,
        ..gpu_pod("web")
    };
    let operand = PodFacts {
        protected: true,
        ..gpu_pod("nvidia-dcgm-exporter-x")
    };
    let leaving = PodFacts {
        terminating: true,
        ..gpu_pod("leaving")
    };
    facts.pods = vec![gpu_pod("train"), by_process, web, operand, leaving];
    let plan = one(&settings(), &facts, t(5));
    let evict = |name: &str| {
        Action::Evict(PodKey {
            namespace: "ml".into(),
            name: name.into(),
        })
    };
    assert_eq!(
        actions(&plan, "a"),
        [evict("train"), evict("monitor")],
        "a terminating pod is not evicted again"
    );
    assert_eq!(next_state(&plan, "a"), None);
    facts.pods.retain(|p| p.gpu_use.is_none() || p.protected);
    let plan = one(&settings(), &facts, t(6));
    assert_eq!(next_state(&plan, "a"), Some(Some(PodRestartRequired)));
}

#[test]
fn a_daemonset_gpu_user_made_again_after_its_eviction_is_not_chased() {
    let mut facts = node("a", Some(PodDeletionRequired), "old");
    facts.pods = vec![PodFacts {
        gpu_use: Some("its processes use GPU 1".into()),
        daemon_set: true,
        created: Some(t(3)),
        ..gpu_pod("monitor-new")
    }];
    assert_eq!(
        next_state(&one(&settings(), &facts, t(5)), "a"),
        Some(Some(PodRestartRequired))
    );
}

#[test]
fn pod_deletion_fails_with_the_reason_at_its_timeout_or_at_a_pod_it_may_not_evict() {
    let mut facts = node("a", Some(PodDeletionRequired), "old");
    facts.pods = vec![PodFacts {
        refusal: Some("Cannot evict pod as it would violate the pod's disruption budget.".into()),
        ..gpu_pod("train")
    }];
    let waiting = one(&settings(), &facts, t(299));
    assert_eq!(next_state(&waiting, "a"), None);
    assert!(
        step(&waiting, "a")
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .contains("disruption budget")
    );
    assert_eq!(
        waiting.wake_at,
        Some(t(300)),
        "the timeout comes before the next look"
    );
    let failed = one(&settings(), &facts, t(300));
    assert_eq!(next_state(&failed, "a"), Some(Some(UpgradeFailed)));
    let transition = step(&failed, "a").unwrap().transition.clone().unwrap();
    assert!(
        transition
            .reason
            .starts_with("pod deletion failed: evicting ml/train (Cannot evict"),
        "{}",
        transition.reason
    );
    assert!(
        transition.reason.contains("after 300s"),
        "{}",
        transition.reason
    );
    assert_eq!(
        transition.patch.annotations[FAILED_REVISION_ANNOTATION].as_deref(),
        Some("new")
    );
    assert_eq!(
        transition.patch.annotations[REASON_ANNOTATION].as_deref(),
        Some(transition.reason.as_str())
    );
    assert_eq!(
        failed.summary.failures,
        [("a".to_owned(), transition.reason.clone())]
    );

    facts.pods = vec![PodFacts {
        controlled: false,
        ..gpu_pod("bare")
    }];
    let refused = one(&settings(), &facts, t(1));
    let reason = step(&refused, "a")
        .unwrap()
        .transition
        .as_ref()
        .unwrap()
        .reason
        .clone();
    assert!(
        reason.contains("ml/bare has no controller") && reason.contains("podDeletion.force"),
        "{reason}"
    );
    let mut forced = settings();
    forced.pod_deletion.force = true;
    assert_eq!(actions(&one(&forced, &facts, t(1)), "a").len(), 1);

    facts.pods = vec![PodFacts {
        empty_dir: true,
        ..gpu_pod("scratch")
    }];
    let reason = one(&settings(), &facts, t(1)).steps[0]
        .transition
        .clone()
        .unwrap()
        .reason;
    assert!(reason.contains("podDeletion.deleteEmptyDir"), "{reason}");
}

#[test]
fn with_drain_on_pod_deletion_hands_what_it_cannot_do_to_the_drain() {
    let mut s = settings();
    s.drain = Some(Drain {
        force: true,
        pod_selector: None,
        timeout: Some(Duration::from_secs(60)),
        delete_empty_dir: true,
    });
    let mut facts = node("a", Some(PodDeletionRequired), "old");
    facts.pods = vec![PodFacts {
        controlled: false,
        ..gpu_pod("bare")
    }];
    assert_eq!(
        next_state(&one(&s, &facts, t(1)), "a"),
        Some(Some(DrainRequired))
    );
    facts.pods.clear();
    assert_eq!(
        next_state(&one(&s, &facts, t(1)), "a"),
        Some(Some(DrainRequired))
    );
}

#[test]
fn drain_evicts_selected_pods_but_not_daemonsets_operands_or_skipped_pods() {
    let mut s = settings();
    s.drain = Some(Drain {
        force: false,
        pod_selector: Some("tier=batch".into()),
        timeout: Some(Duration::from_secs(60)),
        delete_empty_dir: false,
    });
    let mut facts = node("a", Some(DrainRequired), "old");
    let plain = |name: &str| PodFacts {
        gpu_use: None,
        ..gpu_pod(name)
    };
    facts.pods = vec![
        plain("batch"),
        PodFacts {
            drain_selected: false,
            ..plain("web")
        },
        PodFacts {
            daemon_set: true,
            ..plain("logs")
        },
        PodFacts {
            protected: true,
            ..plain("skip-me")
        },
        PodFacts {
            mirror: true,
            ..plain("static")
        },
        PodFacts {
            finished: true,
            ..plain("done")
        },
    ];
    let plan = one(&s, &facts, t(1));
    assert_eq!(
        actions(&plan, "a"),
        [Action::Evict(PodKey {
            namespace: "ml".into(),
            name: "batch".into()
        })]
    );
    assert_eq!(
        next_state(&one(&s, &facts, t(60)), "a"),
        Some(Some(UpgradeFailed))
    );
    facts.pods.remove(0);
    assert_eq!(
        next_state(&one(&s, &facts, t(2)), "a"),
        Some(Some(PodRestartRequired))
    );
    // Drain off: the state passes on.
    assert_eq!(
        next_state(&one(&settings(), &facts, t(2)), "a"),
        Some(Some(PodRestartRequired))
    );
}

#[test]
fn pod_restart_deletes_the_old_pod_once_and_waits_for_the_new_one() {
    let mut facts = node("a", Some(PodRestartRequired), "old");
    let plan = one(&settings(), &facts, t(1));
    assert_eq!(
        actions(&plan, "a"),
        [Action::DeleteDriverPod("driver-a".into())]
    );
    assert_eq!(next_state(&plan, "a"), None);
    assert_eq!(
        plan.wake_at,
        Some(t(0) + settings().restart_timeout),
        "wakes at the timeout"
    );
    facts
        .driver
        .as_mut()
        .unwrap()
        .pod
        .as_mut()
        .unwrap()
        .terminating = true;
    assert_eq!(
        actions(&one(&settings(), &facts, t(2)), "a"),
        [],
        "not deleted twice"
    );
    facts.driver.as_mut().unwrap().pod = None;
    assert_eq!(actions(&one(&settings(), &facts, t(3)), "a"), []);
    facts.driver.as_mut().unwrap().pod = Some(DriverPod {
        name: "driver-a-2".into(),
        revision: Some("new".into()),
        ready: false,
        terminating: false,
        created: Some(t(4)),
    });
    let plan = one(&settings(), &facts, t(5));
    assert_eq!(actions(&plan, "a"), []);
    assert!(
        step(&plan, "a")
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .contains("driver-a-2")
    );
    let timed_out = one(&settings(), &facts, t(1800));
    let reason = step(&timed_out, "a")
        .unwrap()
        .transition
        .clone()
        .unwrap()
        .reason;
    assert_eq!(next_state(&timed_out, "a"), Some(Some(UpgradeFailed)));
    assert!(
        reason.contains("driver pod driver-a-2 of revision new to become ready after 1800s"),
        "{reason}"
    );
    facts.driver.as_mut().unwrap().pod.as_mut().unwrap().ready = true;
    assert_eq!(
        next_state(&one(&settings(), &facts, t(6)), "a"),
        Some(Some(ValidationRequired))
    );
}

#[test]
fn validation_needs_a_validator_pod_started_after_the_new_driver() {
    let mut facts = node("a", Some(ValidationRequired), "new");
    facts.driver.as_mut().unwrap().pod.as_mut().unwrap().created = Some(t(10));
    facts.validator = Validator::Pod(ValidatorPod {
        name: "validator-a".into(),
        ready: true,
        terminating: false,
        created: Some(t(-500)),
    });
    let plan = one(&settings(), &facts, t(11));
    assert_eq!(
        actions(&plan, "a"),
        [Action::DeleteValidatorPod("validator-a".into())]
    );
    assert_eq!(next_state(&plan, "a"), None);
    facts.validator = Validator::Pod(ValidatorPod {
        name: "validator-a2".into(),
        ready: false,
        terminating: false,
        created: Some(t(12)),
    });
    let plan = one(&settings(), &facts, t(13));
    assert_eq!(
        actions(&plan, "a"),
        [],
        "the new validator is not restarted"
    );
    assert_eq!(next_state(&plan, "a"), None);
    let timed_out = one(&settings(), &facts, t(600));
    assert_eq!(next_state(&timed_out, "a"), Some(Some(UpgradeFailed)));
    if let Validator::Pod(pod) = &mut facts.validator {
        pod.ready = true;
    }
    assert_eq!(
        next_state(&one(&settings(), &facts, t(14)), "a"),
        Some(Some(UncordonRequired))
    );
    facts.validator = Validator::Missing;
    assert_eq!(next_state(&one(&settings(), &facts, t(14)), "a"), None);
    facts.validator = Validator::NotDeployed;
    assert_eq!(
        next_state(&one(&settings(), &facts, t(14)), "a"),
        Some(Some(UncordonRequired))
    );
}

#[test]
fn a_newer_revision_during_validation_restarts_the_driver_again() {
    let facts = node("a", Some(ValidationRequired), "old");
    assert_eq!(
        next_state(&one(&settings(), &facts, t(1)), "a"),
        Some(Some(PodRestartRequired))
    );
}

#[test]
fn uncordon_then_done_clears_the_upgrade_annotations() {
    let mut facts = node("a", Some(UncordonRequired), "new");
    facts.unschedulable = true;
    let plan = one(&settings(), &facts, t(1));
    assert_eq!(actions(&plan, "a"), [Action::Uncordon]);
    let patch = &step(&plan, "a").unwrap().transition.as_ref().unwrap().patch;
    assert_eq!(patch.labels[STATE_LABEL].as_deref(), Some("upgrade-done"));
    for key in [
        INITIAL_UNSCHEDULABLE_ANNOTATION,
        FAILED_REVISION_ANNOTATION,
        REASON_ANNOTATION,
    ] {
        assert_eq!(patch.annotations[key], None, "{key}");
    }
}

#[test]
fn a_failed_node_stays_failed_until_a_new_revision_or_a_validated_driver() {
    let mut facts = node("a", Some(UpgradeFailed), "old");
    facts.unschedulable = true;
    facts.failed_revision = Some("new".into());
    facts.reason = Some("the new driver did not start".into());
    let plan = one(&settings(), &facts, t(100_000));
    assert!(
        plan.steps.is_empty(),
        "no timeout leaves upgrade-failed, and never to upgrade-done"
    );
    assert_eq!(plan.summary.failed, 1);
    assert_eq!(plan.summary.failures[0].1, "the new driver did not start");
    // Its driver pod at the failed revision, Ready, but not validated: still failed.
    facts
        .driver
        .as_mut()
        .unwrap()
        .pod
        .as_mut()
        .unwrap()
        .revision = Some("new".into());
    facts.validator = Validator::Pod(ValidatorPod {
        name: "v".into(),
        ready: false,
        terminating: false,
        created: Some(t(5)),
    });
    assert!(one(&settings(), &facts, t(10)).steps.is_empty());
    // Validated after all: uncordon, then done.
    facts.validator = Validator::Pod(ValidatorPod {
        name: "v".into(),
        ready: true,
        terminating: false,
        created: Some(t(5)),
    });
    assert_eq!(
        next_state(&one(&settings(), &facts, t(10)), "a"),
        Some(Some(UncordonRequired))
    );
    // A newer revision resumes it, keeping it cordoned.
    facts.driver.as_mut().unwrap().revision = "newer".into();
    let plan = one(&settings(), &facts, t(10));
    assert_eq!(next_state(&plan, "a"), Some(Some(UpgradeRequired)));
    let patch = &plan.steps[0].transition.as_ref().unwrap().patch;
    assert!(
        !patch
            .annotations
            .contains_key(INITIAL_UNSCHEDULABLE_ANNOTATION),
        "the upgrade cordoned it, not the admin"
    );
    assert_eq!(patch.annotations[REASON_ANNOTATION], None);
}

#[test]
fn the_admins_label_resumes_a_failed_node() {
    let mut facts = node("a", Some(UpgradeFailed), "old");
    facts.failed_revision = Some("new".into());
    facts.unschedulable = true;
    facts.label = Some("upgrade-required".into());
    // It is cordoned, so starting it makes nothing more unavailable.
    let plan = one(&settings(), &facts, t(1));
    assert_eq!(next_state(&plan, "a"), Some(Some(CordonRequired)));
}

#[test]
fn slots_keep_to_max_parallel_upgrades_in_name_order() {
    let mut s = settings();
    s.max_parallel = Some(2);
    let nodes: Vec<NodeFacts> = ["n3", "n1", "n2", "n4"]
        .iter()
        .map(|name| node(name, Some(UpgradeRequired), "old"))
        .collect();
    let plan = plan(&s, &nodes, t(0));
    let started: Vec<&str> = plan
        .steps
        .iter()
        .filter(|s| {
            s.transition
                .as_ref()
                .is_some_and(|t| t.to == Some(CordonRequired))
        })
        .map(|s| s.node.as_str())
        .collect();
    assert_eq!(started, ["n1", "n2"]);
    assert!(
        step(&plan, "n3")
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .contains("maxParallelUpgrades")
    );
    assert_eq!(plan.summary.in_progress, 2);
    assert_eq!(plan.summary.pending, 2);
    assert_eq!(plan.summary.available, 0);

    let mut nodes = nodes;
    nodes[0] = node("n3", Some(DrainRequired), "old");
    nodes[0].unschedulable = true;
    let plan = super::decide::plan(&s, &nodes, t(0));
    let started: Vec<&str> = plan
        .steps
        .iter()
        .filter(|s| {
            s.transition
                .as_ref()
                .is_some_and(|t| t.to == Some(CordonRequired))
        })
        .map(|s| s.node.as_str())
        .collect();
    assert_eq!(started, ["n1"], "one slot is taken");
    s.max_parallel = None;
    let plan = super::decide::plan(&s, &nodes, t(0));
    assert_eq!(plan.summary.in_progress, 4, "0 is no limit");
}

#[test]
fn slots_keep_to_max_unavailable_counting_nodes_already_unavailable() {
    let mut s = settings();
    s.max_parallel = None;
    s.max_unavailable = MaxUnavailable::Nodes(2);
    let mut nodes: Vec<NodeFacts> = (0..4)
        .map(|i| node(&format!("n{i}"), Some(UpgradeRequired), "old"))
        .collect();
    nodes[3].ready = false;
    let plan = plan(&s, &nodes, t(0));
    let started = plan
        .steps
        .iter()
        .filter(|s| {
            s.transition
                .as_ref()
                .is_some_and(|t| t.to == Some(CordonRequired))
        })
        .count();
    // n3 is NotReady (unavailable, and may start without adding any); one more of n0..n2 fits.
    assert_eq!(started, 2);
    assert_eq!(next_state(&plan, "n3"), Some(Some(CordonRequired)));
    assert!(
        step(&plan, "n1")
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .contains("maxUnavailable")
    );
    s.max_unavailable = MaxUnavailable::Nodes(0);
    nodes[3].ready = true;
    assert_eq!(super::decide::plan(&s, &nodes, t(0)).summary.in_progress, 0);
}

#[test]
fn auto_upgrade_off_starts_nothing_finishes_what_runs_and_drops_idle_labels() {
    let mut s = settings();
    s.auto_upgrade = false;
    assert!(one(&s, &node("a", None, "old"), t(0)).steps.is_empty());
    assert_eq!(
        next_state(
            &one(&s, &node("a", Some(UpgradeRequired), "old"), t(0)),
            "a"
        ),
        Some(None)
    );
    assert_eq!(
        next_state(&one(&s, &node("a", Some(UpgradeDone), "new"), t(0)), "a"),
        Some(None)
    );
    let mut uncordon = node("a", Some(UncordonRequired), "new");
    uncordon.unschedulable = true;
    assert_eq!(actions(&one(&s, &uncordon, t(0)), "a"), [Action::Uncordon]);
}

#[test]
fn a_node_no_driver_daemonset_selects_is_released() {
    let mut facts = node("a", Some(DrainRequired), "old");
    facts.driver = None;
    facts.unschedulable = true;
    let plan = one(&settings(), &facts, t(0));
    assert_eq!(actions(&plan, "a"), [Action::Uncordon]);
    assert_eq!(next_state(&plan, "a"), Some(None));
    let patch = &plan.steps[0].transition.as_ref().unwrap().patch;
    assert_eq!(patch.labels[STATE_LABEL], None);
    facts.label = None;
    assert!(
        one(&settings(), &facts, t(0)).steps.is_empty(),
        "never in the upgrade"
    );
}

#[test]
fn a_state_without_its_start_time_records_it_and_times_out_from_there() {
    let mut facts = node("a", Some(PodRestartRequired), "new");
    facts.driver.as_mut().unwrap().pod.as_mut().unwrap().ready = false;
    facts.since = None;
    let plan = one(&settings(), &facts, t(5000));
    let transition = plan.steps[0].transition.clone().unwrap();
    assert_eq!(transition.to, Some(PodRestartRequired));
    assert_eq!(
        transition.patch.annotations[STATE_SINCE_ANNOTATION].as_deref(),
        Some(t(5000).to_string().as_str())
    );
}

#[test]
fn an_unknown_label_value_is_treated_as_no_state() {
    let mut facts = node("a", None, "new");
    facts.label = Some("upgrade-in-progress".into());
    assert_eq!(
        next_state(&one(&settings(), &facts, t(0)), "a"),
        Some(Some(UpgradeDone))
    );
}

/// The whole walk of one node, each pass fed what the previous one did, and an operator restart (a fresh pass on
/// the same facts) at every state: the same decision, so nothing is done twice.
#[test]
fn a_full_upgrade_walks_every_state_in_order_and_each_restart_decides_the_same() {
    let mut s = settings();
    s.drain = Some(Drain {
        force: false,
        pod_selector: None,
        timeout: None,
        delete_empty_dir: false,
    });
    let mut facts = node("a", None, "old");
    facts.validator = Validator::NotDeployed;
    facts.pods = vec![gpu_pod("train")];
    let mut seen = Vec::new();
    let mut now = 0;
    while facts.state() != Some(UpgradeDone) {
        now += 1;
        assert!(now < 50, "stuck in {:?}: {seen:?}", facts.state());
        let plan = one(&s, &facts, t(now));
        assert_eq!(
            plan,
            one(&s, &facts, t(now)),
            "a restarted operator decides the same"
        );
        let Some(step) = step(&plan, "a").cloned() else {
            panic!("no step in {:?}", facts.state());
        };
        for action in &step.actions {
            match action {
                Action::Evict(_) => facts.pods.clear(),
                Action::DeleteDriverPod(_) => {
                    facts.driver.as_mut().unwrap().pod = Some(DriverPod {
                        name: "driver-a-new".into(),
                        revision: Some("new".into()),
                        ready: true,
                        terminating: false,
                        created: Some(t(now)),
                    });
                }
                _ => {}
            }
        }
        apply(&mut facts, &step);
        if let Some(state) = facts.state()
            && seen.last() != Some(&state)
        {
            seen.push(state);
        }
    }
    assert_eq!(
        seen,
        [
            UpgradeRequired,
            CordonRequired,
            WaitForJobsRequired,
            PodDeletionRequired,
            DrainRequired,
            PodRestartRequired,
            ValidationRequired,
            UncordonRequired,
            UpgradeDone
        ]
    );
    assert!(!facts.unschedulable);
}

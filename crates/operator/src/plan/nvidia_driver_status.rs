//! The status of one NVIDIADriver as a pure function of the node assignment and its DaemonSets: `ready` once each
//! of its DaemonSets has rolled out on its nodes, `notReady` while not or while it is refused (the conditions say
//! why), `disabled` when the ClusterPolicy does not hand drivers to NVIDIADriver objects. Conditions `Ready` and
//! `Error` as NVIDIA writes them.

use std::collections::BTreeMap;

use crd::nvidia_driver::{NvidiaDriverState, NvidiaDriverStatus};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::driver_assignment::Conflict;
use super::status::{condition, reason, rollout};

/// What became of the object in the assignment, with what its status is computed from.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// The ClusterPolicy does not set `driver.useNvidiaDriverCRD`.
    Disabled,
    /// Refused: another object drives one of its nodes.
    Refused(&'a Conflict),
    /// Accepted: the DaemonSets rendered for it (by name) and those that exist.
    Accepted {
        nodes: usize,
        rendered: &'a [String],
        daemonsets: &'a BTreeMap<String, &'a DaemonSet>,
    },
}

/// Reason of the `Ready=False` condition of a refused object.
pub const CONFLICT_REASON: &str = "ConflictingNodeSelector";
/// Reason of the `Ready=False` condition of an object whose drivers are not up yet.
pub const NOT_READY_REASON: &str = "DriverNotReady";
/// Reason of both conditions of a disabled object.
pub const DISABLED_REASON: &str = "NVIDIADriverCRDDisabled";

/// The status to write for an object of `generation`, keeping each condition's transition time from `previous`
/// while its status holds.
pub fn compute(
    outcome: &Outcome<'_>,
    namespace: &str,
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> NvidiaDriverStatus {
    let (state, problem, reason_false) = match outcome {
        Outcome::Disabled => (
            NvidiaDriverState::Disabled,
            Some(
                "the ClusterPolicy's driver.useNvidiaDriverCRD is not true, so its driver section runs the drivers"
                    .to_owned(),
            ),
            DISABLED_REASON,
        ),
        Outcome::Refused(conflict) => (
            NvidiaDriverState::NotReady,
            Some(conflict.to_string()),
            CONFLICT_REASON,
        ),
        Outcome::Accepted {
            nodes,
            rendered,
            daemonsets,
        } => {
            let problems: Vec<String> = rendered
                .iter()
                .filter_map(|name| rollout(name, daemonsets.get(name).copied()).problem)
                .collect();
            if problems.is_empty() {
                (NvidiaDriverState::Ready, None, NOT_READY_REASON)
            } else {
                (
                    NvidiaDriverState::NotReady,
                    Some(format!("{nodes} nodes: {}", problems.join("; "))),
                    NOT_READY_REASON,
                )
            }
        }
    };
    let ready = problem.is_none();
    let message = problem.clone().unwrap_or_default();
    let refused = matches!(outcome, Outcome::Refused(_));
    let conditions = vec![
        condition(
            previous,
            reason::READY,
            ready,
            if ready { reason::READY } else { reason_false },
            &message,
            generation,
            now,
        ),
        // NVIDIA's Error condition is true only for a failure of the object itself, not for drivers still starting.
        condition(
            previous,
            reason::ERROR,
            refused,
            if refused {
                CONFLICT_REASON
            } else {
                reason::READY
            },
            if refused { &message } else { "" },
            generation,
            now,
        ),
    ];
    NvidiaDriverStatus {
        state,
        namespace: Some(namespace.to_owned()),
        conditions,
    }
}

/// Whether `status` accepted `generation`: its Ready condition was computed for that generation and does not
/// report a refusal. Such an object is settled for the assignment and keeps its nodes against new objects.
pub fn accepted(status: Option<&NvidiaDriverStatus>, generation: Option<i64>) -> bool {
    status
        .and_then(|status| {
            status
                .conditions
                .iter()
                .find(|condition| condition.type_ == reason::READY)
        })
        .is_some_and(|ready| {
            ready.observed_generation == generation
                && ready.reason != CONFLICT_REASON
                && ready.reason != DISABLED_REASON
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::from_second(1_800_000_000).expect("a valid time"))
    }

    fn daemonset(desired: i32, available: i32) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                generation: Some(1),
                ..ObjectMeta::default()
            },
            status: Some(DaemonSetStatus {
                observed_generation: Some(1),
                desired_number_scheduled: desired,
                updated_number_scheduled: Some(desired),
                number_available: Some(available),
                ..DaemonSetStatus::default()
            }),
            ..DaemonSet::default()
        }
    }

    #[test]
    fn a_refused_object_is_not_ready_with_the_conflict_in_both_conditions() {
        let conflict = Conflict {
            node: Some("a100-0".into()),
            refused: "default".into(),
            holder: "a100-driver".into(),
        };
        let status = compute(
            &Outcome::Refused(&conflict),
            "gpu-operator",
            Some(1),
            &[],
            &now(),
        );
        assert_eq!(status.state, NvidiaDriverState::NotReady);
        let [ready, error] = &status.conditions[..] else {
            panic!("two conditions: {status:?}")
        };
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", CONFLICT_REASON)
        );
        assert_eq!(
            (error.status.as_str(), error.reason.as_str()),
            ("True", CONFLICT_REASON)
        );
        for name in ["a100-0", "default", "a100-driver"] {
            assert!(ready.message.contains(name), "{}", ready.message);
        }
        assert!(!accepted(Some(&status), Some(1)));
    }

    #[test]
    fn an_accepted_object_is_ready_once_every_daemonset_rolled_out() {
        let rendered = ["nvidia-gpu-driver-a100-ubuntu22.04".to_owned()];
        let starting = daemonset(2, 1);
        let daemonsets = BTreeMap::from([(rendered[0].clone(), &starting)]);
        let outcome = Outcome::Accepted {
            nodes: 2,
            rendered: &rendered,
            daemonsets: &daemonsets,
        };
        let status = compute(&outcome, "gpu-operator", Some(3), &[], &now());
        assert_eq!(status.state, NvidiaDriverState::NotReady);
        assert!(
            status.conditions[0]
                .message
                .contains("1 of 2 nodes available"),
            "{status:?}"
        );
        // Not ready yet, but accepted: it keeps its nodes.
        assert!(accepted(Some(&status), Some(3)));
        assert!(
            !accepted(Some(&status), Some(4)),
            "an edit is not accepted yet"
        );

        let up = daemonset(2, 2);
        let daemonsets = BTreeMap::from([(rendered[0].clone(), &up)]);
        let outcome = Outcome::Accepted {
            nodes: 2,
            rendered: &rendered,
            daemonsets: &daemonsets,
        };
        let ready = compute(
            &outcome,
            "gpu-operator",
            Some(3),
            &status.conditions,
            &now(),
        );
        assert_eq!(ready.state, NvidiaDriverState::Ready);
        assert_eq!(ready.conditions[0].status, "True");
        assert_eq!(ready.conditions[1].status, "False");
    }

    #[test]
    fn a_disabled_object_says_which_field_hands_drivers_to_it() {
        let status = compute(&Outcome::Disabled, "gpu-operator", Some(1), &[], &now());
        assert_eq!(status.state, NvidiaDriverState::Disabled);
        assert!(
            status.conditions[0]
                .message
                .contains("driver.useNvidiaDriverCRD")
        );
        assert!(!accepted(Some(&status), Some(1)));
    }
}

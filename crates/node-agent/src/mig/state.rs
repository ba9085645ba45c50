//! The MIG manager's decisions, pure: what to do about one observation of the node ([`decide`]), and which step
//! follows another ([`next`]). The runner carries the steps out; keeping the order here makes the rules (pause
//! before evicting, evict only when a GPU is disturbed, roll back only once GPUs were touched, reboot at most
//! once) testable without a cluster or GPUs.

/// What was asked: the config name and the config file's contents, so that a failed request is not retried until
/// one of them changes (and is retried as soon as one does).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    /// The config name.
    pub config: String,
    /// A fingerprint of the config file's text.
    pub file: u64,
}

/// What to do about one observation of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No config is asked for (no label, no default): leave the GPUs alone.
    Idle,
    /// This request failed before and nothing has changed since: wait.
    AlreadyFailed,
    /// The request cannot be applied (bad config, unknown name, geometry that cannot exist): fail without
    /// touching anything, for the reason the assessment gave.
    Reject,
    /// The GPUs already have the geometry.
    Converged,
    /// Change the GPUs, starting (or resuming) with [`Step::Pause`].
    Change,
}

/// How the GPUs compare with the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assessment {
    /// Every GPU already has its entry's geometry.
    Matches,
    /// Some GPU needs changing.
    Differs,
    /// The request cannot be applied to these GPUs.
    Impossible,
}

/// What one observation says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation<'a> {
    /// The request, when a config is asked for.
    pub request: Option<&'a Request>,
    /// How the GPUs compare with the request.
    pub assessment: Assessment,
    /// Whether a change was underway (its record is on the Node).
    pub in_progress: bool,
    /// The request that failed last, if any.
    pub failed: Option<&'a Request>,
}

/// Decides what to do about an observation.
#[must_use]
pub fn decide(observation: Observation<'_>) -> Decision {
    let Some(request) = observation.request else {
        return Decision::Idle;
    };
    // A change left underway (a crash) is always finished, even for a request that failed before.
    if !observation.in_progress && observation.failed == Some(request) {
        return Decision::AlreadyFailed;
    }
    match observation.assessment {
        Assessment::Impossible => Decision::Reject,
        Assessment::Matches => Decision::Converged,
        Assessment::Differs => Decision::Change,
    }
}

/// The steps of a change, in order. Each is idempotent, so a restarted agent runs them again from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Set the state to pending, pause the GPU clients, record what to restore.
    Pause,
    /// Wait for the GPU clients' pods to leave the node.
    WaitForClients,
    /// Evict the pods that use the GPUs being disturbed.
    Evict,
    /// Change MIG modes, reset what must be reset, create and destroy instances.
    ChangeGpus,
    /// Read the GPUs back and compare with the config.
    Verify,
}

/// How a step ended; `E` is why a step fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<E> {
    /// It did its work.
    Done,
    /// A MIG mode change needs a reset the platform cannot do.
    NeedsReboot,
    /// It failed.
    Failed(E),
}

/// Why a change fails: a step's error `E`, or a reset only a reboot could give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure<E> {
    /// A step failed.
    #[error(transparent)]
    Step(E),
    /// The node rebooted for this change and the new MIG mode is still pending.
    #[error(
        "a MIG mode change is still pending after the node rebooted: the platform did not apply it at boot; \
         check that the hypervisor or firmware lets this node change MIG mode"
    )]
    PendingAfterReboot,
    /// A reset is needed, the platform cannot do it, and rebooting is not allowed.
    #[error(
        "a MIG mode change needs a GPU reset, which this platform cannot do; set WITH_REBOOT=true \
         (migManager.env) to let the MIG manager reboot the node"
    )]
    RebootNotAllowed,
}

/// What follows a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next<E> {
    /// Run this step.
    Run(Step),
    /// Record the state `rebooting` and reboot; the restarted agent resumes the change.
    Reboot,
    /// Restore the clients and set the state to success.
    Succeed,
    /// Restore the clients and set the state to failed; put the GPUs back first when `roll_back`.
    Fail {
        /// Why.
        reason: Failure<E>,
        /// Whether the GPUs may have been touched, so their previous geometry must be restored.
        roll_back: bool,
    },
}

/// Facts the transitions depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    /// Whether some GPU is disturbed (reset, or instances destroyed), so its workloads must leave.
    pub disrupts: bool,
    /// Whether `WITH_REBOOT` allows rebooting the node.
    pub with_reboot: bool,
    /// Reboots this change has already done.
    pub reboots: u32,
}

/// The step after `step` ended with `outcome`.
#[must_use]
pub fn next<E>(step: Step, outcome: Outcome<E>, context: Context) -> Next<E> {
    let touched = matches!(step, Step::ChangeGpus | Step::Verify);
    match outcome {
        Outcome::Failed(error) => Next::Fail {
            reason: Failure::Step(error),
            roll_back: touched,
        },
        Outcome::NeedsReboot if context.reboots > 0 => Next::Fail {
            reason: Failure::PendingAfterReboot,
            roll_back: true,
        },
        Outcome::NeedsReboot if context.with_reboot => Next::Reboot,
        Outcome::NeedsReboot => Next::Fail {
            reason: Failure::RebootNotAllowed,
            roll_back: true,
        },
        Outcome::Done => match step {
            Step::Pause => Next::Run(Step::WaitForClients),
            Step::WaitForClients if context.disrupts => Next::Run(Step::Evict),
            Step::WaitForClients | Step::Evict => Next::Run(Step::ChangeGpus),
            Step::ChangeGpus => Next::Run(Step::Verify),
            Step::Verify => Next::Succeed,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTEXT: Context = Context {
        disrupts: true,
        with_reboot: false,
        reboots: 0,
    };

    /// A step's error, as the runner's would be.
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    #[error("{0}")]
    struct StepFailed(&'static str);

    fn request(config: &str) -> Request {
        Request {
            config: config.into(),
            file: 1,
        }
    }

    #[test]
    fn decisions_follow_the_observation() {
        let asked = request("all-1g.10gb");
        let observe = |assessment, in_progress, failed| Observation {
            request: Some(&asked),
            assessment,
            in_progress,
            failed,
        };
        assert_eq!(
            decide(Observation {
                request: None,
                ..observe(Assessment::Differs, false, None)
            }),
            Decision::Idle
        );
        assert_eq!(
            decide(observe(Assessment::Matches, false, None)),
            Decision::Converged
        );
        assert_eq!(
            decide(observe(Assessment::Differs, false, None)),
            Decision::Change
        );
        assert_eq!(
            decide(observe(Assessment::Impossible, false, None)),
            Decision::Reject
        );
        assert_eq!(
            decide(observe(Assessment::Differs, false, Some(&asked))),
            Decision::AlreadyFailed
        );
        let other = request("all-balanced");
        assert_eq!(
            decide(observe(Assessment::Differs, false, Some(&other))),
            Decision::Change,
            "a new request is tried even after a failure"
        );
        assert_eq!(
            decide(observe(Assessment::Differs, true, Some(&asked))),
            Decision::Change,
            "a change left underway is finished"
        );
    }

    #[test]
    fn a_change_runs_every_step_in_order() {
        let mut step = Step::Pause;
        let mut seen = vec![step];
        loop {
            match next(step, Outcome::<StepFailed>::Done, CONTEXT) {
                Next::Run(following) => {
                    step = following;
                    seen.push(step);
                }
                other => {
                    assert_eq!(other, Next::Succeed);
                    break;
                }
            }
        }
        assert_eq!(
            seen,
            [
                Step::Pause,
                Step::WaitForClients,
                Step::Evict,
                Step::ChangeGpus,
                Step::Verify
            ]
        );
    }

    #[test]
    fn nothing_is_evicted_when_no_gpu_is_disturbed() {
        let context = Context {
            disrupts: false,
            ..CONTEXT
        };
        assert_eq!(
            next(Step::WaitForClients, Outcome::<StepFailed>::Done, context),
            Next::Run(Step::ChangeGpus)
        );
    }

    #[test]
    fn rollback_only_once_gpus_were_touched() {
        for (step, roll_back) in [
            (Step::Pause, false),
            (Step::WaitForClients, false),
            (Step::Evict, false),
            (Step::ChangeGpus, true),
            (Step::Verify, true),
        ] {
            assert_eq!(
                next(step, Outcome::Failed(StepFailed("x")), CONTEXT),
                Next::Fail {
                    reason: Failure::Step(StepFailed("x")),
                    roll_back
                },
                "{step:?}"
            );
        }
    }

    #[test]
    fn reboot_only_when_allowed_and_only_once() {
        let Next::Fail { reason, roll_back } = next(
            Step::ChangeGpus,
            Outcome::<StepFailed>::NeedsReboot,
            CONTEXT,
        ) else {
            panic!("fails without WITH_REBOOT");
        };
        assert_eq!(reason, Failure::RebootNotAllowed);
        assert!(reason.to_string().contains("set WITH_REBOOT=true") && roll_back);
        let allowed = Context {
            with_reboot: true,
            ..CONTEXT
        };
        assert_eq!(
            next(
                Step::ChangeGpus,
                Outcome::<StepFailed>::NeedsReboot,
                allowed
            ),
            Next::Reboot
        );
        let rebooted = Context {
            reboots: 1,
            ..allowed
        };
        assert_eq!(
            next(
                Step::ChangeGpus,
                Outcome::<StepFailed>::NeedsReboot,
                rebooted
            ),
            Next::Fail {
                reason: Failure::PendingAfterReboot,
                roll_back: true
            }
        );
    }
}

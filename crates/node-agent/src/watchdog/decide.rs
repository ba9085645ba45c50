//! When to signal: pure, from each pass's usage and the time. A pod's processes on a GPU are summed against the
//! pod's budget there. Over it for longer than the grace period, the pod's largest process there gets SIGTERM;
//! still running after the kill grace period, SIGKILL. Back under the budget at any point, the clock starts over:
//! a spike that ends inside the grace period costs nothing. One process is signalled at a time, the largest first,
//! as the kernel's OOM killer picks; if the pod is still over once it is gone, the next follows without a new
//! grace period.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpu::HostProcess;

use super::budget::Budget;
use crate::accounting::ContainerRef;

/// The timing and whether signals are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// How long a pod may stay over its budget before SIGTERM.
    pub grace: Duration,
    /// How long after SIGTERM before SIGKILL.
    pub kill_grace: Duration,
    /// Report and record, never signal.
    pub dry_run: bool,
}

/// One process of a pod on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProcess {
    /// The process.
    pub process: HostProcess,
    /// Its container.
    pub container: String,
    /// GPU memory it uses in bytes.
    pub used_bytes: u64,
}

/// A pod's use of one GPU it has a budget on, at one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUse {
    /// The pod (its `container` is unused here: each process names its own).
    pub pod: ContainerRef,
    /// The GPU's index.
    pub gpu: u32,
    /// The GPU's UUID.
    pub gpu_uuid: String,
    /// The pod's budget there.
    pub budget: Budget,
    /// Its processes there.
    pub processes: Vec<PodProcess>,
}

impl PodUse {
    /// What the pod's processes use together.
    #[must_use]
    pub fn used_bytes(&self) -> u64 {
        self.processes
            .iter()
            .map(|process| process.used_bytes)
            .sum()
    }
}

/// A signal the watchdog sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// Asks the process to end.
    Term,
    /// Ends it.
    Kill,
}

impl Signal {
    /// Its name, the `signal` label.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Term => "SIGTERM",
            Self::Kill => "SIGKILL",
        }
    }
}

/// What to do to one process, with what the event says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    /// The signal.
    pub signal: Signal,
    /// To whom.
    pub target: PodProcess,
    /// The pod's use of the GPU that led to it.
    pub over: PodUse,
    /// How long the pod has been over its budget.
    pub over_for: Duration,
    /// Whether this is a dry run (report, do not signal).
    pub dry_run: bool,
}

/// A signal sent, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sent {
    process: HostProcess,
    signal: Signal,
    at: Instant,
}

/// A pod over its budget on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Over {
    since: Instant,
    sent: Option<Sent>,
}

/// The watchdog's memory between passes: which pods are over, since when, and what was sent.
#[derive(Debug)]
pub struct Decider {
    settings: Settings,
    over: BTreeMap<(String, u32), Over>,
}

impl Decider {
    /// A decider with these settings and nobody over.
    #[must_use]
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            over: BTreeMap::new(),
        }
    }

    /// The actions of one pass at `now`, over every pod's use of every GPU it has a budget on.
    pub fn pass(&mut self, uses: &[PodUse], now: Instant) -> Vec<Action> {
        let mut still_over = BTreeMap::new();
        let mut actions = Vec::new();
        for pod_use in uses {
            if pod_use.used_bytes() <= pod_use.budget.bytes {
                continue;
            }
            let key = (pod_use.pod.pod_uid.clone(), pod_use.gpu);
            let mut over = self.over.get(&key).copied().unwrap_or(Over {
                since: now,
                sent: None,
            });
            if let Some(action) = self.next_signal(pod_use, &mut over, now) {
                actions.push(action);
            }
            still_over.insert(key, over);
        }
        // Pods back under their budget (or gone) start over.
        self.over = still_over;
        actions
    }

    fn next_signal(&self, pod_use: &PodUse, over: &mut Over, now: Instant) -> Option<Action> {
        let over_for = now.saturating_duration_since(over.since);
        if over_for < self.settings.grace {
            return None;
        }
        let running = |process: HostProcess| {
            pod_use
                .processes
                .iter()
                .find(|candidate| candidate.process == process)
        };
        let (target, signal) = match over.sent {
            // The signalled process still runs: SIGKILL once the kill grace period is over.
            Some(sent) if running(sent.process).is_some() => {
                if sent.signal == Signal::Term
                    && now.saturating_duration_since(sent.at) >= self.settings.kill_grace
                {
                    (running(sent.process)?.clone(), Signal::Kill)
                } else {
                    return None;
                }
            }
            // Nothing sent yet, or the signalled process is gone and the pod is still over: the largest next.
            _ => (
                pod_use
                    .processes
                    .iter()
                    .max_by_key(|process| (process.used_bytes, process.process))?
                    .clone(),
                Signal::Term,
            ),
        };
        over.sent = Some(Sent {
            process: target.process,
            signal,
            at: now,
        });
        Some(Action {
            signal,
            target,
            over: pod_use.clone(),
            over_for,
            dry_run: self.settings.dry_run,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::MIB;
    use crate::watchdog::budget::Source;

    const SECOND: Duration = Duration::from_secs(1);

    fn settings(dry_run: bool) -> Settings {
        Settings {
            grace: 10 * SECOND,
            kill_grace: 5 * SECOND,
            dry_run,
        }
    }

    fn process(pid: u32, mib: u64) -> PodProcess {
        PodProcess {
            process: HostProcess {
                pid,
                start_time: u64::from(pid) * 7,
            },
            container: format!("c{pid}"),
            used_bytes: mib * MIB,
        }
    }

    fn pod_use(uid: &str, processes: Vec<PodProcess>) -> PodUse {
        PodUse {
            pod: ContainerRef {
                pod_uid: uid.to_owned(),
                namespace: "default".to_owned(),
                pod: format!("pod-{uid}"),
                container: String::new(),
            },
            gpu: 0,
            gpu_uuid: "GPU-0".to_owned(),
            budget: Budget {
                bytes: 10_240 * MIB,
                source: Source::ReplicaShare,
                reckoning: "1 of 4 replicas of a 40960 MiB GPU".to_owned(),
            },
            processes,
        }
    }

    fn signals(actions: &[Action]) -> Vec<(u32, Signal)> {
        actions
            .iter()
            .map(|action| (action.target.process.pid, action.signal))
            .collect()
    }

    #[test]
    fn over_past_the_grace_period_gets_sigterm_then_sigkill() {
        let start = Instant::now();
        let mut decider = Decider::new(settings(false));
        let over = [pod_use("a", vec![process(1, 8000), process(2, 4000)])];
        let under = [pod_use("b", vec![process(3, 9000)])];
        let both = [over[0].clone(), under[0].clone()];
        assert!(decider.pass(&both, start).is_empty());
        assert!(decider.pass(&both, start + 9 * SECOND).is_empty());
        let term = decider.pass(&both, start + 10 * SECOND);
        assert_eq!(
            signals(&term),
            vec![(1, Signal::Term)],
            "the largest process"
        );
        assert_eq!(term[0].over_for, 10 * SECOND);
        assert!(!term[0].dry_run);
        // It ignores SIGTERM.
        assert!(decider.pass(&both, start + 14 * SECOND).is_empty());
        assert_eq!(
            signals(&decider.pass(&both, start + 15 * SECOND)),
            vec![(1, Signal::Kill)]
        );
        assert!(
            decider.pass(&both, start + 30 * SECOND).is_empty(),
            "sent once"
        );
    }

    #[test]
    fn a_spike_that_ends_inside_the_grace_period_costs_nothing() {
        let start = Instant::now();
        let mut decider = Decider::new(settings(false));
        let spike = [pod_use("a", vec![process(1, 12_000)])];
        let calm = [pod_use("a", vec![process(1, 9_000)])];
        assert!(decider.pass(&spike, start).is_empty());
        assert!(decider.pass(&calm, start + 8 * SECOND).is_empty());
        // Over again: the clock starts over.
        assert!(decider.pass(&spike, start + 9 * SECOND).is_empty());
        assert!(decider.pass(&spike, start + 18 * SECOND).is_empty());
        assert_eq!(decider.pass(&spike, start + 19 * SECOND).len(), 1);
    }

    #[test]
    fn once_the_signalled_process_is_gone_the_next_largest_follows() {
        let start = Instant::now();
        let mut decider = Decider::new(settings(false));
        let three = [pod_use(
            "a",
            vec![process(1, 6000), process(2, 5000), process(3, 1000)],
        )];
        decider.pass(&three, start);
        assert_eq!(
            signals(&decider.pass(&three, start + 10 * SECOND)),
            vec![(1, Signal::Term)]
        );
        let two = [pod_use("a", vec![process(2, 10_000), process(3, 1000)])];
        assert_eq!(
            signals(&decider.pass(&two, start + 11 * SECOND)),
            vec![(2, Signal::Term)]
        );
    }

    #[test]
    fn a_dry_run_reports_each_step_once() {
        let start = Instant::now();
        let mut decider = Decider::new(settings(true));
        let over = [pod_use("a", vec![process(1, 12_000)])];
        decider.pass(&over, start);
        let term = decider.pass(&over, start + 10 * SECOND);
        assert!(term[0].dry_run);
        assert!(decider.pass(&over, start + 11 * SECOND).is_empty());
        assert_eq!(
            signals(&decider.pass(&over, start + 15 * SECOND)),
            vec![(1, Signal::Kill)]
        );
        assert!(decider.pass(&over, start + 60 * SECOND).is_empty());
    }

    #[test]
    fn a_reused_pid_is_another_process() {
        let start = Instant::now();
        let mut decider = Decider::new(settings(false));
        let first = [pod_use("a", vec![process(1, 12_000)])];
        decider.pass(&first, start);
        decider.pass(&first, start + 10 * SECOND);
        let mut successor = process(1, 12_000);
        successor.process.start_time += 1;
        let reused = [pod_use("a", vec![successor])];
        // The signalled process is gone; the newcomer gets SIGTERM first, not SIGKILL.
        assert_eq!(
            signals(&decider.pass(&reused, start + 16 * SECOND)),
            vec![(1, Signal::Term)]
        );
    }
}

//! A driver upgrade at N kwok GPU nodes: our operator with the driver on and NVIDIA's upgrade policy
//! (`autoUpgrade`, `maxParallelUpgrades: 50`, `maxUnavailable: 100%`), then a `kubectl patch` of `driver.version`
//! as the driver-upgrade guide has users do. One `kubectl get nodes --watch` records every change of every node's
//! `nvidia.com/gpu-driver-upgrade-state` label and cordon with its time, until every node is upgrade-done and
//! uncordoned again: the total time, the nodes in flight over time, and the operator's API requests from the audit
//! log over that window.
//!
//! kwok runs no containers and marks every bound pod Ready: the new driver pod is Ready as soon as the DaemonSet
//! controller has made it and the scheduler bound it, and so is the validator pod the operator restarts to check
//! it. The validator's own checks (its driver-ready mark) do not run; its pod's readiness stands for them, as in
//! the e2e driver-upgrade test. No workloads use the GPUs, so pod deletion evicts nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::contender::Contender;
use super::observe::Observer;
use super::report::Environment;
use super::{SETTLE, TIMEOUT, free_local_address, say};
use harness::cluster::audit::{self, Requests};
use harness::cluster::{self, ClusterInfo, Connection};
use harness::command;

/// NVIDIA's `maxParallelUpgrades`; `maxUnavailable` is 100 %, so that this is the only limit.
const MAX_PARALLEL: u32 = 50;
const STATE_LABEL: &str = "nvidia.com/gpu-driver-upgrade-state";
/// Where the operator writes why a node failed.
const REASON_ANNOTATION: &str = "nvidia.com/gpu-driver-upgrade-reason";
const DONE: &str = "upgrade-done";
const FAILED: &str = "upgrade-failed";
const INSTALLED_VERSION: &str = "bench-1";
const UPGRADED_VERSION: &str = "bench-2";
/// The upgrade itself: 1000 nodes, 50 at a time, each through seven states on two cores.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(1800);
/// How often a long wait says where it stands.
const PROGRESS_EVERY: Duration = Duration::from_secs(15);

/// What `cargo xtask bench` records of a driver upgrade.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpgradeBench {
    /// The commit and date of the measurement (`--upgrade-only` keeps the other, older results).
    pub commit: String,
    pub date: String,
    pub nodes: u32,
    pub max_parallel: u32,
    /// From the patch of `driver.version` to every node upgrade-done and uncordoned.
    pub total_s: f64,
    /// The most nodes between upgrade-required and upgrade-done (exclusive) at once.
    pub max_in_flight: u32,
    /// The most nodes in flight during each second after the patch.
    pub in_flight: Vec<u32>,
    /// The operator's requests from the patch to the end.
    pub requests: Requests,
}

impl UpgradeBench {
    /// Requests per upgraded node.
    pub fn per_node(&self, requests: u64) -> f64 {
        requests as f64 / f64::from(self.nodes.max(1))
    }
}

/// Measures on the running cluster `info` with `nodes` kwok GPU nodes and no operator yet.
pub fn measure(
    root: &Path,
    info: &ClusterInfo,
    environment: &Environment,
    contender: &Contender,
    nodes: u32,
) -> anyhow::Result<UpgradeBench> {
    let env = cluster::env_vars(info);
    let kubectl = |args: &[&str]| command::output(&env, "kubectl", args);
    say("driver upgrade: helm install of our chart");
    contender.install(root, &env)?;
    let policy = info.state_dir.join("bench-upgrade-clusterpolicy.yaml");
    std::fs::write(&policy, contender.render_policy(&env)?)?;
    let workload = contender.start(
        info,
        &format!("bench-upgrade-{}", std::process::id()),
        free_local_address()?,
    )?;
    std::thread::sleep(SETTLE);
    let mut watch = NodeWatch::start(&env)?;
    let mut tracker = Tracker::default();

    say(format!(
        "driver upgrade: the ClusterPolicy with the driver {INSTALLED_VERSION} and maxParallelUpgrades {MAX_PARALLEL}"
    ));
    kubectl(&["create", "-f", &policy.display().to_string()])?;
    let driver = json!({"spec": {"driver": {
        "enabled": true, "version": INSTALLED_VERSION,
        "upgradePolicy": {"autoUpgrade": true, "maxParallelUpgrades": MAX_PARALLEL, "maxUnavailable": "100%"}
    }}});
    patch_policy(&kubectl, &driver)?;
    let log = || format!("the operator's log: {}", workload.log.display());
    watch
        .until(
            &mut tracker,
            TIMEOUT,
            "every node upgrade-done with the first driver",
            |tracker| tracker.settled() >= nodes as usize,
        )
        .with_context(log)?;
    // The upgrade starts on a quiet cluster: the other operands' first rollout is not counted in its window.
    let connection = Connection::open(&info.kubeconfig)?;
    Observer::new(&connection)
        .until(
            Instant::now(),
            TIMEOUT,
            "every operand rolled out",
            |_, _| {},
            |snapshot| snapshot.settled(nodes),
        )
        .with_context(log)?;

    say(format!(
        "driver upgrade: patching driver.version to {UPGRADED_VERSION}"
    ));
    let audit_log = info.audit_log();
    let audit_start = audit::Mark::now(&audit_log)?;
    tracker.begin(Instant::now());
    patch_policy(
        &kubectl,
        &json!({"spec": {"driver": {"version": UPGRADED_VERSION}}}),
    )?;
    watch
        .until(
            &mut tracker,
            UPGRADE_TIMEOUT,
            "every node upgraded and uncordoned",
            |tracker| tracker.upgraded(nodes as usize),
        )
        .with_context(log)?;
    let total = tracker.since_begin();
    let requests = audit_start.requests(audit::OPERATOR_USER)?;
    let in_flight = tracker.per_second(total);
    let upgrade = UpgradeBench {
        commit: environment.commit.clone(),
        date: environment.date.clone(),
        nodes,
        max_parallel: MAX_PARALLEL,
        total_s: total.as_secs_f64(),
        max_in_flight: in_flight.iter().copied().max().unwrap_or(0),
        in_flight,
        requests,
    };
    say(format!(
        "driver upgrade: {nodes} nodes in {:.1} s, at most {} in flight (limit {MAX_PARALLEL}), {:.1} requests per node",
        upgrade.total_s,
        upgrade.max_in_flight,
        upgrade.per_node(upgrade.requests.total())
    ));
    Ok(upgrade)
}

fn patch_policy(
    kubectl: &dyn Fn(&[&str]) -> anyhow::Result<String>,
    patch: &serde_json::Value,
) -> anyhow::Result<()> {
    kubectl(&[
        "patch",
        "clusterpolicy/cluster-policy",
        "--type",
        "merge",
        "-p",
        &patch.to_string(),
    ])
    .map(drop)
}

/// One change of a node seen by the watch, timed when it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Change {
    at: Instant,
    node: String,
    state: String,
    cordoned: bool,
}

/// `kubectl get nodes --watch`: the API server sends each write of a node as its own event, so every state a node
/// passes through is seen, in order. Stopped when dropped.
struct NodeWatch {
    child: Child,
    changes: Receiver<Change>,
}

impl NodeWatch {
    fn start(env: &[(String, String)]) -> anyhow::Result<Self> {
        // `|` between the fields: kubectl's watch output goes through a tab writer, which turns tabs into spaces.
        let template = format!(
            "jsonpath={{.metadata.name}}|{{.metadata.labels.{}}}|{{.spec.unschedulable}}{{\"\\n\"}}",
            STATE_LABEL.replace('.', "\\.")
        );
        let mut child = Command::new("kubectl")
            .args(["get", "nodes", "--watch", "-o", &template])
            .envs(env.iter().map(|(key, value)| (key, value)))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start kubectl get nodes --watch")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (sender, changes) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let at = Instant::now();
                let mut fields = line.split('|').map(str::trim);
                let (Some(node), Some(state), cordoned) =
                    (fields.next(), fields.next(), fields.next())
                else {
                    continue;
                };
                if node.is_empty() {
                    continue;
                }
                let change = Change {
                    at,
                    node: node.to_owned(),
                    state: state.to_owned(),
                    cordoned: cordoned == Some("true"),
                };
                if sender.send(change).is_err() {
                    break;
                }
            }
        });
        Ok(Self { child, changes })
    }

    /// Feeds `tracker` until `done` holds of it; fails after `timeout`, when a node fails its upgrade, or when the
    /// watch ends.
    fn until(
        &mut self,
        tracker: &mut Tracker,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Tracker) -> bool,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut reported = started;
        while !done(tracker) {
            if let Some(failed) = tracker.failed() {
                bail!(
                    "{what}: node {failed} is {FAILED} (its {REASON_ANNOTATION} annotation says why)"
                );
            }
            let left = timeout.checked_sub(started.elapsed()).with_context(|| {
                format!(
                    "{what}: not reached within {} s; {}",
                    timeout.as_secs(),
                    tracker.progress()
                )
            })?;
            match self.changes.recv_timeout(left.min(PROGRESS_EVERY)) {
                Ok(change) => tracker.apply(change),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => bail!(
                    "{what}: the node watch ended ({:?}); {}",
                    self.child.try_wait(),
                    tracker.progress()
                ),
            }
            if reported.elapsed() >= PROGRESS_EVERY {
                reported = Instant::now();
                cluster::progress::say(format!(
                    "  {:>4.0} s waiting for {what}: {}",
                    started.elapsed().as_secs_f64(),
                    tracker.progress()
                ));
            }
        }
        Ok(())
    }
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node's upgrade state label (empty without one) and cordon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct NodeState {
    state: String,
    cordoned: bool,
}

impl NodeState {
    /// Between upgrade-required and upgrade-done: taking one of the `maxParallelUpgrades` slots.
    fn in_flight(&self) -> bool {
        !matches!(self.state.as_str(), "" | "upgrade-required" | DONE | FAILED)
    }

    fn settled(&self) -> bool {
        self.state == DONE && !self.cordoned
    }
}

/// Every node as the watch last saw it, and the upgrade's course from [`Tracker::begin`] on (pure).
#[derive(Debug, Default)]
struct Tracker {
    nodes: BTreeMap<String, NodeState>,
    begin: Option<Instant>,
    /// The nodes that left upgrade-done after the begin.
    started: BTreeSet<String>,
    /// The nodes in flight after each change after the begin.
    timeline: Vec<(Duration, usize)>,
    last_change: Duration,
}

impl Tracker {
    /// Marks the upgrade's start: changes seen after it are the upgrade's.
    fn begin(&mut self, at: Instant) {
        self.begin = Some(at);
    }

    fn apply(&mut self, change: Change) {
        let node = NodeState {
            state: change.state,
            cordoned: change.cordoned,
        };
        // The watch also sends the nodes' other writes (kwok's status updates).
        if self.nodes.get(&change.node) == Some(&node) {
            return;
        }
        let in_upgrade = self
            .begin
            .and_then(|begin| change.at.checked_duration_since(begin));
        if in_upgrade.is_some() && node.state != DONE {
            self.started.insert(change.node.clone());
        }
        self.nodes.insert(change.node, node);
        if let Some(at) = in_upgrade {
            let in_flight = self.nodes.values().filter(|n| n.in_flight()).count();
            self.timeline.push((at, in_flight));
            self.last_change = at;
        }
    }

    /// Nodes upgrade-done and uncordoned.
    fn settled(&self) -> usize {
        self.nodes.values().filter(|n| n.settled()).count()
    }

    /// Every one of `nodes` nodes has left upgrade-done since the begin and is back, uncordoned.
    fn upgraded(&self, nodes: usize) -> bool {
        self.started.len() >= nodes
            && self
                .started
                .iter()
                .all(|node| self.nodes.get(node).is_some_and(NodeState::settled))
    }

    fn failed(&self) -> Option<&str> {
        self.nodes
            .iter()
            .find(|(_, n)| n.state == FAILED)
            .map(|(name, _)| name.as_str())
    }

    /// From the begin to the last change seen: the node that settled last.
    fn since_begin(&self) -> Duration {
        self.last_change
    }

    /// The most nodes in flight during each whole second from the begin to `end` (none in flight at the begin).
    fn per_second(&self, end: Duration) -> Vec<u32> {
        let mut current = 0;
        let mut changes = self.timeline.iter().peekable();
        (0..=end.as_secs())
            .map(|second| {
                let mut most = current;
                while let Some((_, count)) = changes.next_if(|(at, _)| at.as_secs() <= second) {
                    current = *count;
                    most = most.max(current);
                }
                most as u32
            })
            .collect()
    }

    fn progress(&self) -> String {
        let count = |keep: fn(&NodeState) -> bool| self.nodes.values().filter(|n| keep(n)).count();
        format!(
            "{} nodes labelled, {} upgrade-done and uncordoned, {} in flight, {} started since the patch",
            count(|n| !n.state.is_empty()),
            self.settled(),
            count(NodeState::in_flight),
            self.started.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(at: Instant, node: &str, state: &str, cordoned: bool) -> Change {
        Change {
            at,
            node: node.into(),
            state: state.into(),
            cordoned,
        }
    }

    #[test]
    fn follows_every_node_through_the_upgrade() {
        let zero = Instant::now();
        let at = |ms: u64| zero + Duration::from_millis(ms);
        let mut tracker = Tracker::default();
        for node in ["a", "b"] {
            tracker.apply(change(zero, node, "", false));
            tracker.apply(change(zero, node, DONE, false));
        }
        assert_eq!(tracker.settled(), 2);
        assert!(!tracker.upgraded(2), "nothing happened since a begin");
        tracker.begin(at(100));
        tracker.apply(change(at(200), "a", "upgrade-required", false));
        tracker.apply(change(at(300), "b", "upgrade-required", false));
        tracker.apply(change(at(1_100), "a", "cordon-required", false));
        tracker.apply(change(at(1_200), "a", "wait-for-jobs-required", true));
        tracker.apply(change(at(1_900), "b", "cordon-required", false));
        assert_eq!(
            tracker.progress(),
            "2 nodes labelled, 0 upgrade-done and uncordoned, 2 in flight, 2 started since the patch"
        );
        tracker.apply(change(at(2_100), "a", "uncordon-required", true));
        tracker.apply(change(at(2_200), "a", DONE, true));
        assert!(!tracker.upgraded(2), "a is still cordoned, b in flight");
        tracker.apply(change(at(2_300), "a", DONE, false));
        tracker.apply(change(at(3_400), "b", DONE, false));
        assert!(tracker.upgraded(2));
        assert_eq!(tracker.failed(), None);
        assert_eq!(tracker.since_begin(), Duration::from_millis(3_300));
        assert_eq!(tracker.per_second(tracker.since_begin()), [0, 2, 2, 1]);
    }

    #[test]
    fn changes_before_the_begin_are_not_the_upgrades() {
        let zero = Instant::now();
        let mut tracker = Tracker::default();
        tracker.apply(change(zero, "a", "cordon-required", false));
        tracker.begin(zero + Duration::from_secs(1));
        tracker.apply(change(zero, "a", DONE, false));
        tracker.apply(change(zero + Duration::from_secs(2), "a", DONE, false));
        assert!(!tracker.upgraded(1), "a repeated state is no change");
        assert!(tracker.timeline.is_empty());
        tracker.apply(change(zero + Duration::from_secs(2), "b", FAILED, true));
        assert_eq!(tracker.failed(), Some("b"));
    }
}

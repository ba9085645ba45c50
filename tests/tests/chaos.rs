//! The operator under faults of the cluster around it: the API server away for 30 s and etcd restarted, each
//! right after a ClusterPolicy change that touches every DaemonSet; the operator rolled (SIGTERM, a new replica)
//! in the middle of such a change; and every connection to the API server cut (every watch dropped) with 1000
//! nodes in its caches. Each step says
//! what breaks and what must hold, and prints the recovery time that docs/faults-and-trust.md tabulates.
//!
//! The operator runs as a local process with the chart's ServiceAccount token. Where it exits (a leader that
//! cannot renew its lease within the renew deadline stops, so that no two replicas ever lead), the test starts it
//! again at once, as the kubelet restarts the pod.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);
/// The pod-template label every operand DaemonSet gets from `spec.daemonsets.labels`.
const MARK: &str = "e2e-chaos";
/// The renew deadline of the operator's lease plus one request timeout: the longest a leader may go on leading
/// without a renewal (`operator::leader`).
const LEADER_STOPS_WITHIN: Duration = Duration::from_secs(10 + 5);

/// The value of [`MARK`] on each operand DaemonSet's pod template ("" where it has none).
fn marks() -> BTreeMap<String, String> {
    operand_daemonsets()
        .iter()
        .map(|ds| {
            (
                ds["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                ds["spec"]["template"]["metadata"]["labels"][MARK]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// Sets [`MARK`] on every operand's pods through the ClusterPolicy (None removes it): a change that touches
/// every DaemonSet.
fn mark_every_daemonset(value: Option<&str>) {
    patch_cluster_policy(&json!({"spec": {"daemonsets": {"labels": {MARK: value}}}}));
}

/// How many DaemonSets carry `value`, of how many.
fn marked(value: &str) -> (usize, usize) {
    let marks = marks();
    (
        marks.values().filter(|mark| *mark == value).count(),
        marks.len(),
    )
}

/// Waits until every operand DaemonSet carries `value`; returns when.
fn wait_marked(value: &str) -> Instant {
    eventually(WAIT, || {
        let (done, all) = marked(value);
        Ok((all > 0 && done == all).then(Instant::now))
    })
    .unwrap_or_else(|error| {
        panic!(
            "not every DaemonSet got {MARK}={value}: {error:#}\n{:?}",
            marks()
        )
    })
}

/// The operator replica `identity`, started again whenever it exits, as the kubelet restarts a pod: at once the
/// first time, then no sooner than [`RESTART_BACKOFF`] after the previous start.
struct Supervised {
    identity: String,
    kubeconfig: std::path::PathBuf,
    operator: Option<Operator>,
    started: Instant,
    /// When each run ended, and how.
    exits: Vec<(Instant, String)>,
}

/// The kubelet's first crash-loop back-off.
const RESTART_BACKOFF: Duration = Duration::from_secs(10);

impl Supervised {
    fn start(identity: &str) -> Self {
        Self {
            identity: identity.to_owned(),
            kubeconfig: service_account_kubeconfig("gpu-operator"),
            operator: Some(Operator::start(identity)),
            started: Instant::now(),
            exits: Vec::new(),
        }
    }

    /// Restarts the operator if it exited since the last look (and its back-off has passed).
    fn look(&mut self) {
        let operator = self.operator.as_mut().expect("the operator runs");
        let Some(status) = operator.exit_status() else {
            return;
        };
        if self
            .exits
            .last()
            .is_none_or(|(ended, _)| *ended < self.started)
        {
            self.exits.push((Instant::now(), status.to_string()));
        }
        let backoff = if self.exits.len() > 1 {
            RESTART_BACKOFF
        } else {
            Duration::ZERO
        };
        if self.started.elapsed() >= backoff {
            self.operator = Some(Operator::launch_as(&self.identity, &self.kubeconfig));
            self.started = Instant::now();
        }
    }

    /// Looks after the operator until `until` returns true (every 100 ms).
    fn look_until(&mut self, timeout: Duration, mut until: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            self.look();
            if until() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "not reached within {timeout:?}; operator exits: {:?}",
            self.exits
        );
    }

    /// Looks after the operator until the ClusterPolicy is ready for its current generation: a replica that lost
    /// its lease while the control plane was away (etcd slow to come back on a busy machine) exits, and only a
    /// restart, as the kubelet's, writes the status again.
    fn look_until_policy_ready(&mut self) {
        self.look_until(WAIT, || {
            policy_in_state("cluster-policy", "ready").is_some()
        });
    }

    fn port(&self) -> u16 {
        self.operator.as_ref().expect("the operator runs").port
    }
}

/// The time since `since`, in seconds with one decimal, for the log.
fn secs(since: Instant, at: Instant) -> String {
    format!("{:.1} s", at.duration_since(since).as_secs_f64())
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn operator_converges_across_an_api_server_outage_and_an_etcd_restart() {
    chart_installed();
    let mut operator = Supervised::start("e2e-chaos");
    wait_for_policy_state("cluster-policy", "ready", WAIT);
    wait_marked("");

    step("the API server stopped for 30 s right after a change of every DaemonSet");
    mark_every_daemonset(Some("outage"));
    let outage = ControlPlaneRestart::start("kube-apiserver", Duration::from_secs(30));
    let stopped = Instant::now();
    // The restart returns once the API server serves again; meanwhile the leader must stop leading by its own
    // clock (it cannot renew), so that it never leads beside a replica that took over.
    let mut outage = Some(outage);
    let mut back = None;
    operator.look_until(Duration::from_secs(120), || {
        if let Some(restart) = outage.take_if(|_| stopped.elapsed() >= Duration::from_secs(29)) {
            back = Some(restart.wait());
        }
        back.is_some()
    });
    let back = back.expect("the API server is back");
    let (left_at, how) = operator
        .exits
        .first()
        .cloned()
        .expect("the leader stopped while it could not renew its lease");
    assert!(
        left_at.duration_since(stopped) <= LEADER_STOPS_WITHIN + Duration::from_secs(1),
        "the leader stopped {} after the API server, later than its renew deadline ({how})",
        secs(stopped, left_at)
    );
    let mut converged = None;
    operator.look_until(WAIT, || {
        let (done, all) = marked("outage");
        converged = (done == all).then(Instant::now);
        converged.is_some()
    });
    let converged = converged.expect("converged");
    operator.look_until_policy_ready();
    eprintln!(
        "API server away {}: the leader stopped {} after it went ({how}); every DaemonSet changed {} after it was back",
        secs(stopped, back),
        secs(stopped, left_at),
        secs(back, converged)
    );

    step("etcd restarted right after another change of every DaemonSet");
    let exits_before = operator.exits.len();
    mark_every_daemonset(Some("etcd-restart"));
    let restart = ControlPlaneRestart::start("etcd", Duration::ZERO);
    let restarted = Instant::now();
    let back = restart.wait();
    let mut converged = None;
    operator.look_until(WAIT, || {
        let (done, all) = marked("etcd-restart");
        converged = (done == all).then(Instant::now);
        converged.is_some()
    });
    let converged = converged.expect("converged");
    operator.look_until_policy_ready();
    eprintln!(
        "etcd restarted in {}: every DaemonSet changed {} after it served again; operator exits meanwhile: {}",
        secs(restarted, back),
        secs(back, converged.max(back)),
        operator.exits.len() - exits_before
    );
    assert_eq!(
        http_status(operator.port(), "/readyz"),
        Some(200),
        "Ready again"
    );
    assert_eq!(lease_holder(), "e2e-chaos", "one replica, leading again");

    step(
        "the operator rolled (SIGTERM, a new replica) in the middle of a change of every DaemonSet",
    );
    let standby = Operator::launch("e2e-chaos-next");
    standby.wait_ready(WAIT);
    mark_every_daemonset(Some("rolled"));
    let rolled = Instant::now();
    operator
        .operator
        .take()
        .expect("the operator runs")
        .terminate();
    // Stopped replicas give their lease up, also when a renewal was cut short by the stop (the copy it held was
    // then older than the lease): the next one must not wait for it to expire.
    assert_ne!(
        lease_holder(),
        "e2e-chaos",
        "the stopped replica released its lease"
    );
    let (done_when_stopped, all) = marked("rolled");
    let converged = wait_marked("rolled");
    wait_leader("e2e-chaos-next", WAIT);
    wait_for_policy_state("cluster-policy", "ready", WAIT);
    eprintln!(
        "rolled during the change ({done_when_stopped} of {all} DaemonSets changed when the old replica stopped): every DaemonSet changed {} after the roll",
        secs(rolled, converged)
    );

    mark_every_daemonset(None);
    wait_marked("");
    drop(standby);
}

/// Label of the nodes the watch test adds, to delete them together.
const BULK_LABEL: &str = "e2e-chaos/bulk";

/// Deletes the watch test's nodes when dropped, also when an assertion fails.
struct BulkNodes;

impl Drop for BulkNodes {
    fn drop(&mut self) {
        clean_up(&["nodes", "-l", BULK_LABEL, "--wait=false"]);
    }
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn operator_resumes_its_watches_at_1000_nodes_without_a_relist_storm() {
    chart_installed();
    step(
        "1000 more Nodes fill the operator's Node cache (Node objects only: no kubelet, no OS label, so no pod runs there)",
    );
    let _bulk = BulkNodes;
    let nodes: Vec<_> = (0..1000)
        .map(|n| {
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": format!("e2e-bulk-{n}"), "labels": {BULK_LABEL: "true"}}})
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": nodes});
    let created = kubectl_with_input(&["create", "-f", "-", "-o", "name"], &list.to_string());
    assert!(created.success, "{}", created.stderr);
    let mut operator = Operator::start("e2e-watches");
    wait_for_policy_state("cluster-policy", "ready", WAIT);

    step("every watch dropped at once: every connection to the API server cut");
    let user = format!("system:serviceaccount:{NAMESPACE}:gpu-operator");
    let (from, _) = audited_requests(&user, 0, &[]);
    let cut_at = Instant::now();
    let cut = cut_api_server_connections();
    assert!(cut > 0, "no connection to the API server was open");
    mark_every_daemonset(Some("watches"));
    let converged = wait_marked("watches");
    assert!(
        operator.exit_status().is_none(),
        "the operator kept running"
    );
    // Every watch has come back by now (the change above went through two of them); a few seconds more let any
    // late relist show.
    std::thread::sleep(Duration::from_secs(5));
    let (_, lists) = audited_requests(&user, from, &["list"]);
    // A watch is counted when it starts: the ones that replaced the cut ones.
    let (_, rewatched) = audited_requests(&user, from, &["watch"]);
    eprintln!(
        "{cut} connections cut: a change of every DaemonSet went through {} later; the operator's watches started again: {rewatched:?}; its LIST requests since: {lists:?}",
        secs(cut_at, converged)
    );
    assert!(
        rewatched.values().sum::<usize>() >= 7,
        "the operator's watches (nodes, GPUNodes, DaemonSets, Services, ConfigMaps, ClusterPolicies twice) were cut and started again: {rewatched:?}"
    );
    for (request, count) in &lists {
        assert!(
            *count <= 1,
            "{request}: {count} LIST requests after one drop of the watches"
        );
    }
    mark_every_daemonset(None);
    wait_marked("");
}

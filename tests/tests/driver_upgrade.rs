//! Driver upgrades on 10 kwok GPU nodes, with the operator as a local process under the chart's RBAC. A change of
//! `driver.version` with `maxParallelUpgrades: 2` moves every node through NVIDIA's upgrade states; the test
//! records every change of every node's state label and cordon from a watch, with times, and prints them.
//!
//! What it shows: the states in order on every node, never more than 2 nodes in flight, a GPU pod evicted through
//! the Eviction API with its PodDisruptionBudget respected (a refused eviction, retried until the budget allows
//! it), a DaemonSet pod without any GPU request whose process uses a GPU evicted (its node's exporter, a local
//! process on the GPU simulator with the chart's RBAC, publishes it in the node's GPUNode status), a pod without
//! GPUs left alone, every node back to upgrade-done and uncordoned; a node whose new driver pod never starts ends
//! upgrade-failed with the reason while the others finish, and a later fixed version completes it; the operator
//! killed in the middle of that second upgrade resumes from the labels, and no node is cordoned twice.
//!
//! kwok runs no containers: pods turn Ready as soon as they are bound. The broken driver is a taint the driver
//! DaemonSet does not tolerate, so that its new pod is never made on that node.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::agents::{NodeAgent, add_simulated_node, node_agent_bin, simulator_tool};
use e2e::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const STATE_LABEL: &str = "nvidia.com/gpu-driver-upgrade-state";
const WORKLOADS: &str = "e2e-upgrade";
/// The nodes this test adds (copies of `gpu-a100-0`, so in its OS pool).
const PREFIX: &str = "e2e-up-";
const OPERATOR: &str = "e2e-upgrade-operator";
const OPERATOR_USER: &str = "system:serviceaccount:gpu-operator:gpu-operator";
/// A short restart timeout, so that the broken node fails within the test.
const RESTART_TIMEOUT_SECONDS: u64 = 20;
const BROKEN_TAINT: &str = "e2e.example/broken-driver";
/// The pid of the probe pod's simulated GPU process.
const PROBE_PID: &str = "4711";

/// The states of a node that upgrades with drain off, in order.
const ORDER: [&str; 8] = [
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "pod-deletion-required",
    "pod-restart-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
];

fn in_flight(state: &str) -> bool {
    !matches!(
        state,
        "" | "upgrade-required" | "upgrade-done" | "upgrade-failed"
    )
}

/// One observed change of a node: its state label and cordon, at a time since the recorder started.
#[derive(Debug, Clone)]
struct Change {
    at: Duration,
    node: String,
    state: String,
    unschedulable: bool,
}

/// Every change of every node, from `kubectl get nodes --watch`: the API server sends each write as its own
/// event, so the order and the count of changes are exact.
struct Recorder {
    child: Child,
    changes: Arc<Mutex<Vec<Change>>>,
    started: Instant,
}

impl Recorder {
    fn start() -> Self {
        // `|` between the fields: kubectl's watch output goes through a tab writer, which turns tabs into spaces.
        let template = format!(
            "jsonpath={{.metadata.name}}|{{.metadata.labels.{}}}|{{.spec.unschedulable}}{{\"\\n\"}}",
            STATE_LABEL.replace('.', "\\.")
        );
        let mut child = Command::new("kubectl")
            .args(["get", "nodes", "--watch", "-o", &template])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kubectl get nodes --watch");
        let stdout = child.stdout.take().expect("watch output");
        let changes: Arc<Mutex<Vec<Change>>> = Arc::default();
        let started = Instant::now();
        let sink = changes.clone();
        std::thread::spawn(move || {
            let mut last: BTreeMap<String, (String, bool)> = BTreeMap::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut fields = line.split('|');
                let node = fields.next().unwrap_or_default().trim().to_owned();
                let state = fields.next().unwrap_or_default().trim().to_owned();
                let unschedulable = fields.next().map(str::trim) == Some("true");
                if node.is_empty() || last.get(&node) == Some(&(state.clone(), unschedulable)) {
                    continue;
                }
                last.insert(node.clone(), (state.clone(), unschedulable));
                sink.lock().unwrap().push(Change {
                    at: started.elapsed(),
                    node,
                    state,
                    unschedulable,
                });
            }
        });
        Self {
            child,
            changes,
            started,
        }
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn since(&self, from: Duration) -> Vec<Change> {
        self.changes
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.at >= from)
            .cloned()
            .collect()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each node's state sequence (consecutive repeats merged) in `changes`.
fn sequences(changes: &[Change]) -> BTreeMap<String, Vec<String>> {
    let mut sequences: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for change in changes {
        let sequence = sequences.entry(change.node.clone()).or_default();
        if sequence.last() != Some(&change.state) {
            sequence.push(change.state.clone());
        }
    }
    sequences
}

/// The most nodes in flight at once, replaying `changes` over the states at `from`.
fn most_in_flight(changes: &[Change], initial: &BTreeMap<String, String>) -> usize {
    let mut states = initial.clone();
    let mut most = states.values().filter(|s| in_flight(s)).count();
    for change in changes {
        states.insert(change.node.clone(), change.state.clone());
        most = most.max(states.values().filter(|s| in_flight(s)).count());
    }
    most
}

/// How many times each node was cordoned (schedulable -> unschedulable) in `changes`, starting from `initial`.
fn cordons(changes: &[Change], initial: &BTreeMap<String, bool>) -> BTreeMap<String, usize> {
    let mut cordoned = initial.clone();
    let mut counts = BTreeMap::new();
    for change in changes {
        let was = cordoned.insert(change.node.clone(), change.unschedulable);
        if change.unschedulable && was != Some(true) {
            *counts.entry(change.node.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// Prints every change with its time, one line per change.
fn print_timeline(title: &str, changes: &[Change], from: Duration) {
    eprintln!("--- {title}: state and cordon changes (seconds since the patch) ---");
    for change in changes {
        eprintln!(
            "{:>7.2}s  {:<12} {:<24} {}",
            (change.at.saturating_sub(from)).as_secs_f64(),
            change.node,
            if change.state.is_empty() {
                "(none)"
            } else {
                &change.state
            },
            if change.unschedulable { "cordoned" } else { "" }
        );
    }
}

fn node_states(nodes: &[String]) -> BTreeMap<String, (String, bool)> {
    let list = kubectl_json(&["get", "nodes"]);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| {
            let name = n["metadata"]["name"].as_str()?.to_owned();
            nodes.contains(&name).then(|| {
                let state = n["metadata"]["labels"][STATE_LABEL]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                (name, (state, n["spec"]["unschedulable"] == json!(true)))
            })
        })
        .collect()
}

/// Waits until every node of `nodes` is in its state of `expected` (a node missing there: upgrade-done) and
/// schedulable unless it failed.
fn wait_for_states(nodes: &[String], expected: &BTreeMap<&str, &str>, timeout: Duration) {
    let mut last = BTreeMap::new();
    eventually(timeout, || {
        last = node_states(nodes);
        let settled = nodes.iter().all(|node| {
            let want = expected
                .get(node.as_str())
                .copied()
                .unwrap_or("upgrade-done");
            last.get(node).is_some_and(|(state, cordoned)| {
                state == want && (*cordoned == (want == "upgrade-failed"))
            })
        });
        Ok(settled.then_some(()))
    })
    .unwrap_or_else(|e| panic!("nodes did not settle: {e:#}\n{last:#?}"));
}

fn driver_daemonsets() -> Vec<Value> {
    operand_daemonsets()
        .into_iter()
        .filter(|d| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("nvidia-driver-daemonset"))
        })
        .collect()
}

fn pods(namespace: &str, selector: &str) -> Vec<Value> {
    kubectl_json(&["get", "pods", "-n", namespace, "-l", selector])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The operator's evictions in the audit log from line `from`, per pod name: the response codes.
fn evictions(from: usize) -> BTreeMap<String, Vec<u64>> {
    let path = std::env::var("E2E_AUDIT_LOG").expect("E2E_AUDIT_LOG is set by `cargo xtask e2e`");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut codes: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in text.lines().skip(from) {
        let Ok(entry) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if entry["user"]["username"] == OPERATOR_USER
            && entry["verb"] == "create"
            && entry["objectRef"]["subresource"] == "eviction"
            && entry["stage"] == "ResponseComplete"
        {
            let name = entry["objectRef"]["name"].as_str().unwrap_or_default();
            codes
                .entry(name.to_owned())
                .or_default()
                .push(entry["responseStatus"]["code"].as_u64().unwrap_or_default());
        }
    }
    codes
}

fn audit_lines() -> usize {
    audited_requests(OPERATOR_USER, 0, &[]).0
}

/// Puts the cluster back as the other suites expect it, also when the test fails: driver off (the running operator
/// releases every node, its labels removed), then the operator stopped and the test's nodes, workloads and GPUNode
/// deleted.
struct Cleanup {
    nodes: Vec<String>,
    operator: Option<Operator>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        undo_policy_patch(
            &json!({"spec": {"driver": {"enabled": false, "upgradePolicy": null}}}),
            STATE_LABEL,
        );
        drop(self.operator.take());
        let _ = run(
            "kubectl",
            &["delete", "namespace", WORKLOADS, "--wait=false"],
        );
        for node in &self.nodes {
            let _ = run(
                "kubectl",
                &["delete", "gpunode", node, "--ignore-not-found"],
            );
            let _ = run("kubectl", &["delete", "node", node, "--ignore-not-found"]);
        }
    }
}

/// The operator with a short driver restart timeout.
fn start_operator() -> Operator {
    Operator::start_with_env(
        OPERATOR,
        &[(
            "DRIVER_UPGRADE_RESTART_TIMEOUT_SECONDS",
            &RESTART_TIMEOUT_SECONDS.to_string(),
        )],
    )
}

/// The ClusterPolicy's `status.driverUpgrade` once it counts `done` and `failed` nodes: it is written in the same
/// pass as the last node's label, a moment after it.
fn upgrade_status(done: u64, failed: u64) -> Value {
    let mut last = Value::Null;
    eventually(WAIT, || {
        last = kubectl_json(&["get", "clusterpolicy", "cluster-policy"])["status"]["driverUpgrade"]
            .clone();
        Ok((last["done"] == json!(done) && last["failed"] == json!(failed)).then(|| last.clone()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "status.driverUpgrade never counted {done} done and {failed} failed: {e:#}\n{last:#}"
        )
    })
}

fn apply(manifest: Value) {
    let applied = kubectl_apply(&manifest.to_string(), &[]);
    assert!(applied.success, "{}{}", applied.stdout, applied.stderr);
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn driver_upgrades_move_every_node_through_nvidias_states() {
    chart_installed();
    let started = Instant::now();

    step("10 GPU nodes: the cluster's, and copies of gpu-a100-0");
    let mut added = Vec::new();
    let existing = gpu_node_names();
    for i in 0..10usize.saturating_sub(existing.len()) {
        let name = format!("{PREFIX}{i}");
        add_simulated_node("gpu-a100-0", &name, "a100-40gb:4", &[]);
        added.push(name);
    }
    let mut cleanup = Cleanup {
        nodes: added.clone(),
        operator: None,
    };
    assert!(added.len() >= 5, "the test needs its own nodes: {added:?}");
    let nodes = gpu_node_names();
    assert_eq!(nodes.len(), 10, "{nodes:?}");
    eventually(WAIT, || {
        let ready = kubectl_json(&["get", "nodes"])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .count();
        Ok((ready >= nodes.len()).then_some(()))
    })
    .expect("the new nodes are Ready");
    // The nodes with roles in the story, in the order the upgrade reaches them (name order).
    let (a, b, c, broken) = (&added[0], &added[added.len() - 1], &added[2], &added[3]);

    cleanup.operator = Some(start_operator());

    step("the driver on, with NVIDIA's upgrade policy: every node starts at upgrade-done");
    patch_cluster_policy(&json!({"spec": {"driver": {
        "enabled": true, "version": "e2e-1",
        "upgradePolicy": {"autoUpgrade": true, "maxParallelUpgrades": 2, "maxUnavailable": "100%",
                          "podDeletion": {"timeoutSeconds": 60}}
    }}}));
    eventually(WAIT, || {
        let drivers = driver_daemonsets();
        Ok((!drivers.is_empty()
            && drivers
                .iter()
                .all(|d| d["spec"]["updateStrategy"]["type"] == "OnDelete"))
        .then_some(()))
    })
    .expect("driver DaemonSets with OnDelete");
    wait_for_states(&nodes, &BTreeMap::new(), WAIT);

    step(
        "workloads: a GPU Deployment with a PodDisruptionBudget, a GPU-using DaemonSet pod, a pod without GPUs",
    );
    apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOADS}}));
    for node in [a, b] {
        kubectl(&[
            "patch",
            "node",
            node,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"}}}"#,
        ]);
    }
    kubectl(&["label", "node", a, "e2e-upgrade/gpu-pool=true"]);
    apply(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "train", "namespace": WORKLOADS},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "train"}},
                 "template": {"metadata": {"labels": {"app": "train"}},
                              "spec": {"nodeSelector": {"e2e-upgrade/gpu-pool": "true"},
                                       "containers": [{"name": "c", "image": "e2e/train",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }));
    apply(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "train", "namespace": WORKLOADS},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}
    }));
    apply(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "gpu-probe", "namespace": WORKLOADS},
        "spec": {"selector": {"matchLabels": {"app": "gpu-probe"}},
                 "template": {"metadata": {"labels": {"app": "gpu-probe"}},
                              "spec": {"nodeSelector": {"kubernetes.io/hostname": c},
                                       "containers": [{"name": "c", "image": "e2e/probe"}]}}}
    }));
    apply(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": WORKLOADS},
        "spec": {"nodeName": a, "containers": [{"name": "c", "image": "e2e/web"}]}
    }));
    let train = eventually(WAIT, || {
        let train = pods(WORKLOADS, "app=train");
        let running = train
            .iter()
            .filter(|p| p["status"]["phase"] == "Running" && p["spec"]["nodeName"] == json!(a))
            .count();
        Ok((running == 2).then_some(train))
    })
    .expect("both replicas run on the first node");
    let probe = eventually(WAIT, || {
        Ok(pods(WORKLOADS, "app=gpu-probe")
            .into_iter()
            .find(|p| p["status"]["phase"] == "Running"))
    })
    .expect("the probe DaemonSet's pod runs");
    // The probe's process on GPU 0 of its node (the simulator's process list, and a procfs folder with the
    // process's cgroup naming the pod, since kwok runs no processes), and the node's exporter, which publishes
    // the pods whose processes use the GPUs in the node's GPUNode status.
    let dir = scenario_dir("e2e-driver-upgrade");
    let state = dir.join(format!("{c}.json"));
    let proc_root = dir.join("proc");
    std::fs::create_dir_all(proc_root.join(PROBE_PID)).expect("the proc folder");
    std::fs::write(
        proc_root.join(PROBE_PID).join("cgroup"),
        format!("0::/kubepods/besteffort/pod{}\n", uid(&probe)),
    )
    .expect("the probe process's cgroup");
    simulator_tool(
        c,
        &state,
        &[
            "start-process",
            "--gpu",
            "0",
            "--pid",
            PROBE_PID,
            "--memory-mib",
            "512",
        ],
    );
    let listen = format!("127.0.0.1:{}", free_port());
    let proc_root = proc_root.display().to_string();
    let _exporter = NodeAgent::start(
        &node_agent_bin(),
        c,
        "nvidia-dcgm-exporter",
        &state,
        &[
            "exporter",
            "--listen",
            &listen,
            "--collect-interval",
            "1",
            "--proc-root",
            &proc_root,
        ],
        &[],
    );
    eventually(WAIT, || {
        // The exporter, just started, creates the GPUNode: not there yet is not a failure.
        let got = run("kubectl", &["get", "gpunode", c, "-o", "json"]);
        if !got.success {
            return Ok(None);
        }
        let gpu_node: Value = serde_json::from_str(&got.stdout).expect("kubectl printed JSON");
        let status = &gpu_node["status"];
        let listed = status["gpuProcessPods"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["uid"] == json!(uid(&probe)) && p["gpus"] == json!([0]));
        Ok(listed.then_some(()))
    })
    .expect("the exporter publishes the probe pod as a GPU user");
    let web = eventually(WAIT, || {
        Ok(pods(WORKLOADS, "")
            .into_iter()
            .find(|p| p["metadata"]["name"] == "web" && p["status"]["phase"] == "Running"))
    })
    .expect("the pod without GPUs runs");

    step(
        "one node's new driver pod will never start: a taint the driver DaemonSet does not tolerate",
    );
    kubectl(&[
        "taint",
        "node",
        broken,
        &format!("{BROKEN_TAINT}=true:NoSchedule"),
    ]);

    step("kubectl patch driver.version: every node upgrades, 2 at a time");
    let recorder = Recorder::start();
    std::thread::sleep(Duration::from_millis(500));
    let initial = node_states(&nodes);
    let audit_from = audit_lines();
    let from = recorder.now();
    patch_cluster_policy(&json!({"spec": {"driver": {"version": "e2e-2"}}}));
    // The last node joins the replicas' pool only once the first replica is evicted: until then the first's
    // replacement has nowhere to run, so the budget must refuse the second eviction. Joined earlier, kwok could
    // run the replacement before the operator asked for the second, and the refusal would depend on timing.
    eventually(WAIT, || {
        let originals_left = pods(WORKLOADS, "app=train")
            .iter()
            .filter(|p| train.iter().any(|t| uid(t) == uid(p)))
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count();
        Ok((originals_left < 2).then_some(()))
    })
    .expect("the upgrade evicts the first replica");
    kubectl(&["label", "node", b, "e2e-upgrade/gpu-pool=true"]);
    let expected = BTreeMap::from([(broken.as_str(), "upgrade-failed")]);
    wait_for_states(&nodes, &expected, Duration::from_secs(120));
    let round_one = recorder.since(from);
    let round_one_took = recorder.now() - from;
    print_timeline("driver.version e2e-1 -> e2e-2", &round_one, from);
    eprintln!(
        "all nodes settled {:.1}s after the patch",
        round_one_took.as_secs_f64()
    );

    let sequences_one = sequences(&round_one);
    for node in nodes.iter().filter(|n| *n != broken) {
        let sequence = &sequences_one[node];
        assert_eq!(
            sequence
                .iter()
                .skip_while(|s| s.as_str() == "upgrade-done")
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ORDER,
            "{node}: {sequence:?}"
        );
    }
    let broken_sequence = &sequences_one[broken];
    assert_eq!(
        broken_sequence.last().map(String::as_str),
        Some("upgrade-failed"),
        "{broken_sequence:?}"
    );
    assert!(
        broken_sequence.iter().any(|s| s == "pod-restart-required"),
        "{broken_sequence:?}"
    );
    let initial_states: BTreeMap<String, String> = initial
        .iter()
        .map(|(n, (s, _))| (n.clone(), s.clone()))
        .collect();
    let most = most_in_flight(&round_one, &initial_states);
    eprintln!("most nodes in flight at once: {most}");
    assert!(most <= 2, "maxParallelUpgrades 2, seen {most}");
    assert_eq!(most, 2, "two nodes upgrade at once");
    let initial_cordons: BTreeMap<String, bool> =
        initial.iter().map(|(n, (_, c))| (n.clone(), *c)).collect();
    let cordoned = cordons(&round_one, &initial_cordons);
    assert!(
        nodes.iter().all(|n| cordoned.get(n) == Some(&1)),
        "each node cordoned once: {cordoned:?}"
    );

    // The failure says why, where users look.
    let broken_node = kubectl_json(&["get", "node", broken]);
    let reason = broken_node["metadata"]["annotations"]["nvidia.com/gpu-driver-upgrade-reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("the new driver did not start")
            && reason.contains(&format!("after {RESTART_TIMEOUT_SECONDS}s")),
        "{reason}"
    );
    let status = upgrade_status(9, 1);
    assert_eq!(status["failures"][0]["node"], json!(broken), "{status:#}");
    assert_eq!(status["failures"][0]["reason"], json!(reason), "{status:#}");
    let failed_events: Vec<Value> = events_about(broken)
        .into_iter()
        .filter(|e| e["reason"] == "DriverUpgradeFailed")
        .collect();
    assert!(!failed_events.is_empty(), "a Warning Event on the node");

    // The GPU pods: evicted through the Eviction API, the budget refusing the second until the first's
    // replacement ran elsewhere.
    let after = pods(WORKLOADS, "app=train");
    assert!(
        after
            .iter()
            .all(|p| !train.iter().any(|t| uid(t) == uid(p))),
        "both original replicas were evicted"
    );
    assert_eq!(after.len(), 2);
    let evicted = evictions(audit_from);
    eprintln!("the operator's evictions (pod: response codes): {evicted:?}");
    let train_codes: Vec<u64> = train
        .iter()
        .flat_map(|p| {
            evicted
                .get(p["metadata"]["name"].as_str().unwrap_or_default())
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert!(
        train_codes.contains(&429),
        "the PodDisruptionBudget refused one eviction: {train_codes:?}"
    );
    assert_eq!(
        train_codes
            .iter()
            .filter(|c| **c == 201 || **c == 200)
            .count(),
        2,
        "each replica evicted once: {train_codes:?}"
    );
    let probe_name = probe["metadata"]["name"].as_str().unwrap_or_default();
    assert!(
        evicted
            .get(probe_name)
            .is_some_and(|codes| codes.iter().any(|c| *c == 201 || *c == 200)),
        "the DaemonSet pod that uses the GPU was evicted: {evicted:?}"
    );
    assert!(
        pods(WORKLOADS, "app=gpu-probe")
            .iter()
            .all(|p| uid(p) != uid(&probe)),
        "the probe pod that used the GPU is gone"
    );
    let web_now = pods(WORKLOADS, "")
        .into_iter()
        .find(|p| p["metadata"]["name"] == "web");
    assert_eq!(
        web_now.as_ref().map(uid),
        Some(uid(&web)),
        "the pod without GPUs was left alone"
    );
    assert!(!evicted.contains_key("web"));
    let mut gpunodes = String::new();
    eventually(WAIT, || {
        gpunodes = kubectl(&["get", "gpunodes", c]);
        Ok(
            (gpunodes.contains("DRIVER UPGRADE") && gpunodes.contains("upgrade-done"))
                .then_some(()),
        )
    })
    .unwrap_or_else(|e| panic!("kubectl get gpunodes shows the upgrade state: {e:#}\n{gpunodes}"));
    eprintln!("{gpunodes}");
    let port = cleanup.operator.as_ref().expect("the operator runs").port;
    let (code, metrics) = http_get(port, "/metrics").expect("operator serves /metrics");
    assert_eq!(code, 200);
    for line in [
        "gpu_operator_auto_upgrade_enabled 1",
        "gpu_operator_nodes_upgrades_done 9",
        "gpu_operator_nodes_upgrades_failed 1",
        "gpu_operator_nodes_upgrades_in_progress 0",
        "gpu_operator_nodes_upgrades_pending 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in:\n{metrics}"
        );
    }

    step(
        "a fixed version: the failed node resumes; the operator is killed in the middle and resumes too",
    );
    kubectl(&["taint", "node", broken, &format!("{BROKEN_TAINT}-")]);
    let initial = node_states(&nodes);
    let from = recorder.now();
    patch_cluster_policy(&json!({"spec": {"driver": {"version": "e2e-3"}}}));
    eventually(WAIT, || {
        let states = node_states(&nodes);
        Ok(states.values().any(|(s, _)| in_flight(s)).then_some(()))
    })
    .expect("an upgrade in flight");
    cleanup.operator.take().expect("the operator runs").kill();
    let at_kill = node_states(&nodes);
    eprintln!(
        "the operator was killed with these nodes in flight: {:?}",
        at_kill
            .iter()
            .filter(|(_, (s, _))| in_flight(s))
            .map(|(n, (s, _))| format!("{n}={s}"))
            .collect::<Vec<_>>()
    );
    cleanup.operator = Some(start_operator());
    wait_for_states(&nodes, &BTreeMap::new(), Duration::from_secs(120));
    let round_two = recorder.since(from);
    let round_two_took = recorder.now() - from;
    print_timeline(
        "driver.version e2e-2 -> e2e-3, operator killed and restarted",
        &round_two,
        from,
    );
    eprintln!(
        "all nodes settled {:.1}s after the patch",
        round_two_took.as_secs_f64()
    );
    let sequences_two = sequences(&round_two);
    for node in &nodes {
        let sequence: Vec<&str> = sequences_two[node].iter().map(String::as_str).collect();
        let from_required: Vec<&str> = sequence
            .iter()
            .copied()
            .skip_while(|s| *s != "upgrade-required")
            .collect();
        assert_eq!(from_required, ORDER, "{node}: {sequence:?}");
    }
    let initial_states: BTreeMap<String, String> = initial
        .iter()
        .map(|(n, (s, _))| (n.clone(), s.clone()))
        .collect();
    let most = most_in_flight(&round_two, &initial_states);
    assert!(
        most <= 2,
        "maxParallelUpgrades 2 across the restart, seen {most}"
    );
    let initial_cordons: BTreeMap<String, bool> =
        initial.iter().map(|(n, (_, c))| (n.clone(), *c)).collect();
    let cordoned = cordons(&round_two, &initial_cordons);
    for node in &nodes {
        let expected = usize::from(node != broken);
        assert_eq!(
            cordoned.get(node).copied().unwrap_or(0),
            expected,
            "{node} cordoned once (the failed node stayed cordoned): {cordoned:?}"
        );
    }
    let status = upgrade_status(10, 0);
    assert!(status["failures"].is_null(), "{status:#}");
    eprintln!(
        "driver upgrades: first {:.1}s (9 done, 1 failed after its {RESTART_TIMEOUT_SECONDS}s timeout), second {:.1}s (10 done, operator restarted); test {:.1}s",
        round_one_took.as_secs_f64(),
        round_two_took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

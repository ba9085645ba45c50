//! The node agent (`gpu-node-agent`) against the local cluster: MIG manager and feature discovery as local
//! processes per simulated node, with the chart's ServiceAccounts (so its RBAC is tested). The test adds its own
//! two nodes (copies of the harness's kwok nodes, with one A100-80GB and with eight H100s) and deletes them at the
//! end, so the other tests find the cluster as they expect. One scenario, in the order an admin meets it; and one
//! on a real kubelet ([`e2e::kubelet`]), whose pod-resources API tells the MIG manager which pod holds which GPU.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use e2e::agents::{NodeAgent, add_simulated_node, node_agent_bin, simulator_tool};
use e2e::kubelet::{DEVICE_PLUGIN_ROOT, Kubelet, allocatable, gpu_pod};
use e2e::plugin::DevicePlugin;
use e2e::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
/// The test's MIG ConfigMap: the chart's default geometries plus the test's own.
const MIG_CONFIG_MAP: &str = "e2e-mig-parted-config";
/// Label on the test's nodes, so that its stand-in GPU client runs on them only.
const TEST_NODE_LABEL: &str = "e2e.gpu-operator/node-agent";
const PLUGIN_LABEL: &str = "nvidia.com/gpu.deploy.device-plugin";
const STATE_LABEL: &str = "nvidia.com/mig.config.state";

fn node_labels(node: &str) -> Value {
    kubectl_json(&["get", "node", node])["metadata"]["labels"].clone()
}

fn gpunode(node: &str) -> Value {
    kubectl_json(&["get", "gpunode", node])
}

fn set_mig_config(node: &str, config: &str) -> Instant {
    kubectl(&[
        "label",
        "node",
        node,
        &format!("nvidia.com/mig.config={config}"),
        "--overwrite",
    ]);
    Instant::now()
}

/// Waits until the MIG manager has reached `state` for `config` (the label, and GPUNode status naming the
/// config, so that the state of an earlier change does not count); returns the time it took from `since`.
fn wait_for_state(node: &str, config: &str, state: &str, since: Instant) -> Duration {
    eventually(WAIT, || {
        // The agent creates its GPUNode once it has read the GPUs: until then, not there yet.
        let read = run("kubectl", &["get", "gpunode", node, "-o", "json"]);
        let mig = serde_json::from_str::<Value>(&read.stdout).unwrap_or_default()["status"]["mig"].clone();
        let done = node_labels(node)[STATE_LABEL] == state
            && mig["config"] == config
            && mig["state"] == state;
        Ok(done.then(|| since.elapsed()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "{node} never reached MIG state {state} for {config}: {error:#}\nlabels: {:#}\nGPUNode status: {:#}",
            node_labels(node),
            gpunode(node)["status"]
        )
    })
}

/// Every `(state, device-plugin deploy label)` the node goes through while it is watched: a `kubectl --watch`
/// sees each update, so a change faster than any polling is still seen.
struct LabelWatch(std::process::Child);

impl LabelWatch {
    fn start(node: &str) -> Self {
        let template = r#"{.metadata.labels.nvidia\.com/mig\.config\.state} {.metadata.labels.nvidia\.com/gpu\.deploy\.device-plugin}{"\n"}"#;
        let child = std::process::Command::new("kubectl")
            .args(["get", "node", node, "--watch", "-o"])
            .arg(format!("jsonpath={template}"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start kubectl --watch");
        std::thread::sleep(Duration::from_millis(500));
        Self(child)
    }

    /// Stops watching; returns what was seen, repeats removed.
    fn stop(mut self) -> Vec<(String, String)> {
        use std::io::Read;
        let _ = self.0.kill();
        let mut text = String::new();
        if let Some(mut stdout) = self.0.stdout.take() {
            let _ = stdout.read_to_string(&mut text);
        }
        let _ = self.0.wait();
        let mut seen: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            let (state, plugin) = line.split_once(' ').unwrap_or((line, ""));
            let entry = (state.to_owned(), plugin.to_owned());
            if seen.last() != Some(&entry) {
                seen.push(entry);
            }
        }
        seen
    }
}

/// The MIG geometry GPUNode status reports for every GPU: devices by profile.
fn current_geometry(node: &str) -> Vec<Value> {
    gpunode(node)["status"]["mig"]["current"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn assert_every_gpu_has(node: &str, devices: &Value) {
    let current = current_geometry(node);
    assert!(!current.is_empty(), "{node}: no geometry reported");
    for gpu in &current {
        assert_eq!(gpu["migEnabled"], true, "{node}: {gpu}");
        assert_eq!(&gpu["devices"], devices, "{node}: {gpu}");
    }
}

/// The stand-in GPU client: a DaemonSet whose pods carry the device plugin's `app` label and select the device
/// plugin's deploy label, so that pausing the label takes them off the node as it would the real plugin's.
fn gpu_client_daemonset() -> String {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "e2e-gpu-client", "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app": "nvidia-device-plugin-daemonset", "e2e": "gpu-client"}},
            "template": {
                "metadata": {"labels": {"app": "nvidia-device-plugin-daemonset", "e2e": "gpu-client"}},
                "spec": {
                    "nodeSelector": {PLUGIN_LABEL: "true", TEST_NODE_LABEL: "true"},
                    "containers": [{"name": "plugin", "image": "e2e/fake-device-plugin"}]
                }
            }
        }
    })
    .to_string()
}

fn client_pods_on(node: &str) -> usize {
    let pods = kubectl_json(&[
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        "e2e=gpu-client",
        "--field-selector",
        &format!("spec.nodeName={node}"),
    ]);
    pods["items"].as_array().map_or(0, Vec::len)
}

/// The test's MIG config: the chart's defaults plus a geometry that cannot exist on one GPU (9 memory slices)
/// and one that changes GPU 0 of the H100 node only.
fn mig_config_map() -> String {
    let defaults = kubectl_json(&[
        "get",
        "configmap",
        "default-mig-parted-config",
        "-n",
        NAMESPACE,
    ]);
    let mut text = defaults["data"]["config.yaml"]
        .as_str()
        .expect("the chart's MIG config")
        .trim_end()
        .to_owned();
    text.push('\n');
    text.push_str(
        r#"  e2e-too-big:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 2, "1g.10gb": 1}
  e2e-gpu-0-only:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  e2e-gpu-1-only:
    - devices: [1]
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  e2e-first-gpu:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
    - devices: [1, 2, 3, 4, 5, 6, 7]
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
"#,
    );
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": MIG_CONFIG_MAP, "namespace": NAMESPACE},
        "data": {"config.yaml": text}
    })
    .to_string()
}

/// The MIG manager of `node`, as the operator's DaemonSet runs it (plus `env`), with short timeouts.
fn mig_manager(node: &str, state: &Path, env: &[(&str, &str)]) -> NodeAgent {
    NodeAgent::start(
        &node_agent_bin(),
        node,
        "nvidia-mig-manager",
        state,
        &[
            "mig",
            "--config-map",
            MIG_CONFIG_MAP,
            "--default-config",
            "all-disabled",
            // Shorter than the default 300 s so a stuck scenario fails fast, but long enough for the DaemonSet
            // controller and kwok to remove the client pods right after a control-plane outage (30 s was not,
            // once, in the chaos scenario); under the 60 s that a scenario waits for the next step.
            "--clients-timeout",
            "50",
            "--eviction-timeout",
            "45",
        ],
        env,
    )
}

fn discovery(node: &str, state: &Path) -> NodeAgent {
    NodeAgent::start(
        &node_agent_bin(),
        node,
        "gpu-feature-discovery",
        state,
        &["discovery", "--mig-strategy", "mixed", "--interval", "1"],
        &[],
    )
}

/// `GPU index -> MIG device UUIDs` of a simulated node.
fn mig_devices(node: &str, state: &Path) -> Vec<(u32, String)> {
    simulator_tool(node, state, &["devices"])
        .lines()
        .filter_map(|line| {
            let (gpu, uuid) = line.split_once(' ')?;
            Some((gpu.parse().ok()?, uuid.to_owned()))
        })
        .collect()
}

fn warning_events(node: &str, reason: &str) -> Vec<String> {
    events_about(node)
        .iter()
        .filter(|event| event["reason"] == reason && event["type"] == "Warning")
        .filter_map(|event| event["message"].as_str().map(String::from))
        .collect()
}

/// Removes what a test added (its nodes, with their GPUNodes; its DaemonSet, ConfigMap, pods and budget) when
/// dropped, also when an assertion fails, so that the tests after this one find the cluster as they expect.
struct Cleanup {
    nodes: Vec<&'static str>,
    pods: Vec<&'static str>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        clean_up(&["daemonset", "e2e-gpu-client", "-n", NAMESPACE]);
        clean_up(&["configmap", MIG_CONFIG_MAP, "-n", NAMESPACE]);
        clean_up(&["pdb,pod", "e2e-gpu-workload", "-n", "default"]);
        for pod in &self.pods {
            clean_up(&["pod", pod, "-n", "default"]);
        }
        let mut nodes = vec!["node"];
        nodes.extend(&self.nodes);
        clean_up(&nodes);
    }
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn node_agent_mig_manager_and_feature_discovery() {
    chart_installed();
    let dir = scenario_dir("e2e-node-agent");
    let a100 = "e2e-a100-80gb";
    let h100 = "e2e-h100";
    let cleanup = Cleanup {
        nodes: vec![a100, h100],
        pods: Vec::new(),
    };
    let marker = [(TEST_NODE_LABEL, "true"), (PLUGIN_LABEL, "true")];
    add_simulated_node("gpu-a100-0", a100, "a100-80gb:1", &marker);
    add_simulated_node("gpu-h100-0", h100, "h100-80gb:8", &marker);
    assert!(kubectl_apply(&mig_config_map(), &[]).success);
    assert!(kubectl_apply(&gpu_client_daemonset(), &[]).success);
    let a100_state = dir.join(format!("{a100}.json"));
    let h100_state = dir.join(format!("{h100}.json"));

    step(
        "the agents start: GPUNode created and owned by the Node, feature labels, state success (all-disabled)",
    );
    let a100_mig = mig_manager(a100, &a100_state, &[]);
    let a100_discovery = discovery(a100, &a100_state);
    let started = Instant::now();
    wait_for_state(a100, "all-disabled", "success", started);
    let status = eventually(WAIT, || {
        let node = gpunode(a100);
        Ok((node["status"]["gpuCount"] == 1).then_some(node))
    })
    .unwrap_or_else(|error| panic!("GPUNode {a100}: {error:#}\n{}", a100_mig.output()));
    assert_eq!(status["status"]["product"], "NVIDIA A100-SXM4-80GB");
    assert_eq!(status["metadata"]["ownerReferences"][0]["kind"], "Node");
    let labels = eventually(WAIT, || {
        let labels = node_labels(a100);
        Ok((labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB").then_some(labels))
    })
    .expect("feature labels");
    assert_eq!(labels["nvidia.com/mig.capable"], "true");
    assert_eq!(labels["nvidia.com/gpu.family"], "ampere");
    assert_eq!(labels["nvidia.com/mig.strategy"], "mixed");
    eventually(WAIT, || Ok((client_pods_on(a100) == 1).then_some(())))
        .expect("the GPU client runs");

    step("nvidia.com/mig.config=all-1g.10gb: pending (clients paused), then success; 7x1g.10gb");
    let watch = LabelWatch::start(a100);
    let since = set_mig_config(a100, "all-1g.10gb");
    let took = wait_for_state(a100, "all-1g.10gb", "success", since);
    eprintln!("label -> success: {took:?}");
    let seen = watch.stop();
    let pair = |state: &str, plugin: &str| (state.to_owned(), plugin.to_owned());
    let during = seen
        .iter()
        .position(|s| *s == pair("pending", "paused-for-mig-change"));
    let after = seen.iter().rposition(|s| *s == pair("success", "true"));
    assert!(
        matches!((during, after), (Some(d), Some(a)) if d < a),
        "pending with the device plugin paused, then success with it restored: {seen:?}"
    );
    assert_eq!(node_labels(a100)[PLUGIN_LABEL], "true", "restored");
    assert_every_gpu_has(a100, &json!({"1g.10gb": 7}));
    eventually(WAIT, || Ok((client_pods_on(a100) == 1).then_some(())))
        .expect("the GPU client is back");
    eventually(WAIT, || {
        Ok((node_labels(a100)["nvidia.com/mig-1g.10gb.count"] == "7").then_some(()))
    })
    .expect("mixed-strategy labels follow the geometry");
    assert!(node_labels(a100)["nvidia.com/mig.config.progress"].is_null());

    step("all-balanced (mixed profiles)");
    let since = set_mig_config(a100, "all-balanced");
    let took = wait_for_state(a100, "all-balanced", "success", since);
    eprintln!("label -> success (all-balanced): {took:?}");
    assert_every_gpu_has(a100, &json!({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}));

    step(
        "a geometry that cannot exist: failed, GPUs unchanged, labels restored, reason in status, Warning event",
    );
    let before = current_geometry(a100);
    let since = set_mig_config(a100, "e2e-too-big");
    wait_for_state(a100, "e2e-too-big", "failed", since);
    assert_eq!(current_geometry(a100), before, "GPUs unchanged");
    assert_eq!(node_labels(a100)[PLUGIN_LABEL], "true");
    let error = gpunode(a100)["status"]["lastError"].clone();
    assert_eq!(error["component"], "mig-manager");
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("needs 9 memory slices"),
        "{error}"
    );
    eventually(WAIT, || {
        Ok((!warning_events(a100, "MigConfigFailed").is_empty()).then_some(()))
    })
    .expect("a Warning event on the Node");

    step(
        "a GPU pod under a PodDisruptionBudget (maxUnavailable 0): the change waits and reports, nothing is killed",
    );
    kubectl(&[
        "patch",
        "node",
        a100,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status": {"capacity": {"nvidia.com/gpu": "1"}, "allocatable": {"nvidia.com/gpu": "1"}}}"#,
    ]);
    let workload = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "e2e-gpu-workload", "namespace": "default", "labels": {"app": "e2e-gpu-workload"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": a100},
            "containers": [{"name": "cuda", "image": "e2e/cuda",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    });
    assert!(kubectl_apply(&workload.to_string(), &[]).success);
    let budget = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "e2e-gpu-workload", "namespace": "default"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "e2e-gpu-workload"}}}
    });
    assert!(kubectl_apply(&budget.to_string(), &[]).success);
    eventually(WAIT, || {
        let pod = kubectl_json(&["get", "pod", "e2e-gpu-workload", "-n", "default"]);
        Ok((pod["status"]["phase"] == "Running").then_some(()))
    })
    .expect("the GPU pod runs");
    let since = set_mig_config(a100, "all-3g.40gb");
    let refused = eventually(WAIT, || {
        let status = gpunode(a100)["status"].clone();
        let message = status["lastError"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Ok((status["mig"]["state"] == "pending" && message.contains("refused")).then_some(message))
    })
    .unwrap_or_else(|error| panic!("no refusal reported: {error:#}\n{}", a100_mig.output()));
    eprintln!("reported while waiting: {refused}");
    assert_eq!(node_labels(a100)[STATE_LABEL], "pending");
    let pod = kubectl_json(&["get", "pod", "e2e-gpu-workload", "-n", "default"]);
    assert!(
        pod["metadata"]["deletionTimestamp"].is_null(),
        "the budget holds"
    );
    kubectl(&["delete", "pdb", "e2e-gpu-workload", "-n", "default"]);
    wait_for_state(a100, "all-3g.40gb", "success", since);
    assert_every_gpu_has(a100, &json!({"3g.40gb": 2}));
    let gone = run(
        "kubectl",
        &["get", "pod", "e2e-gpu-workload", "-n", "default"],
    );
    assert!(!gone.success, "evicted once the budget allowed it");

    step("the MIG manager is killed in the middle of applying: the restarted one converges");
    simulator_tool(a100, &a100_state, &["delay", "400"]);
    set_mig_config(a100, "all-1g.10gb");
    eventually(WAIT, || {
        Ok((node_labels(a100)[STATE_LABEL] == "pending").then_some(()))
    })
    .expect("the change started");
    eventually(WAIT, || Ok((client_pods_on(a100) == 0).then_some(()))).expect("clients left");
    std::thread::sleep(Duration::from_secs(2));
    a100_mig.kill();
    let labels = node_labels(a100);
    assert_eq!(labels[STATE_LABEL], "pending", "killed mid-change");
    assert_eq!(labels[PLUGIN_LABEL], "paused-for-mig-change");
    assert!(
        !kubectl_json(&["get", "node", a100])["metadata"]["annotations"]["nvidia.com/mig.config.progress"]
            .is_null(),
        "the change's record is on the Node"
    );
    simulator_tool(a100, &a100_state, &["delay", "0"]);
    let restarted = Instant::now();
    let a100_mig = mig_manager(a100, &a100_state, &[]);
    let took = wait_for_state(a100, "all-1g.10gb", "success", restarted);
    eprintln!("restart -> success: {took:?}");
    assert_every_gpu_has(a100, &json!({"1g.10gb": 7}));
    assert_eq!(
        node_labels(a100)[PLUGIN_LABEL],
        "true",
        "restored after the crash"
    );

    step("H100 node: all-1g.10gb gives 7x1g.10gb on each of the 8 GPUs");
    let h100_mig = mig_manager(h100, &h100_state, &[]);
    let h100_discovery = discovery(h100, &h100_state);
    wait_for_state(h100, "all-disabled", "success", Instant::now());
    let since = set_mig_config(h100, "all-1g.10gb");
    let took = wait_for_state(h100, "all-1g.10gb", "success", since);
    eprintln!("label -> success (8 GPUs, all-1g.10gb): {took:?}");
    assert_every_gpu_has(h100, &json!({"1g.10gb": 7}));
    assert_eq!(current_geometry(h100).len(), 8);
    eventually(WAIT, || {
        let labels = node_labels(h100);
        Ok((labels["nvidia.com/mig-1g.10gb.count"] == "56"
            && labels["nvidia.com/gpu.family"] == "hopper")
            .then_some(()))
    })
    .expect("H100 feature labels: 56 1g.10gb devices");
    let table = kubectl(&["get", "gpunodes", h100]);
    eprintln!("{table}");
    assert!(
        table.contains("all-1g.10gb") && table.contains("success"),
        "{table}"
    );

    step("at rest the agents write nothing to the API server for 10 s (audit log)");
    let agents = [
        format!("system:serviceaccount:{NAMESPACE}:nvidia-mig-manager"),
        format!("system:serviceaccount:{NAMESPACE}:gpu-feature-discovery"),
    ];
    let (from, _) = audited_writes(&agents[0], 0);
    std::thread::sleep(Duration::from_secs(10));
    for agent in &agents {
        let (_, writes) = audited_writes(agent, from);
        assert!(writes.is_empty(), "{agent} wrote at rest: {writes:?}");
    }

    step("a change of GPU 0 only: the other GPUs keep their MIG devices (same UUIDs)");
    let before = mig_devices(h100, &h100_state);
    let since = set_mig_config(h100, "e2e-first-gpu");
    wait_for_state(h100, "e2e-first-gpu", "success", since);
    let after = mig_devices(h100, &h100_state);
    let on = |devices: &[(u32, String)], gpu: u32| -> Vec<String> {
        devices
            .iter()
            .filter(|(g, _)| *g == gpu)
            .map(|(_, u)| u.clone())
            .collect()
    };
    for gpu in 1..8 {
        assert_eq!(
            on(&after, gpu),
            on(&before, gpu),
            "GPU {gpu} was not touched"
        );
    }
    assert_eq!(on(&after, 0).len(), 2);
    assert_ne!(on(&after, 0), on(&before, 0));

    step("GPUs that cannot be reset: without WITH_REBOOT the change fails and the GPUs go back");
    drop(h100_mig);
    simulator_tool(h100, &h100_state, &["reset-failure", "unsupported"]);
    let h100_mig = mig_manager(h100, &h100_state, &[]);
    let before = current_geometry(h100);
    let since = set_mig_config(h100, "all-disabled");
    wait_for_state(h100, "all-disabled", "failed", since);
    let error = gpunode(h100)["status"]["lastError"]["message"].clone();
    assert!(
        error
            .as_str()
            .unwrap_or_default()
            .contains("WITH_REBOOT=true"),
        "{error}"
    );
    assert_eq!(current_geometry(h100), before, "rolled back");

    step("with WITH_REBOOT=true: state rebooting, the (simulated) reboot, then success");
    drop(h100_mig);
    let watch = LabelWatch::start(h100);
    let restarted = Instant::now();
    let h100_mig = mig_manager(h100, &h100_state, &[("WITH_REBOOT", "true")]);
    let took = wait_for_state(h100, "all-disabled", "success", restarted);
    eprintln!("start -> success through a reboot: {took:?}");
    let seen = watch.stop();
    assert!(
        seen.iter().any(|(state, _)| state == "rebooting"),
        "{seen:?}"
    );
    assert_eq!(seen.last().map(|(_, plugin)| plugin.as_str()), Some("true"));
    assert!(
        current_geometry(h100)
            .iter()
            .all(|gpu| gpu["migEnabled"] == false)
    );

    for agent in [&a100_mig, &h100_mig] {
        for line in agent
            .output()
            .lines()
            .filter(|line| line.contains("MIG config applied"))
        {
            eprintln!("agent: {line}");
        }
    }

    step("deleting a Node garbage-collects its GPUNode");
    drop((h100_mig, h100_discovery, a100_mig, a100_discovery));
    drop(cleanup);
    eventually(WAIT, || {
        let left = run("kubectl", &["get", "gpunode", a100, h100, "-o", "name"]);
        Ok(left.stdout.trim().is_empty().then_some(()))
    })
    .expect("GPUNodes deleted with their Nodes");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The GPU index of each GPU UUID of `node`, from GPUNode status.
fn gpu_indexes(node: &str) -> BTreeMap<String, u64> {
    gpunode(node)["status"]["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|gpu| Some((gpu["uuid"].as_str()?.to_owned(), gpu["index"].as_u64()?)))
        .collect()
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn mig_manager_evicts_only_the_pods_on_the_gpus_it_changes() {
    chart_installed();
    let node = "e2e-mig-kubelet";
    let dir = scenario_dir("e2e-mig-kubelet");
    let state = dir.join(format!("{node}.json"));
    let pods = ["e2e-gpu-pod-a", "e2e-gpu-pod-b"];
    let _cleanup = Cleanup {
        nodes: vec![node],
        pods: pods.to_vec(),
    };
    assert!(kubectl_apply(&mig_config_map(), &[]).success);

    step(
        "a real kubelet with 2 A100-80GB (simulated), the device plugin, the MIG manager reading pod-resources",
    );
    let kubelet = Kubelet::start(node, &dir.join("kubelet"), &[]);
    kubectl(&[
        "annotate",
        "node",
        node,
        "nvidia.com/gpu.simulator=a100-80gb:2",
        "--overwrite",
    ]);
    let plugin = DevicePlugin::start_on(Path::new(DEVICE_PLUGIN_ROOT), node, &state, &[]);
    let root = kubelet.root().display().to_string();
    let agent = mig_manager(node, &state, &[("KUBELET_ROOT", root.as_str())]);
    let logs = || {
        format!(
            "{}\nplugin log:\n{}\nMIG manager log:\n{}",
            kubelet.output(),
            plugin.output(),
            agent.output()
        )
    };
    wait_for_state(node, "all-disabled", "success", Instant::now());
    eventually(WAIT, || {
        Ok((allocatable(node, "nvidia.com/gpu").as_deref() == Some("2")).then_some(()))
    })
    .unwrap_or_else(|error| panic!("allocatable nvidia.com/gpu never 2: {error:#}\n{}", logs()));

    step("two pods, one GPU each: the kubelet gives them different GPUs");
    let mut holders = BTreeMap::new();
    for pod in pods {
        assert!(kubectl_apply(&gpu_pod(pod, node, "nvidia.com/gpu", 1), &[]).success);
    }
    let indexes = gpu_indexes(node);
    for pod in pods {
        let (gpu, uid) = eventually(WAIT, || {
            let got = kubectl_json(&["get", "pod", pod, "-n", "default"]);
            let Some(container) = kubelet.container_of(pod) else {
                return Ok(None);
            };
            let uuid = container["env"]["NVIDIA_VISIBLE_DEVICES"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let running = got["status"]["phase"] == "Running";
            Ok(running
                .then(|| indexes.get(&uuid).copied())
                .flatten()
                .map(|gpu| {
                    (
                        gpu,
                        got["metadata"]["uid"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    )
                }))
        })
        .unwrap_or_else(|error| panic!("{pod} never ran on a known GPU: {error:#}\n{}", logs()));
        holders.insert(pod, (gpu, uid));
    }
    let (gpu_a, _) = holders[pods[0]];
    let (gpu_b, uid_b) = holders[pods[1]].clone();
    assert_ne!(gpu_a, gpu_b, "{holders:?}");

    step("MIG on pod A's GPU only: pod A is evicted, pod B (on the other GPU) keeps running");
    let config = format!("e2e-gpu-{gpu_a}-only");
    let since = set_mig_config(node, &config);
    let took = wait_for_state(node, &config, "success", since);
    eprintln!("label -> success, with one eviction: {took:?}");
    let gone = run(
        "kubectl",
        &["get", "pod", pods[0], "-n", "default", "-o", "name"],
    );
    assert!(!gone.success, "pod A is still there:\n{}", logs());
    let b = kubectl_json(&["get", "pod", pods[1], "-n", "default"]);
    assert_eq!(b["metadata"]["uid"], uid_b.as_str(), "pod B was replaced");
    assert_eq!(b["status"]["phase"], "Running", "{b}");
    assert!(
        b["metadata"]["deletionTimestamp"].is_null(),
        "pod B is being deleted: {b}"
    );
    let output = agent.output();
    for line in output.lines().filter(|line| line.contains("evict")) {
        eprintln!("agent: {line}");
    }
    assert!(
        output.contains(&format!("default/{}", pods[0]))
            && !output.contains(&format!("evicted pod=default/{}", pods[1])),
        "{output}"
    );
    let geometry = current_geometry(node);
    let changed = geometry
        .iter()
        .find(|gpu| gpu["gpu"] == gpu_a)
        .expect("pod A's GPU");
    assert_eq!(changed["devices"], json!({"1g.10gb": 7}), "{geometry:?}");
}

/// Waits, polling every 10 ms, until `agent`'s log after byte `from` shows MIG step `name` starting; returns when.
fn wait_for_step_start(agent: &NodeAgent, from: usize, name: &str) -> Instant {
    let marker = format!("step{{step={name}}}");
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        let output = agent.output();
        let started = output.get(from..).is_some_and(|new| {
            new.lines()
                .any(|line| line.contains(&marker) && line.contains("step starts"))
        });
        if started {
            return Instant::now();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("step {name} never started:\n{}", agent.output())
}

/// A pod on `node` that holds its one GPU, running.
fn run_gpu_workload(node: &str, name: &str) {
    let workload = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "cuda", "image": "e2e/cuda",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    });
    assert!(kubectl_apply(&workload.to_string(), &[]).success);
    eventually(WAIT, || {
        let pod = kubectl_json(&["get", "pod", name, "-n", "default"]);
        Ok((pod["status"]["phase"] == "Running").then_some(()))
    })
    .expect("the GPU pod runs");
}

/// What a MIG change must leave once it is done, however it was interrupted: the geometry, the device plugin's
/// deploy label restored and no change record left on the Node (the agent's part), its client back (the
/// DaemonSet controller's part, which after a control-plane outage waits for the node's lease and taints to
/// recover, so it gets longer), the GPU pod evicted.
fn assert_change_complete(node: &str, devices: &Value, workload: &str) {
    assert_every_gpu_has(node, devices);
    eventually(WAIT, || {
        let node_object = kubectl_json(&["get", "node", node]);
        let labels = &node_object["metadata"]["labels"];
        let record = &node_object["metadata"]["annotations"]["nvidia.com/mig.config.progress"];
        Ok((labels[PLUGIN_LABEL] == "true" && record.is_null()).then_some(()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "{node}: plugin label or change record not restored: {error:#}\n{:#}",
            kubectl_json(&["get", "node", node])["metadata"]
        )
    });
    eventually(2 * WAIT, || Ok((client_pods_on(node) == 1).then_some(()))).unwrap_or_else(
        |error| {
            let node_object = kubectl_json(&["get", "node", node]);
            panic!(
                "{node}: the GPU client is not back: {error:#}\ntaints: {}\nconditions: {}\nclients: {}",
                node_object["spec"]["taints"],
                node_object["status"]["conditions"],
                run("kubectl", &["get", "pods", "-n", NAMESPACE, "-l", "e2e=gpu-client", "-o", "wide"]).stdout
            )
        },
    );
    let left = run("kubectl", &["get", "pod", workload, "-n", "default"]);
    assert!(!left.success, "{workload} was not evicted");
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn mig_changes_survive_control_plane_faults_and_a_kill_at_every_step() {
    chart_installed();
    let node = "e2e-mig-chaos";
    let workload = "e2e-mig-chaos-workload";
    let dir = scenario_dir("e2e-mig-chaos");
    let state = dir.join(format!("{node}.json"));
    let _cleanup = Cleanup {
        nodes: vec![node],
        pods: vec![workload],
    };
    add_simulated_node(
        "gpu-a100-0",
        node,
        "a100-80gb:1",
        &[(TEST_NODE_LABEL, "true"), (PLUGIN_LABEL, "true")],
    );
    kubectl(&[
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status": {"capacity": {"nvidia.com/gpu": "1"}, "allocatable": {"nvidia.com/gpu": "1"}}}"#,
    ]);
    assert!(kubectl_apply(&mig_config_map(), &[]).success);
    assert!(kubectl_apply(&gpu_client_daemonset(), &[]).success);
    let mut agent = mig_manager(node, &state, &[]);
    wait_for_state(node, "all-disabled", "success", Instant::now());
    eventually(WAIT, || Ok((client_pods_on(node) == 1).then_some(())))
        .expect("the GPU client runs");
    // Every GPU operation takes 100 ms, as MIG operations take time on hardware, so that each step lasts.
    simulator_tool(node, &state, &["delay", "100"]);
    let configs = [
        ("all-1g.10gb", json!({"1g.10gb": 7})),
        ("all-3g.40gb", json!({"3g.40gb": 2})),
    ];

    for (round, name) in ["Pause", "WaitForClients", "Evict", "ChangeGpus", "Verify"]
        .into_iter()
        .enumerate()
    {
        step(&format!(
            "the MIG manager killed (SIGKILL) as step {name} starts: the restarted one finishes the change"
        ));
        let (config, devices) = &configs[round % 2];
        run_gpu_workload(node, workload);
        let from = agent.output().len();
        set_mig_config(node, config);
        wait_for_step_start(&agent, from, name);
        agent.kill();
        let killed = Instant::now();
        let labels = node_labels(node);
        eprintln!(
            "killed at {name}: state {}, device plugin {}",
            labels[STATE_LABEL], labels[PLUGIN_LABEL]
        );
        agent = mig_manager(node, &state, &[]);
        let took = wait_for_state(node, config, "success", killed);
        assert_change_complete(node, devices, workload);
        eprintln!(
            "killed at {name}: the restarted MIG manager reached success {took:?} after the kill"
        );
    }

    for (component, down_for) in [
        ("kube-apiserver", Duration::from_secs(30)),
        ("etcd", Duration::ZERO),
    ] {
        step(&format!(
            "{component} stopped for {down_for:?} while the GPUs change: the change completes once it is back"
        ));
        // The last kill left the first config: the outages alternate from the second.
        let (config, devices) = &configs[usize::from(component == "kube-apiserver")];
        run_gpu_workload(node, workload);
        let from = agent.output().len();
        set_mig_config(node, config);
        wait_for_step_start(&agent, from, "ChangeGpus");
        let back = ControlPlaneRestart::start(component, down_for).wait();
        let took = wait_for_state(node, config, "success", back);
        assert_change_complete(node, devices, workload);
        eprintln!(
            "{component} stopped for {down_for:?} during ChangeGpus: success {took:?} after it served again"
        );
    }
    drop(agent);
}

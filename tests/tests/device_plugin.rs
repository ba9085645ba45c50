//! The device plugin (`gpu-device-plugin`) against the local cluster: one simulated node with 4 A100-40GB, the
//! plugin as a local process under the chart's ServiceAccount, the config in a ConfigMap chosen by the node's
//! `nvidia.com/device-plugin.config` label. What the plugin advertises is read back from GPUNode
//! `status.devicePlugin`, which it writes from the same snapshots it serves to the kubelet. One scenario, in the
//! order an admin meets it: the guides' time-slicing numbers, a relabel and a ConfigMap edit taking effect without
//! a restart, a bad label keeping the last good config (GPUNode lastError and a Warning Event), and a MIG change.

use std::time::{Duration, Instant};

use e2e::agents::{add_simulated_node, node_agent_bin};
use e2e::plugin::{DevicePlugin, TestKubelet, inject_xid, kubelet_root};
use e2e::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const NODE: &str = "e2e-dp-a100";
const CONFIG_MAP: &str = "e2e-device-plugin-config";
const CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";

fn step(name: &str) {
    eprintln!("--- {name}");
}

/// A device-plugin config that time-slices nvidia.com/gpu into `replicas`.
fn time_slicing(replicas: u32, rename: bool) -> String {
    format!(
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: {rename}\n    resources:\n    \
         - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )
}

fn config_map(slice_10_replicas: u32) -> String {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
        "data": {
            "any": time_slicing(4, false),
            "slice-4": time_slicing(4, true),
            "slice-10": time_slicing(slice_10_replicas, true),
        }
    })
    .to_string()
}

fn label(value: Option<&str>) -> Instant {
    label_node(NODE, value)
}

fn label_node(node: &str, value: Option<&str>) -> Instant {
    let argument = value.map_or_else(
        || format!("{CONFIG_LABEL}-"),
        |value| format!("{CONFIG_LABEL}={value}"),
    );
    kubectl(&["label", "node", node, &argument, "--overwrite"]);
    Instant::now()
}

/// The node's GPUNode status; null while the plugin has not created the GPUNode yet.
fn plugin_status() -> Value {
    let got = run("kubectl", &["get", "gpunode", NODE, "-o", "json"]);
    if !got.success {
        return Value::Null;
    }
    serde_json::from_str::<Value>(&got.stdout).expect("kubectl printed JSON")["status"].clone()
}

/// Waits until GPUNode reports exactly `resources` under config `config`; returns the time from `since`.
fn wait_for_resources(
    plugin: &DevicePlugin,
    config: &str,
    resources: &[(&str, u64)],
    since: Instant,
) -> Duration {
    let expected: Vec<Value> = resources
        .iter()
        .map(|(name, count)| json!({"name": name, "count": count}))
        .collect();
    eventually(WAIT, || {
        let status = plugin_status();
        let plugin = &status["devicePlugin"];
        Ok((plugin["config"] == config && plugin["resources"] == Value::from(expected.clone())).then(|| since.elapsed()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "{NODE} never advertised {resources:?} with {config}: {error:#}\nGPUNode status: {:#}\nplugin log:\n{}",
            plugin_status(),
            plugin.output()
        )
    })
}

/// Removes a test's node (with its GPUNode) and the ConfigMap when dropped, also when an assertion fails.
struct Cleanup(&'static str);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run(
            "kubectl",
            &[
                "delete",
                "configmap",
                CONFIG_MAP,
                "-n",
                NAMESPACE,
                "--ignore-not-found",
            ],
        );
        let _ = run("kubectl", &["delete", "node", self.0, "--ignore-not-found"]);
    }
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn device_plugin_follows_labels_config_maps_and_mig() {
    chart_installed();
    let dir = std::env::temp_dir().join(format!("e2e-device-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("state folder");
    let state = dir.join(format!("{NODE}.json"));
    let _cleanup = Cleanup(NODE);
    assert!(kubectl_apply(&config_map(10), &[]).success);
    add_simulated_node(
        "gpu-a100-0",
        NODE,
        "a100-40gb:4",
        &[(CONFIG_LABEL, "slice-4")],
    );

    step(
        "slice-4 with renameByDefault on 4 A100-40GB: nvidia.com/gpu.shared 16 (the guide's number)",
    );
    let started = Instant::now();
    let plugin = DevicePlugin::start(
        NODE,
        &state,
        &[
            "--mig-strategy",
            "mixed",
            "--config-map",
            CONFIG_MAP,
            "--default-config",
            "any",
            "--cdi",
        ],
    );
    let took = wait_for_resources(
        &plugin,
        "slice-4",
        &[("nvidia.com/gpu.shared", 16)],
        started,
    );
    eprintln!("advertised {took:?} after start");
    assert!(
        plugin.serves("nvidia.com/gpu.shared"),
        "{}",
        plugin.output()
    );
    let cdi = std::fs::read_to_string(
        plugin
            .root
            .join("cdi/k8s.device-plugin.nvidia.com-gpu.json"),
    )
    .expect("CDI spec");
    assert_eq!(cdi.matches("\"name\": \"GPU-").count(), 4, "{cdi}");
    let owner = kubectl_json(&["get", "gpunode", NODE])["metadata"]["ownerReferences"][0].clone();
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("Node"), Some(NODE))
    );

    step("relabel slice-4 -> slice-10: 40 replicas, same process");
    let took = wait_for_resources(
        &plugin,
        "slice-10",
        &[("nvidia.com/gpu.shared", 40)],
        label(Some("slice-10")),
    );
    eprintln!("relabel took effect after {took:?}");

    step("edit the ConfigMap (slice-10 now has 5 replicas): 20, same process");
    let edited = Instant::now();
    assert!(kubectl_apply(&config_map(5), &[]).success);
    let took = wait_for_resources(
        &plugin,
        "slice-10",
        &[("nvidia.com/gpu.shared", 20)],
        edited,
    );
    eprintln!("ConfigMap edit took effect after {took:?}");

    step(
        "a label naming a missing key keeps slice-10 and says why (GPUNode lastError, Warning Event)",
    );
    label(Some("slice-3"));
    let error = eventually(WAIT, || {
        let error = plugin_status()["lastError"].clone();
        Ok((error["component"] == "device-plugin").then_some(error))
    })
    .unwrap_or_else(|error| panic!("no lastError: {error:#}\n{}", plugin.output()));
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no key \"slice-3\"") && message.ends_with("keeping config slice-10"),
        "{message}"
    );
    assert_eq!(plugin_status()["devicePlugin"]["resources"][0]["count"], 20);
    eventually(WAIT, || {
        let events = kubectl_json(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            &format!("involvedObject.name={NODE}"),
        ]);
        let rejected = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|event| {
                event["reason"] == "DevicePluginConfigRejected" && event["type"] == "Warning"
            });
        Ok(rejected.then_some(()))
    })
    .expect("a Warning Event on the Node");

    step("no label: the default config (any: 4 replicas, no rename) and the error is cleared");
    wait_for_resources(&plugin, "any", &[("nvidia.com/gpu", 16)], label(None));
    eventually(WAIT, || {
        Ok(plugin_status()["lastError"].is_null().then_some(()))
    })
    .expect("lastError cleared");
    assert!(
        !plugin.serves("nvidia.com/gpu.shared"),
        "the renamed resource is withdrawn"
    );

    step(
        "MIG 2x2g.10gb + 3x1g.5gb on every GPU, mixed strategy: mig-1g.5gb 12, mig-2g.10gb 8 (the guide's numbers)",
    );
    let mig_config = dir.join("mig-parted.yaml");
    std::fs::write(
        &mig_config,
        "version: v1\nmig-configs:\n  e2e-mixed:\n  - devices: all\n    mig-enabled: true\n    \
         mig-devices:\n      \"2g.10gb\": 2\n      \"1g.5gb\": 3\n",
    )
    .expect("mig-parted file");
    let applied = Instant::now();
    let output = std::process::Command::new(node_agent_bin())
        .args(["mig", "apply", "-f"])
        .arg(&mig_config)
        .args([
            "-c",
            "e2e-mixed",
            "--simulate",
            "node",
            "--node-name",
            NODE,
            "--sim-state",
        ])
        .arg(&state)
        .output()
        .expect("gpu-node-agent mig apply");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let took = wait_for_resources(
        &plugin,
        "any",
        &[("nvidia.com/mig-1g.5gb", 12), ("nvidia.com/mig-2g.10gb", 8)],
        applied,
    );
    eprintln!("MIG change advertised {took:?} after mig apply");
    assert!(
        plugin.serves("nvidia.com/mig-1g.5gb") && !plugin.serves("nvidia.com/gpu"),
        "{}",
        plugin.output()
    );
}

/// The node for the test kubelet scenario.
const KUBELET_NODE: &str = "e2e-dp-kubelet";

/// The node's allocatable for `resource`, as the scheduler sees it.
fn allocatable(resource: &str) -> Option<String> {
    kubectl_json(&["get", "node", KUBELET_NODE])["status"]["allocatable"][resource]
        .as_str()
        .map(str::to_owned)
}

fn wait_for_allocatable(
    resource: &str,
    count: &str,
    what: &str,
    logs: &dyn Fn() -> String,
) -> Duration {
    let since = Instant::now();
    eventually(WAIT, || {
        Ok((allocatable(resource).as_deref() == Some(count)).then(|| since.elapsed()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "{what}: allocatable {resource} never {count}: {error:#}\n{}",
            logs()
        )
    })
}

/// A pod asking for one `nvidia.com/gpu.shared` on the test kubelet's node, left to the scheduler.
fn shared_gpu_pod(name: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": KUBELET_NODE},
            "containers": [{"name": "cuda", "image": "e2e/cuda-sample",
                            "resources": {"limits": {"nvidia.com/gpu.shared": 1}}}]
        }
    })
    .to_string()
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn device_plugin_on_a_kubelet_built_on_the_generated_api() {
    chart_installed();
    let dir =
        std::env::temp_dir().join(format!("e2e-device-plugin-kubelet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("state folder");
    let state = dir.join(format!("{KUBELET_NODE}.json"));
    let _cleanup = Cleanup(KUBELET_NODE);
    let _pod_cleanup = PodCleanup("e2e-shared-gpu");
    assert!(kubectl_apply(&config_map(10), &[]).success);
    add_simulated_node(
        "gpu-a100-0",
        KUBELET_NODE,
        "a100-40gb:4",
        &[(CONFIG_LABEL, "slice-4")],
    );
    let root = kubelet_root(KUBELET_NODE, &state);
    std::fs::create_dir_all(root.join("device-plugins")).expect("device-plugin directory");

    step(
        "the test kubelet and the plugin: allocatable nvidia.com/gpu.shared 16, written by the kubelet side",
    );
    let mut kubelet = TestKubelet::start(KUBELET_NODE, &root, 0);
    let plugin = DevicePlugin::start(
        KUBELET_NODE,
        &state,
        &[
            "--mig-strategy",
            "none",
            "--config-map",
            CONFIG_MAP,
            "--default-config",
            "any",
            "--cdi",
            "--health-recovery-seconds",
            "3",
        ],
    );
    let logs = || all_logs(&dir);
    let took = wait_for_allocatable("nvidia.com/gpu.shared", "16", "start", &logs);
    eprintln!("allocatable after {took:?}");

    step(
        "a pod asking for one replica: the real scheduler binds it, Allocate gives it the GPU by UUID and CDI name",
    );
    assert!(kubectl_apply(&shared_gpu_pod("e2e-shared-gpu"), &[]).success);
    let allocation: Value = eventually(WAIT, || {
        let pod = kubectl_json(&["get", "pod", "e2e-shared-gpu", "-n", "default"]);
        let annotation = pod["metadata"]["annotations"]["e2e.gpu-operator/device-allocation"]
            .as_str()
            .map(str::to_owned);
        Ok(annotation.map(|text| serde_json::from_str(&text).expect("allocation JSON")))
    })
    .unwrap_or_else(|error| panic!("the pod was never allocated: {error:#}\n{}", logs()));
    let answer = &allocation["cuda"]["nvidia.com/gpu.shared"];
    let visible = answer["envs"]["NVIDIA_VISIBLE_DEVICES"]
        .as_str()
        .unwrap_or_default();
    assert!(
        visible.starts_with("GPU-") && !visible.contains(','),
        "{allocation}"
    );
    assert_eq!(
        answer["cdiDevices"][0],
        format!("k8s.device-plugin.nvidia.com/gpu={visible}"),
        "{allocation}"
    );
    assert!(
        answer["devices"][0]
            .as_str()
            .unwrap_or_default()
            .starts_with(&format!("{visible}::")),
        "{allocation}"
    );

    step("relabel slice-4 -> slice-10: allocatable 40, the plugin not restarted");
    label_node(KUBELET_NODE, Some("slice-10"));
    let took = wait_for_allocatable("nvidia.com/gpu.shared", "40", "relabel", &logs);
    eprintln!("relabel reached allocatable after {took:?}");

    step(
        "an XID on GPU 0: its 10 replicas go Unhealthy (allocatable 30), then recover after the quiet period (3 s)",
    );
    inject_xid(KUBELET_NODE, &state, 0, 79);
    wait_for_allocatable("nvidia.com/gpu.shared", "30", "XID", &logs);
    let took = wait_for_allocatable("nvidia.com/gpu.shared", "40", "recovery", &logs);
    eprintln!("recovered {took:?} after the drop was seen");

    step(
        "kubelet restart (sockets deleted, kubelet.sock created again): the plugin registers again",
    );
    drop(kubelet);
    let restarted = Instant::now();
    kubelet = TestKubelet::start(KUBELET_NODE, &root, 1);
    let took = eventually(WAIT, || {
        Ok(kubelet
            .output()
            .contains("registered nvidia.com/gpu.shared")
            .then(|| restarted.elapsed()))
    })
    .unwrap_or_else(|error| panic!("no re-registration: {error:#}\n{}", logs()));
    eprintln!("re-registered {took:?} after the kubelet started again");
    wait_for_allocatable(
        "nvidia.com/gpu.shared",
        "40",
        "after the kubelet restart",
        &logs,
    );
    assert!(
        plugin.serves("nvidia.com/gpu.shared"),
        "a fresh socket after the restart"
    );
}

/// Every log in the test's folder (the test kubelets' and the plugin's), for a failure message.
fn all_logs(dir: &std::path::Path) -> String {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .collect();
    logs.retain(|path| path.extension().is_some_and(|extension| extension == "log"));
    logs.sort();
    logs.iter()
        .map(|path| {
            format!(
                "==> {}\n{}",
                path.display(),
                std::fs::read_to_string(path).unwrap_or_default()
            )
        })
        .collect()
}

/// Deletes a test pod when dropped.
struct PodCleanup(&'static str);

impl Drop for PodCleanup {
    fn drop(&mut self) {
        let _ = run(
            "kubectl",
            &[
                "delete",
                "pod",
                self.0,
                "-n",
                "default",
                "--ignore-not-found",
                "--wait=false",
            ],
        );
    }
}

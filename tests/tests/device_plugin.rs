//! The device plugin (`gpu-device-plugin`) against the local cluster, on simulated nodes with 4 A100-40GB, the
//! plugin as a local process under the chart's ServiceAccount, the config in a ConfigMap chosen by the node's
//! `nvidia.com/device-plugin.config` label. Two scenarios:
//! - on a kwok node (no kubelet), what the plugin reports in GPUNode `status.devicePlugin`, which it writes from
//!   the same snapshots it serves to the kubelet: the guides' numbers, a relabel and a ConfigMap edit without a
//!   restart, a bad label keeping the last good config (GPUNode lastError and a Warning Event), a MIG change;
//! - on a real kubelet ([`e2e::kubelet`]): node allocatable as the kubelet computes it from ListAndWatch, pods
//!   bound by the real scheduler and admitted by the kubelet, whose Allocate answers reach the container runtime,
//!   an XID and its recovery, a kubelet restart, and the mixed and single MIG strategies.

use std::time::{Duration, Instant};

use e2e::agents::{add_simulated_node, node_agent_bin};
use e2e::kubelet::{DEVICE_PLUGIN_ROOT, Kubelet, allocatable, delete_pod, gpu_pod, wait_running};
use e2e::plugin::{DevicePlugin, inject_xid};
use e2e::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const NODE: &str = "e2e-dp-a100";
const CONFIG_MAP: &str = "e2e-device-plugin-config";
const CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";

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
        clean_up(&["configmap", CONFIG_MAP, "-n", NAMESPACE]);
        clean_up(&["node", self.0]);
    }
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn device_plugin_follows_labels_config_maps_and_mig() {
    chart_installed();
    let dir = scenario_dir("e2e-device-plugin");
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
    let cdi = std::fs::read_to_string(plugin.cdi_dir.join("k8s.device-plugin.nvidia.com-gpu.json"))
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
        let rejected = events_about(NODE).iter().any(|event| {
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
    let applied = Instant::now();
    mig_apply(
        NODE,
        &state,
        &dir,
        "e2e-mixed",
        "{\"2g.10gb\": 2, \"1g.5gb\": 3}",
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

/// The node of the real-kubelet scenario.
const KUBELET_NODE: &str = "e2e-kubelet";

/// Waits until the kubelet's node has `count` of `resource` allocatable; returns how long that took.
fn wait_for_allocatable(
    resource: &str,
    count: &str,
    what: &str,
    logs: &dyn Fn() -> String,
) -> Duration {
    let since = Instant::now();
    eventually(WAIT, || {
        Ok(
            (allocatable(KUBELET_NODE, resource).as_deref() == Some(count))
                .then(|| since.elapsed()),
        )
    })
    .unwrap_or_else(|error| {
        panic!(
            "{what}: allocatable {resource} never {count}: {error:#}\n{}",
            logs()
        )
    })
}

/// Creates a pod asking for `count` of `resource` and waits until the kubelet runs it; returns the container as
/// the runtime got it (environment and CDI devices from the plugin's Allocate answer) and the pod's UID.
fn run_gpu_pod(
    kubelet: &Kubelet,
    name: &str,
    resource: &str,
    count: u32,
    logs: &dyn Fn() -> String,
) -> (Value, String) {
    assert!(kubectl_apply(&gpu_pod(name, KUBELET_NODE, resource, count), &[]).success);
    let pod = wait_running(name, WAIT, logs);
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let container = kubelet
        .container_of(name)
        .unwrap_or_else(|| panic!("the runtime never created {name}'s container\n{}", logs()));
    (container, uid)
}

/// The devices a created container got: its `NVIDIA_VISIBLE_DEVICES` entries, checked against its CDI names.
fn visible_devices(container: &Value) -> Vec<String> {
    let visible: Vec<String> = container["env"]["NVIDIA_VISIBLE_DEVICES"]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .collect();
    let cdi: Vec<String> = visible
        .iter()
        .map(|id| format!("k8s.device-plugin.nvidia.com/gpu={id}"))
        .collect();
    assert_eq!(container["cdiDevices"], json!(cdi), "{container}");
    visible
}

/// Applies a mig-parted config to the simulated GPUs of `node` with the admin tool.
fn mig_apply(
    node: &str,
    state: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    devices: &str,
) {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &file,
        format!(
            "version: v1\nmig-configs:\n  {name}:\n  - devices: all\n    mig-enabled: true\n    \
             mig-devices: {devices}\n"
        ),
    )
    .expect("mig-parted file");
    let file = file.display().to_string();
    simulated::run_tool(
        &node_agent_bin(),
        node,
        state,
        &["mig", "apply", "-f", &file, "-c", name],
    );
}

/// The ConfigMap of the real-kubelet scenario: the time-slicing keys, whole GPUs, and the two MIG strategies.
fn kubelet_config_map(slice_10_replicas: u32) -> String {
    let mut config_map: Value = serde_json::from_str(&config_map(slice_10_replicas)).expect("JSON");
    let data = &mut config_map["data"];
    data["whole"] = "version: v1\n".into();
    data["mixed"] = "version: v1\nflags:\n  migStrategy: mixed\n".into();
    data["single"] = "version: v1\nflags:\n  migStrategy: single\n".into();
    config_map.to_string()
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn device_plugin_on_a_real_kubelet() {
    chart_installed();
    let dir = scenario_dir("e2e-real-kubelet");
    let state = dir.join(format!("{KUBELET_NODE}.json"));
    let _config_map = Cleanup(KUBELET_NODE);
    let _pods = [
        PodCleanup("e2e-shared-gpu"),
        PodCleanup("e2e-mig-2g"),
        PodCleanup("e2e-single-mig"),
    ];
    assert!(kubectl_apply(&kubelet_config_map(10), &[]).success);

    step("a real kubelet (fake container runtime) joins the cluster as node e2e-kubelet");
    let started = Instant::now();
    let kubelet = Kubelet::start(
        KUBELET_NODE,
        &dir.join("kubelet"),
        &[(CONFIG_LABEL, "whole")],
    );
    eprintln!(
        "node Ready {:?} after the kubelet started",
        started.elapsed()
    );
    kubectl(&[
        "annotate",
        "node",
        KUBELET_NODE,
        "nvidia.com/gpu.simulator=a100-40gb:4",
        "--overwrite",
    ]);
    let plugin = DevicePlugin::start_on(
        std::path::Path::new(DEVICE_PLUGIN_ROOT),
        KUBELET_NODE,
        &state,
        &[
            "--config-map",
            CONFIG_MAP,
            "--default-config",
            "any",
            "--cdi",
            "--health-recovery-seconds",
            "5",
        ],
    );
    let logs = || format!("{}\nplugin log:\n{}", kubelet.output(), plugin.output());

    step("whole GPUs: the kubelet registers the plugin and allocatable nvidia.com/gpu is 4");
    let took = wait_for_allocatable("nvidia.com/gpu", "4", "start", &logs);
    eprintln!("allocatable {took:?} after the plugin started");

    step(
        "an XID on GPU 0: allocatable drops by one and GPUNode says Degraded, then both recover after the quiet period (5 s)",
    );
    let health = |expected: (Value, Value)| {
        eventually(WAIT, || {
            let status = &kubectl_json(&["get", "gpunode", KUBELET_NODE])["status"];
            let seen = (
                status["health"].clone(),
                status["devicePlugin"]["unhealthyGpus"].clone(),
            );
            Ok((seen == expected).then_some(()))
        })
        .unwrap_or_else(|error| panic!("GPUNode health never {expected:?}: {error:#}\n{}", logs()));
    };
    health((json!("Healthy"), Value::Null));
    inject_xid(KUBELET_NODE, &state, 0, 79);
    wait_for_allocatable("nvidia.com/gpu", "3", "XID", &logs);
    health((json!("Degraded"), json!([0])));
    let took = wait_for_allocatable("nvidia.com/gpu", "4", "recovery", &logs);
    eprintln!("recovered {took:?} after the drop was seen");
    health((json!("Healthy"), Value::Null));

    step("slice-4 with renameByDefault: allocatable nvidia.com/gpu.shared 16 (the guide's number)");
    label_node(KUBELET_NODE, Some("slice-4"));
    wait_for_allocatable("nvidia.com/gpu.shared", "16", "slice-4", &logs);

    step(
        "a pod asking for one replica: the scheduler binds it, the kubelet's Allocate gives it one GPU (UUID, CDI)",
    );
    let (container, uid) = run_gpu_pod(
        &kubelet,
        "e2e-shared-gpu",
        "nvidia.com/gpu.shared",
        1,
        &logs,
    );
    let visible = visible_devices(&container);
    assert!(
        visible.len() == 1 && visible[0].starts_with("GPU-"),
        "{container}"
    );

    step(
        "relabel slice-4 -> slice-10: allocatable 40, the pod keeps running, the plugin is not restarted",
    );
    let took = {
        label_node(KUBELET_NODE, Some("slice-10"));
        wait_for_allocatable("nvidia.com/gpu.shared", "40", "relabel", &logs)
    };
    eprintln!("relabel reached allocatable after {took:?}");

    step("edit the ConfigMap (slice-10 now has 5 replicas): allocatable 20");
    assert!(kubectl_apply(&kubelet_config_map(5), &[]).success);
    let took = wait_for_allocatable("nvidia.com/gpu.shared", "20", "ConfigMap edit", &logs);
    eprintln!("ConfigMap edit reached allocatable after {took:?}");
    let pod = kubectl_json(&["get", "pod", "e2e-shared-gpu", "-n", "default"]);
    assert_eq!(pod["metadata"]["uid"], uid.as_str(), "the pod was replaced");
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0);

    step(
        "kubelet restart (it deletes every socket and serves kubelet.sock again): the plugin registers again",
    );
    let registrations = || {
        plugin
            .output()
            .matches("registered with the kubelet")
            .count()
    };
    let before = registrations();
    let restarted = Instant::now();
    kubelet.restart();
    let took = eventually(WAIT, || {
        Ok((registrations() > before).then(|| restarted.elapsed()))
    })
    .unwrap_or_else(|error| panic!("no re-registration: {error:#}\n{}", logs()));
    eprintln!("re-registered {took:?} after the kubelet was restarted");
    wait_for_allocatable(
        "nvidia.com/gpu.shared",
        "20",
        "after the kubelet restart",
        &logs,
    );
    assert!(
        plugin.serves("nvidia.com/gpu.shared"),
        "a fresh socket after the restart"
    );
    delete_pod("e2e-shared-gpu");

    step(
        "MIG 2x2g.10gb + 3x1g.5gb on every GPU, mixed strategy: mig-1g.5gb 12, mig-2g.10gb 8 (the guide's numbers)",
    );
    mig_apply(
        KUBELET_NODE,
        &state,
        &dir,
        "e2e-mixed",
        "{\"2g.10gb\": 2, \"1g.5gb\": 3}",
    );
    label_node(KUBELET_NODE, Some("mixed"));
    wait_for_allocatable("nvidia.com/mig-1g.5gb", "12", "mixed", &logs);
    wait_for_allocatable("nvidia.com/mig-2g.10gb", "8", "mixed", &logs);
    let (container, _) = run_gpu_pod(&kubelet, "e2e-mig-2g", "nvidia.com/mig-2g.10gb", 1, &logs);
    let visible = visible_devices(&container);
    assert!(
        visible.len() == 1 && visible[0].starts_with("MIG-"),
        "{container}"
    );
    delete_pod("e2e-mig-2g");

    step(
        "7x1g.5gb on every GPU, single strategy: nvidia.com/gpu 28 (the guide's number), pods get MIG devices",
    );
    mig_apply(KUBELET_NODE, &state, &dir, "e2e-single", "{\"1g.5gb\": 7}");
    label_node(KUBELET_NODE, Some("single"));
    wait_for_allocatable("nvidia.com/gpu", "28", "single", &logs);
    let (container, _) = run_gpu_pod(&kubelet, "e2e-single-mig", "nvidia.com/gpu", 2, &logs);
    let visible = visible_devices(&container);
    assert!(
        visible.len() == 2 && visible.iter().all(|id| id.starts_with("MIG-")),
        "{container}"
    );
}

/// Deletes a test pod when dropped.
struct PodCleanup(&'static str);

impl Drop for PodCleanup {
    fn drop(&mut self) {
        clean_up(&["pod", self.0, "-n", "default", "--wait=false"]);
    }
}

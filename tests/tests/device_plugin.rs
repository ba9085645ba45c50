//! The device plugin (`gpu-device-plugin`) against the local cluster: one simulated node with 4 A100-40GB, the
//! plugin as a local process under the chart's ServiceAccount, the config in a ConfigMap chosen by the node's
//! `nvidia.com/device-plugin.config` label. What the plugin advertises is read back from GPUNode
//! `status.devicePlugin`, which it writes from the same snapshots it serves to the kubelet. One scenario, in the
//! order an admin meets it: the guides' time-slicing numbers, a relabel and a ConfigMap edit taking effect without
//! a restart, a bad label keeping the last good config (GPUNode lastError and a Warning Event), and a MIG change.

use std::time::{Duration, Instant};

use e2e::agents::{add_simulated_node, node_agent_bin};
use e2e::plugin::DevicePlugin;
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
    let argument = value.map_or_else(
        || format!("{CONFIG_LABEL}-"),
        |value| format!("{CONFIG_LABEL}={value}"),
    );
    kubectl(&["label", "node", NODE, &argument, "--overwrite"]);
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

/// Removes the test's node (with its GPUNode) and ConfigMap when dropped, also when an assertion fails.
struct Cleanup;

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
        let _ = run("kubectl", &["delete", "node", NODE, "--ignore-not-found"]);
    }
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn device_plugin_follows_labels_config_maps_and_mig() {
    chart_installed();
    let dir = std::env::temp_dir().join(format!("e2e-device-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("state folder");
    let state = dir.join(format!("{NODE}.json"));
    let _cleanup = Cleanup;
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

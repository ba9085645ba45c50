//! The operator against the local cluster (3 simulated GPU nodes on two OS versions), running as a local
//! process with the chart's ServiceAccount token, so that the chart's RBAC is what is tested. One scenario,
//! in the order a user meets it: install, ready, patch, pause on a node, crash and restart, a standby
//! replica taking over, a second policy, deletion.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use e2e::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

/// The operand DaemonSets that exist, by name.
fn daemonsets() -> BTreeSet<String> {
    daemonset_uids().into_keys().collect()
}

/// The operand DaemonSets that exist, name -> UID: a DaemonSet deleted and created again gets a new UID (and
/// its pods are replaced on every node).
fn daemonset_uids() -> BTreeMap<String, String> {
    operand_daemonsets()
        .iter()
        .filter_map(|d| {
            let name = d["metadata"]["name"].as_str()?;
            let uid = d["metadata"]["uid"].as_str()?;
            Some((name.to_string(), uid.to_string()))
        })
        .collect()
}

fn policy() -> Value {
    kubectl_json(&["get", "clusterpolicy", "cluster-policy"])
}

fn wait_for_state(state: &str) -> Value {
    wait_for_policy_state("cluster-policy", state, WAIT)
}

fn wait_for_daemonsets(expected: &[&str]) {
    let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    eventually(WAIT, || Ok((daemonsets() == expected).then_some(()))).unwrap_or_else(|error| {
        panic!(
            "DaemonSets {:?}, expected {expected:?}: {error:#}",
            daemonsets()
        )
    });
}

/// Patches the exporter's image version and waits until its DaemonSet runs that image.
fn set_exporter_version(version: &str) {
    patch_cluster_policy(&json!({"spec": {"dcgmExporter": {"version": version}}}));
    eventually(WAIT, || {
        let ds = kubectl_json(&["get", "daemonset", "nvidia-dcgm-exporter", "-n", NAMESPACE]);
        let image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        Ok(image.ends_with(&format!(":{version}")).then_some(()))
    })
    .unwrap_or_else(|e| panic!("the exporter DaemonSet never ran version {version}: {e:#}"));
}

/// Nodes where pods with this app label run.
fn pod_nodes(app: &str) -> BTreeSet<String> {
    let pods = kubectl_json(&["get", "pods", "-n", NAMESPACE, "-l", &format!("app={app}")]);
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| p["spec"]["nodeName"].as_str().map(String::from))
        .collect()
}

const BASE: [&str; 5] = [
    "gpu-feature-discovery",
    "nvidia-container-toolkit-daemonset",
    "nvidia-dcgm-exporter",
    "nvidia-device-plugin-daemonset",
    "nvidia-mig-manager",
];

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    BASE.iter()
        .chain(std::iter::once(&"nvidia-operator-validator"))
        .chain(extra)
        .copied()
        .collect()
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn operator_reconciles_the_cluster_policy() {
    chart_installed();
    let nodes = gpu_node_names();
    // `cargo xtask e2e` starts 3 GPU nodes on two OS versions; other tests may have added more.
    assert!(
        nodes.len() >= 3,
        "the e2e cluster has at least 3 GPU nodes: {nodes:?}"
    );
    let operator = Operator::start("e2e-operator");

    step(
        "helm install: every enabled operand's DaemonSet exists, kwok runs their pods, the policy is ready",
    );
    wait_for_daemonsets(&with(&[]));
    let ready = wait_for_state("ready");
    assert_eq!(ready["status"]["gpuNodes"], json!(nodes.len()));
    assert_eq!(ready["status"]["ready"], "6/6", "{:#}", ready["status"]);
    let table = kubectl(&["get", "clusterpolicy", "cluster-policy"]);
    assert!(table.contains("ready") && table.contains("6/6"), "{table}");
    assert_eq!(http_status(operator.port, "/healthz"), Some(200));
    let (code, metrics) = http_get(operator.port, "/metrics").expect("operator serves /metrics");
    assert_eq!(code, 200);
    for line in [
        format!("gpu_operator_gpu_nodes {}", nodes.len()),
        "gpu_operator_components_enabled 6".to_string(),
        "gpu_operator_components_ready 6".to_string(),
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in:\n{metrics}"
        );
    }
    let reconciles = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gpu_operator_reconcile_duration_seconds_count "))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_default();
    assert!(reconciles > 0, "reconciles are timed:\n{metrics}");
    for node in &nodes {
        let labels = kubectl_json(&["get", "node", node])["metadata"]["labels"].clone();
        assert_eq!(labels["nvidia.com/gpu.present"], "true", "{node}");
        assert_eq!(
            labels["nvidia.com/gpu.deploy.device-plugin"], "true",
            "{node}"
        );
        // NVIDIA's operator labels every GPU node for each of its operands, enabled or not (its
        // gpuStateLabels); a disabled one has no DaemonSet to select the node.
        assert_eq!(labels["nvidia.com/gpu.deploy.driver"], "true", "{node}");
    }
    let driver_daemonsets: Vec<String> =
        kubectl_json(&["get", "daemonsets", "-n", NAMESPACE])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ds| ds["metadata"]["name"].as_str().map(str::to_owned))
            .filter(|name| name.starts_with("nvidia-driver-daemonset"))
            .collect();
    assert!(
        driver_daemonsets.is_empty(),
        "driver disabled: no driver DaemonSet, found {driver_daemonsets:?}"
    );
    assert_eq!(
        pod_nodes("nvidia-device-plugin-daemonset").len(),
        nodes.len()
    );
    let events = events_about("cluster-policy");
    let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
    assert!(
        reasons.contains(&"Ready"),
        "the transition to ready is an Event on the ClusterPolicy: {reasons:?}"
    );

    step(
        "a device-plugin ConfigMap that is missing or invalid is named in the status, with the fix",
    );
    patch_cluster_policy(
        &json!({"spec": {"devicePlugin": {"config": {"name": "time-slicing-config-all", "default": "any"}}}}),
    );
    let plugin_message = || {
        let components = policy()["status"]["components"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let plugin = components
            .into_iter()
            .find(|c| c["name"] == "device-plugin")
            .unwrap_or_default();
        plugin["message"].as_str().unwrap_or_default().to_string()
    };
    eventually(WAIT, || {
        Ok(plugin_message()
            .contains("ConfigMap gpu-operator/time-slicing-config-all does not exist")
            .then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "missing ConfigMap not reported: {e:#}; message: {}",
            plugin_message()
        )
    });
    let config_map = |replicas: u32| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "time-slicing-config-all", "namespace": NAMESPACE},
               "data": {"any": format!("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: {replicas}\n")}})
        .to_string()
    };
    assert!(kubectl_apply(&config_map(1), &[]).success);
    eventually(WAIT, || {
        Ok(plugin_message()
            .contains("key any: sharing.timeSlicing.resources[0].replicas: 1 is too small")
            .then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "invalid config not reported: {e:#}; message: {}",
            plugin_message()
        )
    });
    assert!(kubectl_apply(&config_map(4), &[]).success);
    wait_for_state("ready");
    patch_cluster_policy(
        &json!({"spec": {"devicePlugin": {"config": {"name": "", "default": ""}}}}),
    );

    step("devicePlugin.enabled=false: its DaemonSet is deleted and the status follows");
    patch_cluster_policy(&json!({"spec": {"devicePlugin": {"enabled": false}}}));
    let mut expected = with(&[]);
    expected.retain(|name| *name != "nvidia-device-plugin-daemonset");
    wait_for_daemonsets(&expected);
    let status = wait_for_state("ready");
    assert_eq!(status["status"]["ready"], "5/5");
    let plugin = status["status"]["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "device-plugin")
        .cloned()
        .unwrap();
    assert_eq!(plugin["enabled"], json!(false));
    assert_eq!(plugin["state"], "disabled");

    step("a new image version changes that DaemonSet only");
    let before = kubectl_json(&["get", "daemonset", "gpu-feature-discovery", "-n", NAMESPACE])["metadata"]["generation"].clone();
    set_exporter_version("9.9.9");
    let after = kubectl_json(&["get", "daemonset", "gpu-feature-discovery", "-n", NAMESPACE])["metadata"]["generation"].clone();
    assert_eq!(before, after, "an unrelated DaemonSet was rewritten");

    step("a field the schema does not know is kept, and the status names it");
    patch_cluster_policy(&json!({"spec": {"devicePlugin": {"confg": {"name": "typo"}}}}));
    let condition = eventually(WAIT, || {
        let conditions = policy()["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(conditions
            .into_iter()
            .find(|c| c["type"] == "UnknownFields"))
    })
    .expect("UnknownFields condition");
    assert!(
        condition["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("spec.devicePlugin.confg is not defined"),
        "{condition}"
    );
    patch_cluster_policy(&json!({"spec": {"devicePlugin": {"confg": null}}}));

    step(
        "nvidia.com/gpu.deploy.dcgm-exporter=false on one node: the exporter leaves that node only",
    );
    let paused = &nodes[0];
    kubectl(&[
        "label",
        "node",
        paused,
        "nvidia.com/gpu.deploy.dcgm-exporter=false",
        "--overwrite",
    ]);
    eventually(WAIT, || {
        let on = pod_nodes("nvidia-dcgm-exporter");
        Ok((on.len() == nodes.len() - 1 && !on.contains(paused)).then_some(()))
    })
    .expect("exporter pods on every other node");
    wait_for_state("ready");
    let label = kubectl_json(&["get", "node", paused])["metadata"]["labels"]["nvidia.com/gpu.deploy.dcgm-exporter"].clone();
    assert_eq!(label, "false", "the operator kept the admin's value");

    step("two OS pools: enabling the driver yields one driver DaemonSet per pool");
    patch_cluster_policy(&json!({"spec": {"driver": {"enabled": true}}}));
    let mut pools = with(&[
        "nvidia-driver-daemonset-rhel9.4",
        "nvidia-driver-daemonset-ubuntu22.04",
    ]);
    pools.retain(|name| *name != "nvidia-device-plugin-daemonset");
    wait_for_daemonsets(&pools);
    let ubuntu = kubectl_json(&[
        "get",
        "daemonset",
        "nvidia-driver-daemonset-ubuntu22.04",
        "-n",
        NAMESPACE,
    ]);
    let image = ubuntu["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "nvidia-driver-ctr")
        .unwrap()["image"]
        .clone();
    assert!(image.as_str().unwrap().ends_with("-ubuntu22.04"), "{image}");
    assert_eq!(ubuntu["spec"]["updateStrategy"]["type"], "OnDelete");

    step(
        "the operator is killed mid-reconcile and restarted: it converges, nothing duplicated or orphaned",
    );
    let toolkit = "nvidia-container-toolkit-daemonset";
    let toolkit_uid = daemonset_uids()[toolkit].clone();
    patch_cluster_policy(
        &json!({"spec": {"devicePlugin": {"enabled": true}, "driver": {"enabled": false}}}),
    );
    operator.kill();
    let operator = Operator::start("e2e-operator");
    let expected = with(&[]);
    wait_for_daemonsets(&expected);
    wait_for_state("ready");
    assert_eq!(
        daemonset_uids()[toolkit],
        toolkit_uid,
        "the restarted operator deleted and re-created a DaemonSet it still renders"
    );
    let uid = policy()["metadata"]["uid"].clone();
    let all = kubectl_json(&[
        "get",
        "daemonsets,services",
        "-n",
        NAMESPACE,
        "-l",
        "app.kubernetes.io/managed-by=gpu-operator",
    ]);
    for object in all["items"].as_array().unwrap() {
        let owners = object["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            owners.iter().any(|o| o["uid"] == uid),
            "orphan: {}",
            object["metadata"]["name"]
        );
    }

    step(
        "a second replica is ready while the first leads, but does not reconcile; it takes over once the dead leader's lease expires",
    );
    assert_eq!(lease_holder(), "e2e-operator");
    let standby = Operator::launch("e2e-standby");
    // Readiness is health, not leadership: a rollout's new pod becomes Ready while the old one leads.
    standby.wait_ready(Duration::from_secs(60));
    // Longer than the 3 s retry period: the standby has asked for the lease at least once and been told to wait.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(lease_holder(), "e2e-operator");
    let (_, metrics) = http_get(standby.port, "/metrics").expect("the standby serves /metrics");
    assert!(
        metrics.contains("gpu_operator_reconcile_duration_seconds_count 0"),
        "a standby reconciles nothing:\n{metrics}"
    );
    let before_takeover = daemonset_uids();
    operator.kill();
    let killed = std::time::Instant::now();
    wait_leader("e2e-standby", Duration::from_secs(40));
    eprintln!(
        "the standby leads {:.1?} after the leader was killed (lease 15 s)",
        killed.elapsed()
    );
    set_exporter_version("9.9.10");
    wait_for_state("ready");
    assert_eq!(
        daemonset_uids(),
        before_takeover,
        "the new leader deleted and re-created DaemonSets instead of updating them"
    );

    step(
        "a leader stopped as in a rollout (SIGTERM) releases the lease: the next replica leads at once",
    );
    let successor = Operator::launch("e2e-successor");
    successor.wait_ready(Duration::from_secs(60));
    let stopped = std::time::Instant::now();
    standby.terminate();
    wait_leader("e2e-successor", Duration::from_secs(10));
    let handover = stopped.elapsed();
    eprintln!("the successor leads {handover:.1?} after the leader was stopped");
    assert!(
        handover < Duration::from_secs(10),
        "a released lease is taken without waiting for it to expire: {handover:?}"
    );
    set_exporter_version("9.9.11");
    wait_for_state("ready");
    let operator = successor;

    step("at rest the operator writes nothing to the API server for 60 s (audit log)");
    let user = format!("system:serviceaccount:{NAMESPACE}:gpu-operator");
    let (start, _) = audited_writes(&user, 0);
    std::thread::sleep(Duration::from_secs(60));
    let (_, writes) = audited_writes(&user, start);
    let lease_renewals: usize = writes
        .iter()
        .filter(|(k, _)| k.ends_with(" leases"))
        .map(|(_, n)| n)
        .sum();
    let other: Vec<_> = writes
        .iter()
        .filter(|(k, _)| !k.ends_with(" leases"))
        .collect();
    eprintln!("writes at rest over 60 s: {other:?}; leader-lease renewals: {lease_renewals}");
    assert!(other.is_empty(), "the operator wrote at rest: {other:?}");

    step("an operand someone else edited is reverted by the operator");
    let image_of_plugin = || {
        kubectl(&[
            "get",
            "daemonset",
            "nvidia-device-plugin-daemonset",
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])
    };
    let rendered_image = image_of_plugin();
    kubectl(&[
        "-n",
        NAMESPACE,
        "set",
        "image",
        "ds/nvidia-device-plugin-daemonset",
        "*=registry.example/someone-else:1",
    ]);
    let edited = std::time::Instant::now();
    eventually(Duration::from_secs(30), || {
        Ok((image_of_plugin() == rendered_image).then_some(()))
    })
    .expect("the operator re-applies the edited DaemonSet");
    eprintln!("the edit was reverted after {:.1?}", edited.elapsed());

    step("a second ClusterPolicy is ignored, with the reason");
    let spec = policy()["spec"].clone();
    let second = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "second-policy"}, "spec": spec});
    assert!(kubectl_apply(&second.to_string(), &[]).success);
    let ignored = eventually(WAIT, || {
        let policy = kubectl_json(&["get", "clusterpolicy", "second-policy"]);
        Ok((policy["status"]["state"] == "ignored").then_some(policy))
    })
    .expect("second policy ignored");
    let condition = &ignored["status"]["conditions"][0];
    assert_eq!(condition["reason"], "AnotherPolicyIsActive");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("cluster-policy is the active one"),
        "{condition}"
    );
    assert_eq!(
        daemonsets().len(),
        expected.len(),
        "the ignored policy changed nothing"
    );

    step(
        "deleting the active ClusterPolicy: the other one takes over, keeping the operands and labels",
    );
    kubectl(&[
        "delete",
        "clusterpolicy",
        "cluster-policy",
        "--wait=true",
        "--timeout=60s",
    ]);
    eventually(WAIT, || {
        let second = kubectl_json(&["get", "clusterpolicy", "second-policy"]);
        Ok((second["status"]["state"] == "ready").then_some(()))
    })
    .expect("second-policy became the active, ready one");
    wait_for_daemonsets(&expected);
    let present =
        kubectl_json(&["get", "node", &nodes[1]])["metadata"]["labels"]["nvidia.com/gpu.present"]
            .clone();
    assert_eq!(present, "true", "labels stay while a policy remains");

    step(
        "deleting the last ClusterPolicy: children garbage-collected, operator-written labels gone",
    );
    kubectl(&[
        "delete",
        "clusterpolicy",
        "second-policy",
        "--wait=true",
        "--timeout=60s",
    ]);
    eventually(WAIT, || Ok(daemonsets().is_empty().then_some(())))
        .expect("operand DaemonSets garbage-collected");
    for node in &nodes {
        let labels = kubectl_json(&["get", "node", node])["metadata"]["labels"].clone();
        assert!(
            labels["nvidia.com/gpu.present"].is_null(),
            "{node}: {labels}"
        );
        assert!(
            labels["nvidia.com/gpu.deploy.device-plugin"].is_null(),
            "{node}: {labels}"
        );
        assert!(
            labels["nvidia.com/gpu.container-runtime"].is_null(),
            "{node}: {labels}"
        );
    }
    let admin = kubectl_json(&["get", "node", paused])["metadata"]["labels"]["nvidia.com/gpu.deploy.dcgm-exporter"].clone();
    assert_eq!(admin, "false", "the admin's label stays");
    drop(operator);
}

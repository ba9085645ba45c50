//! Per-pool drivers through NVIDIA's NVIDIADriver resource, on kwok GPU nodes with the operator as a local process
//! under the chart's RBAC. With the ClusterPolicy's `driver.useNvidiaDriverCRD`, two objects written as a user
//! would (one per node pool, different versions, one with its own upgrade policy) each get their driver
//! DaemonSets, one per OS pool among their nodes; NVIDIA's own sample object, applied unchanged, reaches into both
//! pools and is refused with a status and an Event that name the node and both objects; NVIDIA's chart's default
//! object, applied unchanged, takes the GPU nodes no other object picks. A new version of one object upgrades its
//! nodes under its own policy and leaves the other pool's drivers alone.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::agents::add_simulated_node;
use e2e::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const OWNER_LABEL: &str = "nvidia.com/gpu-operator.driver.owner";
const STATE_LABEL: &str = "nvidia.com/gpu-driver-upgrade-state";
const POOL_LABEL: &str = "e2e-nvd/pool";
const OPERATOR: &str = "e2e-nvidiadriver-operator";

/// An OS other than the template node's: os-release ID and VERSION_ID.
type OtherOs = Option<(&'static str, &'static str)>;

/// The test's nodes: name, pool, and the OS of the second H100 node (another OS pool).
const NODES: [(&str, &str, OtherOs); 4] = [
    ("e2e-nvd-a-0", "a100", None),
    ("e2e-nvd-a-1", "a100", None),
    ("e2e-nvd-h-0", "h100", None),
    ("e2e-nvd-h-1", "h100", Some(("rhel", "9.4"))),
];

/// Hands the drivers back to the ClusterPolicy (off, as the chart installs it), deletes the objects and waits until
/// the owner labels are gone, then stops the operator and deletes the test's nodes.
struct Cleanup {
    operator: Option<Operator>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run(
            "kubectl",
            &["delete", "nvidiadrivers", "--all", "--wait=true"],
        );
        undo_policy_patch(
            &json!({"spec": {"driver": {"enabled": false, "useNvidiaDriverCRD": false}}}),
            OWNER_LABEL,
        );
        drop(self.operator.take());
        for (node, _, _) in NODES {
            let _ = run(
                "kubectl",
                &["delete", "gpunode", node, "--ignore-not-found"],
            );
            let _ = run("kubectl", &["delete", "node", node, "--ignore-not-found"]);
        }
    }
}

fn apply(manifest: &str) {
    let applied = kubectl_apply(manifest, &[]);
    assert!(applied.success, "{}{}", applied.stdout, applied.stderr);
}

/// The driver DaemonSets of each NVIDIADriver object (by its owner label), names sorted.
fn daemonsets_by_object() -> BTreeMap<String, Vec<Value>> {
    let mut by_object: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for daemonset in operand_daemonsets() {
        if let Some(object) = daemonset["metadata"]["labels"][OWNER_LABEL].as_str() {
            by_object
                .entry(object.to_owned())
                .or_default()
                .push(daemonset.clone());
        }
    }
    for daemonsets in by_object.values_mut() {
        daemonsets.sort_by_key(name);
    }
    by_object
}

fn name(object: &Value) -> String {
    object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn image(daemonset: &Value) -> String {
    daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Each node's owner label, for the nodes that have one.
fn owners() -> BTreeMap<String, String> {
    kubectl_json(&["get", "nodes", "-l", OWNER_LABEL])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|node| {
            (
                name(node),
                node["metadata"]["labels"][OWNER_LABEL]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

fn nvidia_driver(name: &str) -> Value {
    kubectl_json(&["get", "nvidiadriver", name])
}

fn wait_state(name: &str, state: &str) -> Value {
    let mut last = Value::Null;
    eventually(WAIT, || {
        last = nvidia_driver(name);
        Ok((last["status"]["state"] == state).then(|| last.clone()))
    })
    .unwrap_or_else(|e| panic!("NVIDIADriver {name} never became {state}: {e:#}\n{last:#}"))
}

/// The UIDs of the driver pods on `nodes`.
fn driver_pods(nodes: &[&str]) -> BTreeMap<String, String> {
    kubectl_json(&[
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        "app.kubernetes.io/component=driver",
    ])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|pod| {
            let node = pod["spec"]["nodeName"].as_str()?;
            nodes.contains(&node).then(|| {
                (
                    node.to_owned(),
                    pod["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
        })
        .collect()
}

/// Every field of the file is stored as written: nothing of NVIDIA's object is dropped by our schema.
fn stored_as_written(file: &str, name: &str) {
    let written: Value = serde_saphyr::from_str(&fixture(file)).expect("NVIDIA's YAML");
    let missing = missing_fields(&written["spec"], &nvidia_driver(name)["spec"], "spec");
    assert!(missing.is_empty(), "{file}: {missing:#?}");
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn nvidia_drivers_run_one_driver_per_pool_and_refuse_a_conflicting_object() {
    chart_installed();
    let mut cleanup = Cleanup { operator: None };

    step("four GPU nodes in two pools, one of them on another OS; no label of ours on them");
    for (node, pool, os) in NODES {
        let mut labels = vec![(POOL_LABEL, pool)];
        if let Some((id, version)) = os {
            labels.push(("feature.node.kubernetes.io/system-os_release.ID", id));
            labels.push((
                "feature.node.kubernetes.io/system-os_release.VERSION_ID",
                version,
            ));
        }
        add_simulated_node("gpu-a100-0", node, "a100-40gb:1", &labels);
    }
    cleanup.operator = Some(Operator::start(OPERATOR));

    step("driver.useNvidiaDriverCRD on, and one NVIDIADriver per pool");
    patch_cluster_policy(
        &json!({"spec": {"driver": {"enabled": true, "useNvidiaDriverCRD": true}}}),
    );
    apply(
        r#"
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata:
  name: a100
spec:
  repository: nvcr.io/nvidia
  image: driver
  version: "570.172.08"
  nodeSelector:
    e2e-nvd/pool: a100
---
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata:
  name: h100
spec:
  repository: nvcr.io/nvidia
  image: driver
  version: "580.95.05"
  nodeSelector:
    e2e-nvd/pool: h100
  upgradePolicy:
    autoUpgrade: true
    maxParallelUpgrades: 2
    maxUnavailable: "100%"
"#,
    );
    let mut last = BTreeMap::new();
    eventually(WAIT, || {
        last = daemonsets_by_object();
        let names = |object: &str| -> Vec<String> {
            last.get(object).into_iter().flatten().map(name).collect()
        };
        Ok((names("a100") == ["nvidia-gpu-driver-a100-ubuntu22.04"]
            && names("h100")
                == [
                    "nvidia-gpu-driver-h100-rhel9.4",
                    "nvidia-gpu-driver-h100-ubuntu22.04",
                ])
        .then_some(()))
    })
    .unwrap_or_else(|e| panic!("one DaemonSet per object and OS pool: {e:#}\n{last:#?}"));
    assert_eq!(
        image(&last["a100"][0]),
        "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04"
    );
    assert_eq!(
        image(&last["h100"][0]),
        "nvcr.io/nvidia/driver:580.95.05-rhel9.4"
    );
    assert!(
        operand_daemonsets()
            .iter()
            .all(|d| !name(d).starts_with("nvidia-driver-daemonset")),
        "the ClusterPolicy's own driver is not rendered"
    );
    let pools: BTreeMap<String, String> = NODES
        .iter()
        .map(|(node, pool, _)| ((*node).to_owned(), (*pool).to_owned()))
        .collect();
    eventually(WAIT, || {
        let owned = owners();
        Ok(pools
            .iter()
            .all(|(node, pool)| owned.get(node) == Some(pool))
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("each node names its object: {e:#}\n{:#?}", owners()));
    for object in ["a100", "h100"] {
        let ready = wait_state(object, "ready");
        assert_eq!(ready["status"]["namespace"], NAMESPACE);
    }
    let listed = kubectl(&["get", "nvd"]);
    assert!(
        listed.contains("a100") && listed.contains("ready"),
        "{listed}"
    );

    step("NVIDIA's sample NVIDIADriver, unchanged: it picks every GPU node, and is refused");
    apply(&fixture("nvidia/nvidiadriver-sample.yaml"));
    stored_as_written("nvidia/nvidiadriver-sample.yaml", "nvidiadriver-sample");
    let refused = wait_state("nvidiadriver-sample", "notReady");
    let ready = refused["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["reason"], "ConflictingNodeSelector", "{refused:#}");
    let message = ready["message"].as_str().unwrap_or_default();
    let (node, holder) = NODES
        .iter()
        .find(|(node, _, _)| message.contains(&format!("node {node} ")))
        .map(|(node, pool, _)| (*node, *pool))
        .unwrap_or_else(|| panic!("the status names one of the pools' nodes: {message}"));
    assert!(
        message.contains("NVIDIADriver nvidiadriver-sample")
            && message.contains(&format!("NVIDIADriver {holder}")),
        "both objects named: {message}"
    );
    eprintln!("refused: {message}");
    let event = eventually(WAIT, || {
        Ok(events_about("nvidiadriver-sample")
            .into_iter()
            .find(|e| e["reason"] == "ConflictingNodeSelector"))
    })
    .expect("a Warning Event on the refused object");
    assert_eq!(event["type"], "Warning");
    assert!(
        event["note"]
            .as_str()
            .or(event["message"].as_str())
            .is_some_and(|note| note.contains(node)),
        "{event:#}"
    );
    assert!(
        !daemonsets_by_object().contains_key("nvidiadriver-sample"),
        "a refused object gets no driver"
    );
    assert_eq!(
        owners().get(node).map(String::as_str),
        Some(holder),
        "the node keeps its driver"
    );
    kubectl(&["delete", "nvidiadriver", "nvidiadriver-sample"]);

    step(
        "NVIDIA's chart's default NVIDIADriver, unchanged: it takes the GPU nodes no other object picks",
    );
    apply(&fixture("nvidia/nvidiadriver-chart-default.yaml"));
    stored_as_written("nvidia/nvidiadriver-chart-default.yaml", "default");
    let others: Vec<String> = gpu_node_names()
        .into_iter()
        .filter(|node| !pools.contains_key(node))
        .collect();
    assert!(!others.is_empty(), "the cluster has GPU nodes of its own");
    eventually(WAIT, || {
        let owned = owners();
        Ok((others
            .iter()
            .all(|node| owned.get(node).map(String::as_str) == Some("default"))
            && pools
                .iter()
                .all(|(node, pool)| owned.get(node) == Some(pool)))
        .then_some(()))
    })
    .unwrap_or_else(|e| panic!("the default drives the rest: {e:#}\n{:#?}", owners()));
    let defaults = eventually(WAIT, || Ok(daemonsets_by_object().remove("default")))
        .expect("the default object's DaemonSets");
    for daemonset in &defaults {
        assert!(
            image(daemonset).starts_with("nvcr.io/nvidia/driver:595.91.07-"),
            "NVIDIA's chart's version: {}",
            image(daemonset)
        );
        assert_eq!(
            daemonset["spec"]["template"]["spec"]["nodeSelector"][OWNER_LABEL],
            "default"
        );
    }
    wait_state("default", "ready");

    step("a new version of h100: its nodes upgrade under its own policy, the A100 drivers stay");
    let a100_nodes = ["e2e-nvd-a-0", "e2e-nvd-a-1"];
    let h100_nodes = ["e2e-nvd-h-0", "e2e-nvd-h-1"];
    let a100_pods = eventually(WAIT, || {
        let pods = driver_pods(&a100_nodes);
        Ok((pods.len() == 2).then_some(pods))
    })
    .expect("a driver pod on each A100 node");
    let h100_pods = eventually(WAIT, || {
        let pods = driver_pods(&h100_nodes);
        Ok((pods.len() == 2).then_some(pods))
    })
    .expect("a driver pod on each H100 node");
    let done = |nodes: &[&str]| {
        let list = kubectl_json(&["get", "nodes"]);
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| nodes.contains(&name(n).as_str()))
            .all(|n| {
                n["metadata"]["labels"][STATE_LABEL] == "upgrade-done"
                    && n["spec"]["unschedulable"] != json!(true)
            })
    };
    eventually(WAIT, || Ok(done(&h100_nodes).then_some(())))
        .expect("h100's nodes start at upgrade-done");
    kubectl(&[
        "patch",
        "nvidiadriver",
        "h100",
        "--type",
        "merge",
        "-p",
        r#"{"spec": {"version": "580.105.08"}}"#,
    ]);
    eventually(WAIT, || {
        let pods = driver_pods(&h100_nodes);
        Ok((pods.len() == 2
            && pods
                .iter()
                .all(|(node, uid)| h100_pods.get(node) != Some(uid))
            && done(&h100_nodes))
        .then_some(()))
    })
    .expect("both H100 nodes upgraded to new driver pods, back to upgrade-done and uncordoned");
    assert!(
        daemonsets_by_object()["h100"]
            .iter()
            .all(|d| image(d).starts_with("nvcr.io/nvidia/driver:580.105.08-")),
        "the new version in both OS pools"
    );
    assert_eq!(
        driver_pods(&a100_nodes),
        a100_pods,
        "the A100 drivers were not touched"
    );
}

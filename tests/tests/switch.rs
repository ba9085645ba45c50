//! Switching a running cluster from NVIDIA's GPU Operator to this one and back, with the commands of
//! docs/migrate-from-nvidia.md: NVIDIA's chart and operator (the release the benchmark measures, built from its
//! Go module) run on the kwok nodes with the driver, a time-slicing ConfigMap and MIG and device-plugin config
//! labels; after the switch this operator's operands run, the ClusterPolicy and the driver DaemonSet are the same
//! objects (same uid) and the driver pods were never replaced, and the GPU nodes' labels and allocatable are
//! what they were; the rollback gives all of it back to NVIDIA's operator in the same way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::{
    GUIDE_VALUES, NAMESPACE, Operator, chart_dir, eventually, gpu_node_names, kubectl,
    kubectl_apply, kubectl_json, remove_release, run, step, try_install_chart,
};
use serde_json::Value;

const POLICY: &str = "cluster-policy";
const DRIVER: &str = "nvidia-driver-daemonset";
/// NVIDIA's time-slicing guide's ConfigMap (one key, `any`), as the guide creates it.
const TIME_SLICING: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: time-slicing-config-all
  namespace: gpu-operator
data:
  any: |-
    version: v1
    flags:
      migStrategy: none
    sharing:
      timeSlicing:
        resources:
        - name: nvidia.com/gpu
          replicas: 4
"#;

/// The values both charts get, as a user keeps one values file across the switch: NVIDIA's guide for a cluster
/// without NFD, with the time-slicing ConfigMap as the device plugin's config, and no automatic driver upgrades
/// (as the guide advises for the switch), so that no upgrade controller replaces a driver pod on its own.
const VALUES: [&str; 8] = [
    "--set",
    "nfd.enabled=false",
    "--set",
    "driver.upgradePolicy.autoUpgrade=false",
    "--set",
    "devicePlugin.config.name=time-slicing-config-all",
    "--set",
    "devicePlugin.config.default=any",
];

/// `helm uninstall` of the release without its hooks (both charts' pre-delete hooks delete the ClusterPolicy).
const UNINSTALL_WITHOUT_HOOKS: [&str; 6] = [
    "uninstall",
    "gpu-operator",
    "-n",
    NAMESPACE,
    "--no-hooks",
    "--wait",
];
/// Stops the release's operator Deployment.
const SCALE_OPERATOR_TO_ZERO: [&str; 6] = [
    "scale",
    "deployment",
    "gpu-operator",
    "-n",
    NAMESPACE,
    "--replicas=0",
];
/// Removes the ClusterPolicy's finalizers, so that nothing waits for a stopped operator.
const REMOVE_POLICY_FINALIZERS: [&str; 7] = [
    "patch",
    "clusterpolicy",
    POLICY,
    "--type",
    "json",
    "-p",
    r#"[{"op": "remove", "path": "/metadata/finalizers"}]"#,
];

/// NVIDIA's build: its binary, manifests and chart (built into the cache by `cargo xtask e2e` beforehand).
fn nvidia_build() -> PathBuf {
    harness::cluster::nvidia_gpu_operator()
        .unwrap_or_else(|error| panic!("NVIDIA's gpu-operator build: {error:#}"))
}

fn nvidia_chart() -> String {
    nvidia_build().join("gpu-operator").display().to_string()
}

/// NVIDIA's operator as a local process with its chart's ServiceAccount, started by the harness as the benchmark
/// starts it (kwok nodes run no containers, so the chart's Deployment pod runs nothing). Returns its log.
fn start_nvidia_operator() -> PathBuf {
    let cluster = harness::cluster::running().expect("the local cluster runs");
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    harness::operators::nvidia::start(&cluster, &nvidia_build(), metrics)
        .unwrap_or_else(|error| panic!("starting NVIDIA's gpu-operator: {error:#}"))
        .log
}

fn stop_nvidia_operator() -> anyhow::Result<()> {
    harness::operators::nvidia::stop(&harness::cluster::running()?)
}

/// The DaemonSets, the driver pods with the template revision each runs, and the driver's revisions, for a
/// failure's message.
fn daemonsets_and_driver_pods() -> String {
    let of_driver = "app=nvidia-driver-daemonset";
    format!(
        "DaemonSets:\n{}\ndriver pods:\n{}\ndriver revisions:\n{}",
        kubectl(&["get", "daemonsets", "-n", NAMESPACE, "-o", "wide"]),
        kubectl(&[
            "get",
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            of_driver,
            "-o",
            "custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,UID:.metadata.uid,\
             REVISION:.metadata.labels.controller-revision-hash,PHASE:.status.phase",
        ]),
        kubectl(&[
            "get",
            "controllerrevisions",
            "-n",
            NAMESPACE,
            "-l",
            of_driver
        ]),
    )
}

/// Where two JSON values differ: `path: before -> after`, one line per leaf.
fn json_differences(path: &str, before: &Value, after: &Value) -> Vec<String> {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => a
            .keys()
            .chain(b.keys().filter(|key| !a.contains_key(*key)))
            .flat_map(|key| {
                json_differences(
                    &format!("{path}.{key}"),
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                )
            })
            .collect(),
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .flat_map(|(i, (a, b))| json_differences(&format!("{path}[{i}]"), a, b))
            .collect(),
        _ if before == after => Vec::new(),
        _ => vec![format!("{path}: {before} -> {after}")],
    }
}

/// The end of NVIDIA's operator's log.
fn nvidia_operator_log_tail(log: &Path) -> String {
    let log =
        std::fs::read_to_string(log).unwrap_or_else(|error| format!("{}: {error}", log.display()));
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

/// `helm install gpu-operator <chart> -n gpu-operator <VALUES> --timeout 180s`, with `extra` flags.
fn helm_install(chart: &str, extra: &[&str]) {
    let mut args = vec![
        "install",
        "gpu-operator",
        chart,
        "-n",
        NAMESPACE,
        "--timeout",
        "180s",
    ];
    args.extend(VALUES);
    args.extend(extra);
    e2e::ok("helm", &args);
}

/// What a GPU node advertises: its labels and its allocatable.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Advertised {
    labels: BTreeMap<String, String>,
    allocatable: BTreeMap<String, String>,
}

fn advertised() -> BTreeMap<String, Advertised> {
    gpu_node_names()
        .into_iter()
        .map(|name| {
            let node = kubectl_json(&["get", "node", &name]);
            let map = |value: &Value| -> BTreeMap<String, String> {
                value
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            };
            let advertised = Advertised {
                labels: map(&node["metadata"]["labels"]),
                allocatable: map(&node["status"]["allocatable"]),
            };
            (name, advertised)
        })
        .collect()
}

/// The one node label this operator adds that NVIDIA's does not write: the container runtime its per-runtime
/// toolkit DaemonSets select nodes by. NVIDIA's operator leaves it in place after a rollback.
const OWN_LABELS: [&str; 1] = ["nvidia.com/gpu.container-runtime"];

/// What changed between two views of the nodes, one line each: every label removed or changed, every label added
/// but this operator's own ([`OWN_LABELS`]), and every change of allocatable. Empty when the nodes advertise what
/// they did.
fn differences(
    before: &BTreeMap<String, Advertised>,
    after: &BTreeMap<String, Advertised>,
) -> Vec<String> {
    let mut lines = Vec::new();
    for (node, was) in before {
        let Some(now) = after.get(node) else {
            lines.push(format!("{node}: gone"));
            continue;
        };
        for (what, old, new) in [
            ("label", &was.labels, &now.labels),
            ("allocatable", &was.allocatable, &now.allocatable),
        ] {
            let keys: std::collections::BTreeSet<_> = old.keys().chain(new.keys()).collect();
            for key in keys {
                let added_own =
                    what == "label" && !old.contains_key(key) && OWN_LABELS.contains(&key.as_str());
                if old.get(key) != new.get(key) && !added_own {
                    lines.push(format!(
                        "{node}: {what} {key}: {:?} -> {:?}",
                        old.get(key),
                        new.get(key)
                    ));
                }
            }
        }
    }
    lines
}

/// NFD's labels of a node's OS, which pick the driver image.
const OS_LABELS: [&str; 2] = [
    "feature.node.kubernetes.io/system-os_release.ID",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID",
];

/// Gives every GPU node the OS of the first (for this test; [`Restore`] puts the labels back). A ClusterPolicy's
/// driver under NVIDIA's operator is one image for the whole cluster, tagged with the OS of whichever GPU node its
/// cache lists first, which changes from one reconcile to the next on a cluster of several OSes (each change a new
/// template, and its OnDelete pods never ready); a cluster that ran it has one OS. NVIDIA's NVIDIADriver objects
/// are its answer for several, and `nvidia_driver.rs` tests those.
fn one_os_for_nvidias_driver(nodes: &[String]) {
    let os_of = |node: &str| -> Vec<String> {
        let labels = &kubectl_json(&["get", "node", node])["metadata"]["labels"];
        OS_LABELS
            .iter()
            .map(|key| labels[*key].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let first = os_of(&nodes[0]);
    for node in &nodes[1..] {
        if os_of(node) != first {
            let mut args = vec!["label", "node", node.as_str(), "--overwrite"];
            let labels: Vec<String> = OS_LABELS
                .iter()
                .zip(&first)
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            args.extend(labels.iter().map(String::as_str));
            kubectl(&args);
        }
    }
}

/// Whether this operator's server-side apply wrote the object (`kubectl get --show-managed-fields`).
fn applied_by_this_operator(object: &Value) -> bool {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|entry| entry["manager"] == "gpu-operator" && entry["operation"] == "Apply")
}

fn uid(kind: &str, name: &str) -> String {
    let mut args = vec!["get", kind, name, "-o", "jsonpath={.metadata.uid}"];
    if kind != "clusterpolicy" {
        args.extend(["-n", NAMESPACE]);
    }
    kubectl(&args)
}

/// Every DaemonSet in the namespace by name, with its uid.
fn daemonset_uids() -> BTreeMap<String, String> {
    kubectl_json(&["get", "daemonsets", "-n", NAMESPACE])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|ds| {
            (
                ds["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                ds["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// The pods of the driver DaemonSet with uid `daemonset_uid` by node, with their uids.
fn driver_pods(daemonset_uid: &str) -> BTreeMap<String, String> {
    kubectl_json(&[
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        "app=nvidia-driver-daemonset",
    ])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|pod| {
            pod["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|owner| owner["uid"] == daemonset_uid)
                && pod["metadata"]["deletionTimestamp"].is_null()
        })
        .map(|pod| {
            (
                pod["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                pod["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// The GPU nodes of the OS pool the driver image `image` was built for (`...:<version>-<os><version>`).
fn nodes_of_pool(image: &str) -> Vec<String> {
    gpu_node_names()
        .into_iter()
        .filter(|name| {
            let labels = &kubectl_json(&["get", "node", name])["metadata"]["labels"];
            let pool = format!(
                "-{}{}",
                labels["feature.node.kubernetes.io/system-os_release.ID"]
                    .as_str()
                    .unwrap_or_default(),
                labels["feature.node.kubernetes.io/system-os_release.VERSION_ID"]
                    .as_str()
                    .unwrap_or_default()
            );
            image.ends_with(&pool)
        })
        .collect()
}

fn driver_image() -> String {
    kubectl(&[
        "get",
        "daemonset",
        DRIVER,
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.spec.template.spec.containers[?(@.name==\"nvidia-driver-ctr\")].image}",
    ])
}

/// NVIDIA's ClusterPolicy status: `ready`, which its operator writes without an observed generation.
fn wait_for_nvidia_ready(timeout: Duration) {
    eventually(timeout, || {
        let state = kubectl(&[
            "get",
            "clusterpolicy",
            POLICY,
            "-o",
            "jsonpath={.status.state}",
        ]);
        Ok((state == "ready").then_some(()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "NVIDIA's ClusterPolicy never became ready: {error:#}\n{:#}",
            kubectl_json(&["get", "clusterpolicy", POLICY])["status"]
        )
    });
}

/// This operator's status once it has taken over: every component ready but the driver, whose pods of NVIDIA's
/// template stay until each is deleted (OnDelete), which its status says (`outdated` nodes available, none updated),
/// as NVIDIA's operator says of its own outdated driver pods.
fn wait_for_ours_taken_over(outdated: usize, timeout: Duration) {
    let waiting = format!("{DRIVER}: {outdated} of {outdated} nodes available, 0 updated");
    let get = || kubectl_json(&["get", "clusterpolicy", POLICY]);
    eventually(timeout, || {
        let policy = get();
        let status = &policy["status"];
        if status["observedGeneration"] != policy["metadata"]["generation"] {
            return Ok(None);
        }
        let components = status["components"].as_array().cloned().unwrap_or_default();
        let others_ready = components
            .iter()
            .filter(|c| c["name"] != "driver" && c["enabled"] == true)
            .all(|c| c["state"] == "ready");
        let driver_waits = components.iter().any(|c| {
            c["name"] == "driver"
                && c["message"]
                    .as_str()
                    .is_some_and(|message| message.contains(&waiting))
        });
        Ok((others_ready && driver_waits).then_some(()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "this operator never took over (every component ready, the driver waiting on {outdated} old pods): \
             {error:#}\n{:#}\n{}",
            get()["status"],
            daemonsets_and_driver_pods(),
        )
    });
}

/// Restores what the suites after this one expect, also when the test fails: NVIDIA's operator and release
/// gone with the ClusterPolicy and every operand, the nodes' labels as before, and the guide's install of this
/// chart back.
struct Restore {
    labels: BTreeMap<String, Advertised>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        drop(stop_nvidia_operator());
        drop(run(
            "kubectl",
            &["delete", "clusterpolicy", "--all", "--wait=false"],
        ));
        drop(run("kubectl", &REMOVE_POLICY_FINALIZERS));
        drop(run("helm", &UNINSTALL_WITHOUT_HOOKS));
        drop(run(
            "kubectl",
            &[
                "delete",
                "daemonsets",
                "--all",
                "-n",
                NAMESPACE,
                "--wait=true",
                "--timeout=60s",
            ],
        ));
        drop(run(
            "kubectl",
            &[
                "delete",
                "crd",
                "nvidiadrivers.nvidia.com",
                "--ignore-not-found",
            ],
        ));
        drop(run(
            "kubectl",
            &[
                "delete",
                "configmap",
                "time-slicing-config-all",
                "-n",
                NAMESPACE,
                "--ignore-not-found",
            ],
        ));
        let now = advertised();
        for (node, was) in &self.labels {
            let Some(current) = now.get(node) else {
                continue;
            };
            let mut args = vec![
                "label".to_owned(),
                "node".into(),
                node.clone(),
                "--overwrite".into(),
            ];
            for key in current.labels.keys() {
                if !was.labels.contains_key(key) {
                    args.push(format!("{key}-"));
                }
            }
            for (key, value) in &was.labels {
                if current.labels.get(key) != Some(value) {
                    args.push(format!("{key}={value}"));
                }
            }
            if args.len() > 4 {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                drop(run("kubectl", &args));
            }
        }
        let restored = try_install_chart(&GUIDE_VALUES);
        if !restored.success {
            eprintln!("restoring the guide's install failed: {}", restored.stderr);
        }
    }
}

#[test]
#[ignore = "needs the local cluster: cargo xtask e2e"]
fn nvidia_to_ours_and_back_keeps_the_driver_and_what_nodes_advertise() {
    step(
        "a cluster run by NVIDIA's operator: its chart, a time-slicing ConfigMap, MIG and device-plugin labels",
    );
    e2e::chart_installed();
    let restore = Restore {
        labels: advertised(),
    };
    remove_release("switch");
    // A cluster that never ran this chart: NVIDIA's chart installs its own CRDs, NVIDIADriver's among them (Helm
    // would refuse to apply them over this operator's, whose fields another manager owns).
    kubectl(&[
        "delete",
        "crd",
        "clusterpolicies.nvidia.com",
        "gpunodes.nvidia.com",
        "nvidiadrivers.nvidia.com",
        "--ignore-not-found",
    ]);
    let nodes = gpu_node_names();
    assert!(
        nodes.len() >= 2,
        "the switch needs two GPU nodes: {nodes:?}"
    );
    one_os_for_nvidias_driver(&nodes);
    kubectl(&[
        "label",
        "node",
        &nodes[0],
        "nvidia.com/mig.config=all-1g.5gb",
        "--overwrite",
    ]);
    kubectl(&[
        "label",
        "node",
        &nodes[1],
        "nvidia.com/device-plugin.config=any",
        "--overwrite",
    ]);
    let applied = kubectl_apply(TIME_SLICING, &[]);
    assert!(applied.success, "{}", applied.stderr);
    let nvidia = nvidia_chart();
    helm_install(&nvidia, &["--wait"]);
    start_nvidia_operator();
    wait_for_nvidia_ready(Duration::from_secs(240));
    let policy_uid = uid("clusterpolicy", POLICY);
    let nvidia_daemonsets = daemonset_uids();
    let driver_uid = nvidia_daemonsets
        .get(DRIVER)
        .cloned()
        .unwrap_or_else(|| panic!("NVIDIA's operator made no {DRIVER}: {nvidia_daemonsets:?}"));
    let image = driver_image();
    let nvidias_driver_template =
        kubectl_json(&["get", "daemonset", DRIVER, "-n", NAMESPACE])["spec"]["template"].clone();
    let pool_nodes = nodes_of_pool(&image);
    assert!(!pool_nodes.is_empty(), "no GPU node of the pool of {image}");
    let nvidias_driver_pods = eventually(Duration::from_secs(60), || {
        let pods = driver_pods(&driver_uid);
        Ok(pool_nodes
            .iter()
            .all(|node| pods.contains_key(node))
            .then_some(pods))
    })
    .expect("NVIDIA's driver pods run on the pool's nodes");
    // Settled: NVIDIA's operator has written its state labels on every GPU node (the labels below are what the
    // nodes advertise), the validator's among them.
    let before = eventually(Duration::from_secs(60), || {
        let now = advertised();
        Ok(now
            .values()
            .all(|node| {
                node.labels.get("nvidia.com/gpu.deploy.operator-validator")
                    == Some(&"true".to_owned())
            })
            .then_some(now))
    })
    .expect("NVIDIA's operator labels every GPU node");
    eprintln!(
        "NVIDIA's DaemonSets: {:?}; driver {image} on {pool_nodes:?}",
        nvidia_daemonsets.keys().collect::<Vec<_>>()
    );

    step("the switch, as docs/migrate-from-nvidia.md writes it");
    let started = Instant::now();
    // Helm keeps what the release's own manifest marks `keep`; NVIDIA's chart marks its ClusterPolicy so with
    // operator.cleanupCRD (whose pre-delete hook `--no-hooks` skips below).
    let mut keep = vec![
        "upgrade",
        "gpu-operator",
        &nvidia,
        "-n",
        NAMESPACE,
        "--reuse-values",
        "--no-hooks",
        "--set",
        "operator.cleanupCRD=true",
    ];
    keep.extend(["--wait", "--timeout", "180s"]);
    e2e::ok("helm", &keep);
    kubectl(&SCALE_OPERATOR_TO_ZERO);
    stop_nvidia_operator().expect("NVIDIA's operator stops");
    e2e::ok("helm", &UNINSTALL_WITHOUT_HOOKS);
    kubectl(&[
        "delete",
        "-n",
        NAMESPACE,
        "serviceaccount",
        "nvidia-operator-validator",
        "nvidia-dcgm",
        "nvidia-dcgm-exporter",
        "nvidia-mig-manager",
        "nvidia-node-status-exporter",
        "--ignore-not-found",
    ]);
    kubectl(&[
        "delete",
        "clusterrole,clusterrolebinding",
        "nvidia-mig-manager",
        "nvidia-node-status-exporter",
        "--ignore-not-found",
    ]);
    kubectl(&[
        "delete",
        "-n",
        NAMESPACE,
        "configmap",
        "default-mig-parted-config",
        "--ignore-not-found",
    ]);
    helm_install(&chart_dir(), &["--wait"]);
    let ours = Operator::start("switch");
    wait_for_ours_taken_over(pool_nodes.len(), Duration::from_secs(180));
    let switched_in = started.elapsed();
    eprintln!("switched to this operator in {switched_in:?}");

    step("afterwards: our operands, the same ClusterPolicy, driver DaemonSet and driver pods");
    assert_eq!(
        uid("clusterpolicy", POLICY),
        policy_uid,
        "the ClusterPolicy was kept"
    );
    let after = daemonset_uids();
    assert_eq!(
        after.get(DRIVER),
        Some(&driver_uid),
        "the driver DaemonSet was taken over in place: {after:?}"
    );
    for (name, was) in &nvidia_daemonsets {
        if let Some(now) = after.get(name) {
            assert_eq!(now, was, "{name} was taken over in place, not recreated");
        }
    }
    let driver = kubectl_json(&[
        "get",
        "daemonset",
        DRIVER,
        "-n",
        NAMESPACE,
        "--show-managed-fields",
    ]);
    // NVIDIA's chart labels NVIDIA's DaemonSets managed-by gpu-operator too: this operator's apply is what tells.
    assert!(
        applied_by_this_operator(&driver),
        "this operator's apply wrote the driver DaemonSet: {}",
        driver["metadata"]["managedFields"]
    );
    // NVIDIA's driver DaemonSet says `nvidia-driver`.
    assert_eq!(
        driver["metadata"]["labels"]["app.kubernetes.io/component"], "driver",
        "{}",
        driver["metadata"]["labels"]
    );
    assert_ne!(
        driver["spec"]["template"], nvidias_driver_template,
        "this operator's pod template"
    );
    assert_eq!(driver["spec"]["updateStrategy"]["type"], "OnDelete");
    assert_eq!(
        driver["spec"]["selector"],
        serde_json::json!({"matchLabels": {"app": DRIVER}})
    );
    assert_eq!(
        driver_pods(&driver_uid),
        nvidias_driver_pods,
        "no driver pod was replaced"
    );
    // NVIDIA's chart labels NVIDIA's DaemonSets managed-by gpu-operator too: this operator's are those its apply
    // wrote.
    let daemonsets = kubectl_json(&[
        "get",
        "daemonsets",
        "-n",
        NAMESPACE,
        "--show-managed-fields",
    ]);
    let our_daemonsets: Vec<String> = daemonsets["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|ds| applied_by_this_operator(ds))
        .filter_map(|ds| ds["metadata"]["name"].as_str().map(String::from))
        .collect();
    for operand in [
        DRIVER,
        "nvidia-container-toolkit-daemonset",
        "nvidia-operator-validator",
        "nvidia-device-plugin-daemonset",
        "gpu-feature-discovery",
        "nvidia-dcgm-exporter",
        "nvidia-mig-manager",
    ] {
        assert!(
            our_daemonsets.contains(&operand.to_owned()),
            "{operand} is this operator's: {our_daemonsets:?}"
        );
    }
    let left: Vec<&String> = nvidia_daemonsets
        .keys()
        .filter(|name| !our_daemonsets.contains(name))
        .collect();
    let gone: Vec<&&String> = left
        .iter()
        .filter(|name| !after.contains_key(**name))
        .collect();
    eprintln!(
        "NVIDIA's DaemonSets of parts this operator does not run: {left:?}; of them gone: {gone:?}"
    );
    let changed = differences(&before, &advertised());
    assert!(
        changed.is_empty(),
        "the GPU nodes advertise what they did:\n{}",
        changed.join("\n")
    );

    step("the rollback, as docs/migrate-from-nvidia.md writes it");
    let started = Instant::now();
    // This chart's manifest marks the ClusterPolicy `keep` (its uninstall hook, skipped below, deletes it).
    kubectl(&SCALE_OPERATOR_TO_ZERO);
    ours.terminate();
    kubectl(&REMOVE_POLICY_FINALIZERS);
    e2e::ok("helm", &UNINSTALL_WITHOUT_HOOKS);
    kubectl(&[
        "delete",
        "daemonset",
        "-n",
        NAMESPACE,
        "-l",
        "app.kubernetes.io/managed-by=gpu-operator,app!=nvidia-driver-daemonset",
    ]);
    kubectl(&[
        "delete",
        "daemonset",
        "-n",
        NAMESPACE,
        "-l",
        "app=nvidia-driver-daemonset",
        "--field-selector",
        "metadata.name!=nvidia-driver-daemonset",
    ]);
    // The CRDs stay this operator's (a superset of NVIDIA's schema), whose fields Helm would refuse to take over.
    // No `--wait`: Helm 4 waits for the ClusterPolicy's status to observe its generation, which only this operator
    // writes; NVIDIA's `state: ready` is what the guide waits for instead.
    helm_install(&nvidia, &["--skip-crds"]);
    let nvidia_log = start_nvidia_operator();
    let waited = run(
        "kubectl",
        &[
            "wait",
            "clusterpolicy",
            POLICY,
            "--for=jsonpath={.status.state}=ready",
            "--timeout=240s",
        ],
    );
    assert!(
        waited.success,
        "NVIDIA's operator never reported the ClusterPolicy ready after the rollback: {}\nstatus: {:#}\n\
         {}\nthe driver's pod template against NVIDIA's before the switch: {:#?}\nNVIDIA's operator's log:\n{}",
        waited.stderr,
        kubectl_json(&["get", "clusterpolicy", POLICY])["status"],
        daemonsets_and_driver_pods(),
        json_differences(
            "",
            &nvidias_driver_template,
            &kubectl_json(&["get", "daemonset", DRIVER, "-n", NAMESPACE])["spec"]["template"]
        ),
        nvidia_operator_log_tail(&nvidia_log)
    );
    eprintln!(
        "rolled back to NVIDIA's operator in {:?}",
        started.elapsed()
    );

    step(
        "after the rollback: NVIDIA's operator runs the same ClusterPolicy, driver DaemonSet and pods",
    );
    assert_eq!(uid("clusterpolicy", POLICY), policy_uid);
    assert_eq!(daemonset_uids().get(DRIVER), Some(&driver_uid));
    assert_eq!(
        driver_pods(&driver_uid),
        nvidias_driver_pods,
        "the driver pods stayed"
    );
    // NVIDIA's operator wrote its own DaemonSet back (its template, whose revision the pods still run, which is
    // also what its ready state says for an OnDelete DaemonSet), with its own labels.
    let driver = kubectl_json(&["get", "daemonset", DRIVER, "-n", NAMESPACE]);
    let template_changes =
        json_differences("", &nvidias_driver_template, &driver["spec"]["template"]);
    assert!(
        template_changes.is_empty(),
        "NVIDIA's operator wrote its pod template back: {template_changes:#?}"
    );
    assert_eq!(
        driver["metadata"]["labels"]["app.kubernetes.io/component"], "nvidia-driver",
        "{}",
        driver["metadata"]["labels"]
    );
    let changed = differences(&before, &advertised());
    assert!(
        changed.is_empty(),
        "the GPU nodes advertise what they did under NVIDIA's operator:\n{}",
        changed.join("\n")
    );
    drop(restore);
}

//! Switching a running cluster from NVIDIA's GPU Operator to this one and back, with the commands of
//! docs/migrate-from-nvidia.md: NVIDIA's chart and operator (the release the benchmark measures, built from its
//! Go module) run on the kwok nodes with the driver, a time-slicing ConfigMap and MIG and device-plugin config
//! labels; after the switch this operator's operands run, the ClusterPolicy and the driver DaemonSet are the same
//! objects (same uid) and the driver pods were never replaced, and the GPU nodes' labels and allocatable are
//! what they were; the rollback gives all of it back to NVIDIA's operator in the same way.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
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

fn nvidia_chart() -> String {
    let dir = std::env::var("E2E_NVIDIA_GPU_OPERATOR_DIR")
        .expect("E2E_NVIDIA_GPU_OPERATOR_DIR is set by `cargo xtask e2e`");
    PathBuf::from(dir)
        .join("gpu-operator")
        .display()
        .to_string()
}

/// `xtask nvidia-operator start|stop`: NVIDIA's operator as a local process with its chart's ServiceAccount, as
/// the benchmark runs it (kwok nodes run no containers, so the chart's Deployment pod runs nothing).
fn nvidia_operator(action: &str) {
    let xtask = std::env::var("E2E_XTASK_BIN").expect("E2E_XTASK_BIN is set by `cargo xtask e2e`");
    let output = Command::new(xtask)
        .args(["nvidia-operator", action])
        .output()
        .expect("run xtask nvidia-operator");
    assert!(
        output.status.success(),
        "xtask nvidia-operator {action}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `helm install gpu-operator <chart> -n gpu-operator <VALUES> --wait`, with `extra` flags.
fn helm_install(chart: &str, extra: &[&str]) {
    let mut args = vec![
        "install",
        "gpu-operator",
        chart,
        "-n",
        NAMESPACE,
        "--wait",
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

/// NVIDIA's container toolkit DaemonSet, whose init container `driver-validation` NVIDIA runs privileged and this
/// operator confined: the take-over has to hand NVIDIA's `privileged` to this operator's apply, which removes it.
const TOOLKIT: &str = "nvidia-container-toolkit-daemonset";

/// The managed fields of DaemonSet `name` (manager, operation, subresource, apiVersion) with what each entry owns
/// of the `driver-validation` init container's securityContext, for the log.
fn print_managed_fields(name: &str, when: &str) {
    let ds = kubectl_json(&[
        "get",
        "daemonset",
        name,
        "-n",
        NAMESPACE,
        "--show-managed-fields",
    ]);
    eprintln!("managedFields of {name} {when}:");
    for entry in ds["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let security = &entry["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:initContainers"]["k:{\"name\":\"driver-validation\"}"]
            ["f:securityContext"];
        eprintln!(
            "  manager={} operation={} subresource={} apiVersion={} fieldsType={} time={} driver-validation securityContext={}",
            entry["manager"],
            entry["operation"],
            entry["subresource"],
            entry["apiVersion"],
            entry["fieldsType"],
            entry["time"],
            security
        );
    }
    eprintln!(
        "  driver-validation securityContext now: {}",
        ds["spec"]["template"]["spec"]["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == "driver-validation")
            .map(|c| c["securityContext"].clone())
            .unwrap_or_default()
    );
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
        print_managed_fields(TOOLKIT, "when the take-over failed");
        panic!(
            "this operator never took over (every component ready, the driver waiting on {outdated} old pods): \
             {error:#}\n{:#}",
            get()["status"]
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
        let xtask = std::env::var("E2E_XTASK_BIN").unwrap_or_default();
        drop(
            Command::new(xtask)
                .args(["nvidia-operator", "stop"])
                .output(),
        );
        drop(run(
            "kubectl",
            &["delete", "clusterpolicy", "--all", "--wait=false"],
        ));
        drop(run(
            "kubectl",
            &[
                "patch",
                "clusterpolicy",
                POLICY,
                "--type",
                "json",
                "-p",
                r#"[{"op": "remove", "path": "/metadata/finalizers"}]"#,
            ],
        ));
        drop(run(
            "helm",
            &[
                "uninstall",
                "gpu-operator",
                "-n",
                NAMESPACE,
                "--no-hooks",
                "--wait",
            ],
        ));
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
    helm_install(&nvidia, &[]);
    nvidia_operator("start");
    wait_for_nvidia_ready(Duration::from_secs(240));
    let policy_uid = uid("clusterpolicy", POLICY);
    let nvidia_daemonsets = daemonset_uids();
    let driver_uid = nvidia_daemonsets
        .get(DRIVER)
        .cloned()
        .unwrap_or_else(|| panic!("NVIDIA's operator made no {DRIVER}: {nvidia_daemonsets:?}"));
    let image = driver_image();
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
    // Settled: NVIDIA's operator has labelled every node (the labels below are what the nodes advertise).
    std::thread::sleep(Duration::from_secs(5));
    let before = advertised();
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
    kubectl(&[
        "scale",
        "deployment",
        "gpu-operator",
        "-n",
        NAMESPACE,
        "--replicas=0",
    ]);
    nvidia_operator("stop");
    e2e::ok(
        "helm",
        &[
            "uninstall",
            "gpu-operator",
            "-n",
            NAMESPACE,
            "--no-hooks",
            "--wait",
        ],
    );
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
    print_managed_fields(TOOLKIT, "before the take-over");
    helm_install(&chart_dir(), &[]);
    let ours = Operator::start("switch");
    wait_for_ours_taken_over(pool_nodes.len(), Duration::from_secs(180));
    let switched_in = started.elapsed();
    print_managed_fields(TOOLKIT, "after the take-over");
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
        driver["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|entry| entry["manager"] == "gpu-operator" && entry["operation"] == "Apply"),
        "this operator's apply wrote the driver DaemonSet: {}",
        driver["metadata"]["managedFields"]
    );
    assert!(
        !driver["metadata"]["labels"]["app.kubernetes.io/component"].is_null(),
        "{}",
        driver["metadata"]["labels"]
    );
    assert_eq!(driver["spec"]["updateStrategy"]["type"], "OnDelete");
    assert_eq!(
        driver["spec"]["selector"],
        serde_json::json!({"matchLabels": {"app": DRIVER}})
    );
    let taken_over = driver_pods(&driver_uid);
    for node in &pool_nodes {
        assert_eq!(
            taken_over.get(node),
            nvidias_driver_pods.get(node),
            "the driver pod on {node} was never replaced"
        );
    }
    let our_daemonsets: Vec<String> = e2e::operand_daemonsets()
        .iter()
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
    eprintln!(
        "NVIDIA's DaemonSets this operator does not run: {:?}",
        after
            .keys()
            .filter(|name| !our_daemonsets.contains(name))
            .collect::<Vec<_>>()
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
    kubectl(&[
        "scale",
        "deployment",
        "gpu-operator",
        "-n",
        NAMESPACE,
        "--replicas=0",
    ]);
    ours.terminate();
    kubectl(&[
        "patch",
        "clusterpolicy",
        POLICY,
        "--type",
        "json",
        "-p",
        r#"[{"op": "remove", "path": "/metadata/finalizers"}]"#,
    ]);
    e2e::ok(
        "helm",
        &[
            "uninstall",
            "gpu-operator",
            "-n",
            NAMESPACE,
            "--no-hooks",
            "--wait",
        ],
    );
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
    helm_install(&nvidia, &["--skip-crds"]);
    nvidia_operator("start");
    wait_for_nvidia_ready(Duration::from_secs(240));
    eprintln!(
        "rolled back to NVIDIA's operator in {:?}",
        started.elapsed()
    );

    step(
        "after the rollback: NVIDIA's operator runs the same ClusterPolicy, driver DaemonSet and pods",
    );
    assert_eq!(uid("clusterpolicy", POLICY), policy_uid);
    assert_eq!(daemonset_uids().get(DRIVER), Some(&driver_uid));
    let back = driver_pods(&driver_uid);
    for node in &pool_nodes {
        assert_eq!(
            back.get(node),
            nvidias_driver_pods.get(node),
            "the driver pod on {node} stayed"
        );
    }
    let driver = kubectl_json(&["get", "daemonset", DRIVER, "-n", NAMESPACE]);
    // NVIDIA's operator replaces the labels with its own (NVIDIA's chart's managed-by gpu-operator among them):
    // this operator's component label is gone.
    assert!(
        driver["metadata"]["labels"]["app.kubernetes.io/component"].is_null(),
        "NVIDIA's operator wrote its own DaemonSet back: {}",
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

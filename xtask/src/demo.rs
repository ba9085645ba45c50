//! `cargo xtask demo`: the project's main job on a node that runs real containers. Starts a fresh local cluster,
//! builds the images, adds the real node (containerd and runc, four simulated A100-40GB GPUs), installs the chart
//! the way NVIDIA's guide does for a pre-installed driver, and follows what a user would watch: the operator's pod,
//! the ClusterPolicy turning ready, the node's GPUs, NVIDIA's time-slicing guide (4 GPUs become 16
//! `nvidia.com/gpu.shared`), and a MIG change through the node's label (28 MIG devices, 112 shared replicas).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::e2e::add_real_node_with_images;
use harness::cluster;
use harness::command;
use harness::operators::NAMESPACE;

/// The values for a node whose GPUs are simulated (shared with the real-node end-to-end suite).
const SIMULATED_GPUS_VALUES: &str = "examples/simulated-gpus-values.yaml";
/// NVIDIA's time-slicing guide's ConfigMap (shared with the real-node end-to-end suite).
const TIME_SLICING_CONFIG: &str = "examples/time-slicing-config.yaml";
/// The host folder of the simulated GPUs' state, which a new demo starts without.
const SIMULATOR_DIR: &str = "/run/gpu-operator-rs-simulator";
/// The geometry the demo gives the node: seven 1g.5gb instances on each A100-40GB.
const DEMO_MIG_CONFIG: &str = "all-1g.5gb";
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(180);

pub fn run(root: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    // A fresh cluster: no state from an earlier run, and no kwok node the operator's pod could land on.
    cluster::down()?;
    let info = cluster::ensure_up()?;
    let env = cluster::env_vars(&info);
    match std::fs::remove_dir_all(SIMULATOR_DIR) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            bail!("cannot remove the simulated GPUs' state in {SIMULATOR_DIR}: {error}")
        }
        _ => {}
    }
    let real_node = add_real_node_with_images(root)?;
    let node = real_node.node;
    // The images as the local registry serves them, as a user's registry would.
    let registry = format!("global.imageRegistry={}", real_node.registry);
    let values = root.join(SIMULATED_GPUS_VALUES).display().to_string();
    let kubelet_root = format!("hostPaths.kubeletRootDir={}", node.kubelet_root.display());
    let chart = root.join("charts/gpu-operator").display().to_string();
    command::run(
        root,
        &env,
        "helm",
        &[
            "install",
            "gpu-operator",
            "-n",
            NAMESPACE,
            "--create-namespace",
            &chart,
            "-f",
            &values,
            "--set",
            &kubelet_root,
            "--set",
            &registry,
        ],
    )?;
    let node = node.node;
    follow(
        &env,
        "the operator's pod",
        &[
            "get",
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            "app=gpu-operator",
            "-o",
            "jsonpath={.items[0].status.phase} on {.items[0].spec.nodeName}",
        ],
        |state| state.starts_with("Running on"),
    )?;
    follow(
        &env,
        "cluster-policy",
        &[
            "get",
            "clusterpolicy",
            "cluster-policy",
            "-o",
            "jsonpath={.status.state} {.status.ready}",
        ],
        |state| state.starts_with("ready "),
    )?;
    command::run(
        root,
        &env,
        "kubectl",
        &["get", "pods", "-n", NAMESPACE, "-o", "wide"],
    )?;
    follow_allocatable(&env, &node, "nvidia.com/gpu", "4")?;

    println!("\nNVIDIA's time-slicing guide: the slice-4 config shares each GPU four ways");
    command::run(
        root,
        &env,
        "kubectl",
        &[
            "apply",
            "-f",
            &root.join(TIME_SLICING_CONFIG).display().to_string(),
        ],
    )?;
    command::run(
        root,
        &env,
        "kubectl",
        &[
            "patch",
            "clusterpolicy",
            "cluster-policy",
            "--type",
            "merge",
            "-p",
            r#"{"spec": {"devicePlugin": {"config": {"name": "time-slicing-config", "default": "slice-4"}}}}"#,
        ],
    )?;
    follow_allocatable(&env, &node, "nvidia.com/gpu.shared", "16")?;

    println!("\nA MIG change through the node's label, applied by the MIG manager's container");
    let label = format!("nvidia.com/mig.config={DEMO_MIG_CONFIG}");
    command::run(
        root,
        &env,
        "kubectl",
        &["label", "node", &node, &label, "--overwrite"],
    )?;
    follow(
        &env,
        &format!("{node} MIG config and state"),
        &[
            "get",
            "node",
            &node,
            "-o",
            r"jsonpath={.metadata.labels.nvidia\.com/mig\.config} {.metadata.labels.nvidia\.com/mig\.config\.state}",
        ],
        |state| state == format!("{DEMO_MIG_CONFIG} success"),
    )?;
    follow_allocatable(&env, &node, "nvidia.com/gpu.shared", "112")?;
    command::run(root, &env, "kubectl", &["get", "clusterpolicy"])?;
    command::run(root, &env, "kubectl", &["get", "gpunodes"])?;
    println!(
        "\nThe demo took {:.0} s. The cluster keeps running; use it with: eval \"$(cargo xtask cluster env)\"",
        started.elapsed().as_secs_f64()
    );
    println!("  kubectl logs -n {NAMESPACE} deploy/gpu-operator");
    println!(
        "  kubectl label node {node} nvidia.com/mig.config=all-balanced --overwrite; kubectl get gpunodes -w"
    );
    println!(
        "  helm uninstall -n {NAMESPACE} gpu-operator --wait   # leaves no operand, label or GPUNode"
    );
    println!("Stop everything with: cargo xtask cluster down");
    Ok(())
}

/// Follows `node`'s allocatable `resource` until it is `count`.
fn follow_allocatable(
    env: &[(String, String)],
    node: &str,
    resource: &str,
    count: &str,
) -> anyhow::Result<()> {
    let path = format!(
        "jsonpath={{.status.allocatable.{}}}",
        resource.replace('.', r"\.")
    );
    follow(
        env,
        &format!("{node} allocatable {resource}"),
        &["get", "node", node, "-o", &path],
        |allocatable| allocatable == count,
    )
}

/// Prints what `kubectl <args>` answers each time it changes, until `done` accepts it.
fn follow(
    env: &[(String, String)],
    what: &str,
    args: &[&str],
    done: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < FOLLOW_TIMEOUT {
        let answer = command::output(env, "kubectl", args).unwrap_or_default();
        let answer = answer.trim().to_string();
        if last.as_ref() != Some(&answer) {
            println!(
                "[{:>5.1}s] {what}: {}",
                started.elapsed().as_secs_f64(),
                if answer.is_empty() {
                    "(not yet)"
                } else {
                    &answer
                }
            );
            last = Some(answer.clone());
        }
        if done(&answer) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!(
        "{what} did not get there within {} s: see `kubectl describe clusterpolicy cluster-policy`, `kubectl get pods -n {NAMESPACE}` and `kubectl describe gpunodes`",
        FOLLOW_TIMEOUT.as_secs()
    )
}

//! `cargo xtask demo`: the project's main job on the embedded defaults. Brings up the local cluster with three
//! simulated GPU nodes, installs the chart the way NVIDIA's guide does, and shows the ClusterPolicy.

use std::path::Path;

use crate::cluster;
use crate::command;
use crate::e2e::standard_nodes;

pub fn run(root: &Path) -> anyhow::Result<()> {
    let info = cluster::ensure_up()?;
    let env = cluster::env_vars(&info);
    if command::output(&env, "kubectl", &["get", "nodes", "-o", "name"])?.trim().is_empty() {
        for pool in standard_nodes() {
            cluster::add_nodes(&pool)?;
        }
    }
    let chart = root.join("charts/gpu-operator").display().to_string();
    command::run(root, &env, "helm", &[
        "upgrade", "--install", "--wait", "--timeout", "180s", "gpu-operator", "-n", "gpu-operator",
        "--create-namespace", &chart, "--set", "driver.enabled=false", "--set", "nfd.enabled=false",
    ])?;
    command::run(root, &env, "kubectl", &["get", "nodes", "-L", "feature.node.kubernetes.io/system-os_release.ID,nvidia.com/gpu.simulator"])?;
    command::run(root, &env, "kubectl", &["get", "pods", "-n", "gpu-operator", "-o", "wide"])?;
    command::run(root, &env, "kubectl", &["get", "clusterpolicy"])?;
    println!();
    println!("The cluster keeps running. Use it with: eval \"$(cargo xtask cluster env)\"");
    println!("  kubectl explain clusterpolicy.spec.devicePlugin      kubectl get gpunodes");
    println!("Stop it with: cargo xtask cluster down");
    Ok(())
}

//! `cargo xtask demo`: the project's main job on the embedded defaults. Brings up the local cluster with three
//! simulated GPU nodes on two operating systems, installs the chart the way NVIDIA's guide does, starts the
//! operator (as a local process with the chart's ServiceAccount, since kwok runs no containers) and shows the
//! ClusterPolicy turning Ready.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::cluster;
use crate::command;
use crate::e2e::{build_binaries, standard_nodes};
use crate::install::{self, NAMESPACE};

pub fn run(root: &Path) -> anyhow::Result<()> {
    let info = cluster::ensure_up()?;
    let env = cluster::env_vars(&info);
    if command::output(&env, "kubectl", &["get", "nodes", "-o", "name"])?
        .trim()
        .is_empty()
    {
        for pool in standard_nodes() {
            cluster::add_nodes(&pool)?;
        }
    }
    install::install_chart(root, &env, "180s")?;
    let bin_dir = build_binaries(root, &[("operator", "gpu-operator")])?;
    let log = install::start_operator(&info, &bin_dir.join("gpu-operator"), "demo")?.log;
    println!(
        "the operator runs as a local process with the chart's ServiceAccount; its log: {}",
        log.display()
    );
    wait_until_ready(&env)?;
    command::run(
        root,
        &env,
        "kubectl",
        &[
            "get",
            "nodes",
            "-L",
            "feature.node.kubernetes.io/system-os_release.ID,feature.node.kubernetes.io/system-os_release.VERSION_ID,nvidia.com/gpu.present,nvidia.com/gpu.deploy.device-plugin",
        ],
    )?;
    command::run(
        root,
        &env,
        "kubectl",
        &["get", "daemonsets", "-n", NAMESPACE],
    )?;
    command::run(root, &env, "kubectl", &["get", "clusterpolicy"])?;
    println!();
    println!(
        "The cluster and the operator keep running. Use them with: eval \"$(cargo xtask cluster env)\""
    );
    println!(
        "  kubectl patch clusterpolicy/cluster-policy --type merge -p '{{\"spec\": {{\"driver\": {{\"enabled\": true}}}}}}'"
    );
    println!("  kubectl get daemonsets -n {NAMESPACE}     # one driver DaemonSet per OS pool");
    println!("Stop everything with: cargo xtask cluster down");
    Ok(())
}

/// Shows the ClusterPolicy's state as it changes, until it is ready.
fn wait_until_ready(env: &[(String, String)]) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(180) {
        let state = command::output(
            env,
            "kubectl",
            &[
                "get",
                "clusterpolicy",
                "cluster-policy",
                "-o",
                "jsonpath={.status.state} {.status.ready}",
            ],
        )
        .unwrap_or_default();
        if state != last {
            println!(
                "[{:>5.1}s] cluster-policy: {}",
                started.elapsed().as_secs_f64(),
                if state.trim().is_empty() {
                    "(no status yet)"
                } else {
                    state.trim()
                }
            );
            last = state.clone();
        }
        if state.starts_with("ready ") {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!(
        "the ClusterPolicy did not become ready within 180 s: see `kubectl describe clusterpolicy cluster-policy` and the operator's log"
    )
}

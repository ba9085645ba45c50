//! `cargo xtask demo`: the project's main job on the embedded defaults. Brings up the local cluster with three
//! simulated GPU nodes on two operating systems, installs the chart the way NVIDIA's guide does, starts the
//! operator and each node's feature discovery and MIG manager (as local processes with the chart's
//! ServiceAccounts, since kwok runs no containers; the node agents on the GPU simulator), shows the ClusterPolicy
//! turning Ready and the GPUNodes filling in, then changes one node's MIG geometry through its label.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::cluster::{self, ClusterInfo};
use crate::command;
use crate::e2e::{build_binaries, standard_nodes};
use crate::install::{self, NAMESPACE};

/// The geometry the demo gives its first node: seven 1g.5gb instances on each A100-40GB.
const DEMO_MIG_CONFIG: &str = "all-1g.5gb";
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(180);

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
    let bin_dir = build_binaries(
        root,
        &[
            ("operator", "gpu-operator"),
            ("node-agent", "gpu-node-agent"),
        ],
    )?;
    let log = install::start_operator(&info, &bin_dir.join("gpu-operator"), "demo")?.log;
    println!(
        "the operator runs as a local process with the chart's ServiceAccount; its log: {}",
        log.display()
    );
    let gpu_nodes = command::output(
        &env,
        "kubectl",
        &[
            "get",
            "nodes",
            "-l",
            "feature.node.kubernetes.io/pci-10de.present=true",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
    )?;
    let gpu_nodes: Vec<&str> = gpu_nodes.split_whitespace().collect();
    for node in &gpu_nodes {
        start_node_agents(&info, &bin_dir.join("gpu-node-agent"), node)?;
    }
    println!(
        "feature discovery and the MIG manager run for {} on simulated GPUs; their logs: {}",
        gpu_nodes.join(", "),
        info.state_dir.join("logs").display()
    );
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
    // The MIG manager reports the node's geometry once the operator has labelled it all-disabled.
    for node in &gpu_nodes {
        follow_mig_change(&env, node, "all-disabled")?;
    }
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
    command::run(root, &env, "kubectl", &["get", "gpunodes"])?;
    if let Some(node) = gpu_nodes.first() {
        let label = format!("nvidia.com/mig.config={DEMO_MIG_CONFIG}");
        command::run(
            root,
            &env,
            "kubectl",
            &["label", "node", node, &label, "--overwrite"],
        )?;
        follow_mig_change(&env, node, DEMO_MIG_CONFIG)?;
        command::run(root, &env, "kubectl", &["get", "gpunodes"])?;
    }
    println!();
    println!(
        "The cluster and the operator keep running. Use them with: eval \"$(cargo xtask cluster env)\""
    );
    println!(
        "  kubectl patch clusterpolicy/cluster-policy --type merge -p '{{\"spec\": {{\"driver\": {{\"enabled\": true}}}}}}'"
    );
    println!("  kubectl get daemonsets -n {NAMESPACE}     # one driver DaemonSet per OS pool");
    println!(
        "  kubectl label node gpu-h100-0 nvidia.com/mig.config=all-balanced --overwrite; kubectl get gpunodes -w"
    );
    println!("Stop everything with: cargo xtask cluster down");
    Ok(())
}

/// Starts feature discovery and the MIG manager of `node` as the operator's DaemonSets run them, on the GPU
/// simulator (the node's `nvidia.com/gpu.simulator` annotation says which GPUs), with the chart's ServiceAccounts.
fn start_node_agents(info: &ClusterInfo, binary: &Path, node: &str) -> anyhow::Result<()> {
    let state = info.state_dir.join(format!("gpus-{node}.json"));
    let roles: [(&str, &str, &[&str]); 2] = [
        (
            "gpu-feature-discovery",
            "discovery",
            &["--mig-strategy", "single"],
        ),
        (
            "nvidia-mig-manager",
            "mig",
            &[
                "--config-map",
                "default-mig-parted-config",
                "--default-config",
                "all-disabled",
            ],
        ),
    ];
    for (account, role, flags) in roles {
        let kubeconfig = cluster::service_account_kubeconfig(info, NAMESPACE, account)?;
        let mut args: Vec<String> = std::iter::once(role)
            .chain(flags.iter().copied())
            .chain(["--simulate", "node", "--sim-state"])
            .map(String::from)
            .collect();
        args.push(state.display().to_string());
        cluster::start_workload(
            info,
            &format!("{account}-{node}"),
            binary,
            &args,
            &[
                ("KUBECONFIG".into(), kubeconfig.display().to_string()),
                ("NODE_NAME".into(), node.into()),
                ("OPERATOR_NAMESPACE".into(), NAMESPACE.into()),
            ],
        )?;
    }
    Ok(())
}

/// Follows the MIG config and state in `node`'s GPUNode until its MIG manager has applied `config`.
fn follow_mig_change(env: &[(String, String)], node: &str, config: &str) -> anyhow::Result<()> {
    let applied = format!("{config} success");
    follow(
        env,
        &format!("{node} MIG config and state"),
        &[
            "get",
            "gpunode",
            node,
            "-o",
            "jsonpath={.status.mig.config} {.status.mig.state}",
        ],
        |state| state == applied,
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
        "{what} did not get there within {} s: see `kubectl describe clusterpolicy cluster-policy`, `kubectl describe gpunodes` and the logs in the cluster's state directory",
        FOLLOW_TIMEOUT.as_secs()
    )
}

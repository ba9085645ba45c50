//! The watchdog's CPU and RSS, at rest and with 200 GPU processes on 8 GPUs: the release `gpu-node-agent
//! watchdog` runs as a local process for one kwok node of the bench's cluster, with 25 pods on it (kwok's), the
//! `watchdog_load` example standing in for the node around it (simulated H100s, the kubelet's pod-resources
//! socket, the GPU processes: real `sleep`s in the pods' cgroups under a procfs of its own). Each phase is
//! measured over a window after a settling time, and the watchdog's own metrics must show every pod.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use super::report::Environment;
use super::say;
use harness::cluster::{self, AddNodes, ClusterInfo};
use harness::command;
use harness::proc_stats;

const PODS: u32 = 25;
const GPUS: u32 = 8;
const PROCESSES: u32 = 200;
/// The watchdog's pass interval (its default).
const INTERVAL_SECONDS: u32 = 5;
const SETTLE: Duration = Duration::from_secs(15);
const WINDOW: Duration = Duration::from_secs(60);
const LISTEN: &str = "127.0.0.1:19402";

/// One phase's figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// GPU processes the simulator reports.
    pub processes: u32,
    /// CPU time per wall-clock second over the window, in percent of one core.
    pub cpu_percent: f64,
    pub rss_mib: f64,
}

/// What `cargo xtask bench` records of the watchdog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchdogUsage {
    /// The commit and date of the measurement (`--watchdog-only` keeps the operators' older results).
    pub commit: String,
    pub date: String,
    pub gpus: u32,
    pub pods: u32,
    pub interval_seconds: u32,
    pub at_rest: Phase,
    pub loaded: Phase,
    pub peak_rss_mib: f64,
}

/// A child process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Measures the watchdog on the running cluster `info`.
pub fn measure(
    root: &Path,
    info: &ClusterInfo,
    environment: &Environment,
) -> anyhow::Result<WatchdogUsage> {
    let env = cluster::env_vars(info);
    let node = cluster::add_nodes(&AddNodes {
        count: 1,
        gpus: format!("h100-80gb:{GPUS}")
            .parse()
            .map_err(anyhow::Error::msg)?,
        os: "ubuntu22.04".parse().map_err(anyhow::Error::msg)?,
        prefix: "watchdog".into(),
    })?
    .pop()
    .context("no node was added")?;
    say(format!("watchdog: {PODS} pods on {node}"));
    let pods: Vec<serde_json::Value> = (0..PODS)
        .map(|n| {
            serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("watchdog-load-{n}"), "namespace": "default",
                             "labels": {"app": "watchdog-load"}},
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": "load"}]}
            })
        })
        .collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": pods});
    let work = info.state_dir.join("watchdog-bench");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let manifest = work.join("pods.yaml");
    std::fs::write(&manifest, list.to_string())?;
    command::output(
        &env,
        "kubectl",
        &["apply", "-f", &manifest.display().to_string()],
    )?;
    let listed: serde_json::Value = serde_json::from_str(&command::output(
        &env,
        "kubectl",
        &[
            "get",
            "pods",
            "-n",
            "default",
            "-l",
            "app=watchdog-load",
            "-o",
            "json",
        ],
    )?)?;
    let refs: Vec<serde_json::Value> = listed["items"]
        .as_array()
        .context("no pod list")?
        .iter()
        .map(|pod| {
            serde_json::json!({"uid": pod["metadata"]["uid"], "namespace": "default",
                               "name": pod["metadata"]["name"]})
        })
        .collect();
    let pods_file = work.join("pods.json");
    std::fs::write(&pods_file, serde_json::to_string(&refs)?)?;

    let release = command::target_dir(root).join("release");
    let state = work.join("gpus.json");
    let kubelet_root = work.join("kubelet");
    let proc_root = work.join("proc");
    let path = |p: &Path| p.display().to_string();
    let mut load = Running(
        Command::new(release.join("examples/watchdog_load"))
            .args([
                "--node",
                &node,
                "--pods",
                &path(&pods_file),
                "--sim-state",
                &path(&state),
                "--kubelet-root",
                &path(&kubelet_root),
                "--proc-root",
                &path(&proc_root),
                "--gpus",
                &GPUS.to_string(),
                "--processes",
                &PROCESSES.to_string(),
                "--seconds",
                &(SETTLE + WINDOW + Duration::from_secs(5))
                    .as_secs()
                    .to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start the watchdog_load example")?,
    );
    let mut lines = BufReader::new(load.0.stdout.take().context("no stdout")?);
    wait_for(&mut lines, "rest")?;
    let watchdog = Running(
        Command::new(release.join("gpu-node-agent"))
            .args([
                "--simulate",
                &format!("h100-80gb:{GPUS}"),
                "--sim-state",
                &path(&state),
                "watchdog",
                "--node-name",
                &node,
                "--kubelet-root",
                &path(&kubelet_root),
                "--proc-root",
                &path(&proc_root),
                "--listen",
                LISTEN,
                "--interval-seconds",
                &INTERVAL_SECONDS.to_string(),
            ])
            .envs(env.iter().map(|(key, value)| (key, value)))
            .stdout(Stdio::null())
            .spawn()
            .context("cannot start gpu-node-agent watchdog")?,
    );
    let pid = watchdog.0.id();
    say("watchdog: at rest");
    let at_rest = phase(pid, 0)?;
    wait_for(&mut lines, "loaded")?;
    say(format!("watchdog: {PROCESSES} processes on {GPUS} GPUs"));
    let loaded = phase(pid, PROCESSES)?;
    let metrics = command::output(&[], "curl", &["-sf", &format!("http://{LISTEN}/metrics")])?;
    let pods_seen = metrics
        .lines()
        .filter(|line| {
            line.starts_with("gpu_watchdog_pod_memory_used_bytes{") && !line.ends_with(" 0")
        })
        .count();
    if pods_seen != PODS as usize {
        bail!("the watchdog shows {pods_seen} pods using GPU memory, not {PODS}:\n{metrics}");
    }
    let peak_rss_mib = proc_stats::read(pid)?.peak_rss_mib;
    drop(watchdog);
    drop(load);
    command::output(
        &env,
        "kubectl",
        &[
            "delete",
            "pods",
            "-n",
            "default",
            "-l",
            "app=watchdog-load",
            "--wait=false",
        ],
    )?;
    command::output(&env, "kubectl", &["delete", "node", &node, "--wait=false"])?;
    Ok(WatchdogUsage {
        commit: environment.commit.clone(),
        date: environment.date.clone(),
        gpus: GPUS,
        pods: PODS,
        interval_seconds: INTERVAL_SECONDS,
        at_rest,
        loaded,
        peak_rss_mib,
    })
}

fn wait_for(lines: &mut BufReader<ChildStdout>, word: &str) -> anyhow::Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line)? == 0 {
            bail!("the watchdog_load example ended before {word:?}");
        }
        if line.starts_with(word) {
            return Ok(());
        }
    }
}

/// CPU over the window after the settling time, and RSS at its end.
fn phase(pid: u32, processes: u32) -> anyhow::Result<Phase> {
    std::thread::sleep(SETTLE);
    let before = proc_stats::read(pid)?;
    std::thread::sleep(WINDOW);
    let after = proc_stats::read(pid)?;
    Ok(Phase {
        processes,
        cpu_percent: (after.cpu_s - before.cpu_s) / WINDOW.as_secs_f64() * 100.0,
        rss_mib: after.rss_mib,
    })
}

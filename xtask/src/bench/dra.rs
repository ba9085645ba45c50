//! Fractional GPUs through DRA: how fast the real kube-scheduler brings pods with shares of GPUs to Running, and
//! how long the driver's NodePrepareResources takes. 25 kwok nodes with 4 simulated A100-40GB each (100 GPUs,
//! every one shared) get a release `gpu-dra-driver run` each, publishing their slices; pods take 3000 MiB
//! and 10 % of the SMs each (ten fit on a GPU), through a ResourceClaimTemplate of the chart's
//! `shared.gpu.nvidia.com` class. kwok marks a bound pod Running, so the time is the scheduler's (allocation of
//! the claims included) and the API server's. Then the `prepare_latency` example plays the kubelet against the
//! drivers for a sample of the allocated claims.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::report::Environment;
use super::say;
use harness::cluster::{self, AddNodes, ClusterInfo};
use harness::command;

const NODES: u32 = 25;
const GPUS_PER_NODE: u32 = 4;
/// The pod counts measured, one run each on an emptied cluster.
const RUNS: [u32; 2] = [100, 1000];
/// Claims the prepare latency is measured on.
const PREPARE_SAMPLE: usize = 300;
const TIMEOUT: Duration = Duration::from_secs(900);
const TEMPLATE: &str = "bench-share";

/// One scheduling run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SchedulingRun {
    pub pods: u32,
    /// From the create request to the last pod Running.
    pub seconds: f64,
    pub pods_per_second: f64,
}

/// What `cargo xtask bench` records of fractional GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraBench {
    pub commit: String,
    pub date: String,
    pub gpus: u32,
    pub nodes: u32,
    pub runs: Vec<SchedulingRun>,
    pub prepared_claims: u32,
    pub prepare_p50_us: u64,
    pub prepare_p99_us: u64,
    pub unprepare_p50_us: u64,
    pub unprepare_p99_us: u64,
}

/// The drivers, stopped when dropped.
struct Drivers(Vec<Child>);

impl Drop for Drivers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Measures on the running cluster `info`.
pub fn measure(
    root: &Path,
    info: &ClusterInfo,
    environment: &Environment,
) -> anyhow::Result<DraBench> {
    let env = cluster::env_vars(info);
    let kubectl = |args: &[&str]| command::output(&env, "kubectl", args);
    let nodes = cluster::add_nodes(&AddNodes {
        count: NODES,
        gpus: format!("a100-40gb:{GPUS_PER_NODE}")
            .parse()
            .map_err(anyhow::Error::msg)?,
        os: "ubuntu22.04".parse().map_err(anyhow::Error::msg)?,
        prefix: "dra".into(),
    })?;
    let work = info.state_dir.join("dra-bench");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;

    say("DRA: the chart's DeviceClasses and CRDs, and a driver per node");
    let classes = command::output(
        &env,
        "helm",
        &[
            "template",
            "bench",
            &root.join("charts/gpu-operator").display().to_string(),
            "--show-only",
            "templates/deviceclasses.yaml",
            // The chart renders DeviceClasses only where the API server serves them, which `helm template`
            // cannot ask.
            "--api-versions",
            "resource.k8s.io/v1/DeviceClass",
        ],
    )?;
    let classes_file = work.join("deviceclasses.yaml");
    std::fs::write(&classes_file, classes)?;
    kubectl(&["apply", "-f", &classes_file.display().to_string()])?;
    // The drivers write their GPUNode status.
    kubectl(&[
        "apply",
        "-f",
        &root.join("charts/gpu-operator/crds").display().to_string(),
    ])?;
    let binary = command::target_dir(root).join("release/gpu-dra-driver");
    let mut drivers = Drivers(Vec::new());
    for node in &nodes {
        let dir = work.join(node);
        std::fs::create_dir_all(&dir)?;
        let path = |name: &str| dir.join(name).display().to_string();
        let log = std::fs::File::create(dir.join("driver.log"))?;
        drivers.0.push(
            Command::new(&binary)
                .args([
                    "--simulate",
                    "node",
                    "--sim-state",
                    &path("gpus.json"),
                    "run",
                    "--kubelet-root",
                    &path("kubelet"),
                    "--cdi-root",
                    &path("cdi"),
                    "--mps-root",
                    &path("mps"),
                    "--dev-root",
                    &path("dev"),
                ])
                .envs(env.iter().map(|(key, value)| (key, value)))
                .env("NODE_NAME", node)
                .env("DRA_GPUS", "all")
                .env("DRA_SHARED_GPUS", "all")
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("cannot start gpu-dra-driver run")?,
        );
    }
    wait(TIMEOUT, "every node's ResourceSlice", || {
        let slices: Value =
            serde_json::from_str(&kubectl(&["get", "resourceslices", "-o", "json"])?)?;
        Ok(count(&slices, |_| true) >= nodes.len())
    })?;
    let template = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "shared.gpu.nvidia.com",
            "capacity": {"requests": {"memory": "3000Mi", "cores": "10"}}
        }}]}}}
    });
    let template_file = work.join("template.json");
    std::fs::write(&template_file, template.to_string())?;
    kubectl(&["apply", "-f", &template_file.display().to_string()])?;

    let mut runs = Vec::new();
    let mut prepared = None;
    for pods in RUNS {
        say(format!(
            "DRA: {pods} pods, each 3000 MiB and 10 % of one of {} GPUs",
            NODES * GPUS_PER_NODE
        ));
        let list = json!({"apiVersion": "v1", "kind": "List", "items": (0..pods).map(|n| json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("share-{n}"), "namespace": "default", "labels": {"app": "dra-bench"}},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "work", "image": "work", "resources": {"claims": [{"name": "gpu"}]}}]
            }
        })).collect::<Vec<_>>()});
        let pods_file = work.join(format!("pods-{pods}.json"));
        std::fs::write(&pods_file, list.to_string())?;
        let started = Instant::now();
        kubectl(&["create", "-f", &pods_file.display().to_string()])?;
        wait(TIMEOUT, &format!("{pods} pods Running"), || {
            let listed: Value = serde_json::from_str(&kubectl(&[
                "get",
                "pods",
                "-n",
                "default",
                "-l",
                "app=dra-bench",
                "-o",
                "json",
            ])?)?;
            Ok(count(&listed, |pod| pod["status"]["phase"] == "Running") >= pods as usize)
        })?;
        let seconds = started.elapsed().as_secs_f64();
        let run = SchedulingRun {
            pods,
            seconds,
            pods_per_second: f64::from(pods) / seconds,
        };
        say(format!(
            "DRA: {pods} pods Running in {seconds:.1} s ({:.1} pods/s)",
            run.pods_per_second
        ));
        runs.push(run);
        if pods == RUNS[RUNS.len() - 1] {
            prepared = Some(prepare_latency(root, &kubectl, &work)?);
        }
        kubectl(&[
            "delete",
            "pods",
            "-n",
            "default",
            "-l",
            "app=dra-bench",
            "--wait=false",
        ])?;
        wait(TIMEOUT, "every pod and claim gone", || {
            let left: Value = serde_json::from_str(&kubectl(&[
                "get",
                "pods,resourceclaims",
                "-n",
                "default",
                "-o",
                "json",
            ])?)?;
            Ok(count(&left, |_| true) == 0)
        })?;
    }
    drop(drivers);
    let prepared = prepared.context("the prepare latency was not measured")?;
    Ok(DraBench {
        commit: environment.commit.clone(),
        date: environment.date.clone(),
        gpus: NODES * GPUS_PER_NODE,
        nodes: NODES,
        runs,
        prepared_claims: prepared["claims"].as_u64().unwrap_or(0) as u32,
        prepare_p50_us: prepared["prepare_p50_us"].as_u64().unwrap_or(0),
        prepare_p99_us: prepared["prepare_p99_us"].as_u64().unwrap_or(0),
        unprepare_p50_us: prepared["unprepare_p50_us"].as_u64().unwrap_or(0),
        unprepare_p99_us: prepared["unprepare_p99_us"].as_u64().unwrap_or(0),
    })
}

/// Plays the kubelet for a sample of the allocated claims: each to the driver of the node it was allocated on.
fn prepare_latency(
    root: &Path,
    kubectl: &dyn Fn(&[&str]) -> anyhow::Result<String>,
    work: &Path,
) -> anyhow::Result<Value> {
    let claims: Value = serde_json::from_str(&kubectl(&[
        "get",
        "resourceclaims",
        "-n",
        "default",
        "-o",
        "json",
    ])?)?;
    let targets: Vec<Value> = claims["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|claim| {
            let pool = claim["status"]["allocation"]["devices"]["results"][0]["pool"].as_str()?;
            let socket: PathBuf = work
                .join(pool)
                .join("kubelet/plugins/gpu.nvidia.com/dra.sock");
            Some(json!({
                "socket": socket,
                "namespace": claim["metadata"]["namespace"],
                "name": claim["metadata"]["name"],
                "uid": claim["metadata"]["uid"],
            }))
        })
        .take(PREPARE_SAMPLE)
        .collect();
    say(format!(
        "DRA: NodePrepareResources and NodeUnprepareResources of {} claims",
        targets.len()
    ));
    let file = work.join("claims.json");
    std::fs::write(&file, serde_json::to_vec(&targets)?)?;
    let line = super::example_json(
        root,
        "prepare_latency",
        &["--claims", &file.display().to_string()],
    )?;
    Ok(serde_json::from_str(&line)?)
}

/// The items of a list that pass `keep`.
fn count(list: &Value, keep: impl Fn(&Value) -> bool) -> usize {
    list["items"]
        .as_array()
        .map_or(0, |items| items.iter().filter(|item| keep(item)).count())
}

/// Polls `done` twice a second until it holds, or fails after `timeout`.
fn wait(
    timeout: Duration,
    what: &str,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if done()? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!("{what}: not reached within {} s", timeout.as_secs())
}

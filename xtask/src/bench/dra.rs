//! Fractional GPUs through DRA: how fast the real kube-scheduler brings pods with shares of GPUs to Running, and
//! how long the driver's NodePrepareResources takes. 25 kwok nodes with 4 simulated A100-40GB each (100 GPUs,
//! every one shared) get a release `gpu-dra-driver run` each, publishing their slices; pods take 3000 MiB
//! and 10 % of the SMs each (ten fit on a GPU), through a ResourceClaimTemplate of the chart's
//! `shared.gpu.nvidia.com` class. kwok marks a bound pod Running, so the time is the scheduler's (allocation of
//! the claims included) and the API server's. Then the `prepare_latency` example plays the kubelet against the
//! drivers for a sample of the allocated claims.

use std::collections::BTreeSet;
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
/// Claims the prepare latency is measured on, in each round.
const PREPARE_SAMPLE: usize = 300;
/// Rounds of the prepare latency, each on claims of its own (a claim is prepared once, as for one pod): the report
/// gives their medians and the spread of the p99.
const PREPARE_ROUNDS: usize = 3;
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
    /// Medians over the rounds.
    pub prepare_p50_us: u64,
    pub prepare_p99_us: u64,
    pub unprepare_p50_us: u64,
    pub unprepare_p99_us: u64,
    /// Each round's figures (empty in results recorded before there were rounds).
    #[serde(default)]
    pub prepare_rounds: Vec<PrepareRound>,
}

/// One round of the prepare latency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrepareRound {
    pub claims: u32,
    /// At the driver's socket, as the kubelet waits.
    pub prepare_p50_us: u64,
    pub prepare_p99_us: u64,
    pub unprepare_p50_us: u64,
    pub unprepare_p99_us: u64,
    /// Inside the driver, from the call to the answer (its `prepared` log line's `total_us`): what is left of the
    /// socket's figures is the gRPC path and the wait for a core. 0 in results recorded before.
    #[serde(default)]
    pub in_driver_p50_us: u64,
    #[serde(default)]
    pub in_driver_p99_us: u64,
    /// Of that, the host side under the claims' lock (the CDI spec, MPS directories, the checkpoint): its p99.
    #[serde(default)]
    pub host_p99_us: u64,
    /// The claims prepared from what the driver read ahead.
    #[serde(default)]
    pub read_ahead: u32,
    /// From the round's last prepare until every claim of the round carried its device status in the API (polled,
    /// so to within about a second). 0 in results recorded before, when each claim was unprepared right after its
    /// prepare.
    #[serde(default)]
    pub status_written_ms: u64,
}

/// One prepare as its driver logged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InDriver {
    /// From the call to the answer, µs.
    total_us: u64,
    /// The host side under the lock, µs.
    host_us: u64,
    read_ahead: bool,
}

/// What the drivers' JSON logs say of the prepares of `claims` (`namespace/name`).
fn prepared_in_driver(logs: &str, claims: &BTreeSet<String>) -> Vec<InDriver> {
    logs.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|entry| entry["fields"]["message"] == "prepared")
        .filter(|entry| {
            entry["fields"]["claim"]
                .as_str()
                .is_some_and(|claim| claims.contains(claim))
        })
        .filter_map(|entry| {
            let fields = &entry["fields"];
            Some(InDriver {
                total_us: fields["total_us"].as_u64()?,
                host_us: fields["host_us"].as_u64().unwrap_or(0),
                read_ahead: fields["read_ahead"].as_bool().unwrap_or(false),
            })
        })
        .collect()
}

/// The p50 and p99 of `samples` (nearest rank, as the `prepare_latency` example counts); zeros for none.
fn percentiles(mut samples: Vec<u64>) -> (u64, u64) {
    samples.sort_unstable();
    let at = |fraction: f64| {
        let last = samples.len().saturating_sub(1);
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let position = (last as f64 * fraction).round() as usize;
        samples.get(position).copied().unwrap_or(0)
    };
    (at(0.5), at(0.99))
}

impl DraBench {
    /// The lowest and highest prepare p99 of the rounds.
    #[must_use]
    pub fn prepare_p99_spread(&self) -> Option<(u64, u64)> {
        let p99s = self.prepare_rounds.iter().map(|round| round.prepare_p99_us);
        Some((p99s.clone().min()?, p99s.max()?))
    }

    /// Inside the driver: the medians over the rounds of p50, p99 and the host side's p99, and the claims read
    /// ahead of all prepared;
    /// None for results recorded before the driver's time was read.
    #[must_use]
    pub fn in_driver(&self) -> Option<(u64, u64, u64, u32, u32)> {
        let rounds = &self.prepare_rounds;
        if rounds.is_empty() || rounds.iter().any(|round| round.in_driver_p99_us == 0) {
            return None;
        }
        let middle = |figure: fn(&PrepareRound) -> u64| median(rounds.iter().map(figure).collect());
        Some((
            middle(|round| round.in_driver_p50_us),
            middle(|round| round.in_driver_p99_us),
            middle(|round| round.host_p99_us),
            rounds.iter().map(|round| round.read_ahead).sum(),
            rounds.iter().map(|round| round.claims).sum(),
        ))
    }

    /// The median and the longest, over the rounds, of the time until every prepared claim carried its device
    /// status; `None` for results recorded before it was measured.
    #[must_use]
    pub fn status_written_ms(&self) -> Option<(u64, u64)> {
        let times: Vec<u64> = self
            .prepare_rounds
            .iter()
            .map(|round| round.status_written_ms)
            .collect();
        if times.is_empty() || times.contains(&0) {
            return None;
        }
        Some((median(times.clone()), times.into_iter().max().unwrap_or(0)))
    }
}

/// The median of `values` (the lower middle of an even count); 0 for none.
fn median(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0)
}

/// A directory on tmpfs (`/dev/shm`, else the system's temporary directory), removed when dropped.
struct VolatileDir(PathBuf);

impl VolatileDir {
    fn new() -> anyhow::Result<Self> {
        let shm = Path::new("/dev/shm");
        let parent = if shm.is_dir() {
            shm.to_owned()
        } else {
            std::env::temp_dir()
        };
        let dir = parent.join(format!("dra-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for VolatileDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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
    // As on a node, the CDI specs, MPS directories and the checkpoint live on tmpfs (`/var/run/cdi`,
    // `/run/nvidia/mps`, `/run/nvidia/dra-driver`), the kubelet's root on disk.
    let volatile = VolatileDir::new()?;

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
                    &volatile.0.join(node).join("cdi").display().to_string(),
                    "--mps-root",
                    &volatile.0.join(node).join("mps").display().to_string(),
                    "--state-dir",
                    &volatile.0.join(node).join("state").display().to_string(),
                    "--dev-root",
                    &path("dev"),
                ])
                .envs(env.iter().map(|(key, value)| (key, value)))
                .env("NODE_NAME", node)
                .env("DRA_GPUS", "all")
                .env("DRA_SHARED_GPUS", "all")
                // Each prepare's `prepared` line (logged at the default level in a cluster too) tells its time
                // inside the driver; JSON to be read back.
                .env("RUST_LOG", "warn,dra_driver::claims=info")
                .env("LOG_FORMAT", "json")
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
            prepared = Some(prepare_latency(root, &kubectl, &work, &nodes)?);
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
    let rounds = prepared.context("the prepare latency was not measured")?;
    let middle = |figure: fn(&PrepareRound) -> u64| median(rounds.iter().map(figure).collect());
    Ok(DraBench {
        commit: environment.commit.clone(),
        date: environment.date.clone(),
        gpus: NODES * GPUS_PER_NODE,
        nodes: NODES,
        runs,
        prepared_claims: rounds.first().map_or(0, |round| round.claims),
        prepare_p50_us: middle(|round| round.prepare_p50_us),
        prepare_p99_us: middle(|round| round.prepare_p99_us),
        unprepare_p50_us: middle(|round| round.unprepare_p50_us),
        unprepare_p99_us: middle(|round| round.unprepare_p99_us),
        prepare_rounds: rounds,
    })
}

/// Plays the kubelet for [`PREPARE_ROUNDS`] samples of the allocated claims, each claim of its own round: each to the
/// driver of the node it was allocated on.
fn prepare_latency(
    root: &Path,
    kubectl: &dyn Fn(&[&str]) -> anyhow::Result<String>,
    work: &Path,
    nodes: &[String],
) -> anyhow::Result<Vec<PrepareRound>> {
    let claims = claims_of_the_pods(kubectl)?;
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
        .take(PREPARE_SAMPLE * PREPARE_ROUNDS)
        .collect();
    let mut rounds = Vec::new();
    for (round, sample) in targets.chunks(PREPARE_SAMPLE).enumerate() {
        say(format!(
            "DRA: NodePrepareResources and NodeUnprepareResources of {} claims, round {} of {PREPARE_ROUNDS}",
            sample.len(),
            round + 1
        ));
        let file = work.join(format!("claims-{round}.json"));
        std::fs::write(&file, serde_json::to_vec(sample)?)?;
        let call = |call: &str| -> anyhow::Result<(u64, u64)> {
            let line = super::example_json(
                root,
                "prepare_latency",
                &["--claims", &file.display().to_string(), "--call", call],
            )?;
            let measured: Value = serde_json::from_str(&line)?;
            let figure = |name: &str| measured[name].as_u64().unwrap_or(0);
            Ok((figure("p50_us"), figure("p99_us")))
        };
        // As the kubelet does for pods that start, run, and end: every claim is prepared, its device status
        // reaches the API server (the driver writes it once the calls pause), then every claim is unprepared.
        let (prepare_p50_us, prepare_p99_us) = call("prepare")?;
        let prepared_at = Instant::now();
        let uids: BTreeSet<&str> = sample
            .iter()
            .filter_map(|claim| claim["uid"].as_str())
            .collect();
        wait(TIMEOUT, "every prepared claim's device status", || {
            let written = count(&claims_of_the_pods(kubectl)?, |claim| {
                claim["metadata"]["uid"]
                    .as_str()
                    .is_some_and(|uid| uids.contains(uid))
                    && claim["status"]["devices"][0]["driver"] == "gpu.nvidia.com"
            });
            Ok(written == uids.len())
        })?;
        let status_written_ms =
            u64::try_from(prepared_at.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (unprepare_p50_us, unprepare_p99_us) = call("unprepare")?;
        let keys: BTreeSet<String> = sample
            .iter()
            .filter_map(|claim| {
                Some(format!(
                    "{}/{}",
                    claim["namespace"].as_str()?,
                    claim["name"].as_str()?
                ))
            })
            .collect();
        let mut in_driver = Vec::new();
        for node in nodes {
            let logs = std::fs::read_to_string(work.join(node).join("driver.log"))?;
            in_driver.extend(prepared_in_driver(&logs, &keys));
        }
        let read_ahead = in_driver
            .iter()
            .filter(|prepare| prepare.read_ahead)
            .count();
        let (in_driver_p50_us, in_driver_p99_us) =
            percentiles(in_driver.iter().map(|prepare| prepare.total_us).collect());
        let (_, host_p99_us) =
            percentiles(in_driver.iter().map(|prepare| prepare.host_us).collect());
        rounds.push(PrepareRound {
            claims: u32::try_from(sample.len()).unwrap_or(u32::MAX),
            prepare_p50_us,
            prepare_p99_us,
            unprepare_p50_us,
            unprepare_p99_us,
            status_written_ms,
            in_driver_p50_us,
            in_driver_p99_us,
            host_p99_us,
            read_ahead: u32::try_from(read_ahead).unwrap_or(u32::MAX),
        });
    }
    Ok(rounds)
}

/// The ResourceClaims of the benchmark's pods (generated in their namespace), as a JSON list.
fn claims_of_the_pods(
    kubectl: &dyn Fn(&[&str]) -> anyhow::Result<String>,
) -> anyhow::Result<Value> {
    let listed = kubectl(&["get", "resourceclaims", "-n", "default", "-o", "json"])?;
    Ok(serde_json::from_str(&listed)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn round(p99: u64) -> PrepareRound {
        PrepareRound {
            claims: 300,
            prepare_p50_us: 1000,
            prepare_p99_us: p99,
            unprepare_p50_us: 900,
            unprepare_p99_us: p99,
            in_driver_p50_us: 300,
            in_driver_p99_us: 900,
            host_p99_us: 500,
            read_ahead: 300,
            status_written_ms: p99 / 10,
        }
    }

    #[test]
    fn the_time_inside_the_driver_is_read_from_its_prepared_lines_of_the_rounds_claims() {
        let logs = [
            r#"{"timestamp":"t","level":"INFO","fields":{"message":"prepared","claim":"default/a","devices":1,"read_ahead":true,"read_us":9,"host_us":200,"total_us":420},"target":"dra_driver::claims"}"#,
            r#"{"timestamp":"t","level":"INFO","fields":{"message":"prepared","claim":"default/b","devices":1,"read_ahead":false,"read_us":3000,"total_us":3600},"target":"dra_driver::claims"}"#,
            r#"{"timestamp":"t","level":"INFO","fields":{"message":"prepared","claim":"default/other-round","devices":1,"read_ahead":true,"read_us":9,"total_us":1},"target":"dra_driver::claims"}"#,
            r#"{"timestamp":"t","level":"INFO","fields":{"message":"unprepared","claim":"uid-a"},"target":"dra_driver::claims"}"#,
            "not json: a panic's message",
        ]
        .join("\n");
        let claims = ["default/a".to_owned(), "default/b".to_owned()].into();
        assert_eq!(
            prepared_in_driver(&logs, &claims),
            vec![
                InDriver {
                    total_us: 420,
                    host_us: 200,
                    read_ahead: true
                },
                InDriver {
                    total_us: 3600,
                    host_us: 0,
                    read_ahead: false
                }
            ]
        );
        assert_eq!(percentiles(vec![3600, 420]), (3600, 3600));
        assert_eq!(percentiles((1..=100).collect()), (51, 99));
        assert_eq!(percentiles(Vec::new()), (0, 0));
    }

    #[test]
    fn rounds_are_reported_by_their_median_and_the_spread_of_their_p99() {
        assert_eq!(median(vec![6791, 4656, 4448]), 4656);
        assert_eq!(median(vec![4, 1]), 1, "the lower middle of an even count");
        assert_eq!(median(Vec::new()), 0);
        let bench = DraBench {
            commit: "c".into(),
            date: "d".into(),
            gpus: 100,
            nodes: 25,
            runs: Vec::new(),
            prepared_claims: 300,
            prepare_p50_us: 1000,
            prepare_p99_us: 4656,
            unprepare_p50_us: 900,
            unprepare_p99_us: 4656,
            prepare_rounds: vec![round(4656), round(6791), round(4448)],
        };
        assert_eq!(bench.prepare_p99_spread(), Some((4448, 6791)));
        assert_eq!(bench.in_driver(), Some((300, 900, 500, 900, 900)));
        assert_eq!(bench.status_written_ms(), Some((465, 679)));
        let before_rounds: DraBench = serde_json::from_value(serde_json::json!({
            "commit": "c", "date": "d", "gpus": 100, "nodes": 25, "runs": [], "prepared_claims": 300,
            "prepare_p50_us": 1, "prepare_p99_us": 2, "unprepare_p50_us": 1, "unprepare_p99_us": 2
        }))
        .unwrap();
        assert_eq!(before_rounds.prepare_p99_spread(), None);
        assert_eq!(before_rounds.in_driver(), None);
        assert_eq!(before_rounds.status_written_ms(), None);
    }
}

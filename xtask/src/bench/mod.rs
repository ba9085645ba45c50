//! `cargo xtask bench`: the operator's footprint and reaction times on the local cluster with N simulated GPU nodes
//! (DESIGN.md, Performance), and the device plugin's Allocate latency. Writes `bench.md`, `bench.json` and
//! `bench.png` to the output directory and prints the table.
//!
//! For each node count: a fresh cluster, N nodes in two OS pools, `helm upgrade --install --wait` of the chart, the
//! operator (release build) started as a workload with the chart's ServiceAccount, then: time to ready, a
//! `kubectl patch` of `dcgmExporter.version` to the DaemonSet and to ready again, RSS and CPU after 30 s at rest,
//! and the operator's write requests over 60 s at rest from the API server's audit log.

mod plot;
mod report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::cluster::{self, AddNodes, Workload};
use crate::command;
use crate::install::{self, NAMESPACE};
use report::{Allocate, Results, Row};

const POLL: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_secs(300);
const PATCHED_VERSION: &str = "bench-2";

/// `cargo xtask bench` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Node counts to measure, comma-separated; each gets a fresh cluster.
    #[arg(long, default_value = "10,100")]
    nodes: String,
    /// Where bench.md, bench.json and bench.png go (default: `bench` in the cargo target directory).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Allocate calls for the device plugin's latency.
    #[arg(long, default_value_t = 1000)]
    calls: u32,
}

fn say(message: impl AsRef<str>) {
    eprintln!("bench: {}", message.as_ref());
}

pub fn run(root: &Path, args: &Args) -> anyhow::Result<()> {
    let counts = report::parse_node_counts(&args.nodes)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| command::target_dir(root).join("bench"));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;

    say("building the operator and the Allocate latency example (release)");
    command::release_build(
        root,
        &[
            "--package",
            "operator",
            "--bin",
            "gpu-operator",
            "--package",
            "device-plugin",
            "--example",
            "allocate_latency",
        ]
        .map(String::from),
    )?;
    let operator = command::target_dir(root).join("release/gpu-operator");

    say(format!("Allocate latency, {} calls", args.calls));
    let allocate = allocate_latency(root, args.calls)?;
    say(format!(
        "Allocate p50 {} µs, p99 {} µs",
        allocate.p50_us, allocate.p99_us
    ));

    let mut results = Results {
        rows: Vec::new(),
        allocate: Some(allocate),
    };
    let mut outcome = Ok(());
    for nodes in counts {
        match measure(root, &operator, nodes) {
            Ok(row) => {
                say(format!("{nodes} nodes: {row:?}"));
                results.rows.push(row);
                write_outputs(&out, &results)?;
            }
            Err(error) => {
                outcome = Err(error.context(format!("the run with {nodes} nodes failed")));
                break;
            }
        }
    }
    say("stopping the cluster");
    cluster::down()?;
    write_outputs(&out, &results)?;
    print!("{}", report::render_table(&results));
    println!(
        "\nwritten: {}, {}, {}",
        out.join("bench.md").display(),
        out.join("bench.json").display(),
        out.join("bench.png").display()
    );
    outcome
}

fn write_outputs(out: &Path, results: &Results) -> anyhow::Result<()> {
    std::fs::write(out.join("bench.md"), report::render_table(results))?;
    std::fs::write(
        out.join("bench.json"),
        serde_json::to_string_pretty(results)?,
    )?;
    if !results.rows.is_empty() {
        plot::draw(&results.rows, &out.join("bench.png"))?;
    }
    Ok(())
}

fn allocate_latency(root: &Path, calls: u32) -> anyhow::Result<Allocate> {
    let calls = calls.to_string();
    // Built by `run` with the release environment; `cargo run` here would rebuild it without.
    let output = std::process::Command::new(
        command::target_dir(root).join("release/examples/allocate_latency"),
    )
    .args(["--calls", &calls])
    .current_dir(root)
    .output()
    .context("cannot run the allocate_latency example")?;
    anyhow::ensure!(
        output.status.success(),
        "the allocate_latency example failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|line| line.starts_with('{'))
        .context("the allocate_latency example printed no JSON")?;
    serde_json::from_str(line).with_context(|| format!("cannot parse {line:?}"))
}

/// One node count, on a fresh cluster.
fn measure(root: &Path, operator: &Path, nodes: u32) -> anyhow::Result<Row> {
    say(format!("{nodes} nodes: a fresh cluster"));
    cluster::down()?;
    let info = cluster::ensure_up()?;
    let env = cluster::env_vars(&info);
    let ubuntu = nodes / 2;
    let pools = [
        AddNodes {
            count: ubuntu,
            gpus: "a100-40gb:4".parse().map_err(anyhow::Error::msg)?,
            os: "ubuntu22.04".parse().map_err(anyhow::Error::msg)?,
            prefix: "gpu-a100".into(),
        },
        AddNodes {
            count: nodes - ubuntu,
            gpus: "h100-80gb:8".parse().map_err(anyhow::Error::msg)?,
            os: "rhel9.4".parse().map_err(anyhow::Error::msg)?,
            prefix: "gpu-h100".into(),
        },
    ];
    for pool in &pools {
        say(format!(
            "adding {} {} nodes ({})",
            pool.count, pool.os.id, pool.prefix
        ));
        cluster::add_nodes(pool)?;
    }
    say("helm upgrade --install --wait");
    install::install_chart(root, &env, "300s")?;

    say("starting the operator");
    let started = Instant::now();
    let identity = format!("bench-{nodes}-{}", std::process::id());
    let Workload { pid, log } = install::start_operator(&info, operator, &identity)?;
    wait_for(&env, "the ClusterPolicy to be ready", &log, |policy| {
        policy.state == "ready"
    })?;
    let ready_s = started.elapsed().as_secs_f64();
    say(format!("ready after {ready_s:.2} s"));

    say(format!(
        "patching dcgmExporter.version to {PATCHED_VERSION}"
    ));
    let patched_at = Instant::now();
    let generation: i64 = command::output(
        &env,
        "kubectl",
        &[
            "patch",
            "clusterpolicy/cluster-policy",
            "--type",
            "merge",
            "-p",
            &format!(r#"{{"spec":{{"dcgmExporter":{{"version":"{PATCHED_VERSION}"}}}}}}"#),
            "-o",
            "jsonpath={.metadata.generation}",
        ],
    )?
    .trim()
    .parse()
    .context("kubectl patch printed no generation")?;
    let suffix = format!(":{PATCHED_VERSION}");
    poll(&log, "the dcgm-exporter DaemonSet's new image", || {
        let image = command::output(
            &env,
            "kubectl",
            &[
                "get",
                "daemonset",
                "nvidia-dcgm-exporter",
                "-n",
                NAMESPACE,
                "-o",
                "jsonpath={.spec.template.spec.containers[0].image}",
            ],
        )
        .unwrap_or_default();
        image.trim().ends_with(&suffix)
    })?;
    let patch_to_daemonset_s = patched_at.elapsed().as_secs_f64();
    wait_for(
        &env,
        "the ClusterPolicy to be ready again",
        &log,
        |policy| policy.state == "ready" && policy.observed_generation >= generation,
    )?;
    let patch_to_ready_s = patched_at.elapsed().as_secs_f64();
    say(format!(
        "DaemonSet after {patch_to_daemonset_s:.2} s, ready after {patch_to_ready_s:.2} s"
    ));

    say("30 s at rest");
    std::thread::sleep(Duration::from_secs(30));
    let rss_mib = read_rss_kib(pid)? as f64 / 1024.0;
    let ticks = clock_ticks_per_second();
    let cpu_before = read_cpu_ticks(pid)?;
    let cpu_s = cpu_before as f64 / ticks;
    say(format!(
        "RSS {rss_mib:.1} MiB, CPU {cpu_s:.2} s; counting writes over 60 s at rest"
    ));
    let audit_log = info.state_dir.join("logs/audit.log");
    let offset = std::fs::metadata(&audit_log)
        .with_context(|| format!("cannot read {}", audit_log.display()))?
        .len();
    std::thread::sleep(Duration::from_secs(60));
    let cpu_rest_s = (read_cpu_ticks(pid)? - cpu_before) as f64 / ticks;
    let bytes = std::fs::read(&audit_log)?;
    let window = String::from_utf8_lossy(bytes.get(offset as usize..).unwrap_or_default());
    // A line cut at the offset is skipped as not JSON.
    let writes = report::count_writes(&window, report::OPERATOR_USER);
    Ok(Row {
        nodes,
        ready_s,
        patch_to_daemonset_s,
        patch_to_ready_s,
        rss_mib,
        cpu_s,
        cpu_rest_s,
        writes_at_rest: writes.other,
        lease_writes_at_rest: writes.leases,
    })
}

fn read_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context("the operator is not running")?;
    report::vm_rss_kib(&status).context("no VmRSS in /proc/<pid>/status")
}

fn read_cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .context("the operator is not running")?;
    report::cpu_ticks(&stat).context("cannot parse /proc/<pid>/stat")
}

/// CLK_TCK from `getconf`; 100 (Linux's value everywhere in practice) when that fails.
fn clock_ticks_per_second() -> f64 {
    command::output(&[], "getconf", &["CLK_TCK"])
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The ClusterPolicy's fields the benchmark waits on.
#[derive(Debug, Default)]
struct PolicyStatus {
    state: String,
    observed_generation: i64,
}

fn policy_status(env: &[(String, String)]) -> PolicyStatus {
    let text = command::output(
        env,
        "kubectl",
        &[
            "get",
            "clusterpolicy",
            "cluster-policy",
            "-o",
            "jsonpath={.status.state} {.status.observedGeneration}",
        ],
    )
    .unwrap_or_default();
    let mut words = text.split_whitespace();
    PolicyStatus {
        state: words.next().unwrap_or_default().to_owned(),
        observed_generation: words.next().and_then(|g| g.parse().ok()).unwrap_or(0),
    }
}

fn wait_for(
    env: &[(String, String)],
    what: &str,
    log: &Path,
    condition: impl Fn(&PolicyStatus) -> bool,
) -> anyhow::Result<()> {
    poll(log, what, || condition(&policy_status(env)))
}

/// Polls `done` every 100 ms, up to 300 s.
fn poll(log: &Path, what: &str, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < TIMEOUT {
        if done() {
            return Ok(());
        }
        std::thread::sleep(POLL);
    }
    anyhow::bail!(
        "timed out after {TIMEOUT:?} waiting for {what}; the operator's log: {}",
        log.display()
    )
}

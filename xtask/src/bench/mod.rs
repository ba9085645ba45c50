//! `cargo xtask bench`: our operator and NVIDIA's, one after the other on the same local cluster with N simulated
//! GPU nodes, measured alike (DESIGN.md, Performance): time to ready, patch propagation, RSS and CPU, and API
//! requests by verb and resource from the audit log; beside them the floor, our DaemonSets and node labels applied
//! with no operator (`floor.rs`), which is as fast as the cluster itself goes; plus the device plugin's Allocate latency, the GPU memory
//! watchdog, fractional GPUs through DRA and a driver upgrade at the largest node count (ours only), and MIG on
//! demand's packing under the scheduler's first fit, our device order against NVIDIA's (`packing.rs`, no cluster).
//! Writes `bench.md`, `bench.json` and PNG charts to the output directory (`docs/bench` by default).

mod contender;
mod dra;
mod floor;
mod node_side;
mod observe;
mod packing;
mod plot;
mod report;
mod settle;
mod upgrade;
mod watchdog;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use contender::{Contender, Operator};
use harness::cluster::audit::{self, Requests};
use harness::cluster::{self, AddNodes, ClusterInfo, Connection};
use harness::command;
use harness::proc_stats;
use k8s_openapi::jiff::Timestamp;
use observe::{Observer, Snapshot};
use report::{Allocate, Environment, Reconciles, Results, Row};

/// How long one wait may take; the 1000-node rollouts take minutes on two cores.
const TIMEOUT: Duration = Duration::from_secs(900);
/// The patch: the container toolkit's version, an operand both operators run NVIDIA's image for (ours runs its own
/// images in place of NVIDIA's device plugin, exporter, GFD, MIG manager and validator, whose versions it ignores).
const PATCHED_VERSION: &str = "bench-2";
const PATCHED_DAEMONSET: &str = "nvidia-container-toolkit-daemonset";
/// Time for a started operator to sync its caches and take the leader lease before the ClusterPolicy exists.
const SETTLE: Duration = Duration::from_secs(5);
const REST_BEFORE_RSS: Duration = Duration::from_secs(30);
const REST_WINDOW: Duration = Duration::from_secs(60);

/// `cargo xtask bench` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Node counts to measure, comma-separated; each gets a fresh cluster.
    #[arg(long, default_value = "10,100,1000")]
    nodes: String,
    /// Measure our operator only (NVIDIA's is not built).
    #[arg(long)]
    ours_only: bool,
    /// Where bench.md, bench.json and the charts go (default: docs/bench).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Allocate calls for the device plugin's latency.
    #[arg(long, default_value_t = 1000)]
    calls: u32,
    /// Measure only the GPU memory watchdog (on a fresh cluster), keeping the other results of bench.json.
    #[arg(long)]
    watchdog_only: bool,
    /// Measure only fractional GPUs through DRA (on a fresh cluster), keeping the other results of bench.json.
    #[arg(long)]
    dra_only: bool,
    /// Measure only a driver upgrade at the largest node count (on a fresh cluster), keeping the other results of
    /// bench.json.
    #[arg(long)]
    upgrade_only: bool,
    /// Measure only the operators and the floor at each node count, keeping the other results of bench.json; its
    /// rows of the same operator and node count are replaced.
    #[arg(long)]
    operators_only: bool,
    /// Runs of the operators and the floor per node count, each on a fresh cluster; the report gives their medians
    /// and spread, and in every second run the floor goes first.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Measure only the node side (every role of a GPU node on one real kubelet's node, on a fresh cluster),
    /// keeping the other results of bench.json.
    #[arg(long)]
    node_side_only: bool,
    /// Replay only MIG on demand's packing, our device order against NVIDIA's (seconds, no cluster), keeping the
    /// other results of bench.json.
    #[arg(long)]
    packing_only: bool,
    /// Measure nothing: write bench.md and the charts again from bench.json (after a change to the report).
    #[arg(long)]
    report_only: bool,
}

fn say(message: impl AsRef<str>) {
    cluster::progress::say(format!("bench: {}", message.as_ref()));
}

pub fn run(root: &Path, args: &Args) -> anyhow::Result<()> {
    let counts = report::parse_node_counts(&args.nodes)?;
    let out = args.out.clone().unwrap_or_else(|| root.join("docs/bench"));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    if args.report_only {
        let results: Results = serde_json::from_slice(
            &std::fs::read(out.join("bench.json")).context("--report-only reads bench.json")?,
        )?;
        write_outputs(&out, &results)?;
        print!("{}", report::render(&results));
        return Ok(());
    }
    if args.packing_only {
        let earlier = std::fs::read(out.join("bench.json")).context(
            "--packing-only keeps the other results of bench.json, which does not exist yet",
        )?;
        let mut results: Results = serde_json::from_slice(&earlier)?;
        results.packing = Some(packing::measure(&environment(root, args.ours_only)?)?);
        write_outputs(&out, &results)?;
        print!("{}", report::render(&results));
        return Ok(());
    }

    // The node side alone needs only the node's binaries: with the size-tuned release profile every binary is a
    // link of several minutes on two cores.
    let node_side_alone =
        args.node_side_only && !(args.watchdog_only || args.dra_only || args.upgrade_only);
    let mut targets = vec![
        "--package",
        "device-plugin",
        "--bin",
        "gpu-device-plugin",
        "--package",
        "node-agent",
        "--bin",
        "gpu-node-agent",
        "--package",
        "dra-driver",
        "--bin",
        "gpu-dra-driver",
    ];
    if node_side_alone {
        say("building the node agent, the device plugin and the DRA driver (release)");
    } else {
        say(
            "building our operator, the node agent, the device plugin, the DRA driver and the benchmarks' examples \
             (release)",
        );
        targets.extend([
            "--package",
            "operator",
            "--bin",
            "gpu-operator",
            "--package",
            "device-plugin",
            "--example",
            "allocate_latency",
            "--package",
            "node-agent",
            "--example",
            "watchdog_load",
            "--package",
            "dra-driver",
            "--example",
            "prepare_latency",
        ]);
    }
    command::release_build(
        root,
        &targets.into_iter().map(String::from).collect::<Vec<_>>(),
    )?;
    // The driver upgrade runs at the largest node count.
    let upgrade_nodes = counts.iter().copied().max().unwrap_or_default();
    if args.watchdog_only || args.dra_only || args.upgrade_only || args.node_side_only {
        let earlier = std::fs::read(out.join("bench.json")).context(
            "--watchdog-only, --dra-only, --upgrade-only and --node-side-only keep the other results of bench.json, \
             which does not exist yet",
        )?;
        let mut results: Results = serde_json::from_slice(&earlier)?;
        let environment = environment(root, args.ours_only)?;
        if args.watchdog_only {
            cluster::down()?;
            let info = cluster::ensure_up()?;
            let measured = watchdog::measure(root, &info, &environment);
            cluster::down()?;
            results.watchdog = Some(measured?);
        }
        if args.dra_only {
            cluster::down()?;
            let info = cluster::ensure_up()?;
            let measured = dra::measure(root, &info, &environment);
            cluster::down()?;
            results.dra = Some(measured?);
        }
        if args.node_side_only {
            results.node_side = Some(node_side::measure_on_fresh_cluster(root, &environment)?);
        }
        if args.upgrade_only {
            let info = fresh_cluster(upgrade_nodes)?;
            let measured = upgrade::measure(root, &info, &environment, &ours(root), upgrade_nodes);
            cluster::down()?;
            results.upgrade = Some(measured?);
        }
        write_outputs(&out, &results)?;
        print!("{}", report::render(&results));
        return Ok(());
    }
    let mut contenders = vec![ours(root)];
    if !args.ours_only {
        say(format!(
            "building NVIDIA's gpu-operator {} ({}) from its Go module",
            cluster::NVIDIA_GPU_OPERATOR_RELEASE,
            cluster::NVIDIA_GPU_OPERATOR
        ));
        contenders.push(Contender::nvidia(cluster::nvidia_gpu_operator()?));
    }

    let mut results = if args.operators_only {
        let earlier = std::fs::read(out.join("bench.json")).context(
            "--operators-only keeps the other results of bench.json, which does not exist yet",
        )?;
        Results {
            environment: environment(root, args.ours_only)?,
            ..serde_json::from_slice(&earlier)?
        }
    } else {
        say(format!("Allocate latency, {} calls", args.calls));
        let allocate = allocate_latency(root, args.calls)?;
        say(format!(
            "Allocate p50 {} µs, p99 {} µs",
            allocate.p50_us, allocate.p99_us
        ));
        Results {
            environment: environment(root, args.ours_only)?,
            rows: Vec::new(),
            allocate: Some(allocate),
            watchdog: None,
            dra: None,
            upgrade: None,
            packing: None,
            node_side: None,
        }
    };
    let mut outcome = Ok(());
    let measured_operators: Vec<Operator> = contenders
        .iter()
        .map(|contender| contender.operator)
        .chain([Operator::Floor])
        .collect();
    'counts: for nodes in counts {
        // A count measured anew replaces its earlier runs whole: runs of two commits are not one median.
        results.rows.retain(|earlier| {
            earlier.nodes != nodes || !measured_operators.contains(&earlier.operator)
        });
        // What our operator's last run rendered and labelled, for a run where the floor goes first.
        let mut captured: Option<floor::Captured> = None;
        for run in 1..=args.runs {
            let info = match fresh_cluster(nodes) {
                Ok(info) => info,
                Err(error) => {
                    outcome = Err(error.context(format!("preparing {nodes} nodes failed")));
                    break 'counts;
                }
            };
            // The ClusterPolicy both operators get: NVIDIA's chart's when NVIDIA's runs, else ours.
            let env = cluster::env_vars(&info);
            let policy = info.state_dir.join("bench-clusterpolicy.yaml");
            let rendered = contenders
                .last()
                .context("no operator to measure")
                .and_then(|last| last.render_policy(&env))
                .and_then(|yaml| Ok(std::fs::write(&policy, yaml)?));
            if let Err(error) = rendered {
                outcome = Err(error.context("rendering the ClusterPolicy failed"));
                break 'counts;
            }
            let floor_first = report::floor_first(run) && captured.is_some();
            let mut steps: Vec<Step> = Vec::new();
            if floor_first {
                steps.push(Step::Floor);
            }
            steps.extend(contenders.iter().map(Step::Operator));
            for step in steps {
                let label = format!("{nodes} nodes, run {run}, {}", step.label());
                let measured = match step {
                    Step::Floor => captured
                        .as_ref()
                        .context("no capture of our operator's run")
                        .and_then(|captured| {
                            measure_floor(root, &info, &ours(root), captured, nodes)
                        })
                        .map(|row| vec![row]),
                    Step::Operator(contender) => measure(root, &info, contender, &policy, nodes)
                        .and_then(|(row, capture)| {
                            let mut rows = vec![row];
                            if let Some(capture) = capture {
                                if !floor_first {
                                    rows.push(measure_floor(
                                        root, &info, contender, &capture, nodes,
                                    )?);
                                }
                                captured = Some(capture);
                            }
                            Ok(rows)
                        }),
                };
                match measured {
                    Ok(rows) => {
                        for row in rows {
                            say(format!(
                                "{} nodes, run {run}, {}: ready {:.2} s, patch→ready {:.2} s, steady RSS {:.1} MiB, \
                                 {} requests/min at rest",
                                row.nodes,
                                row.operator.label(),
                                row.ready_s,
                                row.patch_to_ready_s,
                                row.steady_rss_mib,
                                row.at_rest.total()
                            ));
                            results.rows.push(Row { run, ..row });
                        }
                        write_outputs(&out, &results)?;
                    }
                    Err(error) => {
                        outcome = Err(error.context(format!("the run with {label} failed")));
                        break 'counts;
                    }
                }
            }
        }
    }
    // Everything but the operators, unless only they are measured.
    let rest = !args.operators_only;
    if outcome.is_ok() && rest {
        match packing::measure(&results.environment) {
            Ok(measured) => results.packing = Some(measured),
            Err(error) => outcome = Err(error.context("replaying MIG packing failed")),
        }
    }
    if outcome.is_ok() && rest {
        let info = cluster::ensure_up()?;
        match watchdog::measure(root, &info, &results.environment) {
            Ok(usage) => results.watchdog = Some(usage),
            Err(error) => outcome = Err(error.context("measuring the watchdog failed")),
        }
    }
    if outcome.is_ok() && rest {
        cluster::down()?;
        let info = cluster::ensure_up()?;
        match dra::measure(root, &info, &results.environment) {
            Ok(measured) => results.dra = Some(measured),
            Err(error) => {
                outcome = Err(error.context("measuring fractional GPUs through DRA failed"))
            }
        }
    }
    if outcome.is_ok() && rest {
        match node_side::measure_on_fresh_cluster(root, &results.environment) {
            Ok(measured) => results.node_side = Some(measured),
            Err(error) => outcome = Err(error.context("measuring the node side failed")),
        }
    }
    if outcome.is_ok() && rest {
        let measured = fresh_cluster(upgrade_nodes).and_then(|info| {
            upgrade::measure(
                root,
                &info,
                &results.environment,
                &ours(root),
                upgrade_nodes,
            )
        });
        match measured {
            Ok(measured) => results.upgrade = Some(measured),
            Err(error) => outcome = Err(error.context("measuring a driver upgrade failed")),
        }
    }
    say("stopping the cluster");
    cluster::down()?;
    write_outputs(&out, &results)?;
    print!("{}", report::render(&results));
    println!("\nwritten to {}", out.display());
    outcome
}

/// Our operator, from the release build `run` makes.
fn ours(root: &Path) -> Contender {
    Contender::ours(root, command::target_dir(root).join("release/gpu-operator"))
}

fn environment(root: &Path, ours_only: bool) -> anyhow::Result<Environment> {
    let date = command::output(&[], "date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"])?;
    let commit = command::output(
        &[],
        "git",
        &[
            "-C",
            &root.display().to_string(),
            "rev-parse",
            "--short=12",
            "HEAD",
        ],
    )?;
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("cannot read /proc/meminfo")?;
    let memory_kib: f64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .context("no MemTotal in /proc/meminfo")?;
    Ok(Environment {
        date: date.trim().to_owned(),
        commit: commit.trim().to_owned(),
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        memory_gib: memory_kib / 1024.0 / 1024.0,
        kubernetes: cluster::KUBERNETES.to_owned(),
        nvidia: if ours_only {
            "NVIDIA's operator not run (--ours-only)".to_owned()
        } else {
            format!(
                "NVIDIA gpu-operator {} = Go module version {}",
                cluster::NVIDIA_GPU_OPERATOR_RELEASE,
                cluster::NVIDIA_GPU_OPERATOR
            )
        },
    })
}

fn write_outputs(out: &Path, results: &Results) -> anyhow::Result<()> {
    std::fs::write(out.join("bench.md"), report::render(results))?;
    std::fs::write(
        out.join("bench.json"),
        serde_json::to_string_pretty(results)? + "\n",
    )?;
    if !results.rows.is_empty() {
        plot::draw_all(&results.summaries(), out)?;
    }
    if let Some(upgrade) = &results.upgrade {
        plot::draw_upgrade(upgrade, out)?;
    }
    if let Some(packing) = &results.packing {
        plot::draw_packing(packing, out)?;
    }
    Ok(())
}

fn allocate_latency(root: &Path, calls: u32) -> anyhow::Result<Allocate> {
    let line = example_json(root, "allocate_latency", &["--calls", &calls.to_string()])?;
    serde_json::from_str(&line).with_context(|| format!("cannot parse {line:?}"))
}

/// Runs a release example built by `run` (`cargo run` here would rebuild it without the release environment) and
/// returns the JSON line it printed last.
fn example_json(root: &Path, example: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = std::process::Command::new(
        command::target_dir(root)
            .join("release/examples")
            .join(example),
    )
    .args(args)
    .current_dir(root)
    .output()
    .with_context(|| format!("cannot run the {example} example"))?;
    anyhow::ensure!(
        output.status.success(),
        "the {example} example failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .rev()
        .find(|line| line.starts_with('{'))
        .map(str::to_owned)
        .with_context(|| format!("the {example} example printed no JSON"))
}

/// A fresh cluster with `nodes` kwok nodes in two OS pools, once it has taken them in (`settle.rs`).
fn fresh_cluster(nodes: u32) -> anyhow::Result<ClusterInfo> {
    say(format!("{nodes} nodes: a fresh cluster"));
    cluster::down()?;
    let info = cluster::ensure_up()?;
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
    let settled = settle::until_nodes_taken_in(&info)?;
    say(format!(
        "the cluster took its nodes in after {:.0} s more",
        settled.as_secs_f64()
    ));
    Ok(info)
}

/// One operator on the prepared cluster, removed again at the end; with ours, what the floor repeats.
fn measure(
    root: &Path,
    info: &ClusterInfo,
    contender: &Contender,
    policy: &Path,
    nodes: u32,
) -> anyhow::Result<(Row, Option<floor::Captured>)> {
    let operator = contender.operator;
    let env = cluster::env_vars(info);
    say(format!("{}: helm install of its chart", operator.label()));
    contender.install(root, &env)?;
    let identity = format!("bench-{nodes}-{}", std::process::id());
    let metrics_addr = free_local_address()?;
    let workload = contender.start(info, &identity, metrics_addr)?;
    say(format!(
        "{} started (pid {}, log {})",
        operator.label(),
        workload.pid,
        workload.log.display()
    ));
    std::thread::sleep(SETTLE);
    let connection = Connection::open(&info.kubeconfig)?;
    let observer = Observer::new(&connection);
    let audit_log = info.audit_log();
    // Our run leaves what the floor's repeats: the labels it writes are what differs from now.
    let labels_before = match operator {
        Operator::Ours => Some(floor::node_labels(&connection)?),
        Operator::Nvidia | Operator::Floor => None,
    };

    say("creating the ClusterPolicy");
    let created = Instant::now();
    command::run(
        root,
        &env,
        "kubectl",
        &["create", "-f", &policy.display().to_string()],
    )?;
    let timeline = time_rollout(
        &observer,
        created,
        nodes,
        "the ClusterPolicy to be ready with every operand rolled out",
        |snapshot| snapshot.settled(nodes),
    )
    .with_context(|| format!("the operator's log: {}", workload.log.display()))?;
    let captured = labels_before
        .map(|before| floor::capture(&connection, &before))
        .transpose()?;

    say(format!("patching toolkit.version to {PATCHED_VERSION}"));
    let rollout_start = audit::Mark::now(&audit_log)?;
    let (to_daemonset, to_ready) = time_patch(
        &observer,
        &rollout_start,
        ("clusterpolicies", "cluster-policy"),
        || {
            command::run(
                root,
                &env,
                "kubectl",
                &[
                    "patch",
                    "clusterpolicy/cluster-policy",
                    "--type",
                    "merge",
                    "-p",
                    &format!(r#"{{"spec":{{"toolkit":{{"version":"{PATCHED_VERSION}"}}}}}}"#),
                ],
            )
        },
        |snapshot| snapshot.settled(nodes),
    )?;
    let rollout = rollout_start.requests(audit::OPERATOR_USER)?;

    say(format!(
        "{} s at rest, then {} s of counting requests",
        REST_BEFORE_RSS.as_secs(),
        REST_WINDOW.as_secs()
    ));
    std::thread::sleep(REST_BEFORE_RSS);
    let steady = proc_stats::read(workload.pid)?;
    let rest_start = audit::Mark::now(&audit_log)?;
    std::thread::sleep(REST_WINDOW);
    let end = proc_stats::read(workload.pid)?;
    let reconciles = reconciles(operator, metrics_addr)?;
    let at_rest = rest_start.requests(audit::OPERATOR_USER)?;

    say(format!("removing {}", operator.label()));
    contender.remove(root, info)?;
    let row = Row {
        peak_rss_mib: end.peak_rss_mib,
        steady_rss_mib: steady.rss_mib,
        cpu_s: end.cpu_s,
        cpu_rest_s: end.cpu_s - steady.cpu_s,
        at_rest,
        rollout,
        reconciles,
        ..timeline.row(operator, nodes, to_daemonset, to_ready)
    };
    Ok((row, captured))
}

/// One measurement of a run: an operator's, or the floor's.
enum Step<'a> {
    Operator(&'a Contender),
    Floor,
}

impl Step<'_> {
    fn label(&self) -> String {
        match self {
            Self::Operator(contender) => contender.operator.label(),
            Self::Floor => Operator::Floor.label(),
        }
    }
}

/// The floor at `nodes`: what our operator's run rendered and labelled, applied with no operator.
fn measure_floor(
    root: &Path,
    info: &ClusterInfo,
    ours: &Contender,
    captured: &floor::Captured,
    nodes: u32,
) -> anyhow::Result<Row> {
    let label = Operator::Floor.label();
    say(format!(
        "{label}: our chart and the labels our operator wrote, in place"
    ));
    captured.prepare(root, info, ours)?;
    let connection = Connection::open(&info.kubeconfig)?;
    let observer = Observer::new(&connection);
    say(format!(
        "{label}: creating {} DaemonSets and {} Services",
        captured.daemonsets.len(),
        captured.services.len()
    ));
    let created = Instant::now();
    captured.apply(&connection)?;
    let timeline = time_rollout(
        &observer,
        created,
        nodes,
        "every operand rolled out",
        |snapshot| snapshot.rolled_out(nodes),
    )?;
    say(format!(
        "{label}: the container toolkit's image to {PATCHED_VERSION}"
    ));
    let (to_daemonset, to_ready) = time_patch(
        &observer,
        &audit::Mark::now(&info.audit_log())?,
        ("daemonsets", PATCHED_DAEMONSET),
        || captured.retag(&connection, PATCHED_DAEMONSET, PATCHED_VERSION),
        |snapshot| snapshot.rolled_out(nodes),
    )?;
    say("removing the floor's DaemonSets and labels");
    captured.remove(root, info, ours)?;
    Ok(timeline.row(Operator::Floor, nodes, to_daemonset, to_ready))
}

/// Seconds from the start of a rollout to each of its milestones.
struct Timeline {
    /// The DaemonSets seen.
    daemonsets: Vec<String>,
    /// When each DaemonSet was rolled out for the last time.
    rolled_out_s: std::collections::BTreeMap<String, f64>,
    daemonsets_s: f64,
    labelled_s: f64,
    available_s: f64,
    ready_s: f64,
}

impl Timeline {
    /// The row of these times and the patch's, without the figures of an operator's process (the floor's row;
    /// an operator's adds them).
    fn row(
        self,
        operator: Operator,
        nodes: u32,
        to_daemonset: Duration,
        to_ready: Duration,
    ) -> Row {
        Row {
            operator,
            nodes,
            // Numbered by the caller, which knows the run.
            run: 1,
            daemonsets_s: self.daemonsets_s,
            labelled_s: self.labelled_s,
            available_s: self.available_s,
            ready_s: self.ready_s,
            patch_to_daemonset_s: to_daemonset.as_secs_f64(),
            patch_to_ready_s: to_ready.as_secs_f64(),
            peak_rss_mib: 0.0,
            steady_rss_mib: 0.0,
            cpu_s: 0.0,
            cpu_rest_s: 0.0,
            at_rest: Requests::default(),
            rollout: Requests::default(),
            reconciles: Reconciles::default(),
            daemonsets: self.daemonsets,
            rolled_out_s: self.rolled_out_s,
        }
    }
}

/// Polls from `since` until `settled`, noting when the DaemonSets appeared, the nodes were labelled and the pods
/// became available.
fn time_rollout(
    observer: &Observer,
    since: Instant,
    nodes: u32,
    what: &str,
    settled: impl Fn(&Snapshot) -> bool,
) -> anyhow::Result<Timeline> {
    let mut first_seen = std::collections::BTreeMap::new();
    let mut rolled_out = std::collections::BTreeMap::new();
    let (mut labelled, mut available) = (None, None);
    let ready = observer.until(
        since,
        TIMEOUT,
        what,
        |snapshot, at| {
            for name in snapshot.daemonsets.keys() {
                first_seen.entry(name.clone()).or_insert(at);
            }
            snapshot.note_rolled_out(&mut rolled_out, at);
            if snapshot.labelled(nodes) {
                labelled.get_or_insert(at);
            }
            if snapshot.available(nodes) {
                available.get_or_insert(at);
            }
        },
        settled,
    )?;
    let daemonsets_at = first_seen.values().max().copied().unwrap_or_default();
    say(format!(
        "{} DaemonSets after {:.2} s, ready after {:.2} s",
        first_seen.len(),
        daemonsets_at.as_secs_f64(),
        ready.as_secs_f64()
    ));
    Ok(Timeline {
        daemonsets: first_seen.into_keys().collect(),
        rolled_out_s: rolled_out
            .into_iter()
            .map(|(name, at)| (name, at.as_secs_f64()))
            .collect(),
        daemonsets_s: daemonsets_at.as_secs_f64(),
        labelled_s: labelled.unwrap_or(ready).as_secs_f64(),
        available_s: available.unwrap_or(ready).as_secs_f64(),
        ready_s: ready.as_secs_f64(),
    })
}

/// The patch, made by `patch`, timed: to the toolkit DaemonSet carrying the patched image, and to `settled` with it.
/// The first is the API server's own time from receiving the write of `cause` (the ClusterPolicy, or the floor's
/// DaemonSet) to completing the write that put the image in the DaemonSet, read from the audit log since `mark`:
/// a poll's period grows with the cluster (a snapshot of 25,000 pods takes over a second) and would be measured
/// instead of the operator.
fn time_patch(
    observer: &Observer,
    mark: &audit::Mark,
    cause: audit::Object,
    patch: impl FnOnce() -> anyhow::Result<()>,
    settled: impl Fn(&Snapshot) -> bool,
) -> anyhow::Result<(Duration, Duration)> {
    let patched = Instant::now();
    patch()?;
    let suffix = format!(":{PATCHED_VERSION}");
    let patched_image = |snapshot: &Snapshot| snapshot.runs_image(PATCHED_DAEMONSET, &suffix);
    let seen = observer.until(
        patched,
        TIMEOUT,
        "the container toolkit DaemonSet's new image",
        |_, _| {},
        patched_image,
    )?;
    let to_daemonset = audit::reaction(
        &mark.text()?,
        cause,
        ("daemonsets", PATCHED_DAEMONSET),
        Timestamp::now(),
    )
    .and_then(|reaction| Duration::try_from(reaction).ok())
    .with_context(|| {
        format!("the audit log has no write of {cause:?} followed by one of the toolkit DaemonSet")
    })?;
    let to_ready = observer.until(
        patched,
        TIMEOUT,
        "ready again with the new image rolled out",
        |_, _| {},
        |snapshot| patched_image(snapshot) && settled(snapshot),
    )?;
    say(format!(
        "DaemonSet after {:.3} s (audit log; seen by polling after {:.2} s), ready after {:.2} s",
        to_daemonset.as_secs_f64(),
        seen.as_secs_f64(),
        to_ready.as_secs_f64()
    ));
    Ok((to_daemonset, to_ready))
}

/// A loopback address with a port nothing listens on now.
fn free_local_address() -> anyhow::Result<SocketAddr> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free local port")?;
    Ok(listener.local_addr()?)
}

/// The operator's reconcile count and time so far, from its Prometheus metrics.
fn reconciles(operator: Operator, metrics_addr: SocketAddr) -> anyhow::Result<Reconciles> {
    let url = format!("http://{metrics_addr}/metrics");
    let text = ureq::get(&url)
        .call()
        .and_then(|response| response.into_body().read_to_string())
        .with_context(|| format!("cannot read {url}"))?;
    let histogram = operator
        .reconcile_histogram()
        .context("the floor runs no operator to count reconciles of")?;
    report::reconciles(&text, histogram).with_context(|| format!("{url} has no {histogram}"))
}

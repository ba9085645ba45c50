//! The benchmark's results and their Markdown report (pure).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::contender::Operator;
use super::packing::{Figures, PackingBench, Spread};
use super::upgrade::UpgradeBench;
use dra_driver::packing::Order;
use harness::cluster::audit::Requests;

/// What one operator measured with N simulated GPU nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub operator: Operator,
    pub nodes: u32,
    /// Which of the node count's runs, from 1, each on a fresh cluster (reports before runs had one).
    #[serde(default = "first_run")]
    pub run: u32,
    /// From creating the ClusterPolicy to the last operand DaemonSet existing.
    pub daemonsets_s: f64,
    /// From creating the ClusterPolicy to the device plugin's DaemonSet wanting a pod on every node (the operator
    /// has labelled them).
    pub labelled_s: f64,
    /// From creating the ClusterPolicy to every operand pod available (scheduled, started by kwok, Ready).
    pub available_s: f64,
    /// From creating the ClusterPolicy to settled: `status.state == ready`, every operand DaemonSet rolled out, the
    /// device plugin on every node.
    pub ready_s: f64,
    /// From `kubectl patch` of `toolkit.version` to the container toolkit DaemonSet carrying the new image.
    pub patch_to_daemonset_s: f64,
    /// From the patch to settled again with the new image rolled out.
    pub patch_to_ready_s: f64,
    /// VmHWM at the end of the run.
    pub peak_rss_mib: f64,
    /// VmRSS after 30 s at rest.
    pub steady_rss_mib: f64,
    /// utime + stime from start to the end of the run.
    pub cpu_s: f64,
    /// utime + stime during the 60 s at rest.
    pub cpu_rest_s: f64,
    /// Requests during the 60 s at rest.
    pub at_rest: Requests,
    /// Requests from the patch to settled again.
    pub rollout: Requests,
    /// Reconciles from start to the end of the run, from the operator's own metrics.
    pub reconciles: Reconciles,
    /// The operand DaemonSets it created.
    pub daemonsets: Vec<String>,
    /// From creating the ClusterPolicy to each operand DaemonSet rolled out for the last time in the rollout (every
    /// pod it wants updated and available); empty in reports from before it was measured.
    #[serde(default)]
    pub rolled_out_s: BTreeMap<String, f64>,
}

fn first_run() -> u32 {
    1
}

/// Whether the floor goes first in `run`: in every second run, so that neither our operator nor the floor always
/// meets a cluster that has rolled the same pods out once already.
pub fn floor_first(run: u32) -> bool {
    run.is_multiple_of(2)
}

impl Row {
    /// Requests per minute during the rollout.
    pub fn rollout_per_minute(&self) -> f64 {
        self.rollout.total() as f64 * 60.0 / self.patch_to_ready_s.max(1e-3)
    }
}

/// How often an operator reconciled and how long it spent doing so: the `_count` and `_sum` of its reconcile
/// duration histogram, summed over its controllers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Reconciles {
    pub count: u64,
    pub seconds: f64,
}

/// The totals of the histogram `name` in a Prometheus text exposition; `None` when it is not there.
pub fn reconciles(metrics: &str, name: &str) -> Option<Reconciles> {
    let (sum, count) = (format!("{name}_sum"), format!("{name}_count"));
    let mut found = false;
    let mut totals = Reconciles::default();
    for line in metrics.lines().filter(|line| !line.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let metric = series.split('{').next().unwrap_or(series);
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if metric == sum {
            totals.seconds += value;
        } else if metric == count {
            totals.count += value as u64;
        } else {
            continue;
        }
        found = true;
    }
    found.then_some(totals)
}

/// Allocate latency of the device plugin, as the `allocate_latency` example prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocate {
    pub calls: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// Where and with what the run happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// UTC, RFC 3339.
    pub date: String,
    pub commit: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kubernetes: String,
    pub nvidia: String,
}

/// Everything `bench.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub environment: Environment,
    pub rows: Vec<Row>,
    pub allocate: Option<Allocate>,
    /// The GPU memory watchdog's CPU and RSS.
    #[serde(default)]
    pub watchdog: Option<super::watchdog::WatchdogUsage>,
    /// Scheduling throughput of fractional GPU pods and the DRA driver's prepare latency.
    #[serde(default)]
    pub dra: Option<super::dra::DraBench>,
    /// A driver upgrade at the largest node count.
    #[serde(default)]
    pub upgrade: Option<super::upgrade::UpgradeBench>,
    /// MIG on demand: our device order and NVIDIA's under the scheduler's first fit.
    #[serde(default)]
    pub packing: Option<PackingBench>,
    /// Every role of a GPU node, at rest, loaded and through a MIG change.
    #[serde(default)]
    pub node_side: Option<super::node_side::NodeSideBench>,
}

impl Results {
    /// The runs of `operator` at `nodes`, in run order.
    fn runs(&self, operator: Operator, nodes: u32) -> Vec<&Row> {
        let mut runs: Vec<&Row> = self
            .rows
            .iter()
            .filter(|row| row.operator == operator && row.nodes == nodes)
            .collect();
        runs.sort_by_key(|row| row.run);
        runs
    }

    /// `operator` at `nodes` over its runs: each time, memory and CPU figure the median of the runs'; the requests,
    /// reconciles and DaemonSets those of the run whose time to ready is the median (the later one of two).
    fn median_of_runs(&self, operator: Operator, nodes: u32) -> Option<Row> {
        let mut runs = self.runs(operator, nodes);
        runs.sort_by(|a, b| a.ready_s.total_cmp(&b.ready_s));
        let middle = (*runs.get(runs.len() / 2)?).clone();
        let median =
            |figure: fn(&Row) -> f64| Spread::of(runs.iter().map(|row| figure(row))).median;
        // The requests at rest are a table by kind, so they come whole from the run with the median count: a run
        // whose watches happened to be re-established in its window is not the one reported for the others.
        let mut by_requests_at_rest = runs.clone();
        by_requests_at_rest.sort_by_key(|row| row.at_rest.total());
        let at_rest = by_requests_at_rest[by_requests_at_rest.len() / 2]
            .at_rest
            .clone();
        Some(Row {
            at_rest,
            daemonsets_s: median(|row| row.daemonsets_s),
            labelled_s: median(|row| row.labelled_s),
            available_s: median(|row| row.available_s),
            ready_s: median(|row| row.ready_s),
            patch_to_daemonset_s: median(|row| row.patch_to_daemonset_s),
            patch_to_ready_s: median(|row| row.patch_to_ready_s),
            peak_rss_mib: median(|row| row.peak_rss_mib),
            steady_rss_mib: median(|row| row.steady_rss_mib),
            cpu_s: median(|row| row.cpu_s),
            cpu_rest_s: median(|row| row.cpu_rest_s),
            ..middle
        })
    }

    /// The node counts at which our operator ran more than once.
    fn repeated_counts(&self) -> Vec<u32> {
        self.node_counts()
            .into_iter()
            .filter(|&nodes| self.runs(Operator::Ours, nodes).len() > 1)
            .collect()
    }

    /// Every operator and node count over its runs, in the order they were first measured.
    pub fn summaries(&self) -> Vec<Row> {
        let mut seen = BTreeSet::new();
        self.rows
            .iter()
            .filter(|row| seen.insert((row.nodes, row.operator.label())))
            .filter_map(|row| self.median_of_runs(row.operator, row.nodes))
            .collect()
    }

    fn node_counts(&self) -> BTreeSet<u32> {
        self.rows.iter().map(|row| row.nodes).collect()
    }
}

/// The whole report: environment, one line per operator and node count, the ratios and goals, and the requests by
/// kind.
pub fn render(results: &Results) -> String {
    let env = &results.environment;
    let mut text = format!(
        "# gpu-operator-rs and NVIDIA's gpu-operator on one local cluster\n\n\
         Run {} at commit `{}` on {} cores and {:.0} GiB; Kubernetes {} (kube-apiserver, etcd, controller manager, \
         scheduler), kwok nodes; {}. Produced by `cargo xtask bench`.\n\n",
        env.date, env.commit, env.cores, env.memory_gib, env.kubernetes, env.nvidia
    );
    if !results.repeated_counts().is_empty() {
        text.push_str(
            "Each figure is the median of the runs; every run, and the spread, are under [Runs](#runs).\n\n",
        );
    }
    text.push_str(
        "| nodes | operator | runs | ready s | patch→DaemonSet s | patch→ready s | peak RSS MiB | steady RSS MiB | \
         CPU s | CPU s/min at rest | requests/min at rest | writes/min at rest | lease writes/min | requests/min in \
         rollout |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in &results.summaries() {
        let _ = write!(
            text,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            row.nodes,
            row.operator.label(),
            results.runs(row.operator, row.nodes).len(),
            row.ready_s,
            row.patch_to_daemonset_s,
            row.patch_to_ready_s,
        );
        let _ = if row.operator.runs_a_process() {
            writeln!(
                text,
                " {:.1} | {:.1} | {:.2} | {:.2} | {} | {} | {} | {:.0} |",
                row.peak_rss_mib,
                row.steady_rss_mib,
                row.cpu_s,
                row.cpu_rest_s,
                row.at_rest.total(),
                row.at_rest.writes(),
                row.at_rest.lease_writes(),
                row.rollout_per_minute(),
            )
        } else {
            writeln!(text, "{}", " — |".repeat(8))
        };
    }
    render_meaning(results, &mut text);
    render_floor(results, &mut text);
    render_runs(results, &mut text);
    render_last_daemonsets(results, &mut text);
    render_goals(results, &mut text);
    render_timeline(results, &mut text);
    render_requests(results, &mut text);
    text.push_str(
        "\n## How it is measured\n\n\
         For each node count: a fresh cluster with N kwok nodes in two OS pools (half Ubuntu 22.04 with 4 A100-40GB, \
         half RHEL 9.4 with 8 H100-80GB), which has taken them in: the nodes behind on the TTL controller's \
         annotation touched, then 15 s without a node or node Lease created or a node's metadata written, and every \
         node at one TTL. Then each operator in turn: `helm install` of its own chart (driver and \
         NFD off, as for nodes whose image carries the driver), the chart's ClusterPolicy deleted, the operator started \
         as a local process with its chart's ServiceAccount token and leader election, as its Deployment would run it \
         (kwok runs no containers); after 5 s one ClusterPolicy, the same for both (NVIDIA's chart's, rendered with \
         the same values), is created. **ready**: `status.state == ready`, every operand DaemonSet rolled out \
         (observed generation, updated and available = desired) and the device plugin on all N nodes, polled every \
         200 ms. **patch**: `kubectl patch` of `toolkit.version` (both operators run NVIDIA's toolkit image), to the DaemonSet's new image (the API \
         server's time from receiving the patch to completing the write that put the image in the DaemonSet, from \
         its audit log) and to settled again with it rolled out. RSS from `/proc` (VmRSS 30 s after, VmHWM at the end), CPU = utime + stime. \
         Requests: the API server's audit log (every request of the operator's ServiceAccount, watches counted when \
         they start), over 60 s at rest and over the rollout (scaled to a minute). Between the operators the \
         ClusterPolicy is deleted with the operator running, the chart uninstalled and the CRDs removed. **floor**: after \
         our operator's run, its DaemonSets and Services (without their owner) and the node labels it wrote are kept; \
         with our chart installed again and no operator started, the labels are written first, untimed, then the \
         objects are created (one server-side apply each) and timed to rolled out on all N nodes; its patch sets the toolkit \
         DaemonSet's image tag directly.\n",
    );
    if let Some(allocate) = &results.allocate {
        let _ = writeln!(
            text,
            "\nDevice plugin Allocate latency (in process, unix socket, release build, {} calls): p50 {} µs, \
             p99 {} µs.",
            allocate.calls, allocate.p50_us, allocate.p99_us
        );
    }
    if let Some(watchdog) = &results.watchdog {
        let _ = writeln!(
            text,
            "\n## GPU memory watchdog\n\n`gpu-node-agent watchdog` (release) for one node with {} simulated H100-80GB and \
             {} pods on time-sliced replicas, a pass every {} s (its default), against the bench's API server and a \
             stand-in kubelet pod-resources socket; the GPU processes are real `sleep` processes that a stand-in procfs puts in the pods' cgroups.\n\n\
             | | GPU processes | CPU (% of one core) | RSS (MiB) |\n|---|---:|---:|---:|\n\
             | at rest | {} | {:.2} | {:.1} |\n| loaded | {} | {:.2} | {:.1} |\n\nPeak RSS {:.1} MiB. Measured \
             {} at commit {}.",
            watchdog.gpus,
            watchdog.pods,
            watchdog.interval_seconds,
            watchdog.at_rest.processes,
            watchdog.at_rest.cpu_percent,
            watchdog.at_rest.rss_mib,
            watchdog.loaded.processes,
            watchdog.loaded.cpu_percent,
            watchdog.loaded.rss_mib,
            watchdog.peak_rss_mib,
            watchdog.date,
            watchdog.commit,
        );
    }
    if let Some(dra) = &results.dra {
        let _ = writeln!(
            text,
            "\n## Fractional GPUs through DRA\n\nThe real kube-scheduler allocating claims of 3000 MiB and 10 % of the SMs \
             (class `shared.gpu.nvidia.com`) from {} simulated A100-40GB on {} kwok nodes, each with a release \
             `gpu-dra-driver run` publishing its slice; time from `kubectl create` of the pods to the last one \
             Running (kwok runs a bound pod).\n\n| pods | seconds | pods/s |\n|---:|---:|---:|",
            dra.gpus, dra.nodes,
        );
        for run in &dra.runs {
            let _ = writeln!(
                text,
                "| {} | {:.1} | {:.1} |",
                run.pods, run.seconds, run.pods_per_second
            );
        }
        let rounds = match (dra.prepare_rounds.len(), dra.prepare_p99_spread()) {
            (count, Some((lowest, highest))) if count > 1 => format!(
                " (medians of {count} rounds, each on claims of its own; the p99 of a round was {lowest} to \
                 {highest} µs)"
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            text,
            "\nNodePrepareResources over the driver's socket, for {} of the allocated claims (each takes its claim as \
             its driver read it when the pod was bound, or reads it from the API server, and writes a CDI spec and \
             the checkpoint): p50 {} µs, p99 {} µs; NodeUnprepareResources: \
             p50 {} µs, p99 {} µs{rounds}. Measured {} at commit {}.",
            dra.prepared_claims,
            dra.prepare_p50_us,
            dra.prepare_p99_us,
            dra.unprepare_p50_us,
            dra.unprepare_p99_us,
            dra.date,
            dra.commit,
        );
        if let Some((p50, p99, host_p99, read_ahead, claims)) = dra.in_driver() {
            let _ = writeln!(
                text,
                "\nInside the driver, from the call to its answer (each prepare's `prepared` log line): p50 {p50} µs, \
                 p99 {p99} µs, of which the host side (CDI spec, MPS directories and checkpoint, on tmpfs as on a node) \
                 p99 {host_p99} µs (medians of the rounds); {read_ahead} of {claims} claims were read ahead. The rest \
                 of the time at the socket is the gRPC path and the wait for a core: the drivers share the machine's \
                 cores with the control plane.",
            );
        }
        if let Some((median, longest)) = dra.status_written_ms() {
            let _ = writeln!(
                text,
                "\nEvery claim of a round was prepared before any was unprepared, as for pods that start and later \
                 end. The drivers write each prepared claim's device status once the kubelet's calls pause: every \
                 claim of a round carried it {:.1} s after the round's last prepare (median of the rounds; at most \
                 {:.1} s; polled every 0.5 s).",
                std::time::Duration::from_millis(median).as_secs_f64(),
                std::time::Duration::from_millis(longest).as_secs_f64(),
            );
        }
    }
    if let Some(node_side) = &results.node_side {
        render_node_side(node_side, &mut text);
    }
    if let Some(upgrade) = &results.upgrade {
        render_upgrade(upgrade, &mut text);
    }
    if let Some(packing) = &results.packing {
        render_packing(packing, &mut text);
    }
    text
}

/// The node side: every role's CPU and RSS in each window, its requests at rest, and the default install's sum.
fn render_node_side(bench: &super::node_side::NodeSideBench, text: &mut String) {
    let node = &bench.measured;
    let (rest, window) = (node.rest_seconds, node.window_seconds);
    let _ = writeln!(
        text,
        "\n## The node side\n\nEvery role of a GPU node as a release process on one real kubelet's node (the \
         kubelet's own device manager, pod-resources and DRA plugin calls; a fake container runtime) with {gpus} \
         simulated GPUs, each under its chart ServiceAccount's pod-bound token with its DaemonSet's command line and \
         default intervals. **At rest** ({rest} s) no pod, the exporter scraped every {scrape} s; **loaded** \
         ({window} s) {plugin} pods on time-sliced GPUs (the kubelet calls Allocate) and {dra} with DRA shares (it \
         calls NodePrepareResources) arrive, each with a GPU process the exporter and the watchdog map to its pod; \
         **MIG change** ({window} s) the pods gone, the node labelled `{mig}`, applied in {mig_s:.1} s while discovery, the \
         plugin and the driver follow. CPU in % of one core over the window; RSS at its end, in MiB. Requests: to \
         the API server at rest, per minute, from the audit log. Measured {date} at commit {commit}.\n\n\
         | role | command | default install | CPU at rest | RSS at rest | CPU loaded | RSS loaded | CPU MIG change | RSS MIG change | peak RSS | requests/min at rest | writes/min at rest |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        gpus = node.gpus,
        scrape = node.scrape_interval_seconds,
        plugin = node.plugin_pods,
        dra = node.dra_pods,
        mig = node.mig_config,
        mig_s = node.mig_change_seconds,
        date = bench.date,
        commit = bench.commit,
    );
    for role in &node.roles {
        let _ = writeln!(
            text,
            "| {} | `{}` | {} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} |",
            role.role,
            role.command,
            if role.default_install { "yes" } else { "no" },
            role.at_rest.cpu_percent,
            role.at_rest.rss_mib,
            role.loaded.cpu_percent,
            role.loaded.rss_mib,
            role.mig_change.cpu_percent,
            role.mig_change.rss_mib,
            role.peak_rss_mib,
            role.requests_per_minute(rest),
            role.writes_per_minute(rest),
        );
    }
    let sum = |value: &dyn Fn(&harness::node_side::RoleUsage) -> f64| -> f64 {
        node.default_install().map(value).sum()
    };
    let requests_per_node = node.default_install_requests_per_minute();
    let _ = writeln!(
        text,
        "| **default install, per node** | | | {:.2} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} |",
        sum(&|role| role.at_rest.cpu_percent),
        sum(&|role| role.at_rest.rss_mib),
        sum(&|role| role.loaded.cpu_percent),
        sum(&|role| role.loaded.rss_mib),
        sum(&|role| role.mig_change.cpu_percent),
        sum(&|role| role.mig_change.rss_mib),
        sum(&|role| role.peak_rss_mib),
        requests_per_node,
        sum(&|role| role.writes_per_minute(rest)),
    );
    let _ = writeln!(
        text,
        "\nAt 5,000 nodes the default install's roles send the API server {:.0} requests a minute at rest ({:.1} per \
         node). Feature discovery's writes at rest renew `nvidia.com/gfd.timestamp` once a minute, as NVIDIA's GFD \
         does; `GFD_NO_TIMESTAMP=true` in the ClusterPolicy's `gfd.env` leaves the label out. NVIDIA's node \
         components (device plugin, GFD, DCGM and dcgm-exporter, MIG manager) need a GPU and its driver to start, so \
         they are not measured here.",
        requests_per_node * 5000.0,
        requests_per_node,
    );
}

/// MIG on demand, packing: both orders' figures over the seeds, and which order is better by how much.
fn render_packing(packing: &PackingBench, text: &mut String) {
    let per_node = packing.gpus_per_node.max(1);
    let nodes = match packing.gpus % per_node {
        0 => format!("{} nodes of {per_node}", packing.gpus / per_node),
        rest => format!(
            "{} nodes of {per_node} and one of {rest}",
            packing.gpus / per_node
        ),
    };
    let mix: Vec<String> = packing
        .mix
        .iter()
        .map(|(profile, weight)| format!("{profile} {weight} %"))
        .collect();
    // The mix's two largest profiles: where fragmentation shows first.
    let large: Vec<&str> = packing
        .mix
        .iter()
        .rev()
        .take(2)
        .rev()
        .map(|(profile, _)| profile.as_str())
        .collect();
    let _ = write!(
        text,
        "\n## MIG on demand: packing\n\n`dra_driver::packing` replays MIG claims arriving and leaving on {} simulated {} \
         ({nodes} GPUs), with the devices and counters the DRA driver publishes for GPUs served as MIG \
         on demand, against the scheduler's allocator: for each claim the first device, in slice order, that its \
         profile selects and whose counters are free, on the first node where there is one (standing for a bin-packing \
         node score). Only the order of the devices differs: **ours**, each profile's placements from the highest \
         start down, and **NVIDIA's**, its DynamicMIG devices sorted by name (`gpu-<minor>-mig-<profile>-<id>-<start>`), \
         so from the lowest start up (kubernetes-sigs/dra-driver-nvidia-gpu, `cmd/gpu-kubelet-plugin/driver.go` and \
         `mig.go`). Claims: {}; one arrives per tick and lives 1 to {} ticks ({} on average), {} arrivals, means taken \
         after the first {}; a pod no node can take is refused and dropped. Refused for fragmentation: no placement of \
         the profile was free anywhere, yet one GPU had as many memory slices free (elsewhere on it) and every other \
         counter the profile takes. {} seeds: median (least–most).\n\n\
         | order | pods placed | refused | refused for fragmentation | GPUs in use, mean | GPUs in use, most | \
         compute slices held |",
        packing.gpus,
        packing.model,
        mix.join(", "),
        2 * packing.mean_lifetime - 1,
        packing.mean_lifetime,
        packing.arrivals,
        packing.warmup,
        packing.runs.len(),
    );
    for profile in &large {
        let _ = write!(text, " GPUs free for a {profile}, mean |");
    }
    text.push_str("\n|---|---:|---:|---:|---:|---:|---:|");
    text.push_str(&"---:|".repeat(large.len()));
    text.push('\n');
    let whole =
        |spread: Spread| format!("{:.0} ({:.0}–{:.0})", spread.median, spread.min, spread.max);
    let tenths =
        |spread: Spread| format!("{:.1} ({:.1}–{:.1})", spread.median, spread.min, spread.max);
    for order in Order::ALL {
        let spread = |figure: fn(&Figures) -> f64| packing.spread(order, figure);
        let _ = write!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} |",
            order.label(),
            whole(spread(|figures| f64::from(figures.placed))),
            whole(spread(|figures| f64::from(figures.refused))),
            whole(spread(|figures| f64::from(figures.refused_fragmented))),
            tenths(spread(|figures| figures.gpus_used_mean)),
            whole(spread(|figures| f64::from(figures.gpus_used_max))),
            tenths(Spread {
                median: spread(|figures| figures.busy_mean).median * 100.0,
                min: spread(|figures| figures.busy_mean).min * 100.0,
                max: spread(|figures| figures.busy_mean).max * 100.0,
            }) + " %",
        );
        for profile in &large {
            let free = packing.spread(order, |figures| {
                figures
                    .can_take_mean
                    .get(*profile)
                    .copied()
                    .unwrap_or_default()
            });
            let _ = write!(text, " {} |", tenths(free));
        }
        text.push('\n');
    }
    let refused = |order| packing.spread(order, |figures| f64::from(figures.refused));
    let fragmented = |order| packing.spread(order, |figures| f64::from(figures.refused_fragmented));
    let (ours, nvidia) = (refused(Order::Ours), refused(Order::Nvidia));
    let (ours_fragmented, nvidia_fragmented) = (fragmented(Order::Ours), fragmented(Order::Nvidia));
    let (fewer, more) = packing.ours_fewer_more();
    let seeds = packing.runs.len();
    let percent = |than: f64, of: f64| (than - of).abs() * 100.0 / than.max(1.0);
    let _ = if ours.median < nvidia.median {
        write!(
            text,
            "\nOurs is better: it refused {:.1} % fewer pods than NVIDIA's order (median {:.0} against {:.0}; fewer in \
             {fewer} of {seeds} seeds, more in {more}), and {:.0} for fragmentation against {:.0}.",
            percent(nvidia.median, ours.median),
            ours.median,
            nvidia.median,
            ours_fragmented.median,
            nvidia_fragmented.median,
        )
    } else if ours.median > nvidia.median {
        write!(
            text,
            "\nNVIDIA's order is better: ours refused {:.1} % more pods (median {:.0} against {:.0}; more in {more} of \
             {seeds} seeds, fewer in {fewer}), and {:.0} for fragmentation against {:.0}.",
            percent(nvidia.median, ours.median),
            ours.median,
            nvidia.median,
            ours_fragmented.median,
            nvidia_fragmented.median,
        )
    } else {
        write!(
            text,
            "\nNeither order is better: both refused {:.0} pods (median; ours fewer in {fewer} of {seeds} seeds, more in \
             {more}), and for fragmentation ours {:.0} against {:.0}.",
            ours.median, ours_fragmented.median, nvidia_fragmented.median,
        )
    };
    let _ = writeln!(
        text,
        " One seed's refusals differ from another's by up to {:.0} (ours) and {:.0} (NVIDIA's). Both orders take a \
         node's GPUs one after another, so under first fit neither scatters small instances over GPUs; they differ in \
         which placement of a GPU a profile takes first. The chart `mig-packing.png` shows the refusals. Replayed {} \
         at commit {}.",
        ours.max - ours.min,
        nvidia.max - nvidia.min,
        packing.date,
        packing.commit,
    );
}

/// The driver upgrade: its figures, then the operator's requests by verb and resource, in all and per node.
fn render_upgrade(upgrade: &UpgradeBench, text: &mut String) {
    let requests = &upgrade.requests;
    let _ = writeln!(
        text,
        "\n## Driver upgrade\n\nOur operator (release, local process as in the runs above) with the driver on for {} kwok \
         GPU nodes and NVIDIA's upgrade policy (`autoUpgrade: true`, `maxParallelUpgrades: {}`, `maxUnavailable: \
         100%`); once every node is upgrade-done, `kubectl patch` of `driver.version`. One `kubectl get nodes --watch` \
         times every change of each node's `nvidia.com/gpu-driver-upgrade-state` label and cordon, until every node is \
         upgrade-done and uncordoned again. kwok marks each new driver pod and each restarted validator pod Ready as \
         soon as it is bound: the validator's driver checks are not run, its pod's readiness stands for them. No \
         workloads use the GPUs, so nothing is evicted. In flight: a node between upgrade-required and upgrade-done \
         (what `maxParallelUpgrades` limits); the chart `driver-upgrade.png` shows it per second.\n\n\
         | nodes | total s | most in flight | requests | per node | writes per node |\n|---:|---:|---:|---:|---:|---:|\n\
         | {} | {:.1} | {} of {} | {} | {:.1} | {:.1} |\n\n| request | count | per node |\n|---|---:|---:|",
        upgrade.nodes,
        upgrade.max_parallel,
        upgrade.nodes,
        upgrade.total_s,
        upgrade.max_in_flight,
        upgrade.max_parallel,
        requests.total(),
        upgrade.per_node(requests.total()),
        upgrade.per_node(requests.writes()),
    );
    for (kind, count) in &requests.by_kind {
        let _ = writeln!(
            text,
            "| `{kind}` | {count} | {:.2} |",
            upgrade.per_node(*count)
        );
    }
    let _ = writeln!(
        text,
        "\nMeasured {} at commit {}.",
        upgrade.date, upgrade.commit
    );
}

/// NVIDIA's figure over ours, where both ran; an operator's over the floor's.
/// What the figures mean for a cluster of each measured size, a sentence or two per size: how long until its GPU
/// nodes run the operands, against the cluster alone and NVIDIA's; how fast a change arrives; what the operator
/// costs at rest, and what the nodes' own agents cost the API server (from the node side, at that size).
fn render_meaning(results: &Results, text: &mut String) {
    let sizes: Vec<(u32, Row)> = results
        .node_counts()
        .into_iter()
        .filter_map(|nodes| Some((nodes, results.median_of_runs(Operator::Ours, nodes)?)))
        .collect();
    if sizes.is_empty() {
        return;
    }
    text.push_str("\n## What this means for a cluster of N GPU nodes\n\n");
    let per_node = results
        .node_side
        .as_ref()
        .map(|bench| bench.measured.default_install_requests_per_minute());
    for (nodes, ours) in sizes {
        let floor = results.median_of_runs(Operator::Floor, nodes);
        let nvidia = results.median_of_runs(Operator::Nvidia, nodes);
        let mut sentence = format!(
            "- **{nodes} nodes.** After the ClusterPolicy is created, every GPU node runs its operands after {}",
            duration(ours.ready_s)
        );
        let mut others = Vec::new();
        if let Some(floor) = &floor {
            others.push(format!(
                "{} when the cluster does it with no operator, so ours adds {:.0} %",
                duration(floor.ready_s),
                (ours.ready_s / floor.ready_s.max(1e-3) - 1.0) * 100.0
            ));
        }
        if let Some(nvidia) = &nvidia {
            others.push(format!(
                "{} with NVIDIA's operator",
                duration(nvidia.ready_s)
            ));
        }
        if !others.is_empty() {
            let _ = write!(sentence, " ({})", others.join("; "));
        }
        let _ = write!(
            sentence,
            ". A change to the policy is in its DaemonSets after {} and on every node after {}. At rest the \
             operator holds {:.0} MiB",
            duration(ours.patch_to_daemonset_s),
            duration(ours.patch_to_ready_s),
            ours.steady_rss_mib,
        );
        if let Some(nvidia) = &nvidia {
            let _ = write!(sentence, " (NVIDIA's {:.0} MiB)", nvidia.steady_rss_mib);
        }
        let _ = write!(
            sentence,
            " and sends {} requests a minute, {} of them writes besides its lease",
            ours.at_rest.total(),
            ours.at_rest.writes(),
        );
        if let Some(per_node) = per_node {
            let _ = write!(
                sentence,
                "; the nodes' own agents send {:.0} more ({per_node:.1} per node)",
                per_node * f64::from(nodes)
            );
        }
        sentence.push_str(".\n");
        text.push_str(&sentence);
    }
}

/// Seconds as a reader takes them in: milliseconds under 1 s, tenths under 10 s, whole seconds under 2 minutes,
/// else minutes (alone, as the figure often stands in parentheses already).
fn duration(seconds: f64) -> String {
    if seconds < 1.0 {
        format!("{:.0} ms", seconds * 1000.0)
    } else if seconds < 10.0 {
        format!("{seconds:.1} s")
    } else if seconds < 120.0 {
        format!("{seconds:.0} s")
    } else {
        format!("{:.1} min", seconds / 60.0)
    }
}

fn ratio(nvidia: f64, ours: f64) -> f64 {
    nvidia / ours.max(1e-3)
}

/// How close to the floor ours came (and NVIDIA's, where it ran), with the goals that are stated against the floor:
/// ready within 5 % of it from 1000 nodes on, and a patch in every DaemonSet within a second.
fn render_floor(results: &Results, text: &mut String) {
    let counts: Vec<(u32, Row, Row)> = results
        .node_counts()
        .into_iter()
        .filter_map(|nodes| {
            Some((
                nodes,
                results.median_of_runs(Operator::Floor, nodes)?,
                results.median_of_runs(Operator::Ours, nodes)?,
            ))
        })
        .collect();
    if counts.is_empty() {
        return;
    }
    text.push_str(
        "\n## Against the floor (an operator's time ÷ the floor's)\n\n\
         The floor is our operator's DaemonSets and Services created directly, on nodes that already carry the \
         labels it wrote: \
         what the API server, the DaemonSet controller, the scheduler and kwok take with no operator in the way. \
         Goals: ours ready within 5 % of the floor from 1000 nodes on; a patch in every DaemonSet within 1 s.",
    );
    if !results.repeated_counts().is_empty() {
        text.push_str(
            " Each ratio here is of the two medians; each run's own ratio, with who went first, is under \
             [Runs](#runs).",
        );
    }
    text.push_str(
        "\n\n| nodes | floor ready s | ours ÷ floor, ready | ours ÷ floor, patch→ready | ours patch→DaemonSet s \
         | NVIDIA ÷ floor, ready | goals |\n|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for (nodes, floor, ours) in counts {
        let ready = ratio(ours.ready_s, floor.ready_s);
        let to_ready = ratio(ours.patch_to_ready_s, floor.patch_to_ready_s);
        let nvidia = results.median_of_runs(Operator::Nvidia, nodes).map_or_else(
            || "—".to_owned(),
            |row| format!("{:.2}×", ratio(row.ready_s, floor.ready_s)),
        );
        let mut missed = Vec::new();
        if nodes >= 1000 && ready > 1.05 {
            missed.push("ready ≤ 1.05× floor");
        }
        if ours.patch_to_daemonset_s >= 1.0 {
            missed.push("patch→DaemonSet < 1 s");
        }
        let goals = if missed.is_empty() {
            "met".to_owned()
        } else {
            format!("missed: {}", missed.join(", "))
        };
        let _ = writeln!(
            text,
            "| {nodes} | {:.2} | {ready:.2}× | {to_ready:.2}× | {:.2} | {nvidia} | {goals} |",
            floor.ready_s, ours.patch_to_daemonset_s,
        );
    }
}

/// Every run of ours and the floor at each node count measured more than once, who went first, and the spread of
/// each figure and ratio over the runs: what a median hides.
fn render_runs(results: &Results, text: &mut String) {
    let counts = results.repeated_counts();
    if counts.is_empty() {
        return;
    }
    text.push_str(
        "\n## Runs\n\n\
         Each run on a fresh cluster. In every second run the floor went first, with what our operator rendered and \
         labelled in the run before, so that neither always meets a cluster that has rolled the same pods out once. \
         Ratios are ours ÷ the floor's in the same run; the last line of a node count is the median (least–most).\n\n\
         | nodes | run | first | ours ready s | floor ready s | ready ratio | ours patch→ready s | floor patch→ready s \
         | patch→ready ratio | ours steady RSS MiB |\n|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let spread = |values: &[f64], digits: usize| {
        if values.is_empty() {
            return "—".to_owned();
        }
        let Spread { median, min, max } = Spread::of(values.iter().copied());
        format!("{median:.digits$} ({min:.digits$}–{max:.digits$})")
    };
    // Decimals of each figure's column: seconds and ratios in hundredths, RSS in tenths.
    const DIGITS: [usize; 7] = [2, 2, 2, 2, 2, 2, 1];
    for nodes in counts {
        let floors = results.runs(Operator::Floor, nodes);
        let mut columns: [Vec<f64>; 7] = Default::default();
        for ours in results.runs(Operator::Ours, nodes) {
            let floor = floors.iter().find(|floor| floor.run == ours.run);
            let first = if floor.is_some() && floor_first(ours.run) {
                "floor"
            } else {
                "ours"
            };
            let figures = [
                Some(ours.ready_s),
                floor.map(|floor| floor.ready_s),
                floor.map(|floor| ratio(ours.ready_s, floor.ready_s)),
                Some(ours.patch_to_ready_s),
                floor.map(|floor| floor.patch_to_ready_s),
                floor.map(|floor| ratio(ours.patch_to_ready_s, floor.patch_to_ready_s)),
                Some(ours.steady_rss_mib),
            ];
            let _ = write!(text, "| {nodes} | {} | {first} |", ours.run);
            for (index, figure) in figures.into_iter().enumerate() {
                let digits = DIGITS[index];
                match figure {
                    Some(value) => {
                        columns[index].push(value);
                        let _ = write!(text, " {value:.digits$} |");
                    }
                    None => text.push_str(" — |"),
                }
            }
            text.push('\n');
        }
        let _ = write!(text, "| {nodes} | median | |");
        for (values, digits) in columns.iter().zip(DIGITS) {
            let _ = write!(text, " {} |", spread(values, digits));
        }
        text.push('\n');
    }
}

/// Per node count where ours and the floor both have them: when each DaemonSet was rolled out, the median over the
/// runs, so that the one an operator holds back shows.
fn render_last_daemonsets(results: &Results, text: &mut String) {
    let mut header = false;
    for nodes in results.node_counts() {
        let medians = |operator| {
            let runs = results.runs(operator, nodes);
            let names: BTreeSet<&String> = runs
                .iter()
                .flat_map(|row| row.rolled_out_s.keys())
                .collect();
            names
                .into_iter()
                .map(|name| {
                    let times = runs
                        .iter()
                        .filter_map(|row| row.rolled_out_s.get(name).copied());
                    (name.clone(), Spread::of(times))
                })
                .collect::<BTreeMap<String, Spread>>()
        };
        let (ours, floor) = (medians(Operator::Ours), medians(Operator::Floor));
        if ours.is_empty() || floor.is_empty() {
            continue;
        }
        if !header {
            header = true;
            text.push_str(
                "\n## When each DaemonSet was rolled out\n\n\
                 Seconds from the start to a DaemonSet's last rollout (every pod it wants updated and available), \
                 median (least–most) over the runs; the last one is what ready waits for.\n\n\
                 | nodes | DaemonSet | ours s | floor s | ours − floor s |\n|---:|---|---:|---:|---:|\n",
            );
        }
        for (name, mine) in &ours {
            let Some(theirs) = floor.get(name) else {
                continue;
            };
            let _ = writeln!(
                text,
                "| {nodes} | {name} | {:.2} ({:.2}–{:.2}) | {:.2} ({:.2}–{:.2}) | {:.2} |",
                mine.median,
                mine.min,
                mine.max,
                theirs.median,
                theirs.min,
                theirs.max,
                mine.median - theirs.median
            );
        }
    }
}

fn render_goals(results: &Results, text: &mut String) {
    let pairs: Vec<(u32, Row, Row)> = results
        .node_counts()
        .into_iter()
        .filter_map(|nodes| {
            Some((
                nodes,
                results.median_of_runs(Operator::Ours, nodes)?,
                results.median_of_runs(Operator::Nvidia, nodes)?,
            ))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    text.push_str(
        "\n## Ratios (NVIDIA's figure ÷ ours) and goals\n\n\
         | nodes | ready | patch→DaemonSet | patch→ready | steady RSS | goals |\n|---:|---:|---:|---:|---:|---|\n",
    );
    let largest = pairs.iter().map(|(nodes, ..)| *nodes).max().unwrap_or(0);
    for (nodes, ours, nvidia) in pairs {
        let ready = ratio(nvidia.ready_s, ours.ready_s);
        let to_daemonset = ratio(nvidia.patch_to_daemonset_s, ours.patch_to_daemonset_s);
        let to_ready = ratio(nvidia.patch_to_ready_s, ours.patch_to_ready_s);
        let rss = ratio(nvidia.steady_rss_mib, ours.steady_rss_mib);
        let speed_goal = if nodes == largest && nodes >= 1000 {
            5.0
        } else {
            1.0
        };
        let mut missed = Vec::new();
        if ready < speed_goal {
            missed.push(format!("ready ≥ {speed_goal}×"));
        }
        if to_daemonset.min(to_ready) < speed_goal {
            missed.push(format!("patch ≥ {speed_goal}×"));
        }
        if rss < 5.0 {
            missed.push("RSS ≤ ⅕".to_owned());
        }
        if ours.at_rest.writes() > 0 {
            missed.push("0 writes at rest".to_owned());
        }
        let goals = if missed.is_empty() {
            "all met".to_owned()
        } else {
            format!("missed: {}", missed.join(", "))
        };
        let _ = writeln!(
            text,
            "| {nodes} | {ready:.1}× | {to_daemonset:.1}× | {to_ready:.1}× | {rss:.1}× | {goals} |"
        );
    }
}

/// Where the time to ready goes: what the operator does (DaemonSets, node labels, noticing readiness) and what the
/// cluster does (scheduling the pods, kwok starting them), with the operator's own reconcile count and time.
fn render_timeline(results: &Results, text: &mut String) {
    text.push_str(
        "\n## Where the time to ready goes\n\n\
         Seconds from the ClusterPolicy's creation. The operator's part: its DaemonSets exist, every node carries its \
         labels, and it reports ready once the pods are; in between, the cluster's part: the DaemonSet controller, the \
         scheduler and kwok make every operand pod available. Reconciles: count and total time from the operator's \
         reconcile-duration histogram over the whole run (both rollouts and the rest). The floor's seconds count from \
         the creation of its DaemonSets, on nodes labelled beforehand.\n\n\
         | nodes | operator | DaemonSets created | nodes labelled | pods available | ready | reconciles | seconds in \
         reconciles |\n|---:|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in &results.summaries() {
        let _ = write!(
            text,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            row.nodes,
            row.operator.label(),
            row.daemonsets_s,
            row.labelled_s,
            row.available_s,
            row.ready_s,
        );
        let _ = if row.operator.runs_a_process() {
            writeln!(
                text,
                " {} | {:.2} |",
                row.reconciles.count, row.reconciles.seconds
            )
        } else {
            writeln!(text, " — | — |")
        };
    }
}

/// Requests by verb and resource, both operators side by side, and the user agents: at the largest node count
/// NVIDIA's operator was measured at (a table of ours alone compares nothing), else at the largest count.
fn render_requests(results: &Results, text: &mut String) {
    let counts = results.node_counts();
    let with_nvidia = counts
        .iter()
        .copied()
        .filter(|&nodes| results.median_of_runs(Operator::Nvidia, nodes).is_some())
        .max();
    let Some(nodes) = with_nvidia.or_else(|| counts.into_iter().max()) else {
        return;
    };
    let rows: Vec<Row> = [Operator::Ours, Operator::Nvidia]
        .into_iter()
        .filter_map(|operator| results.median_of_runs(operator, nodes))
        .collect();
    let kinds: BTreeSet<&String> = rows
        .iter()
        .flat_map(|row| row.at_rest.by_kind.keys().chain(row.rollout.by_kind.keys()))
        .collect();
    let _ = write!(
        text,
        "\n## Requests by verb and resource at {nodes} nodes (per minute)\n\n| request |"
    );
    for row in &rows {
        let label = row.operator.label();
        let _ = write!(text, " {label} at rest | {label} in rollout |");
    }
    text.push_str("\n|---|");
    text.push_str(&"---:|---:|".repeat(rows.len()));
    text.push('\n');
    for kind in kinds {
        let _ = write!(text, "| `{kind}` |");
        for row in &rows {
            let rest = row.at_rest.by_kind.get(kind).copied().unwrap_or(0);
            let rollout = row.rollout.by_kind.get(kind).copied().unwrap_or(0) as f64 * 60.0
                / row.patch_to_ready_s.max(1e-3);
            let _ = write!(text, " {rest} | {rollout:.0} |");
        }
        text.push('\n');
    }
    text.push_str("\nUser agents:\n");
    for row in &rows {
        let agents: BTreeSet<&String> = row
            .at_rest
            .user_agents
            .iter()
            .chain(&row.rollout.user_agents)
            .collect();
        let agents: Vec<String> = agents
            .into_iter()
            .map(|agent| format!("`{agent}`"))
            .collect();
        let _ = writeln!(text, "- {}: {}", row.operator.label(), agents.join(", "));
    }
}

/// Parses `--nodes 10,100,1000`.
pub fn parse_node_counts(text: &str) -> anyhow::Result<Vec<u32>> {
    text.split(',')
        .map(|part| {
            let count: u32 = part
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("--nodes takes counts like 10,100; got {part:?}"))?;
            anyhow::ensure!(
                count >= 2,
                "--nodes: each count must be at least 2 (two OS pools)"
            );
            Ok(count)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn requests(pairs: &[(&str, u64)]) -> Requests {
        Requests {
            by_kind: pairs
                .iter()
                .map(|(kind, count)| ((*kind).to_owned(), *count))
                .collect::<BTreeMap<_, _>>(),
            user_agents: BTreeSet::from(["agent/1".to_owned()]),
        }
    }

    fn row(operator: Operator, nodes: u32, ready_s: f64, rss: f64, writes: u64) -> Row {
        Row {
            operator,
            nodes,
            run: 1,
            daemonsets_s: 0.5,
            labelled_s: 0.75,
            available_s: ready_s - 0.25,
            ready_s,
            patch_to_daemonset_s: ready_s / 10.0,
            patch_to_ready_s: ready_s / 2.0,
            peak_rss_mib: rss * 2.0,
            steady_rss_mib: rss,
            cpu_s: 1.5,
            cpu_rest_s: 0.02,
            at_rest: requests(&[("update leases", 20), ("update configmaps", writes)]),
            rollout: requests(&[("patch daemonsets", 3)]),
            reconciles: Reconciles {
                count: 10,
                seconds: 0.5,
            },
            daemonsets: vec!["nvidia-device-plugin-daemonset".into()],
            rolled_out_s: BTreeMap::new(),
        }
    }

    fn results(rows: Vec<Row>) -> Results {
        Results {
            environment: Environment {
                date: "2026-11-23T20:00:00Z".into(),
                commit: "abc1234".into(),
                cores: 2,
                memory_gib: 24.0,
                kubernetes: "v1.37.1".into(),
                nvidia: "NVIDIA gpu-operator v25.3.2".into(),
            },
            rows,
            allocate: Some(Allocate {
                calls: 1000,
                p50_us: 80,
                p99_us: 150,
            }),
            watchdog: None,
            dra: None,
            upgrade: None,
            packing: None,
            node_side: None,
        }
    }

    #[test]
    fn requests_at_rest_come_from_the_run_with_the_median_count() {
        let mut quiet = row(Operator::Ours, 1000, 10.0, 30.0, 0);
        let mut busy = row(Operator::Ours, 1000, 20.0, 30.0, 0);
        let mut slow = row(Operator::Ours, 1000, 30.0, 30.0, 0);
        (quiet.run, busy.run, slow.run) = (1, 2, 3);
        busy.at_rest = requests(&[("update leases", 20), ("watch nodes", 13)]);
        let results = results(vec![quiet, busy, slow]);
        let median = results.median_of_runs(Operator::Ours, 1000).unwrap();
        assert_eq!(median.ready_s, 20.0);
        assert_eq!(median.at_rest.total(), 20);
    }

    #[test]
    fn requests_are_compared_at_the_largest_count_nvidia_reached() {
        let text = render(&results(vec![
            row(Operator::Ours, 1000, 10.0, 30.0, 0),
            row(Operator::Nvidia, 1000, 40.0, 100.0, 30),
            row(Operator::Ours, 5000, 50.0, 120.0, 0),
        ]));
        assert!(
            text.contains("## Requests by verb and resource at 1000 nodes"),
            "{text}"
        );
        assert!(!text.contains("## Requests by verb and resource at 5000 nodes"));
    }

    #[test]
    fn renders_rows_ratios_goals_and_requests() {
        let text = render(&results(vec![
            row(Operator::Ours, 10, 2.0, 20.0, 0),
            row(Operator::Nvidia, 10, 4.0, 120.0, 30),
            row(Operator::Ours, 1000, 10.0, 30.0, 0),
            row(Operator::Nvidia, 1000, 40.0, 100.0, 30),
        ]));
        assert!(text.contains("on 2 cores and 24 GiB; Kubernetes v1.37.1"));
        assert!(text.contains(&format!(
            "| 10 | {} | 1 | 2.00 | 0.20 | 1.00 | 40.0 | 20.0 | 1.50 | 0.02 | 20 | 0 | 20 | 180 |",
            Operator::Ours.label()
        )));
        assert!(text.contains(&format!(
            "| 1000 | {} | 0.50 | 0.75 | 39.75 | 40.00 | 10 | 0.50 |",
            Operator::Nvidia.label()
        )));
        assert!(text.contains("| 10 | 2.0× | 2.0× | 2.0× | 6.0× | all met |"));
        assert!(
            text.contains(
                "| 1000 | 4.0× | 4.0× | 4.0× | 3.3× | missed: ready ≥ 5×, patch ≥ 5×, RSS ≤ ⅕ |"
            ),
            "{text}"
        );
        assert!(text.contains("## Requests by verb and resource at 1000 nodes"));
        assert!(text.contains("| `update configmaps` | 0 | 0 | 30 | 0 |"));
        assert!(text.contains("| `patch daemonsets` | 0 | 36 | 0 | 9 |"));
        assert!(text.contains("p50 80 µs, p99 150 µs"));
    }

    /// A node side of three roles, the watchdog not in the default install: 12 requests a minute per node.
    fn node_side_bench() -> super::super::node_side::NodeSideBench {
        use harness::node_side::{NodeSide, Phase, RoleUsage};
        let role = |name: &str, default_install: bool, rss_mib: f64, lists: u64| RoleUsage {
            role: name.into(),
            command: format!("gpu-node-agent {name}"),
            default_install,
            at_rest: Phase {
                cpu_percent: 0.5,
                rss_mib,
            },
            loaded: Phase {
                cpu_percent: 2.0,
                rss_mib: rss_mib + 1.0,
            },
            mig_change: Phase {
                cpu_percent: 1.0,
                rss_mib,
            },
            peak_rss_mib: rss_mib + 2.0,
            requests_at_rest: requests(&[("list nodes", lists), ("patch nodes", 1)]),
        };
        super::super::node_side::NodeSideBench {
            commit: "def5678".into(),
            date: "2026-11-28T10:00:00Z".into(),
            measured: NodeSide {
                gpus: "h100-80gb:8".into(),
                plugin_pods: 40,
                dra_pods: 10,
                scrape_interval_seconds: 15,
                rest_seconds: 30,
                window_seconds: 60,
                mig_change_seconds: 12.5,
                mig_config: "all-1g.10gb".into(),
                roles: vec![
                    role("exporter", true, 10.0, 3),
                    role("discovery", true, 6.0, 1),
                    role("watchdog", false, 8.0, 5),
                ],
            },
        }
    }

    #[test]
    fn says_what_each_size_means_against_the_floor_nvidia_and_the_nodes() {
        let mut results = results(vec![
            row(Operator::Ours, 1000, 70.0, 40.0, 0),
            row(Operator::Floor, 1000, 67.0, 0.0, 0),
            row(Operator::Nvidia, 1000, 190.0, 90.0, 30),
            row(Operator::Ours, 10, 2.0, 28.0, 0),
        ]);
        results.node_side = Some(node_side_bench());
        let text = render(&results);
        assert!(
            text.contains("## What this means for a cluster of N GPU nodes"),
            "{text}"
        );
        assert!(
            text.contains(
                "- **1000 nodes.** After the ClusterPolicy is created, every GPU node runs its operands after 70 s \
                 (67 s when the cluster does it with no operator, so ours adds 4 %; 3.2 min with NVIDIA's \
                 operator). A change to the policy is in its DaemonSets after 7.0 s and on every node after 35 s. At \
                 rest the operator holds 40 MiB (NVIDIA's 90 MiB) and sends 20 requests a minute, 0 of them writes \
                 besides its lease; the nodes' own agents send 12000 more (12.0 per node)."
            ),
            "{text}"
        );
        assert!(
            text.contains("- **10 nodes.** After the ClusterPolicy is created, every GPU node runs its operands after 2.0 s. A change \
                 to the policy is in its DaemonSets after 200 ms and on every node after 1.0 s."),
            "a size without the floor or NVIDIA names neither: {text}"
        );
    }

    #[test]
    fn renders_the_node_side_with_the_default_installs_sum() {
        let mut results = results(Vec::new());
        results.node_side = Some(node_side_bench());
        let text = render(&results);
        assert!(text.contains("## The node side"), "{text}");
        assert!(text.contains("applied in 12.5 s"), "{text}");
        assert!(
            text.contains(
                "| exporter | `gpu-node-agent exporter` | yes | 0.50 | 10.0 | 2.00 | 11.0 | 1.00 | 10.0 | 12.0 | 8.0 | 2.0 |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| watchdog | `gpu-node-agent watchdog` | no |"),
            "{text}"
        );
        // The watchdog is not in the default install's sum: 4 + 2 requests in 30 s, 16 MiB at rest.
        assert!(
            text.contains(
                "| **default install, per node** | | | 1.00 | 16.0 | 4.00 | 18.0 | 2.00 | 16.0 | 20.0 | 12.0 | 4.0 |"
            ),
            "{text}"
        );
        assert!(
            text.contains("60000 requests a minute at rest (12.0 per node)"),
            "{text}"
        );
    }

    #[test]
    fn renders_the_driver_upgrade() {
        let mut results = results(Vec::new());
        results.upgrade = Some(UpgradeBench {
            commit: "def5678".into(),
            date: "2026-11-27T10:00:00Z".into(),
            nodes: 4,
            max_parallel: 2,
            total_s: 12.34,
            max_in_flight: 2,
            in_flight: vec![0, 2, 2, 1],
            requests: requests(&[("patch nodes", 32), ("delete pods", 8)]),
        });
        let text = render(&results);
        assert!(text.contains("## Driver upgrade"));
        assert!(
            text.contains("| 4 | 12.3 | 2 of 2 | 40 | 10.0 | 10.0 |"),
            "{text}"
        );
        assert!(text.contains("| `patch nodes` | 32 | 8.00 |"));
        assert!(text.contains("Measured 2026-11-27T10:00:00Z at commit def5678."));
    }

    #[test]
    fn renders_the_packing_of_both_orders_and_says_which_is_better() {
        let mut results = results(Vec::new());
        results.packing = Some(super::super::packing::tests::bench(&[
            (190, 200),
            (180, 170),
            (210, 230),
        ]));
        let text = render(&results);
        assert!(text.contains("## MIG on demand: packing"), "{text}");
        assert!(
            text.contains(
                "Claims: 1g.10gb 40 %, 2g.20gb 25 %, 3g.40gb 20 %, 4g.40gb 10 %, 7g.80gb 5 %;"
            ),
            "{text}"
        );
        assert!(text.contains("(12 nodes of 8 and one of 4 GPUs)"), "{text}");
        assert!(
            text.contains(&format!(
                "| {} | 5810 (5790–5820) | 190 (180–210) | 47 (45–52) | 98.5 (98.5–98.5) | 100 (100–100) | \
                 88.5 (88.5–88.5) % | 3.0 (3.0–3.0) | 1.5 (1.5–1.5) |",
                Order::Ours.label()
            )),
            "{text}"
        );
        assert!(text.contains(&format!(
            "| {} | 5800 (5770–5830) | 200 (170–230) |",
            Order::Nvidia.label()
        )));
        assert!(
            text.contains(
                "Ours is better: it refused 5.0 % fewer pods than NVIDIA's order (median 190 against 200; fewer in 2 \
                 of 3 seeds, more in 1), and 47 for fragmentation against 66."
            ),
            "{text}"
        );
        assert!(text.contains("by up to 30 (ours) and 60 (NVIDIA's)"));

        results.packing = Some(super::super::packing::tests::bench(&[(210, 200)]));
        let text = render(&results);
        assert!(
            text.contains("NVIDIA's order is better: ours refused 5.0 % more pods (median 210 against 200; more in 1 of 1"),
            "{text}"
        );
        results.packing = Some(super::super::packing::tests::bench(&[(200, 200)]));
        assert!(render(&results).contains("Neither order is better: both refused 200 pods"));
    }

    #[test]
    fn three_runs_give_medians_their_spread_and_who_went_first() {
        let run = |operator, run, ready_s, rss| Row {
            run,
            ..row(operator, 1000, ready_s, rss, 0)
        };
        let results = results(vec![
            run(Operator::Ours, 1, 99.4, 39.8),
            run(Operator::Floor, 1, 62.4, 0.0),
            run(Operator::Floor, 2, 64.6, 0.0),
            run(Operator::Ours, 2, 71.1, 40.5),
            run(Operator::Ours, 3, 83.0, 40.2),
            run(Operator::Floor, 3, 56.5, 0.0),
        ]);
        let text = render(&results);
        assert!(
            text.contains("median of the runs; every run, and the spread, are under [Runs](#runs)")
        );
        // One line per operator, of medians: ready 83.0 s, RSS 40.2 MiB, patch→ready 41.5 s (the middle run's).
        assert!(
            text.contains(
                "| 1000 | gpu-operator-rs 0.1.0 | 3 | 83.00 | 8.30 | 41.50 | 80.4 | 40.2 |"
            ),
            "{text}"
        );
        assert!(text.contains("| 1000 | floor (our DaemonSets, no operator) | 3 | 62.40 |"));
        assert_eq!(
            text.matches("| 1000 | gpu-operator-rs 0.1.0 |").count(),
            2,
            "{text}"
        );
        // Against the floor: the medians' ratio, 83.0 ÷ 62.4.
        assert!(text.contains("| 1000 | 62.40 | 1.33× |"), "{text}");
        // Every run with its order and ratio, then the spread.
        assert!(
            text.contains("| 1000 | 1 | ours | 99.40 | 62.40 | 1.59 |"),
            "{text}"
        );
        assert!(
            text.contains("| 1000 | 2 | floor | 71.10 | 64.60 | 1.10 |"),
            "{text}"
        );
        assert!(
            text.contains("| 1000 | 3 | ours | 83.00 | 56.50 | 1.47 |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| 1000 | median | | 83.00 (71.10–99.40) | 62.40 (56.50–64.60) | 1.47 (1.10–1.59) |"
            ),
            "{text}"
        );
        assert!(text.contains("40.2 (39.8–40.5) |\n"), "{text}");
    }

    #[test]
    fn one_run_has_no_runs_section_and_an_earlier_json_is_run_1() {
        let text = render(&results(vec![
            row(Operator::Ours, 100, 7.9, 33.1, 0),
            row(Operator::Floor, 100, 7.4, 0.0, 0),
        ]));
        assert!(!text.contains("Runs"), "{text}");
        let mut json = serde_json::to_value(row(Operator::Ours, 100, 7.9, 33.1, 0)).unwrap();
        json.as_object_mut().unwrap().remove("run");
        let loaded: Row = serde_json::from_value(json).unwrap();
        assert_eq!(loaded.run, 1);
        assert!(loaded.rolled_out_s.is_empty());
        assert!(!text.contains("When each DaemonSet"), "{text}");
    }

    #[test]
    fn each_daemonsets_rollout_is_given_for_ours_and_the_floor_by_its_median() {
        let timed = |operator, run, toolkit: f64| Row {
            run,
            rolled_out_s: BTreeMap::from([
                ("nvidia-container-toolkit-daemonset".to_owned(), toolkit),
                ("nvidia-device-plugin-daemonset".to_owned(), 50.0),
            ]),
            ..row(operator, 1000, toolkit, 40.0, 0)
        };
        let text = render(&results(vec![
            timed(Operator::Ours, 1, 80.0),
            timed(Operator::Floor, 1, 70.0),
            timed(Operator::Floor, 2, 66.0),
            timed(Operator::Ours, 2, 68.0),
            timed(Operator::Ours, 3, 77.0),
            timed(Operator::Floor, 3, 64.0),
        ]));
        assert!(
            text.contains("## When each DaemonSet was rolled out"),
            "{text}"
        );
        assert!(
            text.contains(
                "| 1000 | nvidia-container-toolkit-daemonset | 77.00 (68.00–80.00) | 66.00 (64.00–70.00) | 11.00 |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| 1000 | nvidia-device-plugin-daemonset | 50.00 (50.00–50.00) | 50.00 (50.00–50.00) | 0.00 |"
            ),
            "{text}"
        );
    }

    #[test]
    fn an_earlier_bench_json_without_packing_still_loads() {
        let mut json = serde_json::to_value(results(Vec::new())).unwrap();
        json.as_object_mut().unwrap().remove("packing");
        let loaded: Results = serde_json::from_value(json).unwrap();
        assert_eq!(loaded.packing, None);
    }

    #[test]
    fn the_floor_has_its_ratios_and_no_process_figures() {
        let mut floor = row(Operator::Floor, 1000, 9.8, 0.0, 0);
        floor.patch_to_ready_s = 4.0;
        let mut ours = row(Operator::Ours, 1000, 10.0, 30.0, 0);
        ours.patch_to_daemonset_s = 1.5;
        let text = render(&results(vec![
            ours,
            floor,
            row(Operator::Nvidia, 1000, 40.0, 100.0, 30),
            row(Operator::Ours, 10, 2.0, 20.0, 0),
            row(Operator::Floor, 10, 1.0, 0.0, 0),
        ]));
        assert!(text.contains("## Against the floor"));
        assert!(
            text.contains(
                "| 1000 | 9.80 | 1.02× | 1.25× | 1.50 | 4.08× | missed: patch→DaemonSet < 1 s |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| 10 | 1.00 | 2.00× | 2.00× | 0.20 | — | met |"),
            "under 1000 nodes only the patch goal counts: {text}"
        );
        assert!(text.contains(&format!(
            "| 10 | {} | 1 | 1.00 | 0.10 | 0.50 | — | — | — | — | — | — | — | — |",
            Operator::Floor.label()
        )));
        assert!(text.contains(&format!(
            "| 10 | {} | 0.50 | 0.75 | 0.75 | 1.00 | — | — |",
            Operator::Floor.label()
        )));
    }

    #[test]
    fn ours_alone_has_no_ratios() {
        let text = render(&results(vec![row(Operator::Ours, 10, 2.0, 20.0, 1)]));
        assert!(!text.contains("## Ratios"));
        assert!(text.contains("## Requests by verb and resource at 10 nodes"));
    }

    #[test]
    fn sums_the_reconcile_histogram_over_controllers() {
        let ours = "# HELP gpu_operator_reconcile_duration_seconds Time to reconcile.\n\
                    gpu_operator_reconcile_duration_seconds_sum 1.5\n\
                    gpu_operator_reconcile_duration_seconds_count 12\n\
                    gpu_operator_reconcile_duration_seconds_bucket{le=\"0.005\"} 3\n# EOF\n";
        assert_eq!(
            reconciles(ours, "gpu_operator_reconcile_duration_seconds"),
            Some(Reconciles {
                count: 12,
                seconds: 1.5
            })
        );
        let nvidia = "controller_runtime_reconcile_time_seconds_sum{controller=\"clusterpolicy-controller\"} 20.25\n\
                      controller_runtime_reconcile_time_seconds_count{controller=\"clusterpolicy-controller\"} 40\n\
                      controller_runtime_reconcile_time_seconds_sum{controller=\"upgrade-controller\"} 0.75\n\
                      controller_runtime_reconcile_time_seconds_count{controller=\"upgrade-controller\"} 3\n";
        assert_eq!(
            reconciles(nvidia, "controller_runtime_reconcile_time_seconds"),
            Some(Reconciles {
                count: 43,
                seconds: 21.0
            })
        );
        assert_eq!(
            reconciles(ours, "controller_runtime_reconcile_time_seconds"),
            None
        );
    }

    #[test]
    fn parses_node_counts() {
        assert_eq!(
            parse_node_counts("10,100,1000").unwrap(),
            vec![10, 100, 1000]
        );
        assert_eq!(parse_node_counts(" 50 ").unwrap(), vec![50]);
        assert!(parse_node_counts("10,x").is_err());
        assert!(parse_node_counts("1").is_err());
    }

    #[test]
    fn allocate_json_parses() {
        let allocate: Allocate =
            serde_json::from_str(r#"{"calls": 1000, "p50_us": 81, "p99_us": 140}"#).unwrap();
        assert_eq!(allocate.p99_us, 140);
    }
}

//! Developer and CI tasks. Run as `cargo xtask <task>`.

mod bench;
mod chart;
mod cluster_command;
mod crdgen;
mod demo;
mod deny;
mod e2e;
mod nvidia_operator;
mod test;
mod values_schema;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use harness::{cluster, images};

#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    version,
    about = "Developer and CI tasks for the GPU operator"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Write charts/gpu-operator/crds/*.yaml and values.schema.json from the Rust API types.
    Crdgen {
        /// Fail instead of writing when the checked-in CRDs differ from the types.
        #[arg(long)]
        check: bool,
    },
    /// Check the Helm chart with the cluster tools' helm, no cluster needed: lint with every values file users start
    /// from, the values schema refusing misspelled keys, DRA objects per Kubernetes version, standard labels.
    Chart,
    /// Build, start, stop and populate the local Kubernetes cluster used by the demo and the end-to-end tests.
    Cluster {
        #[command(subcommand)]
        command: cluster_command::Command,
    },
    /// Bring up the local cluster with simulated GPU nodes, install the chart, and show the ClusterPolicy.
    Demo,
    /// Check the dependency tree's licences, bans and sources with cargo-deny (installed into the cache if needed).
    Deny,
    /// Run the end-to-end tests against a fresh local cluster.
    E2e {
        /// Leave the cluster running afterwards, for a look around.
        #[arg(long)]
        keep_cluster: bool,
        /// Run the real-node suite instead: build the images, add a node with containerd, and run the tests
        /// whose pods are real containers.
        #[arg(long)]
        real_node: bool,
        /// Run only the tests whose name contains this.
        filter: Option<String>,
    },
    /// Benchmark the operator on the local cluster with N simulated GPU nodes, and the device plugin's Allocate latency.
    Bench(bench::Args),
    /// Build the OCI images of the operator, node agent, device plugin, pause and test images for linux/amd64 and
    /// linux/arm64 (archives under the cache), and with --push push them to a registry as multi-platform indexes.
    Images(images::Args),
    /// NVIDIA's gpu-operator (the release the benchmark measures), built from its Go module, on the local cluster.
    NvidiaOperator {
        #[command(subcommand)]
        command: nvidia_operator::Command,
    },
    /// Every check and test: formatting, dependencies (cargo-deny), generated files, clippy, unit tests, the Helm
    /// chart, images, end-to-end tests.
    Test,
}

/// Ends with the error's chain of causes, without the backtrace anyhow prints when `RUST_BACKTRACE` is set (as in
/// CI): the last lines of a failed run then say what failed, not where in xtask the error was made.
fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let root = harness::workspace_root();
    match Cli::parse().task {
        Task::Crdgen { check } => crdgen::run(check),
        Task::Chart => chart::check(&root, &cluster::tools_env()?),
        Task::Cluster { command } => cluster_command::run(command),
        Task::Demo => demo::run(&root),
        Task::Deny => deny::run(&root),
        Task::E2e {
            keep_cluster,
            real_node,
            filter,
        } => e2e::run(&root, keep_cluster, real_node, filter.as_deref()),
        Task::NvidiaOperator { command } => nvidia_operator::run(command),
        Task::Test => test::run(&root),
        Task::Bench(args) => bench::run(&root, &args),
        Task::Images(args) => images::run(&root, &args).map(|_| ()),
    }
}

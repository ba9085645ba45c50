//! Developer and CI tasks. Run as `cargo xtask <task>`.

mod cluster;
mod crdgen;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "xtask", about = "Developer and CI tasks for the GPU operator")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Write charts/gpu-operator/crds/*.yaml from the Rust API types.
    Crdgen {
        /// Fail instead of writing when the checked-in CRDs differ from the types.
        #[arg(long)]
        check: bool,
    },
    /// Build, start, stop and populate the local Kubernetes cluster used by the demo and the end-to-end tests.
    Cluster {
        #[command(subcommand)]
        command: cluster::Command,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Crdgen { check } => crdgen::run(check),
        Task::Cluster { command } => cluster::run(command),
    }
}

//! `cargo xtask nvidia-operator <command>`: NVIDIA's gpu-operator on the local cluster, through the harness.

use std::net::SocketAddr;

use harness::cluster;
use harness::operators::nvidia;

/// `cargo xtask nvidia-operator <command>`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Build it if it is not cached, and print its directory: the binary, the manifests it reads and its Helm
    /// chart (`gpu-operator`).
    Build,
    /// Start it on the running cluster as its chart's ServiceAccount (install NVIDIA's chart first), with leader
    /// election as its chart runs it; replaces a running one.
    Start {
        /// Where it serves its Prometheus metrics.
        #[arg(long, default_value = "127.0.0.1:0")]
        metrics_addr: SocketAddr,
    },
    /// Stop it (SIGTERM, then SIGKILL), if it runs.
    Stop,
}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Build => {
            println!("{}", cluster::nvidia_gpu_operator()?.display());
            Ok(())
        }
        Command::Start { metrics_addr } => {
            let info = cluster::running()?;
            let workload = nvidia::start(&info, &cluster::nvidia_gpu_operator()?, metrics_addr)?;
            println!(
                "NVIDIA's gpu-operator runs (pid {}, log {})",
                workload.pid,
                workload.log.display()
            );
            Ok(())
        }
        Command::Stop => nvidia::stop(&cluster::running()?),
    }
}

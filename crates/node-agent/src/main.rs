//! `gpu-node-agent`: parses the command line, sets up logging, runs the role.

use clap::Parser;
use node_agent::cli::{Cli, Command};
use node_agent::{
    discovery, exporter, mig, node_facts, simulator_tool, status_exporter, validate, watchdog,
};
use node_runtime::process::{self, exit_code};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cli.logging.init();
    let role = async {
        match cli.command {
            Command::Mig(args) => mig::run(args, &cli.gpus).await,
            Command::Discovery(args) => discovery::run(args, &cli.gpus).await,
            Command::NodeFacts(args) => node_facts::run(args, &cli.gpus).await,
            Command::Validate(args) => validate::run(args, &cli.gpus).await,
            Command::Exporter(args) => exporter::run(args, &cli.gpus).await,
            Command::StatusExporter(args) => status_exporter::run(args).await,
            Command::Watchdog(args) => watchdog::run(args, &cli.gpus).await,
            Command::Simulator(args) => simulator_tool::run(&args, &cli.gpus).await,
        }
    };
    // A container's first process gets no default action for SIGTERM: without this the kubelet would wait out the
    // grace period (30 s) and kill it, which holds up MIG changes (they wait for paused operands to go) and
    // uninstalls. A MIG change cut short is resumed or rolled back by the next MIG manager, as after a crash.
    exit_code(tokio::select! {
        result = role => result,
        () = process::stopped() => Ok(()),
    })
}

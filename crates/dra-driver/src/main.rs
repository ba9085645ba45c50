//! `gpu-dra-driver`: parses the command line, sets up logging, runs the driver or its planner.

use clap::Parser;
use dra_driver::cli::{Cli, Command};
use node_runtime::process::{self, exit_code};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cli.logging.init();
    let command = async {
        match cli.command {
            Command::Run(args) => dra_driver::run(args, &cli.gpus).await,
            Command::Plan(args) => dra_driver::plan(&args, &cli.gpus).map(|plan| print!("{plan}")),
        }
    };
    // A container's first process gets no default action for SIGTERM: without this the kubelet would wait out the
    // grace period (30 s) and kill it. Claims prepared when it stops are in the checkpoint, which the next driver
    // reads.
    exit_code(tokio::select! {
        result = command => result,
        () = process::stopped() => Ok(()),
    })
}

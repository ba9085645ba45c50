//! `gpu-device-plugin`: parses the command line, sets up logging, runs the subcommand.

use clap::Parser;
use device_plugin::cli::{self, Cli, Command};
use node_runtime::process::exit_code;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cli.logging.init();
    exit_code(match cli.command {
        Command::Run(args) => cli::run(args, &cli.gpus).await,
        Command::Plan(args) => cli::plan(&args, &cli.gpus).await.map(|out| print!("{out}")),
    })
}

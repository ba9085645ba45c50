//! `gpu-device-plugin`: parses the command line, sets up logging, runs the subcommand.

use std::io::IsTerminal;

use clap::Parser;
use device_plugin::cli::{self, Cli, Command};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
        Command::Run(args) => cli::run(args, &cli.gpus).await,
        Command::Plan(args) => cli::plan(&args, &cli.gpus).await.map(|out| print!("{out}")),
        Command::Xid(args) => cli::xid(&args, &cli.gpus).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs to stderr (stdout is for `plan`'s output), filtered by `RUST_LOG` (default `info`).
fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

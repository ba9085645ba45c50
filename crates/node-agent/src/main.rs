//! `gpu-node-agent`: parses the command line, sets up logging, runs the role.

use std::io::IsTerminal;

use clap::Parser;
use node_agent::cli::{Cli, Command, LogFormat};
use node_agent::{discovery, exporter, mig, node_facts, simulator_tool, status_exporter, validate};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Mig(args) => mig::run(args, &cli.gpus).await,
        Command::Discovery(args) => discovery::run(args, &cli.gpus).await,
        Command::NodeFacts(args) => node_facts::run(args, &cli.gpus).await,
        Command::Validate(args) => validate::run(args, &cli.gpus).await,
        Command::Exporter(args) => exporter::run(args, &cli.gpus).await,
        Command::StatusExporter(args) => status_exporter::run(args).await,
        Command::Simulator(args) => simulator_tool::run(&args, &cli.gpus).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs to stderr (stdout is for the admin tools' output), filtered by `RUST_LOG` (default `info`).
fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal, never in a pod's log or a file.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

//! The process around a node role: logging set-up, the signals that stop it, and the exit status.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

/// `--log-format` (or `LOG_FORMAT`), accepted by every node binary.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct Logging {
    /// Log format.
    #[arg(long, value_enum, default_value_t, global = true, env = "LOG_FORMAT")]
    pub log_format: LogFormat,
}

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

impl Logging {
    /// Logs to stderr (stdout is for the admin tools' output), filtered by `RUST_LOG` (default `info`).
    pub fn init(self) {
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
        // Colours only for a person at a terminal, never in a pod's log or a file.
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr);
        match self.log_format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
    }
}

/// `elapsed` in whole microseconds, for a log field: a u64, since a JSON log records the u128 of
/// [`Duration::as_micros`] as a string, which log pipelines cannot add up.
#[must_use]
pub fn log_micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
}

/// The exit status of a command: success, or failure with the error and its causes on stderr.
#[must_use]
pub fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Completes on SIGTERM (the kubelet stopping the pod) or Ctrl-C.
pub async fn stopped() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = async {
            match terminate.as_mut() {
                Some(signal) => { signal.recv().await; }
                None => std::future::pending().await,
            }
        } => {}
    }
}

//! MPS control daemons, for the device plugin (one per MPS-shared resource) and the DRA driver (one per claim on a
//! shared GPU). A daemon runs with its clients' limits as its defaults, so that every client it serves is held to
//! its share of device memory and SMs: memory isolation without LD_PRELOAD. The control program needs the driver;
//! callers on simulated GPUs start nothing and say so.

use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// The MPS control program of the driver.
const CONTROL: &str = "nvidia-cuda-mps-control";
/// Device memory one client may pin, per device (`<device>=<MiB>M`, comma-separated).
pub const MEMORY_LIMIT_ENV: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// Share of the SMs one client may use, in percent.
pub const THREADS_ENV: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// Where clients and the control daemon find each other's pipes.
pub const PIPE_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// What one control daemon runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// The GPUs or MIG devices it serves (its `CUDA_VISIBLE_DEVICES`), by UUID.
    pub uuids: Vec<String>,
    /// Default share of the SMs per client, in percent.
    pub thread_percentage: u32,
    /// Default pinned device memory per client, in MiB, by position in `uuids`.
    pub memory_limits_mib: Vec<u64>,
}

/// Why a control daemon could not be started or told something.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// A directory of the daemon could not be created.
    #[error("cannot create the MPS directory {dir}: {source}")]
    Directory {
        /// The directory.
        dir: String,
        /// The cause.
        source: std::io::Error,
    },
    /// `nvidia-cuda-mps-control` could not be run or failed.
    #[error("cannot run nvidia-cuda-mps-control: {0}")]
    Control(String),
}

/// Starts a control daemon whose pipes are in `pipe` and logs in `log`, and sets its default client limits.
///
/// # Errors
/// When a directory cannot be created or the control program fails.
pub async fn start(pipe: &Path, log: &Path, daemon: &Daemon) -> Result<(), MpsError> {
    for dir in [pipe, log] {
        std::fs::create_dir_all(dir).map_err(|source| MpsError::Directory {
            dir: dir.display().to_string(),
            source,
        })?;
    }
    let started = Command::new(CONTROL)
        .arg("-d")
        .env("CUDA_VISIBLE_DEVICES", daemon.uuids.join(","))
        .env(PIPE_ENV, pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", log)
        .status()
        .await
        .map_err(|error| MpsError::Control(error.to_string()))?;
    if !started.success() {
        return Err(MpsError::Control(format!("`-d` exited with {started}")));
    }
    let mut commands = vec![format!(
        "set_default_active_thread_percentage {}",
        daemon.thread_percentage
    )];
    // By position, not UUID: limits set by UUID were not applied by some drivers (NVIDIA's device plugin 0.15
    // release notes), and the daemon's devices are numbered from 0 in `CUDA_VISIBLE_DEVICES` order.
    commands.extend(
        daemon
            .memory_limits_mib
            .iter()
            .enumerate()
            .map(|(position, limit)| {
                format!("set_default_device_pinned_mem_limit {position} {limit}M")
            }),
    );
    control(pipe, &commands.join("\n")).await
}

/// Stops the control daemon whose pipes are in `pipe`.
///
/// # Errors
/// When the control program cannot be run.
pub async fn stop(pipe: &Path) -> Result<(), MpsError> {
    control(pipe, "quit").await
}

/// Sends commands to the running daemon whose pipes are in `pipe`, through the control program's standard input.
async fn control(pipe: &Path, commands: &str) -> Result<(), MpsError> {
    let failed = |error: std::io::Error| MpsError::Control(error.to_string());
    let mut child = Command::new(CONTROL)
        .env(PIPE_ENV, pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(failed)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(format!("{commands}\n").as_bytes())
            .await
            .map_err(failed)?;
    }
    child.wait().await.map_err(failed)?;
    Ok(())
}

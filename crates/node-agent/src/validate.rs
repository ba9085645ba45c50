//! The `validate` role, for the validator's init containers and the operands' waits: a part of the node that is
//! ready gets a file in the validations folder (`/run/nvidia/validations` on the host), which every operand's
//! init container waits for (`validate wait --for driver --for toolkit`).
//!
//! - driver: NVML (or the simulator) initialises and sees at least one GPU -> `driver-ready`;
//! - toolkit: the container runtime the toolkit installs is there and executable -> `toolkit-ready`;
//! - watch: checks again periodically, writing files that hold and removing stale ones, so that a driver that
//!   goes away stops new operands from starting.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use node_runtime::backend::{GpuSource, Gpus};
use node_runtime::state_file::{self, Lifetime, StateFileError};
use tracing::{info, warn};

use crate::cli::{ValidateArgs, ValidateStep};

/// How often `wait` says what it is still waiting for.
const WAIT_REPORT: Duration = Duration::from_secs(30);

/// A part of the node that is validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Part {
    /// The driver.
    Driver,
    /// The container toolkit.
    Toolkit,
}

impl Part {
    /// The ready file's name, as NVIDIA's validator writes it.
    #[must_use]
    pub const fn file_name(self) -> &'static str {
        match self {
            Self::Driver => "driver-ready",
            Self::Toolkit => "toolkit-ready",
        }
    }
}

/// Why a part is not ready.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// The driver cannot be reached.
    #[error("driver not ready: {0}")]
    Driver(String),
    /// The toolkit's runtime is missing.
    #[error(
        "toolkit not ready: {path}: {problem} (is the NVIDIA container toolkit installed? its runtime is looked \
         for at --toolkit-runtime / TOOLKIT_RUNTIME)"
    )]
    Toolkit {
        /// Where the runtime was looked for.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The ready file cannot be written.
    #[error(transparent)]
    Write(#[from] StateFileError),
    /// The ready file cannot be removed.
    #[error("cannot remove {path}: {source}")]
    Remove {
        /// The file.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// Runs a validation step.
///
/// # Errors
/// A part that is not ready (`driver`, `toolkit`), or a folder that cannot be written.
pub async fn run(args: ValidateArgs, source: &GpuSource) -> anyhow::Result<()> {
    let checker = Checker {
        source: source.clone(),
        node: args.node_name.clone(),
        toolkit_runtime: args.toolkit_runtime.clone(),
    };
    let folder = &args.validations_dir;
    match args.step {
        ValidateStep::Driver | ValidateStep::Toolkit => {
            let part = if matches!(args.step, ValidateStep::Driver) {
                Part::Driver
            } else {
                Part::Toolkit
            };
            let facts = checker.check(part).await?;
            mark(folder, part, &facts)?;
            println!("{} ready", part.file_name().trim_end_matches("-ready"));
            Ok(())
        }
        ValidateStep::Watch { interval } => loop {
            for part in [Part::Driver, Part::Toolkit] {
                match checker.check(part).await {
                    Ok(facts) => mark(folder, part, &facts)?,
                    Err(error) => {
                        if unmark(folder, part)? {
                            warn!(%error, file = part.file_name(), "no longer ready; ready file removed");
                        }
                    }
                }
            }
            tokio::time::sleep(interval).await;
        },
        ValidateStep::Wait { parts, interval } => {
            let mut reported = Instant::now();
            loop {
                let missing = missing(folder, &parts);
                if missing.is_empty() {
                    return Ok(());
                }
                if reported.elapsed() >= WAIT_REPORT {
                    info!(folder = %folder.display(), ?missing, "still waiting");
                    reported = Instant::now();
                }
                tokio::time::sleep(interval).await;
            }
        }
    }
}

/// What the checks need.
#[derive(Debug, Clone)]
struct Checker {
    source: GpuSource,
    node: Option<String>,
    toolkit_runtime: PathBuf,
}

impl Checker {
    /// Checks a part; returns the facts to write into its ready file.
    async fn check(&self, part: Part) -> Result<String, ValidateError> {
        match part {
            Part::Driver => self.driver().await,
            Part::Toolkit => check_toolkit(&self.toolkit_runtime),
        }
    }

    async fn driver(&self) -> Result<String, ValidateError> {
        let gpus = Gpus::open_reading_node(&self.source, self.node.as_deref())
            .await
            .map_err(|error| ValidateError::Driver(format!("{error:#}")))?;
        let inventory = gpus
            .run(|gpus| gpus.backend().gpus())
            .await
            .map_err(|error| ValidateError::Driver(error.to_string()))?;
        let first = inventory
            .first()
            .ok_or_else(|| ValidateError::Driver("the driver answers but sees no GPU".into()))?;
        let mut facts = String::new();
        let _ = writeln!(facts, "DRIVER_VERSION={}", first.driver_version);
        let _ = writeln!(facts, "CUDA_DRIVER_VERSION={}", first.cuda_driver_version);
        let _ = writeln!(facts, "GPU_COUNT={}", inventory.len());
        Ok(facts)
    }
}

/// The toolkit is ready when its runtime binary exists and is executable.
fn check_toolkit(runtime: &Path) -> Result<String, ValidateError> {
    let problem = |problem: &str| ValidateError::Toolkit {
        path: runtime.to_owned(),
        problem: problem.to_owned(),
    };
    let metadata = std::fs::metadata(runtime).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => problem("does not exist"),
        _ => problem(&error.to_string()),
    })?;
    if !metadata.is_file() {
        return Err(problem("is not a file"));
    }
    if metadata.permissions().mode() & 0o111 == 0 {
        return Err(problem("is not executable"));
    }
    Ok(format!("RUNTIME={}\n", runtime.display()))
}

/// Writes a part's ready file, atomically and durably: waiters never see half a file. The file is only read back to
/// skip an unchanged write, so one that is damaged differs from the facts and is simply written again.
fn mark(folder: &Path, part: Part, facts: &str) -> Result<(), ValidateError> {
    let path = folder.join(part.file_name());
    if std::fs::read_to_string(&path).is_ok_and(|existing| existing == facts) {
        return Ok(());
    }
    Ok(state_file::write(
        &path,
        facts.as_bytes(),
        Lifetime::Durable,
    )?)
}

/// Removes a part's ready file; returns whether there was one.
fn unmark(folder: &Path, part: Part) -> Result<bool, ValidateError> {
    let path = folder.join(part.file_name());
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(ValidateError::Remove { path, source }),
    }
}

/// The parts whose ready file is missing.
fn missing(folder: &Path, parts: &[Part]) -> Vec<Part> {
    parts
        .iter()
        .copied()
        .filter(|part| !folder.join(part.file_name()).is_file())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toolkit_needs_an_executable_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path().join("nvidia-container-runtime");
        let error = check_toolkit(&runtime).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!(
                "toolkit not ready: {}: does not exist",
                runtime.display()
            )),
            "{error}"
        );
        std::fs::write(&runtime, "#!/bin/sh\n").unwrap();
        assert!(
            check_toolkit(&runtime)
                .unwrap_err()
                .to_string()
                .contains("is not executable")
        );
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_toolkit(&runtime).is_ok());
    }

    #[test]
    fn ready_files_come_and_go() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("validations");
        let both = [Part::Driver, Part::Toolkit];
        assert_eq!(missing(&folder, &both), both);
        mark(&folder, Part::Driver, "GPU_COUNT=1\n").unwrap();
        assert_eq!(missing(&folder, &both), [Part::Toolkit]);
        assert_eq!(
            std::fs::read_to_string(folder.join("driver-ready")).unwrap(),
            "GPU_COUNT=1\n"
        );
        assert!(unmark(&folder, Part::Driver).unwrap());
        assert!(!unmark(&folder, Part::Driver).unwrap());
    }

    #[tokio::test]
    async fn the_simulated_driver_is_ready() {
        let dir = tempfile::tempdir().unwrap();
        let checker = Checker {
            source: GpuSource {
                simulate: Some("a30:2".parse().unwrap()),
                sim_state: Some(dir.path().join("gpus.json")),
            },
            node: None,
            toolkit_runtime: dir.path().join("runtime"),
        };
        let facts = checker.check(Part::Driver).await.unwrap();
        assert!(facts.contains("GPU_COUNT=2\n"), "{facts}");
        let toolkit = checker.check(Part::Toolkit).await.unwrap_err();
        assert!(toolkit.to_string().contains("does not exist"));
    }
}

//! Rebooting the node for a MIG mode change the platform cannot apply with a GPU reset (`WITH_REBOOT=true`).
//!
//! The runner first records the reboot on the Node (state `rebooting`, the change's record with one more reboot),
//! so that the restarted agent resumes the change and knows a second reboot would not help. On the simulator a
//! reboot resets every simulated GPU and returns: the next reconcile (the Node just changed) resumes the change,
//! as the restarted agent of a real node does.

use std::process::ExitStatus;

use tracing::info;

use super::gpus::{ChangeError, simulated_reboot};
use node_runtime::backend::Gpus;

/// Why the node was not rebooted.
#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    /// The simulated GPUs could not be reset.
    #[error("rebooting the simulated node: {0}")]
    Simulated(#[source] ChangeError),
    /// The reboot command could not be started.
    #[error(
        "rebooting with `{command}` failed: {source}; set REBOOT_COMMAND (migManager.env) to a command that \
         reboots this node from the MIG manager's container"
    )]
    Start {
        /// The command.
        command: String,
        /// Why it did not start.
        source: std::io::Error,
    },
    /// The reboot command failed.
    #[error(
        "rebooting with `{command}` failed: it exited with {status}; set REBOOT_COMMAND (migManager.env) to a \
         command that reboots this node from the MIG manager's container"
    )]
    Exited {
        /// The command.
        command: String,
        /// How it ended.
        status: ExitStatus,
    },
}

/// Reboots the node: on the simulator, resets the simulated GPUs and returns; on a real node, runs `command` and
/// waits to be stopped by the shutdown, never returning.
///
/// # Errors
/// When the simulated GPUs cannot be reset, or the command does not run or fails.
pub async fn reboot(gpus: &Gpus, command: &str) -> Result<(), RebootError> {
    if gpus.simulator().is_some() {
        gpus.run(|gpus| {
            let count = gpus.backend().gpu_count()?;
            let all: Vec<u32> = (0..count).collect();
            gpus.simulator()
                .map_or(Ok(()), |simulator| simulated_reboot(simulator, &all))
        })
        .await
        .map_err(RebootError::Simulated)?;
        info!("simulated reboot done");
        return Ok(());
    }
    let mut words = command.split_whitespace();
    let program = words.next().unwrap_or("reboot");
    let status = tokio::process::Command::new(program)
        .args(words)
        .status()
        .await
        .map_err(|source| RebootError::Start {
            command: command.to_owned(),
            source,
        })?;
    if !status.success() {
        return Err(RebootError::Exited {
            command: command.to_owned(),
            status,
        });
    }
    info!("reboot requested; waiting to be stopped");
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use node_runtime::testing::simulated;

    #[tokio::test]
    async fn a_failing_reboot_command_says_which_and_how_to_fix_it() {
        let (_dir, simulator) = simulated("h100-80gb:1", &[]);
        let real = Gpus::from_backend(simulator as Arc<dyn gpu::GpuBackend>);
        let error = reboot(&real, "false").await.unwrap_err();
        assert!(matches!(error, RebootError::Exited { .. }), "{error}");
        assert!(
            error.to_string().starts_with(
                "rebooting with `false` failed: it exited with exit status: 1; set REBOOT_COMMAND"
            ),
            "{error}"
        );
        let missing = reboot(&real, "/nonexistent/reboot now").await.unwrap_err();
        assert!(matches!(missing, RebootError::Start { .. }), "{missing}");
    }
}

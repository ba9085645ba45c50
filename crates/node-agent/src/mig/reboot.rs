//! Rebooting the node for a MIG mode change the platform cannot apply with a GPU reset (`WITH_REBOOT=true`).
//!
//! The runner first records the reboot on the Node (state `rebooting`, the change's record with one more reboot),
//! so that the restarted agent resumes the change and knows a second reboot would not help. On the simulator a
//! reboot resets every simulated GPU and returns: the next reconcile (the Node just changed) resumes the change,
//! as the restarted agent of a real node does.
//!
//! On a real node no program is run (the image has none to run): the agent sends SIGINT to the host's systemd,
//! PID 1 of the host's PID namespace, which the operator shares with the MIG manager only when `WITH_REBOOT` is
//! true. systemd answers SIGINT by starting `ctrl-alt-del.target`, a clean reboot (`reboot.target`) unless the
//! node's admin changed that target. A host whose init is not systemd is not rebooted: the change fails and says so.

use std::path::PathBuf;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tracing::info;

use super::gpus::{ChangeError, simulated_reboot};
use node_runtime::backend::Gpus;

/// The process a reboot signals, checked by name first so that a wrong PID namespace never signals something else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Init {
    /// Its process id.
    pub pid: i32,
    /// Its name (`/proc/<pid>/comm`).
    pub name: &'static str,
    /// The signal that asks it for a clean reboot.
    pub reboot_signal: Signal,
}

impl Init {
    /// The host's systemd, as the MIG manager sees it in the host's PID namespace.
    #[must_use]
    pub fn host_systemd() -> Self {
        Self {
            pid: 1,
            name: "systemd",
            reboot_signal: Signal::SIGINT,
        }
    }
}

/// Why the node was not rebooted.
#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    /// The simulated GPUs could not be reset.
    #[error("rebooting the simulated node: {0}")]
    Simulated(#[source] ChangeError),
    /// PID 1 is not the host's systemd: not the host's PID namespace, or a host without systemd.
    #[error(
        "not rebooting: process {pid} is `{found}`, not the host's {expected}; the MIG manager reboots a node by \
         signalling systemd in the host's PID namespace, which its DaemonSet shares when migManager.env sets \
         WITH_REBOOT=true"
    )]
    NotInit {
        /// The process looked at.
        pid: i32,
        /// The name expected.
        expected: &'static str,
        /// Its name, or why it could not be read.
        found: String,
    },
    /// The signal could not be sent.
    #[error("rebooting: cannot send {signal} to {expected} (process {pid}): {source}")]
    Signal {
        /// The process.
        pid: i32,
        /// The signal.
        signal: Signal,
        /// Its name.
        expected: &'static str,
        /// Why.
        source: nix::Error,
    },
}

/// Reboots the node: on the simulator, resets the simulated GPUs and returns; on a real node, sends `init` its
/// reboot signal (SIGINT for systemd) and waits to be stopped by the shutdown, never returning.
///
/// # Errors
/// When the simulated GPUs cannot be reset, or `init` is not the expected process or cannot be signalled.
pub async fn reboot(gpus: &Gpus, init: &Init) -> Result<(), RebootError> {
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
    let found = process_name(init.pid);
    if found != init.name {
        return Err(RebootError::NotInit {
            pid: init.pid,
            expected: init.name,
            found,
        });
    }
    kill(Pid::from_raw(init.pid), init.reboot_signal).map_err(|source| RebootError::Signal {
        pid: init.pid,
        signal: init.reboot_signal,
        expected: init.name,
        source,
    })?;
    info!(init = init.name, "reboot requested; waiting to be stopped");
    std::future::pending().await
}

/// A process's name, or why it cannot be read.
fn process_name(pid: i32) -> String {
    let path = PathBuf::from(format!("/proc/{pid}/comm"));
    std::fs::read_to_string(&path).map_or_else(
        |error| format!("unreadable ({}: {error})", path.display()),
        |name| name.trim_end().to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    use std::sync::Arc;

    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::process::{Child, ChildStdin, Command};

    use super::*;
    use node_runtime::testing::simulated;

    fn real_gpus() -> (tempfile::TempDir, Gpus) {
        let (dir, simulator) = simulated("h100-80gb:1", &[]);
        (
            dir,
            Gpus::from_backend(simulator as Arc<dyn gpu::GpuBackend>),
        )
    }

    /// A running `cat` and its stdin: the line it echoes back proves that it runs as `cat`, not as the test that
    /// forked it. Holding the stdin apart from the child keeps `cat` waiting for input until it is signalled:
    /// `Child::wait` closes a stdin the child still holds, and `cat` would then end on its own.
    async fn cat() -> (Child, ChildStdin) {
        let mut child = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("cat starts");
        let mut stdin = child.stdin.take().expect("a stdin");
        stdin.write_all(b"ready\n").await.expect("cat reads");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("a stdout"))
            .read_line(&mut line)
            .await
            .expect("cat echoes");
        assert_eq!(line, "ready\n");
        (child, stdin)
    }

    /// `child` as the init, asked to reboot with SIGTERM: the SIGINT systemd is sent would not do here, since a
    /// shell that starts the tests in the background has its children ignore SIGINT.
    fn init_of(child: &Child, name: &'static str) -> Init {
        Init {
            pid: i32::try_from(child.id().expect("the child runs")).expect("a pid fits i32"),
            name,
            reboot_signal: Signal::SIGTERM,
        }
    }

    #[test]
    fn the_hosts_systemd_is_asked_with_sigint_its_ctrl_alt_del() {
        assert_eq!(
            Init::host_systemd(),
            Init {
                pid: 1,
                name: "systemd",
                reboot_signal: Signal::SIGINT
            }
        );
    }

    #[tokio::test]
    async fn a_process_that_is_not_the_init_is_never_signalled() {
        let (_dir, gpus) = real_gpus();
        let (mut child, _stdin) = cat().await;
        let error = reboot(&gpus, &init_of(&child, "systemd"))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, RebootError::NotInit { found, .. } if found == "cat"),
            "{error}"
        );
        assert!(error.to_string().contains("WITH_REBOOT=true"), "{error}");
        assert!(
            child.try_wait().expect("the child is ours").is_none(),
            "the process was left alone"
        );
        child.kill().await.expect("the child stops");
    }

    #[tokio::test]
    async fn the_init_gets_its_reboot_signal_and_the_agent_waits_to_be_stopped() {
        let (_dir, gpus) = real_gpus();
        let (mut child, _stdin) = cat().await;
        let init = init_of(&child, "cat");
        tokio::select! {
            result = reboot(&gpus, &init) => panic!("a real reboot never returns: {result:?}"),
            status = child.wait() => {
                assert_eq!(status.expect("the child ends").signal(), Some(Signal::SIGTERM as i32));
            }
        }
    }
}

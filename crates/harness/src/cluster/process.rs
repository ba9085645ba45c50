//! The control-plane processes: started detached from xtask, recorded by PID, and stopped by exactly those PIDs.

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::progress;

/// A process that `cluster up` started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    pub pid: u32,
    /// The executable it was started as, to tell it from an unrelated process that got the same PID later.
    pub binary: PathBuf,
    pub log: PathBuf,
}

/// Starts `binary args` with extra environment `env` in its own process group (so the terminal's Ctrl-C and
/// xtask's exit leave it running), with stdin closed and stdout and stderr appended to `log`.
pub fn spawn(
    name: &str,
    binary: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
) -> anyhow::Result<(Child, Record)> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let err = out.try_clone()?;
    let child = Command::new(binary)
        .args(args)
        .envs(env.iter().map(|(key, value)| (key, value)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {name} ({})", binary.display()))?;
    let record = Record {
        name: name.to_owned(),
        pid: child.id(),
        binary: binary.to_owned(),
        log: log.to_owned(),
    };
    Ok((child, record))
}

/// Whether the recorded process still runs: its PID exists, is not a zombie, and runs the recorded binary.
pub fn is_running(record: &Record) -> bool {
    let proc_dir = PathBuf::from(format!("/proc/{}", record.pid));
    let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else {
        return false;
    };
    let Ok(cmdline) = std::fs::read(proc_dir.join("cmdline")) else {
        return false;
    };
    !is_zombie(&stat) && runs_binary(&cmdline, &record.binary)
}

/// Whether a `/proc/<pid>/stat` line says the process has exited but not been reaped (or is being torn down).
pub fn is_zombie(stat: &str) -> bool {
    // The state follows the command name, which is in parentheses and may itself contain ") ".
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .is_some_and(|state| matches!(state, 'Z' | 'X'))
}

/// Whether a `/proc/<pid>/cmdline` (NUL-separated argv) starts with `binary`.
pub fn runs_binary(cmdline: &[u8], binary: &Path) -> bool {
    let argv0 = cmdline.split(|byte| *byte == 0).next().unwrap_or_default();
    argv0 == binary.as_os_str().as_encoded_bytes()
}

/// Stops the recorded processes one at a time, last started first (so kwok and the controllers go before the API
/// server, and the API server before etcd): SIGTERM, up to `grace` to exit, then SIGKILL. Processes that already
/// exited are skipped.
pub fn stop_all(records: &[Record], grace: Duration) -> anyhow::Result<()> {
    for record in records.iter().rev() {
        stop(record, grace)?;
    }
    Ok(())
}

fn stop(record: &Record, grace: Duration) -> anyhow::Result<()> {
    if !is_running(record) {
        return Ok(());
    }
    signal(record, Signal::SIGTERM)?;
    if wait_exit(record, grace) {
        return Ok(());
    }
    progress::say(format!(
        "{} (pid {}) ignored SIGTERM for {grace:?}; sending SIGKILL",
        record.name, record.pid
    ));
    signal(record, Signal::SIGKILL)?;
    anyhow::ensure!(
        wait_exit(record, Duration::from_secs(5)),
        "{} (pid {}) is still running after SIGKILL",
        record.name,
        record.pid
    );
    Ok(())
}

/// Waits up to `timeout` for the process to exit; true when it did.
fn wait_exit(record: &Record, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while is_running(record) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

fn signal(record: &Record, signal: Signal) -> anyhow::Result<()> {
    let pid =
        i32::try_from(record.pid).with_context(|| format!("pid {} out of range", record.pid))?;
    match kill(Pid::from_raw(pid), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(error) => Err(error)
            .with_context(|| format!("cannot send {signal} to {} (pid {pid})", record.name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_state_after_the_command_name() {
        assert!(!is_zombie("1234 (etcd) S 1 1234 1234 0 -1"));
        assert!(is_zombie("1234 (kube-apiserver) Z 1 1234"));
        assert!(!is_zombie("1234 (odd) name) R 1"));
        assert!(is_zombie("1234 (odd) name) Z 1"));
        assert!(!is_zombie("garbage"));
    }

    #[test]
    fn matches_argv0_exactly() {
        let binary = Path::new("/c/bin/set/etcd");
        assert!(runs_binary(b"/c/bin/set/etcd\0--name=default\0", binary));
        assert!(!runs_binary(b"/c/bin/set/etcdctl\0", binary));
        assert!(!runs_binary(b"", binary));
    }

    #[test]
    fn starts_detached_and_stops_by_pid() {
        let dir = std::env::temp_dir().join(format!("xtask-process-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sleep.log");
        let (mut child, record) =
            spawn("sleep", Path::new("/bin/sleep"), &["30".into()], &[], &log).unwrap();
        // Between fork and exec the child still shows the test binary's command line.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !is_running(&record) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(is_running(&record));
        // Reap it in a thread, so that once stopped it does not stay a zombie of the test process.
        let reaper = std::thread::spawn(move || child.wait());
        stop_all(std::slice::from_ref(&record), Duration::from_secs(5)).unwrap();
        assert!(!reaper.join().unwrap().unwrap().success());
        assert!(!is_running(&record));
        stop_all(&[record], Duration::from_secs(1)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Which host process a pid names right now. A pid alone is not an identity: once its process exits, the kernel
//! hands the number to the next one. A pid with the process's start time is: the simulator ends a simulated GPU
//! user when the real process it stands for exits, and the watchdog never signals a process that has replaced the
//! one it measured.

use std::fs;
use std::path::Path;

/// A host process: its pid and its start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostProcess {
    /// The pid, in the PID namespace of `proc_root`.
    pub pid: u32,
    /// Start time in clock ticks since boot.
    pub start_time: u64,
}

impl HostProcess {
    /// The process `pid` names now under `proc_root` (`/proc`, or the host's procfs mounted elsewhere); `None`
    /// when no such process runs.
    #[must_use]
    pub fn find(proc_root: &Path, pid: u32) -> Option<Self> {
        let stat = fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
        Some(Self {
            pid,
            start_time: start_time(&stat)?,
        })
    }

    /// Whether this very process still runs (its pid is not free, nor taken by a later process).
    #[must_use]
    pub fn is_running(&self, proc_root: &Path) -> bool {
        Self::find(proc_root, self.pid) == Some(*self)
    }
}

/// The start time in a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and may itself hold
/// spaces and parentheses, so fields are counted from the last `)`.
fn start_time(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    // After the name: field 3 (state) is the first; field 22 (starttime) is the 20th.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_counted_after_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 150 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    2318336 131 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0";
        assert_eq!(start_time(stat), Some(987_654));
        assert_eq!(start_time("4242 (truncated) S 1"), None);
    }

    #[test]
    fn this_process_is_found_and_a_free_pid_is_not() {
        let proc_root = Path::new("/proc");
        let me = HostProcess::find(proc_root, std::process::id()).expect("this process runs");
        assert!(me.is_running(proc_root));
        let impostor = HostProcess {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(
            !impostor.is_running(proc_root),
            "a reused pid is another process"
        );
        // Above the kernel's pid_max (at most 2^22): never a running process.
        assert_eq!(HostProcess::find(proc_root, 1 << 23), None);
    }
}

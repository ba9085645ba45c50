//! GPU memory limits as the hardware's software enforces them, so that a simulated process that allocates past its
//! limit fails as a CUDA allocation would:
//! - per cgroup, by an R615+ driver (`nvmlDeviceSetMemoryLimits`, which the container toolkit's
//!   `apply-cuda-memory-limits` hook calls when a container is created): every process of the cgroup together;
//! - per MPS client, by the pinned-memory limit in its environment (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`), which the
//!   client library enforces for each process alone.
//!
//! Limits apply to simulated processes that stand for real host processes (their cgroup and environment are
//! real); the others have neither.

use std::path::Path;

use super::Simulator;
use super::state::GpuState;
use crate::error::{GpuError, Result};

/// The MPS client's pinned device-memory limit variable (`<device>=<amount>[M|G]`, comma-separated).
const PINNED_LIMIT_ENV: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

impl Simulator {
    /// Installs driver `version` on the node (every GPU reports it from now on), as a driver upgrade does.
    ///
    /// # Errors
    /// When the state file cannot be written.
    pub fn set_driver_version(&self, version: &str) -> Result<()> {
        self.file.update(|state| {
            for gpu in &mut state.gpus {
                gpu.driver_version = Some(version.to_owned());
            }
            Ok(())
        })
    }

    /// Caps what the processes of `cgroup` (a cgroup v2 path, as `/proc/<pid>/cgroup` gives it) may hold on a GPU
    /// together, as `nvmlDeviceSetMemoryLimits` does.
    ///
    /// # Errors
    /// `NotSupported` when the driver is older than R615 or the GPU is in MIG mode (the driver's limits do not
    /// apply to MIG devices); `InvalidArgument` for an empty cgroup; `NotFound` for an unknown GPU.
    pub fn set_memory_limit(&self, gpu: u32, cgroup: &str, limit_mib: u64) -> Result<()> {
        self.file.update(|state| {
            let state_gpu = state.gpu_mut(gpu)?;
            let version = state_gpu.driver_version();
            if !crd::dra::driver_caps_memory(version) {
                return Err(GpuError::NotSupported(format!(
                    "per-cgroup memory limits need driver R{} or later; GPU {gpu} runs {version}",
                    crd::dra::DRIVER_MEMORY_LIMITS_BRANCH
                )));
            }
            if state_gpu.mig_mode.current {
                return Err(GpuError::NotSupported(format!(
                    "per-cgroup memory limits on GPU {gpu}: it is in MIG mode"
                )));
            }
            if cgroup.is_empty() {
                return Err(GpuError::InvalidArgument(
                    "a memory limit needs the cgroup it applies to".to_owned(),
                ));
            }
            state_gpu.memory_limits.insert(cgroup.to_owned(), limit_mib);
            Ok(())
        })
    }
}

/// Whether process `pid` may hold `memory_mib` on `gpu` now: refused, as an out-of-memory error names it, when its
/// MPS pinned limit or its cgroup's limit (with what the cgroup's other processes hold) would be passed.
pub(crate) fn check_allocation(gpu: &GpuState, pid: u32, memory_mib: u64) -> Result<()> {
    let Some(entry) = gpu.faults.host_processes.get(&pid) else {
        return Ok(());
    };
    if let Some(pinned) = entry.pinned_limit_mib
        && memory_mib > pinned
    {
        return Err(GpuError::InsufficientResources(format!(
            "out of memory: process {pid} asks for {memory_mib} MiB past its MPS pinned limit of {pinned} MiB"
        )));
    }
    let Some(&limit) = gpu.memory_limits.get(&entry.cgroup) else {
        return Ok(());
    };
    let others: u64 = gpu
        .faults
        .processes
        .iter()
        .filter(|process| process.pid != pid)
        .filter(|process| {
            gpu.faults
                .host_processes
                .get(&process.pid)
                .is_some_and(|other| other.cgroup == entry.cgroup)
        })
        .filter_map(|process| process.used_memory_mib)
        .sum();
    if others + memory_mib > limit {
        return Err(GpuError::InsufficientResources(format!(
            "out of memory: cgroup {} is limited to {limit} MiB by the driver; its processes would hold {} MiB",
            entry.cgroup,
            others + memory_mib
        )));
    }
    Ok(())
}

/// The cgroup v2 path of process `pid` under `proc_root` (the `0::` line of `/proc/<pid>/cgroup`); empty when it
/// has none (cgroup v1, or the process is gone).
pub(crate) fn cgroup_of(proc_root: &Path, pid: u32) -> String {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup"))
        .ok()
        .and_then(|cgroups| {
            cgroups
                .lines()
                .find_map(|line| line.strip_prefix("0::").map(str::to_owned))
        })
        .unwrap_or_default()
}

/// The pinned device-memory limit, in MiB, that process `pid`'s environment gives its first device (device 0: a
/// container sees only its own devices), if any.
pub(crate) fn pinned_limit_of(proc_root: &Path, pid: u32) -> Option<u64> {
    let environ = std::fs::read(proc_root.join(pid.to_string()).join("environ")).ok()?;
    let value = environ
        .split(|byte| *byte == 0)
        .filter_map(|entry| std::str::from_utf8(entry).ok())
        .find_map(|entry| entry.strip_prefix(PINNED_LIMIT_ENV)?.strip_prefix('='))?
        .to_owned();
    pinned_limit(&value)
}

/// Device 0's limit in a pinned-limit value: `0=3000M`, `0=2G,1=4G`, or a bare amount for every device.
fn pinned_limit(value: &str) -> Option<u64> {
    let amount = value
        .split(',')
        .find_map(|entry| match entry.split_once('=') {
            Some((device, amount)) => (device.trim() == "0").then_some(amount),
            None => Some(entry),
        })?;
    let amount = amount.trim();
    let (digits, scale) = match amount.chars().last()? {
        'M' | 'm' => (&amount[..amount.len() - 1], 1),
        'G' | 'g' => (&amount[..amount.len() - 1], 1024),
        _ => (amount, 1),
    };
    digits.parse::<u64>().ok().map(|number| number * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_limits_read_as_mps_writes_them() {
        assert_eq!(pinned_limit("0=3000M"), Some(3000));
        assert_eq!(pinned_limit("1=1G,0=2G"), Some(2048));
        assert_eq!(pinned_limit("8192M"), Some(8192));
        assert_eq!(pinned_limit("1=1G"), None);
        assert_eq!(pinned_limit("0=lots"), None);
    }

    #[test]
    fn a_processs_cgroup_and_pinned_limit_are_read_from_its_proc_entry() {
        let proc_root = tempfile::tempdir().unwrap();
        let entry = |pid: &str, cgroup: &str, environ: &[u8]| {
            let dir = proc_root.path().join(pid);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup"), cgroup).unwrap();
            std::fs::write(dir.join("environ"), environ).unwrap();
        };
        // A container's process on a cgroup v2 host, and one on a hybrid host (v1 controllers beside the unified
        // hierarchy).
        entry(
            "10",
            "0::/kubepods.slice/pod-a.slice/cri-containerd-1.scope\n",
            b"PATH=/bin\0CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3000M\0",
        );
        entry("11", "4:memory:/x\n0::/\n", b"PATH=/bin\0");
        entry("12", "4:memory:/x\n1:cpu:/\n", b"");
        let root = proc_root.path();
        assert_eq!(
            cgroup_of(root, 10),
            "/kubepods.slice/pod-a.slice/cri-containerd-1.scope"
        );
        assert_eq!(pinned_limit_of(root, 10), Some(3000));
        assert_eq!(cgroup_of(root, 11), "/");
        assert_eq!(pinned_limit_of(root, 11), None);
        assert_eq!(cgroup_of(root, 12), "", "cgroup v1 only: no limit applies");
        assert_eq!(cgroup_of(root, 13), "", "gone");
    }
}

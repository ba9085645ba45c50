//! Faults a test injects into a simulated node: XID events, processes holding GPU memory, a failing reset, slow
//! operations. They live in the state file, so the agent, device plugin and exporter of the node all see a fault
//! that the test injected from its own process.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::state::{GpuState, KEPT_EVENTS, StoredEvent};
use super::telemetry::SimulatedCounters;
use super::{Simulator, memory_limits};
use crate::error::{GpuError, Result};
use crate::host_process::HostProcess;
use crate::types::{GpuProcess, HealthEvent};

/// The faults of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Faults {
    /// Processes that hold the GPU (and memory on it).
    pub processes: Vec<GpuProcess>,
    /// Those of `processes` that stand for real host processes, by pid: when one exits, it stops using the GPU, as
    /// the driver frees a process's memory when it exits.
    #[serde(default)]
    pub host_processes: BTreeMap<u32, HostEntry>,
    /// How a reset fails, if it should.
    pub reset_failure: Option<ResetFailure>,
    /// Added to every operation on the GPU, in milliseconds.
    pub delay_ms: u64,
    /// Error, throttling and NVLink counters a test set; `None`: a healthy GPU's.
    #[serde(default)]
    pub counters: Option<SimulatedCounters>,
}

/// A real process standing for a GPU user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostEntry {
    /// Its start time, so that a reused pid is not taken for it.
    pub start_time: u64,
    /// The PID namespace its pid is valid in (`/proc/self/ns/pid` of the process that reported it). Only a reader
    /// in that namespace can tell whether it still runs: the node's containers without the host's PID namespace
    /// see none of the host's processes.
    pub pid_namespace: String,
    /// Its cgroup v2 path, which the driver's memory limits apply to (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cgroup: String,
    /// The MPS pinned device-memory limit of its environment, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_limit_mib: Option<u64>,
}

/// This process's PID namespace, as `/proc/self/ns/pid` names it (`pid:[4026531836]`); empty if unreadable.
pub(crate) fn own_pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|link| link.display().to_string())
        .unwrap_or_default()
}

impl Faults {
    /// The injected delay.
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms)
    }

    /// Ends the simulated processes whose host process has exited (or whose pid another process has taken), of
    /// those this process can see (`pid_namespace`, its own). Returns whether any ended.
    pub fn end_exited_host_processes(&mut self, pid_namespace: &str) -> bool {
        let proc_root = Path::new("/proc");
        let exited: Vec<u32> = self
            .host_processes
            .iter()
            .filter(|&(&pid, entry)| {
                entry.pid_namespace == pid_namespace
                    && !HostProcess {
                        pid,
                        start_time: entry.start_time,
                    }
                    .is_running(proc_root)
            })
            .map(|(&pid, _)| pid)
            .collect();
        for pid in &exited {
            self.host_processes.remove(pid);
            self.processes.retain(|process| process.pid != *pid);
        }
        !exited.is_empty()
    }
}

/// How an injected reset failure shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResetFailure {
    /// The platform cannot reset GPUs (as in many VMs): `NotSupported`, the node must be rebooted instead.
    Unsupported,
    /// The reset is attempted and fails: `Other`.
    Fails,
}

impl ResetFailure {
    pub(crate) fn error(self, index: u32) -> GpuError {
        match self {
            Self::Unsupported => GpuError::NotSupported(format!(
                "GPU {index} cannot be reset on this platform; reboot the node to apply a pending MIG mode"
            )),
            Self::Fails => GpuError::Other(format!("GPU {index} reset failed (injected fault)")),
        }
    }
}

/// Checks that a process's place exists: on a MIG GPU it runs in an existing MIG device, otherwise on the GPU.
fn check_place(index: u32, gpu: &GpuState, process: &GpuProcess) -> Result<()> {
    match (
        gpu.mig_mode.current,
        process.gpu_instance_id,
        process.compute_instance_id,
    ) {
        (false, None, None) => Ok(()),
        (true, Some(gpu_instance), Some(compute)) => {
            let exists = gpu.gpu_instances.iter().any(|instance| {
                instance.id == gpu_instance
                    && instance.compute_instances.iter().any(|ci| ci.id == compute)
            });
            if exists {
                Ok(())
            } else {
                Err(GpuError::NotFound(format!(
                    "MIG device {gpu_instance}/{compute} on GPU {index}"
                )))
            }
        }
        (true, _, _) => Err(GpuError::InvalidArgument(format!(
            "GPU {index} has MIG on: a process runs in a MIG device (give GPU- and compute-instance ids)"
        ))),
        (false, _, _) => Err(GpuError::InvalidArgument(format!(
            "GPU {index} has MIG off: a process cannot name GPU or compute instances"
        ))),
    }
}

/// Fault injection. Each call changes the shared state file, so every process of the node sees it.
impl Simulator {
    /// Queues a critical XID error on a GPU, as the driver reports one.
    ///
    /// # Errors
    /// `NotFound` for an unknown GPU; `Other` when the state file cannot be written.
    pub fn inject_xid(&self, gpu: u32, xid: u64) -> Result<()> {
        self.file.update(|state| {
            state.gpu(gpu)?;
            state.events.push(StoredEvent {
                sequence: state.next_event,
                event: HealthEvent::xid(gpu, xid),
            });
            state.next_event += 1;
            let excess = state.events.len().saturating_sub(KEPT_EVENTS);
            state.events.drain(..excess);
            Ok(())
        })
    }

    /// Starts a simulated process on a GPU (or, with MIG on, in one of its MIG devices) using GPU memory. While it
    /// runs, the GPU cannot be reset and its MIG device cannot be destroyed.
    ///
    /// # Errors
    /// `InvalidArgument` when the process's place does not match the MIG mode, or the pid is already running there;
    /// `NotFound` for an unknown GPU or MIG device.
    pub fn start_process(&self, gpu: u32, process: GpuProcess) -> Result<()> {
        self.add_process(gpu, process, None)
    }

    /// Reports a real host process as a user of a GPU (or MIG device), as the driver would list it: it runs there
    /// until it exits (or [`Simulator::stop_process`]), with the memory figure a test sets and changes
    /// ([`Simulator::set_process_memory`]). This is how the watchdog and the exporter's per-pod accounting run on
    /// real processes in real pods without a GPU. The pid is this process's; its exit is noticed by the node's
    /// processes that share this PID namespace (the host's, for the watchdog and MIG manager), and recorded in the
    /// file for the others.
    ///
    /// # Errors
    /// `NotFound` when no process `process.pid` runs on this host; otherwise as [`Simulator::start_process`].
    pub fn start_host_process(&self, gpu: u32, process: GpuProcess) -> Result<()> {
        let host = HostProcess::find(Path::new("/proc"), process.pid).ok_or_else(|| {
            GpuError::NotFound(format!("host process {} (no such pid)", process.pid))
        })?;
        self.add_process(gpu, process, Some(host))
    }

    fn add_process(&self, gpu: u32, process: GpuProcess, host: Option<HostProcess>) -> Result<()> {
        let proc_root = Path::new("/proc");
        self.file.update(|state| {
            let now = super::now_ms();
            let state_gpu = state.gpu_mut(gpu)?;
            check_place(gpu, state_gpu, &process)?;
            if state_gpu
                .faults
                .processes
                .iter()
                .any(|running| running.pid == process.pid)
            {
                return Err(GpuError::InvalidArgument(format!(
                    "process {} already runs on GPU {gpu}",
                    process.pid
                )));
            }
            state_gpu.settle_energy(now);
            if let Some(host) = host {
                state_gpu.faults.host_processes.insert(
                    host.pid,
                    HostEntry {
                        start_time: host.start_time,
                        pid_namespace: own_pid_namespace(),
                        cgroup: memory_limits::cgroup_of(proc_root, host.pid),
                        pinned_limit_mib: memory_limits::pinned_limit_of(proc_root, host.pid),
                    },
                );
            }
            if let Some(memory_mib) = process.used_memory_mib
                && let Err(refused) =
                    memory_limits::check_allocation(state_gpu, process.pid, memory_mib)
            {
                state_gpu.faults.host_processes.remove(&process.pid);
                return Err(refused);
            }
            state_gpu.faults.processes.push(process);
            Ok(())
        })
    }

    /// Changes the GPU memory a running simulated process uses, as a real program allocates and frees. An
    /// allocation past the process's limits fails and changes nothing ([`memory_limits`]).
    ///
    /// # Errors
    /// `NotFound` when no such process runs on the GPU; `InsufficientResources` (out of memory) past a limit.
    pub fn set_process_memory(&self, gpu: u32, pid: u32, memory_mib: u64) -> Result<()> {
        self.file.update(|state| {
            let state_gpu = state.gpu_mut(gpu)?;
            memory_limits::check_allocation(state_gpu, pid, memory_mib)?;
            let process = state_gpu
                .faults
                .processes
                .iter_mut()
                .find(|process| process.pid == pid)
                .ok_or_else(|| GpuError::NotFound(format!("process {pid} on GPU {gpu}")))?;
            process.used_memory_mib = Some(memory_mib);
            Ok(())
        })
    }

    /// Ends a simulated process.
    ///
    /// # Errors
    /// `NotFound` when no such process runs on the GPU.
    pub fn stop_process(&self, gpu: u32, pid: u32) -> Result<()> {
        self.file.update(|state| {
            let now = super::now_ms();
            let state_gpu = state.gpu_mut(gpu)?;
            if !state_gpu
                .faults
                .processes
                .iter()
                .any(|process| process.pid == pid)
            {
                return Err(GpuError::NotFound(format!("process {pid} on GPU {gpu}")));
            }
            state_gpu.settle_energy(now);
            state_gpu
                .faults
                .processes
                .retain(|process| process.pid != pid);
            state_gpu.faults.host_processes.remove(&pid);
            Ok(())
        })
    }

    /// Makes resets of a GPU fail (`Some`) or succeed again (`None`).
    ///
    /// # Errors
    /// `NotFound` for an unknown GPU.
    pub fn set_reset_failure(&self, gpu: u32, failure: Option<ResetFailure>) -> Result<()> {
        self.file.update(|state| {
            state.gpu_mut(gpu)?.faults.reset_failure = failure;
            Ok(())
        })
    }

    /// Makes every operation on a GPU take at least `delay` longer (zero to stop).
    ///
    /// # Errors
    /// `NotFound` for an unknown GPU.
    pub fn set_delay(&self, gpu: u32, delay: Duration) -> Result<()> {
        self.file.update(|state| {
            state.gpu_mut(gpu)?.faults.delay_ms =
                u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            Ok(())
        })
    }

    /// Removes every fault of a GPU: processes end, resets succeed, no delay, healthy counters. Queued XID events
    /// stay queued.
    ///
    /// # Errors
    /// `NotFound` for an unknown GPU.
    pub fn clear_faults(&self, gpu: u32) -> Result<()> {
        self.file.update(|state| {
            let now = super::now_ms();
            let state_gpu = state.gpu_mut(gpu)?;
            state_gpu.settle_energy(now);
            state_gpu.faults = Faults::default();
            Ok(())
        })
    }
}

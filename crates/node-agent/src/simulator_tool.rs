//! `gpu-node-agent simulator`: for end-to-end tests, injects faults into a simulated node from outside the agent
//! (a slow MIG change that a test can kill the agent in the middle of, GPUs that cannot be reset, processes using
//! GPU memory, simulated or real host processes whose memory figure the test changes, which the exporter and the
//! watchdog see, XID errors, which the device plugin and the exporter see) and lists its MIG devices (to show that
//! a change keeps the devices of the GPUs it does not touch).

use std::time::Duration;

use anyhow::Context;
use gpu::simulator::ResetFailure;
use gpu::{GpuBackend, GpuProcess};
use node_runtime::backend::{GpuSource, Gpus};

use crate::cli::{ResetFailureArg, SimulatorAction, SimulatorArgs};

/// Injects the fault (into every GPU of the node, or the one named), or lists the MIG devices.
///
/// # Errors
/// Without `--simulate`, or when the state file cannot be changed.
pub async fn run(args: &SimulatorArgs, source: &GpuSource) -> anyhow::Result<()> {
    let gpus = Gpus::open_reading_node(source, Some(&args.node_name)).await?;
    let simulator = gpus
        .simulator()
        .context("the simulator tool needs --simulate and --sim-state")?;
    match args.action {
        SimulatorAction::Delay { milliseconds } => {
            for gpu in 0..simulator.gpu_count()? {
                simulator.set_delay(gpu, Duration::from_millis(milliseconds))?;
            }
        }
        SimulatorAction::ResetFailure { failure } => {
            let failure = match failure {
                ResetFailureArg::Unsupported => Some(ResetFailure::Unsupported),
                ResetFailureArg::Fails => Some(ResetFailure::Fails),
                ResetFailureArg::None => None,
            };
            for gpu in 0..simulator.gpu_count()? {
                simulator.set_reset_failure(gpu, failure)?;
            }
        }
        SimulatorAction::StartProcess {
            gpu,
            pid,
            memory_mib,
            gpu_instance,
            compute_instance,
            host_process,
        } => {
            let process = GpuProcess {
                pid,
                used_memory_mib: Some(memory_mib),
                gpu_instance_id: gpu_instance,
                compute_instance_id: compute_instance,
            };
            if host_process {
                simulator.start_host_process(gpu, process)?;
            } else {
                simulator.start_process(gpu, process)?;
            }
        }
        SimulatorAction::SetProcessMemory {
            gpu,
            pid,
            memory_mib,
        } => simulator.set_process_memory(gpu, pid, memory_mib)?,
        SimulatorAction::StopProcess { gpu, pid } => simulator.stop_process(gpu, pid)?,
        SimulatorAction::DriverVersion { ref version } => simulator.set_driver_version(version)?,
        SimulatorAction::MemoryLimit {
            gpu,
            ref cgroup,
            memory_mib,
        } => simulator.set_memory_limit(gpu, cgroup, memory_mib)?,
        SimulatorAction::Xid { gpu, xid } => simulator.inject_xid(gpu, xid)?,
        SimulatorAction::Devices => {
            for gpu in 0..simulator.gpu_count()? {
                for device in simulator.mig_devices(gpu)? {
                    println!("{gpu} {}", device.uuid);
                }
            }
        }
    }
    Ok(())
}

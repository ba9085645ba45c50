//! `gpu-node-agent simulator`: injects faults into a simulated node from outside the agent, for end-to-end tests
//! (a slow MIG change that a test can kill the agent in the middle of).

use std::time::Duration;

use anyhow::Context;
use gpu::GpuBackend;

use crate::backend::{GpuSource, Gpus};
use crate::cli::{SimulatorArgs, SimulatorFault};

/// Injects the fault into every GPU of the node.
///
/// # Errors
/// Without `--simulate`, or when the state file cannot be changed.
pub async fn run(args: &SimulatorArgs, source: &GpuSource) -> anyhow::Result<()> {
    let gpus = Gpus::open_reading_node(source, Some(&args.node_name)).await?;
    let simulator = gpus
        .simulator()
        .context("the simulator tool needs --simulate and --sim-state")?;
    match args.fault {
        SimulatorFault::Delay { milliseconds } => {
            for gpu in 0..simulator.gpu_count()? {
                simulator.set_delay(gpu, Duration::from_millis(milliseconds))?;
            }
        }
    }
    Ok(())
}

//! A simulated node's GPUs, with the real MIG tables of the catalog, whose state lives in a file.
//!
//! The development and CI machines have no GPU, yet the agents, device plugin and exporter must run as they would on
//! one. The simulator answers the [`GpuBackend`] calls from a JSON state file that every process of the simulated
//! node opens (the `state` module explains the locking), and behaves like the hardware where callers depend on it (the
//! `hardware` module). Tests make things go wrong through the fault-injection methods of [`Simulator`].

mod faults;
mod hardware;
mod memory_limits;
mod spec;
mod state;
mod telemetry;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Mutex;
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

pub use faults::ResetFailure;
pub use spec::{MAX_SIMULATED_GPUS, SimulatedGpus, SpecError};
pub use telemetry::SimulatedCounters;

use self::state::{GpuState, StateFile};
use crate::backend::GpuBackend;
use crate::error::{GpuError, Result};
use crate::types::{
    ComputeInstance, GpuDetails, GpuInstance, GpuInstanceProfileInfo, GpuInventory, GpuProcess,
    HealthEvent, MigDevice, MigMode, Placement, Telemetry,
};

/// A handle on a simulated node. Cheap to open; any number of handles, in any processes, may share one state file.
#[derive(Debug)]
pub struct Simulator {
    file: StateFile,
    /// Sequence number of the next health event this handle has not returned yet.
    event_cursor: Mutex<u64>,
}

/// Milliseconds since the Unix epoch: the simulator's clock for energy counters.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

impl Simulator {
    /// Opens the simulated node whose state is in `state_file`, creating it (every GPU with MIG off) on first use.
    /// GPU UUIDs derive from `node_name` and the index, so they are the same in every process and after restarts.
    ///
    /// # Errors
    /// `InvalidArgument` when the file holds another node or another GPU spec (remove it to start over); `Other` when
    /// it cannot be read or written.
    pub fn open(
        state_file: impl Into<PathBuf>,
        node_name: &str,
        spec: &SimulatedGpus,
    ) -> Result<Self> {
        let file = StateFile::new(state_file.into());
        let state = file.open_or_create(
            || hardware::new_node(node_name, spec, now_ms()),
            |existing| {
                if existing.node_name == node_name && existing.spec == spec.to_string() {
                    Ok(())
                } else {
                    Err(GpuError::InvalidArgument(format!(
                        "simulator state {} belongs to node {} with GPUs {}, not node {node_name} with GPUs {spec}; \
                         remove the file to start over",
                        file.path().display(),
                        existing.node_name,
                        existing.spec
                    )))
                }
            },
        )?;
        Ok(Self {
            file,
            // Like an NVML event set, a new handle sees only events that arrive after it was opened.
            event_cursor: Mutex::new(state.next_event),
        })
    }

    /// Turns MIG on and creates `devices` on every GPU, as applying a uniform mig-parted config to a fresh node
    /// does: the quick way to start a test from a geometry.
    ///
    /// # Errors
    /// `InvalidArgument` when a GPU has no MIG tables or the devices do not fit it; the backend's errors.
    pub fn create_on_every_gpu(
        &self,
        devices: &std::collections::BTreeMap<crd::mig::MigProfileName, u32>,
    ) -> Result<()> {
        for gpu in 0..self.gpu_count()? {
            self.set_mig_mode(gpu, true)?;
            self.reset(gpu)?;
            let model = self.gpu(gpu)?.model().ok_or_else(|| {
                GpuError::InvalidArgument(format!("GPU {gpu} has no MIG profile tables"))
            })?;
            let steps = crate::planner::plan(model, &[], devices)
                .map_err(|error| GpuError::InvalidArgument(format!("GPU {gpu}: {error}")))?;
            crate::backend::apply_plan(self, gpu, &steps)?;
        }
        Ok(())
    }

    /// Runs a read-only operation on one GPU, then waits for the GPU's injected delay.
    fn with_gpu<T>(&self, index: u32, operation: impl FnOnce(&GpuState) -> Result<T>) -> Result<T> {
        let state = self.file.read()?;
        let gpu = state.gpu(index)?;
        let result = operation(gpu);
        thread::sleep(gpu.faults.delay());
        result
    }

    /// Runs a changing operation on one GPU under the exclusive lock, then waits for the GPU's injected delay
    /// (outside the lock, so a slow GPU does not stall the other processes of the node).
    fn with_gpu_mut<T>(
        &self,
        index: u32,
        operation: impl FnOnce(&mut GpuState) -> Result<T>,
    ) -> Result<T> {
        let mut delay = None;
        let result = self.file.update(|state| {
            let gpu = state.gpu_mut(index)?;
            delay = Some(gpu.faults.delay());
            operation(gpu)
        });
        if let Some(delay) = delay {
            thread::sleep(delay);
        }
        result
    }
}

impl GpuBackend for Simulator {
    fn gpu_count(&self) -> Result<u32> {
        let count = self.file.read()?.gpus.len();
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    fn gpu(&self, index: u32) -> Result<GpuInventory> {
        self.with_gpu(index, |gpu| hardware::inventory(index, gpu))
    }

    fn gpu_instance_profile(&self, gpu: u32, nvml_index: u32) -> Result<GpuInstanceProfileInfo> {
        self.with_gpu(gpu, |state| hardware::profile_info(state, nvml_index))
    }

    fn gpu_instance_placements(&self, gpu: u32, profile_id: u32) -> Result<Vec<Placement>> {
        self.with_gpu(gpu, |state| hardware::placements(gpu, state, profile_id))
    }

    fn gpu_instances(&self, gpu: u32) -> Result<Vec<GpuInstance>> {
        self.with_gpu(gpu, |state| hardware::gpu_instances(gpu, state))
    }

    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance> {
        self.with_gpu_mut(gpu, |state| {
            hardware::create_gpu_instance(gpu, state, profile_id, placement)
        })
    }

    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance_id: u32) -> Result<()> {
        self.with_gpu_mut(gpu, |state| {
            hardware::destroy_gpu_instance(gpu, state, gpu_instance_id)
        })
    }

    fn compute_instances(&self, gpu: u32, gpu_instance_id: u32) -> Result<Vec<ComputeInstance>> {
        self.with_gpu(gpu, |state| {
            hardware::compute_instances(gpu, state, gpu_instance_id)
        })
    }

    fn create_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
        compute_slices: u32,
    ) -> Result<ComputeInstance> {
        self.with_gpu_mut(gpu, |state| {
            hardware::create_compute_instance(gpu, state, gpu_instance_id, compute_slices)
        })
    }

    fn destroy_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<()> {
        self.with_gpu_mut(gpu, |state| {
            hardware::destroy_compute_instance(gpu, state, gpu_instance_id, compute_instance_id)
        })
    }

    fn mig_devices(&self, gpu: u32) -> Result<Vec<MigDevice>> {
        self.with_gpu(gpu, hardware::mig_devices)
    }

    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>> {
        self.with_gpu(gpu, |state| Ok(state.faults.processes.clone()))
    }

    fn telemetry(&self, gpu: u32) -> Result<Telemetry> {
        self.with_gpu(gpu, |state| hardware::telemetry(state, now_ms()))
    }

    fn details(&self, gpu: u32) -> Result<GpuDetails> {
        self.with_gpu(gpu, |state| Ok(telemetry::details(state)))
    }

    fn health_events(&self) -> Result<Vec<HealthEvent>> {
        let state = self.file.read()?;
        let mut cursor = self
            .event_cursor
            .lock()
            .map_err(|_| GpuError::Other("simulator: the event cursor lock is poisoned".into()))?;
        let events = state
            .events
            .iter()
            .filter(|stored| stored.sequence >= *cursor)
            .map(|stored| stored.event)
            .collect();
        *cursor = state.next_event;
        Ok(events)
    }

    fn reset(&self, gpu: u32) -> Result<()> {
        self.with_gpu_mut(gpu, |state| hardware::reset(gpu, state))
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigMode> {
        self.with_gpu_mut(gpu, |state| {
            state.catalog_model()?;
            Ok(hardware::set_mig_mode(state, enabled))
        })
    }
}

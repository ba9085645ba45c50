//! The one trait every GPU user goes through, so that the node agents, the device plugin and the exporter run the
//! same code on real GPUs (NVML) and on the simulator.
//!
//! Synchronous on purpose: NVML is a blocking C API, and hiding that behind `async` would only move the blocking
//! somewhere less visible. Async callers wrap calls in `tokio::task::spawn_blocking`; the trait is `Send + Sync`
//! so a backend can sit in an `Arc` shared by tasks.

use std::fmt;

use crate::error::{GpuError, Result};
use crate::planner::{ExistingInstance, MigPlan};
use crate::types::{
    ComputeInstance, GpuDetails, GpuInstance, GpuInstanceProfileInfo, GpuInventory, GpuProcess,
    HealthEvent, MigDevice, MigMode, Placement, Telemetry,
};

/// How many NVML GPU-instance profile constants there are (`NVML_GPU_INSTANCE_PROFILE_COUNT`): the range
/// [`GpuBackend::gpu_instance_profiles`] asks about.
pub const GPU_INSTANCE_PROFILE_INDEX_COUNT: u32 = 17;

/// Everything the node agents do with a GPU. GPUs are named by their NVML index on the node.
pub trait GpuBackend: Send + Sync + fmt::Debug {
    /// Number of GPUs on the node.
    ///
    /// # Errors
    /// `LibraryNotFound` when there is no driver; `Other` for driver failures.
    fn gpu_count(&self) -> Result<u32>;

    /// Identity, model, capabilities and MIG mode of one GPU.
    ///
    /// # Errors
    /// `NotFound` for an index that is not on the node.
    fn gpu(&self, index: u32) -> Result<GpuInventory>;

    /// Every GPU of the node, in index order.
    ///
    /// # Errors
    /// As [`GpuBackend::gpu`].
    fn gpus(&self) -> Result<Vec<GpuInventory>> {
        (0..self.gpu_count()?)
            .map(|index| self.gpu(index))
            .collect()
    }

    /// One GPU-instance profile, by its NVML constant (`nvml_index` in the catalog).
    ///
    /// # Errors
    /// `NotSupported` when the GPU has no such profile; `InvalidArgument` for a constant NVML does not define.
    fn gpu_instance_profile(&self, gpu: u32, nvml_index: u32) -> Result<GpuInstanceProfileInfo>;

    /// Every GPU-instance profile the GPU offers.
    ///
    /// # Errors
    /// As [`GpuBackend::gpu_instance_profile`], except that profiles the GPU lacks are left out.
    fn gpu_instance_profiles(&self, gpu: u32) -> Result<Vec<GpuInstanceProfileInfo>> {
        let mut profiles = Vec::new();
        for nvml_index in 0..GPU_INSTANCE_PROFILE_INDEX_COUNT {
            match self.gpu_instance_profile(gpu, nvml_index) {
                Ok(profile) => profiles.push(profile),
                Err(GpuError::NotSupported(_) | GpuError::InvalidArgument(_)) => {}
                Err(other) => return Err(other),
            }
        }
        Ok(profiles)
    }

    /// Every placement a GPU instance of this profile may take (regardless of what is occupied now).
    ///
    /// # Errors
    /// `NotSupported` when MIG is off or the profile unknown.
    fn gpu_instance_placements(&self, gpu: u32, profile_id: u32) -> Result<Vec<Placement>>;

    /// The GPU instances on a GPU, by id.
    ///
    /// # Errors
    /// `NotSupported` when MIG is off.
    fn gpu_instances(&self, gpu: u32) -> Result<Vec<GpuInstance>>;

    /// Creates a GPU instance at an explicit placement. Explicit placements are how the planner avoids the
    /// "Insufficient Resources" that creating in the wrong order causes.
    ///
    /// # Errors
    /// `InsufficientResources` when the placement is taken, not allowed for the profile, or the profile is at its
    /// maximum count; `NotSupported` when MIG is off; `InvalidArgument` for an unknown profile.
    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance>;

    /// Destroys a GPU instance; its compute instances must be destroyed first.
    ///
    /// # Errors
    /// `InUse` while compute instances or processes exist in it; `NotFound` for an unknown id.
    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance_id: u32) -> Result<()>;

    /// The compute instances of a GPU instance, by id.
    ///
    /// # Errors
    /// `NotFound` for an unknown GPU instance.
    fn compute_instances(&self, gpu: u32, gpu_instance_id: u32) -> Result<Vec<ComputeInstance>>;

    /// Creates a compute instance of `compute_slices` slices (the `<C>` of a profile name) in a GPU instance.
    ///
    /// # Errors
    /// `InsufficientResources` when it does not fit; `NotSupported` for a size the GPU instance does not accept.
    fn create_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
        compute_slices: u32,
    ) -> Result<ComputeInstance>;

    /// Destroys a compute instance.
    ///
    /// # Errors
    /// `InUse` while processes run in it; `NotFound` for unknown ids.
    fn destroy_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<()>;

    /// The MIG devices (compute instances, with their UUIDs) of a GPU.
    ///
    /// # Errors
    /// `NotFound` for an unknown GPU.
    fn mig_devices(&self, gpu: u32) -> Result<Vec<MigDevice>>;

    /// Processes running on a GPU, with the MIG device they run in when MIG is on.
    ///
    /// # Errors
    /// `NotFound` for an unknown GPU.
    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>>;

    /// Utilization, clocks, temperatures, power, energy, memory use, throttling, memory errors and NVLink
    /// counters of a GPU.
    ///
    /// # Errors
    /// `NotFound` for an unknown GPU; readings the GPU does not offer are `None`, not errors.
    fn telemetry(&self, gpu: u32) -> Result<Telemetry>;

    /// The versions and serial number of a GPU's board and firmware.
    ///
    /// # Errors
    /// `NotFound` for an unknown GPU; texts the GPU does not offer are `None`, not errors.
    fn details(&self, gpu: u32) -> Result<GpuDetails>;

    /// Health events (critical XIDs) of every GPU that arrived since the previous call, or since this backend was
    /// opened; never blocks.
    ///
    /// # Errors
    /// `Other` when the driver's event queue fails.
    fn health_events(&self) -> Result<Vec<HealthEvent>>;

    /// Resets a GPU: a pending MIG mode takes effect and MIG instances are gone.
    ///
    /// # Errors
    /// `InUse` while any process holds the GPU; `NotSupported` where the platform cannot reset (reboot instead).
    fn reset(&self, gpu: u32) -> Result<()>;

    /// Sets the MIG mode; returns the mode afterwards. On most GPUs the change stays pending until [`reset`].
    ///
    /// [`reset`]: GpuBackend::reset
    ///
    /// # Errors
    /// `NotSupported` on a GPU that is not MIG capable.
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigMode>;
}

/// Carries out a [`MigPlan`] on a GPU: destroys what it drops (compute instances first, as NVML requires), then
/// creates each new GPU instance at its planned placement with its compute instance.
///
/// Stops at the first failure and leaves the GPU as far as it got; the plan is computed from whatever exists, so
/// planning again from [`current_geometry`] and applying that plan continues from there.
///
/// # Errors
/// The first backend error, e.g. `InUse` when a process still runs in an instance to destroy.
pub fn apply_plan(backend: &dyn GpuBackend, gpu: u32, plan: &MigPlan) -> Result<()> {
    for &gpu_instance_id in &plan.destroy {
        for compute in backend.compute_instances(gpu, gpu_instance_id)? {
            backend.destroy_compute_instance(gpu, gpu_instance_id, compute.id)?;
        }
        backend.destroy_gpu_instance(gpu, gpu_instance_id)?;
    }
    for planned in &plan.create {
        let instance = backend.create_gpu_instance(gpu, planned.profile_id, planned.placement)?;
        backend.create_compute_instance(gpu, instance.id, planned.compute_slices)?;
    }
    Ok(())
}

/// Reads a GPU's current MIG geometry in the form the planner takes: every GPU instance with the sizes of its
/// compute instances. Empty when MIG is off.
///
/// # Errors
/// Whatever the backend reports for listing instances.
pub fn current_geometry(backend: &dyn GpuBackend, gpu: u32) -> Result<Vec<ExistingInstance>> {
    let inventory = backend.gpu(gpu)?;
    if !inventory.mig_mode.is_some_and(|mode| mode.current) {
        return Ok(Vec::new());
    }
    backend
        .gpu_instances(gpu)?
        .into_iter()
        .map(|instance| {
            let compute_slices = backend
                .compute_instances(gpu, instance.id)?
                .iter()
                .map(|compute| compute.slice_count)
                .collect();
            Ok(ExistingInstance {
                gpu_instance_id: instance.id,
                profile_id: instance.profile_id,
                placement: instance.placement,
                compute_slices,
            })
        })
        .collect()
}

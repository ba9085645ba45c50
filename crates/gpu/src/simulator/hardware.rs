//! How a simulated GPU behaves: the rules a real one enforces, applied to its state. Pure functions of the state
//! (and the clock, passed in), so the rules are tested without files.
//!
//! The rules, and the NVML errors they produce, follow the NVML reference for the MIG calls and the facts in
//! reference/mig-profiles.md: MIG mode changes wait for a reset, a reset is refused while a process holds the GPU,
//! instances go only at allowed placements that are free, and never more than a profile's maximum.

use crd::mig::{GpuInstanceProfile, GpuModel, model_by_simulator_name};

use super::SimulatedGpus;
use super::state::{GpuState, NodeState, SimComputeInstance, SimGpuInstance};
use crate::backend::GPU_INSTANCE_PROFILE_INDEX_COUNT;
use crate::compute::{compute_profile_index, compute_slices_for, max_compute_instances};
use crate::error::{GpuError, Result};
use crate::types::{
    ComputeInstance, CudaVersion, GpuInstance, GpuInstanceProfileInfo, GpuInventory, MigDevice,
    MigMode, Placement, Telemetry,
};

/// The driver the simulated node pretends to run.
pub(crate) const DRIVER_VERSION: &str = "570.86.15";
/// The CUDA version that driver supports.
pub(crate) const CUDA_DRIVER_VERSION: CudaVersion = CudaVersion {
    major: 12,
    minor: 8,
};

/// Power draw of an idle and of a busy simulated GPU, in milliwatts.
const IDLE_POWER_MILLIWATTS: u32 = 60_000;
const BUSY_POWER_MILLIWATTS: u32 = 300_000;

/// A fresh node: every GPU with MIG off, no instances, no faults.
pub(crate) fn new_node(node_name: &str, spec: &SimulatedGpus, now_ms: u64) -> NodeState {
    let gpus = spec
        .models()
        .enumerate()
        .map(|(index, model)| GpuState {
            model: model.simulator_name.to_owned(),
            uuid: derived_uuid("GPU", &format!("{node_name}/{index}")),
            mig_mode: MigMode::default(),
            gpu_instances: Vec::new(),
            faults: super::faults::Faults::default(),
            driver_version: None,
            memory_limits: std::collections::BTreeMap::new(),
            energy_millijoules: 0,
            energy_since_ms: now_ms,
        })
        .collect();
    NodeState {
        node_name: node_name.to_owned(),
        spec: spec.to_string(),
        next_event: 0,
        events: Vec::new(),
        gpus,
    }
}

/// A UUID (`PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) that depends only on `key`, so that a restarted process,
/// or another process of the same node, sees the same GPUs and MIG devices.
pub(crate) fn derived_uuid(prefix: &str, key: &str) -> String {
    // FNV-1a, twice with different offsets, for 128 bits; stability matters here, not cryptographic strength.
    let hash = |offset: u64| {
        key.bytes().fold(offset, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3)
        })
    };
    let bits =
        (u128::from(hash(0xCBF2_9CE4_8422_2325)) << 64) | u128::from(hash(0x6C62_272E_07BB_0142));
    let hex = format!("{bits:032x}");
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl GpuState {
    /// The driver version the GPU reports.
    pub fn driver_version(&self) -> &str {
        self.driver_version.as_deref().unwrap_or(DRIVER_VERSION)
    }

    /// The catalog model; an unknown name means the file was edited by hand or by an incompatible version.
    pub fn catalog_model(&self) -> Result<&'static GpuModel> {
        model_by_simulator_name(&self.model).ok_or_else(|| {
            GpuError::Other(format!(
                "simulator state names an unknown GPU model \"{}\"",
                self.model
            ))
        })
    }

    /// True when a process holds the GPU.
    fn busy(&self) -> bool {
        !self.faults.processes.is_empty()
    }

    fn power_milliwatts(&self) -> u32 {
        if self.busy() {
            BUSY_POWER_MILLIWATTS
        } else {
            IDLE_POWER_MILLIWATTS
        }
    }

    /// Energy used up to `now_ms`, in millijoules.
    pub fn energy_at(&self, now_ms: u64) -> u64 {
        let elapsed = now_ms.saturating_sub(self.energy_since_ms);
        self.energy_millijoules + u64::from(self.power_milliwatts()) * elapsed / 1000
    }

    /// Books the energy used so far, before something changes the power draw.
    pub fn settle_energy(&mut self, now_ms: u64) {
        self.energy_millijoules = self.energy_at(now_ms);
        self.energy_since_ms = now_ms;
    }

    fn require_mig(&self, index: u32) -> Result<()> {
        if self.mig_mode.current {
            Ok(())
        } else {
            Err(GpuError::NotSupported(format!(
                "MIG mode is disabled on GPU {index}"
            )))
        }
    }

    fn gpu_instance(&self, index: u32, id: u32) -> Result<&SimGpuInstance> {
        self.gpu_instances
            .iter()
            .find(|instance| instance.id == id)
            .ok_or_else(|| GpuError::NotFound(format!("GPU instance {id} on GPU {index}")))
    }

    fn profile_by_id(&self, id: u32) -> Result<Option<&'static GpuInstanceProfile>> {
        Ok(self
            .catalog_model()?
            .profiles
            .iter()
            .find(|profile| profile.id == id))
    }
}

/// Identity and state of a GPU, as NVML would report it.
pub(crate) fn inventory(index: u32, gpu: &GpuState) -> Result<GpuInventory> {
    let model = gpu.catalog_model()?;
    let sm_count = if gpu.mig_mode.current {
        // With MIG on, the SMs left are those of the full-GPU instance: the rest goes to MIG's own overhead.
        model
            .profiles
            .iter()
            .map(|profile| profile.sm_count)
            .max()
            .unwrap_or(model.sm_count)
    } else {
        model.sm_count
    };
    Ok(GpuInventory {
        index,
        uuid: gpu.uuid.clone(),
        product_name: model.product_name().to_owned(),
        pci_device_id: model.pci_device_ids[0],
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + index),
        memory_mib: model.memory_mib,
        multiprocessor_count: Some(sm_count),
        compute_capability: model.compute_capability,
        driver_version: gpu.driver_version().to_owned(),
        cuda_driver_version: CUDA_DRIVER_VERSION,
        mig_mode: Some(gpu.mig_mode),
    })
}

/// GPU-instance profile by NVML constant. Answered with MIG on or off, as NVML does for MIG-capable GPUs.
pub(crate) fn profile_info(gpu: &GpuState, nvml_index: u32) -> Result<GpuInstanceProfileInfo> {
    if nvml_index >= GPU_INSTANCE_PROFILE_INDEX_COUNT {
        return Err(GpuError::InvalidArgument(format!(
            "GPU-instance profile constant {nvml_index}"
        )));
    }
    let model = gpu.catalog_model()?;
    let profile = model
        .profiles
        .iter()
        .find(|profile| profile.nvml_index == nvml_index)
        .ok_or_else(|| {
            GpuError::NotSupported(format!(
                "GPU-instance profile constant {nvml_index} on {}",
                model.product_name()
            ))
        })?;
    Ok(GpuInstanceProfileInfo {
        nvml_index,
        id: profile.id,
        slice_count: u32::from(profile.name.slices),
        instance_count: profile.max_instances,
        memory_mib: profile.memory_mib,
        multiprocessor_count: profile.sm_count,
    })
}

/// Every placement the profile may take.
pub(crate) fn placements(index: u32, gpu: &GpuState, profile_id: u32) -> Result<Vec<Placement>> {
    gpu.require_mig(index)?;
    let profile = gpu.profile_by_id(profile_id)?.ok_or_else(|| {
        GpuError::NotSupported(format!(
            "GPU-instance profile id {profile_id} on GPU {index}"
        ))
    })?;
    Ok(Placement::of_profile(profile).collect())
}

/// The GPU instances, by id.
pub(crate) fn gpu_instances(index: u32, gpu: &GpuState) -> Result<Vec<GpuInstance>> {
    gpu.require_mig(index)?;
    let mut instances: Vec<GpuInstance> = gpu
        .gpu_instances
        .iter()
        .map(|instance| GpuInstance {
            id: instance.id,
            profile_id: instance.profile_id,
            placement: instance.placement,
        })
        .collect();
    instances.sort_by_key(|instance| instance.id);
    Ok(instances)
}

/// Creates a GPU instance at an explicit placement, refusing what the hardware refuses.
pub(crate) fn create_gpu_instance(
    index: u32,
    gpu: &mut GpuState,
    profile_id: u32,
    placement: Placement,
) -> Result<GpuInstance> {
    gpu.require_mig(index)?;
    let profile = gpu.profile_by_id(profile_id)?.ok_or_else(|| {
        GpuError::InvalidArgument(format!(
            "GPU-instance profile id {profile_id} on GPU {index}"
        ))
    })?;
    let name = profile.name;
    if placement.size != u32::from(profile.placement_size) {
        return Err(GpuError::InvalidArgument(format!(
            "placement {placement} for {name}, whose instances take {} memory slices",
            profile.placement_size
        )));
    }
    if !profile
        .placement_starts
        .iter()
        .any(|start| u32::from(*start) == placement.start)
    {
        return Err(GpuError::InsufficientResources(format!(
            "{name} cannot start at memory slice {} on GPU {index}",
            placement.start
        )));
    }
    let existing = gpu
        .gpu_instances
        .iter()
        .filter(|instance| instance.profile_id == profile_id)
        .count();
    if existing >= profile.max_instances as usize {
        return Err(GpuError::InsufficientResources(format!(
            "GPU {index} already has {existing} {name} instances, the most it holds"
        )));
    }
    if let Some(taken) = gpu
        .gpu_instances
        .iter()
        .find(|instance| instance.placement.overlaps(placement))
    {
        return Err(GpuError::InsufficientResources(format!(
            "placement {placement} for {name} overlaps GPU instance {} at {} on GPU {index}",
            taken.id, taken.placement
        )));
    }
    let id = lowest_free(gpu.gpu_instances.iter().map(|instance| instance.id), 1);
    gpu.gpu_instances.push(SimGpuInstance {
        id,
        profile_id,
        placement,
        compute_instances: Vec::new(),
    });
    Ok(GpuInstance {
        id,
        profile_id,
        placement,
    })
}

/// Destroys a GPU instance that has no compute instances and no processes.
pub(crate) fn destroy_gpu_instance(index: u32, gpu: &mut GpuState, id: u32) -> Result<()> {
    gpu.require_mig(index)?;
    let instance = gpu.gpu_instance(index, id)?;
    if !instance.compute_instances.is_empty() {
        return Err(GpuError::InUse(format!(
            "GPU instance {id} on GPU {index} still has {} compute instance(s)",
            instance.compute_instances.len()
        )));
    }
    if gpu
        .faults
        .processes
        .iter()
        .any(|process| process.gpu_instance_id == Some(id))
    {
        return Err(GpuError::InUse(format!(
            "GPU instance {id} on GPU {index} has running processes"
        )));
    }
    gpu.gpu_instances.retain(|instance| instance.id != id);
    Ok(())
}

/// The compute instances of a GPU instance, by id.
pub(crate) fn compute_instances(
    index: u32,
    gpu: &GpuState,
    gpu_instance_id: u32,
) -> Result<Vec<ComputeInstance>> {
    gpu.require_mig(index)?;
    let instance = gpu.gpu_instance(index, gpu_instance_id)?;
    let mut computes: Vec<ComputeInstance> = instance
        .compute_instances
        .iter()
        .map(|compute| compute_instance(gpu_instance_id, *compute))
        .collect();
    computes.sort_by_key(|compute| compute.id);
    Ok(computes)
}

fn compute_instance(gpu_instance_id: u32, compute: SimComputeInstance) -> ComputeInstance {
    ComputeInstance {
        id: compute.id,
        gpu_instance_id,
        profile_id: compute_profile_index(compute.slice_count).unwrap_or(u32::MAX),
        slice_count: compute.slice_count,
    }
}

/// Creates a compute instance of `slices` compute slices in a GPU instance.
pub(crate) fn create_compute_instance(
    index: u32,
    gpu: &mut GpuState,
    gpu_instance_id: u32,
    slices: u32,
) -> Result<ComputeInstance> {
    gpu.require_mig(index)?;
    let profile_id = gpu.gpu_instance(index, gpu_instance_id)?.profile_id;
    let profile = gpu.profile_by_id(profile_id)?.ok_or_else(|| {
        GpuError::Other(format!(
            "GPU instance {gpu_instance_id} has an unknown profile"
        ))
    })?;
    let gpu_slices = u32::from(profile.name.slices);
    if !compute_slices_for(gpu_slices).contains(&slices) {
        return Err(GpuError::NotSupported(format!(
            "a {}-slice compute instance in {} GPU instance {gpu_instance_id} on GPU {index}",
            slices, profile.name
        )));
    }
    let instance = gpu
        .gpu_instances
        .iter_mut()
        .find(|instance| instance.id == gpu_instance_id)
        .ok_or_else(|| {
            GpuError::NotFound(format!("GPU instance {gpu_instance_id} on GPU {index}"))
        })?;
    let same_size = instance
        .compute_instances
        .iter()
        .filter(|compute| compute.slice_count == slices)
        .count();
    let used: u32 = instance
        .compute_instances
        .iter()
        .map(|compute| compute.slice_count)
        .sum();
    if same_size as u32 >= max_compute_instances(gpu_slices, slices) || used + slices > gpu_slices {
        return Err(GpuError::InsufficientResources(format!(
            "no room for a {slices}-slice compute instance in GPU instance {gpu_instance_id} on GPU {index} \
             ({used} of {gpu_slices} slices in use)"
        )));
    }
    let id = lowest_free(
        instance.compute_instances.iter().map(|compute| compute.id),
        0,
    );
    let compute = SimComputeInstance {
        id,
        slice_count: slices,
    };
    instance.compute_instances.push(compute);
    Ok(compute_instance(gpu_instance_id, compute))
}

/// Destroys a compute instance no process runs in.
pub(crate) fn destroy_compute_instance(
    index: u32,
    gpu: &mut GpuState,
    gpu_instance_id: u32,
    id: u32,
) -> Result<()> {
    gpu.require_mig(index)?;
    let in_use = gpu.faults.processes.iter().any(|process| {
        process.gpu_instance_id == Some(gpu_instance_id) && process.compute_instance_id == Some(id)
    });
    let instance = gpu
        .gpu_instances
        .iter_mut()
        .find(|instance| instance.id == gpu_instance_id)
        .ok_or_else(|| {
            GpuError::NotFound(format!("GPU instance {gpu_instance_id} on GPU {index}"))
        })?;
    if !instance
        .compute_instances
        .iter()
        .any(|compute| compute.id == id)
    {
        return Err(GpuError::NotFound(format!(
            "compute instance {id} in GPU instance {gpu_instance_id} on GPU {index}"
        )));
    }
    if in_use {
        return Err(GpuError::InUse(format!(
            "compute instance {id} in GPU instance {gpu_instance_id} on GPU {index} has running processes"
        )));
    }
    instance
        .compute_instances
        .retain(|compute| compute.id != id);
    Ok(())
}

/// The MIG devices: one per compute instance, with a UUID derived from the GPU and the instance ids.
pub(crate) fn mig_devices(gpu: &GpuState) -> Result<Vec<MigDevice>> {
    if !gpu.mig_mode.current {
        return Ok(Vec::new());
    }
    let mut devices = Vec::new();
    for instance in &gpu.gpu_instances {
        let profile = gpu.profile_by_id(instance.profile_id)?.ok_or_else(|| {
            GpuError::Other(format!(
                "GPU instance {} has an unknown profile",
                instance.id
            ))
        })?;
        for compute in &instance.compute_instances {
            devices.push(MigDevice {
                uuid: derived_uuid(
                    "MIG",
                    &format!("{}/{}/{}", gpu.uuid, instance.id, compute.id),
                ),
                gpu_instance_id: instance.id,
                gpu_instance_profile_id: instance.profile_id,
                compute_instance_id: compute.id,
                compute_slice_count: compute.slice_count,
                memory_mib: profile.memory_mib,
                multiprocessor_count: profile.sm_count * compute.slice_count
                    / u32::from(profile.name.slices),
                engines: None,
            });
        }
    }
    devices.sort_by_key(|device| (device.gpu_instance_id, device.compute_instance_id));
    Ok(devices)
}

/// Readings of a GPU: idle or busy depending on whether a process holds it. Utilization is not reported with MIG
/// on, as on real GPUs; the counters are the GPU's (the `telemetry` module).
pub(crate) fn telemetry(gpu: &GpuState, now_ms: u64) -> Result<Telemetry> {
    let model = gpu.catalog_model()?;
    let busy = gpu.busy();
    let utilization =
        |busy_percent| (!gpu.mig_mode.current).then_some(if busy { busy_percent } else { 0 });
    let used: u64 = gpu
        .faults
        .processes
        .iter()
        .filter_map(|process| process.used_memory_mib)
        .sum();
    let reserved = super::telemetry::reserved_memory_mib(model.memory_mib);
    let temperature = if busy { 65 } else { 32 };
    let counters = gpu.counters();
    Ok(Telemetry {
        gpu_utilization_percent: utilization(100),
        memory_utilization_percent: utilization(40),
        sm_clock_mhz: Some(if busy { 1410 } else { 210 }),
        memory_clock_mhz: Some(1215),
        temperature_celsius: Some(temperature),
        power_milliwatts: Some(gpu.power_milliwatts()),
        total_energy_millijoules: Some(gpu.energy_at(now_ms)),
        memory_used_mib: Some(used.min(model.memory_mib - reserved)),
        memory_free_mib: Some(
            model
                .memory_mib
                .saturating_sub(reserved)
                .saturating_sub(used),
        ),
        memory_reserved_mib: Some(reserved),
        memory_temperature_celsius: Some(super::telemetry::memory_temperature_celsius(temperature)),
        // No simulated process encodes or decodes video.
        encoder_utilization_percent: utilization(0),
        decoder_utilization_percent: utilization(0),
        pcie_replays: counters.pcie_replays,
        throttling: counters.throttling,
        memory_errors: counters.memory_errors,
        nvlink: counters.nvlink,
    })
}

/// Resets a GPU: refused while a process holds it or when a failure is injected; otherwise the pending MIG mode
/// takes effect and every MIG instance is gone.
pub(crate) fn reset(index: u32, gpu: &mut GpuState) -> Result<()> {
    if gpu.busy() {
        let pids: Vec<String> = gpu
            .faults
            .processes
            .iter()
            .map(|process| process.pid.to_string())
            .collect();
        return Err(GpuError::InUse(format!(
            "GPU {index} cannot be reset while processes use it (pids {})",
            pids.join(", ")
        )));
    }
    if let Some(failure) = gpu.faults.reset_failure {
        return Err(failure.error(index));
    }
    gpu.mig_mode.current = gpu.mig_mode.pending;
    gpu.gpu_instances.clear();
    Ok(())
}

/// Sets the pending MIG mode; it takes effect at the next reset.
pub(crate) fn set_mig_mode(gpu: &mut GpuState, enabled: bool) -> MigMode {
    gpu.mig_mode.pending = enabled;
    gpu.mig_mode
}

/// The smallest id from `first` on that `used` does not contain.
fn lowest_free(used: impl Iterator<Item = u32>, first: u32) -> u32 {
    let used: Vec<u32> = used.collect();
    (first..).find(|id| !used.contains(id)).unwrap_or(first)
}

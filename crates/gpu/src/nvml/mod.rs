//! The real GPUs, through NVML (`nvml-wrapper`, which loads `libnvidia-ml.so.1` at run time).
//!
//! A node without a driver is a normal state for a GPU operator (the driver may not be installed yet, or the
//! container may lack the mount), so opening the backend there returns [`GpuError::LibraryNotFound`] with a message
//! that says so, never a panic. The MIG instance calls the safe wrapper lacks go through the `mig_sys` module; the
//! reset goes through `nvidia-smi` (the `reset` module) because NVML has no public reset call.

mod error;
mod fields_sys;
mod mig_sys;
mod reset;
mod telemetry;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, EventSet, Nvml, cuda_driver_version_major, cuda_driver_version_minor};

use self::error::{from_init, from_nvml};
use crate::backend::{GPU_INSTANCE_PROFILE_INDEX_COUNT, GpuBackend};
use crate::compute::compute_profile_index;
use crate::error::{GpuError, Result};
use crate::types::{
    ComputeInstance, CudaVersion, GpuDetails, GpuInstance, GpuInstanceProfileInfo, GpuInventory,
    GpuProcess, HealthEvent, MigDevice, MigEngines, MigMode, Placement, Telemetry,
};
use crd::mig::ComputeCapability;

/// NVML's value for "MIG enabled" in `nvmlDeviceGetMigMode`.
const MIG_ENABLED: u32 = 1;
const MIB: u64 = 1024 * 1024;

/// The process's NVML library, initialised once: NVML is process-wide state, and event sets borrow it for as long
/// as the backend lives, so it is never shut down.
static NVML: OnceLock<Nvml> = OnceLock::new();

fn nvml() -> Result<&'static Nvml> {
    if let Some(nvml) = NVML.get() {
        return Ok(nvml);
    }
    let nvml = Nvml::init().map_err(from_init)?;
    // If another thread won the race, its instance is kept and this one shut down (NVML counts initialisations).
    Ok(NVML.get_or_init(|| nvml))
}

/// The node's GPUs through NVML.
pub struct NvmlBackend {
    nvml: &'static Nvml,
    /// One event set per GPU that reports critical XIDs, registered when the backend was opened.
    events: Mutex<Vec<(u32, EventSet<'static>)>>,
}

impl fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvmlBackend").finish_non_exhaustive()
    }
}

/// Maps an NVML error with its context, for `map_err`.
fn failed(context: impl fmt::Display) -> impl FnOnce(NvmlError) -> GpuError {
    move |error| from_nvml(error, &context.to_string())
}

/// `Ok(None)` for a reading the GPU does not offer, so that one unsupported counter does not hide the others.
fn optional<T>(result: std::result::Result<T, NvmlError>, context: &str) -> Result<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(NvmlError::NotSupported) => Ok(None),
        Err(error) => Err(from_nvml(error, context)),
    }
}

impl NvmlBackend {
    /// Initialises NVML and starts watching every GPU for critical XID errors (GPUs that cannot report them, such
    /// as some consumer parts, are not watched).
    ///
    /// # Errors
    /// [`GpuError::LibraryNotFound`] when the driver or `libnvidia-ml.so.1` is missing; other NVML failures.
    pub fn new() -> Result<Self> {
        let nvml = nvml()?;
        let count = nvml.device_count().map_err(failed("counting GPUs"))?;
        let mut events = Vec::new();
        for index in 0..count {
            let context = format!("watching GPU {index} for XID errors");
            let device = nvml.device_by_index(index).map_err(failed(&context))?;
            let set = nvml.create_event_set().map_err(failed(&context))?;
            match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(set) => events.push((index, set)),
                Err(error) if matches!(error.error, NvmlError::NotSupported) => {}
                Err(error) => return Err(from_nvml(error.error, &context)),
            }
        }
        Ok(Self {
            nvml,
            events: Mutex::new(events),
        })
    }

    fn device(&self, index: u32) -> Result<Device<'static>> {
        self.nvml
            .device_by_index(index)
            .map_err(failed(format!("GPU {index}")))
    }

    fn mig_mode(device: &Device<'_>, index: u32) -> Result<Option<MigMode>> {
        Ok(
            optional(device.mig_mode(), &format!("GPU {index}: MIG mode"))?.map(|mode| MigMode {
                current: mode.current == MIG_ENABLED,
                pending: mode.pending == MIG_ENABLED,
            }),
        )
    }
}

/// Our process entry from NVML's.
fn process(info: &ProcessInfo) -> GpuProcess {
    GpuProcess {
        pid: info.pid,
        used_memory_mib: match info.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes / MIB),
            UsedGpuMemory::Unavailable => None,
        },
        gpu_instance_id: info.gpu_instance_id,
        compute_instance_id: info.compute_instance_id,
    }
}

impl GpuBackend for NvmlBackend {
    fn gpu_count(&self) -> Result<u32> {
        self.nvml.device_count().map_err(failed("counting GPUs"))
    }

    fn gpu(&self, index: u32) -> Result<GpuInventory> {
        let device = self.device(index)?;
        let context = |what: &str| format!("GPU {index}: {what}");
        let pci = device.pci_info().map_err(failed(context("PCI info")))?;
        let memory = device.memory_info().map_err(failed(context("memory")))?;
        let capability = device
            .cuda_compute_capability()
            .map_err(failed(context("compute capability")))?;
        let cuda = self
            .nvml
            .sys_cuda_driver_version()
            .map_err(failed("CUDA driver version"))?;
        let attributes = optional(device.attributes(), &context("attributes"))?;
        Ok(GpuInventory {
            index,
            uuid: device.uuid().map_err(failed(context("UUID")))?,
            product_name: device.name().map_err(failed(context("name")))?,
            pci_device_id: pci.pci_device_id,
            pci_bus_id: pci.bus_id,
            memory_mib: memory.total / MIB,
            multiprocessor_count: attributes.map(|attributes| attributes.multiprocessor_count),
            compute_capability: ComputeCapability {
                major: u32::try_from(capability.major).unwrap_or_default(),
                minor: u32::try_from(capability.minor).unwrap_or_default(),
            },
            driver_version: self
                .nvml
                .sys_driver_version()
                .map_err(failed("driver version"))?,
            cuda_driver_version: CudaVersion {
                major: u32::try_from(cuda_driver_version_major(cuda)).unwrap_or_default(),
                minor: u32::try_from(cuda_driver_version_minor(cuda)).unwrap_or_default(),
            },
            mig_mode: Self::mig_mode(&device, index)?,
        })
    }

    fn gpu_instance_profile(&self, gpu: u32, nvml_index: u32) -> Result<GpuInstanceProfileInfo> {
        let info = self
            .device(gpu)?
            .profile_info(nvml_index)
            .map_err(failed(format!(
                "GPU {gpu}: GPU-instance profile {nvml_index}"
            )))?;
        Ok(GpuInstanceProfileInfo {
            nvml_index,
            id: info.id,
            slice_count: info.slice_count,
            instance_count: info.instance_count,
            memory_mib: info.memory_size_mb,
            multiprocessor_count: info.multiprocessor_count,
        })
    }

    fn gpu_instance_placements(&self, gpu: u32, profile_id: u32) -> Result<Vec<Placement>> {
        mig_sys::possible_placements(self.nvml, &self.device(gpu)?, profile_id)
    }

    fn gpu_instances(&self, gpu: u32) -> Result<Vec<GpuInstance>> {
        let device = self.device(gpu)?;
        // NVML answers per profile; without MIG some drivers answer "none" rather than "not supported", so the mode
        // is checked first, for the same answer as the simulator's.
        if !Self::mig_mode(&device, gpu)?.is_some_and(|mode| mode.current) {
            return Err(GpuError::NotSupported(format!(
                "MIG mode is disabled on GPU {gpu}"
            )));
        }
        let mut instances = Vec::new();
        for nvml_index in 0..GPU_INSTANCE_PROFILE_INDEX_COUNT {
            let profile = match self.gpu_instance_profile(gpu, nvml_index) {
                Ok(profile) => profile,
                Err(GpuError::NotSupported(_) | GpuError::InvalidArgument(_)) => continue,
                Err(other) => return Err(other),
            };
            instances.extend(mig_sys::gpu_instances(
                self.nvml,
                &device,
                profile.id,
                profile.instance_count,
            )?);
        }
        instances.sort_by_key(|instance| instance.id);
        Ok(instances)
    }

    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance> {
        mig_sys::create_gpu_instance(self.nvml, &self.device(gpu)?, profile_id, placement)
    }

    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance_id: u32) -> Result<()> {
        mig_sys::destroy_gpu_instance(self.nvml, &self.device(gpu)?, gpu_instance_id)
    }

    fn compute_instances(&self, gpu: u32, gpu_instance_id: u32) -> Result<Vec<ComputeInstance>> {
        mig_sys::compute_instances(self.nvml, &self.device(gpu)?, gpu_instance_id)
    }

    fn create_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
        compute_slices: u32,
    ) -> Result<ComputeInstance> {
        let index = compute_profile_index(compute_slices).ok_or_else(|| {
            GpuError::NotSupported(format!(
                "NVML has no {compute_slices}-slice compute-instance profile"
            ))
        })?;
        mig_sys::create_compute_instance(self.nvml, &self.device(gpu)?, gpu_instance_id, index)
    }

    fn destroy_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<()> {
        mig_sys::destroy_compute_instance(
            self.nvml,
            &self.device(gpu)?,
            gpu_instance_id,
            compute_instance_id,
        )
    }

    fn mig_devices(&self, gpu: u32) -> Result<Vec<MigDevice>> {
        let device = self.device(gpu)?;
        if !Self::mig_mode(&device, gpu)?.is_some_and(|mode| mode.current) {
            return Ok(Vec::new());
        }
        let profiles: BTreeMap<u32, u32> = self
            .gpu_instances(gpu)?
            .iter()
            .map(|instance| (instance.id, instance.profile_id))
            .collect();
        let slots = device
            .mig_device_count()
            .map_err(failed(format!("GPU {gpu}: MIG device count")))?;
        let mut devices = Vec::new();
        for slot in 0..slots {
            let context = format!("GPU {gpu}: MIG device {slot}");
            // Slots are the most MIG devices the GPU can have; unused ones report NotFound.
            let mig = match device.mig_device_by_index(slot) {
                Ok(mig) => mig,
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(error) => return Err(from_nvml(error, &context)),
            };
            let (gpu_instance_id, compute_instance_id) = mig_sys::mig_device_ids(self.nvml, &mig)?;
            let attributes = mig.attributes().map_err(failed(&context))?;
            devices.push(MigDevice {
                uuid: mig.uuid().map_err(failed(&context))?,
                gpu_instance_id,
                gpu_instance_profile_id: profiles.get(&gpu_instance_id).copied().ok_or_else(
                    || {
                        GpuError::NotFound(format!(
                            "{context}: GPU instance {gpu_instance_id} is not listed"
                        ))
                    },
                )?,
                compute_instance_id,
                compute_slice_count: attributes.compute_instance_slice_count,
                memory_mib: mig.memory_info().map_err(failed(&context))?.total / MIB,
                multiprocessor_count: attributes.multiprocessor_count,
                engines: Some(MigEngines {
                    copy: attributes.shared_copy_engine_count,
                    decoder: attributes.shared_decoder_count,
                    encoder: attributes.shared_encoder_count,
                    jpeg: attributes.shared_jpeg_count,
                    ofa: attributes.shared_ofa_count,
                }),
            });
        }
        devices.sort_by_key(|device| (device.gpu_instance_id, device.compute_instance_id));
        Ok(devices)
    }

    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>> {
        let device = self.device(gpu)?;
        let context = format!("GPU {gpu}: processes");
        let compute = device
            .running_compute_processes()
            .map_err(failed(&context))?;
        let graphics = optional(device.running_graphics_processes(), &context)?.unwrap_or_default();
        let mut processes: Vec<GpuProcess> = Vec::new();
        for info in compute.iter().chain(&graphics) {
            let entry = process(info);
            if !processes.contains(&entry) {
                processes.push(entry);
            }
        }
        Ok(processes)
    }

    fn telemetry(&self, gpu: u32) -> Result<Telemetry> {
        telemetry::read(self.nvml, &self.device(gpu)?, gpu)
    }

    fn details(&self, gpu: u32) -> Result<GpuDetails> {
        telemetry::details(self.nvml, &self.device(gpu)?, gpu)
    }

    fn health_events(&self) -> Result<Vec<HealthEvent>> {
        let sets = self
            .events
            .lock()
            .map_err(|_| GpuError::Other("NVML event sets: lock poisoned".into()))?;
        let mut events = Vec::new();
        for (gpu_index, set) in sets.iter() {
            loop {
                match set.wait(0) {
                    Ok(data) if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) => {
                        events.push(HealthEvent {
                            gpu_index: *gpu_index,
                            xid: match data.event_data {
                                Some(XidError::Value(xid)) => Some(xid),
                                Some(XidError::Unknown) | None => None,
                            },
                        });
                    }
                    Ok(_) => {}
                    Err(NvmlError::Timeout) => break,
                    Err(error) => {
                        return Err(from_nvml(
                            error,
                            &format!("GPU {gpu_index}: reading events"),
                        ));
                    }
                }
            }
        }
        Ok(events)
    }

    fn reset(&self, gpu: u32) -> Result<()> {
        let holders = self.processes(gpu)?;
        if !holders.is_empty() {
            let pids: Vec<String> = holders
                .iter()
                .map(|process| process.pid.to_string())
                .collect();
            return Err(GpuError::InUse(format!(
                "GPU {gpu} cannot be reset while processes use it (pids {})",
                pids.join(", ")
            )));
        }
        let bus_id = self.gpu(gpu)?.pci_bus_id;
        reset::reset_with_nvidia_smi(&bus_id)
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigMode> {
        let device = self.device(gpu)?;
        // The returned activation status only says whether the change took effect at once (some GPUs apply it
        // without a reset when idle); the mode read back says the same, for both backends alike.
        device
            .set_mig_mode(enabled)
            .map_err(failed(format!("GPU {gpu}: setting MIG mode")))?;
        Self::mig_mode(&device, gpu)?
            .ok_or_else(|| GpuError::NotSupported(format!("GPU {gpu} is not MIG capable")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine has no NVIDIA driver: opening the backend must fail cleanly and say why. On a machine with a
    /// driver the same test checks that the inventory can be read.
    #[test]
    fn opening_without_a_driver_says_so() {
        match NvmlBackend::new() {
            Err(GpuError::LibraryNotFound(detail)) => assert!(!detail.is_empty()),
            Err(other) => panic!("expected LibraryNotFound, got {other}"),
            Ok(backend) => {
                let gpus = backend.gpus().unwrap();
                assert_eq!(gpus.len(), backend.gpu_count().unwrap() as usize);
            }
        }
    }

    #[test]
    fn process_memory_is_reported_in_mib() {
        let info = ProcessInfo {
            pid: 42,
            used_gpu_memory: UsedGpuMemory::Used(3 * MIB + 5),
            gpu_instance_id: Some(1),
            compute_instance_id: Some(0),
        };
        assert_eq!(
            process(&info),
            GpuProcess {
                pid: 42,
                used_memory_mib: Some(3),
                gpu_instance_id: Some(1),
                compute_instance_id: Some(0)
            }
        );
    }
}

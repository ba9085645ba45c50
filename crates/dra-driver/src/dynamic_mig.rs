//! MIG on demand: the GPUs the node's partition names in `dynamic_mig` (and whose MIG mode is on) are published as
//! one counter set each, and one device per MIG profile and placement that consumes those counters; the scheduler
//! picks a placement for a claim, and the driver creates the instance when the kubelet prepares the claim and
//! destroys it at unprepare. Nothing else on the GPU changes: another claim's instance is never touched.
//!
//! The counters (reference/dra.md §10, NVIDIA's names where NVIDIA has them):
//! - `memory-slice-<i>` (1 each): a placement consumes its slices, so two placements that overlap never run together;
//! - `multiprocessors` and `compute-slices`: what the instances' profiles take of the GPU;
//! - `<profile>-instances`, only for a profile the hardware allows fewer instances of than its placements would
//!   (the `+me` profiles hold the GPU's one set of media engines).
//!
//! Our catalog has no engine counts, so copy, decoder and encoder engines are not counters; the memory slices and the
//! instance limits already refuse every combination the hardware refuses.
//!
//! On a GPU the partition also shares, each placement allows multiple allocations with consumable memory and cores
//! (as a shared GPU does): the scheduler charges the GPU's counters for the placement's first claim only, and the
//! driver makes the instance for the first claim, hands it to the next ones with their own MPS limits, and destroys
//! it with the last ([`crate::claims`]).
//!
//! Devices are ordered for the scheduler's first fit (it takes the first device whose counters are free): GPU by
//! GPU, smallest profile first, and each profile's placements from the highest start down, so that small instances
//! fill a GPU from its top and leave the low placements, where the large profiles start, free.
//!
//! [`placements`] and [`counter_set`] are pure; [`confirmed_profiles`], [`create`], [`destroy`] and [`reconcile`]
//! do the GPU work through the backend.

use std::collections::{BTreeMap, BTreeSet};

use crd::dra::{Partition, profile_label};
use crd::mig::{GpuInstanceProfile, GpuModel};
use gpu::{GpuBackend, GpuError, Placement};
use k8s_openapi::api::resource::v1::{Counter, CounterSet, DeviceCounterConsumption};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use node_runtime::inventory::GpuView;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// Counter: streaming multiprocessors of the GPU in MIG mode.
pub const COUNTER_MULTIPROCESSORS: &str = "multiprocessors";
/// Counter: compute slices of the GPU in MIG mode.
pub const COUNTER_COMPUTE_SLICES: &str = "compute-slices";

/// A GPU served as MIG on demand: its model and the profiles NVML confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicGpu {
    /// The GPU's index.
    pub index: u32,
    /// Its model in the catalog.
    pub model: &'static GpuModel,
    /// The catalog's profiles that NVML reports the same (id, slices, memory, placements), smallest first.
    pub profiles: Vec<&'static GpuInstanceProfile>,
}

/// One placement a device of the slice stands for: what creating its instance takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnDemand {
    /// The GPU's index.
    pub gpu: u32,
    /// The GPU-instance profile id.
    pub profile_id: u32,
    /// Where the GPU instance goes.
    pub placement: Placement,
    /// The compute instance's slices: the whole GPU instance.
    pub compute_slices: u32,
}

/// A MIG instance the driver made for a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    /// The GPU's index.
    pub gpu: u32,
    /// The GPU instance.
    pub gpu_instance: u32,
    /// The compute instance.
    pub compute_instance: u32,
}

/// The name of a GPU's counter set (NVIDIA's).
#[must_use]
pub fn counter_set_name(gpu: u32) -> String {
    format!("gpu-{gpu}-counter-set")
}

fn memory_slice_counter(slice: u32) -> String {
    format!("memory-slice-{slice}")
}

fn instances_counter(profile: &GpuInstanceProfile) -> String {
    format!("{}-instances", profile_label(&profile.name.to_string()))
}

/// How many instances of a profile its placements alone allow (placements of one profile have one size, so taking
/// them by start is the most).
fn disjoint_placements(profile: &GpuInstanceProfile) -> u32 {
    let mut end = 0u32;
    let mut count = 0;
    for &start in profile.placement_starts {
        if u32::from(start) >= end {
            end = u32::from(start) + u32::from(profile.placement_size);
            count += 1;
        }
    }
    count
}

fn quantity(value: impl ToString) -> Counter {
    Counter {
        value: Quantity(value.to_string()),
    }
}

/// The GPU's counter set: everything its instances draw from.
#[must_use]
pub fn counter_set(gpu: &DynamicGpu) -> CounterSet {
    let mut counters: BTreeMap<String, Counter> = (0..u32::from(gpu.model.memory_slices))
        .map(|slice| (memory_slice_counter(slice), quantity(1)))
        .collect();
    let full = gpu.profiles.iter().map(|profile| profile.sm_count).max();
    counters.insert(
        COUNTER_MULTIPROCESSORS.to_owned(),
        quantity(full.unwrap_or(gpu.model.sm_count)),
    );
    counters.insert(
        COUNTER_COMPUTE_SLICES.to_owned(),
        quantity(gpu.model.compute_slices),
    );
    for profile in &gpu.profiles {
        if profile.max_instances < disjoint_placements(profile) {
            counters.insert(instances_counter(profile), quantity(profile.max_instances));
        }
    }
    CounterSet {
        name: counter_set_name(gpu.index),
        counters,
    }
}

/// One placement of one profile: what the slice's device consumes and what preparing it creates.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementDevice {
    /// The profile.
    pub profile: &'static GpuInstanceProfile,
    /// What creating it takes.
    pub on_demand: OnDemand,
    /// The counters it consumes of its GPU's set.
    pub consumes: DeviceCounterConsumption,
}

/// The GPU's placements in the order the slice publishes them (see the module's comment).
#[must_use]
pub fn placements(gpu: &DynamicGpu) -> Vec<PlacementDevice> {
    let mut devices = Vec::new();
    let mut profiles = gpu.profiles.clone();
    profiles.sort_by_key(|profile| (profile.name.slices, profile.memory_mib, profile.id));
    for profile in profiles {
        let limited = profile.max_instances < disjoint_placements(profile);
        for placement in Placement::of_profile(profile).rev() {
            let mut counters: BTreeMap<String, Counter> = (placement.start
                ..placement.start + placement.size)
                .map(|slice| (memory_slice_counter(slice), quantity(1)))
                .collect();
            counters.insert(
                COUNTER_MULTIPROCESSORS.to_owned(),
                quantity(profile.sm_count),
            );
            counters.insert(
                COUNTER_COMPUTE_SLICES.to_owned(),
                quantity(profile.name.slices),
            );
            if limited {
                counters.insert(instances_counter(profile), quantity(1));
            }
            devices.push(PlacementDevice {
                profile,
                on_demand: OnDemand {
                    gpu: gpu.index,
                    profile_id: profile.id,
                    placement,
                    compute_slices: u32::from(profile.name.slices),
                },
                consumes: DeviceCounterConsumption {
                    counter_set: counter_set_name(gpu.index),
                    counters,
                    ..DeviceCounterConsumption::default()
                },
            });
        }
    }
    devices
}

/// The catalog's profiles of the GPU that NVML reports the same: id, slices, memory and placements. A profile
/// NVML does not support on this GPU is left out quietly; one it reports otherwise is left out with a warning, so
/// that no claim is handed an instance the catalog describes wrongly (the compute instance is the whole GPU
/// instance, its slices the profile's, which NVML's answer confirms).
///
/// # Errors
/// When NVML cannot answer for the GPU at all.
pub fn confirmed_profiles(
    backend: &dyn GpuBackend,
    gpu: u32,
    model: &'static GpuModel,
) -> gpu::Result<(Vec<&'static GpuInstanceProfile>, Vec<String>)> {
    let mut confirmed = Vec::new();
    let mut warnings = Vec::new();
    for profile in model.profiles {
        let info = match backend.gpu_instance_profile(gpu, profile.nvml_index) {
            Ok(info) => info,
            Err(GpuError::NotSupported(_) | GpuError::NotFound(_)) => continue,
            Err(error) => return Err(error),
        };
        let placements: Vec<Placement> = backend.gpu_instance_placements(gpu, info.id)?;
        let expected: Vec<Placement> = Placement::of_profile(profile).collect();
        let sorted = |mut list: Vec<Placement>| {
            list.sort();
            list
        };
        if info.id != profile.id
            || info.slice_count != u32::from(profile.name.slices)
            || info.memory_mib != profile.memory_mib
            || sorted(placements.clone()) != sorted(expected)
        {
            warnings.push(format!(
                "GPU {gpu}: NVML reports MIG profile {} as id {}, {} slices, {} MiB, placements {placements:?}; \
                 the catalog says id {}, {} slices, {} MiB: the profile is not offered on demand",
                profile.name,
                info.id,
                info.slice_count,
                info.memory_mib,
                profile.id,
                profile.name.slices,
                profile.memory_mib
            ));
            continue;
        }
        confirmed.push(profile);
    }
    Ok((confirmed, warnings))
}

/// The GPUs of `views` the partition serves as MIG on demand and that can be: MIG mode on, a model the catalog
/// knows. The others are published as before, each with a warning that says why and what to do.
///
/// # Errors
/// When NVML cannot answer for a GPU.
pub fn observe(
    backend: &dyn GpuBackend,
    views: &[GpuView],
    partition: &Partition,
) -> gpu::Result<(Vec<DynamicGpu>, Vec<String>)> {
    let mut gpus = Vec::new();
    let mut warnings = Vec::new();
    for view in views {
        let inventory = &view.inventory;
        if !partition.dynamic_mig(inventory.index) {
            continue;
        }
        let Some(model) = inventory.model() else {
            warnings.push(format!(
                "GPU {} ({}) is listed for MIG on demand, but its model has no MIG profiles in the catalog: it is \
                 published whole",
                inventory.index, inventory.product_name
            ));
            continue;
        };
        if !inventory.mig_mode.is_some_and(|mode| mode.current) {
            warnings.push(format!(
                "GPU {} is listed for MIG on demand, but its MIG mode is off: it is published whole; turn MIG mode \
                 on, e.g. with the node label nvidia.com/mig.config=all-enabled",
                inventory.index
            ));
            continue;
        }
        let (profiles, mismatches) = confirmed_profiles(backend, inventory.index, model)?;
        warnings.extend(mismatches);
        gpus.push(DynamicGpu {
            index: inventory.index,
            model,
            profiles,
        });
    }
    Ok((gpus, warnings))
}

/// Creates the instance of a placement: the GPU instance, then its compute instance, then reads the MIG device's
/// UUID. Any failure after the GPU instance exists destroys what was made, so a failed prepare leaves the GPU as
/// it was.
///
/// # Errors
/// The step that failed and NVML's reason.
pub fn create(
    backend: &dyn GpuBackend,
    on_demand: &OnDemand,
) -> Result<(MigInstance, String), String> {
    let gpu = on_demand.gpu;
    let gpu_instance = backend
        .create_gpu_instance(gpu, on_demand.profile_id, on_demand.placement)
        .map_err(|error| {
            format!(
                "creating the GPU instance of profile {} at {} on GPU {gpu}: {error}",
                on_demand.profile_id, on_demand.placement
            )
        })?;
    let finish = || -> Result<(MigInstance, String), String> {
        let compute = backend
            .create_compute_instance(gpu, gpu_instance.id, on_demand.compute_slices)
            .map_err(|error| {
                format!(
                    "creating the compute instance of {} slices in GPU instance {} on GPU {gpu}: {error}",
                    on_demand.compute_slices, gpu_instance.id
                )
            })?;
        let instance = MigInstance {
            gpu,
            gpu_instance: gpu_instance.id,
            compute_instance: compute.id,
        };
        let uuid = backend
            .mig_devices(gpu)
            .map_err(|error| format!("reading the MIG devices of GPU {gpu}: {error}"))?
            .into_iter()
            .find(|device| {
                device.gpu_instance_id == instance.gpu_instance
                    && device.compute_instance_id == instance.compute_instance
            })
            .map(|device| device.uuid)
            .ok_or_else(|| {
                format!(
                    "GPU {gpu} lists no MIG device for GPU instance {} and compute instance {}",
                    instance.gpu_instance, instance.compute_instance
                )
            })?;
        Ok((instance, uuid))
    };
    finish().map_err(|reason| match destroy(backend, gpu, gpu_instance.id) {
        Ok(()) => format!("{reason}; the GPU instance was destroyed again"),
        Err(error) => format!("{reason}; destroying the GPU instance again failed too: {error}"),
    })
}

/// Destroys a GPU instance and its compute instances. One already gone is fine (an unprepare retried).
///
/// # Errors
/// NVML's reason, e.g. a process still in the instance.
pub fn destroy(backend: &dyn GpuBackend, gpu: u32, gpu_instance: u32) -> Result<(), String> {
    let computes = match backend.compute_instances(gpu, gpu_instance) {
        Ok(computes) => computes,
        Err(GpuError::NotFound(_)) => return Ok(()),
        Err(error) => return Err(format!("GPU {gpu} instance {gpu_instance}: {error}")),
    };
    for compute in computes {
        backend
            .destroy_compute_instance(gpu, gpu_instance, compute.id)
            .map_err(|error| {
                format!(
                    "destroying compute instance {} of GPU instance {gpu_instance} on GPU {gpu}: {error}",
                    compute.id
                )
            })?;
    }
    match backend.destroy_gpu_instance(gpu, gpu_instance) {
        Ok(()) | Err(GpuError::NotFound(_)) => Ok(()),
        Err(error) => Err(format!(
            "destroying GPU instance {gpu_instance} on GPU {gpu}: {error}"
        )),
    }
}

/// Brings the on-demand GPUs in line with the prepared claims when the driver starts: every GPU instance that no
/// checkpointed claim holds is destroyed (one left by a driver stopped between creating a GPU instance and its
/// compute instance, or by a claim unprepared while the driver was down); the ones claims hold are kept. Returns
/// what it destroyed and what it could not.
pub fn reconcile(
    backend: &dyn GpuBackend,
    gpus: &[u32],
    held: &BTreeSet<(u32, u32)>,
) -> (Vec<(u32, u32)>, Vec<String>) {
    let mut destroyed = Vec::new();
    let mut failures = Vec::new();
    for &gpu in gpus {
        let instances = match backend.gpu_instances(gpu) {
            Ok(instances) => instances,
            Err(error) => {
                failures.push(format!("reading the GPU instances of GPU {gpu}: {error}"));
                continue;
            }
        };
        for instance in instances {
            if held.contains(&(gpu, instance.id)) {
                continue;
            }
            match destroy(backend, gpu, instance.id) {
                Ok(()) => {
                    info!(
                        gpu,
                        gpu_instance = instance.id,
                        "destroyed a MIG instance no claim holds"
                    );
                    destroyed.push((gpu, instance.id));
                }
                Err(error) => {
                    warn!(gpu, gpu_instance = instance.id, %error, "cannot destroy a MIG instance no claim holds");
                    failures.push(error);
                }
            }
        }
    }
    (destroyed, failures)
}

#[cfg(test)]
#[path = "dynamic_mig_tests.rs"]
mod tests;

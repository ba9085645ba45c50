//! The MIG planner: from a GPU's current GPU instances and the `mig-devices` a config asks for, which instances to
//! keep, which to destroy, and which to create at which explicit placement. Pure: no backend, no I/O.
//!
//! Why explicit placements: creating instances one by one and letting the driver pick the spot fails with
//! "Insufficient Resources" in some orders even when a packing exists (a `2g` placed at slice 2 blocks the only `4g`).
//! NVIDIA's tool retries orderings and wipes the GPU when none fits; we compute a packing up front (largest first, at
//! allowed starts, backtracking so every packing that exists is found) and create exactly that, or say precisely
//! why none exists before anything is touched.
//!
//! Why keep instances: a MIG device that is already right keeps its UUID and its workload. Among the instances that
//! match the request the planner keeps as many as a packing allows.

mod node;
mod search;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crd::config::mig_parted::PciDeviceId;
use crd::mig::{GpuInstanceProfile, GpuModel, MigProfileName};

use crate::compute::compute_slices_for;
use crate::types::Placement;

pub use node::{GpuDecision, ModeChange, decide, mode_change};

/// A GPU instance that exists on the GPU, with the sizes (compute slices) of the compute instances in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExistingInstance {
    /// GPU-instance id.
    pub gpu_instance_id: u32,
    /// Its profile id.
    pub profile_id: u32,
    /// Its memory slices.
    pub placement: Placement,
    /// Compute slices of each of its compute instances.
    pub compute_slices: Vec<u32>,
}

/// An existing GPU instance the plan keeps as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeptInstance {
    /// GPU-instance id.
    pub gpu_instance_id: u32,
    /// The requested MIG device it provides.
    pub profile: MigProfileName,
}

/// A GPU instance to create, with the one compute instance to create in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlannedInstance {
    /// The requested MIG device (GPU-instance profile and compute-instance size).
    pub profile: MigProfileName,
    /// GPU-instance profile id to create.
    pub profile_id: u32,
    /// Where to create it.
    pub placement: Placement,
    /// Compute slices of the compute instance to create in it.
    pub compute_slices: u32,
}

/// What to do to one GPU: destroy first (compute instances, then GPU instances), then create in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MigPlan {
    /// Existing instances that stay.
    pub keep: Vec<KeptInstance>,
    /// GPU-instance ids to destroy, with their compute instances.
    pub destroy: Vec<u32>,
    /// Instances to create, largest first, each at an explicit placement.
    pub create: Vec<PlannedInstance>,
}

impl MigPlan {
    /// True when the GPU already has the requested geometry.
    #[must_use]
    pub fn is_noop(&self) -> bool {
        self.destroy.is_empty() && self.create.is_empty()
    }
}

/// Why a geometry cannot be planned. The texts are shown to users in node status, so each says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The model has no such GPU-instance profile.
    #[error("profile {profile} does not exist on {model} (profiles: {known})")]
    UnknownProfile {
        /// The requested name.
        profile: MigProfileName,
        /// The GPU model.
        model: String,
        /// The model's profiles.
        known: String,
    },
    /// The compute-instance part of a name is a size its GPU instance does not accept.
    #[error(
        "profile {profile} does not exist on {model}: \
         a {gpu_instance} GPU instance holds compute instances of {known} slices"
    )]
    UnknownComputeSize {
        /// The requested name.
        profile: MigProfileName,
        /// The GPU model.
        model: String,
        /// The GPU-instance part of the name.
        gpu_instance: String,
        /// Accepted sizes.
        known: String,
    },
    /// More instances of one profile than the GPU holds.
    #[error("{profile} x{count} does not fit on {model}: at most {max}")]
    TooMany {
        /// GPU-instance profile name.
        profile: String,
        /// Requested count.
        count: u32,
        /// The GPU model.
        model: String,
        /// The most the GPU holds.
        max: u32,
    },
    /// The request needs more memory slices than the GPU has.
    #[error("needs {needed} memory slices, {model} has {available}")]
    MemorySlices {
        /// Slices requested.
        needed: u32,
        /// The GPU model.
        model: String,
        /// Slices of the GPU.
        available: u32,
    },
    /// The request needs more compute slices than the GPU has.
    #[error("needs {needed} compute slices, {model} has {available}")]
    ComputeSlices {
        /// Slices requested.
        needed: u32,
        /// The GPU model.
        model: String,
        /// Slices of the GPU.
        available: u32,
    },
    /// The counts fit, but no arrangement of the allowed placements holds them all.
    #[error(
        "{devices} do not fit together on {model}: no arrangement of their allowed placements exists"
    )]
    NoPacking {
        /// The request, e.g. `4g.20gb x1, 2g.10gb x2`.
        devices: String,
        /// The GPU model.
        model: String,
    },
    /// The node's `nvidia.com/mig.config` names a config the file does not have.
    #[error("no MIG config named {name} (configs: {known})")]
    UnknownConfig {
        /// The requested config name.
        name: String,
        /// The names the file has.
        known: String,
    },
    /// Two entries of a config apply to one GPU and ask for different things.
    #[error(
        "MIG config {name}: entries {first} and {second} both apply to GPU {gpu} but ask for different geometries"
    )]
    ConflictingEntries {
        /// Config name.
        name: String,
        /// GPU index.
        gpu: u32,
        /// Position of the first entry.
        first: usize,
        /// Position of the second entry.
        second: usize,
    },
    /// A config enables MIG on a GPU that cannot do MIG.
    #[error("MIG config {name} enables MIG on GPU {gpu} ({product}), which is not MIG capable")]
    NotMigCapable {
        /// Config name.
        name: String,
        /// GPU index.
        gpu: u32,
        /// Its product name.
        product: String,
    },
    /// A config creates MIG devices on a GPU model the catalog does not know, so it cannot be planned.
    #[error(
        "MIG config {name} creates MIG devices on GPU {gpu} ({product}, PCI device id {pci_device_id}), a model \
         without a known MIG profile table (the models known are listed in docs/mig-catalog.md)"
    )]
    UnknownModel {
        /// Config name.
        name: String,
        /// GPU index.
        gpu: u32,
        /// Its product name.
        product: String,
        /// Its PCI device id, as `device-filter` writes it.
        pci_device_id: PciDeviceId,
    },
}

/// The model's name as users know it from `nvidia-smi` and the guides, without the vendor prefix.
fn model_name(model: &GpuModel) -> String {
    let name = model.product_name();
    name.strip_prefix("NVIDIA ").unwrap_or(name).to_owned()
}

/// One requested MIG device: its name and catalog profile.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    name: MigProfileName,
    profile: &'static GpuInstanceProfile,
}

/// Plans the instances of one GPU of `model`, from what exists (`current`) to what is asked (`desired`,
/// profile name -> count, as in a mig-parted entry's `mig-devices`).
///
/// # Errors
/// A [`PlanError`] naming the first reason the request cannot be met on this model.
pub fn plan(
    model: &GpuModel,
    current: &[ExistingInstance],
    desired: &BTreeMap<MigProfileName, u32>,
) -> Result<MigPlan, PlanError> {
    let wanted = wanted_devices(model, desired)?;
    let candidates: Vec<(usize, MigProfileName)> = current
        .iter()
        .enumerate()
        .filter_map(|(position, existing)| {
            Some((position, matching_name(model, existing, &wanted)?))
        })
        .collect();

    for keep_count in (0..=candidates.len().min(wanted.len())).rev() {
        for kept in search::combinations(candidates.len(), keep_count) {
            let kept: Vec<(usize, MigProfileName)> = kept.iter().map(|&i| candidates[i]).collect();
            let Some(remaining) = remaining_after(&wanted, &kept) else {
                continue;
            };
            let Some(occupied) = occupied_by(current, &kept) else {
                continue;
            };
            let profiles: Vec<&GpuInstanceProfile> =
                remaining.iter().map(|want| want.profile).collect();
            if let Some(placements) = search::pack(&profiles, occupied) {
                return Ok(assemble(current, &kept, &remaining, &placements));
            }
        }
    }
    Err(PlanError::NoPacking {
        devices: describe(&wanted),
        model: model_name(model),
    })
}

/// Checks the request against the model and returns one entry per device, largest first.
fn wanted_devices(
    model: &GpuModel,
    desired: &BTreeMap<MigProfileName, u32>,
) -> Result<Vec<Wanted>, PlanError> {
    let mut asked: Vec<(MigProfileName, &'static GpuInstanceProfile, u32)> = Vec::new();
    let mut per_profile: BTreeMap<u32, (&'static GpuInstanceProfile, u32)> = BTreeMap::new();
    for (&name, &count) in desired.iter().filter(|(_, count)| **count > 0) {
        let profile =
            model
                .profile(name.gpu_instance)
                .ok_or_else(|| PlanError::UnknownProfile {
                    profile: name,
                    model: model_name(model),
                    known: join(
                        model
                            .profiles
                            .iter()
                            .map(|profile| profile.name.to_string()),
                    ),
                })?;
        let sizes = compute_slices_for(u32::from(profile.name.slices));
        if !sizes.contains(&u32::from(name.compute_slices)) {
            return Err(PlanError::UnknownComputeSize {
                profile: name,
                model: model_name(model),
                gpu_instance: profile.name.to_string(),
                known: join(sizes.iter().map(ToString::to_string)),
            });
        }
        // Two names of one GPU-instance profile (`3g.20gb`, `1c.3g.20gb`) add up; saturating, so that counts near
        // `u32::MAX` still compare as too many rather than wrap to a small number.
        let total = &mut per_profile.entry(profile.id).or_insert((profile, 0)).1;
        *total = total.saturating_add(count);
        asked.push((name, profile, count));
    }
    // Checked before one entry per device is made: a count is only expanded once it is known to fit.
    for (profile, count) in per_profile.values() {
        if *count > profile.max_instances {
            return Err(PlanError::TooMany {
                profile: profile.name.to_string(),
                count: *count,
                model: model_name(model),
                max: profile.max_instances,
            });
        }
    }
    let mut wanted: Vec<Wanted> = asked
        .into_iter()
        .flat_map(|(name, profile, count)| (0..count).map(move |_| Wanted { name, profile }))
        .collect();
    let total = |slices: fn(&GpuInstanceProfile) -> u8| -> u32 {
        wanted
            .iter()
            .map(|want| u32::from(slices(want.profile)))
            .sum()
    };
    let memory = total(|profile| profile.placement_size);
    if memory > u32::from(model.memory_slices) {
        return Err(PlanError::MemorySlices {
            needed: memory,
            model: model_name(model),
            available: u32::from(model.memory_slices),
        });
    }
    let compute = total(|profile| profile.name.slices);
    if compute > u32::from(model.compute_slices) {
        return Err(PlanError::ComputeSlices {
            needed: compute,
            model: model_name(model),
            available: u32::from(model.compute_slices),
        });
    }
    // Largest first: big instances have the fewest allowed starts, so placing them first prunes the search early.
    // Equal profiles end up next to each other, which the search relies on to skip symmetric arrangements.
    wanted.sort_by_key(|want| {
        (
            std::cmp::Reverse(want.profile.placement_size),
            std::cmp::Reverse(want.profile.name.slices),
            want.profile.id,
            want.name,
        )
    });
    Ok(wanted)
}

/// The requested name an existing instance already provides: same GPU-instance profile, at an allowed placement,
/// holding exactly one compute instance of the requested size.
fn matching_name(
    model: &GpuModel,
    existing: &ExistingInstance,
    wanted: &[Wanted],
) -> Option<MigProfileName> {
    let profile = model
        .profiles
        .iter()
        .find(|profile| profile.id == existing.profile_id)?;
    if !search::allowed(profile, existing.placement) {
        return None;
    }
    wanted
        .iter()
        .find(|want| {
            want.profile.id == profile.id
                && existing.compute_slices == [u32::from(want.name.compute_slices)]
        })
        .map(|want| want.name)
}

/// The devices still to create when `kept` stay; `None` when `kept` holds more of a name than was asked.
fn remaining_after(wanted: &[Wanted], kept: &[(usize, MigProfileName)]) -> Option<Vec<Wanted>> {
    let mut remaining = wanted.to_vec();
    for (_, name) in kept {
        let position = remaining.iter().position(|want| want.name == *name)?;
        remaining.remove(position);
    }
    Some(remaining)
}

/// The memory slices the kept instances occupy; `None` when two of them overlap (a state no GPU reports, but the
/// input is not ours to trust).
fn occupied_by(current: &[ExistingInstance], kept: &[(usize, MigProfileName)]) -> Option<u64> {
    kept.iter().try_fold(0u64, |occupied, (position, _)| {
        let mask = current[*position].placement.mask();
        (occupied & mask == 0).then_some(occupied | mask)
    })
}

/// Builds the plan from the chosen kept instances and placements of the rest.
fn assemble(
    current: &[ExistingInstance],
    kept: &[(usize, MigProfileName)],
    remaining: &[Wanted],
    placements: &[Placement],
) -> MigPlan {
    let keep: Vec<KeptInstance> = kept
        .iter()
        .map(|(position, name)| KeptInstance {
            gpu_instance_id: current[*position].gpu_instance_id,
            profile: *name,
        })
        .collect();
    let destroy = current
        .iter()
        .map(|existing| existing.gpu_instance_id)
        .filter(|id| !keep.iter().any(|kept| kept.gpu_instance_id == *id))
        .collect();
    let create = remaining
        .iter()
        .zip(placements)
        .map(|(want, placement)| PlannedInstance {
            profile: want.name,
            profile_id: want.profile.id,
            placement: *placement,
            compute_slices: u32::from(want.name.compute_slices),
        })
        .collect();
    MigPlan {
        keep,
        destroy,
        create,
    }
}

/// `4g.20gb x1, 2g.10gb x2`, in the order the devices are placed.
fn describe(wanted: &[Wanted]) -> String {
    let mut counts: Vec<(MigProfileName, u32)> = Vec::new();
    for want in wanted {
        match counts.iter_mut().find(|(name, _)| *name == want.name) {
            Some((_, count)) => *count += 1,
            None => counts.push((want.name, 1)),
        }
    }
    join(
        counts
            .iter()
            .map(|(name, count)| format!("{name} x{count}")),
    )
}

/// Comma-separated list.
fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

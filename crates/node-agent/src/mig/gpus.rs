//! The GPU side of a MIG change, through the backend trait (blocking; the runner calls it off the async runtime).
//!
//! Only what must change is touched: the mode is set only where [`mode_change`] says so, only those GPUs are
//! reset, and instances are planned from what exists, so matching instances (and their MIG device UUIDs) survive.
//! Every function recomputes from what the GPUs report, so running it again after a crash continues the work.

use std::collections::BTreeMap;
use std::fmt;

use crd::gpu_node::GpuMigGeometry;
use crd::mig::{GpuInstanceProfile, GpuModel, MigProfileName};
use gpu::planner::{MigPlan, PlanError, mode_change, plan};
use gpu::simulator::ResetFailure;
use gpu::{GpuBackend, GpuError, GpuInstanceProfileInfo, apply_plan, current_geometry};

use super::assess::{GpuChange, geometry};

/// The geometry one GPU must end up with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The GPU's index.
    pub gpu: u32,
    /// MIG on or off.
    pub enabled: bool,
    /// The MIG devices when on.
    pub devices: BTreeMap<MigProfileName, u32>,
}

impl From<&GpuChange> for Target {
    fn from(change: &GpuChange) -> Self {
        Self {
            gpu: change.gpu,
            enabled: change.enabled,
            devices: change.devices.clone(),
        }
    }
}

impl Target {
    /// The target that puts a GPU back to a geometry GPUNode status recorded.
    ///
    /// # Errors
    /// A profile name that does not parse (the geometry held a device of a model the catalog does not know).
    pub fn from_geometry(geometry: &GpuMigGeometry) -> Result<Self, ChangeError> {
        let devices = geometry
            .devices
            .iter()
            .map(|(name, count)| {
                let profile = name.parse().map_err(|_| ChangeError::UnknownProfile {
                    gpu: geometry.gpu,
                    profile: name.clone(),
                })?;
                Ok((profile, *count))
            })
            .collect::<Result<_, ChangeError>>()?;
        Ok(Self {
            gpu: geometry.gpu,
            enabled: geometry.mig_enabled,
            devices,
        })
    }
}

/// Why a change of the GPUs failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    /// The GPU work could not run at all.
    #[error(transparent)]
    Backend(#[from] GpuError),
    /// A backend call failed.
    #[error("GPU {gpu}: {action}: {source}")]
    Gpu {
        /// The GPU.
        gpu: u32,
        /// What was being done.
        action: &'static str,
        /// The backend's error.
        source: GpuError,
    },
    /// The geometry cannot be planned from what the GPU has now.
    #[error("GPU {gpu}: {source}")]
    Plan {
        /// The GPU.
        gpu: u32,
        /// The planner's error.
        source: PlanError,
    },
    /// MIG devices on a GPU the catalog has no table for.
    #[error("GPU {gpu}: no MIG profile table for this model")]
    UnknownModel {
        /// The GPU.
        gpu: u32,
    },
    /// The MIG catalog describes a profile differently from the GPU, so instances planned from it could be wrong.
    #[error(
        "GPU {gpu}: the MIG catalog's {profile} ({catalog}) differs from what the GPU reports ({reported}); \
         nothing was created: the catalog needs correcting for this model"
    )]
    CatalogDisagrees {
        /// The GPU.
        gpu: u32,
        /// The profile.
        profile: String,
        /// How the catalog describes it.
        catalog: String,
        /// What the GPU reports for its NVML profile constant.
        reported: String,
    },
    /// A recorded geometry names a profile that does not exist.
    #[error("GPU {gpu}: unknown MIG profile {profile}")]
    UnknownProfile {
        /// The GPU.
        gpu: u32,
        /// The name.
        profile: String,
    },
}

/// A backend error on a GPU, for `map_err`.
fn on(gpu: u32, action: &'static str) -> impl FnOnce(GpuError) -> ChangeError {
    move |source| ChangeError::Gpu {
        gpu,
        action,
        source,
    }
}

/// How a change of the GPUs ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    /// Every target has its mode and instances.
    Done,
    /// These GPUs need a reset the platform cannot do (their new mode is pending); nothing was planned yet.
    NeedsReboot(Vec<u32>),
}

/// Brings every target to its geometry: MIG mode where it differs (instances destroyed first where MIG goes
/// off), a reset of exactly those GPUs, then each enabled GPU's planned instances.
///
/// # Errors
/// The first failure; the GPUs are left as far as they got (the caller rolls back).
pub fn change(
    backend: &dyn GpuBackend,
    targets: &[Target],
    reboot_allowed: bool,
) -> Result<Changed, ChangeError> {
    let mut resets = Vec::new();
    for target in targets {
        let gpu = target.gpu;
        let Some(mode) = backend.gpu(gpu).map_err(on(gpu, "reading"))?.mig_mode else {
            continue;
        };
        let needed = mode_change(mode, target.enabled);
        if !target.enabled && mode.current && (needed.reset || needed.set_mode.is_some()) {
            destroy_all(backend, gpu)?;
        }
        if let Some(enabled) = needed.set_mode {
            backend
                .set_mig_mode(gpu, enabled)
                .map_err(on(gpu, "setting the MIG mode"))?;
        }
        if needed.reset {
            resets.push(gpu);
        }
    }
    let mut reboot = Vec::new();
    for gpu in resets {
        match backend.reset(gpu) {
            Ok(()) => {}
            Err(GpuError::NotSupported(_)) if reboot_allowed => reboot.push(gpu),
            Err(error) => return Err(on(gpu, "resetting")(error)),
        }
    }
    if !reboot.is_empty() {
        return Ok(Changed::NeedsReboot(reboot));
    }
    for target in targets.iter().filter(|target| target.enabled) {
        let steps = plan_for(backend, target)?;
        apply_plan(backend, target.gpu, &steps).map_err(on(target.gpu, "applying the plan"))?;
    }
    Ok(Changed::Done)
}

/// The plan that takes a GPU from what it has to its target.
fn plan_for(backend: &dyn GpuBackend, target: &Target) -> Result<MigPlan, ChangeError> {
    let gpu = target.gpu;
    let model = backend
        .gpu(gpu)
        .map_err(on(gpu, "reading"))?
        .model()
        .ok_or(ChangeError::UnknownModel { gpu })?;
    // Some catalog values are derived rather than read from hardware: before instances are created from them, the
    // GPU must confirm the id and size of every profile the target uses.
    for name in target.devices.keys() {
        let Some(profile) = model.profile(name.gpu_instance) else {
            continue; // the planner reports the unknown profile
        };
        let reported = match backend.gpu_instance_profile(gpu, profile.nvml_index) {
            Ok(reported) => Some(reported),
            Err(GpuError::NotSupported(_) | GpuError::InvalidArgument(_)) => None,
            Err(error) => return Err(on(gpu, "reading MIG profiles")(error)),
        };
        catalog_agrees(gpu, model, profile, reported.as_ref())?;
    }
    let current = current_geometry(backend, gpu).map_err(on(gpu, "listing instances"))?;
    plan(model, &current, &target.devices).map_err(|source| ChangeError::Plan { gpu, source })
}

/// Whether the GPU reports `profile` (of `model`) as the catalog has it: same profile id, slices and most
/// instances for its NVML constant. `reported` is `None` when the GPU does not offer that constant.
fn catalog_agrees(
    gpu: u32,
    model: &GpuModel,
    profile: &GpuInstanceProfile,
    reported: Option<&GpuInstanceProfileInfo>,
) -> Result<(), ChangeError> {
    let describe = |id: u32, slices: u32, most: u32| {
        format!("profile id {id}, {slices} slices, at most {most}")
    };
    let catalog = describe(
        profile.id,
        u32::from(profile.name.slices),
        profile.max_instances,
    );
    let reported = match reported {
        Some(info) => describe(info.id, info.slice_count, info.instance_count),
        None => format!(
            "no profile for NVML constant {} on {}",
            profile.nvml_index,
            model.product_name()
        ),
    };
    if reported == catalog {
        return Ok(());
    }
    Err(ChangeError::CatalogDisagrees {
        gpu,
        profile: profile.name.to_string(),
        catalog,
        reported,
    })
}

/// Destroys every instance of a GPU (before MIG goes off).
fn destroy_all(backend: &dyn GpuBackend, gpu: u32) -> Result<(), ChangeError> {
    let instances = current_geometry(backend, gpu).map_err(on(gpu, "listing instances"))?;
    let steps = MigPlan {
        destroy: instances
            .iter()
            .map(|instance| instance.gpu_instance_id)
            .collect(),
        ..MigPlan::default()
    };
    apply_plan(backend, gpu, &steps).map_err(on(gpu, "destroying instances"))
}

/// A GPU whose mode or instances differ from its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The target.
    pub wanted: GpuMigGeometry,
    /// What the GPU has, or why it could not be read.
    pub found: Result<GpuMigGeometry, ChangeError>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let describe = |geometry: &GpuMigGeometry| {
            if !geometry.mig_enabled {
                return "MIG off".to_owned();
            }
            let devices: Vec<String> = geometry
                .devices
                .iter()
                .map(|(name, count)| format!("{name} x{count}"))
                .collect();
            format!("MIG on [{}]", devices.join(", "))
        };
        let found = match &self.found {
            Ok(found) => describe(found),
            Err(error) => error.to_string(),
        };
        write!(
            f,
            "GPU {}: wanted {}, found {found}",
            self.wanted.gpu,
            describe(&self.wanted)
        )
    }
}

/// Compares the GPUs with their targets: mode in effect and pending, and the planner finding nothing to do.
#[must_use]
pub fn verify(backend: &dyn GpuBackend, targets: &[Target]) -> Vec<Mismatch> {
    targets
        .iter()
        .filter_map(|target| {
            let wanted = geometry(target.gpu, target.enabled, &target.devices);
            let matches = || -> Result<bool, ChangeError> {
                let mode = backend
                    .gpu(target.gpu)
                    .map_err(on(target.gpu, "reading"))?
                    .mig_mode
                    .unwrap_or_default();
                if mode.current != target.enabled || mode.pending != target.enabled {
                    return Ok(false);
                }
                Ok(!target.enabled || plan_for(backend, target)?.is_noop())
            };
            match matches() {
                Ok(true) => None,
                Ok(false) => Some(Mismatch {
                    found: Ok(found_geometry(backend, target.gpu)),
                    wanted,
                }),
                Err(error) => Some(Mismatch {
                    wanted,
                    found: Err(error),
                }),
            }
        })
        .collect()
}

/// What a GPU has, for a mismatch report (empty when it cannot be read).
fn found_geometry(backend: &dyn GpuBackend, gpu: u32) -> GpuMigGeometry {
    node_runtime::inventory::read(backend)
        .ok()
        .and_then(|gpus| gpus.into_iter().find(|view| view.inventory.index == gpu))
        .map_or_else(
            || GpuMigGeometry {
                gpu,
                ..GpuMigGeometry::default()
            },
            |view| view.geometry(),
        )
}

/// A reboot of a simulated node: processes end and the GPUs reset, even where the platform cannot reset a GPU
/// (which is why the node reboots).
///
/// # Errors
/// When the simulator's state cannot be changed.
pub fn simulated_reboot(simulator: &gpu::Simulator, gpus: &[u32]) -> Result<(), ChangeError> {
    for &gpu in gpus {
        for process in simulator.processes(gpu).map_err(on(gpu, "rebooting"))? {
            simulator
                .stop_process(gpu, process.pid)
                .map_err(on(gpu, "rebooting"))?;
        }
        simulator
            .set_reset_failure(gpu, None)
            .map_err(on(gpu, "rebooting"))?;
        let reset = simulator.reset(gpu).map_err(on(gpu, "rebooting"));
        // The platform still cannot reset GPUs after the reboot.
        simulator
            .set_reset_failure(gpu, Some(ResetFailure::Unsupported))
            .map_err(on(gpu, "rebooting"))?;
        reset?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use gpu::GpuProcess;
    use node_runtime::inventory::read;
    use node_runtime::testing::simulated;

    use super::*;

    fn target(gpu: u32, devices: &[(&str, u32)]) -> Target {
        Target {
            gpu,
            enabled: true,
            devices: devices
                .iter()
                .map(|(name, count)| (name.parse().unwrap(), *count))
                .collect(),
        }
    }

    fn uuids(backend: &dyn GpuBackend, gpu: u32) -> Vec<String> {
        backend
            .mig_devices(gpu)
            .unwrap()
            .into_iter()
            .map(|device| device.uuid)
            .collect()
    }

    #[test]
    fn applies_mode_reset_and_instances() {
        let (_dir, simulator) = simulated("a100-80gb:2", &[]);
        let targets = [target(0, &[("1g.10gb", 7)])];
        assert_eq!(
            change(simulator.as_ref(), &targets, false).unwrap(),
            Changed::Done
        );
        assert!(verify(simulator.as_ref(), &targets).is_empty());
        let gpus = read(simulator.as_ref()).unwrap();
        assert_eq!(gpus[0].geometry().devices["1g.10gb"], 7);
        assert!(!gpus[1].geometry().mig_enabled, "GPU 1 was not a target");
    }

    #[test]
    fn untouched_gpus_keep_their_devices() {
        let (_dir, simulator) = simulated("a100-80gb:2", &[("1g.10gb", 7)]);
        let before = uuids(simulator.as_ref(), 1);
        let targets = [target(0, &[("3g.40gb", 2)]), target(1, &[("1g.10gb", 7)])];
        change(simulator.as_ref(), &targets, false).unwrap();
        assert!(verify(simulator.as_ref(), &targets).is_empty());
        assert_eq!(uuids(simulator.as_ref(), 1), before);
    }

    #[test]
    fn turning_mig_off_destroys_instances_first() {
        let (_dir, simulator) = simulated("a100-40gb:1", &[("1g.5gb", 7)]);
        let off = Target {
            gpu: 0,
            enabled: false,
            devices: BTreeMap::new(),
        };
        change(simulator.as_ref(), std::slice::from_ref(&off), false).unwrap();
        assert!(verify(simulator.as_ref(), &[off]).is_empty());
    }

    #[test]
    fn a_busy_gpu_is_not_reset_and_says_why() {
        let (_dir, simulator) = simulated("a100-80gb:1", &[]);
        let process = GpuProcess {
            pid: 42,
            used_memory_mib: Some(100),
            gpu_instance_id: None,
            compute_instance_id: None,
        };
        simulator.start_process(0, process).unwrap();
        let error = change(simulator.as_ref(), &[target(0, &[("1g.10gb", 1)])], false).unwrap_err();
        assert!(
            error.to_string().starts_with("GPU 0: resetting: in use"),
            "{error}"
        );
        let mismatch = verify(simulator.as_ref(), &[target(0, &[("1g.10gb", 1)])]);
        assert_eq!(
            mismatch[0].to_string(),
            "GPU 0: wanted MIG on [1g.10gb x1], found MIG off"
        );
    }

    #[test]
    fn an_unresettable_gpu_needs_a_reboot_which_the_simulator_does() {
        let (_dir, simulator) = simulated("h100-80gb:2", &[]);
        simulator
            .set_reset_failure(0, Some(ResetFailure::Unsupported))
            .unwrap();
        let targets = [target(0, &[("1g.10gb", 7)])];
        let error = change(simulator.as_ref(), &targets, false).unwrap_err();
        assert!(matches!(
            error,
            ChangeError::Gpu {
                source: GpuError::NotSupported(_),
                ..
            }
        ));
        assert_eq!(
            change(simulator.as_ref(), &targets, true).unwrap(),
            Changed::NeedsReboot(vec![0])
        );
        simulated_reboot(&simulator, &[0]).unwrap();
        assert_eq!(
            change(simulator.as_ref(), &targets, true).unwrap(),
            Changed::Done
        );
        assert!(verify(simulator.as_ref(), &targets).is_empty());
    }

    #[test]
    fn rolling_back_to_a_recorded_geometry_touches_only_what_changed() {
        let (_dir, simulator) = simulated("a100-80gb:2", &[("1g.10gb", 7)]);
        let previous = node_runtime::inventory::geometries(&read(simulator.as_ref()).unwrap());
        let untouched = uuids(simulator.as_ref(), 1);
        change(simulator.as_ref(), &[target(0, &[("3g.40gb", 2)])], false).unwrap();
        let back: Vec<Target> = previous
            .iter()
            .map(|geometry| Target::from_geometry(geometry).unwrap())
            .collect();
        change(simulator.as_ref(), &back, false).unwrap();
        assert!(verify(simulator.as_ref(), &back).is_empty());
        assert_eq!(uuids(simulator.as_ref(), 1), untouched);
    }

    #[test]
    fn a_recorded_geometry_becomes_a_target() {
        let geometry = GpuMigGeometry {
            gpu: 3,
            mig_enabled: true,
            devices: BTreeMap::from([("2g.20gb".into(), 3)]),
        };
        assert_eq!(
            Target::from_geometry(&geometry).unwrap(),
            target(3, &[("2g.20gb", 3)])
        );
        let unknown = GpuMigGeometry {
            devices: BTreeMap::from([("profile-99".into(), 1)]),
            ..geometry
        };
        assert!(Target::from_geometry(&unknown).is_err());
    }

    /// Instances are created from the catalog only where the GPU confirms the catalog's profile.
    #[test]
    fn a_catalog_the_gpu_contradicts_is_not_used() {
        let model = crd::mig::model_by_simulator_name("rtx-pro-6000").unwrap();
        let profile = model.profile_by_name("1g.24gb+gfx").unwrap();
        let info = |id| GpuInstanceProfileInfo {
            nvml_index: profile.nvml_index,
            id,
            slice_count: 1,
            instance_count: 4,
            memory_mib: profile.memory_mib,
            multiprocessor_count: profile.sm_count,
        };
        catalog_agrees(0, model, profile, Some(&info(profile.id))).unwrap();
        assert_eq!(
            catalog_agrees(0, model, profile, Some(&info(profile.id + 1)))
                .unwrap_err()
                .to_string(),
            format!(
                "GPU 0: the MIG catalog's 1g.24gb+gfx (profile id {}, 1 slices, at most 4) differs from what the GPU \
                 reports (profile id {}, 1 slices, at most 4); nothing was created: the catalog needs correcting for \
                 this model",
                profile.id,
                profile.id + 1
            )
        );
        assert!(
            catalog_agrees(0, model, profile, None)
                .unwrap_err()
                .to_string()
                .contains("no profile for NVML constant 10 on NVIDIA RTX PRO 6000 Blackwell Server Edition")
        );
    }
}

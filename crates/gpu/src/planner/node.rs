//! Node-level decisions: which entry of a named mig-parted config each GPU takes, and whether its MIG mode must
//! change. Callers reset only the GPUs whose mode changes, so a config edit that only moves instances never
//! interrupts the other GPUs of the node.

use crd::config::mig_parted::{MigConfigEntry, MigPartedConfig, PciDeviceId};

use super::{PlanError, plan};
use crate::types::{GpuInventory, MigMode};

/// What must happen to a GPU's MIG mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModeChange {
    /// Set the mode to this (it becomes the pending mode); `None` when the pending mode is already right.
    pub set_mode: Option<bool>,
    /// Reset the GPU afterwards, so that the pending mode takes effect.
    pub reset: bool,
}

impl ModeChange {
    /// True when nothing needs doing.
    #[must_use]
    pub fn is_none(self) -> bool {
        self.set_mode.is_none() && !self.reset
    }
}

/// What to do so that `mode` ends up `enabled`. A pending mode that is already the wanted one needs only the reset
/// (a previous run set it and stopped before resetting); a pending mode that differs from a right current mode is
/// set back, which needs no reset.
#[must_use]
pub fn mode_change(mode: MigMode, enabled: bool) -> ModeChange {
    ModeChange {
        set_mode: (mode.pending != enabled).then_some(enabled),
        reset: mode.current != enabled,
    }
}

/// The decision for one GPU under a named config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuDecision<'c> {
    /// Index of the GPU.
    pub gpu_index: u32,
    /// The config entry that applies to it.
    pub entry: &'c MigConfigEntry,
    /// What its MIG mode needs.
    pub mode_change: ModeChange,
}

/// Decides, for each GPU of a node, which entry of config `name` applies and what its MIG mode needs. GPUs no entry
/// applies to are left out (the config leaves them alone), and so are GPUs without MIG that an entry keeps MIG off.
///
/// Every entry that enables MIG is also planned on an empty GPU of the GPU's model, so that a geometry that cannot
/// exist is refused before any GPU is reset, not after.
///
/// # Errors
/// An unknown config name, two applicable entries that disagree, MIG on a GPU without MIG, a GPU model the catalog
/// does not know, or a geometry that does not fit the model.
pub fn decide<'c>(
    config: &'c MigPartedConfig,
    name: &str,
    gpus: &[GpuInventory],
) -> Result<Vec<GpuDecision<'c>>, PlanError> {
    let entries = config
        .mig_configs
        .get(name)
        .ok_or_else(|| PlanError::UnknownConfig {
            name: name.to_owned(),
            known: config
                .mig_configs
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let mut decisions = Vec::new();
    for gpu in gpus {
        let Some(entry) = applicable_entry(name, entries, gpu)? else {
            continue;
        };
        let Some(mode) = gpu.mig_mode else {
            if entry.mig_enabled {
                return Err(PlanError::NotMigCapable {
                    name: name.to_owned(),
                    gpu: gpu.index,
                    product: gpu.product_name.clone(),
                });
            }
            continue;
        };
        let devices = entry.mig_devices.clone().unwrap_or_default();
        if entry.mig_enabled && !devices.is_empty() {
            let model = gpu.model().ok_or_else(|| PlanError::UnknownModel {
                name: name.to_owned(),
                gpu: gpu.index,
                product: gpu.product_name.clone(),
                pci_device_id: PciDeviceId(gpu.pci_device_id),
            })?;
            plan(model, &[], &devices)?;
        }
        decisions.push(GpuDecision {
            gpu_index: gpu.index,
            entry,
            mode_change: mode_change(mode, entry.mig_enabled),
        });
    }
    Ok(decisions)
}

/// The entry of `entries` that applies to `gpu` (by index and PCI device id), if any. Several may apply as long as
/// they ask for the same thing; mig-parted would apply them one after the other, so differing ones are a mistake in
/// the config that we report rather than resolve by position.
fn applicable_entry<'c>(
    name: &str,
    entries: &'c [MigConfigEntry],
    gpu: &GpuInventory,
) -> Result<Option<&'c MigConfigEntry>, PlanError> {
    let mut applicable = entries
        .iter()
        .enumerate()
        .filter(|(_, entry)| entry.applies_to(gpu.index, gpu.pci_device_id));
    let Some((first_position, first)) = applicable.next() else {
        return Ok(None);
    };
    let geometry = |entry: &MigConfigEntry| {
        (
            entry.mig_enabled,
            entry.mig_devices.clone().unwrap_or_default(),
        )
    };
    for (position, other) in applicable {
        if geometry(other) != geometry(first) {
            return Err(PlanError::ConflictingEntries {
                name: name.to_owned(),
                gpu: gpu.index,
                first: first_position,
                second: position,
            });
        }
    }
    Ok(Some(first))
}

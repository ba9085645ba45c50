//! The checks types cannot express: cross-field rules of an entry, and profiles checked against the MIG catalog for
//! the models the catalog knows.

use std::collections::BTreeSet;

use super::MigConfigEntry;
use crate::config::{ConfigError, label_value_problem};
use crate::mig::{
    GpuInstanceProfileName, GpuModel, MAX_MIG_DEVICES_PER_GPU, MigProfileName,
    model_by_pci_device_id,
};

/// Checks the typed entries of config `name` (at `path`, `mig-configs.<name>`); returns the first problem, entries
/// in file order.
pub(super) fn validate(
    name: &str,
    path: &str,
    entries: &[MigConfigEntry],
) -> Result<(), ConfigError> {
    if let Some(problem) = label_value_problem(name) {
        return Err(ConfigError::invalid(
            path,
            format!(
                "\"{name}\" cannot be selected with the nvidia.com/mig.config label: {problem}"
            ),
        ));
    }
    if entries.is_empty() {
        return Err(ConfigError::invalid(
            path,
            "list at least one entry (devices, mig-enabled, mig-devices)",
        ));
    }
    for (index, entry) in entries.iter().enumerate() {
        validate_entry(&format!("{path}[{index}]"), entry)?;
    }
    Ok(())
}

/// Checks one entry at `path` (`mig-configs.<name>[<index>]`).
fn validate_entry(path: &str, entry: &MigConfigEntry) -> Result<(), ConfigError> {
    let devices_path = format!("{path}.mig-devices");
    let counts = match (&entry.mig_devices, entry.mig_enabled) {
        (None, true) => {
            return Err(ConfigError::invalid(
                path,
                "missing field \"mig-devices\" (required when mig-enabled is true; \
                 write mig-devices: {} to enable MIG without creating instances)",
            ));
        }
        (Some(counts), false) if !counts.is_empty() => {
            return Err(ConfigError::invalid(
                devices_path,
                "must be empty when mig-enabled is false (remove mig-devices or set mig-enabled: true)",
            ));
        }
        (Some(counts), true) => counts,
        (_, false) => return Ok(()),
    };
    // Each count is at most the bound, so the sum of a map's counts cannot overflow before it is compared.
    let total: u64 = counts.values().map(|&count| u64::from(count)).sum();
    if total > u64::from(MAX_MIG_DEVICES_PER_GPU) {
        return Err(ConfigError::invalid(
            devices_path,
            format!(
                "{total} MIG devices in all, more than a GPU holds: use at most {MAX_MIG_DEVICES_PER_GPU} per entry"
            ),
        ));
    }

    // Only the models the catalog knows can be checked here. The rest of the filter, and an entry without a filter
    // (which applies to whatever GPU a node has), are checked on the node against the GPU NVML reports.
    let known: Vec<&GpuModel> = entry
        .device_filter
        .iter()
        .filter_map(|id| model_by_pci_device_id(id.0))
        .collect();
    for (profile, &count) in counts {
        if let Some(message) = known
            .iter()
            .find_map(|model| check_model(model, *profile, count))
        {
            return Err(ConfigError::invalid(devices_path, message));
        }
    }
    Ok(())
}

/// The problem with `count` instances of `profile` on `model`, if any.
fn check_model(model: &GpuModel, profile: MigProfileName, count: u32) -> Option<String> {
    let product = model.product_name();
    match model.profile(profile.gpu_instance) {
        None => Some(format!(
            "unknown profile \"{profile}\" for {product} (known profiles: {})",
            name_list(model.profiles.iter().map(|known| known.name))
        )),
        Some(known) if count > known.max_instances => Some(format!(
            "\"{profile}\": {count} instances do not fit on {product}, which holds at most {}",
            known.max_instances
        )),
        Some(_) => None,
    }
}

/// Distinct names, smallest first, comma separated.
fn name_list(names: impl Iterator<Item = GpuInstanceProfileName>) -> String {
    let sorted: BTreeSet<GpuInstanceProfileName> = names.collect();
    sorted
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

//! MIG facts: the catalog of MIG-capable GPU models and their GPU-instance profiles, the profile-name grammar, and
//! the default mig-parted config that the chart ships and the MIG manager falls back to.
//!
//! Pure data and pure functions: the simulator, the config validators and the placement planner all read the same
//! table, so a profile that validates is one the simulator can create.

mod catalog;
mod profile_name;

pub use catalog::{
    ComputeCapability, GpuInstanceProfile, GpuModel, model_by_pci_device_id, model_by_product_name,
    model_by_simulator_name, models,
};
pub use profile_name::{
    GpuInstanceProfileName, MigProfileName, ProfileAttribute, ProfileNameError,
};

/// The default mig-parted config (YAML): NVIDIA's well-known config names (`all-disabled`, `all-enabled`,
/// `all-balanced`, `all-<profile>` for every profile of every catalog model) plus the `2x2g.10gb-3x1g.5gb` example of
/// the guides. Embedded so that the chart's ConfigMap and the MIG manager's fallback cannot drift apart.
pub const DEFAULT_MIG_CONFIG: &str = include_str!("default-mig-config.yaml");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::mig_parted::{self, DeviceSelector};

    #[test]
    fn default_config_parses_and_has_the_well_known_names() {
        let config = mig_parted::parse(DEFAULT_MIG_CONFIG).unwrap();
        for name in [
            "all-disabled",
            "all-enabled",
            "all-balanced",
            "all-1g.5gb",
            "all-2g.10gb",
            "all-3g.20gb",
            "all-7g.40gb",
            "all-1g.10gb",
            "all-2g.20gb",
            "all-3g.40gb",
            "all-7g.80gb",
            "2x2g.10gb-3x1g.5gb",
        ] {
            assert!(config.mig_configs.contains_key(name), "{name} missing");
        }
    }

    /// Every profile of a filtered entry exists, with room for its count, on every model the filter names; every
    /// filter id is one the catalog knows; an unfiltered entry's profiles exist on some model.
    #[test]
    fn default_config_profiles_exist_in_the_catalog() {
        let config = mig_parted::parse(DEFAULT_MIG_CONFIG).unwrap();
        for (name, entries) in &config.mig_configs {
            for entry in entries {
                assert_eq!(entry.devices, DeviceSelector::All, "{name}");
                let counts = entry.mig_devices.clone().unwrap_or_default();
                let filtered: Vec<&GpuModel> = entry
                    .device_filter
                    .iter()
                    .map(|id| {
                        model_by_pci_device_id(id.0)
                            .unwrap_or_else(|| panic!("{name}: unknown {id}"))
                    })
                    .collect();
                for (profile, count) in counts {
                    if filtered.is_empty() {
                        assert!(
                            models()
                                .iter()
                                .any(|model| model.profile(profile.gpu_instance).is_some()),
                            "{name}: {profile}"
                        );
                    }
                    for model in &filtered {
                        let known = model.profile(profile.gpu_instance).unwrap_or_else(|| {
                            panic!("{name}: {profile} not on {}", model.product_name())
                        });
                        assert!(count <= known.max_instances, "{name}: {profile}");
                    }
                }
            }
        }
    }

    /// Every profile of every catalog model has its `all-<profile>` config (`+` written as `.`), so that a user can
    /// select any profile the catalog offers by name.
    #[test]
    fn default_config_has_an_all_config_per_profile() {
        let config = mig_parted::parse(DEFAULT_MIG_CONFIG).unwrap();
        for model in models() {
            for profile in model.profiles {
                let name = format!("all-{}", profile.name.to_string().replace('+', "."));
                assert!(config.mig_configs.contains_key(&name), "{name} missing");
            }
        }
    }
}

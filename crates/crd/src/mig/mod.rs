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

/// The most MIG devices one GPU can be split into: every MIG-capable GPU has at most 7 compute slices, and each
/// device of a mig-parted config is a GPU instance of its own, which takes at least one. Counts are checked against
/// it before anything is expanded, so that a count near `u32::MAX` is an error, not an allocation.
pub const MAX_MIG_DEVICES_PER_GPU: u32 = 7;

/// The default mig-parted config (YAML): every config of NVIDIA's default (gpu-operator v26.7.0) with the same
/// geometry for every device id (`all-disabled`, `all-enabled`, `all-balanced`, `all-<profile>` for every profile of
/// every catalog model) plus the `2x2g.10gb-3x1g.5gb` example of the guides. Embedded so that the chart's ConfigMap
/// (generated from it by `cargo xtask crdgen`) and the MIG manager's fallback cannot drift apart.
pub const DEFAULT_MIG_CONFIG: &str = include_str!("default-mig-config.yaml");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::mig_parted::{self, DeviceSelector, MigPartedConfig};

    /// Our transcription of NVIDIA's default mig-parted config (gpu-operator v26.7.0, `config.yaml` of
    /// `assets/state-mig-manager/0400_configmap.yaml`).
    const NVIDIA_DEFAULT: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/nvidia/default-mig-parted-config.yaml"
    ));

    /// Profiles NVIDIA's default config names without a device filter that no model of the catalog has (they
    /// belong to a GB200 variant whose device id the file does not give); a node with such a GPU checks them.
    const UNCATALOGUED: [&str; 4] = ["1g.24gb+me", "3g.95gb", "4g.95gb", "7g.189gb"];

    /// Parses `text`, which must have no invalid config.
    fn valid(text: &str) -> MigPartedConfig {
        let parsed = mig_parted::parse(text).unwrap();
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        parsed.config
    }

    #[test]
    fn nvidias_default_config_parses_whole() {
        let config = valid(NVIDIA_DEFAULT);
        assert_eq!(config.mig_configs.len(), 81);
    }

    #[test]
    fn default_config_parses_and_has_the_well_known_names() {
        let config = valid(DEFAULT_MIG_CONFIG);
        for name in [
            "all-disabled",
            "all-enabled",
            "all-balanced",
            "all-1g.5gb",
            "all-7g.80gb",
            "all-1g.24gb.gfx",
            "all-2g.48gb.me.all",
            "all-1g.24gb-me",
            "2x2g.10gb-3x1g.5gb",
        ] {
            assert!(config.mig_configs.contains_key(name), "{name} missing");
        }
    }

    /// Every config of NVIDIA's default is in ours, and gives every GPU the same geometry: for every device id the
    /// catalog knows, and for one it does not, at several GPU indices.
    #[test]
    fn default_config_is_a_superset_of_nvidias() {
        let ours = valid(DEFAULT_MIG_CONFIG);
        let nvidia = valid(NVIDIA_DEFAULT);
        let ids: Vec<u32> = models()
            .iter()
            .flat_map(|model| model.pci_device_ids.iter().copied())
            .chain([0xFFFF_10DE])
            .collect();
        let geometry = |config: &MigPartedConfig, name: &str, index: u32, id: u32| {
            config
                .entries_for_gpu(name, index, id)
                .unwrap_or_else(|| panic!("{name} missing"))
                .into_iter()
                .map(|entry| (entry.mig_enabled, entry.mig_devices.clone()))
                .collect::<Vec<_>>()
        };
        for name in nvidia.mig_configs.keys() {
            for &id in &ids {
                for index in 0..3 {
                    assert_eq!(
                        geometry(&ours, name, index, id),
                        geometry(&nvidia, name, index, id),
                        "{name} on 0x{id:08X} GPU {index}"
                    );
                }
            }
        }
        assert_eq!(
            ours.mig_configs.len(),
            nvidia.mig_configs.len() + 1,
            "only 2x2g.10gb-3x1g.5gb is ours alone"
        );
    }

    /// Every profile of a filtered entry exists, with room for its count, on every model the filter names; every
    /// filter id is one the catalog knows; an unfiltered entry's profiles exist on some model, except the ones NVIDIA
    /// names for a GPU the catalog cannot identify.
    #[test]
    fn default_config_profiles_exist_in_the_catalog() {
        let config = valid(DEFAULT_MIG_CONFIG);
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
                        let on_some_model = models().iter().any(|model| {
                            model
                                .profile(profile.gpu_instance)
                                .is_some_and(|known| count <= known.max_instances)
                        });
                        assert!(
                            on_some_model || UNCATALOGUED.contains(&profile.to_string().as_str()),
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
        let config = valid(DEFAULT_MIG_CONFIG);
        for model in models() {
            for profile in model.profiles {
                let name = format!("all-{}", profile.name.to_string().replace('+', "."));
                assert!(config.mig_configs.contains_key(&name), "{name} missing");
            }
        }
    }

    /// The bound that config counts are checked against holds for every model the catalog knows.
    #[test]
    fn no_model_holds_more_mig_devices_than_the_bound() {
        for model in models() {
            assert!(
                u32::from(model.compute_slices) <= MAX_MIG_DEVICES_PER_GPU,
                "{}",
                model.product_name()
            );
            for profile in model.profiles {
                assert!(
                    profile.max_instances <= MAX_MIG_DEVICES_PER_GPU,
                    "{} {}",
                    model.product_name(),
                    profile.name
                );
            }
        }
    }
}

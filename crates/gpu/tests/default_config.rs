//! The default mig-parted configs must work on the GPUs they name: ours (the chart's) and NVIDIA's (gpu-operator
//! v26.7.0, our transcription in `tests/fixtures/nvidia/`). Every enabled entry plans and applies on a simulated
//! GPU of every model its device filter names (an entry without a filter: every model that has all of its
//! profiles); every config of NVIDIA's file, selected on a node of every catalog model, gives that node the geometry
//! of the entry for its device id; and a whole node can be moved from config to config through the planner.

mod common;

use std::collections::BTreeMap;

use common::{device_counts, fresh_mig_gpu, nonzero, reconfigure};
use crd::config::mig_parted::{self, MigConfigEntry, MigPartedConfig};
use crd::mig::{DEFAULT_MIG_CONFIG, GpuModel, MigProfileName, model_by_pci_device_id, models};
use gpu::planner::decide;
use gpu::{GpuBackend, Simulator, apply_plan, current_geometry, plan};
use tempfile::TempDir;

/// Our transcription of NVIDIA's default mig-parted config (`config.yaml` of gpu-operator v26.7.0's
/// `assets/state-mig-manager/0400_configmap.yaml`).
const NVIDIA_DEFAULT: &str =
    include_str!("../../../tests/fixtures/nvidia/default-mig-parted-config.yaml");

/// Profiles NVIDIA's default config names without a device filter that no model of the catalog has (a GB200
/// variant the file gives no device id for); a node with such a GPU checks them against NVML.
const UNCATALOGUED: [&str; 4] = ["1g.24gb+me", "3g.95gb", "4g.95gb", "7g.189gb"];

/// Parses `text`, which must have no invalid config.
fn valid(text: &str) -> MigPartedConfig {
    let parsed = mig_parted::parse(text).unwrap();
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    parsed.config
}

/// The models an entry is meant for.
fn models_for(entry: &MigConfigEntry) -> Vec<&'static GpuModel> {
    if entry.device_filter.is_empty() {
        let devices = entry.mig_devices.clone().unwrap_or_default();
        models()
            .iter()
            .filter(|model| {
                devices
                    .keys()
                    .all(|name| model.profile(name.gpu_instance).is_some())
            })
            .collect()
    } else {
        entry
            .device_filter
            .iter()
            .map(|id| model_by_pci_device_id(id.0).unwrap())
            .collect()
    }
}

/// Plans and applies every enabled entry of `config` on a fresh GPU of each model it is meant for; returns the
/// number of entry/model pairs checked.
fn plan_every_entry(label: &str, config: &MigPartedConfig) -> usize {
    let mut checked = 0;
    for (name, entries) in &config.mig_configs {
        for entry in entries.iter().filter(|entry| entry.mig_enabled) {
            let request = entry.mig_devices.clone().unwrap_or_default();
            let targets = models_for(entry);
            if targets.is_empty() {
                assert!(
                    request
                        .keys()
                        .all(|profile| UNCATALOGUED.contains(&profile.to_string().as_str())),
                    "{label} {name}: no model has all of {request:?}"
                );
                continue;
            }
            for model in targets {
                let context = format!("{label} {name} on {}", model.simulator_name);
                let planned =
                    plan(model, &[], &request).unwrap_or_else(|error| panic!("{context}: {error}"));
                let (_dir, sim) = fresh_mig_gpu(model);
                apply_plan(&sim, 0, &planned).unwrap_or_else(|error| panic!("{context}: {error}"));
                assert_eq!(device_counts(&sim, model), nonzero(&request), "{context}");
                checked += 1;
            }
        }
    }
    checked
}

#[test]
fn every_default_config_plans_and_applies_on_its_models() {
    let checked = plan_every_entry("ours", &valid(DEFAULT_MIG_CONFIG));
    assert!(checked > 100, "only {checked} config/model pairs checked");
}

#[test]
fn every_config_of_nvidias_default_plans_and_applies_on_its_models() {
    let checked = plan_every_entry("NVIDIA's", &valid(NVIDIA_DEFAULT));
    assert!(checked > 100, "only {checked} config/model pairs checked");
}

/// Whether a GPU of `model` can hold `request` (every profile exists, every count fits alone).
fn model_has(model: &GpuModel, request: &BTreeMap<MigProfileName, u32>) -> bool {
    request.iter().all(|(name, count)| {
        model
            .profile(name.gpu_instance)
            .is_some_and(|profile| *count <= profile.max_instances)
    })
}

/// For every device id of every catalog model, a simulated node with one such GPU selects each of NVIDIA's 81
/// configs as the MIG manager would (decide, set the mode, reset, plan, apply): the GPU ends with exactly the
/// geometry of the entry NVIDIA's file gives its device id, or, when that entry's profiles do not exist on the
/// model (an unfiltered `all-<profile>` for another model), the config is refused before anything is touched.
/// `all-balanced` must apply on every model.
#[test]
fn every_nvidia_config_gives_each_model_its_entry() {
    let config = valid(NVIDIA_DEFAULT);
    assert_eq!(config.mig_configs.len(), 81);
    let mut applied = 0;
    let mut balanced = Vec::new();
    for model in models() {
        let dir = TempDir::new().unwrap();
        let spec = format!("{}:1", model.simulator_name).parse().unwrap();
        let sim = Simulator::open(dir.path().join("state.json"), "node-1", &spec).unwrap();
        assert_eq!(
            sim.gpu(0).unwrap().model(),
            Some(model),
            "{}",
            model.simulator_name
        );
        for name in config.mig_configs.keys() {
            // Read again each time: the MIG mode is what the previous config left.
            let gpus = sim.gpus().unwrap();
            let context = format!("{name} on {}", model.simulator_name);
            let entries = config
                .entries_for_gpu(name, 0, gpus[0].pci_device_id)
                .unwrap();
            let Some(entry) = entries.first() else {
                assert!(
                    decide(&config, name, &gpus).unwrap().is_empty(),
                    "{context}"
                );
                continue;
            };
            let request = entry.mig_devices.clone().unwrap_or_default();
            if entry.mig_enabled && !model_has(model, &request) {
                assert!(decide(&config, name, &gpus).is_err(), "{context}");
                assert_ne!(name, "all-balanced", "{context}");
                continue;
            }
            let decisions =
                decide(&config, name, &gpus).unwrap_or_else(|error| panic!("{context}: {error}"));
            let decision = &decisions[0];
            if let Some(enabled) = decision.mode_change.set_mode {
                sim.set_mig_mode(0, enabled).unwrap();
            }
            if decision.mode_change.reset {
                sim.reset(0).unwrap();
            }
            if decision.entry.mig_enabled {
                let current = current_geometry(&sim, 0).unwrap();
                let planned = plan(model, &current, &request)
                    .unwrap_or_else(|error| panic!("{context}: {error}"));
                apply_plan(&sim, 0, &planned).unwrap_or_else(|error| panic!("{context}: {error}"));
                assert_eq!(device_counts(&sim, model), nonzero(&request), "{context}");
            } else {
                assert!(!sim.gpu(0).unwrap().mig_mode.unwrap().current, "{context}");
            }
            if name == "all-balanced" {
                assert!(!request.is_empty(), "{context}");
                balanced.push(model.simulator_name);
            }
            applied += 1;
        }
    }
    let every: Vec<&str> = models().iter().map(|model| model.simulator_name).collect();
    assert_eq!(balanced, every, "all-balanced must apply on every model");
    assert!(applied >= 150, "only {applied} config/model pairs applied");
}

/// A node with two models goes from all-disabled to all-balanced to all-1g.10gb and back, as the MIG manager would
/// drive it: decide per GPU, set modes and reset only where needed, then plan and apply per GPU.
#[test]
fn a_node_moves_between_default_configs() {
    let config = valid(DEFAULT_MIG_CONFIG);
    let dir = TempDir::new().unwrap();
    let spec = "a100-40gb:2,h100-80gb:1".parse().unwrap();
    let sim = Simulator::open(dir.path().join("state.json"), "node-1", &spec).unwrap();

    for (name, expect_reset) in [
        ("all-balanced", true),
        ("all-1g.10gb", false),
        ("all-disabled", true),
    ] {
        let gpus = sim.gpus().unwrap();
        let decisions = decide(&config, name, &gpus).unwrap();
        assert_eq!(decisions.len(), 3, "{name}");
        for decision in &decisions {
            let gpu = decision.gpu_index;
            assert_eq!(decision.mode_change.reset, expect_reset, "{name} GPU {gpu}");
            if let Some(enabled) = decision.mode_change.set_mode {
                sim.set_mig_mode(gpu, enabled).unwrap();
            }
            if decision.mode_change.reset {
                sim.reset(gpu).unwrap();
            }
            if decision.entry.mig_enabled {
                let model = gpus[gpu as usize].model().unwrap();
                let request = decision.entry.mig_devices.clone().unwrap_or_default();
                let current = current_geometry(&sim, gpu).unwrap();
                apply_plan(&sim, gpu, &plan(model, &current, &request).unwrap()).unwrap();
            }
        }
    }
    assert!(
        sim.gpus()
            .unwrap()
            .iter()
            .all(|gpu| !gpu.mig_mode.unwrap().current)
    );
}

/// all-balanced on an A100-40GB, then the guides' 2x2g.10gb-3x1g.5gb: the 1g.5gb instances of the first survive.
#[test]
fn switching_geometry_keeps_matching_instances() {
    let config = valid(DEFAULT_MIG_CONFIG);
    let a100 = model_by_pci_device_id(0x20B0_10DE).unwrap();
    let (_dir, sim) = fresh_mig_gpu(a100);
    let request = |name: &str| {
        let gpu = sim.gpu(0).unwrap();
        let entries = config.entries_for_gpu(name, 0, gpu.pci_device_id).unwrap();
        entries[0].mig_devices.clone().unwrap()
    };
    reconfigure(&sim, a100, &request("all-balanced")).unwrap();
    let planned = reconfigure(&sim, a100, &request("2x2g.10gb-3x1g.5gb")).unwrap();
    let kept: Vec<String> = planned
        .keep
        .iter()
        .map(|kept| kept.profile.to_string())
        .collect();
    assert!(
        kept.iter().filter(|name| *name == "1g.5gb").count() == 2,
        "{planned:?}"
    );
    assert_eq!(
        device_counts(&sim, a100),
        nonzero(&request("2x2g.10gb-3x1g.5gb"))
    );
}

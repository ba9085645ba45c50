//! The default mig-parted config the chart ships must work on the GPUs it names: every enabled entry plans and
//! applies on a simulated GPU of every model its device filter names (an entry without a filter: every model that has
//! all of its profiles), and a whole node can be moved from config to config through the planner.

mod common;

use common::{device_counts, fresh_mig_gpu, nonzero, reconfigure};
use crd::config::mig_parted::{self, MigConfigEntry};
use crd::mig::{DEFAULT_MIG_CONFIG, GpuModel, model_by_pci_device_id, models};
use gpu::planner::decide;
use gpu::{GpuBackend, Simulator, apply_plan, current_geometry, plan};
use tempfile::TempDir;

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

#[test]
fn every_default_config_plans_and_applies_on_its_models() {
    let config = mig_parted::parse(DEFAULT_MIG_CONFIG).unwrap();
    let mut checked = 0;
    for (name, entries) in &config.mig_configs {
        for entry in entries.iter().filter(|entry| entry.mig_enabled) {
            let request = entry.mig_devices.clone().unwrap_or_default();
            let targets = models_for(entry);
            assert!(
                !targets.is_empty(),
                "{name}: no model has all of {request:?}"
            );
            for model in targets {
                let planned = plan(model, &[], &request)
                    .unwrap_or_else(|error| panic!("{name} on {}: {error}", model.simulator_name));
                let (_dir, sim) = fresh_mig_gpu(model);
                apply_plan(&sim, 0, &planned)
                    .unwrap_or_else(|error| panic!("{name} on {}: {error}", model.simulator_name));
                assert_eq!(
                    device_counts(&sim, model),
                    nonzero(&request),
                    "{name} on {}",
                    model.simulator_name
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 30, "only {checked} config/model pairs checked");
}

/// A node with two models goes from all-disabled to all-balanced to all-1g.10gb and back, as the MIG manager would
/// drive it: decide per GPU, set modes and reset only where needed, then plan and apply per GPU.
#[test]
fn a_node_moves_between_default_configs() {
    let config = mig_parted::parse(DEFAULT_MIG_CONFIG).unwrap();
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
    let config = mig_parted::parse(DEFAULT_MIG_CONFIG).unwrap();
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

//! Helpers shared by the integration tests: a fresh simulated GPU, what is on it, and reconfiguring it.

use std::collections::BTreeMap;

use crd::mig::{GpuModel, MigProfileName};
use gpu::{GpuBackend, MigPlan, Simulator, apply_plan, current_geometry, plan};
use tempfile::TempDir;

/// A simulator with one GPU of `model`, MIG on, no instances. The directory must outlive the simulator.
pub fn fresh_mig_gpu(model: &GpuModel) -> (TempDir, Simulator) {
    let dir = TempDir::new().unwrap();
    let spec = format!("{}:1", model.simulator_name).parse().unwrap();
    let sim = Simulator::open(dir.path().join("state.json"), "prop-node", &spec).unwrap();
    sim.set_mig_mode(0, true).unwrap();
    sim.reset(0).unwrap();
    (dir, sim)
}

/// The MIG devices on GPU 0, counted by profile name.
pub fn device_counts(sim: &Simulator, model: &GpuModel) -> BTreeMap<MigProfileName, u32> {
    let mut counts = BTreeMap::new();
    for device in sim.mig_devices(0).unwrap() {
        let profile = model
            .profiles
            .iter()
            .find(|profile| profile.id == device.gpu_instance_profile_id)
            .unwrap();
        let name = MigProfileName {
            gpu_instance: profile.name,
            compute_slices: u8::try_from(device.compute_slice_count).unwrap(),
        };
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}

/// The request without its zero counts, as it should appear on the GPU.
pub fn nonzero(request: &BTreeMap<MigProfileName, u32>) -> BTreeMap<MigProfileName, u32> {
    request
        .iter()
        .filter(|(_, count)| **count > 0)
        .map(|(name, count)| (*name, *count))
        .collect()
}

/// Reads GPU 0's geometry, plans the request from it and applies the plan; nothing is touched when planning fails.
pub fn reconfigure(
    sim: &Simulator,
    model: &GpuModel,
    request: &BTreeMap<MigProfileName, u32>,
) -> Result<MigPlan, String> {
    let current = current_geometry(sim, 0).map_err(|error| error.to_string())?;
    let planned = plan(model, &current, request).map_err(|error| error.to_string())?;
    apply_plan(sim, 0, &planned).map_err(|error| error.to_string())?;
    Ok(planned)
}

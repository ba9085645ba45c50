//! Test helpers for the node binaries (feature `testing`, enabled by their dev-dependencies).

use std::collections::BTreeMap;
use std::sync::Arc;

use crd::mig::MigProfileName;
use gpu::Simulator;

/// A simulated node (`node-1`) in a temporary folder, as `spec` (e.g. `a100-40gb:2`) describes it; when `devices`
/// is not empty, MIG is on and those devices exist on every GPU. The folder lives as long as the `TempDir`.
///
/// # Panics
/// On a spec or profile name the simulator does not know: a mistake in the test.
#[must_use]
pub fn simulated(spec: &str, devices: &[(&str, u32)]) -> (tempfile::TempDir, Arc<Simulator>) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let simulator = Arc::new(
        Simulator::open(
            dir.path().join("gpus.json"),
            "node-1",
            &spec.parse().expect("a simulator spec"),
        )
        .expect("a simulated node"),
    );
    if !devices.is_empty() {
        let desired: BTreeMap<MigProfileName, u32> = devices
            .iter()
            .map(|(name, count)| (name.parse().expect("a MIG profile name"), *count))
            .collect();
        simulator
            .create_on_every_gpu(&desired)
            .expect("the MIG devices");
    }
    (dir, simulator)
}

//! One reading of the node's GPUs, and the GPUNode status fields every role derives from it (inventory, product,
//! count, MIG geometry). The derivations are pure; [`read`] is the one function that asks the backend.

use std::collections::BTreeMap;

use crd::gpu_node::{GpuInfo, GpuMigGeometry};
use crd::mig::{GpuModel, MigProfileName};
use gpu::planner::ExistingInstance;
use gpu::{GpuBackend, GpuInventory, MigDevice, current_geometry};

/// Product value when a node's GPUs are not all the same model.
pub const MIXED_PRODUCT: &str = "mixed";

/// One GPU as read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuView {
    /// Identity, model, MIG mode.
    pub inventory: GpuInventory,
    /// Its GPU instances, in the planner's form.
    pub instances: Vec<ExistingInstance>,
    /// Its MIG devices, each with its profile name when the catalog knows the model.
    pub devices: Vec<(Option<MigProfileName>, MigDevice)>,
}

impl GpuView {
    /// The MIG geometry as GPUNode status shows it: whether MIG is on, and devices by profile name.
    #[must_use]
    pub fn geometry(&self) -> GpuMigGeometry {
        let mut devices = BTreeMap::new();
        for (name, device) in &self.devices {
            let name = name.map_or_else(
                || format!("profile-{}", device.gpu_instance_profile_id),
                |name| name.to_string(),
            );
            *devices.entry(name).or_insert(0) += 1;
        }
        GpuMigGeometry {
            gpu: self.inventory.index,
            mig_enabled: self.inventory.mig_mode.is_some_and(|mode| mode.current),
            devices,
        }
    }
}

/// The profile name of a MIG device: its GPU instance's profile on `model`, with its compute slices.
#[must_use]
pub fn profile_name(model: &GpuModel, device: &MigDevice) -> Option<MigProfileName> {
    let profile = model
        .profiles
        .iter()
        .find(|profile| profile.id == device.gpu_instance_profile_id)?;
    Some(MigProfileName {
        gpu_instance: profile.name,
        compute_slices: u8::try_from(device.compute_slice_count).ok()?,
    })
}

/// The PRODUCT column: the model of every GPU, `mixed` when they differ, none without GPUs.
#[must_use]
pub fn product(gpus: &[GpuView]) -> Option<String> {
    let first = &gpus.first()?.inventory.product_name;
    if gpus.iter().all(|gpu| &gpu.inventory.product_name == first) {
        Some(first.clone())
    } else {
        Some(MIXED_PRODUCT.to_owned())
    }
}

/// The inventory entries of GPUNode status.
#[must_use]
pub fn gpu_infos(gpus: &[GpuView]) -> Vec<GpuInfo> {
    gpus.iter()
        .map(|gpu| GpuInfo::from(&gpu.inventory))
        .collect()
}

/// The geometry of every GPU.
#[must_use]
pub fn geometries(gpus: &[GpuView]) -> Vec<GpuMigGeometry> {
    gpus.iter().map(GpuView::geometry).collect()
}

/// Reads every GPU: inventory, instances and MIG devices.
///
/// # Errors
/// The first backend failure.
pub fn read(backend: &dyn GpuBackend) -> gpu::Result<Vec<GpuView>> {
    backend
        .gpus()?
        .into_iter()
        .map(|inventory| {
            let index = inventory.index;
            let model = inventory.model();
            let devices = backend
                .mig_devices(index)?
                .into_iter()
                .map(|device| (model.and_then(|model| profile_name(model, &device)), device))
                .collect();
            Ok(GpuView {
                instances: current_geometry(backend, index)?,
                devices,
                inventory,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::simulated;

    #[test]
    fn geometry_counts_devices_by_profile() {
        let (_dir, simulator) = simulated("a100-40gb:2", &[("1g.5gb", 3), ("2g.10gb", 2)]);
        let gpus = read(simulator.as_ref()).unwrap();
        assert_eq!(gpus.len(), 2);
        let geometry = gpus[1].geometry();
        assert!(geometry.mig_enabled);
        assert_eq!(
            geometry.devices,
            BTreeMap::from([("1g.5gb".into(), 3), ("2g.10gb".into(), 2)])
        );
        assert_eq!(product(&gpus).as_deref(), Some("NVIDIA A100-SXM4-40GB"));
        assert_eq!(gpu_infos(&gpus)[1].index, 1);
    }

    #[test]
    fn different_models_are_mixed() {
        let (_dir, simulator) = simulated("a100-40gb:1,h100-80gb:1", &[]);
        let gpus = read(simulator.as_ref()).unwrap();
        assert_eq!(product(&gpus).as_deref(), Some(MIXED_PRODUCT));
        assert!(!gpus[0].geometry().mig_enabled);
        assert_eq!(product(&[]), None);
    }
}

//! What a named config asks of each GPU of the node, compared with what the GPUs have: pure, from one reading.
//!
//! The answer decides everything that follows: whether anything changes at all (then nothing is paused or
//! evicted), which GPUs are disturbed (reset, or instances destroyed: only their workloads must leave), and which
//! GPUs are left alone (their instances, and so their MIG device UUIDs, survive).

use std::collections::BTreeMap;

use crd::config::mig_parted::MigPartedConfig;
use crd::gpu_node::GpuMigGeometry;
use crd::mig::MigProfileName;
use gpu::planner::{MigPlan, ModeChange, PlanError, decide, plan};

use crate::inventory::GpuView;

/// What one GPU needs to reach its entry of the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuChange {
    /// The GPU's index.
    pub gpu: u32,
    /// Whether the config wants MIG on.
    pub enabled: bool,
    /// The MIG devices the config wants (empty when MIG is off, or on without devices).
    pub devices: BTreeMap<MigProfileName, u32>,
    /// What the MIG mode needs.
    pub mode: ModeChange,
    /// The instance changes when MIG is wanted on, planned from what exists.
    pub plan: Option<MigPlan>,
    /// Whether the GPU has GPU instances now (they go when MIG is turned off).
    pub has_instances: bool,
}

impl GpuChange {
    /// True when the GPU already is as the config wants.
    #[must_use]
    pub fn is_noop(&self) -> bool {
        self.mode.is_none()
            && self.plan.as_ref().is_none_or(MigPlan::is_noop)
            && (self.enabled || !self.has_instances)
    }

    /// Whether workloads on the GPU are disturbed: it is reset, or MIG devices on it are destroyed. A change
    /// that only adds instances disturbs nobody.
    #[must_use]
    pub fn disrupts(&self) -> bool {
        self.mode.reset
            || self
                .plan
                .as_ref()
                .is_some_and(|plan| !plan.destroy.is_empty())
            || (!self.enabled && self.has_instances)
    }

    /// The geometry the config wants, as GPUNode status shows it.
    #[must_use]
    pub fn desired_geometry(&self) -> GpuMigGeometry {
        geometry(self.gpu, self.enabled, &self.devices)
    }
}

/// A geometry as GPUNode status shows it: devices by profile name, without zero counts.
#[must_use]
pub fn geometry(
    gpu: u32,
    enabled: bool,
    devices: &BTreeMap<MigProfileName, u32>,
) -> GpuMigGeometry {
    GpuMigGeometry {
        gpu,
        mig_enabled: enabled,
        devices: devices
            .iter()
            .filter(|(_, count)| **count > 0)
            .map(|(name, count)| (name.to_string(), *count))
            .collect(),
    }
}

/// The change each GPU of the node needs for config `name`. GPUs the config has no entry for are left out.
///
/// # Errors
/// Why the config cannot be applied to these GPUs (unknown name, a geometry that does not fit, ...), before
/// anything is touched.
pub fn assess(
    config: &MigPartedConfig,
    name: &str,
    gpus: &[GpuView],
) -> Result<Vec<GpuChange>, PlanError> {
    let inventories: Vec<_> = gpus.iter().map(|gpu| gpu.inventory.clone()).collect();
    let mut changes = Vec::new();
    for (decision, view) in decide(config, name, &inventories)?
        .into_iter()
        .filter_map(|decision| {
            let view = gpus
                .iter()
                .find(|gpu| gpu.inventory.index == decision.gpu_index)?;
            Some((decision, view))
        })
    {
        let enabled = decision.entry.mig_enabled;
        let devices: BTreeMap<MigProfileName, u32> = if enabled {
            decision.entry.mig_devices.clone().unwrap_or_default()
        } else {
            BTreeMap::new()
        };
        let plan = match view.inventory.model() {
            Some(model) if enabled => Some(plan(model, &view.instances, &devices)?),
            _ => None,
        };
        changes.push(GpuChange {
            gpu: decision.gpu_index,
            enabled,
            devices,
            mode: decision.mode_change,
            plan,
            has_instances: !view.instances.is_empty(),
        });
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{read, tests::simulated};

    fn config() -> MigPartedConfig {
        crd::config::mig_parted::parse(
            r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  first-only:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
    - devices: [1]
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  add-one:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  too-much:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 2, "1g.10gb": 1}
"#,
        )
        .unwrap()
    }

    #[test]
    fn a_fresh_gpu_needs_mode_and_instances() {
        let (_dir, simulator) = simulated("a100-80gb:1", &[]);
        let gpus = read(simulator.as_ref()).unwrap();
        let changes = assess(&config(), "all-1g.10gb", &gpus).unwrap();
        assert_eq!(changes.len(), 1);
        let change = &changes[0];
        assert!(change.mode.reset && change.mode.set_mode == Some(true));
        assert_eq!(change.plan.as_ref().unwrap().create.len(), 7);
        assert!(!change.is_noop() && change.disrupts());
        assert_eq!(
            change.desired_geometry().devices,
            BTreeMap::from([("1g.10gb".into(), 7)])
        );
        let disabled = assess(&config(), "all-disabled", &gpus).unwrap();
        assert!(disabled[0].is_noop());
    }

    #[test]
    fn only_gpus_whose_instances_change_are_disturbed() {
        let (_dir, simulator) = simulated("a100-80gb:2", &[("1g.10gb", 7)]);
        let gpus = read(simulator.as_ref()).unwrap();
        let changes = assess(&config(), "first-only", &gpus).unwrap();
        assert!(changes[0].disrupts(), "GPU 0 goes from 7x1g to 2x3g");
        assert!(
            changes[1].is_noop() && !changes[1].disrupts(),
            "GPU 1 keeps its 7x1g"
        );
        assert!(
            assess(&config(), "add-one", &gpus)
                .unwrap()
                .iter()
                .all(GpuChange::is_noop)
        );
    }

    #[test]
    fn turning_mig_off_destroys_and_resets() {
        let (_dir, simulator) = simulated("a100-80gb:1", &[("1g.10gb", 2)]);
        let gpus = read(simulator.as_ref()).unwrap();
        let change = &assess(&config(), "all-disabled", &gpus).unwrap()[0];
        assert!(change.mode.reset && change.has_instances && change.disrupts());
        assert!(change.desired_geometry().devices.is_empty());
    }

    #[test]
    fn impossible_requests_fail_before_anything_is_touched() {
        let (_dir, simulator) = simulated("a100-80gb:1", &[]);
        let gpus = read(simulator.as_ref()).unwrap();
        let error = assess(&config(), "too-much", &gpus).unwrap_err();
        assert_eq!(
            error.to_string(),
            "needs 9 memory slices, A100-SXM4-80GB has 8"
        );
        let unknown = assess(&config(), "nope", &gpus).unwrap_err().to_string();
        assert!(unknown.starts_with("no MIG config named nope"), "{unknown}");
    }
}

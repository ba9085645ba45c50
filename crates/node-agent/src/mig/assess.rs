//! What a named config asks of each GPU of the node, compared with what the GPUs have: pure, from one reading.
//!
//! The answer decides everything that follows: whether anything changes at all (then nothing is paused or
//! evicted), which GPUs are disturbed (reset, or instances destroyed: only their workloads must leave), and which
//! GPUs are left alone (their instances, and so their MIG device UUIDs, survive).

use std::collections::BTreeMap;

use crd::config::ConfigError;
use crd::config::mig_parted::ParsedMigConfig;
use crd::gpu_node::GpuMigGeometry;
use crd::mig::MigProfileName;
use gpu::planner::{MigPlan, ModeChange, PlanError, decide, plan};
use node_runtime::inventory::GpuView;

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

/// Why a named config cannot be applied to the node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssessError {
    /// The config is one of the file's invalid ones; the other configs of the file are unaffected.
    #[error("{0}")]
    Invalid(ConfigError),
    /// The config does not fit these GPUs (unknown name, a model or geometry that does not fit, ...).
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// The change each GPU of the node needs for config `name` of a parsed file. GPUs the config has no entry for are
/// left out.
///
/// # Errors
/// Why the config cannot be applied to these GPUs, before anything is touched: it is invalid (its problem, which
/// names it and its entry), or it does not fit them.
pub fn assess(
    parsed: &ParsedMigConfig,
    name: &str,
    gpus: &[GpuView],
) -> Result<Vec<GpuChange>, AssessError> {
    if let Some(problem) = parsed.problem(name) {
        return Err(AssessError::Invalid(problem.clone()));
    }
    let inventories: Vec<_> = gpus.iter().map(|gpu| gpu.inventory.clone()).collect();
    let mut changes = Vec::new();
    for (decision, view) in decide(&parsed.config, name, &inventories)?
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

/// The GPUs the DRA driver serves as MIG on demand (`on_demand`) keep their instances: each is a claim's, made
/// when the claim was prepared and destroyed when it ends. A config that wants MIG on such a GPU only sees to the
/// mode; one that wants MIG off still turns it off (and its users leave first, as for any change).
pub fn leave_instances_to_the_dra_driver(
    changes: &mut [GpuChange],
    on_demand: impl Fn(u32) -> bool,
) {
    for change in changes
        .iter_mut()
        .filter(|change| change.enabled && on_demand(change.gpu))
    {
        change.devices.clear();
        change.plan = None;
    }
}

#[cfg(test)]
mod tests {
    use node_runtime::inventory::read;
    use node_runtime::testing::simulated;

    use super::*;
    use crate::mig::state::{Assessment, Decision, Observation, Request, decide};

    fn config() -> ParsedMigConfig {
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
  broken:
    - device-filter: "0x20B210DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
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

    /// NVIDIA's all-enabled (MIG on, no devices) on a GPU whose instances the DRA driver made for claims: nothing to
    /// do there, while the config still destroys the instances of a GPU the driver does not serve so.
    #[test]
    fn instances_of_gpus_served_as_mig_on_demand_are_the_dra_drivers() {
        let (_dir, simulator) = simulated("h100-80gb:2", &[("1g.10gb", 2)]);
        let gpus = read(simulator.as_ref()).unwrap();
        let nvidia = crd::config::mig_parted::parse(crd::mig::DEFAULT_MIG_CONFIG).unwrap();
        let mut changes = assess(&nvidia, "all-enabled", &gpus).unwrap();
        assert!(
            changes.iter().all(|change| !change.is_noop()),
            "{changes:?}"
        );
        leave_instances_to_the_dra_driver(&mut changes, |gpu| gpu == 1);
        assert!(!changes[0].is_noop() && changes[0].disrupts());
        assert!(
            changes[1].is_noop() && !changes[1].disrupts(),
            "{:?}",
            changes[1]
        );

        let mut disabled = assess(&nvidia, "all-disabled", &gpus).unwrap();
        leave_instances_to_the_dra_driver(&mut disabled, |_| true);
        assert!(
            disabled.iter().all(|change| !change.is_noop()),
            "MIG off is still the admin's to ask"
        );
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

    /// A node that selects the file's invalid config fails with its problem; one that selects a valid config of the
    /// same file is planned as usual.
    #[test]
    fn an_invalid_config_fails_only_the_nodes_that_select_it() {
        let (_dir, simulator) = simulated("a100-80gb:1", &[]);
        let gpus = read(simulator.as_ref()).unwrap();
        let parsed = config();
        assert!(parsed.problem("broken").is_some());
        let error = assess(&parsed, "broken", &gpus).unwrap_err();
        assert_eq!(
            error.to_string(),
            "mig-configs.broken[0].mig-devices: unknown profile \"1g.5gb\" for NVIDIA A100-SXM4-80GB (known \
             profiles: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"
        );
        assert_eq!(assess(&parsed, "all-1g.10gb", &gpus).unwrap().len(), 1);

        // The manager's decision for each node: the one selecting the invalid config is rejected (state failed,
        // the problem as its reason), the one selecting a valid config of the same file changes its GPUs.
        let observe = |name: &str| {
            let request = Request {
                config: name.to_owned(),
                file: 1,
            };
            let assessment = match assess(&parsed, name, &gpus) {
                Err(_) => Assessment::Impossible,
                Ok(changes) if changes.iter().all(GpuChange::is_noop) => Assessment::Matches,
                Ok(_) => Assessment::Differs,
            };
            decide(Observation {
                request: Some(&request),
                assessment,
                in_progress: false,
                failed: None,
            })
        };
        assert_eq!(observe("broken"), Decision::Reject);
        assert_eq!(observe("all-1g.10gb"), Decision::Change);
    }
}

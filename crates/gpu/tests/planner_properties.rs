//! Properties of the MIG planner, checked against the simulator (which enforces the hardware's rules) and against a
//! brute-force search (which knows nothing of the planner's ordering and pruning).

mod common;

use std::collections::BTreeMap;

use common::{device_counts, fresh_mig_gpu, nonzero, reconfigure};
use crd::mig::{GpuInstanceProfile, GpuModel, MigProfileName, models};
use gpu::compute::compute_slices_for;
use gpu::{GpuBackend, apply_plan, plan};
use proptest::prelude::*;

/// Whether some placement of every requested instance exists, by trying every allowed start of every instance in
/// request order: no sorting, no pruning, nothing shared with the planner but the catalog.
fn fits(model: &GpuModel, request: &BTreeMap<MigProfileName, u32>) -> bool {
    let mut devices: Vec<&GpuInstanceProfile> = Vec::new();
    for (name, count) in request {
        let Some(profile) = model.profile(name.gpu_instance) else {
            return false;
        };
        devices.extend((0..*count).map(|_| profile));
    }
    let within_maximum = model.profiles.iter().all(|profile| {
        let wanted = devices
            .iter()
            .filter(|device| device.id == profile.id)
            .count();
        wanted <= profile.max_instances as usize
    });
    within_maximum && place_all(&devices, &mut vec![false; usize::from(model.memory_slices)])
}

fn place_all(devices: &[&GpuInstanceProfile], taken: &mut Vec<bool>) -> bool {
    let Some((first, rest)) = devices.split_first() else {
        return true;
    };
    for start in first.placement_starts {
        let slices = usize::from(*start)..usize::from(*start) + usize::from(first.placement_size);
        if slices.clone().all(|slice| !taken[slice]) {
            slices.clone().for_each(|slice| taken[slice] = true);
            let placed = place_all(rest, taken);
            slices.for_each(|slice| taken[slice] = false);
            if placed {
                return true;
            }
        }
    }
    false
}

/// Every name a model accepts: each GPU-instance profile with each compute-instance size it holds.
fn names_of(model: &'static GpuModel) -> Vec<MigProfileName> {
    model
        .profiles
        .iter()
        .flat_map(|profile| {
            compute_slices_for(u32::from(profile.name.slices))
                .iter()
                .map(move |compute| MigProfileName {
                    gpu_instance: profile.name,
                    compute_slices: u8::try_from(*compute).unwrap(),
                })
        })
        .collect()
}

/// A request of a few names of the model, 1 to 3 of each (names may repeat, counts add up).
fn request_for(model: &'static GpuModel) -> impl Strategy<Value = BTreeMap<MigProfileName, u32>> {
    prop::collection::vec((prop::sample::select(names_of(model)), 1..=3u32), 0..5).prop_map(
        |pairs| {
            let mut request = BTreeMap::new();
            for (name, count) in pairs {
                *request.entry(name).or_insert(0) += count;
            }
            request
        },
    )
}

/// A request that fits: names are drawn at random and each is kept only if the request still fits with it.
fn fitting_request_for(
    model: &'static GpuModel,
) -> impl Strategy<Value = BTreeMap<MigProfileName, u32>> {
    prop::collection::vec(prop::sample::select(names_of(model)), 0..10).prop_map(move |names| {
        let mut request = BTreeMap::new();
        for name in names {
            *request.entry(name).or_insert(0) += 1;
            if !fits(model, &request) {
                match request.get_mut(&name) {
                    Some(count) if *count > 1 => *count -= 1,
                    _ => {
                        request.remove(&name);
                    }
                }
            }
        }
        request
    })
}

fn any_model() -> impl Strategy<Value = &'static GpuModel> {
    (0..models().len()).prop_map(|index| &models()[index])
}

/// A model, a geometry that fits to start from, and a request to go to.
type Scenario = (
    &'static GpuModel,
    BTreeMap<MigProfileName, u32>,
    BTreeMap<MigProfileName, u32>,
);

/// The request to go to is any request (most do not fit) or, with `fitting`, one that fits.
fn scenario(fitting: bool) -> impl Strategy<Value = Scenario> {
    any_model().prop_flat_map(move |model| {
        let request = if fitting {
            fitting_request_for(model).boxed()
        } else {
            request_for(model).boxed()
        };
        (Just(model), fitting_request_for(model), request)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, failure_persistence: None, ..ProptestConfig::default() })]

    /// A plan exists exactly when a packing exists; every plan, created in order on a fresh GPU, succeeds and gives
    /// the requested devices.
    #[test]
    fn every_plan_applies_on_a_fresh_gpu(
        (model, request) in any_model().prop_flat_map(|model| (Just(model), request_for(model)))
    ) {
        match plan(model, &[], &request) {
            Ok(planned) => {
                prop_assert!(fits(model, &request));
                prop_assert!(planned.keep.is_empty() && planned.destroy.is_empty());
                let (_dir, sim) = fresh_mig_gpu(model);
                apply_plan(&sim, 0, &planned).map_err(|error| TestCaseError::fail(error.to_string()))?;
                prop_assert_eq!(device_counts(&sim, model), nonzero(&request));
            }
            Err(error) => prop_assert!(!fits(model, &request), "planner refused a request that fits: {}", error),
        }
    }

    /// A request that does not fit is refused, and the GPU keeps the geometry it had.
    #[test]
    fn a_request_that_does_not_fit_changes_nothing((model, start, request) in scenario(false)) {
        prop_assume!(!fits(model, &request));
        let (_dir, sim) = fresh_mig_gpu(model);
        reconfigure(&sim, model, &start).map_err(TestCaseError::fail)?;
        let instances = sim.gpu_instances(0).unwrap();
        let devices = sim.mig_devices(0).unwrap();
        prop_assert!(reconfigure(&sim, model, &request).is_err());
        prop_assert_eq!(sim.gpu_instances(0).unwrap(), instances);
        prop_assert_eq!(sim.mig_devices(0).unwrap(), devices);
    }

    /// From any geometry to any request that fits: the plan applies, the result is the request, and the instances
    /// the plan keeps are untouched (same id, placement and MIG device UUID).
    #[test]
    fn replanning_keeps_what_it_says((model, start, request) in scenario(true)) {
        let (_dir, sim) = fresh_mig_gpu(model);
        reconfigure(&sim, model, &start).map_err(TestCaseError::fail)?;
        let before = sim.mig_devices(0).unwrap();
        let instances = sim.gpu_instances(0).unwrap();
        let planned = reconfigure(&sim, model, &request).map_err(TestCaseError::fail)?;
        prop_assert_eq!(device_counts(&sim, model), nonzero(&request));
        let after = sim.mig_devices(0).unwrap();
        for kept in &planned.keep {
            let old = before.iter().find(|device| device.gpu_instance_id == kept.gpu_instance_id).unwrap();
            prop_assert!(after.contains(old), "kept device {:?} changed", old);
            let placement = instances.iter().find(|instance| instance.id == kept.gpu_instance_id).unwrap();
            prop_assert!(sim.gpu_instances(0).unwrap().contains(placement));
        }
        // Planning the same request again finds nothing to do.
        prop_assert!(reconfigure(&sim, model, &request).map_err(TestCaseError::fail)?.is_noop());
    }
}

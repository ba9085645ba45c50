use std::collections::BTreeMap;

use crd::dra::GpuSet;
use gpu::Simulator;
use node_runtime::testing::simulated;

use super::*;

/// A simulated GPU of `model` with MIG mode on and no instance, as the driver finds a GPU it serves on demand.
fn mig_on(model: &str) -> (tempfile::TempDir, std::sync::Arc<Simulator>) {
    let (dir, simulator) = simulated(&format!("{model}:1"), &[]);
    simulator.set_mig_mode(0, true).unwrap();
    simulator.reset(0).unwrap();
    (dir, simulator)
}

fn dynamic_gpu(simulator: &Simulator) -> DynamicGpu {
    let views = node_runtime::inventory::read(simulator).unwrap();
    let partition = Partition {
        dra: GpuSet::All,
        shared: GpuSet::All,
        dynamic_mig: GpuSet::All,
    };
    let (mut gpus, warnings) = observe(simulator, &views, &partition).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    gpus.remove(0)
}

fn counter(set: &BTreeMap<String, Counter>, name: &str) -> i64 {
    set[name].value.0.parse().unwrap()
}

#[test]
fn an_h100_publishes_its_slices_compute_and_the_one_media_extension_as_counters() {
    let (_dir, simulator) = mig_on("h100-80gb");
    let gpu = dynamic_gpu(&simulator);
    assert_eq!(
        gpu.profiles.len(),
        gpu.model.profiles.len(),
        "NVML confirms every profile"
    );
    let set = counter_set(&gpu);
    assert_eq!(set.name, "gpu-0-counter-set");
    for slice in 0..8 {
        assert_eq!(counter(&set.counters, &format!("memory-slice-{slice}")), 1);
    }
    assert_eq!(counter(&set.counters, COUNTER_COMPUTE_SLICES), 7);
    assert_eq!(counter(&set.counters, "1g10gbme-instances"), 1);
    assert!(
        !set.counters.contains_key("1g10gb-instances"),
        "only a profile its placements would over-count gets a limit"
    );

    let devices = placements(&gpu);
    let placement_count: usize = gpu
        .model
        .profiles
        .iter()
        .map(|p| p.placement_starts.len())
        .sum();
    assert_eq!(devices.len(), placement_count);
    let first = &devices[0];
    assert_eq!(first.profile.name.to_string(), "1g.10gb");
    assert_eq!(
        first.on_demand.placement.start, 6,
        "the smallest profile fills the GPU from its top"
    );
    let last = devices.last().unwrap();
    assert_eq!(last.profile.name.to_string(), "7g.80gb");
    assert_eq!(
        last.consumes
            .counters
            .keys()
            .filter(|name| name.starts_with("memory-slice-"))
            .count(),
        8
    );
    let sizes: Vec<u8> = devices
        .iter()
        .map(|device| device.profile.name.slices)
        .collect();
    assert!(sizes.windows(2).all(|pair| pair[0] <= pair[1]), "{sizes:?}");
}

/// The counters refuse exactly what the GPU refuses: on every model of the catalog, placements are tried in a
/// scrambled order, with some destroyed along the way, and each is admitted by the counters if and only if the
/// simulated GPU creates it.
#[test]
fn the_counters_admit_exactly_the_placements_the_gpu_creates_on_every_model() {
    for model in crd::mig::models() {
        let (_dir, simulator) = mig_on(model.simulator_name);
        let gpu = dynamic_gpu(&simulator);
        let capacity = counter_set(&gpu).counters;
        let devices = placements(&gpu);
        let mut used: BTreeMap<String, i64> = BTreeMap::new();
        let mut held: Vec<(usize, u32)> = Vec::new();
        let mut seed = 7u64;
        let mut created = 0;
        for step in 0..400 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let pick = usize::try_from(seed >> 33).unwrap() % devices.len();
            if step % 5 == 4 && !held.is_empty() {
                let (device, gpu_instance) = held.remove(pick % held.len());
                destroy(simulator.as_ref(), 0, gpu_instance).unwrap();
                for (name, value) in &devices[device].consumes.counters {
                    *used.get_mut(name).unwrap() -= value.value.0.parse::<i64>().unwrap();
                }
                continue;
            }
            let device = &devices[pick];
            let fits = device.consumes.counters.iter().all(|(name, value)| {
                used.get(name).copied().unwrap_or(0) + value.value.0.parse::<i64>().unwrap()
                    <= counter(&capacity, name)
            });
            let made = create(simulator.as_ref(), &device.on_demand);
            assert_eq!(
                fits,
                made.is_ok(),
                "{}: {} at {}: counters say {fits}, the GPU says {made:?}",
                model.simulator_name,
                device.profile.name,
                device.on_demand.placement
            );
            if let Ok((instance, uuid)) = made {
                assert!(uuid.starts_with("MIG-"), "{uuid}");
                created += 1;
                held.push((pick, instance.gpu_instance));
                for (name, value) in &device.consumes.counters {
                    *used.entry(name.clone()).or_default() += value.value.0.parse::<i64>().unwrap();
                }
            }
        }
        assert!(
            created > 20,
            "{}: only {created} instances made",
            model.simulator_name
        );
    }
}

#[test]
fn a_failed_compute_instance_leaves_no_gpu_instance_behind() {
    let (_dir, simulator) = mig_on("a100-40gb");
    let gpu = dynamic_gpu(&simulator);
    let three = placements(&gpu)
        .into_iter()
        .find(|device| device.profile.name.to_string() == "3g.20gb")
        .unwrap();
    let impossible = OnDemand {
        compute_slices: 5,
        ..three.on_demand
    };
    let error = create(simulator.as_ref(), &impossible).unwrap_err();
    assert!(
        error.contains("creating the compute instance") && error.contains("was destroyed again"),
        "{error}"
    );
    assert!(simulator.gpu_instances(0).unwrap().is_empty());
    let (instance, _) = create(simulator.as_ref(), &three.on_demand).unwrap();
    assert_eq!(
        simulator
            .compute_instances(0, instance.gpu_instance)
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn reconcile_destroys_the_instances_no_claim_holds_and_keeps_the_rest() {
    let (_dir, simulator) = mig_on("h100-80gb");
    let gpu = dynamic_gpu(&simulator);
    let devices = placements(&gpu);
    let (kept, _) = create(simulator.as_ref(), &devices[0].on_demand).unwrap();
    let (orphan, _) = create(simulator.as_ref(), &devices[1].on_demand).unwrap();
    // A GPU instance without its compute instance: what a driver stopped between the two leaves.
    let half = simulator
        .create_gpu_instance(
            0,
            devices[2].on_demand.profile_id,
            devices[2].on_demand.placement,
        )
        .unwrap();
    let held = BTreeSet::from([(0, kept.gpu_instance)]);
    let (destroyed, failures) = reconcile(simulator.as_ref(), &[0], &held);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(destroyed, [(0, orphan.gpu_instance), (0, half.id)]);
    let left: Vec<u32> = simulator
        .gpu_instances(0)
        .unwrap()
        .iter()
        .map(|gi| gi.id)
        .collect();
    assert_eq!(left, [kept.gpu_instance]);
}

#[test]
fn gpus_that_cannot_be_served_on_demand_are_published_whole_with_the_reason() {
    let (_dir, simulator) = simulated("h100-80gb:2", &[]);
    simulator.set_mig_mode(1, true).unwrap();
    simulator.reset(1).unwrap();
    let views = node_runtime::inventory::read(simulator.as_ref()).unwrap();
    let partition = Partition {
        dra: GpuSet::All,
        shared: GpuSet::None,
        dynamic_mig: GpuSet::All,
    };
    let (gpus, warnings) = observe(simulator.as_ref(), &views, &partition).unwrap();
    assert_eq!(gpus.iter().map(|gpu| gpu.index).collect::<Vec<_>>(), [1]);
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].contains("GPU 0") && warnings[0].contains("nvidia.com/mig.config=all-enabled"),
        "{}",
        warnings[0]
    );
    let only_one = Partition {
        dynamic_mig: "0".parse().unwrap(),
        ..partition
    };
    let (gpus, _) = observe(simulator.as_ref(), &views, &only_one).unwrap();
    assert!(gpus.is_empty());
}

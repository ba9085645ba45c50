use std::collections::BTreeMap;

use crd::config::device_plugin::parse;
use gpu::{GpuBackend, Simulator};
use node_runtime::testing::simulated;

use super::*;

/// The GPUs of a simulated node, as the planner takes them.
pub(crate) fn planned(simulator: &Simulator) -> Vec<PlannedGpu> {
    node_runtime::inventory::read(simulator)
        .unwrap()
        .into_iter()
        .map(|view| PlannedGpu {
            view,
            numa_node: None,
        })
        .collect()
}

/// Resource name to device count.
fn counts(plan: &Plan) -> BTreeMap<String, usize> {
    plan.iter()
        .map(|(name, resource)| (name.to_string(), resource.devices.len()))
        .collect()
}

fn plan_for(
    spec: &str,
    devices: &[(&str, u32)],
    config: &str,
    strategy: MigStrategy,
) -> Result<Plan, PlanError> {
    let (_dir, simulator) = simulated(spec, devices);
    advertise(&planned(&simulator), &parse(config).unwrap(), strategy)
}

const SLICE_4: &str = "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    \
                       - name: nvidia.com/gpu\n      replicas: 4\n";

#[test]
fn guide_slice_4_with_rename_on_four_gpus() {
    let plan = plan_for("a100-40gb:4", &[], SLICE_4, MigStrategy::None).unwrap();
    assert_eq!(
        counts(&plan),
        BTreeMap::from([("nvidia.com/gpu.shared".into(), 16)])
    );
    let resource = &plan[&"nvidia.com/gpu.shared".parse().unwrap()];
    assert!(resource.devices[0].id.ends_with("::0"));
    assert!(resource.devices[3].id.ends_with("::3"));
    assert_eq!(resource.devices[0].replicas, 4);
    assert_eq!(
        resource.shared,
        Some(Shared {
            strategy: SharingStrategy::TimeSlicing,
            fail_requests_greater_than_one: false,
            allocation_policy: AllocationPolicy::Distributed
        })
    );
}

#[test]
fn guide_replicas_without_rename_on_one_gpu() {
    let config = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";
    let plan = plan_for("a100-40gb:1", &[], config, MigStrategy::None).unwrap();
    assert_eq!(
        counts(&plan),
        BTreeMap::from([("nvidia.com/gpu".into(), 4)])
    );
}

#[test]
fn guide_mixed_strategy_after_two_2g_three_1g() {
    let plan = plan_for(
        "a100-40gb:4",
        &[("2g.10gb", 2), ("1g.5gb", 3)],
        "version: v1\n",
        MigStrategy::Mixed,
    )
    .unwrap();
    assert_eq!(
        counts(&plan),
        BTreeMap::from([
            ("nvidia.com/mig-1g.5gb".into(), 12),
            ("nvidia.com/mig-2g.10gb".into(), 8)
        ])
    );
    let small = &plan[&"nvidia.com/mig-1g.5gb".parse().unwrap()].devices[0];
    assert!(small.uuid.starts_with("MIG-"));
    assert_eq!(small.memory_mib, 4864);
}

#[test]
fn guide_single_strategy_after_seven_1g() {
    let plan = plan_for(
        "a100-40gb:4",
        &[("1g.5gb", 7)],
        "version: v1\n",
        MigStrategy::Single,
    )
    .unwrap();
    assert_eq!(
        counts(&plan),
        BTreeMap::from([("nvidia.com/gpu".into(), 28)])
    );
    let device = &plan[&"nvidia.com/gpu".parse().unwrap()].devices[8];
    assert_eq!((device.gpu_index, device.mig_index), (1, Some(1)));
}

#[test]
fn none_strategy_hides_mig_devices_and_lists_whole_gpus() {
    let (_dir, simulator) = simulated("a100-40gb:2", &[]);
    simulator.set_mig_mode(1, true).unwrap();
    simulator.reset(1).unwrap();
    let gpus = planned(&simulator);
    let plan = advertise(&gpus, &DevicePluginConfig::default(), MigStrategy::None).unwrap();
    assert_eq!(
        counts(&plan),
        BTreeMap::from([("nvidia.com/gpu".into(), 1)])
    );
    assert_eq!(plan.values().next().unwrap().devices[0].gpu_index, 0);
    // Mixed lists the GPU without MIG as a whole GPU too.
    let mixed = advertise(&gpus, &DevicePluginConfig::default(), MigStrategy::Mixed).unwrap();
    assert_eq!(
        counts(&mixed),
        BTreeMap::from([("nvidia.com/gpu".into(), 1)])
    );
    // Single refuses a node where only some GPUs have MIG on.
    let error = advertise(&gpus, &DevicePluginConfig::default(), MigStrategy::Single).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("on for GPUs 1 and off for GPUs 0"),
        "{error}"
    );
}

#[test]
fn single_strategy_refuses_mixed_profiles() {
    let error = plan_for(
        "a100-40gb:1",
        &[("2g.10gb", 2), ("1g.5gb", 3)],
        "version: v1\n",
        MigStrategy::Single,
    )
    .unwrap_err();
    assert!(
        matches!(error, PlanError::SingleMixedProfiles(_)),
        "{error}"
    );
    assert!(
        error.to_string().contains("1g.5gb") && error.to_string().contains("2g.10gb"),
        "{error}"
    );
}

#[test]
fn device_subsets_replicate_only_what_they_select() {
    let config = |devices: &str| {
        format!(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      \
             rename: gpu-small\n      devices: {devices}\n      replicas: 2\n"
        )
    };
    let by_count = plan_for("a100-40gb:4", &[], &config("1"), MigStrategy::None).unwrap();
    assert_eq!(
        counts(&by_count),
        BTreeMap::from([
            ("nvidia.com/gpu".into(), 3),
            ("nvidia.com/gpu-small".into(), 2)
        ])
    );
    let by_index = plan_for("a100-40gb:4", &[], &config("[1, \"3\"]"), MigStrategy::None).unwrap();
    let small = &by_index[&"nvidia.com/gpu-small".parse().unwrap()];
    let gpus: Vec<u32> = small
        .devices
        .iter()
        .map(|device| device.gpu_index)
        .collect();
    assert_eq!(gpus, [1, 1, 3, 3]);

    let (_dir, simulator) = simulated("a100-40gb:2", &[]);
    let gpus = planned(&simulator);
    let uuid = gpus[1].view.inventory.uuid.clone();
    let by_uuid = advertise(
        &gpus,
        &parse(&config(&format!("[{uuid}]"))).unwrap(),
        MigStrategy::None,
    )
    .unwrap();
    assert_eq!(
        by_uuid[&"nvidia.com/gpu-small".parse().unwrap()].devices[1].id,
        format!("{uuid}::1")
    );

    let too_many = plan_for("a100-40gb:1", &[], &config("2"), MigStrategy::None).unwrap_err();
    assert_eq!(
        too_many.to_string(),
        "sharing nvidia.com/gpu: devices: 2, but the node has only 1 of nvidia.com/gpu"
    );
    let missing = plan_for("a100-40gb:1", &[], &config("[5]"), MigStrategy::None).unwrap_err();
    assert_eq!(
        missing.to_string(),
        "sharing nvidia.com/gpu: device 5 is not a device of nvidia.com/gpu on this node"
    );
}

#[test]
fn mig_devices_are_shared_by_gpu_and_mig_index() {
    let config = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/mig-1g.5gb\n      \
                  devices: [\"0:1\"]\n      replicas: 3\n";
    let plan = plan_for("a100-40gb:1", &[("1g.5gb", 2)], config, MigStrategy::Mixed).unwrap();
    let resource = &plan[&"nvidia.com/mig-1g.5gb".parse().unwrap()];
    // The selected MIG device as three MPS replicas, the other one unshared, under the same name.
    assert_eq!(resource.devices.len(), 4);
    assert_eq!(
        resource
            .devices
            .iter()
            .filter(|device| device.replicas == 3)
            .count(),
        3
    );
    assert_eq!(resource.devices[0].mig_index, Some(1));
    assert_eq!(
        resource.shared,
        Some(Shared {
            strategy: SharingStrategy::Mps,
            fail_requests_greater_than_one: true,
            allocation_policy: AllocationPolicy::Distributed
        })
    );
}

#[test]
fn resource_patterns_rename_whole_gpus_and_mig_profiles() {
    let config = "version: v1\nresources:\n  gpus:\n  - pattern: \"*A100*\"\n    name: a100\n  mig:\n  \
                  - pattern: \"1g.*\"\n    name: mig-small\n";
    let plan = plan_for("a100-40gb:1", &[], config, MigStrategy::None).unwrap();
    assert_eq!(
        counts(&plan),
        BTreeMap::from([("nvidia.com/a100".into(), 1)])
    );
    let mig = plan_for(
        "a100-40gb:1",
        &[("1g.5gb", 1), ("2g.10gb", 1)],
        config,
        MigStrategy::Mixed,
    )
    .unwrap();
    assert_eq!(
        counts(&mig),
        BTreeMap::from([
            ("nvidia.com/mig-2g.10gb".into(), 1),
            ("nvidia.com/mig-small".into(), 1)
        ])
    );
}

#[test]
fn globs_match_like_the_reference() {
    assert!(glob_matches("*", "anything"));
    assert!(glob_matches("*A100*", "NVIDIA A100-SXM4-40GB"));
    assert!(glob_matches("NVIDIA*40GB", "NVIDIA A100-SXM4-40GB"));
    assert!(!glob_matches("*H100*", "NVIDIA A100-SXM4-40GB"));
    assert!(!glob_matches("A100", "NVIDIA A100"));
}

/// The recursive matcher this replaced tried every split for every star, so a pattern of many stars that cannot
/// match took time exponential in the stars (here C(200, 40) tries); the linear one answers in one pass.
#[test]
fn many_stars_that_cannot_match_do_not_backtrack() {
    let pattern = format!("{}b", "*a".repeat(40));
    assert!(!glob_matches(&pattern, &"a".repeat(200)));
    assert!(glob_matches(&pattern, &format!("{}b", "a".repeat(200))));
    assert!(glob_matches(&"*".repeat(10_000), ""));
    assert!(glob_matches(&"*".repeat(10_000), "NVIDIA A100"));
}

#[test]
fn the_allocation_policy_comes_from_the_plugin_flags() {
    let packed = format!("{SLICE_4}flags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n");
    let plan = plan_for("a100-40gb:2", &[], &packed, MigStrategy::None).unwrap();
    let resource = &plan[&"nvidia.com/gpu.shared".parse().unwrap()];
    assert_eq!(
        resource.shared.unwrap().allocation_policy,
        AllocationPolicy::Packed
    );
}

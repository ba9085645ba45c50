use std::collections::BTreeMap;

use crd::config::mig_parted;
use crd::mig::{
    ComputeCapability, GpuInstanceProfile, GpuInstanceProfileName, GpuModel, MigProfileName,
    model_by_simulator_name,
};

use super::*;
use crate::types::{CudaVersion, GpuInventory, MigMode};

fn a100() -> &'static GpuModel {
    model_by_simulator_name("a100-40gb").unwrap()
}

fn request(pairs: &[(&str, u32)]) -> BTreeMap<MigProfileName, u32> {
    pairs
        .iter()
        .map(|(name, count)| (name.parse().unwrap(), *count))
        .collect()
}

fn existing(id: u32, profile: &str, start: u32, compute: &[u32]) -> ExistingInstance {
    let profile = a100().profile_by_name(profile).unwrap();
    ExistingInstance {
        gpu_instance_id: id,
        profile_id: profile.id,
        placement: Placement {
            start,
            size: u32::from(profile.placement_size),
        },
        compute_slices: compute.to_vec(),
    }
}

fn created(plan: &MigPlan) -> Vec<(String, Placement)> {
    plan.create
        .iter()
        .map(|instance| (instance.profile.to_string(), instance.placement))
        .collect()
}

fn at(start: u32, size: u32) -> Placement {
    Placement { start, size }
}

#[test]
fn places_largest_first_where_creation_order_would_fail() {
    // Created in name order, 2g.10gb could land on slice 0 and leave no room for 4g.20gb, whose only start is 0.
    let plan = plan(
        a100(),
        &[],
        &request(&[("2g.10gb", 1), ("4g.20gb", 1), ("1g.5gb", 1)]),
    )
    .unwrap();
    assert_eq!(
        created(&plan),
        [
            ("4g.20gb".to_owned(), at(0, 4)),
            ("2g.10gb".to_owned(), at(4, 2)),
            ("1g.5gb".to_owned(), at(6, 1)),
        ]
    );
    assert!(plan.keep.is_empty() && plan.destroy.is_empty());
}

#[test]
fn the_guides_mixed_geometry_plans() {
    let plan = plan(a100(), &[], &request(&[("2g.10gb", 2), ("1g.5gb", 3)])).unwrap();
    assert_eq!(
        created(&plan),
        [
            ("2g.10gb".to_owned(), at(0, 2)),
            ("2g.10gb".to_owned(), at(2, 2)),
            ("1g.5gb".to_owned(), at(4, 1)),
            ("1g.5gb".to_owned(), at(5, 1)),
            ("1g.5gb".to_owned(), at(6, 1)),
        ]
    );
}

#[test]
fn matching_instances_survive() {
    let current = [
        existing(1, "3g.20gb", 4, &[3]),
        existing(2, "1g.5gb", 0, &[1]),
    ];
    let plan = plan(
        a100(),
        &current,
        &request(&[("3g.20gb", 1), ("2g.10gb", 2)]),
    )
    .unwrap();
    assert_eq!(
        plan.keep,
        [KeptInstance {
            gpu_instance_id: 1,
            profile: "3g.20gb".parse().unwrap()
        }]
    );
    assert_eq!(plan.destroy, [2]);
    assert_eq!(
        created(&plan),
        [
            ("2g.10gb".to_owned(), at(0, 2)),
            ("2g.10gb".to_owned(), at(2, 2))
        ]
    );
}

#[test]
fn an_instance_in_the_way_is_moved() {
    // The 2g.10gb at slice 2 matches, but 4g.20gb needs slices 0-3: keeping it would leave no packing.
    let current = [existing(5, "2g.10gb", 2, &[2])];
    let plan = plan(
        a100(),
        &current,
        &request(&[("4g.20gb", 1), ("2g.10gb", 1)]),
    )
    .unwrap();
    assert!(plan.keep.is_empty());
    assert_eq!(plan.destroy, [5]);
    assert_eq!(
        created(&plan),
        [
            ("4g.20gb".to_owned(), at(0, 4)),
            ("2g.10gb".to_owned(), at(4, 2))
        ]
    );
}

#[test]
fn keeps_as_many_as_possible_when_more_match_than_are_wanted() {
    let current = [
        existing(1, "1g.5gb", 0, &[1]),
        existing(2, "1g.5gb", 1, &[1]),
        existing(3, "1g.5gb", 6, &[1]),
    ];
    let plan = plan(a100(), &current, &request(&[("1g.5gb", 2), ("4g.20gb", 1)])).unwrap();
    // 4g.20gb needs slices 0-3, so only the instance at slice 6 can stay.
    assert_eq!(plan.keep.len(), 1);
    assert_eq!(plan.keep[0].gpu_instance_id, 3);
    assert_eq!(plan.destroy, [1, 2]);
    assert_eq!(
        created(&plan),
        [
            ("4g.20gb".to_owned(), at(0, 4)),
            ("1g.5gb".to_owned(), at(4, 1))
        ]
    );
}

#[test]
fn unchanged_geometry_is_a_noop() {
    let current = [
        existing(1, "3g.20gb", 0, &[3]),
        existing(2, "3g.20gb", 4, &[3]),
    ];
    let plan = plan(a100(), &current, &request(&[("3g.20gb", 2)])).unwrap();
    assert!(plan.is_noop());
    assert_eq!(plan.keep.len(), 2);
}

#[test]
fn compute_instance_part_is_planned_and_matched() {
    let plan_fresh = plan(a100(), &[], &request(&[("1c.2g.10gb", 1)])).unwrap();
    assert_eq!(plan_fresh.create[0].compute_slices, 1);
    assert_eq!(plan_fresh.create[0].profile_id, 14);
    // A 2g.10gb holding one full-size compute instance is not a 1c.2g.10gb device.
    let current = [existing(1, "2g.10gb", 0, &[2])];
    let replan = plan(a100(), &current, &request(&[("1c.2g.10gb", 1)])).unwrap();
    assert_eq!(replan.destroy, [1]);
    let current = [existing(1, "2g.10gb", 0, &[1])];
    assert!(
        plan(a100(), &current, &request(&[("1c.2g.10gb", 1)]))
            .unwrap()
            .is_noop()
    );
}

#[test]
fn empty_request_destroys_everything() {
    let current = [existing(1, "7g.40gb", 0, &[7])];
    let plan = plan(a100(), &current, &request(&[("1g.5gb", 0)])).unwrap();
    assert_eq!(plan.destroy, [1]);
    assert!(plan.create.is_empty() && plan.keep.is_empty());
}

fn error(pairs: &[(&str, u32)]) -> String {
    plan(a100(), &[], &request(pairs)).unwrap_err().to_string()
}

#[test]
fn errors_say_what_does_not_fit() {
    assert_eq!(
        error(&[("3g.20gb", 3)]),
        "3g.20gb x3 does not fit on A100-SXM4-40GB: at most 2"
    );
    assert_eq!(
        error(&[("3g.20gb", 1), ("1c.3g.20gb", 2)]),
        "3g.20gb x3 does not fit on A100-SXM4-40GB: at most 2"
    );
    assert_eq!(
        error(&[("1g.20gb", 1)]),
        "profile 1g.20gb does not exist on A100-SXM4-40GB \
         (profiles: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)"
    );
    assert_eq!(
        error(&[("4g.20gb", 1), ("3g.20gb", 1), ("1g.5gb", 1)]),
        "needs 9 memory slices, A100-SXM4-40GB has 8"
    );
    assert_eq!(
        error(&[("4g.20gb", 1), ("2g.10gb", 2)]),
        "needs 8 compute slices, A100-SXM4-40GB has 7"
    );
    assert_eq!(
        error(&[("3c.4g.20gb", 1)]),
        "profile 3c.4g.20gb does not exist on A100-SXM4-40GB: a 4g.20gb GPU instance holds compute instances \
         of 1, 2, 4 slices"
    );
}

/// Counts near `u32::MAX` are refused by the bound check, which runs before one entry per device is made; two
/// names of one profile whose counts add up past `u32::MAX` are too many, not a wrapped small number.
#[test]
fn counts_near_u32_max_are_too_many_before_anything_is_expanded() {
    assert_eq!(
        error(&[("1g.5gb", u32::MAX)]),
        "1g.5gb x4294967295 does not fit on A100-SXM4-40GB: at most 7"
    );
    assert_eq!(
        error(&[("3g.20gb", u32::MAX), ("1c.3g.20gb", 2)]),
        "3g.20gb x4294967295 does not fit on A100-SXM4-40GB: at most 2"
    );
}

/// A model whose two profiles both want slice 0, so that the counts fit but no packing does.
static CRAMPED_PROFILES: [GpuInstanceProfile; 2] = [
    GpuInstanceProfile {
        name: GpuInstanceProfileName::new(1, 5),
        nvml_index: 0,
        id: 19,
        max_instances: 2,
        sm_count: 14,
        memory_mib: 4864,
        placement_starts: &[0],
        placement_size: 1,
    },
    GpuInstanceProfile {
        name: GpuInstanceProfileName::new(2, 10),
        nvml_index: 1,
        id: 14,
        max_instances: 1,
        sm_count: 28,
        memory_mib: 9856,
        placement_starts: &[0],
        placement_size: 2,
    },
];

static CRAMPED: GpuModel = GpuModel {
    simulator_name: "cramped",
    sources: "A test model with too few placements for its counts.",
    product_names: &["NVIDIA Cramped"],
    pci_device_ids: &[0x0001_10DE],
    memory_mib: 40960,
    compute_capability: ComputeCapability { major: 8, minor: 0 },
    sm_count: 108,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &CRAMPED_PROFILES,
};

#[test]
fn no_packing_is_reported_with_the_request() {
    let error = plan(&CRAMPED, &[], &request(&[("1g.5gb", 1), ("2g.10gb", 1)])).unwrap_err();
    assert_eq!(
        error.to_string(),
        "2g.10gb x1, 1g.5gb x1 do not fit together on Cramped: no arrangement of their allowed placements exists"
    );
}

#[test]
fn mode_change_resets_only_when_the_current_mode_is_wrong() {
    let mode = |current, pending| MigMode { current, pending };
    assert!(mode_change(mode(true, true), true).is_none());
    assert_eq!(
        mode_change(mode(false, false), true),
        ModeChange {
            set_mode: Some(true),
            reset: true
        }
    );
    assert_eq!(
        mode_change(mode(false, true), true),
        ModeChange {
            set_mode: None,
            reset: true
        }
    );
    assert_eq!(
        mode_change(mode(true, false), true),
        ModeChange {
            set_mode: Some(true),
            reset: false
        }
    );
}

fn gpu(index: u32, model: &str, mig: Option<MigMode>) -> GpuInventory {
    let model = model_by_simulator_name(model).unwrap();
    GpuInventory {
        index,
        uuid: format!("GPU-{index}"),
        product_name: model.product_name().to_owned(),
        pci_device_id: model.pci_device_ids[0],
        pci_bus_id: format!("00000000:{index:02X}:00.0"),
        memory_mib: model.memory_mib,
        multiprocessor_count: Some(model.sm_count),
        compute_capability: model.compute_capability,
        driver_version: "570.86.15".into(),
        cuda_driver_version: CudaVersion {
            major: 12,
            minor: 8,
        },
        mig_mode: mig,
    }
}

const CONFIG: &str = r#"
version: v1
mig-configs:
  mixed:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
    - devices: [1]
      device-filter: "0x233010DE"
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
  clash:
    - devices: all
      mig-enabled: false
    - devices: [1]
      mig-enabled: true
      mig-devices: {}
"#;

#[test]
fn decide_picks_entries_and_mode_changes_per_gpu() {
    let config = mig_parted::parse(CONFIG).unwrap().config;
    let off = Some(MigMode::default());
    let on = Some(MigMode {
        current: true,
        pending: true,
    });
    let gpus = [
        gpu(0, "a100-40gb", on),
        gpu(1, "a100-40gb", off),
        gpu(2, "h100-80gb", off),
    ];
    let decisions = decide(&config, "mixed", &gpus).unwrap();
    // GPU 1 is an A100, which the second entry's filter excludes; GPU 2 is not in any entry's devices.
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].gpu_index, 0);
    assert!(decisions[0].mode_change.is_none());

    let error = decide(&config, "clash", &gpus).unwrap_err().to_string();
    assert_eq!(
        error,
        "MIG config clash: entries 0 and 1 both apply to GPU 1 but ask for different geometries"
    );
    assert_eq!(
        decide(&config, "nope", &gpus).unwrap_err().to_string(),
        "no MIG config named nope (configs: clash, mixed)"
    );
}

#[test]
fn decide_refuses_mig_on_gpus_without_it() {
    let config = mig_parted::parse(CONFIG).unwrap().config;
    let error = decide(&config, "mixed", &[gpu(0, "a100-40gb", None)]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "MIG config mixed enables MIG on GPU 0 (NVIDIA A100-SXM4-40GB), which is not MIG capable"
    );
}

/// A GPU newer than the catalog: an entry for it parses (its filter names an unknown id), and the node refuses to
/// create instances on it with the product and the id it reports.
#[test]
fn decide_names_a_gpu_the_catalog_does_not_know() {
    let parsed = mig_parted::parse(
        "version: v1\nmig-configs:\n  future:\n  - device-filter: \"0x999910DE\"\n    devices: all\n    \
         mig-enabled: true\n    mig-devices: {\"1g.30gb\": 7}\n",
    )
    .unwrap();
    assert!(parsed.problems.is_empty());
    let on = Some(MigMode {
        current: true,
        pending: true,
    });
    let future = GpuInventory {
        product_name: "NVIDIA X300".into(),
        pci_device_id: 0x9999_10DE,
        ..gpu(0, "b200", on)
    };
    assert_eq!(
        decide(&parsed.config, "future", &[future])
            .unwrap_err()
            .to_string(),
        "MIG config future creates MIG devices on GPU 0 (NVIDIA X300, PCI device id 0x999910DE), a model without a \
         known MIG profile table (the models known are listed in docs/mig-catalog.md)"
    );
}

use super::*;
use crate::inventory::{GpuView, read, tests::simulated};

fn with_sharing(text: &str) -> Sharing {
    Sharing::of(&crd::config::device_plugin::parse(text).unwrap()).unwrap()
}

fn compute(
    spec: &str,
    devices: &[(&str, u32)],
    strategy: MigStrategy,
    sharing: Option<&Sharing>,
) -> Result<BTreeMap<String, String>, LabelError> {
    let (_dir, simulator) = simulated(spec, devices);
    let gpus = read(simulator.as_ref()).unwrap();
    labels(Facts {
        gpus: &gpus,
        strategy,
        sharing,
        machine: "DGX A100",
    })
}

fn get<'l>(labels: &'l BTreeMap<String, String>, name: &str) -> &'l str {
    labels
        .get(&format!("nvidia.com/{name}"))
        .unwrap_or_else(|| panic!("no {name} in {labels:?}"))
}

#[test]
fn full_gpus_are_labelled_as_nvidias_gfd_does() {
    let labels = compute("a100-40gb:4", &[], MigStrategy::None, None).unwrap();
    let expected = [
        ("gpu.product", "NVIDIA-A100-SXM4-40GB"),
        ("gpu.count", "4"),
        ("gpu.memory", "40960"),
        ("gpu.family", "ampere"),
        ("gpu.compute.major", "8"),
        ("gpu.compute.minor", "0"),
        ("gpu.machine", "DGX-A100"),
        ("gpu.replicas", "1"),
        ("gpu.sharing-strategy", "none"),
        ("cuda.driver-version.major", "570"),
        ("cuda.driver-version.minor", "86"),
        ("cuda.driver-version.revision", "15"),
        ("cuda.driver-version.full", "570.86.15"),
        ("cuda.runtime-version.major", "12"),
        ("cuda.runtime-version.minor", "8"),
        ("cuda.runtime-version.full", "12.8"),
        ("mig.capable", "true"),
        ("mps.capable", "false"),
        ("mig.strategy", "none"),
    ];
    for (name, value) in expected {
        assert_eq!(get(&labels, name), value, "{name}");
    }
    assert_eq!(labels.len(), expected.len(), "{labels:?}");
    assert!(labels.keys().all(|key| is_owned(key)), "{labels:?}");
}

#[test]
fn time_slicing_without_rename_marks_the_product_shared() {
    let sharing = with_sharing(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    );
    let labels = compute("a100-40gb:1", &[], MigStrategy::None, Some(&sharing)).unwrap();
    assert_eq!(get(&labels, "gpu.product"), "NVIDIA-A100-SXM4-40GB-SHARED");
    assert_eq!(get(&labels, "gpu.replicas"), "4");
    assert_eq!(get(&labels, "gpu.sharing-strategy"), "time-slicing");

    let renamed = with_sharing(
        "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
    );
    let labels = compute("h100-80gb:1", &[], MigStrategy::None, Some(&renamed)).unwrap();
    assert_eq!(get(&labels, "gpu.product"), "NVIDIA-H100-80GB-HBM3");
    assert_eq!(get(&labels, "gpu.family"), "hopper");
    assert_eq!(get(&labels, "mps.capable"), "true");
    assert_eq!(get(&labels, "gpu.sharing-strategy"), "mps");
}

#[test]
fn single_strategy_labels_the_mig_devices_as_gpus() {
    let labels = compute("a100-40gb:4", &[("1g.5gb", 7)], MigStrategy::Single, None).unwrap();
    assert_eq!(
        get(&labels, "gpu.product"),
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    );
    assert_eq!(get(&labels, "gpu.count"), "28");
    assert_eq!(get(&labels, "gpu.memory"), "4864");
    assert_eq!(get(&labels, "gpu.multiprocessors"), "14");
    assert_eq!(get(&labels, "gpu.slices.gi"), "1");
    assert_eq!(get(&labels, "gpu.slices.ci"), "1");
    assert_eq!(get(&labels, "mig.strategy"), "single");

    let mixed = compute(
        "a100-40gb:1",
        &[("1g.5gb", 3), ("2g.10gb", 2)],
        MigStrategy::Single,
        None,
    )
    .unwrap_err();
    assert_eq!(
        mixed.to_string(),
        "MIG strategy single needs every GPU in MIG mode with MIG devices of one profile; found 0 GPUs with \
         MIG off and MIG devices of [1g.5gb, 2g.10gb] (use the mixed strategy, or a config with one profile \
         for all GPUs)"
    );
    let without_mig = compute("a100-40gb:1", &[], MigStrategy::Single, None).unwrap();
    assert_eq!(get(&without_mig, "gpu.product"), "NVIDIA-A100-SXM4-40GB");
}

#[test]
fn mixed_strategy_labels_every_profile() {
    let sharing = with_sharing(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.5gb\n      replicas: 2\n",
    );
    let labels = compute(
        "a100-40gb:4",
        &[("1g.5gb", 3), ("2g.10gb", 2)],
        MigStrategy::Mixed,
        Some(&sharing),
    )
    .unwrap();
    assert_eq!(get(&labels, "mig-1g.5gb.count"), "12");
    assert_eq!(get(&labels, "mig-2g.10gb.count"), "8");
    assert_eq!(get(&labels, "mig-2g.10gb.memory"), "9856");
    assert_eq!(get(&labels, "mig-2g.10gb.multiprocessors"), "28");
    assert_eq!(get(&labels, "mig-2g.10gb.slices.gi"), "2");
    assert_eq!(get(&labels, "mig-2g.10gb.slices.ci"), "2");
    assert_eq!(get(&labels, "mig-2g.10gb.replicas"), "1");
    assert_eq!(get(&labels, "mig-1g.5gb.replicas"), "2");
    assert_eq!(
        get(&labels, "mig-1g.5gb.product"),
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    );
    assert_eq!(get(&labels, "gpu.count"), "4");
    assert_eq!(get(&labels, "gpu.product"), "NVIDIA-A100-SXM4-40GB");
}

/// The labels of `gpus` under the mixed strategy, without sharing.
fn mixed(gpus: &[GpuView]) -> BTreeMap<String, String> {
    labels(Facts {
        gpus,
        strategy: MigStrategy::Mixed,
        sharing: None,
        machine: "DGX A100",
    })
    .unwrap()
}

#[test]
fn engine_labels_come_only_from_a_backend_that_counts_engines() {
    let (_dir, simulator) = simulated("a100-40gb:1", &[("2g.10gb", 3)]);
    let mut gpus = read(simulator.as_ref()).unwrap();
    assert!(
        !mixed(&gpus).keys().any(|key| key.contains(".engines.")),
        "the simulator knows no engine counts"
    );
    // As NVML's device attributes give them.
    for (_, device) in &mut gpus[0].devices {
        device.engines = Some(gpu::MigEngines {
            copy: 2,
            decoder: 1,
            encoder: 0,
            jpeg: 0,
            ofa: 0,
        });
    }
    let counted = mixed(&gpus);
    assert_eq!(get(&counted, "mig-2g.10gb.engines.copy"), "2");
    assert_eq!(get(&counted, "mig-2g.10gb.engines.decoder"), "1");
    assert_eq!(get(&counted, "mig-2g.10gb.engines.encoder"), "0");
    assert_eq!(get(&counted, "mig-2g.10gb.engines.jpeg"), "0");
    assert_eq!(get(&counted, "mig-2g.10gb.engines.ofa"), "0");
}

#[test]
fn media_extension_profiles_use_the_resource_spelling() {
    let labels = compute("a100-40gb:1", &[("1g.5gb+me", 1)], MigStrategy::Mixed, None).unwrap();
    assert_eq!(get(&labels, "mig-1g.5gb.me.count"), "1");
}

#[test]
fn the_patch_sets_changes_and_removes_only_stale_owned_labels() {
    let current: BTreeMap<String, String> = [
        ("nvidia.com/gpu.count", "4"),
        ("nvidia.com/gpu.product", "old"),
        ("nvidia.com/mig-1g.5gb.count", "12"),
        ("nvidia.com/mig.config", "all-1g.5gb"),
        ("nvidia.com/mig.config.state", "success"),
        ("nvidia.com/gpu.deploy.device-plugin", "true"),
        ("nvidia.com/gpu.present", "true"),
    ]
    .map(|(key, value)| (key.to_owned(), value.to_owned()))
    .into();
    let desired: BTreeMap<String, String> = [
        ("nvidia.com/gpu.count", "4"),
        ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
    ]
    .map(|(key, value)| (key.to_owned(), value.to_owned()))
    .into();
    let change = patch(&current, &desired);
    assert_eq!(
        change.labels,
        BTreeMap::from([
            (
                "nvidia.com/gpu.product".to_owned(),
                Some("NVIDIA-A100-SXM4-40GB".to_owned())
            ),
            ("nvidia.com/mig-1g.5gb.count".to_owned(), None),
        ])
    );
    assert!(
        patch(&desired, &desired).is_empty(),
        "nothing to write when nothing changed"
    );
}

#[test]
fn families_and_label_values() {
    let family_of = |major, minor| family(ComputeCapability { major, minor });
    assert_eq!(family_of(7, 0), "volta");
    assert_eq!(family_of(7, 5), "turing");
    assert_eq!(family_of(8, 6), "ampere");
    assert_eq!(family_of(8, 9), "ada-lovelace");
    assert_eq!(family_of(9, 0), "hopper");
    assert_eq!(family_of(12, 0), "blackwell");
    assert_eq!(family_of(1, 0), "undefined");
    assert_eq!(label_value(" NVIDIA A100 (PCIe) "), "NVIDIA-A100--PCIe");
    assert_eq!(label_value(&"x".repeat(70)).len(), 63);
    assert!(!is_owned("nvidia.com/mig.config"));
    assert!(!is_owned("nvidia.com/gpu.present"));
    assert!(is_owned("nvidia.com/mig-1g.5gb.count"));
}

use crd::mig::ComputeCapability;
use node_runtime::inventory::{GpuView, read};
use node_runtime::testing::simulated;

use super::*;

fn with_sharing(text: &str) -> Sharing {
    Sharing::of(&crd::config::device_plugin::parse(text).unwrap()).unwrap()
}

/// Every GPU a 3D controller, as simulated data-centre GPUs are.
fn compute_classes(gpus: &[GpuView]) -> BTreeMap<String, u32> {
    gpus.iter()
        .map(|gpu| (pci_address(&gpu.inventory.pci_bus_id), PCI_CLASS_3D))
        .collect()
}

fn compute(
    spec: &str,
    devices: &[(&str, u32)],
    strategy: MigStrategy,
    sharing: Option<&Sharing>,
) -> Result<Labelled, LabelError> {
    let (_dir, simulator) = simulated(spec, devices);
    let gpus = read(simulator.as_ref()).unwrap();
    labels(Facts {
        gpus: &gpus,
        strategy,
        sharing,
        machine: "DGX A100",
        pci_classes: &compute_classes(&gpus),
    })
}

fn valid(
    spec: &str,
    devices: &[(&str, u32)],
    strategy: MigStrategy,
    sharing: Option<&Sharing>,
) -> BTreeMap<String, String> {
    let labelled = compute(spec, devices, strategy, sharing).unwrap();
    assert_eq!(labelled.invalid, None);
    labelled.labels
}

fn get<'l>(labels: &'l BTreeMap<String, String>, name: &str) -> &'l str {
    labels
        .get(&format!("nvidia.com/{name}"))
        .unwrap_or_else(|| panic!("no {name} in {labels:?}"))
}

#[test]
fn full_gpus_are_labelled_as_nvidias_gfd_does() {
    let labels = valid("a100-40gb:4", &[], MigStrategy::None, None);
    let expected = [
        ("gpu.product", "NVIDIA-A100-SXM4-40GB"),
        ("gpu.count", "4"),
        ("gpu.memory", "40960"),
        ("gpu.family", "ampere"),
        ("gpu.compute.major", "8"),
        ("gpu.compute.minor", "0"),
        ("gpu.machine", "DGX-A100"),
        ("gpu.mode", "compute"),
        ("gpu.replicas", "1"),
        ("gpu.sharing-strategy", "none"),
        ("cuda.driver.major", "570"),
        ("cuda.driver.minor", "86"),
        ("cuda.driver.rev", "15"),
        ("cuda.runtime.major", "12"),
        ("cuda.runtime.minor", "8"),
        ("cuda.driver-version.major", "570"),
        ("cuda.driver-version.minor", "86"),
        ("cuda.driver-version.revision", "15"),
        ("cuda.driver-version.full", "570.86.15"),
        ("cuda.runtime-version.major", "12"),
        ("cuda.runtime-version.minor", "8"),
        ("cuda.runtime-version.full", "12.8"),
        ("mig.capable", "true"),
        ("mps.capable", "false"),
    ];
    for (name, value) in expected {
        assert_eq!(get(&labels, name), value, "{name}");
    }
    assert_eq!(labels.len(), expected.len(), "{labels:?}");
    assert!(
        labels.keys().all(|key| written_by_feature_discovery(key)),
        "{labels:?}"
    );
}

#[test]
fn driver_versions_without_a_revision_and_malformed_ones() {
    let (_dir, simulator) = simulated("a100-40gb:1", &[]);
    let mut gpus = read(simulator.as_ref()).unwrap();
    let facts = |gpus: &[GpuView]| {
        labels(Facts {
            gpus,
            strategy: MigStrategy::None,
            sharing: None,
            machine: "",
            pci_classes: &BTreeMap::new(),
        })
    };
    gpus[0].inventory.driver_version = "580.65".into();
    let labels = facts(&gpus).unwrap().labels;
    assert_eq!(get(&labels, "cuda.driver.rev"), "");
    assert_eq!(get(&labels, "cuda.driver-version.revision"), "");
    assert_eq!(get(&labels, "gpu.mode"), "unknown", "no class read");
    assert_eq!(get(&labels, "gpu.machine"), "");
    gpus[0].inventory.driver_version = "580".into();
    assert_eq!(
        facts(&gpus).unwrap_err(),
        LabelError::DriverVersion("580".into())
    );
}

#[test]
fn sharing_strategy_and_shared_product_follow_the_replicas() {
    let sharing = with_sharing(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    );
    let labels = valid("a100-40gb:1", &[], MigStrategy::None, Some(&sharing));
    assert_eq!(get(&labels, "gpu.product"), "NVIDIA-A100-SXM4-40GB-SHARED");
    assert_eq!(get(&labels, "gpu.replicas"), "4");
    assert_eq!(get(&labels, "gpu.sharing-strategy"), "time-slicing");
    assert_eq!(get(&labels, "mps.capable"), "false");

    let renamed = with_sharing(
        "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
    );
    let labels = valid("h100-80gb:1", &[], MigStrategy::None, Some(&renamed));
    assert_eq!(get(&labels, "gpu.product"), "NVIDIA-H100-80GB-HBM3");
    assert_eq!(get(&labels, "gpu.family"), "hopper");
    assert_eq!(get(&labels, "mps.capable"), "true");
    assert_eq!(get(&labels, "gpu.sharing-strategy"), "mps");

    // Sharing that replicates another resource: the GPUs themselves are not shared.
    let other = with_sharing(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/mig-1g.5gb\n      replicas: 2\n",
    );
    let labels = valid("a100-40gb:1", &[], MigStrategy::None, Some(&other));
    assert_eq!(get(&labels, "gpu.sharing-strategy"), "none");
    assert_eq!(get(&labels, "gpu.replicas"), "1");
    assert_eq!(get(&labels, "mps.capable"), "true");
}

#[test]
fn mps_with_mig_on_is_refused_as_gfd_refuses_it() {
    let mps = with_sharing(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
    );
    assert_eq!(
        compute(
            "a100-40gb:2",
            &[("1g.5gb", 7)],
            MigStrategy::Mixed,
            Some(&mps)
        )
        .unwrap_err(),
        LabelError::MpsWithMig { gpu: 0 }
    );
}

#[test]
fn gpus_with_mig_on_are_labelled_without_sharing() {
    let sharing = with_sharing(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    );
    let labels = valid(
        "a100-40gb:2",
        &[("1g.5gb", 7)],
        MigStrategy::None,
        Some(&sharing),
    );
    assert_eq!(get(&labels, "gpu.replicas"), "0");
    assert_eq!(get(&labels, "gpu.sharing-strategy"), "none");
    assert_eq!(get(&labels, "gpu.product"), "NVIDIA-A100-SXM4-40GB");
    assert!(!labels.contains_key("nvidia.com/mig.strategy"));
}

#[test]
fn single_strategy_labels_the_mig_devices_as_gpus() {
    let labels = valid("a100-40gb:4", &[("1g.5gb", 7)], MigStrategy::Single, None);
    assert_eq!(
        get(&labels, "gpu.product"),
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    );
    assert_eq!(get(&labels, "gpu.count"), "28");
    assert_eq!(get(&labels, "gpu.memory"), "4864");
    assert_eq!(get(&labels, "gpu.multiprocessors"), "14");
    assert_eq!(get(&labels, "gpu.slices.gi"), "1");
    assert_eq!(get(&labels, "gpu.slices.ci"), "1");
    assert_eq!(get(&labels, "gpu.replicas"), "1");
    assert_eq!(get(&labels, "gpu.sharing-strategy"), "none");
    assert_eq!(get(&labels, "gpu.family"), "ampere");
    assert_eq!(get(&labels, "mig.strategy"), "single");

    let mixed = compute(
        "a100-40gb:1",
        &[("1g.5gb", 3), ("2g.10gb", 2)],
        MigStrategy::Single,
        None,
    )
    .unwrap();
    assert_eq!(
        mixed.invalid.unwrap().to_string(),
        "MIG strategy single needs every GPU in MIG mode with MIG devices of one profile; found 0 GPUs with \
         MIG off, 0 with MIG on and no MIG devices, MIG devices of [1g.5gb, 2g.10gb] (use the mixed strategy, \
         or a config with one profile for all GPUs)"
    );
    for (name, value) in [
        ("gpu.product", "NVIDIA-A100-SXM4-40GB-MIG-INVALID"),
        ("gpu.count", "0"),
        ("gpu.replicas", "0"),
        ("gpu.sharing-strategy", ""),
        ("gpu.memory", "0"),
    ] {
        assert_eq!(get(&mixed.labels, name), value, "{name}");
    }
    let empty = compute("a100-40gb:1", &[], MigStrategy::Single, None);
    let without_mig = empty.unwrap().labels;
    assert_eq!(get(&without_mig, "gpu.product"), "NVIDIA-A100-SXM4-40GB");
    assert_eq!(get(&without_mig, "mig.strategy"), "single");
}

#[test]
fn mixed_strategy_labels_every_profile() {
    let sharing = with_sharing(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.5gb\n      replicas: 2\n",
    );
    let labels = valid(
        "a100-40gb:4",
        &[("1g.5gb", 3), ("2g.10gb", 2)],
        MigStrategy::Mixed,
        Some(&sharing),
    );
    assert_eq!(get(&labels, "mig-1g.5gb.count"), "12");
    assert_eq!(get(&labels, "mig-2g.10gb.count"), "8");
    assert_eq!(get(&labels, "mig-2g.10gb.memory"), "9856");
    assert_eq!(get(&labels, "mig-2g.10gb.multiprocessors"), "28");
    assert_eq!(get(&labels, "mig-2g.10gb.slices.gi"), "2");
    assert_eq!(get(&labels, "mig-2g.10gb.slices.ci"), "2");
    assert_eq!(get(&labels, "mig-2g.10gb.replicas"), "1");
    assert_eq!(get(&labels, "mig-2g.10gb.sharing-strategy"), "none");
    assert_eq!(get(&labels, "mig-1g.5gb.replicas"), "2");
    assert_eq!(get(&labels, "mig-1g.5gb.sharing-strategy"), "time-slicing");
    assert_eq!(
        get(&labels, "mig-1g.5gb.product"),
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    );
    assert_eq!(get(&labels, "gpu.count"), "4");
    assert_eq!(get(&labels, "gpu.replicas"), "0");
    assert_eq!(get(&labels, "gpu.product"), "NVIDIA-A100-SXM4-40GB");
    assert_eq!(get(&labels, "mig.strategy"), "mixed");
}

/// The labels of `gpus` under the mixed strategy, without sharing.
fn mixed(gpus: &[GpuView]) -> BTreeMap<String, String> {
    labels(Facts {
        gpus,
        strategy: MigStrategy::Mixed,
        sharing: None,
        machine: "DGX A100",
        pci_classes: &compute_classes(gpus),
    })
    .unwrap()
    .labels
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
    let labels = valid("a100-40gb:1", &[("1g.5gb+me", 1)], MigStrategy::Mixed, None);
    assert_eq!(get(&labels, "mig-1g.5gb.me.count"), "1");
    assert_eq!(
        get(&labels, "mig-1g.5gb.me.product"),
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me"
    );
}

#[test]
fn gpu_mode_needs_one_class_for_every_gpu() {
    let (_dir, simulator) = simulated("a100-40gb:2", &[]);
    let gpus = read(simulator.as_ref()).unwrap();
    let address = |index: usize| pci_address(&gpus[index].inventory.pci_bus_id);
    let classes = |first, second| BTreeMap::from([(address(0), first), (address(1), second)]);
    assert_eq!(
        gpu_mode(&gpus, &classes(PCI_CLASS_3D, PCI_CLASS_3D)),
        "compute"
    );
    assert_eq!(
        gpu_mode(&gpus, &classes(PCI_CLASS_VGA, PCI_CLASS_VGA)),
        "graphics"
    );
    assert_eq!(
        gpu_mode(&gpus, &classes(PCI_CLASS_VGA, PCI_CLASS_3D)),
        "unknown"
    );
    assert_eq!(gpu_mode(&gpus, &classes(0x0380, 0x0380)), "unknown");
    let one = BTreeMap::from([(address(0), PCI_CLASS_3D)]);
    assert_eq!(gpu_mode(&gpus, &one), "unknown", "a class not read");
    assert_eq!(pci_address("00000000:3B:00.0"), "0000:3b:00.0");
    assert_eq!(pci_address("0000:3b:00.0"), "0000:3b:00.0");
}

fn strings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

#[test]
fn the_patch_sets_changes_and_removes_only_stale_owned_labels() {
    let current = strings(&[
        ("nvidia.com/gpu.count", "4"),
        ("nvidia.com/gpu.product", "old"),
        ("nvidia.com/mig-1g.5gb.count", "12"),
        ("nvidia.com/mig.config", "all-1g.5gb"),
        ("nvidia.com/mig.config.state", "success"),
        ("nvidia.com/gpu.deploy.device-plugin", "true"),
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.clique", "cluster.1"),
    ]);
    let desired = strings(&[
        ("nvidia.com/gpu.count", "4"),
        ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
    ]);
    let change = patch(&current, &desired, None);
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
        patch(&desired, &desired, None).is_empty(),
        "nothing to write when nothing changed"
    );
}

#[test]
fn the_timestamp_is_renewed_with_changes_or_once_a_minute() {
    let desired = strings(&[("nvidia.com/gpu.count", "4")]);
    let at = |time: u64| {
        let mut labels = desired.clone();
        labels.insert(TIMESTAMP.into(), time.to_string());
        labels
    };
    let stamp = |change: &MetadataPatch| change.labels.get(TIMESTAMP).cloned().flatten();
    // First pass: everything, stamped.
    let first = patch(&BTreeMap::new(), &desired, Some(1_700_000_000));
    assert_eq!(stamp(&first).as_deref(), Some("1700000000"));
    // Nothing changed, stamped 30 s ago: nothing to write (the Node watch this patch wakes stays quiet).
    assert!(patch(&at(1_700_000_000), &desired, Some(1_700_000_030)).is_empty());
    // A minute later: only the timestamp.
    let renewed = patch(&at(1_700_000_000), &desired, Some(1_700_000_060));
    assert_eq!(renewed.labels.len(), 1);
    assert_eq!(stamp(&renewed).as_deref(), Some("1700000060"));
    // A change: stamped with it.
    let changed = strings(&[("nvidia.com/gpu.count", "3")]);
    let with_change = patch(&at(1_700_000_000), &changed, Some(1_700_000_001));
    assert_eq!(stamp(&with_change).as_deref(), Some("1700000001"));
    // Timestamps off: the label goes.
    assert_eq!(
        patch(&at(1_700_000_000), &desired, None).labels,
        BTreeMap::from([(TIMESTAMP.to_owned(), None)])
    );
}

#[test]
fn families_and_label_values() {
    let family_of = |major, minor| ComputeCapability { major, minor }.family();
    assert_eq!(family_of(7, 0), "volta");
    assert_eq!(family_of(7, 5), "turing");
    assert_eq!(family_of(8, 6), "ampere");
    assert_eq!(family_of(8, 9), "ada-lovelace");
    assert_eq!(family_of(9, 0), "hopper");
    assert_eq!(family_of(10, 0), "blackwell");
    assert_eq!(family_of(12, 0), "blackwell");
    assert_eq!(family_of(13, 0), "rubin");
    assert_eq!(family_of(4, 0), "undefined");
    assert_eq!(sanitise(" NVIDIA  A100 (PCIe) "), "NVIDIA-A100-PCIe");
    assert_eq!(
        sanitise("NVIDIA RTX PRO 6000 Blackwell Server Edition"),
        "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
    );
    assert_eq!(label_value(&"x".repeat(70)).len(), 63);
    assert!(!written_by_feature_discovery("nvidia.com/mig.config"));
    assert!(!written_by_feature_discovery("nvidia.com/gpu.present"));
    assert!(
        !written_by_feature_discovery("nvidia.com/gpu.clique"),
        "IMEX cliques are not computed here"
    );
    assert!(written_by_feature_discovery("nvidia.com/mig-1g.5gb.count"));
    assert!(written_by_feature_discovery(TIMESTAMP));
}

/// One line of our transcription of NVIDIA's GFD expected outputs: a label name (`<profile>` standing for a MIG
/// profile such as `1g.5gb`) and the regex its value must match, searched as Go's `MatchString` does.
struct ExpectedLabel {
    line: &'static str,
    name: regex::Regex,
    value: regex::Regex,
}

fn expected_labels(text: &'static str) -> Vec<ExpectedLabel> {
    text.lines()
        .map(|line| {
            let (name, value) = line.split_once(' ').expect("name and value regex");
            let name = regex::escape(name).replace("<profile>", r"[0-9]+g\.[0-9]+gb");
            ExpectedLabel {
                line,
                name: regex::Regex::new(&format!("^{name}$")).unwrap(),
                value: regex::Regex::new(value).unwrap(),
            }
        })
        .collect()
}

/// Every way `labels` differs from NVIDIA's expectations: a label NVIDIA expects that is missing or whose value has
/// another format, and (the check NVIDIA's own test makes) a label of ours that no expectation describes.
fn differences(expected: &[ExpectedLabel], labels: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    for label in expected {
        let matching: Vec<(&String, &String)> = labels
            .iter()
            .filter(|(name, _)| label.name.is_match(name))
            .collect();
        if matching.is_empty() {
            problems.push(format!("missing: {}", label.line));
        }
        for (name, value) in matching {
            if !label.value.is_match(value) {
                problems.push(format!("{name}={value} does not match {}", label.line));
            }
        }
    }
    for (name, value) in labels {
        if !expected
            .iter()
            .any(|label| label.name.is_match(name) && label.value.is_match(value))
        {
            problems.push(format!("not in NVIDIA's list: {name}={value}"));
        }
    }
    problems
}

/// The labels discovery writes on a node without labels: the computed ones and the timestamp.
fn written(labelled: &Labelled) -> BTreeMap<String, String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    patch(&BTreeMap::new(), &labelled.labels, Some(now))
        .labels
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
        .collect()
}

/// The engine counts NVML reports for A100 MIG devices, which the simulator does not model.
fn with_engines(gpus: &mut [GpuView]) {
    for gpu in gpus {
        for (_, device) in &mut gpu.devices {
            device.engines = Some(gpu::MigEngines {
                copy: device.multiprocessor_count / 14,
                decoder: 0,
                encoder: 0,
                jpeg: 0,
                ofa: 0,
            });
        }
    }
}

fn simulated_labels(
    spec: &str,
    devices: &[(&str, u32)],
    strategy: MigStrategy,
    sharing: Option<&Sharing>,
) -> BTreeMap<String, String> {
    let (_dir, simulator) = simulated(spec, devices);
    let mut gpus = read(simulator.as_ref()).unwrap();
    with_engines(&mut gpus);
    let classes = compute_classes(&gpus);
    let labelled = labels(Facts {
        gpus: &gpus,
        strategy,
        sharing,
        machine: "DGX A100",
        pci_classes: &classes,
    })
    .unwrap();
    assert_eq!(labelled.invalid, None);
    written(&labelled)
}

#[test]
fn whole_gpus_carry_every_label_of_nvidias_expected_output() {
    let time_slicing = with_sharing(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    );
    for (file, expected) in [
        (
            "gfd-expected-output.txt",
            include_str!("../../../../tests/fixtures/nvidia/gfd-expected-output.txt"),
        ),
        (
            "gfd-expected-output-mig-none.txt",
            include_str!("../../../../tests/fixtures/nvidia/gfd-expected-output-mig-none.txt"),
        ),
    ] {
        let expected = expected_labels(expected);
        for sharing in [None, Some(&time_slicing)] {
            let labels = simulated_labels("a100-40gb:4", &[], MigStrategy::None, sharing);
            assert_eq!(
                differences(&expected, &labels),
                Vec::<String>::new(),
                "{file}"
            );
        }
    }
}

#[test]
fn single_strategy_carries_every_label_of_nvidias_expected_output() {
    let expected = expected_labels(include_str!(
        "../../../../tests/fixtures/nvidia/gfd-expected-output-mig-single.txt"
    ));
    let labels = simulated_labels("a100-40gb:2", &[("1g.5gb", 7)], MigStrategy::Single, None);
    assert_eq!(differences(&expected, &labels), Vec::<String>::new());
}

#[test]
fn mixed_strategy_carries_every_label_of_nvidias_expected_output() {
    let expected = expected_labels(include_str!(
        "../../../../tests/fixtures/nvidia/gfd-expected-output-mig-mixed.txt"
    ));
    let shared_mig = with_sharing(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.5gb\n      replicas: 2\n",
    );
    for sharing in [None, Some(&shared_mig)] {
        let labels = simulated_labels(
            "a100-40gb:2",
            &[("1g.5gb", 3), ("2g.10gb", 2)],
            MigStrategy::Mixed,
            sharing,
        );
        assert_eq!(differences(&expected, &labels), Vec::<String>::new());
    }
}

#[test]
fn the_comparison_catches_a_missing_label_and_a_wrong_format() {
    let expected = expected_labels(include_str!(
        "../../../../tests/fixtures/nvidia/gfd-expected-output.txt"
    ));
    let mut labels = simulated_labels("a100-40gb:1", &[], MigStrategy::None, None);
    labels.remove("nvidia.com/cuda.driver.rev");
    labels.insert("nvidia.com/gfd.timestamp".into(), "soon".into());
    labels.insert("nvidia.com/gpu.extra".into(), "1".into());
    assert_eq!(
        differences(&expected, &labels),
        [
            "nvidia.com/gfd.timestamp=soon does not match nvidia.com/gfd.timestamp [0-9]{10}",
            "missing: nvidia.com/cuda.driver.rev [0-9]*",
            "not in NVIDIA's list: nvidia.com/gfd.timestamp=soon",
            "not in NVIDIA's list: nvidia.com/gpu.extra=1",
        ]
    );
}

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::*;

fn profile_of(model: &str, name: &str) -> &'static GpuInstanceProfile {
    model_by_simulator_name(model)
        .unwrap()
        .profile_by_name(name)
        .unwrap_or_else(|| panic!("{model} has no {name}"))
}

/// (name, index, id, max, SMs, MiB, starts, size) as the reference tables print them.
type Row = (&'static str, u32, u32, u32, u32, u64, &'static [u8], u8);

fn assert_rows(model: &str, rows: &[Row]) {
    let profiles = model_by_simulator_name(model).unwrap().profiles;
    assert_eq!(profiles.len(), rows.len(), "{model}");
    for (profile, row) in profiles.iter().zip(rows) {
        let actual: Row = (
            row.0,
            profile.nvml_index,
            profile.id,
            profile.max_instances,
            profile.sm_count,
            profile.memory_mib,
            profile.placement_starts,
            profile.placement_size,
        );
        assert_eq!(profile.name.to_string(), row.0, "{model}");
        assert_eq!(actual, *row, "{model}");
    }
}

/// Names and max instances of a model's profiles, in catalog order.
fn names(model: &str) -> Vec<(String, u32)> {
    model_by_simulator_name(model)
        .unwrap()
        .profiles
        .iter()
        .map(|p| (p.name.to_string(), p.max_instances))
        .collect()
}

fn owned(rows: &[(&str, u32)]) -> Vec<(String, u32)> {
    rows.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect()
}

/// Every PCI device id a `device-filter` of NVIDIA's default mig-parted config (gpu-operator v26.7.0) names is in
/// the catalog, and the catalog has no other.
#[test]
fn every_id_of_nvidias_default_config_is_known() {
    let text = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/nvidia/default-mig-parted-config.yaml"
    ));
    let parsed = crate::config::mig_parted::parse(text).unwrap();
    let nvidia: BTreeSet<u32> = parsed
        .config
        .mig_configs
        .values()
        .flatten()
        .flat_map(|entry| entry.device_filter.iter().map(|id| id.0))
        .collect();
    assert_eq!(nvidia.len(), 27);
    for id in &nvidia {
        assert!(model_by_pci_device_id(*id).is_some(), "0x{id:08X}");
    }
    let catalog: BTreeSet<u32> = models()
        .iter()
        .flat_map(|model| model.pci_device_ids.iter().copied())
        .collect();
    assert_eq!(catalog, nvidia);
}

#[test]
fn a100_40gb_matches_the_reference_table() {
    let all: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
    assert_rows(
        "a100-40gb",
        &[
            ("1g.5gb", 0, 19, 7, 14, 4864, all, 1),
            ("1g.5gb+me", 7, 20, 1, 14, 4864, all, 1),
            ("1g.10gb", 9, 15, 4, 14, 9856, &[0, 2, 4, 6], 2),
            ("2g.10gb", 1, 14, 3, 28, 9856, &[0, 2, 4], 2),
            ("3g.20gb", 2, 9, 2, 42, 19968, &[0, 4], 4),
            ("4g.20gb", 3, 5, 1, 56, 19968, &[0], 4),
            ("7g.40gb", 4, 0, 1, 98, 40192, &[0], 8),
        ],
    );
    let model = model_by_simulator_name("a100-40gb").unwrap();
    assert_eq!(model.sm_count, 108);
    assert_eq!(model.compute_capability.to_string(), "8.0");
    assert_eq!((model.compute_slices, model.memory_slices), (7, 8));
}

#[test]
fn a100_80gb_matches_the_reference() {
    let all: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
    assert_rows(
        "a100-80gb",
        &[
            ("1g.10gb", 0, 19, 7, 14, 9728, all, 1),
            ("1g.10gb+me", 7, 20, 1, 14, 9728, all, 1),
            ("1g.20gb", 9, 15, 4, 14, 19456, &[0, 2, 4, 6], 2),
            ("2g.20gb", 1, 14, 3, 28, 19456, &[0, 2, 4], 2),
            ("3g.40gb", 2, 9, 2, 42, 40192, &[0, 4], 4),
            ("4g.40gb", 3, 5, 1, 56, 40192, &[0], 4),
            ("7g.80gb", 4, 0, 1, 98, 80896, &[0], 8),
        ],
    );
}

#[test]
fn h100_matches_the_reference_with_gib_converted() {
    assert_eq!(profile_of("h100-80gb", "1g.10gb").memory_mib, 9984);
    assert_eq!(profile_of("h100-80gb", "1g.20gb").memory_mib, 20096);
    assert_eq!(profile_of("h100-80gb", "3g.40gb").memory_mib, 40448);
    assert_eq!(profile_of("h100-80gb", "7g.80gb").memory_mib, 81152);
    let ids: Vec<(String, u32, u32, u32)> = model_by_simulator_name("h100-80gb")
        .unwrap()
        .profiles
        .iter()
        .map(|p| (p.name.to_string(), p.id, p.max_instances, p.sm_count))
        .collect();
    let expected = [
        ("1g.10gb", 19, 7, 16),
        ("1g.10gb+me", 20, 1, 16),
        ("1g.20gb", 15, 4, 26),
        ("2g.20gb", 14, 3, 32),
        ("3g.40gb", 9, 2, 60),
        ("4g.40gb", 5, 1, 64),
        ("7g.80gb", 0, 1, 132),
    ];
    let expected: Vec<(String, u32, u32, u32)> = expected
        .iter()
        .map(|(name, id, max, sms)| ((*name).to_owned(), *id, *max, *sms))
        .collect();
    assert_eq!(ids, expected);
    assert_eq!(
        model_by_simulator_name("h100-80gb")
            .unwrap()
            .compute_capability
            .to_string(),
        "9.0"
    );
}

#[test]
fn h200_and_a30_have_the_reference_names_and_counts() {
    assert_eq!(
        names("h200"),
        owned(&[
            ("1g.18gb", 7),
            ("1g.18gb+me", 1),
            ("1g.35gb", 4),
            ("2g.35gb", 3),
            ("3g.71gb", 2),
            ("4g.71gb", 1),
            ("7g.141gb", 1)
        ])
    );
    assert_eq!(
        names("a30"),
        owned(&[
            ("1g.6gb", 4),
            ("1g.6gb+me", 1),
            ("2g.12gb", 2),
            ("2g.12gb+me", 1),
            ("4g.24gb", 1)
        ])
    );
    let a30 = model_by_simulator_name("a30").unwrap();
    assert_eq!((a30.compute_slices, a30.memory_slices), (4, 4));
}

/// The names NVIDIA's default config gives each 7-slice model, smallest first, with the A100 layout's counts.
#[test]
fn seven_slice_models_have_the_names_of_nvidias_default_config() {
    let layout = |one: u16, two: u16, four: u16, eight: u16| {
        owned(&[
            (&format!("1g.{one}gb"), 7),
            (&format!("1g.{one}gb+me"), 1),
            (&format!("1g.{two}gb"), 4),
            (&format!("2g.{two}gb"), 3),
            (&format!("3g.{four}gb"), 2),
            (&format!("4g.{four}gb"), 1),
            (&format!("7g.{eight}gb"), 1),
        ])
    };
    for (model, sizes) in [
        ("pg506-96gb", (12, 24, 48, 96)),
        ("h100-94gb", (12, 24, 47, 94)),
        ("h100-96gb", (12, 24, 48, 96)),
        ("h20", (12, 24, 48, 96)),
        ("gh200-144gb", (18, 36, 72, 144)),
        ("b200", (23, 45, 90, 180)),
        ("gb200", (23, 47, 93, 186)),
        ("b300", (34, 67, 135, 269)),
        ("gb300", (35, 70, 139, 278)),
    ] {
        assert_eq!(
            names(model),
            layout(sizes.0, sizes.1, sizes.2, sizes.3),
            "{model}"
        );
    }
    let capability = |model: &str| {
        model_by_simulator_name(model)
            .unwrap()
            .compute_capability
            .to_string()
    };
    assert_eq!(capability("b200"), "10.0");
    assert_eq!(capability("gh200-144gb"), "9.0");
    assert_eq!(capability("pg506-96gb"), "8.0");
}

#[test]
fn rtx_pro_6000_has_the_graphics_and_media_variants() {
    let quarters: &[u8] = &[0, 1, 2, 3];
    let halves: &[u8] = &[0, 2];
    assert_rows(
        "rtx-pro-6000",
        &[
            ("1g.24gb", 0, 14, 4, 46, 24320, quarters, 1),
            ("1g.24gb+me.all", 15, 21, 1, 46, 24320, quarters, 1),
            ("1g.24gb+gfx", 10, 47, 4, 46, 24320, quarters, 1),
            ("1g.24gb-me", 13, 48, 4, 46, 24320, quarters, 1),
            ("2g.48gb", 1, 5, 2, 92, 48640, halves, 2),
            ("2g.48gb+me.all", 16, 6, 1, 92, 48640, halves, 2),
            ("2g.48gb+gfx", 11, 49, 2, 92, 48640, halves, 2),
            ("2g.48gb-me", 14, 50, 2, 92, 48640, halves, 2),
            ("4g.96gb", 3, 0, 1, 184, 97280, &[0], 4),
            ("4g.96gb+gfx", 12, 51, 1, 184, 97280, &[0], 4),
        ],
    );
    let model = model_by_simulator_name("rtx-pro-6000").unwrap();
    assert_eq!(model.compute_capability.to_string(), "12.0");
    assert_eq!((model.compute_slices, model.memory_slices), (4, 4));
}

/// The derivation rules reproduce the reference where the reference has values.
#[test]
fn derivation_rules_match_the_reference_where_it_speaks() {
    assert_eq!(memory_slice_mib(40960, 8), 4864);
    assert_eq!(sms_per_slice(108, 7), 14);
    assert_eq!(sms_per_slice(148, 7), 20);
}

/// Placements must stay inside the memory slices, and the listed starts must allow max instances side by side;
/// names, NVML indices and ids are unique within a model, and ids across models are unique.
#[test]
fn every_profile_fits_its_model() {
    let mut simulator_names = BTreeSet::new();
    for model in models() {
        assert!(simulator_names.insert(model.simulator_name));
        assert!(!model.sources.is_empty());
        let full = model.profiles.iter().map(|p| p.sm_count).max().unwrap();
        let distinct = |values: Vec<String>| values.iter().collect::<BTreeSet<_>>().len();
        let count = model.profiles.len();
        assert_eq!(
            distinct(model.profiles.iter().map(|p| p.name.to_string()).collect()),
            count
        );
        assert_eq!(
            distinct(model.profiles.iter().map(|p| p.id.to_string()).collect()),
            count
        );
        assert_eq!(
            distinct(
                model
                    .profiles
                    .iter()
                    .map(|p| p.nvml_index.to_string())
                    .collect()
            ),
            count
        );
        for profile in model.profiles {
            assert!(profile.name.slices <= model.compute_slices, "{profile:?}");
            assert!(profile.memory_mib < model.memory_mib, "{profile:?}");
            assert!(
                profile.sm_count <= full && full <= model.sm_count,
                "{profile:?}"
            );
            for start in profile.placement_starts {
                assert!(
                    start + profile.placement_size <= model.memory_slices,
                    "{profile:?}"
                );
            }
            let disjoint = profile
                .placement_starts
                .windows(2)
                .all(|pair| pair[0] + profile.placement_size <= pair[1]);
            if disjoint {
                assert!(
                    profile.placement_starts.len() as u32 >= profile.max_instances,
                    "{profile:?}"
                );
            }
        }
    }
}

#[test]
fn lookups_find_each_model() {
    for (id, name) in [
        (0x20B0_10DE, "a100-40gb"),
        (0x20F6_10DE, "a100-40gb"),
        (0x20B5_10DE, "a100-80gb"),
        (0x2324_10DE, "h100-80gb"),
        (0x233A_10DE, "h100-94gb"),
        (0x2342_10DE, "h100-96gb"),
        (0x2335_10DE, "h200"),
        (0x233B_10DE, "h200"),
        (0x2941_10DE, "gb200"),
        (0x2BB5_10DE, "rtx-pro-6000"),
    ] {
        assert_eq!(model_by_pci_device_id(id).unwrap().simulator_name, name);
    }
    assert!(model_by_pci_device_id(0x1234_10DE).is_none());
    assert_eq!(
        model_by_product_name("NVIDIA H100 80GB HBM3")
            .unwrap()
            .simulator_name,
        "h100-80gb"
    );
    assert_eq!(
        model_by_product_name("NVIDIA A100 80GB PCIe")
            .unwrap()
            .simulator_name,
        "a100-80gb"
    );
    assert!(model_by_product_name("NVIDIA A30X").is_none());
    for model in models() {
        assert_eq!(model_by_simulator_name(model.simulator_name), Some(model));
        assert_eq!(model_by_product_name(model.product_name()), Some(model));
    }
    let a100 = model_by_simulator_name("a100-40gb").unwrap();
    assert_eq!(a100.product_name(), "NVIDIA A100-SXM4-40GB");
    assert!(a100.profile_by_name("1g.10gb+me").is_none());
    assert!(a100.profile_by_name("not a profile").is_none());
}

/// `docs/mig-catalog.md` as the catalog prints it.
fn catalog_markdown() -> String {
    let mut doc = String::from(
        "# MIG catalog\n\n\
         The MIG-capable GPU models the operator knows (`crates/crd/src/mig/catalog/`): the simulator simulates each \
         of them by its simulator name (`--simulate b200:8`), the mig-parted config validator checks profiles \
         against them, and the planner places instances with their placements. Generated from the catalog by \
         `UPDATE_DOCS=1 cargo test -p crd catalog_doc`; a test fails when this file and the catalog differ.\n\n\
         Sources: the project's reference tables (from `nvidia-smi mig -lgip`), NVIDIA's MIG user guide (\"Supported \
         GPUs\": compute capability, memory size, most instances; \"Supported MIG Profiles\": names, fractions, \
         counts) and NVIDIA's default mig-parted config of gpu-operator v26.7.0 (which device ids take which \
         profiles and how many). Values none of them give are derived by the rules below and say so in each model's \
         sources. On real hardware the MIG manager checks each profile's id, slices and count against what NVML \
         reports before it creates instances, and stops with an error if they differ. A GPU is matched to its model by \
         PCI device id; product names are what the simulator reports.\n\n\
         Derivation rules: memory of one memory slice = total / memory slices, rounded down to 256 MiB, less 256 MiB \
         (the A100-40GB's reference values follow this rule); SMs of one compute slice = SMs / compute slices, \
         rounded down to an even number; a profile of `n` slices has `n` times a slice's SMs and memory; ids, NVML \
         indices, counts and placements of 7-slice parts are the A100's.\n\n\
         How mig-parted configs are checked (`crates/crd/src/config/mig_parted/`): each named config on its own, so \
         one invalid config never stops the others of the file from being applied; the operator reports each \
         invalid config by name and entry in the MIG manager's status, and a node that selects it fails with the \
         same reason. A profile that a model named by an entry's `device-filter` lacks is an error naming the model \
         and its profiles. An entry whose filter names only device ids this catalog does not know, and an entry \
         without a filter, are left to the node, which plans them for the GPU it has. The built-in default config \
         holds every config of NVIDIA's default with the same geometry for every device id (a test compares them).\n\n\
         Columns: NVML index is the `NVML_GPU_INSTANCE_PROFILE_*` constant; id is what `nvidia-smi mig -lgip` prints \
         and create calls take; placements are memory-slice starts, each `start:size`.\n",
    );
    for model in models() {
        let ids: Vec<String> = model
            .pci_device_ids
            .iter()
            .map(|id| format!("`0x{id:08X}`"))
            .collect();
        let _ = write!(
            doc,
            "\n## {}\n\n\
             - simulator name: `{}`\n\
             - product names (NVML): {}\n\
             - PCI device ids: {}\n\
             - compute capability {}, {} SMs, {} MiB\n\
             - {} compute slices, {} memory slices\n\
             - sources: {}\n\n\
             | profile | NVML index | id | max instances | SMs | memory MiB | placements |\n\
             |---|---|---|---|---|---|---|\n",
            model.product_name(),
            model.simulator_name,
            model.product_names.join(", "),
            ids.join(", "),
            model.compute_capability,
            model.sm_count,
            model.memory_mib,
            model.compute_slices,
            model.memory_slices,
            model.sources,
        );
        for profile in model.profiles {
            let placements: Vec<String> = profile
                .placement_starts
                .iter()
                .map(|start| format!("{start}:{}", profile.placement_size))
                .collect();
            let _ = writeln!(
                doc,
                "| `{}` | {} | {} | {} | {} | {} | {} |",
                profile.name,
                profile.nvml_index,
                profile.id,
                profile.max_instances,
                profile.sm_count,
                profile.memory_mib,
                placements.join(", "),
            );
        }
    }
    doc
}

#[test]
fn catalog_doc_matches_the_catalog() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/mig-catalog.md");
    let expected = catalog_markdown();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(path, &expected).unwrap();
    }
    let actual = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        actual == expected,
        "docs/mig-catalog.md differs from the catalog; run UPDATE_DOCS=1 cargo test -p crd catalog_doc"
    );
}

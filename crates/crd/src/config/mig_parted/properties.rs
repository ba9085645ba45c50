//! Property tests of the mig-parted parser: any text is parsed or refused without a panic, and what is accepted is
//! bounded (at most [`MAX_MIG_DEVICES_PER_GPU`] devices an entry) and reads back the same once written out.

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Value, json};

use super::{MigPartedConfig, parse};
use crate::config::label_value_problem;
use crate::config::mutation::{count_around, mutated, object};
use crate::mig::{DEFAULT_MIG_CONFIG, MAX_MIG_DEVICES_PER_GPU};

/// Cases of the properties on generated text, a few milliseconds each in a debug build.
const CASES: u32 = 256;
/// Cases of the property on NVIDIA's files, which are long (their configs for every model): about 15 ms each.
const FILE_CASES: u32 = 64;

/// NVIDIA's default file, ours, and a small one with compute-instance profiles.
fn seeds() -> Vec<&'static str> {
    vec![
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/nvidia/default-mig-parted-config.yaml"
        )),
        DEFAULT_MIG_CONFIG,
        "version: v1\nmig-configs:\n  custom:\n    - devices: [0, 1]\n      device-filter: \"0x20B010DE\"\n      \
         mig-enabled: true\n      mig-devices: {\"1c.3g.20gb\": 2, \"1g.5gb\": 1}\n    - devices: all\n      \
         mig-enabled: false\n",
    ]
}

/// A count: around the bounds (1 to 7), and the extremes.
fn count() -> impl Strategy<Value = i64> {
    count_around(-1..=9)
}

/// A profile name: catalog names, names of the right shape, and anything.
fn profile() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "1g.5gb",
            "1g.5gb+me",
            "2g.10gb",
            "3g.20gb",
            "1c.3g.20gb",
            "7g.80gb",
            "1g.10gb",
            "4g.24gb"
        ])
        .prop_map(str::to_owned),
        "[0-9]{1,3}(c\\.[0-9])?g\\.[0-9]{1,6}gb(\\+me|-me|\\+gfx)?",
        "\\PC{0,12}",
    ]
}

/// One entry, with every field optional and every value drawn from good and bad ones.
fn entry() -> impl Strategy<Value = Value> {
    let devices = prop_oneof![
        Just(json!("all")),
        prop::collection::vec(-1_i64..9, 0..4).prop_map(Value::from),
        "\\PC{0,6}".prop_map(Value::from),
    ];
    let filter = prop_oneof![
        select(vec!["0x20B010DE", "0x233010DE", "0x999910DE", "0x20b710de"]).prop_map(Value::from),
        "\\PC{0,10}".prop_map(Value::from),
    ];
    let counts = prop::collection::btree_map(profile(), count(), 0..5);
    (
        prop::option::weighted(0.9, devices),
        prop::option::of(filter),
        prop::option::weighted(0.9, any::<bool>()),
        prop::option::weighted(0.8, counts),
    )
        .prop_map(|(devices, filter, enabled, counts)| {
            object([
                ("devices", devices),
                ("device-filter", filter),
                ("mig-enabled", enabled.map(Value::from)),
                ("mig-devices", counts.map(|counts| json!(counts))),
            ])
        })
}

/// A whole file of named configs, as JSON text (which YAML reads).
fn document() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        4 => "[a-z0-9][a-z0-9.-]{0,12}[a-z0-9]",
        1 => "\\PC{0,70}",
    ];
    prop::collection::btree_map(name, prop::collection::vec(entry(), 0..3), 1..4)
        .prop_map(|configs| json!({"version": "v1", "mig-configs": configs}).to_string())
}

/// What every accepted config satisfies, and that it reads back the same when written out.
fn check_accepted(config: &MigPartedConfig) -> Result<(), TestCaseError> {
    for (name, entries) in &config.mig_configs {
        prop_assert_eq!(label_value_problem(name), None, "{}", name);
        prop_assert!(!entries.is_empty(), "{}", name);
        for entry in entries {
            let counts = entry.mig_devices.clone().unwrap_or_default();
            prop_assert!(
                counts
                    .values()
                    .all(|count| (1..=MAX_MIG_DEVICES_PER_GPU).contains(count)),
                "{:?}",
                counts
            );
            prop_assert!(counts.values().sum::<u32>() <= MAX_MIG_DEVICES_PER_GPU);
        }
    }
    if !config.mig_configs.is_empty() {
        let written = serde_json::to_string(config)
            .map_err(|error| TestCaseError::fail(error.to_string()))?;
        let read = parse(&written).map_err(|error| TestCaseError::fail(error.to_string()))?;
        prop_assert!(read.problems.is_empty(), "{:?}", read.problems);
        prop_assert_eq!(&read.config, config);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Structured files: every named config is either accepted and bounded, or refused with its path; a count
    /// outside 1 to 7 never gets through.
    #[test]
    fn generated_configs_are_accepted_bounded_or_refused_by_name(text in document()) {
        // Only a whole-file problem fails the parse, and these files have none: a version and at least one config.
        let parsed = parse(&text).map_err(|error| TestCaseError::fail(error.to_string()))?;
        check_accepted(&parsed.config)?;
        let written: Value = serde_json::from_str(&text).unwrap();
        for (name, entries) in written["mig-configs"].as_object().unwrap() {
            let accepted = parsed.config.mig_configs.contains_key(name);
            prop_assert_ne!(accepted, parsed.problems.contains_key(name), "{}", name);
            if let Some(problem) = parsed.problems.get(name) {
                prop_assert!(problem.path().starts_with("mig-configs."), "{}", problem);
            }
            let out_of_bounds = entries.as_array().unwrap().iter().any(|entry| {
                entry["mig-devices"].as_object().is_some_and(|counts| {
                    counts.values().any(|count| {
                        count.as_i64().is_some_and(|count| {
                            !(1..=i64::from(MAX_MIG_DEVICES_PER_GPU)).contains(&count)
                        })
                    })
                })
            });
            prop_assert!(!(accepted && out_of_bounds), "{} accepted with {}", name, entries);
        }
    }

    /// Any text at all.
    #[test]
    fn any_text_is_parsed_or_refused(text in "\\PC{0,300}") {
        if let Ok(parsed) = parse(&text) {
            check_accepted(&parsed.config)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(FILE_CASES))]

    /// NVIDIA's files with random edits: parsed or refused, never a panic; what is accepted is bounded.
    #[test]
    fn mutated_files_are_parsed_or_refused(text in mutated(seeds())) {
        if let Ok(parsed) = parse(&text) {
            check_accepted(&parsed.config)?;
        }
    }
}

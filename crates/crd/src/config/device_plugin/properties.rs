//! Property tests of the device-plugin config parser: any text is parsed or refused without a panic, and what is
//! accepted is bounded (replicas from 2 to [`MAX_REPLICAS`], at most [`MAX_MPS_REPLICAS`] under MPS) and reads back
//! the same once written out.

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Value, json};

use super::{DevicePluginConfig, MAX_MPS_REPLICAS, MAX_REPLICAS, parse, parse_tolerant};
use crate::config::mutation::{count_around, mutated, object};

/// Cases per property, a few milliseconds each in a debug build.
const CASES: u32 = 256;
/// Cases of the property of many unknown keys, which reads a file up to 65 times.
const UNKNOWN_KEYS_CASES: u32 = 48;

/// NVIDIA's example files.
fn seeds() -> Vec<&'static str> {
    macro_rules! nvidia {
        ($($name:literal),+) => {
            vec![$(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/nvidia/", $name))),+]
        };
    }
    nvidia!(
        "device-plugin-cli-options-in-config.yaml",
        "device-plugin-every-flag.yaml",
        "device-plugin-mps-rename.yaml",
        "device-plugin-mps.yaml",
        "device-plugin-readme-config0.yaml",
        "device-plugin-readme-config1.yaml",
        "device-plugin-time-slicing-rename.yaml",
        "device-plugin-time-slicing.yaml"
    )
}

/// Replicas: around the lower bound and the upper ones (100 under MPS, 256), and the extremes.
fn replicas() -> impl Strategy<Value = i64> {
    prop_oneof![count_around(-1..=12), count_around(90..=300)]
}

/// A resource name, good or not.
fn resource_name() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "nvidia.com/gpu",
            "gpu",
            "nvidia.com/mig-1g.5gb",
            "mig-3g.20gb",
            "example.com/gpu"
        ])
        .prop_map(str::to_owned),
        "[a-z0-9.-]{0,70}",
        "\\PC{0,12}",
    ]
}

/// One replicated resource, with every field optional.
fn shared_resource() -> impl Strategy<Value = Value> {
    let devices = prop_oneof![
        Just(json!("all")),
        (-1_i64..5).prop_map(Value::from),
        prop::collection::vec(
            prop_oneof![
                (0_i64..4).prop_map(Value::from),
                select(vec![
                    "0",
                    "0:1",
                    "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763",
                    "x"
                ])
                .prop_map(Value::from),
            ],
            0..3
        )
        .prop_map(Value::from),
    ];
    (
        resource_name(),
        prop::option::weighted(0.3, resource_name()),
        prop::option::weighted(0.5, devices),
        prop::option::weighted(0.95, replicas()),
    )
        .prop_map(|(name, rename, devices, replicas)| {
            object([
                ("name", Some(Value::from(name))),
                ("rename", rename.map(Value::from)),
                ("devices", devices),
                ("replicas", replicas.map(Value::from)),
            ])
        })
}

/// A whole config as JSON text (which YAML reads), with an unknown key now and then.
fn document() -> impl Strategy<Value = String> {
    let sharing = || {
        (
            any::<bool>(),
            prop::collection::vec(shared_resource(), 0..3),
        )
            .prop_map(
                |(rename, resources)| json!({"renameByDefault": rename, "resources": resources}),
            )
    };
    let mapping = ("\\PC{0,20}", resource_name())
        .prop_map(|(pattern, name)| json!({"pattern": pattern, "name": name}));
    (
        prop::option::of(select(vec!["none", "single", "mixed", "all"])),
        prop::option::weighted(0.3, prop::collection::vec(mapping, 0..3)),
        prop::option::of(sharing()),
        prop::option::weighted(0.3, sharing()),
        prop::option::weighted(0.2, "[a-zA-Z]{1,8}"),
    )
        .prop_map(|(strategy, gpus, time_slicing, mps, unknown)| {
            let mut config = json!({"version": "v1", "flags": {}, "sharing": {}});
            if let Some(strategy) = strategy {
                config["flags"]["migStrategy"] = json!(strategy);
            }
            if let Some(gpus) = gpus {
                config["resources"] = json!({"gpus": gpus});
            }
            if let Some(time_slicing) = time_slicing {
                config["sharing"]["timeSlicing"] = time_slicing;
            }
            if let Some(mps) = mps {
                config["sharing"]["mps"] = mps;
            }
            if let Some(unknown) = unknown {
                config["flags"][unknown] = json!(1);
            }
            config.to_string()
        })
}

/// What every accepted config satisfies, and that it reads back the same when written out.
fn check_accepted(config: &DevicePluginConfig) -> Result<(), TestCaseError> {
    if let Some(sharing) = &config.sharing {
        for (shared, most) in [
            (&sharing.time_slicing, MAX_REPLICAS),
            (&sharing.mps, MAX_MPS_REPLICAS),
        ] {
            for resource in shared.iter().flat_map(|shared| &shared.resources) {
                prop_assert!(
                    (2..=most).contains(&resource.replicas),
                    "{}",
                    resource.replicas
                );
            }
        }
    }
    for mapping in config
        .resources
        .iter()
        .flat_map(|resources| resources.gpus.iter().chain(&resources.mig))
    {
        prop_assert!(!mapping.pattern.is_empty());
    }
    let written =
        serde_json::to_string(config).map_err(|error| TestCaseError::fail(error.to_string()))?;
    let read =
        parse(&written).map_err(|error| TestCaseError::fail(format!("{error}: {written}")))?;
    prop_assert_eq!(&read, config);
    Ok(())
}

/// Whether a generated config asks for replicas out of bounds anywhere.
fn replicas_out_of_bounds(text: &str) -> bool {
    let config: Value = serde_json::from_str(text).unwrap_or_default();
    [("timeSlicing", MAX_REPLICAS), ("mps", MAX_MPS_REPLICAS)]
        .into_iter()
        .any(|(section, most)| {
            config["sharing"][section]["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|resource| resource["replicas"].as_i64())
                .any(|replicas| !(2..=i64::from(most)).contains(&replicas))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Structured configs: accepted and bounded, or refused; replicas out of bounds never get through.
    #[test]
    fn generated_configs_are_accepted_bounded_or_refused(text in document()) {
        match parse_tolerant(&text) {
            Ok(parsed) => {
                prop_assert!(!replicas_out_of_bounds(&text), "{}", text);
                prop_assert!(parsed.unknown_keys.len() <= 1, "{:?}", parsed.unknown_keys);
                check_accepted(&parsed.config)?;
            }
            Err(error) => prop_assert!(!error.to_string().is_empty()),
        }
    }

    /// NVIDIA's files with random edits: parsed or refused, never a panic; what is accepted is bounded.
    #[test]
    fn mutated_files_are_parsed_or_refused(text in mutated(seeds())) {
        if let Ok(config) = parse(&text) {
            check_accepted(&config)?;
        }
    }

    /// Any text at all.
    #[test]
    fn any_text_is_parsed_or_refused(text in "\\PC{0,300}") {
        if let Ok(config) = parse(&text) {
            check_accepted(&config)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(UNKNOWN_KEYS_CASES))]

    /// A file of many unknown keys is read in a bounded number of rounds: up to the bound they are listed, past it
    /// the file is refused at the first key too many.
    #[test]
    fn unknown_keys_are_listed_up_to_the_bound(count in 0_usize..200) {
        let keys: Vec<String> = (0..count).map(|key| format!("  key{key}: 1\n")).collect();
        let text = format!("version: v1\nflags:\n{}", keys.concat());
        match parse_tolerant(&text) {
            Ok(parsed) => {
                prop_assert!(count <= super::MAX_UNKNOWN_KEYS);
                prop_assert_eq!(parsed.unknown_keys.len(), count);
            }
            Err(error) => {
                prop_assert!(count > super::MAX_UNKNOWN_KEYS);
                prop_assert!(error.to_string().contains("more than 64 keys this version does not know"), "{}", error);
            }
        }
    }
}

use super::*;

/// The Display text of the one problem of `text`: the whole file's, or that of its only invalid named config.
fn error(text: &str) -> String {
    match parse(text) {
        Err(error) => error.to_string(),
        Ok(parsed) => {
            assert_eq!(parsed.problems.len(), 1, "{parsed:?}");
            parsed.problems.values().next().unwrap().to_string()
        }
    }
}

/// The valid configs of `text`, which must have no invalid one.
fn valid(text: &str) -> MigPartedConfig {
    let parsed = parse(text).unwrap();
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    parsed.config
}

/// A config with one named config `name` holding one entry, written as YAML lines under the list item.
fn one_entry(name: &str, entry: &str) -> String {
    let indented: String = entry
        .lines()
        .map(|line| format!("      {line}\n"))
        .collect();
    format!(
        "version: v1\nmig-configs:\n  {name}:\n    - {}",
        indented.trim_start()
    )
}

#[test]
fn guide_example_parses_and_selects_entries_per_gpu() {
    let config = valid(
        r#"
version: v1
mig-configs:
  custom-config:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
    - devices: [2, 3]
      device-filter: "0x20B010DE"
      mig-enabled: false
"#,
    );
    let entries = &config.mig_configs["custom-config"];
    assert_eq!(entries[0].devices, DeviceSelector::Indices(vec![0, 1]));
    assert_eq!(entries[1].device_filter, vec![PciDeviceId(0x20B0_10DE)]);
    assert_eq!(entries[1].mig_devices, None);

    let for_gpu = |index, id| config.entries_for_gpu("custom-config", index, id).unwrap();
    assert_eq!(for_gpu(1, 0x2330_10DE), vec![&entries[0]]);
    assert_eq!(for_gpu(3, 0x20B0_10DE), vec![&entries[1]]);
    assert!(for_gpu(3, 0x2330_10DE).is_empty());
    assert!(for_gpu(4, 0x20B0_10DE).is_empty());
    assert_eq!(config.entries_for_gpu("other", 0, 0x20B0_10DE), None);
}

#[test]
fn json_input_and_serialization_round_trip() {
    let config = valid(
        r#"{"version": "v1", "mig-configs": {"all-1g.5gb": [
            {"devices": "all", "device-filter": ["0x20B010DE"], "mig-enabled": true, "mig-devices": {"1g.5gb": 7}}
        ]}}"#,
    );
    let entry = &config.mig_configs["all-1g.5gb"][0];
    assert!(entry.applies_to(5, 0x20B0_10DE));
    assert!(!entry.applies_to(0, 0x20B2_10DE));
    let json = serde_json::to_string(&config).unwrap();
    assert_eq!(
        json,
        r#"{"version":"v1","mig-configs":{"all-1g.5gb":[{"devices":"all","device-filter":["0x20B010DE"],"mig-enabled":true,"mig-devices":{"1g.5gb":7}}]}}"#
    );
    assert_eq!(valid(&json), config);
}

#[test]
fn enabled_with_empty_mig_devices_is_allowed() {
    let config = valid(&one_entry(
        "all-enabled",
        "devices: all\nmig-enabled: true\nmig-devices: {}",
    ));
    assert_eq!(
        config.mig_configs["all-enabled"][0].mig_devices,
        Some(BTreeMap::new())
    );
}

#[test]
fn unquoted_pci_id_reads_as_the_same_id() {
    let config = valid(&one_entry(
        "a",
        "devices: all\ndevice-filter: 0x20B010DE\nmig-enabled: false",
    ));
    assert_eq!(
        config.mig_configs["a"][0].device_filter,
        vec![PciDeviceId(0x20B0_10DE)]
    );
}

#[test]
fn unknown_field() {
    assert_eq!(
        error(&one_entry(
            "all-balanced",
            "devices: all\nmig-enabled: true\nmig-device: {\"1g.5gb\": 1}"
        )),
        "mig-configs.all-balanced[0].mig-device: unknown field \"mig-device\", expected one of \"devices\", \
         \"device-filter\", \"mig-enabled\", \"mig-devices\""
    );
    assert_eq!(
        error("version: v1\nmig-configs: {}\nmig-config: {}\n"),
        "mig-config: unknown field \"mig-config\", expected \"version\" or \"mig-configs\""
    );
}

#[test]
fn wrong_or_missing_version() {
    assert_eq!(
        error("version: v2\nmig-configs: {}\n"),
        "version: unsupported version \"v2\", expected \"v1\""
    );
    assert_eq!(
        error("mig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n"),
        "missing field \"version\""
    );
}

#[test]
fn missing_required_fields() {
    assert_eq!(
        error(&one_entry("x", "devices: all")),
        "mig-configs.x[0]: missing field \"mig-enabled\""
    );
    assert_eq!(
        error(&one_entry("x", "mig-enabled: false")),
        "mig-configs.x[0]: missing field \"devices\""
    );
    assert_eq!(error("version: v1\n"), "missing field \"mig-configs\"");
    assert_eq!(
        error(&one_entry("x", "devices: all\nmig-enabled: true")),
        "mig-configs.x[0]: missing field \"mig-devices\" (required when mig-enabled is true; write mig-devices: {} \
         to enable MIG without creating instances)"
    );
}

#[test]
fn empty_configs_and_unusable_names() {
    assert_eq!(
        error("version: v1\nmig-configs: {}\n"),
        "mig-configs: define at least one named config, e.g. all-disabled"
    );
    assert_eq!(
        error("version: v1\nmig-configs:\n  x: []\n"),
        "mig-configs.x: list at least one entry (devices, mig-enabled, mig-devices)"
    );
    assert_eq!(
        error(&one_entry("-x", "devices: all\nmig-enabled: false")),
        "mig-configs.-x: \"-x\" cannot be selected with the nvidia.com/mig.config label: it must start and end \
         with a letter or digit"
    );
}

#[test]
fn mig_devices_on_a_disabled_entry() {
    assert_eq!(
        error(&one_entry(
            "custom",
            "devices: all\nmig-enabled: false\nmig-devices: {\"1g.5gb\": 1}"
        )),
        "mig-configs.custom[0].mig-devices: must be empty when mig-enabled is false (remove mig-devices or set \
         mig-enabled: true)"
    );
    valid(&one_entry(
        "custom",
        "devices: all\nmig-enabled: false\nmig-devices: {}",
    ));
}

/// An entry without a filter applies to whatever GPU a node has, which may be newer than the catalog: the node
/// checks it, not the parser.
#[test]
fn unfiltered_entries_are_left_to_the_node() {
    for devices in ["{\"3g.25gb\": 1}", "{\"1g.5gb\": 7}", "{\"7g.80gb\": 2}"] {
        valid(&one_entry(
            "all-balanced",
            &format!("devices: all\nmig-enabled: true\nmig-devices: {devices}"),
        ));
    }
}

#[test]
fn unknown_profile_with_filter_lists_that_models_profiles() {
    assert_eq!(
        error(&one_entry(
            "all-balanced",
            "devices: all\ndevice-filter: [\"0x20B010DE\"]\nmig-enabled: true\nmig-devices: {\"3g.25gb\": 1}"
        )),
        "mig-configs.all-balanced[0].mig-devices: unknown profile \"3g.25gb\" for NVIDIA A100-SXM4-40GB (known \
         profiles: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)"
    );
    // Each model the filter names must have the profile: 1g.5gb exists on the A100-40GB but not on the H100.
    assert_eq!(
        error(&one_entry(
            "mixed",
            "devices: all\ndevice-filter: [\"0x20B010DE\", \"0x233010DE\"]\nmig-enabled: true\n\
             mig-devices: {\"1g.5gb\": 1}"
        )),
        "mig-configs.mixed[0].mig-devices: unknown profile \"1g.5gb\" for NVIDIA H100 80GB HBM3 (known profiles: \
         1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"
    );
}

/// A filter that names only models the catalog does not know is accepted with any well-formed profile; one that
/// names a known model too is checked for that model.
#[test]
fn filter_of_unknown_models_is_left_to_the_node() {
    let config = valid(&one_entry(
        "future",
        "devices: all\ndevice-filter: \"0x999910DE\"\nmig-enabled: true\nmig-devices: {\"1g.99gb+gfx\": 7}",
    ));
    assert!(config.mig_configs.contains_key("future"));
    assert_eq!(
        error(&one_entry(
            "mixed",
            "devices: all\ndevice-filter: [\"0x999910DE\", \"0x20B710DE\"]\nmig-enabled: true\n\
             mig-devices: {\"1g.99gb\": 1}"
        )),
        "mig-configs.mixed[0].mig-devices: unknown profile \"1g.99gb\" for NVIDIA A30 (known profiles: 1g.6gb, \
         1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb)"
    );
}

#[test]
fn compute_instance_profiles_are_checked_by_their_gpu_instance() {
    let config = valid(&one_entry(
        "ci",
        "devices: all\ndevice-filter: \"0x20B010DE\"\nmig-enabled: true\nmig-devices: {\"1c.3g.20gb\": 2}",
    ));
    let counts = config.mig_configs["ci"][0].mig_devices.clone().unwrap();
    assert_eq!(
        counts.keys().map(ToString::to_string).collect::<Vec<_>>(),
        ["1c.3g.20gb"]
    );
}

#[test]
fn counts_beyond_the_model_are_refused() {
    assert_eq!(
        error(&one_entry(
            "x",
            "devices: all\ndevice-filter: \"0x20B010DE\"\nmig-enabled: true\nmig-devices: {\"3g.20gb\": 3}"
        )),
        "mig-configs.x[0].mig-devices: \"3g.20gb\": 3 instances do not fit on NVIDIA A100-SXM4-40GB, which holds \
         at most 2"
    );
}

/// The bound holds on every GPU, known or not: a count near `u32::MAX` is refused while the file is read, so that
/// no later step (the planner expands counts into one entry per device) ever sees it.
#[test]
fn counts_beyond_any_gpu_are_refused_whatever_the_filter() {
    for (filter, count) in [
        ("", "4294967295"),
        ("device-filter: \"0x999910DE\"\n", "8"),
        ("device-filter: \"0x20B010DE\"\n", "4294967296"),
        ("", "9223372036854775807"),
    ] {
        assert_eq!(
            error(&one_entry(
                "x",
                &format!(
                    "devices: all\n{filter}mig-enabled: true\nmig-devices: {{\"1g.5gb\": {count}}}"
                )
            )),
            format!(
                "mig-configs.x[0].mig-devices: \"1g.5gb\": {count} is more MIG devices than a GPU holds, use at \
                 most 7"
            )
        );
    }
}

/// Counts that each fit but add up to more devices than a GPU holds are refused before any model is consulted.
#[test]
fn counts_that_add_up_beyond_any_gpu_are_refused() {
    assert_eq!(
        error(&one_entry(
            "x",
            "devices: all\nmig-enabled: true\nmig-devices: {\"1g.5gb\": 7, \"1g.10gb\": 7, \"2g.10gb\": 1}"
        )),
        "mig-configs.x[0].mig-devices: 15 MIG devices in all, more than a GPU holds: use at most 7 per entry"
    );
    let config = valid(&one_entry(
        "x",
        "devices: all\nmig-enabled: true\nmig-devices: {\"1g.5gb\": 3, \"2g.10gb\": 2}",
    ));
    assert!(config.mig_configs.contains_key("x"));
}

#[test]
fn malformed_profile_name() {
    assert_eq!(
        error(&one_entry(
            "x",
            "devices: all\nmig-enabled: true\nmig-devices: {\"3gb\": 1}"
        )),
        "mig-configs.x[0].mig-devices: invalid profile name \"3gb\" (expected <G>g.<GB>gb, e.g. 1g.5gb)"
    );
    assert_eq!(
        error(&one_entry(
            "x",
            "devices: all\nmig-enabled: true\nmig-devices: {\"3g.20gb\": 1, \"3c.3g.20gb\": 1}"
        )),
        "mig-configs.x[0].mig-devices: \"3c.3g.20gb\" and \"3g.20gb\" are the same profile; list it once"
    );
}

#[test]
fn counts_below_one() {
    for count in ["0", "-1"] {
        assert_eq!(
            error(&one_entry(
                "x",
                &format!("devices: all\nmig-enabled: true\nmig-devices: {{\"1g.5gb\": {count}}}")
            )),
            format!(
                "mig-configs.x[0].mig-devices: \"1g.5gb\": {count} is not a valid count, use at least 1 or remove \
                 the profile"
            )
        );
    }
    assert_eq!(
        error(&one_entry(
            "x",
            "devices: all\nmig-enabled: true\nmig-devices: {\"1g.5gb\": many}"
        )),
        "mig-configs.x[0].mig-devices.1g.5gb: invalid type: string \"many\", expected i64"
    );
}

#[test]
fn bad_device_lists() {
    assert_eq!(
        error(&one_entry("x", "devices: [0, 1, 1]\nmig-enabled: false")),
        "mig-configs.x[0].devices: GPU index 1 is listed twice; list each GPU once"
    );
    assert_eq!(
        error(&one_entry("x", "devices: [-1]\nmig-enabled: false")),
        "mig-configs.x[0].devices: -1 is not a GPU index (indices start at 0, as nvidia-smi numbers GPUs)"
    );
    assert_eq!(
        error(&one_entry("x", "devices: []\nmig-enabled: false")),
        "mig-configs.x[0].devices: the list is empty: list at least one GPU index, or use \"all\""
    );
    assert_eq!(
        error(&one_entry("x", "devices: some\nmig-enabled: false")),
        "mig-configs.x[0].devices: expected \"all\" or a list of GPU indices, found \"some\""
    );
}

#[test]
fn bad_device_filters() {
    assert_eq!(
        error(&one_entry(
            "x",
            "devices: all\ndevice-filter: [\"0x20B010DE\", \"20B010DE\"]\nmig-enabled: false"
        )),
        "mig-configs.x[0].device-filter[1]: \"20B010DE\" is not a PCI device id (expected 0x followed by 8 hex \
         digits, e.g. 0x20B010DE)"
    );
    assert_eq!(
        error(&one_entry(
            "x",
            "devices: all\ndevice-filter: \"0x20B0\"\nmig-enabled: false"
        )),
        "mig-configs.x[0].device-filter: \"0x20B0\" is not a PCI device id (expected 0x followed by 8 hex digits, \
         e.g. 0x20B010DE)"
    );
    assert_eq!(
        error(&one_entry(
            "x",
            "devices: all\ndevice-filter: []\nmig-enabled: false"
        )),
        "mig-configs.x[0].device-filter: the list is empty: give at least one value, or remove the field"
    );
}

#[test]
fn yaml_syntax_error_has_line_and_column() {
    assert_eq!(
        error("version: v1\nmig-configs:\n  x:\n    - devices: all\n   mig-enabled: false\n"),
        "invalid YAML: while parsing a block mapping, did not find expected key at line 5, column 4"
    );
}

/// One invalid config among valid ones: the valid ones are kept, the invalid one is reported by name with its
/// entry, and nothing of it is kept.
#[test]
fn an_invalid_config_does_not_spoil_the_others() {
    let parsed = parse(
        r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.5gb:
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  broken:
    - devices: all
      mig-enabled: false
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.12gb": 1}
  typo:
    - devices: all
      mig-enabeld: true
"#,
    )
    .unwrap();
    assert_eq!(
        parsed.config.mig_configs.keys().collect::<Vec<_>>(),
        ["all-1g.5gb", "all-disabled"]
    );
    assert_eq!(
        parsed.problem("broken").unwrap().to_string(),
        "mig-configs.broken[1].mig-devices: unknown profile \"1g.12gb\" for NVIDIA A100-SXM4-40GB (known profiles: \
         1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)"
    );
    assert_eq!(
        parsed.problem("typo").unwrap().to_string(),
        "mig-configs.typo[0].mig-enabeld: unknown field \"mig-enabeld\", expected one of \"devices\", \
         \"device-filter\", \"mig-enabled\", \"mig-devices\""
    );
    assert_eq!(parsed.problem("all-disabled"), None);
    assert_eq!(parsed.problems.len(), 2);
}

/// A file whose every config is invalid still parses: the node that selects one fails with its reason.
#[test]
fn a_file_of_invalid_configs_still_parses() {
    let parsed = parse("version: v1\nmig-configs:\n  x: []\n  y: 3\n").unwrap();
    assert!(parsed.config.mig_configs.is_empty());
    assert_eq!(
        parsed.problem("y").unwrap().to_string(),
        "mig-configs.y: invalid type: integer \"3\", expected a sequence"
    );
}

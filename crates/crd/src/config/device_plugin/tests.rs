use std::collections::BTreeMap;
use std::time::Duration;

use super::*;

/// The Display text of the error `text` fails with.
fn error(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

/// A time-slicing config with one resource whose fields are the given YAML lines.
fn time_slicing(resource: &str) -> String {
    let indented: String = resource
        .lines()
        .map(|line| format!("        {line}\n"))
        .collect();
    format!(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - {}",
        indented.trim_start()
    )
}

/// The ConfigMap of NVIDIA's time-slicing guide: `any` and the `slice-4` / `slice-10` variants.
fn guide_config_map() -> BTreeMap<String, String> {
    let renamed = |replicas: u32| {
        format!(
            "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    \
             failRequestsGreaterThanOne: false\n    resources:\n    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
        )
    };
    BTreeMap::from([
        (
            "any".to_owned(),
            "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n    resources:\n    \
             - name: nvidia.com/gpu\n      replicas: 4\n"
                .to_owned(),
        ),
        ("slice-4".to_owned(), renamed(4)),
        ("slice-10".to_owned(), renamed(10)),
    ])
}

#[test]
fn time_slicing_guide_configs_parse() {
    let parsed = parse_config_map(&guide_config_map());
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);

    let any = &parsed.configs["any"];
    let (strategy, shared) = any.sharing.as_ref().unwrap().active().unwrap();
    assert_eq!(strategy, SharingStrategy::TimeSlicing);
    assert_eq!(strategy.label_value(), "time-slicing");
    assert_eq!(shared.resources[0].replicas, 4);
    assert_eq!(shared.resources[0].devices, ReplicatedDevices::All);
    assert_eq!(
        shared.advertised_name(&shared.resources[0]).as_str(),
        "nvidia.com/gpu"
    );
    assert!(!shared.fails_requests_greater_than_one(strategy));

    let slice_4 = &parsed.configs["slice-4"];
    let (_, shared) = slice_4.sharing.as_ref().unwrap().active().unwrap();
    assert_eq!(
        shared.advertised_name(&shared.resources[0]).as_str(),
        "nvidia.com/gpu.shared"
    );
    assert_eq!(
        slice_4.flags.as_ref().unwrap().mig_strategy,
        Some(MigStrategy::None)
    );
    let (_, shared) = parsed.configs["slice-10"]
        .sharing
        .as_ref()
        .unwrap()
        .active()
        .unwrap();
    assert_eq!(shared.resources[0].replicas, 10);
}

#[test]
fn mixed_mig_time_slicing_guide_config_parses() {
    let config = parse(
        r#"
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 8
    - name: nvidia.com/mig-1g.5gb
      replicas: 2
    - name: nvidia.com/mig-2g.10gb
      replicas: 2
    - name: nvidia.com/mig-3g.20gb
      replicas: 3
    - name: nvidia.com/mig-7g.40gb
      replicas: 7
"#,
    )
    .unwrap();
    let shared = config.sharing.unwrap().time_slicing.unwrap();
    let profile = "1g.5gb".parse().unwrap();
    assert_eq!(shared.resources[1].name, mig_resource_name(&profile));
}

#[test]
fn mps_config_parses_and_wins_over_time_slicing() {
    let config = parse(
        r#"
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 2
  mps:
    renameByDefault: true
    resources:
    - name: gpu
      devices: [0, "1", "0:1", "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763", "MIG-GPU-b1028956-cfa2-0990-bf4a-5da9abb51763/3/0"]
      replicas: 10
"#,
    )
    .unwrap();
    let sharing = config.sharing.unwrap();
    let (strategy, shared) = sharing.active().unwrap();
    assert_eq!(
        (strategy, strategy.label_value()),
        (SharingStrategy::Mps, "mps")
    );
    assert!(shared.fails_requests_greater_than_one(strategy));
    let resource = &shared.resources[0];
    assert_eq!(resource.name.as_str(), "nvidia.com/gpu");
    assert_eq!(
        resource.devices,
        ReplicatedDevices::List(vec![
            DeviceRef::Index(0),
            DeviceRef::Index(1),
            DeviceRef::MigIndex { gpu: 0, mig: 1 },
            DeviceRef::Uuid("GPU-b1028956-cfa2-0990-bf4a-5da9abb51763".to_owned()),
            DeviceRef::Uuid("MIG-GPU-b1028956-cfa2-0990-bf4a-5da9abb51763/3/0".to_owned()),
        ])
    );
    assert_eq!(
        shared.advertised_name(resource).as_str(),
        "nvidia.com/gpu.shared"
    );
}

#[test]
fn every_flag_parses_and_round_trips_through_json() {
    let config = parse(
        r#"{
  "version": "v1",
  "flags": {
    "migStrategy": "single", "failOnInitError": true, "restartOnDeviceUnhealthy": true, "mpsRoot": "/run/nvidia/mps",
    "nvidiaDriverRoot": "/", "nvidiaDevRoot": "/", "gdrcopyEnabled": false, "gdsEnabled": false, "mofedEnabled": false,
    "useNodeFeatureAPI": true, "deviceDiscoveryStrategy": "nvml",
    "plugin": {"passDeviceSpecs": true, "deviceListStrategy": ["envvar", "cdi-cri"], "deviceIDStrategy": "index",
               "cdiAnnotationPrefix": "cdi.k8s.io/", "nvidiaCTKPath": "/usr/bin/nvidia-ctk",
               "containerDriverRoot": "/driver-root", "kubeletSocket": "/var/lib/kubelet/device-plugins/kubelet.sock",
               "cdiFeatureFlags": "x"},
    "gfd": {"oneshot": false, "noTimestamp": true, "sleepInterval": "1m30s", "outputFile": "/etc/f",
            "machineTypeFile": "/sys/class/dmi/id/product_name"}
  },
  "resources": {"gpus": [{"pattern": "*A100*", "name": "a100"}], "mig": [{"pattern": "1g.5gb", "name": "mig-small"}]},
  "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "rename": "gpu-ts", "devices": 2, "replicas": 3}]}},
  "imex": {"channelIDs": [0], "required": true}
}"#,
    )
    .unwrap();
    let flags = config.flags.as_ref().unwrap();
    let plugin = flags.plugin.as_ref().unwrap();
    assert_eq!(
        plugin.device_list_strategy,
        [DeviceListStrategy::Envvar, DeviceListStrategy::CdiCri]
    );
    assert_eq!(plugin.device_id_strategy, Some(DeviceIdStrategy::Index));
    assert_eq!(
        flags.gfd.as_ref().unwrap().sleep_interval,
        Some(GoDuration(Duration::from_secs(90)))
    );
    assert_eq!(
        config.resources.as_ref().unwrap().gpus[0].name.as_str(),
        "nvidia.com/a100"
    );
    let shared = config
        .sharing
        .as_ref()
        .unwrap()
        .time_slicing
        .as_ref()
        .unwrap();
    assert_eq!(shared.resources[0].devices, ReplicatedDevices::Count(2));
    assert_eq!(
        shared.advertised_name(&shared.resources[0]).as_str(),
        "nvidia.com/gpu-ts"
    );

    let json = serde_json::to_string(&config).unwrap();
    assert_eq!(parse(&json).unwrap(), config);
}

#[test]
fn single_device_list_strategy_and_missing_version() {
    let config = parse("flags:\n  plugin:\n    deviceListStrategy: volume-mounts\n").unwrap();
    assert_eq!(config.version, crate::config::ConfigVersion::V1);
    let plugin = config.flags.unwrap().plugin.unwrap();
    assert_eq!(
        plugin.device_list_strategy,
        [DeviceListStrategy::VolumeMounts]
    );
    assert_eq!(
        parse("version: v1\n").unwrap(),
        DevicePluginConfig::default()
    );
}

#[test]
fn wrong_version() {
    assert_eq!(
        error("version: v2\n"),
        "version: unsupported version \"v2\", expected \"v1\""
    );
}

#[test]
fn bad_enum_values_name_the_allowed_ones() {
    assert_eq!(
        error("flags:\n  migStrategy: both\n"),
        "flags.migStrategy: unknown variant \"both\", expected one of \"none\", \"single\", \"mixed\""
    );
    assert_eq!(
        error("flags:\n  plugin:\n    deviceIDStrategy: serial\n"),
        "flags.plugin.deviceIDStrategy: unknown variant \"serial\", expected \"uuid\" or \"index\""
    );
    assert_eq!(
        error("flags:\n  plugin:\n    deviceListStrategy: env\n"),
        "flags.plugin.deviceListStrategy: unknown variant \"env\", expected one of \"envvar\", \"volume-mounts\", \
         \"cdi-annotations\", \"cdi-cri\""
    );
    assert_eq!(
        error("flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi]\n"),
        "flags.plugin.deviceListStrategy[1]: unknown variant \"cdi\", expected one of \"envvar\", \"volume-mounts\", \
         \"cdi-annotations\", \"cdi-cri\""
    );
    assert_eq!(
        error("flags:\n  deviceDiscoveryStrategy: wsl\n"),
        "flags.deviceDiscoveryStrategy: unknown variant \"wsl\", expected one of \"auto\", \"nvml\", \"tegra\""
    );
}

#[test]
fn unknown_keys_are_ignored_and_listed() {
    let parsed = parse_tolerant(
        "version: v1\nnewTopLevel: {a: 1}\nflags:\n  plugin:\n    passDeviceSpec: true\n    passDeviceSpecs: true\n\
         sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n      weight: 2\n",
    )
    .unwrap();
    assert_eq!(
        parsed.unknown_keys,
        [
            "flags.plugin.passDeviceSpec",
            "newTopLevel",
            "sharing.timeSlicing.resources[0].weight"
        ]
    );
    assert_eq!(
        parsed.warnings()[0],
        "flags.plugin.passDeviceSpec: unknown key, ignored"
    );
    let plugin = parsed.config.flags.unwrap().plugin.unwrap();
    assert_eq!(plugin.pass_device_specs, Some(true));
    let (_, shared) = parsed.config.sharing.as_ref().unwrap().active().unwrap();
    assert_eq!(shared.resources[0].replicas, 4);
    assert!(
        parse_tolerant("version: v1\n")
            .unwrap()
            .unknown_keys
            .is_empty()
    );
}

#[test]
fn a_misspelt_required_key_is_still_an_error() {
    assert_eq!(
        error(&time_slicing("name: nvidia.com/gpu\nreplica: 4")),
        "sharing.timeSlicing.resources[0]: missing field \"replicas\""
    );
}

#[test]
fn shared_devices_allocation_policy() {
    let policy = |text: &str| {
        parse(&format!(
            "version: v1\nflags:\n  plugin:\n    sharedDevicesAllocationPolicy: {text}\n"
        ))
        .map(|config| {
            config
                .flags
                .unwrap()
                .plugin
                .unwrap()
                .shared_devices_allocation_policy
        })
    };
    assert_eq!(policy("packed"), Ok(Some(AllocationPolicy::Packed)));
    assert_eq!(
        policy("distributed"),
        Ok(Some(AllocationPolicy::Distributed))
    );
    assert_eq!(AllocationPolicy::default(), AllocationPolicy::Distributed);
    assert_eq!(
        policy("spread").unwrap_err().to_string(),
        "flags.plugin.sharedDevicesAllocationPolicy: unknown variant \"spread\", expected \"distributed\" or \"packed\""
    );
}

#[test]
fn replicas_below_two() {
    for replicas in ["1", "0", "-3"] {
        assert_eq!(
            error(&time_slicing(&format!(
                "name: nvidia.com/gpu\nreplicas: {replicas}"
            ))),
            format!(
                "sharing.timeSlicing.resources[0].replicas: {replicas} is too small, replicas must be at least 2 \
                 (use 2 or more, or remove the sharing entry)"
            )
        );
    }
    assert_eq!(
        error(&time_slicing("name: nvidia.com/gpu")),
        "sharing.timeSlicing.resources[0]: missing field \"replicas\""
    );
}

/// Replicas are bounded while the file is read, before the plugin expands a device into one entry per replica: a
/// count near `u32::MAX` is an error naming the field and the limit, not an allocation.
#[test]
fn replicas_beyond_the_bound_are_refused_before_expansion() {
    for replicas in ["257", "4294967295", "4294967296", "9223372036854775807"] {
        assert_eq!(
            error(&time_slicing(&format!(
                "name: nvidia.com/gpu\nreplicas: {replicas}"
            ))),
            format!(
                "sharing.timeSlicing.resources[0].replicas: {replicas} is too large, replicas must be at most 256"
            )
        );
    }
    let most = parse(&time_slicing("name: nvidia.com/gpu\nreplicas: 256")).unwrap();
    let shared = most.sharing.unwrap().time_slicing.unwrap();
    assert_eq!(shared.resources[0].replicas, MAX_REPLICAS);
}

/// Each unknown key costs a read of the whole file, so a file of thousands of them is refused at the bound rather
/// than read in time that grows with the square of its size.
#[test]
fn thousands_of_unknown_keys_are_refused_at_the_bound() {
    let keys: String = (0..5_000).map(|key| format!("  key{key}: 1\n")).collect();
    let error = parse_tolerant(&format!("version: v1\nflags:\n{keys}")).unwrap_err();
    assert!(error.path().starts_with("flags.key"), "{error}");
    assert!(
        error
            .to_string()
            .ends_with("unknown key, and more than 64 keys this version does not know: is this a device-plugin config (version v1)?"),
        "{error}"
    );
}

/// MPS gives each replica a whole percent of the GPU's threads, so it takes at most 100 replicas.
#[test]
fn mps_replicas_beyond_a_whole_percent_are_refused() {
    let mps = |replicas: u32| {
        parse(&format!(
            "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n    \
             - name: nvidia.com/mig-1g.5gb\n      replicas: {replicas}\n"
        ))
    };
    assert_eq!(
        mps(101).unwrap_err().to_string(),
        "sharing.mps.resources[1].replicas: 101 is too large for MPS, replicas must be at most 100 (each replica \
         gets a whole percent of the GPU's threads); use time-slicing for more"
    );
    let most = mps(MAX_MPS_REPLICAS).unwrap().sharing.unwrap().mps.unwrap();
    assert_eq!(most.resources[1].replicas, 100);
}

#[test]
fn bad_devices() {
    assert_eq!(
        error(&time_slicing(
            "name: nvidia.com/gpu\ndevices: 0\nreplicas: 2"
        )),
        "sharing.timeSlicing.resources[0].devices: 0 is not a device count, use \"all\", a count of at least 1, or a \
         list of devices"
    );
    assert_eq!(
        error(&time_slicing(
            "name: nvidia.com/gpu\ndevices: some\nreplicas: 2"
        )),
        "sharing.timeSlicing.resources[0].devices: \"some\" is not a device selection, use \"all\", a count of at \
         least 1, or a list of devices"
    );
    assert_eq!(
        error(&time_slicing(
            "name: nvidia.com/gpu\ndevices: [0, GPU-xyz]\nreplicas: 2"
        )),
        "sharing.timeSlicing.resources[0].devices[1]: \"GPU-xyz\" is not a device, use a GPU index (0), a MIG \
         device as \"<gpu>:<mig>\" (\"0:1\"), or a UUID (GPU-... or MIG-...)"
    );
}

#[test]
fn bad_resource_names() {
    let advice = "(expected nvidia.com/<name>, where <name> is lowercase letters, digits, '-' and '.', starts and ends \
                  with a letter or digit, and the whole is at most 63 characters, e.g. nvidia.com/gpu)";
    assert_eq!(
        error(&time_slicing("name: example.com/gpu\nreplicas: 2")),
        format!(
            "sharing.timeSlicing.resources[0].name: invalid resource name \"example.com/gpu\" {advice}"
        )
    );
    assert_eq!(
        error(&time_slicing(
            "name: nvidia.com/gpu\nrename: GPU_Shared\nreplicas: 2"
        )),
        format!(
            "sharing.timeSlicing.resources[0].rename: invalid resource name \"GPU_Shared\" {advice}"
        )
    );
    assert_eq!(
        error("resources:\n  gpus:\n  - pattern: '*'\n    name: nvidia.com/Big\n"),
        format!("resources.gpus[0].name: invalid resource name \"nvidia.com/Big\" {advice}")
    );
}

#[test]
fn bad_field_types() {
    assert_eq!(
        error("sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: maybe\n"),
        "sharing.timeSlicing.failRequestsGreaterThanOne: invalid type: string \"maybe\", expected a boolean"
    );
    assert_eq!(
        error("flags:\n  gfd:\n    sleepInterval: \"60\"\n"),
        "flags.gfd.sleepInterval: \"60\" is not a duration (use a number and a unit of h, m, s, ms, us or ns, e.g. \
         60s or 1m30s)"
    );
}

#[test]
fn resources_shared_or_advertised_twice() {
    assert_eq!(
        error(
            "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n    \
             - name: gpu\n      replicas: 4\n"
        ),
        "sharing.mps.resources[1].name: \"nvidia.com/gpu\" is already shared by resources[0]; list each resource once"
    );
    assert_eq!(
        error(
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      rename: shared\n      \
             replicas: 2\n    - name: nvidia.com/mig-1g.5gb\n      rename: shared\n      replicas: 2\n"
        ),
        "sharing.timeSlicing.resources[1].rename: \"nvidia.com/shared\" is already advertised by resources[0]; give \
         each resource its own name"
    );
    let long = "a".repeat(52);
    assert_eq!(
        error(&format!(
            "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: {long}\n      replicas: 2\n"
        )),
        format!(
            "sharing.timeSlicing.resources[0].name: \"nvidia.com/{long}.shared\" (the renameByDefault name) is longer \
             than 63 characters; use a shorter rename"
        )
    );
}

#[test]
fn other_semantic_checks() {
    assert_eq!(
        error("imex:\n  channelIDs: [1]\n"),
        "imex.channelIDs: only channel 0 is supported: write [0], or leave channelIDs out"
    );
    assert_eq!(
        error("resources:\n  mig:\n  - pattern: ''\n    name: mig-small\n"),
        "resources.mig[0].pattern: must not be empty (use \"*\" to match every product)"
    );
}

#[test]
fn config_map_reports_bad_keys_and_keeps_good_ones() {
    let mut data = guide_config_map();
    data.insert(
        "broken".to_owned(),
        time_slicing("name: nvidia.com/gpu\nreplicas: 1"),
    );
    data.insert("-bad".to_owned(), "version: v1\n".to_owned());
    data.insert("yaml".to_owned(), "sharing: [\n".to_owned());
    let parsed = parse_config_map(&data);
    assert_eq!(
        parsed.configs.keys().collect::<Vec<_>>(),
        ["any", "slice-10", "slice-4"]
    );
    let errors: Vec<String> = parsed.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "-bad: the key cannot be selected with the nvidia.com/device-plugin.config label: it must start and end \
             with a letter or digit",
            "broken: sharing.timeSlicing.resources[0].replicas: 1 is too small, replicas must be at least 2 (use 2 or \
             more, or remove the sharing entry)",
            "yaml: invalid YAML: unclosed bracket '[' at line 1, column 10",
        ]
    );
}

/// NVIDIA's published device-plugin configs (README examples, and one with every key of their `api/config/v1`),
/// as our fixtures.
macro_rules! nvidia_fixture {
    ($name:literal) => {
        (
            $name,
            include_str!(concat!("../../../../../tests/fixtures/nvidia/", $name)),
        )
    };
}

#[test]
fn nvidias_example_configs_parse_without_warnings() {
    for (name, text) in [
        nvidia_fixture!("device-plugin-readme-config0.yaml"),
        nvidia_fixture!("device-plugin-readme-config1.yaml"),
        nvidia_fixture!("device-plugin-time-slicing.yaml"),
        nvidia_fixture!("device-plugin-time-slicing-rename.yaml"),
        nvidia_fixture!("device-plugin-mps.yaml"),
        nvidia_fixture!("device-plugin-mps-rename.yaml"),
        nvidia_fixture!("device-plugin-every-flag.yaml"),
    ] {
        let parsed = parse_tolerant(text).unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(parsed.unknown_keys, Vec::<String>::new(), "{name}");
    }
    let (_, every) = nvidia_fixture!("device-plugin-every-flag.yaml");
    let config = parse(every).unwrap();
    let flags = config.flags.unwrap();
    let plugin = flags.plugin.unwrap();
    assert_eq!(
        plugin.shared_devices_allocation_policy,
        Some(AllocationPolicy::Packed)
    );
    assert_eq!(
        plugin.device_list_strategy,
        [
            DeviceListStrategy::Envvar,
            DeviceListStrategy::CdiAnnotations
        ]
    );
    assert_eq!(flags.gfd.unwrap().no_timestamp, Some(true));
    assert_eq!(flags.mig_strategy, Some(MigStrategy::Mixed));
}

#[test]
fn a_command_line_option_written_into_the_config_is_ignored_with_a_warning() {
    let (_, text) = nvidia_fixture!("device-plugin-cli-options-in-config.yaml");
    let parsed = parse_tolerant(text).unwrap();
    assert_eq!(
        parsed.warnings(),
        ["flags.compatWithCPUManager: unknown key, ignored"]
    );
    assert_eq!(
        parsed.config.flags.unwrap().mig_strategy,
        Some(MigStrategy::None)
    );
}

#[test]
fn config_maps_list_the_ignored_keys_per_config() {
    let data = BTreeMap::from([
        (
            "any".to_owned(),
            "version: v1\nflags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n    newFlag: 1\n"
                .to_owned(),
        ),
        ("plain".to_owned(), "version: v1\n".to_owned()),
    ]);
    let parsed = parse_config_map(&data);
    assert_eq!(parsed.configs.len(), 2);
    assert_eq!(
        parsed.warnings,
        BTreeMap::from([(
            "any".to_owned(),
            vec!["flags.plugin.newFlag: unknown key, ignored".to_owned()]
        )])
    );
}

#[test]
fn replica_ids_are_the_uuid_and_a_number() {
    let id = replica_id("GPU-abc", 3);
    assert_eq!(id, "GPU-abc::3");
    assert_eq!(device_uuid(&id), "GPU-abc");
    assert_eq!(device_uuid("MIG-def::10"), "MIG-def");
    assert_eq!(device_uuid("GPU-abc"), "GPU-abc");
}

#[test]
fn mig_strategies_parse_as_written() {
    for strategy in [MigStrategy::None, MigStrategy::Single, MigStrategy::Mixed] {
        assert_eq!(strategy.as_str().parse::<MigStrategy>(), Ok(strategy));
        assert_eq!(
            serde_json::to_value(strategy).unwrap(),
            serde_json::Value::from(strategy.as_str())
        );
    }
    assert_eq!(
        "both".parse::<MigStrategy>().unwrap_err().to_string(),
        "expected none, single or mixed, got \"both\""
    );
}

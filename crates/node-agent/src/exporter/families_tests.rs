//! The readings → families mapping, over the simulator.

use std::time::{Duration, Instant};

use gpu::{GpuBackend, GpuDetails, GpuProcess, Simulator};
use node_runtime::testing::simulated;

use super::*;
use crate::exporter::collect::read_gpus;
use crate::pod_resources::ContainerDevices;

const HOST: &str = "node-1";

/// Families of a fresh reading of `simulator`, with `holders` and `xids`.
fn collect(
    simulator: &Simulator,
    holders: &Holders,
    xids: &XidGauge,
    selection: &Selection,
) -> Vec<MetricFamily> {
    let pass = read_gpus(simulator).unwrap();
    assert!(pass.problems.is_empty(), "{:?}", pass.problems);
    families(
        &NodeReading {
            hostname: HOST,
            gpus: &pass.gpus,
            holders,
            xids,
            processes: &[],
        },
        selection,
    )
}

fn family(families: &[MetricFamily], field: Field) -> Option<&MetricFamily> {
    families.iter().find(|family| family.field == Some(field))
}

/// A label's value in a series.
fn label<'s>(series: &'s Series, name: &str) -> Option<&'s str> {
    series
        .labels
        .iter()
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.as_str())
}

/// `(gpu, pod, value)` of every series of a field.
fn values(families: &[MetricFamily], field: Field) -> Vec<(String, Option<String>, Value)> {
    family(families, field)
        .map(|family| {
            family
                .series
                .iter()
                .map(|series| {
                    (
                        label(series, "gpu").unwrap().to_owned(),
                        label(series, "pod").map(str::to_owned),
                        series.value,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn process(pid: u32, mib: u64) -> GpuProcess {
    GpuProcess {
        pid,
        used_memory_mib: Some(mib),
        gpu_instance_id: None,
        compute_instance_id: None,
    }
}

#[test]
fn whole_gpus_carry_dcgms_labels_and_their_readings() {
    let (_dir, simulator) = simulated("a100-40gb:2", &[]);
    simulator.start_process(1, process(4242, 1500)).unwrap();
    let families = collect(
        &simulator,
        &Holders::default(),
        &XidGauge::new(Duration::from_secs(300)),
        &Selection::default(),
    );

    let gpu_temp = family(&families, Field::GpuTemp).unwrap();
    assert_eq!(gpu_temp.kind, Kind::Gauge);
    assert_eq!(gpu_temp.help, "GPU temperature (in C).");
    let uuid = simulator.gpu(1).unwrap().uuid;
    assert_eq!(
        gpu_temp.series[1].labels,
        [
            ("gpu", "1".to_owned()),
            ("UUID", uuid),
            ("pci_bus_id", "00000000:11:00.0".to_owned()),
            ("device", "nvidia1".to_owned()),
            ("modelName", "NVIDIA A100-SXM4-40GB".to_owned()),
            ("hostname", HOST.to_owned()),
            ("DCGM_FI_DRIVER_VERSION", "570.86.15".to_owned()),
        ]
    );
    // GPU 1 runs a process: busy, and its memory in use.
    assert_eq!(
        values(&families, Field::FbUsed),
        [
            ("0".into(), None, Value::Integer(0)),
            ("1".into(), None, Value::Integer(1500))
        ]
    );
    assert_eq!(
        values(&families, Field::FbFree)[1].2,
        Value::Integer(40960 - 512 - 1500)
    );
    assert_eq!(
        values(&families, Field::GpuUtil),
        [
            ("0".into(), None, Value::Integer(0)),
            ("1".into(), None, Value::Integer(100))
        ]
    );
    assert_eq!(values(&families, Field::SmClock)[1].2, Value::Integer(1410));
    assert_eq!(
        values(&families, Field::MemClock)[1].2,
        Value::Integer(1215)
    );
    assert_eq!(
        values(&families, Field::MemCopyUtil)[1].2,
        Value::Integer(40)
    );
    // Watts, as DCGM, from the backend's milliwatts.
    assert_eq!(
        values(&families, Field::PowerUsage)[1].2,
        Value::Float(300.0)
    );
    let energy = family(&families, Field::TotalEnergyConsumption).unwrap();
    assert_eq!(energy.kind, Kind::Counter);
    assert!(matches!(energy.series[0].value, Value::Integer(_)));
    assert_eq!(values(&families, Field::XidErrors)[0].2, Value::Integer(0));

    // Every default field the GPU gives, in the default CSV's order; the driver version is a label, not a family.
    assert_eq!(
        families
            .iter()
            .filter_map(|family| family.field)
            .collect::<Vec<_>>(),
        Field::DEFAULT
            .into_iter()
            .filter(|field| !field.is_text())
            .collect::<Vec<_>>(),
    );
}

#[test]
fn mig_instances_get_gpu_i_labels_and_their_own_memory() {
    let (_dir, simulator) = simulated("a100-80gb:1", &[("1g.10gb", 2), ("3g.40gb", 1)]);
    let devices = simulator.mig_devices(0).unwrap();
    let big = devices
        .iter()
        .find(|device| device.memory_mib > 20_000)
        .unwrap();
    simulator
        .start_process(
            0,
            GpuProcess {
                pid: 7,
                used_memory_mib: Some(2048),
                gpu_instance_id: Some(big.gpu_instance_id),
                compute_instance_id: Some(big.compute_instance_id),
            },
        )
        .unwrap();
    let families = collect(
        &simulator,
        &Holders::default(),
        &XidGauge::new(Duration::from_secs(300)),
        &Selection::default(),
    );

    let used = family(&families, Field::FbUsed).unwrap();
    assert_eq!(used.series.len(), 4, "the GPU and its three instances");
    let gpu_only = &used.series[0];
    assert_eq!(label(gpu_only, "GPU_I_ID"), None);
    let instances: Vec<(Option<&str>, Option<&str>, Value)> = used.series[1..]
        .iter()
        .map(|series| {
            (
                label(series, "GPU_I_PROFILE"),
                label(series, "GPU_I_ID"),
                series.value,
            )
        })
        .collect();
    let big_id = big.gpu_instance_id.to_string();
    assert!(
        instances.contains(&(Some("3g.40gb"), Some(big_id.as_str()), Value::Integer(2048))),
        "{instances:?}"
    );
    assert_eq!(
        instances
            .iter()
            .filter(|(profile, _, value)| *profile == Some("1g.10gb") && *value == Value::Integer(0))
            .count(),
        2,
        "{instances:?}"
    );
    let free = family(&families, Field::FbFree).unwrap();
    let big_free = free
        .series
        .iter()
        .find(|series| label(series, "GPU_I_ID") == Some(big_id.as_str()))
        .unwrap();
    assert_eq!(big_free.value, Value::Integer(big.memory_mib - 2048));
    // The instance series sit between the GPU's labels and the label fields, as in dcgm-exporter.
    let keys: Vec<&str> = big_free.labels.iter().map(|(key, _)| *key).collect();
    assert_eq!(
        keys,
        [
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "GPU_I_PROFILE",
            "GPU_I_ID",
            "hostname",
            "DCGM_FI_DRIVER_VERSION"
        ]
    );

    // GPU-wide readings stay on the GPU's series only (summing a GPU's series counts its power once); MIG has
    // no utilization reading, so none is exported.
    assert_eq!(
        family(&families, Field::PowerUsage).unwrap().series.len(),
        1
    );
    assert!(family(&families, Field::GpuUtil).is_none());
    assert!(family(&families, Field::MemCopyUtil).is_none());
}

#[test]
fn compute_instances_sharing_a_gpu_instance_make_one_series() {
    let (_dir, simulator) = simulated("a100-40gb:1", &[]);
    let inventory = simulator.gpu(0).unwrap();
    let device = |uuid: &str, compute_instance_id| MigDevice {
        uuid: uuid.into(),
        gpu_instance_id: 1,
        // The 3g.20gb profile of the A100-40GB.
        gpu_instance_profile_id: 9,
        compute_instance_id,
        compute_slice_count: 1,
        memory_mib: 19968,
        multiprocessor_count: 14,
        engines: None,
    };
    let process = |pid, ci, mib| GpuProcess {
        pid,
        used_memory_mib: mib,
        gpu_instance_id: Some(1),
        compute_instance_id: Some(ci),
    };
    let reading = GpuReading::new(
        inventory.clone(),
        Telemetry::default(),
        GpuDetails::default(),
        &[device("MIG-a", 0), device("MIG-b", 1)],
        &[process(1, 0, Some(100)), process(2, 1, Some(200))],
        &[gpu::GpuInstance {
            id: 1,
            profile_id: 9,
            placement: gpu::Placement { start: 4, size: 4 },
        }],
    );
    assert_eq!(
        reading.instances,
        [InstanceReading {
            id: 1,
            profile: "3g.20gb".into(),
            device_uuids: vec!["MIG-a".into(), "MIG-b".into()],
            memory_mib: 19968,
            used_memory_mib: Some(300),
            placement: Some((9, 4)),
        }]
    );
    // One process whose use the driver does not report makes the instance's use unknown, not smaller.
    let unknown = GpuReading::new(
        inventory,
        Telemetry::default(),
        GpuDetails::default(),
        &[device("MIG-a", 0)],
        &[process(1, 0, Some(100)), process(2, 0, None)],
        &[],
    );
    assert_eq!(unknown.instances[0].used_memory_mib, None);
    // The DRA driver names an instance it made on demand by profile and placement; both name this one.
    let readings = [reading];
    for device in ["gpu-0-mig-3g20gb-9-4", "gpu-0-mig-1-0"] {
        assert_eq!(
            claimed_uuids(device, &readings),
            ["MIG-a", "MIG-b"],
            "{device}"
        );
    }
    assert!(claimed_uuids("gpu-0-mig-3g20gb-9-0", &readings).is_empty());
    let xids = XidGauge::new(Duration::from_secs(1));
    let families = families(
        &NodeReading {
            hostname: HOST,
            gpus: &[unknown],
            holders: &Holders::default(),
            xids: &xids,
            processes: &[],
        },
        &Selection::default(),
    );
    // Only the XID gauge: the GPU gave no telemetry, the instance no memory use.
    assert_eq!(
        families
            .iter()
            .filter_map(|family| family.field)
            .collect::<Vec<_>>(),
        [Field::XidErrors]
    );
}

#[test]
fn series_of_a_gpu_held_through_dra_claims_carry_nvidias_dra_labels_per_claim() {
    let (_dir, simulator) = simulated("a100-40gb:2", &[]);
    let pass = read_gpus(simulator.as_ref()).unwrap();
    let claim = |pod: &str, claim: &str, device: &str| PodDevices {
        pod: format!("team/{pod}"),
        containers: vec![ContainerDevices {
            name: "work".into(),
            devices: BTreeMap::new(),
            claims: vec![crate::pod_resources::ClaimDevice {
                claim_namespace: "team".into(),
                claim_name: claim.into(),
                driver: crd::dra::DRIVER.into(),
                pool: "node-1".into(),
                device: device.into(),
            }],
        }],
    };
    let answer = [
        claim("a", "a-gpu-1", "gpu-1"),
        claim("b", "b-gpu-1", "gpu-1"),
        claim("c", "c-gone", "gpu-9"),
    ];
    let families = collect(
        &simulator,
        &Holders::new(&answer, &pass.gpus),
        &XidGauge::new(Duration::from_secs(300)),
        &Selection::default(),
    );
    let used = family(&families, Field::FbUsed).unwrap();
    let of_gpu = |gpu: &str| -> Vec<&Labels> {
        used.series
            .iter()
            .map(|series| &series.labels)
            .filter(|labels| {
                labels
                    .iter()
                    .any(|(name, value)| *name == "gpu" && value == gpu)
            })
            .collect()
    };
    let shared = of_gpu("1");
    assert_eq!(
        shared.len(),
        2,
        "one series per claim sharing GPU 1: {shared:?}"
    );
    let label = |labels: &Labels, name: &str| {
        labels
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.clone())
    };
    assert_eq!(label(shared[0], "pod").as_deref(), Some("a"));
    assert_eq!(
        label(shared[0], "dra_claim_name").as_deref(),
        Some("a-gpu-1")
    );
    assert_eq!(
        label(shared[0], "dra_claim_namespace").as_deref(),
        Some("team")
    );
    assert_eq!(
        label(shared[0], "dra_driver_name").as_deref(),
        Some("gpu.nvidia.com")
    );
    assert_eq!(
        label(shared[0], "dra_device_name").as_deref(),
        Some("gpu-1")
    );
    assert_eq!(
        label(shared[1], "dra_claim_name").as_deref(),
        Some("b-gpu-1")
    );
    let unclaimed = of_gpu("0");
    assert_eq!(unclaimed.len(), 1);
    assert_eq!(label(unclaimed[0], "dra_claim_name"), None);
}

fn pod(namespace_and_name: &str, containers: &[(&str, &str, &[&str])]) -> PodDevices {
    PodDevices {
        pod: namespace_and_name.into(),
        containers: containers
            .iter()
            .map(|(name, resource, ids)| ContainerDevices {
                name: (*name).into(),
                devices: std::iter::once((
                    (*resource).to_owned(),
                    ids.iter().map(|id| (*id).to_owned()).collect(),
                ))
                .collect(),
                claims: Vec::new(),
            })
            .collect(),
    }
}

#[test]
fn every_container_holding_a_gpu_or_replica_is_attributed() {
    let (_dir, simulator) = simulated("a100-80gb:3", &[]);
    let uuid = |gpu| simulator.gpu(gpu).unwrap().uuid;
    simulator.start_process(0, process(1, 1000)).unwrap();
    let answer = [
        // Time-slicing: two pods share GPU 0 through replicas.
        pod(
            "ml/trainer",
            &[(
                "main",
                "nvidia.com/gpu.shared",
                &[&format!("{}::0", uuid(0))],
            )],
        ),
        pod(
            "ml/notebook",
            &[
                (
                    "jupyter",
                    "nvidia.com/gpu.shared",
                    &[&format!("{}::3", uuid(0))],
                ),
                ("sidecar", "example.com/nic", &["nic-0"]),
            ],
        ),
        // A whole GPU.
        pod(
            "default/render",
            &[("blender", "nvidia.com/gpu", &[&uuid(1)])],
        ),
        // Devices of no GPU of the node.
        pod(
            "default/other",
            &[("x", "nvidia.com/gpu", &["GPU-elsewhere::1"])],
        ),
    ];
    let families = collect(
        &simulator,
        &Holders::new(&answer, &[]),
        &XidGauge::new(Duration::from_secs(300)),
        &Selection::default(),
    );
    let used = family(&families, Field::FbUsed).unwrap();
    let attributed: Vec<_> = used
        .series
        .iter()
        .map(|series| {
            (
                label(series, "gpu").unwrap(),
                label(series, "namespace"),
                label(series, "pod"),
                label(series, "container"),
                series.value,
            )
        })
        .collect();
    assert_eq!(
        attributed,
        [
            (
                "0",
                Some("ml"),
                Some("notebook"),
                Some("jupyter"),
                Value::Integer(1000)
            ),
            (
                "0",
                Some("ml"),
                Some("trainer"),
                Some("main"),
                Value::Integer(1000)
            ),
            (
                "1",
                Some("default"),
                Some("render"),
                Some("blender"),
                Value::Integer(0)
            ),
            ("2", None, None, None, Value::Integer(0)),
        ]
    );
    let keys: Vec<&str> = used.series[0].labels.iter().map(|(key, _)| *key).collect();
    assert_eq!(keys[keys.len() - 3..], ["pod", "namespace", "container"]);
}

#[test]
fn mig_devices_are_attributed_to_their_instance() {
    let (_dir, simulator) = simulated("a100-80gb:1", &[("1g.10gb", 2)]);
    let devices = simulator.mig_devices(0).unwrap();
    let held = &devices[1];
    // The single strategy advertises MIG devices as nvidia.com/gpu, with replicas when shared.
    let answer = [pod(
        "batch/job",
        &[("worker", "nvidia.com/gpu", &[&format!("{}::1", held.uuid)])],
    )];
    let families = collect(
        &simulator,
        &Holders::new(&answer, &[]),
        &XidGauge::new(Duration::from_secs(300)),
        &Selection::default(),
    );
    let used = family(&families, Field::FbUsed).unwrap();
    let held_id = held.gpu_instance_id.to_string();
    for series in &used.series {
        let expected = (label(series, "GPU_I_ID") == Some(held_id.as_str())).then_some("job");
        assert_eq!(label(series, "pod"), expected, "{:?}", series.labels);
    }
}

#[test]
fn the_xid_gauge_shows_the_last_critical_xid_then_clears() {
    let (_dir, simulator) = simulated("a100-40gb:2", &[]);
    let start = Instant::now();
    let mut xids = XidGauge::new(Duration::from_secs(300));
    simulator.inject_xid(1, 48).unwrap();
    simulator.inject_xid(1, 79).unwrap();
    xids.record(&simulator.health_events().unwrap(), start);
    let selection = Selection::parse("DCGM_FI_DEV_XID_ERRORS, gauge, last XID\n").unwrap();
    let families = collect(&simulator, &Holders::default(), &xids, &selection);
    assert_eq!(
        values(&families, Field::XidErrors),
        [
            ("0".into(), None, Value::Integer(0)),
            ("1".into(), None, Value::Integer(79))
        ]
    );
    assert_eq!(families[0].help, "last XID");

    xids.record(
        &simulator.health_events().unwrap(),
        start + Duration::from_secs(301),
    );
    let families = collect(&simulator, &Holders::default(), &xids, &selection);
    assert_eq!(values(&families, Field::XidErrors)[1].2, Value::Integer(0));
    assert!(
        simulator.health_events().unwrap().is_empty(),
        "events are read once"
    );
}

#[test]
fn the_selection_decides_fields_types_and_labels() {
    let (_dir, simulator) = simulated("a100-40gb:1", &[]);
    let selection = Selection::parse(
        "DCGM_FI_DEV_POWER_USAGE, counter, watts\nDCGM_FI_DEV_RETIRED_DBE, counter, retired\n",
    )
    .unwrap();
    let families = collect(
        &simulator,
        &Holders::default(),
        &XidGauge::new(Duration::from_secs(300)),
        &selection,
    );
    assert_eq!(
        families.len(),
        1,
        "an A100 remaps rows: NVML gives no retired-page count"
    );
    assert_eq!(
        (
            families[0].field,
            families[0].kind,
            families[0].help.as_str()
        ),
        (Some(Field::PowerUsage), Kind::Counter, "watts")
    );
    assert!(
        families[0].series[0]
            .labels
            .iter()
            .all(|(key, _)| *key != "DCGM_FI_DRIVER_VERSION"),
        "the driver version label only when selected"
    );
}

#[test]
fn the_text_keeps_dcgms_names_for_counters_too() {
    let (_dir, simulator) = simulated("a100-40gb:1", &[]);
    let answer = [pod(
        "ml/quote\"d",
        &[("main", "nvidia.com/gpu", &[&simulator.gpu(0).unwrap().uuid])],
    )];
    let families = collect(
        &simulator,
        &Holders::new(&answer, &[]),
        &XidGauge::new(Duration::from_secs(300)),
        &Selection::default(),
    );
    let text = encode(Arc::new(families));
    assert!(
        text.contains(
            "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n\
             # TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n\
             DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"0\""
        ),
        "{text}"
    );
    assert!(!text.contains("_total"), "{text}");
    assert!(
        text.contains("# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"),
        "{text}"
    );
    assert!(
        text.contains(
            ",hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"570.86.15\",pod=\"quote\\\"d\",namespace=\"ml\",container=\"main\"} 60.0\n"
        ),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_eq!(encode(Arc::new(Vec::new())), "# EOF\n");
}

/// A selection of every field this exporter knows, each with its usual type.
fn everything() -> Selection {
    let csv: String = Field::ALL
        .iter()
        .map(|field| {
            format!(
                "{}, {}, {}\n",
                field,
                field.default_kind().word(),
                field.default_help()
            )
        })
        .collect();
    Selection::parse(&csv).unwrap()
}

#[test]
fn a_scrape_lists_every_field_nvml_gives_on_the_simulator() {
    let (_dir, simulator) = simulated("a100-40gb:1,h100-80gb:1", &[]);
    let xids = XidGauge::new(Duration::from_secs(300));
    let families = collect(&simulator, &Holders::default(), &xids, &everything());
    // An A100 and an H100 remap rows instead of retiring pages: NVML has no retired-page counts for them, so
    // those three fields, and only those, have no series, as with dcgm-exporter.
    let missing: Vec<Field> = Field::ALL
        .into_iter()
        .filter(|field| !field.is_text() && family(&families, *field).is_none())
        .collect();
    assert_eq!(
        missing,
        [Field::RetiredSbe, Field::RetiredDbe, Field::RetiredPending]
    );
    for family in &families {
        assert_eq!(
            family.series.len(),
            2,
            "{}: one series per GPU",
            family.name
        );
    }
    // Every text field NVML gives is a label on every series; the power infoROM object is not on these boards.
    let labels: Vec<&str> = families[0].series[0]
        .labels
        .iter()
        .map(|(key, _)| *key)
        .collect();
    let texts: Vec<&str> = Field::ALL
        .into_iter()
        .filter(|field| field.is_text() && *field != Field::PowerInforomVer)
        .map(Field::name)
        .collect();
    assert_eq!(labels[6..], texts[..]);
    assert_eq!(
        label(&families[0].series[0], "DCGM_FI_NVML_VERSION"),
        Some("12.570.86.15")
    );

    // What a worn GPU counted shows as such; yes/no states as 1/0.
    let mut worn = gpu::SimulatedCounters::healthy();
    worn.memory_errors.remapped_rows_correctable = Some(3);
    worn.memory_errors.remapped_rows_failure = Some(true);
    worn.memory_errors.retired_pages_double_bit = Some(2);
    worn.memory_errors.ecc_uncorrected_aggregate = Some(1);
    worn.nvlink.crc_data_errors = Some(7);
    worn.nvlink.data_kib = None;
    worn.throttling.thermal_ns = Some(1_500_000);
    worn.pcie_replays = Some(11);
    simulator.set_counters(1, Some(worn)).unwrap();
    let families = collect(&simulator, &Holders::default(), &xids, &everything());
    let on_gpu_1 = |field| {
        values(&families, field)
            .into_iter()
            .find(|(gpu, _, _)| gpu == "1")
            .map(|(_, _, value)| value)
    };
    assert_eq!(
        on_gpu_1(Field::CorrectableRemappedRows),
        Some(Value::Integer(3))
    );
    assert_eq!(on_gpu_1(Field::RowRemapFailure), Some(Value::Integer(1)));
    assert_eq!(on_gpu_1(Field::RowRemapPending), Some(Value::Integer(0)));
    assert_eq!(on_gpu_1(Field::RetiredDbe), Some(Value::Integer(2)));
    assert_eq!(on_gpu_1(Field::EccDbeAggTotal), Some(Value::Integer(1)));
    assert_eq!(
        on_gpu_1(Field::NvlinkCrcDataErrorCountTotal),
        Some(Value::Integer(7))
    );
    assert_eq!(
        on_gpu_1(Field::ThermalViolation),
        Some(Value::Integer(1_500_000))
    );
    assert_eq!(on_gpu_1(Field::PcieReplayCounter), Some(Value::Integer(11)));
    // A reading the GPU does not give is left out, not shown as 0.
    assert_eq!(on_gpu_1(Field::NvlinkBandwidthTotal), None);
    assert_eq!(values(&families, Field::NvlinkBandwidthTotal).len(), 1);
}

#[test]
fn nvidias_csvs_scrape_as_dcgm_exporter_names_them() {
    let (_dir, simulator) = simulated("h100-80gb:1", &[]);
    let xids = XidGauge::new(Duration::from_secs(300));
    for csv in [
        include_str!("../../../../tests/fixtures/nvidia/dcp-metrics-included.csv"),
        include_str!("../../../../tests/fixtures/nvidia/default-counters.csv"),
    ] {
        let selection = Selection::parse(csv).unwrap();
        let text = encode(Arc::new(collect(
            &simulator,
            &Holders::default(),
            &xids,
            &selection,
        )));
        for field in Field::DEFAULT.iter().filter(|field| !field.is_text()) {
            assert!(
                text.contains(&format!("\n{field}{{gpu=\"0\"")),
                "{field}:\n{text}"
            );
        }
        assert!(!text.contains("DCGM_FI_PROF_"), "{text}");
        assert!(!text.contains("VGPU_LICENSE"), "{text}");
    }
    // The 1.x namespace: the metrics keep the names the file gives them.
    let legacy = Selection::parse(include_str!(
        "../../../../tests/fixtures/nvidia/1.x-compatibility-metrics.csv"
    ))
    .unwrap();
    let text = encode(Arc::new(collect(
        &simulator,
        &Holders::default(),
        &xids,
        &legacy,
    )));
    assert!(text.contains("\ndcgm_gpu_temp{gpu=\"0\""), "{text}");
    assert!(
        text.contains("# TYPE dcgm_nvlink_bandwidth_total counter\n"),
        "{text}"
    );
    assert!(!text.contains("DCGM_FI_"), "{text}");
}

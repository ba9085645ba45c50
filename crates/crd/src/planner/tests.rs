use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::hami::Selection;

use super::*;

const A100: &str = "NVIDIA A100-SXM4-40GB";
const H100: &str = "NVIDIA H100 80GB HBM3";
const A100_MIB: u64 = 40_960;
const H100_MIB: u64 = 81_920;

fn quantity(text: &str) -> Quantity {
    Quantity(text.to_owned())
}

fn attributes(pairs: &[(&str, &str)]) -> BTreeMap<String, DeviceAttribute> {
    pairs
        .iter()
        .map(|(name, value)| {
            (
                (*name).to_owned(),
                DeviceAttribute {
                    string: Some((*value).to_owned()),
                    ..DeviceAttribute::default()
                },
            )
        })
        .collect()
}

fn range(default: &str, min: &str, max: &str, step: &str) -> Option<CapacityRequestPolicy> {
    Some(CapacityRequestPolicy {
        default: Some(quantity(default)),
        valid_range: Some(CapacityRequestPolicyRange {
            min: quantity(min),
            max: Some(quantity(max)),
            step: Some(quantity(step)),
        }),
        valid_values: None,
    })
}

/// A GPU the admin marked shareable, as the driver publishes it: memory in bytes (default all of it, 1Mi steps),
/// cores 0–100 (default 0).
fn shared_gpu(name: &str, product: &str, memory_mib: u64) -> Device {
    shared_gpu_with_step(name, product, memory_mib, "1Mi")
}

fn shared_gpu_with_step(name: &str, product: &str, memory_mib: u64, step: &str) -> Device {
    let memory = format!("{memory_mib}Mi");
    Device {
        name: name.to_owned(),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes(&[
            ("type", "gpu"),
            ("uuid", &format!("GPU-{name}")),
            ("productName", product),
        ])),
        capacity: Some(BTreeMap::from([
            (
                "memory".to_owned(),
                DeviceCapacity {
                    value: quantity(&memory),
                    request_policy: range(&memory, step, &memory, step),
                },
            ),
            (
                "cores".to_owned(),
                DeviceCapacity {
                    value: quantity("100"),
                    request_policy: range("0", "0", "100", "1"),
                },
            ),
        ])),
        ..Device::default()
    }
}

/// A device taken whole: only a memory capacity, no policy, not multi-allocatable.
fn unshared(name: &str, pairs: &[(&str, &str)], memory_mib: u64) -> Device {
    Device {
        name: name.to_owned(),
        attributes: Some(attributes(pairs)),
        capacity: Some(BTreeMap::from([(
            "memory".to_owned(),
            DeviceCapacity {
                value: quantity(&format!("{memory_mib}Mi")),
                request_policy: None,
            },
        )])),
        ..Device::default()
    }
}

/// A whole GPU.
fn whole_gpu(name: &str, product: &str, memory_mib: u64) -> Device {
    let uuid = format!("GPU-{name}");
    unshared(
        name,
        &[("type", "gpu"), ("uuid", &uuid), ("productName", product)],
        memory_mib,
    )
}

fn mig(name: &str, profile: &str, memory_mib: u64) -> Device {
    let uuid = format!("MIG-{name}");
    unshared(
        name,
        &[
            ("type", "mig"),
            ("uuid", &uuid),
            ("productName", A100),
            ("profile", profile),
        ],
        memory_mib,
    )
}

fn node(name: &str, devices: Vec<Device>) -> NodeDevices {
    NodeDevices {
        node: name.to_owned(),
        devices,
    }
}

fn requests(texts: &[&str]) -> Vec<Request> {
    texts.iter().map(|t| t.parse().unwrap()).collect()
}

fn landed(plan: &Plan, index: usize) -> &[Landed] {
    plan.placements[index]
        .outcome
        .as_ref()
        .unwrap_or_else(|why| panic!("request {index} unplaced: {why}"))
}

fn unplaced(plan: &Plan, index: usize) -> String {
    match &plan.placements[index].outcome {
        Ok(devices) => panic!("request {index} landed on {devices:?}"),
        Err(why) => why.to_string(),
    }
}

/// (node, device, memory MiB, cores) of each device a request took.
fn spots(plan: &Plan, index: usize) -> Vec<(String, String, u64, Option<u64>)> {
    landed(plan, index)
        .iter()
        .map(|l| {
            (
                l.node.clone(),
                l.device.clone(),
                l.memory_bytes / MIB,
                l.cores,
            )
        })
        .collect()
}

fn spot(
    node: &str,
    device: &str,
    mib: u64,
    cores: Option<u64>,
) -> (String, String, u64, Option<u64>) {
    (node.to_owned(), device.to_owned(), mib, cores)
}

fn remaining<'a>(plan: &'a Plan, node: &str, device: &str) -> &'a DeviceRemaining {
    plan.remaining
        .iter()
        .find(|r| r.node == node && r.device == device)
        .unwrap()
}

#[test]
fn thirteen_shares_of_3000_mib_fit_a_40gb_gpu_and_the_fourteenth_is_told_why() {
    let nodes = [node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)])];
    let plan = plan(&nodes, &requests(&["gpumem=3000"; 14]));
    for index in 0..13 {
        assert_eq!(
            spots(&plan, index),
            [spot("node-a", "gpu-0", 3000, Some(0))]
        );
    }
    assert_eq!(
        unplaced(&plan, 13),
        "no shared GPU has 3000 MiB free: gpu-0 on node-a has 1960 MiB and 100 cores free"
    );
    let gpu = remaining(&plan, "node-a", "gpu-0");
    assert_eq!(gpu.allocations, 13);
    assert_eq!(
        gpu.memory,
        Some(Usage {
            total: A100_MIB * MIB,
            used: 39_000 * MIB
        })
    );
    assert_eq!(
        gpu.cores,
        Some(Usage {
            total: 100,
            used: 0
        })
    );
}

#[test]
fn three_requests_of_40_cores_cannot_share_one_gpu_but_two_do() {
    let nodes = [node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)])];
    let plan = plan(&nodes, &requests(&["gpumem=3000,gpucores=40"; 3]));
    assert_eq!(spots(&plan, 0), [spot("node-a", "gpu-0", 3000, Some(40))]);
    assert_eq!(spots(&plan, 1), [spot("node-a", "gpu-0", 3000, Some(40))]);
    assert_eq!(
        unplaced(&plan, 2),
        "no shared GPU has 3000 MiB and 40 cores free: gpu-0 on node-a has 34960 MiB and 20 cores free"
    );
    assert_eq!(
        remaining(&plan, "node-a", "gpu-0").cores,
        Some(Usage {
            total: 100,
            used: 80
        })
    );
}

#[test]
fn a_memory_only_request_takes_no_cores() {
    let nodes = [node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)])];
    let plan = plan(
        &nodes,
        &requests(&["gpumem=3000", "gpumem=1000,gpucores=100"]),
    );
    assert_eq!(spots(&plan, 0), [spot("node-a", "gpu-0", 3000, Some(0))]);
    assert_eq!(spots(&plan, 1), [spot("node-a", "gpu-0", 1000, Some(100))]);
    assert_eq!(
        remaining(&plan, "node-a", "gpu-0").cores,
        Some(Usage {
            total: 100,
            used: 100
        })
    );
}

#[test]
fn a_request_without_gpumem_takes_the_default_all_of_the_memory() {
    let nodes = [node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)])];
    let plan = plan(&nodes, &requests(&["gpucores=10", "gpumem=1"]));
    assert_eq!(
        spots(&plan, 0),
        [spot("node-a", "gpu-0", A100_MIB, Some(10))]
    );
    assert_eq!(
        unplaced(&plan, 1),
        "no shared GPU has 1 MiB free: gpu-0 on node-a has 0 MiB and 90 cores free"
    );
}

#[test]
fn a_memory_percentage_is_of_each_device_s_own_memory() {
    let nodes = [
        node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)]),
        node("node-h", vec![shared_gpu("gpu-0", H100, H100_MIB)]),
    ];
    let plan = plan(
        &nodes,
        &requests(&[
            "gpumem-percentage=50,type=A100",
            "gpumem-percentage=50,type=H100",
        ]),
    );
    assert_eq!(spots(&plan, 0), [spot("node-a", "gpu-0", 20_480, Some(0))]);
    assert_eq!(spots(&plan, 1), [spot("node-h", "gpu-0", 40_960, Some(0))]);
}

#[test]
fn a_percentage_is_rounded_down_to_whole_mib() {
    // 33 % of 40960 MiB is 13516.8 MiB: HAMi and the planner take 13516 MiB.
    let nodes = [node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)])];
    let plan = plan(&nodes, &requests(&["gpumem-percentage=33"]));
    assert_eq!(landed(&plan, 0)[0].memory_bytes, 13_516 * MIB);
}

#[test]
fn type_picks_by_product_name_in_any_case_and_nouse_type_avoids_it() {
    // The H100 node comes first, so first-fit alone would pick it.
    let nodes = [
        node("node-h", vec![shared_gpu("gpu-0", H100, H100_MIB)]),
        node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)]),
    ];
    let plan = plan(
        &nodes,
        &requests(&[
            "gpumem=3000,type=a100",
            "gpumem=3000,nouse-type=H100",
            "gpumem=3000,nouse-type=A100",
            "gpumem=3000",
            "gpumem=3000,type=V100,T4",
        ]),
    );
    assert_eq!(spots(&plan, 0)[0].0, "node-a");
    assert_eq!(spots(&plan, 1)[0].0, "node-a");
    assert_eq!(spots(&plan, 2)[0].0, "node-h");
    assert_eq!(spots(&plan, 3)[0].0, "node-h");
    assert_eq!(
        unplaced(&plan, 4),
        "no shared GPU matches productName contains \"v100\" or \"t4\" (any case); the shared GPUs are: \
         NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-40GB"
    );
}

/// The type and UUID lists are HAMi's selection annotations as the webhook reads them (`crate::hami::Selection`):
/// what the webhook refuses in an annotation, the planner refuses in a request.
#[test]
fn selection_lists_are_read_as_the_webhook_reads_hamis_annotations() {
    let request: Request = "type=A100, nouse-uuid=GPU-1".parse().unwrap();
    let annotations = BTreeMap::from([
        (crate::hami::USE_GPUTYPE.to_owned(), "A100".to_owned()),
        (crate::hami::NOUSE_GPUUUID.to_owned(), "GPU-1".to_owned()),
    ]);
    assert_eq!(
        request.selection,
        Selection::from_annotations(&annotations).unwrap()
    );
    for text in ["type=A100\")", "uuid=GPU-1 || true"] {
        let error = text.parse::<Request>().unwrap_err();
        assert!(
            matches!(error, RequestError::BadValue { expected, .. } if expected == crate::hami::EXPECT_SELECTION),
            "{text}: {error}"
        );
    }
}

#[test]
fn uuid_filters_compare_exactly() {
    let nodes = [node(
        "node-a",
        vec![
            shared_gpu("gpu-0", A100, A100_MIB),
            shared_gpu("gpu-1", A100, A100_MIB),
        ],
    )];
    let plan = plan(
        &nodes,
        &requests(&[
            "gpumem=1000,uuid=GPU-gpu-1",
            "gpumem=1000,nouse-uuid=GPU-gpu-0",
            "gpumem=1000,uuid=gpu-gpu-1",
        ]),
    );
    assert_eq!(spots(&plan, 0)[0].1, "gpu-1");
    assert_eq!(spots(&plan, 1)[0].1, "gpu-1");
    assert!(unplaced(&plan, 2).starts_with("no shared GPU matches uuid is \"gpu-gpu-1\";"));
}

#[test]
fn count_two_takes_two_devices_on_one_node() {
    let nodes = [
        node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)]),
        node(
            "node-b",
            vec![
                shared_gpu("gpu-0", A100, A100_MIB),
                shared_gpu("gpu-1", A100, A100_MIB),
            ],
        ),
    ];
    let plan = plan(
        &nodes,
        &requests(&["count=2,gpumem=8Gi", "count=3,gpumem=8Gi"]),
    );
    assert_eq!(
        spots(&plan, 0),
        [
            spot("node-b", "gpu-0", 8192, Some(0)),
            spot("node-b", "gpu-1", 8192, Some(0)),
        ]
    );
    assert_eq!(
        unplaced(&plan, 1),
        "count 3 needs 3 shared GPUs on one node that each has 8192 MiB free; at most 2 do on one node (node-b)"
    );
    assert_eq!(remaining(&plan, "node-a", "gpu-0").allocations, 0);
}

#[test]
fn a_whole_gpu_is_allocated_once() {
    let nodes = [node("node-a", vec![whole_gpu("gpu-0", A100, A100_MIB)])];
    let plan = plan(
        &nodes,
        &requests(&["class=gpu", "class=gpu", "gpumem=3000"]),
    );
    assert_eq!(spots(&plan, 0), [spot("node-a", "gpu-0", A100_MIB, None)]);
    assert_eq!(
        unplaced(&plan, 1),
        "no GPU is free: gpu-0 on node-a is allocated"
    );
    assert_eq!(
        unplaced(&plan, 2),
        "no node publishes a shared GPU (a device with type \"gpu\" and allowMultipleAllocations)"
    );
    let gpu = remaining(&plan, "node-a", "gpu-0");
    assert_eq!(gpu.memory.unwrap().free(), 0);
    assert_eq!(gpu.cores, None);
}

#[test]
fn gpumem_on_a_whole_gpu_only_filters_by_size() {
    let nodes = [node(
        "node-a",
        vec![
            whole_gpu("gpu-0", A100, A100_MIB),
            whole_gpu("gpu-1", H100, H100_MIB),
        ],
    )];
    let plan = plan(
        &nodes,
        &requests(&["class=gpu,gpumem=60Gi", "class=gpu,gpumem=100Gi"]),
    );
    assert_eq!(spots(&plan, 0), [spot("node-a", "gpu-1", H100_MIB, None)]);
    assert_eq!(
        unplaced(&plan, 1),
        "no GPU can hold 102400 MiB: gpu-0 on node-a has only 40960 MiB"
    );
}

#[test]
fn a_whole_gpu_request_on_a_shared_gpu_consumes_the_defaults() {
    // NVIDIA's gpu.nvidia.com class selects every type "gpu" device; on a shared one the claim consumes the
    // defaults, all of the memory, so it lands only where nobody holds a share.
    let nodes = [node(
        "node-a",
        vec![
            shared_gpu("gpu-0", A100, A100_MIB),
            shared_gpu("gpu-1", A100, A100_MIB),
        ],
    )];
    let plan = plan(
        &nodes,
        &requests(&["gpumem=3000", "class=gpu", "class=gpu"]),
    );
    assert_eq!(
        spots(&plan, 1),
        [spot("node-a", "gpu-1", A100_MIB, Some(0))]
    );
    assert_eq!(
        unplaced(&plan, 2),
        "no GPU is free: gpu-0 on node-a has 37960 MiB and 100 cores free; gpu-1 on node-a has 0 MiB and 100 cores free"
    );
}

#[test]
fn memory_is_rounded_up_onto_the_step_and_up_to_the_minimum() {
    let nodes = [node(
        "node-a",
        vec![shared_gpu_with_step("gpu-0", A100, A100_MIB, "256Mi")],
    )];
    let plan = plan(
        &nodes,
        &requests(&["gpumem=1000", "gpumem=100", "gpumem=1024", "gpumem=1500Ki"]),
    );
    assert_eq!(landed(&plan, 0)[0].memory_bytes, 1024 * MIB);
    assert_eq!(landed(&plan, 1)[0].memory_bytes, 256 * MIB);
    assert_eq!(landed(&plan, 2)[0].memory_bytes, 1024 * MIB);
    assert_eq!(landed(&plan, 3)[0].memory_bytes, 256 * MIB);
    // On the driver's 1Mi step a part of a MiB rounds up to a whole one.
    let nodes = [node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)])];
    let fine = super::plan(&nodes, &requests(&["gpumem=1500Ki"]));
    assert_eq!(landed(&fine, 0)[0].memory_bytes, 2 * MIB);
}

#[test]
fn more_than_the_policy_max_is_refused() {
    let nodes = [node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)])];
    let plan = plan(&nodes, &requests(&["gpumem=50000", "gpumem=40Gi"]));
    assert_eq!(
        unplaced(&plan, 0),
        "no shared GPU can hold 50000 MiB: gpu-0 on node-a takes at most 40960 MiB (asked 50000 MiB)"
    );
    assert_eq!(
        spots(&plan, 1),
        [spot("node-a", "gpu-0", A100_MIB, Some(0))]
    );
}

#[test]
fn mig_requests_match_the_profile() {
    let nodes = [node(
        "node-a",
        vec![
            shared_gpu("gpu-0", A100, A100_MIB),
            mig("gpu-1-mig-0", "3g.20gb", 20_096),
            mig("gpu-1-mig-1", "1g.5gb", 4_864),
        ],
    )];
    let plan = plan(
        &nodes,
        &requests(&[
            "class=mig,profile=1g.5gb",
            "class=mig,profile=1g.5gb",
            "class=mig",
            "class=mig,profile=7g.40gb",
        ]),
    );
    assert_eq!(
        spots(&plan, 0),
        [spot("node-a", "gpu-1-mig-1", 4_864, None)]
    );
    assert_eq!(
        unplaced(&plan, 1),
        "no MIG device is free: gpu-1-mig-1 on node-a is allocated"
    );
    assert_eq!(
        spots(&plan, 2),
        [spot("node-a", "gpu-1-mig-0", 20_096, None)]
    );
    assert_eq!(
        unplaced(&plan, 3),
        "no node publishes a MIG device (a device with type \"mig\" and profile \"7g.40gb\")"
    );
}

#[test]
fn a_capacity_the_device_lacks_makes_it_ineligible() {
    // A shared GPU published without `cores`: a request for cores cannot take it (§3.4.1).
    let mut gpu = shared_gpu("gpu-0", A100, A100_MIB);
    gpu.capacity.as_mut().unwrap().remove("cores");
    let nodes = [node("node-a", vec![gpu])];
    let plan = plan(&nodes, &requests(&["gpucores=10", "gpumem=1000"]));
    assert_eq!(
        unplaced(&plan, 0),
        "no shared GPU can hold all of its memory and 10 cores: gpu-0 on node-a has no capacity \"cores\""
    );
    assert_eq!(spots(&plan, 1), [spot("node-a", "gpu-0", 1000, None)]);
}

#[test]
fn the_plan_prints_what_it_made_of_a_tolerated_value() {
    let nodes = [node("node-a", vec![shared_gpu("gpu-0", A100, A100_MIB)])];
    let plan = plan(&nodes, &requests(&["gpumem=3000,gpumem-percentage=50"]));
    let printed = plan.to_string();
    let first_row = printed.lines().nth(1).unwrap_or_default();
    assert!(
        first_row.starts_with("gpumem=3000,gpumem-percentage=50")
            && first_row.ends_with(
                "note: gpumem and gpumem-percentage are both set; gpumem is used, as HAMi does"
            ),
        "{printed}"
    );
    // The share's cores default to none reserved (HAMi's defaultCores: 0).
    assert_eq!(spots(&plan, 0), [spot("node-a", "gpu-0", 3000, Some(0))]);
}

#[test]
fn the_plan_prints_as_two_tables() {
    // The whole-GPU request cannot take the shared A100, which holds a share, so it takes the H100.
    let nodes = [node(
        "node-a",
        vec![
            shared_gpu("gpu-0", A100, A100_MIB),
            whole_gpu("gpu-1", H100, H100_MIB),
        ],
    )];
    let plan = plan(
        &nodes,
        &requests(&["gpumem=3000,gpucores=30", "class=gpu", "gpumem=40000"]),
    );
    assert_eq!(
        plan.to_string(),
        "\
REQUEST                  NODE    DEVICE  PRODUCT                MEMORY MiB  CORES
gpumem=3000,gpucores=30  node-a  gpu-0   NVIDIA A100-SXM4-40GB  3000        30
class=gpu                node-a  gpu-1   NVIDIA H100 80GB HBM3  81920       -
gpumem=40000             unplaced: no shared GPU has 40000 MiB free: gpu-0 on node-a has 37960 MiB and 70 cores free

NODE    DEVICE  PRODUCT                MEMORY USED/FREE MiB  CORES USED/FREE
node-a  gpu-0   NVIDIA A100-SXM4-40GB  3000/37960            30/70
node-a  gpu-1   NVIDIA H100 80GB HBM3  81920/0               -
"
    );
}

#[test]
fn requests_parse_from_hami_key_names() {
    let request: Request = "gpumem=3000,gpucores=30".parse().unwrap();
    assert_eq!(
        request,
        Request {
            label: "gpumem=3000,gpucores=30".to_owned(),
            count: 1,
            memory: Memory::Bytes(3000 * MIB),
            cores: Some(30),
            selection: Selection::default(),
            class: Class::Shared,
            profile: None,
            notes: vec![],
        }
    );
    let request: Request = "nvidia.com/gpu=2, nvidia.com/gpumem-percentage=50, nvidia.com/use-gputype=A100,V100, nouse-gpuuuid=GPU-1"
        .parse()
        .unwrap();
    assert_eq!(request.count, 2);
    assert_eq!(request.memory, Memory::Percent(50));
    assert_eq!(request.selection.use_types, ["a100", "v100"]);
    assert_eq!(request.selection.nouse_uuids, ["GPU-1"]);
    let request: Request = "count=2,gpumem=8Gi,nouse-type=H100,nouse-type=T4"
        .parse()
        .unwrap();
    assert_eq!(request.memory, Memory::Bytes(8 << 30));
    assert_eq!(request.selection.nouse_types, ["h100", "t4"]);
    let request: Request = "class=mig,profile=1g.5gb".parse().unwrap();
    assert_eq!(
        (request.class, request.profile.as_deref()),
        (Class::Mig, Some("1g.5gb"))
    );
    let request: Request = "class=gpu.nvidia.com,uuid=GPU-a".parse().unwrap();
    assert_eq!(
        (request.class, request.selection.use_uuids),
        (Class::WholeGpu, vec!["GPU-a".to_owned()])
    );
}

/// What HAMi tolerates reads as the webhook reads a HAMi pod (`crate::hami`), with a note; `3k` is the API server's
/// canonical form of 3000 MiB.
#[test]
fn requests_keep_what_hami_tolerates_as_the_webhook_does() {
    let request: Request = "gpumem=1000,gpumem-percentage=50".parse().unwrap();
    assert_eq!(request.memory, Memory::Bytes(1000 * MIB));
    assert_eq!(
        request.notes,
        ["gpumem and gpumem-percentage are both set; gpumem is used, as HAMi does"]
    );
    let request: Request = "gpumem-percentage=150".parse().unwrap();
    assert_eq!(request.memory, Memory::Percent(100));
    assert_eq!(
        request.notes,
        ["gpumem-percentage 150 is over 100 and taken as 100, as HAMi does"]
    );
    let request: Request = "gpumem=3k".parse().unwrap();
    assert_eq!(request.memory, Memory::Bytes(3000 * MIB));
    let request: Request = "gpumem=0,gpumem-percentage=0".parse().unwrap();
    assert_eq!(request.memory, Memory::Whole);
}

#[test]
fn request_errors_name_the_key_and_the_fix() {
    let error = |text: &str| text.parse::<Request>().unwrap_err().to_string();
    assert_eq!(
        error(""),
        "the request is empty; write key=value pairs such as gpumem=3000,gpucores=30"
    );
    assert_eq!(
        error("gpumem=lots"),
        "gpumem=\"lots\": expected MiB as a whole number (3000), or a quantity with a binary suffix (8Gi, 3000Mi)"
    );
    assert_eq!(
        error("gpucores=101"),
        "gpucores=\"101\": expected a whole percentage of the SMs, 0 to 100"
    );
    assert_eq!(
        error("gpumem-percentage=half"),
        "gpumem-percentage=\"half\": expected a whole percentage of the GPU's memory, 1 to 100"
    );
    assert_eq!(
        error("count=0"),
        "count=\"0\": expected a whole number of devices, 1 or more"
    );
    assert_eq!(
        error("gpumem=1,gpumem=2"),
        "gpumem is given twice; keep one"
    );
    assert_eq!(
        error("gpumemory=1"),
        "unknown key \"gpumemory\"; use count, gpumem, gpumem-percentage, gpucores, type, nouse-type, uuid, nouse-uuid, class or profile"
    );
    assert_eq!(
        error("gpumem=1,A100"),
        "\"A100\" is not key=value; write e.g. gpumem=3000 (bare words only continue a type, nouse-type, uuid or nouse-uuid list)"
    );
    assert_eq!(
        error("class=gpu,gpucores=50"),
        "gpucores does not apply to class=gpu; a whole GPU or MIG device has all of its SMs; use class=shared for a share"
    );
    assert_eq!(
        error("profile=1g.5gb"),
        "profile does not apply to class=shared; add class=mig"
    );
    assert_eq!(
        error("class=vgpu"),
        "class=\"vgpu\": expected shared, gpu or mig"
    );
}

#[test]
fn an_amount_over_max_passes_when_it_is_the_default() {
    // §3.4.3: the default always passes, even above the range's max.
    let mut gpu = shared_gpu("gpu-0", A100, A100_MIB);
    let memory = gpu.capacity.as_mut().unwrap().get_mut("memory").unwrap();
    memory.request_policy = range("40960Mi", "1Mi", "20480Mi", "1Mi");
    let nodes = [node("node-a", vec![gpu])];
    let plan = plan(&nodes, &requests(&["gpumem=40960", "gpumem=30000"]));
    assert_eq!(
        spots(&plan, 0),
        [spot("node-a", "gpu-0", A100_MIB, Some(0))]
    );
    assert_eq!(
        unplaced(&plan, 1),
        "no shared GPU can hold 30000 MiB: gpu-0 on node-a takes at most 20480 MiB (asked 30000 MiB)"
    );
}

#[test]
fn valid_values_take_the_smallest_one_large_enough() {
    let mut gpu = shared_gpu("gpu-0", A100, A100_MIB);
    let memory = gpu.capacity.as_mut().unwrap().get_mut("memory").unwrap();
    memory.request_policy = Some(CapacityRequestPolicy {
        default: Some(quantity("8Gi")),
        valid_range: None,
        valid_values: Some(vec![quantity("1Gi"), quantity("4Gi"), quantity("8Gi")]),
    });
    let nodes = [node("node-a", vec![gpu])];
    let plan = plan(
        &nodes,
        &requests(&["gpumem=3000", "gpumem=9Gi", "gpucores=5", "gpumem=1Gi"]),
    );
    assert_eq!(spots(&plan, 0), [spot("node-a", "gpu-0", 4096, Some(0))]);
    assert_eq!(
        unplaced(&plan, 1),
        "no shared GPU can hold 9216 MiB: gpu-0 on node-a takes at most 8192 MiB (asked 9216 MiB)"
    );
    assert_eq!(spots(&plan, 2), [spot("node-a", "gpu-0", 8192, Some(5))]);
    assert_eq!(spots(&plan, 3), [spot("node-a", "gpu-0", 1024, Some(0))]);
}

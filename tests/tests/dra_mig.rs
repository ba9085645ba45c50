//! MIG on demand (`DRA_DYNAMIC_MIG_GPUS`) on a real kubelet: the driver publishes every MIG profile and placement
//! of a simulated H100-80GB as devices that consume the GPU's counters, the real kube-scheduler picks a placement
//! for each claim, and the driver creates the instance when the kubelet prepares the claim and destroys it when the
//! pod is gone. The GPU's MIG mode is turned on as an admin would, with NVIDIA's `all-enabled` config.

use std::path::Path;
use std::time::Duration;

use e2e::agents::{NodeAgent, simulator_tool};
use e2e::dra::{
    Cleanup, claim_of, claim_pod, slice_named, slice_of, start_driver, wait_unschedulable,
};
use e2e::kubelet::{Kubelet, delete_pod, gpu_pod};
use e2e::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const NODE: &str = "e2e-dra-mig";
/// The driver's environment: the node's one GPU is its own, served as MIG on demand.
const ON_DEMAND: [(&str, &str); 3] = [
    ("DRA_GPUS", "all"),
    ("DRA_SHARED_GPUS", "none"),
    ("DRA_DYNAMIC_MIG_GPUS", "all"),
];

/// A ResourceClaimTemplate for one MIG device of `profile`, as NVIDIA's DRA driver's users write it.
fn mig_template(profile: &str) -> String {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(profile), "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{
            "name": "mig",
            "exactly": {
                "deviceClassName": "mig.nvidia.com",
                "selectors": [{"cel": {"expression":
                    format!("device.attributes[\"gpu.nvidia.com\"].profile == \"{profile}\"")}}]
            }
        }]}}}
    })
    .to_string()
}

fn template_name(profile: &str) -> String {
    format!("e2e-mig-{}", profile.replace('.', "-"))
}

/// The GPU instances of the simulated GPU 0 as its state file holds them: (id, profile id, placement start,
/// compute instances). Read from the file itself, which the simulator replaces whole on every change, so that the
/// test sees an instance the moment it exists, without the injected delay the simulator's calls wait.
fn gpu_instances(state: &Path) -> Vec<(u64, u64, u64, usize)> {
    let text = std::fs::read_to_string(state).expect("the simulator's state file");
    let state: Value = serde_json::from_str(&text).expect("JSON state");
    state["gpus"][0]["gpu_instances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|instance| {
            (
                instance["id"].as_u64().unwrap_or_default(),
                instance["profile_id"].as_u64().unwrap_or_default(),
                instance["placement"]["start"].as_u64().unwrap_or_default(),
                instance["compute_instances"].as_array().map_or(0, Vec::len),
            )
        })
        .collect()
}

/// The MIG device UUIDs of the node, as the simulator tool lists them.
fn mig_uuids(state: &Path) -> Vec<String> {
    simulator_tool(NODE, state, &["devices"])
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1).map(str::to_owned))
        .collect()
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn mig_on_demand_on_a_real_kubelet() {
    chart_installed();
    let dir = scenario_dir(NODE);
    let state = dir.join(format!("{NODE}.json"));
    let host = dir.join("host");
    let cdi_dir = host.join("cdi");
    std::fs::create_dir_all(&cdi_dir).expect("CDI directory");
    let profiles = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb"];
    let mut objects: Vec<(&'static str, String)> = [
        "mig-small",
        "mig-medium",
        "mig-large",
        "mig-none",
        "mig-again",
        "mig-extended",
        "mig-share-8",
        "mig-share-16",
    ]
    .iter()
    .map(|pod| ("pod", (*pod).to_owned()))
    .collect();
    objects.extend(
        profiles
            .iter()
            .map(|profile| ("resourceclaimtemplate", template_name(profile))),
    );
    objects.extend(
        ["mig-share-8", "mig-share-16"].map(|name| ("resourceclaimtemplate", name.to_owned())),
    );
    let _cleanup = Cleanup(objects);

    step(
        "a real kubelet joins with a simulated H100-80GB; the admin turns MIG mode on with NVIDIA's all-enabled",
    );
    let kubelet = Kubelet::start_resolving_cdi(NODE, &dir.join("kubelet"), &[], &cdi_dir);
    kubectl(&[
        "annotate",
        "node",
        NODE,
        "nvidia.com/gpu.simulator=h100-80gb:1",
        "--overwrite",
    ]);
    e2e::dra::mig_mode_on(NODE, &state);
    let root = kubelet.root();
    let mut driver = start_driver(NODE, &state, &root, &host, &ON_DEMAND);
    let logs =
        |driver: &NodeAgent| format!("{}\ndriver log:\n{}", kubelet.output(), driver.output());

    step(
        "the pool: every profile and placement as a device consuming gpu-0-counter-set, the counters apart",
    );
    let slice = eventually(WAIT, || Ok(slice_of(NODE)))
        .unwrap_or_else(|error| panic!("no ResourceSlice: {error:#}\n{}", logs(&driver)));
    let devices = slice["spec"]["devices"]
        .as_array()
        .expect("devices")
        .clone();
    assert_eq!(slice["spec"]["pool"]["resourceSliceCount"], 2, "{slice:#}");
    assert_eq!(devices.len(), 25, "H100-80GB: 7+7+4+3+2+1+1 placements");
    assert_eq!(devices[0]["name"], "gpu-0-mig-1g10gb-19-6");
    assert!(
        devices
            .iter()
            .all(|device| device["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set"),
        "{slice:#}"
    );
    let counters =
        slice_named(&format!("{NODE}-gpu.nvidia.com-counters")).expect("the counters slice");
    let set = &counters["spec"]["sharedCounters"][0];
    assert_eq!(set["name"], "gpu-0-counter-set");
    assert_eq!(set["counters"]["memory-slice-7"]["value"], "1");
    assert_eq!(set["counters"]["compute-slices"]["value"], "7");
    assert!(
        gpu_instances(&state).is_empty(),
        "nothing is made before a claim"
    );

    step(
        "claims for 1g.10gb, 2g.20gb and 3g.40gb run at once, each container with its own MIG device",
    );
    for profile in profiles {
        assert!(kubectl_apply(&mig_template(profile), &[]).success);
    }
    let pods = [
        ("mig-small", "1g.10gb"),
        ("mig-medium", "2g.20gb"),
        ("mig-large", "3g.40gb"),
    ];
    for (pod, profile) in pods {
        assert!(kubectl_apply(&claim_pod(pod, NODE, &template_name(profile)), &[]).success);
    }
    let mut visible = Vec::new();
    for (pod, profile) in pods {
        let running = e2e::kubelet::wait_running(pod, WAIT, &|| logs(&driver));
        let claim = kubectl_json(&["get", "resourceclaim", &claim_of(&running), "-n", "default"]);
        let device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
            .as_str()
            .expect("an allocated device")
            .to_owned();
        assert!(
            device.starts_with(&format!("gpu-0-mig-{}-", profile.replace('.', ""))),
            "{pod}: {device}"
        );
        let container = kubelet.container_of(pod).expect("the container");
        let uid = claim["metadata"]["uid"].as_str().expect("claim uid");
        assert_eq!(
            container["cdiDevices"],
            json!([format!("k8s.gpu.nvidia.com/claim={uid}-{device}")])
        );
        let uuid = container["env"]["NVIDIA_VISIBLE_DEVICES"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(uuid.starts_with("MIG-"), "{container}");
        visible.push(uuid);
    }
    let mut listed = mig_uuids(&state);
    listed.sort();
    let mut expected = visible.clone();
    expected.sort();
    expected.dedup();
    assert_eq!(listed, expected, "three instances, one per container");

    step(
        "a claim for 4g.40gb, whose one placement the 3g.40gb holds, stays Pending with the scheduler's reason",
    );
    assert!(kubectl_apply(&claim_pod("mig-none", NODE, &template_name("4g.40gb")), &[]).success);
    let condition = wait_unschedulable("mig-none");
    assert!(
        condition["message"]
            .as_str()
            .is_some_and(|message| message.contains("claim")),
        "{condition:#}"
    );

    step("deleting the 2g.20gb pod destroys its instance only");
    delete_pod("mig-medium");
    eventually(
        WAIT,
        || Ok((gpu_instances(&state).len() == 2).then_some(())),
    )
    .unwrap_or_else(|error| panic!("the instance stayed: {error:#}\n{}", logs(&driver)));
    let mut left = mig_uuids(&state);
    left.sort();
    let mut kept = vec![visible[0].clone(), visible[2].clone()];
    kept.sort();
    assert_eq!(left, kept, "the other pods' devices are untouched");

    step(
        "the driver killed between the GPU instance and its compute instance leaves no orphan after restart",
    );
    simulator_tool(NODE, &state, &["delay", "4000"]);
    assert!(
        kubectl_apply(
            &claim_pod("mig-again", NODE, &template_name("2g.20gb")),
            &[]
        )
        .success
    );
    eventually(WAIT, || {
        Ok(gpu_instances(&state)
            .iter()
            .any(|&(_, _, _, computes)| computes == 0)
            .then_some(()))
    })
    .unwrap_or_else(|error| panic!("no GPU instance was made: {error:#}\n{}", logs(&driver)));
    driver.kill();
    assert!(
        gpu_instances(&state)
            .iter()
            .any(|&(_, _, _, computes)| computes == 0),
        "the half-made instance is there when the driver dies"
    );
    simulator_tool(NODE, &state, &["delay", "0"]);
    driver = start_driver(NODE, &state, &root, &host, &ON_DEMAND);
    e2e::kubelet::wait_running("mig-again", WAIT, &|| logs(&driver));
    let instances = gpu_instances(&state);
    assert_eq!(
        instances.len(),
        3,
        "1g, 3g and the new 2g: {instances:?}\n{}",
        logs(&driver)
    );
    assert!(
        instances.iter().all(|&(_, _, _, computes)| computes == 1),
        "{instances:?}"
    );
    assert!(
        driver
            .output()
            .contains("destroyed a MIG instance no claim holds"),
        "{}",
        logs(&driver)
    );
    assert_eq!(
        kubectl_json(&["get", "pod", "mig-none", "-n", "default"])["status"]["phase"],
        "Pending"
    );

    step(
        "a classic pod asking for nvidia.com/mig-3g.40gb gets the 3g.40gb placement through the chart's DeviceClass",
    );
    delete_pod("mig-none");
    delete_pod("mig-large");
    eventually(
        WAIT,
        || Ok((gpu_instances(&state).len() == 2).then_some(())),
    )
    .unwrap_or_else(|error| panic!("the 3g.40gb instance stayed: {error:#}\n{}", logs(&driver)));
    assert!(
        kubectl_apply(
            &gpu_pod("mig-extended", NODE, "nvidia.com/mig-3g.40gb", 1),
            &[]
        )
        .success
    );
    let running = e2e::kubelet::wait_running("mig-extended", WAIT, &|| logs(&driver));
    let claim = kubectl_json(&["get", "resourceclaim", &claim_of(&running), "-n", "default"]);
    let result = &claim["status"]["allocation"]["devices"]["results"][0];
    assert_eq!(result["device"], "gpu-0-mig-3g40gb-9-0", "{claim:#}");
    let container = kubelet.container_of("mig-extended").expect("the container");
    let uuid = container["env"]["NVIDIA_VISIBLE_DEVICES"]
        .as_str()
        .unwrap_or_default();
    assert!(
        uuid.starts_with("MIG-") && mig_uuids(&state).iter().any(|listed| listed == uuid),
        "{container}"
    );

    step(
        "the GPU also shared: two pods of 8Gi and 16Gi share one 3g.40gb instance, each with its own MPS memory limit",
    );
    for pod in ["mig-small", "mig-again", "mig-extended"] {
        delete_pod(pod);
    }
    eventually(WAIT, || Ok(gpu_instances(&state).is_empty().then_some(())))
        .unwrap_or_else(|error| panic!("instances stayed: {error:#}\n{}", logs(&driver)));
    driver.kill();
    let driver = start_driver(
        NODE,
        &state,
        &root,
        &host,
        &[
            ("DRA_GPUS", "all"),
            ("DRA_SHARED_GPUS", "all"),
            ("DRA_DYNAMIC_MIG_GPUS", "all"),
        ],
    );
    eventually(WAIT, || {
        Ok(slice_of(NODE)
            .is_some_and(|slice| slice["spec"]["devices"][0]["allowMultipleAllocations"] == true)
            .then_some(()))
    })
    .unwrap_or_else(|error| panic!("the slice never shared: {error:#}\n{}", logs(&driver)));
    let mut limits = Vec::new();
    let mut uuids = Vec::new();
    for (pod, memory) in [("mig-share-8", "8Gi"), ("mig-share-16", "16Gi")] {
        assert!(kubectl_apply(&share_template(pod, memory), &[]).success);
        assert!(kubectl_apply(&claim_pod(pod, NODE, pod), &[]).success);
        e2e::kubelet::wait_running(pod, WAIT, &|| logs(&driver));
        let container = kubelet.container_of(pod).expect("the container");
        uuids.push(
            container["env"]["NVIDIA_VISIBLE_DEVICES"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        limits.push(container["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].clone());
    }
    assert!(
        uuids[0].starts_with("MIG-") && uuids[0] == uuids[1],
        "{uuids:?}"
    );
    assert_eq!(limits, [json!("0=8192M"), json!("0=16384M")]);
    assert_eq!(gpu_instances(&state).len(), 1, "one instance for both");
    delete_pod("mig-share-8");
    assert_eq!(
        gpu_instances(&state).len(),
        1,
        "the other pod still holds it"
    );
    delete_pod("mig-share-16");
    eventually(WAIT, || Ok(gpu_instances(&state).is_empty().then_some(())))
        .unwrap_or_else(|error| panic!("the shared instance stayed: {error:#}\n{}", logs(&driver)));
}

/// A ResourceClaimTemplate named `name` for `memory` of a 3g.40gb instance that others may share.
fn share_template(name: &str, memory: &str) -> String {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{
            "name": "mig",
            "exactly": {
                "deviceClassName": "mig.nvidia.com",
                "selectors": [{"cel": {"expression":
                    "device.attributes[\"gpu.nvidia.com\"].profile == \"3g.40gb\""}}],
                "capacity": {"requests": {"memory": memory}}
            }
        }]}}}
    })
    .to_string()
}

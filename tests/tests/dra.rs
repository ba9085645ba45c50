//! The DRA driver (`gpu-dra-driver run`) against the local cluster: the real kube-scheduler allocates
//! claims from the ResourceSlices the driver publishes (consumable memory and cores on shared GPUs), and on a real
//! kubelet ([`e2e::kubelet`], fake container runtime that resolves CDI devices as containerd does) the kubelet
//! registers the driver, calls NodePrepareResources and hands the container the claim's CDI edits.

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::agents::{NodeAgent, add_simulated_node, node_agent_bin};
use e2e::dra::{
    Cleanup, checkpoint, checkpoint_path, claim_of, claim_pod, slice_of, wait_unschedulable,
};
use e2e::kubelet::{Kubelet, delete_pod, gpu_pod};
use e2e::plugin::DevicePlugin;
use e2e::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const KUBELET_NODE: &str = "e2e-dra-kubelet";

/// A ResourceClaimTemplate for part of a shared GPU.
fn share_template(name: &str, memory: &str, cores: Option<u32>) -> String {
    let mut requests = json!({"memory": memory});
    if let Some(cores) = cores {
        requests["cores"] = cores.to_string().into();
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{
            "name": "gpu",
            "exactly": {"deviceClassName": "shared.gpu.nvidia.com", "capacity": {"requests": requests}}
        }]}}}
    })
    .to_string()
}

/// A quantity's value: the API server writes consumed capacity in its own form (`3000Mi` comes back `3145728k`).
fn bytes(quantity: &Value) -> u64 {
    let text = quantity.as_str().expect("a quantity");
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let factor: u64 = match suffix {
        "" => 1,
        "k" => 1000,
        "M" => 1000_u64.pow(2),
        "G" => 1000_u64.pow(3),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("unexpected quantity suffix {other} in {text}"),
    };
    number.parse::<u64>().expect("an integer quantity") * factor
}

/// The driver for `node` with its GPUs in `gpus` all shared, as the chart's defaults share them.
fn start_driver(node: &str, state: &Path, root: &Path, host: &Path, gpus: &str) -> NodeAgent {
    e2e::dra::start_driver(
        node,
        state,
        root,
        host,
        &[("DRA_GPUS", gpus), ("DRA_SHARED_GPUS", "all")],
    )
}

/// The pod once Running, else a panic with its description and `logs`.
fn wait_running(name: &str, logs: &dyn Fn() -> String) -> Value {
    e2e::kubelet::wait_running(name, WAIT, logs)
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn dra_driver_on_a_real_kubelet() {
    chart_installed();
    let dir = scenario_dir("e2e-dra-kubelet");
    let state = dir.join(format!("{KUBELET_NODE}.json"));
    let host = dir.join("host");
    let cdi_dir = host.join("cdi");
    std::fs::create_dir_all(&cdi_dir).expect("CDI directory");
    let _cleanup = Cleanup(vec![
        ("pod", "e2e-dra-a".into()),
        ("pod", "e2e-dra-b".into()),
        ("pod", "e2e-dra-late".into()),
        ("pod", "e2e-dra-tainted".into()),
        ("pod", "e2e-dra-extended".into()),
        ("pod", "e2e-dra-classic".into()),
        ("pod", "e2e-dra-capped".into()),
        ("pod", "training".into()),
        ("pod", "notebook".into()),
        ("resourceclaimtemplate", "e2e-share-3000-30".into()),
        ("resourceclaimtemplate", "e2e-share-2g".into()),
    ]);

    step(
        "a real kubelet joins as e2e-dra-kubelet with 2 simulated A100-40GB; GPU 1 is the DRA driver's, GPU 0 the plugin's",
    );
    let kubelet = Kubelet::start_resolving_cdi(KUBELET_NODE, &dir.join("kubelet"), &[], &cdi_dir);
    kubectl(&[
        "annotate",
        "node",
        KUBELET_NODE,
        "nvidia.com/gpu.simulator=a100-40gb:2",
        "--overwrite",
    ]);
    let root: PathBuf = kubelet.root();
    let mut driver = start_driver(KUBELET_NODE, &state, &root, &host, "1");
    let plugin = DevicePlugin::start_on(
        Path::new(e2e::kubelet::DEVICE_PLUGIN_ROOT),
        KUBELET_NODE,
        &state,
        &["--dra-gpus", "1"],
    );
    let logs = |driver: &NodeAgent| {
        format!(
            "{}\ndriver log:\n{}\nplugin log:\n{}",
            kubelet.output(),
            driver.output(),
            plugin.output()
        )
    };

    step("the driver publishes one shared device, gpu-1; the plugin advertises GPU 0 alone");
    let slice = eventually(WAIT, || Ok(slice_of(KUBELET_NODE)))
        .unwrap_or_else(|error| panic!("no ResourceSlice: {error:#}\n{}", logs(&driver)));
    let devices = &slice["spec"]["devices"];
    assert_eq!(devices.as_array().map(Vec::len), Some(1), "{slice:#}");
    assert_eq!(devices[0]["name"], "gpu-1");
    assert_eq!(devices[0]["allowMultipleAllocations"], true);
    assert_eq!(devices[0]["capacity"]["memory"]["value"], "40Gi");
    assert_eq!(
        devices[0]["capacity"]["cores"]["requestPolicy"]["default"],
        "0"
    );
    let dra_uuid = devices[0]["attributes"]["uuid"]["string"]
        .as_str()
        .expect("the uuid attribute")
        .to_owned();
    eventually(WAIT, || {
        Ok(
            (e2e::kubelet::allocatable(KUBELET_NODE, "nvidia.com/gpu").as_deref() == Some("1"))
                .then_some(()),
        )
    })
    .unwrap_or_else(|error| {
        panic!(
            "allocatable nvidia.com/gpu never 1: {error:#}\n{}",
            logs(&driver)
        )
    });

    step(
        "a pod with a claim of 3000Mi and 30 cores: the scheduler allocates, the kubelet prepares, the container gets the limits through CDI",
    );
    assert!(
        kubectl_apply(
            &share_template("e2e-share-3000-30", "3000Mi", Some(30)),
            &[]
        )
        .success
    );
    assert!(
        kubectl_apply(
            &claim_pod("e2e-dra-a", KUBELET_NODE, "e2e-share-3000-30"),
            &[]
        )
        .success
    );
    let pod_a = wait_running("e2e-dra-a", &|| logs(&driver));
    let claim_a = claim_of(&pod_a);
    // The claim the scheduler allocated for the pod is read when the pod is bound, under the chart's RBAC, and it is
    // one a prepare may take without a read (generated for the pod, reserved for it). Whether the kubelet's prepare
    // came before or after that read is a race: the benchmark measures what it saves.
    let read_ahead = format!("read ahead claim={claim_a} kept=true");
    eventually(WAIT, || {
        Ok(driver
            .output()
            .lines()
            .any(|line| line.contains(&read_ahead))
            .then_some(()))
    })
    .unwrap_or_else(|error| panic!("{claim_a} not read ahead: {error:#}\n{}", logs(&driver)));
    // The claim's own status says what holds it to its share, written by the driver under the chart's RBAC and
    // node-bound policy.
    let device_status = eventually(WAIT, || {
        let claim = kubectl_json(&["get", "resourceclaim", &claim_a, "-n", "default"]);
        let status = claim["status"]["devices"][0].clone();
        Ok((!status.is_null()).then_some(status))
    })
    .unwrap_or_else(|error| {
        panic!(
            "no device status on {claim_a}: {error:#}\n{}",
            logs(&driver)
        )
    });
    assert_eq!(device_status["device"], "gpu-1", "{device_status:#}");
    assert_eq!(device_status["data"]["memoryEnforcement"], "mpsPinned");
    assert_eq!(device_status["data"]["memoryMiB"], 3000);
    assert_eq!(device_status["data"]["cores"], 30);
    let claim = kubectl_json(&["get", "resourceclaim", &claim_a, "-n", "default"]);
    let result = &claim["status"]["allocation"]["devices"]["results"][0];
    assert_eq!(result["device"], "gpu-1");
    assert_eq!(
        bytes(&result["consumedCapacity"]["memory"]),
        3000 << 20,
        "{claim:#}"
    );
    assert_eq!(result["consumedCapacity"]["cores"], "30");
    let container = kubelet
        .container_of("e2e-dra-a")
        .unwrap_or_else(|| panic!("no container for e2e-dra-a\n{}", logs(&driver)));
    let claim_uid = claim["metadata"]["uid"].as_str().expect("claim uid");
    assert_eq!(
        container["cdiDevices"],
        json!([format!("k8s.gpu.nvidia.com/claim={claim_uid}-gpu-1")])
    );
    assert_eq!(
        container["env"]["NVIDIA_VISIBLE_DEVICES"],
        dra_uuid.as_str()
    );
    assert_eq!(
        container["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
        "0=3000M"
    );
    assert_eq!(container["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
    assert_eq!(
        container["env"]["CUDA_MPS_PIPE_DIRECTORY"],
        "/tmp/nvidia-mps"
    );
    assert!(
        container["mounts"]["/tmp/nvidia-mps"]
            .as_str()
            .is_some_and(|host_path| host_path.ends_with(&format!("{claim_uid}/gpu-1/pipe"))),
        "{container}"
    );

    step("a classic nvidia.com/gpu pod on the same node gets GPU 0, never the DRA driver's GPU");
    assert!(
        kubectl_apply(
            &gpu_pod("e2e-dra-classic", KUBELET_NODE, "nvidia.com/gpu", 1),
            &[]
        )
        .success
    );
    wait_running("e2e-dra-classic", &|| logs(&driver));
    let classic = kubelet
        .container_of("e2e-dra-classic")
        .expect("classic container");
    let classic_uuid = classic["env"]["NVIDIA_VISIBLE_DEVICES"]
        .as_str()
        .unwrap_or_default();
    assert!(
        classic_uuid.starts_with("GPU-") && classic_uuid != dra_uuid,
        "{classic}"
    );

    step(
        "GPUNode shows gpu-1 with one claim: 3000 MiB and 30 cores allocated, the rest free; no MPS daemon on simulated GPUs",
    );
    eventually(WAIT, || {
        let status = &kubectl_json(&["get", "gpunode", KUBELET_NODE])["status"]["dra"];
        let device = &status["devices"][0];
        Ok((device["claims"] == 1
            && device["memoryAllocatedMiB"] == 3000
            && device["memoryFreeMiB"] == 37960
            && device["coresFree"] == 70
            && status["enforcement"]
                .as_str()
                .is_some_and(|text| text.starts_with("none: simulated GPUs")))
        .then_some(()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "GPUNode dra status never matched: {error:#}\n{:#}\n{}",
            kubectl_json(&["get", "gpunode", KUBELET_NODE])["status"],
            logs(&driver)
        )
    });

    assert_eq!(
        slice_of(KUBELET_NODE).expect("slice")["spec"]["pool"]["generation"],
        slice["spec"]["pool"]["generation"],
        "claims came and were prepared, the devices did not change: the slice was not written again"
    );

    step(
        "the exporter attributes GPU 1's series to the claim's pod with NVIDIA's dra_* labels, from the kubelet's pod resources",
    );
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let root_text = root.display().to_string();
    let exporter = NodeAgent::start(
        &node_agent_bin(),
        KUBELET_NODE,
        "nvidia-dcgm-exporter",
        &state,
        &[
            "exporter",
            "--listen",
            &listen,
            "--collect-interval",
            "1",
            "--kubelet-root",
            &root_text,
        ],
        &[],
    );
    let expected = [
        "pod=\"e2e-dra-a\"".to_owned(),
        format!("dra_claim_name=\"{claim_a}\""),
        "dra_claim_namespace=\"default\"".to_owned(),
        "dra_driver_name=\"gpu.nvidia.com\"".to_owned(),
        "dra_device_name=\"gpu-1\"".to_owned(),
    ];
    let line = eventually(WAIT, || {
        let body = http_get(port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        Ok(body
            .lines()
            .find(|line| {
                line.starts_with("DCGM_FI_DEV_FB_USED{")
                    && expected.iter().all(|label| line.contains(label.as_str()))
            })
            .map(str::to_owned))
    })
    .unwrap_or_else(|error| {
        panic!(
            "no attributed series: {error:#}\nexporter log:\n{}",
            exporter.output()
        )
    });
    eprintln!("{line}");
    drop(exporter);

    step(
        "XID 79 on GPU 1: the kubelet shows the pod's device Unhealthy (the driver's health stream), the slice taints gpu-1 so a new claim waits; once the GPU is quiet all clears and the claim is allocated",
    );
    e2e::plugin::inject_xid(KUBELET_NODE, &state, 1, 79);
    let resource_id = format!("k8s.gpu.nvidia.com/claim={claim_uid}-gpu-1");
    let device_health = |health: &str| {
        let pod = kubectl_json(&["get", "pod", "e2e-dra-a", "-n", "default"]);
        let statuses = &pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"];
        (statuses[0]["name"] == "claim:gpu"
            && statuses[0]["resources"][0]["resourceID"] == resource_id.as_str()
            && statuses[0]["resources"][0]["health"] == health)
            .then(|| statuses[0]["resources"][0].clone())
    };
    let unhealthy = eventually(WAIT, || Ok(device_health("Unhealthy"))).unwrap_or_else(|error| {
        panic!(
            "the kubelet never showed the device Unhealthy: {error:#}\n{:#}\n{}",
            kubectl_json(&["get", "pod", "e2e-dra-a", "-n", "default"])["status"],
            logs(&driver)
        )
    });
    assert_eq!(unhealthy["message"], "GPU 1 reported critical XID 79");
    let taints = &slice_of(KUBELET_NODE).expect("slice")["spec"]["devices"][0]["taints"];
    assert_eq!(taints[0]["key"], "gpu.nvidia.com/xid", "{taints}");
    assert_eq!(taints[0]["value"], "79");
    assert_eq!(taints[0]["effect"], "NoSchedule");
    assert_eq!(
        kubectl_json(&["get", "gpunode", KUBELET_NODE])["status"]["dra"]["devices"][0]["unhealthy"],
        "GPU 1 reported critical XID 79"
    );
    assert!(
        kubectl_apply(
            &claim_pod("e2e-dra-tainted", KUBELET_NODE, "e2e-share-3000-30"),
            &[]
        )
        .success
    );
    let waiting = wait_unschedulable("e2e-dra-tainted");
    eprintln!("while tainted: {}", waiting["message"]);
    eventually(WAIT, || Ok(device_health("Healthy"))).unwrap_or_else(|error| {
        panic!(
            "the device never became Healthy again: {error:#}\n{}",
            logs(&driver)
        )
    });
    assert_eq!(
        slice_of(KUBELET_NODE).expect("slice")["spec"]["devices"][0]["taints"],
        Value::Null
    );
    wait_running("e2e-dra-tainted", &|| logs(&driver));
    delete_pod("e2e-dra-tainted");

    step(
        "the driver is killed and a pod is created meanwhile: after the restart that pod runs, and the first claim is prepared once; the checkpoint is where 0.1.0 kept it, as after an upgrade",
    );
    driver.kill();
    let legacy = root.join("plugins/gpu.nvidia.com/checkpoint.json");
    // Copied and removed: the kubelet's root and the host directory may be on different filesystems.
    std::fs::copy(checkpoint_path(&host), &legacy).expect("the checkpoint put where 0.1.0 kept it");
    std::fs::remove_file(checkpoint_path(&host))
        .expect("the checkpoint gone from the state directory");
    assert!(kubectl_apply(&share_template("e2e-share-2g", "2Gi", None), &[]).success);
    assert!(kubectl_apply(&claim_pod("e2e-dra-b", KUBELET_NODE, "e2e-share-2g"), &[]).success);
    std::thread::sleep(Duration::from_secs(3));
    driver = start_driver(KUBELET_NODE, &state, &root, &host, "1");
    wait_running("e2e-dra-b", &|| logs(&driver));
    assert!(
        !legacy.exists(),
        "the upgraded driver moved the checkpoint to its state directory"
    );
    let prepared = checkpoint(&host);
    let claims = prepared["claims"].as_object().map(|claims| claims.len());
    assert_eq!(claims, Some(2), "{prepared:#}");
    let b = kubelet
        .container_of("e2e-dra-b")
        .expect("container of e2e-dra-b");
    assert_eq!(b["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=2048M");
    assert_eq!(
        b["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "100",
        "no cores asked: not capped"
    );

    step(
        "the kubelet restarts and wipes the node's slices: the driver publishes again, both pods keep running, nothing is prepared twice",
    );
    let generation = slice_of(KUBELET_NODE).expect("slice")["spec"]["pool"]["generation"].clone();
    kubelet.restart();
    eventually(WAIT, || {
        Ok(slice_of(KUBELET_NODE)
            .filter(|slice| slice["metadata"]["uid"] != Value::Null)
            .map(drop))
    })
    .unwrap_or_else(|error| panic!("the slice never came back: {error:#}\n{}", logs(&driver)));
    eprintln!("slice generation before the kubelet restart: {generation}");
    for pod in ["e2e-dra-a", "e2e-dra-b"] {
        let seen = kubectl_json(&["get", "pod", pod, "-n", "default"]);
        assert_eq!(seen["status"]["phase"], "Running", "{pod}");
    }
    assert_eq!(
        checkpoint(&host)["claims"]
            .as_object()
            .map(|claims| claims.len()),
        Some(2)
    );
    assert!(
        kubectl_apply(
            &claim_pod("e2e-dra-late", KUBELET_NODE, "e2e-share-2g"),
            &[]
        )
        .success
    );
    wait_running("e2e-dra-late", &|| logs(&driver));

    step(
        "deleting a pod unprepares its claim: the claim is gone, its CDI spec removed, GPUNode frees its share",
    );
    delete_pod("e2e-dra-a");
    eventually(WAIT, || {
        let gone = !run(
            "kubectl",
            &["get", "resourceclaim", &claim_a, "-n", "default"],
        )
        .success;
        let unprepared = checkpoint(&host)["claims"].get(claim_uid).is_none();
        Ok((gone && unprepared).then_some(()))
    })
    .unwrap_or_else(|error| panic!("claim {claim_a} never went: {error:#}\n{}", logs(&driver)));
    assert!(
        !cdi_dir
            .join(format!("k8s.gpu.nvidia.com-claim_{claim_uid}.json"))
            .exists()
    );

    step(
        "the README's example, examples/dra/shared-gpu-claims.yaml: both pods share GPU 1 with their own limits",
    );
    let example = repo_root().join("examples/dra/shared-gpu-claims.yaml");
    let applied = run(
        "kubectl",
        &[
            "apply",
            "-n",
            "default",
            "-f",
            &example.display().to_string(),
        ],
    );
    assert!(applied.success, "{}", applied.stderr);
    for pod in ["training", "notebook"] {
        wait_running(pod, &|| logs(&driver));
    }
    let training = kubelet
        .container_of("training")
        .expect("training's container");
    assert_eq!(
        training["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
        "0=3000M"
    );
    assert_eq!(training["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
    let notebook = kubelet
        .container_of("notebook")
        .expect("notebook's container");
    assert_eq!(
        notebook["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
        "0=2048M"
    );
    assert_eq!(notebook["env"]["NVIDIA_VISIBLE_DEVICES"], dra_uuid.as_str());
    run(
        "kubectl",
        &[
            "delete",
            "-n",
            "default",
            "--wait=false",
            "-f",
            &example.display().to_string(),
        ],
    );

    step(
        "every GPU the driver's (label nvidia.com/dra.gpus=all): the device plugin advertises none, and a classic nvidia.com/gpu pod is served through the gpu.nvidia.com class: the scheduler's claim, prepared by the driver, its CDI device in the container",
    );
    delete_pod("e2e-dra-classic");
    kubectl(&[
        "label",
        "node",
        KUBELET_NODE,
        "nvidia.com/dra.gpus=all",
        "--overwrite",
    ]);
    eventually(WAIT, || {
        let none = matches!(
            e2e::kubelet::allocatable(KUBELET_NODE, "nvidia.com/gpu").as_deref(),
            None | Some("0")
        );
        let both = slice_of(KUBELET_NODE)
            .is_some_and(|slice| slice["spec"]["devices"].as_array().map(Vec::len) == Some(2));
        Ok((none && both).then_some(()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "GPU 0 never moved to the driver: {error:#}\n{}",
            logs(&driver)
        )
    });
    assert!(
        kubectl_apply(
            &gpu_pod("e2e-dra-extended", KUBELET_NODE, "nvidia.com/gpu", 1),
            &[]
        )
        .success
    );
    let pod = wait_running("e2e-dra-extended", &|| logs(&driver));
    let claim = claim_of(&pod);
    let claim = kubectl_json(&["get", "resourceclaim", &claim, "-n", "default"]);
    let device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        .as_str()
        .unwrap_or_else(|| panic!("no device allocated: {claim:#}"));
    let container = kubelet
        .container_of("e2e-dra-extended")
        .unwrap_or_else(|| panic!("no container for e2e-dra-extended\n{}", logs(&driver)));
    assert_eq!(
        container["cdiDevices"],
        json!([format!(
            "k8s.gpu.nvidia.com/claim={}-{device}",
            claim["metadata"]["uid"].as_str().expect("claim uid")
        )])
    );
    assert!(
        container["env"]["NVIDIA_VISIBLE_DEVICES"]
            .as_str()
            .is_some_and(|uuid| uuid.starts_with("GPU-")),
        "{container}"
    );
    delete_pod("e2e-dra-extended");
    kubectl(&["label", "node", KUBELET_NODE, "nvidia.com/dra.gpus-"]);
    // Until the driver publishes GPU 1 alone, the scheduler may still allocate GPU 0 from the slice it read:
    // a claim allocated so would never be prepared, by this driver or the one restarted below.
    eventually(WAIT, || {
        let plugin_has_gpu_0 =
            e2e::kubelet::allocatable(KUBELET_NODE, "nvidia.com/gpu").as_deref() == Some("1");
        let gpu_1_alone = slice_of(KUBELET_NODE).is_some_and(|slice| {
            slice["spec"]["devices"].as_array().map(|devices| {
                devices
                    .iter()
                    .map(|device| device["name"].clone())
                    .collect::<Vec<_>>()
            }) == Some(vec![json!("gpu-1")])
        });
        Ok((plugin_has_gpu_0 && gpu_1_alone).then_some(()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "without the label, GPU 0 never went back to the plugin: {error:#}\n{}",
            logs(&driver)
        )
    });

    step(
        "an R615 driver and a toolkit whose CDI hook applies memory limits (MEMORY_LIMIT_HOOK, as the operator renders it for toolkit 1.20.1+): on a cgroup v2 host the driver holds the claim's memory through the hook, elsewhere MPS does and GPUNode says why",
    );
    driver.kill();
    e2e::agents::simulator_tool(KUBELET_NODE, &state, &["driver-version", "615.10.02"]);
    let hook = "/usr/local/nvidia/toolkit/nvidia-cdi-hook";
    driver = e2e::dra::start_driver(
        KUBELET_NODE,
        &state,
        &root,
        &host,
        &[
            ("DRA_GPUS", "1"),
            ("DRA_SHARED_GPUS", "all"),
            ("MEMORY_LIMIT_HOOK", hook),
        ],
    );
    // The restarted driver's status, once it is written: the driver is up before the pod comes.
    let cgroup_v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let status = eventually(WAIT, || {
        let status = kubectl_json(&["get", "gpunode", KUBELET_NODE])["status"]["dra"].clone();
        let enforcement = status["devices"]
            .as_array()
            .and_then(|devices| devices.iter().find(|device| device["name"] == "gpu-1"))
            .map(|device| device["memoryEnforcement"].clone());
        let written = if cgroup_v2 {
            enforcement == Some(json!("driver"))
        } else {
            enforcement == Some(json!("mpsPinned"))
                && status["warnings"].to_string().contains("not cgroup v2")
        };
        Ok(written.then_some(status))
    })
    .unwrap_or_else(|error| {
        panic!(
            "GPUNode status never named the enforcement (cgroup v2: {cgroup_v2}): {error:#}\n{}",
            logs(&driver)
        )
    });
    eprintln!("GPUNode status.dra: {status}");
    assert!(
        kubectl_apply(
            &claim_pod("e2e-dra-capped", KUBELET_NODE, "e2e-share-2g"),
            &[]
        )
        .success
    );
    let capped = wait_running("e2e-dra-capped", &|| logs(&driver));
    let claim = kubectl_json(&["get", "resourceclaim", &claim_of(&capped), "-n", "default"]);
    let spec_file = cdi_dir.join(format!(
        "k8s.gpu.nvidia.com-claim_{}.json",
        claim["metadata"]["uid"].as_str().expect("claim uid")
    ));
    let spec: Value =
        serde_json::from_slice(&std::fs::read(&spec_file).expect("the claim's CDI spec"))
            .expect("a CDI spec");
    let edits = &spec["devices"][0]["containerEdits"];
    let container = kubelet
        .container_of("e2e-dra-capped")
        .expect("container of e2e-dra-capped");
    if cgroup_v2 {
        assert_eq!(
            container["env"]["NVIDIA_GPU_MEMORY_LIMIT"], "2048",
            "{container}"
        );
        assert_eq!(
            container["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
            Value::Null
        );
        assert_eq!(edits["hooks"][0]["path"], hook, "{spec:#}");
        assert_eq!(edits["hooks"][0]["args"][1], "apply-cuda-memory-limits");
    } else {
        eprintln!("this host has no unified cgroup v2 hierarchy: MPS holds the claim's memory");
        assert_eq!(
            container["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
            "0=2048M"
        );
        assert_eq!(container["env"]["NVIDIA_GPU_MEMORY_LIMIT"], Value::Null);
        assert_eq!(edits.get("hooks"), None, "{spec:#}");
    }
    delete_pod("e2e-dra-capped");
}

/// HAMi's published example `file`, as HAMi ships it (`examples/nvidia/` at HAMi commit 4707fb0, kept in
/// `tests/fixtures/hami`).
fn hami_file(file: &str) -> String {
    let path = repo_root().join("tests/fixtures/hami").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// A pod of a HAMi example once it ran: as stored, and where it was placed.
struct Placed {
    pod: Value,
    node: String,
    results: Vec<Value>,
}

impl Placed {
    /// The node and the first device it got.
    fn first_gpu(&self) -> (&str, &Value) {
        (&self.node, &self.results[0]["device"])
    }
}

/// HAMi's example `file`, applied unchanged: its `pods` once each runs, with where it was placed. They are deleted
/// before this returns.
fn run_example<const N: usize>(file: &str, pods: [&str; N]) -> [Placed; N] {
    let applied = kubectl_apply(&hami_file(file), &[]);
    assert!(applied.success, "{}{}", applied.stdout, applied.stderr);
    let placed = pods.map(|name| {
        let pod = wait_running(name, &String::new);
        let (node, results) = placement(name);
        Placed { pod, node, results }
    });
    for name in pods {
        delete_pod(name);
    }
    placed
}

/// A pod of HAMi's examples (examples/nvidia in HAMi's repository): its spec as HAMi publishes it, our name.
fn hami_example(name: &str, annotations: Value, limits: Value) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"containers": [{
            "name": "ubuntu-container", "image": "ubuntu:22.04",
            "command": ["bash", "-c", "sleep 86400"],
            "resources": {"limits": limits},
        }]}
    })
    .to_string()
}

/// A pod of our own on `node`: `gpumem` MiB and `gpucores` percent of one GPU, written as for HAMi.
fn hami_share(name: &str, node: &str, gpumem: u32, gpucores: Option<u32>) -> String {
    let mut limits = json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": gpumem});
    if let Some(cores) = gpucores {
        limits["nvidia.com/gpucores"] = cores.into();
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "work", "image": "ubuntu:22.04", "resources": {"limits": limits}}]
        }
    })
    .to_string()
}

/// The node a pod was bound to, and its claim's allocation results.
fn placement(name: &str) -> (String, Vec<Value>) {
    let pod = kubectl_json(&["get", "pod", name, "-n", "default"]);
    let claim = claim_of(&pod);
    let claim = kubectl_json(&["get", "resourceclaim", &claim, "-n", "default"]);
    let results = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    (
        pod["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        results,
    )
}

/// Removes the webhook configuration and the test's nodes and pods when dropped.
struct HamiCleanup(Vec<String>);

impl Drop for HamiCleanup {
    fn drop(&mut self) {
        clean_up(&[
            "pods",
            "-n",
            "default",
            "-l",
            "nvidia.com/gpu-sharing=hami-dra",
            "--wait=false",
        ]);
        for node in &self.0 {
            clean_up(&["node", node, "--wait=false"]);
        }
        clean_up(&[
            "deployment",
            "cuda-sample-vector-add",
            "-n",
            "default",
            "--wait=false",
        ]);
        clean_up(&["mutatingwebhookconfiguration", "gpu-operator-hami"]);
        clean_up(&["namespace", QUOTA_NAMESPACE, "--wait=false"]);
    }
}

/// The namespace of the HAMi suite's GPU quota.
const QUOTA_NAMESPACE: &str = "e2e-hami-quota";

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn hami_pods_are_scheduled_as_dra_claims() {
    let dir = scenario_dir("e2e-hami");
    let nodes = [
        "e2e-hami-a100",
        "e2e-hami-h100",
        "e2e-hami-pack",
        "e2e-hami-mig",
    ];
    let _cleanup = HamiCleanup(nodes.iter().map(|node| (*node).to_owned()).collect());
    // The operator reconciles the chart's ClusterPolicy too: its own install, restored afterwards, keeps that from
    // the suites that follow.
    let mut install = OwnInstall::start_with(&GUIDE_VALUES, "e2e-hami", |identity| {
        Operator::with_webhook(identity, free_port())
    });

    step(
        "two kwok nodes, 2 A100-40GB and 2 H100-80GB, every GPU shared; a DRA driver for each publishes their slices",
    );
    let mut drivers = Vec::new();
    for (node, gpus) in [
        ("e2e-hami-a100", "a100-40gb:2"),
        ("e2e-hami-h100", "h100-80gb:2"),
    ] {
        add_simulated_node("gpu-a100-0", node, gpus, &[]);
        let state = dir.join(format!("{node}.json"));
        let root = dir.join(format!("{node}-kubelet"));
        drivers.push(start_driver(
            node,
            &state,
            &root,
            &dir.join(format!("{node}-host")),
            "all",
        ));
        eventually(WAIT, || Ok(slice_of(node).map(drop))).unwrap_or_else(|error| {
            panic!(
                "no slice for {node}: {error:#}\n{}",
                drivers.last().unwrap().output()
            )
        });
    }

    step(
        "HAMi's specify_card_type_to_use.yaml, unchanged (use-gputype \"A100,V100\", 2 whole GPUs): lands on the A100 node",
    );
    let apply = |manifest: String| {
        let applied = kubectl_apply(&manifest, &[]);
        assert!(applied.success, "{}{}", applied.stdout, applied.stderr);
        applied
    };
    let [typed] = run_example("specify_card_type_to_use.yaml", ["gpu-pod"]);
    assert_eq!(
        (typed.node.as_str(), typed.results.len()),
        ("e2e-hami-a100", 2),
        "{:#?}",
        typed.results
    );

    step(
        "HAMi's specify_card_type_not_use.yaml, unchanged (nouse-gputype \"1080,2080\", 2 whole GPUs): runs on 2 GPUs",
    );
    let [avoiding] = run_example("specify_card_type_not_use.yaml", ["gpu-pod"]);
    assert_eq!(avoiding.results.len(), 2);

    step(
        "the same example with A100 in its nouse-gputype (2 whole GPUs): lands elsewhere, on the H100 node",
    );
    apply(hami_example(
        "hami-nouse-a100",
        json!({"nvidia.com/nouse-gputype": "A100"}),
        json!({"nvidia.com/gpu": 2}),
    ));
    wait_running("hami-nouse-a100", &String::new);
    assert_eq!(placement("hami-nouse-a100").0, "e2e-hami-h100");
    delete_pod("hami-nouse-a100");

    step(
        "HAMi's default_use.yaml, unchanged (gpumem 3000, gpucores 30): one share of 3000 MiB and 30 cores",
    );
    let [Placed { pod, results, .. }] = run_example("default_use.yaml", ["gpu-pod"]);
    assert_eq!(results.len(), 1);
    assert_eq!(
        bytes(&results[0]["consumedCapacity"]["memory"]),
        3000 << 20,
        "{results:#?}"
    );
    assert_eq!(results[0]["consumedCapacity"]["cores"], "30");
    assert_eq!(
        pod["metadata"]["labels"]["nvidia.com/gpu-sharing"],
        "hami-dra"
    );
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["limits"],
        Value::Null,
        "{pod:#}"
    );

    step(
        "an init container asking 2000 MiB before a main container asking 3000 MiB: one claim of 3000 MiB (max(init, main), as Kubernetes counts init containers), used by both",
    );
    let with_init = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hami-with-init", "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "initContainers": [{"name": "prepare", "image": "ubuntu:22.04",
                                "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}}}],
            "containers": [{"name": "main", "image": "ubuntu:22.04",
                            "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}}}]
        }
    });
    apply(with_init.to_string());
    let pod = wait_running("hami-with-init", &String::new);
    assert_eq!(
        pod["spec"]["resourceClaims"].as_array().map(Vec::len),
        Some(1),
        "{pod:#}"
    );
    for container in [
        &pod["spec"]["initContainers"][0],
        &pod["spec"]["containers"][0],
    ] {
        assert_eq!(
            container["resources"]["claims"],
            json!([{"name": "hami-main"}]),
            "{pod:#}"
        );
    }
    let (_, results) = placement("hami-with-init");
    assert_eq!(results.len(), 1, "{results:#?}");
    assert_eq!(
        bytes(&results[0]["consumedCapacity"]["memory"]),
        3000 << 20,
        "{results:#?}"
    );
    delete_pod("hami-with-init");

    step(
        "HAMi's use_memory_fraction.yaml, unchanged (2 GPUs, gpumem-percentage 50, gpucores 30): half of each GPU's memory, two GPUs of one node",
    );
    let [Placed { node, results, .. }] = run_example("use_memory_fraction.yaml", ["gpu-pod"]);
    assert_eq!(results.len(), 2, "{results:#?}");
    assert_ne!(results[0]["device"], results[1]["device"]);
    let half = if node == "e2e-hami-a100" {
        20480
    } else {
        81559 / 2
    };
    for result in &results {
        assert_eq!(
            bytes(&result["consumedCapacity"]["memory"]),
            half << 20,
            "{node}: {result:#}"
        );
    }

    step(
        "HAMi's use_sharing_card.yaml, unchanged (40 % memory and 60 % cores, 60 % and 40 %): the two pods share one GPU",
    );
    let [first, second] = run_example("use_sharing_card.yaml", ["gpu-pod1", "gpu-pod2"]);
    assert_eq!(first.first_gpu(), second.first_gpu());

    step(
        "HAMi's use_as_normal.yaml, unchanged (nvidia.com/gpu: 1 each): no node's device plugin has GPUs, so the scheduler serves them through the gpu.nvidia.com class; they never share a GPU",
    );
    let [first, second] = run_example("use_as_normal.yaml", ["gpu-pod1", "gpu-pod2"]);
    assert_eq!(
        first.pod["spec"]["resourceClaims"],
        Value::Null,
        "nvidia.com/gpu alone is not HAMi's to convert: {:#}",
        first.pod
    );
    assert_ne!(first.first_gpu(), second.first_gpu());

    step(
        "HAMi's specify_scheduling_policy.yaml, unchanged (nvidia.com/gpu: 1 and HAMi's policies): admitted as it is, runs on one GPU",
    );
    let [with_policies] = run_example("specify_scheduling_policy.yaml", ["gpu-pod"]);
    assert_eq!(with_policies.results.len(), 1);

    step(
        "HAMi's example.yaml, unchanged: the Deployment's pod, made by the ReplicaSet controller, runs with a 3000 MiB share",
    );
    apply(hami_file("example.yaml"));
    let pod = eventually(WAIT, || {
        let pods = kubectl_json(&[
            "get",
            "pods",
            "-n",
            "default",
            "-l",
            "app=cuda-sample-vector-add",
        ]);
        Ok(pods["items"]
            .as_array()
            .and_then(|pods| pods.first())
            .filter(|pod| pod["status"]["phase"] == "Running")
            .cloned())
    })
    .unwrap_or_else(|error| panic!("the Deployment's pod never ran: {error:#}"));
    let (_, results) = placement(pod["metadata"]["name"].as_str().expect("pod name"));
    assert_eq!(
        bytes(&results[0]["consumedCapacity"]["memory"]),
        3000 << 20,
        "{results:#?}"
    );
    clean_up(&["deployment", "cuda-sample-vector-add", "-n", "default"]);

    step("a request no GPU can hold is refused at admission, saying why");
    let refused = kubectl_apply(
        &hami_example(
            "hami-too-big",
            json!({}),
            json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 90000}),
        ),
        &[],
    );
    assert!(!refused.success);
    assert!(
        refused.stderr.contains("virtual device memory"),
        "{}",
        refused.stderr
    );

    step(
        "HAMi's dynamic_mig_example.yaml, unchanged (nvidia.com/vgpu-mode: mig): refused at admission while no GPU is served as MIG on demand, saying how to get one, rather than run on an MPS-limited share",
    );
    let refused = kubectl_apply(&hami_file("dynamic_mig_example.yaml"), &[]);
    assert!(!refused.success, "{}", refused.stdout);
    assert!(
        refused
            .stderr
            .contains("nvidia.com/vgpu-mode mig asks for a MIG instance made for the pod")
            && refused.stderr.contains("draDriver.dynamicMIG"),
        "{}",
        refused.stderr
    );

    step(
        "a node of 2 H100-80GB served as MIG on demand (MIG mode on with NVIDIA's all-enabled): the same example gets a 1g.10gb instance, the smallest that holds its 8000 MiB, on each GPU",
    );
    add_simulated_node("gpu-a100-0", "e2e-hami-mig", "h100-80gb:2", &[]);
    let mig_state = dir.join("e2e-hami-mig.json");
    e2e::dra::mig_mode_on("e2e-hami-mig", &mig_state);
    let mig_driver = e2e::dra::start_driver(
        "e2e-hami-mig",
        &mig_state,
        &dir.join("e2e-hami-mig-kubelet"),
        &dir.join("e2e-hami-mig-host"),
        &[
            ("DRA_GPUS", "all"),
            ("DRA_SHARED_GPUS", "none"),
            ("DRA_DYNAMIC_MIG_GPUS", "all"),
        ],
    );
    eventually(WAIT, || Ok(slice_of("e2e-hami-mig").map(drop))).unwrap_or_else(|error| {
        panic!(
            "no slice for e2e-hami-mig: {error:#}\n{}",
            mig_driver.output()
        )
    });
    // Admission reads the slices from its watch: retried until the webhook has seen them.
    eventually(WAIT, || {
        Ok(kubectl_apply(&hami_file("dynamic_mig_example.yaml"), &[])
            .success
            .then_some(()))
    })
    .unwrap_or_else(|error| panic!("never admitted: {error:#}"));
    wait_running("gpu-pod", &|| mig_driver.output());
    let (node, results) = placement("gpu-pod");
    let mut devices: Vec<&str> = results
        .iter()
        .filter_map(|result| result["device"].as_str())
        .collect();
    devices.sort_unstable();
    assert_eq!(node, "e2e-hami-mig");
    assert_eq!(
        devices,
        ["gpu-0-mig-1g10gb-19-6", "gpu-1-mig-1g10gb-19-6"],
        "{results:#?}"
    );
    delete_pod("gpu-pod");
    mig_driver.kill();
    clean_up(&["node", "e2e-hami-mig", "--wait=false"]);

    step(
        "packing: 13 pods of 3000 MiB run on one 40 GB GPU, the 14th stays Pending with the scheduler's reason",
    );
    add_simulated_node("gpu-a100-0", "e2e-hami-pack", "a100-40gb:1", &[]);
    let pack_state = dir.join("e2e-hami-pack.json");
    drivers.push(start_driver(
        "e2e-hami-pack",
        &pack_state,
        &dir.join("e2e-hami-pack-kubelet"),
        &dir.join("e2e-hami-pack-host"),
        "all",
    ));
    eventually(WAIT, || Ok(slice_of("e2e-hami-pack").map(drop))).expect("the pack node's slice");
    for index in 0..14 {
        apply(hami_share(
            &format!("hami-pack-{index}"),
            "e2e-hami-pack",
            3000,
            None,
        ));
    }
    for index in 0..13 {
        wait_running(&format!("hami-pack-{index}"), &String::new);
    }
    let pending = wait_unschedulable("hami-pack-13");
    eprintln!("the 14th pod: {pending}");
    assert!(
        pending["message"]
            .as_str()
            .is_some_and(|message| message.contains("claim")),
        "{pending:#}"
    );

    step("deleting a pod frees its share: the 14th starts, and the deleted pod's claim is gone");
    let (_, freed) = placement("hami-pack-0");
    let freed_claim = claim_of(&kubectl_json(&[
        "get",
        "pod",
        "hami-pack-0",
        "-n",
        "default",
    ]));
    assert_eq!(freed.len(), 1);
    delete_pod("hami-pack-0");
    wait_running("hami-pack-13", &String::new);
    eventually(WAIT, || {
        Ok((!run(
            "kubectl",
            &["get", "resourceclaim", &freed_claim, "-n", "default"],
        )
        .success)
            .then_some(()))
    })
    .expect("the deleted pod's claim is garbage-collected");
    for index in 1..14 {
        clean_up(&[
            "pod",
            &format!("hami-pack-{index}"),
            "-n",
            "default",
            "--wait=false",
        ]);
    }
    eventually(WAIT, || {
        let left = kubectl_json(&["get", "resourceclaims", "-n", "default"]);
        Ok(left["items"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(()))
    })
    .expect("every packing claim is gone");

    step("cores: two pods of 40 % share the GPU, a third cannot");
    for index in 0..3 {
        apply(hami_share(
            &format!("hami-cores-{index}"),
            "e2e-hami-pack",
            1000,
            Some(40),
        ));
    }
    wait_running("hami-cores-0", &String::new);
    wait_running("hami-cores-1", &String::new);
    wait_unschedulable("hami-cores-2");

    step(
        "GPU quota: a namespace whose ResourceQuota limits nvidia.com/gpu refuses HAMi pods, saying what to add, until the quota charges the claims' class too; then it charges them",
    );
    let in_quota_namespace = |name: &str| {
        let mut pod: Value =
            serde_json::from_str(&hami_share(name, "e2e-hami-pack", 1000, None)).unwrap();
        pod["metadata"]["namespace"] = json!(QUOTA_NAMESPACE);
        kubectl_apply(&pod.to_string(), &[])
    };
    apply(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": QUOTA_NAMESPACE}})
            .to_string(),
    );
    let quota = |hard: Value| {
        json!({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": QUOTA_NAMESPACE},
            "spec": {"hard": hard},
        })
        .to_string()
    };
    apply(quota(json!({"requests.nvidia.com/gpu": "2"})));
    let escaping = in_quota_namespace("hami-quota-0");
    assert!(!escaping.success, "{}", escaping.stdout);
    assert!(
        escaping
            .stderr
            .contains("ResourceQuota gpus limits requests.nvidia.com/gpu in this namespace")
            && escaping
                .stderr
                .contains("add `shared.gpu.nvidia.com.deviceclass.resource.k8s.io/devices`"),
        "{}",
        escaping.stderr
    );
    let devices = "shared.gpu.nvidia.com.deviceclass.resource.k8s.io/devices";
    apply(quota(json!({"requests.nvidia.com/gpu": "2", devices: "1"})));
    for name in ["hami-quota-0", "hami-quota-1"] {
        let admitted = in_quota_namespace(name);
        assert!(admitted.success, "{}", admitted.stderr);
    }
    eventually(WAIT, || {
        let pod = kubectl_json(&["get", "pod", "hami-quota-0", "-n", QUOTA_NAMESPACE]);
        Ok((pod["status"]["phase"] == "Running").then_some(()))
    })
    .expect("the pod within the quota runs");
    let used = kubectl_json(&["get", "resourcequota", "gpus", "-n", QUOTA_NAMESPACE]);
    assert_eq!(used["status"]["used"][devices], "1", "{used:#}");
    let over = eventually(WAIT, || {
        let events = kubectl_json(&[
            "get",
            "events",
            "-n",
            QUOTA_NAMESPACE,
            "--field-selector",
            "involvedObject.name=hami-quota-1",
        ]);
        Ok(events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|event| event["message"].as_str())
            .find(|message| message.contains("exceeded quota"))
            .map(str::to_owned))
    })
    .expect("the second pod's claim is refused by the quota");
    eprintln!("the second pod in the quota: {over}");
    clean_up(&["namespace", QUOTA_NAMESPACE, "--wait=false"]);

    step(
        "a garbage webhook Secret: the restarted operator replaces it, serves again and admits a HAMi pod",
    );
    kubectl(&[
        "patch",
        "secret",
        "gpu-operator-webhook-tls",
        "-n",
        NAMESPACE,
        "--type",
        "merge",
        "-p",
        r#"{"data":{"tls.crt":"bm90IGEgY2VydGlmaWNhdGU=","tls.key":""}}"#,
    ]);
    drop(install.operator.take());
    let restarted = std::time::Instant::now();
    install.operator = Some(Operator::with_webhook("e2e-hami-restarted", free_port()));
    let serving = restarted.elapsed();
    apply(hami_share("hami-after-secret", "e2e-hami-pack", 1000, None));
    wait_running("hami-after-secret", &String::new);
    eprintln!(
        "recovered from the garbage Secret: webhook serving and configured {serving:.1?} after the start, a HAMi pod running {:.1?} after it",
        restarted.elapsed()
    );
    let secret = kubectl_json(&["get", "secret", "gpu-operator-webhook-tls", "-n", NAMESPACE]);
    assert_ne!(
        secret["data"]["tls.crt"], "bm90IGEgY2VydGlmaWNhdGU=",
        "the garbage certificate was replaced"
    );

    step(
        "templates no pod names any more are swept (kept 5 s after their last use here, an hour by default)",
    );
    let ours = [
        "-n",
        "default",
        "-l",
        "app.kubernetes.io/managed-by=gpu-operator",
    ];
    let templates = || {
        let mut args = vec!["get", "resourceclaimtemplates"];
        args.extend_from_slice(&ours);
        kubectl_json(&args)["items"].as_array().map_or(0, Vec::len)
    };
    assert!(templates() > 0, "the webhook's templates exist");
    kubectl(&[
        "delete",
        "pods",
        "-n",
        "default",
        "-l",
        "nvidia.com/gpu-sharing=hami-dra",
        "--wait=true",
    ]);
    let unused = std::time::Instant::now();
    eventually(WAIT, || Ok((templates() == 0).then_some(())))
        .expect("every template no pod names is deleted");
    eprintln!(
        "the last pods gone, their templates were deleted {:.1?} later",
        unused.elapsed()
    );
    drop(drivers);
}

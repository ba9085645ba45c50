//! Pods on the real node run as containers (containerd, runc, the CNI bridge), from images built here.

use std::time::Duration;

use e2e::realnode::{self, RunningContainer};
use e2e::{kubectl_apply, step};

/// The `kubernetes` Service's address as pods see it (the first address of the cluster's service range).
const KUBERNETES_SERVICE: &str = "10.96.0.1:443";

#[test]
#[ignore = "needs the real node: cargo xtask e2e --real-node"]
fn a_static_container_runs_prints_its_environment_and_reaches_the_api_server() {
    let testapp = realnode::image("testapp");
    step("a pod of the test image on the real node");
    let applied = kubectl_apply(
        &realnode::pod(
            "testapp",
            &testapp.reference,
            &[("GREETING", "hello from the test")],
        ),
        &[],
    );
    assert!(applied.success, "{}", applied.stderr);
    let containers = realnode::wait_running("default", "testapp", Duration::from_secs(120));
    let [container] = containers.as_slice() else {
        panic!("one container expected: {containers:?}");
    };
    println!(
        "running: pod {} container {} image {} restarts {}",
        container.pod, container.container, container.image_id, container.restarts
    );
    assert_eq!(
        container,
        &RunningContainer {
            pod: "testapp".into(),
            container: "main".into(),
            image_id: testapp.digest_reference(),
            restarts: 0,
            ready: true,
        }
    );

    step("its own output, through kubectl logs");
    let logs = realnode::logs_with(
        "default",
        "testapp",
        "env GREETING=hello from the test",
        Duration::from_secs(30),
    );
    println!("{logs}");
    assert!(
        logs.lines().any(|line| line
            == format!(
                "env KUBERNETES_SERVICE_HOST={}",
                KUBERNETES_SERVICE.split(':').next().unwrap()
            )),
        "the kubelet gave the container no kubernetes Service address:\n{logs}"
    );
    assert!(
        logs.lines()
            .any(|line| line == format!("apiserver {KUBERNETES_SERVICE} connected")),
        "the container could not reach the API server through the kubernetes Service:\n{logs}"
    );

    step("deleting the pod stops the container");
    realnode::delete_pod("default", "testapp");
}

/// The AKS setup of NVIDIA's guides: the driver is pre-installed and containerd needs no toolkit; every operand
/// whose image is built here runs (the node status exporter is off by default, so it is turned on).
const SETTINGS: [&str; 3] = [
    "driver.enabled=false",
    "toolkit.enabled=false",
    "nodeStatusExporter.enabled=true",
];

/// The host folder of the simulated node's state file, which every operand container of the node shares.
const SIMULATOR_DIR: &str = "/run/gpu-operator-rs-e2e-simulator";

/// The chart sections whose containers run on the simulated GPUs, each with `GPU_SIMULATE=node` (the model from the
/// node's `nvidia.com/gpu.simulator` annotation) and `GPU_SIM_STATE` in their `env`. `validator.driver` is the
/// validator's driver-validation init container.
const SIMULATED_SECTIONS: [&str; 6] = [
    "validator",
    "validator.driver",
    "devicePlugin",
    "gfd",
    "dcgmExporter",
    "migManager",
];

/// Each operand's `app` label, and the image it runs.
const OPERANDS: [(&str, &str); 6] = [
    ("nvidia-operator-validator", "gpu-node-agent"),
    ("nvidia-device-plugin-daemonset", "gpu-device-plugin"),
    ("gpu-feature-discovery", "gpu-node-agent"),
    ("nvidia-dcgm-exporter", "gpu-node-agent"),
    ("nvidia-mig-manager", "gpu-node-agent"),
    ("nvidia-node-status-exporter", "gpu-node-agent"),
];

#[test]
#[ignore = "needs the real node: cargo xtask e2e --real-node"]
fn the_chart_runs_the_operator_and_its_operands_as_pods_on_a_simulated_gpu() {
    let operator = realnode::image("gpu-operator");
    // A state left by an earlier run would carry its MIG layout over.
    let _ = std::fs::remove_dir_all(SIMULATOR_DIR);
    step("helm install with the images built here (never pulled), the operands on simulated GPUs");
    let chart = e2e::chart_dir();
    let simulated_env = serde_json::json!([
        {"name": "GPU_SIMULATE", "value": "node"},
        {"name": "GPU_SIM_STATE", "value": format!("{SIMULATOR_DIR}/state.json")}
    ])
    .to_string();
    let env_settings: Vec<String> = SIMULATED_SECTIONS
        .iter()
        .map(|section| format!("{section}.env={simulated_env}"))
        .collect();
    // No --wait: helm v4 would wait for the ClusterPolicy to be ready, which this test checks itself.
    let mut args = vec![
        "install",
        e2e::RELEASE,
        "-n",
        e2e::NAMESPACE,
        "--create-namespace",
        &chart,
        "--set",
        "operator.imagePullPolicy=Never",
    ];
    for setting in SETTINGS {
        args.extend(["--set", setting]);
    }
    for setting in &env_settings {
        args.extend(["--set-json", setting]);
    }
    e2e::ok("helm", &args);

    step("the operator's Deployment runs as a container on the real node");
    let pod = scheduled_pod("gpu-operator");
    let containers = realnode::wait_running(e2e::NAMESPACE, &pod, Duration::from_secs(120));
    print_and_check(&containers);
    let [container] = containers.as_slice() else {
        panic!("one operator container expected: {containers:?}");
    };
    assert_eq!(container.image_id, operator.digest_reference());

    step("it reached the API server through the kubernetes Service, led and reconciled");
    let logs_args = ["logs", "-n", e2e::NAMESPACE, pod.as_str()];
    for message in ["became the leader", "reconciling", "operands applied"] {
        e2e::eventually(Duration::from_secs(60), || {
            Ok(e2e::kubectl(&logs_args).contains(message).then_some(()))
        })
        .unwrap_or_else(|error| {
            panic!(
                "the operator never logged {message:?}: {error:#}\n{}",
                e2e::run("kubectl", &logs_args).stdout
            )
        });
    }
    println!("{}", e2e::kubectl(&logs_args));

    step("every operand runs as a container on the real node, on the simulated GPUs");
    for (app, image) in OPERANDS {
        let pod = scheduled_pod(app);
        let containers = realnode::wait_running(e2e::NAMESPACE, &pod, Duration::from_secs(180));
        print_and_check(&containers);
        let built = realnode::image(image).digest_reference();
        for container in &containers {
            assert_eq!(container.image_id, built, "{container:?}");
        }
    }

    step("the ClusterPolicy turns ready from the pods' readiness");
    let state = e2e::eventually(Duration::from_secs(120), || {
        let policy = e2e::kubectl_json(&["get", "clusterpolicy", "cluster-policy"]);
        Ok((policy["status"]["state"] == "ready").then_some(policy["status"].clone()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "the ClusterPolicy never turned ready: {error:#}\n{}",
            e2e::run(
                "kubectl",
                &["get", "clusterpolicy", "cluster-policy", "-o", "yaml"]
            )
            .stdout
        )
    });
    println!("ClusterPolicy status: {state}");

    step(
        "the device plugin registered through the host socket: the node offers the simulated GPUs",
    );
    let node = realnode::node();
    let allocatable = e2e::eventually(Duration::from_secs(60), || {
        let node = e2e::kubectl_json(&["get", "node", &node]);
        Ok((node["status"]["allocatable"]["nvidia.com/gpu"] == "4")
            .then(|| node["status"]["allocatable"].clone()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "the node never offered 4 nvidia.com/gpu: {error:#}\n{}",
            e2e::kubectl(&["get", "node", &node, "-o", "jsonpath={.status.allocatable}"])
        )
    });
    println!("allocatable: {allocatable}");

    step(
        "the guide's slice-4: the device plugin follows the ClusterPolicy to 16 shared replicas of 4 GPUs",
    );
    let applied = kubectl_apply(SLICE_4, &[]);
    assert!(applied.success, "{}", applied.stderr);
    e2e::ok(
        "kubectl",
        &[
            "patch",
            "clusterpolicy",
            "cluster-policy",
            "--type=merge",
            "-p",
            r#"{"spec":{"devicePlugin":{"config":{"name":"time-slicing-config","default":"slice-4"}}}}"#,
        ],
    );
    let allocatable = e2e::eventually(Duration::from_secs(120), || {
        let node = e2e::kubectl_json(&["get", "node", &node]);
        let allocatable = &node["status"]["allocatable"];
        Ok(
            (allocatable["nvidia.com/gpu.shared"] == "16" && allocatable["nvidia.com/gpu"] == "0")
                .then(|| allocatable.clone()),
        )
    })
    .unwrap_or_else(|error| {
        panic!(
            "the node never offered 16 nvidia.com/gpu.shared: {error:#}\n{}",
            e2e::kubectl(&["get", "node", &node, "-o", "jsonpath={.status.allocatable}"])
        )
    });
    println!("allocatable with slice-4: {allocatable}");
}

/// NVIDIA's time-slicing guide's config: 4 replicas per GPU, renamed to `nvidia.com/gpu.shared`.
const SLICE_4: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: time-slicing-config, namespace: gpu-operator}
data:
  slice-4: |-
    version: v1
    sharing:
      timeSlicing:
        renameByDefault: true
        resources:
          - name: nvidia.com/gpu
            replicas: 4
"#;

/// The name of the (only) pod labelled `app=<app>`, once it is scheduled on the real node.
fn scheduled_pod(app: &str) -> String {
    let selector = format!("app={app}");
    let pods = e2e::eventually(Duration::from_secs(120), || {
        let pods = e2e::kubectl_json(&["get", "pods", "-n", e2e::NAMESPACE, "-l", &selector]);
        Ok(pods["items"][0]["spec"]["nodeName"]
            .is_string()
            .then_some(pods))
    })
    .unwrap_or_else(|error| {
        panic!(
            "no pod {selector} was scheduled: {error:#}\n{}",
            e2e::run(
                "kubectl",
                &["get", "daemonsets,pods", "-n", e2e::NAMESPACE, "-o", "wide"]
            )
            .stdout
        )
    });
    assert_eq!(
        pods["items"][0]["spec"]["nodeName"],
        realnode::node().as_str(),
        "{selector}"
    );
    pods["items"][0]["metadata"]["name"]
        .as_str()
        .expect("a named pod")
        .to_owned()
}

/// Lists a pod's containers with their image digests, and checks none restarted.
fn print_and_check(containers: &[RunningContainer]) {
    for container in containers {
        println!(
            "running: pod {} container {} image {} restarts {} ready {}",
            container.pod,
            container.container,
            container.image_id,
            container.restarts,
            container.ready
        );
        assert_eq!(container.restarts, 0, "{container:?}");
    }
}

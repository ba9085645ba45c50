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

/// The operand sections the operator renders nothing for in this test: none of them has a simulated-GPU source on
/// the real node yet, so their containers would look for NVML.
const OPERANDS_OFF: [&str; 6] = [
    "driver.enabled=false",
    "toolkit.enabled=false",
    "devicePlugin.enabled=false",
    "dcgmExporter.enabled=false",
    "gfd.enabled=false",
    "migManager.enabled=false",
];

#[test]
#[ignore = "needs the real node: cargo xtask e2e --real-node"]
fn the_chart_runs_the_operator_as_a_pod_that_leads_and_reconciles() {
    let operator = realnode::image("gpu-operator");
    step("helm install with the images built here (never pulled)");
    let chart = e2e::chart_dir();
    // No --wait: helm would wait for the ClusterPolicy to be ready, which its validator cannot make it yet.
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
    for setting in OPERANDS_OFF {
        args.extend(["--set", setting]);
    }
    e2e::ok("helm", &args);

    step("the operator's Deployment runs as a container on the real node");
    let pods = e2e::eventually(Duration::from_secs(60), || {
        let pods = e2e::kubectl_json(&[
            "get",
            "pods",
            "-n",
            e2e::NAMESPACE,
            "-l",
            "app=gpu-operator",
        ]);
        Ok(pods["items"][0]["spec"]["nodeName"]
            .is_string()
            .then_some(pods))
    })
    .expect("the operator Deployment's pod is scheduled");
    let pod = pods["items"][0]["metadata"]["name"]
        .as_str()
        .expect("an operator pod")
        .to_owned();
    assert_eq!(
        pods["items"][0]["spec"]["nodeName"],
        realnode::node().as_str()
    );
    let containers = realnode::wait_running(e2e::NAMESPACE, &pod, Duration::from_secs(120));
    for container in &containers {
        println!(
            "running: pod {} container {} image {} restarts {}",
            container.pod, container.container, container.image_id, container.restarts
        );
        assert_eq!(container.restarts, 0, "{container:?}");
    }
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
    let policy = e2e::eventually(Duration::from_secs(60), || {
        let policy = e2e::kubectl_json(&["get", "clusterpolicy", "cluster-policy"]);
        Ok(policy["status"]["state"].as_str().map(str::to_owned))
    })
    .expect("the operator writes the ClusterPolicy's status");
    println!("ClusterPolicy state: {policy}");
}

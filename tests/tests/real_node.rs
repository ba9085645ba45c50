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
            image_id: format!(
                "{}@{}",
                testapp.reference.rsplit_once(':').unwrap().0,
                testapp.digest
            ),
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

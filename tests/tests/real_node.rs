//! Pods on the real node run as containers (containerd, runc, the CNI bridge), from images built here and pulled by
//! containerd from the cluster's local registry, where `cargo xtask images --push` put them.

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

    step(
        "containerd pulled it from the local registry: the pushed reference, index digest and platforms",
    );
    realnode::assert_pulled(&testapp);

    step("deleting the pod stops the container");
    realnode::delete_pod("default", "testapp");
}

/// The values for a node whose GPUs are simulated, as `cargo xtask demo` installs them too: NVIDIA's guide setup
/// for a pre-installed driver (AKS), every operand on the simulated GPUs, the node status exporter on.
const SIMULATED_GPUS_VALUES: &str = "examples/simulated-gpus-values.yaml";

/// NVIDIA's time-slicing guide's ConfigMap, key `slice-4`: 4 replicas per GPU, as `nvidia.com/gpu.shared`.
const TIME_SLICING_CONFIG: &str = "examples/time-slicing-config.yaml";

/// The host folder of the simulated node's state file (`GPU_SIM_STATE` in [`SIMULATED_GPUS_VALUES`]).
const SIMULATOR_DIR: &str = "/run/gpu-operator-rs-simulator";

/// Node Feature Discovery's label prefix, which node-facts writes in NFD's place.
const NFD_PREFIX: &str = "feature.node.kubernetes.io/";

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
    let node = realnode::node();
    step("the node starts as a user's: no Node Feature Discovery label, no nvidia.com label");
    for prefix in [NFD_PREFIX, "nvidia.com/"] {
        let labels = labels_under(&node, prefix);
        assert!(
            labels.is_empty(),
            "{node} has {prefix} labels before the chart is installed: {labels:?}"
        );
    }

    step(
        "the chart packaged and pushed to the local registry as an OCI artifact (helm package, helm push), as a \
         release publishes it",
    );
    let package_dir = e2e::scenario_dir("chart-package");
    let package_dir = package_dir.to_str().expect("a UTF-8 path");
    let packaged = e2e::ok(
        "helm",
        &["package", &e2e::chart_dir(), "--destination", package_dir],
    );
    let archive = packaged
        .trim()
        .rsplit(": ")
        .next()
        .expect("helm package names the archive")
        .to_string();
    let charts = format!("oci://{}/charts", realnode::registry());
    // The local registry speaks plain HTTP, as the images' push does.
    let pushed = e2e::ok("helm", &["push", &archive, &charts, "--plain-http"]);
    println!("{}", pushed.trim());
    let version = chart_version();

    step(
        "helm install of the chart from the registry, with global.imageRegistry on the registry where the images \
         built here were pushed; the operands on simulated GPUs",
    );
    let chart = format!("{charts}/gpu-operator");
    let values = e2e::repo_root().join(SIMULATED_GPUS_VALUES);
    let values = values.to_str().expect("a UTF-8 path");
    // The real node's kubelet keeps its root (and so its pod-resources socket) under the cache, as a k0s or
    // MicroK8s kubelet keeps it elsewhere: the exporter and the MIG manager must find it there.
    let kubelet_root = format!("hostPaths.kubeletRootDir={}", realnode::kubelet_root());
    // The one value that points every image of the chart, the operator's default operand images included, at the
    // registry.
    let registry = format!("global.imageRegistry={}", realnode::registry());
    // No --wait: helm v4 would wait for the ClusterPolicy to be ready, which this test checks itself.
    let args = [
        "install",
        e2e::RELEASE,
        "-n",
        e2e::NAMESPACE,
        "--create-namespace",
        &chart,
        "--version",
        &version,
        "--plain-http",
        "-f",
        values,
        "--set",
        &kubelet_root,
        "--set",
        &registry,
        // The API server accepts the operator's NetworkPolicy and nothing stops working with it (this node's
        // bridge network does not enforce policies; Calico or Cilium would).
        "--set",
        "operator.networkPolicy.enabled=true",
    ];
    e2e::ok("helm", &args);

    step("the operator's Deployment runs as a container on the real node");
    let pod = scheduled_pod("gpu-operator");
    let containers = realnode::wait_running(e2e::NAMESPACE, &pod, Duration::from_secs(120));
    print_and_check(&containers);
    let [container] = containers.as_slice() else {
        panic!("one operator container expected: {containers:?}");
    };
    assert_eq!(container.image_id, operator.digest_reference());
    assert!(
        operator
            .reference
            .starts_with(&format!("{}/", realnode::registry())),
        "{operator:?}"
    );

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

    step("node-facts labels the bare node: the operator finds its GPUs");
    let pod = scheduled_pod("gpu-node-facts");
    let containers = realnode::wait_running(e2e::NAMESPACE, &pod, Duration::from_secs(120));
    print_and_check(&containers);
    let node_agent = realnode::image("gpu-node-agent").digest_reference();
    for container in &containers {
        assert_eq!(container.image_id, node_agent, "{container:?}");
    }
    let pci_label = format!("{NFD_PREFIX}pci-10de.present");
    let labels = e2e::eventually(Duration::from_secs(120), || {
        let labels = e2e::kubectl_json(&["get", "node", &node])["metadata"]["labels"].clone();
        Ok(
            (labels[&pci_label] == "true" && labels["nvidia.com/gpu.present"] == "true")
                .then_some(labels),
        )
    })
    .unwrap_or_else(|error| {
        panic!(
            "{node} never got {pci_label}=true and nvidia.com/gpu.present=true: {error:#}\n{}\n\
             node-facts' log:\n{}",
            e2e::kubectl(&["get", "node", &node, "-o", "jsonpath={.metadata.labels}"]),
            realnode::app_logs(e2e::NAMESPACE, "gpu-node-facts")
        )
    });
    println!("labels: {labels}");

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
        "containerd pulled every image from the local registry by the reference the chart renders: the pushed \
         index digests, each index with linux/amd64 and linux/arm64",
    );
    for name in [
        "gpu-operator",
        "gpu-node-agent",
        "gpu-device-plugin",
        "pause",
    ] {
        realnode::assert_pulled(&realnode::image(name));
    }

    step(
        "the device plugin registered through the host socket: the node offers the simulated GPUs",
    );
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
    let time_slicing = e2e::repo_root().join(TIME_SLICING_CONFIG);
    e2e::kubectl(&["apply", "-f", time_slicing.to_str().expect("a UTF-8 path")]);
    patch_policy(
        r#"{"spec":{"devicePlugin":{"config":{"name":"time-slicing-config","default":"slice-4"}}}}"#,
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

    workload_receives_one_shared_gpu(&node);
    exporters_answer_on_their_pod_ips(&node);
    watchdog_stops_the_pod_over_its_share(&node);
    mig_relabel_goes_pending_then_success(&node);
    operator_rollouts_finish();

    step("every pod of the operator and its operands: Running, ready, never restarted, built here");
    // The operands the MIG change paused are coming back: wait until every pod runs, ready.
    let pods = e2e::eventually(Duration::from_secs(120), || {
        let pods = e2e::kubectl_json(&["get", "pods", "-n", e2e::NAMESPACE]);
        let settled = pods["items"].as_array().is_some_and(|items| {
            // The operator, node-facts and one pod of each operand.
            items.len() == OPERANDS.len() + 2
                && items.iter().all(|pod| {
                    pod["status"]["phase"] == "Running"
                        && realnode::containers_of(pod)
                            .iter()
                            .all(|container| container.ready)
                })
        });
        Ok(settled.then_some(pods))
    })
    .unwrap_or_else(|error| {
        panic!(
            "not every pod runs, ready: {error:#}\n{}",
            e2e::kubectl(&["get", "pods", "-n", e2e::NAMESPACE, "-o", "wide"])
        )
    });
    let images = ["gpu-operator", "gpu-node-agent", "gpu-device-plugin"]
        .map(|name| realnode::image(name).digest_reference());
    for pod in pods["items"].as_array().expect("a pod list") {
        assert_eq!(
            pod["spec"]["nodeName"],
            node.as_str(),
            "{}",
            pod["metadata"]["name"]
        );
        assert_eq!(
            pod["status"]["phase"], "Running",
            "{}",
            pod["metadata"]["name"]
        );
        let containers = realnode::containers_of(pod);
        print_and_check(&containers);
        for container in &containers {
            assert!(container.ready, "{container:?}");
            assert!(images.contains(&container.image_id), "{container:?}");
        }
    }

    uninstall_leaves_nothing_behind(&node);
}

/// `kubectl rollout restart` and a `helm upgrade` that changes the operator's pod template both finish: the new
/// pod becomes Ready while the old one still leads (readiness is health, not leadership), the old one releases
/// the lease when it is stopped, and the new one leads and reconciles.
fn operator_rollouts_finish() {
    let rollout_status = [
        "rollout",
        "status",
        "deploy/gpu-operator",
        "-n",
        e2e::NAMESPACE,
        "--timeout=60s",
    ];
    step("kubectl rollout restart deploy/gpu-operator finishes within 60 s, and the new pod leads");
    let started = std::time::Instant::now();
    e2e::kubectl(&[
        "rollout",
        "restart",
        "deploy/gpu-operator",
        "-n",
        e2e::NAMESPACE,
    ]);
    let status = e2e::run("kubectl", &rollout_status);
    assert!(
        status.success,
        "the rollout did not finish within 60 s: {}{}\n{}",
        status.stdout,
        status.stderr,
        e2e::kubectl(&["get", "pods", "-n", e2e::NAMESPACE, "-o", "wide"])
    );
    println!("rollout restart finished in {:.1?}", started.elapsed());
    let pod = operator_pod_leads();
    println!(
        "{pod} leads {:.1?} after the restart began",
        started.elapsed()
    );

    step("helm upgrade with a changed pod template finishes, and the upgraded pod leads");
    let started = std::time::Instant::now();
    e2e::ok(
        "helm",
        &[
            "upgrade",
            e2e::RELEASE,
            &e2e::chart_dir(),
            "-n",
            e2e::NAMESPACE,
            "--reuse-values",
            // Helm 4 upgrades by server-side apply, which refuses to take back the ClusterPolicy fields an admin
            // changed with `kubectl patch` (the watchdog's, above) unless told to let the chart's values win.
            "--force-conflicts",
            "--set-string",
            "operator.annotations.e2e/upgraded=yes",
        ],
    );
    let status = e2e::run("kubectl", &rollout_status);
    assert!(
        status.success,
        "the upgrade's rollout did not finish within 60 s: {}{}",
        status.stdout, status.stderr
    );
    let pod = operator_pod_leads();
    println!(
        "helm upgrade rolled out and {pod} leads after {:.1?}",
        started.elapsed()
    );
    patch_policy(r#"{"spec":{"dcgmExporter":{"env":[{"name":"E2E_AFTER_UPGRADE","value":"1"}]}}}"#);
    e2e::eventually(Duration::from_secs(60), || {
        let env = e2e::kubectl(&[
            "get",
            "daemonset",
            "nvidia-dcgm-exporter",
            "-n",
            e2e::NAMESPACE,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].env}",
        ]);
        Ok(env.contains("E2E_AFTER_UPGRADE").then_some(()))
    })
    .expect("the upgraded operator reconciles a ClusterPolicy change");
}

/// Waits until an operator pod that is not terminating holds the leader lease; returns its name.
fn operator_pod_leads() -> String {
    e2e::eventually(Duration::from_secs(30), || {
        let holder = e2e::lease_holder();
        let pods = pods_of("gpu-operator");
        let live = pods["items"].as_array().is_some_and(|pods| {
            pods.iter().any(|pod| {
                pod["metadata"]["name"] == holder.as_str()
                    && pod["metadata"]["deletionTimestamp"].is_null()
            })
        });
        Ok(live.then_some(holder))
    })
    .expect("the new operator pod leads")
}

/// `helm uninstall`: its hook deletes the ClusterPolicy while the operator still runs, which stops the operands
/// and removes the labels they and it wrote and the GPUNode; then Helm deletes the rest. Only the admin's own
/// label (the MIG config this test chose) stays, and node-facts' Node Feature Discovery labels (values.yaml,
/// nodeFacts): they describe the hardware, and node-facts still runs while the hook cleans up.
fn uninstall_leaves_nothing_behind(node: &str) {
    step("helm uninstall: no operand, label or GPUNode left behind");
    let started = std::time::Instant::now();
    let uninstalled = e2e::uninstall_release();
    assert!(
        uninstalled.success,
        "helm uninstall failed:\n{}\n{}\nthe hook's log:\n{}",
        uninstalled.stdout,
        uninstalled.stderr,
        realnode::app_logs(e2e::NAMESPACE, "gpu-operator-uninstall")
    );
    println!("helm uninstall took {:.1?}", started.elapsed());
    let policies = e2e::kubectl_json(&["get", "clusterpolicies"]);
    assert_eq!(
        policies["items"],
        serde_json::json!([]),
        "ClusterPolicies left"
    );
    let gpunodes = e2e::kubectl_json(&["get", "gpunodes"]);
    assert_eq!(gpunodes["items"], serde_json::json!([]), "GPUNodes left");
    let daemonsets = e2e::kubectl_json(&["get", "daemonsets", "-n", e2e::NAMESPACE]);
    assert_eq!(
        daemonsets["items"],
        serde_json::json!([]),
        "DaemonSets left"
    );
    let pods = e2e::eventually(Duration::from_secs(60), || {
        let pods = e2e::kubectl_json(&["get", "pods", "-n", e2e::NAMESPACE]);
        Ok(pods["items"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(()))
    });
    assert!(
        pods.is_ok(),
        "pods left:\n{}",
        e2e::kubectl(&["get", "pods", "-n", e2e::NAMESPACE, "-o", "wide"])
    );
    assert_eq!(
        serde_json::Value::Object(labels_under(node, "nvidia.com/")),
        serde_json::json!({"nvidia.com/mig.config": "all-1g.5gb"}),
        "only the admin's label may stay"
    );
    let nfd = labels_under(node, NFD_PREFIX);
    assert_eq!(
        nfd[&format!("{NFD_PREFIX}pci-10de.present")],
        "true",
        "node-facts' labels describe the hardware and stay: {nfd:?}"
    );
}

/// The node's labels whose keys begin with `prefix`.
fn labels_under(node: &str, prefix: &str) -> serde_json::Map<String, serde_json::Value> {
    e2e::kubectl_json(&["get", "node", node])["metadata"]["labels"]
        .as_object()
        .expect("labels")
        .iter()
        .filter(|(key, _)| key.starts_with(prefix))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// A pod of the test image asks for one `nvidia.com/gpu.shared` replica, starts, and prints the GPU the device
/// plugin gave it.
fn workload_receives_one_shared_gpu(node: &str) {
    step(
        "a workload pod asking for one nvidia.com/gpu.shared starts and prints the GPU it received",
    );
    let testapp = realnode::image("testapp");
    let mut pod: serde_json::Value =
        serde_json::from_str(&realnode::pod("gpu-workload", &testapp.reference, &[]))
            .expect("a pod");
    pod["spec"]["containers"][0]["resources"] =
        serde_json::json!({"limits": {"nvidia.com/gpu.shared": 1}});
    let applied = kubectl_apply(&pod.to_string(), &[]);
    assert!(applied.success, "{}", applied.stderr);
    let containers = realnode::wait_running("default", "gpu-workload", Duration::from_secs(120));
    print_and_check(&containers);
    let logs = realnode::logs_with(
        "default",
        "gpu-workload",
        "testapp: pid 1, waiting",
        Duration::from_secs(30),
    );
    let visible = logs
        .lines()
        .find_map(|line| line.strip_prefix("env NVIDIA_VISIBLE_DEVICES="))
        .unwrap_or_else(|| panic!("the container received no NVIDIA_VISIBLE_DEVICES:\n{logs}"));
    println!("the workload's own output: NVIDIA_VISIBLE_DEVICES={visible}");
    let gpunode = e2e::kubectl_json(&["get", "gpunode", node]);
    let uuids: Vec<&str> = gpunode["status"]["gpus"]
        .as_array()
        .expect("GPUs in the GPUNode status")
        .iter()
        .filter_map(|gpu| gpu["uuid"].as_str())
        .collect();
    assert!(
        uuids.contains(&visible),
        "NVIDIA_VISIBLE_DEVICES={visible} names none of the node's GPUs {uuids:?}"
    );
    realnode::delete_pod("default", "gpu-workload");
}

/// The exporter's and the node status exporter's metrics, fetched with curl from their pods' IPs.
fn exporters_answer_on_their_pod_ips(node: &str) {
    step("curl of the exporter and the node status exporter through their pod IPs");
    for (app, port, series) in [
        (
            "nvidia-dcgm-exporter",
            9400,
            "DCGM_FI_DEV_GPU_TEMP{".to_owned(),
        ),
        (
            "nvidia-node-status-exporter",
            8000,
            format!("gpu_operator_node_driver_ready{{node=\"{node}\"}} 1"),
        ),
    ] {
        let url = metrics_url(app, port);
        let metrics = e2e::eventually(Duration::from_secs(60), || {
            let fetched = e2e::run("curl", &["-sf", "--max-time", "5", &url]);
            Ok((fetched.success && fetched.stdout.contains(&series)).then_some(fetched.stdout))
        })
        .unwrap_or_else(|error| {
            panic!(
                "{url} never served {series:?}: {error:#}\n{}",
                e2e::run("curl", &["-s", "--max-time", "5", &url]).stdout
            )
        });
        let sample: Vec<&str> = metrics
            .lines()
            .filter(|line| line.starts_with(series.split('{').next().unwrap_or_default()))
            .take(4)
            .collect();
        println!(
            "{url}: {} lines, e.g.\n  {}",
            metrics.lines().count(),
            sample.join("\n  ")
        );
    }
}

/// The metrics URL of an operand, at its pod's IP.
fn metrics_url(app: &str, port: u16) -> String {
    let pod = scheduled_pod(app);
    let ip = e2e::kubectl(&[
        "get",
        "pod",
        "-n",
        e2e::NAMESPACE,
        &pod,
        "-o",
        "jsonpath={.status.podIP}",
    ]);
    format!("http://{ip}:{port}/metrics")
}

/// `kubectl patch clusterpolicy cluster-policy --type=merge -p <patch>`, as users steer the operator.
fn patch_policy(patch: &str) {
    e2e::ok(
        "kubectl",
        &[
            "patch",
            "clusterpolicy",
            "cluster-policy",
            "--type=merge",
            "-p",
            patch,
        ],
    );
}

/// Metrics fetched with curl from the pod IP of an operand.
fn metrics_of(app: &str, port: u16) -> String {
    e2e::run("curl", &["-sf", "--max-time", "5", &metrics_url(app, port)]).stdout
}

/// The host pid of the workload process of pod `default/name` (not its sandbox's): found the test's own way, by
/// the pod's UID or its container's ID in the processes' cgroups (this kubelet makes no pod cgroups, so containerd
/// puts containers in `/k8s.io/<id>`), apart from the agents' cgroup parser.
fn host_pid_of(name: &str) -> u32 {
    let pod = e2e::kubectl_json(&["get", "pod", name]);
    let uid = pod["metadata"]["uid"].as_str().expect("a UID").to_owned();
    let container = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|id| id.split_once("://"))
        .map(|(_, id)| id.to_owned())
        .expect("a running container");
    let forms = [uid.clone(), uid.replace('-', "_"), container];
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            forms.iter().any(|form| cgroup.contains(form.as_str())) && comm.trim() == "testapp"
        })
        .collect();
    let [pid] = pids.as_slice() else {
        panic!("one testapp process expected in pod {name} ({uid}), found {pids:?}");
    };
    *pid
}

/// The index and memory of the GPU a workload received (its `NVIDIA_VISIBLE_DEVICES`).
fn gpu_of(node: &str, pod: &str) -> (u32, u64) {
    let logs = realnode::logs_with(
        "default",
        pod,
        "testapp: pid 1, waiting",
        Duration::from_secs(30),
    );
    let uuid = logs
        .lines()
        .find_map(|line| line.strip_prefix("env NVIDIA_VISIBLE_DEVICES="))
        .unwrap_or_else(|| panic!("{pod} received no GPU:\n{logs}"));
    let gpunode = e2e::kubectl_json(&["get", "gpunode", node]);
    let gpu = gpunode["status"]["gpus"]
        .as_array()
        .expect("GPUs in the GPUNode status")
        .iter()
        .find(|gpu| gpu["uuid"] == uuid)
        .unwrap_or_else(|| panic!("{uuid} is none of the node's GPUs"));
    (
        u32::try_from(gpu["index"].as_u64().expect("an index")).expect("a small index"),
        gpu["memoryMiB"].as_u64().expect("the GPU's memory"),
    )
}

/// The watchdog, switched on with `kubectl patch`: two pods on one time-sliced replica each, their real processes
/// reported by the simulator as GPU users under their quarter of the GPU, then one grown over it. The watchdog maps each process to its
/// pod through its cgroup, terminates the one over its share after the grace period (a Warning Event on the pod,
/// its container restarts), leaves the other alone; the exporter shows each pod's own memory.
fn watchdog_stops_the_pod_over_its_share(node: &str) {
    step("kubectl patch switches the watchdog on: its DaemonSet runs on the real node");
    patch_policy(
        r#"{"spec":{"watchdog":{"enabled":true,"intervalSeconds":1,"gracePeriodSeconds":3,"killGracePeriodSeconds":3}}}"#,
    );
    let watchdog = scheduled_pod("nvidia-gpu-watchdog");
    let containers = realnode::wait_running(e2e::NAMESPACE, &watchdog, Duration::from_secs(120));
    print_and_check(&containers);

    step(
        "two workloads on time-sliced replicas; the simulator reports their real processes as GPU users",
    );
    let testapp = realnode::image("testapp");
    for name in ["gpu-hog", "gpu-calm"] {
        let mut pod: serde_json::Value =
            serde_json::from_str(&realnode::pod(name, &testapp.reference, &[])).expect("a pod");
        pod["spec"]["containers"][0]["resources"] =
            serde_json::json!({"limits": {"nvidia.com/gpu.shared": 1}});
        let applied = kubectl_apply(&pod.to_string(), &[]);
        assert!(applied.success, "{}", applied.stderr);
    }
    let state = std::path::Path::new(SIMULATOR_DIR).join("state.json");
    let mut reported = Vec::new();
    for name in ["gpu-hog", "gpu-calm"] {
        realnode::wait_running("default", name, Duration::from_secs(120));
        let (gpu, memory_mib) = gpu_of(node, name);
        let share = memory_mib / 4;
        // Both under their quarter of the GPU for now: the hog grows over it once the exporter has shown both.
        let used = if name == "gpu-hog" {
            share - 2048
        } else {
            share / 2
        };
        let pid = host_pid_of(name);
        e2e::agents::simulator_tool(
            node,
            &state,
            &[
                "start-process",
                "--host-process",
                "--gpu",
                &gpu.to_string(),
                "--pid",
                &pid.to_string(),
                "--memory-mib",
                &used.to_string(),
            ],
        );
        println!(
            "{name}: host pid {pid} reported on GPU {gpu} using {used} MiB (its share: {share} MiB)"
        );
        reported.push((name, gpu, pid, share, used));
    }

    step("the exporter shows each pod's own GPU memory, mapped through the processes' cgroups");
    for (name, _, _, _, used) in &reported {
        let series = format!(
            r#"pod="{name}",namespace="default",container="main"}} {}"#,
            used * 1024 * 1024
        );
        let metrics = e2e::eventually(Duration::from_secs(60), || {
            let metrics = metrics_of("nvidia-dcgm-exporter", 9400);
            Ok(metrics
                .lines()
                .any(|line| {
                    line.starts_with("gpu_pod_memory_used_bytes{") && line.ends_with(&series)
                })
                .then_some(metrics))
        })
        .unwrap_or_else(|error| {
            panic!(
                "no gpu_pod_memory_used_bytes series ending {series}: {error:#}\n{}\nthe exporter's log:\n{}",
                metrics_of("nvidia-dcgm-exporter", 9400),
                realnode::app_logs(e2e::NAMESPACE, "nvidia-dcgm-exporter")
            )
        });
        let line = metrics
            .lines()
            .find(|line| line.starts_with("gpu_pod_memory_used_bytes{") && line.ends_with(&series))
            .unwrap_or_default();
        println!("exporter: {line}");
    }

    step("the hog's process grows over its share (the simulator's figure, as a program allocates)");
    let (_, gpu, pid, share, _) = reported[0];
    let grown = share + 2048;
    e2e::agents::simulator_tool(
        node,
        &state,
        &[
            "set-process-memory",
            "--gpu",
            &gpu.to_string(),
            "--pid",
            &pid.to_string(),
            "--memory-mib",
            &grown.to_string(),
        ],
    );
    println!("gpu-hog: {grown} MiB (its share: {share} MiB)");

    step(
        "the pod over its share gets a Warning Event and its container is terminated; the other is left alone",
    );
    let event = e2e::eventually(Duration::from_secs(60), || {
        let events = e2e::kubectl_json(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            "involvedObject.name=gpu-hog,reason=GPUMemoryOverBudget",
        ]);
        Ok(events["items"][0]["message"].as_str().map(str::to_owned))
    })
    .unwrap_or_else(|error| {
        panic!(
            "no GPUMemoryOverBudget event on gpu-hog: {error:#}\nwatchdog log:\n{}",
            e2e::kubectl(&["logs", "-n", e2e::NAMESPACE, &watchdog])
        )
    });
    println!("event on gpu-hog: {event}");
    assert!(
        event.contains("(container main)") && event.ends_with("sent SIGTERM"),
        "{event}"
    );
    let restarted = e2e::eventually(Duration::from_secs(60), || {
        let pod = e2e::kubectl_json(&["get", "pod", "gpu-hog"]);
        let status = &pod["status"]["containerStatuses"][0];
        Ok((status["restartCount"].as_u64() >= Some(1)).then(|| status["lastState"].clone()))
    })
    .unwrap_or_else(|error| panic!("gpu-hog's container was never terminated: {error:#}"));
    println!("gpu-hog's container ended: {restarted}");
    let calm = e2e::kubectl_json(&["get", "pod", "gpu-calm"]);
    assert_eq!(calm["status"]["containerStatuses"][0]["restartCount"], 0);
    let calm_events = e2e::kubectl_json(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "involvedObject.name=gpu-calm,reason=GPUMemoryOverBudget",
    ]);
    assert_eq!(calm_events["items"], serde_json::json!([]));

    step("the watchdog's metrics count the signal");
    let kills = e2e::eventually(Duration::from_secs(30), || {
        let metrics = metrics_of("nvidia-gpu-watchdog", 9402);
        Ok(metrics
            .lines()
            .find(|line| {
                line.starts_with("gpu_watchdog_kills_total{")
                    && line.contains(r#"pod="gpu-hog""#)
                    && line.contains(r#"signal="SIGTERM""#)
            })
            .map(str::to_owned))
    })
    .unwrap_or_else(|error| {
        panic!(
            "no kill counted: {error:#}\n{}",
            metrics_of("nvidia-gpu-watchdog", 9402)
        )
    });
    println!("watchdog: {kills}");
    assert!(kills.ends_with(" 1"), "{kills}");

    step("the workloads go; switched off, the watchdog's DaemonSet goes too");
    realnode::delete_pod("default", "gpu-hog");
    realnode::delete_pod("default", "gpu-calm");
    // Their processes ended with them. NVML forgets a process that exits; the simulator learns it from a reader in
    // the PID namespace that reported the process (this test's, the host's), which the MIG manager, confined to its
    // own, is not: a read here ends them, as the watchdog's (host PID namespace) would, before it is switched off.
    e2e::agents::simulator_tool(node, &state, &["devices"]);
    patch_policy(r#"{"spec":{"watchdog":{"enabled":false}}}"#);
    e2e::eventually(Duration::from_secs(60), || {
        let pods = pods_of("nvidia-gpu-watchdog");
        Ok(pods["items"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(()))
    })
    .unwrap_or_else(|error| panic!("the watchdog's pod stayed: {error:#}"));
}

/// `nvidia.com/mig.config=all-1g.5gb` on the real node: the MIG manager in its container pauses the device
/// plugin, changes the simulated GPUs, and reports pending, then success; the device plugin comes back with the
/// MIG devices (single strategy: 7 per A100-40GB, 4 time-sliced replicas each).
fn mig_relabel_goes_pending_then_success(node: &str) {
    step("a MIG relabel: pending, then success, with the MIG manager in its container");
    e2e::ok(
        "kubectl",
        &[
            "label",
            "node",
            node,
            "--overwrite",
            "nvidia.com/mig.config=all-1g.5gb",
        ],
    );
    let mut seen: Vec<String> = Vec::new();
    e2e::eventually(Duration::from_secs(180), || {
        let labels = e2e::kubectl_json(&["get", "node", node])["metadata"]["labels"].clone();
        let state = labels["nvidia.com/mig.config.state"]
            .as_str()
            .unwrap_or("<none>")
            .to_owned();
        if seen.last() != Some(&state) {
            seen.push(state.clone());
        }
        Ok((state == "success" && seen.iter().any(|state| state == "pending")).then_some(()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "the MIG relabel did not go pending then success ({seen:?}): {error:#}\n{}",
            realnode::app_logs(e2e::NAMESPACE, "nvidia-mig-manager")
        )
    });
    println!("nvidia.com/mig.config.state: {}", seen.join(" -> "));
    let gpunode = e2e::kubectl_json(&["get", "gpunode", node]);
    println!("GPUNode MIG status: {}", gpunode["status"]["mig"]);
    let allocatable = e2e::eventually(Duration::from_secs(120), || {
        let allocatable =
            e2e::kubectl_json(&["get", "node", node])["status"]["allocatable"].clone();
        Ok((allocatable["nvidia.com/gpu.shared"] == "112").then_some(allocatable))
    })
    .unwrap_or_else(|error| {
        panic!(
            "the node never offered 4 replicas of 28 MIG devices: {error:#}\n{}",
            e2e::kubectl(&["get", "node", node, "-o", "jsonpath={.status.allocatable}"])
        )
    });
    println!("allocatable after the MIG change: {allocatable}");
}

/// The name of the (only) pod labelled `app=<app>`, once it is scheduled on the real node.
fn scheduled_pod(app: &str) -> String {
    let selector = format!("app={app}");
    let pods = e2e::eventually(Duration::from_secs(120), || {
        let pods = pods_of(app);
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

/// The pods of the operator's namespace with label `app=<app>`, as `kubectl get pods -o json` lists them.
fn pods_of(app: &str) -> serde_json::Value {
    e2e::kubectl_json(&[
        "get",
        "pods",
        "-n",
        e2e::NAMESPACE,
        "-l",
        &format!("app={app}"),
    ])
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

/// The chart's version, from its Chart.yaml: what `helm push` tagged it with.
fn chart_version() -> String {
    let path = std::path::Path::new(&e2e::chart_dir()).join("Chart.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    text.lines()
        .find_map(|line| line.strip_prefix("version:"))
        .map(|version| version.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("{} has no version", path.display()))
}

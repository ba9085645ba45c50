//! The DCGM-compatible exporter (`gpu-node-agent exporter`) against the local cluster: a real kubelet's node
//! ([`e2e::kubelet`]) with 2 simulated A100-40GB, the device plugin giving a pod one GPU, and the exporter as a
//! local process under the chart's `nvidia-dcgm-exporter` ServiceAccount, scraped over HTTP as Prometheus does.
//! What it shows: the DCGM names and labels, the pod that holds a GPU on that GPU's series (from the kubelet's
//! pod-resources API), values that follow the GPU (a process's memory, an XID that clears again), and a metrics
//! ConfigMap whose edits apply without a restart while a bad edit keeps the last good selection. Beside it, the
//! node status exporter (`gpu-node-agent status-exporter`): the validator's marks and the node's GPUNode status.
//! And what the chart's Grafana dashboard shows of that scrape once Prometheus has stored it through the
//! ServiceMonitor the operator renders ([`e2e::prometheus`]): the workload's `namespace` and `pod` on the per-pod
//! panels with the rendered `honorLabels: true`, and the exporter pod's with `honorLabels: false`.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use e2e::agents::{NodeAgent, node_agent_bin, simulator_tool};
use e2e::kubelet::{DEVICE_PLUGIN_ROOT, Kubelet, allocatable, gpu_pod};
use e2e::plugin::{DevicePlugin, inject_xid};
use e2e::prometheus::{self, ScrapeTarget};
use e2e::*;
use k8s_openapi::api::core::v1::Node;
use operator::model::{ClusterFacts, Component, ContainerRuntime, DefaultImages, validate};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const NODE: &str = "e2e-exporter";
const CONFIG_MAP: &str = "e2e-dcgm-metrics";
const POD: &str = "e2e-metrics-pod";
/// The pid of the pod's simulated GPU process.
const POD_PID: &str = "4545";

/// The metrics ConfigMap, in dcgm-exporter's CSV format.
fn metrics_config_map(csv: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
        "data": {"dcgm-metrics.csv": csv}
    })
    .to_string()
}

const SELECTED: &str = "# field, type, help\n\
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n\
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n\
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.\n";

/// The body of `GET /metrics`, once the exporter answers 200.
fn scrape(port: u16) -> Option<String> {
    let (status, body) = http_get(port, "/metrics")?;
    (status == 200).then_some(body)
}

/// The value of `metric` on the series of GPU `gpu` that carries every label of `labels` (`key="value"`).
fn sample(body: &str, metric: &str, gpu: u32, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")))
        .filter(|line| line.contains(&format!("gpu=\"{gpu}\"")))
        .find(|line| labels.iter().all(|label| line.contains(label)))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// Scrapes until `check` accepts the body; panics with the last body and the exporter's log otherwise.
fn wait_for_metrics(
    port: u16,
    what: &str,
    exporter: &NodeAgent,
    check: impl Fn(&str) -> bool,
) -> String {
    let mut last = String::new();
    eventually(WAIT, || {
        let Some(body) = scrape(port) else {
            return Ok(None);
        };
        let accepted = check(&body).then(|| body.clone());
        last = body;
        Ok(accepted)
    })
    .unwrap_or_else(|error| {
        panic!(
            "{what}: {error:#}\nlast scrape:\n{last}\nexporter log:\n{}",
            exporter.output()
        )
    })
}

/// The exporter's DaemonSet, Service and ServiceMonitor, as the operator renders them on `node` for the chart's
/// ClusterPolicy (`helm template` with the guide's values, the ServiceMonitor enabled and `values`).
fn rendered_exporter(node: &str, values: &[&str]) -> (Value, Value, Value) {
    let chart = chart_dir();
    let mut args = vec!["template", RELEASE, &chart, "-n", NAMESPACE];
    args.extend(GUIDE_VALUES);
    args.extend(["--set", "dcgmExporter.serviceMonitor.enabled=true"]);
    args.extend(values);
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&ok("helm", &args)).expect("helm template's YAML");
    let policy = documents
        .into_iter()
        .find(|document| document["kind"] == "ClusterPolicy")
        .expect("the chart's ClusterPolicy");
    let policy: crd::ClusterPolicy = serde_json::from_value(policy).expect("a ClusterPolicy");
    let validated = validate(&policy.spec, &DefaultImages::builtin()).expect("a valid policy");
    let node: Node =
        serde_json::from_value(kubectl_json(&["get", "node", node])).expect("the Node");
    let facts = ClusterFacts::from_nodes(
        NAMESPACE,
        [&node],
        ContainerRuntime::from_default(&validated.spec.operator.default_runtime),
    );
    let exporter: Vec<Value> = operator::render::render(&validated, &facts)
        .iter()
        .filter(|object| object.component() == Component::DcgmExporter)
        .map(|object| object.to_json())
        .collect();
    let kind = |kind: &str| {
        exporter
            .iter()
            .find(|object| object["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} rendered for the exporter"))
            .clone()
    };
    (kind("DaemonSet"), kind("Service"), kind("ServiceMonitor"))
}

/// The `(namespace, pod)` of every series the dashboard's per-pod panel queries (a legend naming `{{pod}}`)
/// return once Prometheus has stored `body` through the rendered ServiceMonitor, and the `namespace` variable's
/// values; the ServiceMonitor's `honorLabels` beside them.
fn dashboard_pods(
    body: &str,
    node: &str,
    values: &[&str],
) -> (bool, BTreeSet<(String, String)>, BTreeSet<String>) {
    let (daemon_set, service, monitor) = rendered_exporter(node, values);
    // A DaemonSet pod's name: the DaemonSet's and a generated suffix.
    let exporter_pod = format!(
        "{}-x7k2q",
        daemon_set["metadata"]["name"].as_str().unwrap_or_default()
    );
    let target = ScrapeTarget::of_service_monitor(
        &monitor,
        &service,
        &daemon_set,
        &exporter_pod,
        "10.1.0.7",
    )
    .unwrap_or_else(|error| {
        panic!(
            "{error:#}
{monitor}"
        )
    });
    eprintln!(
        "honorLabels {}, target labels {:?}",
        target.honor_labels, target.labels
    );
    let scraped = prometheus::parse_exposition(body).expect("the exporter's exposition");
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            repo_root().join("charts/gpu-operator/files/dashboards/gpu-operator.json"),
        )
        .expect("the dashboard"),
    )
    .expect("the dashboard's JSON");
    let result = prometheus::evaluate_dashboard(&dashboard, &target.store(&scraped))
        .unwrap_or_else(|error| panic!("{error:#}"));
    let mut pods = BTreeSet::new();
    for panel in result
        .panels
        .iter()
        .filter(|panel| panel.legend.contains("{{pod}}"))
    {
        eprintln!("{}: {} -> {:?}", panel.panel, panel.expr, panel.series);
        pods.extend(panel.series.iter().map(|labels| {
            let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
            (label("namespace"), label("pod"))
        }));
    }
    let namespaces = result
        .variables
        .get("namespace")
        .cloned()
        .unwrap_or_default();
    (target.honor_labels, pods, namespaces)
}

/// Removes the test's ConfigMap and pod when dropped (the kubelet's Drop removes the Node).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        clean_up(&["configmap", CONFIG_MAP, "-n", NAMESPACE]);
        clean_up(&["pod", POD, "-n", "default"]);
    }
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn exporter_serves_dcgm_metrics_with_pods_and_follows_its_config_map() {
    chart_installed();
    let dir = scenario_dir("e2e-exporter");
    let state = dir.join(format!("{NODE}.json"));
    let _cleanup = Cleanup;
    assert!(kubectl_apply(&metrics_config_map(SELECTED), &[]).success);

    step("a real kubelet with 2 A100-40GB, the device plugin, and a pod holding one GPU");
    let kubelet = Kubelet::start(NODE, &dir.join("kubelet"), &[]);
    kubectl(&[
        "annotate",
        "node",
        NODE,
        "nvidia.com/gpu.simulator=a100-40gb:2",
        "--overwrite",
    ]);
    let plugin = DevicePlugin::start_on(Path::new(DEVICE_PLUGIN_ROOT), NODE, &state, &[]);
    eventually(WAIT, || {
        Ok((allocatable(NODE, "nvidia.com/gpu").as_deref() == Some("2")).then_some(()))
    })
    .unwrap_or_else(|error| panic!("no GPUs allocatable: {error:#}\n{}", plugin.output()));
    assert!(kubectl_apply(&gpu_pod(POD, NODE, "nvidia.com/gpu", 1), &[]).success);
    let held = eventually(WAIT, || {
        let running =
            kubectl_json(&["get", "pod", POD, "-n", "default"])["status"]["phase"] == "Running";
        Ok(running.then(|| kubelet.container_of(POD)).flatten())
    })
    .unwrap_or_else(|error| panic!("{POD} never ran: {error:#}\n{}", kubelet.output()));
    let uuid = held["env"]["NVIDIA_VISIBLE_DEVICES"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let gpus = kubectl_json(&["get", "gpunode", NODE])["status"]["gpus"].clone();
    let held_gpu = gpus
        .as_array()
        .into_iter()
        .flatten()
        .find(|gpu| gpu["uuid"] == uuid.as_str())
        .and_then(|gpu| gpu["index"].as_u64())
        .unwrap_or_else(|| panic!("{uuid} is none of {gpus}")) as u32;
    let free_gpu = 1 - held_gpu;

    // The pod's process on its GPU, in the pod's cgroup as the exporter reads it under `--proc-root`, for the
    // per-pod memory series (the fake runtime runs no processes, so the simulator and a procfs folder stand in).
    let proc_root = dir.join("proc");
    let pod_uid = kubectl_json(&["get", "pod", POD, "-n", "default"])["metadata"]["uid"]
        .as_str()
        .expect("the pod's UID")
        .to_owned();
    std::fs::create_dir_all(proc_root.join(POD_PID)).expect("the proc folder");
    std::fs::write(
        proc_root.join(POD_PID).join("cgroup"),
        format!("0::/kubepods/besteffort/pod{pod_uid}\n"),
    )
    .expect("the process's cgroup");
    simulator_tool(
        NODE,
        &state,
        &[
            "start-process",
            "--gpu",
            &held_gpu.to_string(),
            "--pid",
            POD_PID,
            "--memory-mib",
            "1234",
        ],
    );

    step("the exporter, scraped: DCGM names and labels, only the fields the ConfigMap selects");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let root = kubelet.root().display().to_string();
    let proc_root = proc_root.display().to_string();
    let exporter = NodeAgent::start(
        &node_agent_bin(),
        NODE,
        "nvidia-dcgm-exporter",
        &state,
        &[
            "exporter",
            "--listen",
            &listen,
            "--metrics-config-map",
            CONFIG_MAP,
            "--collect-interval",
            "1",
            "--xid-clear-seconds",
            "3",
            "--kubelet-root",
            &root,
            "--proc-root",
            &proc_root,
        ],
        &[],
    );
    let hostname = format!("hostname=\"{NODE}\"");
    let held_by_pod = [
        format!("pod=\"{POD}\""),
        "namespace=\"default\"".to_owned(),
        "container=\"cuda\"".to_owned(),
        format!("UUID=\"{uuid}\""),
    ];
    let held_labels: Vec<&str> = held_by_pod.iter().map(String::as_str).collect();
    let body = wait_for_metrics(port, "the pod's GPU series", &exporter, |body| {
        sample(body, "DCGM_FI_DEV_GPU_TEMP", held_gpu, &held_labels).is_some()
    });
    if let Some(line) = body
        .lines()
        .find(|line| line.starts_with("DCGM_FI_DEV_GPU_TEMP{") && line.contains(&held_by_pod[0]))
    {
        eprintln!("{line}");
    }
    for label in [
        hostname.as_str(),
        "modelName=\"NVIDIA A100-SXM4-40GB\"",
        &format!("device=\"nvidia{held_gpu}\""),
    ] {
        assert!(
            sample(&body, "DCGM_FI_DEV_GPU_TEMP", held_gpu, &[label]).is_some(),
            "{label}:\n{body}"
        );
    }
    assert!(
        sample(&body, "DCGM_FI_DEV_GPU_TEMP", free_gpu, &[&hostname]).is_some()
            && sample(&body, "DCGM_FI_DEV_GPU_TEMP", free_gpu, &["pod=\""]).is_none(),
        "the free GPU has a series, and no pod on it:\n{body}"
    );
    assert!(
        !body.contains("DCGM_FI_DEV_SM_CLOCK"),
        "not selected:\n{body}"
    );

    step(
        "the dashboard through Prometheus and the operator's ServiceMonitor: per-pod panels show the workload's namespace and pod (honorLabels true); with honorLabels false they would show the exporter's",
    );
    let pod_memory = "gpu_pod_memory_used_bytes{";
    let body = wait_for_metrics(port, "the pod's own GPU memory", &exporter, |body| {
        body.lines()
            .any(|line| line.starts_with(pod_memory) && line.contains(&held_by_pod[0]))
    });
    let (honoured, pods, namespaces) = dashboard_pods(&body, NODE, &[]);
    assert!(
        honoured,
        "the rendered ServiceMonitor honours the series' labels"
    );
    assert_eq!(
        pods,
        BTreeSet::from([("default".to_owned(), POD.to_owned())]),
        "the per-pod panels show the workload"
    );
    assert!(namespaces.contains("default"), "{namespaces:?}");
    let (honoured, pods, namespaces) = dashboard_pods(
        &body,
        NODE,
        &["--set", "dcgmExporter.serviceMonitor.honorLabels=false"],
    );
    assert!(!honoured);
    assert!(
        !pods.is_empty()
            && pods
                .iter()
                .all(|(namespace, pod)| namespace == NAMESPACE && pod != POD),
        "without honorLabels the per-pod panels show the exporter pod, not the workload: {pods:?}"
    );
    assert!(!namespaces.contains("default"), "{namespaces:?}");

    step("a process using 3000 MiB on the free GPU: DCGM_FI_DEV_FB_USED follows");
    let gpu = free_gpu.to_string();
    simulator_tool(
        NODE,
        &state,
        &[
            "start-process",
            "--gpu",
            &gpu,
            "--pid",
            "4242",
            "--memory-mib",
            "3000",
        ],
    );
    wait_for_metrics(port, "FB_USED 3000", &exporter, |body| {
        sample(body, "DCGM_FI_DEV_FB_USED", free_gpu, &[]) == Some(3000.0)
    });
    simulator_tool(
        NODE,
        &state,
        &["stop-process", "--gpu", &gpu, "--pid", "4242"],
    );

    step(
        "the node status exporter: the validator's driver mark, the device plugin's devices, health Healthy",
    );
    let validations = dir.join("validations");
    let validations_dir = validations.display().to_string();
    simulated::run_tool(
        &node_agent_bin(),
        NODE,
        &state,
        &["validate", "--validations-dir", &validations_dir, "driver"],
    );
    let status_port = free_port();
    let status_listen = format!("127.0.0.1:{status_port}");
    let status_exporter = NodeAgent::start(
        &node_agent_bin(),
        NODE,
        "nvidia-node-status-exporter",
        &state,
        &[
            "status-exporter",
            "--listen",
            &status_listen,
            "--validations-dir",
            &validations_dir,
        ],
        &[],
    );
    let status_line = |metric: &str, labels: &str| format!("{metric}{{node=\"{NODE}\"{labels}}}");
    let expected = [
        format!("{} 1", status_line("gpu_operator_node_driver_ready", "")),
        format!("{} 0", status_line("gpu_operator_node_toolkit_ready", "")),
        format!("{} 2", status_line("gpu_operator_node_gpus", "")),
        format!(
            "{} 2",
            status_line(
                "gpu_operator_node_device_plugin_devices",
                ",resource=\"nvidia.com/gpu\""
            )
        ),
        format!(
            "{} 1",
            status_line("gpu_operator_node_health", ",health=\"Healthy\"")
        ),
    ];
    wait_for_metrics(status_port, "node status", &status_exporter, |body| {
        expected
            .iter()
            .all(|line| body.lines().any(|seen| seen == line))
    });

    step(
        "an XID 79 on the pod's GPU: DCGM_FI_DEV_XID_ERRORS reads 79 and the node status says Degraded; the gauge clears after 3 s",
    );
    inject_xid(NODE, &state, held_gpu, 79);
    wait_for_metrics(port, "XID 79", &exporter, |body| {
        sample(body, "DCGM_FI_DEV_XID_ERRORS", held_gpu, &held_labels) == Some(79.0)
    });
    let degraded = format!(
        "{} 1",
        status_line("gpu_operator_node_health", ",health=\"Degraded\"")
    );
    wait_for_metrics(
        status_port,
        "node status Degraded",
        &status_exporter,
        |body| body.lines().any(|line| line == degraded),
    );
    wait_for_metrics(port, "XID cleared", &exporter, |body| {
        sample(body, "DCGM_FI_DEV_XID_ERRORS", held_gpu, &held_labels) == Some(0.0)
    });

    step("the ConfigMap adds DCGM_FI_DEV_SM_CLOCK: exported without a restart");
    let with_clock =
        format!("{SELECTED}DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).\n");
    assert!(kubectl_apply(&metrics_config_map(&with_clock), &[]).success);
    wait_for_metrics(port, "SM clock selected", &exporter, |body| {
        sample(body, "DCGM_FI_DEV_SM_CLOCK", held_gpu, &[]).is_some()
    });

    step("a bad line (unknown field): the previous selection stays and the log names the line");
    let bad = format!("{with_clock}DCGM_FI_DEV_NOT_A_FIELD, gauge, nothing\n");
    assert!(kubectl_apply(&metrics_config_map(&bad), &[]).success);
    eventually(WAIT, || {
        Ok(exporter
            .output()
            .contains("DCGM_FI_DEV_NOT_A_FIELD")
            .then_some(()))
    })
    .unwrap_or_else(|error| panic!("no warning: {error:#}\n{}", exporter.output()));
    let body = scrape(port).expect("the exporter still answers");
    assert!(
        sample(&body, "DCGM_FI_DEV_SM_CLOCK", held_gpu, &[]).is_some()
            && sample(&body, "DCGM_FI_DEV_FB_USED", held_gpu, &[]).is_some(),
        "the last good selection is exported:\n{body}"
    );
    let warning = exporter
        .output()
        .lines()
        .find(|line| line.contains("DCGM_FI_DEV_NOT_A_FIELD"))
        .unwrap_or_default()
        .to_owned();
    assert!(warning.contains("line 6"), "{warning}");
    eprintln!("{warning}");
}

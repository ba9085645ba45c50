//! The DCGM-compatible metrics exporter (`gpu-node-agent exporter`) on port 9400, the Service in front of it,
//! and, when asked, a Prometheus-operator ServiceMonitor so kube-prometheus-stack scrapes it.

use super::RenderedObject;
use super::common::{
    Awaits, HostMount, NODE_AGENT, OperandDaemonSet, RootFs, User, config_map_name, confined,
    container, gpu_access_env, node_name_env, port,
};
use super::metrics::{self, MetricsPort, ServiceSettings};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

/// The metrics port, as NVIDIA's dcgm-exporter serves it, and the Service's port name.
const METRICS: MetricsPort = MetricsPort {
    component: Component::DcgmExporter,
    port: 9400,
    service_port_name: "gpu-metrics",
};

/// Where the host's procfs is mounted.
const HOST_PROC: &str = "/host/proc";

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let spec = &policy.spec.dcgm_exporter;
    let listen = format!(":{}", METRICS.port);
    let kubelet_root = policy.spec.host_paths.kubelet_root_dir.as_str();
    // `--kubelet-root` names the mounted pod-resources folder below, which is at the host's path.
    let mut command = vec![
        NODE_AGENT,
        "exporter",
        "--listen",
        &listen,
        "--kubelet-root",
        kubelet_root,
        "--proc-root",
        HOST_PROC,
    ];
    if let Some(name) = config_map_name(spec.config.as_ref()) {
        command.extend(["--metrics-config-map", name]);
    }

    let mut ds = OperandDaemonSet::new(policy, facts, Component::DcgmExporter);
    ds.main = container(Component::DcgmExporter.app_name(), command);
    let mut env = vec![node_name_env()];
    env.extend(gpu_access_env());
    ds.main.env = Some(env);
    ds.main.ports = Some(vec![port("metrics", METRICS.port)]);
    // Root without capabilities: the kubelet's pod-resources socket and the MIG monitor capability device
    // (/dev/nvidia-caps, for MIG devices' metrics) are root's only.
    ds.main.security_context = confined(User::Root, &[], RootFs::ReadOnly);
    // The kubelet's pod-resources API says which pod holds which GPU, for the pod/namespace/container labels.
    ds.mount(&HostMount::pod_resources(policy));
    // The host's procfs: each GPU process's cgroup names its pod, for the per-pod memory series. Read through
    // a mount rather than the host's PID namespace, which the exporter does not need otherwise.
    ds.mount(&HostMount::new("host-proc", "/proc", HOST_PROC).read_only());
    ds.host_pid = spec.host_pid == Some(true);
    ds.host_network = spec.host_network == Some(true);
    ds.pod_labels = spec.pod_labels.clone();
    ds.pod_annotations = spec.pod_annotations.clone();
    ds.await_validation(Awaits::DriverAndToolkit);

    let settings = spec.service.as_ref();
    metrics::with_service(
        policy,
        facts,
        &METRICS,
        ds.build(),
        ServiceSettings {
            type_: settings.and_then(|s| s.type_.clone()),
            internal_traffic_policy: settings.and_then(|s| s.internal_traffic_policy.clone()),
        },
        spec.service_monitor.as_ref(),
    )
}

//! The DCGM-compatible metrics exporter (`gpu-node-agent exporter`) on port 9400, the Service in front of it,
//! and, when asked, a Prometheus-operator ServiceMonitor so kube-prometheus-stack scrapes it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::RenderedObject;
use super::common::{
    APP_LABEL, Awaits, HostMount, NODE_AGENT, OperandDaemonSet, config_map_name, container,
    node_name_env, object_meta, port,
};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

/// apiVersion of the Prometheus operator's ServiceMonitor.
pub const SERVICE_MONITOR_API_VERSION: &str = "monitoring.coreos.com/v1";
pub const SERVICE_MONITOR_KIND: &str = "ServiceMonitor";

/// The metrics port, as NVIDIA's dcgm-exporter serves it.
const METRICS_PORT: i32 = 9400;
/// The Service's port name, which the ServiceMonitor's endpoint names.
const SERVICE_PORT_NAME: &str = "gpu-metrics";

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let spec = &policy.spec.dcgm_exporter;
    let listen = format!(":{METRICS_PORT}");
    let kubelet_root = policy.spec.host_paths.kubelet_root_dir.as_str();
    // `--kubelet-root` names the mounted pod-resources folder below, which is at the host's path.
    let mut command = vec![
        NODE_AGENT,
        "exporter",
        "--listen",
        &listen,
        "--kubelet-root",
        kubelet_root,
    ];
    if let Some(name) = config_map_name(spec.config.as_ref()) {
        command.extend(["--metrics-config-map", name]);
    }

    let mut ds = OperandDaemonSet::new(policy, facts, Component::DcgmExporter);
    ds.main = container(Component::DcgmExporter.app_name(), command);
    ds.main.env = Some(vec![node_name_env()]);
    ds.main.ports = Some(vec![port("metrics", METRICS_PORT)]);
    // The kubelet's pod-resources API says which pod holds which GPU, for the pod/namespace/container labels.
    ds.mount(
        &HostMount::same("pod-resources", &format!("{kubelet_root}/pod-resources")).read_only(),
    );
    ds.host_pid = spec.host_pid == Some(true);
    ds.host_network = spec.host_network == Some(true);
    ds.pod_labels = spec.pod_labels.clone();
    ds.pod_annotations = spec.pod_annotations.clone();
    ds.await_validation(Awaits::DriverAndToolkit);

    let mut objects = vec![ds.build().into(), service(policy, facts).into()];
    if let Some(monitor) = spec
        .service_monitor
        .as_ref()
        .filter(|m| m.enabled == Some(true))
    {
        objects.push(service_monitor(policy, facts, monitor));
    }
    objects
}

fn service(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Service {
    let settings = policy.spec.dcgm_exporter.service.as_ref();
    let app = Component::DcgmExporter.app_name();
    Service {
        metadata: object_meta(
            policy,
            facts,
            Component::DcgmExporter,
            app,
            &BTreeMap::new(),
            &BTreeMap::new(),
        ),
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(APP_LABEL.into(), app.into())])),
            ports: Some(vec![ServicePort {
                name: Some(SERVICE_PORT_NAME.into()),
                port: METRICS_PORT,
                target_port: Some(IntOrString::String("metrics".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            type_: settings.and_then(|s| s.type_.clone()),
            internal_traffic_policy: settings.and_then(|s| s.internal_traffic_policy.clone()),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The ServiceMonitor, as JSON (its types are the Prometheus operator's): scrapes the Service's `gpu-metrics`
/// port at /metrics, labelled with `additionalLabels` so the user's Prometheus selects it.
fn service_monitor(
    policy: &ValidatedPolicy,
    facts: &ClusterFacts,
    settings: &crd::cluster_policy::ServiceMonitorSpec,
) -> RenderedObject {
    let app = Component::DcgmExporter.app_name();
    let metadata = object_meta(
        policy,
        facts,
        Component::DcgmExporter,
        app,
        &settings.additional_labels,
        &BTreeMap::new(),
    );
    let mut endpoint = json!({ "port": SERVICE_PORT_NAME, "path": "/metrics" });
    if let Some(interval) = settings.interval.as_deref().filter(|i| !i.is_empty()) {
        endpoint["interval"] = interval.into();
    }
    if let Some(honor_labels) = settings.honor_labels {
        endpoint["honorLabels"] = honor_labels.into();
    }
    if !settings.relabelings.is_empty() {
        endpoint["relabelings"] = Value::Array(settings.relabelings.clone());
    }
    RenderedObject::ServiceMonitor(json!({
        "apiVersion": SERVICE_MONITOR_API_VERSION,
        "kind": SERVICE_MONITOR_KIND,
        "metadata": metadata,
        "spec": {
            "selector": { "matchLabels": { APP_LABEL: app } },
            "namespaceSelector": { "matchNames": [facts.namespace] },
            "endpoints": [endpoint],
        },
    }))
}

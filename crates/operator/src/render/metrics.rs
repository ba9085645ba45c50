//! What the operands that serve Prometheus metrics share: the Service in front of their pods and, when asked, a
//! Prometheus-operator ServiceMonitor so kube-prometheus-stack scrapes them (the exporter's and the watchdog's).

use std::collections::BTreeMap;

use crd::cluster_policy::ServiceMonitorSpec;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::RenderedObject;
use super::common::{APP_LABEL, object_meta};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

/// apiVersion of the Prometheus operator's ServiceMonitor.
pub const SERVICE_MONITOR_API_VERSION: &str = "monitoring.coreos.com/v1";
pub const SERVICE_MONITOR_KIND: &str = "ServiceMonitor";

/// An operand's metrics port: its container port is named `metrics`.
#[derive(Clone, Copy, Debug)]
pub(super) struct MetricsPort {
    pub component: Component,
    pub port: i32,
    /// The Service's port name, which the ServiceMonitor's endpoint names.
    pub service_port_name: &'static str,
}

/// What users set on the Service (the exporter's `service` section; NVIDIA's names).
#[derive(Clone, Debug, Default)]
pub(super) struct ServiceSettings {
    pub type_: Option<String>,
    pub internal_traffic_policy: Option<String>,
}

/// A metrics operand's objects: its DaemonSet, the Service in front of it and, when enabled, its ServiceMonitor.
pub(super) fn with_service(
    policy: &ValidatedPolicy,
    facts: &ClusterFacts,
    metrics: &MetricsPort,
    daemon_set: DaemonSet,
    settings: ServiceSettings,
    monitor: Option<&ServiceMonitorSpec>,
) -> Vec<RenderedObject> {
    let mut objects = vec![
        daemon_set.into(),
        service(policy, facts, metrics, settings).into(),
    ];
    objects.extend(service_monitor(policy, facts, metrics, monitor));
    objects
}

/// The Service selecting the component's pods by their `app` label.
fn service(
    policy: &ValidatedPolicy,
    facts: &ClusterFacts,
    metrics: &MetricsPort,
    settings: ServiceSettings,
) -> Service {
    let app = metrics.component.app_name();
    Service {
        metadata: object_meta(
            policy,
            facts,
            metrics.component,
            app,
            &BTreeMap::new(),
            &BTreeMap::new(),
        ),
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(APP_LABEL.into(), app.into())])),
            ports: Some(vec![ServicePort {
                name: Some(metrics.service_port_name.into()),
                port: metrics.port,
                target_port: Some(IntOrString::String("metrics".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            type_: settings.type_,
            internal_traffic_policy: settings.internal_traffic_policy,
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The ServiceMonitor, when enabled, as JSON (its types are the Prometheus operator's): scrapes the Service's
/// port at /metrics, keeping the series' own `pod` and `namespace`, labelled with `additionalLabels` so the
/// user's Prometheus selects it.
fn service_monitor(
    policy: &ValidatedPolicy,
    facts: &ClusterFacts,
    metrics: &MetricsPort,
    settings: Option<&ServiceMonitorSpec>,
) -> Option<RenderedObject> {
    let settings = settings.filter(|m| m.enabled == Some(true))?;
    let app = metrics.component.app_name();
    let metadata = object_meta(
        policy,
        facts,
        metrics.component,
        app,
        &settings.additional_labels,
        &BTreeMap::new(),
    );
    let mut endpoint = json!({ "port": metrics.service_port_name, "path": "/metrics" });
    if let Some(interval) = settings.interval.as_deref().filter(|i| !i.is_empty()) {
        endpoint["interval"] = interval.into();
    }
    // The exporter and the watchdog label each series with the `pod` and `namespace` of the workload using the
    // GPU, the labels the dashboard groups by. Prometheus' target labels of the same names (the exporter's own pod)
    // would rename them to exported_pod and exported_namespace unless the series' labels are honoured, so unset
    // means true here, where NVIDIA's default is false. An explicit false (as NVIDIA's values file writes) is kept
    // for queries written against exported_*.
    endpoint["honorLabels"] = settings.honor_labels.unwrap_or(true).into();
    if !settings.relabelings.is_empty() {
        endpoint["relabelings"] = Value::Array(settings.relabelings.clone());
    }
    Some(RenderedObject::ServiceMonitor(json!({
        "apiVersion": SERVICE_MONITOR_API_VERSION,
        "kind": SERVICE_MONITOR_KIND,
        "metadata": metadata,
        "spec": {
            "selector": { "matchLabels": { APP_LABEL: app } },
            "namespaceSelector": { "matchNames": [facts.namespace] },
            "endpoints": [endpoint],
        },
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixture::{one_node, policy};

    fn monitor(settings: Value) -> Value {
        let policy = policy(json!({}));
        let facts = one_node();
        let metrics = MetricsPort {
            component: Component::DcgmExporter,
            port: 9400,
            service_port_name: "gpu-metrics",
        };
        let settings: ServiceMonitorSpec = serde_json::from_value(settings).expect("settings");
        match service_monitor(&policy, &facts, &metrics, Some(&settings)) {
            Some(RenderedObject::ServiceMonitor(monitor)) => monitor,
            other => panic!("expected a ServiceMonitor, got {other:?}"),
        }
    }

    #[test]
    fn service_monitor_honours_the_series_labels_unless_told_not_to() {
        let default = monitor(json!({"enabled": true}));
        assert_eq!(default["spec"]["endpoints"][0]["honorLabels"], true);
        let nvidias = monitor(json!({"enabled": true, "honorLabels": false}));
        assert_eq!(nvidias["spec"]["endpoints"][0]["honorLabels"], false);
    }

    #[test]
    fn service_monitor_carries_the_additional_labels() {
        let labelled = monitor(
            json!({"enabled": true, "additionalLabels": {"release": "kube-prometheus-stack"}}),
        );
        assert_eq!(
            labelled["metadata"]["labels"]["release"],
            "kube-prometheus-stack"
        );
        assert_eq!(
            labelled["metadata"]["labels"][APP_LABEL],
            "nvidia-dcgm-exporter"
        );
    }
}

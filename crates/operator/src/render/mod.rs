//! render: pure functions from the validated policy and the observed cluster to the objects the operator
//! applies. One module per operand; what they share (metadata, scheduling, the section's container settings,
//! the validation init container) is built once in [`common`].
//!
//! Rendering reads nothing but its arguments: no API calls, no clock, no environment. The same inputs always
//! give the same objects in the same order, with sorted maps, so that golden snapshots are stable and the apply
//! layer's server-side apply sees no change when nothing changed.

mod common;
mod dcgm;
mod device_plugin;
mod discovery;
mod dra_driver;
mod driver;
mod exporter;
mod metrics;
mod mig_manager;
mod node_status_exporter;
mod toolkit;
mod validator;
mod watchdog;

#[cfg(test)]
pub(crate) mod fixture;
#[cfg(test)]
mod option_tests;
#[cfg(test)]
mod privileges;
#[cfg(test)]
mod tests;

use k8s_openapi::Resource;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::model::{ClusterFacts, Component, ValidatedPolicy};

pub use common::{COMPONENT_LABEL, DAEMONSET_LABEL, MANAGED_BY_LABEL, MANAGER, PART_OF_LABEL};
pub use metrics::{SERVICE_MONITOR_API_VERSION, SERVICE_MONITOR_KIND};

/// One object the operator wants in the cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum RenderedObject {
    DaemonSet(Box<DaemonSet>),
    Service(Box<Service>),
    /// A Prometheus-operator ServiceMonitor, kept as JSON: its CRD is not ours and may not be installed.
    ServiceMonitor(Value),
}

/// Every object the policy asks for on this cluster, component by component in [`Component::ALL`] order.
/// Disabled components render nothing; DaemonSets render even when there is no GPU node (they schedule
/// nowhere), except the per-pool ones (driver per OS pool or kernel, toolkit per runtime), which exist only for
/// the pools present.
pub fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    Component::ALL
        .into_iter()
        .filter(|component| policy.is_enabled(*component))
        .flat_map(|component| render_component(component, policy, facts))
        .collect()
}

fn render_component(
    component: Component,
    policy: &ValidatedPolicy,
    facts: &ClusterFacts,
) -> Vec<RenderedObject> {
    match component {
        Component::Driver => driver::render(policy, facts),
        Component::ContainerToolkit => toolkit::render(policy, facts),
        Component::OperatorValidator => validator::render(policy, facts),
        Component::DevicePlugin => device_plugin::render(policy, facts),
        Component::GpuFeatureDiscovery => discovery::render(policy, facts),
        Component::Dcgm => dcgm::render(policy, facts),
        Component::DcgmExporter => exporter::render(policy, facts),
        Component::MigManager => mig_manager::render(policy, facts),
        Component::NodeStatusExporter => node_status_exporter::render(policy, facts),
        Component::Watchdog => watchdog::render(policy, facts),
        Component::DraDriver => dra_driver::render(policy, facts),
    }
}

impl RenderedObject {
    /// The component the object belongs to, read from its `app.kubernetes.io/component` label.
    ///
    /// # Panics
    /// When the object lacks that label or names no component; every object [`render`] returns carries it.
    pub fn component(&self) -> Component {
        let label = match self.metadata() {
            Some(metadata) => metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(COMPONENT_LABEL))
                .cloned(),
            None => self.to_json()["metadata"]["labels"][COMPONENT_LABEL]
                .as_str()
                .map(str::to_owned),
        };
        Component::ALL
            .into_iter()
            .find(|component| Some(component.label_name()) == label.as_deref())
            .unwrap_or_else(|| {
                panic!(
                    "{} {} has no valid {COMPONENT_LABEL} label",
                    self.kind(),
                    self.name()
                )
            })
    }

    /// The object's kind, e.g. `DaemonSet`.
    pub fn kind(&self) -> &'static str {
        match self {
            RenderedObject::DaemonSet(_) => DaemonSet::KIND,
            RenderedObject::Service(_) => Service::KIND,
            RenderedObject::ServiceMonitor(_) => SERVICE_MONITOR_KIND,
        }
    }

    /// The object's apiVersion, e.g. `apps/v1`.
    pub fn api_version(&self) -> &'static str {
        match self {
            RenderedObject::DaemonSet(_) => DaemonSet::API_VERSION,
            RenderedObject::Service(_) => Service::API_VERSION,
            RenderedObject::ServiceMonitor(_) => SERVICE_MONITOR_API_VERSION,
        }
    }

    /// The object's name (every rendered object is named).
    pub fn name(&self) -> String {
        let name = match self.metadata() {
            Some(metadata) => metadata.name.clone(),
            None => self.to_json()["metadata"]["name"]
                .as_str()
                .map(str::to_owned),
        };
        name.unwrap_or_default()
    }

    /// The metadata of a typed object; `None` for a ServiceMonitor, which is JSON.
    fn metadata(&self) -> Option<&ObjectMeta> {
        match self {
            RenderedObject::DaemonSet(ds) => Some(&ds.metadata),
            RenderedObject::Service(svc) => Some(&svc.metadata),
            RenderedObject::ServiceMonitor(_) => None,
        }
    }

    /// The object as JSON with `apiVersion` and `kind` set, ready for server-side apply.
    pub fn to_json(&self) -> Value {
        let mut value = match self {
            RenderedObject::DaemonSet(ds) => serde_json::to_value(ds.as_ref()),
            RenderedObject::Service(svc) => serde_json::to_value(svc.as_ref()),
            RenderedObject::ServiceMonitor(value) => Ok(value.clone()),
        }
        .expect("Kubernetes objects always serialize to JSON");
        if let Some(object) = value.as_object_mut() {
            object.insert("apiVersion".into(), self.api_version().into());
            object.insert("kind".into(), self.kind().into());
        }
        value
    }
}

impl From<DaemonSet> for RenderedObject {
    fn from(ds: DaemonSet) -> Self {
        RenderedObject::DaemonSet(Box::new(ds))
    }
}

impl From<Service> for RenderedObject {
    fn from(svc: Service) -> Self {
        RenderedObject::Service(Box::new(svc))
    }
}

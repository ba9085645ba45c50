//! The floor: how fast the cluster itself runs our operands with no operator in the way. After our operator's run at
//! a node count, the objects it rendered (DaemonSets, and Services such as the exporter's, whose endpoints the
//! cluster keeps as pods come up) and the node labels it wrote are captured. The floor's run installs our chart (the
//! operands' ServiceAccounts and RuntimeClass), writes those labels beforehand (untimed: a cluster where they already
//! stand), then creates the objects at once, and times what the DaemonSet controller, the scheduler and kwok take.
//! Whatever an operator's time adds to the floor's is the operator's doing.
//!
//! Capturing is the I/O half; [`as_applied`], [`service_as_applied`] and [`written_labels`] are pure.

use std::collections::BTreeMap;
use std::path::Path;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams};

use harness::cluster::{self, ClusterInfo, Connection};
use harness::command;
use harness::operators::NAMESPACE;

use super::contender::{Contender, delete_operands};

/// Every node's labels, by node name.
pub type NodeLabels = BTreeMap<String, BTreeMap<String, String>>;

/// The field manager of the floor's writes.
const MANAGER: &str = "bench-floor";

/// What our operator made of the cluster, to be made again without it.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Its operand DaemonSets as one would create them.
    pub daemonsets: Vec<DaemonSet>,
    /// Its Services, likewise.
    pub services: Vec<Service>,
    /// The labels it added or changed, with the nodes that got exactly those.
    pub labels: Vec<(BTreeMap<String, String>, Vec<String>)>,
}

/// Reads every node's labels.
pub fn node_labels(connection: &Connection) -> anyhow::Result<NodeLabels> {
    let nodes: Api<Node> = Api::all(connection.client.clone());
    let list = connection.request(nodes.list(&ListParams::default()))?;
    Ok(list
        .items
        .into_iter()
        .map(|node| {
            (
                node.metadata.name.unwrap_or_default(),
                node.metadata.labels.unwrap_or_default(),
            )
        })
        .collect())
}

/// The operator's DaemonSets and Services and the labels written since `before`, while its run stands ready.
pub fn capture(connection: &Connection, before: &NodeLabels) -> anyhow::Result<Captured> {
    let rendered = ListParams::default().labels(RENDERED);
    let daemonsets: Api<DaemonSet> = Api::namespaced(connection.client.clone(), NAMESPACE);
    let services: Api<Service> = Api::namespaced(connection.client.clone(), NAMESPACE);
    Ok(Captured {
        daemonsets: connection
            .request(daemonsets.list(&rendered))?
            .items
            .into_iter()
            .map(as_applied)
            .collect(),
        services: connection
            .request(services.list(&rendered))?
            .items
            .into_iter()
            .map(service_as_applied)
            .collect(),
        labels: written_labels(before, &node_labels(connection)?),
    })
}

/// What the operator renders carries this label (the chart's own objects are Helm's).
const RENDERED: &str = "app.kubernetes.io/managed-by=gpu-operator";

/// Metadata as creating an object takes it: name, namespace, labels and annotations. The owner reference to the
/// ClusterPolicy goes (no ClusterPolicy exists in the floor's run, and the garbage collector would delete what it
/// owned), and so does what the API server writes.
fn applied_metadata(metadata: ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        labels: metadata.labels,
        annotations: metadata.annotations.map(|annotations| {
            annotations
                .into_iter()
                .filter(|(key, _)| !key.starts_with("deprecated.daemonset.template.generation"))
                .collect()
        }),
        ..ObjectMeta::default()
    }
}

/// A Service as read back, reduced to what creating it takes: its cluster IPs are the API server's to allocate.
pub fn service_as_applied(service: Service) -> Service {
    Service {
        metadata: applied_metadata(service.metadata),
        spec: service.spec.map(|mut spec| {
            spec.cluster_ip = None;
            spec.cluster_ips = None;
            spec
        }),
        status: None,
    }
}

/// A DaemonSet as read back, reduced to what creating it takes: its metadata as [`applied_metadata`] keeps it and
/// its spec.
pub fn as_applied(daemonset: DaemonSet) -> DaemonSet {
    DaemonSet {
        metadata: applied_metadata(daemonset.metadata),
        spec: daemonset.spec,
        status: None,
    }
}

/// The labels each node has in `after` that it did not have (with that value) in `before`, grouped: one entry per
/// distinct set of labels, with its nodes in name order.
pub fn written_labels(
    before: &NodeLabels,
    after: &NodeLabels,
) -> Vec<(BTreeMap<String, String>, Vec<String>)> {
    let mut groups: BTreeMap<BTreeMap<String, String>, Vec<String>> = BTreeMap::new();
    for (node, labels) in after {
        let earlier = before.get(node);
        let written: BTreeMap<String, String> = labels
            .iter()
            .filter(|(key, value)| earlier.and_then(|labels| labels.get(*key)) != Some(*value))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        if !written.is_empty() {
            groups.entry(written).or_default().push(node.clone());
        }
    }
    groups.into_iter().collect()
}

/// Merge-patches `labels` onto every node of `nodes` (`None` removes the key).
fn label_nodes(
    connection: &Connection,
    nodes: &[String],
    labels: &BTreeMap<&str, Option<&str>>,
) -> anyhow::Result<()> {
    super::say(format!("labelling {} nodes", nodes.len()));
    patch_nodes(connection, nodes, &serde_json::json!({"labels": labels}))
}

/// Merge-patches `metadata` (labels, annotations) onto every node of `nodes`, [`IN_FLIGHT`] patches at a time:
/// `kubectl label` patches one node after another, which took 15 minutes at 5,000 nodes.
pub fn patch_nodes(
    connection: &Connection,
    nodes: &[String],
    metadata: &serde_json::Value,
) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(connection.client.clone());
    let patch = Patch::Merge(serde_json::json!({ "metadata": metadata }));
    let params = PatchParams::default();
    // One request call per chunk, so that each stays well inside the connection's timeout.
    for chunk in nodes.chunks(IN_FLIGHT * 4) {
        connection.request(
            futures::stream::iter(chunk)
                .map(|node| api.patch(node, &params, &patch))
                .buffer_unordered(IN_FLIGHT)
                .try_collect::<Vec<_>>(),
        )?;
    }
    Ok(())
}

/// Node label patches in flight at once.
const IN_FLIGHT: usize = 32;

impl Captured {
    /// Our chart installed (no operator started) and the captured labels written, before the clock starts.
    pub fn prepare(&self, root: &Path, info: &ClusterInfo, ours: &Contender) -> anyhow::Result<()> {
        let env = cluster::env_vars(info);
        ours.install(root, &env)?;
        let connection = Connection::open(&info.kubeconfig)?;
        for (labels, nodes) in &self.labels {
            let set = labels
                .iter()
                .map(|(key, value)| (key.as_str(), Some(value.as_str())))
                .collect();
            label_nodes(&connection, nodes, &set)?;
        }
        Ok(())
    }

    /// Creates every DaemonSet and Service, one server-side apply each.
    pub fn apply(&self, connection: &Connection) -> anyhow::Result<()> {
        let params = PatchParams::apply(MANAGER).force();
        let daemonsets: Api<DaemonSet> = Api::namespaced(connection.client.clone(), NAMESPACE);
        for daemonset in &self.daemonsets {
            let name = daemonset.metadata.name.clone().unwrap_or_default();
            connection.request(daemonsets.patch(&name, &params, &Patch::Apply(daemonset)))?;
        }
        let services: Api<Service> = Api::namespaced(connection.client.clone(), NAMESPACE);
        for service in &self.services {
            let name = service.metadata.name.clone().unwrap_or_default();
            connection.request(services.patch(&name, &params, &Patch::Apply(service)))?;
        }
        Ok(())
    }

    /// The patch of the benchmark, done by hand: the first container of `daemonset` gets the image tag `tag`.
    pub fn retag(&self, connection: &Connection, daemonset: &str, tag: &str) -> anyhow::Result<()> {
        let container = self
            .daemonsets
            .iter()
            .find(|candidate| candidate.metadata.name.as_deref() == Some(daemonset))
            .and_then(|found| found.spec.template.spec.as_ref()?.containers.first())
            .ok_or_else(|| anyhow::anyhow!("our operator rendered no DaemonSet {daemonset}"))?;
        let image = container.image.clone().unwrap_or_default();
        let repository = image
            .rsplit_once(':')
            .map_or(image.as_str(), |(repository, _)| repository);
        let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [
            {"name": container.name, "image": format!("{repository}:{tag}")}
        ]}}}});
        let api: Api<DaemonSet> = Api::namespaced(connection.client.clone(), NAMESPACE);
        connection.request(api.patch(
            daemonset,
            &PatchParams::default(),
            &Patch::Strategic(patch),
        ))?;
        Ok(())
    }

    /// Deletes the DaemonSets (waiting for their pods), the Services, the labels and the chart: the cluster is as
    /// before.
    pub fn remove(&self, root: &Path, info: &ClusterInfo, ours: &Contender) -> anyhow::Result<()> {
        let env = cluster::env_vars(info);
        delete_operands(root, &env)?;
        command::run(
            root,
            &env,
            "kubectl",
            &[
                "delete", "service", "-n", NAMESPACE, "-l", RENDERED, "--wait",
            ],
        )?;
        let connection = Connection::open(&info.kubeconfig)?;
        for (labels, nodes) in &self.labels {
            let removed = labels.keys().map(|key| (key.as_str(), None)).collect();
            label_nodes(&connection, nodes, &removed)?;
        }
        ours.uninstall(root, &env)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn written_labels_are_grouped_by_what_each_node_got() {
        let nfd = ("feature.node.kubernetes.io/pci-10de.present", "true");
        let before = NodeLabels::from([
            ("a".to_owned(), labels(&[nfd])),
            ("b".to_owned(), labels(&[nfd])),
            (
                "c".to_owned(),
                labels(&[nfd, ("nvidia.com/mig.capable", "true")]),
            ),
            ("cpu".to_owned(), labels(&[])),
        ]);
        let deploy = ("nvidia.com/gpu.deploy.device-plugin", "true");
        let after = NodeLabels::from([
            ("a".to_owned(), labels(&[nfd, deploy])),
            ("b".to_owned(), labels(&[nfd, deploy])),
            (
                "c".to_owned(),
                labels(&[
                    nfd,
                    deploy,
                    ("nvidia.com/mig.capable", "true"),
                    ("nvidia.com/mig.config", "all-disabled"),
                ]),
            ),
            ("cpu".to_owned(), labels(&[])),
        ]);
        assert_eq!(
            written_labels(&before, &after),
            vec![
                (labels(&[deploy]), vec!["a".to_owned(), "b".to_owned()]),
                (
                    labels(&[deploy, ("nvidia.com/mig.config", "all-disabled")]),
                    vec!["c".to_owned()]
                ),
            ],
            "labels a node had before are not written again; a node with nothing new is left out"
        );
        let changed = NodeLabels::from([("a".to_owned(), labels(&[("nfd", "false")]))]);
        let before = NodeLabels::from([("a".to_owned(), labels(&[("nfd", "true")]))]);
        assert_eq!(
            written_labels(&before, &changed),
            vec![(labels(&[("nfd", "false")]), vec!["a".to_owned()])],
            "a changed value is written"
        );
    }

    #[test]
    fn a_service_is_applied_without_its_cluster_ips() {
        let read: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator", "uid": "1",
                         "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy", "uid": "5678"}]},
            "spec": {"clusterIP": "10.0.0.7", "clusterIPs": ["10.0.0.7"], "ports": [{"name": "metrics", "port": 9400}]},
            "status": {"loadBalancer": {}}
        }))
        .unwrap();
        let applied = service_as_applied(read);
        let spec = applied.spec.unwrap();
        assert!(spec.cluster_ip.is_none() && spec.cluster_ips.is_none());
        assert_eq!(spec.ports.unwrap()[0].port, 9400);
        assert!(applied.metadata.owner_references.is_none() && applied.metadata.uid.is_none());
        assert!(applied.status.is_none());
    }

    #[test]
    fn a_daemonset_is_applied_without_its_owner_and_server_fields() {
        let read: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "nvidia-device-plugin-daemonset",
                "namespace": "gpu-operator",
                "uid": "1234",
                "resourceVersion": "99",
                "generation": 3,
                "creationTimestamp": "2026-11-27T10:00:00Z",
                "labels": {"app": "nvidia-device-plugin-daemonset"},
                "annotations": {
                    "deprecated.daemonset.template.generation": "3",
                    "nvidia.com/last-applied-hash": "x"
                },
                "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy", "uid": "5678"}],
                "managedFields": [{"manager": "gpu-operator"}]
            },
            "spec": {
                "selector": {"matchLabels": {"app": "nvidia-device-plugin-daemonset"}},
                "template": {"spec": {"containers": [{"name": "plugin", "image": "x/plugin:1"}]}}
            },
            "status": {"currentNumberScheduled": 1, "desiredNumberScheduled": 1, "numberMisscheduled": 0, "numberReady": 1}
        }))
        .unwrap();
        let spec = read.spec.clone();
        let applied = as_applied(read);
        assert_eq!(applied.spec, spec);
        assert!(applied.status.is_none());
        let metadata = applied.metadata;
        assert_eq!(
            metadata.name.as_deref(),
            Some("nvidia-device-plugin-daemonset")
        );
        assert_eq!(metadata.namespace.as_deref(), Some("gpu-operator"));
        assert_eq!(
            metadata.annotations,
            Some(labels(&[("nvidia.com/last-applied-hash", "x")]))
        );
        assert_eq!(metadata.owner_references, None::<Vec<OwnerReference>>);
        assert!(metadata.uid.is_none() && metadata.resource_version.is_none());
        assert!(metadata.managed_fields.is_none() && metadata.generation.is_none());
    }
}

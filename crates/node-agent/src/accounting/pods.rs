//! The pods of this node, by UID, as the API server has them: what turns a cgroup's pod UID and container ID into
//! a namespace, a pod and a container name. Kept by a watch on the node's own pods (a field selector), so a pass
//! costs no API call.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

/// One pod of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    /// `metadata.uid`.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its annotations (the watchdog reads its memory-limit annotation).
    pub annotations: BTreeMap<String, String>,
    /// Container runtime ID (without the `containerd://` scheme) → container name, over its init, regular and
    /// ephemeral containers.
    pub containers: BTreeMap<String, String>,
    /// The names of its ResourceClaims: named in its spec, or generated from a template (its status).
    pub claims: BTreeSet<String>,
}

impl PodEntry {
    /// The entry for a pod as the API server has it.
    #[must_use]
    pub fn new(pod: &Pod) -> Self {
        let statuses = pod.status.iter().flat_map(|status| {
            [
                &status.init_container_statuses,
                &status.container_statuses,
                &status.ephemeral_container_statuses,
            ]
            .into_iter()
            .flatten()
            .flatten()
        });
        let containers = statuses
            .filter_map(|status| {
                let id = status.container_id.as_deref()?;
                let id = id.split_once("://").map_or(id, |(_, id)| id);
                Some((id.to_owned(), status.name.clone()))
            })
            .collect();
        let named = pod
            .spec
            .iter()
            .flat_map(|spec| spec.resource_claims.iter().flatten())
            .filter_map(|claim| claim.resource_claim_name.clone());
        let generated = pod
            .status
            .iter()
            .flat_map(|status| status.resource_claim_statuses.iter().flatten())
            .filter_map(|claim| claim.resource_claim_name.clone());
        Self {
            claims: named.chain(generated).collect(),
            uid: pod.uid().unwrap_or_default(),
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            annotations: pod.annotations().clone(),
            containers,
        }
    }
}

/// The node's pods by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodIndex {
    by_uid: BTreeMap<String, PodEntry>,
}

impl PodIndex {
    /// The index of these pods.
    pub fn new<'p>(pods: impl IntoIterator<Item = &'p Pod>) -> Self {
        Self {
            by_uid: pods
                .into_iter()
                .map(PodEntry::new)
                .map(|entry| (entry.uid.clone(), entry))
                .collect(),
        }
    }

    /// The pod with this UID.
    #[must_use]
    pub fn get(&self, uid: &str) -> Option<&PodEntry> {
        self.by_uid.get(uid)
    }

    /// The pod one of whose containers has this runtime ID.
    #[must_use]
    pub fn with_container(&self, container_id: &str) -> Option<&PodEntry> {
        self.by_uid
            .values()
            .find(|pod| pod.containers.contains_key(container_id))
    }

    /// Every pod.
    pub fn iter(&self) -> impl Iterator<Item = &PodEntry> {
        self.by_uid.values()
    }

    /// The pod with this namespace and name.
    #[must_use]
    pub fn named(&self, namespace: &str, name: &str) -> Option<&PodEntry> {
        self.by_uid
            .values()
            .find(|pod| pod.namespace == namespace && pod.name == name)
    }
}

/// A store of the node's pods, and the watch that fills it (to be spawned).
pub fn watch_node_pods(
    client: Client,
    node: &str,
) -> (Store<Pod>, impl Future<Output = ()> + Send + 'static) {
    let (store, pods) = node_runtime::kube_io::watch_node_pods(client, node);
    (store, pods.for_each(|_| std::future::ready(())))
}

/// The index of what the store holds now.
#[must_use]
pub fn index(store: &Store<Pod>) -> PodIndex {
    PodIndex::new(store.state().iter().map(AsRef::as_ref))
}

/// A running pod of one container `main`, as the API server has it, for tests.
#[cfg(test)]
pub(crate) fn running_pod(namespace: &str, name: &str, uid: &str, container_id: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": {"containerStatuses": [{
            "name": "main", "containerID": format!("containerd://{container_id}"),
            "image": "x", "imageID": "", "ready": true, "restartCount": 0
        }]}
    }))
    .expect("a pod")
}

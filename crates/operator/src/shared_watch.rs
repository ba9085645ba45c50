//! The watches both controllers read, the reconciler's and the driver upgrade's: one watch and one cache per kind,
//! trimmed to what either reads, with a stream of changes for each. Two watches of every Node had the API server
//! send each node's updates twice and the operator keep two copies of every node (at 1000 kwok nodes with 20
//! labels each, 3.7 MiB per copy; nodes labelled by Node Feature Discovery carry three to five times more).

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::ready;
use std::hash::Hash;
use std::sync::Arc;

use crd::{GPUNode, GpuNodeStatus};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo};
use kube::Resource;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::{Writer, WriterDropped};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::controller::{forget_bookkeeping, guarded_watcher};
use crate::health::Health;
use crate::metrics::Metrics;

/// Changes a slow reader may fall behind by before the watch waits for it.
const BUFFER: usize = 1024;

/// A cache and a stream of its changes, as one controller reads them.
pub struct SharedCache<K: Resource + 'static>
where
    K::DynamicType: Hash + Eq,
{
    pub store: Store<K>,
    /// The objects as they are applied, each only when its relevance to this reader changed.
    pub changes: BoxStream<'static, Arc<K>>,
    /// Whether the cache holds its first full list. A kube store's own readiness wakes a single waiter, and a
    /// shared store has a waiter per reader: the one that was not woken would wait forever.
    listed: watch::Receiver<bool>,
    kind: String,
}

impl<K: Resource> SharedCache<K>
where
    K::DynamicType: Hash + Eq,
{
    /// Completes once the cache holds its first full list.
    pub fn listed(&self) -> impl Future<Output = Result<(), Unlisted>> + Send + 'static {
        let mut listed = self.listed.clone();
        let kind = self.kind.clone();
        async move {
            listed
                .wait_for(|listed| *listed)
                .await
                .map(drop)
                .map_err(|_| Unlisted { kind })
        }
    }
}

/// A shared watch that stopped before its cache held a full list.
#[derive(Debug, thiserror::Error)]
#[error("the {kind} watch stopped before its first list")]
pub struct Unlisted {
    kind: String,
}

/// Why a controller's caches never held their first lists: a watch of its own or a shared one stopped.
#[derive(Debug, thiserror::Error)]
pub enum Unsynced {
    #[error(transparent)]
    Own(#[from] WriterDropped),
    #[error(transparent)]
    Shared(#[from] Unlisted),
}

/// One watch of `K` feeding one cache that several controllers read.
pub struct SharedWatch<K: Resource + Clone + 'static>
where
    K::DynamicType: Hash + Eq + Clone,
{
    writer: Writer<K>,
    listed: watch::Sender<bool>,
}

impl<K> SharedWatch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Debug + Send + Sync + Unpin,
{
    pub fn new() -> Self {
        Self {
            writer: Writer::new_shared(BUFFER, Default::default()),
            listed: watch::channel(false).0,
        }
    }

    /// A reader's view: the cache, and the objects whose `relevance` changed since they last came by (what kube's
    /// `predicate_filter` does for a watch of one's own).
    pub fn reader(&self, relevance: fn(&K) -> Option<u64>) -> SharedCache<K> {
        SharedCache {
            store: self.writer.as_reader(),
            changes: relevant(
                futures::stream::iter(self.writer.subscribe()).flatten(),
                relevance,
            )
            .boxed(),
            listed: self.listed.subscribe(),
            kind: K::kind(&Default::default()).into_owned(),
        }
    }

    /// Runs the watch until the future is dropped, `keep` trimming each object before it is cached.
    pub async fn run(
        self,
        api: Api<DeserializeGuard<K>>,
        config: watcher::Config,
        keep: fn(&mut K),
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) {
        // The one waiter on the store's readiness, which tells every reader.
        let store = self.writer.as_reader();
        let listed = self.listed;
        let announce = async move {
            if store.wait_until_ready().await.is_ok() {
                listed.send_replace(true);
            }
        };
        let watch = guarded_watcher(api, config, &metrics, &health)
            .modify(keep)
            .reflect_shared(self.writer)
            .for_each(|_| ready(()));
        futures::future::join(watch, announce).await;
    }
}

impl<K: Resource + Clone> Debug for SharedWatch<K>
where
    K::DynamicType: Hash + Eq + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWatch")
            .field("kind", &std::any::type_name::<K>())
            .finish_non_exhaustive()
    }
}

impl<K: Resource> Debug for SharedCache<K>
where
    K::DynamicType: Hash + Eq,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCache")
            .field("kind", &std::any::type_name::<K>())
            .finish_non_exhaustive()
    }
}

impl<K> Default for SharedWatch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Debug + Send + Sync + Unpin,
{
    fn default() -> Self {
        Self::new()
    }
}

/// The objects of `changes` whose `relevance` differs from the last time the same object (by uid, else name) came
/// by; an object without relevance always passes.
fn relevant<K: Resource>(
    changes: impl Stream<Item = Arc<K>>,
    relevance: fn(&K) -> Option<u64>,
) -> impl Stream<Item = Arc<K>> {
    let mut seen: HashMap<String, u64> = HashMap::new();
    changes.filter(move |object| {
        let meta = object.meta();
        let key = meta
            .uid
            .clone()
            .or_else(|| meta.name.clone())
            .unwrap_or_default();
        let changed = match relevance(object) {
            Some(hash) => seen.insert(key, hash) != Some(hash),
            None => true,
        };
        ready(changed)
    })
}

/// What the controllers read of a Node, before it is cached: its labels (both), the driver upgrade's annotations,
/// the container runtime and kubelet versions of `status.nodeInfo` (the reconciler), `spec.unschedulable` and the
/// Ready condition's status (the driver upgrade). Everything else goes, times every node of the cluster: managed
/// fields, pulled images, addresses, capacity, the other conditions, heartbeats, and the other annotations (Node
/// Feature Discovery's alone list every feature label it wrote, kilobytes on a real node).
pub fn keep_what_controllers_read_of_nodes(node: &mut Node) {
    forget_bookkeeping(node);
    if let Some(annotations) = node.metadata.annotations.as_mut() {
        annotations.retain(|key, _| crd::driver_upgrade::NODE_ANNOTATIONS.contains(&key.as_str()));
    }
    node.spec = node.spec.take().map(|spec| NodeSpec {
        unschedulable: spec.unschedulable,
        ..NodeSpec::default()
    });
    node.status = node.status.take().map(|status| NodeStatus {
        node_info: status.node_info.map(|info| NodeSystemInfo {
            container_runtime_version: info.container_runtime_version,
            kubelet_version: info.kubelet_version,
            ..NodeSystemInfo::default()
        }),
        conditions: status.conditions.map(|conditions| {
            conditions
                .into_iter()
                .filter(|c| c.type_ == "Ready")
                .map(|c| NodeCondition {
                    type_: c.type_,
                    status: c.status,
                    ..NodeCondition::default()
                })
                .collect()
        }),
        ..NodeStatus::default()
    });
}

/// What the controllers read of a GPUNode's status, before it is cached: its MIG state and last error (for the
/// reconciler), the driver upgrade's state and the pods using its GPUs (for the upgrade). The per-GPU inventory
/// goes.
pub fn keep_what_controllers_read_of_gpu_nodes(gpu_node: &mut GPUNode) {
    forget_bookkeeping(gpu_node);
    gpu_node.status = gpu_node.status.take().map(|status| GpuNodeStatus {
        mig: status.mig,
        last_error: status.last_error,
        driver_upgrade: status.driver_upgrade,
        gpu_process_pods: status.gpu_process_pods,
        ..GpuNodeStatus::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerImage, NodeCondition, NodeSystemInfo};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    use kube::ResourceExt;

    #[test]
    fn a_node_keeps_what_either_controller_reads_and_nothing_else() {
        let heartbeat = Time(Timestamp::from_second(1_800_000_000).unwrap());
        let condition = |type_: &str| NodeCondition {
            type_: type_.into(),
            status: "True".into(),
            last_heartbeat_time: Some(heartbeat.clone()),
            ..NodeCondition::default()
        };
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: Some([("nvidia.com/gpu.present".to_owned(), "true".to_owned())].into()),
                annotations: Some(
                    [
                        (
                            "nfd.node.kubernetes.io/feature-labels".to_owned(),
                            "cpu-cpuid.ADX".to_owned(),
                        ),
                        (
                            crd::driver_upgrade::REQUESTED_ANNOTATION.to_owned(),
                            "true".to_owned(),
                        ),
                    ]
                    .into(),
                ),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(true),
                pod_cidr: Some("10.0.0.0/24".into()),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                images: Some(vec![ContainerImage::default()]),
                conditions: Some(vec![condition("Ready"), condition("MemoryPressure")]),
                node_info: Some(NodeSystemInfo {
                    container_runtime_version: "containerd://2.1.4".into(),
                    ..NodeSystemInfo::default()
                }),
                ..NodeStatus::default()
            }),
        };
        let reconciler = crate::controller::node_relevance(&node);
        let upgrade = crate::upgrade::controller::node_relevance(&node);

        keep_what_controllers_read_of_nodes(&mut node);

        assert_eq!(node.metadata.managed_fields, None);
        assert_eq!(node.labels().len(), 1);
        assert_eq!(
            node.annotations().keys().collect::<Vec<_>>(),
            [crd::driver_upgrade::REQUESTED_ANNOTATION],
            "only the driver upgrade's annotations"
        );
        let spec = node.spec.as_ref().unwrap();
        assert_eq!(
            (spec.unschedulable, spec.pod_cidr.as_ref()),
            (Some(true), None)
        );
        let status = node.status.as_ref().unwrap();
        assert_eq!(status.images, None);
        assert_eq!(
            status.node_info.as_ref().unwrap().container_runtime_version,
            "containerd://2.1.4"
        );
        let conditions = status.conditions.as_ref().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            (
                conditions[0].type_.as_str(),
                conditions[0].last_heartbeat_time.as_ref()
            ),
            ("Ready", None)
        );
        assert_eq!(crate::controller::node_relevance(&node), reconciler);
        assert_eq!(crate::upgrade::controller::node_relevance(&node), upgrade);
    }

    /// Two readers of one watch (as the two controllers are): both learn that the cache holds its first list (a
    /// kube store's own readiness would wake only one of them) and both get the listed node.
    #[tokio::test]
    async fn every_reader_learns_of_the_first_list_and_gets_the_objects() {
        let (api, client) = api_test_kit::FakeApi::start();
        api.insert(node("a", &[("x", "1")]).as_ref());
        let shared = SharedWatch::<Node>::new();
        let mut readers = [
            shared.reader(crate::controller::node_relevance),
            shared.reader(crate::upgrade::controller::node_relevance),
        ];
        let watch = tokio::spawn(shared.run(
            Api::all(client),
            watcher::Config::default(),
            keep_what_controllers_read_of_nodes,
            Metrics::shared(),
            Health::new(false),
        ));
        let wait = std::time::Duration::from_secs(10);
        for reader in &mut readers {
            tokio::time::timeout(wait, reader.listed())
                .await
                .expect("told of the first list")
                .unwrap();
            let node = tokio::time::timeout(wait, reader.changes.next())
                .await
                .expect("a change")
                .expect("the listed node");
            assert_eq!(node.name_any(), "a");
            assert_eq!(reader.store.state().len(), 1);
        }
        watch.abort();
    }

    fn node(uid: &str, labels: &[(&str, &str)]) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(uid.into()),
                uid: Some(uid.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..Node::default()
        })
    }

    #[tokio::test]
    async fn only_an_object_whose_relevance_changed_passes() {
        let changes = futures::stream::iter([
            node("a", &[("x", "1")]),
            node("b", &[("x", "1")]),
            node("a", &[("x", "1")]),
            node("a", &[("x", "2")]),
            node("b", &[("x", "1")]),
        ]);
        let passed: Vec<(String, String)> = relevant(changes, crate::controller::node_relevance)
            .map(|node| {
                (
                    node.metadata.name.clone().unwrap(),
                    node.labels()["x"].clone(),
                )
            })
            .collect()
            .await;
        assert_eq!(
            passed,
            [("a", "1"), ("b", "1"), ("a", "2")].map(|(n, x)| (n.to_owned(), x.to_owned()))
        );
    }
}

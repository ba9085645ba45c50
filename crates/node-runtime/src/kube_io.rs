//! The Kubernetes I/O the roles share: this node (read, watch, patch its metadata), one ConfigMap (watch), the pods
//! bound to this node (watch), and Events on the Node. Watches are field-selector watches (`metadata.name`, or
//! `spec.nodeName` for pods), so a node's agent receives its own node's changes only and never polls.

use std::collections::BTreeMap;

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod, PodSpec};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::watch_object;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tracing::warn;

use crd::node_patch::MetadataPatch;

/// A Kubernetes call that failed, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{action}: {source}")]
pub struct KubeError {
    /// What was being done, e.g. `patching node gpu-a100-0`.
    pub action: String,
    /// The client's error.
    #[source]
    pub source: kube::Error,
}

impl KubeError {
    /// A `map_err` adapter that names the action.
    pub fn during(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self { action, source }
    }

    /// The HTTP status the API server answered with, if it answered.
    #[must_use]
    pub fn status_code(&self) -> Option<u16> {
        match &self.source {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }
}

/// Connects with the in-cluster service account, or `KUBECONFIG` outside a cluster.
///
/// # Errors
/// When no configuration is found or it is unusable.
pub async fn client() -> anyhow::Result<Client> {
    use anyhow::Context;
    Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster service account or KUBECONFIG)")
}

/// A client that does not retry refused requests by itself, for the Eviction API: there a 429 means "a
/// PodDisruptionBudget says not now", which the MIG manager reports and retries on its own schedule, while the
/// default client would keep retrying it (with growing waits) inside one call.
///
/// # Errors
/// As [`client`].
pub async fn client_without_retries() -> anyhow::Result<Client> {
    use anyhow::Context;
    let mut config = kube::Config::infer().await.context(
        "reading the Kubernetes client configuration (in-cluster service account or KUBECONFIG)",
    )?;
    config.default_retry = false;
    Client::try_from(config).context("building the Kubernetes client")
}

/// This node, as the agent sees and changes it.
#[derive(Debug, Clone)]
pub struct NodeApi {
    api: Api<Node>,
    name: String,
}

impl NodeApi {
    /// The node called `name`.
    #[must_use]
    pub fn new(client: Client, name: &str) -> Self {
        Self {
            api: Api::all(client),
            name: name.to_owned(),
        }
    }

    /// The node's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads the node.
    ///
    /// # Errors
    /// When it cannot be read (404 when it does not exist).
    pub async fn get(&self) -> Result<Node, KubeError> {
        self.api
            .get(&self.name)
            .await
            .map_err(KubeError::during(format!("reading node {}", self.name)))
    }

    /// Applies a label/annotation change as one merge patch; nothing is sent when it is empty.
    ///
    /// # Errors
    /// When the API server refuses the patch.
    pub async fn patch(&self, patch: &MetadataPatch) -> Result<(), KubeError> {
        if patch.is_empty() {
            return Ok(());
        }
        self.api
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(patch.to_json()),
            )
            .await
            .map(drop)
            .map_err(KubeError::during(format!("patching node {}", self.name)))
    }

    /// The node's current state after every change; `None` while it does not exist.
    pub fn watch(&self) -> impl Stream<Item = Option<Node>> + Send + use<> {
        object_changes(self.api.clone(), &self.name)
    }
}

/// Every state of one ConfigMap: `None` while it does not exist.
pub fn watch_config_map(
    client: Client,
    namespace: &str,
    name: &str,
) -> impl Stream<Item = Option<ConfigMap>> + Send + use<> {
    object_changes(Api::namespaced(client, namespace), name)
}

/// Every state of one GPUNode: `None` while it does not exist.
pub fn watch_gpu_node(
    client: Client,
    name: &str,
) -> impl Stream<Item = Option<crd::gpu_node::GPUNode>> + Send + use<> {
    object_changes(Api::all(client), name)
}

/// Every state of one ResourceSlice: `None` while it does not exist (the kubelet deletes a node's slices when it
/// starts, and the DRA driver publishes its slice again).
pub fn watch_resource_slice(
    client: Client,
    name: &str,
) -> impl Stream<Item = Option<k8s_openapi::api::resource::v1::ResourceSlice>> + Send + use<> {
    object_changes(Api::all(client), name)
}

/// The pods bound to `node` (field selector `spec.nodeName`), in a store, and the watch that fills it: a stream of
/// each pod as it is added or changed, to be polled (the store fills only while it is). A failed watch is logged and
/// retried with backoff. Of the spec, only the claims it names are kept: no caller reads more, and a node's pods are
/// held for as long as the role runs.
pub fn watch_node_pods(
    client: Client,
    node: &str,
) -> (Store<Pod>, impl Stream<Item = Pod> + Send + use<>) {
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let pods = watcher(Api::<Pod>::all(client), config)
        .default_backoff()
        .modify(|pod| {
            pod.managed_fields_mut().clear();
            pod.spec = pod.spec.take().map(|spec| PodSpec {
                resource_claims: spec.resource_claims,
                ..PodSpec::default()
            });
        })
        .reflect(writer)
        .applied_objects()
        .filter_map(|event| {
            std::future::ready(match event {
                Ok(pod) => Some(pod),
                Err(error) => {
                    warn!(%error, "watching this node's pods failed; retrying");
                    None
                }
            })
        });
    (store, pods)
}

/// The latest Node and ConfigMap a role works from.
#[derive(Debug, Clone)]
pub struct Watched {
    /// This node.
    pub node: Node,
    /// The ConfigMap, `None` while it does not exist (or when the role has none).
    pub config_map: Option<ConfigMap>,
}

/// Watches the node and (when named) one ConfigMap in the background, keeping only their latest states: a role
/// that is busy for a while then sees the newest state once, not every state in between. The receiver holds
/// `None` until both have been seen (and while the Node does not exist).
#[must_use]
pub fn watch_inputs(
    node: &NodeApi,
    client: Client,
    namespace: &str,
    config_map: Option<&str>,
) -> watch::Receiver<Option<Watched>> {
    enum Change {
        Node(Box<Option<Node>>),
        ConfigMap(Box<Option<ConfigMap>>),
    }
    let nodes = node
        .watch()
        .map(|node| Change::Node(Box::new(node)))
        .boxed();
    let config_maps = match config_map {
        Some(name) => watch_config_map(client, namespace, name)
            .map(|config_map| Change::ConfigMap(Box::new(config_map)))
            .boxed(),
        None => stream::once(std::future::ready(Change::ConfigMap(Box::new(None)))).boxed(),
    };
    let (sender, receiver) = watch::channel(None);
    tokio::spawn(async move {
        let mut changes = stream::select(nodes, config_maps);
        let (mut node, mut config_map) = (None, None);
        while let Some(change) = changes.next().await {
            match change {
                Change::Node(latest) => node = Some(*latest),
                Change::ConfigMap(latest) => config_map = Some(*latest),
            }
            if let (Some(Some(node)), Some(config_map)) = (&node, &config_map) {
                let watched = Watched {
                    node: node.clone(),
                    config_map: config_map.clone(),
                };
                if sender.send(Some(watched)).is_err() {
                    break;
                }
            }
        }
    });
    receiver
}

/// One object's states, retrying with backoff when the watch fails (a failed watch is logged, not fatal).
fn object_changes<K>(api: Api<K>, name: &str) -> impl Stream<Item = Option<K>> + Send + use<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let name = name.to_owned();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    watch_object(api, &name)
        .default_backoff()
        .filter_map(move |result| {
            let outcome = match result {
                Ok(object) => Some(object),
                Err(error) => {
                    warn!(%kind, %name, %error, "watch failed; retrying");
                    None
                }
            };
            std::future::ready(outcome)
        })
}

/// A label of the node, if set.
#[must_use]
pub fn label<'n>(node: &'n Node, key: &str) -> Option<&'n str> {
    node.labels().get(key).map(String::as_str)
}

/// An annotation of the node, if set.
#[must_use]
pub fn annotation<'n>(node: &'n Node, key: &str) -> Option<&'n str> {
    node.annotations().get(key).map(String::as_str)
}

/// A key of a ConfigMap's data.
#[must_use]
pub fn config_map_value<'c>(config_map: &'c ConfigMap, key: &str) -> Option<&'c str> {
    config_map
        .data
        .as_ref()
        .and_then(|data: &BTreeMap<String, String>| data.get(key))
        .map(String::as_str)
}

/// Events about this node, as `kubectl describe node` shows them.
#[derive(Clone)]
pub struct NodeEvents {
    recorder: Recorder,
    reference: ObjectReference,
}

impl std::fmt::Debug for NodeEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeEvents")
            .field("node", &self.reference.name)
            .finish()
    }
}

impl NodeEvents {
    /// Events from `controller` (e.g. `gpu-node-agent-mig`) about `node`.
    #[must_use]
    pub fn new(client: Client, controller: &str, node: &Node) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance: Some(node.name_any()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            reference: node.object_ref(&()),
        }
    }

    /// Records an event; a failure is logged, because an event is never worth failing the work it reports.
    pub async fn publish(&self, warning: bool, reason: &str, note: &str) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(note.chars().take(1000).collect()),
            action: reason.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &self.reference).await {
            let node = self.reference.name.as_deref().unwrap_or_default();
            warn!(%node, %error, reason, "cannot record the event");
        }
    }
}

#[cfg(test)]
#[path = "kube_io_tests.rs"]
mod api_tests;

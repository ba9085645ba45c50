//! Getting pods off the GPUs before they change: waiting for the paused GPU clients to leave, and evicting the
//! workloads that use the GPUs being disturbed, through the Eviction API so that PodDisruptionBudgets hold. A
//! budget that refuses (HTTP 429) means wait and retry until the timeout; a pod is never deleted directly.
//!
//! Which pods use which GPU: the kubelet's pod-resources API ([`pod_resources`]) says which device IDs each pod
//! holds, and [`holders`](super::holders) traces them to GPUs. A pod that requests a GPU resource
//! (`nvidia.com/gpu*` or `nvidia.com/mig-*`) is evicted unless the answer shows it holding GPU devices on GPUs
//! the change leaves alone; pods the answer does not place (not admitted yet, unknown IDs) are evicted too. The
//! answer is asked again on every retry, as pods come and go. When the kubelet cannot be asked (no socket, no
//! answer), every pod on the node that requests a GPU resource counts as using every disturbed GPU, as before the
//! agent asked. A change that disturbs no GPU (it only adds instances) evicts nothing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Api, EvictParams, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use node_runtime::kube_io::KubeError;
use tokio::time::{Instant, sleep};
use tracing::{debug, info};

use super::clients::GPU_CLIENTS;
use super::holders::{Disturbed, is_gpu_resource};
use crate::pod_resources;

/// Time between looks while waiting for pods to go, and between eviction retries.
const RETRY: Duration = Duration::from_secs(1);

/// Why pods did not leave.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// A call failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// The GPU clients were still there at the timeout.
    #[error("the GPU clients' pods did not leave within {timeout:?}: {pods}")]
    ClientsStayed {
        /// The timeout.
        timeout: Duration,
        /// The pods.
        pods: String,
    },
    /// Pods that use the GPUs were still there at the timeout.
    #[error("pods using the GPUs were not evicted within {timeout:?}: {pods}{why}")]
    EvictionTimedOut {
        /// The timeout.
        timeout: Duration,
        /// The pods.
        pods: String,
        /// The last refusal, if any.
        why: String,
    },
}

/// Whether a pod requests a GPU resource: whole or shared GPUs (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, ...)
/// or MIG devices (`nvidia.com/mig-1g.10gb`, ...).
#[must_use]
pub fn uses_gpus(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    let requests = |container: &Container| {
        container.resources.as_ref().is_some_and(|resources| {
            [&resources.requests, &resources.limits]
                .into_iter()
                .flatten()
                .any(|amounts| amounts.keys().any(|name| is_gpu_resource(name)))
        })
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(requests)
}

/// Whether a pod no longer runs (finished), so it neither holds a GPU nor needs evicting.
#[must_use]
pub fn finished(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .is_some_and(|phase| matches!(phase, "Succeeded" | "Failed"))
}

/// Whether a pod must leave before the GPUs change: it runs and requests a GPU resource, and it is not among the
/// pods the kubelet's answer spares (none are when the kubelet could not be asked).
#[must_use]
pub fn must_leave(pod: &Pod, spared: &BTreeSet<String>) -> bool {
    uses_gpus(pod) && !finished(pod) && !spared.contains(&pod_name(pod))
}

/// `namespace/name`.
fn pod_name(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// The pods of one node.
#[derive(Clone)]
pub struct NodePods {
    client: Client,
    node: String,
    namespace: String,
    kubelet_root: PathBuf,
}

impl std::fmt::Debug for NodePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePods")
            .field("node", &self.node)
            .field("kubelet_root", &self.kubelet_root)
            .finish()
    }
}

impl NodePods {
    /// The pods on `node`; the GPU clients are looked for in `namespace` (the operator's), and which pod holds
    /// which GPU is asked of the kubelet whose root directory is `kubelet_root`. `client` must not retry 429
    /// answers itself ([`client_without_retries`](node_runtime::kube_io::client_without_retries)), or one refused
    /// eviction would block for minutes instead of being reported.
    #[must_use]
    pub fn new(client: Client, node: &str, namespace: &str, kubelet_root: &Path) -> Self {
        Self {
            client,
            node: node.to_owned(),
            namespace: namespace.to_owned(),
            kubelet_root: kubelet_root.to_owned(),
        }
    }

    /// Every pod on the node.
    async fn list(&self, api: &Api<Pod>) -> Result<Vec<Pod>, KubeError> {
        let params = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        Ok(api
            .list(&params)
            .await
            .map_err(KubeError::during(format!("listing pods on {}", self.node)))?
            .items)
    }

    /// Waits until no pod of the GPU clients (by their `app` label) is left on the node.
    ///
    /// # Errors
    /// `ClientsStayed` at the timeout.
    pub async fn wait_for_clients(&self, timeout: Duration) -> Result<(), DrainError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let apps: Vec<&str> = GPU_CLIENTS.iter().map(|(_, app)| *app).collect();
        let config = watcher::Config::default()
            .labels(&format!("app in ({})", apps.join(",")))
            .fields(&format!("spec.nodeName={}", self.node));
        // Watched, not polled: the change goes on the moment the last client pod is gone.
        let mut events = watcher(api, config).default_backoff().boxed();
        let (mut listed, mut left) = (BTreeSet::new(), None::<BTreeSet<String>>);
        let gone = async {
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Init) => listed.clear(),
                    Ok(watcher::Event::InitApply(pod)) => drop(listed.insert(pod_name(&pod))),
                    Ok(watcher::Event::InitDone) => left = Some(std::mem::take(&mut listed)),
                    Ok(watcher::Event::Apply(pod)) => {
                        left.get_or_insert_default().insert(pod_name(&pod));
                    }
                    Ok(watcher::Event::Delete(pod)) => {
                        left.get_or_insert_default().remove(&pod_name(&pod));
                    }
                    Err(error) => debug!(%error, "watching the GPU clients failed; retrying"),
                }
                if left.as_ref().is_some_and(BTreeSet::is_empty) {
                    return;
                }
            }
        };
        if tokio::time::timeout(timeout, gone).await.is_ok() {
            return Ok(());
        }
        Err(DrainError::ClientsStayed {
            timeout,
            pods: left
                .unwrap_or(listed)
                .into_iter()
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// Evicts every running pod on the node that uses a GPU of `disturbed` (as the module doc tells), retrying
    /// refused evictions until `timeout`, and waits until they are gone. `on_refused` hears each refusal (a
    /// PodDisruptionBudget), to report it while waiting.
    ///
    /// # Errors
    /// `EvictionTimedOut` when pods remain at the timeout; other API failures.
    pub async fn evict_gpu_pods(
        &self,
        disturbed: &Disturbed,
        timeout: Duration,
        mut on_refused: impl AsyncFnMut(&str),
    ) -> Result<(), DrainError> {
        let all: Api<Pod> = Api::all(self.client.clone());
        let deadline = Instant::now() + timeout;
        let mut refusal = String::new();
        let mut evicted = BTreeSet::new();
        let (mut fell_back, mut kept) = (false, BTreeSet::new());
        loop {
            let spared = self.spared(disturbed, &mut fell_back).await;
            if spared != kept && !spared.is_empty() {
                info!(
                    pods = ?spared,
                    gpus = ?disturbed.gpus(),
                    "pods on GPUs the change leaves alone are not evicted"
                );
            }
            kept = spared;
            let remaining: Vec<Pod> = self
                .list(&all)
                .await?
                .into_iter()
                .filter(|pod| must_leave(pod, &kept))
                .collect();
            if remaining.is_empty() {
                return Ok(());
            }
            debug!(
                pods = remaining.len(),
                "pods using the GPUs are still on the node"
            );
            if Instant::now() >= deadline {
                return Err(DrainError::EvictionTimedOut {
                    timeout,
                    pods: remaining
                        .iter()
                        .map(pod_name)
                        .collect::<Vec<_>>()
                        .join(", "),
                    why: if refusal.is_empty() {
                        String::new()
                    } else {
                        format!(" ({refusal})")
                    },
                });
            }
            for pod in remaining
                .iter()
                .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            {
                let name = pod_name(pod);
                let api: Api<Pod> =
                    Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
                match api.evict(&pod.name_any(), &EvictParams::default()).await {
                    Ok(_) => {
                        if evicted.insert(name.clone()) {
                            info!(pod = %name, "evicted");
                        }
                    }
                    Err(kube::Error::Api(status)) if status.code == 429 => {
                        refusal =
                            format!("eviction of {name} refused, waiting: {}", status.message);
                        on_refused(&refusal).await;
                    }
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => {
                        return Err(KubeError::during(format!("evicting pod {name}"))(error).into());
                    }
                }
            }
            sleep(RETRY).await;
        }
    }

    /// The GPU pods that may stay, asked of the kubelet afresh (pods come and go while evictions wait on budgets).
    /// None may stay when the kubelet cannot be asked; the first time (`fell_back` unset), the log says why.
    async fn spared(&self, disturbed: &Disturbed, fell_back: &mut bool) -> BTreeSet<String> {
        match pod_resources::list(&self.kubelet_root).await {
            Ok(answer) => disturbed.spared(&answer),
            Err(error) => {
                if !std::mem::replace(fell_back, true) {
                    info!(
                        %error,
                        "cannot tell which pods use the disturbed GPUs; evicting every pod on the node that requests a GPU"
                    );
                }
                BTreeSet::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(resources: serde_json::Value, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "resources": resources}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn gpu_pods_are_found_by_their_resources() {
        assert!(uses_gpus(&pod(
            json!({"limits": {"nvidia.com/gpu": "1"}}),
            "Running"
        )));
        assert!(uses_gpus(&pod(
            json!({"requests": {"nvidia.com/gpu.shared": "1"}}),
            "Running"
        )));
        assert!(uses_gpus(&pod(
            json!({"limits": {"nvidia.com/mig-1g.10gb": "1"}}),
            "Running"
        )));
        assert!(!uses_gpus(&pod(json!({"limits": {"cpu": "1"}}), "Running")));
        assert!(!uses_gpus(&pod(json!({}), "Running")));
        let init: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "c"}],
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            },
        }))
        .unwrap();
        assert!(uses_gpus(&init));
    }

    #[test]
    fn finished_pods_hold_nothing() {
        assert!(finished(&pod(json!({}), "Succeeded")));
        assert!(finished(&pod(json!({}), "Failed")));
        assert!(!finished(&pod(json!({}), "Running")));
        assert_eq!(pod_name(&pod(json!({}), "Running")), "default/p");
    }

    #[test]
    fn only_gpu_pods_the_kubelet_places_elsewhere_stay() {
        let gpu = pod(json!({"limits": {"nvidia.com/gpu": "1"}}), "Running");
        let spared = |pods: &[&str]| pods.iter().map(|pod| (*pod).to_owned()).collect();
        assert!(!must_leave(&gpu, &spared(&["default/p"])));
        // Not in the answer (not admitted yet, or holding a disturbed GPU), or no answer at all: it goes.
        assert!(must_leave(&gpu, &spared(&["default/other"])));
        assert!(must_leave(&gpu, &BTreeSet::new()));
        assert!(!must_leave(
            &pod(json!({"limits": {"cpu": "1"}}), "Running"),
            &BTreeSet::new()
        ));
        assert!(!must_leave(
            &pod(json!({"limits": {"nvidia.com/gpu": "1"}}), "Succeeded"),
            &BTreeSet::new()
        ));
    }
}

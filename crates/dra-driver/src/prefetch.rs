//! Claims read before the kubelet asks for them. A prepare that reads its claim from the API server waits for the
//! busiest part of the cluster; the kubelet only calls once the pod is bound here, and the driver sees that binding
//! as soon as the kubelet does (a watch on this node's pods). So the driver reads each claim generated for a pod
//! when the pod arrives, and a prepare takes the claim from here instead of the API server.
//!
//! A claim read here is only ever handed to a prepare when its allocation cannot have changed since the read:
//! - it was read with a quorum read after the pod was seen bound to this node, and the scheduler allocates and
//!   reserves a claim before it binds the pod, so the read shows the allocation the pod was bound with;
//! - the claim was generated for that pod from a template (the pod is its controller): only that pod reserves it, a
//!   claim cannot be deallocated while a pod reserves it, and a generated claim is deleted, not allocated again, once
//!   its pod is done (a new pod gets a new claim, with a new UID, which a prepare asks for by UID);
//! - the pod is still here and may still start (not deleting, not finished) when the prepare takes the claim.
//!
//! Any other claim (one named by several pods, `resourceClaimName`) is read from the API server at prepare, as is
//! a claim whose read has not finished yet. Each claim is handed out once: the checkpoint answers later prepares.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use tokio::sync::Semaphore;
use tracing::{debug, info};

use crate::claims::{ClaimReader, Claims};

/// How many claims are read at once: a driver that starts beside a hundred running pods must not burst.
const READS_AT_ONCE: usize = 4;

/// A claim read for the pod it was generated for.
#[derive(Debug, Clone)]
struct Entry {
    claim: ResourceClaim,
    /// The pod, as `ObjectRef` (namespace and name) and UID.
    pod: ObjectRef<Pod>,
    pod_uid: String,
}

/// The claims read ahead, by claim UID, and the node's pods they were read for.
#[derive(Debug)]
pub struct Prefetched {
    entries: Mutex<BTreeMap<String, Entry>>,
    pods: Store<Pod>,
}

impl Prefetched {
    /// Nothing read yet, for the pods in `pods`.
    #[must_use]
    pub fn new(pods: Store<Pod>) -> Self {
        Self {
            entries: Mutex::new(BTreeMap::new()),
            pods,
        }
    }

    /// Keeps `claim`, read after `pod` was seen bound here, when its allocation is the pod's for the claim's life.
    /// Returns whether it was kept.
    pub fn keep(&self, pod: &Pod, claim: ResourceClaim) -> bool {
        if !settled_for(&claim, pod) {
            return false;
        }
        let entry = Entry {
            pod: ObjectRef::from_obj(pod),
            pod_uid: pod.uid().unwrap_or_default(),
            claim,
        };
        let uid = entry.claim.uid().unwrap_or_default();
        self.lock().insert(uid, entry);
        true
    }

    /// The claim with `uid`, once, if it was kept and its pod may still start here.
    pub fn take(&self, uid: &str) -> Option<ResourceClaim> {
        let entry = self.lock().remove(uid)?;
        let pod = self.pods.get(&entry.pod)?;
        (pod.uid().as_deref() == Some(entry.pod_uid.as_str()) && may_start(&pod))
            .then_some(entry.claim)
    }

    /// Forgets the claims of pods that are gone or can no longer start.
    fn prune(&self) {
        self.lock().retain(|_, entry| {
            self.pods.get(&entry.pod).is_some_and(|pod| {
                pod.uid().as_deref() == Some(entry.pod_uid.as_str()) && may_start(&pod)
            })
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether `pod` may still start containers: not being deleted, not finished.
fn may_start(pod: &Pod) -> bool {
    let phase = pod
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The names of the claims generated for `pod` from templates (its status lists them), while it may still start.
#[must_use]
pub fn generated_claims(pod: &Pod) -> Vec<String> {
    if !may_start(pod) {
        return Vec::new();
    }
    pod.status
        .iter()
        .flat_map(|status| status.resource_claim_statuses.iter().flatten())
        .filter_map(|claim| claim.resource_claim_name.clone())
        .collect()
}

/// Whether `claim`, read after `pod` was bound, holds the allocation the pod runs with for the claim's whole life:
/// `pod` is its controller, it is allocated, and it is reserved for `pod`.
#[must_use]
pub fn settled_for(claim: &ResourceClaim, pod: &Pod) -> bool {
    let Some(pod_uid) = pod.metadata.uid.as_deref() else {
        return false;
    };
    let controlled = claim
        .owner_references()
        .iter()
        .any(|owner| owner.controller == Some(true) && owner.kind == "Pod" && owner.uid == pod_uid);
    let Some(status) = &claim.status else {
        return false;
    };
    let reserved = status
        .reserved_for
        .iter()
        .flatten()
        .any(|consumer| consumer.resource == "pods" && consumer.uid == pod_uid);
    controlled && status.allocation.is_some() && reserved
}

/// Reads the generated claims of each pod the watch yields (a pod bound to this node, or changed) that the driver
/// has not prepared, at most [`READS_AT_ONCE`] at a time, until the watch ends.
pub async fn run(
    prefetched: Arc<Prefetched>,
    pods: impl Stream<Item = Pod>,
    client: Client,
    claims: Arc<Claims>,
) {
    let reads = Arc::new(Semaphore::new(READS_AT_ONCE));
    // (pod UID, claim name) read or being read: a pod's status changes often, its claims are read once.
    let mut asked: BTreeSet<(String, String)> = BTreeSet::new();
    let mut pods = std::pin::pin!(pods);
    while let Some(pod) = pods.next().await {
        prefetched.prune();
        let (Some(namespace), Some(pod_uid)) = (pod.namespace(), pod.uid()) else {
            continue;
        };
        for name in generated_claims(&pod) {
            if !asked.insert((pod_uid.clone(), name.clone()))
                || claims.holds(&namespace, &name).await
            {
                continue;
            }
            let (prefetched, reads, api, pod) = (
                prefetched.clone(),
                reads.clone(),
                Api::<ResourceClaim>::namespaced(client.clone(), &namespace),
                pod.clone(),
            );
            tokio::spawn(async move {
                let Ok(_turn) = reads.acquire().await else {
                    return;
                };
                match api.get(&name).await {
                    Ok(claim) => {
                        let kept = prefetched.keep(&pod, claim);
                        info!(claim = %name, kept, "read ahead");
                    }
                    Err(error) => {
                        debug!(claim = %name, %error, "cannot read ahead; read at prepare")
                    }
                }
            });
        }
        let live: BTreeSet<String> = prefetched
            .pods
            .state()
            .iter()
            .filter_map(|pod| pod.uid())
            .collect();
        asked.retain(|(pod_uid, _)| live.contains(pod_uid));
    }
}

/// The API server behind the claims read ahead: a prepare takes its claim from [`Prefetched`] when it is there.
#[derive(Clone)]
pub struct PrefetchingReader {
    /// Reads a claim that was not read ahead.
    pub client: Client,
    /// The claims read ahead.
    pub prefetched: Arc<Prefetched>,
}

impl std::fmt::Debug for PrefetchingReader {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PrefetchingReader")
            .field("prefetched", &self.prefetched)
            .finish_non_exhaustive()
    }
}

impl ClaimReader for PrefetchingReader {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        self.client.get(namespace, name).await
    }

    fn read_ahead(&self, uid: &str) -> Option<ResourceClaim> {
        self.prefetched.take(uid)
    }
}

#[cfg(test)]
#[path = "prefetch_tests.rs"]
mod tests;

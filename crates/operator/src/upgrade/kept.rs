//! What the upgrade controller's pod cache keeps of its own pods: what its passes read, so that the cache holds a
//! few fields per pod rather than whole objects. (Its Nodes come from the watch it shares with the reconciler.)

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};

use crate::controller::forget_bookkeeping;

/// What the upgrade reads of its own pods (drivers and validators): metadata, the node and the Ready condition.
/// Containers, volumes and statuses are dropped before the pod is cached: they are most of a pod's size, and a
/// validator runs on every GPU node (at 1000 nodes the cached pods' specs were tens of MiB).
pub(super) fn keep_what_upgrades_read_of_pods(pod: &mut Pod) {
    forget_bookkeeping(pod);
    pod.metadata.annotations = None;
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|status| PodStatus {
        conditions: status.conditions.map(|conditions| {
            conditions
                .into_iter()
                .filter(|c| c.type_ == "Ready")
                .collect()
        }),
        ..PodStatus::default()
    });
}

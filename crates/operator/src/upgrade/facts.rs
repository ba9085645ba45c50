//! What the cluster's objects say of each GPU node, in the terms of [`super::decide`] (pure): the node's label,
//! annotations and cordon, its driver DaemonSet's current revision and pod there, the validator, and which pods on
//! it use the GPUs.
//!
//! A pod uses the GPUs when it requests a GPU resource (whole, shared or MIG), holds a DRA claim our driver
//! allocated, or when the node's agents saw its processes on a GPU (GPUNode `status.gpuProcessPods`, from the
//! driver's process list traced through cgroups): the last finds DaemonSet pods and pods that asked for no GPU at
//! all (runtimeClass-only), which a request-based drain leaves running under the driver.

use std::collections::{BTreeMap, BTreeSet};

use crd::driver_upgrade::{
    DRAIN_SKIP_LABEL, FAILED_REVISION_ANNOTATION, GpuProcessPod, INITIAL_UNSCHEDULABLE_ANNOTATION,
    REASON_ANNOTATION, REQUESTED_ANNOTATION, SKIP_LABEL, STATE_LABEL, STATE_SINCE_ANNOTATION,
};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::decide::{Driver, DriverPod, NodeFacts, PodFacts, PodKey, Validator, ValidatorPod};
use crate::model::placement::places_on;
use crate::render::{MANAGED_BY_LABEL, MANAGER};

/// The label every DaemonSet pod carries with its revision.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// A DaemonSet the upgrade reads (a driver's or the validator's), with its current revision.
#[derive(Debug, Clone)]
pub struct OwnedDaemonSet<'a> {
    /// The DaemonSet.
    pub daemonset: &'a DaemonSet,
    /// Its current revision's `controller-revision-hash`, from its newest ControllerRevision.
    pub revision: Option<String>,
}

/// The current revision of `daemonset`: the hash label of the newest ControllerRevision it owns, as the DaemonSet
/// controller labels the pods of its current template.
#[must_use]
pub fn current_revision(
    daemonset: &DaemonSet,
    revisions: &[&ControllerRevision],
) -> Option<String> {
    let uid = daemonset.uid()?;
    revisions
        .iter()
        .filter(|revision| {
            revision
                .owner_references()
                .iter()
                .any(|owner| owner.uid == uid && owner.controller == Some(true))
        })
        .max_by_key(|revision| revision.revision)
        .and_then(|revision| revision.labels().get(REVISION_LABEL).cloned())
}

/// Whether `daemonset` places a pod on `node`: its pod template's nodeSelector and required node affinity match
/// the node.
#[must_use]
pub fn selects(daemonset: &DaemonSet, node: &Node) -> bool {
    daemonset
        .spec
        .template
        .spec
        .as_ref()
        .is_none_or(|pod| places_on(pod, &node.name_any(), node.labels()))
}

/// Whether `pod` belongs to the DaemonSet with `uid`.
fn owned_by(pod: &Pod, uid: &str) -> bool {
    pod.owner_references().iter().any(|owner| owner.uid == uid)
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

fn created(pod: &Pod) -> Option<Timestamp> {
    pod.metadata.creation_timestamp.as_ref().map(|time| time.0)
}

/// The newest of the pods of `daemonset` on `node`: during a replacement the old one may still be terminating.
fn pod_on<'a>(daemonset: &DaemonSet, node: &str, pods: &[&'a Pod]) -> Option<&'a Pod> {
    let uid = daemonset.uid()?;
    pods.iter()
        .copied()
        .filter(|pod| node_name(pod) == Some(node) && owned_by(pod, &uid))
        .max_by_key(|pod| (pod.metadata.deletion_timestamp.is_none(), created(pod)))
}

/// The node's facts, pods aside ([`pod_facts`] adds them for the nodes that handle pods).
#[must_use]
pub fn node_facts(
    node: &Node,
    drivers: &[OwnedDaemonSet<'_>],
    validators: &[&DaemonSet],
    pods: &[&Pod],
) -> NodeFacts {
    let name = node.name_any();
    let labels = node.labels();
    let annotations = node.annotations();
    let flag = |key: &str| annotations.get(key).is_some_and(|v| v == "true");
    let driver = drivers
        .iter()
        .find(|driver| selects(driver.daemonset, node))
        .and_then(|driver| {
            let revision = driver.revision.clone()?;
            let pod = pod_on(driver.daemonset, &name, pods).map(|pod| DriverPod {
                name: pod.name_any(),
                revision: pod.labels().get(REVISION_LABEL).cloned(),
                ready: pod_ready(pod),
                terminating: pod.metadata.deletion_timestamp.is_some(),
                created: created(pod),
            });
            Some(Driver { revision, pod })
        });
    let validator = match validators.iter().find(|ds| selects(ds, node)) {
        None => Validator::NotDeployed,
        Some(daemonset) => match pod_on(daemonset, &name, pods) {
            None => Validator::Missing,
            Some(pod) => Validator::Pod(ValidatorPod {
                name: pod.name_any(),
                ready: pod_ready(pod),
                terminating: pod.metadata.deletion_timestamp.is_some(),
                created: created(pod),
            }),
        },
    };
    NodeFacts {
        name,
        label: labels.get(STATE_LABEL).cloned(),
        skip: labels.get(SKIP_LABEL).is_some_and(|v| v == "true"),
        unschedulable: node
            .spec
            .as_ref()
            .and_then(|spec| spec.unschedulable)
            .unwrap_or(false),
        ready: node
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            }),
        initially_unschedulable: flag(INITIAL_UNSCHEDULABLE_ANNOTATION),
        upgrade_requested: flag(REQUESTED_ANNOTATION),
        since: annotations
            .get(STATE_SINCE_ANNOTATION)
            .and_then(|since| since.parse().ok()),
        failed_revision: annotations.get(FAILED_REVISION_ANNOTATION).cloned(),
        reason: annotations.get(REASON_ANNOTATION).cloned(),
        driver,
        validator,
        pods: Vec::new(),
    }
}

/// What is known of the pods on one node besides the pods themselves.
#[derive(Debug, Clone, Copy)]
pub struct PodContext<'a> {
    /// The operator's namespace: its own operands there are never evicted by the upgrade.
    pub namespace: &'a str,
    /// Pods whose processes use the node's GPUs (GPUNode status).
    pub process_pods: &'a [GpuProcessPod],
    /// Pods (by UID) holding a DRA claim that our DRA driver allocated.
    pub dra_holders: &'a BTreeSet<String>,
    /// Pods (by UID) matching `waitForCompletion.podSelector`.
    pub awaited: &'a BTreeSet<String>,
    /// Pods (by UID) matching `drain.podSelector`; `None` when the drain has no selector (every pod).
    pub drain_selected: Option<&'a BTreeSet<String>>,
    /// The last refusal of each pod's eviction.
    pub refusals: &'a BTreeMap<PodKey, String>,
}

/// Whether a resource name is one of the GPU resources: whole or shared GPUs (`nvidia.com/gpu`,
/// `nvidia.com/gpu.shared`, ...) or MIG devices (`nvidia.com/mig-1g.10gb`, ...).
fn is_gpu_resource(name: &str) -> bool {
    name.starts_with("nvidia.com/gpu") || name.starts_with("nvidia.com/mig-")
}

/// The GPU resource a pod requests, if any.
fn requested_gpu_resource(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let requested = |container: &Container| {
        let resources = container.resources.as_ref()?;
        [&resources.requests, &resources.limits]
            .into_iter()
            .flatten()
            .flat_map(|amounts| amounts.keys())
            .find(|name| is_gpu_resource(name))
            .cloned()
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find_map(requested)
}

/// Why `pod` uses the GPUs, if it does.
fn gpu_use(pod: &Pod, context: &PodContext<'_>) -> Option<String> {
    let uid = pod.uid().unwrap_or_default();
    if let Some(process) = context.process_pods.iter().find(|p| p.uid == uid) {
        let gpus: Vec<String> = process.gpus.iter().map(u32::to_string).collect();
        return Some(format!("its processes use GPU {}", gpus.join(", ")));
    }
    if context.dra_holders.contains(&uid) {
        return Some("holds a GPU through a DRA claim".into());
    }
    requested_gpu_resource(pod).map(|resource| format!("requests {resource}"))
}

/// One pod on a node, as [`super::decide`] sees it.
#[must_use]
pub fn pod_facts(pod: &Pod, context: &PodContext<'_>) -> PodFacts {
    let key = PodKey {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
    };
    let uid = pod.uid().unwrap_or_default();
    let owners = pod.owner_references();
    let ours = key.namespace == context.namespace
        && pod.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGER);
    let phase = pod
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref());
    PodFacts {
        gpu_use: gpu_use(pod, context),
        daemon_set: owners.iter().any(|o| o.kind == "DaemonSet"),
        controlled: owners.iter().any(|o| o.controller == Some(true)),
        empty_dir: pod
            .spec
            .as_ref()
            .and_then(|spec| spec.volumes.as_ref())
            .is_some_and(|volumes| volumes.iter().any(|v| v.empty_dir.is_some())),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        mirror: pod
            .annotations()
            .contains_key("kubernetes.io/config.mirror"),
        protected: ours
            || pod
                .labels()
                .get(DRAIN_SKIP_LABEL)
                .is_some_and(|v| v == "true"),
        awaited: context.awaited.contains(&uid),
        drain_selected: context.drain_selected.is_none_or(|set| set.contains(&uid)),
        created: created(pod),
        refusal: context.refusals.get(&key).cloned(),
        key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn daemonset(uid: &str, selector: serde_json::Value) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": format!("ds-{uid}"), "namespace": "gpu-operator", "uid": uid},
            "spec": {"selector": {}, "template": {"spec": {"containers": [], "nodeSelector": selector}}}
        }))
        .unwrap()
    }

    fn revision(owner: &str, number: i64, hash: &str) -> ControllerRevision {
        serde_json::from_value(json!({
            "metadata": {"name": format!("r-{hash}"), "labels": {REVISION_LABEL: hash},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": owner, "controller": true}]},
            "revision": number
        }))
        .unwrap()
    }

    #[test]
    fn the_current_revision_is_the_newest_the_daemonset_owns() {
        let ds = daemonset("u1", json!({}));
        let revisions = [
            revision("u1", 1, "aaa"),
            revision("u1", 3, "ccc"),
            revision("u2", 9, "zzz"),
            revision("u1", 2, "bbb"),
        ];
        let refs: Vec<&ControllerRevision> = revisions.iter().collect();
        assert_eq!(current_revision(&ds, &refs).as_deref(), Some("ccc"));
        assert_eq!(current_revision(&daemonset("u3", json!({})), &refs), None);
    }

    #[test]
    fn node_facts_read_labels_annotations_cordon_driver_and_validator() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1",
                "labels": {"os": "ubuntu", STATE_LABEL: "pod-restart-required", SKIP_LABEL: "false"},
                "annotations": {INITIAL_UNSCHEDULABLE_ANNOTATION: "true", STATE_SINCE_ANNOTATION: "2027-01-15T08:00:00Z",
                                FAILED_REVISION_ANNOTATION: "abc", REASON_ANNOTATION: "drain failed"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let ubuntu = daemonset("d1", json!({"os": "ubuntu"}));
        let rhel = daemonset("d2", json!({"os": "rhel"}));
        let validator = daemonset("v1", json!({}));
        let pods = [
            pod(
                json!({"metadata": {"name": "old", "uid": "p0", "creationTimestamp": "2027-01-15T07:00:00Z",
                        "deletionTimestamp": "2027-01-15T08:00:01Z",
                        "labels": {REVISION_LABEL: "r1"}, "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d1"}]},
                        "spec": {"nodeName": "n1", "containers": []}}),
            ),
            pod(
                json!({"metadata": {"name": "new", "uid": "p1", "creationTimestamp": "2027-01-15T08:00:02Z",
                        "labels": {REVISION_LABEL: "r2"}, "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d1"}]},
                        "spec": {"nodeName": "n1", "containers": []},
                        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
            pod(
                json!({"metadata": {"name": "elsewhere", "uid": "p2", "labels": {REVISION_LABEL: "r1"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d1"}]},
                        "spec": {"nodeName": "n2", "containers": []}}),
            ),
        ];
        let pod_refs: Vec<&Pod> = pods.iter().collect();
        let drivers = [
            OwnedDaemonSet {
                daemonset: &rhel,
                revision: Some("x".into()),
            },
            OwnedDaemonSet {
                daemonset: &ubuntu,
                revision: Some("r2".into()),
            },
        ];
        let facts = node_facts(&node, &drivers, &[&validator], &pod_refs);
        assert_eq!(facts.label.as_deref(), Some("pod-restart-required"));
        assert!(!facts.skip, "only `true` skips");
        assert!(facts.unschedulable && facts.ready && facts.initially_unschedulable);
        assert_eq!(facts.since, Some("2027-01-15T08:00:00Z".parse().unwrap()));
        assert_eq!(facts.failed_revision.as_deref(), Some("abc"));
        assert_eq!(facts.reason.as_deref(), Some("drain failed"));
        let driver = facts.driver.unwrap();
        assert_eq!(driver.revision, "r2", "the pool's DaemonSet");
        let pod = driver.pod.unwrap();
        assert_eq!(pod.name, "new", "the running pod, not the terminating one");
        assert!(pod.ready && !pod.terminating);
        assert_eq!(facts.validator, Validator::Missing);
    }

    #[test]
    fn gpu_users_are_found_by_request_claim_and_process() {
        let processes = [GpuProcessPod {
            namespace: "monitoring".into(),
            name: "gpu-probe-x".into(),
            uid: "u-probe".into(),
            gpus: vec![0, 2],
        }];
        let holders = BTreeSet::from(["u-dra".to_owned()]);
        let awaited = BTreeSet::from(["u-train".to_owned()]);
        let refusals = BTreeMap::new();
        let context = PodContext {
            namespace: "gpu-operator",
            process_pods: &processes,
            dra_holders: &holders,
            awaited: &awaited,
            drain_selected: None,
            refusals: &refusals,
        };
        let train = pod(
            json!({"metadata": {"name": "train", "namespace": "ml", "uid": "u-train",
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j", "controller": true}]},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}],
                     "volumes": [{"name": "scratch", "emptyDir": {}}]}}),
        );
        let facts = pod_facts(&train, &context);
        assert_eq!(
            facts.gpu_use.as_deref(),
            Some("requests nvidia.com/gpu.shared")
        );
        assert!(facts.controlled && facts.empty_dir && facts.awaited && facts.drain_selected);
        assert!(!facts.daemon_set && !facts.protected);

        let probe = pod(
            json!({"metadata": {"name": "gpu-probe-x", "namespace": "monitoring", "uid": "u-probe",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "p", "uid": "p", "controller": true}]},
            "spec": {"containers": [{"name": "c"}]}}),
        );
        let facts = pod_facts(&probe, &context);
        assert_eq!(facts.gpu_use.as_deref(), Some("its processes use GPU 0, 2"));
        assert!(facts.daemon_set);

        let claim = pod(
            json!({"metadata": {"name": "fraction", "namespace": "ml", "uid": "u-dra"},
            "spec": {"containers": [{"name": "c"}]}}),
        );
        assert_eq!(
            pod_facts(&claim, &context).gpu_use.as_deref(),
            Some("holds a GPU through a DRA claim")
        );

        let web = pod(
            json!({"metadata": {"name": "web", "namespace": "ml", "uid": "u-web"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Running"}}),
        );
        let facts = pod_facts(&web, &context);
        assert_eq!(facts.gpu_use, None);
        assert!(!facts.controlled, "no controller");

        let operand = pod(
            json!({"metadata": {"name": "nvidia-dcgm-exporter-x", "namespace": "gpu-operator", "uid": "u-op",
            "labels": {MANAGED_BY_LABEL: MANAGER}}, "spec": {"containers": [{"name": "c"}]}}),
        );
        assert!(pod_facts(&operand, &context).protected);
        let skipped = pod(
            json!({"metadata": {"name": "keep", "namespace": "ml", "uid": "u-keep",
            "labels": {DRAIN_SKIP_LABEL: "true"}}, "spec": {"containers": [{"name": "c"}]}}),
        );
        assert!(pod_facts(&skipped, &context).protected);
        let selected = BTreeSet::new();
        let narrowed = PodContext {
            drain_selected: Some(&selected),
            ..context
        };
        assert!(!pod_facts(&web, &narrowed).drain_selected);
    }
}

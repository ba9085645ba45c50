//! The upgrade controller's passes against the fake API server (stateful): the caches are filled from what the
//! server holds before each pass, as the watches would, and the cluster's own reactions (the DaemonSet controller
//! making the new driver and validator pods) are played by the test.

use std::sync::Arc;

use api_test_kit::{FakeApi, Request};
use crd::driver_upgrade::{STATE_LABEL, UpgradeState};
use crd::{ClusterPolicy, GPUNode};
use http::Method;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;
use crate::shared_watch::keep_what_controllers_read_of_nodes;

const NAMESPACE: &str = "gpu-operator";
const NODE: &str = "gpu-0";

/// The writers of the caches a pass reads.
struct Caches {
    policies: Writer<ClusterPolicy>,
    nodes: Writer<Node>,
    daemonsets: Writer<DaemonSet>,
    pods: Writer<Pod>,
    revisions: Writer<ControllerRevision>,
    gpu_nodes: Writer<GPUNode>,
}

/// Replaces a cache's content with the objects under `collection` on the fake server, as `keep` leaves them (what
/// the controller's watch keeps of each, so that a pass sees no field its cache would not hold).
fn fill<K>(writer: &mut Writer<K>, api: &FakeApi, collection: &str, keep: fn(&mut K))
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in api.objects(collection) {
        let mut object: K =
            serde_json::from_value(object).expect("a stored object reads as its type");
        keep(&mut object);
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

/// A context of a fresh operator over `client`, and its caches' writers.
fn context(client: Client) -> (Arc<Context>, Caches) {
    let (policies, policy_writer) = reflector::store();
    let (nodes, node_writer) = reflector::store();
    let (daemonsets, daemonset_writer) = reflector::store();
    let (pods, pod_writer) = reflector::store();
    let (revisions, revision_writer) = reflector::store();
    let (gpu_nodes, gpu_node_writer) = reflector::store();
    let (_synced, caches_synced) = watch::channel(true);
    let (_leading, leading) = watch::channel(true);
    let context = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "gpu-operator".into()),
        client,
        namespace: NAMESPACE.into(),
        timeouts: StepTimeouts::default(),
        policies,
        nodes,
        daemonsets,
        pods,
        revisions,
        gpu_nodes,
        nvidia_drivers: reflector::store().0,
        metrics: Metrics::shared(),
        gate: Gate::new(caches_synced, leading),
        failures: Mutex::default(),
        refusals: Mutex::default(),
        waiting: Mutex::default(),
        spacing: Spacing::new(PASS_SPACING),
    });
    let caches = Caches {
        policies: policy_writer,
        nodes: node_writer,
        daemonsets: daemonset_writer,
        pods: pod_writer,
        revisions: revision_writer,
        gpu_nodes: gpu_node_writer,
    };
    (context, caches)
}

fn refresh(caches: &mut Caches, api: &FakeApi) {
    fill(
        &mut caches.policies,
        api,
        "/apis/nvidia.com/v1/clusterpolicies",
        forget_bookkeeping,
    );
    fill(
        &mut caches.nodes,
        api,
        "/api/v1/nodes",
        keep_what_controllers_read_of_nodes,
    );
    fill(
        &mut caches.daemonsets,
        api,
        &format!("/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets"),
        forget_bookkeeping,
    );
    fill(
        &mut caches.pods,
        api,
        &format!("/api/v1/namespaces/{NAMESPACE}/pods"),
        keep_what_upgrades_read_of_pods,
    );
    fill(
        &mut caches.revisions,
        api,
        &format!("/apis/apps/v1/namespaces/{NAMESPACE}/controllerrevisions"),
        forget_bookkeeping,
    );
    fill(
        &mut caches.gpu_nodes,
        api,
        "/apis/nvidia.com/v1alpha1/gpunodes",
        forget_bookkeeping,
    );
}

fn object<K: DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

/// A time `seconds` from now, whole seconds as the API server writes them.
fn time(seconds: i64) -> String {
    Timestamp::from_second(Timestamp::now().as_second() + seconds)
        .unwrap()
        .to_string()
}

fn owned_by(kind: &str, uid: &str) -> Value {
    json!([{"apiVersion": "apps/v1", "kind": kind, "name": uid, "uid": uid, "controller": true}])
}

/// A DaemonSet of the operator's (`component`) placing pods on every node, with revision `hash` current.
fn daemonset(api: &FakeApi, name: &str, component: &str, hash: &str) {
    api.insert::<DaemonSet>(&object(json!({
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": name,
                     "labels": {MANAGED_BY_LABEL: MANAGER, COMPONENT_LABEL: component}},
        "spec": {"selector": {}, "template": {"spec": {"containers": []}}}
    })));
    api.insert::<ControllerRevision>(&object(json!({
        "metadata": {"name": format!("{name}-{hash}"), "namespace": NAMESPACE,
                     "labels": {facts::REVISION_LABEL: hash, MANAGED_BY_LABEL: MANAGER, COMPONENT_LABEL: component},
                     "ownerReferences": owned_by("DaemonSet", name)},
        "revision": 1
    })));
}

/// A pod of DaemonSet `owner` on the node, at `hash`, Ready, created at `created`.
fn operand_pod(api: &FakeApi, name: &str, owner: &str, component: &str, hash: &str, created: i64) {
    api.insert::<Pod>(&object(json!({
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": name, "creationTimestamp": time(created),
                     "labels": {facts::REVISION_LABEL: hash, MANAGED_BY_LABEL: MANAGER, COMPONENT_LABEL: component},
                     "ownerReferences": owned_by("DaemonSet", owner)},
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    })));
}

fn workload(api: &FakeApi, name: &str, owner: (&str, &str), resources: Value) {
    api.insert::<Pod>(&object(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": name, "creationTimestamp": time(-1000),
                     "ownerReferences": owned_by(owner.0, owner.1)},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": "Running"}
    })));
}

/// One GPU node whose driver pod runs revision `old` while its DaemonSet is at `new`, with a validator, a pod
/// requesting a GPU, a DaemonSet pod whose process uses a GPU (in GPUNode status) and a pod without GPUs.
fn cluster(policy: Value) -> (FakeApi, Client) {
    let (api, client) = FakeApi::start();
    let mut cluster_policy: ClusterPolicy = object(json!({
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy", "uid": "policy", "generation": 1,
                     "creationTimestamp": time(-5000)},
        "spec": {"driver": {"upgradePolicy": policy}}
    }));
    cluster_policy.status = None;
    api.insert(&cluster_policy);
    api.insert::<Node>(&object(json!({
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    })));
    api.insert::<GPUNode>(&object(json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNode", "metadata": {"name": NODE}, "spec": {},
        "status": {"gpuCount": 4, "gpuProcessPods": [{"namespace": "ml", "name": "probe", "uid": "probe", "gpus": [1]}]}
    })));
    daemonset(&api, "nvidia-driver-daemonset-ubuntu22.04", "driver", "new");
    operand_pod(
        &api,
        "driver-old",
        "nvidia-driver-daemonset-ubuntu22.04",
        "driver",
        "old",
        -3000,
    );
    daemonset(
        &api,
        "nvidia-operator-validator",
        "operator-validator",
        "v1",
    );
    operand_pod(
        &api,
        "validator-old",
        "nvidia-operator-validator",
        "operator-validator",
        "v1",
        -2000,
    );
    workload(
        &api,
        "train",
        ("ReplicaSet", "rs"),
        json!({"limits": {"nvidia.com/gpu": "1"}}),
    );
    workload(&api, "probe", ("DaemonSet", "probe-ds"), json!({}));
    workload(
        &api,
        "web",
        ("ReplicaSet", "web-rs"),
        json!({"requests": {"cpu": "1"}}),
    );
    (api, client)
}

fn node_state(api: &FakeApi) -> Option<String> {
    let node: Node = api.get(None, NODE).expect("the node");
    node.metadata.labels?.get(STATE_LABEL).cloned()
}

fn writes(requests: &[Request]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.is_write() && !r.path.contains("/events"))
        .map(|r| match r.path.as_str() {
            path if path.ends_with(&format!("nodes/{NODE}")) => {
                if r.body["spec"]["unschedulable"] == json!(true) {
                    "cordon".to_owned()
                } else if r.body["spec"]["unschedulable"] == json!(false) {
                    "uncordon".to_owned()
                } else {
                    format!(
                        "state {}",
                        r.body["metadata"]["labels"][STATE_LABEL]
                            .as_str()
                            .unwrap_or("(annotations)")
                    )
                }
            }
            path => format!("{} {path}", r.method),
        })
        .collect()
}

/// The cluster's reactions to what a pass did: the DaemonSet controller makes the deleted driver pod again at
/// the current revision and the deleted validator pod again, both Ready (kwok's way).
fn react(api: &FakeApi, pass: i64) {
    let pods = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    if api.object(&format!("{pods}/driver-old")).is_none()
        && api.object(&format!("{pods}/driver-new")).is_none()
    {
        operand_pod(
            api,
            "driver-new",
            "nvidia-driver-daemonset-ubuntu22.04",
            "driver",
            "new",
            pass * 10,
        );
    }
    if api.object(&format!("{pods}/validator-old")).is_none()
        && api.object(&format!("{pods}/validator-new")).is_none()
    {
        operand_pod(
            api,
            "validator-new",
            "nvidia-operator-validator",
            "operator-validator",
            "v1",
            pass * 10 + 5,
        );
    }
}

/// Runs passes until the node is upgrade-done (at most 30); `restart` runs each pass in a fresh operator.
async fn walk(restart: bool) -> (FakeApi, Vec<String>, Vec<String>) {
    let (api, client) =
        cluster(json!({"autoUpgrade": true, "podDeletion": {"timeoutSeconds": 60}}));
    let (mut context, mut caches) = context(client.clone());
    let mut states = Vec::new();
    let mut all_writes = Vec::new();
    for pass in 0..30 {
        if restart {
            (context, caches) = super::tests::context(client.clone());
        }
        refresh(&mut caches, &api);
        let policy = context.policies.state()[0].clone();
        upgrade(&policy, &context).await.expect("a pass");
        all_writes.extend(writes(&api.take_requests()));
        react(&api, pass);
        let state = node_state(&api).unwrap_or_default();
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        if state == "upgrade-done" {
            break;
        }
    }
    (api, states, all_writes)
}

#[tokio::test]
async fn a_node_walks_every_state_with_each_write_once_and_a_restarted_operator_does_the_same() {
    let (api, states, writes) = walk(false).await;
    assert_eq!(
        states,
        [
            "upgrade-required",
            "cordon-required",
            "wait-for-jobs-required",
            "pod-deletion-required",
            "pod-deletion-required",
            "pod-restart-required",
            "validation-required",
            "uncordon-required",
            "upgrade-done"
        ]
        .into_iter()
        .fold(Vec::<String>::new(), |mut merged, s| {
            if merged.last().map(String::as_str) != Some(s) {
                merged.push(s.to_owned());
            }
            merged
        })
    );
    let count = |write: &str| writes.iter().filter(|w| *w == write).count();
    assert_eq!(count("cordon"), 1, "{writes:#?}");
    assert_eq!(count("uncordon"), 1, "{writes:#?}");
    assert_eq!(
        count("POST /api/v1/namespaces/ml/pods/train/eviction"),
        1,
        "{writes:#?}"
    );
    assert_eq!(
        count("POST /api/v1/namespaces/ml/pods/probe/eviction"),
        1,
        "the DaemonSet pod whose process uses a GPU: {writes:#?}"
    );
    assert!(
        !writes.iter().any(|w| w.contains("pods/web")),
        "a pod without GPUs stays: {writes:#?}"
    );
    assert_eq!(
        count(&format!(
            "DELETE /api/v1/namespaces/{NAMESPACE}/pods/driver-old"
        )),
        1,
        "{writes:#?}"
    );
    assert_eq!(
        count(&format!(
            "DELETE /api/v1/namespaces/{NAMESPACE}/pods/validator-old"
        )),
        1,
        "{writes:#?}"
    );
    for state in UpgradeState::ALL
        .iter()
        .filter(|s| **s != UpgradeState::DrainRequired && **s != UpgradeState::UpgradeFailed)
    {
        assert_eq!(count(&format!("state {state}")), 1, "{state}: {writes:#?}");
    }
    assert!(api.object("/api/v1/namespaces/ml/pods/web").is_some());
    let node: Node = api.get(None, NODE).unwrap();
    assert_ne!(node.spec.and_then(|s| s.unschedulable), Some(true));
    let gpu_node: GPUNode = api.get(None, NODE).unwrap();
    let upgrade = gpu_node.status.unwrap().driver_upgrade.unwrap();
    assert_eq!(upgrade.state, Some(UpgradeState::UpgradeDone));
    let policy: ClusterPolicy = api.get(None, "cluster-policy").unwrap();
    let status = policy.status.unwrap().driver_upgrade.unwrap();
    assert_eq!((status.done, status.in_progress, status.failed), (1, 0, 0));

    let (_, restarted_states, restarted_writes) = walk(true).await;
    assert_eq!(
        restarted_states, states,
        "a restarted operator resumes from the labels"
    );
    let actions = |writes: &[String]| -> Vec<String> {
        writes
            .iter()
            .filter(|w| !w.starts_with("PATCH /apis/nvidia.com"))
            .cloned()
            .collect()
    };
    assert_eq!(
        actions(&restarted_writes),
        actions(&writes),
        "nothing is done twice across restarts"
    );
}

#[tokio::test]
async fn nothing_is_written_at_rest() {
    let (api, client) = cluster(json!({"autoUpgrade": true}));
    let pods = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    api.remove(&format!("{pods}/driver-old"));
    operand_pod(
        &api,
        "driver-new",
        "nvidia-driver-daemonset-ubuntu22.04",
        "driver",
        "new",
        0,
    );
    let (context, mut caches) = context(client);
    refresh(&mut caches, &api);
    let policy = context.policies.state()[0].clone();
    upgrade(&policy, &context).await.unwrap();
    assert_eq!(node_state(&api).as_deref(), Some("upgrade-done"));
    api.take_requests();
    for _ in 0..2 {
        refresh(&mut caches, &api);
        let policy = context.policies.state()[0].clone();
        let requeue = upgrade(&policy, &context).await.unwrap();
        assert_eq!(requeue, Requeue::await_change(), "no timer at rest");
    }
    let requests = api.take_requests();
    assert!(
        requests.iter().all(|r| !r.is_write()),
        "{:#?}",
        writes(&requests)
    );
    assert!(
        requests.is_empty(),
        "no pod lists for nodes that handle no pods: {requests:#?}"
    );
}

#[tokio::test]
async fn a_labelled_node_whose_driver_daemonset_is_gone_is_released_and_then_read_no_more() {
    let (api, client) = cluster(json!({"autoUpgrade": true}));
    let (context, mut caches) = context(client);
    let pass = async |caches: &mut Caches| {
        refresh(caches, &api);
        let policy = context.policies.state()[0].clone();
        upgrade(&policy, &context).await.unwrap();
        writes(&api.take_requests())
    };
    pass(&mut caches).await;
    assert!(node_state(&api).is_some(), "the pass labels the node");
    // The driver turned off: its DaemonSet is pruned, the node keeps the label the upgrade wrote.
    api.remove(&format!(
        "/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/nvidia-driver-daemonset-ubuntu22.04"
    ));
    pass(&mut caches).await;
    assert_eq!(
        node_state(&api),
        None,
        "the ClusterPolicy's group releases it"
    );
    // The next pass reports that no node is in an upgrade any more; after that, nothing is left to write.
    pass(&mut caches).await;
    let at_rest = pass(&mut caches).await;
    assert!(
        at_rest.is_empty(),
        "{at_rest:?}: a node neither driven nor labelled is none of the pass's business"
    );
}

#[tokio::test]
async fn a_refused_eviction_is_retried_with_the_refusal_in_the_status_until_it_passes() {
    let (api, client) = cluster(json!({"autoUpgrade": true}));
    let mut node: Node = api.get(None, NODE).unwrap();
    node.metadata.labels.get_or_insert_default().insert(
        STATE_LABEL.into(),
        UpgradeState::PodDeletionRequired.as_str().into(),
    );
    node.spec.get_or_insert_default().unschedulable = Some(true);
    api.insert(&node);
    api.fail_next(Method::POST, "pods/train/eviction", 429);
    let (context, mut caches) = context(client);
    refresh(&mut caches, &api);
    let policy = context.policies.state()[0].clone();
    let requeue = upgrade(&policy, &context).await.unwrap();
    assert_eq!(
        requeue,
        Requeue::requeue(decide::POD_POLL),
        "looks again at the pods soon"
    );
    assert!(
        api.object("/api/v1/namespaces/ml/pods/train").is_some(),
        "refused"
    );
    assert!(
        api.object("/api/v1/namespaces/ml/pods/probe").is_none(),
        "evicted"
    );
    refresh(&mut caches, &api);
    let policy = context.policies.state()[0].clone();
    upgrade(&policy, &context).await.unwrap();
    let gpu_node: GPUNode = api.get(None, NODE).unwrap();
    let reason = gpu_node
        .status
        .unwrap()
        .driver_upgrade
        .unwrap()
        .reason
        .unwrap_or_default();
    assert!(
        reason.contains("ml/train (refused by the test)"),
        "the refusal is named while it waits: {reason}"
    );
    assert!(
        api.object("/api/v1/namespaces/ml/pods/train").is_none(),
        "retried and evicted"
    );
    refresh(&mut caches, &api);
    let policy = context.policies.state()[0].clone();
    upgrade(&policy, &context).await.unwrap();
    assert_eq!(node_state(&api).as_deref(), Some("pod-restart-required"));
}

#[tokio::test]
async fn an_unusable_policy_stops_upgrades_with_an_event_naming_the_field() {
    let (api, client) = cluster(json!({"autoUpgrade": true, "maxUnavailable": "a quarter"}));
    let (context, mut caches) = context(client);
    refresh(&mut caches, &api);
    let policy = context.policies.state()[0].clone();
    upgrade(&policy, &context).await.unwrap();
    let requests = api.take_requests();
    assert_eq!(node_state(&api), None, "nothing starts");
    let event = requests
        .iter()
        .find(|r| r.path.contains("/events"))
        .expect("an Event");
    assert_eq!(event.body["reason"], "UpgradePolicyInvalid");
    assert!(
        event.body["note"]
            .as_str()
            .unwrap_or_default()
            .starts_with("driver.upgradePolicy.maxUnavailable is \"a quarter\""),
        "{}",
        event.body
    );
}

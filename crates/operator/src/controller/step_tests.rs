//! The reconcile steps against a scripted fake API server ([`api_test_kit::FakeApi::scripted`]), one test per outcome: the
//! operand apply step (created, unchanged, changed, conflict, API error) and the ClusterPolicy status write
//! (written, unchanged, changed, conflict, API error), and the NVIDIADriver statuses and Events; failures go to
//! `error_policy`, which requeues with backoff.

use std::collections::{BTreeMap, BTreeSet};
use std::slice;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crd::ClusterPolicy;
use crd::cluster_policy::{ClusterPolicyStatus, PolicyState};
use http::Method;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::labels_in_flight::LabelsInFlight;
use super::nvidia_drivers::DriverObjects;
use super::reconcile::{apply_operands, cleanup, reconcile_policy};
use super::writes::{label_nodes, write_status};
use super::{Context, Gate, GateClosed, ReconcileError, error_policy};
use crate::apply::{Applier, ApplySummary};
use crate::metrics::Metrics;
use crate::model::{ClusterFacts, ContainerRuntime, validate};
use crate::render::fixture::default_images;
use crate::render::{RenderedObject, render};
use api_test_kit::standard::{self, Retry};
use api_test_kit::{Answer, Expected, FakeApi, expect};

const NAMESPACE: &str = "gpu-operator";
const PLUGIN: &str = "nvidia-device-plugin-daemonset";
const PLUGIN_PATH: &str =
    "/apis/apps/v1/namespaces/gpu-operator/daemonsets/nvidia-device-plugin-daemonset";
const STATUS_PATH: &str = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy/status";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

fn policy() -> ClusterPolicy {
    let mut policy = ClusterPolicy::new("cluster-policy", crd::ClusterPolicySpec::default());
    policy.metadata.uid = Some("uid-1".into());
    policy.metadata.generation = Some(1);
    policy
}

/// Every object the default policy renders on a cluster without GPU nodes.
fn rendered() -> Vec<RenderedObject> {
    let validated = validate(&policy().spec, &default_images()).unwrap();
    let facts = ClusterFacts::from_nodes(NAMESPACE, [], ContainerRuntime::Containerd);
    render(&validated, &facts)
}

/// The device plugin's DaemonSet, as rendered.
fn plugin_daemonset() -> DaemonSet {
    rendered()
        .into_iter()
        .find_map(|object| match object {
            RenderedObject::DaemonSet(daemonset)
                if daemonset.metadata.name.as_deref() == Some(PLUGIN) =>
            {
                Some(*daemonset)
            }
            _ => None,
        })
        .expect("the device plugin renders")
}

/// The controller's context over a scenario, with writers for the caches the applier reads.
struct Fixture {
    api: FakeApi,
    context: Arc<Context>,
    nodes: Writer<Node>,
    daemonsets: Writer<DaemonSet>,
    services: Writer<Service>,
}

impl Fixture {
    fn new(expected: Vec<Expected>) -> Self {
        let (api, client) = FakeApi::scripted(expected);
        Self::over(api, client)
    }

    fn over(api: FakeApi, client: Client) -> Self {
        let (nodes, node_writer) = reflector::store();
        let (daemonsets, daemonset_writer) = reflector::store();
        let (services, service_writer) = reflector::store();
        Self {
            api,
            context: Arc::new(context(client, nodes, daemonsets.clone(), services)),
            nodes: node_writer,
            daemonsets: daemonset_writer,
            services: service_writer,
        }
    }

    /// The objects as the watch caches would hold them once applied.
    fn cached(&mut self, objects: &[RenderedObject]) {
        for object in objects {
            match object {
                RenderedObject::DaemonSet(daemonset) => self
                    .daemonsets
                    .apply_watcher_event(&watcher::Event::Apply(daemonset.as_ref().clone())),
                RenderedObject::Service(service) => self
                    .services
                    .apply_watcher_event(&watcher::Event::Apply(service.as_ref().clone())),
                RenderedObject::ServiceMonitor(_) => {}
            }
        }
    }

    async fn apply(&self, objects: &[RenderedObject]) -> Result<ApplySummary, ReconcileError> {
        let now = Time(Timestamp::now());
        apply_operands(
            &policy(),
            &ClusterPolicyStatus::default(),
            objects,
            &BTreeSet::new(),
            &self.context,
            &now,
        )
        .await
    }

    async fn write_status(
        &self,
        previous: &ClusterPolicyStatus,
        status: ClusterPolicyStatus,
    ) -> Result<(), ReconcileError> {
        write_status(&policy(), previous, status, &self.context).await
    }

    fn retry(&self, error: &ReconcileError) -> Action {
        error_policy(Arc::new(policy()), error, self.context.clone())
    }
}

fn context(
    client: Client,
    nodes: reflector::Store<Node>,
    daemonsets: reflector::Store<DaemonSet>,
    services: reflector::Store<Service>,
) -> Context {
    let (_, caches_synced) = watch::channel(true);
    let (_, leading) = watch::channel(true);
    Context {
        applier: Applier::new(
            client.clone(),
            NAMESPACE.into(),
            daemonsets.clone(),
            services,
        ),
        recorder: Recorder::new(client.clone(), "gpu-operator".into()),
        client,
        namespace: NAMESPACE.into(),
        defaults: default_images(),
        policies: reflector::store().0,
        nodes,
        gpu_nodes: reflector::store().0,
        daemonsets,
        config_maps: reflector::store().0,
        nvidia_drivers: reflector::store().0,
        metrics: Metrics::shared(),
        failures: Mutex::default(),
        unknown_fields: Mutex::default(),
        gate: Gate::new(caches_synced, leading),
        health: crate::health::Health::new(false),
        labels_in_flight: LabelsInFlight::default(),
    }
}

fn empty_list(kind: &str) -> Answer {
    Answer::Json(
        200,
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": []}),
    )
}

/// The pruning pass after the applies: nothing of the policy's is left over (no Prometheus operator).
fn prune_finds_nothing() -> Vec<Expected> {
    vec![
        expect(
            Method::GET,
            "/apis/apps/v1/namespaces/gpu-operator/daemonsets",
            empty_list("DaemonSetList"),
        ),
        expect(
            Method::GET,
            "/api/v1/namespaces/gpu-operator/services",
            empty_list("ServiceList"),
        ),
        expect(
            Method::GET,
            "/apis/monitoring.coreos.com/v1/namespaces/gpu-operator/servicemonitors",
            Answer::Error(404, "NotFound"),
        ),
    ]
}

fn apply_plugin(answer: Answer) -> Expected {
    expect(Method::PATCH, PLUGIN_PATH, answer)
}

/// The read of a DaemonSet the operator has not applied yet, which NVIDIA's operator may have made (see
/// `handover`): none here.
fn plugin_not_there_yet() -> Expected {
    expect(Method::GET, PLUGIN_PATH, Answer::Error(404, "NotFound"))
}

/// The device plugin's DaemonSet applied (201), then the pruning pass.
fn plugin_applied() -> Vec<Expected> {
    let mut expected = vec![plugin_not_there_yet(), apply_plugin(Answer::Echo)];
    expected.extend(prune_finds_nothing());
    expected
}

/// The device plugin's DaemonSet as the API server stores it, at `generation`.
fn stored_plugin(generation: i64) -> DaemonSet {
    let mut daemonset = plugin_daemonset();
    daemonset.metadata.generation = Some(generation);
    daemonset
}

/// The device plugin applied once by this process (the API server answering with generation 1), and in the cache
/// since.
async fn applied_once() -> (Fixture, RenderedObject) {
    let plugin = RenderedObject::from(plugin_daemonset());
    let stored = serde_json::to_value(stored_plugin(1)).unwrap();
    let mut expected = vec![
        plugin_not_there_yet(),
        apply_plugin(Answer::Json(200, stored)),
    ];
    expected.extend(prune_finds_nothing());
    let mut fixture = Fixture::new(expected);
    fixture.apply(slice::from_ref(&plugin)).await.unwrap();
    fixture.cached(&[RenderedObject::from(stored_plugin(1))]);
    fixture.api.finish();
    (fixture, plugin)
}

/// A server-side apply under the operator's field manager, forcing its ownership.
fn assert_server_side_apply(line: &str) {
    assert!(
        line.contains("fieldManager=gpu-operator") && line.contains("force=true"),
        "{line}"
    );
}

/// The device plugin's DaemonSet as NVIDIA's operator made it for the same policy: its own selector and a plain
/// update's field ownership.
fn nvidias_plugin() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {
            "name": PLUGIN, "namespace": NAMESPACE, "uid": "nvidias-uid", "resourceVersion": "42",
            "labels": {"app": PLUGIN},
            "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy",
                                 "uid": "uid-1", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "gpu-operator", "operation": "Update", "apiVersion": "apps/v1",
                               "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:volumes": {}}}}}}],
        },
        "spec": {
            "selector": {"matchLabels": {"app": PLUGIN}},
            "template": {"metadata": {"labels": {"app": PLUGIN}},
                         "spec": {"containers": [{"name": "nvidia-device-plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.2"}]}},
        },
    })
}

#[tokio::test]
async fn nvidias_operand_of_the_same_policy_is_taken_over_in_place() {
    let mut expected = vec![
        expect(
            Method::GET,
            PLUGIN_PATH,
            Answer::Json(200, nvidias_plugin()),
        ),
        expect(
            Method::PATCH,
            PLUGIN_PATH,
            Answer::Json(200, nvidias_plugin()),
        ),
        apply_plugin(Answer::Echo),
    ];
    expected.extend(prune_finds_nothing());
    let fixture = Fixture::new(expected);

    let plugin = RenderedObject::from(plugin_daemonset());
    let summary = fixture.apply(slice::from_ref(&plugin)).await.unwrap();

    assert_eq!((summary.applied, summary.pruned), (1, 0));
    let sent = fixture.api.finish();
    // First NVIDIA's fields become the operator's, unless the object changed since it was read...
    let handover = &sent[1].body;
    assert_eq!(
        handover[0],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"})
    );
    assert_eq!(handover[1]["path"], "/metadata/managedFields");
    assert_eq!(
        handover[1]["value"],
        json!([{"manager": "gpu-operator", "operation": "Apply", "apiVersion": "apps/v1", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:volumes": {}}}}}}])
    );
    // ...then the apply keeps NVIDIA's immutable selector, which the rendered pods carry.
    assert_server_side_apply(&sent[2].query);
    assert_eq!(
        sent[2].body["spec"]["selector"],
        json!({"matchLabels": {"app": PLUGIN}})
    );
    assert_eq!(
        sent[2].body["spec"]["template"]["metadata"]["labels"]["app"],
        PLUGIN
    );
}

#[tokio::test]
async fn a_taken_over_operand_keeps_nvidias_selector_when_applied_again() {
    // In the cache: the device plugin as the take-over left it, this operator's labels and NVIDIA's selector.
    let mut taken_over = stored_plugin(2);
    taken_over.spec.selector.match_labels = Some([("app".to_owned(), PLUGIN.to_owned())].into());
    let mut expected = vec![apply_plugin(Answer::Echo)];
    expected.extend(prune_finds_nothing());
    let mut fixture = Fixture::new(expected);
    fixture.cached(&[RenderedObject::from(taken_over)]);

    let mut changed = plugin_daemonset();
    let pod = changed.spec.template.spec.as_mut().unwrap();
    pod.containers[0].image = Some("registry.test/device-plugin:2".into());
    fixture
        .apply(&[RenderedObject::from(changed)])
        .await
        .unwrap();

    let sent = fixture.api.finish();
    assert_server_side_apply(&sent[0].query);
    assert_eq!(
        sent[0].body["spec"]["selector"],
        json!({"matchLabels": {"app": PLUGIN}}),
        "a selector cannot change"
    );
}

#[tokio::test]
async fn a_daemonset_of_another_policy_is_not_taken_over() {
    let mut other = nvidias_plugin();
    other["metadata"]["ownerReferences"][0]["uid"] = json!("another-policy");
    let mut expected = vec![
        expect(Method::GET, PLUGIN_PATH, Answer::Json(200, other)),
        apply_plugin(Answer::Echo),
    ];
    expected.extend(prune_finds_nothing());
    let fixture = Fixture::new(expected);

    let plugin = RenderedObject::from(plugin_daemonset());
    fixture.apply(slice::from_ref(&plugin)).await.unwrap();

    let sent = fixture.api.finish();
    assert_eq!(
        sent[1].body["spec"]["selector"]["matchLabels"]["nvidia.com/gpu-operator.daemonset"],
        PLUGIN,
        "the operator's own selector: nothing handed over"
    );
}

#[tokio::test]
async fn a_new_operand_is_created_by_server_side_apply_owned_by_the_policy() {
    let fixture = Fixture::new(plugin_applied());

    let plugin = RenderedObject::from(plugin_daemonset());
    let summary = fixture.apply(slice::from_ref(&plugin)).await.unwrap();

    assert_eq!(
        (summary.applied, summary.unchanged, summary.pruned),
        (1, 0, 0)
    );
    let sent = fixture.api.finish();
    assert_server_side_apply(&sent[1].query);
    let owner = &sent[1].body["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["uid"], &owner["controller"]),
        (&json!("uid-1"), &json!(true))
    );
}

#[tokio::test]
async fn an_unchanged_operand_is_not_written_again() {
    let (fixture, plugin) = applied_once().await;

    let summary = fixture.apply(slice::from_ref(&plugin)).await.unwrap();

    assert_eq!((summary.applied, summary.unchanged), (0, 1));
    let sent = fixture.api.finish();
    assert!(
        sent.is_empty(),
        "the same objects again: no write, and no prune lists: {sent:?}"
    );
}

#[tokio::test]
async fn a_changed_set_of_operands_is_pruned_again() {
    let (fixture, _) = applied_once().await;

    fixture.api.then(prune_finds_nothing());
    let summary = fixture.apply(&[]).await.unwrap();

    assert_eq!(summary.pruned, 0);
    let sent = fixture.api.finish();
    assert_eq!(sent.len(), 3, "one list per prunable kind: {sent:?}");
}

#[tokio::test]
async fn a_changed_operand_is_applied_again() {
    let (fixture, _) = applied_once().await;

    let mut changed = plugin_daemonset();
    let pod = changed.spec.template.spec.as_mut().unwrap();
    pod.containers[0].image = Some("registry.test/device-plugin:2".into());
    // The same set of objects: applied again, not pruned again.
    fixture.api.then(vec![apply_plugin(Answer::Echo)]);
    let summary = fixture
        .apply(&[RenderedObject::from(changed)])
        .await
        .unwrap();

    assert_eq!((summary.applied, summary.unchanged), (1, 0));
    let sent = fixture.api.finish();
    assert_server_side_apply(&sent[0].query);
    assert_eq!(
        sent[0].body["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.test/device-plugin:2"
    );
}

#[tokio::test]
async fn an_operand_someone_else_changed_is_applied_again() {
    let (mut fixture, plugin) = applied_once().await;

    // `kubectl set image` on the DaemonSet: its generation moves on, the rendered form stays the same.
    let mut edited = stored_plugin(2);
    let pod = edited.spec.template.spec.as_mut().unwrap();
    pod.containers[0].image = Some("registry.test/someone-else:1".into());
    fixture.cached(&[RenderedObject::from(edited)]);
    fixture.api.then(vec![apply_plugin(Answer::Json(
        200,
        serde_json::to_value(stored_plugin(3)).unwrap(),
    ))]);
    let summary = fixture.apply(slice::from_ref(&plugin)).await.unwrap();

    assert_eq!((summary.applied, summary.unchanged), (1, 0));
    let sent = fixture.api.finish();
    assert_server_side_apply(&sent[0].query);
    assert_eq!(
        sent[0].body["spec"]["template"]["spec"]["containers"][0]["image"],
        json!(plugin_daemonset().spec.template.spec.unwrap().containers[0].image),
        "the rendered image again"
    );

    // The cache catches up with the operator's own write: nothing to do any more.
    fixture.cached(&[RenderedObject::from(stored_plugin(3))]);
    let summary = fixture.apply(slice::from_ref(&plugin)).await.unwrap();
    assert_eq!((summary.applied, summary.unchanged), (0, 1));
    assert!(fixture.api.finish().is_empty());
}

/// A refused apply: the failure is said in status (with the object and the server's answer) and in a Warning
/// Event, the step fails, and `error_policy` retries it with a growing delay.
async fn refused_apply(code: u16, reason: &'static str) {
    let plugin = RenderedObject::from(plugin_daemonset());
    let fixture = Fixture::new(vec![
        plugin_not_there_yet(),
        apply_plugin(Answer::Error(code, reason)),
        expect(Method::POST, EVENTS_PATH, Answer::Echo),
        status_written(),
    ]);

    let error = fixture.apply(slice::from_ref(&plugin)).await.unwrap_err();

    assert!(matches!(error, ReconcileError::Apply(_)), "{error}");
    let sent = fixture.api.finish();
    let message = format!("applying DaemonSet gpu-operator/{PLUGIN}: ");
    assert_eq!(sent[2].body["type"], "Warning");
    assert!(
        sent[2].body["note"].as_str().unwrap().starts_with(&message),
        "{}",
        sent[2].body
    );
    let status = &sent[3].body["status"];
    assert_eq!(status["state"], "notReady");
    let condition = |kind: &str| {
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|condition| condition["type"] == kind)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let error_condition = condition("Error");
    assert_eq!(error_condition["status"], "True");
    let said = error_condition["message"].as_str().unwrap();
    assert!(
        said.starts_with(&message) && said.contains(reason),
        "{said}"
    );
    assert_eq!(
        fixture.retry(&error),
        Action::requeue(Duration::from_secs(2))
    );
    assert_eq!(
        fixture.retry(&error),
        Action::requeue(Duration::from_secs(4)),
        "backs off"
    );
}

#[tokio::test]
async fn a_conflicting_apply_fails_the_reconcile_says_why_and_is_retried() {
    refused_apply(409, "Conflict").await;
}

#[tokio::test]
async fn an_api_error_on_apply_fails_the_reconcile_says_why_and_is_retried() {
    refused_apply(500, "InternalError").await;
}

#[tokio::test]
async fn a_refused_apply_fails_the_reconcile_says_why_and_is_retried() {
    refused_apply(403, "Forbidden").await;
    refused_apply(422, "Invalid").await;
}

fn ready_status() -> ClusterPolicyStatus {
    ClusterPolicyStatus {
        state: Some(PolicyState::Ready),
        namespace: Some(NAMESPACE.into()),
        ready: Some("7/7".into()),
        ..ClusterPolicyStatus::default()
    }
}

/// The status write the API server takes.
fn status_written() -> Expected {
    expect(
        Method::PATCH,
        STATUS_PATH,
        Answer::Json(200, json!(policy())),
    )
}

#[tokio::test]
async fn a_first_status_is_written_by_server_side_apply() {
    let fixture = Fixture::new(vec![status_written()]);

    fixture
        .write_status(&ClusterPolicyStatus::default(), ready_status())
        .await
        .unwrap();

    let sent = fixture.api.finish();
    assert_server_side_apply(&sent[0].query);
    assert_eq!(sent[0].body["apiVersion"], "nvidia.com/v1");
    assert_eq!(sent[0].body["kind"], "ClusterPolicy");
    assert_eq!(sent[0].body["status"], json!(ready_status()));
}

#[tokio::test]
async fn an_unchanged_status_is_not_written() {
    let fixture = Fixture::new(Vec::new());

    fixture
        .write_status(&ready_status(), ready_status())
        .await
        .unwrap();

    assert!(fixture.api.finish().is_empty());
}

#[tokio::test]
async fn a_changed_status_is_written() {
    let fixture = Fixture::new(vec![status_written()]);
    let not_ready = ClusterPolicyStatus {
        state: Some(PolicyState::NotReady),
        ready: Some("6/7".into()),
        ..ready_status()
    };

    fixture
        .write_status(&ready_status(), not_ready)
        .await
        .unwrap();

    let sent = fixture.api.finish();
    assert_eq!(sent[0].body["status"]["state"], "notReady");
    assert_eq!(sent[0].body["status"]["ready"], "6/7");
}

/// A status write the API server refuses with `answer`: the step fails with the server's answer, retried by
/// `error_policy`.
async fn refused_status(answer: Answer) -> kube::core::Status {
    let fixture = Fixture::new(vec![expect(Method::PATCH, STATUS_PATH, answer)]);

    let error = fixture
        .write_status(&ClusterPolicyStatus::default(), ready_status())
        .await
        .unwrap_err();

    fixture.api.finish();
    assert!(
        error
            .to_string()
            .starts_with("writing the ClusterPolicy status: "),
        "{error}"
    );
    assert_eq!(
        fixture.retry(&error),
        Action::requeue(Duration::from_secs(2))
    );
    match error {
        ReconcileError::Status(kube::Error::Api(status)) => *status,
        other => panic!("not the API server's answer: {other:?}"),
    }
}

#[tokio::test]
async fn a_conflicting_status_write_fails_and_is_retried() {
    let status = refused_status(Answer::Error(409, "Conflict")).await;
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
}

#[tokio::test]
async fn an_api_error_on_the_status_write_fails_and_is_retried() {
    let status = refused_status(Answer::Error(503, "ServiceUnavailable")).await;
    assert!(status.is_failure() && status.code == 503, "{status:?}");
}

/// A whole reconcile of the default policy on a cluster without GPU nodes: every operand applied (this process
/// has not applied them yet, though they exist), then status; the next reconcile of the same policy writes
/// nothing.
#[tokio::test]
async fn a_reconcile_applies_every_operand_then_writes_status_once() {
    let objects = rendered();
    let mut expected = every_object_applied(&objects);
    expected.extend(prune_finds_nothing());
    expected.extend([
        // The stored spec, read once per generation for fields the schema does not know.
        expect(
            Method::GET,
            "/apis/nvidia.com/v1/clusterpolicies/cluster-policy",
            Answer::Json(200, json!(policy())),
        ),
        expect(Method::POST, EVENTS_PATH, Answer::Echo),
        status_written(),
    ]);
    let mut fixture = Fixture::new(expected);
    fixture.cached(&objects);

    let action = reconcile_policy(&policy(), &fixture.context).await.unwrap();

    assert_eq!(action, Action::await_change());
    let sent = fixture.api.finish();
    let status: ClusterPolicyStatus =
        serde_json::from_value(sent.last().unwrap().body["status"].clone()).unwrap();
    assert_eq!(status.namespace.as_deref(), Some(NAMESPACE));

    // The policy carries its status now: nothing to write.
    let mut again = policy();
    again.status = Some(status);
    reconcile_policy(&again, &fixture.context).await.unwrap();
    let sent = fixture.api.finish();
    assert!(sent.is_empty(), "no request at all: {sent:?}");
}

/// The server-side apply of each of `objects`, in order (each one in the cache already: no read before it).
fn every_object_applied(objects: &[RenderedObject]) -> Vec<Expected> {
    objects
        .iter()
        .map(|object| {
            let group = match object.kind() {
                "DaemonSet" => "/apis/apps/v1",
                "Service" => "/api/v1",
                _ => "/apis/monitoring.coreos.com/v1",
            };
            let path = format!(
                "{group}/namespaces/{NAMESPACE}/{}s/{}",
                object.kind().to_lowercase(),
                object.name()
            );
            expect(Method::PATCH, &path, Answer::Echo)
        })
        .collect()
}

/// A reconcile on a cluster with a GPU node applies every operand before it writes the node's labels (the
/// DaemonSets' affinity places the pods without them; written first, the labels held every DaemonSet back), and a
/// refused label write fails the reconcile, to be retried, with every operand applied.
#[tokio::test]
async fn operands_are_applied_before_node_labels_and_a_refused_label_write_fails_the_reconcile() {
    let mut policy = policy();
    // No driver: its OS pools would first look for NVIDIA's driver DaemonSet to take over.
    policy.spec = serde_json::from_value(json!({"driver": {"enabled": false}})).unwrap();
    let node: Node = serde_json::from_value(json!({"metadata": {
        "name": "gpu-0",
        "labels": {"feature.node.kubernetes.io/pci-10de.present": "true"},
    }}))
    .unwrap();
    let validated = validate(&policy.spec, &default_images()).unwrap();
    let facts = ClusterFacts::from_nodes(NAMESPACE, [&node], ContainerRuntime::Containerd);
    let objects = render(&validated, &facts);
    let mut expected = every_object_applied(&objects);
    expected.extend(prune_finds_nothing());
    expected.push(expect(
        Method::PATCH,
        "/api/v1/nodes/gpu-0",
        Answer::Error(500, "InternalError"),
    ));
    let mut fixture = Fixture::new(expected);
    fixture.cached(&objects);
    fixture
        .nodes
        .apply_watcher_event(&watcher::Event::Apply(node));

    let error = reconcile_policy(&policy, &fixture.context)
        .await
        .unwrap_err();

    assert!(error.to_string().contains("InternalError"), "{error}");
    let sent = fixture.api.finish();
    assert_eq!(sent.len(), objects.len() + prune_finds_nothing().len() + 1);
    assert_eq!(
        sent.last().unwrap().body["metadata"]["labels"]["nvidia.com/gpu.present"],
        "true"
    );
}

/// The deleted policy's device plugin DaemonSet as a metadata list answers it: labelled as the operator's, owned
/// by the policy, terminating or not.
fn owned_plugin_listed(terminating: bool) -> Answer {
    let mut metadata = json!({
        "name": PLUGIN,
        "namespace": NAMESPACE,
        "labels": {"app.kubernetes.io/managed-by": "gpu-operator"},
        "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy", "uid": "uid-1"}],
    });
    if terminating {
        metadata["deletionTimestamp"] = json!("2026-11-23T10:00:00Z");
    }
    Answer::Json(
        200,
        json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": {"resourceVersion": "1"},
            "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": metadata}],
        }),
    )
}

/// The rest of a removal pass after the DaemonSets: no Service, no Prometheus operator.
fn nothing_else_owned() -> Vec<Expected> {
    prune_finds_nothing().split_off(1)
}

/// A deleted policy's cleanup deletes its operands in the foreground and keeps its finalizer (an error, retried
/// soon and not counted as a failure) until their pods have stopped; no label or GPUNode is touched meanwhile, or
/// a still running agent would write them again.
#[tokio::test]
async fn cleanup_keeps_the_finalizer_while_the_operands_stop() {
    let daemonsets = "/apis/apps/v1/namespaces/gpu-operator/daemonsets";
    let mut expected = vec![
        expect(Method::GET, daemonsets, owned_plugin_listed(false)),
        expect(
            Method::DELETE,
            PLUGIN_PATH,
            Answer::Json(200, json!(plugin_daemonset())),
        ),
    ];
    expected.extend(nothing_else_owned());
    let fixture = Fixture::new(expected);

    let error = cleanup(&policy(), &fixture.context).await.unwrap_err();

    assert!(
        matches!(error, ReconcileError::OperandsStopping { remaining: 1 }),
        "{error}"
    );
    let sent = fixture.api.finish();
    assert_eq!(sent[1].body["propagationPolicy"], "Foreground", "{sent:?}");
    assert_eq!(
        fixture.retry(&error),
        Action::requeue(Duration::from_secs(2))
    );
    // Waiting is not a failure: a real error afterwards starts the backoff from its first step.
    assert_eq!(
        fixture.retry(&ReconcileError::Gate(GateClosed::CachesStopped)),
        Action::requeue(Duration::from_secs(2))
    );

    // Still terminating: not deleted again, still waited for.
    let mut expected = vec![expect(Method::GET, daemonsets, owned_plugin_listed(true))];
    expected.extend(nothing_else_owned());
    fixture.api.then(expected);
    let error = cleanup(&policy(), &fixture.context).await.unwrap_err();
    assert!(matches!(
        error,
        ReconcileError::OperandsStopping { remaining: 1 }
    ));
    fixture.api.finish();
}

/// Once the operands are gone, the cleanup removes the GPUNodes (and the labels of the nodes it knows).
#[tokio::test]
async fn cleanup_deletes_the_gpunodes_once_the_operands_are_gone() {
    let mut expected = prune_finds_nothing();
    expected.push(expect(
        Method::DELETE,
        "/apis/nvidia.com/v1alpha1/gpunodes",
        Answer::Json(200, json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNodeList", "metadata": {}, "items": []})),
    ));
    let fixture = Fixture::new(expected);

    let action = cleanup(&policy(), &fixture.context).await.unwrap();

    assert_eq!(action, Action::await_change());
    fixture.api.finish();
}

#[tokio::test]
async fn a_refused_status_write_names_the_status_and_the_reason() {
    for (code, reason) in [(403, "Forbidden"), (422, "Invalid")] {
        let status = refused_status(Answer::Error(code, reason)).await;
        assert_eq!((status.code, status.reason.as_str()), (code, reason));
    }
}

#[path = "label_tests.rs"]
mod labels;

/// The NVIDIADriver statuses after a reconcile: each object's status written once, a Warning Event only when an
/// object is newly refused, nothing written again when nothing changed.
#[tokio::test]
async fn nvidia_driver_statuses_are_written_once_and_a_refusal_is_an_event() {
    use crd::nvidia_driver::{NVIDIADriver, NvidiaDriverStatus};
    use kube::runtime::reflector::store::Writer;

    let object = |name: &str, spec: Value| {
        let mut object = NVIDIADriver::new(name, serde_json::from_value(spec).unwrap());
        object.metadata.generation = Some(1);
        object.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(1_800_000_000).unwrap(),
            ));
        object
    };
    let mut objects = vec![
        object(
            "a100",
            json!({"image": "driver", "nodeSelector": {"pool": "a100"}}),
        ),
        // NVIDIA's sample: every GPU node, a100's included; created later.
        object("sample", json!({"image": "driver"})),
    ];
    objects[1].metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::from_second(1_800_000_100).unwrap(),
        ));
    let node = Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("gpu-0".into()),
            labels: Some(
                [
                    ("feature.node.kubernetes.io/pci-10de.present", "true"),
                    ("nvidia.com/gpu.present", "true"),
                    ("pool", "a100"),
                ]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
            ),
            ..Default::default()
        },
        ..Node::default()
    };
    let nodes = [Arc::new(node)];
    let policy = validate(
        &serde_json::from_value(json!({"driver": {"useNvidiaDriverCRD": true}})).unwrap(),
        &default_images(),
    )
    .unwrap();
    let observed = |objects: &[NVIDIADriver]| {
        let mut writer: Writer<NVIDIADriver> = Writer::default();
        for object in objects {
            writer.apply_watcher_event(&watcher::Event::Apply(object.clone()));
        }
        DriverObjects::observe(&policy, &nodes, &writer.as_reader())
    };
    let status_path = |name: &str| format!("/apis/nvidia.com/v1alpha1/nvidiadrivers/{name}/status");
    let stored = |object: &NVIDIADriver| Answer::Json(200, serde_json::to_value(object).unwrap());
    let fixture = Fixture::new(vec![
        expect(Method::PATCH, &status_path("a100"), stored(&objects[0])),
        expect(Method::POST, EVENTS_PATH, Answer::Echo),
        expect(Method::PATCH, &status_path("sample"), stored(&objects[1])),
    ]);
    let now = Time(Timestamp::now());

    let drivers = observed(&objects);
    assert_eq!(
        drivers.owner("gpu-0", &BTreeMap::new()).as_deref(),
        Some("a100")
    );
    drivers.report(&[], &fixture.context, &now).await.unwrap();

    let sent = fixture.api.finish();
    assert_eq!(sent[1].body["type"], "Warning");
    assert_eq!(sent[1].body["reason"], "ConflictingNodeSelector");
    let note = sent[1].body["note"].as_str().unwrap();
    assert!(
        note.contains("gpu-0")
            && note.contains("NVIDIADriver sample")
            && note.contains("NVIDIADriver a100"),
        "{note}"
    );
    for (object, request) in objects.iter_mut().zip([&sent[0], &sent[2]]) {
        assert_server_side_apply(&request.query);
        let status: NvidiaDriverStatus =
            serde_json::from_value(request.body["status"].clone()).unwrap();
        object.status = Some(status);
    }
    assert_eq!(
        objects[1].status.as_ref().unwrap().state,
        crd::nvidia_driver::NvidiaDriverState::NotReady
    );

    // The statuses as written: nothing to write, and no second Event for the same refusal.
    observed(&objects)
        .report(&[], &fixture.context, &now)
        .await
        .unwrap();
    assert!(fixture.api.finish().is_empty());
}

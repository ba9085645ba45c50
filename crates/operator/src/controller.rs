//! The ClusterPolicy controller: observe -> validate -> label -> render -> apply -> status, driven by watches
//! (no polling). It watches ClusterPolicies, the DaemonSets and Services it owns, Nodes (only changes that
//! matter for GPU deployment), GPUNodes and the ConfigMaps in its namespace.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crd::cluster_policy::{ClusterPolicyStatus, PolicyState};
use crd::{ClusterPolicy, GPUNode};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, predicates, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

use crate::apply::{Applier, ApplyError, MANAGED_BY_SELECTOR};
use crate::crd_install::FIELD_MANAGER;
use crate::metrics::Metrics;
use crate::model::{
    ClusterFacts, Component, ContainerRuntime, DefaultImages, ValidateError, ValidatedPolicy,
    validate,
};
use crate::plan::configs;
use crate::plan::labels::{LabelChanges, plan_cleanup, plan_node};
use crate::plan::status::{self, Observed};
use crate::render::{RenderedObject, render};

/// Finalizer that lets the operator remove the node labels it wrote when its ClusterPolicy is deleted.
pub const FINALIZER: &str = "nvidia.com/gpu-operator-cleanup";

/// The longest wait between retries of a failing reconcile.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Everything a reconcile needs, shared across reconciles.
pub struct Context {
    pub client: Client,
    pub namespace: String,
    pub defaults: DefaultImages,
    pub policies: Store<ClusterPolicy>,
    pub nodes: Store<Node>,
    pub gpu_nodes: Store<GPUNode>,
    pub daemonsets: Store<DaemonSet>,
    pub config_maps: Store<ConfigMap>,
    pub applier: Applier,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    failures: Mutex<HashMap<String, u32>>,
    /// Unknown spec fields per policy, with the generation they were found in: the stored spec is read once
    /// per change, not once per reconcile.
    unknown_fields: Mutex<HashMap<String, (i64, Vec<String>)>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("labelling node {node}: {source}")]
    Label { node: String, source: kube::Error },
    #[error("writing the ClusterPolicy status: {0}")]
    Status(#[source] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(String),
}

impl ReconcileError {
    fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Apply(_) => "apply",
            ReconcileError::Label { .. } => "label",
            ReconcileError::Status(_) => "status",
            ReconcileError::Finalizer(_) => "finalizer",
        }
    }
}

/// Runs the controller until the process is asked to stop.
pub async fn run(
    client: Client,
    namespace: String,
    defaults: DefaultImages,
    metrics: Arc<Metrics>,
    ready: impl FnOnce(),
) {
    let (nodes, node_writer) = reflector::store();
    let node_events = watcher(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .reflect(node_writer)
    .applied_objects()
    .predicate_filter(node_relevance, Default::default());
    let (gpu_nodes, gpu_node_writer) = reflector::store();
    let gpu_node_events = watcher(
        Api::<GPUNode>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(gpu_node_writer)
    .applied_objects()
    .predicate_filter(predicates::resource_version, Default::default());
    let owned = || watcher::Config::default().labels(MANAGED_BY_SELECTOR);
    let (daemonsets, daemonset_writer) = reflector::store();
    let daemonset_events = watcher(
        Api::<DaemonSet>::namespaced(client.clone(), &namespace),
        owned(),
    )
    .default_backoff()
    .reflect(daemonset_writer)
    .applied_objects();
    let (services, service_writer) = reflector::store();
    let service_events = watcher(
        Api::<Service>::namespaced(client.clone(), &namespace),
        owned(),
    )
    .default_backoff()
    .reflect(service_writer)
    .applied_objects();
    let (config_maps, config_map_writer) = reflector::store();
    let config_map_events = watcher(
        Api::<ConfigMap>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(config_map_writer)
    .applied_objects()
    .predicate_filter(predicates::resource_version, Default::default());

    let client_for_policies = client.clone();
    let controller = Controller::new(
        Api::<ClusterPolicy>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    );
    let policies = controller.store();
    let context = Arc::new(Context {
        applier: Applier::new(
            client.clone(),
            namespace.clone(),
            daemonsets.clone(),
            services,
        ),
        recorder: Recorder::new(client.clone(), "gpu-operator".into()),
        client,
        namespace,
        defaults,
        policies: policies.clone(),
        nodes,
        gpu_nodes,
        daemonsets,
        config_maps,
        metrics,
        failures: Mutex::default(),
        unknown_fields: Mutex::default(),
    });
    ready();
    controller
        .owns_stream(daemonset_events)
        .owns_stream(service_events)
        .watches_stream(node_events, every_policy(policies.clone()))
        .watches_stream(gpu_node_events, every_policy(policies.clone()))
        .watches_stream(config_map_events, every_policy(policies.clone()))
        // A policy created, changed or deleted can change which one is active: every policy looks again.
        .watches(
            Api::<ClusterPolicy>::all(client_for_policies),
            watcher::Config::default(),
            every_policy(policies),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, context)
        // Failures are logged once, with their retry delay, by `error_policy`.
        .for_each(|_| async {})
        .await;
}

/// Maps any watched object to every ClusterPolicy: there is one active policy, and the others short-circuit.
fn every_policy<K>(
    policies: Store<ClusterPolicy>,
) -> impl Fn(K) -> Vec<ObjectRef<ClusterPolicy>> + Send + Sync + 'static {
    move |_| {
        policies
            .state()
            .iter()
            .map(|policy| ObjectRef::from_obj(policy.as_ref()))
            .collect()
    }
}

/// Only what decides GPU deployment wakes the controller: labels and the container runtime. Node heartbeats
/// (status updates every few seconds on every node) do not.
fn node_relevance(node: &Node) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    node.labels().hash(&mut hasher);
    let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
    info.map(|i| (&i.container_runtime_version, &i.kubelet_version))
        .hash(&mut hasher);
    Some(hasher.finish())
}

async fn reconcile(
    policy: Arc<ClusterPolicy>,
    context: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let span = info_span!("reconcile", clusterpolicy = %policy.name_any());
    async move {
        let started = Instant::now();
        let api = Api::<ClusterPolicy>::all(context.client.clone());
        let result = finalizer(&api, FINALIZER, policy, |event| async {
            match event {
                FinalizerEvent::Apply(policy) => reconcile_policy(&policy, &context).await,
                FinalizerEvent::Cleanup(policy) => cleanup(&policy, &context).await,
            }
        })
        .await
        .map_err(|error| match error {
            kube::runtime::finalizer::Error::ApplyFailed(error)
            | kube::runtime::finalizer::Error::CleanupFailed(error) => error,
            other => ReconcileError::Finalizer(other.to_string()),
        });
        context.metrics.observe_reconcile(started.elapsed());
        result
    }
    .instrument(span)
    .await
}

/// Retries failing reconciles with exponential backoff (1 s doubling to 5 min), per ClusterPolicy.
fn error_policy(
    policy: Arc<ClusterPolicy>,
    error: &ReconcileError,
    context: Arc<Context>,
) -> Action {
    context.metrics.count_error(error.reason());
    let failures = context.failures.lock().map_or(1, |mut map| {
        let count = map.entry(policy.name_any()).or_insert(0);
        *count += 1;
        *count
    });
    let delay = Duration::from_secs(1u64 << failures.min(9)).min(MAX_BACKOFF);
    warn!(clusterpolicy = %policy.name_any(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The active ClusterPolicy: the oldest, ties broken by name.
fn active_policy(policies: &Store<ClusterPolicy>) -> Option<Arc<ClusterPolicy>> {
    policies
        .state()
        .into_iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .min_by(|a, b| {
            (a.creation_timestamp(), a.name_any()).cmp(&(b.creation_timestamp(), b.name_any()))
        })
}

async fn reconcile_policy(
    policy: &ClusterPolicy,
    context: &Context,
) -> Result<Action, ReconcileError> {
    let now = Time(Timestamp::now());
    let previous = policy.status.clone().unwrap_or_default();
    let active = active_policy(&context.policies);
    if let Some(active) = active.filter(|active| active.name_any() != policy.name_any()) {
        let status = status::ignored(
            &active.name_any(),
            &previous.conditions,
            policy.meta().generation,
            &now,
        );
        write_status(policy, &previous, status, context).await?;
        return Ok(Action::await_change());
    }
    let validated = match validate(&policy.spec, &context.defaults) {
        Ok(validated) => validated,
        Err(error) => return report_invalid(policy, &previous, &error, context, &now).await,
    };
    let default_runtime = ContainerRuntime::from_default(&validated.spec.operator.default_runtime);
    let nodes = context.nodes.state();
    let facts = ClusterFacts::from_nodes(
        &context.namespace,
        nodes.iter().map(AsRef::as_ref),
        default_runtime,
    );
    let labelled = label_nodes(&validated, &nodes, default_runtime, context).await?;

    let objects = render(&validated, &facts);
    let summary = match context.applier.apply(policy, &objects).await {
        Ok(summary) => summary,
        Err(error) => {
            // Said where users look (status and an Event), then retried with backoff by `error_policy`.
            let message = error.to_string();
            publish(
                policy,
                context,
                EventType::Warning,
                status::reason::RECONCILE_FAILED,
                &message,
            )
            .await;
            let failed = status::failed(&previous, &message, policy.meta().generation, &now);
            write_status(policy, &previous, failed, context).await?;
            return Err(error.into());
        }
    };
    if summary.applied + summary.pruned > 0 {
        info!(
            applied = summary.applied,
            unchanged = summary.unchanged,
            pruned = summary.pruned,
            "operands applied"
        );
    }

    let unknown_fields = unknown_fields(policy, context).await;
    let daemonsets = context.daemonsets.state();
    let gpu_nodes: Vec<GPUNode> = context
        .gpu_nodes
        .state()
        .iter()
        .map(|n| n.as_ref().clone())
        .collect();
    let observed = Observed {
        policy: &validated,
        generation: policy.meta().generation,
        namespace: &context.namespace,
        gpu_node_count: facts.gpu_nodes.len(),
        rendered: rendered_daemonsets(&objects),
        expected_nodes: expected_nodes(&validated, &labelled),
        daemonsets: daemonsets
            .iter()
            .map(|d| (d.name_any(), d.as_ref()))
            .collect(),
        gpu_nodes: &gpu_nodes,
        unknown_fields: &unknown_fields,
        config_problems: configs::config_problems(&validated, &context.namespace, |name| {
            let key = ObjectRef::new(name).within(&context.namespace);
            context
                .config_maps
                .get(&key)
                .map(|config_map| config_map.as_ref().clone())
        }),
    };
    let mut status = status::compute(&observed, &previous.conditions, &now);
    if !summary.skipped.is_empty() {
        let exporter = status
            .components
            .iter_mut()
            .find(|c| c.name == Component::DcgmExporter.label_name());
        if let Some(exporter) = exporter {
            exporter.message = Some(summary.skipped.join("; "));
        }
    }
    context.metrics.gpu_nodes.set(facts.gpu_nodes.len() as i64);
    context
        .metrics
        .components_enabled
        .set(validated.enabled().len() as i64);
    let ready = status
        .components
        .iter()
        .filter(|c| c.enabled && c.state == "ready")
        .count();
    context.metrics.components_ready.set(ready as i64);
    announce_transition(policy, &previous, &status, context).await;
    write_status(policy, &previous, status, context).await?;
    if let Ok(mut failures) = context.failures.lock() {
        failures.remove(&policy.name_any());
    }
    Ok(Action::await_change())
}

/// The fields of the policy's stored spec that the schema does not define. The typed object has dropped them,
/// so the stored one is read as JSON — once per generation. A failed read is logged and treated as none.
async fn unknown_fields(policy: &ClusterPolicy, context: &Context) -> Vec<String> {
    let name = policy.name_any();
    let generation = policy.meta().generation.unwrap_or(0);
    if let Some((seen, fields)) = context
        .unknown_fields
        .lock()
        .ok()
        .and_then(|map| map.get(&name).cloned())
        && seen == generation
    {
        return fields;
    }
    let resource = ApiResource::erase::<ClusterPolicy>(&());
    let api = Api::<DynamicObject>::all_with(context.client.clone(), &resource);
    let fields = match api.get(&name).await {
        Ok(stored) => crd::crds::unknown_spec_fields(&stored.data["spec"]),
        Err(error) => {
            warn!(%error, "reading the stored ClusterPolicy to find unknown fields failed");
            return Vec::new();
        }
    };
    if !fields.is_empty() {
        warn!(
            ?fields,
            "the ClusterPolicy has fields this operator does not know; they are ignored"
        );
    }
    if let Ok(mut map) = context.unknown_fields.lock() {
        map.insert(name, (generation, fields.clone()));
    }
    fields
}

/// Applies the label plan to every node that needs a change; returns every node's labels after it.
async fn label_nodes(
    policy: &ValidatedPolicy,
    nodes: &[Arc<Node>],
    default_runtime: ContainerRuntime,
    context: &Context,
) -> Result<Vec<BTreeMap<String, String>>, ReconcileError> {
    let api = Api::<Node>::all(context.client.clone());
    let mut labelled = Vec::with_capacity(nodes.len());
    for node in nodes {
        let mut labels = node.labels().clone();
        let runtime = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .and_then(|i| {
                ContainerRuntime::detect(&i.container_runtime_version, &i.kubelet_version)
            })
            .unwrap_or(default_runtime);
        let changes = plan_node(policy, &labels, runtime);
        patch_labels(&api, &node.name_any(), &changes).await?;
        apply_changes(&mut labels, changes);
        labelled.push(labels);
    }
    Ok(labelled)
}

async fn patch_labels(
    api: &Api<Node>,
    node: &str,
    changes: &LabelChanges,
) -> Result<(), ReconcileError> {
    if changes.is_empty() {
        return Ok(());
    }
    let patch = json!({"metadata": {"labels": changes}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| ReconcileError::Label {
            node: node.into(),
            source,
        })?;
    info!(%node, ?changes, "node labels updated");
    Ok(())
}

fn apply_changes(labels: &mut BTreeMap<String, String>, changes: LabelChanges) {
    for (key, value) in changes {
        match value {
            Some(value) => labels.insert(key, value),
            None => labels.remove(&key),
        };
    }
}

/// For each enabled component, how many nodes its deploy label selects.
fn expected_nodes(
    policy: &ValidatedPolicy,
    labelled: &[BTreeMap<String, String>],
) -> BTreeMap<Component, usize> {
    policy
        .enabled()
        .into_iter()
        .map(|component| {
            let label = component.deploy_label();
            let count = labelled
                .iter()
                .filter(|labels| labels.get(&label).is_some_and(|v| v == "true"))
                .count();
            (component, count)
        })
        .collect()
}

fn rendered_daemonsets(objects: &[RenderedObject]) -> BTreeMap<Component, Vec<String>> {
    let mut rendered: BTreeMap<Component, Vec<String>> = BTreeMap::new();
    for object in objects.iter().filter(|o| o.kind() == "DaemonSet") {
        rendered
            .entry(object.component())
            .or_default()
            .push(object.name());
    }
    rendered
}

/// A spec that cannot be rendered: nothing is applied, the status and an Event say why.
async fn report_invalid(
    policy: &ClusterPolicy,
    previous: &ClusterPolicyStatus,
    error: &ValidateError,
    context: &Context,
    now: &Time,
) -> Result<Action, ReconcileError> {
    let message = error.to_string();
    warn!(%message, "invalid ClusterPolicy");
    context.metrics.count_error("validate");
    publish(policy, context, EventType::Warning, "InvalidSpec", &message).await;
    let status = status::failed(previous, &message, policy.meta().generation, now);
    write_status(policy, previous, status, context).await?;
    // Only an edit of the spec can fix it, and an edit triggers a reconcile: no retry.
    Ok(Action::await_change())
}

/// Events on state transitions, so `kubectl describe clusterpolicy` tells the story.
async fn announce_transition(
    policy: &ClusterPolicy,
    previous: &ClusterPolicyStatus,
    status: &ClusterPolicyStatus,
    context: &Context,
) {
    if previous.state == status.state {
        return;
    }
    let message = status
        .conditions
        .first()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    match status.state {
        Some(PolicyState::Ready) => {
            publish(policy, context, EventType::Normal, "Ready", &message).await
        }
        Some(PolicyState::NotReady) => {
            publish(policy, context, EventType::Normal, "NotReady", &message).await
        }
        _ => {}
    }
}

async fn publish(
    policy: &ClusterPolicy,
    context: &Context,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(error) = context
        .recorder
        .publish(&event, &policy.object_ref(&()))
        .await
    {
        warn!(%error, "publishing an event failed");
    }
}

/// Writes the status only when it changed, under the operator's field manager.
async fn write_status(
    policy: &ClusterPolicy,
    previous: &ClusterPolicyStatus,
    status: ClusterPolicyStatus,
    context: &Context,
) -> Result<(), ReconcileError> {
    if *previous == status {
        return Ok(());
    }
    let api = Api::<ClusterPolicy>::all(context.client.clone());
    let patch = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "status": status});
    api.patch_status(
        &policy.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(ReconcileError::Status)?;
    Ok(())
}

/// On deletion: when no other ClusterPolicy takes over, remove every node label the operator wrote. The
/// operands go with the policy through their owner references.
async fn cleanup(policy: &ClusterPolicy, context: &Context) -> Result<Action, ReconcileError> {
    let others = context
        .policies
        .state()
        .iter()
        .any(|p| p.name_any() != policy.name_any() && p.meta().deletion_timestamp.is_none());
    if others {
        info!("another ClusterPolicy remains; it keeps the node labels");
        return Ok(Action::await_change());
    }
    let api = Api::<Node>::all(context.client.clone());
    for node in context.nodes.state() {
        patch_labels(&api, &node.name_any(), &plan_cleanup(node.labels())).await?;
    }
    info!("node labels removed");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn heartbeats_do_not_wake_the_controller_but_labels_do() {
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        let before = node_relevance(&node);
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(
            node_relevance(&node),
            before,
            "a status heartbeat is not relevant"
        );
        node.metadata.labels = Some(
            [(
                "nvidia.com/gpu.deploy.driver".to_string(),
                "false".to_string(),
            )]
            .into(),
        );
        assert_ne!(node_relevance(&node), before);
    }

    #[test]
    fn expected_nodes_count_true_deploy_labels() {
        let images = DefaultImages(
            DefaultImages::VARIABLES
                .iter()
                .map(|v| (v.to_string(), format!("x/{v}:1")))
                .collect(),
        );
        let policy = validate(&crd::ClusterPolicySpec::default(), &images).unwrap();
        let label = Component::DevicePlugin.deploy_label();
        let labelled = vec![
            BTreeMap::from([(label.clone(), "true".to_string())]),
            BTreeMap::from([(label.clone(), "false".to_string())]),
            BTreeMap::new(),
        ];
        assert_eq!(
            expected_nodes(&policy, &labelled)[&Component::DevicePlugin],
            1
        );
    }
}

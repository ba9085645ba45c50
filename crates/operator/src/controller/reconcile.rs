//! One reconcile of a ClusterPolicy, step by step: which policy is active, validate, observe, build
//! (render), apply, label, status; and the cleanup when the policy is deleted. Each step is a function of its own, so
//! that its outcomes can be tested against a mocked API server.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use crd::cluster_policy::ClusterPolicyStatus;
use crd::{ClusterPolicy, GPUNode};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::nvidia_drivers::DriverObjects;
use super::writes::{announce_transition, label_nodes, patch_labels, publish, write_status};
use super::{Context, ReconcileError};
use crate::apply::{ApplyError, ApplySummary};
use crate::model::{
    ClusterFacts, Component, ContainerRuntime, OsPool, ValidateError, ValidatedPolicy, validate,
};
use crate::plan::configs;
use crate::plan::labels::plan_cleanup;
use crate::plan::status::{self, Observed};
use crate::render::{RenderedObject, render};

/// The active ClusterPolicy: the oldest, ties broken by name.
pub(crate) fn active_policy(policies: &Store<ClusterPolicy>) -> Option<Arc<ClusterPolicy>> {
    policies
        .state()
        .into_iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .min_by(|a, b| {
            (a.creation_timestamp(), a.name_any()).cmp(&(b.creation_timestamp(), b.name_any()))
        })
}

pub(super) async fn reconcile_policy(
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
    let mut cluster = observe(&validated, context);
    cluster.facts.nvidia_driver_pool =
        nvidia_driver_pool(policy, &previous, &validated, &cluster.facts, context, &now).await?;
    let objects = render(&validated, &cluster.facts);
    let kept = cluster.drivers.kept(&context.daemonsets.state());
    // The DaemonSets first: their node affinity places a GPU node's pods whether or not its labels are written yet
    // (`plan::labels::deploy_terms`), so the label writes are off the operands' critical path. The labels follow:
    // NVIDIA's semantics and the tools that read them, and the toolkit's runtime label, which its DaemonSets select.
    let summary = apply_operands(policy, &previous, &objects, &kept, context, &now).await?;
    let labelled = label_nodes(
        &validated,
        &cluster.nodes,
        cluster.default_runtime,
        &cluster.drivers,
        context,
    )
    .await?;
    let built = Built {
        policy: &validated,
        facts: &cluster.facts,
        labelled: &labelled,
        objects: &objects,
        summary: &summary,
    };
    let status = compute_status(policy, &previous, &built, context, &now).await;
    announce_transition(policy, &previous, &status, context).await;
    write_status(policy, &previous, status, context).await?;
    cluster.drivers.report(&objects, context, &now).await?;
    if let Ok(mut failures) = context.failures.lock() {
        failures.remove(&policy.name_any());
    }
    Ok(Action::await_change())
}

/// What a reconcile reads of the cluster besides the policy: the nodes (from the watch cache), the facts
/// rendering depends on, and the NVIDIADriver objects with their nodes.
struct Cluster {
    nodes: Vec<Arc<Node>>,
    facts: ClusterFacts,
    default_runtime: ContainerRuntime,
    drivers: DriverObjects,
}

/// observe: the cluster as the watch caches hold it.
fn observe(validated: &ValidatedPolicy, context: &Context) -> Cluster {
    let default_runtime = ContainerRuntime::from_default(&validated.spec.operator.default_runtime);
    let nodes = context.nodes.state();
    let mut facts = ClusterFacts::from_nodes(
        &context.namespace,
        nodes.iter().map(AsRef::as_ref),
        default_runtime,
    );
    let drivers = DriverObjects::observe(validated, &nodes, &context.nvidia_drivers);
    facts.nvidia_drivers = drivers.accepted();
    Cluster {
        nodes,
        facts,
        default_runtime,
        drivers,
    }
}

/// apply: the rendered operands server-side applied (each only when it changed) and what is no longer rendered
/// pruned, except the `kept` DaemonSets. A failure is said where users look (status and a Warning Event) and returned, so that
/// `error_policy` retries it with backoff.
pub(super) async fn apply_operands(
    policy: &ClusterPolicy,
    previous: &ClusterPolicyStatus,
    objects: &[RenderedObject],
    kept: &BTreeSet<String>,
    context: &Context,
    now: &Time,
) -> Result<ApplySummary, ReconcileError> {
    let summary = match context.applier.apply(policy, objects, kept).await {
        Ok(summary) => summary,
        Err(error) => return Err(report_apply_failure(policy, previous, error, context, now).await),
    };
    if summary.applied + summary.pruned > 0 {
        info!(
            applied = summary.applied,
            unchanged = summary.unchanged,
            pruned = summary.pruned,
            "operands applied"
        );
    }
    Ok(summary)
}

/// After a switch from NVIDIA's operator, the OS pool whose driver DaemonSet takes over NVIDIA's in place (see
/// `handover`); none where no driver, a precompiled one per kernel, or NVIDIADriver objects' drivers are rendered. A failure is reported as a
/// failed apply is: no driver DaemonSet may be created beside NVIDIA's while it is unknown which pool takes it.
async fn nvidia_driver_pool(
    policy: &ClusterPolicy,
    previous: &ClusterPolicyStatus,
    validated: &ValidatedPolicy,
    facts: &ClusterFacts,
    context: &Context,
    now: &Time,
) -> Result<Option<OsPool>, ReconcileError> {
    // With NVIDIADriver objects the drivers are theirs, named after each object: none takes NVIDIA's name.
    if !validated.is_enabled(Component::Driver)
        || validated.spec.driver.use_precompiled == Some(true)
        || validated.spec.driver.use_nvidia_driver_crd == Some(true)
    {
        return Ok(None);
    }
    match context.applier.nvidia_driver_pool(policy, facts).await {
        Ok(pool) => Ok(pool),
        Err(error) => Err(report_apply_failure(policy, previous, error, context, now).await),
    }
}

/// Says an apply failure where users look (status and a Warning Event); returns the error to retry with.
async fn report_apply_failure(
    policy: &ClusterPolicy,
    previous: &ClusterPolicyStatus,
    error: ApplyError,
    context: &Context,
    now: &Time,
) -> ReconcileError {
    let message = error.to_string();
    publish(
        policy,
        context,
        EventType::Warning,
        status::reason::RECONCILE_FAILED,
        &message,
    )
    .await;
    let failed = status::failed(previous, &message, policy.meta().generation, now);
    match write_status(policy, previous, failed, context).await {
        Ok(()) => error.into(),
        Err(write) => write,
    }
}

/// What this reconcile made of the policy, for its status.
struct Built<'a> {
    policy: &'a ValidatedPolicy,
    facts: &'a ClusterFacts,
    labelled: &'a [Cow<'a, BTreeMap<String, String>>],
    objects: &'a [RenderedObject],
    summary: &'a ApplySummary,
}

/// status: the policy's status from what was built and what the cluster reports (DaemonSets, GPUNodes,
/// ConfigMaps); the metrics follow it.
async fn compute_status(
    policy: &ClusterPolicy,
    previous: &ClusterPolicyStatus,
    built: &Built<'_>,
    context: &Context,
    now: &Time,
) -> ClusterPolicyStatus {
    let unknown_fields = unknown_fields(policy, context).await;
    let daemonsets = context.daemonsets.state();
    let gpu_nodes = context.gpu_nodes.state();
    let observed = Observed {
        policy: built.policy,
        generation: policy.meta().generation,
        namespace: &context.namespace,
        gpu_node_count: built.facts.gpu_nodes.len(),
        rendered: rendered_daemonsets(built.objects),
        expected_nodes: expected_nodes(built.policy, built.labelled),
        daemonsets: daemonsets
            .iter()
            .map(|d| (d.name_any(), d.as_ref()))
            .collect(),
        gpu_nodes: &gpu_nodes,
        unknown_fields: &unknown_fields,
        configs: configs::config_findings(built.policy, &context.namespace, |name| {
            let key = ObjectRef::new(name).within(&context.namespace);
            context
                .config_maps
                .get(&key)
                .map(|config_map| config_map.as_ref().clone())
        }),
    };
    let mut status = status::compute(&observed, &previous.conditions, now);
    if !built.summary.skipped.is_empty() {
        let exporter = status
            .components
            .iter_mut()
            .find(|c| c.name == Component::DcgmExporter.label_name());
        if let Some(exporter) = exporter {
            // Not a readiness problem: the exporter runs; only its scrape configuration could not be made.
            exporter
                .warnings
                .extend(built.summary.skipped.iter().cloned());
        }
    }
    let ready = status
        .components
        .iter()
        .filter(|c| c.enabled && c.state == "ready")
        .count();
    context.metrics.record_policy_status(
        built.facts.gpu_nodes.len(),
        built.policy.enabled().len(),
        ready,
        SystemTime::now(),
    );
    status
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

/// For each enabled component, how many nodes its deploy label selects.
fn expected_nodes(
    policy: &ValidatedPolicy,
    labelled: &[Cow<'_, BTreeMap<String, String>>],
) -> BTreeMap<Component, usize> {
    policy
        .enabled()
        .into_iter()
        .map(|component| {
            let label = component.deploy_label();
            let count = labelled
                .iter()
                .filter(|labels| labels.get(label).is_some_and(|v| v == "true"))
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

/// On deletion: when no other ClusterPolicy takes over, remove every node label the operator wrote. The
/// operands go with the policy through their owner references.
pub(super) async fn cleanup(
    policy: &ClusterPolicy,
    context: &Context,
) -> Result<Action, ReconcileError> {
    let others = context
        .policies
        .state()
        .iter()
        .any(|p| p.name_any() != policy.name_any() && p.meta().deletion_timestamp.is_none());
    if others {
        info!("another ClusterPolicy remains; it keeps the node labels");
        return Ok(Action::await_change());
    }
    // The operands go first, and the cleanup waits for their pods to stop: a running agent would label its node
    // or write its GPUNode again after they were removed.
    // An error, not a requeue: the finalizer is removed as soon as the cleanup returns Ok.
    let remaining = context.applier.remove_all(policy).await?;
    if remaining > 0 {
        return Err(ReconcileError::OperandsStopping { remaining });
    }
    let api = Api::<Node>::all(context.client.clone());
    for node in context.nodes.state() {
        patch_labels(&api, &node.name_any(), &plan_cleanup(node.labels())).await?;
    }
    info!("node labels removed");
    let gpu_nodes = Api::<GPUNode>::all(context.client.clone());
    gpu_nodes
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .map_err(ReconcileError::GpuNodes)?;
    info!("GPUNodes deleted");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixture::default_images;

    #[test]
    fn expected_nodes_count_true_deploy_labels() {
        let policy = validate(&crd::ClusterPolicySpec::default(), &default_images()).unwrap();
        let label = Component::DevicePlugin.deploy_label();
        let labelled = vec![
            Cow::Owned(BTreeMap::from([(label.to_owned(), "true".to_string())])),
            Cow::Owned(BTreeMap::from([(label.to_owned(), "false".to_string())])),
            Cow::Owned(BTreeMap::new()),
        ];
        assert_eq!(
            expected_nodes(&policy, &labelled)[&Component::DevicePlugin],
            1
        );
    }
}

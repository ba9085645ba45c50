//! The upgrade controller's I/O: the same watch-driven controller as the policy's ([`crate::controller`]), its
//! watches guarded the same way and its failures retried with the same backoff, keyed on the active
//! ClusterPolicy. Each pass reads the watch caches (nodes, the operator's driver and validator DaemonSets, their
//! pods and ControllerRevisions, GPUNodes), lists the pods of the nodes that handle pods, asks
//! [`decide::plan`], and does what it says ([`super::steps`]): cordon, evictions, driver and validator pod
//! deletions, uncordon, then the node's label and annotations in one merge patch; then reports
//! ([`super::report`]). Only the leader runs passes.
//!
//! Driver DaemonSets are found by their labels (`app.kubernetes.io/component=driver`, managed by this operator),
//! whatever made them: the ClusterPolicy's (one per OS pool) and the NVIDIADriver objects'; each is upgraded under
//! the policy that governs it ([`groups`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crd::nvidia_driver::NVIDIADriver;
use crd::{ClusterPolicy, GPUNode};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, predicates, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tracing::{Instrument, debug, info_span, warn};

use super::decide::{self, NodeFacts, PodKey};
use super::facts::{self, OwnedDaemonSet};
use super::groups::{self, Governor, Group};
use super::kept::keep_what_upgrades_read_of_pods;
use super::pods::read_pods;
use super::report::{publish, report};
use super::settings::{Settings, StepTimeouts};
use super::spacing::{PASS_SPACING, Spacing};
use super::steps::carry_out;
use crate::controller::{
    Gate, GateClosed, WatchesBackOffThemselves, active_policy, every_policy, forget_bookkeeping,
    guarded_watcher, retry_delay,
};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::model::Component;
use crate::render::{COMPONENT_LABEL, MANAGED_BY_LABEL, MANAGER};
use crate::shared_watch::{SharedCache, Unsynced};

/// The longest a pass waits for a timeout before it looks again anyway.
const MAX_WAIT: Duration = Duration::from_secs(300);

/// A failed pass of the upgrade controller.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(transparent)]
    Gate(#[from] GateClosed),
    #[error("listing the pods on node {node}: {source}")]
    ListPods { node: String, source: kube::Error },
    #[error("{field}: the API server refused the selector {selector:?}: {source}")]
    Selector {
        field: &'static str,
        selector: String,
        source: kube::Error,
    },
    #[error("writing the driver upgrade state of node {node}: {source}")]
    NodeWrite { node: String, source: kube::Error },
    #[error("writing the driver upgrade status of the ClusterPolicy: {0}")]
    Status(#[source] kube::Error),
}

/// What passes share.
pub struct Context {
    pub(super) client: Client,
    pub(super) namespace: String,
    pub(super) timeouts: StepTimeouts,
    pub(super) policies: Store<ClusterPolicy>,
    pub(super) nodes: Store<Node>,
    pub(super) daemonsets: Store<DaemonSet>,
    pub(super) pods: Store<Pod>,
    pub(super) revisions: Store<ControllerRevision>,
    pub(super) gpu_nodes: Store<GPUNode>,
    /// NVIDIADriver objects, whose own upgrade policies govern their driver DaemonSets.
    pub(super) nvidia_drivers: Store<NVIDIADriver>,
    pub(super) recorder: Recorder,
    pub(super) metrics: Arc<Metrics>,
    pub(super) gate: Gate,
    /// Consecutive failed passes, for the backoff.
    pub(super) failures: Mutex<u32>,
    /// The last refusal of each pod's eviction (a PodDisruptionBudget), shown in the reason while it waits.
    pub(super) refusals: Mutex<BTreeMap<PodKey, String>>,
    /// What each node was last logged waiting for: a wait is logged when it changes, not on every pass.
    pub(super) waiting: Mutex<HashMap<String, String>>,
    /// When the last pass ended: the next starts no sooner than [`PASS_SPACING`] after.
    pub(super) spacing: Spacing,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Labels of the DaemonSets and pods the upgrade reads: the operator's driver and validator.
fn owned_components() -> String {
    format!(
        "{MANAGED_BY_LABEL}={MANAGER},{COMPONENT_LABEL} in ({}, {})",
        Component::Driver.label_name(),
        Component::OperatorValidator.label_name()
    )
}

/// Runs the upgrade controller until the future is dropped: watch caches at once, passes while `leading`. Nodes
/// and GPUNodes come from the watches it shares with the reconciler ([`crate::shared_watch`]), read with
/// [`node_relevance`] and [`process_pods`].
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    namespace: String,
    timeouts: StepTimeouts,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    leading: watch::Receiver<bool>,
    nodes: SharedCache<Node>,
    gpu_nodes: SharedCache<GPUNode>,
) {
    let owned = || watcher::Config::default().labels(&owned_components());
    let (daemonsets, daemonset_writer) = reflector::store();
    let daemonset_events = guarded_watcher(
        Api::<DeserializeGuard<DaemonSet>>::namespaced(client.clone(), &namespace),
        owned(),
        &metrics,
        &health,
    )
    .modify(forget_bookkeeping)
    .reflect(daemonset_writer)
    .applied_objects()
    .predicate_filter(predicates::generation, Default::default());
    let (pods, pod_writer) = reflector::store();
    let pod_events = guarded_watcher(
        Api::<DeserializeGuard<Pod>>::namespaced(client.clone(), &namespace),
        owned(),
        &metrics,
        &health,
    )
    .modify(keep_what_upgrades_read_of_pods)
    .reflect(pod_writer)
    .touched_objects()
    .predicate_filter(pod_relevance, Default::default());
    let (revisions, revision_writer) = reflector::store();
    let revision_events = guarded_watcher(
        Api::<DeserializeGuard<ControllerRevision>>::namespaced(client.clone(), &namespace),
        owned(),
        &metrics,
        &health,
    )
    .modify(|revision: &mut ControllerRevision| {
        forget_bookkeeping(revision);
        // The template itself: only the revision number and hash label are read.
        revision.data =
            k8s_openapi::apimachinery::pkg::runtime::RawExtension(serde_json::Value::Null);
    })
    .reflect(revision_writer)
    .applied_objects();
    let (nvidia_drivers, nvidia_driver_writer) = reflector::store();
    let nvidia_driver_events = guarded_watcher(
        Api::<DeserializeGuard<NVIDIADriver>>::all(client.clone()),
        watcher::Config::default(),
        &metrics,
        &health,
    )
    .modify(forget_bookkeeping)
    .reflect(nvidia_driver_writer)
    .applied_objects()
    .predicate_filter(predicates::generation, Default::default());
    let (policies, policy_writer) = reflector::store();
    let policy_events = guarded_watcher(
        Api::<DeserializeGuard<ClusterPolicy>>::all(client.clone()),
        watcher::Config::default().any_semantic(),
        &metrics,
        &health,
    )
    .reflect(policy_writer)
    .applied_objects()
    .predicate_filter(predicates::generation, Default::default());

    let (synced, caches_synced) = watch::channel(false);
    let shared_listed = futures::future::try_join(nodes.listed(), gpu_nodes.listed());
    let context = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "gpu-operator".into()),
        client,
        namespace,
        timeouts,
        policies: policies.clone(),
        nodes: nodes.store,
        daemonsets,
        pods,
        revisions,
        gpu_nodes: gpu_nodes.store,
        nvidia_drivers,
        metrics,
        gate: Gate::new(caches_synced, leading),
        failures: Mutex::default(),
        refusals: Mutex::default(),
        waiting: Mutex::default(),
        spacing: Spacing::new(PASS_SPACING),
    });
    let caches = context.clone();
    tokio::spawn(async move {
        let ready = async {
            shared_listed.await?;
            caches.daemonsets.wait_until_ready().await?;
            caches.pods.wait_until_ready().await?;
            caches.revisions.wait_until_ready().await?;
            caches.nvidia_drivers.wait_until_ready().await?;
            Ok::<(), Unsynced>(())
        };
        match ready.await {
            Ok(()) => {
                synced.send_replace(true);
            }
            Err(error) => warn!(%error, "the upgrade controller's watch caches stopped"),
        }
    });
    Controller::for_stream(policy_events, policies.clone())
        .trigger_backoff(WatchesBackOffThemselves)
        .watches_shared_stream(nodes.changes, every_policy(policies.clone()))
        .watches_stream(daemonset_events, every_policy(policies.clone()))
        .watches_stream(pod_events, every_policy(policies.clone()))
        .watches_stream(revision_events, every_policy(policies.clone()))
        .watches_shared_stream(gpu_nodes.changes, every_policy(policies.clone()))
        .watches_stream(nvidia_driver_events, every_policy(policies))
        .run(pass, error_policy, context)
        .for_each(|_| async {})
        .await;
}

/// What of a Node wakes a pass: labels (state, skip, pools), the upgrade's annotations, cordon and readiness; not
/// heartbeats.
pub fn node_relevance(node: &Node) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    node.labels().hash(&mut hasher);
    node.annotations()
        .iter()
        .filter(|(key, _)| crd::driver_upgrade::NODE_ANNOTATIONS.contains(&key.as_str()))
        .for_each(|annotation| annotation.hash(&mut hasher));
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .hash(&mut hasher);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone());
    ready.hash(&mut hasher);
    Some(hasher.finish())
}

/// What of a driver or validator pod wakes a pass: where it runs, its revision, readiness and deletion.
fn pod_relevance(pod: &Pod) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    (
        pod.uid(),
        pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        pod.labels().get(facts::REVISION_LABEL),
        pod.metadata.deletion_timestamp.is_some(),
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone()),
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// What of a GPUNode wakes a pass: the pods whose processes use its GPUs (not the upgrade's own status).
pub fn process_pods(gpu_node: &GPUNode) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    if let Some(status) = &gpu_node.status {
        for pod in &status.gpu_process_pods {
            (&pod.uid, &pod.gpus).hash(&mut hasher);
        }
    }
    Some(hasher.finish())
}

async fn pass(policy: Arc<ClusterPolicy>, context: Arc<Context>) -> Result<Requeue, UpgradeError> {
    let span = info_span!("driver_upgrade", clusterpolicy = %policy.name_any());
    async move {
        context.gate.open().await?;
        if policy.meta().deletion_timestamp.is_some()
            || active_policy(&context.policies)
                .is_none_or(|active| active.name_any() != policy.name_any())
        {
            return Ok(Requeue::await_change());
        }
        context.spacing.wait().await;
        let outcome = upgrade(&policy, &context).await;
        context.spacing.ended();
        let requeue = outcome?;
        if let Ok(mut failures) = context.failures.lock() {
            *failures = 0;
        }
        Ok(requeue)
    }
    .instrument(span)
    .await
}

fn error_policy(
    policy: Arc<ClusterPolicy>,
    error: &UpgradeError,
    context: Arc<Context>,
) -> Requeue {
    context.metrics.count_error("driver-upgrade");
    let failures = context.failures.lock().map_or(1, |mut count| {
        *count += 1;
        *count
    });
    let delay = retry_delay(failures);
    warn!(clusterpolicy = %policy.name_any(), %error, retry_in = ?delay, "driver upgrade pass failed");
    Requeue::requeue(delay)
}

/// One pass over every GPU node, a group of nodes at a time (see [`groups`]).
async fn upgrade(policy: &ClusterPolicy, context: &Context) -> Result<Requeue, UpgradeError> {
    let daemonsets = context.daemonsets.state();
    let revisions = context.revisions.state();
    let revision_refs: Vec<&ControllerRevision> = revisions.iter().map(AsRef::as_ref).collect();
    let of = |component: Component| {
        daemonsets
            .iter()
            .filter(move |ds| {
                ds.labels().get(COMPONENT_LABEL).map(String::as_str) == Some(component.label_name())
            })
            .map(AsRef::as_ref)
    };
    let drivers: Vec<OwnedDaemonSet<'_>> = of(Component::Driver)
        .map(|daemonset| OwnedDaemonSet {
            daemonset,
            revision: facts::current_revision(daemonset, &revision_refs),
        })
        .collect();
    if let Some(unknown) = drivers.iter().find(|d| d.revision.is_none()) {
        // The DaemonSet controller writes the revision right after the DaemonSet; its watch event wakes a pass.
        debug!(daemonset = %unknown.daemonset.name_any(), "waiting for the driver DaemonSet's first revision");
        return Ok(Requeue::await_change());
    }
    let validators: Vec<&DaemonSet> = of(Component::OperatorValidator).collect();
    let pods = context.pods.state();
    // By node, built on the first node a pass reads: each node's facts read only its own driver and validator pods
    // (at 1000 nodes a thousandth of them), and a pass with no node to read (the driver disabled, say) reads none.
    let pods_by_node = OnceLock::new();
    let pods_on = |node: &str| -> &[&Pod] {
        let by_node: &HashMap<&str, Vec<&Pod>> = pods_by_node.get_or_init(|| {
            let mut by_node: HashMap<&str, Vec<&Pod>> = HashMap::new();
            for pod in &pods {
                if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                    by_node.entry(node).or_default().push(pod.as_ref());
                }
            }
            by_node
        });
        by_node.get(node).map_or(&[][..], Vec::as_slice)
    };
    let nodes = context.nodes.state();
    // A node whose driver DaemonSet is gone keeps its state label; the ClusterPolicy's group looks after it.
    let labelled_without_driver: BTreeSet<&str> = nodes
        .iter()
        .filter(|node| node.labels().contains_key(crd::driver_upgrade::STATE_LABEL))
        .filter(|node| !drivers.iter().any(|d| facts::selects(d.daemonset, node)))
        .map(|node| name_of(node))
        .collect();
    let objects = context.nvidia_drivers.state();
    let groups = groups::group(
        policy.spec.driver.upgrade_policy.as_ref(),
        drivers,
        &objects,
    );
    let now = Timestamp::now();
    let mut plan = decide::Plan::default();
    let mut all_facts = Vec::new();
    let mut auto_upgrade = false;
    for group in groups {
        let Some(settings) = group_settings(policy, &group, context).await else {
            continue;
        };
        auto_upgrade |= settings.auto_upgrade;
        // The group's nodes: those its drivers run on, and for the ClusterPolicy's group the labelled nodes no
        // driver runs on any more. Chosen before their facts are read, so that a pass costs what it upgrades.
        let ours = |node: &&Arc<Node>| {
            group
                .drivers
                .iter()
                .any(|driver| facts::selects(driver.daemonset, node))
                || (group.governor == Governor::ClusterPolicy
                    && labelled_without_driver.contains(name_of(node)))
        };
        let mut facts: Vec<NodeFacts> = nodes
            .iter()
            .filter(ours)
            .map(|node| {
                let on_node = pods_on(name_of(node));
                facts::node_facts(node, &group.drivers, &validators, on_node)
            })
            .collect();
        for node in facts
            .iter_mut()
            .filter(|node| decide::handles_pods(node.state()) && !node.skip)
        {
            node.pods = read_pods(node, &settings, context).await?;
        }
        let group_plan = decide::plan(&settings, &facts, now);
        for step in &group_plan.steps {
            let node = nodes.iter().find(|node| name_of(node) == step.node);
            if let Some(node) = node {
                carry_out(step, node, context).await?;
            }
        }
        plan.merge(group_plan);
        all_facts.extend(facts);
    }
    report(policy, auto_upgrade, &all_facts, &plan, context).await?;
    Ok(match plan.wake_at {
        Some(at) => {
            let wait = Duration::try_from(at.duration_since(now)).unwrap_or_default();
            Requeue::requeue(wait.clamp(Duration::from_millis(200), MAX_WAIT))
        }
        None => Requeue::await_change(),
    })
}

/// A cached node's name, borrowed (a pass reads every node's).
fn name_of(node: &Node) -> &str {
    node.meta().name.as_deref().unwrap_or_default()
}

/// The settings of a group's upgrade policy; `None`, with a Warning Event on the object that holds the policy,
/// when they cannot be used: that group's upgrades stop until the policy is fixed, the others go on.
async fn group_settings(
    policy: &ClusterPolicy,
    group: &Group<'_>,
    context: &Context,
) -> Option<Settings> {
    let error = match Settings::from_spec(group.spec.as_ref(), context.timeouts) {
        Ok(settings) => return Some(settings),
        Err(error) => error,
    };
    let object = match &group.governor {
        Governor::ClusterPolicy => policy.object_ref(&()),
        Governor::NvidiaDriver(name) => {
            let object = context.nvidia_drivers.get(&ObjectRef::new(name))?;
            object.object_ref(&())
        }
    };
    warn!(%error, governor = ?group.governor, "driver upgrades stopped: the upgrade policy cannot be used");
    publish(
        context,
        &object,
        EventType::Warning,
        "UpgradePolicyInvalid",
        &error.to_string(),
    )
    .await;
    None
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;

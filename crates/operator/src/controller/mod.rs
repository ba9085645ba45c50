//! The ClusterPolicy controller: observe -> validate -> label -> render -> apply -> status, driven by watches
//! (no polling). It watches ClusterPolicies, the DaemonSets and Services it owns, Nodes (only changes that
//! matter for GPU deployment), GPUNodes, NVIDIADrivers and the ConfigMaps in its namespace.

mod gate;
mod guarded;
mod labels_in_flight;
mod nvidia_drivers;
mod reconcile;
#[cfg(test)]
mod step_tests;
mod writes;

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crd::nvidia_driver::NVIDIADriver;
use crd::{ClusterPolicy, GPUNode};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, predicates, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

use crate::apply::{Applier, ApplyError, MANAGED_BY_SELECTOR};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::model::DefaultImages;
use crate::shared_watch::{SharedCache, Unlisted, Unsynced};
pub(crate) use gate::{Gate, GateClosed, publish_event};
pub(crate) use guarded::{WatchesBackOffThemselves, watcher as guarded_watcher};
pub(crate) use reconcile::active_policy;
use reconcile::{cleanup, reconcile_policy};

/// Finalizer that lets the operator remove its operands, the node labels they and it wrote, and the GPUNodes when
/// its ClusterPolicy is deleted.
pub const FINALIZER: &str = "nvidia.com/gpu-operator-cleanup";

/// How often a deleted policy's cleanup looks again whether its operands' pods have stopped: terminating pods
/// change no object the controller watches until their DaemonSet is gone.
const OPERANDS_STOPPING_POLL: Duration = Duration::from_secs(2);

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
    pub nvidia_drivers: Store<NVIDIADriver>,
    pub applier: Applier,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    failures: Mutex<HashMap<String, u32>>,
    /// Unknown spec fields per policy, with the generation they were found in: the stored spec is read once
    /// per change, not once per reconcile.
    unknown_fields: Mutex<HashMap<String, (i64, Vec<String>)>>,
    /// Open once every watch cache holds its first full list (see [`sync_caches`]) and while this replica holds the
    /// leader lease: every replica keeps its caches, only the leader reconciles.
    gate: Gate,
    /// What the probes report: caches synced, the reconcile in flight, failing watches.
    pub health: Arc<Health>,
    /// Node labels written that the Node cache may not show yet, so that they are not written again.
    labels_in_flight: labels_in_flight::LabelsInFlight,
}

/// Waits until every cache a reconcile reads holds its first full list. A reconcile on a half-filled Node
/// cache would find no OS pools or container runtimes, render no per-pool DaemonSets (driver per OS, toolkit
/// per runtime) and prune the ones that run: a restarted operator would take the drivers away. The
/// ClusterPolicy cache is not awaited here: the controller holds reconciles until that one is filled itself.
///
/// Only this one task waits on the stores: a store's readiness wakes a single waiter, so reconciles wait on
/// the `synced` channel this task sets instead.
async fn sync_caches(
    context: Arc<Context>,
    synced: watch::Sender<bool>,
    shared_listed: impl Future<Output = Result<((), ()), Unlisted>>,
) -> Result<(), Unsynced> {
    shared_listed.await?;
    context.config_maps.wait_until_ready().await?;
    // Without it a reconcile would find no NVIDIADriver, render none of their drivers and prune the running ones.
    context.nvidia_drivers.wait_until_ready().await?;
    // The DaemonSet and Service caches, which `context.daemonsets` shares.
    context.applier.caches_synced().await?;
    synced.send_replace(true);
    context.health.set_caches_synced();
    Ok(())
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
    Apply(Box<ApplyError>),
    #[error("labelling node {node}: {source}")]
    Label { node: String, source: kube::Error },
    #[error("writing the ClusterPolicy status: {0}")]
    Status(#[source] kube::Error),
    /// Not a failure: the cleanup of a deleted policy waits for its operands' pods to stop.
    #[error(
        "{remaining} operand objects are still being deleted; the node labels and GPUNodes go once they are gone"
    )]
    OperandsStopping { remaining: usize },
    #[error("deleting the GPUNodes: {0}")]
    GpuNodes(#[source] kube::Error),
    #[error("writing the status of NVIDIADriver {name}: {source}")]
    NvidiaDriverStatus { name: String, source: kube::Error },
    #[error("finalizer: {0}")]
    Finalizer(String),
    #[error(transparent)]
    Gate(#[from] GateClosed),
}

/// Boxed: an apply error carries a whole API status, and every reconcile result would pay for its size.
impl From<ApplyError> for ReconcileError {
    fn from(error: ApplyError) -> Self {
        Self::Apply(Box::new(error))
    }
}

impl ReconcileError {
    fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Apply(_) => "apply",
            ReconcileError::Label { .. } => "label",
            ReconcileError::Status(_) => "status",
            ReconcileError::OperandsStopping { .. } => "operands-stopping",
            ReconcileError::GpuNodes(_) => "gpunodes",
            ReconcileError::NvidiaDriverStatus { .. } => "nvidiadriver-status",
            ReconcileError::Finalizer(_) => "finalizer",
            ReconcileError::Gate(closed) => closed.reason(),
        }
    }
}

/// Runs the controller until the future is dropped: the watch caches at once, reconciles while `leading` is true.
/// Nodes and GPUNodes come from the watches it shares with the driver upgrade controller
/// ([`crate::shared_watch`]), read with [`node_relevance`] and [`kept_gpu_node_status`].
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    namespace: String,
    defaults: DefaultImages,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    leading: watch::Receiver<bool>,
    nodes: SharedCache<Node>,
    gpu_nodes: SharedCache<GPUNode>,
) {
    let owned = || watcher::Config::default().labels(MANAGED_BY_SELECTOR);
    let (daemonsets, daemonset_writer) = reflector::store();
    let daemonset_events = guarded::watcher(
        Api::<DeserializeGuard<DaemonSet>>::namespaced(client.clone(), &namespace),
        owned(),
        &metrics,
        &health,
    )
    .modify(keep_field_managers)
    .reflect(daemonset_writer)
    .applied_objects()
    .predicate_filter(rollout_progress, Default::default());
    let (services, service_writer) = reflector::store();
    let service_events = guarded::watcher(
        Api::<DeserializeGuard<Service>>::namespaced(client.clone(), &namespace),
        owned(),
        &metrics,
        &health,
    )
    .reflect(service_writer)
    .applied_objects();
    let (config_maps, config_map_writer) = reflector::store();
    let config_map_events = guarded::watcher(
        Api::<DeserializeGuard<ConfigMap>>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
        &metrics,
        &health,
    )
    .modify(forget_bookkeeping)
    .reflect(config_map_writer)
    .applied_objects()
    .predicate_filter(predicates::resource_version, Default::default());

    let (nvidia_drivers, nvidia_driver_writer) = reflector::store();
    let nvidia_driver_events = guarded::watcher(
        Api::<DeserializeGuard<NVIDIADriver>>::all(client.clone()),
        watcher::Config::default(),
        &metrics,
        &health,
    )
    .modify(forget_bookkeeping)
    .reflect(nvidia_driver_writer)
    .applied_objects()
    .predicate_filter(spec_and_deletion, Default::default());

    let (policies, policy_writer) = reflector::store();
    let policy_events = guarded::watcher(
        Api::<DeserializeGuard<ClusterPolicy>>::all(client.clone()),
        watcher::Config::default().any_semantic(),
        &metrics,
        &health,
    )
    .reflect(policy_writer)
    .applied_objects()
    .predicate_filter(spec_and_lifecycle, Default::default());
    // A policy created, changed or deleted can change which one is active: every policy looks again.
    let any_policy_events = guarded::watcher(
        Api::<DeserializeGuard<ClusterPolicy>>::all(client.clone()),
        watcher::Config::default(),
        &metrics,
        &health,
    )
    .touched_objects()
    .predicate_filter(spec_and_lifecycle, Default::default());
    let controller = Controller::for_stream(policy_events, policies.clone())
        .trigger_backoff(guarded::WatchesBackOffThemselves);
    let (synced, caches_synced) = watch::channel(false);
    let shared_listed = futures::future::try_join(nodes.listed(), gpu_nodes.listed());
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
        nodes: nodes.store,
        gpu_nodes: gpu_nodes.store,
        daemonsets,
        config_maps,
        nvidia_drivers,
        metrics,
        failures: Mutex::default(),
        unknown_fields: Mutex::default(),
        gate: Gate::new(caches_synced, leading),
        health,
        labels_in_flight: labels_in_flight::LabelsInFlight::default(),
    });
    let caches_context = context.clone();
    tokio::spawn(async move {
        if let Err(error) = sync_caches(caches_context, synced, shared_listed).await {
            warn!(%error, "the watch caches stopped before their first list");
        }
    });
    controller
        .watches_stream(daemonset_events, owning_policy)
        .watches_stream(service_events, owning_policy)
        .watches_shared_stream(nodes.changes, every_policy(policies.clone()))
        .watches_shared_stream(gpu_nodes.changes, every_policy(policies.clone()))
        .watches_stream(config_map_events, every_policy(policies.clone()))
        .watches_stream(nvidia_driver_events, every_policy(policies.clone()))
        .watches_stream(any_policy_events, every_policy(policies))
        .run(reconcile, error_policy, context)
        // Failures are logged once, with their retry delay, by `error_policy`.
        .for_each(|_| async {})
        .await;
}

/// What of a GPUNode wakes the controller: its MIG state and last error, what reconciles read. An agent's write of
/// anything else (health, the GPU inventory, the pods using its GPUs) or the driver upgrade's state cannot change
/// what a reconcile computes.
pub fn kept_gpu_node_status(gpu_node: &GPUNode) -> Option<u64> {
    let status = gpu_node.status.as_ref();
    let read = (
        status.map(|status| &status.mig),
        status.map(|status| &status.last_error),
    );
    let mut hasher = DefaultHasher::new();
    serde_json::to_string(&read).ok()?.hash(&mut hasher);
    Some(hasher.finish())
}

/// What the DaemonSet cache keeps of the managed fields: who wrote each DaemonSet and how (whether this
/// operator's apply has, see `handover`), not the fields.
fn keep_field_managers(daemonset: &mut DaemonSet) {
    for entry in daemonset.metadata.managed_fields.iter_mut().flatten() {
        entry.fields_v1 = None;
    }
}

/// Drops what the watch caches hold but no reconcile reads: the managed fields (server-side apply's bookkeeping,
/// about half of a Node's size), so that the caches of a 1000-node cluster stay small.
pub(crate) fn forget_bookkeeping<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// The ClusterPolicy that owns an operand object. Not `owns_stream`: it keys the owner with the child's
/// namespace, which for a cluster-scoped owner is a second key for the same ClusterPolicy, and two reconciles
/// of one policy could then run at once.
fn owning_policy<K: Resource>(object: K) -> Option<ObjectRef<ClusterPolicy>> {
    object
        .owner_references()
        .iter()
        .find_map(|owner| ObjectRef::from_owner_ref(None, owner, ()))
}

/// Maps any watched object to every ClusterPolicy: there is one active policy, and the others short-circuit.
pub(crate) fn every_policy<K>(
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
/// (status updates every few seconds on every node) do not, nor do the driver upgrade's state labels, which the
/// upgrade controller writes several times per node during an upgrade and which decide nothing here.
pub fn node_relevance(node: &Node) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    node.labels()
        .iter()
        .filter(|(key, _)| {
            key.as_str() != crd::driver_upgrade::STATE_LABEL
                && key.as_str() != crd::driver_upgrade::SKIP_LABEL
        })
        .for_each(|label| label.hash(&mut hasher));
    let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
    info.map(|i| (&i.container_runtime_version, &i.kubelet_version))
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// What of a ClusterPolicy a reconcile reacts to: its spec (generation), its deletion and its finalizers (the
/// finalizer helper waits for the event of the one it adds). Not its status: each status write would wake the
/// controller again, and during a rollout every such reconcile found new counts to write, a loop that kept a core
/// busy until the rollout ended.
fn spec_and_lifecycle(policy: &ClusterPolicy) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    (
        policy.metadata.generation,
        policy.metadata.deletion_timestamp.is_some(),
        policy.finalizers(),
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// What of an NVIDIADriver a reconcile reacts to: its spec (generation) and its deletion. Not its status, which
/// the reconcile itself writes.
fn spec_and_deletion(object: &NVIDIADriver) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    (
        object.metadata.generation,
        object.metadata.deletion_timestamp.is_some(),
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// Progress steps a DaemonSet rollout reports in: at 1000 nodes its status changes thousands of times, and a
/// reconcile for each kept a core busy and slowed the very rollout it reported on.
const ROLLOUT_STEPS: i32 = 20;

/// What of a DaemonSet a reconcile reacts to: its spec (generation), whether the controller has seen it, how many
/// nodes it wants, whether it is rolled out, and its ready pods in [`ROLLOUT_STEPS`] steps.
fn rollout_progress(daemonset: &DaemonSet) -> Option<u64> {
    let status = daemonset.status.clone().unwrap_or_default();
    let desired = status.desired_number_scheduled;
    let updated = status.updated_number_scheduled.unwrap_or(0);
    let available = status.number_available.unwrap_or(0);
    // Ready pods (available and updated) only grow during a rollout; available alone dips by one and recovers with
    // every pod a rolling update replaces, and would wake the controller each time.
    let ready_step = available.min(updated) * ROLLOUT_STEPS / desired.max(1);
    let mut hasher = DefaultHasher::new();
    (
        daemonset.metadata.generation,
        status.observed_generation,
        desired,
        updated == desired && available == desired,
        ready_step,
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

async fn reconcile(
    policy: Arc<ClusterPolicy>,
    context: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let span = info_span!("reconcile", clusterpolicy = %policy.name_any());
    async move {
        context.gate.open().await?;
        let _in_flight = context.health.reconciling();
        let started = Instant::now();
        let api = Api::<ClusterPolicy>::all(context.client.clone());
        let Some(policy) = with_current_finalizers(&api, policy).await? else {
            return Ok(Action::await_change());
        };
        let result = finalizer(&api, FINALIZER, policy, |event| async {
            match event {
                FinalizerEvent::Apply(policy) => reconcile_policy(&policy, &context).await,
                FinalizerEvent::Cleanup(policy) => cleanup(&policy, &context).await,
            }
        })
        .await
        .or_else(|error| match error {
            kube::runtime::finalizer::Error::ApplyFailed(error)
            | kube::runtime::finalizer::Error::CleanupFailed(error) => Err(error),
            // The policy is gone already: an earlier reconcile finished its cleanup.
            kube::runtime::finalizer::Error::RemoveFinalizer(kube::Error::Api(status))
                if status.code == 404 =>
            {
                Ok(Action::await_change())
            }
            other => Err(ReconcileError::Finalizer(other.to_string())),
        });
        context.metrics.observe_reconcile(started.elapsed());
        result
    }
    .instrument(span)
    .await
}

/// The policy with its finalizers as the API server has them, read again when the cached copy lacks the operator's.
/// The finalizer helper adds it with a JSON patch that first tests the list is still as cached; the write that
/// added it reaches the cache a moment later, and a reconcile woken by another watch in between would test a stale
/// list, which the API server refuses with `422 Invalid`. `None`: the policy is gone.
async fn with_current_finalizers(
    api: &Api<ClusterPolicy>,
    policy: Arc<ClusterPolicy>,
) -> Result<Option<Arc<ClusterPolicy>>, ReconcileError> {
    if policy.finalizers().iter().any(|f| f == FINALIZER)
        || policy.meta().deletion_timestamp.is_some()
    {
        return Ok(Some(policy));
    }
    let current = api.get_opt(&policy.name_any()).await.map_err(|error| {
        ReconcileError::Finalizer(format!("reading the ClusterPolicy: {error}"))
    })?;
    Ok(current.map(Arc::new))
}

/// The wait before retrying after `failures` consecutive failures: 2 s doubling to 5 min. Every controller of
/// the operator retries with it.
pub(crate) fn retry_delay(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.min(9)).min(MAX_BACKOFF)
}

/// Retries failing reconciles with exponential backoff ([`retry_delay`]), per ClusterPolicy.
fn error_policy(
    policy: Arc<ClusterPolicy>,
    error: &ReconcileError,
    context: Arc<Context>,
) -> Action {
    if let ReconcileError::OperandsStopping { remaining } = error {
        info!(clusterpolicy = %policy.name_any(), remaining, "waiting for the operands to stop");
        return Action::requeue(OPERANDS_STOPPING_POLL);
    }
    context.metrics.count_error(error.reason());
    let failures = context.failures.lock().map_or(1, |mut map| {
        let count = map.entry(policy.name_any()).or_insert(0);
        *count += 1;
        *count
    });
    let delay = retry_delay(failures);
    warn!(clusterpolicy = %policy.name_any(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn an_operand_wakes_its_policy_under_the_policy_s_own_key() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let owned_by = |api_version: &str, kind: &str| DaemonSet {
            metadata: ObjectMeta {
                name: Some("nvidia-device-plugin-daemonset".into()),
                namespace: Some("gpu-operator".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    name: "cluster-policy".into(),
                    uid: "1".into(),
                    controller: Some(true),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            ..DaemonSet::default()
        };
        // The same key the ClusterPolicy's own events use: no namespace.
        assert_eq!(
            owning_policy(owned_by("nvidia.com/v1", "ClusterPolicy")),
            Some(ObjectRef::new("cluster-policy"))
        );
        assert_eq!(owning_policy(owned_by("apps/v1", "ReplicaSet")), None);
    }

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
        let labelled = node_relevance(&node);
        node.metadata.labels.as_mut().unwrap().insert(
            crd::driver_upgrade::STATE_LABEL.into(),
            "cordon-required".into(),
        );
        assert_eq!(
            node_relevance(&node),
            labelled,
            "the driver upgrade's states are the upgrade controller's"
        );
    }

    #[test]
    fn a_rollout_wakes_the_controller_in_steps_and_when_it_completes() {
        use k8s_openapi::api::apps::v1::DaemonSetStatus;
        let daemonset = |generation, observed, updated, available| DaemonSet {
            metadata: ObjectMeta {
                generation: Some(generation),
                ..ObjectMeta::default()
            },
            status: Some(DaemonSetStatus {
                desired_number_scheduled: 1000,
                observed_generation: Some(observed),
                updated_number_scheduled: Some(updated),
                number_available: Some(available),
                ..DaemonSetStatus::default()
            }),
            ..DaemonSet::default()
        };
        let key = |ds: DaemonSet| rollout_progress(&ds);
        assert_eq!(
            key(daemonset(2, 2, 1000, 500)),
            key(daemonset(2, 2, 1000, 549)),
            "within one 5 % step"
        );
        assert_ne!(
            key(daemonset(2, 2, 1000, 549)),
            key(daemonset(2, 2, 1000, 550))
        );
        assert_ne!(
            key(daemonset(2, 2, 1000, 999)),
            key(daemonset(2, 2, 1000, 1000)),
            "rolled out"
        );
        assert_ne!(key(daemonset(2, 1, 0, 0)), key(daemonset(2, 2, 0, 0)));
        assert_ne!(key(daemonset(3, 2, 0, 0)), key(daemonset(2, 2, 0, 0)));
    }

    #[test]
    fn a_status_write_does_not_wake_the_controller_but_spec_deletion_and_finalizers_do() {
        let mut policy = ClusterPolicy::new("cluster-policy", crd::ClusterPolicySpec::default());
        policy.metadata.generation = Some(1);
        let before = spec_and_lifecycle(&policy);
        policy.status = Some(crd::cluster_policy::ClusterPolicyStatus::default());
        policy.metadata.resource_version = Some("42".into());
        assert_eq!(spec_and_lifecycle(&policy), before, "status only");

        let mut changed = policy.clone();
        changed.metadata.generation = Some(2);
        assert_ne!(spec_and_lifecycle(&changed), before);
        let mut finalized = policy.clone();
        finalized.metadata.finalizers = Some(vec![FINALIZER.into()]);
        assert_ne!(spec_and_lifecycle(&finalized), before);
        let mut deleted = policy;
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_ne!(spec_and_lifecycle(&deleted), before);
    }

    #[test]
    fn only_the_kept_gpu_node_status_wakes_the_controller() {
        use crate::shared_watch::keep_what_controllers_read_of_gpu_nodes;
        use crd::gpu_node::{GpuNodeSpec, GpuNodeStatus, NodeError};
        let mut gpu_node = GPUNode::new("n", GpuNodeSpec {});
        gpu_node.status = Some(GpuNodeStatus {
            gpu_count: 4,
            ..GpuNodeStatus::default()
        });
        keep_what_controllers_read_of_gpu_nodes(&mut gpu_node);
        let before = kept_gpu_node_status(&gpu_node);

        let mut inventory = gpu_node.clone();
        inventory.status = Some(GpuNodeStatus {
            gpu_count: 8,
            ..GpuNodeStatus::default()
        });
        keep_what_controllers_read_of_gpu_nodes(&mut inventory);
        assert_eq!(kept_gpu_node_status(&inventory), before, "inventory only");
        let mut upgraded = gpu_node.clone();
        upgraded.status.as_mut().unwrap().driver_upgrade =
            Some(crd::driver_upgrade::NodeUpgradeStatus::default());
        assert_eq!(
            kept_gpu_node_status(&upgraded),
            before,
            "the driver upgrade's state (cached for the upgrade controller) does not wake this one"
        );

        let mut failed = gpu_node;
        failed.status.as_mut().unwrap().last_error = Some(NodeError {
            message: "MIG config all-1g.5gb is invalid".into(),
            ..NodeError::default()
        });
        assert_ne!(kept_gpu_node_status(&failed), before);
    }
}

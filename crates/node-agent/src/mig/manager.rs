//! The MIG manager's runner: one reconcile per observed change of the Node or the ConfigMap. It reads the GPUs,
//! lets [`observe`](super::observe) decide, and carries the decision out: a change runs the
//! [`steps`](super::steps) in the order [`state`](super::state) gives, and every way out of it (success, failure,
//! reboot) restores the GPU clients and reports through the state label, GPUNode status and Events
//! ([`report`](super::report)).

use std::time::Duration;

use crd::gpu_node::{GpuMigGeometry, GpuNodeStatus};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use tracing::{info, instrument, warn};

use super::assess::GpuChange;
use super::clients::{Progress, rebooting, restore};
use super::drain::{DrainError, NodePods};
use super::gpus::{ChangeError, Mismatch, Target};
use super::observe::{ConfigSource, Rejection, observe};
use super::reboot::{Init, RebootError, reboot};
use super::report::{MigEvent, Reporter};
use crd::gpu_node::MigState;

use super::state::{Context, Decision, Failure, Next, Request, Step, next};
use node_runtime::backend::Gpus;
use node_runtime::gpunode::GpuNodeWriter;
use node_runtime::inventory::{self, GpuView};
use node_runtime::kube_io::{KubeError, NodeApi, NodeEvents, Watched};

#[cfg(test)]
mod tests;

/// How the role is configured.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The operator's namespace (the ConfigMap's and the GPU clients').
    pub namespace: String,
    /// The ConfigMap holding `config.yaml`.
    pub config_map: String,
    /// The config for nodes without the label.
    pub default_config: Option<String>,
    /// Whether the node may be rebooted.
    pub with_reboot: bool,
    /// How long the GPU clients get to leave.
    pub clients_timeout: Duration,
    /// How long evictions are retried.
    pub eviction_timeout: Duration,
    /// The DRA driver's GPUs and those it serves as MIG on demand, whose instances are its own (node labels
    /// override them).
    pub dra: crd::dra::Partition,
}

/// The I/O handles the manager works through.
#[derive(Debug)]
pub struct Parts {
    /// This node.
    pub node: NodeApi,
    /// Its GPUs.
    pub gpus: Gpus,
    /// Its GPUNode status, under the MIG manager's field manager.
    pub status: GpuNodeWriter,
    /// Events on the Node.
    pub events: NodeEvents,
    /// Its pods.
    pub pods: NodePods,
}

/// Why a reconcile could not run (it is retried); a MIG change that fails is not this, it ends in state `failed`.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A Kubernetes call failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// The GPUs could not be read.
    #[error("reading the GPUs: {0}")]
    Gpu(#[from] gpu::GpuError),
    /// The simulated reboot failed; the next reconcile resumes the change and reboots again.
    #[error(transparent)]
    Reboot(RebootError),
}

/// Why a step of a change failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// Setting the state to pending and pausing the GPU clients.
    #[error("setting the state to pending and pausing the GPU clients: {0}")]
    Pause(#[source] KubeError),
    /// The GPU clients or the workloads on the disturbed GPUs did not leave.
    #[error(transparent)]
    Drain(#[from] DrainError),
    /// Changing or reading back the GPUs.
    #[error(transparent)]
    Gpus(#[from] ChangeError),
    /// The GPUs read back differ from the config.
    #[error("the GPUs differ from the config after applying it: {}", list(.0))]
    Differs(Vec<Mismatch>),
}

impl From<gpu::GpuError> for StepError {
    fn from(error: gpu::GpuError) -> Self {
        Self::Gpus(ChangeError::Backend(error))
    }
}

/// The mismatches, one after another.
fn list(mismatches: &[Mismatch]) -> String {
    let found: Vec<String> = mismatches.iter().map(ToString::to_string).collect();
    found.join("; ")
}

/// Why a request ended in state `failed`: GPUNode `lastError` and the Warning Event say this.
#[derive(Debug, thiserror::Error)]
pub enum ChangeFailed {
    /// The request cannot be applied; nothing was touched.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// A step of the change failed, or the change needs a reboot it cannot have.
    #[error(transparent)]
    Change(#[from] Failure<StepError>),
    /// The reboot command failed.
    #[error(transparent)]
    Reboot(#[from] RebootError),
    /// The change failed and the GPUs could not be put back either.
    #[error("{failure}; restoring the previous geometry failed too: {roll_back}")]
    NotRolledBack {
        /// Why the change failed.
        failure: Box<ChangeFailed>,
        /// Why the previous geometry could not be restored.
        roll_back: ChangeError,
    },
}

/// The MIG manager of one node.
#[derive(Debug)]
pub struct MigManager {
    pub(super) node: NodeApi,
    pub(super) gpus: Gpus,
    pub(super) pods: NodePods,
    pub(super) settings: Settings,
    pub(super) report: Reporter,
    /// The request that failed last; not retried until the label or the config file changes.
    failed: Option<Request>,
}

/// A change being carried out.
pub(super) struct Run<'a> {
    pub(super) request: &'a Request,
    pub(super) changes: &'a [GpuChange],
    /// The geometry before the change, for the record.
    pub(super) previous: Vec<GpuMigGeometry>,
    /// The record on the Node: what to restore, reboots done.
    pub(super) record: Option<Progress>,
}

impl Run<'_> {
    /// The record, or a fresh one when pausing never got as far as writing it.
    fn take_record(&mut self) -> Progress {
        self.record
            .take()
            .unwrap_or_else(|| Progress::new(&self.request.config, self.previous.clone()))
    }
}

impl MigManager {
    /// A manager that continues from `stored` status (its state and when it last changed, its last error).
    #[must_use]
    pub fn new(parts: Parts, settings: Settings, stored: Option<&GpuNodeStatus>) -> Self {
        Self {
            node: parts.node,
            gpus: parts.gpus,
            pods: parts.pods,
            settings,
            report: Reporter::new(parts.status, parts.events, stored),
            failed: None,
        }
    }

    /// One pass over the latest Node and ConfigMap.
    ///
    /// # Errors
    /// When the GPUs or the API cannot be reached; the caller retries.
    #[instrument(skip_all, fields(node = %self.node.name(), config))]
    pub async fn reconcile(&mut self, watched: &Watched) -> Result<(), ReconcileError> {
        self.report.views = self.read_gpus().await?;
        let source = ConfigSource {
            namespace: self.settings.namespace.clone(),
            config_map: self.settings.config_map.clone(),
        };
        let observed = observe(
            watched,
            &source,
            self.settings.default_config.as_deref(),
            &self.settings.dra,
            &self.report.views,
            self.failed.as_ref(),
        );
        tracing::Span::current().record("config", observed.config.as_deref().unwrap_or("-"));
        self.report.desired = observed.desired();
        self.report.config = observed.config;
        match (observed.decision, observed.request, observed.changes) {
            (Decision::Change, Some(request), Ok(changes)) => {
                let run = Run {
                    request: &request,
                    changes: &changes,
                    previous: inventory::geometries(&self.report.views),
                    record: observed.progress,
                };
                self.change(run).await
            }
            (Decision::Reject, request, Err(rejection)) => {
                // A change left underway (the agent crashed) may have touched GPUs: put them back.
                let roll_back = observed.progress.is_some();
                self.fail(rejection.into(), request, observed.progress, roll_back)
                    .await
            }
            (Decision::Converged, _, _) => {
                self.succeed(observed.progress, Some(&watched.node)).await
            }
            (Decision::Idle, _, _) => {
                self.report.clear_state();
                self.finish(observed.progress.as_ref(), None, Some(&watched.node))
                    .await?;
                self.publish().await
            }
            _ => self.publish().await,
        }
    }

    pub(super) async fn read_gpus(&self) -> Result<Vec<GpuView>, gpu::GpuError> {
        self.gpus.run(|gpus| inventory::read(gpus.backend())).await
    }

    /// Carries out a change, step by step, to success or failure.
    async fn change(&mut self, mut run: Run<'_>) -> Result<(), ReconcileError> {
        let started = std::time::Instant::now();
        let targets: Vec<Target> = run
            .changes
            .iter()
            .filter(|change| !change.is_noop())
            .map(Target::from)
            .collect();
        let context = Context {
            disrupts: run.changes.iter().any(GpuChange::disrupts),
            with_reboot: self.settings.with_reboot,
            reboots: run.record.as_ref().map_or(0, |record| record.reboots),
        };
        info!(
            gpus = ?targets.iter().map(|target| target.gpu).collect::<Vec<_>>(),
            disrupts = context.disrupts,
            resumed = run.record.is_some(),
            "applying MIG config"
        );
        let mut step = Step::Pause;
        let mut outcome = self.step(step, &mut run, &targets).await;
        loop {
            match next(step, outcome, context) {
                Next::Run(following) => {
                    step = following;
                    outcome = self.step(step, &mut run, &targets).await;
                }
                Next::Reboot => {
                    let record = run.take_record();
                    return self.reboot(run.request, record).await;
                }
                Next::Succeed => {
                    info!(elapsed = ?started.elapsed(), "MIG config applied");
                    return self.succeed(Some(run.take_record()), None).await;
                }
                Next::Fail { reason, roll_back } => {
                    let record = run.take_record();
                    return self
                        .fail(
                            reason.into(),
                            Some(run.request.clone()),
                            Some(record),
                            roll_back,
                        )
                        .await;
                }
            }
        }
    }

    /// Records `rebooting` and reboots; a failed reboot command fails the change (the GPUs go back).
    async fn reboot(
        &mut self,
        request: &Request,
        mut record: Progress,
    ) -> Result<(), ReconcileError> {
        self.node.patch(&rebooting(&mut record)).await?;
        self.report.set_state(MigState::Rebooting);
        self.publish().await?;
        self.report
            .event(
                MigEvent::Rebooting,
                "rebooting the node so that a MIG mode change takes effect",
            )
            .await;
        match reboot(&self.gpus, &Init::host_systemd()).await {
            Ok(()) => Ok(()),
            Err(error @ RebootError::Simulated(_)) => Err(ReconcileError::Reboot(error)),
            Err(error) => {
                self.fail(error.into(), Some(request.clone()), Some(record), true)
                    .await
            }
        }
    }

    /// Ends a change (or finds the GPUs right): clients restored, state `success`.
    async fn succeed(
        &mut self,
        progress: Option<Progress>,
        seen: Option<&Node>,
    ) -> Result<(), ReconcileError> {
        self.report.set_state(MigState::Success);
        self.report.set_error(None);
        self.failed = None;
        self.finish(progress.as_ref(), Some(MigState::Success), seen)
            .await?;
        if let Some(progress) = progress {
            self.report
                .event(
                    MigEvent::Applied,
                    &format!("MIG config {} applied", progress.config),
                )
                .await;
        }
        self.publish().await
    }

    /// Ends a request in failure: the GPUs back to their previous geometry when they may have been touched
    /// (`roll_back`), clients restored, state `failed`, the reason in GPUNode status and a Warning Event.
    async fn fail(
        &mut self,
        mut reason: ChangeFailed,
        request: Option<Request>,
        progress: Option<Progress>,
        roll_back: bool,
    ) -> Result<(), ReconcileError> {
        if let (true, Some(progress)) = (roll_back, &progress)
            && let Err(error) = self.roll_back(&progress.previous).await
        {
            reason = ChangeFailed::NotRolledBack {
                failure: Box::new(reason),
                roll_back: error,
            };
        }
        let reason = reason.to_string();
        warn!(%reason, "MIG config failed");
        self.report.set_state(MigState::Failed);
        self.report.set_error(Some(reason.clone()));
        self.failed = request;
        self.finish(progress.as_ref(), Some(MigState::Failed), None)
            .await?;
        self.report.event(MigEvent::Failed, &reason).await;
        self.report.views = self.read_gpus().await?;
        self.publish().await
    }

    /// Restores the clients and sets the state label, retrying until the API server takes it: labels are never
    /// left paused. `seen` is the Node as this reconcile watched it, when nothing was written since: if it already
    /// carries the result, there is nothing to read or write (a later change comes through the watch, with a
    /// reconcile of its own). Without it, or when a write is due, the Node is read fresh to patch against.
    async fn finish(
        &self,
        progress: Option<&Progress>,
        state: Option<MigState>,
        seen: Option<&Node>,
    ) -> Result<(), ReconcileError> {
        if let Some(node) = seen
            && restore(node.labels(), progress, state)
                .minus(node.labels(), node.annotations())
                .is_empty()
        {
            return Ok(());
        }
        let mut retry = node_runtime::Backoff::default();
        loop {
            let attempt = async {
                let node = self.node.get().await?;
                let patch = restore(node.labels(), progress, state);
                self.node
                    .patch(&patch.minus(node.labels(), node.annotations()))
                    .await
            };
            match attempt.await {
                Ok(()) => return Ok(()),
                Err(error) => {
                    warn!(%error, "cannot restore the GPU clients yet; retrying");
                    retry.wait().await;
                }
            }
        }
    }

    /// Writes this role's part of GPUNode status (only when it changed).
    pub(super) async fn publish(&mut self) -> Result<(), ReconcileError> {
        Ok(self.report.publish().await?)
    }
}

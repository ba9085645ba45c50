//! The MIG manager's runner: one reconcile per observed change of the Node or the ConfigMap, carrying out what
//! [`state`](super::state) decides, and reporting through the state label, GPUNode status and Events.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use crd::config::mig_parted::{self, CONFIG_KEY, ParsedMigConfig};
use crd::gpu_node::{GpuMigGeometry, GpuNodeStatus, MigState, MigStatus, NodeError};
use crd::labels::MIG_CONFIG;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use node_runtime::backend::Gpus;
use node_runtime::gpunode::{GpuNodeWriter, inventory_status, node_error};
use node_runtime::inventory::{self, GpuView};
use node_runtime::kube_io::{self, KubeError, NodeApi, NodeEvents, Watched};
use tracing::{debug, info, instrument, warn};

use super::assess::{AssessError, GpuChange, assess};
use super::clients::{Progress, pause, rebooting, restore};
use super::drain::NodePods;
use super::gpus::{Changed, Target, change, simulated_reboot, verify};
use super::holders::Disturbed;
use super::state::{Context, Decision, Next, Observation, Outcome, Request, Step, decide, next};

/// The component name in `lastError`.
const COMPONENT: &str = "mig-manager";

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
    /// The command that reboots the node.
    pub reboot_command: String,
    /// How long the GPU clients get to leave.
    pub clients_timeout: Duration,
    /// How long evictions are retried.
    pub eviction_timeout: Duration,
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
}

/// What GPUNode status says, kept between reconciles.
#[derive(Debug, Clone, Default)]
struct Report {
    views: Vec<GpuView>,
    config: Option<String>,
    desired: Vec<GpuMigGeometry>,
    state: Option<MigState>,
    since: Option<Time>,
    error: Option<NodeError>,
}

/// The MIG manager of one node.
#[derive(Debug)]
pub struct MigManager {
    parts: Parts,
    settings: Settings,
    report: Report,
    /// The request that failed last; not retried until the label or the config file changes.
    failed: Option<Request>,
}

/// A change being carried out.
struct Run<'a> {
    request: &'a Request,
    changes: &'a [GpuChange],
    /// The geometry before the change, for the record.
    previous: Vec<GpuMigGeometry>,
    /// The record on the Node: what to restore, reboots done.
    record: Option<Progress>,
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
        let mig = stored.and_then(|status| status.mig.as_ref());
        let report = Report {
            state: mig.and_then(|mig| mig.state),
            since: mig.and_then(|mig| mig.last_transition_time.clone()),
            error: stored
                .and_then(|status| status.last_error.clone())
                .filter(|error| error.component == COMPONENT),
            ..Report::default()
        };
        Self {
            parts,
            settings,
            report,
            failed: None,
        }
    }

    /// One pass over the latest Node and ConfigMap.
    ///
    /// # Errors
    /// When the GPUs or the API cannot be reached; the caller retries.
    #[instrument(skip_all, fields(node = %self.parts.node.name(), config))]
    pub async fn reconcile(&mut self, watched: &Watched) -> Result<(), ReconcileError> {
        let node = &watched.node;
        let desired = kube_io::label(node, MIG_CONFIG)
            .map(str::to_owned)
            .or_else(|| self.settings.default_config.clone());
        tracing::Span::current().record("config", desired.as_deref().unwrap_or("-"));
        let progress = Progress::from_annotations(node.annotations()).unwrap_or_else(|error| {
            warn!(%error, "ignoring an unreadable MIG progress record");
            None
        });
        let text = watched
            .config_map
            .as_ref()
            .and_then(|config_map| kube_io::config_map_value(config_map, CONFIG_KEY));
        let config = self.parse(text);
        self.report.views = self.read_gpus().await?;
        let changes = match (&config, &desired) {
            (Err(reason), _) => Err(reason.clone()),
            (Ok(parsed), Some(name)) => {
                assess(parsed, name, &self.report.views).map_err(|error| match error {
                    // Say which file the invalid config is in; its problem names the config and the entry.
                    AssessError::Invalid(_) => format!("{}: {error}", self.source()),
                    AssessError::Plan(_) => error.to_string(),
                })
            }
            (Ok(_), None) => Ok(Vec::new()),
        };
        let request = desired.clone().map(|config| Request {
            config,
            file: fingerprint(text),
        });
        self.report.config = desired;
        self.report.desired = changes
            .as_ref()
            .map(|changes| changes.iter().map(GpuChange::desired_geometry).collect())
            .unwrap_or_default();
        let decision = decide(Observation {
            request: request.as_ref(),
            assessment: changes
                .as_ref()
                .map(|changes| changes.iter().all(GpuChange::is_noop))
                .map_err(String::as_str),
            in_progress: progress.is_some(),
            failed: self.failed.as_ref(),
        });
        match (decision, request, changes) {
            (Decision::Change, Some(request), Ok(changes)) => {
                let run = Run {
                    request: &request,
                    changes: &changes,
                    previous: inventory::geometries(&self.report.views),
                    record: progress,
                };
                self.change(run).await
            }
            (Decision::Reject(reason), request, _) => {
                // A change left underway (the agent crashed) may have touched GPUs: put them back.
                let roll_back = progress.is_some();
                self.fail(reason, request, progress, roll_back).await
            }
            (Decision::Converged, _, _) => self.succeed(progress).await,
            (Decision::Idle, _, _) => {
                self.report.state = None;
                self.finish(progress.as_ref(), None).await?;
                self.publish().await
            }
            _ => self.publish().await,
        }
    }

    /// Where the config file comes from, as messages name it.
    fn source(&self) -> String {
        format!(
            "ConfigMap {}/{} key {CONFIG_KEY}",
            self.settings.namespace, self.settings.config_map
        )
    }

    /// The config file from the ConfigMap, or why there is none. Invalid named configs in it do not make it
    /// unusable: only a node that selects one fails.
    fn parse(&self, text: Option<&str>) -> Result<ParsedMigConfig, String> {
        let source = self.source();
        let text = text.ok_or_else(|| format!("{source} does not exist"))?;
        mig_parted::parse(text).map_err(|error| format!("{source}: {error}"))
    }

    async fn read_gpus(&self) -> Result<Vec<GpuView>, gpu::GpuError> {
        self.parts
            .gpus
            .run(|gpus| inventory::read(gpus.backend()))
            .await
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
                    return self.succeed(Some(run.take_record())).await;
                }
                Next::Fail { reason, roll_back } => {
                    let record = run.take_record();
                    return self
                        .fail(reason, Some(run.request.clone()), Some(record), roll_back)
                        .await;
                }
            }
        }
    }

    /// Runs one step.
    #[instrument(skip(self, run, targets))]
    async fn step(&mut self, step: Step, run: &mut Run<'_>, targets: &[Target]) -> Outcome {
        debug!("step starts");
        let result: Result<Outcome, String> = match step {
            Step::Pause => self.pause(run).await.map(|()| Outcome::Done),
            Step::WaitForClients => {
                let pods = self.parts.pods.clone();
                pods.wait_for_clients(self.settings.clients_timeout)
                    .await
                    .map(|()| Outcome::Done)
                    .map_err(|error| error.to_string())
            }
            Step::Evict => {
                let pods = self.parts.pods.clone();
                // The views are from before the change: the MIG device UUIDs pods hold are those.
                let disturbed = Disturbed::new(
                    &self.report.views,
                    run.changes
                        .iter()
                        .filter(|change| change.disrupts())
                        .map(|change| change.gpu),
                );
                let timeout = self.settings.eviction_timeout;
                pods.evict_gpu_pods(&disturbed, timeout, async |refusal: &str| {
                    self.report.error = Some(node_error(COMPONENT, refusal));
                    if let Err(error) = self.publish().await {
                        warn!(%error, "cannot report the refused eviction");
                    }
                })
                .await
                .map(|()| Outcome::Done)
                .map_err(|error| error.to_string())
            }
            Step::ChangeGpus => {
                let targets = targets.to_vec();
                self.parts
                    .gpus
                    .run(move |gpus| change(gpus.backend(), &targets, true))
                    .await
                    .map(|changed| match changed {
                        Changed::Done => Outcome::Done,
                        Changed::NeedsReboot(_) => Outcome::NeedsReboot,
                    })
                    .map_err(|error| error.to_string())
            }
            Step::Verify => self.verify(run.changes).await,
        };
        result.unwrap_or_else(Outcome::Failed)
    }

    /// Sets the state to pending and pauses the clients (recording what to restore).
    async fn pause(&mut self, run: &mut Run<'_>) -> Result<(), String> {
        let node = self
            .parts
            .node
            .get()
            .await
            .map_err(|error| error.to_string())?;
        if let Ok(Some(recorded)) = Progress::from_annotations(node.annotations()) {
            run.record = Some(recorded);
        }
        let (record, patch) = pause(
            node.labels(),
            run.record.clone(),
            &run.request.config,
            run.previous.clone(),
        );
        run.record = Some(record);
        self.parts
            .node
            .patch(&patch)
            .await
            .map_err(|error| error.to_string())?;
        self.set_state(MigState::Pending);
        self.report.error = None;
        self.publish().await.map_err(|error| error.to_string())
    }

    /// Reads the GPUs back and compares them with every GPU's entry.
    async fn verify(&mut self, changes: &[GpuChange]) -> Result<Outcome, String> {
        let all: Vec<Target> = changes.iter().map(Target::from).collect();
        let mismatches = self
            .parts
            .gpus
            .run(move |gpus| Ok::<_, gpu::GpuError>(verify(gpus.backend(), &all)))
            .await
            .map_err(|error| error.to_string())?;
        self.report.views = self.read_gpus().await.map_err(|error| error.to_string())?;
        if mismatches.is_empty() {
            return Ok(Outcome::Done);
        }
        let found: Vec<String> = mismatches.iter().map(ToString::to_string).collect();
        Err(format!(
            "the GPUs differ from the config after applying it: {}",
            found.join("; ")
        ))
    }

    /// Records `rebooting` and reboots. On the simulator a reboot resets every simulated GPU, and the next
    /// reconcile (the Node just changed) resumes the change, as the restarted agent of a real node does.
    async fn reboot(
        &mut self,
        request: &Request,
        mut record: Progress,
    ) -> Result<(), ReconcileError> {
        self.parts.node.patch(&rebooting(&mut record)).await?;
        self.set_state(MigState::Rebooting);
        self.publish().await?;
        self.parts
            .events
            .publish(
                false,
                "MigRebooting",
                "rebooting the node so that a MIG mode change takes effect",
            )
            .await;
        if self.parts.gpus.simulator().is_some() {
            let result = self
                .parts
                .gpus
                .run(|gpus| {
                    let count = gpus.backend().gpu_count()?;
                    let all: Vec<u32> = (0..count).collect();
                    gpus.simulator()
                        .map_or(Ok(()), |simulator| simulated_reboot(simulator, &all))
                        .map_err(|error| gpu::GpuError::Other(error.to_string()))
                })
                .await;
            info!("simulated reboot done");
            return result.map_err(ReconcileError::Gpu);
        }
        let mut words = self.settings.reboot_command.split_whitespace();
        let program = words.next().unwrap_or("reboot");
        match tokio::process::Command::new(program)
            .args(words)
            .status()
            .await
        {
            Ok(status) if status.success() => {
                info!("reboot requested; waiting to be stopped");
                std::future::pending::<()>().await;
                Ok(())
            }
            outcome => {
                let reason = format!(
                    "rebooting with `{}` failed: {outcome:?}",
                    self.settings.reboot_command
                );
                self.fail(reason, Some(request.clone()), Some(record), true)
                    .await
            }
        }
    }

    /// Ends a change (or finds the GPUs right): clients restored, state `success`.
    async fn succeed(&mut self, progress: Option<Progress>) -> Result<(), ReconcileError> {
        self.set_state(MigState::Success);
        self.report.error = None;
        self.failed = None;
        self.finish(progress.as_ref(), Some(MigState::Success))
            .await?;
        if let Some(progress) = progress {
            self.parts
                .events
                .publish(
                    false,
                    "MigConfigApplied",
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
        mut reason: String,
        request: Option<Request>,
        progress: Option<Progress>,
        roll_back: bool,
    ) -> Result<(), ReconcileError> {
        if let (true, Some(progress)) = (roll_back, &progress)
            && let Err(error) = self.roll_back(&progress.previous).await
        {
            reason.push_str(&format!(
                "; restoring the previous geometry failed too: {error}"
            ));
        }
        warn!(%reason, "MIG config failed");
        self.set_state(MigState::Failed);
        self.report.error = Some(node_error(COMPONENT, reason.clone()));
        self.failed = request;
        self.finish(progress.as_ref(), Some(MigState::Failed))
            .await?;
        self.parts
            .events
            .publish(true, "MigConfigFailed", &reason)
            .await;
        self.report.views = self.read_gpus().await?;
        self.publish().await
    }

    /// Puts the GPUs back to the geometry recorded before the change. GPUs the change did not touch already have
    /// it, so nothing is done to them (no mode change, no reset, an empty plan).
    async fn roll_back(&self, previous: &[GpuMigGeometry]) -> Result<(), String> {
        let targets = previous
            .iter()
            .map(Target::from_geometry)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| error.to_string())?;
        self.parts
            .gpus
            .run(move |gpus| change(gpus.backend(), &targets, false))
            .await
            .map(drop)
            .map_err(|error| error.to_string())
    }

    /// Restores the clients and sets the state label, retrying until the API server takes it: labels are never
    /// left paused.
    async fn finish(
        &self,
        progress: Option<&Progress>,
        state: Option<MigState>,
    ) -> Result<(), ReconcileError> {
        let mut retry = node_runtime::Backoff::default();
        loop {
            let attempt = async {
                let node = self.parts.node.get().await?;
                let patch = restore(node.labels(), progress, state);
                self.parts
                    .node
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

    fn set_state(&mut self, state: MigState) {
        if self.report.state != Some(state) {
            self.report.state = Some(state);
            self.report.since = Some(Time(Timestamp::now()));
        }
    }

    /// Writes this role's part of GPUNode status (only when it changed).
    async fn publish(&mut self) -> Result<(), ReconcileError> {
        let report = &self.report;
        let status = GpuNodeStatus {
            mig: Some(MigStatus {
                config: report.config.clone(),
                state: report.state,
                current: inventory::geometries(&report.views),
                desired: report.desired.clone(),
                last_transition_time: report.since.clone(),
            }),
            last_error: report.error.clone(),
            ..inventory_status(&report.views)
        };
        self.parts.status.publish(status).await?;
        Ok(())
    }
}

/// A fingerprint of the config file's text.
fn fingerprint(text: Option<&str>) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

//! Carrying out one step of a change ([`Step`]): pausing the GPU clients, waiting for them and evicting the
//! workloads on disturbed GPUs ([`drain`](super::drain)), changing the GPUs and reading them back
//! ([`gpus`](super::gpus)); and putting the GPUs back after a failure. Each step says how it ended; which step
//! follows is [`state::next`](super::state::next)'s decision.

use crd::gpu_node::GpuMigGeometry;
use kube::ResourceExt;
use tracing::{debug, instrument, warn};

use super::clients::{Progress, pause};
use super::gpus::{ChangeError, Changed, Target, change, verify};
use super::holders::Disturbed;
use super::manager::{MigManager, Run, StepError};
use crd::gpu_node::MigState;

use super::state::{Outcome, Step};

impl MigManager {
    /// Runs one step.
    #[instrument(skip(self, run, targets))]
    pub(super) async fn step(
        &mut self,
        step: Step,
        run: &mut Run<'_>,
        targets: &[Target],
    ) -> Outcome<StepError> {
        debug!("step starts");
        let result = match step {
            Step::Pause => self.pause(run).await.map(|()| Outcome::Done),
            Step::WaitForClients => self
                .pods
                .clone()
                .wait_for_clients(self.settings.clients_timeout)
                .await
                .map(|()| Outcome::Done)
                .map_err(StepError::from),
            Step::Evict => self.evict(run).await.map(|()| Outcome::Done),
            Step::ChangeGpus => {
                let targets = targets.to_vec();
                self.gpus
                    .run(move |gpus| change(gpus.backend(), &targets, true))
                    .await
                    .map(|changed| match changed {
                        Changed::Done => Outcome::Done,
                        Changed::NeedsReboot(_) => Outcome::NeedsReboot,
                    })
                    .map_err(StepError::from)
            }
            Step::Verify => self.verify(run).await.map(|()| Outcome::Done),
        };
        result.unwrap_or_else(Outcome::Failed)
    }

    /// Sets the state to pending and pauses the clients, recording what to restore.
    async fn pause(&mut self, run: &mut Run<'_>) -> Result<(), StepError> {
        let node = self.node.get().await.map_err(StepError::Pause)?;
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
        self.node.patch(&patch).await.map_err(StepError::Pause)?;
        self.report.set_state(MigState::Pending);
        self.report.set_error(None);
        self.report.publish().await.map_err(StepError::Pause)
    }

    /// Evicts the pods on the GPUs the change disturbs; each refusal (a PodDisruptionBudget) is reported in
    /// GPUNode status while the eviction waits.
    async fn evict(&mut self, run: &Run<'_>) -> Result<(), StepError> {
        let pods = self.pods.clone();
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
            self.report.set_error(Some(refusal.to_owned()));
            if let Err(error) = self.report.publish().await {
                warn!(%error, "cannot report the refused eviction");
            }
        })
        .await?;
        Ok(())
    }

    /// Reads the GPUs back and compares them with every GPU's entry.
    async fn verify(&mut self, run: &Run<'_>) -> Result<(), StepError> {
        let all: Vec<Target> = run.changes.iter().map(Target::from).collect();
        let mismatches = self
            .gpus
            .run(move |gpus| Ok::<_, gpu::GpuError>(verify(gpus.backend(), &all)))
            .await?;
        self.report.views = self.read_gpus().await?;
        if mismatches.is_empty() {
            return Ok(());
        }
        Err(StepError::Differs(mismatches))
    }

    /// Puts the GPUs back to the geometry recorded before the change. GPUs the change did not touch already have
    /// it, so nothing is done to them (no mode change, no reset, an empty plan).
    pub(super) async fn roll_back(&self, previous: &[GpuMigGeometry]) -> Result<(), ChangeError> {
        let targets = previous
            .iter()
            .map(Target::from_geometry)
            .collect::<Result<Vec<_>, _>>()?;
        self.gpus
            .run(move |gpus| change(gpus.backend(), &targets, false))
            .await
            .map(drop)
    }
}

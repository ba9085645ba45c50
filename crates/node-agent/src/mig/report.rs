//! What the MIG manager tells the cluster besides the Node's labels: its part of GPUNode status (config, state and
//! when it last changed, current and desired geometry, the last error) and Events on the Node. The report is kept
//! between reconciles and written only when it changed, so a node at rest writes nothing.

use crd::gpu_node::{GpuMigGeometry, GpuNodeStatus, MigStatus, NodeError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crd::gpu_node::MigState;
use node_runtime::gpunode::{GpuNodeWriter, inventory_status, node_error};
use node_runtime::inventory::{self, GpuView};
use node_runtime::kube_io::{KubeError, NodeEvents};

/// The component name in `lastError`.
pub const COMPONENT: &str = "mig-manager";

/// The Events the MIG manager records on its Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigEvent {
    /// A config was applied (Normal).
    Applied,
    /// A config failed (Warning).
    Failed,
    /// The node reboots for a MIG mode change (Normal).
    Rebooting,
}

impl MigEvent {
    /// The Event's reason.
    #[must_use]
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Applied => "MigConfigApplied",
            Self::Failed => "MigConfigFailed",
            Self::Rebooting => "MigRebooting",
        }
    }
}

/// The MIG manager's report on its node, and where it goes.
#[derive(Debug)]
pub struct Reporter {
    status: GpuNodeWriter,
    events: NodeEvents,
    /// The GPUs as last read.
    pub views: Vec<GpuView>,
    /// The config asked for.
    pub config: Option<String>,
    /// The geometry it asks of each GPU.
    pub desired: Vec<GpuMigGeometry>,
    state: Option<MigState>,
    since: Option<Time>,
    error: Option<NodeError>,
}

impl Reporter {
    /// A reporter that continues from `stored` status (its state and when it last changed, its last error).
    #[must_use]
    pub fn new(status: GpuNodeWriter, events: NodeEvents, stored: Option<&GpuNodeStatus>) -> Self {
        let mig = stored.and_then(|status| status.mig.as_ref());
        Self {
            status,
            events,
            views: Vec::new(),
            config: None,
            desired: Vec::new(),
            state: mig.and_then(|mig| mig.state),
            since: mig.and_then(|mig| mig.last_transition_time.clone()),
            error: stored
                .and_then(|status| status.last_error.clone())
                .filter(|error| error.component == COMPONENT),
        }
    }

    /// Sets the state, and when it changed.
    pub fn set_state(&mut self, state: MigState) {
        if self.state != Some(state) {
            self.state = Some(state);
            self.since = Some(Time(Timestamp::now()));
        }
    }

    /// No config is asked for: no state. The time of the last transition is kept.
    pub fn clear_state(&mut self) {
        self.state = None;
    }

    /// Sets (or clears) the last error.
    pub fn set_error(&mut self, message: Option<String>) {
        self.error = message.map(|message| node_error(COMPONENT, message));
    }

    /// Writes the MIG manager's part of GPUNode status, when it changed.
    ///
    /// # Errors
    /// When the API server refuses it; the next write sends it again.
    pub async fn publish(&mut self) -> Result<(), KubeError> {
        let status = GpuNodeStatus {
            mig: Some(MigStatus {
                config: self.config.clone(),
                state: self.state,
                current: inventory::geometries(&self.views),
                desired: self.desired.clone(),
                last_transition_time: self.since.clone(),
            }),
            last_error: self.error.clone(),
            ..inventory_status(&self.views)
        };
        self.status.publish(status).await?;
        Ok(())
    }

    /// Records an Event on the Node (a failure is logged: an Event is never worth failing the work it reports).
    pub async fn event(&self, event: MigEvent, note: &str) {
        let warning = event == MigEvent::Failed;
        self.events.publish(warning, event.reason(), note).await;
    }
}

//! One collection: reads the GPUs (blocking backend calls, off the async runtime), asks the kubelet who holds
//! which device, feeds the XID gauge, and turns it all into metric families.
//!
//! A GPU that does not answer is still exported with what is known of it (its identity and XID gauge: an XID 79
//! "fallen off the bus" is exactly when its telemetry fails), and a kubelet that does not answer only costs the
//! pod labels. Problems are logged when they start and when they end, not at every collection.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpu::{GpuBackend, GpuDetails, GpuError, HealthEvent, Telemetry};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use node_runtime::backend::Gpus;
use tracing::{info, warn};

use super::config::Selection;
use super::families::{
    GpuReading, Holder, Holders, MetricFamily, NodeReading, ProcessMemory, families,
};
use super::xid::XidGauge;
use crate::accounting::{self, Owner, pods};
use crate::pod_resources::{self, PodResourcesError};

/// Where the exporter accounts GPU processes to pods: the host's procfs, and the node's pods.
#[derive(Debug, Clone)]
pub struct ProcessAccounting {
    /// The host's procfs as mounted in the exporter's container.
    pub proc_root: PathBuf,
    /// The node's pods, kept by a watch.
    pub pods: Store<Pod>,
}

/// What one pass over the GPUs read.
#[derive(Debug)]
pub struct GpuPass {
    /// Every GPU the backend lists.
    pub gpus: Vec<GpuReading>,
    /// The health events that arrived since the previous pass.
    pub events: Vec<HealthEvent>,
    /// What could not be read, one sentence each.
    pub problems: BTreeSet<String>,
}

/// Reads every GPU: identity, telemetry, board details, and with MIG on its MIG devices and processes; and the
/// health events.
///
/// # Errors
/// Only when the GPUs cannot be listed at all; a GPU that fails a later call is kept with what was read.
pub fn read_gpus(backend: &dyn GpuBackend) -> gpu::Result<GpuPass> {
    let mut problems = BTreeSet::new();
    let events = backend.health_events().unwrap_or_else(|error| {
        problems.insert(format!("reading XID events: {error}"));
        Vec::new()
    });
    let mut gpus = Vec::new();
    for inventory in backend.gpus()? {
        let index = inventory.index;
        let telemetry = backend.telemetry(index).unwrap_or_else(|error| {
            problems.insert(format!("GPU {index}: reading telemetry: {error}"));
            Telemetry::default()
        });
        let details = backend.details(index).unwrap_or_else(|error| {
            problems.insert(format!("GPU {index}: reading board details: {error}"));
            GpuDetails::default()
        });
        let mig = inventory.mig_mode.is_some_and(|mode| mode.current);
        let (devices, processes, instances) = if mig {
            match (
                backend.mig_devices(index),
                backend.processes(index),
                backend.gpu_instances(index),
            ) {
                (Ok(devices), Ok(processes), Ok(instances)) => (devices, processes, instances),
                (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => {
                    problems.insert(format!(
                        "GPU {index}: reading MIG devices, instances and processes: {error}"
                    ));
                    (Vec::new(), Vec::new(), Vec::new())
                }
            }
        } else {
            // Without MIG the GPU's telemetry already has its memory use: no need to list processes.
            (Vec::new(), Vec::new(), Vec::new())
        };
        gpus.push(GpuReading::new(
            inventory, telemetry, details, &devices, &processes, &instances,
        ));
    }
    Ok(GpuPass {
        gpus,
        events,
        problems,
    })
}

/// Problems seen at the previous collection, so that each is logged once when it starts and once when it ends.
#[derive(Debug, Default)]
struct Problems(BTreeSet<String>);

impl Problems {
    fn update(&mut self, current: BTreeSet<String>) {
        for problem in current.difference(&self.0) {
            warn!(%problem, "exporting without this reading until it recovers");
        }
        for problem in self.0.difference(&current) {
            info!(%problem, "recovered");
        }
        self.0 = current;
    }
}

/// Collects the node's metrics on demand, keeping the state that spans collections (the XID gauge, what was
/// logged).
#[derive(Debug)]
pub struct Collector {
    gpus: Gpus,
    hostname: String,
    kubelet_root: PathBuf,
    xids: XidGauge,
    problems: Problems,
    /// Whether the missing pod-resources socket was logged already (it is not expected to appear later).
    told_no_kubelet: bool,
    /// Per-process accounting, when asked for.
    accounting: Option<ProcessAccounting>,
}

impl Collector {
    /// A collector over `gpus`, labelling series with `hostname`, asking the kubelet under `kubelet_root`, with
    /// XIDs clearing after `xid_quiet_period` (zero: never).
    #[must_use]
    pub fn new(
        gpus: Gpus,
        hostname: &str,
        kubelet_root: PathBuf,
        xid_quiet_period: Duration,
    ) -> Self {
        Self {
            gpus,
            hostname: hostname.to_owned(),
            kubelet_root,
            xids: XidGauge::new(xid_quiet_period),
            problems: Problems::default(),
            told_no_kubelet: false,
            accounting: None,
        }
    }

    /// Also accounts each GPU process to its container, for the per-pod memory series.
    #[must_use]
    pub fn with_accounting(mut self, accounting: ProcessAccounting) -> Self {
        self.accounting = Some(accounting);
        self
    }

    /// Reads everything once and returns the families `selection` asks for. Everything is built afresh, so
    /// series of a GPU, MIG device or pod that is gone are gone too: memory stays flat.
    pub async fn collect(&mut self, selection: &Selection) -> Vec<MetricFamily> {
        let mut problems = BTreeSet::new();
        let pass = self
            .gpus
            .run(|gpus| read_gpus(gpus.backend()))
            .await
            .unwrap_or_else(|error: GpuError| {
                // Stale values would pass for current ones: export no GPU at all until they can be listed.
                problems.insert(format!("listing the GPUs: {error}"));
                GpuPass {
                    gpus: Vec::new(),
                    events: Vec::new(),
                    problems: BTreeSet::new(),
                }
            });
        problems.extend(pass.problems);
        for event in pass.events.iter().filter(|event| event.xid.is_none()) {
            warn!(
                gpu = event.gpu_index,
                "the driver reported a critical XID error without its code; the XID gauge cannot show it"
            );
        }
        self.xids.record(&pass.events, Instant::now());
        let holders = self.holders(&pass.gpus, &mut problems).await;
        let processes = self.processes(&mut problems).await;
        self.problems.update(problems);
        families(
            &NodeReading {
                hostname: &self.hostname,
                gpus: &pass.gpus,
                holders: &holders,
                xids: &self.xids,
                processes: &processes,
            },
            selection,
        )
    }

    /// Every GPU process with its container; none without accounting or when the processes cannot be read.
    async fn processes(&self, problems: &mut BTreeSet<String>) -> Vec<ProcessMemory> {
        let Some(setup) = &self.accounting else {
            return Vec::new();
        };
        let proc_root = setup.proc_root.clone();
        let read = self
            .gpus
            .run(move |gpus| accounting::read(gpus.backend(), &proc_root))
            .await;
        let accounting = match read {
            Ok(accounting) => accounting,
            Err(error) => {
                problems.insert(format!("reading the GPUs' processes: {error}"));
                return Vec::new();
            }
        };
        let owners = accounting.owners(&pods::index(&setup.pods));
        accounting
            .processes
            .iter()
            .zip(owners)
            .map(|(process, owner)| ProcessMemory {
                gpu: process.gpu,
                gpu_instance: process.mig_device.as_ref().map(|place| place.gpu_instance),
                owner: match owner {
                    Owner::Container(container) => Some(Holder {
                        namespace: container.namespace,
                        pod: container.pod,
                        container: container.container,
                        claim: None,
                    }),
                    Owner::OutsidePods | Owner::UnknownPod(_) => None,
                },
                used_bytes: process.used_bytes.unwrap_or(0),
            })
            .collect()
    }

    /// Who holds which device; nobody when the kubelet cannot say (the series then have no pod labels).
    async fn holders(&mut self, gpus: &[GpuReading], problems: &mut BTreeSet<String>) -> Holders {
        match pod_resources::list(&self.kubelet_root).await {
            Ok(answer) => Holders::new(&answer, gpus),
            Err(error @ PodResourcesError::SocketMissing { .. }) => {
                if !std::mem::replace(&mut self.told_no_kubelet, true) {
                    info!(%error, "exporting without pod, namespace and container labels");
                }
                Holders::default()
            }
            Err(error) => {
                problems.insert(format!("asking the kubelet who holds the GPUs: {error}"));
                Holders::default()
            }
        }
    }
}

//! The plugin's main loop: it turns the inputs (the chosen config, the GPUs, their health, the kubelet coming and
//! going) into running servers, and reports what is advertised.
//!
//! Each pass re-plans when the config or the GPUs changed, and then reconciles: resources that appear get a server
//! and are registered, resources that vanish are withdrawn (server stopped, socket removed; the kubelet drops
//! them), and resources that stay get the new device list and health on their open ListAndWatch stream. A config
//! that fails keeps the last good plan and says why in the report.
//!
//! The backend offers no event stream for MIG changes, so MIG devices are re-read every `mig_poll`; XID events
//! are drained every `health_poll` (a non-blocking read of the backend's queue).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crd::config::device_plugin::{NodeConfig, ResourceName};
use node_runtime::backend::Gpus;
use node_runtime::inventory::{self, GpuView};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::allocate::AllocateSettings;
use crate::api::KUBELET_SOCKET;
use crate::cdi;
use crate::kubelet::{register, watch_kubelet_socket};
use crate::mps::{self, MpsDaemons};
use crate::plan::{Plan, PlannedGpu, advertise};
use crate::server::{RunningServer, Snapshot};
use node_runtime::health::HealthTracker;

/// How the plugin runs, from the command line.
#[derive(Debug, Clone)]
pub struct Options {
    /// The kubelet's device-plugin directory (`<kubelet-root>/device-plugins`).
    pub plugin_dir: PathBuf,
    /// Whether CDI names are handed out by default (`--cdi`).
    pub cdi: bool,
    /// Where the CDI spec is written.
    pub cdi_dir: PathBuf,
    /// Root of the MPS pipe directories on the host.
    pub mps_root: PathBuf,
    /// Whether MPS control daemons are started (real GPUs only: they need the driver).
    pub start_mps: bool,
    /// Which XIDs count, and when a GPU is Healthy again.
    pub health: HealthTracker,
    /// How often MIG devices are re-read.
    pub mig_poll: Duration,
    /// How often XID events are drained.
    pub health_poll: Duration,
}

/// A config as the watchers deliver it: chosen, or why none could be.
pub type ConfigUpdate = Result<NodeConfig, String>;

/// What the plugin advertises, for GPUNode status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The config key in use.
    pub config: Option<String>,
    /// Healthy devices per advertised resource.
    pub resources: BTreeMap<String, u32>,
    /// The GPUs as last read.
    pub gpus: Vec<GpuView>,
    /// Why the latest config or GPU change could not be applied, if it could not.
    pub error: Option<String>,
    /// What the config in use has that is ignored.
    pub config_warnings: Vec<String>,
    /// The GPUs whose devices are Unhealthy (a recent critical XID).
    pub unhealthy: BTreeSet<u32>,
}

/// Time between registration attempts while the kubelet's socket exists but it does not accept them yet.
const REGISTRATION_RETRY: Duration = Duration::from_millis(200);

/// Runs the plugin until `configs` closes. `configs` holds `None` until the first config is known; nothing is
/// advertised before.
///
/// # Errors
/// When the device-plugin directory cannot be watched or the GPUs cannot be read at start.
pub async fn run(
    options: Options,
    gpus_source: Gpus,
    mut configs: watch::Receiver<Option<ConfigUpdate>>,
    report: watch::Sender<Report>,
) -> anyhow::Result<()> {
    let (_watcher, mut kubelet_started) = watch_kubelet_socket(&options.plugin_dir)?;
    let mut servers = Servers {
        dir: options.plugin_dir.clone(),
        running: BTreeMap::new(),
        unregistered: BTreeSet::new(),
    };
    let mut tracker = options.health.clone();
    let mut gpus = read_gpus(&gpus_source).await?;
    let mut mig_tick = tokio::time::interval(options.mig_poll);
    let mut health_tick = tokio::time::interval(options.health_poll);
    // An interval, not a sleep per pass: the other ticks end passes more often than a retry is due.
    let mut registration_tick = tokio::time::interval(REGISTRATION_RETRY);
    for tick in [&mut mig_tick, &mut health_tick, &mut registration_tick] {
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    }
    let mut state = State::default();
    let mut mps = MpsDaemons::new(&options.mps_root, options.start_mps);
    let mut replan = true;
    loop {
        if replan {
            state.replan(&options, &gpus, configs.borrow_and_update().clone());
            mps.reconcile(mps::daemons(&state.plan)).await;
            replan = false;
        }
        let now = Instant::now();
        let unhealthy = tracker.unhealthy(now.into_std());
        servers
            .reconcile(&state.plan, state.settings.as_ref(), &unhealthy)
            .await;
        report.send_if_modified(|current| {
            state
                .report(&servers, &gpus, &unhealthy)
                .is_some_and(|next| {
                    let changed = *current != next;
                    *current = next;
                    changed
                })
        });
        let recovery = tracker.next_recovery(now.into_std()).map(Instant::from_std);
        tokio::select! {
            changed = configs.changed() => {
                if changed.is_err() {
                    break;
                }
                replan = true;
            }
            _ = mig_tick.tick() => match read_gpus(&gpus_source).await {
                Ok(latest) if latest != gpus => {
                    info!("the GPUs changed (MIG geometry); planning again");
                    gpus = latest;
                    replan = true;
                }
                Ok(_) => {}
                Err(error) => warn!(%error, "cannot read the GPUs; keeping the last reading"),
            },
            _ = health_tick.tick() => {
                for event in gpus_source.health_events().await {
                    if tracker.record(&event, Instant::now().into_std()) {
                        warn!(gpu = event.gpu_index, xid = ?event.xid, "critical XID: devices of the GPU are Unhealthy");
                    }
                }
            }
            Some(()) = kubelet_started.recv() => servers.reregister().await,
            _ = registration_tick.tick(), if !servers.unregistered.is_empty() => {
                servers.retry_registration().await;
            }
            () = sleep_until(recovery) => info!("quiet period over: GPUs are Healthy again"),
        }
    }
    servers
        .reconcile(&Plan::new(), None, &BTreeSet::new())
        .await;
    Ok(())
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The plan in effect and what it came from.
#[derive(Debug, Default)]
struct State {
    /// The last config that planned without error.
    good: Option<NodeConfig>,
    plan: Plan,
    settings: Option<AllocateSettings>,
    /// Why the newest config update is not usable.
    config_error: Option<String>,
    /// Why the config in use does not fit the GPUs.
    plan_error: Option<String>,
    /// Whether any config has arrived (nothing is reported before).
    started: bool,
}

impl State {
    /// Plans with the newest config, or with the last good one when the newest is an error; a plan that fails
    /// leaves the previous one in effect.
    fn replan(&mut self, options: &Options, gpus: &[PlannedGpu], update: Option<ConfigUpdate>) {
        let Some(update) = update else { return };
        self.started = true;
        let candidate = match update {
            Ok(chosen) => {
                self.config_error = None;
                for warning in &chosen.warnings {
                    warn!(config = ?chosen.name, %warning, "config key ignored");
                }
                chosen
            }
            Err(error) => {
                self.config_error = Some(self.keeping(error));
                match self.good.clone() {
                    Some(good) => good,
                    None => return,
                }
            }
        };
        // The DRA driver's GPUs are never advertised: the two never hand out the same GPU.
        let ours: Vec<PlannedGpu> = gpus
            .iter()
            .filter(|gpu| !candidate.dra_gpus.contains(gpu.view.inventory.index))
            .cloned()
            .collect();
        match advertise(&ours, &candidate.config, candidate.mig_strategy) {
            Ok(plan) => {
                let settings =
                    AllocateSettings::new(&candidate.config, options.cdi, &options.mps_root);
                if settings.uses_cdi() {
                    match cdi::write(&options.cdi_dir, &cdi::spec(&plan)) {
                        Ok(path) => info!(path = %path.display(), "CDI spec written"),
                        Err(error) => {
                            warn!(%error, "cannot write the CDI spec; CDI names will not resolve")
                        }
                    }
                }
                let resources: Vec<String> = plan.keys().map(ToString::to_string).collect();
                info!(config = ?candidate.name, ?resources, "planned");
                self.plan_error = None;
                self.good = Some(candidate);
                self.plan = plan;
                self.settings = Some(settings);
            }
            Err(error) => {
                let name = candidate.name.as_deref().unwrap_or("default");
                self.plan_error = Some(self.keeping(format!("config {name}: {error}")));
            }
        }
    }

    /// An error message that also says what stays in effect.
    fn keeping(&self, error: String) -> String {
        warn!(%error, "config not applied");
        match self
            .good
            .as_ref()
            .map(|good| good.name.as_deref().unwrap_or("default"))
        {
            Some(good) => format!("{error}; keeping config {good}"),
            None => format!("{error}; nothing is advertised until a valid config is found"),
        }
    }

    /// The report, once a config has arrived.
    fn report(
        &self,
        servers: &Servers,
        gpus: &[PlannedGpu],
        unhealthy: &BTreeSet<u32>,
    ) -> Option<Report> {
        self.started.then(|| Report {
            config: self.good.as_ref().and_then(|good| good.name.clone()),
            config_warnings: self
                .good
                .as_ref()
                .map(|good| good.warnings.clone())
                .unwrap_or_default(),
            resources: servers.healthy_counts(),
            gpus: gpus.iter().map(|gpu| gpu.view.clone()).collect(),
            error: self
                .plan_error
                .clone()
                .or_else(|| self.config_error.clone()),
            unhealthy: unhealthy.clone(),
        })
    }
}

/// The running servers, by resource.
#[derive(Debug)]
struct Servers {
    dir: PathBuf,
    running: BTreeMap<ResourceName, RunningServer>,
    /// Served but not registered: the kubelet was gone, or its socket existed before it accepted connections
    /// (it appears when the kubelet binds, before it listens). Retried every [`REGISTRATION_RETRY`].
    unregistered: BTreeSet<ResourceName>,
}

impl Servers {
    /// Makes the running servers match `plan`: withdraws, updates, starts and registers.
    async fn reconcile(
        &mut self,
        plan: &Plan,
        settings: Option<&AllocateSettings>,
        unhealthy: &BTreeSet<u32>,
    ) {
        let gone: Vec<ResourceName> = self
            .running
            .keys()
            .filter(|name| !plan.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            if let Some(server) = self.running.remove(&name) {
                server.stop().await;
                self.unregistered.remove(&name);
                info!(resource = %name, "resource withdrawn");
            }
        }
        let Some(settings) = settings else { return };
        for (name, resource) in plan {
            let snapshot = Arc::new(Snapshot {
                resource: resource.clone(),
                settings: settings.clone(),
                unhealthy: unhealthy.clone(),
            });
            if let Some(server) = self.running.get(name) {
                server.update(snapshot);
                continue;
            }
            match RunningServer::start(&self.dir, name, snapshot) {
                Ok(server) => {
                    self.register_resource(&server, name).await;
                    self.running.insert(name.clone(), server);
                }
                Err(error) => warn!(resource = %name, %error, "cannot serve the resource"),
            }
        }
    }

    /// Serves every resource on a fresh socket and registers it again: the kubelet restarted and deleted them.
    async fn reregister(&mut self) {
        info!("kubelet.sock created: registering every resource again");
        for (name, server) in std::mem::take(&mut self.running) {
            match server.restart(&self.dir).await {
                Ok(server) => {
                    self.register_resource(&server, &name).await;
                    self.running.insert(name, server);
                }
                Err(error) => warn!(resource = %name, %error, "cannot serve the resource again"),
            }
        }
    }

    /// Registers a resource, remembering it for a retry when the kubelet does not answer.
    async fn register_resource(&mut self, server: &RunningServer, name: &ResourceName) {
        let span = info_span!("register", resource = %name);
        match register(&self.dir, &server.endpoint(), name.as_str())
            .instrument(span)
            .await
        {
            Ok(()) => {
                self.unregistered.remove(name);
                info!(resource = %name, "registered with the kubelet");
            }
            // Said once; the retries stay quiet until one succeeds.
            Err(error) if self.unregistered.insert(name.clone()) => {
                warn!(resource = %name, %error, "not registered (yet); retrying");
            }
            Err(error) => debug!(resource = %name, %error, "still not registered"),
        }
    }

    /// Registers again every resource the kubelet has not accepted yet, while its socket exists (a kubelet that
    /// is gone is waited for: the socket's creation triggers [`reregister`](Self::reregister)).
    async fn retry_registration(&mut self) {
        if !self.dir.join(KUBELET_SOCKET).exists() {
            return;
        }
        let pending: Vec<ResourceName> = self.unregistered.iter().cloned().collect();
        for name in pending {
            let Some(server) = self.running.remove(&name) else {
                self.unregistered.remove(&name);
                continue;
            };
            self.register_resource(&server, &name).await;
            self.running.insert(name, server);
        }
    }

    fn healthy_counts(&self) -> BTreeMap<String, u32> {
        self.running
            .iter()
            .map(|(name, server)| {
                (
                    name.to_string(),
                    u32::try_from(server.snapshot().healthy_count()).unwrap_or(u32::MAX),
                )
            })
            .collect()
    }
}

/// Reads the GPUs off the async runtime (NVML blocks; the simulator reads its file), with their NUMA nodes.
async fn read_gpus(gpus: &Gpus) -> anyhow::Result<Vec<PlannedGpu>> {
    let views = gpus.run(|gpus| inventory::read(gpus.backend())).await?;
    Ok(views
        .into_iter()
        .map(|view| PlannedGpu {
            numa_node: numa_node(&view.inventory.pci_bus_id),
            view,
        })
        .collect())
}

/// The NUMA node of a PCI device from sysfs (`-1` or missing: unknown). NVML's bus id has an 8-digit domain,
/// sysfs a 4-digit one.
fn numa_node(pci_bus_id: &str) -> Option<i64> {
    let (domain, rest) = pci_bus_id.split_once(':')?;
    let short = format!("{:0>4}:{rest}", domain.trim_start_matches('0')).to_lowercase();
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{short}/numa_node")).ok()?;
    text.trim().parse().ok().filter(|node: &i64| *node >= 0)
}

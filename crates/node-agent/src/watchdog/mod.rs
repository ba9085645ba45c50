//! The GPU memory watchdog (`gpu-node-agent watchdog`). Time-slicing gives pods no memory isolation, and MPS or a
//! DRA share limits only what goes through MPS; one pod's leak then takes the GPU's memory from every pod sharing
//! it. The watchdog does for GPU memory what the kubelet does for memory limits: each pass, it accounts every GPU
//! process to its pod ([`crate::accounting`]), gives each pod a budget on each GPU it shares ([`budget`]), and
//! signals the processes of a pod that stays over it ([`decide`]): SIGTERM after the grace period, SIGKILL after
//! the kill grace period. Each signal is a Warning Event on the pod and a count in the metrics.
//!
//! What it never does: signal a process it cannot attribute to a pod of this node (a host service, a pod it does
//! not know yet), signal on a whole GPU or a MIG device (no budget), or signal a process whose pid has been reused
//! since it was measured. In a dry run it reports the same and signals nothing.
//!
//! It runs in the host's PID namespace, so that the pids the driver reports are the ones it reads in `/proc` and
//! signals.

pub mod assess;
pub mod budget;
pub mod decide;
pub mod dra;
pub mod metrics;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::header::{CONTENT_TYPE, HeaderName};
use axum::routing::get;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use nix::sys::signal::{Signal as UnixSignal, kill};
use nix::unistd::Pid;
use node_runtime::backend::{GpuSource, Gpus};
use node_runtime::kube_io;
use tokio::net::TcpListener;
use tokio::sync::Mutex;
use tracing::{info, warn};

use self::assess::{Assessment, holdings};
use self::decide::{Action, Decider, Settings, Signal};
use self::metrics::WatchdogMetrics;
use crate::accounting::{self, ContainerRef, MIB, pods};
use crate::cli::WatchdogArgs;
use crate::pod_resources;

/// The events' reporting controller.
const CONTROLLER: &str = "gpu-node-agent-watchdog";
/// The reason of the Warning Event on a pod whose process is signalled (or would be, in a dry run).
pub const OVER_BUDGET_REASON: &str = "GPUMemoryOverBudget";
/// The reason of the Warning Event on a pod whose memory-limit annotation is not a memory size.
pub const BAD_ANNOTATION_REASON: &str = "InvalidGPUMemoryLimit";
/// The Prometheus text format, as the exporter serves it.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Runs the watchdog until the process is stopped.
///
/// # Errors
/// When the GPUs cannot be opened, the API server cannot be reached, or the metrics address cannot be bound.
pub async fn run(args: WatchdogArgs, source: &GpuSource) -> anyhow::Result<()> {
    let node = args.node.node_name.clone();
    let gpus = Gpus::open_reading_node(source, Some(&node)).await?;
    let client = kube_io::client().await?;
    let (store, watch) = pods::watch_node_pods(client.clone(), &node);
    tokio::spawn(watch);
    store
        .wait_until_ready()
        .await
        .context("watching this node's pods")?;
    let metrics = Arc::new(Mutex::new(WatchdogMetrics::new(&node)));
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    info!(
        address = %listener.local_addr()?,
        %node,
        dry_run = args.dry_run,
        grace_seconds = args.grace_period.as_secs(),
        kill_grace_seconds = args.kill_grace_period.as_secs(),
        budget = ?args.default_budget,
        "watchdog running"
    );
    let router = Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(metrics.clone());
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            warn!(%error, "serving /metrics failed");
        }
    });

    let mut watchdog = Watchdog {
        decider: Decider::new(Settings {
            grace: args.grace_period,
            kill_grace: args.kill_grace_period,
            dry_run: args.dry_run,
        }),
        events: Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER.to_owned(),
                instance: Some(node.clone()),
            },
        ),
        claims: dra::Claims::new(client, &node),
        told_processes: BTreeSet::new(),
        told_annotations: BTreeSet::new(),
        last_problem: None,
    };
    let mut ticks = tokio::time::interval(args.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let pods = pods::index(&store);
        watchdog.pass(&args, &gpus, &pods, &metrics).await;
    }
}

async fn serve_metrics(
    State(metrics): State<Arc<Mutex<WatchdogMetrics>>>,
) -> ([(HeaderName, &'static str); 1], String) {
    ([(CONTENT_TYPE, TEXT_FORMAT)], metrics.lock().await.encode())
}

/// What the watchdog keeps between passes.
struct Watchdog {
    decider: Decider,
    events: Recorder,
    claims: dra::Claims,
    /// Unattributed processes (GPU, pid) logged already, while they last.
    told_processes: BTreeSet<(u32, u32)>,
    /// Pods (UIDs) whose bad annotation has had its Event, while the annotation stays bad.
    told_annotations: BTreeSet<String>,
    /// The last problem reading the kubelet or the GPUs, logged once.
    last_problem: Option<String>,
}

impl Watchdog {
    async fn pass(
        &mut self,
        args: &WatchdogArgs,
        gpus: &Gpus,
        pods: &pods::PodIndex,
        metrics: &Mutex<WatchdogMetrics>,
    ) {
        let proc_root = args.proc_root.clone();
        let accounting = match gpus
            .run(move |gpus| accounting::read(gpus.backend(), &proc_root))
            .await
        {
            Ok(accounting) => accounting,
            Err(error) => {
                self.problem(Some(format!("reading the GPUs' processes: {error}")));
                return;
            }
        };
        // Without the kubelet's word on who holds what, nobody has a budget: nothing is signalled.
        let held = match tokio::try_join!(
            pod_resources::list(&args.kubelet_root),
            pod_resources::allocatable(&args.kubelet_root)
        ) {
            Ok((held, advertised)) => {
                self.problem(None);
                let claims = self.claims.shares(pods, &accounting).await;
                holdings(&held, &advertised, &claims)
            }
            Err(error) => {
                self.problem(Some(format!(
                    "asking the kubelet who holds the GPUs (no budgets until it answers): {error}"
                )));
                assess::Holdings::new()
            }
        };
        let (assessment, actions) = judge(
            &mut self.decider,
            &accounting,
            pods,
            &held,
            args.default_budget,
            Instant::now(),
        );
        self.tell_once(&assessment).await;
        metrics.lock().await.show(&accounting, &assessment);
        for action in actions {
            // Not under the metrics lock: a scrape need not wait for the API server.
            self.act(&action, &args.proc_root).await;
            metrics.lock().await.count(&action);
        }
    }

    fn problem(&mut self, problem: Option<String>) {
        if problem != self.last_problem {
            match &problem {
                Some(problem) => warn!(%problem, "watchdog pass incomplete"),
                None => info!("watchdog reads the kubelet and the GPUs again"),
            }
            self.last_problem = problem;
        }
    }

    /// Logs each unattributed process once, and records a Warning Event once per pod with a bad annotation. What
    /// is gone (or mended) is forgotten, so that the memory of what was said stays as small as the node.
    async fn tell_once(&mut self, assessment: &Assessment) {
        let previous = std::mem::take(&mut self.told_processes);
        for process in &assessment.unattributed {
            self.told_processes.insert((process.gpu, process.pid));
            if !previous.contains(&(process.gpu, process.pid)) {
                info!(
                    gpu = process.gpu,
                    pid = process.pid,
                    why = %process.why,
                    "a GPU process is not attributed to a pod: reported, never signalled"
                );
            }
        }
        let still_bad: BTreeSet<&str> = assessment
            .bad_annotations
            .iter()
            .map(|(pod, _)| pod.pod_uid.as_str())
            .collect();
        self.told_annotations
            .retain(|uid| still_bad.contains(uid.as_str()));
        for (pod, error) in &assessment.bad_annotations {
            if !self.told_annotations.contains(&pod.pod_uid) {
                warn!(namespace = %pod.namespace, pod = %pod.pod, %error, "ignoring the annotation");
                // Remembered once recorded: an Event the API server refused is tried again on the next pass.
                if self
                    .publish(pod, BAD_ANNOTATION_REASON, &error.to_string())
                    .await
                {
                    self.told_annotations.insert(pod.pod_uid.clone());
                }
            }
        }
    }

    /// Signals (unless a dry run), logs and records the Event.
    async fn act(&self, action: &Action, proc_root: &Path) {
        let outcome = if action.dry_run {
            format!("dry run: would send {}", action.signal.name())
        } else {
            match send(action, proc_root) {
                Ok(()) => format!("sent {}", action.signal.name()),
                Err(error) => format!("{} not sent: {error}", action.signal.name()),
            }
        };
        let note = describe(action, &outcome);
        warn!(
            namespace = %action.over.pod.namespace,
            pod = %action.over.pod.pod,
            pid = action.target.process.pid,
            "{note}"
        );
        self.publish(&action.over.pod, OVER_BUDGET_REASON, &note)
            .await;
    }

    /// Records a Warning Event on the pod; returns whether it was recorded. A refusal is logged with the pod and
    /// the API server's answer: an Event is never worth failing the work it tells of.
    async fn publish(&self, pod: &ContainerRef, reason: &str, note: &str) -> bool {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            note: Some(note.chars().take(1000).collect()),
            action: reason.to_owned(),
            secondary: None,
        };
        let reference = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.pod.clone()),
            uid: Some(pod.pod_uid.clone()),
            ..ObjectReference::default()
        };
        match self.events.publish(&event, &reference).await {
            Ok(()) => true,
            Err(error) => {
                warn!(namespace = %pod.namespace, pod = %pod.pod, %error, reason, "cannot record the event");
                false
            }
        }
    }
}

/// One pass's judgement after the reading: each pod's budget and use, and the signals due at `now`.
#[must_use]
pub fn judge(
    decider: &mut Decider,
    accounting: &accounting::Accounting,
    pods: &pods::PodIndex,
    held: &assess::Holdings,
    rule: budget::DefaultBudget,
    now: Instant,
) -> (Assessment, Vec<Action>) {
    let owners = accounting.owners(pods);
    let assessment = assess::assess(accounting, &owners, held, pods, rule);
    let actions = decider.pass(&assessment.judged, now);
    (assessment, actions)
}

/// Why a signal was not sent.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The process is gone, or its pid now names another process.
    #[error("process {0} has exited")]
    Exited(u32),
    /// The kernel refused.
    #[error("kill({pid}): {source}")]
    Kill {
        /// The process.
        pid: u32,
        /// Why.
        #[source]
        source: nix::Error,
    },
}

/// Sends the action's signal, after checking that its pid still names the process that was measured.
///
/// # Errors
/// When the process has exited (or its pid was reused), or the kernel refuses.
pub fn send(action: &Action, proc_root: &Path) -> Result<(), SendError> {
    let process = action.target.process;
    if !process.is_running(proc_root) {
        return Err(SendError::Exited(process.pid));
    }
    let pid = i32::try_from(process.pid).map_err(|_| SendError::Exited(process.pid))?;
    let signal = match action.signal {
        Signal::Term => UnixSignal::SIGTERM,
        Signal::Kill => UnixSignal::SIGKILL,
    };
    kill(Pid::from_raw(pid), signal).map_err(|source| SendError::Kill {
        pid: process.pid,
        source,
    })
}

/// The Event's note: the process, its use, the pod's use and budget, how long, and what was done.
#[must_use]
pub fn describe(action: &Action, outcome: &str) -> String {
    let over = &action.over;
    let container = if action.target.container.is_empty() {
        String::new()
    } else {
        format!(" (container {})", action.target.container)
    };
    format!(
        "process {pid}{container} uses {process} MiB of GPU {gpu} ({uuid}); the pod uses {used} MiB there, over its budget of {budget} MiB ({reckoning}) for {seconds}s: {outcome}",
        pid = action.target.process.pid,
        process = action.target.used_bytes / MIB,
        gpu = over.gpu,
        uuid = over.gpu_uuid,
        used = over.used_bytes() / MIB,
        budget = over.budget.bytes / MIB,
        reckoning = over.budget.reckoning,
        seconds = action.over_for.as_secs(),
    )
}

#[cfg(test)]
mod events_tests;
#[cfg(test)]
mod tests;

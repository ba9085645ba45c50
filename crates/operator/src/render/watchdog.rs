//! The GPU memory watchdog (`gpu-node-agent watchdog`, ClusterPolicy `watchdog`, ours) on port 9402, with its
//! Service and, when asked, a ServiceMonitor.
//!
//! Its own DaemonSet rather than a container of the exporter's: it runs in the host's PID namespace and signals
//! other users' processes, rights the exporter must not have; it can be off while metrics are on; and a failure
//! of one does not take the other down.

use crd::cluster_policy::{
    DEFAULT_GRACE_PERIOD_SECONDS, DEFAULT_INTERVAL_SECONDS, DEFAULT_KILL_GRACE_PERIOD_SECONDS,
};

use super::RenderedObject;
use super::common::{
    Awaits, HostMount, NODE_AGENT, OperandDaemonSet, RootFs, User, confined, container,
    gpu_access_env, node_name_env, port,
};
use super::metrics::{self, MetricsPort, ServiceSettings};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

const METRICS: MetricsPort = MetricsPort {
    component: Component::Watchdog,
    port: 9402,
    service_port_name: "watchdog-metrics",
};

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let spec = &policy.spec.watchdog;
    let kubelet_root = policy.spec.host_paths.kubelet_root_dir.as_str();
    let seconds = |value: Option<i64>, default: u32| value.unwrap_or(default.into()).to_string();
    let listen = format!(":{}", METRICS.port);
    let interval = seconds(spec.interval_seconds, DEFAULT_INTERVAL_SECONDS);
    let grace = seconds(spec.grace_period_seconds, DEFAULT_GRACE_PERIOD_SECONDS);
    let kill_grace = seconds(
        spec.kill_grace_period_seconds,
        DEFAULT_KILL_GRACE_PERIOD_SECONDS,
    );
    let default_budget = match spec.default_budget.as_deref() {
        Some("none") => "none",
        _ => "replica-share",
    };
    let mut command = vec![
        NODE_AGENT,
        "watchdog",
        "--listen",
        &listen,
        "--kubelet-root",
        kubelet_root,
        "--interval-seconds",
        &interval,
        "--grace-period-seconds",
        &grace,
        "--kill-grace-period-seconds",
        &kill_grace,
        "--default-budget",
        default_budget,
    ];
    if spec.dry_run == Some(true) {
        command.push("--dry-run");
    }
    let mut ds = OperandDaemonSet::new(policy, facts, Component::Watchdog);
    ds.main = container(Component::Watchdog.app_name(), command);
    let mut env = vec![node_name_env()];
    env.extend(gpu_access_env());
    ds.main.env = Some(env);
    ds.main.ports = Some(vec![port("metrics", METRICS.port)]);
    // Root for the kubelet's pod-resources socket; of the capabilities only CAP_KILL, to signal the processes of
    // pods that run as other users.
    ds.main.security_context = confined(User::Root, &["KILL"], RootFs::ReadOnly);
    // The pids NVML reports are the host's: reading their cgroups in /proc and signalling them needs its PID
    // namespace.
    ds.host_pid = true;
    // Which pod holds which GPU replica, and how many replicas each GPU has.
    ds.mount(&HostMount::pod_resources(policy));
    ds.await_validation(Awaits::DriverAndToolkit);
    metrics::with_service(
        policy,
        facts,
        &METRICS,
        ds.build(),
        ServiceSettings::default(),
        spec.service_monitor.as_ref(),
    )
}

//! `spec.watchdog`: ours, not NVIDIA's. The GPU memory watchdog accounts each GPU process to its pod and signals
//! the processes of a pod that stays over its memory budget on a shared GPU. NVIDIA's ClusterPolicy has no such
//! section, so no policy written for NVIDIA's operator carries one, and its rules refuse only our own field's bad
//! values.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::common::{ContainerSpec, ImageSpec};
use super::operands::ServiceMonitorSpec;

/// Seconds between passes when unset.
pub const DEFAULT_INTERVAL_SECONDS: u32 = 5;
/// Seconds a pod may stay over its budget before SIGTERM, when unset.
pub const DEFAULT_GRACE_PERIOD_SECONDS: u32 = 30;
/// Seconds between SIGTERM and SIGKILL, when unset.
pub const DEFAULT_KILL_GRACE_PERIOD_SECONDS: u32 = 10;

/// The GPU memory watchdog (this operator's own, not part of NVIDIA's ClusterPolicy; off by default). On shared
/// GPUs (time-slicing and MPS replicas, DRA shares) each pod gets a memory budget on each GPU; a pod over it for
/// longer than the grace period has its largest process there terminated (SIGTERM, then SIGKILL), with a Warning
/// Event on the pod. Whole GPUs and MIG devices have no budget. Pods can lower their own budget with the
/// annotation nvidia.com/gpu-memory-limit (e.g. 8Gi).
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WatchdogSpec {
    /// Deploy the watchdog on GPU nodes (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Report (Events, logs, metrics) without ever signalling a process (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    /// Seconds between passes over the GPUs' processes, 1 to 300 (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 300").message("watchdog.intervalSeconds must be between 1 and 300 seconds"))]
    pub interval_seconds: Option<i64>,
    /// Seconds a pod may stay over its budget on a GPU before its largest process there gets SIGTERM, 0 to 3600
    /// (default 30). A spike that ends sooner costs nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 3600").message("watchdog.gracePeriodSeconds must be between 0 and 3600 seconds"))]
    pub grace_period_seconds: Option<i64>,
    /// Seconds after SIGTERM before SIGKILL, for a process that does not end, 1 to 600 (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 600").message("watchdog.killGracePeriodSeconds must be between 1 and 600 seconds"))]
    pub kill_grace_period_seconds: Option<i64>,
    /// Where a time-sliced (or MPS) GPU's budgets come from: replicaShare (the GPU's memory divided by its
    /// replicas, times the replicas a pod holds; the default) or none (only DRA claims and the pod annotation
    /// nvidia.com/gpu-memory-limit set budgets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['replicaShare', 'none']").message("watchdog.defaultBudget must be replicaShare or none"))]
    pub default_budget: Option<String>,
    /// Watchdog image (this operator's node agent unless set).
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Watchdog container resources, arguments and environment.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// A Prometheus-operator ServiceMonitor for the watchdog's metrics (port 9402).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<ServiceMonitorSpec>,
}

//! The operator's own Prometheus metrics, served on /metrics beside the probes: ours, and those of NVIDIA's
//! operator (controllers/operator_metrics.go) whose meaning this operator has, with NVIDIA's names, types and
//! values, so that alert rules written for NVIDIA's operator keep firing after a switch.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// Metrics of the reconcile loop and of what it found.
#[derive(Debug)]
pub struct Metrics {
    pub reconcile_duration: Histogram,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Watched objects left out because they do not deserialise, by kind: each time a list or a change brings one.
    pub unreadable_objects: Family<KindLabels, Counter>,
    pub gpu_nodes: Gauge,
    pub components_enabled: Gauge,
    pub components_ready: Gauge,
    nvidia: NvidiaMetrics,
    registry: Registry,
}

/// NVIDIA's operator metrics, by their names there.
#[derive(Debug, Default)]
struct NvidiaMetrics {
    /// `gpu_operator_gpu_nodes_total`.
    gpu_nodes_total: Gauge,
    /// `gpu_operator_reconciliation_status`: one of the [`ReconciliationStatus`] values.
    reconciliation_status: Gauge,
    /// `gpu_operator_reconciliation_last_success_ts_seconds`: Unix time of the last reconcile that found every
    /// enabled component ready.
    last_success: Gauge,
    /// `gpu_operator_reconciliation_total`.
    reconciliations: Counter,
    /// `gpu_operator_reconciliation_failed_total`.
    failed: Counter,
    /// `gpu_operator_auto_upgrade_enabled`: 1 while `driver.upgradePolicy.autoUpgrade` is on.
    auto_upgrade_enabled: Gauge,
    /// `gpu_operator_nodes_upgrades_in_progress`, `_done`, `_failed`, `_available`, `_pending`.
    upgrades_in_progress: Gauge,
    upgrades_done: Gauge,
    upgrades_failed: Gauge,
    upgrades_available: Gauge,
    upgrades_pending: Gauge,
}

/// The values of `gpu_operator_reconciliation_status`, as NVIDIA's operator sets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconciliationStatus {
    /// Every enabled component is ready.
    Success = 1,
    /// The policy was applied and some component is not ready yet.
    NotReady = 0,
    /// The ClusterPolicy cannot be used (this operator: its spec is invalid).
    ClusterPolicyUnavailable = -1,
    /// The reconcile failed.
    OperatorError = -2,
}

impl Default for Metrics {
    fn default() -> Self {
        let reconcile_duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let unreadable_objects = Family::<KindLabels, Counter>::default();
        let gpu_nodes = Gauge::default();
        let components_enabled = Gauge::default();
        let components_ready = Gauge::default();
        let mut registry = Registry::with_prefix("gpu_operator");
        registry.register(
            "reconcile_duration_seconds",
            "Time to reconcile the ClusterPolicy",
            reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by reason",
            reconcile_errors.clone(),
        );
        registry.register(
            "unreadable_objects",
            "Watched objects left out because they cannot be read, by kind",
            unreadable_objects.clone(),
        );
        registry.register("gpu_nodes", "Nodes with NVIDIA GPUs", gpu_nodes.clone());
        registry.register(
            "components_enabled",
            "Operands the active ClusterPolicy enables",
            components_enabled.clone(),
        );
        registry.register(
            "components_ready",
            "Enabled operands that are ready on every GPU node",
            components_ready.clone(),
        );
        let nvidia = NvidiaMetrics::default();
        registry.register(
            "gpu_nodes_total",
            "Number of nodes with GPUs (NVIDIA's name)",
            nvidia.gpu_nodes_total.clone(),
        );
        registry.register(
            "reconciliation_status",
            "1 if the reconciliation is currently successful, 0 if the operands are not ready, -1 if the cluster policy is unavailable, -2 if an error occurred within the operator",
            nvidia.reconciliation_status.clone(),
        );
        registry.register(
            "reconciliation_last_success_ts_seconds",
            "Timestamp (in seconds) of the last reconciliation that found every enabled operand ready",
            nvidia.last_success.clone(),
        );
        // Counters get the `_total` suffix from the encoder.
        registry.register(
            "reconciliation",
            "Total number of reconciliations",
            nvidia.reconciliations.clone(),
        );
        registry.register(
            "reconciliation_failed",
            "Number of failed reconciliations",
            nvidia.failed.clone(),
        );
        for (name, help, gauge) in [
            (
                "auto_upgrade_enabled",
                "1 if driver auto upgrade is enabled, 0 otherwise",
                &nvidia.auto_upgrade_enabled,
            ),
            (
                "nodes_upgrades_in_progress",
                "Total number of nodes on which the driver upgrade is in progress",
                &nvidia.upgrades_in_progress,
            ),
            (
                "nodes_upgrades_done",
                "Total number of nodes on which the driver upgrade is done",
                &nvidia.upgrades_done,
            ),
            (
                "nodes_upgrades_failed",
                "Total number of nodes on which the driver upgrade failed",
                &nvidia.upgrades_failed,
            ),
            (
                "nodes_upgrades_available",
                "Total number of nodes on which a driver upgrade can start now",
                &nvidia.upgrades_available,
            ),
            (
                "nodes_upgrades_pending",
                "Total number of nodes waiting for a driver upgrade",
                &nvidia.upgrades_pending,
            ),
        ] {
            registry.register(name, help, gauge.clone());
        }
        Self {
            reconcile_duration,
            reconcile_errors,
            unreadable_objects,
            gpu_nodes,
            components_enabled,
            components_ready,
            nvidia,
            registry,
        }
    }
}

impl Metrics {
    pub fn shared() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn observe_reconcile(&self, elapsed: Duration) {
        self.reconcile_duration.observe(elapsed.as_secs_f64());
        self.nvidia.reconciliations.inc();
    }

    /// A failed reconcile; `validate` (an invalid spec) leaves the ClusterPolicy unusable, any other reason is an
    /// error of the operator's, as NVIDIA's operator tells them apart.
    pub fn count_error(&self, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                reason: reason.into(),
            })
            .inc();
        self.nvidia.failed.inc();
        let status = if reason == "validate" {
            ReconciliationStatus::ClusterPolicyUnavailable
        } else {
            ReconciliationStatus::OperatorError
        };
        self.nvidia.reconciliation_status.set(status as i64);
    }

    /// What a reconcile that applied the policy found: GPU nodes, enabled and ready components, at `now`.
    pub fn record_policy_status(
        &self,
        gpu_nodes: usize,
        enabled: usize,
        ready: usize,
        now: SystemTime,
    ) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.gpu_nodes.set(count(gpu_nodes));
        self.nvidia.gpu_nodes_total.set(count(gpu_nodes));
        self.components_enabled.set(count(enabled));
        self.components_ready.set(count(ready));
        let status = if ready >= enabled {
            let seconds = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            self.nvidia
                .last_success
                .set(i64::try_from(seconds).unwrap_or(i64::MAX));
            ReconciliationStatus::Success
        } else {
            ReconciliationStatus::NotReady
        };
        self.nvidia.reconciliation_status.set(status as i64);
    }

    /// What a driver upgrade pass found, under NVIDIA's names.
    pub fn record_upgrades(&self, auto_upgrade: bool, summary: &crate::upgrade::decide::Summary) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.nvidia
            .auto_upgrade_enabled
            .set(i64::from(auto_upgrade));
        self.nvidia
            .upgrades_in_progress
            .set(count(summary.in_progress));
        self.nvidia.upgrades_done.set(count(summary.done));
        self.nvidia.upgrades_failed.set(count(summary.failed));
        self.nvidia.upgrades_available.set(count(summary.available));
        self.nvidia.upgrades_pending.set(count(summary.pending));
    }

    pub fn count_unreadable(&self, kind: &str) {
        self.unreadable_objects
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_the_operator_metrics() {
        let metrics = Metrics::default();
        metrics.observe_reconcile(Duration::from_millis(12));
        metrics.count_error("apply");
        metrics.gpu_nodes.set(3);
        let text = metrics.encode();
        assert!(
            text.contains("gpu_operator_reconcile_duration_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("gpu_operator_reconcile_errors_total{reason=\"apply\"} 1"),
            "{text}"
        );
        assert!(text.contains("gpu_operator_gpu_nodes 3"), "{text}");
    }

    /// The value of the series `name` (no labels) in `text`.
    fn value(text: &str, name: &str) -> Option<String> {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .map(str::to_owned)
    }

    /// `# TYPE` of `name` in `text`.
    fn type_of(text: &str, name: &str) -> Option<String> {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("# TYPE {name} ")))
            .map(str::to_owned)
    }

    /// Asserts each `(series, value)` of the current scrape.
    fn assert_values(metrics: &Metrics, expected: &[(&str, &str)]) {
        let text = metrics.encode();
        for (name, wanted) in expected {
            assert_eq!(
                value(&text, name).as_deref(),
                Some(*wanted),
                "{name}\n{text}"
            );
        }
    }

    #[test]
    fn serves_nvidias_operator_metrics_with_their_names_types_and_values() {
        let metrics = Metrics::default();
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        metrics.record_policy_status(4, 6, 5, now);
        metrics.observe_reconcile(Duration::from_millis(3));
        let text = metrics.encode();
        for gauge in [
            "gpu_operator_gpu_nodes_total",
            "gpu_operator_reconciliation_status",
            "gpu_operator_reconciliation_last_success_ts_seconds",
        ] {
            assert_eq!(type_of(&text, gauge).as_deref(), Some("gauge"), "{gauge}");
        }
        // OpenMetrics names a counter's family without `_total`; Prometheus stores the sample's name.
        for counter in [
            "gpu_operator_reconciliation",
            "gpu_operator_reconciliation_failed",
        ] {
            assert_eq!(
                type_of(&text, counter).as_deref(),
                Some("counter"),
                "{counter}"
            );
        }
        // One component not ready: never successful yet.
        assert_values(
            &metrics,
            &[
                ("gpu_operator_gpu_nodes_total", "4"),
                ("gpu_operator_reconciliation_status", "0"),
                ("gpu_operator_reconciliation_total", "1"),
                ("gpu_operator_reconciliation_last_success_ts_seconds", "0"),
            ],
        );
        metrics.record_policy_status(4, 6, 6, now);
        assert_values(
            &metrics,
            &[
                ("gpu_operator_reconciliation_status", "1"),
                (
                    "gpu_operator_reconciliation_last_success_ts_seconds",
                    "1700000000",
                ),
            ],
        );
        metrics.count_error("apply");
        assert_values(
            &metrics,
            &[
                ("gpu_operator_reconciliation_status", "-2"),
                ("gpu_operator_reconciliation_failed_total", "1"),
            ],
        );
        metrics.record_upgrades(
            true,
            &crate::upgrade::decide::Summary {
                in_progress: 2,
                done: 5,
                failed: 1,
                pending: 2,
                available: 0,
                ..Default::default()
            },
        );
        assert_values(
            &metrics,
            &[
                ("gpu_operator_auto_upgrade_enabled", "1"),
                ("gpu_operator_nodes_upgrades_in_progress", "2"),
                ("gpu_operator_nodes_upgrades_done", "5"),
                ("gpu_operator_nodes_upgrades_failed", "1"),
                ("gpu_operator_nodes_upgrades_available", "0"),
                ("gpu_operator_nodes_upgrades_pending", "2"),
            ],
        );
        metrics.count_error("validate");
        assert_values(
            &metrics,
            &[
                ("gpu_operator_reconciliation_status", "-1"),
                ("gpu_operator_reconciliation_failed_total", "2"),
            ],
        );
    }
}

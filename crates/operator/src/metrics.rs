//! The operator's own Prometheus metrics, served on /metrics beside the probes.

use std::sync::Arc;
use std::time::Duration;

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
    registry: Registry,
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
        Self {
            reconcile_duration,
            reconcile_errors,
            unreadable_objects,
            gpu_nodes,
            components_enabled,
            components_ready,
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
    }

    pub fn count_error(&self, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                reason: reason.into(),
            })
            .inc();
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
}

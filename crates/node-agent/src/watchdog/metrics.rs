//! The watchdog's metrics: each pod's GPU memory and budget on the GPUs it shares, the signals sent, and the
//! processes it cannot attribute. Labels follow the exporter's (`gpu`, `UUID`, `hostname`, `namespace`, `pod`).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::assess::Assessment;
use super::decide::Action;
use crate::accounting::Accounting;

type Labels = Vec<(&'static str, String)>;

/// The registry and its families.
#[derive(Debug)]
pub struct WatchdogMetrics {
    hostname: String,
    registry: Registry,
    used: Family<Labels, Gauge>,
    budget: Family<Labels, Gauge>,
    kills: Family<Labels, Counter>,
    unattributed: Family<Labels, Gauge>,
}

impl WatchdogMetrics {
    /// Empty families, labelled with `hostname`.
    #[must_use]
    pub fn new(hostname: &str) -> Self {
        let mut registry = Registry::default();
        let used = Family::<Labels, Gauge>::default();
        let budget = Family::<Labels, Gauge>::default();
        let kills = Family::<Labels, Counter>::default();
        let unattributed = Family::<Labels, Gauge>::default();
        registry.register(
            "gpu_watchdog_pod_memory_used_bytes",
            "GPU memory the processes of a pod use on a GPU",
            used.clone(),
        );
        registry.register(
            "gpu_watchdog_pod_budget_bytes",
            "GPU memory a pod may use on a shared GPU, and the rule that set it (source)",
            budget.clone(),
        );
        // Written `gpu_watchdog_kills_total`.
        registry.register(
            "gpu_watchdog_kills",
            "Signals sent to processes of pods over their GPU memory budget (dry_run: reported, not sent)",
            kills.clone(),
        );
        registry.register(
            "gpu_watchdog_unattributed_processes",
            "GPU processes that belong to no pod of this node: reported, never signalled",
            unattributed.clone(),
        );
        Self {
            hostname: hostname.to_owned(),
            registry,
            used,
            budget,
            kills,
            unattributed,
        }
    }

    fn gpu_labels(&self, gpu: u32, uuid: &str) -> Labels {
        vec![
            ("gpu", gpu.to_string()),
            ("UUID", uuid.to_owned()),
            ("hostname", self.hostname.clone()),
        ]
    }

    /// Shows one pass: series of pods and GPUs that are gone go too.
    pub fn show(&self, accounting: &Accounting, assessment: &Assessment) {
        self.used.clear();
        self.budget.clear();
        self.unattributed.clear();
        for gpu in &accounting.gpus {
            let count = assessment
                .unattributed
                .iter()
                .filter(|process| process.gpu == gpu.index)
                .count();
            self.unattributed
                .get_or_create(&self.gpu_labels(gpu.index, &gpu.uuid))
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        for pod in &assessment.pods {
            let mut labels = self.gpu_labels(pod.gpu, &pod.gpu_uuid);
            labels.push(("namespace", pod.pod.namespace.clone()));
            labels.push(("pod", pod.pod.pod.clone()));
            self.used
                .get_or_create(&labels)
                .set(i64::try_from(pod.used_bytes).unwrap_or(i64::MAX));
            if let Some(budget) = &pod.budget {
                labels.push(("source", budget.source.label().to_owned()));
                self.budget
                    .get_or_create(&labels)
                    .set(i64::try_from(budget.bytes).unwrap_or(i64::MAX));
            }
        }
    }

    /// Counts a signal (sent, or reported in a dry run).
    pub fn count(&self, action: &Action) {
        let mut labels = self.gpu_labels(action.over.gpu, &action.over.gpu_uuid);
        labels.extend([
            ("namespace", action.over.pod.namespace.clone()),
            ("pod", action.over.pod.pod.clone()),
            ("container", action.target.container.clone()),
            ("signal", action.signal.name().to_owned()),
            ("dry_run", action.dry_run.to_string()),
        ]);
        self.kills.get_or_create(&labels).inc();
    }

    /// The text exposition of every family.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

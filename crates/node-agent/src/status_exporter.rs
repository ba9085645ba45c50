//! The `status-exporter` role (the operator's `nodeStatusExporter`): the node's readiness as the operator sees it,
//! as Prometheus gauges on port 8000, so that alerts can fire on a node whose driver stopped validating, whose MIG
//! change failed or whose GPUs went Unhealthy, without reading the API server:
//!
//! - `gpu_operator_node_metrics_ready_ts_seconds`: when the exporter started (Unix time);
//! - `gpu_operator_node_driver_ready`, `gpu_operator_node_toolkit_ready`: 1 while the validator's ready file
//!   exists, else 0; `gpu_operator_node_driver_validation`: the same for the driver, which the validator writes
//!   only once the driver validated; `gpu_operator_node_{driver,toolkit}_validation_last_success_ts_seconds`: when
//!   it was written (Unix time), only while it exists;
//! - from the node's GPUNode status: `gpu_operator_node_gpus`, `gpu_operator_node_device_plugin_devices{resource}`
//!   (healthy devices advertised) and their sum `gpu_operator_node_device_plugin_devices_total`,
//!   `gpu_operator_node_device_plugin_unhealthy_gpus`, `gpu_operator_node_mig_config_state{config, state}` and
//!   `gpu_operator_node_health{health}` (1 for the current value). The GPUNode is watched, so a scrape costs no API
//!   call.
//!
//! The names NVIDIA's node status exporter also serves (its validator's metrics.go) have its meaning, type (gauge)
//! and label (`node`), so that its alert rules keep firing. Every series carries `node`. [`render`] is pure; [`run`]
//! reads the files, watches the GPUNode and serves HTTP.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::header::{CONTENT_TYPE, HeaderName};
use axum::routing::get;
use crd::gpu_node::{GpuNodeStatus, MigState};
use futures::StreamExt;
use node_runtime::kube_io;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::info;

use crate::cli::StatusExporterArgs;
use crate::validate::Part;

/// OpenMetrics text, which prometheus-client writes (every series here is a gauge, so nothing is renamed).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The validated parts, in the order they are exported.
const PARTS: [(Part, &str); 2] = [(Part::Driver, "driver"), (Part::Toolkit, "toolkit")];

/// What one scrape reports: the ready files (when each was written, `None` when missing) and GPUNode status.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    /// The node's name (the `node` label).
    pub node: String,
    /// When the exporter started.
    pub started: SystemTime,
    /// Each validated part's ready file: when it was written, or `None` while it is missing.
    pub ready: Vec<(Part, Option<SystemTime>)>,
    /// The node's GPUNode status, `None` while there is none.
    pub status: Option<GpuNodeStatus>,
}

type Labels = Vec<(String, String)>;

/// A gauge family registered under `name` with `help`.
fn family(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let family = Family::<Labels, Gauge>::default();
    registry.register(name, help, family.clone());
    family
}

/// The metrics of one state, as OpenMetrics text.
#[must_use]
pub fn render(state: &NodeState) -> String {
    let mut registry = Registry::default();
    let node = |more: &[(&str, &str)]| -> Labels {
        std::iter::once(("node", state.node.as_str()))
            .chain(more.iter().copied())
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect()
    };
    let unix_seconds = |at: SystemTime| {
        at.duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|since| i64::try_from(since.as_secs()).ok())
    };
    if let Some(seconds) = unix_seconds(state.started) {
        family(
            &mut registry,
            "gpu_operator_node_metrics_ready_ts_seconds",
            "When the node status exporter started (Unix time).",
        )
        .get_or_create(&node(&[]))
        .set(seconds);
    }
    for (part, name) in PARTS {
        let written = state
            .ready
            .iter()
            .find(|(ready, _)| *ready == part)
            .and_then(|(_, written)| *written);
        family(
            &mut registry,
            &format!("gpu_operator_node_{name}_ready"),
            &format!("1 while the validator's {name} ready file exists, else 0."),
        )
        .get_or_create(&node(&[]))
        .set(i64::from(written.is_some()));
        if part == Part::Driver {
            family(
                &mut registry,
                "gpu_operator_node_driver_validation",
                "1 if the driver validated on the node (its ready file exists), else 0.",
            )
            .get_or_create(&node(&[]))
            .set(i64::from(written.is_some()));
        }
        let last_success = family(
            &mut registry,
            &format!("gpu_operator_node_{name}_validation_last_success_ts_seconds"),
            &format!("When the {name} last validated (Unix time), while it is ready."),
        );
        if let Some(seconds) = written.and_then(unix_seconds) {
            last_success.get_or_create(&node(&[])).set(seconds);
        }
    }
    if let Some(status) = &state.status {
        family(&mut registry, "gpu_operator_node_gpus", "GPUs on the node.")
            .get_or_create(&node(&[]))
            .set(i64::from(status.gpu_count));
        if let Some(plugin) = &status.device_plugin {
            let devices = family(
                &mut registry,
                "gpu_operator_node_device_plugin_devices",
                "Healthy devices the device plugin advertises, by resource.",
            );
            for resource in &plugin.resources {
                devices
                    .get_or_create(&node(&[("resource", &resource.name)]))
                    .set(i64::from(resource.count));
            }
            family(
                &mut registry,
                "gpu_operator_node_device_plugin_devices_total",
                "Number of GPU devices the device plugin advertises on the node, every resource together.",
            )
            .get_or_create(&node(&[]))
            .set(plugin.resources.iter().map(|r| i64::from(r.count)).sum());
            family(
                &mut registry,
                "gpu_operator_node_device_plugin_unhealthy_gpus",
                "GPUs whose devices are Unhealthy after a critical XID.",
            )
            .get_or_create(&node(&[]))
            .set(i64::try_from(plugin.unhealthy_gpus.len()).unwrap_or(i64::MAX));
        }
        if let Some(mig) = &status.mig {
            family(
                &mut registry,
                "gpu_operator_node_mig_config_state",
                "1 for the MIG config the node is on and the state of applying it.",
            )
            .get_or_create(&node(&[
                ("config", mig.config.as_deref().unwrap_or_default()),
                ("state", mig.state.map_or("", MigState::as_str)),
            ]))
            .set(1);
        }
        if let Some(health) = &status.health {
            family(
                &mut registry,
                "gpu_operator_node_health",
                "1 for the node's GPU health: Healthy, Degraded or Unhealthy.",
            )
            .get_or_create(&node(&[("health", health.as_str())]))
            .set(1);
        }
    }
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &registry);
    text
}

/// When each part's ready file was written, `None` when it is missing (or unreadable).
fn read_ready(folder: &Path) -> Vec<(Part, Option<SystemTime>)> {
    PARTS
        .iter()
        .map(|(part, _)| {
            let written = std::fs::metadata(folder.join(part.file_name()))
                .and_then(|metadata| metadata.modified())
                .ok();
            (*part, written)
        })
        .collect()
}

#[derive(Clone)]
struct Sources {
    node: String,
    started: SystemTime,
    validations: PathBuf,
    status: watch::Receiver<Option<GpuNodeStatus>>,
}

async fn metrics(State(sources): State<Sources>) -> ([(HeaderName, &'static str); 1], String) {
    let state = NodeState {
        node: sources.node.clone(),
        started: sources.started,
        ready: read_ready(&sources.validations),
        status: sources.status.borrow().clone(),
    };
    ([(CONTENT_TYPE, OPENMETRICS)], render(&state))
}

/// Serves `/metrics` and `/healthz` until the process is stopped.
///
/// # Errors
/// When the cluster cannot be reached at start or the address cannot be listened on.
pub async fn run(args: StatusExporterArgs) -> anyhow::Result<()> {
    let client = kube_io::client().await?;
    let (publish, status) = watch::channel(None);
    let mut changes = kube_io::watch_gpu_node(client, &args.node_name).boxed();
    tokio::spawn(async move {
        while let Some(gpu_node) = changes.next().await {
            publish.send_replace(gpu_node.and_then(|gpu_node| gpu_node.status));
        }
    });
    let sources = Sources {
        node: args.node_name.clone(),
        started: SystemTime::now(),
        validations: args.validations_dir.clone(),
        status,
    };
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(sources);
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let address: SocketAddr = listener.local_addr()?;
    info!(%address, node = %args.node_name, "status exporter serving /metrics");
    axum::serve(listener, router)
        .into_future()
        .await
        .context("serving /metrics")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crd::gpu_node::{AdvertisedResource, DevicePluginStatus, Health, MigStatus};

    use super::*;

    fn line<'t>(text: &'t str, prefix: &str) -> Option<&'t str> {
        text.lines().find(|line| line.starts_with(prefix))
    }

    #[test]
    fn ready_files_and_their_time() {
        let written = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let text = render(&NodeState {
            node: "gpu-0".into(),
            started: written,
            ready: vec![(Part::Driver, Some(written)), (Part::Toolkit, None)],
            status: None,
        });
        assert_eq!(
            line(&text, "gpu_operator_node_driver_ready"),
            Some("gpu_operator_node_driver_ready{node=\"gpu-0\"} 1")
        );
        assert_eq!(
            line(&text, "gpu_operator_node_toolkit_ready"),
            Some("gpu_operator_node_toolkit_ready{node=\"gpu-0\"} 0")
        );
        assert_eq!(
            line(
                &text,
                "gpu_operator_node_driver_validation_last_success_ts_seconds{"
            ),
            Some(
                "gpu_operator_node_driver_validation_last_success_ts_seconds{node=\"gpu-0\"} 1700000000"
            )
        );
        assert_eq!(
            line(
                &text,
                "gpu_operator_node_toolkit_validation_last_success_ts_seconds{"
            ),
            None,
            "not ready: no time"
        );
        assert_eq!(
            line(&text, "gpu_operator_node_driver_validation{"),
            Some("gpu_operator_node_driver_validation{node=\"gpu-0\"} 1")
        );
        assert_eq!(
            line(&text, "gpu_operator_node_metrics_ready_ts_seconds{"),
            Some("gpu_operator_node_metrics_ready_ts_seconds{node=\"gpu-0\"} 1700000000")
        );
        for nvidia_gauge in [
            "gpu_operator_node_metrics_ready_ts_seconds",
            "gpu_operator_node_driver_ready",
            "gpu_operator_node_driver_validation",
            "gpu_operator_node_driver_validation_last_success_ts_seconds",
        ] {
            assert!(
                text.lines()
                    .any(|l| l == format!("# TYPE {nvidia_gauge} gauge")),
                "{nvidia_gauge} is a gauge\n{text}"
            );
        }
        assert!(
            line(&text, "gpu_operator_node_gpus{").is_none(),
            "no GPUNode yet"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn gpu_node_status_as_gauges() {
        let status = GpuNodeStatus {
            gpu_count: 4,
            device_plugin: Some(DevicePluginStatus {
                config: None,
                resources: vec![AdvertisedResource {
                    name: "nvidia.com/gpu.shared".into(),
                    count: 12,
                }],
                unhealthy_gpus: vec![2],
                ..DevicePluginStatus::default()
            }),
            mig: Some(MigStatus {
                config: Some("all-1g.10gb".into()),
                state: Some(MigState::Failed),
                ..MigStatus::default()
            }),
            health: Some(Health::Degraded),
            ..GpuNodeStatus::default()
        };
        let text = render(&NodeState {
            node: "gpu-0".into(),
            started: UNIX_EPOCH,
            ready: Vec::new(),
            status: Some(status),
        });
        for expected in [
            "gpu_operator_node_gpus{node=\"gpu-0\"} 4",
            "gpu_operator_node_device_plugin_devices{node=\"gpu-0\",resource=\"nvidia.com/gpu.shared\"} 12",
            "gpu_operator_node_device_plugin_devices_total{node=\"gpu-0\"} 12",
            "gpu_operator_node_device_plugin_unhealthy_gpus{node=\"gpu-0\"} 1",
            "gpu_operator_node_mig_config_state{node=\"gpu-0\",config=\"all-1g.10gb\",state=\"failed\"} 1",
            "gpu_operator_node_health{node=\"gpu-0\",health=\"Degraded\"} 1",
        ] {
            assert!(
                text.lines().any(|line| line == expected),
                "{expected}\n{text}"
            );
        }
    }

    #[test]
    fn ready_files_are_read_from_the_folder() {
        let folder = tempfile::tempdir().unwrap();
        std::fs::write(folder.path().join("toolkit-ready"), "ok").unwrap();
        let ready = read_ready(folder.path());
        assert_eq!(ready.len(), 2);
        assert!(ready.contains(&(Part::Driver, None)));
        assert!(
            ready
                .iter()
                .any(|(part, written)| *part == Part::Toolkit && written.is_some())
        );
    }
}

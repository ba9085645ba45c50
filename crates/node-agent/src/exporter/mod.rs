//! The `exporter` role: DCGM-exporter compatible GPU metrics on `/metrics` (port 9400 in the operator's
//! DaemonSet), by the names, labels and types NVIDIA's dcgm-exporter uses, so existing dashboards and alerts keep
//! working. It needs no DCGM: readings come from the same [`GpuBackend`](gpu::GpuBackend) as every other role,
//! on NVML or the simulator.
//!
//! Layers: [`fields`] (the DCGM fields known), [`config`] (the metrics CSV, pure), [`xid`] and [`families`]
//! (readings in, metric families and their text out, pure), [`collect`] (reading the GPUs and asking the
//! kubelet's pod-resources API), [`server`] (HTTP), [`process_pods`] (the pods whose processes use the GPUs,
//! published in GPUNode status for the operator's driver upgrade), and here the ConfigMap watch and the wiring.
//!
//! Where it differs from dcgm-exporter, on purpose: every container sharing a GPU is attributed (not one pod per
//! GPU); the XID gauge clears after a quiet period; series of a GPU, MIG device or pod that is gone disappear
//! with it (each collection is built afresh, so memory stays flat); a reading the GPU does not give (NVML's
//! `NotSupported`) is left out rather than shown as 0, as dcgm-exporter does; fields NVML cannot give at all (DCP
//! `DCGM_FI_PROF_*` fields, which need DCGM's profiling module; dcgm-exporter's own `DCGM_EXP_*` fields; the vGPU
//! license state) are accepted in the config, so NVIDIA's CSVs apply unchanged, and logged once per config with
//! the reason.

#[cfg(test)]
pub(crate) mod accounted_scrape;
pub mod collect;
pub mod config;
pub mod families;
pub mod fields;
pub mod process_pods;
pub mod server;
pub mod xid;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use futures::StreamExt;
use kube::Client;
use node_runtime::backend::{GpuSource, Gpus};
use node_runtime::kube_io;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use self::collect::{Collector, ProcessAccounting};
use self::config::{ConfigMapError, Selection, from_config_map};
use crate::accounting::pods;
use crate::cli::ExporterArgs;

/// Runs the role until the process is stopped.
///
/// # Errors
/// When it cannot start: no GPUs, the address taken, no API access when a ConfigMap is named.
pub async fn run(args: ExporterArgs, source: &GpuSource) -> anyhow::Result<()> {
    let gpus = Gpus::open_reading_node(source, Some(&args.node_name)).await?;
    let (selections, selection) = watch::channel(Arc::new(Selection::default()));
    if let Some(name) = &args.metrics_config_map {
        let client = kube_io::client().await?;
        // The DaemonSet runs in the operator's namespace, where the ConfigMap is: the client's default namespace
        // (the pod's own, in a cluster) serves when OPERATOR_NAMESPACE is not set.
        let namespace = args
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        tokio::spawn(follow_config(client, namespace, name.clone(), selections));
    }
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    info!(
        address = %listener.local_addr()?,
        node = %args.node_name,
        interval_seconds = args.collect_interval.as_secs(),
        "exporter serving /metrics"
    );
    let mut collector = Collector::new(
        gpus.clone(),
        &args.node_name,
        args.kubelet_root.clone(),
        args.xid_clear_seconds,
    );
    if let Some(proc_root) = &args.proc_root {
        let (pods, watch) = pods::watch_node_pods(kube_io::client().await?, &args.node_name);
        tokio::spawn(watch);
        pods.wait_until_ready()
            .await
            .context("watching this node's pods")?;
        let accounting = ProcessAccounting {
            proc_root: proc_root.clone(),
            pods,
        };
        tokio::spawn(process_pods::publish(
            kube_io::client().await?,
            args.node_name.clone(),
            gpus,
            accounting.clone(),
            args.collect_interval,
        ));
        collector = collector.with_accounting(accounting);
    }
    server::serve(listener, collector, selection, args.collect_interval)
        .await
        .context("serving /metrics")
}

/// Logs the listed fields that are never exported, with the reason, once per selection.
fn tell_unavailable(selection: &Selection, origin: &str) {
    for field in selection.unavailable() {
        warn!(
            field = %field.name,
            line = field.line,
            origin,
            reason = field.why.reason(),
            "metrics config lists a field this exporter cannot read; it is not exported"
        );
    }
}

/// Follows the metrics ConfigMap, publishing each good selection; a bad or missing one keeps the current
/// selection (at start, the default set) and says what to fix.
async fn follow_config(
    client: Client,
    namespace: String,
    name: String,
    selections: watch::Sender<Arc<Selection>>,
) {
    let mut changes = kube_io::watch_config_map(client, &namespace, &name).boxed();
    // A watch re-delivers the same object when it restarts: act only on changed data.
    let mut seen: Option<Option<BTreeMap<String, String>>> = None;
    while let Some(config_map) = changes.next().await {
        let data = config_map
            .as_ref()
            .map(|cm| cm.data.clone().unwrap_or_default());
        if seen.as_ref() == Some(&data) {
            continue;
        }
        seen = Some(data);
        match from_config_map(config_map.as_ref()) {
            Ok((key, selection)) => {
                info!(
                    config_map = %format!("{namespace}/{name}"),
                    %key,
                    fields = selection.fields().len(),
                    "metrics config applied"
                );
                tell_unavailable(&selection, &format!("{namespace}/{name}"));
                selections.send_replace(Arc::new(selection));
            }
            Err(error) => {
                let kept = selections.borrow().fields().len();
                match error {
                    // One warning a line, each naming its line and fix.
                    ConfigMapError::Csv { key, errors } => {
                        for error in errors {
                            warn!("metrics ConfigMap {namespace}/{name}, key {key}: {error}");
                        }
                    }
                    other => warn!("metrics ConfigMap {namespace}/{name} {other}"),
                }
                warn!(
                    "metrics ConfigMap {namespace}/{name} not applied; still exporting the previous selection ({kept} fields)"
                );
            }
        }
    }
}

//! The `node-facts` role: publishes the Node Feature Discovery labels NVIDIA's operator (and this one) selects
//! GPU nodes and driver pools by (`feature.node.kubernetes.io/pci-10de.present`, `system-os_release.ID`,
//! `system-os_release.VERSION_ID`, `kernel-version.full`, ...), so that no NFD deployment is needed.
//!
//! It runs on every node, not only on GPU nodes like feature discovery: the operator marks GPU nodes (and
//! schedules feature discovery there) by these very labels, so a role limited to GPU nodes would never start on a
//! new one. It needs no driver and no GPU access: it reads the host's `os-release` under `--host-root`, the
//! kernel release and sysfs. Where NFD runs, NFD owns the labels and this role writes nothing ([`nfd`]).

pub mod nfd;

use anyhow::Context;
use gpu::SimulatedGpus;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use node_runtime::backend::{GpuSource, Simulate};
use node_runtime::kube_io::{self, NodeApi, Watched};
use node_runtime::run_loop::run_on_changes;
use tracing::{debug, info, instrument, warn};

use crate::cli::NodeFactsArgs;
use crd::labels::SIMULATED_GPUS_ANNOTATION;
use node_runtime::host::{self, HostFacts, NVIDIA_VENDOR, PCI_CLASS_3D, PciDevice};

/// Runs the role until the process is stopped: a pass on every change of the Node as watched, and every
/// `--interval` (the host's files have no change events).
///
/// # Errors
/// When the role cannot start (no API access), or its watch ends.
pub async fn run(args: NodeFactsArgs, source: &GpuSource) -> anyhow::Result<()> {
    let client = kube_io::client().await?;
    let node_api = NodeApi::new(client.clone(), &args.node_name);
    info!(node = %args.node_name, host_root = %args.host_root.display(), "node facts started");
    // The Node comes from a watch, not a read per pass: this role runs on every node of the cluster, where a GET
    // a minute each would be 5,000 requests a minute at 5,000 nodes. No ConfigMap, so no namespace.
    let inputs = kube_io::watch_inputs(&node_api, client, "", None);
    let ended = run_on_changes(
        inputs,
        Some(args.interval),
        async |latest: Option<Watched>| match latest {
            Some(watched) => pass(&args, source, &node_api, &watched.node).await,
            None => Ok(()),
        },
    )
    .await;
    Err(ended.into())
}

/// One pass over the Node as last watched: read the facts, patch what differs.
#[instrument(skip_all, fields(node = %node_api.name()))]
async fn pass(
    args: &NodeFactsArgs,
    source: &GpuSource,
    node_api: &NodeApi,
    node: &Node,
) -> anyhow::Result<()> {
    let facts = read_facts(args, source, node);
    let desired = nfd::labels(&facts);
    match nfd::patch(node.labels(), node.annotations(), &desired) {
        None => debug!(
            annotation = nfd::NFD_MANAGED_ANNOTATION,
            "Node Feature Discovery manages this node's feature labels; leaving them to it"
        ),
        Some(patch) if patch.is_empty() => {}
        Some(patch) => {
            info!(changes = patch.labels.len(), "updating feature labels");
            node_api.patch(&patch).await?;
        }
    }
    Ok(())
}

/// The host's facts; a part that cannot be read is logged and left out (its labels are not written).
fn read_facts(args: &NodeFactsArgs, source: &GpuSource, node: &Node) -> HostFacts {
    let os_release = host::read_os_release(&args.host_root)
        .with_context(|| format!("reading os-release under {}", args.host_root.display()))
        .unwrap_or_else(|error| {
            warn!(error = %format!("{error:#}"), "no OS labels");
            Default::default()
        });
    let kernel = std::fs::read_to_string(&args.kernel_release_file)
        .map(|text| text.trim().to_owned())
        .inspect_err(|error| {
            warn!(file = %args.kernel_release_file.display(), %error, "no kernel labels");
        })
        .ok();
    let pci = match simulated_gpus(source, node) {
        Some(count) => simulated_pci(count),
        None => host::read_pci_devices(&args.pci_devices_dir)
            .inspect_err(|error| {
                warn!(dir = %args.pci_devices_dir.display(), %error, "no PCI labels");
            })
            .unwrap_or_default(),
    };
    HostFacts {
        os_release,
        kernel,
        pci,
    }
}

/// On the simulator, how many GPUs the node has (the development machine's own PCI devices say nothing about
/// a simulated node); `None` on real nodes.
fn simulated_gpus(source: &GpuSource, node: &Node) -> Option<u32> {
    let spec = match source.simulate.as_ref()? {
        Simulate::Gpus(spec) => Some(spec.clone()),
        Simulate::Node => kube_io::annotation(node, SIMULATED_GPUS_ANNOTATION)
            .and_then(|text| text.parse::<SimulatedGpus>().ok()),
    };
    Some(spec.map_or(0, |spec| spec.count()))
}

/// Simulated GPUs are data-centre models, which are 3D controllers.
fn simulated_pci(count: u32) -> Vec<PciDevice> {
    (0..count)
        .map(|index| PciDevice {
            address: format!("0000:{:02x}:00.0", 0x10 + index),
            vendor: NVIDIA_VENDOR,
            class: PCI_CLASS_3D << 8,
        })
        .collect()
}

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod tests;

//! The `discovery` role, GPU feature discovery: keeps the node's feature labels ([`labels`]) and its part of the
//! GPUNode status current. It runs again when the Node changes (its `nvidia.com/device-plugin.config` label),
//! when the device-plugin ConfigMap changes (sharing replicas), and every `--interval` (MIG geometry has no change
//! events); it writes only when something changed (and `nvidia.com/gfd.timestamp` at most every minute otherwise).

pub mod labels;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use crd::config::device_plugin::{MigStrategy, parse_config_map};
use crd::gpu_node::GpuNodeStatus;
use crd::labels::{DEVICE_PLUGIN_CONFIG, SIMULATED_GPUS_ANNOTATION};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use tracing::{info, instrument, warn};

use self::labels::{Facts, PCI_CLASS_3D, Sharing};
use crate::backend::{GpuSource, Gpus};
use crate::cli::DiscoveryArgs;
use crate::gpunode::{DISCOVERY, GpuNodeWriter, inventory_status, node_error};
use crate::inventory::{self, GpuView};
use crate::kube_io::{self, NodeApi, Watched};
use crate::node_facts::host;

/// The component name in `lastError`.
const COMPONENT: &str = "discovery";
/// The well-known Node label with the machine type, used on the simulator (there is no DMI to read).
const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

/// Runs the role until the process is stopped.
///
/// # Errors
/// When the role cannot start: no API access, no GPUs.
pub async fn run(args: DiscoveryArgs, source: &GpuSource) -> anyhow::Result<()> {
    let name = &args.node.node_name;
    let client = kube_io::client().await?;
    let node_api = NodeApi::new(client.clone(), name);
    let node = node_api.get().await?;
    let gpus = Gpus::open(
        source,
        Some(name),
        kube_io::annotation(&node, SIMULATED_GPUS_ANNOTATION),
    )?;
    let mut status = GpuNodeWriter::new(client.clone(), name, DISCOVERY);
    status.ensure(&node).await?;
    let mut inputs = kube_io::watch_inputs(
        &node_api,
        client,
        &args.node.namespace,
        args.device_plugin_config_map.as_deref(),
    );
    info!(node = %name, strategy = ?args.mig_strategy, "feature discovery started");
    loop {
        let latest = inputs.borrow_and_update().clone();
        if let Some(watched) = latest
            && let Err(error) = reconcile(&args, &gpus, &node_api, &mut status, &watched).await
        {
            warn!(error = %format!("{error:#}"), "discovery pass failed; retrying at the next interval");
        }
        tokio::select! {
            changed = inputs.changed() => changed.context("the watch ended")?,
            () = tokio::time::sleep(args.interval) => {}
        }
    }
}

/// One pass: read the GPUs, compute the labels, patch what changed, report.
#[instrument(skip_all, fields(node = %node_api.name()))]
async fn reconcile(
    args: &DiscoveryArgs,
    gpus: &Gpus,
    node_api: &NodeApi,
    status: &mut GpuNodeWriter,
    watched: &Watched,
) -> anyhow::Result<()> {
    let node = &watched.node;
    let views = match gpus.run(|gpus| inventory::read(gpus.backend())).await {
        Ok(views) => views,
        Err(error) => {
            status
                .publish(GpuNodeStatus {
                    last_error: Some(node_error(COMPONENT, format!("reading the GPUs: {error}"))),
                    ..GpuNodeStatus::default()
                })
                .await?;
            return Err(error).context("reading the GPUs");
        }
    };
    let (sharing, strategy, config_problem) =
        sharing(args, node.labels(), watched.config_map.as_ref());
    let machine = machine_type(gpus, node, &args.machine_type_file);
    let pci_classes = pci_classes(gpus, &views, &args.pci_devices_dir);
    let computed = labels::labels(Facts {
        gpus: &views,
        strategy,
        sharing: sharing.as_ref(),
        machine: &machine,
        pci_classes: &pci_classes,
    });
    let problem = match &computed {
        Ok(labelled) => {
            let now = (!args.no_timestamp).then(unix_now);
            let patch = labels::patch(node.labels(), &labelled.labels, now);
            if !patch.is_empty() {
                info!(changes = patch.labels.len(), "updating feature labels");
                node_api.patch(&patch).await?;
            }
            let invalid = labelled.invalid.as_ref().map(ToString::to_string);
            if let Some(invalid) = &invalid {
                warn!(problem = %invalid, "labelled the node MIG-INVALID");
            }
            invalid.or(config_problem)
        }
        Err(error) => Some(error.to_string()),
    };
    status
        .publish(GpuNodeStatus {
            last_error: problem.map(|message| node_error(COMPONENT, message)),
            ..inventory_status(&views)
        })
        .await?;
    Ok(())
}

/// Seconds since the Unix epoch, for `gfd.timestamp`.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// The PCI class of each GPU by address, for `gpu.mode`: from sysfs on real nodes; on the simulator every GPU is a
/// 3D controller, as the data-centre models it simulates are.
fn pci_classes(gpus: &Gpus, views: &[GpuView], dir: &Path) -> BTreeMap<String, u32> {
    if gpus.simulator().is_some() {
        return views
            .iter()
            .map(|gpu| (labels::pci_address(&gpu.inventory.pci_bus_id), PCI_CLASS_3D))
            .collect();
    }
    match host::read_pci_devices(dir) {
        Ok(devices) => host::nvidia_classes(&devices),
        Err(error) => {
            warn!(dir = %dir.display(), %error, "cannot read the PCI classes; gpu.mode is unknown");
            BTreeMap::new()
        }
    }
}

/// The sharing and MIG strategy from the device-plugin config this node selects (its label, else the default
/// key, else the only key), and what is wrong with the selection, if anything. The config file's
/// `flags.migStrategy` wins over `--mig-strategy`, as the device plugin reads it from the same file.
fn sharing(
    args: &DiscoveryArgs,
    labels: &BTreeMap<String, String>,
    config_map: Option<&ConfigMap>,
) -> (Option<Sharing>, MigStrategy, Option<String>) {
    let (Some(name), Some(config_map)) = (&args.device_plugin_config_map, config_map) else {
        return (None, args.mig_strategy, None);
    };
    let data = config_map.data.clone().unwrap_or_default();
    let key = labels
        .get(DEVICE_PLUGIN_CONFIG)
        .or(args.default_config.as_ref())
        .cloned()
        .or_else(|| {
            (data.len() == 1)
                .then(|| data.keys().next().cloned())
                .flatten()
        });
    let Some(key) = key else {
        return (None, args.mig_strategy, None);
    };
    let mut parsed = parse_config_map(&data);
    if let Some(error) = parsed.errors.iter().find(|error| error.key == key) {
        let problem = format!("device-plugin ConfigMap {name}: {error}");
        return (None, args.mig_strategy, Some(problem));
    }
    let Some(config) = parsed.configs.remove(&key) else {
        let problem = format!("device-plugin ConfigMap {name} has no key {key}");
        return (None, args.mig_strategy, Some(problem));
    };
    let strategy = config
        .flags
        .as_ref()
        .and_then(|flags| flags.mig_strategy)
        .unwrap_or(args.mig_strategy);
    (Sharing::of(&config), strategy, None)
}

/// The machine type: the DMI product name on real nodes; the Node's instance-type label (or `unknown`) on the
/// simulator, where the DMI name would be the development machine's.
fn machine_type(gpus: &Gpus, node: &k8s_openapi::api::core::v1::Node, file: &Path) -> String {
    let unknown = || "unknown".to_owned();
    if gpus.simulator().is_some() {
        return kube_io::label(node, INSTANCE_TYPE_LABEL).map_or_else(unknown, str::to_owned);
    }
    std::fs::read_to_string(file).map_or_else(|_| unknown(), |text| text.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::config_map;
    use clap::Parser;

    fn args(line: &[&str]) -> DiscoveryArgs {
        let cli = crate::cli::Cli::try_parse_from(
            ["gpu-node-agent", "discovery", "--node-name", "n"]
                .iter()
                .chain(line),
        )
        .unwrap();
        match cli.command {
            crate::cli::Command::Discovery(args) => args,
            _ => unreachable!("parsed as discovery"),
        }
    }

    const SLICE_4: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";

    #[test]
    fn the_node_label_selects_the_config() {
        let args = args(&[
            "--mig-strategy",
            "single",
            "--device-plugin-config-map",
            "dp",
            "--default-config",
            "any",
        ]);
        let data = config_map(&[
            ("any", "version: v1\nflags:\n  migStrategy: mixed\n"),
            ("slice-4", SLICE_4),
        ]);
        let (sharing, strategy, problem) = sharing(&args, &BTreeMap::new(), Some(&data));
        assert_eq!(
            (sharing, strategy, problem),
            (None, MigStrategy::Mixed, None),
            "default key, its strategy"
        );
        let labelled = BTreeMap::from([(DEVICE_PLUGIN_CONFIG.to_owned(), "slice-4".to_owned())]);
        let (sharing, strategy, _) = super::sharing(&args, &labelled, Some(&data));
        assert_eq!(sharing.unwrap().resources["nvidia.com/gpu"].replicas, 4);
        assert_eq!(strategy, MigStrategy::Single);
        let missing = BTreeMap::from([(DEVICE_PLUGIN_CONFIG.to_owned(), "nope".to_owned())]);
        let (_, _, problem) = super::sharing(&args, &missing, Some(&data));
        assert_eq!(
            problem.as_deref(),
            Some("device-plugin ConfigMap dp has no key nope")
        );
    }

    #[test]
    fn a_single_key_is_used_without_label_or_default() {
        let args = args(&["--mig-strategy", "none", "--device-plugin-config-map", "dp"]);
        let (sharing, _, _) = super::sharing(
            &args,
            &BTreeMap::new(),
            Some(&config_map(&[("only", SLICE_4)])),
        );
        assert!(sharing.is_some());
        let (none, _, _) = super::sharing(&args, &BTreeMap::new(), None);
        assert!(none.is_none());
    }
}

//! The `discovery` role, GPU feature discovery: keeps the node's feature labels ([`labels`]) and its part of the
//! GPUNode status current. It runs again when the Node changes (its `nvidia.com/device-plugin.config` label),
//! when the device-plugin ConfigMap changes (sharing replicas), and every `--interval` (MIG geometry has no change
//! events); it writes only when something changed (and `nvidia.com/gfd.timestamp` at most every minute otherwise).

pub mod labels;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use crd::config::device_plugin::{
    ChoiceError, CommandLine, ConfigInputs, MigStrategy, NodeConfig, node_config,
};
use crd::gpu_node::GpuNodeStatus;
use crd::gpu_node::field_manager::DISCOVERY;
use crd::labels::DEVICE_PLUGIN_CONFIG;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use node_runtime::backend::{GpuSource, Gpus};
use node_runtime::gpunode::{GpuNodeWriter, inventory_status, node_error};
use node_runtime::inventory::{self, GpuView};
use node_runtime::kube_io::{self, NodeApi, Watched};
use node_runtime::run_loop::run_on_changes;
use node_runtime::start::NodeRole;
use tracing::{info, instrument, warn};

use self::labels::{Facts, Sharing};
use crate::cli::DiscoveryArgs;
use node_runtime::host::{self, PCI_CLASS_3D};

/// The component name in `lastError`.
const COMPONENT: &str = "discovery";
/// The well-known Node label with the machine type, used on the simulator (there is no DMI to read).
const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

/// Runs the role until the process is stopped.
///
/// # Errors
/// When the role cannot start: no API access, no GPUs.
pub async fn run(args: DiscoveryArgs, source: &GpuSource) -> anyhow::Result<()> {
    let role = NodeRole::start(source, &args.node.node_name).await?;
    let mut status = role.gpu_node_writer(DISCOVERY).await?;
    let inputs = kube_io::watch_inputs(
        &role.node_api,
        role.client.clone(),
        &args.node.namespace,
        args.device_plugin_config_map.as_deref(),
    );
    info!(node = %args.node.node_name, strategy = ?args.mig_strategy, "feature discovery started");
    let ended = run_on_changes(
        inputs,
        Some(args.interval),
        async |latest: Option<Watched>| match latest {
            Some(watched) => {
                reconcile(&args, &role.gpus, &role.node_api, &mut status, &watched).await
            }
            None => Ok(()),
        },
    )
    .await;
    Err(ended.into())
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
    let selected = select_config(args, node.labels(), watched.config_map.as_ref());
    let machine = machine_type(gpus, node, &args.machine_type_file);
    let pci_classes = pci_classes(gpus, &views, &args.pci_devices_dir);
    let computed = labels::labels(Facts {
        gpus: &views,
        strategy: selected.strategy,
        sharing: selected.sharing.as_ref(),
        machine: &machine,
        pci_classes: &pci_classes,
    });
    let problem = match &computed {
        Ok(labelled) => {
            let now = (!selected.no_timestamp).then(unix_now);
            let patch = labels::patch(node.labels(), &labelled.labels, now);
            if !patch.is_empty() {
                info!(changes = patch.labels.len(), "updating feature labels");
                node_api.patch(&patch).await?;
            }
            let invalid = labelled.invalid.as_ref().map(ToString::to_string);
            if let Some(invalid) = &invalid {
                warn!(problem = %invalid, "labelled the node MIG-INVALID");
            }
            invalid.or(selected.problem)
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

/// What feature discovery takes from the device-plugin config the node selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The sharing it sets up, if any.
    pub sharing: Option<Sharing>,
    /// The MIG strategy in effect.
    pub strategy: MigStrategy,
    /// Whether `gfd.timestamp` is left out.
    pub no_timestamp: bool,
    /// What is wrong with the selection, if anything.
    pub problem: Option<String>,
}

/// The config this node selects and what it sets, decided as the device plugin decides it ([`node_config`]), so
/// that the labels and the advertised resources agree. Without a ConfigMap, or without a key to choose, the
/// command line's settings on the built-in config; a chosen key that is missing or invalid is a problem, and the
/// labels follow the command line meanwhile.
#[must_use]
pub fn select_config(
    args: &DiscoveryArgs,
    labels: &BTreeMap<String, String>,
    config_map: Option<&ConfigMap>,
) -> Selected {
    let command_line = CommandLine {
        mig_strategy: args.mig_strategy,
        no_timestamp: args.no_timestamp,
    };
    let selected = |config: NodeConfig, problem| Selected {
        sharing: Sharing::of(&config.config),
        strategy: config.mig_strategy,
        no_timestamp: config.no_timestamp,
        problem,
    };
    let Some(name) = &args.device_plugin_config_map else {
        return selected(NodeConfig::built_in(command_line), None);
    };
    let inputs = ConfigInputs {
        map: name,
        data: config_map.and_then(|config_map| config_map.data.as_ref()),
        label: labels.get(DEVICE_PLUGIN_CONFIG).map(String::as_str),
        default: args.default_config.as_deref(),
    };
    match node_config(&inputs, command_line) {
        Ok(config) => selected(config, None),
        Err(ChoiceError::NoConfigMap(_) | ChoiceError::NoKey { .. }) => {
            selected(NodeConfig::built_in(command_line), None)
        }
        Err(error) => selected(
            NodeConfig::built_in(command_line),
            Some(format!("device-plugin config: {error}")),
        ),
    }
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
mod api_tests;

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
            (
                "any",
                "version: v1\nflags:\n  migStrategy: mixed\n  gfd:\n    noTimestamp: true\n",
            ),
            ("slice-4", SLICE_4),
        ]);
        assert_eq!(
            select_config(&args, &BTreeMap::new(), Some(&data)),
            Selected {
                sharing: None,
                strategy: MigStrategy::Single,
                no_timestamp: true,
                problem: None
            },
            "default key: --mig-strategy over its flags.migStrategy, its flags.gfd.noTimestamp"
        );
        let without_flag = self::args(&[
            "--device-plugin-config-map",
            "dp",
            "--default-config",
            "any",
        ]);
        assert_eq!(
            select_config(&without_flag, &BTreeMap::new(), Some(&data)).strategy,
            MigStrategy::Mixed,
            "without --mig-strategy, the file's"
        );
        let labelled = BTreeMap::from([(DEVICE_PLUGIN_CONFIG.to_owned(), "slice-4".to_owned())]);
        let selected = select_config(&args, &labelled, Some(&data));
        assert_eq!(
            selected.sharing.unwrap().resources["nvidia.com/gpu"].replicas,
            4
        );
        assert_eq!(selected.strategy, MigStrategy::Single);
        assert!(!selected.no_timestamp);
        let missing = BTreeMap::from([(DEVICE_PLUGIN_CONFIG.to_owned(), "nope".to_owned())]);
        assert_eq!(
            select_config(&args, &missing, Some(&data))
                .problem
                .as_deref(),
            Some(
                "device-plugin config: ConfigMap dp has no key \"nope\" (keys: any, slice-4); fix the node label or \
                 the ConfigMap"
            )
        );
    }

    #[test]
    fn a_single_key_is_used_without_label_or_default() {
        let args = args(&[
            "--mig-strategy",
            "none",
            "--device-plugin-config-map",
            "dp",
            "--no-timestamp",
        ]);
        let selected = select_config(
            &args,
            &BTreeMap::new(),
            Some(&config_map(&[("only", SLICE_4)])),
        );
        assert!(selected.sharing.is_some());
        assert!(selected.no_timestamp, "the command line's");
        assert!(
            select_config(&args, &BTreeMap::new(), None)
                .sharing
                .is_none()
        );
    }
}

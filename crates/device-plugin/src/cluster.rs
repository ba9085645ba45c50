//! The plugin's Kubernetes I/O: the config it follows (this Node's `nvidia.com/device-plugin.config` label and the
//! ConfigMap, both watched one object at a time with field selectors, never polled) and what it reports (GPUNode
//! `status.devicePlugin` and `status.lastError` by server-side apply as `gpu-device-plugin`, and a Warning Event on
//! the Node for each new config problem).

use crd::config::device_plugin::{CommandLine, ConfigInputs, NodeConfig, node_config};
use crd::dra::{GpuSet, Partition};
use crd::gpu_node::field_manager::DEVICE_PLUGIN;
use crd::gpu_node::{AdvertisedResource, DevicePluginStatus, GpuNodeStatus, Health};
use crd::labels::DEVICE_PLUGIN_CONFIG;
use kube::{Client, ResourceExt};
use node_runtime::gpunode::{GpuNodeWriter, inventory_status, node_error};
use node_runtime::kube_io::{self, NodeApi, Watched};
use node_runtime::run_loop::run_on_changes;
use node_runtime::start::NodeRole;
use tokio::sync::watch;

use crate::manager::{ConfigUpdate, Report};

/// The component name in GPUNode `lastError`.
pub const COMPONENT: &str = "device-plugin";
/// The reason of the Warning Event for a config that is not applied.
const CONFIG_REJECTED: &str = "DevicePluginConfigRejected";

/// Where the config comes from: the ConfigMap and its default key (`--config-map`, `--default-config`).
#[derive(Debug, Clone)]
pub struct ConfigSource {
    /// Namespace of the ConfigMap (the operator's).
    pub namespace: String,
    /// The ConfigMap's name.
    pub config_map: String,
    /// The key used when the node has no label.
    pub default_key: Option<String>,
}

/// The config updates for this node: every change of its labels or of the ConfigMap gives a new choice (or the
/// reason there is none). Without a ConfigMap and without a DRA driver beside the plugin, the built-in defaults,
/// once.
#[must_use]
pub fn config_updates(
    client: Client,
    node: &NodeApi,
    source: Option<ConfigSource>,
    command_line: CommandLine,
    dra_gpus: Option<GpuSet>,
) -> watch::Receiver<Option<ConfigUpdate>> {
    if source.is_none() && dra_gpus.is_none() {
        // The built-in config never changes, but the sender must live as long as the plugin: a closed channel
        // tells the plugin to withdraw everything and stop.
        let (sender, receiver) = watch::channel(Some(Ok(NodeConfig::built_in(command_line))));
        tokio::spawn(async move { sender.closed().await });
        return receiver;
    }
    let mut inputs = kube_io::watch_inputs(
        node,
        client,
        source
            .as_ref()
            .map_or("", |source| source.namespace.as_str()),
        source.as_ref().map(|source| source.config_map.as_str()),
    );
    let (sender, receiver) = watch::channel(None);
    tokio::spawn(async move {
        loop {
            let update = inputs
                .borrow_and_update()
                .as_ref()
                .map(|watched| choice(source.as_ref(), watched, command_line, dra_gpus.as_ref()));
            if update.is_some() {
                sender.send_if_modified(|current| {
                    let changed = *current != update;
                    *current = update;
                    changed
                });
            }
            if inputs.changed().await.is_err() || sender.is_closed() {
                break;
            }
        }
    });
    receiver
}

/// The config the latest Node and ConfigMap choose (the built-in one without a ConfigMap), with the command line's
/// settings over the file's flags, and the GPUs the node's DRA driver takes (`dra_gpus`, which the node's
/// `nvidia.com/dra.gpus` label overrides, decided as the DRA driver decides it).
pub fn choice(
    source: Option<&ConfigSource>,
    watched: &Watched,
    command_line: CommandLine,
    dra_gpus: Option<&GpuSet>,
) -> ConfigUpdate {
    let mut chosen = match source {
        None => NodeConfig::built_in(command_line),
        Some(source) => {
            let map = format!("{}/{}", source.namespace, source.config_map);
            let inputs = ConfigInputs {
                map: &map,
                data: watched
                    .config_map
                    .as_ref()
                    .and_then(|config_map| config_map.data.as_ref()),
                label: kube_io::label(&watched.node, DEVICE_PLUGIN_CONFIG),
                default: source.default_key.as_deref(),
            };
            node_config(&inputs, command_line).map_err(|error| error.to_string())?
        }
    };
    if let Some(dra_gpus) = dra_gpus {
        let defaults = Partition {
            dra: dra_gpus.clone(),
            shared: GpuSet::None,
            dynamic_mig: GpuSet::None,
        };
        chosen.dra_gpus = crd::dra::partition(&defaults, watched.node.labels()).0.dra;
    }
    Ok(chosen)
}

/// Writes every new report into the node's GPUNode (creating it when missing) and records a Warning Event for
/// each new error, until the reports end.
pub async fn publish_reports(role: NodeRole, reports: watch::Receiver<Report>) {
    let mut writer = GpuNodeWriter::new(role.client.clone(), role.node_api.name(), DEVICE_PLUGIN);
    let events = role.events(DEVICE_PLUGIN);
    let mut last_error = None;
    run_on_changes(reports, None, async |report: Report| {
        if report == Report::default() {
            return Ok(());
        }
        if report.error.is_some() && report.error != last_error {
            events
                .publish(
                    true,
                    CONFIG_REJECTED,
                    report.error.as_deref().unwrap_or_default(),
                )
                .await;
        }
        last_error.clone_from(&report.error);
        writer.ensure(&role.node).await?;
        writer.publish(status(&report)).await.map(drop)
    })
    .await;
}

/// The plugin's part of GPUNode status. The inventory fields are sent too, with the same values the node agent
/// sends: server-side apply then shares them instead of one side removing what the other wrote.
#[must_use]
pub fn status(report: &Report) -> GpuNodeStatus {
    let resources = report
        .resources
        .iter()
        .map(|(name, count)| AdvertisedResource {
            name: name.clone(),
            count: *count,
        })
        .collect();
    GpuNodeStatus {
        device_plugin: Some(DevicePluginStatus {
            config: report.config.clone(),
            resources,
            unhealthy_gpus: report.unhealthy.iter().copied().collect(),
            config_warnings: report.config_warnings.clone(),
        }),
        health: Some(Health::of(report.gpus.len(), report.unhealthy.len())),
        last_error: report
            .error
            .as_ref()
            .map(|error| node_error(COMPONENT, error.clone())),
        ..inventory_status(&report.gpus)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use k8s_openapi::api::core::v1::{ConfigMap, Node};

    use super::*;

    #[tokio::test]
    async fn without_a_config_map_the_built_in_config_stays_in_effect() {
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let node = NodeApi::new(client.clone(), "gpu-0");
        let mut configs = config_updates(client, &node, None, CommandLine::default(), None);
        assert_eq!(
            *configs.borrow_and_update(),
            Some(Ok(NodeConfig::built_in(CommandLine::default())))
        );
        // A closed channel makes the plugin withdraw its resources and stop, so it must stay open.
        let closed_or_changed =
            tokio::time::timeout(std::time::Duration::from_millis(100), configs.changed()).await;
        assert!(closed_or_changed.is_err(), "{closed_or_changed:?}");
    }

    #[test]
    fn the_label_and_the_config_map_choose() {
        let source = ConfigSource {
            namespace: "gpu-operator".into(),
            config_map: "cfg".into(),
            default_key: Some("any".into()),
        };
        let mut node = Node::default();
        node.metadata.labels = Some(BTreeMap::from([(
            DEVICE_PLUGIN_CONFIG.to_owned(),
            "slice-4".to_owned(),
        )]));
        let config_map = ConfigMap {
            data: Some(BTreeMap::from([(
                "any".to_owned(),
                "version: v1\n".to_owned(),
            )])),
            ..ConfigMap::default()
        };
        let watched = Watched {
            node,
            config_map: Some(config_map),
        };
        assert_eq!(
            choice(Some(&source), &watched, CommandLine::default(), None).unwrap_err(),
            "ConfigMap gpu-operator/cfg has no key \"slice-4\" (keys: any); fix the node label or the ConfigMap"
        );
        let unlabelled = Watched {
            node: Node::default(),
            ..watched
        };
        assert_eq!(
            choice(Some(&source), &unlabelled, CommandLine::default(), None)
                .unwrap()
                .name
                .as_deref(),
            Some("any")
        );
    }

    #[test]
    fn the_dra_driver_s_gpus_are_chosen_from_the_flag_and_the_node_label() {
        let mut node = Node::default();
        let watched = |node: &Node| Watched {
            node: node.clone(),
            config_map: None,
        };
        let all = GpuSet::All;
        let chosen = choice(None, &watched(&node), CommandLine::default(), Some(&all)).unwrap();
        assert_eq!(chosen.dra_gpus, GpuSet::All);
        assert_eq!(chosen.name, None, "the built-in config");
        node.metadata.labels = Some(BTreeMap::from([(
            crd::dra::LABEL_DRA_GPUS.to_owned(),
            "1".to_owned(),
        )]));
        let chosen = choice(None, &watched(&node), CommandLine::default(), Some(&all)).unwrap();
        assert_eq!(chosen.dra_gpus.to_string(), "1");
        let without_driver = choice(None, &watched(&node), CommandLine::default(), None).unwrap();
        assert_eq!(
            without_driver.dra_gpus,
            GpuSet::None,
            "no DRA driver, no GPU left out"
        );
    }

    #[test]
    fn status_carries_resources_config_and_error() {
        let report = Report {
            config: Some("slice-4".into()),
            resources: BTreeMap::from([("nvidia.com/gpu.shared".into(), 16)]),
            gpus: Vec::new(),
            error: Some("bad".into()),
            config_warnings: vec!["flags.plugin.futureFlag: unknown key, ignored".into()],
            unhealthy: BTreeSet::new(),
        };
        let status = status(&report);
        let plugin = status.device_plugin.unwrap();
        assert_eq!(plugin.config.as_deref(), Some("slice-4"));
        assert_eq!(
            plugin.config_warnings,
            ["flags.plugin.futureFlag: unknown key, ignored"]
        );
        assert_eq!(
            plugin.resources,
            [AdvertisedResource {
                name: "nvidia.com/gpu.shared".into(),
                count: 16
            }]
        );
        let error = status.last_error.unwrap();
        assert_eq!(
            (error.component.as_str(), error.message.as_str()),
            ("device-plugin", "bad")
        );
    }

    #[test]
    fn health_follows_the_unhealthy_gpus() {
        let report = Report {
            unhealthy: BTreeSet::from([2]),
            ..Report::default()
        };
        let status = status(&report);
        assert_eq!(status.device_plugin.unwrap().unhealthy_gpus, [2]);
        assert_eq!(status.health, Some(Health::Unhealthy), "no GPUs read");
    }
}

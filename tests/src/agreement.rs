//! Feature discovery's labels and the device plugin's resources agree on one node, whatever the MIG strategy and
//! wherever it is set: each binary is given its own command line (as the operator renders both from one
//! `mig.strategy`) and the same device-plugin ConfigMap, and decides through its own code path. Runs without a
//! cluster, on a simulated node.

use std::collections::BTreeMap;

use clap::Parser;
use crd::config::device_plugin::MigStrategy;
use crd::labels::DEVICE_PLUGIN_CONFIG;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use node_runtime::inventory::{self, GpuView};
use node_runtime::kube_io::Watched;
use node_runtime::testing::simulated;

const MAP: &str = "device-plugin-config";

/// The resources the labels promise: one `nvidia.com/mig-<profile>` per `mig-<profile>.count` label, and with
/// the single strategy `nvidia.com/gpu` as many as `gpu.count` (the MIG devices). Counts of zero promise nothing.
fn promised(labels: &BTreeMap<String, String>) -> BTreeMap<String, usize> {
    let count = |key: &str| labels[key].parse::<usize>().unwrap();
    let mut promised: BTreeMap<String, usize> = labels
        .keys()
        .filter_map(|key| {
            let resource = key.strip_suffix(".count")?;
            resource
                .starts_with("nvidia.com/mig-")
                .then(|| (resource.to_owned(), count(key)))
        })
        .collect();
    if labels.get("nvidia.com/mig.strategy").map(String::as_str) == Some("single") {
        promised.insert("nvidia.com/gpu".into(), count("nvidia.com/gpu.count"));
    }
    promised.retain(|_, count| *count > 0);
    promised
}

/// The words of `line`, with `--mig-strategy` when a strategy is given, as the operator renders it.
fn with_strategy(line: &str, strategy: Option<MigStrategy>) -> Vec<&str> {
    let flag = strategy.iter().flat_map(|s| ["--mig-strategy", s.as_str()]);
    line.split_whitespace().chain(flag).collect()
}

/// One node as both binaries see it: its GPUs, its Node, the device-plugin ConfigMap.
struct Inputs<'a> {
    gpus: &'a [GpuView],
    node: &'a Node,
    config_map: &'a ConfigMap,
}

impl Inputs<'_> {
    /// What feature discovery labels, started with `strategy` on the command line (none: the flag left out).
    fn discovery_promises(&self, strategy: Option<MigStrategy>) -> BTreeMap<String, usize> {
        let line = "gpu-node-agent discovery --node-name n --device-plugin-config-map device-plugin-config";
        let cli = node_agent::cli::Cli::try_parse_from(with_strategy(line, strategy)).unwrap();
        let node_agent::cli::Command::Discovery(args) = cli.command else {
            unreachable!("parsed as discovery")
        };
        let node_labels = self.node.metadata.labels.clone().unwrap_or_default();
        let selected =
            node_agent::discovery::select_config(&args, &node_labels, Some(self.config_map));
        assert_eq!(selected.problem, None);
        let labelled =
            node_agent::discovery::labels::labels(node_agent::discovery::labels::Facts {
                gpus: self.gpus,
                strategy: selected.strategy,
                sharing: selected.sharing.as_ref(),
                machine: "test",
                pci_classes: &BTreeMap::new(),
            })
            .unwrap();
        promised(&labelled.labels)
    }

    /// What the device plugin advertises, started with `strategy` on the command line (none: the flag left out).
    fn plugin_advertises(&self, strategy: Option<MigStrategy>) -> BTreeMap<String, usize> {
        let line = "gpu-device-plugin run --node-name n --config-map device-plugin-config";
        let cli = device_plugin::cli::Cli::try_parse_from(with_strategy(line, strategy)).unwrap();
        let device_plugin::cli::Command::Run(args) = cli.command else {
            unreachable!("parsed as run")
        };
        let source = device_plugin::cluster::ConfigSource {
            namespace: "gpu-operator".into(),
            config_map: MAP.into(),
            default_key: None,
        };
        let watched = Watched {
            node: self.node.clone(),
            config_map: Some(self.config_map.clone()),
        };
        let chosen =
            device_plugin::cluster::choice(Some(&source), &watched, args.command_line(), None)
                .unwrap();
        let planned: Vec<_> = self
            .gpus
            .iter()
            .map(|view| device_plugin::plan::PlannedGpu {
                view: view.clone(),
                numa_node: None,
            })
            .collect();
        // A config that does not fit the GPUs advertises nothing.
        device_plugin::plan::advertise(&planned, &chosen.config, chosen.mig_strategy)
            .map(|plan| {
                plan.iter()
                    .map(|(name, resource)| (name.to_string(), resource.devices.len()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Every strategy on the command line, in the file's `flags.migStrategy`, in both (disagreeing or not) and in
/// neither: on a node whose GPUs all have MIG on, where the strategy decides everything.
#[test]
fn labels_and_resources_agree_for_every_strategy() {
    let (_dir, simulator) = simulated("a100-40gb:2", &[("1g.5gb", 7)]);
    let gpus = inventory::read(simulator.as_ref()).unwrap();
    let mut node = Node::default();
    node.metadata.labels = Some(BTreeMap::from([(
        DEVICE_PLUGIN_CONFIG.to_owned(),
        "cfg".to_owned(),
    )]));
    let strategies = [
        None,
        Some(MigStrategy::None),
        Some(MigStrategy::Single),
        Some(MigStrategy::Mixed),
    ];
    let mut seen = BTreeMap::new();
    for file in strategies {
        let flags = file.map_or(String::new(), |s| format!("flags:\n  migStrategy: {s}\n"));
        let config_map = ConfigMap {
            data: Some(BTreeMap::from([(
                "cfg".to_owned(),
                format!("version: v1\n{flags}"),
            )])),
            ..ConfigMap::default()
        };
        for command_line in strategies {
            let inputs = Inputs {
                gpus: &gpus,
                node: &node,
                config_map: &config_map,
            };
            let labels = inputs.discovery_promises(command_line);
            let resources = inputs.plugin_advertises(command_line);
            assert_eq!(
                labels, resources,
                "--mig-strategy {command_line:?}, flags.migStrategy {file:?}"
            );
            // The command line wins, else the file, else none (NVIDIA's precedence).
            let effective = command_line.or(file).unwrap_or(MigStrategy::None);
            seen.entry(effective.as_str()).or_insert(resources);
        }
    }
    let expected = |pairs: &[(&str, usize)]| -> BTreeMap<String, usize> {
        pairs
            .iter()
            .map(|(name, n)| ((*name).to_owned(), *n))
            .collect()
    };
    assert_eq!(
        seen,
        BTreeMap::from([
            ("none", expected(&[])),
            ("single", expected(&[("nvidia.com/gpu", 14)])),
            ("mixed", expected(&[("nvidia.com/mig-1g.5gb", 14)])),
        ]),
        "each strategy advertises what it should"
    );
}

//! The command line: `run` (what the operator's DaemonSet starts; `crates/operator/src/render/device_plugin.rs`
//! fixes its flags) and `plan` (what a node would advertise, for admins checking a config change, and for tests).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use crd::config::device_plugin::{
    CommandLine, ConfigInputs, MigStrategy, NodeConfig, node_config, parse_tolerant,
};
use crd::paths::{CDI_DIR, KUBELET_ROOT, MPS_ROOT};
use k8s_openapi::api::core::v1::ConfigMap;
use node_runtime::backend::{GpuSource, Gpus};
use node_runtime::process::{self, Logging};
use node_runtime::start::NodeRole;
use tokio::sync::watch;

use crate::api::DEVICE_PLUGINS_DIR;
use crate::cluster::{ConfigSource, config_updates, publish_reports};
use crate::manager::{self, Options, Report};
use crate::plan::{PlannedGpu, advertise};
use node_runtime::health::HealthArgs;

/// `gpu-device-plugin`: the kubelet device plugin for NVIDIA GPUs.
#[derive(Debug, Parser)]
#[command(name = "gpu-device-plugin", version, about)]
pub struct Cli {
    /// Log format.
    #[command(flatten)]
    pub logging: Logging,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Where the GPUs come from (NVML unless `--simulate`).
    #[command(flatten)]
    pub gpus: GpuSource,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the node's GPUs to the kubelet until stopped.
    Run(RunArgs),
    /// Print every resource and device count the node would advertise with a config, or why it cannot.
    Plan(PlanArgs),
}

/// `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// MIG strategy (none, single or mixed); wins over the config's `flags.migStrategy`.
    #[arg(long)]
    pub mig_strategy: Option<MigStrategy>,
    /// The GPUs the node's DRA driver takes (`all`, `none`, or indices such as `0,2-3`), which the plugin leaves
    /// out; a node's `nvidia.com/dra.gpus` label overrides it. Without it no DRA driver runs beside the plugin.
    #[arg(long, env = "DRA_GPUS")]
    pub dra_gpus: Option<crd::dra::GpuSet>,
    /// Where the kubelet's `device-plugins` folder is: `/var/lib/kubelet` for every kubelet, whatever its
    /// `--root-dir`, since the kubelet fixes its registration socket's path.
    #[arg(long, default_value = KUBELET_ROOT)]
    pub kubelet_root: PathBuf,
    /// Root of the MPS control daemons' pipe directories on the host.
    #[arg(long, default_value = MPS_ROOT)]
    pub mps_root: PathBuf,
    /// ConfigMap (in the operator's namespace) holding named device-plugin configs.
    #[arg(long)]
    pub config_map: Option<String>,
    /// The ConfigMap key used when the node has no `nvidia.com/device-plugin.config` label.
    #[arg(long, requires = "config_map")]
    pub default_config: Option<String>,
    /// Hand out CDI device names too (by default), and write the CDI spec they refer to.
    #[arg(long)]
    pub cdi: bool,
    /// Where the CDI spec is written.
    #[arg(long, default_value = CDI_DIR)]
    pub cdi_dir: PathBuf,
    /// When GPUs are Unhealthy.
    #[command(flatten)]
    pub health: HealthArgs,
    /// Seconds between reads of the MIG devices (the driver has no event for MIG changes).
    #[arg(long, default_value_t = 10)]
    pub mig_poll_seconds: u64,
    /// This node.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The operator's namespace, where the ConfigMap is.
    #[arg(long, env = "OPERATOR_NAMESPACE", default_value = "gpu-operator")]
    pub namespace: String,
}

impl RunArgs {
    /// The settings that win over the config file's flags.
    #[must_use]
    pub fn command_line(&self) -> CommandLine {
        CommandLine {
            mig_strategy: self.mig_strategy,
            no_timestamp: false,
        }
    }
}

/// `plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// A device-plugin config file, or a ConfigMap manifest holding named configs.
    #[arg(long)]
    pub config: PathBuf,
    /// The config's name: the ConfigMap key to use (for a single config file, only shown).
    #[arg(long)]
    pub config_name: String,
    /// MIG strategy (none, single or mixed); wins over the config's `flags.migStrategy`.
    #[arg(long)]
    pub mig_strategy: Option<MigStrategy>,
    /// The node, for `--simulate node`.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
}

/// Runs the plugin: follows the config, serves the kubelet, reports into GPUNode status, until SIGTERM or Ctrl-C.
///
/// # Errors
/// When the cluster, the Node or the GPUs cannot be reached at start.
pub async fn run(args: RunArgs, source: &GpuSource) -> anyhow::Result<()> {
    let health = args.health.tracker()?;
    let role = NodeRole::start(source, &args.node_name).await?;
    let config_source = args.config_map.clone().map(|config_map| ConfigSource {
        namespace: args.namespace.clone(),
        config_map,
        default_key: args.default_config.clone(),
    });
    let configs = config_updates(
        role.client.clone(),
        &role.node_api,
        config_source,
        args.command_line(),
        args.dra_gpus.clone(),
    );
    let (report, reports) = watch::channel(Report::default());
    let gpus = role.gpus.clone();
    let options = Options {
        plugin_dir: args.kubelet_root.join(DEVICE_PLUGINS_DIR),
        cdi: args.cdi,
        cdi_dir: args.cdi_dir,
        mps_root: args.mps_root,
        start_mps: gpus.simulator().is_none(),
        health,
        mig_poll: Duration::from_secs(args.mig_poll_seconds.max(1)),
        health_poll: Duration::from_secs(1),
    };
    // The reports end when the plugin does, so the publisher never finishes first.
    tokio::select! {
        result = manager::run(options, gpus, configs, report) => result,
        () = publish_reports(role, reports) => Ok(()),
        () = process::stopped() => Ok(()),
    }
}

/// Plans the config on the GPUs and returns what `plan` prints: one `<resource>: <count>` line per resource.
///
/// # Errors
/// When the file cannot be read, the config is invalid or does not fit the GPUs.
pub async fn plan(args: &PlanArgs, source: &GpuSource) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let command_line = CommandLine {
        mig_strategy: args.mig_strategy,
        no_timestamp: false,
    };
    let chosen = match config_map_data(&text) {
        Some(data) => {
            let map = args.config.display().to_string();
            let inputs = ConfigInputs {
                map: &map,
                data: Some(&data),
                label: Some(&args.config_name),
                default: None,
            };
            node_config(&inputs, command_line)?
        }
        None => {
            let parsed =
                parse_tolerant(&text).with_context(|| format!("config {}", args.config_name))?;
            NodeConfig::new(Some(args.config_name.clone()), parsed, command_line)
        }
    };
    for warning in &chosen.warnings {
        tracing::warn!(config = %args.config_name, %warning, "config key ignored");
    }
    let gpus = Gpus::open_reading_node(source, args.node_name.as_deref()).await?;
    let views = node_runtime::inventory::read(gpus.backend())?;
    let planned: Vec<PlannedGpu> = views
        .into_iter()
        .map(|view| PlannedGpu {
            view,
            numa_node: None,
        })
        .collect();
    let plan = advertise(&planned, &chosen.config, chosen.mig_strategy)
        .with_context(|| format!("config {}", args.config_name))?;
    let mut out = String::new();
    for (name, resource) in &plan {
        let _ = writeln!(out, "{name}: {}", resource.devices.len());
    }
    Ok(out)
}

/// The data of a ConfigMap manifest, when the text is one.
fn config_map_data(text: &str) -> Option<BTreeMap<String, String>> {
    let config_map: ConfigMap = serde_saphyr::from_str(text).ok()?;
    config_map.data
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn accepts_the_operators_command_line() {
        // As crates/operator/src/render/device_plugin.rs renders it; NODE_NAME comes from the environment there.
        let cli = Cli::try_parse_from([
            "gpu-device-plugin",
            "run",
            "--mig-strategy",
            "mixed",
            "--kubelet-root",
            "/var/lib/kubelet",
            "--mps-root",
            "/run/nvidia/mps",
            "--config-map",
            "time-slicing-config",
            "--default-config",
            "any",
            "--cdi",
            "--node-name",
            "gpu-0",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.mig_strategy, Some(MigStrategy::Mixed));
        assert_eq!(
            (run.config_map.as_deref(), run.default_config.as_deref()),
            (Some("time-slicing-config"), Some("any"))
        );
        assert!(run.cdi);
        assert_eq!(run.health.health_recovery_seconds, 60);
        assert_eq!(run.cdi_dir, PathBuf::from("/var/run/cdi"));
    }

    #[test]
    fn plan_reads_a_config_map_manifest_or_a_single_config() {
        let manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  any: |\n    version: v1\n";
        assert_eq!(config_map_data(manifest).unwrap()["any"], "version: v1\n");
        assert!(config_map_data("version: v1\nsharing: {}\n").is_none());
    }
}

//! The `mig` role, NVIDIA's MIG manager: applies the geometry that the node's `nvidia.com/mig.config` label names
//! (from the mig-parted config in the ConfigMap `--config-map`), and reports `nvidia.com/mig.config.state` and the
//! node's GPUNode status. The modules split it into the pure decisions ([`observe`] reading one observation of the
//! node, [`assess`], [`state`], [`clients`]), the GPU work ([`gpus`]), the pod work ([`drain`], told which pods use
//! which GPU by [`holders`]), the reboot ([`reboot`]), the reporting ([`report`]) and the runner (`manager`, which
//! carries out each step through `steps`); [`admin`] is the admin CLI.
//!
//! `--gpu-clients-config-map` (host services that use the GPUs, stopped by NVIDIA's manager around a change) is
//! accepted so that the operator's command line works, but host services are not stopped: the agent logs that.

pub mod admin;
pub mod assess;
pub mod clients;
pub mod drain;
pub mod gpus;
pub mod holders;
mod manager;
pub mod observe;
pub mod reboot;
pub mod report;
pub mod state;
mod steps;

use anyhow::Context;
use crd::labels::SIMULATED_GPUS_ANNOTATION;
use tracing::{error, info, warn};

use crate::backend::{GpuSource, Gpus};
use crate::cli::MigArgs;
use crate::gpunode::{GpuNodeWriter, MIG_MANAGER};
use crate::kube_io::{self, NodeApi, NodeEvents};

pub use manager::Settings;

/// The ConfigMap key holding the mig-parted config, as in NVIDIA's operator.
pub const CONFIG_KEY: &str = "config.yaml";

/// NVIDIA's default mig-parted config with the configs `extra` appended, for the tests.
#[cfg(test)]
pub(crate) fn nvidia_config_with(extra: &str) -> String {
    let nvidia = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/nvidia/default-mig-parted-config.yaml"
    ));
    format!("{}\n{extra}", nvidia.trim_end())
}

/// Runs the role until the process is stopped.
///
/// # Errors
/// When the role cannot start: no node name, no API access, no GPUs.
pub async fn run(args: MigArgs, source: &GpuSource) -> anyhow::Result<()> {
    if let Some(action) = args.action {
        return admin::run(action, source).await;
    }
    let node_args = args
        .node
        .context("the mig role needs the node name (--node-name or NODE_NAME)")?;
    let config_map = args.config_map.context("the mig role needs --config-map")?;
    if let Some(clients) = &args.gpu_clients_config_map {
        warn!(
            config_map = %clients,
            "host GPU services listed in the GPU clients ConfigMap are not stopped by this MIG manager"
        );
    }
    let client = kube_io::client().await?;
    let node_api = NodeApi::new(client.clone(), &node_args.node_name);
    let node = node_api.get().await?;
    let gpus = Gpus::open(
        source,
        Some(&node_args.node_name),
        kube_io::annotation(&node, SIMULATED_GPUS_ANNOTATION),
    )?;
    let mut status = GpuNodeWriter::new(client.clone(), &node_args.node_name, MIG_MANAGER);
    status.ensure(&node).await?;
    let stored = status.stored().await?;
    let settings = Settings {
        namespace: node_args.namespace.clone(),
        config_map: config_map.clone(),
        default_config: args.default_config,
        with_reboot: args.with_reboot,
        reboot_command: args.reboot_command,
        clients_timeout: args.clients_timeout,
        eviction_timeout: args.eviction_timeout,
    };
    let mut manager = manager::MigManager::new(
        manager::Parts {
            node: node_api.clone(),
            gpus,
            status,
            events: NodeEvents::new(client.clone(), MIG_MANAGER, &node),
            pods: drain::NodePods::new(
                kube_io::client_without_retries().await?,
                &node_args.node_name,
                &node_args.namespace,
                &args.kubelet_root,
            ),
        },
        settings,
        stored.as_ref(),
    );
    info!(node = %node_args.node_name, %config_map, "MIG manager started");
    let mut inputs =
        kube_io::watch_inputs(&node_api, client, &node_args.namespace, Some(&config_map));
    let mut retry = crate::Backoff::default();
    loop {
        let latest = inputs.borrow_and_update().clone();
        let Some(watched) = latest else {
            inputs.changed().await.context("the watch ended")?;
            continue;
        };
        match manager.reconcile(&watched).await {
            Ok(()) => {
                retry.reset();
                inputs.changed().await.context("the watch ended")?;
            }
            Err(failure) => {
                error!(error = %failure, "reconcile failed; retrying");
                retry.wait_or(inputs.changed()).await;
            }
        }
    }
}

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
use crd::gpu_node::field_manager::MIG_MANAGER;
use node_runtime::backend::GpuSource;
use node_runtime::kube_io::{self, Watched};
use node_runtime::run_loop::run_on_changes;
use node_runtime::start::NodeRole;
use tracing::{info, warn};

use crate::cli::MigArgs;

pub use manager::Settings;

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
    let role = NodeRole::start(source, &node_args.node_name).await?;
    let status = role.gpu_node_writer(MIG_MANAGER).await?;
    let stored = status.stored().await?;
    let settings = Settings {
        namespace: node_args.namespace.clone(),
        config_map: config_map.clone(),
        default_config: args.default_config,
        with_reboot: args.with_reboot,
        clients_timeout: args.clients_timeout,
        eviction_timeout: args.eviction_timeout,
        dra: crd::dra::Partition {
            dra: args.dra_gpus.clone(),
            dynamic_mig: args.dra_dynamic_mig_gpus.clone(),
            ..crd::dra::Partition::default()
        },
    };
    let mut manager = manager::MigManager::new(
        manager::Parts {
            node: role.node_api.clone(),
            gpus: role.gpus.clone(),
            status,
            events: role.events(MIG_MANAGER),
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
    let inputs = kube_io::watch_inputs(
        &role.node_api,
        role.client,
        &node_args.namespace,
        Some(&config_map),
    );
    let ended = run_on_changes(inputs, None, async |latest: Option<Watched>| match latest {
        Some(watched) => manager.reconcile(&watched).await,
        None => Ok(()),
    })
    .await;
    Err(ended.into())
}

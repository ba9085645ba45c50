//! The DRA driver, `gpu-dra-driver`: the kubelet plugin of driver `gpu.nvidia.com` for this node (`run`), and the
//! placement planner behind `plan`. Built on `node-runtime`, as the node agent and the device plugin are, and
//! independent of both.
//!
//! - [`cli`]: the command line the operator's DaemonSet renders (`crates/operator/src/render/dra_driver.rs`).
//! - [`slices`] (pure): the devices and the ResourceSlice for the node's GPUs under its partition.
//! - [`publish`]: keeps the slice published (the kubelet deletes it when it starts) and GPUNode status current.
//! - [`claims`]: prepares and unprepares claims, idempotent and restart-safe through a checkpoint.
//! - [`prefetch`]: the claims of the pods bound to this node, read before the kubelet asks to prepare them.
//! - [`dynamic_mig`]: MIG on demand: the counters and placements published, the instances made and destroyed.
//! - [`packing`] (pure): claims arriving and leaving replayed against the scheduler's first fit over our device
//!   order and NVIDIA's (`cargo xtask bench`).
//! - [`cdi`] (pure, and the spec files): the per-claim CDI spec with the MPS limits.
//! - [`claim_status`]: what holds each shared claim to its share, in the claim's own status.
//! - [`service`]: plugin registration and the `v1.DRAPlugin` and `v1.DRAResourceHealth` gRPC services on unix
//!   sockets.
//! - [`health`]: the GPUs' XIDs as device health: for the kubelet (the health stream) and the scheduler (taints).
//! - [`authority`]: the front that lets the kubelet's registration requests through (their `:authority` is the
//!   socket's path, which HTTP/2 servers in Rust refuse).
//! - [`status`] (pure): the driver's part of GPUNode status.
//! - [`planner`] (pure, `crd::planner`, beside `crd::hami`'s request grammar): where requests would land on a set
//!   of devices, and what remains (`plan`).

use std::sync::Arc;

use crd::dra::Partition;
use gpu::simulator::Simulator;
use node_runtime::backend::{GpuSource, Gpus};
use node_runtime::start::NodeRole;
use tokio::sync::{Notify, watch};

use crate::cli::{PlanArgs, RunArgs};

pub mod authority;
pub mod cdi;
pub mod claim_status;
pub mod claims;
pub mod cli;
pub mod dynamic_mig;
pub mod health;
pub mod packing;
/// The placement planner behind `plan`, which the operator's HAMi webhook also asks (in `crd`, as both read it).
pub use crd::planner;
pub mod prefetch;
pub mod publish;
pub mod service;
pub mod slices;
pub mod status;

/// The kubelet's DRA plugin API, v1 (server for the driver, client for tests and the benchmark).
pub mod api {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// The kubelet's DRA resource health API, v1 (server for the driver, client for tests).
pub mod health_api {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/dra_health/v1.rs"));
}

/// The kubelet's plugin registration API (server for the driver, client for tests).
pub mod registration {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("pluginregistration");
}

/// Runs the driver: publishes the node's devices, then serves the kubelet.
///
/// # Errors
/// When the node or its GPUs cannot be read at start, the checkpoint is unreadable, or a server stops.
pub async fn run(args: RunArgs, source: &GpuSource) -> anyhow::Result<()> {
    let role = NodeRole::start(source, &args.node.node_name).await?;
    let (memory_limit_hook, host_warning) = memory_limit_hook(&args);
    let host = claims::HostPaths {
        cdi_dir: args.cdi_root.clone(),
        mps_root: args.mps_root.clone(),
        dev_root: args.dev_root.clone(),
        checkpoint: args.state_dir.join(claims::CHECKPOINT),
        memory_limit_hook,
    };
    let tracker = args.health.tracker()?;
    let start_mps = role.gpus.simulator().is_none();
    let boot_id = node_runtime::state_file::boot_id()?;
    claims::Checkpoint::move_from(
        &args.plugin_dir().join(claims::CHECKPOINT),
        &host.checkpoint,
    )?;
    let claims = Arc::new(
        claims::Claims::open(
            &args.node.node_name,
            host,
            role.gpus.clone(),
            start_mps,
            &boot_id,
        )
        .map_err(anyhow::Error::msg)?,
    );
    let faults = watch::channel(node_runtime::health::Faults::new()).0;
    let publisher = publish::Publisher {
        client: role.client.clone(),
        node: args.node.node_name.clone(),
        gpus: role.gpus.clone(),
        defaults: Partition {
            dra: args.gpus.clone(),
            shared: args.shared_gpus.clone(),
            dynamic_mig: args.dynamic_mig_gpus.clone(),
        },
        devices: watch::channel(Vec::new()).0,
        faults: faults.subscribe(),
        claims: claims.clone(),
        gpu_node: gpu_node_writer(&role).await,
        events: role.events(crd::gpu_node::field_manager::DRA_DRIVER),
        reported: std::collections::BTreeSet::new(),
        written: Vec::new(),
        host_warnings: host_warning.into_iter().collect(),
    };
    claims.restore_daemons().await;
    // The devices are known before the kubelet can call: a claim is never refused for want of them.
    let publication = publisher.publication(&role.node)?;
    for failure in claims
        .reconcile_instances(publication.on_demand_gpus.clone())
        .await
    {
        tracing::warn!(%failure, "a MIG instance no claim holds is left on a GPU served on demand");
    }
    publisher.devices.send_replace(publication.devices);
    let changed = Arc::new(Notify::new());
    let (pods, bound) =
        node_runtime::kube_io::watch_node_pods(role.client.clone(), &args.node.node_name);
    let prefetched = Arc::new(prefetch::Prefetched::new(pods));
    let read_ahead = prefetch::run(
        prefetched.clone(),
        bound,
        role.client.clone(),
        claims.clone(),
    );
    let statuses = Arc::new(claim_status::Queue::default());
    let status_writes = {
        let (statuses, client) = (statuses.clone(), role.client.clone());
        async move {
            statuses
                .run(|pending| claim_status::write(client.clone(), pending))
                .await;
        }
    };
    let driver = service::Driver {
        reader: prefetch::PrefetchingReader {
            client: role.client.clone(),
            prefetched,
        },
        claims,
        devices: publisher.devices.subscribe(),
        changed: changed.clone(),
        statuses,
    };
    let health = health::HealthService {
        pool: args.node.node_name.clone(),
        devices: publisher.devices.subscribe(),
    };
    let sockets = service::Sockets::under(&args.kubelet_root);
    let monitor = health::monitor(role.gpus.clone(), tracker, faults, changed.clone());
    tokio::select! {
        served = service::serve(&sockets, driver, health) => served,
        published = publisher.run(changed) => published,
        () = monitor => anyhow::bail!("the health monitor stopped"),
        () = read_ahead => anyhow::bail!("the watch of this node's pods stopped"),
        () = status_writes => anyhow::bail!("the writer of claims' device status stopped"),
    }
}

/// The toolkit's memory-limit hook, when one is configured and the host can take per-cgroup GPU memory limits
/// (the driver sets them on a cgroup v2 directory), or why it is not used.
fn memory_limit_hook(args: &RunArgs) -> (Option<std::path::PathBuf>, Option<String>) {
    let Some(hook) = args.memory_limit_hook.clone() else {
        return (None, None);
    };
    if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        (Some(hook), None)
    } else {
        let why = format!(
            "MEMORY_LIMIT_HOOK {} is not used: the host's cgroups are not cgroup v2 (unified), where the driver's GPU \
             memory limits apply; shared claims' memory is held by MPS",
            hook.display()
        );
        tracing::warn!("{why}");
        (None, Some(why))
    }
}

/// The GPUNode writer, retried with the one backoff until the GPUNode can be read or created: the kubelet must not
/// wait on a status object (its API can lag behind the CRD, as on a fresh cluster).
async fn gpu_node_writer(role: &NodeRole) -> node_runtime::gpunode::GpuNodeWriter {
    let mut backoff = node_runtime::Backoff::default();
    loop {
        match role
            .gpu_node_writer(crd::gpu_node::field_manager::DRA_DRIVER)
            .await
        {
            Ok(writer) => return writer,
            Err(error) => {
                tracing::warn!(%error, "cannot create the GPUNode yet; retrying");
                backoff.wait().await;
            }
        }
    }
}

/// `plan`: the devices of each node as the driver would publish them, and where the requests land.
///
/// # Errors
/// When a node's GPUs cannot be read or a `--node` is not `NAME=GPUS`.
pub fn plan(args: &PlanArgs, source: &GpuSource) -> anyhow::Result<planner::Plan> {
    let partition = Partition {
        dra: args.gpus.clone(),
        shared: args.shared_gpus.clone(),
        dynamic_mig: crd::dra::GpuSet::None,
    };
    let published = |name: &str, gpus: &Gpus| -> anyhow::Result<planner::NodeDevices> {
        let views = node_runtime::inventory::read(gpus.backend())?;
        Ok(planner::NodeDevices {
            node: name.to_owned(),
            // The planner places HAMi's shares; MIG on demand is the scheduler's (through the counters).
            devices: slices::devices(&views, &partition, &[])
                .into_iter()
                .map(|device| device.device)
                .collect(),
        })
    };
    let mut nodes = Vec::new();
    if args.nodes.is_empty() {
        nodes.push(published("this-node", &Gpus::open(source, None, None)?)?);
    }
    let scratch = tempfile::tempdir()?;
    for node in &args.nodes {
        let (name, spec) = node.split_once('=').ok_or_else(|| {
            anyhow::anyhow!("--node {node:?}: write NAME=MODEL:COUNT, e.g. a=a100-40gb:2")
        })?;
        let spec = spec
            .parse()
            .map_err(|error| anyhow::anyhow!("--node {node:?}: {error}"))?;
        let simulator = Simulator::open(scratch.path().join(format!("{name}.json")), name, &spec)?;
        nodes.push(published(
            name,
            &Gpus::from_backend(std::sync::Arc::new(simulator)),
        )?);
    }
    Ok(planner::plan(&nodes, &args.requests))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nodes: &[&str], shared: &str, requests: &[&str]) -> PlanArgs {
        PlanArgs {
            nodes: nodes.iter().map(|node| (*node).to_owned()).collect(),
            gpus: crd::dra::GpuSet::All,
            shared_gpus: shared.parse().unwrap(),
            requests: requests
                .iter()
                .map(|request| request.parse().unwrap())
                .collect(),
        }
    }

    #[test]
    fn plan_publishes_each_nodes_gpus_as_the_driver_would_and_places_the_requests() {
        let planned = plan(
            &args(
                &["a=a100-40gb:1", "h=h100-80gb:1"],
                "all",
                &["gpumem=3000,gpucores=30", "type=H100,gpumem=8Gi"],
            ),
            &GpuSource::default(),
        )
        .unwrap();
        let text = planned.to_string();
        let rows: Vec<&str> = text.lines().collect();
        assert!(
            rows[1].contains(" a ") && rows[1].contains("3000") && rows[1].contains("30"),
            "{text}"
        );
        assert!(
            rows[2].contains(" h ") && rows[2].contains("8192"),
            "{text}"
        );

        let unshared = plan(
            &args(&["a=a100-40gb:1"], "none", &["gpumem=3000"]),
            &GpuSource::default(),
        )
        .unwrap();
        assert!(unshared.to_string().contains("unplaced"), "{unshared}");

        let error = plan(
            &args(&["a100-40gb:1"], "all", &["gpumem=1"]),
            &GpuSource::default(),
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("write NAME=MODEL:COUNT"),
            "{error}"
        );
    }
}

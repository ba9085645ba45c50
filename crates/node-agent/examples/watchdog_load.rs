//! The load for `cargo xtask bench`'s watchdog measurement: everything around a `gpu-node-agent watchdog` process
//! but the API server (the bench's cluster) and the watchdog itself.
//!
//! - A simulated node (`--gpus` H100-80GB) in `--sim-state`, which the watchdog opens too.
//! - A kubelet's pod-resources socket under `--kubelet-root`: each pod of `--pods` (a JSON list of `{uid,
//!   namespace, name}`, pods the bench created on the node) holds one time-sliced replica of a GPU, `--replicas`
//!   per GPU.
//! - At rest for `--seconds`: no GPU process. Then `--processes` real `sleep` processes, spread over the pods and
//!   GPUs, each put in its pod's cgroup under the procfs `--proc-root` and reported by the simulator as a GPU user
//!   under its pod's budget, for `--seconds` more.
//!
//! Prints one line per phase, `rest` and `loaded`, then `done`, and ends its processes.
//!
//! Run by `cargo xtask bench`; by hand: `cargo run --release -p node-agent --example watchdog_load -- --help`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use gpu::{GpuBackend, GpuProcess, Simulator};
use serde::Deserialize;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
mod kubelet {
    include!(concat!(env!("OUT_DIR"), "/server/v1.rs"));
}

use kubelet::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};

#[derive(Debug, Parser)]
struct Args {
    /// The node's name (the simulated GPUs' UUIDs derive from it).
    #[arg(long)]
    node: String,
    /// The pods on the node: a JSON list of `{"uid", "namespace", "name"}`.
    #[arg(long)]
    pods: PathBuf,
    /// The simulated node's state file.
    #[arg(long)]
    sim_state: PathBuf,
    /// Where the pod-resources socket goes (`<root>/pod-resources/kubelet.sock`).
    #[arg(long)]
    kubelet_root: PathBuf,
    /// The procfs the watchdog reads.
    #[arg(long)]
    proc_root: PathBuf,
    /// H100-80GB GPUs on the node.
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// Time-slicing replicas per GPU.
    #[arg(long, default_value_t = 4)]
    replicas: u32,
    /// GPU processes in the loaded phase.
    #[arg(long, default_value_t = 200)]
    processes: u32,
    /// Seconds of each phase.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
}

#[derive(Debug, Clone, Deserialize)]
struct PodRef {
    uid: String,
    namespace: String,
    name: String,
}

/// The kubelet's pod-resources answers: who holds which replica, and every replica.
#[derive(Debug, Clone)]
struct PodResources {
    held: kubelet::ListPodResourcesResponse,
    advertised: kubelet::AllocatableResourcesResponse,
}

#[tonic::async_trait]
impl PodResourcesLister for PodResources {
    async fn list(
        &self,
        _: Request<kubelet::ListPodResourcesRequest>,
    ) -> Result<Response<kubelet::ListPodResourcesResponse>, Status> {
        Ok(Response::new(self.held.clone()))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<kubelet::AllocatableResourcesRequest>,
    ) -> Result<Response<kubelet::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(self.advertised.clone()))
    }
}

const RESOURCE: &str = "nvidia.com/gpu.shared";

/// Which GPU (index) pod number `n` holds a replica of, and which replica.
fn placement(n: usize, gpus: u32) -> (u32, u32) {
    let gpus = gpus as usize;
    ((n % gpus) as u32, (n / gpus) as u32)
}

fn pod_resources(pods: &[PodRef], uuids: &[String], replicas: u32) -> PodResources {
    let held = pods
        .iter()
        .enumerate()
        .map(|(n, pod)| {
            let (gpu, replica) = placement(n, uuids.len() as u32);
            kubelet::PodResources {
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                containers: vec![kubelet::ContainerResources {
                    name: "main".into(),
                    devices: vec![kubelet::ContainerDevices {
                        resource_name: RESOURCE.into(),
                        device_ids: vec![format!("{}::{replica}", uuids[gpu as usize])],
                    }],
                    dynamic_resources: Vec::new(),
                }],
            }
        })
        .collect();
    let every_replica = uuids
        .iter()
        .flat_map(|uuid| (0..replicas).map(move |replica| format!("{uuid}::{replica}")))
        .collect();
    PodResources {
        held: kubelet::ListPodResourcesResponse {
            pod_resources: held,
        },
        advertised: kubelet::AllocatableResourcesResponse {
            devices: vec![kubelet::ContainerDevices {
                resource_name: RESOURCE.into(),
                device_ids: every_replica,
            }],
        },
    }
}

/// Puts process `pid` in pod `uid`'s cgroup under the procfs `proc_root`, with its real `stat`.
fn enter_pod(proc_root: &Path, pid: u32, uid: &str, container: usize) -> anyhow::Result<()> {
    let folder = proc_root.join(pid.to_string());
    std::fs::create_dir_all(&folder)?;
    std::fs::write(
        folder.join("cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{container:064x}.scope\n",
            uid.replace('-', "_")
        ),
    )?;
    std::os::unix::fs::symlink(format!("/proc/{pid}/stat"), folder.join("stat"))?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pods: Vec<PodRef> = serde_json::from_slice(
        &std::fs::read(&args.pods).with_context(|| format!("reading {}", args.pods.display()))?,
    )
    .context("--pods is not a JSON list of {uid, namespace, name}")?;
    anyhow::ensure!(!pods.is_empty(), "--pods lists no pod");
    let spec = format!("h100-80gb:{}", args.gpus);
    let simulator = Simulator::open(
        &args.sim_state,
        &args.node,
        &spec.parse().map_err(anyhow::Error::msg)?,
    )?;
    let gpus = simulator.gpus()?;
    let uuids: Vec<String> = gpus.iter().map(|gpu| gpu.uuid.clone()).collect();

    let socket_dir = args.kubelet_root.join("pod-resources");
    std::fs::create_dir_all(&socket_dir)?;
    let socket = socket_dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(pod_resources(
                &pods,
                &uuids,
                args.replicas,
            )))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    std::fs::create_dir_all(&args.proc_root)?;
    println!("rest");
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;

    // Each pod's processes share its replica's budget: half of it, spread evenly.
    let share_mib = gpus[0].memory_mib / u64::from(args.replicas);
    let per_pod = (args.processes as usize).div_ceil(pods.len()) as u64;
    let mut children: Vec<Child> = Vec::new();
    let mut by_pod: BTreeMap<usize, u32> = BTreeMap::new();
    for n in 0..args.processes as usize {
        let pod = n % pods.len();
        let (gpu, _) = placement(pod, args.gpus);
        let child = Command::new("sleep").arg("3600").spawn()?;
        enter_pod(&args.proc_root, child.id(), &pods[pod].uid, pod)?;
        simulator.start_host_process(
            gpu,
            GpuProcess {
                pid: child.id(),
                used_memory_mib: Some(share_mib / 2 / per_pod),
                gpu_instance_id: None,
                compute_instance_id: None,
            },
        )?;
        *by_pod.entry(pod).or_default() += 1;
        children.push(child);
    }
    println!(
        "loaded {} processes in {} pods on {} GPUs",
        children.len(),
        by_pod.len(),
        args.gpus
    );
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    println!("done");
    Ok(())
}

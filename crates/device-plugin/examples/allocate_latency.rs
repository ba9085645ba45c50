//! Allocate latency of the device plugin, in process, for `cargo xtask bench`: the plugin runs on four simulated
//! A100s behind a minimal test kubelet (a Registration server on a temporary `kubelet.sock`), and Allocate is
//! called `--calls` times over the plugin's unix socket. Prints `{"calls": n, "p50_us": .., "p99_us": ..}`.
//!
//! Run with `cargo run --release -p device-plugin --example allocate_latency -- --calls 1000`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use crd::config::device_plugin::{CommandLine, NodeConfig, parse_tolerant};
use device_plugin::api::device_plugin_client::DevicePluginClient;
use device_plugin::api::registration_server::{Registration, RegistrationServer};
use device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, Empty, KUBELET_SOCKET, RegisterRequest,
};
use device_plugin::manager::{Options, Report, run};
use gpu::Simulator;
use node_runtime::backend::Gpus;
use node_runtime::grpc::connect;
use node_runtime::health::{Checks, HealthTracker};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

#[path = "../tests/support/mod.rs"]
mod support;
use support::percentiles;

/// The kubelet's side, reduced to what Allocate needs: it records each registration's endpoint and resource.
#[derive(Clone)]
struct Kubelet {
    registrations: mpsc::UnboundedSender<RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.registrations.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

fn calls_from_args() -> anyhow::Result<usize> {
    let mut args = std::env::args().skip(1);
    let mut calls = 1000;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--calls" => {
                calls = args
                    .next()
                    .context("--calls needs a number")?
                    .parse()
                    .context("--calls needs a number")?;
            }
            other => {
                anyhow::bail!("unknown argument {other:?}; usage: allocate_latency [--calls N]")
            }
        }
    }
    anyhow::ensure!(calls > 0, "--calls must be at least 1");
    Ok(calls)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let calls = calls_from_args()?;
    let temp = tempfile::tempdir()?;
    let dir: PathBuf = temp.path().join("device-plugins");
    std::fs::create_dir_all(&dir)?;
    let simulator = Arc::new(Simulator::open(
        temp.path().join("gpus.json"),
        "node-1",
        &"a100-40gb:4".parse()?,
    )?);

    let (registrations, mut registered) = mpsc::unbounded_channel();
    let listener = UnixListener::bind(dir.join(KUBELET_SOCKET))?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet { registrations }))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );

    let whole = NodeConfig::new(
        Some("whole".into()),
        parse_tolerant("version: v1\n")?,
        CommandLine::default(),
    );
    let (_configs, config_receiver) = watch::channel(Some(Ok(whole)));
    let (report, _reports) = watch::channel(Report::default());
    let options = Options {
        plugin_dir: dir.clone(),
        cdi: true,
        cdi_dir: dir.join("cdi"),
        mps_root: dir.join("mps"),
        start_mps: false,
        health: HealthTracker::new(Checks::parse(None)?, Duration::from_secs(2)),
        mig_poll: Duration::from_secs(60),
        health_poll: Duration::from_secs(60),
    };
    let plugin = tokio::spawn(run(
        options,
        Gpus::from_simulator(simulator),
        config_receiver,
        report,
    ));

    let request = tokio::time::timeout(Duration::from_secs(10), registered.recv())
        .await
        .context("the plugin did not register within 10 s")?
        .context("the test kubelet stopped")?;
    let mut client = DevicePluginClient::new(connect(&dir.join(&request.endpoint)).await?);
    let devices = client
        .list_and_watch(Empty {})
        .await?
        .into_inner()
        .message()
        .await?
        .context("ListAndWatch ended without a device list")?
        .devices;
    let device = devices.first().context("no devices advertised")?.id.clone();
    let allocate = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: vec![device],
        }],
    };
    // Warm-up: the first calls open the connection's streams and fill caches.
    for _ in 0..10 {
        client.allocate(allocate.clone()).await?;
    }
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        client.allocate(allocate.clone()).await?;
        samples.push(started.elapsed());
    }
    let (p50, p99) = percentiles(samples);
    println!("{{\"calls\": {calls}, \"p50_us\": {p50}, \"p99_us\": {p99}}}");
    plugin.abort();
    Ok(())
}

//! NodePrepareResources latency of running DRA drivers, for `cargo xtask bench`: it plays the kubelet, calling each
//! claim's driver over its unix socket to prepare the claims, and in a second run to unprepare them, as the kubelet
//! does for pods that start and, later, end. Like the kubelet (`getOrCreateGRPCConn` in its DRA plugin manager), it
//! keeps one connection per driver, opened before the first call, so that a call's time is the call's and not a
//! connection's. The claims are real, allocated by the kube-scheduler for pods bound to the drivers' nodes, so each
//! prepare finds its claim as its driver read it when the pod was bound (or reads it from the API server when it
//! was not read ahead) and writes its CDI spec and checkpoint.
//!
//! `--claims FILE`: a JSON list of `{"socket", "namespace", "name", "uid"}`; `--call prepare` or `unprepare`.
//! Prints `{"claims": n, "p50_us": .., "p99_us": ..}`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use clap::Parser;
use dra_driver::api::dra_plugin_client::DraPluginClient;
use dra_driver::api::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use node_runtime::grpc::connect;
use serde::Deserialize;

#[derive(Debug, Parser)]
struct Args {
    /// The claims to prepare, with their driver's socket.
    #[arg(long)]
    claims: PathBuf,
    /// The call to make for each claim.
    #[arg(long, value_enum)]
    call: Call,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Call {
    Prepare,
    Unprepare,
}

#[derive(Debug, Deserialize)]
struct Target {
    socket: PathBuf,
    namespace: String,
    name: String,
    uid: String,
}

/// p50 and p99 in microseconds (nearest rank).
fn percentiles(mut samples: Vec<Duration>) -> (u128, u128) {
    samples.sort();
    let at = |fraction: f64| {
        let position = ((samples.len() - 1) as f64 * fraction).round() as usize;
        samples[position].as_micros()
    };
    (at(0.5), at(0.99))
}

/// The driver's answer for the claim with UID `uid`.
fn answer_for<T>(mut answers: HashMap<String, T>, uid: &str) -> anyhow::Result<T> {
    answers
        .remove(uid)
        .context("the driver did not answer for the claim")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let targets: Vec<Target> = serde_json::from_slice(&std::fs::read(&args.claims)?)?;
    ensure!(!targets.is_empty(), "no claims to prepare");
    let mut clients = HashMap::new();
    for target in &targets {
        if !clients.contains_key(&target.socket) {
            let channel = connect(&target.socket)
                .await
                .with_context(|| format!("connecting to {}", target.socket.display()))?;
            clients.insert(target.socket.clone(), DraPluginClient::new(channel));
        }
    }
    let mut latencies = Vec::new();
    for target in &targets {
        let client = clients
            .get_mut(&target.socket)
            .context("every socket was connected")?;
        let claim = Claim {
            namespace: target.namespace.clone(),
            uid: target.uid.clone(),
            name: target.name.clone(),
        };
        let started = Instant::now();
        let (error, no_device) = match args.call {
            Call::Prepare => {
                let request = NodePrepareResourcesRequest {
                    claims: vec![claim],
                };
                let answers = client.node_prepare_resources(request).await?;
                let answer = answer_for(answers.into_inner().claims, &target.uid)?;
                (answer.error, answer.devices.is_empty())
            }
            Call::Unprepare => {
                let request = NodeUnprepareResourcesRequest {
                    claims: vec![claim],
                };
                let answers = client.node_unprepare_resources(request).await?;
                (
                    answer_for(answers.into_inner().claims, &target.uid)?.error,
                    false,
                )
            }
        };
        latencies.push(started.elapsed());
        ensure!(
            error.is_empty() && !no_device,
            "{:?} of claim {}/{} failed: {}",
            args.call,
            target.namespace,
            target.name,
            if error.is_empty() {
                "no device"
            } else {
                &error
            }
        );
    }
    let (p50, p99) = percentiles(latencies);
    println!(
        "{}",
        serde_json::json!({"claims": targets.len(), "p50_us": p50, "p99_us": p99})
    );
    Ok(())
}

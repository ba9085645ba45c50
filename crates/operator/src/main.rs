//! `gpu-operator`: the cluster controller's binary.

use std::net::SocketAddr;

use anyhow::Context;
use clap::{Parser, Subcommand};
use operator::{crd_install, health, telemetry};
use tracing::info;

#[derive(Debug, Parser)]
#[command(name = "gpu-operator", version, about = "GPU operator for Kubernetes: ClusterPolicy (nvidia.com/v1) controller")]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t, global = true, env = "LOG_FORMAT")]
    log_format: telemetry::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the operator: apply its CRDs (so that upgrading the operator upgrades them), then serve the
    /// /healthz and /readyz probes. Reconciling ClusterPolicy into operands is not part of this version.
    Run {
        /// Address of the probe endpoints.
        #[arg(long, default_value = "0.0.0.0:8081", env = "HEALTH_ADDR")]
        health_addr: SocketAddr,
    },
    /// The operator's CustomResourceDefinitions.
    Crd {
        #[command(subcommand)]
        action: CrdAction,
    },
}

#[derive(Debug, Subcommand)]
enum CrdAction {
    /// Print the CRDs as YAML.
    Print,
    /// Server-side apply the CRDs to the cluster of the current kubeconfig and wait until they are established.
    Apply,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match cli.command {
        Command::Crd { action: CrdAction::Print } => {
            print!("{}", crd_install::crds_yaml().context("serialising the CRDs")?);
        }
        Command::Crd { action: CrdAction::Apply } => {
            let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
            for name in crd_install::apply_crds(&client).await? {
                println!("customresourcedefinition.apiextensions.k8s.io/{name} applied");
            }
        }
        Command::Run { health_addr } => run(health_addr).await?,
    }
    Ok(())
}

async fn run(health_addr: SocketAddr) -> anyhow::Result<()> {
    let readiness = health::Readiness::default();
    let server = tokio::spawn(health::serve(health_addr, readiness.clone(), shutdown_signal()));
    let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
    crd_install::apply_crds(&client).await?;
    readiness.set_ready();
    info!(%health_addr, "CRDs are up to date; serving probes until terminated");
    server.await.context("probe server task")?.context("probe server")?;
    Ok(())
}

/// Completes on SIGTERM (the kubelet stopping the pod) or Ctrl-C.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

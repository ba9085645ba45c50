//! `gpu-operator`: the cluster controller's binary.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use crd::GPUNode;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use operator::health::Health;
use operator::leader::LeaderElector;
use operator::metrics::Metrics;
use operator::model::DefaultImages;
use operator::shared_watch::{
    SharedWatch, keep_what_controllers_read_of_gpu_nodes, keep_what_controllers_read_of_nodes,
};
use operator::upgrade::settings::StepTimeouts;
use operator::{
    controller, crd_install, health, render_command, telemetry, uninstall, upgrade, webhook,
};
use tokio::sync::watch;
use tracing::info;

#[derive(Debug, Parser)]
#[command(
    name = "gpu-operator",
    version,
    about = "GPU operator for Kubernetes: ClusterPolicy (nvidia.com/v1) controller"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t, global = true, env = "LOG_FORMAT")]
    log_format: telemetry::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
// Parsed once at start and matched at once: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run the operator: apply its CRDs (so that upgrading the operator upgrades them), take the leader lease,
    /// and reconcile the ClusterPolicy into operand DaemonSets, node labels and status.
    Run {
        /// Address of /healthz, /readyz and /metrics.
        #[arg(long, default_value = "0.0.0.0:8081", env = "HEALTH_ADDR")]
        health_addr: SocketAddr,
        /// Namespace of the operator and its operands.
        #[arg(long, default_value = "gpu-operator", env = "OPERATOR_NAMESPACE")]
        namespace: String,
        /// This replica's identity in the leader lease (the pod name).
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// Serve the HAMi admission webhook (pods asking for nvidia.com/gpumem, gpumem-percentage or gpucores
        /// become DRA claims); `false` removes its configuration.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "HAMI_WEBHOOK")]
        hami_webhook: bool,
        /// The names HAMi's pods ask for a GPU, its memory (MiB and percent), its cores and a priority with.
        /// HAMi's chart lets a cluster rename them (its values `resourceName`, `resourceMem`,
        /// `resourceMemPercentage`, `resourceCores`, `resourcePriority`); this chart sets these from the same values.
        #[command(flatten)]
        hami_names: HamiNames,
        /// What becomes of a HAMi pod annotated `nvidia.com/vgpu-mode: mig` when no GPU it may take is served as MIG
        /// on demand: `refuse` it, naming what would serve it, or admit it as an MPS-limited `share` of whole GPUs
        /// with a warning.
        #[arg(
            long,
            value_enum,
            default_value_t = webhook::hami::MigWithoutDynamicMig::Refuse,
            env = "HAMI_MIG_WITHOUT_DYNAMIC_MIG"
        )]
        hami_mig_without_dynamic_mig: webhook::hami::MigWithoutDynamicMig,
        /// Bind the node agents' evictions to their nodes: a validating webhook lets the MIG manager's token evict
        /// only pods on the node it is bound to; `false` removes its configuration.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "NODE_BOUND_EVICTIONS")]
        node_bound_evictions: bool,
        /// Seconds the leader keeps a ResourceClaimTemplate of the HAMi webhook that no pod names, after its last
        /// use.
        #[arg(
            long,
            default_value_t = 3600,
            env = "HAMI_TEMPLATES_UNUSED_FOR_SECONDS"
        )]
        hami_templates_unused_for_seconds: u64,
        /// Seconds between the leader's sweeps of those templates.
        #[arg(
            long,
            default_value_t = 600,
            env = "HAMI_TEMPLATES_SWEEP_EVERY_SECONDS"
        )]
        hami_templates_sweep_every_seconds: u64,
        /// Address of the webhooks' HTTPS server (it runs when either webhook is on).
        #[arg(long, default_value = "0.0.0.0:9443", env = "WEBHOOK_LISTEN")]
        webhook_listen: SocketAddr,
        /// The Service (in the operator's namespace, port 443) through which the API server calls the webhook.
        #[arg(long, default_value = "gpu-operator-webhook", env = "WEBHOOK_SERVICE")]
        webhook_service: String,
        /// The URL the API server calls instead of the Service (an operator running outside the cluster).
        #[arg(long, env = "WEBHOOK_URL")]
        webhook_url: Option<String>,
        /// Seconds a driver upgrade waits for the new driver pod to become ready after deleting the old one, before
        /// the node is marked upgrade-failed (a driver build may take its startup probe's 21 minutes).
        #[arg(
            long,
            default_value_t = 1800,
            env = "DRIVER_UPGRADE_RESTART_TIMEOUT_SECONDS"
        )]
        driver_upgrade_restart_timeout_seconds: u64,
        /// Seconds a driver upgrade waits for the validator to pass the new driver before the node is marked
        /// upgrade-failed.
        #[arg(
            long,
            default_value_t = 600,
            env = "DRIVER_UPGRADE_VALIDATION_TIMEOUT_SECONDS"
        )]
        driver_upgrade_validation_timeout_seconds: u64,
    },
    /// Print, as YAML, every object the operator would apply for a ClusterPolicy and a set of Nodes.
    Render {
        /// A file holding the ClusterPolicy.
        #[arg(long)]
        policy: PathBuf,
        /// A file holding the Nodes (several documents, or a List as `kubectl get nodes -o yaml` prints).
        #[arg(long)]
        nodes: PathBuf,
        /// Namespace of the operands.
        #[arg(long, default_value = "gpu-operator", env = "OPERATOR_NAMESPACE")]
        namespace: String,
    },
    /// Delete every ClusterPolicy and wait until the running operator has removed its operands, node labels and
    /// GPUNodes (the chart's pre-delete hook runs this before Helm deletes the operator).
    Uninstall {
        /// How long to wait for the operator's cleanup before failing, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout_seconds: u64,
        /// Also delete the operator's CRDs afterwards (NVIDIA's `operator.cleanupCRD`).
        #[arg(long)]
        crds: bool,
    },
    /// The operator's CustomResourceDefinitions (printed as YAML without a subcommand).
    Crd {
        #[command(subcommand)]
        action: Option<CrdAction>,
    },
}

#[derive(Debug, Subcommand)]
enum CrdAction {
    /// Print the CRDs as YAML.
    Print,
    /// Server-side apply the CRDs to the cluster of the current kubeconfig and wait until they are established.
    Apply,
}

// One thread: the operator reconciles one ClusterPolicy at a time and otherwise waits on the API server, and a
// single thread keeps a single malloc arena (worker threads each get one, holding freed memory of their own).
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match cli.command {
        Command::Crd {
            action: None | Some(CrdAction::Print),
        } => {
            emit(&crd_install::crds_yaml().context("serialising the CRDs")?)?;
        }
        Command::Crd {
            action: Some(CrdAction::Apply),
        } => {
            let client = connect().await?;
            for name in crd_install::apply_crds(&client).await? {
                println!("customresourcedefinition.apiextensions.k8s.io/{name} applied");
            }
        }
        Command::Render {
            policy,
            nodes,
            namespace,
        } => {
            let rendered = render_command::render_files(
                &policy,
                &nodes,
                &namespace,
                &DefaultImages::from_env(),
            )?;
            for warning in &rendered.warnings {
                eprintln!("warning: {warning}");
            }
            emit(&rendered.yaml)?;
        }
        Command::Uninstall {
            timeout_seconds,
            crds,
        } => {
            let client = connect().await?;
            uninstall::uninstall(&client, Duration::from_secs(timeout_seconds), crds).await?;
        }
        Command::Run {
            health_addr,
            namespace,
            identity,
            hami_webhook,
            hami_names,
            hami_mig_without_dynamic_mig,
            node_bound_evictions,
            hami_templates_unused_for_seconds,
            hami_templates_sweep_every_seconds,
            webhook_listen,
            webhook_service,
            webhook_url,
            driver_upgrade_restart_timeout_seconds,
            driver_upgrade_validation_timeout_seconds,
        } => {
            let hami_names = webhook::hami::ResourceNames::new(
                &hami_names.resource_name,
                &hami_names.resource_mem,
                &hami_names.resource_mem_percentage,
                &hami_names.resource_cores,
                &hami_names.resource_priority,
            )?;
            let webhook = (hami_webhook || node_bound_evictions).then(|| webhook::Settings {
                listen: webhook_listen,
                endpoint: webhook_url.map_or_else(
                    || webhook::tls::Endpoint::Service {
                        namespace: namespace.clone(),
                        name: webhook_service,
                        port: 443,
                    },
                    webhook::tls::Endpoint::Url,
                ),
                namespace: namespace.clone(),
                hami: hami_webhook,
                hami_names,
                mig_without_dynamic_mig: hami_mig_without_dynamic_mig,
                node_bound_evictions,
                templates_unused_for: Duration::from_secs(hami_templates_unused_for_seconds),
                templates_sweep_every: Duration::from_secs(hami_templates_sweep_every_seconds),
            });
            let upgrade_timeouts = StepTimeouts {
                restart: Duration::from_secs(driver_upgrade_restart_timeout_seconds),
                validation: Duration::from_secs(driver_upgrade_validation_timeout_seconds),
            };
            run(health_addr, namespace, identity, webhook, upgrade_timeouts).await?;
        }
    }
    Ok(())
}

/// A client from the in-cluster ServiceAccount or `KUBECONFIG`, naming this program in its User-Agent so that
/// audit logs and API server metrics tell its requests apart.
async fn connect() -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::infer().await.context(
        "reading the Kubernetes client configuration (in-cluster ServiceAccount or KUBECONFIG)",
    )?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("gpu-operator-rs/", env!("CARGO_PKG_VERSION"))),
    ));
    kube::Client::try_from(config).context("connecting to the Kubernetes API")
}

/// The operator's main loop. Every replica keeps its watch caches and serves the webhook, and is Ready once it can;
/// the one that holds the lease applies the CRDs and the webhook configuration and reconciles. A replica stopped
/// by SIGTERM (a rollout, `helm upgrade`) releases the lease, so that the next one leads at once.
async fn run(
    health_addr: SocketAddr,
    namespace: String,
    identity: Option<String>,
    webhook: Option<webhook::Settings>,
    upgrade_timeouts: StepTimeouts,
) -> anyhow::Result<()> {
    let health = Health::new(webhook.is_some());
    let metrics = Metrics::shared();
    let server = tokio::spawn(health::serve(
        health_addr,
        health.clone(),
        metrics.clone(),
        shutdown_signal(),
    ));
    let client = connect().await?;
    let webhook_enabled = webhook.is_some();
    let (leading, leading_changes) = watch::channel(false);
    if let Some(settings) = webhook {
        let health = health.clone();
        tokio::spawn(webhook::run(
            client.clone(),
            settings,
            leading_changes.clone(),
            move || health.set_webhook_serving(true),
        ));
    }

    let identity = identity.unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
    let leases = kube::Api::<Lease>::namespaced(client.clone(), &namespace);
    let elector = LeaderElector::new(leases, "gpu-operator-leader", &identity);
    let lead = async {
        elector.acquire().await;
        // Only the leader writes the cluster-wide configuration: a rollout's new replica, which may be a newer
        // version, changes no CRD or webhook under the old leader.
        crd_install::apply_crds(&client).await?;
        if !webhook_enabled {
            webhook::delete_unserved_configurations(&client, None).await?;
        }
        leading.send_replace(true);
        info!(%health_addr, namespace = %namespace, "reconciling");
        Err::<(), _>(anyhow::Error::from(elector.keep().await))
    };
    // One watch of Nodes and one of GPUNodes, read by both controllers.
    let nodes = SharedWatch::<Node>::new();
    let gpu_nodes = SharedWatch::<GPUNode>::new();
    let controller = controller::run(
        client.clone(),
        namespace.clone(),
        DefaultImages::from_env(),
        metrics.clone(),
        health.clone(),
        leading_changes.clone(),
        nodes.reader(controller::node_relevance),
        gpu_nodes.reader(controller::kept_gpu_node_status),
    );
    let upgrades = upgrade::controller::run(
        client.clone(),
        namespace.clone(),
        upgrade_timeouts,
        metrics.clone(),
        health.clone(),
        leading_changes,
        nodes.reader(upgrade::controller::node_relevance),
        gpu_nodes.reader(upgrade::controller::process_pods),
    );
    let node_watch = nodes.run(
        kube::Api::all(client.clone()),
        watcher::Config::default().any_semantic(),
        keep_what_controllers_read_of_nodes,
        metrics.clone(),
        health.clone(),
    );
    let gpu_node_watch = gpu_nodes.run(
        kube::Api::all(client.clone()),
        watcher::Config::default(),
        keep_what_controllers_read_of_gpu_nodes,
        metrics,
        health.clone(),
    );
    let outcome = tokio::select! {
        () = shutdown_signal() => Ok(()),
        led = lead => led.context("stopping: this replica leads no more"),
        () = controller => Err(anyhow::anyhow!("the controller stopped")),
        () = upgrades => Err(anyhow::anyhow!("the driver upgrade controller stopped")),
        () = node_watch => Err(anyhow::anyhow!("the Node watch stopped")),
        () = gpu_node_watch => Err(anyhow::anyhow!("the GPUNode watch stopped")),
    };
    elector.release().await;
    server.abort();
    outcome
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "gpu-operator".into(), |h| h.trim().to_string())
}

/// Writes command output to stdout; a reader that stops early (`| head`) ends the output, not the process
/// with a panic.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(error.into()),
        _ => Ok(()),
    }
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

/// HAMi's resource names, HAMi's defaults where unset.
#[derive(clap::Args, Debug)]
struct HamiNames {
    /// The whole-GPU resource (HAMi's `resourceName`).
    #[arg(long = "hami-resource-name", env = "HAMI_RESOURCE_NAME", default_value = webhook::hami::GPU)]
    resource_name: String,
    /// GPU memory in MiB (HAMi's `resourceMem`).
    #[arg(long = "hami-resource-mem", env = "HAMI_RESOURCE_MEM", default_value = webhook::hami::GPUMEM)]
    resource_mem: String,
    /// GPU memory in percent (HAMi's `resourceMemPercentage`).
    #[arg(
        long = "hami-resource-mem-percentage",
        env = "HAMI_RESOURCE_MEM_PERCENTAGE",
        default_value = webhook::hami::GPUMEM_PERCENTAGE
    )]
    resource_mem_percentage: String,
    /// Percent of the GPU's cores (HAMi's `resourceCores`).
    #[arg(long = "hami-resource-cores", env = "HAMI_RESOURCE_CORES", default_value = webhook::hami::GPUCORES)]
    resource_cores: String,
    /// Task priority (HAMi's `resourcePriority`).
    #[arg(long = "hami-resource-priority", env = "HAMI_RESOURCE_PRIORITY", default_value = webhook::hami::PRIORITY)]
    resource_priority: String,
}

//! The command line: `run` (what the operator's DaemonSet starts; `crates/operator/src/render/dra_driver.rs` fixes
//! its flags) and `plan` (where requests would land, for admins and tests, without a cluster).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use crd::paths::KUBELET_ROOT;
use node_runtime::backend::GpuSource;
use node_runtime::process::Logging;
use node_runtime::start::NodeArgs;

/// `gpu-dra-driver`: the DRA driver `gpu.nvidia.com`.
#[derive(Debug, Parser)]
#[command(
    name = "gpu-dra-driver",
    version,
    about = "GPU DRA driver gpu.nvidia.com: fractional GPUs with consumable memory and MPS limits, and the placement planner"
)]
pub struct Cli {
    /// Log format.
    #[command(flatten)]
    pub logging: Logging,
    /// Where the GPUs come from.
    #[command(flatten)]
    pub gpus: GpuSource,
    #[command(subcommand)]
    pub command: Command,
}

/// The driver and its tool.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The DRA driver `gpu.nvidia.com`: publishes the node's GPUs as a ResourceSlice (shared ones with consumable
    /// memory and cores) and prepares claims for the kubelet (CDI specs with MPS limits).
    Run(RunArgs),
    /// Where DRA requests (HAMi's terms: `gpumem=3000,gpucores=30`) would land on nodes' GPUs as the DRA driver
    /// publishes them, and what would remain; for admins and tests, without a cluster.
    Plan(PlanArgs),
}

/// `gpu-dra-driver run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// This node and the operator's namespace.
    #[command(flatten)]
    pub node: NodeArgs,
    /// The kubelet's root directory: the driver registers in its `plugins_registry` and serves in its `plugins`.
    #[arg(long, env = "KUBELET_ROOT", default_value = KUBELET_ROOT)]
    pub kubelet_root: PathBuf,
    /// The container runtime's dynamic CDI directory, where each prepared claim's spec goes.
    #[arg(long, env = "CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,
    /// Where claims' MPS control daemons keep their pipes and logs (a host directory).
    #[arg(long, env = "MPS_ROOT", default_value = "/run/nvidia/mps")]
    pub mps_root: PathBuf,
    /// Where the checkpoint of prepared claims is kept: this boot's state, on tmpfs (a write there is a fraction of
    /// one on the kubelet's disk). A checkpoint left under the kubelet's plugins directory by an earlier version is
    /// moved here at start.
    #[arg(long, env = "STATE_DIR", default_value = crd::paths::DRA_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The host's `/dev`: device nodes that exist there go into the CDI specs.
    #[arg(long, default_value = "/dev")]
    pub dev_root: PathBuf,
    /// GPUs of each node the driver takes, unless the node's `nvidia.com/dra.gpus` label says otherwise: `all`,
    /// `none` or indices such as `0,2-3`. The device plugin leaves these out.
    #[arg(long, env = "DRA_GPUS", default_value = "all")]
    pub gpus: crd::dra::GpuSet,
    /// Which of the driver's GPUs are shared (consumable memory and cores), unless the node's
    /// `nvidia.com/dra.shared-gpus` label says otherwise.
    #[arg(long, env = "DRA_SHARED_GPUS", default_value = "none")]
    pub shared_gpus: crd::dra::GpuSet,
    /// Which of the driver's GPUs it serves as MIG on demand (every profile and placement published, instances made
    /// when claims are prepared), unless the node's `nvidia.com/dra.dynamic-mig-gpus` label says otherwise. Their
    /// MIG mode must be on.
    #[arg(long, env = "DRA_DYNAMIC_MIG_GPUS", default_value = "none")]
    pub dynamic_mig_gpus: crd::dra::GpuSet,
    /// The container toolkit's CDI hook program on the host (`nvidia-cdi-hook`, toolkit 1.20.1 or later), whose
    /// `apply-cuda-memory-limits` sets a container's GPU memory limit in the driver (R615+). Unset, or on a host
    /// without cgroup v2, shared claims' memory is held by MPS alone.
    #[arg(long, env = "MEMORY_LIMIT_HOOK")]
    pub memory_limit_hook: Option<PathBuf>,
    /// When GPUs are Unhealthy (their devices tainted, and reported so to the kubelet); `DP_DISABLE_HEALTHCHECKS`
    /// applies as in the device plugin.
    #[command(flatten)]
    pub health: node_runtime::health::HealthArgs,
}

/// `gpu-dra-driver plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// A node and its GPUs, as the simulator names them: `NAME=MODEL:COUNT[,MODEL:COUNT]` (e.g.
    /// `a=a100-40gb:2`); repeat for several nodes, tried in order. Without any, this machine's GPUs (NVML, or
    /// `--simulate`).
    #[arg(long = "node", value_name = "NAME=GPUS")]
    pub nodes: Vec<String>,
    /// The GPUs the driver takes on every node: `all`, `none` or indices.
    #[arg(long, default_value = "all")]
    pub gpus: crd::dra::GpuSet,
    /// Which of those are shared.
    #[arg(long, default_value = "all")]
    pub shared_gpus: crd::dra::GpuSet,
    /// The requests, placed in order: comma-separated `key=value` with HAMi's names (`gpumem` in MiB or as a
    /// quantity, `gpumem-percentage`, `gpucores`, `count`, `type`, `nouse-type`, `uuid`, `nouse-uuid`, `class`
    /// shared|gpu|mig, `profile`).
    #[arg(required = true, value_name = "REQUEST")]
    pub requests: Vec<crate::planner::Request>,
}

impl RunArgs {
    /// The driver's own directory under the kubelet's plugins (its socket; its checkpoint before 0.1.1).
    #[must_use]
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_root.join("plugins").join(crd::dra::DRIVER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gpu-dra-driver").chain(line.iter().copied()))
    }

    /// The command line the operator renders (see the `dra_driver_enabled` render snapshot) parses.
    #[test]
    fn the_rendered_command_line_parses() {
        let cli = parse(&[
            "run",
            "--kubelet-root",
            "/var/lib/k0s/kubelet",
            "--cdi-root",
            "/var/run/cdi",
            "--mps-root",
            "/run/nvidia/mps",
            "--dev-root",
            "/host/dev",
            "--node-name",
            "n1",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("run")
        };
        assert_eq!(run.node.node_name, "n1");
        assert_eq!(run.dev_root, PathBuf::from("/host/dev"));
        assert_eq!(
            run.plugin_dir(),
            PathBuf::from("/var/lib/k0s/kubelet/plugins/gpu.nvidia.com")
        );
    }

    #[test]
    fn plan_needs_a_request() {
        let cli = parse(&["plan", "--node", "a=a100-40gb:1", "gpumem=3000"]).unwrap();
        let Command::Plan(plan) = cli.command else {
            panic!("plan")
        };
        assert_eq!(plan.nodes, ["a=a100-40gb:1"]);
        assert_eq!(plan.requests.len(), 1);
        let error = parse(&["plan", "--node", "a=a100-40gb:1"]).unwrap_err();
        assert!(error.to_string().contains("<REQUEST>"), "{error}");
    }
}

//! The command line. The role command lines are the ones the operator renders into its DaemonSets
//! (`crates/operator/src/render/`), so every flag here that a DaemonSet passes must keep its name.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use crd::config::device_plugin::MigStrategy;
use crd::paths::{KUBELET_ROOT, VALIDATIONS_DIR};
use node_runtime::backend::GpuSource;
use node_runtime::process::Logging;
use node_runtime::start::NodeArgs;

/// `gpu-node-agent`: one binary per node, several roles.
#[derive(Debug, Parser)]
#[command(
    name = "gpu-node-agent",
    version,
    about = "GPU node agent: MIG manager, GPU feature discovery, validation, DCGM-compatible metrics; reports the node's GPUNode status"
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

/// The roles and tools.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The MIG manager: applies the geometry the node's `nvidia.com/mig.config` label names. With a subcommand,
    /// an admin tool that works on this machine's GPUs without Kubernetes.
    #[command(subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
    Mig(MigArgs),
    /// GPU feature discovery: publishes the `nvidia.com/gpu.*`, `cuda.*` and `mig-*` node labels.
    Discovery(DiscoveryArgs),
    /// Node Feature Discovery's labels the operator needs (NVIDIA PCI devices, OS release, kernel version), for
    /// clusters without NFD; runs on every node and needs no GPU access.
    NodeFacts(NodeFactsArgs),
    /// Validation for init containers: marks the driver and toolkit ready, or waits for the marks.
    Validate(ValidateArgs),
    /// DCGM-exporter compatible GPU metrics on `/metrics` (and `/healthz`), with pod, namespace and container
    /// labels from the kubelet's pod-resources API.
    Exporter(ExporterArgs),
    /// The node's readiness as the operator sees it (validations, GPUNode status) as Prometheus metrics.
    StatusExporter(StatusExporterArgs),
    /// The GPU memory watchdog: accounts each GPU process to its pod, and signals the processes of a pod that
    /// stays over its memory budget on a shared GPU (time-slicing and MPS replicas, DRA shares).
    Watchdog(WatchdogArgs),
    /// Test tool for the simulator: inject faults (delays, reset failures, XIDs, processes) into a simulated node's
    /// GPUs, list its MIG devices.
    Simulator(SimulatorArgs),
}

/// `gpu-node-agent mig`.
#[derive(Debug, Args)]
pub struct MigArgs {
    /// ConfigMap (in the operator's namespace) whose `config.yaml` holds the mig-parted config.
    #[arg(long, required = true)]
    pub config_map: Option<String>,
    /// Config applied when the node has no `nvidia.com/mig.config` label; without it, such nodes are left alone.
    #[arg(long)]
    pub default_config: Option<String>,
    /// ConfigMap naming host services that use the GPUs (accepted for compatibility; see the crate docs).
    #[arg(long)]
    pub gpu_clients_config_map: Option<String>,
    /// Reboot the node when a MIG mode change needs a GPU reset the platform cannot do: SIGINT to the host's
    /// systemd, which needs the host's PID namespace (the operator renders it with this setting).
    #[arg(long, env = "WITH_REBOOT")]
    pub with_reboot: bool,
    /// How long to wait for the node's GPU clients (device plugin, feature discovery, DCGM) to leave.
    #[arg(long, value_parser = seconds, default_value = "300")]
    pub clients_timeout: Duration,
    /// How long to keep evicting the pods that use the GPUs being changed (PodDisruptionBudgets may hold them).
    #[arg(long, value_parser = seconds, default_value = "300")]
    pub eviction_timeout: Duration,
    /// The GPUs the node's DRA driver takes (`all`, `none`, or indices; the `nvidia.com/dra.gpus` label overrides).
    #[arg(long, env = "DRA_GPUS", default_value = "none")]
    pub dra_gpus: crd::dra::GpuSet,
    /// Which of those it serves as MIG on demand (the `nvidia.com/dra.dynamic-mig-gpus` label overrides): their
    /// instances are the driver's claims', which a config leaves alone.
    #[arg(long, env = "DRA_DYNAMIC_MIG_GPUS", default_value = "none")]
    pub dra_dynamic_mig_gpus: crd::dra::GpuSet,
    /// The kubelet's root directory: its `pod-resources/kubelet.sock` says which pods hold which GPU, so that only
    /// the pods on the GPUs being changed are evicted (without it, every pod that requests a GPU is).
    #[arg(long, env = "KUBELET_ROOT", default_value = KUBELET_ROOT)]
    pub kubelet_root: PathBuf,
    /// The node (required for the role).
    #[command(flatten)]
    pub node: Option<NodeArgs>,
    /// An admin tool instead of the role.
    #[command(subcommand)]
    pub action: Option<MigAction>,
}

/// `gpu-node-agent mig plan|apply|assert`.
#[derive(Debug, Subcommand)]
pub enum MigAction {
    /// Print the geometry each GPU would get, or why the config cannot be applied.
    Plan(MigFileArgs),
    /// Apply the config to this machine's GPUs (no Kubernetes involved).
    Apply(MigFileArgs),
    /// Exit non-zero, with the differences, when the GPUs do not have the config's geometry.
    Assert(MigFileArgs),
}

/// The config file and name the admin tools take.
#[derive(Debug, Args)]
pub struct MigFileArgs {
    /// The mig-parted config file (YAML or JSON, version v1).
    #[arg(short = 'f', long = "config-file")]
    pub file: PathBuf,
    /// The config name in the file.
    #[arg(short = 'c', long = "selected-config")]
    pub config: String,
    /// Node name, for `--simulate node` and the simulator's GPU identities.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
}

/// `gpu-node-agent status-exporter`.
#[derive(Debug, Args)]
pub struct StatusExporterArgs {
    /// Where to serve `/metrics` and `/healthz`: `:PORT` (every IPv4 address) or `ADDRESS:PORT`.
    #[arg(long, value_parser = listen_address, default_value = ":8000")]
    pub listen: SocketAddr,
    /// Folder of the validator's ready files.
    #[arg(
        long,
        env = "VALIDATIONS_DIR",
        default_value = VALIDATIONS_DIR
    )]
    pub validations_dir: PathBuf,
    /// This node (its GPUNode has the same name).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
}

/// `gpu-node-agent discovery`.
#[derive(Debug, Args)]
pub struct DiscoveryArgs {
    /// How MIG devices are advertised: none, single or mixed; wins over the device-plugin config's
    /// `flags.migStrategy` (none when neither says).
    #[arg(long)]
    pub mig_strategy: Option<MigStrategy>,
    /// ConfigMap of named device-plugin configs (for the sharing labels).
    #[arg(long)]
    pub device_plugin_config_map: Option<String>,
    /// Key of that ConfigMap used on nodes without the `nvidia.com/device-plugin.config` label.
    #[arg(long)]
    pub default_config: Option<String>,
    /// How often to read the GPUs again (MIG geometry has no change events).
    #[arg(long, value_parser = seconds, default_value = "10")]
    pub interval: Duration,
    /// File holding the machine type (DMI product name) for `nvidia.com/gpu.machine`.
    #[arg(long, default_value = "/sys/class/dmi/id/product_name")]
    pub machine_type_file: PathBuf,
    /// sysfs folder of the PCI devices, whose classes give `nvidia.com/gpu.mode` (compute or graphics).
    #[arg(long, default_value = "/sys/bus/pci/devices")]
    pub pci_devices_dir: PathBuf,
    /// Leave out the `nvidia.com/gfd.timestamp` label (GFD's `--no-timestamp`).
    #[arg(long, env = "GFD_NO_TIMESTAMP")]
    pub no_timestamp: bool,
    /// The node.
    #[command(flatten)]
    pub node: NodeArgs,
}

/// `gpu-node-agent node-facts`.
#[derive(Debug, Args)]
pub struct NodeFactsArgs {
    /// Where the host's root filesystem is mounted: its `etc/os-release` (else `usr/lib/os-release`) gives the
    /// OS labels.
    #[arg(long, env = "HOST_ROOT", default_value = "/host")]
    pub host_root: PathBuf,
    /// The kernel release, for `kernel-version.full` (a container shares the host's kernel).
    #[arg(long, default_value = "/proc/sys/kernel/osrelease")]
    pub kernel_release_file: PathBuf,
    /// sysfs folder of the PCI devices (the host's, as every container sees it).
    #[arg(long, default_value = "/sys/bus/pci/devices")]
    pub pci_devices_dir: PathBuf,
    /// How often to read the facts again.
    #[arg(long, value_parser = seconds, default_value = "60")]
    pub interval: Duration,
    /// Name of this node.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
}

/// `gpu-node-agent exporter`.
#[derive(Debug, Args)]
pub struct ExporterArgs {
    /// Where to serve `/metrics` and `/healthz`: `:PORT` (every IPv4 address) or `ADDRESS:PORT` (an IP address;
    /// `[::]:PORT` for every IPv6 one).
    #[arg(long, value_parser = listen_address, default_value = ":9400")]
    pub listen: SocketAddr,
    /// ConfigMap (in the operator's namespace) with the fields to export, as dcgm-exporter's CSV (`field, type,
    /// help` a line; type gauge, counter or label), in the key `dcgm-metrics.csv` or the ConfigMap's only key.
    /// Followed live; a config with a bad line is not applied (the warning names the line). Without it, the
    /// default set: every DCGM field this exporter can read.
    #[arg(long)]
    pub metrics_config_map: Option<String>,
    /// Namespace of that ConfigMap; by default the exporter's own (the operator's, where its DaemonSet runs).
    #[arg(long, env = "OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,
    /// The kubelet's root directory: its `pod-resources/kubelet.sock` says which container holds which GPU, for
    /// the pod, namespace and container labels (without it, series have none).
    #[arg(long, env = "KUBELET_ROOT", default_value = KUBELET_ROOT)]
    pub kubelet_root: PathBuf,
    /// DCGM_FI_DEV_XID_ERRORS holds a GPU's last critical XID until the GPU has had none for this many seconds,
    /// then reads 0 again (DCGM holds it forever, so alerts never resolve); 0 holds it forever too.
    #[arg(long, value_parser = seconds, default_value = "300")]
    pub xid_clear_seconds: Duration,
    /// The host's procfs (mounted in the container, e.g. `/host/proc`): with it, each GPU process is accounted to
    /// its pod through its cgroup, for the per-pod memory series `gpu_pod_memory_used_bytes` (the node's pods are
    /// watched from the API server to name them).
    #[arg(long)]
    pub proc_root: Option<PathBuf>,
    /// Seconds between readings of the GPUs and the kubelet; scrapes serve the latest reading.
    #[arg(long, value_parser = seconds, default_value = "5")]
    pub collect_interval: Duration,
    /// This node: the `Hostname` label, and the node whose annotation `--simulate node` reads.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
}

/// `gpu-node-agent watchdog`.
#[derive(Debug, Args)]
pub struct WatchdogArgs {
    /// This node and the operator's namespace.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Where to serve `/metrics` and `/healthz`: `:PORT` or `ADDRESS:PORT`.
    #[arg(long, value_parser = listen_address, default_value = ":9402")]
    pub listen: SocketAddr,
    /// The kubelet's root directory: its `pod-resources/kubelet.sock` says which pod holds which GPU replica.
    #[arg(long, env = "KUBELET_ROOT", default_value = KUBELET_ROOT)]
    pub kubelet_root: PathBuf,
    /// The host's procfs, where each GPU process's cgroup names its pod (the watchdog runs in the host's PID
    /// namespace, so the pids the driver reports are valid here).
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Seconds between passes over the GPUs' processes.
    #[arg(long = "interval-seconds", value_parser = seconds, default_value = "5")]
    pub interval: Duration,
    /// Seconds a pod may stay over its budget on a GPU before its largest process there gets SIGTERM.
    #[arg(long = "grace-period-seconds", value_parser = seconds, default_value = "30")]
    pub grace_period: Duration,
    /// Seconds between SIGTERM and SIGKILL, for a process that does not end.
    #[arg(long = "kill-grace-period-seconds", value_parser = seconds, default_value = "10")]
    pub kill_grace_period: Duration,
    /// Where a time-sliced (or MPS) GPU's budgets come from: `replica-share` (its memory divided by its replicas)
    /// or `none` (only DRA claims and the `nvidia.com/gpu-memory-limit` annotation set budgets).
    #[arg(long, value_enum, default_value = "replica-share")]
    pub default_budget: crate::watchdog::budget::DefaultBudget,
    /// Report (events, logs, metrics with `dry_run="true"`), never signal.
    #[arg(long)]
    pub dry_run: bool,
}

/// `gpu-node-agent validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Folder of the ready files that operands' init containers wait for.
    #[arg(
        long,
        env = "VALIDATIONS_DIR",
        default_value = VALIDATIONS_DIR,
        global = true
    )]
    pub validations_dir: PathBuf,
    /// The container runtime binary the toolkit installs.
    #[arg(
        long,
        env = "TOOLKIT_RUNTIME",
        default_value = "/host/usr/local/nvidia/toolkit/nvidia-container-runtime",
        global = true
    )]
    pub toolkit_runtime: PathBuf,
    /// Node name (for `--simulate node`).
    #[arg(long, env = "NODE_NAME", global = true)]
    pub node_name: Option<String>,
    /// What to validate.
    #[command(subcommand)]
    pub step: ValidateStep,
}

/// One validation step.
#[derive(Debug, Subcommand)]
pub enum ValidateStep {
    /// The driver answers (NVML initialises and sees at least one GPU): writes `driver-ready`.
    Driver,
    /// The container toolkit's runtime is installed: writes `toolkit-ready`.
    Toolkit,
    /// Re-checks periodically, writing the ready files that hold and removing those that no longer do.
    Watch {
        /// Time between checks.
        #[arg(long, value_parser = seconds, default_value = "30")]
        interval: Duration,
    },
    /// Blocks until the named parts are marked ready.
    Wait {
        /// A part to wait for: driver or toolkit (repeatable).
        #[arg(long = "for", value_enum, required = true)]
        parts: Vec<crate::validate::Part>,
        /// Time between looks at the folder.
        #[arg(long, value_parser = seconds, default_value = "1")]
        interval: Duration,
    },
}

/// `gpu-node-agent simulator`.
#[derive(Debug, Args)]
pub struct SimulatorArgs {
    /// Node name the simulated GPUs belong to.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// What to do.
    #[command(subcommand)]
    pub action: SimulatorAction,
}

/// What the simulator tool does.
#[derive(Debug, Subcommand)]
pub enum SimulatorAction {
    /// Make every operation on every GPU of the node take this many milliseconds longer (0 to stop).
    Delay {
        /// Milliseconds added to each operation.
        milliseconds: u64,
    },
    /// Make GPU resets fail on every GPU of the node: `unsupported` (the platform cannot reset, as in many VMs:
    /// a MIG mode change then needs a reboot), `fails`, or `none` to let resets succeed again.
    ResetFailure {
        /// How resets fail.
        #[arg(value_enum)]
        failure: ResetFailureArg,
    },
    /// Print every MIG device as `<GPU index> <MIG device UUID>`, one per line (to check which devices survive
    /// a change).
    Devices,
    /// Start a simulated process on one GPU (with MIG on, in one of its MIG devices) using GPU memory: the GPU
    /// reads busy (utilization, clocks, power, temperature) and its memory used, until `stop-process`.
    StartProcess {
        /// Index of the GPU.
        #[arg(long)]
        gpu: u32,
        /// Its process id.
        #[arg(long)]
        pid: u32,
        /// GPU memory it uses, in MiB.
        #[arg(long)]
        memory_mib: u64,
        /// The GPU instance it runs in, on a GPU with MIG on.
        #[arg(long, requires = "compute_instance")]
        gpu_instance: Option<u32>,
        /// The compute instance it runs in, on a GPU with MIG on.
        #[arg(long, requires = "gpu_instance")]
        compute_instance: Option<u32>,
        /// `--pid` is a real process on this host: it uses the GPU until it exits, as a real GPU user would (the
        /// watchdog and the exporter map it to its pod through its cgroup).
        #[arg(long)]
        host_process: bool,
    },
    /// Change the GPU memory a running simulated process uses, as a program allocates or frees memory.
    SetProcessMemory {
        /// Index of the GPU.
        #[arg(long)]
        gpu: u32,
        /// Its process id.
        #[arg(long)]
        pid: u32,
        /// GPU memory it uses now, in MiB.
        #[arg(long)]
        memory_mib: u64,
    },
    /// Queue a critical XID error on one GPU, as the driver reports one: the device plugin marks the GPU's devices
    /// Unhealthy and the exporter shows it (13, 31, 43, 45, 68 and 109 are application XIDs, ignored by default).
    Xid {
        /// Index of the GPU.
        #[arg(long)]
        gpu: u32,
        /// The XID, e.g. 79 (fallen off the bus).
        #[arg(long)]
        xid: u64,
    },
    /// Install another driver version on the node's GPUs (as a driver upgrade does): R615 and later cap cgroups'
    /// GPU memory.
    DriverVersion {
        /// The version the GPUs report, e.g. 615.10.02.
        version: String,
    },
    /// Cap a cgroup's GPU memory on one GPU, as `nvmlDeviceSetMemoryLimits` does (R615+; what the container
    /// toolkit's `apply-cuda-memory-limits` hook calls): a simulated host process of that cgroup that allocates
    /// past it fails.
    MemoryLimit {
        /// Index of the GPU.
        #[arg(long)]
        gpu: u32,
        /// The cgroup v2 path, as `/proc/<pid>/cgroup` gives it.
        #[arg(long)]
        cgroup: String,
        /// The limit, in MiB.
        #[arg(long)]
        memory_mib: u64,
    },
    /// End a simulated process.
    StopProcess {
        /// Index of the GPU.
        #[arg(long)]
        gpu: u32,
        /// Its process id.
        #[arg(long)]
        pid: u32,
    },
}

/// How simulated resets fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResetFailureArg {
    /// `NotSupported`: the node must be rebooted instead.
    Unsupported,
    /// The reset is attempted and fails.
    Fails,
    /// Resets succeed.
    None,
}

/// A duration given in whole seconds.
fn seconds(text: &str) -> Result<Duration, String> {
    text.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| format!("expected a number of seconds, got {text:?}"))
}

/// A listen address as dcgm-exporter takes it: `:9400` for every IPv4 address, or `ADDRESS:PORT`.
fn listen_address(text: &str) -> Result<SocketAddr, String> {
    let parsed = match text.strip_prefix(':') {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .map(|port| SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))),
        None => text.parse().ok(),
    };
    parsed.ok_or_else(|| {
        format!("expected :PORT or ADDRESS:PORT (an IP address, e.g. 127.0.0.1:9400 or [::]:9400), got {text:?}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gpu-node-agent").chain(line.iter().copied()))
    }

    /// The command lines the operator renders (see the render snapshots) parse.
    #[test]
    fn rendered_command_lines_parse() {
        let cli = parse(&[
            "mig",
            "--config-map",
            "custom-mig-parted-config",
            "--default-config",
            "all-disabled",
            "--gpu-clients-config-map",
            "gpu-clients",
            "--kubelet-root",
            "/var/lib/k0s/kubelet",
            "--node-name",
            "n1",
        ])
        .unwrap();
        let Command::Mig(mig) = cli.command else {
            panic!("mig")
        };
        assert_eq!(mig.config_map.as_deref(), Some("custom-mig-parted-config"));
        assert!(mig.action.is_none());
        assert_eq!(mig.kubelet_root, PathBuf::from("/var/lib/k0s/kubelet"));
        let cli = parse(&["mig", "--config-map", "m", "--node-name", "n1"]).unwrap();
        let Command::Mig(mig) = cli.command else {
            panic!("mig")
        };
        assert_eq!(mig.kubelet_root, PathBuf::from("/var/lib/kubelet"));

        let cli = parse(&[
            "discovery",
            "--mig-strategy",
            "mixed",
            "--device-plugin-config-map",
            "time-slicing-config-all",
            "--default-config",
            "any",
            "--node-name",
            "n1",
        ])
        .unwrap();
        assert!(
            matches!(cli.command, Command::Discovery(ref d) if d.mig_strategy == Some(MigStrategy::Mixed) && !d.no_timestamp)
        );

        let cli = parse(&["node-facts", "--host-root", "/host", "--node-name", "n1"]).unwrap();
        let Command::NodeFacts(facts) = cli.command else {
            panic!("node-facts")
        };
        assert_eq!(facts.host_root, PathBuf::from("/host"));
        assert_eq!(facts.interval, Duration::from_secs(60));
        assert_eq!(facts.pci_devices_dir, PathBuf::from("/sys/bus/pci/devices"));

        let cli = parse(&[
            "exporter",
            "--listen",
            ":9400",
            "--metrics-config-map",
            "metrics-config",
            "--kubelet-root",
            "/var/lib/k0s/kubelet",
            "--node-name",
            "n1",
        ])
        .unwrap();
        let Command::Exporter(exporter) = cli.command else {
            panic!("exporter")
        };
        assert_eq!(exporter.listen, "0.0.0.0:9400".parse().unwrap());
        assert_eq!(
            exporter.metrics_config_map.as_deref(),
            Some("metrics-config")
        );
        assert_eq!(exporter.kubelet_root, PathBuf::from("/var/lib/k0s/kubelet"));
        assert_eq!(exporter.xid_clear_seconds, Duration::from_secs(300));
        assert_eq!(exporter.collect_interval, Duration::from_secs(5));

        for line in [
            &["validate", "driver"][..],
            &["validate", "toolkit"],
            &["validate", "watch"],
            &["validate", "wait", "--for", "driver", "--for", "toolkit"],
        ] {
            parse(line).unwrap_or_else(|error| panic!("{line:?}: {error}"));
        }
    }

    #[test]
    fn mig_admin_tools_need_no_node_or_config_map() {
        let cli = parse(&[
            "mig",
            "plan",
            "-f",
            "config.yaml",
            "-c",
            "all-1g.10gb",
            "--simulate",
            "a100-80gb:2",
            "--sim-state",
            "/tmp/x.json",
        ])
        .unwrap();
        let Command::Mig(mig) = cli.command else {
            panic!("mig")
        };
        assert!(
            matches!(mig.action, Some(MigAction::Plan(ref file)) if file.config == "all-1g.10gb")
        );
        assert!(cli.gpus.simulate.is_some());
    }

    #[test]
    fn simulated_processes_take_a_mig_place_as_both_ids() {
        let line = [
            "simulator",
            "--node-name",
            "n1",
            "start-process",
            "--gpu",
            "1",
            "--pid",
            "42",
            "--memory-mib",
            "2048",
        ];
        let cli = parse(&line).unwrap();
        let Command::Simulator(simulator) = cli.command else {
            panic!("simulator")
        };
        assert!(matches!(
            simulator.action,
            SimulatorAction::StartProcess {
                gpu: 1,
                pid: 42,
                memory_mib: 2048,
                gpu_instance: None,
                compute_instance: None,
                host_process: false,
            }
        ));
        let half: Vec<&str> = line
            .iter()
            .copied()
            .chain(["--gpu-instance", "1"])
            .collect();
        assert!(parse(&half).is_err());
    }

    #[test]
    fn xids_are_injected_by_the_simulator_tool() {
        let cli = parse(&[
            "simulator",
            "--node-name",
            "n1",
            "xid",
            "--gpu",
            "2",
            "--xid",
            "79",
        ])
        .unwrap();
        let Command::Simulator(simulator) = cli.command else {
            panic!("simulator")
        };
        assert!(matches!(
            simulator.action,
            SimulatorAction::Xid { gpu: 2, xid: 79 }
        ));
    }

    #[test]
    fn listen_addresses_are_a_port_or_an_address_and_port() {
        assert_eq!(
            listen_address("127.0.0.1:0"),
            Ok("127.0.0.1:0".parse().unwrap())
        );
        assert_eq!(
            listen_address("[::]:9400"),
            Ok("[::]:9400".parse().unwrap())
        );
        for bad in ["9400", ":http", "localhost:9400", ":70000"] {
            let error = listen_address(bad).unwrap_err();
            assert!(
                error.starts_with("expected :PORT or ADDRESS:PORT"),
                "{error}"
            );
        }
    }

    #[test]
    fn the_role_needs_its_config_map() {
        let error = parse(&["mig", "--node-name", "n1"]).unwrap_err();
        assert!(error.to_string().contains("--config-map"), "{error}");
        assert!(parse(&["discovery", "--mig-strategy", "dual", "--node-name", "n"]).is_err());
    }
}

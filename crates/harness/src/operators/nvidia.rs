//! NVIDIA's gpu-operator on the local cluster: the release `cargo xtask bench` measures ours against and the
//! switch test (`tests/tests/switch.rs`) switches from. Built once from its Go module into the cache
//! ([`cluster::nvidia_gpu_operator`]), it runs as a local process with its chart's ServiceAccount token, in a root
//! of its own (`chroot`) where its hard-coded paths exist, since kwok nodes run no containers.
//!
//! The benchmark, `cargo xtask nvidia-operator build|start|stop` and the switch test all start it through here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::NAMESPACE;
use crate::cluster::{self, ClusterInfo, Workload};

/// The workload name `cluster down` knows the process by (its log is `logs/nvidia-gpu-operator.log`).
pub const WORKLOAD: &str = "nvidia-gpu-operator";

/// Starts the operator built into `build` (the directory [`cluster::nvidia_gpu_operator`] returns) as the cluster
/// workload [`WORKLOAD`], authenticated as its chart's ServiceAccount, serving its metrics at `metrics_addr`.
pub fn start(
    info: &ClusterInfo,
    build: &Path,
    metrics_addr: SocketAddr,
) -> anyhow::Result<Workload> {
    let root = prepare_root(info, build)?;
    cluster::start_workload(
        info,
        WORKLOAD,
        Path::new("/usr/sbin/chroot"),
        &[
            root.display().to_string(),
            "/bin/gpu-operator".into(),
            "--leader-elect".into(),
            format!("--metrics-bind-address={metrics_addr}"),
            "--health-probe-bind-address=0".into(),
        ],
        &[
            ("KUBECONFIG".into(), "/kubeconfig".into()),
            ("OPERATOR_NAMESPACE".into(), NAMESPACE.into()),
        ],
    )
}

/// Stops the workload [`WORKLOAD`] if it runs.
pub fn stop(info: &ClusterInfo) -> anyhow::Result<()> {
    cluster::stop_workload(info, WORKLOAD)
}

/// The root NVIDIA's operator runs in (`chroot`): its hard-coded paths exist there without touching the host's
/// `/`. `/opt/gpu-operator` holds its manifests as its image does, `/host-etc/os-release` is the host's, and the
/// ServiceAccount's namespace file tells its leader election where the Lease goes, as in a pod.
fn prepare_root(info: &ClusterInfo, build: &Path) -> anyhow::Result<PathBuf> {
    let root = info.state_dir.join("nvidia-gpu-operator-root");
    if root.exists() {
        std::fs::remove_dir_all(&root)
            .with_context(|| format!("cannot remove {}", root.display()))?;
    }
    let opt = root.join("opt/gpu-operator");
    cluster::copy_tree(&build.join("assets"), &opt)?;
    cluster::copy_tree(&build.join("manifests"), &opt.join("manifests"))?;
    let account = root.join("var/run/secrets/kubernetes.io/serviceaccount");
    for dir in [root.join("bin"), root.join("host-etc"), account.clone()] {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::copy(
        build.join("nvidia-gpu-operator"),
        root.join("bin/gpu-operator"),
    )
    .context("cannot copy NVIDIA's gpu-operator into its root")?;
    std::fs::copy("/etc/os-release", root.join("host-etc/os-release"))
        .context("cannot copy /etc/os-release")?;
    std::fs::write(account.join("namespace"), NAMESPACE)?;
    let kubeconfig = cluster::service_account_kubeconfig(info, NAMESPACE, "gpu-operator")?;
    std::fs::copy(&kubeconfig, root.join("kubeconfig"))
        .context("cannot copy the ServiceAccount's kubeconfig")?;
    Ok(root)
}

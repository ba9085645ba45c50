//! What the demo and the benchmark both do on a running cluster: install the chart as NVIDIA's guide does, and
//! start the operator as the chart's Deployment would run it (kwok runs no containers, so it runs as a local
//! process with the chart's ServiceAccount token, and `cluster down` stops it).

use std::path::Path;

use crate::cluster::{self, ClusterInfo, Workload};
use crate::command;

/// The namespace of NVIDIA's guides, and ours.
pub const NAMESPACE: &str = "gpu-operator";

/// `helm upgrade --install --wait` of the chart with the guide's pre-installed-driver settings.
pub fn install_chart(root: &Path, env: &[(String, String)], timeout: &str) -> anyhow::Result<()> {
    let chart = root.join("charts/gpu-operator").display().to_string();
    command::run(
        root,
        env,
        "helm",
        &[
            "upgrade",
            "--install",
            "--wait",
            "--timeout",
            timeout,
            "gpu-operator",
            "-n",
            NAMESPACE,
            "--create-namespace",
            &chart,
            "--set",
            "driver.enabled=false",
            "--set",
            "nfd.enabled=false",
        ],
    )
}

/// Starts `gpu-operator run` from `binary` as the cluster workload `gpu-operator` (replacing a running one),
/// authenticated as the chart's ServiceAccount; `identity` is its name in the leader lease.
pub fn start_operator(
    info: &ClusterInfo,
    binary: &Path,
    identity: &str,
) -> anyhow::Result<Workload> {
    let kubeconfig = cluster::service_account_kubeconfig(info, NAMESPACE, "gpu-operator")?;
    cluster::start_workload(
        info,
        "gpu-operator",
        binary,
        &["run".into(), "--health-addr".into(), "127.0.0.1:0".into()],
        &[
            ("KUBECONFIG".into(), kubeconfig.display().to_string()),
            ("OPERATOR_NAMESPACE".into(), NAMESPACE.into()),
            ("POD_NAME".into(), identity.into()),
        ],
    )
}

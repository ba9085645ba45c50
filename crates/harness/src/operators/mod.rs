//! The operators as workloads of the local cluster, whose kwok nodes run no containers: this one as the chart's
//! Deployment would run it, and NVIDIA's ([`nvidia`]), each a local process with its chart's ServiceAccount token
//! (`cluster down` stops them).

pub mod nvidia;

use std::net::SocketAddr;
use std::path::Path;

use crate::cluster::{self, ClusterInfo, Workload};

/// The namespace of NVIDIA's guides, and ours.
pub const NAMESPACE: &str = "gpu-operator";

/// Starts `gpu-operator run` from `binary` as the cluster workload `gpu-operator` (replacing a running one),
/// authenticated as the chart's ServiceAccount; `identity` is its name in the leader lease, `health_addr` where it
/// serves its probes and metrics.
pub fn start_operator(
    info: &ClusterInfo,
    binary: &Path,
    identity: &str,
    health_addr: SocketAddr,
) -> anyhow::Result<Workload> {
    let kubeconfig = cluster::service_account_kubeconfig(info, NAMESPACE, "gpu-operator")?;
    cluster::start_workload(
        info,
        "gpu-operator",
        binary,
        &[
            "run".into(),
            "--health-addr".into(),
            health_addr.to_string(),
        ],
        &[
            ("KUBECONFIG".into(), kubeconfig.display().to_string()),
            ("OPERATOR_NAMESPACE".into(), NAMESPACE.into()),
            ("POD_NAME".into(), identity.into()),
        ],
    )
}

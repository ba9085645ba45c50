//! A standalone DCGM host engine, NVIDIA's image. This operator's exporter reads the GPUs directly and needs
//! none; it is deployed because NVIDIA's operator does by default and other tools may connect to it.

use super::RenderedObject;
use super::common::{Awaits, OperandDaemonSet, RootFs, User, confined, container, port};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

/// The host engine's port.
const DCGM_PORT: i32 = 5555;

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let mut ds = OperandDaemonSet::new(policy, facts, Component::Dcgm);
    // `-n`: stay in the foreground; `-b ALL`: listen on every interface, so clients on the node reach it.
    ds.main = container("nvidia-dcgm-ctr", ["nv-hostengine", "-n", "-b", "ALL"]);
    let mut dcgm_port = port("dcgm", DCGM_PORT);
    dcgm_port.host_port = policy.spec.dcgm.host_port;
    ds.main.ports = Some(vec![dcgm_port]);
    // NVIDIA's image, which NVIDIA's operator runs privileged; the host engine needs less: CAP_SYS_ADMIN for the
    // profiling (DCP) fields its clients ask for, as DCGM documents, root for the MIG monitor capability device,
    // and a writable root for its log file. The image's own env has the NVIDIA runtime give it the GPUs.
    ds.main.security_context = confined(User::Root, &["SYS_ADMIN"], RootFs::Writable);
    ds.await_validation(Awaits::DriverAndToolkit);
    vec![ds.build().into()]
}

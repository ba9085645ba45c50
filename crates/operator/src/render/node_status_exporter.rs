//! The node status exporter (`gpu-node-agent status-exporter`, the validator's image unless its section names
//! one): serves each node's validation state as metrics on port 8000.

use super::RenderedObject;
use super::common::{
    Awaits, HostMount, NODE_AGENT, OperandDaemonSet, RootFs, User, confined, container,
    node_name_env, port,
};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

const METRICS_PORT: i32 = 8000;

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let mut ds = OperandDaemonSet::new(policy, facts, Component::NodeStatusExporter);
    let listen = format!(":{METRICS_PORT}");
    ds.main = container(
        Component::NodeStatusExporter.app_name(),
        [NODE_AGENT, "status-exporter", "--listen", &listen],
    );
    ds.main.env = Some(vec![node_name_env()]);
    ds.main.ports = Some(vec![port("metrics", METRICS_PORT)]);
    // Non-root: it reads world-readable ready files and talks to the API server.
    ds.main.security_context = confined(User::NonRoot, &[], RootFs::ReadOnly);
    // The validator's ready files are the status it exports.
    ds.mount(&HostMount::validations().read_only());
    ds.await_validation(Awaits::DriverAndToolkit);
    vec![ds.build().into()]
}

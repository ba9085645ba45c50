//! What the DRA driver's suites share: the driver started as its DaemonSet starts it, and reading what it
//! published and prepared.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::agents::{NodeAgent, dra_driver_bin};
use crate::kubelet::pod_on;
use crate::{clean_up, eventually, kubectl_json, run};

/// The ServiceAccount the operator's DRA driver DaemonSet runs as.
pub const DRIVER_ACCOUNT: &str = "nvidia-dra-driver-gpu";
/// How long the driver under test keeps a GPU Unhealthy after its last XID.
const HEALTH_RECOVERY: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(90);

/// The driver for `node` as a local process under the chart's ServiceAccount, with the DaemonSet's command line
/// and `env` (the partition: `DRA_GPUS`, `DRA_SHARED_GPUS`, `DRA_DYNAMIC_MIG_GPUS`).
pub fn start_driver(
    node: &str,
    state: &Path,
    root: &Path,
    host: &Path,
    env: &[(&str, &str)],
) -> NodeAgent {
    let (root, cdi, mps, state_dir, dev) = (
        root.display().to_string(),
        host.join("cdi").display().to_string(),
        host.join("mps").display().to_string(),
        host.join(DRIVER_STATE).display().to_string(),
        host.join("dev").display().to_string(),
    );
    NodeAgent::start(
        &dra_driver_bin(),
        node,
        DRIVER_ACCOUNT,
        state,
        &[
            "run",
            "--kubelet-root",
            &root,
            "--cdi-root",
            &cdi,
            "--mps-root",
            &mps,
            "--state-dir",
            &state_dir,
            "--dev-root",
            &dev,
            // Short enough that a test sees a GPU recover, long enough that it sees it Unhealthy first.
            "--health-recovery-seconds",
            &HEALTH_RECOVERY.as_secs().to_string(),
        ],
        env,
    )
}

/// Turns MIG mode on on every GPU of the simulated `node`, as an admin would: NVIDIA's `all-enabled` config (MIG on,
/// no instance) applied by the MIG manager's admin command.
pub fn mig_mode_on(node: &str, state: &Path) {
    let nvidia_config = crate::repo_root()
        .join("crates/crd/src/mig/default-mig-config.yaml")
        .display()
        .to_string();
    crate::simulated::run_tool(
        &crate::agents::node_agent_bin(),
        node,
        state,
        &["mig", "apply", "-f", &nvidia_config, "-c", "all-enabled"],
    );
}

/// The driver's slice `name` (`<node>-gpu.nvidia.com`, the first of its pool), once published.
pub fn slice_named(name: &str) -> Option<Value> {
    let got = run("kubectl", &["get", "resourceslice", name, "-o", "json"]);
    got.success
        .then(|| serde_json::from_str(&got.stdout).expect("kubectl printed JSON"))
}

/// The driver's first slice of `node`, once published.
pub fn slice_of(node: &str) -> Option<Value> {
    slice_named(&format!("{node}-gpu.nvidia.com"))
}

/// The claim generated for the pod's first claim entry, or else the one the scheduler made for its extended
/// resources (`nvidia.com/gpu` served through the `gpu.nvidia.com` class).
pub fn claim_of(pod: &Value) -> String {
    pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .or_else(|| pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"].as_str())
        .unwrap_or_else(|| panic!("the pod has no claim: {pod:#}"))
        .to_owned()
}

/// A pod on `node` whose one container takes the claim made from `template`.
pub fn claim_pod(name: &str, node: &str, template: &str) -> String {
    pod_on(
        name,
        node,
        &json!({"claims": [{"name": "gpu"}]}),
        &[("gpu", template)],
    )
}

/// The driver's state directory (its checkpoint) under the host directory given to [`start_driver`].
const DRIVER_STATE: &str = "run/nvidia/dra-driver";

/// Where the driver started on `host` by [`start_driver`] keeps its checkpoint of prepared claims.
pub fn checkpoint_path(host: &Path) -> PathBuf {
    host.join(DRIVER_STATE).join("checkpoint.json")
}

/// The checkpoint of prepared claims of the driver started on `host` by [`start_driver`].
pub fn checkpoint(host: &Path) -> Value {
    std::fs::read_to_string(checkpoint_path(host))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null)
}

/// The pod's PodScheduled condition once the scheduler gave up on it for now.
pub fn wait_unschedulable(name: &str) -> Value {
    eventually(WAIT, || {
        let pod = kubectl_json(&["get", "pod", name, "-n", "default"]);
        let condition = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|condition| condition["type"] == "PodScheduled" && condition["status"] == "False")
            .cloned();
        Ok(condition.filter(|condition| condition["reason"] == "Unschedulable"))
    })
    .unwrap_or_else(|error| panic!("pod {name} was never reported unschedulable: {error:#}"))
}

/// Deletes objects of namespace `default` (kind, name) when dropped, also when an assertion fails.
#[derive(Debug)]
pub struct Cleanup(pub Vec<(&'static str, String)>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for (kind, name) in &self.0 {
            clean_up(&[kind, name, "-n", "default", "--wait=false"]);
        }
    }
}

//! The device plugin (`gpu-device-plugin run`) as a local process for one simulated node, with the token a pod of
//! the chart's `nvidia-device-plugin-daemonset` ServiceAccount has on that node (so the chart's RBAC and its
//! node-bound-writes policies are what is tested), the command
//! line the operator's DaemonSet gives it, and either a temporary kubelet root (a kwok node: the plugin serves its
//! sockets and reports into GPUNode status without registering) or a real kubelet's ([`crate::kubelet`]).
//!
//! The binary is `E2E_DEVICE_PLUGIN_BIN`, else `gpu-device-plugin` in `$CARGO_TARGET_DIR/debug` (or the
//! workspace's `target/debug`): build it with `cargo build -p device-plugin` before the tests run.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use crate::agents::{pod_token_kubeconfig, simulator_tool};
use crate::{NAMESPACE, simulated, workspace_binary};

/// The ServiceAccount the operator's device-plugin DaemonSet runs as.
pub const SERVICE_ACCOUNT: &str = "nvidia-device-plugin-daemonset";

/// The `gpu-device-plugin` binary under test.
pub fn device_plugin_bin() -> PathBuf {
    workspace_binary(
        "E2E_DEVICE_PLUGIN_BIN",
        "gpu-device-plugin",
        "device-plugin",
    )
}

/// The kubelet root the plugin of `node` uses, next to its simulator state.
pub fn kubelet_root(node: &str, state: &Path) -> PathBuf {
    state.with_file_name(format!("{node}-kubelet"))
}

/// Queues an XID on GPU `gpu` of a simulated node (`gpu-node-agent simulator xid`), as the driver reports one.
pub fn inject_xid(node: &str, state: &Path, gpu: u32, xid: u64) {
    let (gpu, xid) = (gpu.to_string(), xid.to_string());
    simulator_tool(node, state, &["xid", "--gpu", &gpu, "--xid", &xid]);
}

/// One plugin process; killed when dropped.
#[derive(Debug)]
pub struct DevicePlugin {
    child: Child,
    /// Its kubelet root: sockets are in `device-plugins/`.
    pub root: PathBuf,
    /// Where it writes its CDI spec.
    pub cdi_dir: PathBuf,
    log: PathBuf,
}

impl DevicePlugin {
    /// Starts `gpu-device-plugin run <args>` for `node` on the simulated GPUs in `state`, with MIG polled every
    /// second so that the test sees geometry changes quickly (unless `args` sets `--mig-poll-seconds`), on a
    /// kubelet root of its own (no kubelet).
    pub fn start(node: &str, state: &Path, args: &[&str]) -> Self {
        Self::start_on(&kubelet_root(node, state), node, state, args)
    }

    /// As [`start`](Self::start), for the kubelet whose device-plugin directory is under `root`.
    pub fn start_on(root: &Path, node: &str, state: &Path, args: &[&str]) -> Self {
        let files = kubelet_root(node, state);
        std::fs::create_dir_all(root.join("device-plugins")).expect("kubelet root");
        let log = state.with_file_name(format!("{node}-device-plugin.log"));
        let output = std::fs::File::create(&log).expect("plugin log");
        let cdi_dir = files.join("cdi");
        let child = simulated::command(&device_plugin_bin(), node, state, &["run"])
            .args(args)
            .arg("--kubelet-root")
            .arg(root)
            .arg("--mps-root")
            .arg(files.join("mps"))
            .arg("--cdi-dir")
            .arg(&cdi_dir)
            .args(
                (!args.contains(&"--mig-poll-seconds"))
                    .then_some(["--mig-poll-seconds", "1"])
                    .into_iter()
                    .flatten(),
            )
            .env("KUBECONFIG", pod_token_kubeconfig(SERVICE_ACCOUNT, node))
            .env("OPERATOR_NAMESPACE", NAMESPACE)
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(output.try_clone().expect("log handle")))
            .stderr(Stdio::from(output))
            .spawn()
            .expect("start gpu-device-plugin");
        Self {
            child,
            root: root.to_owned(),
            cdi_dir,
            log,
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The plugin's output so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the plugin serves a socket for `resource` (e.g. `nvidia.com/gpu.shared`).
    pub fn serves(&self, resource: &str) -> bool {
        let short = resource.trim_start_matches("nvidia.com/");
        self.root
            .join(format!("device-plugins/nvidia-{short}.sock"))
            .exists()
    }
}

impl Drop for DevicePlugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

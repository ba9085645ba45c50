//! The node-side binaries (`gpu-node-agent`, `gpu-device-plugin`, `gpu-dra-driver`) on a simulated node: every
//! process of the node runs with `--simulate node` (the GPUs the Node's `nvidia.com/gpu.simulator` annotation names)
//! and the node's one state file, as the processes of a real node share its GPUs.
use std::path::Path;
use std::process::Command;

/// `binary <args> --simulate node --sim-state <state>` for `node` (`NODE_NAME`), to be given its environment and
/// started by the caller.
pub fn command(binary: &Path, node: &str, state: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(binary);
    command
        .args(args)
        .args(["--simulate", "node", "--sim-state"])
        .arg(state)
        .env("NODE_NAME", node);
    command
}

/// Runs one tool command of `binary` on `node`'s simulated GPUs with the admin's credentials (it reads at most the
/// Node's annotation) and returns what it printed; fails the test when the command fails.
pub fn run_tool(binary: &Path, node: &str, state: &Path, args: &[&str]) -> String {
    let name = binary.file_name().unwrap_or_default().to_string_lossy();
    let output = command(binary, node, state, args)
        .output()
        .unwrap_or_else(|error| panic!("run {name} {args:?}: {error}"));
    assert!(
        output.status.success(),
        "{name} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

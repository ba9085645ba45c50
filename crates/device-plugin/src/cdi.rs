//! The CDI spec the `cdi-cri` and `cdi-annotations` answers refer to: one CDI device per GPU and MIG device, named
//! by UUID, of kind `k8s.device-plugin.nvidia.com/gpu`. A CDI-aware runtime (containerd, CRI-O) resolves the names
//! in Allocate's answer through this file, so it must be written before the names are handed out.
//!
//! The spec is built by a pure function; [`write`] is the one place that touches the file system.

use std::path::{Path, PathBuf};

use node_runtime::state_file::{self, Lifetime, StateFileError};
use serde_json::{Value, json};

use crate::plan::{Device, Plan};

/// The CDI kind (`vendor/class`) of every device this plugin names.
pub const KIND: &str = "k8s.device-plugin.nvidia.com/gpu";
/// The CDI spec version written; 0.6.0 is read by every CDI-capable containerd and CRI-O release.
const CDI_VERSION: &str = "0.6.0";
/// The spec's file name in the CDI directory.
const FILE_NAME: &str = "k8s.device-plugin.nvidia.com-gpu.json";
/// Device nodes every GPU container needs, whichever GPU it has.
const CONTROL_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// The fully qualified CDI name of a device: `k8s.device-plugin.nvidia.com/gpu=<uuid>`.
#[must_use]
pub fn qualified_name(uuid: &str) -> String {
    format!("{KIND}={uuid}")
}

/// The device nodes for these GPU indices: the control nodes, then `/dev/nvidia<index>` for each.
///
/// The GPU's index stands for its device minor number, which is what the driver assigns on every machine where
/// the PCI order and the NVML order agree (NVML reports the minor number too; the backend does not carry it yet).
#[must_use]
pub fn device_nodes(gpus: &[u32]) -> Vec<String> {
    CONTROL_NODES
        .iter()
        .map(|path| (*path).to_owned())
        .chain(gpus.iter().map(|gpu| format!("/dev/nvidia{gpu}")))
        .collect()
}

/// The CDI spec for every physical device of a plan (replicas share their device's entry).
#[must_use]
pub fn spec(plan: &Plan) -> Value {
    let mut devices: Vec<&Device> = plan
        .values()
        .flat_map(|resource| &resource.devices)
        .collect();
    devices.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    devices.dedup_by(|a, b| a.uuid == b.uuid);
    let node = |path: &str| json!({ "path": path });
    let entries: Vec<Value> = devices
        .iter()
        .map(|device| {
            json!({
                "name": device.uuid,
                "containerEdits": {
                    "env": [format!("NVIDIA_VISIBLE_DEVICES={}", device.uuid)],
                    "deviceNodes": [node(&format!("/dev/nvidia{}", device.gpu_index))],
                },
            })
        })
        .collect();
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": entries,
        "containerEdits": { "deviceNodes": CONTROL_NODES.iter().map(|path| node(path)).collect::<Vec<_>>() },
    })
}

/// Writes `spec` into the CDI directory `dir` (created when missing), replacing the previous spec atomically and
/// durably so that a runtime never reads half a file, even after a power loss; returns the file's path.
///
/// # Errors
/// When the directory or the file cannot be written.
pub fn write(dir: &Path, spec: &Value) -> Result<PathBuf, StateFileError> {
    let path = dir.join(FILE_NAME);
    state_file::write_json(&path, spec, Lifetime::Durable)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use node_runtime::testing::simulated;

    use super::*;
    use crate::plan::tests::planned;

    #[test]
    fn spec_names_every_physical_device_once() {
        let (_dir, simulator) = simulated("a100-40gb:2", &[]);
        let config = crd::config::device_plugin::parse(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n",
        )
        .unwrap();
        let plan = crate::plan::advertise(
            &planned(&simulator),
            &config,
            crd::config::device_plugin::MigStrategy::None,
        )
        .unwrap();
        let spec = spec(&plan);
        assert_eq!(spec["kind"], KIND);
        let devices = spec["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        let uuid = devices[0]["name"].as_str().unwrap();
        assert!(uuid.starts_with("GPU-"));
        assert_eq!(
            spec["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/nvidiactl"
        );

        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir.path().join("cdi"), &spec).unwrap();
        let written: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(written, spec);
        assert_eq!(
            qualified_name(uuid),
            format!("k8s.device-plugin.nvidia.com/gpu={uuid}")
        );
    }

    #[test]
    fn device_nodes_start_with_the_control_nodes() {
        assert_eq!(
            device_nodes(&[0, 3]),
            [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia0",
                "/dev/nvidia3"
            ]
        );
    }
}

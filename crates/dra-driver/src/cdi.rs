//! The CDI spec of one prepared claim: a transient spec per claim in the runtime's dynamic CDI directory, of kind
//! `k8s.gpu.nvidia.com/claim` (NVIDIA's DRA driver's), with one CDI device per allocated device named
//! `<claim UID>-<device>`, so that two claims sharing a GPU never produce the same CDI name.
//!
//! A shared device's memory is held either by the claim's MPS daemon (the pinned-memory limit in the container's
//! environment) or, where the driver caps cgroups (R615+), by the driver: the container toolkit's
//! `apply-cuda-memory-limits` hook reads `NVIDIA_GPU_MEMORY_LIMIT` when the container is created and sets it on the
//! container's cgroup through NVML. The toolkit applies the one value to each GPU of the container, so a container
//! given two shared devices with different limits gets one of them for both.
//!
//! The spec is built by a pure function from the claim's [`PreparedDevice`]s; [`write`] and [`remove`] are the only
//! functions here that touch the file system.

use std::io;
use std::path::{Path, PathBuf};

use crd::dra::MemoryEnforcement;
use node_runtime::mps::{MEMORY_LIMIT_ENV, PIPE_ENV, THREADS_ENV};
use node_runtime::state_file::{self, Lifetime, StateFileError};
use serde_json::{Value, json};

/// The CDI kind (`vendor/class`) of every device this driver names.
pub const KIND: &str = "k8s.gpu.nvidia.com/claim";
/// The CDI spec version written; 0.6.0 is read by every CDI-capable containerd and CRI-O release.
const CDI_VERSION: &str = "0.6.0";
/// Where a container finds its claim's MPS control daemon.
pub const CONTAINER_MPS_PIPE: &str = "/tmp/nvidia-mps";
/// The variable the NVIDIA container runtime reads the devices from.
const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
/// The hard GPU memory limit, in MiB, the toolkit's hook sets on the container's cgroup.
pub const DRIVER_MEMORY_LIMIT_ENV: &str = "NVIDIA_GPU_MEMORY_LIMIT";
/// The toolkit hook's subcommand that applies it.
const MEMORY_LIMIT_HOOK_COMMAND: &str = "apply-cuda-memory-limits";

/// One allocated device of a claim, as its container must see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreparedDevice {
    /// The requests of the claim it serves.
    pub requests: Vec<String>,
    /// Pool and device name in the driver's slice.
    pub pool: String,
    /// The device's name in the slice.
    pub device: String,
    /// The allocation's share ID on a shared device.
    pub share_id: Option<String>,
    /// The GPU's or MIG device's UUID.
    pub uuid: String,
    /// Device nodes of this device that exist on the host (none on simulated GPUs).
    pub device_nodes: Vec<String>,
    /// On a shared GPU, the limits the claim was allocated, and its MPS daemon's pipe directory on the host.
    pub limits: Option<ShareLimits>,
    /// A MIG placement made on demand: what to create for the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand: Option<crate::dynamic_mig::OnDemand>,
    /// The MIG instance created for the claim, once it exists (destroyed at unprepare).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_instance: Option<crate::dynamic_mig::MigInstance>,
}

/// What a claim was allocated on a shared GPU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShareLimits {
    /// Device memory, in MiB.
    pub memory_mib: u64,
    /// Percent of the SMs; 0 when the claim asked for none (then it is not capped).
    pub cores: u64,
    /// The host directory of the claim's MPS daemon for this device.
    pub mps_dir: PathBuf,
    /// What holds the claim to its memory (claims checkpointed before the driver could cap cgroups: MPS).
    #[serde(default)]
    pub enforcement: MemoryEnforcement,
}

impl ShareLimits {
    /// The SM share MPS enforces: the claim's cores, or all of them when it asked for none (MPS has no zero).
    #[must_use]
    pub fn thread_percentage(&self) -> u32 {
        u32::try_from(self.cores)
            .ok()
            .filter(|cores| (1..=100).contains(cores))
            .unwrap_or(100)
    }
}

/// The CDI device name of `device` in claim `claim_uid`.
#[must_use]
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI ID the kubelet hands the runtime.
#[must_use]
pub fn qualified_name(claim_uid: &str, device: &str) -> String {
    format!("{KIND}={}", device_name(claim_uid, device))
}

/// The spec of one claim; `memory_limit_hook` is the toolkit's hook program on the host, for the devices whose
/// memory the driver holds.
#[must_use]
pub fn spec(
    claim_uid: &str,
    devices: &[PreparedDevice],
    memory_limit_hook: Option<&Path>,
) -> Value {
    let entries: Vec<Value> = devices
        .iter()
        .map(|device| {
            let mut env = vec![format!("{VISIBLE_DEVICES_ENV}={}", device.uuid)];
            let mut mounts = Vec::new();
            let mut hooks = Vec::new();
            if let Some(limits) = &device.limits {
                match (limits.enforcement, memory_limit_hook) {
                    (MemoryEnforcement::Driver, Some(hook)) => {
                        env.push(format!("{DRIVER_MEMORY_LIMIT_ENV}={}", limits.memory_mib));
                        hooks.push(json!({
                            "hookName": "createContainer",
                            "path": hook,
                            "args": ["nvidia-cdi-hook", MEMORY_LIMIT_HOOK_COMMAND],
                        }));
                    }
                    // Inside the container the claim's device is the only one, device 0 of its MPS daemon.
                    _ => env.push(format!("{MEMORY_LIMIT_ENV}=0={}M", limits.memory_mib)),
                }
                env.push(format!("{THREADS_ENV}={}", limits.thread_percentage()));
                env.push(format!("{PIPE_ENV}={CONTAINER_MPS_PIPE}"));
                mounts.push(json!({
                    "hostPath": limits.mps_dir.join("pipe"),
                    "containerPath": CONTAINER_MPS_PIPE,
                    "options": ["rbind", "rw"],
                }));
                mounts.push(json!({
                    "hostPath": limits.mps_dir.join("shm"),
                    "containerPath": "/dev/shm",
                    "options": ["rbind", "rw"],
                }));
            }
            let nodes: Vec<Value> = device
                .device_nodes
                .iter()
                .map(|path| json!({ "path": path }))
                .collect();
            let mut edits = json!({ "env": env });
            if !mounts.is_empty() {
                edits["mounts"] = Value::Array(mounts);
            }
            if !nodes.is_empty() {
                edits["deviceNodes"] = Value::Array(nodes);
            }
            if !hooks.is_empty() {
                edits["hooks"] = Value::Array(hooks);
            }
            json!({
                "name": device_name(claim_uid, &device.device),
                "containerEdits": edits,
            })
        })
        .collect();
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": entries,
    })
}

/// The spec file of a claim in `dir`: `k8s.gpu.nvidia.com-claim_<uid>.json`, the transient name NVIDIA's driver
/// uses, so the runtime loads it from the dynamic CDI directory.
#[must_use]
pub fn path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(format!("k8s.gpu.nvidia.com-claim_{claim_uid}.json"))
}

/// Writes a claim's spec atomically (a runtime never reads half a file), for this boot: the runtime's dynamic CDI
/// directory is on tmpfs on most hosts, and a claim's devices are prepared again after a reboot.
///
/// # Errors
/// When the directory or the file cannot be written.
pub fn write(dir: &Path, claim_uid: &str, spec: &Value) -> Result<(), StateFileError> {
    state_file::write_json(&path(dir, claim_uid), spec, Lifetime::ThisBoot)
}

/// Removes a claim's spec; a spec already gone is fine (unprepare is retried).
///
/// # Errors
/// When the file exists and cannot be removed.
pub fn remove(dir: &Path, claim_uid: &str) -> io::Result<()> {
    match std::fs::remove_file(path(dir, claim_uid)) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(cores: u64) -> PreparedDevice {
        PreparedDevice {
            requests: vec!["gpu".into()],
            pool: "node-a".into(),
            device: "gpu-1".into(),
            share_id: Some("share-1".into()),
            uuid: "GPU-1".into(),
            device_nodes: vec![],
            limits: Some(ShareLimits {
                memory_mib: 3000,
                cores,
                mps_dir: PathBuf::from("/run/nvidia/mps/claim-1/gpu-1"),
                enforcement: MemoryEnforcement::MpsPinned,
            }),
            on_demand: None,
            mig_instance: None,
        }
    }

    #[test]
    fn a_shared_device_carries_its_limits_and_its_daemons_pipes() {
        let spec = spec("claim-1", &[shared(30)], None);
        assert_eq!(spec["kind"], KIND);
        let device = &spec["devices"][0];
        assert_eq!(device["name"], "claim-1-gpu-1");
        let env: Vec<&str> = device["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|value| value.as_str().unwrap())
            .collect();
        assert_eq!(
            env,
            [
                "NVIDIA_VISIBLE_DEVICES=GPU-1",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3000M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
            ]
        );
        let mounts = device["containerEdits"]["mounts"].as_array().unwrap();
        assert_eq!(mounts[0]["hostPath"], "/run/nvidia/mps/claim-1/gpu-1/pipe");
        assert_eq!(mounts[1]["containerPath"], "/dev/shm");
        assert!(device["containerEdits"].get("deviceNodes").is_none());
        assert_eq!(
            qualified_name("claim-1", "gpu-1"),
            "k8s.gpu.nvidia.com/claim=claim-1-gpu-1"
        );
    }

    #[test]
    fn a_claim_without_cores_is_not_capped_and_a_whole_gpu_has_no_limits() {
        let memory_only = spec("c", &[shared(0)], None);
        let env = memory_only["devices"][0]["containerEdits"]["env"].to_string();
        assert!(
            env.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"),
            "{env}"
        );

        let mut whole = shared(0);
        whole.limits = None;
        whole.device_nodes = vec!["/dev/nvidia1".into()];
        let spec = spec("c", &[whole], None);
        let edits = &spec["devices"][0]["containerEdits"];
        assert_eq!(edits["env"], json!(["NVIDIA_VISIBLE_DEVICES=GPU-1"]));
        assert_eq!(edits["deviceNodes"][0]["path"], "/dev/nvidia1");
        assert!(edits.get("mounts").is_none());
    }

    #[test]
    fn a_device_whose_memory_the_driver_holds_gets_the_toolkits_hook_and_no_pinned_limit() {
        let mut capped = shared(30);
        capped.limits.as_mut().unwrap().enforcement = MemoryEnforcement::Driver;
        let hook = Path::new("/usr/local/nvidia/toolkit/nvidia-cdi-hook");
        let capped_spec = spec("claim-1", &[capped.clone()], Some(hook));
        let edits = &capped_spec["devices"][0]["containerEdits"];
        assert_eq!(
            edits["env"],
            json!([
                "NVIDIA_VISIBLE_DEVICES=GPU-1",
                "NVIDIA_GPU_MEMORY_LIMIT=3000",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
            ])
        );
        assert_eq!(
            edits["hooks"],
            json!([{
                "hookName": "createContainer",
                "path": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
                "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits"]
            }])
        );
        // A hook that went away since (the toolkit downgraded): MPS holds the memory, never nothing.
        let without = spec("claim-1", &[capped], None);
        let edits = &without["devices"][0]["containerEdits"];
        assert!(edits.get("hooks").is_none());
        assert!(
            edits["env"]
                .to_string()
                .contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3000M")
        );
    }

    #[test]
    fn specs_are_written_and_removed_idempotently() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec("c", &[shared(10)], None);
        write(dir.path(), "c", &spec).unwrap();
        let written: Value =
            serde_json::from_slice(&std::fs::read(path(dir.path(), "c")).unwrap()).unwrap();
        assert_eq!(written, spec);
        remove(dir.path(), "c").unwrap();
        remove(dir.path(), "c").unwrap();
        assert!(!path(dir.path(), "c").exists());
    }
}

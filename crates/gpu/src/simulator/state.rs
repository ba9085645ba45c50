//! The simulated node's state, and the file it lives in.
//!
//! Several processes of one simulated node (agent, device plugin, exporter) open the same file, so every access
//! holds a lock: shared to read, exclusive for read-modify-write. The lock is a `flock` on a sidecar `<state>.lock`
//! file, not on the state file itself, because writes replace the state file by renaming a fresh copy over it (a
//! crash mid-write then leaves the old state, never half a file), and a lock on the replaced file would protect
//! nothing.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::faults::Faults;
use crate::error::{GpuError, Result};
use crate::types::{HealthEvent, MigMode, Placement};

/// Health events kept in the file; older ones are dropped (a reader that fell this far behind has lost them, as an
/// NVML event queue that overflows loses events).
pub(crate) const KEPT_EVENTS: usize = 256;

/// Everything about one simulated node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeState {
    /// The node the GPUs belong to (their UUIDs derive from it).
    pub node_name: String,
    /// The `--simulate` spec the state was created with, canonical form.
    pub spec: String,
    /// Sequence number the next health event gets.
    pub next_event: u64,
    /// Recent health events of every GPU, oldest first.
    pub events: Vec<StoredEvent>,
    /// The GPUs, by index.
    pub gpus: Vec<GpuState>,
}

/// A health event with its sequence number, so each reader can tell which ones it has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredEvent {
    /// Position in the node's event stream.
    pub sequence: u64,
    /// The event.
    pub event: HealthEvent,
}

/// One simulated GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GpuState {
    /// Catalog model (simulator name).
    pub model: String,
    /// GPU UUID.
    pub uuid: String,
    /// MIG mode now and after reset.
    pub mig_mode: MigMode,
    /// GPU instances, in creation order.
    pub gpu_instances: Vec<SimGpuInstance>,
    /// Injected faults.
    pub faults: Faults,
    /// The driver installed, when not the simulator's default ([`Simulator::set_driver_version`]).
    ///
    /// [`Simulator::set_driver_version`]: super::Simulator::set_driver_version
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// GPU memory limits the driver holds cgroups to, in MiB, by cgroup path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memory_limits: BTreeMap<String, u64>,
    /// Energy counted up to `energy_since_ms`, in millijoules.
    pub energy_millijoules: u64,
    /// When the energy was last settled (Unix milliseconds); power since then is constant.
    pub energy_since_ms: u64,
}

/// A simulated GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SimGpuInstance {
    /// GPU-instance id.
    pub id: u32,
    /// Profile id.
    pub profile_id: u32,
    /// Memory slices.
    pub placement: Placement,
    /// Compute instances in it.
    pub compute_instances: Vec<SimComputeInstance>,
}

/// A simulated compute instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SimComputeInstance {
    /// Compute-instance id within its GPU instance.
    pub id: u32,
    /// Compute slices.
    pub slice_count: u32,
}

impl NodeState {
    /// The GPU with this index.
    pub fn gpu(&self, index: u32) -> Result<&GpuState> {
        self.gpus
            .get(index as usize)
            .ok_or_else(|| no_such_gpu(index, self.gpus.len()))
    }

    /// Ends the simulated processes whose host process this process sees exited; returns whether any ended.
    pub fn end_exited_host_processes(&mut self) -> bool {
        let namespace = super::faults::own_pid_namespace();
        let mut ended = false;
        for gpu in &mut self.gpus {
            ended |= gpu.faults.end_exited_host_processes(&namespace);
        }
        ended
    }

    /// The GPU with this index, to change.
    pub fn gpu_mut(&mut self, index: u32) -> Result<&mut GpuState> {
        let count = self.gpus.len();
        self.gpus
            .get_mut(index as usize)
            .ok_or_else(|| no_such_gpu(index, count))
    }
}

fn no_such_gpu(index: u32, count: usize) -> GpuError {
    GpuError::NotFound(format!("GPU {index} (the node has {count} GPUs)"))
}

/// The state file and its lock file.
#[derive(Debug, Clone)]
pub(crate) struct StateFile {
    path: PathBuf,
    lock_path: PathBuf,
}

impl StateFile {
    pub fn new(path: PathBuf) -> Self {
        let lock_path = with_suffix(&path, ".lock");
        Self { path, lock_path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the state under a shared lock. When a host process standing for a GPU user has exited, the first
    /// reader that can see it records that in the file (under the exclusive lock), so that readers that cannot
    /// (in another PID namespace) see it end too.
    pub fn read(&self) -> Result<NodeState> {
        let mut state = {
            let lock = self.lock()?;
            lock.lock_shared()
                .map_err(|error| self.error("lock", &error))?;
            self.load()?
                .ok_or_else(|| self.error("read", &"the state file does not exist"))?
        };
        if state.end_exited_host_processes() {
            state = self.update(|state| Ok(state.clone()))?;
        }
        Ok(state)
    }

    /// Runs `change` on the state under an exclusive lock, and writes the result back if `change` succeeded and
    /// changed something. A failed operation leaves the file as it was, as a failed NVML call leaves the GPU.
    pub fn update<T>(&self, change: impl FnOnce(&mut NodeState) -> Result<T>) -> Result<T> {
        let lock = self.lock()?;
        lock.lock().map_err(|error| self.error("lock", &error))?;
        let before = self
            .load()?
            .ok_or_else(|| self.error("read", &"the state file does not exist"))?;
        let mut state = before.clone();
        state.end_exited_host_processes();
        let value = change(&mut state)?;
        if state != before {
            self.store(&state)?;
        }
        Ok(value)
    }

    /// Under an exclusive lock: the existing state, checked by `check`, or a new one from `create`, written.
    pub fn open_or_create(
        &self,
        create: impl FnOnce() -> NodeState,
        check: impl FnOnce(&NodeState) -> Result<()>,
    ) -> Result<NodeState> {
        if let Some(parent) = self
            .path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
        {
            fs::create_dir_all(parent)
                .map_err(|error| self.error("create the folder of", &error))?;
        }
        let lock = self.lock()?;
        lock.lock().map_err(|error| self.error("lock", &error))?;
        if let Some(state) = self.load()? {
            check(&state)?;
            return Ok(state);
        }
        let state = create();
        self.store(&state)?;
        Ok(state)
    }

    /// Opens the lock file; the lock is released when the returned file is dropped.
    fn lock(&self) -> Result<File> {
        File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.lock_path)
            .map_err(|error| self.error("open the lock file of", &error))
    }

    fn load(&self) -> Result<Option<NodeState>> {
        match fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|error| self.error("parse", &error)),
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(None),
            Err(error) => Err(self.error("read", &error)),
        }
    }

    fn store(&self, state: &NodeState) -> Result<()> {
        let text =
            serde_json::to_vec_pretty(state).map_err(|error| self.error("serialize", &error))?;
        let temporary = with_suffix(&self.path, ".tmp");
        // Not flushed to disk, unlike the node binaries' state files (`node_runtime::state_file`): the rename already
        // keeps a crashed process from leaving half a file to the others, and only a power loss or kernel crash could
        // still leave a damaged one, after which real GPUs lose their state too. A flush per simulated NVML call
        // made the simulator's tests four times slower.
        fs::write(&temporary, text).map_err(|error| self.error("write", &error))?;
        fs::rename(&temporary, &self.path).map_err(|error| self.error("replace", &error))
    }

    fn error(&self, action: &str, error: &dyn std::fmt::Display) -> GpuError {
        GpuError::Other(format!(
            "simulator: cannot {action} the state file {}: {error}",
            self.path.display()
        ))
    }
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

//! Preparing and unpreparing claims, idempotent and restart-safe.
//!
//! The kubelet names a claim by namespace, name and UID; its allocation is read from the API. [`devices_of`] (pure)
//! turns the allocation results for this node's pool into [`PreparedDevice`]s; [`Claims`] then makes them real in
//! this order: MIG instances of placements served on demand, MPS daemon directories (and daemons, on real GPUs), the
//! claim's CDI spec, and last the checkpoint entry. A prepare that fails destroys the MIG instances it created. A
//! driver stopped anywhere before the checkpoint is written prepares the claim again from the start when the
//! kubelet retries (every step overwrites what an earlier try left, and the instances it left are destroyed when the
//! driver starts: [`Claims::reconcile_instances`]); one stopped after it answers from the checkpoint and never
//! prepares twice. Calls are serialized, as NVIDIA's driver does.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crd::dra::{
    ATTRIBUTE_DRIVER_VERSION, ATTRIBUTE_TYPE, CAPACITY_CORES, CAPACITY_MEMORY, DRIVER,
    MemoryEnforcement,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use node_runtime::mps::{self, Daemon};
use node_runtime::process::log_micros;
use node_runtime::state_file::{self, Lifetime, StateFileError};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::cdi::{self, PreparedDevice, ShareLimits};
use crate::dynamic_mig;
use crate::slices::DriverDevice;
use crd::quantity::parse_bytes as parse_quantity;
use node_runtime::backend::Gpus;

/// Reads a ResourceClaim: the API in the driver, a map in tests.
pub trait ClaimReader: Send + Sync {
    /// The claim `namespace/name`.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, String>> + Send;

    /// The claim with `uid` when it was read ahead and may be used without a read ([`crate::prefetch`]), once.
    fn read_ahead(&self, _uid: &str) -> Option<ResourceClaim> {
        None
    }
}

impl ClaimReader for kube::Client {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        kube::Api::<ResourceClaim>::namespaced(self.clone(), namespace)
            .get(name)
            .await
            .map_err(|error| error.to_string())
    }
}

/// Why a claim cannot be prepared. The message reaches the pod's events through the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The claim could not be read.
    #[error("cannot read ResourceClaim {claim}: {reason}")]
    Read {
        /// namespace/name.
        claim: String,
        /// The API's answer.
        reason: String,
    },
    /// The claim read has another UID: the one the kubelet means was deleted and replaced.
    #[error("ResourceClaim {claim} has UID {found}, not {wanted}: it was replaced")]
    Replaced {
        /// namespace/name.
        claim: String,
        /// The UID the kubelet sent.
        wanted: String,
        /// The UID read.
        found: String,
    },
    /// The claim has no allocation.
    #[error("ResourceClaim {claim} is not allocated")]
    NotAllocated {
        /// namespace/name.
        claim: String,
    },
    /// The allocation names a device this driver does not publish (any more).
    #[error(
        "ResourceClaim {claim} was allocated device {device} of pool {pool}, which this node's driver does not publish: \
         the node's GPUs or its nvidia.com/dra.gpus label changed after scheduling; delete the pod to schedule it again"
    )]
    UnknownDevice {
        /// namespace/name.
        claim: String,
        /// The pool.
        pool: String,
        /// The device.
        device: String,
    },
    /// A consumed capacity is not a quantity.
    #[error(
        "ResourceClaim {claim}: consumed {capacity} {value:?} of device {device} is not a quantity"
    )]
    Capacity {
        /// namespace/name.
        claim: String,
        /// The device.
        device: String,
        /// The capacity.
        capacity: &'static str,
        /// Its value.
        value: String,
    },
    /// The host side of the claim could not be set up.
    #[error("cannot prepare ResourceClaim {claim}: {reason}")]
    Host {
        /// namespace/name.
        claim: String,
        /// What failed.
        reason: String,
    },
}

/// The devices of `claim`'s allocation on this driver's `pool`, as the container must see them.
///
/// # Errors
/// When the claim is not allocated, names a device not published here, or its consumed capacity is unreadable.
pub fn devices_of(
    claim: &ResourceClaim,
    pool: &str,
    published: &[DriverDevice],
    host: &HostPaths,
    exists: &dyn Fn(&str) -> bool,
) -> Result<Vec<PreparedDevice>, PrepareError> {
    let name = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    let results = claim
        .status
        .as_ref()
        .and_then(|status| status.allocation.as_ref())
        .and_then(|allocation| allocation.devices.as_ref())
        .and_then(|devices| devices.results.as_ref())
        .ok_or_else(|| PrepareError::NotAllocated {
            claim: name.clone(),
        })?;
    let mut prepared: Vec<PreparedDevice> = Vec::new();
    for result in results
        .iter()
        .filter(|result| result.driver == DRIVER && result.pool == pool)
    {
        // The kubelet matches containers' requests by the request's base name, without a sub-request.
        let request = result
            .request
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        if let Some(existing) = prepared
            .iter_mut()
            .find(|device| device.device == result.device && device.share_id == result.share_id)
        {
            existing.requests.push(request);
            continue;
        }
        let device = published
            .iter()
            .find(|device| device.name == result.device)
            .ok_or_else(|| PrepareError::UnknownDevice {
                claim: name.clone(),
                pool: result.pool.clone(),
                device: result.device.clone(),
            })?;
        let consumed = |capacity: &'static str| -> Result<Option<u64>, PrepareError> {
            let Some(value) = result
                .consumed_capacity
                .as_ref()
                .and_then(|consumed| consumed.get(capacity))
            else {
                return Ok(None);
            };
            parse_quantity(&value.0)
                .map(Some)
                .map_err(|_| PrepareError::Capacity {
                    claim: name.clone(),
                    device: device.name.clone(),
                    capacity,
                    value: value.0.clone(),
                })
        };
        let limits = if device.shared {
            let memory = consumed(CAPACITY_MEMORY)?.map_or(device.memory_mib, |bytes| bytes >> 20);
            Some(ShareLimits {
                memory_mib: memory,
                cores: consumed(CAPACITY_CORES)?.unwrap_or(0),
                mps_dir: host.mps_dir(uid, &device.name),
                enforcement: memory_enforcement(device, host.memory_limit_hook.is_some()),
            })
        } else {
            None
        };
        prepared.push(PreparedDevice {
            requests: vec![request],
            pool: result.pool.clone(),
            device: device.name.clone(),
            share_id: result.share_id.clone(),
            uuid: device.uuid.clone(),
            device_nodes: host.device_nodes(device.gpu_index, exists),
            limits,
            on_demand: device.on_demand,
            mig_instance: None,
        });
    }
    Ok(prepared)
}

/// How a shared claim's memory is held on `device` ([`crd::dra::memory_enforcement`], from what it publishes),
/// with the toolkit's hook in use or not.
pub(crate) fn memory_enforcement(device: &DriverDevice, hook_available: bool) -> MemoryEnforcement {
    let attributes = device.device.attributes.as_ref();
    let attribute = |name: &str| attributes.and_then(|attributes| attributes.get(name));
    let device_type = attribute(ATTRIBUTE_TYPE)
        .and_then(|value| value.string.as_deref())
        .unwrap_or_default();
    let driver_version = attribute(ATTRIBUTE_DRIVER_VERSION)
        .and_then(|value| value.version.as_deref())
        .unwrap_or_default();
    crd::dra::memory_enforcement(device_type, driver_version, hook_available)
}

/// Where the driver's host side lives.
#[derive(Debug, Clone)]
pub struct HostPaths {
    /// The runtime's dynamic CDI directory (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// Where claims' MPS daemons keep their pipes, shared memory and logs.
    pub mps_root: PathBuf,
    /// The host's `/dev`, as the driver sees it.
    pub dev_root: PathBuf,
    /// The checkpoint file of prepared claims.
    pub checkpoint: PathBuf,
    /// The toolkit's CDI hook program on the host, where the host can take GPU memory limits per cgroup.
    pub memory_limit_hook: Option<PathBuf>,
}

impl HostPaths {
    /// The directory of a claim's MPS daemon for one device.
    #[must_use]
    pub fn mps_dir(&self, claim_uid: &str, device: &str) -> PathBuf {
        self.mps_root.join(claim_uid).join(device)
    }

    /// The device nodes a container of this GPU needs that exist on the host: the control nodes and the GPU's own.
    /// On simulated GPUs none exist, and the CDI spec has none.
    fn device_nodes(&self, gpu_index: u32, exists: &dyn Fn(&str) -> bool) -> Vec<String> {
        ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
            .into_iter()
            .map(str::to_owned)
            .chain([format!("nvidia{gpu_index}")])
            .filter(|name| exists(&self.dev_root.join(name).display().to_string()))
            .map(|name| format!("/dev/{name}"))
            .collect()
    }
}

/// One prepared claim, as checkpointed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// Its devices on this node.
    pub devices: Vec<PreparedDevice>,
}

/// The checkpoint: every prepared claim by UID, in the boot that prepared them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The boot the claims were prepared in ([`state_file::boot_id`]). None in a checkpoint of a driver before
    /// 0.1.1, which is taken as this boot's: the common case is the driver upgraded in place, whose claims' MPS
    /// daemons must come back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Prepared claims by UID.
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// The checkpoint's file name, in the driver's state directory.
pub const CHECKPOINT: &str = "checkpoint.json";

impl Checkpoint {
    /// Moves the checkpoint an earlier version kept at `legacy` (under the kubelet's plugins directory, on disk) to
    /// `path`, so that a driver upgraded in place keeps its prepared claims: called once at start, before
    /// [`load`](Self::load).
    ///
    /// # Errors
    /// When the legacy checkpoint cannot be read or removed, or `path` cannot be written.
    pub fn move_from(legacy: &Path, path: &Path) -> Result<(), StateFileError> {
        if legacy.exists() && !path.exists() {
            info!(from = %legacy.display(), to = %path.display(), "moving the checkpoint of an earlier version");
        }
        state_file::move_file(legacy, path, Lifetime::ThisBoot)
    }

    /// Reads the checkpoint; none yet is an empty one, and so is a corrupt one (moved aside with a warning). A
    /// checkpoint that is lost forgets the claims prepared before, and the driver still starts: each claim the kubelet
    /// has not seen prepared is prepared again from its allocation (every step overwrites what is there), and each
    /// it unprepares is unprepared by its UID alone, so its pods can be torn down.
    ///
    /// A checkpoint of an earlier boot than `boot_id` reads as empty: what it describes went with that boot (the
    /// CDI specs on the runtime's tmpfs, the MPS daemons, MIG instances), and answering the kubelet's prepare from
    /// it would hand containers CDI devices that no longer exist. The kubelet prepares its pods' claims again after
    /// the reboot, and they are prepared from their allocations.
    ///
    /// # Errors
    /// When the file exists but cannot be read, or is corrupt and cannot be moved aside.
    pub fn load(path: &Path, boot_id: &str) -> Result<Self, StateFileError> {
        let read: Self = state_file::read_json(path)?.unwrap_or_default();
        let this_boot = Self {
            boot_id: Some(boot_id.to_owned()),
            claims: BTreeMap::new(),
        };
        match &read.boot_id {
            Some(earlier) if earlier != boot_id => {
                if !read.claims.is_empty() {
                    info!(
                        checkpoint = %path.display(),
                        claims = read.claims.len(),
                        "the checkpoint is of an earlier boot; its claims are prepared again when the kubelet asks"
                    );
                }
                Ok(this_boot)
            }
            _ => Ok(Self {
                claims: read.claims,
                ..this_boot
            }),
        }
    }

    /// Written for this boot only, without flushes to disk: after a crash of the kernel the node reboots and the
    /// checkpoint is dropped anyway, so a flush would buy nothing.
    fn save(&self, path: &Path) -> Result<(), StateFileError> {
        state_file::write_json(path, self, Lifetime::ThisBoot)
    }
}

/// A claim the kubelet names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// The prepared claims of this node and the host side they own.
#[derive(Debug)]
pub struct Claims {
    pool: String,
    host: HostPaths,
    /// The GPUs, where MIG instances are made on demand.
    gpus: Gpus,
    /// False on simulated GPUs: no MPS daemon is started (it needs the driver).
    start_mps: bool,
    state: Mutex<Checkpoint>,
}

impl Claims {
    /// The claims of pool `pool`, from the checkpoint at `host.checkpoint` when it is of boot `boot_id`.
    ///
    /// # Errors
    /// When the checkpoint exists but cannot be read (see [`Checkpoint::load`]).
    pub fn open(
        pool: &str,
        host: HostPaths,
        gpus: Gpus,
        start_mps: bool,
        boot_id: &str,
    ) -> Result<Self, StateFileError> {
        let checkpoint = Checkpoint::load(&host.checkpoint, boot_id)?;
        Ok(Self {
            pool: pool.to_owned(),
            host,
            gpus,
            start_mps,
            state: Mutex::new(checkpoint),
        })
    }

    /// What is prepared now.
    pub async fn prepared(&self) -> Checkpoint {
        self.state.lock().await.clone()
    }

    /// Whether the claim `namespace/name` is prepared here.
    pub async fn holds(&self, namespace: &str, name: &str) -> bool {
        self.state
            .lock()
            .await
            .claims
            .values()
            .any(|claim| claim.namespace == namespace && claim.name == name)
    }

    /// The toolkit's memory-limit hook, where the driver holds shared claims' memory.
    #[must_use]
    pub fn memory_limit_hook(&self) -> Option<&Path> {
        self.host.memory_limit_hook.as_deref()
    }

    /// Whether MPS daemons are started for shared claims.
    #[must_use]
    pub fn starts_mps(&self) -> bool {
        self.start_mps
    }

    /// Prepares one claim: from the checkpoint when it is there, else from its allocation.
    ///
    /// The claim is read from the API without the lock, so that one slow answer of the API server delays only its
    /// own claim; the host side and the checkpoint are done under it.
    ///
    /// # Errors
    /// When the claim cannot be read or prepared; nothing is checkpointed then.
    pub async fn prepare(
        &self,
        reader: &impl ClaimReader,
        claim: &ClaimRef,
        published: &[DriverDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        if let Some(prepared) = self.state.lock().await.claims.get(&claim.uid) {
            return Ok(prepared.devices.clone());
        }
        let key = format!("{}/{}", claim.namespace, claim.name);
        let started = Instant::now();
        let ahead = reader.read_ahead(&claim.uid);
        let read_ahead = ahead.is_some();
        let read = match ahead {
            Some(read) => read,
            None => reader
                .get(&claim.namespace, &claim.name)
                .await
                .map_err(|reason| PrepareError::Read {
                    claim: key.clone(),
                    reason,
                })?,
        };
        let found = read.metadata.uid.clone().unwrap_or_default();
        if found != claim.uid {
            return Err(PrepareError::Replaced {
                claim: key,
                wanted: claim.uid.clone(),
                found,
            });
        }
        let exists = |path: &str| Path::new(path).exists();
        let mut devices = devices_of(&read, &self.pool, published, &self.host, &exists)?;
        let read_time = started.elapsed();
        let mut state = self.state.lock().await;
        let locked = Instant::now();
        // Prepared meanwhile by a call for another pod that shares the claim.
        if let Some(prepared) = state.claims.get(&claim.uid) {
            return Ok(prepared.devices.clone());
        }
        let host = |reason: String| PrepareError::Host {
            claim: key.clone(),
            reason,
        };
        let created = self
            .create_instances(&state, &mut devices)
            .await
            .map_err(host)?;
        let prepared = async {
            for (device, limits) in devices
                .iter()
                .filter_map(|device| Some((device, device.limits.as_ref()?)))
            {
                self.start_daemon(device, limits).await?;
            }
            let spec = cdi::spec(&claim.uid, &devices, self.host.memory_limit_hook.as_deref());
            cdi::write(&self.host.cdi_dir, &claim.uid, &spec)
                .map_err(|error| format!("writing its CDI spec: {error}"))?;
            state.claims.insert(
                claim.uid.clone(),
                PreparedClaim {
                    namespace: claim.namespace.clone(),
                    name: claim.name.clone(),
                    devices: devices.clone(),
                },
            );
            state.save(&self.host.checkpoint).map_err(|error| {
                state.claims.remove(&claim.uid);
                format!("writing the checkpoint: {error}")
            })
        }
        .await;
        if let Err(reason) = prepared {
            let _ = cdi::remove(&self.host.cdi_dir, &claim.uid);
            return Err(host(self.undo_instances(&created, reason).await));
        }
        info!(
            claim = %key,
            devices = devices.len(),
            read_ahead,
            read_us = log_micros(read_time),
            host_us = log_micros(locked.elapsed()),
            total_us = log_micros(started.elapsed()),
            "prepared"
        );
        Ok(devices)
    }

    /// Unprepares one claim: stops its daemons, removes its CDI spec and its checkpoint entry. A claim not
    /// prepared here (or unprepared before) is fine.
    ///
    /// # Errors
    /// When its CDI spec or the checkpoint cannot be written; the claim stays checkpointed then, to be retried.
    pub async fn unprepare(&self, claim_uid: &str) -> Result<(), String> {
        let mut state = self.state.lock().await;
        if let Some(prepared) = state.claims.get(claim_uid) {
            // The claim's containers are gone; an instance still in use (a process left in it) fails the
            // unprepare, which the kubelet retries, and the claim stays checkpointed so that its instance is
            // neither forgotten nor destroyed by the next start's reconcile while in use. A shared instance
            // another claim still holds stays.
            let others = instances_held(&state, Some(claim_uid));
            for instance in prepared
                .devices
                .iter()
                .filter_map(|device| device.mig_instance.clone())
                .filter(|instance| !others.contains(&(instance.gpu, instance.gpu_instance)))
            {
                self.destroy_instance(instance)
                    .await
                    .map_err(|error| format!("claim {claim_uid}: {error}"))?;
            }
            for limits in prepared
                .devices
                .iter()
                .filter_map(|device| device.limits.as_ref())
            {
                if self.start_mps
                    && let Err(error) = mps::stop(&limits.mps_dir.join("pipe")).await
                {
                    warn!(claim = claim_uid, %error, "cannot stop the claim's MPS daemon");
                }
                let _ = std::fs::remove_dir_all(&limits.mps_dir);
            }
        }
        cdi::remove(&self.host.cdi_dir, claim_uid)
            .map_err(|error| format!("removing the CDI spec of claim {claim_uid}: {error}"))?;
        // By UID, whether the checkpoint knows the claim or not: one prepared before a checkpoint was lost leaves
        // its directories behind otherwise.
        let _ = std::fs::remove_dir_all(self.host.mps_root.join(claim_uid));
        if state.claims.remove(claim_uid).is_some() {
            state
                .save(&self.host.checkpoint)
                .map_err(|error| format!("writing the checkpoint: {error}"))?;
            info!(claim = claim_uid, "unprepared");
        }
        Ok(())
    }

    /// Creates the MIG instances of the devices served on demand, in order, and returns them; a shared placement
    /// whose instance a prepared claim holds already gets that instance. When one fails, destroys those created
    /// before it and says why.
    async fn create_instances(
        &self,
        prepared: &Checkpoint,
        devices: &mut [PreparedDevice],
    ) -> Result<Vec<dynamic_mig::MigInstance>, String> {
        let mut created = Vec::new();
        for device in devices.iter_mut() {
            let Some(on_demand) = device.on_demand else {
                continue;
            };
            if device.limits.is_some()
                && let Some(existing) = prepared
                    .claims
                    .values()
                    .flat_map(|claim| &claim.devices)
                    .find(|held| held.device == device.device && held.mig_instance.is_some())
            {
                device.uuid = existing.uuid.clone();
                device.mig_instance = existing.mig_instance.clone();
                continue;
            }
            let gpus = self.gpus.clone();
            let made = tokio::task::spawn_blocking(move || {
                dynamic_mig::create(gpus.backend(), &on_demand)
            })
            .await
            .map_err(|error| error.to_string())
            .and_then(|made| made);
            match made {
                Ok((instance, uuid)) => {
                    info!(device = %device.device, gpu_instance = instance.gpu_instance, %uuid, "MIG instance created");
                    device.uuid = uuid;
                    device.mig_instance = Some(instance.clone());
                    created.push(instance);
                }
                Err(reason) => {
                    return Err(self.undo_instances(&created, reason).await);
                }
            }
        }
        Ok(created)
    }

    /// Destroys the instances a failed prepare created; returns its reason with what could not be undone.
    async fn undo_instances(&self, created: &[dynamic_mig::MigInstance], reason: String) -> String {
        let mut reason = reason;
        for instance in created.iter().cloned() {
            if let Err(error) = self.destroy_instance(instance).await {
                reason.push_str(&format!("; and undoing it failed: {error}"));
            }
        }
        reason
    }

    async fn destroy_instance(&self, instance: dynamic_mig::MigInstance) -> Result<(), String> {
        let gpus = self.gpus.clone();
        tokio::task::spawn_blocking(move || {
            dynamic_mig::destroy(gpus.backend(), instance.gpu, instance.gpu_instance)
        })
        .await
        .map_err(|error| error.to_string())?
    }

    /// Destroys the MIG instances on the GPUs served on demand that no prepared claim holds: called once when the
    /// driver starts, before the kubelet can prepare anything. Returns what it could not destroy.
    pub async fn reconcile_instances(&self, on_demand_gpus: Vec<u32>) -> Vec<String> {
        let held = instances_held(&*self.state.lock().await, None);
        let gpus = self.gpus.clone();
        tokio::task::spawn_blocking(move || {
            dynamic_mig::reconcile(gpus.backend(), &on_demand_gpus, &held).1
        })
        .await
        .unwrap_or_else(|error| vec![error.to_string()])
    }

    /// Starts again the MPS daemons of the claims prepared before this driver started: a daemon runs in the
    /// driver's container and ends with it, while the claims' containers keep running. A daemon that cannot be
    /// started is logged; the memory watchdog still bounds the claim.
    pub async fn restore_daemons(&self) {
        let state = self.state.lock().await;
        for (uid, claim) in &state.claims {
            for device in &claim.devices {
                if let Some(limits) = &device.limits
                    && let Err(error) = self.start_daemon(device, limits).await
                {
                    warn!(claim = %uid, device = %device.device, %error, "cannot restart the claim's MPS daemon");
                }
            }
        }
    }

    /// Makes the claim's MPS directories (the container's mounts need them) and, on real GPUs, starts its control
    /// daemon with the claim's limits as the daemon's defaults. A daemon left by an earlier, interrupted try is
    /// stopped first.
    async fn start_daemon(
        &self,
        device: &PreparedDevice,
        limits: &ShareLimits,
    ) -> Result<(), String> {
        let pipe = limits.mps_dir.join("pipe");
        for dir in [&pipe, &limits.mps_dir.join("shm")] {
            std::fs::create_dir_all(dir)
                .map_err(|error| format!("creating {}: {error}", dir.display()))?;
        }
        if !self.start_mps {
            return Ok(());
        }
        if pipe.join("nvidia-cuda-mps-control.pid").exists() {
            let _ = mps::stop(&pipe).await;
        }
        let daemon = Daemon {
            uuids: vec![device.uuid.clone()],
            thread_percentage: limits.thread_percentage(),
            // Where the driver holds the container's cgroup to its memory, MPS shares only the SMs.
            memory_limits_mib: match limits.enforcement {
                MemoryEnforcement::MpsPinned => vec![limits.memory_mib],
                MemoryEnforcement::Driver => Vec::new(),
            },
        };
        mps::start(&pipe, &limits.mps_dir.join("log"), &daemon)
            .await
            .map_err(|error| error.to_string())
    }
}

/// The MIG instances (GPU, GPU instance) the prepared claims hold, but claim `except`.
fn instances_held(prepared: &Checkpoint, except: Option<&str>) -> BTreeSet<(u32, u32)> {
    prepared
        .claims
        .iter()
        .filter(|(uid, _)| Some(uid.as_str()) != except)
        .flat_map(|(_, claim)| &claim.devices)
        .filter_map(|device| device.mig_instance.as_ref())
        .map(|instance| (instance.gpu, instance.gpu_instance))
        .collect()
}

#[cfg(test)]
#[path = "claims_tests.rs"]
mod tests;

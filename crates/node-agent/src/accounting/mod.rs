//! Per-process accounting: which pod and container each GPU process belongs to, and how much GPU memory it uses.
//! The exporter's per-pod series and the watchdog's budgets both start here.
//!
//! The driver lists each GPU's processes (host pids, memory used, the MIG device with MIG on); the process's
//! cgroup names its pod's UID and its container's ID ([`cgroup`]); the node's pods, watched from the API server,
//! name the pod and container ([`pods`]). A process that names no pod (a host service), or a pod this node does
//! not know (yet), stays unattributed: reported, never acted on.

pub mod cgroup;
pub mod pods;

use std::path::Path;

use gpu::{GpuBackend, HostProcess};

use self::cgroup::CgroupOwner;
use self::pods::PodIndex;

/// Bytes in a MiB, the unit NVML reports memory in.
pub const MIB: u64 = 1024 * 1024;

/// One GPU as the accounting needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountedGpu {
    /// NVML index, the `gpu` label.
    pub index: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Product name, the `modelName` label.
    pub model_name: String,
    /// Its memory in bytes.
    pub memory_bytes: u64,
    /// Whether MIG is on (MIG isolates memory itself: no budget applies).
    pub mig: bool,
}

/// One process using one GPU (or one of its MIG devices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUse {
    /// The GPU's index in [`Accounting::gpus`].
    pub gpu: u32,
    /// The MIG device it runs in: GPU-instance id, compute-instance id and the device's UUID.
    pub mig_device: Option<MigPlace>,
    /// The process: pid with its start time (`None` when it exited between the driver's answer and `/proc`).
    pub process: Option<HostProcess>,
    /// Its pid as the driver reported it.
    pub pid: u32,
    /// GPU memory it uses in bytes; `None` where the driver does not report it.
    pub used_bytes: Option<u64>,
    /// Whom its cgroup names.
    pub cgroup_owner: Option<CgroupOwner>,
}

/// Where on a MIG GPU a process runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MigPlace {
    /// GPU-instance id.
    pub gpu_instance: u32,
    /// Compute-instance id.
    pub compute_instance: u32,
    /// The MIG device's UUID (empty when the driver did not list the device).
    pub uuid: String,
}

/// What one pass read: the GPUs and every process on them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accounting {
    /// The node's GPUs.
    pub gpus: Vec<AccountedGpu>,
    /// Their processes.
    pub processes: Vec<ProcessUse>,
}

/// Reads every GPU's processes and, under `proc_root` (the host's procfs), their cgroups and start times.
/// Blocking: NVML calls and file reads.
///
/// # Errors
/// When the GPUs cannot be listed or a GPU's processes cannot be read.
pub fn read(backend: &dyn GpuBackend, proc_root: &Path) -> gpu::Result<Accounting> {
    let mut accounting = Accounting::default();
    for inventory in backend.gpus()? {
        let mig = inventory.mig_mode.is_some_and(|mode| mode.current);
        let devices = if mig {
            backend.mig_devices(inventory.index)?
        } else {
            Vec::new()
        };
        for process in backend.processes(inventory.index)? {
            let mig_device = process
                .gpu_instance_id
                .zip(process.compute_instance_id)
                .map(|(gpu_instance, compute_instance)| MigPlace {
                    gpu_instance,
                    compute_instance,
                    uuid: devices
                        .iter()
                        .find(|device| {
                            device.gpu_instance_id == gpu_instance
                                && device.compute_instance_id == compute_instance
                        })
                        .map(|device| device.uuid.clone())
                        .unwrap_or_default(),
                });
            let cgroup_file =
                std::fs::read_to_string(proc_root.join(process.pid.to_string()).join("cgroup"));
            accounting.processes.push(ProcessUse {
                gpu: inventory.index,
                mig_device,
                process: HostProcess::find(proc_root, process.pid),
                pid: process.pid,
                used_bytes: process.used_memory_mib.map(|mib| mib * MIB),
                cgroup_owner: cgroup_file.ok().and_then(|text| cgroup::owner(&text)),
            });
        }
        accounting.gpus.push(AccountedGpu {
            index: inventory.index,
            uuid: inventory.uuid,
            model_name: inventory.product_name,
            memory_bytes: inventory.memory_mib * MIB,
            mig,
        });
    }
    Ok(accounting)
}

/// The container a process belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerRef {
    /// Its pod's UID.
    pub pod_uid: String,
    /// Its pod's namespace.
    pub namespace: String,
    /// Its pod.
    pub pod: String,
    /// Its container's name; empty for a process in the pod but in no container this node reports.
    pub container: String,
}

/// Whom a process is accounted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A container of a pod of this node.
    Container(ContainerRef),
    /// No pod: a host process, or a pod in a cgroup layout not recognised.
    OutsidePods,
    /// A pod UID this node's pods do not (yet) include.
    UnknownPod(String),
}

impl Accounting {
    /// Whom each process belongs to, in the order of [`Accounting::processes`].
    #[must_use]
    pub fn owners(&self, pods: &PodIndex) -> Vec<Owner> {
        self.processes
            .iter()
            .map(|process| {
                let Some(cgroup) = &process.cgroup_owner else {
                    return Owner::OutsidePods;
                };
                let pod = match (&cgroup.pod_uid, &cgroup.container_id) {
                    (Some(uid), _) => pods.get(uid).ok_or_else(|| Owner::UnknownPod(uid.clone())),
                    // Only a container ID: a container of no pod of this node is outside pods.
                    (None, Some(id)) => pods.with_container(id).ok_or(Owner::OutsidePods),
                    (None, None) => Err(Owner::OutsidePods),
                };
                let pod = match pod {
                    Ok(pod) => pod,
                    Err(owner) => return owner,
                };
                let container = cgroup
                    .container_id
                    .as_ref()
                    .and_then(|id| pod.containers.get(id))
                    .cloned()
                    .unwrap_or_default();
                Owner::Container(ContainerRef {
                    pod_uid: pod.uid.clone(),
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container,
                })
            })
            .collect()
    }

    /// The GPU of a process.
    #[must_use]
    pub fn gpu(&self, process: &ProcessUse) -> Option<&AccountedGpu> {
        self.gpus.iter().find(|gpu| gpu.index == process.gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::pods::running_pod;
    use super::*;

    fn process(pid: u32, cgroup: &str) -> ProcessUse {
        ProcessUse {
            gpu: 0,
            mig_device: None,
            process: None,
            pid,
            used_bytes: Some(MIB),
            cgroup_owner: cgroup::owner(cgroup),
        }
    }

    #[test]
    fn owners_by_pod_uid_or_by_container_id_alone() {
        let uid = "00000000-0000-4000-8000-000000000007";
        let id = format!("{:064x}", 7);
        let other = format!("{:064x}", 8);
        let pods = PodIndex::new([&running_pod("ml", "trainer", uid, &id)]);
        let accounting = Accounting {
            gpus: Vec::new(),
            processes: vec![
                process(1, &format!("0::/kubepods/burstable/pod{uid}/{id}\n")),
                process(2, &format!("4:memory:/k8s.io/{id}\n")),
                process(3, &format!("4:memory:/k8s.io/{other}\n")),
                process(
                    4,
                    "0::/kubepods/burstable/pod00000000-0000-4000-8000-000000000009\n",
                ),
                process(5, "0::/system.slice/sshd.service\n"),
            ],
        };
        let trainer = Owner::Container(ContainerRef {
            pod_uid: uid.to_owned(),
            namespace: "ml".to_owned(),
            pod: "trainer".to_owned(),
            container: "main".to_owned(),
        });
        assert_eq!(
            accounting.owners(&pods),
            vec![
                trainer.clone(),
                trainer,
                Owner::OutsidePods,
                Owner::UnknownPod("00000000-0000-4000-8000-000000000009".to_owned()),
                Owner::OutsidePods,
            ]
        );
    }
}

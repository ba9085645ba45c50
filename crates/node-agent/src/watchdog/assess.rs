//! One pass's judgement, pure: who holds what on which GPU (from the kubelet), whose processes use how much
//! (from the accounting), and so each pod's budget and use on each GPU it shares.

use std::collections::{BTreeMap, BTreeSet};

use crd::config::device_plugin::{device_uuid, is_replica};
use crd::labels::GPU_MEMORY_LIMIT_ANNOTATION;

use super::budget::{AnnotationError, Budget, DefaultBudget, Holding, budget, parse_quantity};
use super::decide::{PodProcess, PodUse};
use crate::accounting::pods::PodIndex;
use crate::accounting::{Accounting, ContainerRef, Owner};
use crate::pod_resources::PodDevices;

/// A pod, by namespace and name (what the kubelet's pod-resources API names).
pub type PodName = (String, String);

/// What each pod holds on each GPU (by GPU UUID).
pub type Holdings = BTreeMap<PodName, BTreeMap<String, Holding>>;

/// Memory a pod's DRA claims consumed on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimShare {
    /// The pod.
    pub pod: PodName,
    /// The GPU's UUID.
    pub gpu_uuid: String,
    /// Bytes consumed.
    pub bytes: u64,
}

/// What each pod holds, from the kubelet's answers: its device IDs, and every device the node advertises (which
/// says how many replicas each GPU has); and the memory its DRA claims consumed.
#[must_use]
pub fn holdings(
    pods: &[PodDevices],
    advertised: &BTreeMap<String, BTreeSet<String>>,
    claims: &[ClaimShare],
) -> Holdings {
    let mut replicas_advertised: BTreeMap<&str, u32> = BTreeMap::new();
    for id in advertised.values().flatten().filter(|id| is_replica(id)) {
        *replicas_advertised.entry(device_uuid(id)).or_default() += 1;
    }
    let mut holdings = Holdings::new();
    for pod in pods {
        let (namespace, name) = pod.namespace_and_name();
        let held = holdings
            .entry((namespace.to_owned(), name.to_owned()))
            .or_default();
        for (_, id) in pod.devices() {
            let uuid = device_uuid(id);
            let holding = held.entry(uuid.to_owned()).or_default();
            if is_replica(id) {
                holding.replicas += 1;
                holding.replicas_advertised = replicas_advertised.get(uuid).copied().unwrap_or(0);
            } else {
                holding.exclusive = true;
            }
        }
    }
    for claim in claims {
        let holding = holdings
            .entry(claim.pod.clone())
            .or_default()
            .entry(claim.gpu_uuid.clone())
            .or_default();
        *holding.claimed_bytes.get_or_insert(0) += claim.bytes;
    }
    holdings
}

/// A pod's use of one GPU, for the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodGpu {
    /// The pod (container empty).
    pub pod: ContainerRef,
    /// The GPU's index.
    pub gpu: u32,
    /// The GPU's UUID.
    pub gpu_uuid: String,
    /// What its processes use there.
    pub used_bytes: u64,
    /// Its budget there, if it has one.
    pub budget: Option<Budget>,
}

/// A GPU process the watchdog does not act on because it cannot say whose it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Unattributed {
    /// The GPU's index.
    pub gpu: u32,
    /// The process.
    pub pid: u32,
    /// Why: outside any pod, or a pod this node does not know.
    pub why: String,
}

/// One pass's judgement.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assessment {
    /// Every pod's use of every GPU it has a budget on (what the decider judges).
    pub judged: Vec<PodUse>,
    /// Every pod's use and budget on every GPU it uses or shares (what the metrics show).
    pub pods: Vec<PodGpu>,
    /// Processes nobody is accountable for.
    pub unattributed: Vec<Unattributed>,
    /// Pods whose annotation is not a memory size, each once.
    pub bad_annotations: Vec<(ContainerRef, AnnotationError)>,
}

/// Judges one pass.
#[must_use]
pub fn assess(
    accounting: &Accounting,
    owners: &[Owner],
    holdings: &Holdings,
    pods: &PodIndex,
    rule: DefaultBudget,
) -> Assessment {
    let mut assessment = Assessment::default();
    // (pod UID, GPU index) → the pod and its processes there.
    let mut by_pod: BTreeMap<(String, u32), (ContainerRef, Vec<PodProcess>)> = BTreeMap::new();
    for (process, owner) in accounting.processes.iter().zip(owners) {
        let container = match owner {
            Owner::Container(container) => container,
            Owner::OutsidePods => {
                assessment.unattributed.push(Unattributed {
                    gpu: process.gpu,
                    pid: process.pid,
                    why: "its cgroup names no pod".to_owned(),
                });
                continue;
            }
            Owner::UnknownPod(uid) => {
                assessment.unattributed.push(Unattributed {
                    gpu: process.gpu,
                    pid: process.pid,
                    why: format!("its pod {uid} is not among this node's pods"),
                });
                continue;
            }
        };
        // Exited since the driver listed it: nothing to judge.
        let Some(host) = process.process else {
            continue;
        };
        let pod = ContainerRef {
            container: String::new(),
            ..container.clone()
        };
        by_pod
            .entry((pod.pod_uid.clone(), process.gpu))
            .or_insert_with(|| (pod, Vec::new()))
            .1
            .push(PodProcess {
                process: host,
                container: container.container.clone(),
                used_bytes: process.used_bytes.unwrap_or(0),
            });
    }
    // Pods that share a GPU without using it yet still show their budget.
    for ((namespace, name), held) in holdings {
        let Some(entry) = pods.named(namespace, name) else {
            continue;
        };
        for gpu in &accounting.gpus {
            if held.get(&gpu.uuid).is_some_and(Holding::shared) {
                by_pod
                    .entry((entry.uid.clone(), gpu.index))
                    .or_insert_with(|| {
                        (
                            ContainerRef {
                                pod_uid: entry.uid.clone(),
                                namespace: entry.namespace.clone(),
                                pod: entry.name.clone(),
                                container: String::new(),
                            },
                            Vec::new(),
                        )
                    });
            }
        }
    }
    let mut told_annotation = BTreeSet::new();
    for ((uid, gpu_index), (pod, processes)) in by_pod {
        let Some(gpu) = accounting.gpus.iter().find(|gpu| gpu.index == gpu_index) else {
            continue;
        };
        let annotation = pods
            .get(&uid)
            .and_then(|entry| entry.annotations.get(GPU_MEMORY_LIMIT_ANNOTATION))
            .and_then(|value| match parse_quantity(value) {
                Ok(bytes) => Some(bytes),
                Err(error) => {
                    if told_annotation.insert(uid.clone()) {
                        assessment.bad_annotations.push((pod.clone(), error));
                    }
                    None
                }
            });
        let holding = holdings
            .get(&(pod.namespace.clone(), pod.pod.clone()))
            .and_then(|held| held.get(&gpu.uuid))
            .copied()
            .unwrap_or_default();
        let budget = (!gpu.mig)
            .then(|| budget(gpu.memory_bytes, holding, annotation, rule))
            .flatten();
        assessment.pods.push(PodGpu {
            pod: pod.clone(),
            gpu: gpu.index,
            gpu_uuid: gpu.uuid.clone(),
            used_bytes: processes.iter().map(|process| process.used_bytes).sum(),
            budget: budget.clone(),
        });
        if let Some(budget) = budget {
            assessment.judged.push(PodUse {
                pod,
                gpu: gpu.index,
                gpu_uuid: gpu.uuid.clone(),
                budget,
                processes,
            });
        }
    }
    assessment
}

//! The pods whose processes use this node's GPUs, published in the node's GPUNode status (`status.gpuProcessPods`)
//! whenever that set changes: the same accounting as the per-pod series (the driver's process list, each process's
//! cgroup naming its pod), told to the API server so that the operator's driver upgrade finds every GPU user,
//! DaemonSet pods and pods that requested no GPU included. A process whose pod this node does not know yet is left
//! out until the pod watch has it; a host process never names a pod.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crd::driver_upgrade::GpuProcessPod;
use crd::gpu_node::field_manager::EXPORTER;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use node_runtime::Backoff;
use node_runtime::backend::Gpus;
use node_runtime::gpunode::{GpuNodeWriter, inventory_status};
use node_runtime::inventory;
use tracing::{info, warn};

use super::collect::ProcessAccounting;
use crate::accounting::{self, Accounting, Owner, pods};

/// The pods (sorted, each with the GPUs its processes use) that `owners` attribute `accounting`'s processes to.
#[must_use]
pub fn process_pods(accounting: &Accounting, owners: &[Owner]) -> Vec<GpuProcessPod> {
    let mut pods: BTreeMap<(String, String, String), BTreeSet<u32>> = BTreeMap::new();
    for (process, owner) in accounting.processes.iter().zip(owners) {
        if let Owner::Container(container) = owner {
            pods.entry((
                container.namespace.clone(),
                container.pod.clone(),
                container.pod_uid.clone(),
            ))
            .or_default()
            .insert(process.gpu);
        }
    }
    pods.into_iter()
        .map(|((namespace, name, uid), gpus)| GpuProcessPod {
            namespace,
            name,
            uid,
            gpus: gpus.into_iter().collect(),
        })
        .collect()
}

/// Publishes the node's process pods every `interval`, written only when they change. Runs until the process
/// stops; a failed read or write is logged and tried again at the next interval.
pub async fn publish(
    client: Client,
    node_name: String,
    gpus: Gpus,
    setup: ProcessAccounting,
    interval: Duration,
) {
    let mut writer = writer(client, &node_name).await;
    let mut failing = false;
    loop {
        let proc_root = setup.proc_root.clone();
        let read = gpus
            .run(move |gpus| {
                let views = inventory::read(gpus.backend())?;
                let accounting = accounting::read(gpus.backend(), &proc_root)?;
                Ok::<_, gpu::GpuError>((views, accounting))
            })
            .await;
        let outcome = match read {
            Ok((views, accounting)) => {
                let owners = accounting.owners(&pods::index(&setup.pods));
                let status = crd::GpuNodeStatus {
                    gpu_process_pods: process_pods(&accounting, &owners),
                    ..inventory_status(&views)
                };
                writer
                    .publish(status)
                    .await
                    .map(|_| ())
                    .map_err(|error| error.to_string())
            }
            Err(error) => Err(format!("reading the GPUs' processes: {error}")),
        };
        match outcome {
            Ok(()) if failing => {
                info!("the GPU process pods are published again");
                failing = false;
            }
            Err(error) if !failing => {
                warn!(%error, "publishing the pods that use the GPUs failed; retrying");
                failing = true;
            }
            _ => {}
        }
        tokio::time::sleep(interval).await;
    }
}

/// The GPUNode writer, once the Node can be read and the GPUNode exists.
async fn writer(client: Client, node_name: &str) -> GpuNodeWriter {
    let mut backoff = Backoff::default();
    loop {
        let mut writer = GpuNodeWriter::new(client.clone(), node_name, EXPORTER);
        let ready = match Api::<Node>::all(client.clone()).get(node_name).await {
            Ok(node) => writer.ensure(&node).await.map_err(|e| e.to_string()),
            Err(error) => Err(format!("reading Node {node_name}: {error}")),
        };
        match ready {
            Ok(()) => return writer,
            Err(error) => {
                warn!(%error, "cannot publish the GPU process pods yet; retrying");
                backoff.wait().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::{ContainerRef, ProcessUse};

    fn process(gpu: u32, pid: u32) -> ProcessUse {
        ProcessUse {
            gpu,
            mig_device: None,
            process: None,
            pid,
            used_bytes: None,
            cgroup_owner: None,
        }
    }

    fn container(pod: &str, uid: &str) -> Owner {
        Owner::Container(ContainerRef {
            pod_uid: uid.into(),
            namespace: "ml".into(),
            pod: pod.into(),
            container: "main".into(),
        })
    }

    #[test]
    fn each_pod_is_listed_once_with_every_gpu_its_processes_use() {
        let accounting = Accounting {
            gpus: Vec::new(),
            processes: vec![
                process(2, 10),
                process(0, 11),
                process(2, 12),
                process(1, 13),
                process(3, 14),
            ],
        };
        let owners = [
            container("train", "u-train"),
            container("train", "u-train"),
            container("probe", "u-probe"),
            Owner::OutsidePods,
            Owner::UnknownPod("u-new".into()),
        ];
        assert_eq!(
            process_pods(&accounting, &owners),
            [
                GpuProcessPod {
                    namespace: "ml".into(),
                    name: "probe".into(),
                    uid: "u-probe".into(),
                    gpus: vec![2],
                },
                GpuProcessPod {
                    namespace: "ml".into(),
                    name: "train".into(),
                    uid: "u-train".into(),
                    gpus: vec![0, 2],
                },
            ],
            "host processes and pods not known yet are left out"
        );
    }
}

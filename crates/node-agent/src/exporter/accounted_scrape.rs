//! For tests: a scrape of the exporter, with per-process accounting, over a simulated node whose GPU 0 runs the
//! given processes, each in a pod of namespace `ml` (one container `main`) or in no pod.

use std::sync::Arc;
use std::time::Duration;

use gpu::{GpuBackend, GpuProcess};
use kube::runtime::{reflector, watcher};
use node_runtime::backend::Gpus;
use node_runtime::testing::simulated;

use super::collect::{Collector, ProcessAccounting};
use super::config::Selection;
use super::families::encode;
use crate::accounting::pods::running_pod;

/// A process on GPU 0 (in its first MIG device when MIG is on): pid, MiB, and its pod's name, if any.
pub(crate) type TestProcess = (u32, u64, Option<&'static str>);

/// The scrape of a node of `spec` (with MIG `devices` on every GPU) running `processes`, and GPU 0's UUID.
pub(crate) async fn scrape(
    spec: &str,
    devices: &[(&str, u32)],
    processes: &[TestProcess],
) -> (String, String) {
    let (_dir, simulator) = simulated(spec, devices);
    let place = simulator
        .mig_devices(0)
        .unwrap()
        .first()
        .map(|device| (device.gpu_instance_id, device.compute_instance_id));
    let proc_root = tempfile::tempdir().unwrap();
    let (store, mut writer) = reflector::store();
    for (index, &(pid, mib, pod)) in processes.iter().enumerate() {
        simulator
            .start_process(
                0,
                GpuProcess {
                    pid,
                    used_memory_mib: Some(mib),
                    gpu_instance_id: place.map(|(gi, _)| gi),
                    compute_instance_id: place.map(|(_, ci)| ci),
                },
            )
            .unwrap();
        let cgroup = match pod {
            Some(name) => {
                let uid = format!("00000000-0000-4000-8000-{index:012}");
                let container_id = format!("{index:064x}");
                writer.apply_watcher_event(&watcher::Event::Apply(running_pod(
                    "ml",
                    name,
                    &uid,
                    &container_id,
                )));
                format!("0::/kubepods/besteffort/pod{uid}/{container_id}\n")
            }
            None => "0::/system.slice/inference.service\n".to_owned(),
        };
        let folder = proc_root.path().join(pid.to_string());
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("cgroup"), cgroup).unwrap();
    }
    let kubelet = tempfile::tempdir().unwrap();
    let mut collector = Collector::new(
        Gpus::from_simulator(simulator.clone()),
        "node-1",
        kubelet.path().to_owned(),
        Duration::from_secs(300),
    )
    .with_accounting(ProcessAccounting {
        proc_root: proc_root.path().to_owned(),
        pods: store,
    });
    let text = encode(Arc::new(collector.collect(&Selection::default()).await));
    (text, simulator.gpu(0).unwrap().uuid)
}

//! Device health: the GPUs' critical XIDs, judged as the device plugin judges them ([`node_runtime::health`]),
//! reach the kubelet through the `v1.DRAResourceHealth` stream (it shows them in the status of the pods that use
//! the device, `allocatedResourcesStatus`) and the scheduler through a `NoSchedule` taint on the GPU's devices in
//! the slice: no new claim lands there, and the pods that run there stay, as with the device plugin.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::stream::{self, BoxStream};
use k8s_openapi::api::resource::v1::DeviceTaint;
use node_runtime::backend::Gpus;
use node_runtime::health::{Faults, HealthTracker};
use tokio::sync::{Notify, watch};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::health_api::dra_resource_health_server::DraResourceHealth;
use crate::health_api::{
    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest,
    NodeWatchResourcesResponse,
};
use crate::slices::DriverDevice;

/// The key of the taint on the devices of a GPU with a recent critical XID; its value is the XID.
pub const TAINT_KEY: &str = "gpu.nvidia.com/xid";
/// The taint's value when the driver reported a critical error without an XID.
const UNKNOWN_XID: &str = "unknown";
/// How long the kubelet trusts a report: without a newer one it reads the devices as Unknown.
const TIMEOUT_SECONDS: i64 = 60;
/// How often the stream repeats the list when nothing changes, well within [`TIMEOUT_SECONDS`].
const RESEND: Duration = Duration::from_secs(20);
/// How often the GPUs' XID queue is read.
const POLL: Duration = Duration::from_secs(1);

/// The taint a device of a GPU whose last critical event was `xid` carries.
#[must_use]
pub fn taint(xid: Option<u64>) -> DeviceTaint {
    DeviceTaint {
        key: TAINT_KEY.to_owned(),
        value: Some(xid.map_or_else(|| UNKNOWN_XID.to_owned(), |xid| xid.to_string())),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    }
}

/// Taints the devices of the Unhealthy GPUs (MIG devices with their GPU) and clears the others'.
pub fn taint_unhealthy(devices: &mut [DriverDevice], faults: &Faults) {
    for device in devices {
        device.device.taints = faults.get(&device.gpu_index).map(|xid| vec![taint(*xid)]);
    }
}

/// Why a device is Unhealthy, from its taint; `None` for a healthy one.
#[must_use]
pub fn unhealthy_reason(device: &DriverDevice) -> Option<String> {
    let taint = device
        .device
        .taints
        .iter()
        .flatten()
        .find(|taint| taint.key == TAINT_KEY)?;
    Some(match taint.value.as_deref() {
        Some(UNKNOWN_XID) | None => format!(
            "GPU {} reported a critical error without an XID",
            device.gpu_index
        ),
        Some(xid) => format!("GPU {} reported critical XID {xid}", device.gpu_index),
    })
}

/// The health of every device of the pool, as the kubelet wants it: the complete list each time.
#[must_use]
pub fn report(devices: &[DriverDevice], pool: &str, now_unix: i64) -> NodeWatchResourcesResponse {
    NodeWatchResourcesResponse {
        devices: devices
            .iter()
            .map(|device| {
                let reason = unhealthy_reason(device);
                DeviceHealth {
                    device: Some(DeviceIdentifier {
                        pool_name: pool.to_owned(),
                        device_name: device.name.clone(),
                    }),
                    health: if reason.is_some() {
                        HealthStatus::Unhealthy
                    } else {
                        HealthStatus::Healthy
                    }
                    .into(),
                    last_updated_time: now_unix,
                    health_check_timeout_seconds: TIMEOUT_SECONDS,
                    message: reason.unwrap_or_default(),
                }
            })
            .collect(),
    }
}

/// Reads the GPUs' XIDs for ever, keeps `faults` current and wakes `changed` (the publisher) on each change.
pub async fn monitor(
    gpus: Gpus,
    mut tracker: HealthTracker,
    faults: watch::Sender<Faults>,
    changed: Arc<Notify>,
) {
    let mut tick = tokio::time::interval(POLL);
    loop {
        tick.tick().await;
        let now = std::time::Instant::now();
        for event in gpus.health_events().await {
            if tracker.record(&event, now) {
                warn!(gpu = event.gpu_index, xid = ?event.xid, "critical XID: the GPU's devices are Unhealthy");
            }
        }
        let current = tracker.faults(now);
        let modified = faults.send_if_modified(|published| {
            let modified = *published != current;
            if modified {
                published.clone_from(&current);
            }
            modified
        });
        if modified {
            info!(unhealthy = ?current.keys().collect::<Vec<_>>(), "GPU health changed");
            changed.notify_one();
        }
    }
}

/// The `v1.DRAResourceHealth` service: one stream per kubelet connection, sent on each change of the devices
/// (whose taints say their health) and every [`RESEND`] so that the kubelet's view never times out.
#[derive(Debug)]
pub struct HealthService {
    /// The pool: the node's name.
    pub pool: String,
    /// The devices published now, tainted where their GPU is Unhealthy.
    pub devices: watch::Receiver<Vec<DriverDevice>>,
}

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = BoxStream<'static, Result<NodeWatchResourcesResponse, Status>>;

    async fn node_watch_resources(
        &self,
        _: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        info!("the kubelet watches the devices' health");
        let first = (self.pool.clone(), self.devices.clone(), true);
        let reports = stream::unfold(first, |(pool, mut devices, first)| async move {
            if !first {
                tokio::select! {
                    changed = devices.changed() => changed.ok()?,
                    () = tokio::time::sleep(RESEND) => {}
                }
            }
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |since| {
                    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
                });
            let sent = report(&devices.borrow_and_update(), &pool, now);
            Some((Ok(sent), (pool, devices, false)))
        });
        Ok(Response::new(Box::pin(reports)))
    }
}

#[cfg(test)]
mod tests {
    use crd::dra::{GpuSet, Partition};
    use node_runtime::testing::simulated;

    use super::*;
    use crate::slices;

    fn devices(spec: &str, mig: &[(&str, u32)]) -> Vec<DriverDevice> {
        let (_dir, simulator) = simulated(spec, mig);
        let partition = Partition {
            dra: GpuSet::All,
            shared: GpuSet::All,
            dynamic_mig: GpuSet::None,
        };
        slices::devices(
            &node_runtime::inventory::read(simulator.as_ref()).unwrap(),
            &partition,
            &[],
        )
    }

    #[test]
    fn devices_of_an_unhealthy_gpu_are_tainted_and_reported_unhealthy_with_the_xid() {
        let mut devices = devices("a100-40gb:3", &[]);
        taint_unhealthy(&mut devices, &Faults::from([(1, Some(79))]));
        let reported = report(&devices, "node-a", 1_700_000_000);
        for (device, health) in devices.iter().zip(&reported.devices) {
            let id = health.device.as_ref().unwrap();
            assert_eq!(
                (id.pool_name.as_str(), &id.device_name),
                ("node-a", &device.name)
            );
            assert_eq!(health.last_updated_time, 1_700_000_000);
            assert_eq!(health.health_check_timeout_seconds, TIMEOUT_SECONDS);
            if device.gpu_index == 1 {
                assert_eq!(health.health(), HealthStatus::Unhealthy, "{}", device.name);
                assert_eq!(health.message, "GPU 1 reported critical XID 79");
                let taints = device.device.taints.as_ref().unwrap();
                assert_eq!(taints.len(), 1);
                assert_eq!(
                    (
                        taints[0].key.as_str(),
                        taints[0].value.as_deref(),
                        taints[0].effect.as_str()
                    ),
                    (TAINT_KEY, Some("79"), "NoSchedule")
                );
            } else {
                assert_eq!(health.health(), HealthStatus::Healthy, "{}", device.name);
                assert!(health.message.is_empty());
                assert!(device.device.taints.is_none());
            }
        }

        taint_unhealthy(&mut devices, &Faults::from([(0, None)]));
        assert_eq!(
            unhealthy_reason(&devices[0]).as_deref(),
            Some("GPU 0 reported a critical error without an XID")
        );
        assert!(
            devices[1..]
                .iter()
                .all(|device| device.device.taints.is_none())
        );
    }

    #[test]
    fn mig_devices_share_their_gpus_health() {
        let mut devices = devices("a100-40gb:1", &[("1g.5gb", 7)]);
        assert_eq!(devices.len(), 7);
        taint_unhealthy(&mut devices, &Faults::from([(0, Some(48))]));
        let reported = report(&devices, "node-a", 0);
        assert!(
            reported
                .devices
                .iter()
                .all(|health| health.health() == HealthStatus::Unhealthy)
        );
    }

    #[test]
    fn placements_of_a_gpu_served_on_demand_share_its_health_and_the_others_do_not() {
        use gpu::GpuBackend;

        let (_dir, simulator) = simulated("h100-80gb:2", &[]);
        for gpu in 0..2 {
            simulator.set_mig_mode(gpu, true).unwrap();
            simulator.reset(gpu).unwrap();
        }
        let views = node_runtime::inventory::read(simulator.as_ref()).unwrap();
        let partition = Partition {
            dra: GpuSet::All,
            shared: "1".parse().unwrap(),
            dynamic_mig: GpuSet::All,
        };
        let (dynamic, _) =
            crate::dynamic_mig::observe(simulator.as_ref(), &views, &partition).unwrap();
        let mut devices = slices::devices(&views, &partition, &dynamic);
        assert!(devices.iter().all(|device| device.on_demand.is_some()));
        // GPU 1's placements are shared instances: a shared instance of an Unhealthy GPU takes no new claim either.
        taint_unhealthy(&mut devices, &Faults::from([(1, Some(79))]));
        let (sick, well): (Vec<_>, Vec<_>) =
            devices.iter().partition(|device| device.gpu_index == 1);
        assert!(!sick.is_empty() && !well.is_empty());
        assert!(sick.iter().all(|device| {
            unhealthy_reason(device).as_deref() == Some("GPU 1 reported critical XID 79")
        }));
        assert!(well.iter().all(|device| device.device.taints.is_none()));
    }

    #[tokio::test]
    async fn the_stream_sends_the_list_at_once_and_again_on_each_change() {
        use futures::StreamExt;

        let healthy = devices("a100-40gb:2", &[]);
        let (sender, receiver) = watch::channel(healthy.clone());
        let service = HealthService {
            pool: "node-a".to_owned(),
            devices: receiver,
        };
        let mut stream = service
            .node_watch_resources(Request::new(NodeWatchResourcesRequest {}))
            .await
            .unwrap()
            .into_inner();
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 2);
        assert!(
            first
                .devices
                .iter()
                .all(|device| device.health() == HealthStatus::Healthy)
        );

        let mut tainted = healthy;
        taint_unhealthy(&mut tainted, &Faults::from([(1, Some(79))]));
        sender.send_replace(tainted);
        let next = tokio::time::timeout(RESEND / 2, stream.next())
            .await
            .expect("a change is sent before the periodic resend")
            .unwrap()
            .unwrap();
        let health: Vec<HealthStatus> = next.devices.iter().map(DeviceHealth::health).collect();
        assert_eq!(health, [HealthStatus::Healthy, HealthStatus::Unhealthy]);

        drop(sender);
        assert!(
            stream.next().await.is_none(),
            "the stream ends with the driver"
        );
    }
}

//! One gRPC server per advertised resource, on its own unix socket in the kubelet's device-plugin directory.
//!
//! A server reads everything it answers from a [`Snapshot`] that the plugin replaces whenever the devices, their
//! health or the config change; ListAndWatch streams each new device list to the kubelet. A changed device list
//! of a resource that stays is therefore an update on the open stream, not a restart: the kubelet's allocatable
//! follows at once, and a pod being admitted meanwhile does not meet a missing socket.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crd::config::device_plugin::ResourceName;
use futures::Stream;
use tokio::net::UnixListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use crate::allocate::{AllocateSettings, allocate};
use crate::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::api::{
    self, AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse,
    DevicePluginOptions, Empty, ListAndWatchResponse, NumaNode, PreStartContainerRequest,
    PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
    TopologyInfo,
};
use crate::plan::Resource;
use crate::preferred::preferred;

/// Everything a resource's server answers from, replaced as a whole on every change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The resource's devices and sharing.
    pub resource: Resource,
    /// How Allocate answers.
    pub settings: AllocateSettings,
    /// Indices of the GPUs that are Unhealthy now.
    pub unhealthy: BTreeSet<u32>,
}

impl Snapshot {
    /// The device list as ListAndWatch sends it.
    #[must_use]
    pub fn device_list(&self) -> ListAndWatchResponse {
        let devices = self
            .resource
            .devices
            .iter()
            .map(|device| api::Device {
                id: device.id.clone(),
                health: if self.unhealthy.contains(&device.gpu_index) {
                    api::UNHEALTHY
                } else {
                    api::HEALTHY
                }
                .to_owned(),
                topology: device.numa_node.map(|id| TopologyInfo {
                    nodes: vec![NumaNode { id }],
                }),
            })
            .collect();
        ListAndWatchResponse { devices }
    }

    /// How many devices are Healthy: the node's allocatable for the resource.
    #[must_use]
    pub fn healthy_count(&self) -> usize {
        self.resource
            .devices
            .iter()
            .filter(|device| !self.unhealthy.contains(&device.gpu_index))
            .count()
    }
}

/// The socket file name of a resource's server: `nvidia-<short name>.sock`, e.g. `nvidia-gpu.shared.sock`.
#[must_use]
pub fn socket_name(name: &ResourceName) -> String {
    format!("nvidia-{}.sock", name.short_name())
}

/// The DevicePlugin service of one resource.
#[derive(Debug, Clone)]
struct Service {
    name: ResourceName,
    snapshot: watch::Receiver<Arc<Snapshot>>,
    stopping: watch::Receiver<bool>,
    /// Woken when an Allocate fails, so that ListAndWatch sends the list again (the kubelet's contract).
    resend: Arc<Notify>,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        info!(resource = %self.name, "kubelet opened ListAndWatch");
        let state = (
            self.snapshot.clone(),
            self.stopping.clone(),
            self.resend.clone(),
            true,
        );
        let stream = futures::stream::unfold(
            state,
            |(mut snapshot, mut stopping, resend, first)| async move {
                if !first {
                    tokio::select! {
                        changed = snapshot.changed() => changed.ok()?,
                        () = resend.notified() => {}
                        _ = stopping.wait_for(|stopping| *stopping) => return None,
                    }
                }
                if *stopping.borrow() {
                    return None;
                }
                let list = snapshot.borrow_and_update().device_list();
                Some((Ok(list), (snapshot, stopping, resend, false)))
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let snapshot = self.snapshot.borrow().clone();
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|container| ContainerPreferredAllocationResponse {
                device_i_ds: preferred(
                    &snapshot.resource,
                    &container.available_device_i_ds,
                    &container.must_include_device_i_ds,
                    usize::try_from(container.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let started = Instant::now();
        let snapshot = self.snapshot.borrow().clone();
        let result = request
            .into_inner()
            .container_requests
            .iter()
            .map(|container| {
                let unhealthy = container.devices_ids.iter().find(|id| {
                    snapshot.resource.devices.iter().any(|device| {
                        &device.id == *id && snapshot.unhealthy.contains(&device.gpu_index)
                    })
                });
                if let Some(id) = unhealthy {
                    return Err(Status::failed_precondition(format!(
                        "device {id} of {} is Unhealthy",
                        self.name
                    )));
                }
                allocate(
                    &self.name,
                    &snapshot.resource,
                    &snapshot.settings,
                    &container.devices_ids,
                )
                .map_err(|error| Status::invalid_argument(error.to_string()))
            })
            .collect::<Result<Vec<_>, Status>>();
        match result {
            Ok(container_responses) => {
                debug!(resource = %self.name, elapsed_us = node_runtime::process::log_micros(started.elapsed()), "allocated");
                Ok(Response::new(AllocateResponse {
                    container_responses,
                }))
            }
            Err(status) => {
                warn!(resource = %self.name, error = status.message(), "Allocate refused");
                self.resend.notify_waiters();
                Err(status)
            }
        }
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// The options registered and answered: no PreStartContainer, GetPreferredAllocation available.
#[must_use]
pub fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// A resource's server while it runs.
#[derive(Debug)]
pub struct RunningServer {
    name: ResourceName,
    socket: PathBuf,
    snapshot: watch::Sender<Arc<Snapshot>>,
    stopping: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl RunningServer {
    /// Serves `name` on `<dir>/<socket_name>`, replacing a stale socket file left there.
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub fn start(
        dir: &Path,
        name: &ResourceName,
        snapshot: Arc<Snapshot>,
    ) -> std::io::Result<Self> {
        let (snapshot, _) = watch::channel(snapshot);
        let socket = dir.join(socket_name(name));
        match std::fs::remove_file(&socket) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        let listener = UnixListener::bind(&socket)?;
        let (stopping, _) = watch::channel(false);
        let service = Service {
            name: name.clone(),
            snapshot: snapshot.subscribe(),
            stopping: stopping.subscribe(),
            resend: Arc::new(Notify::new()),
        };
        let mut stop = stopping.subscribe();
        let resource = name.clone();
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stop.wait_for(|stopping| *stopping).await;
                })
                .await;
            if let Err(error) = served {
                warn!(%resource, %error, "device plugin server failed");
            }
        });
        debug!(resource = %name, socket = %socket.display(), "serving");
        Ok(Self {
            name: name.clone(),
            socket,
            snapshot,
            stopping,
            task,
        })
    }

    /// The socket's file name, relative to the device-plugin directory (what registration sends).
    #[must_use]
    pub fn endpoint(&self) -> String {
        socket_name(&self.name)
    }

    /// The snapshot being served.
    #[must_use]
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.borrow().clone()
    }

    /// Replaces the snapshot; open ListAndWatch streams send the new list when it differs.
    pub fn update(&self, snapshot: Arc<Snapshot>) {
        self.snapshot.send_if_modified(|current| {
            let changed = **current != *snapshot;
            if changed {
                *current = snapshot;
            }
            changed
        });
    }

    /// Stops serving and removes the socket. ListAndWatch streams end first, so that the shutdown does not wait on
    /// them.
    pub async fn stop(self) -> Arc<Snapshot> {
        let _ = self.stopping.send(true);
        if tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .is_err()
        {
            warn!(resource = %self.name, "the server did not stop within 5 s");
        }
        let _ = std::fs::remove_file(&self.socket);
        self.snapshot.borrow().clone()
    }

    /// Binds a fresh socket for the same resource and snapshot: a starting kubelet deletes every socket in the
    /// directory, so re-registering needs a new one.
    ///
    /// # Errors
    /// When the new socket cannot be bound.
    pub async fn restart(self, dir: &Path) -> std::io::Result<Self> {
        let name = self.name.clone();
        let snapshot = self.stop().await;
        Self::start(dir, &name, snapshot)
    }
}

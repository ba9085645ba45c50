//! The driver's gRPC services on unix sockets: plugin registration in the kubelet's `plugins_registry` directory,
//! and on the driver's own socket the DRA plugin service (`v1.DRAPlugin`) the kubelet calls to prepare and unprepare
//! claims, beside the health service (`v1.DRAResourceHealth`) it watches.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crd::dra::DRIVER;
use tokio::net::UnixListener;
use tokio::sync::{Notify, watch};
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::api::dra_plugin_server::{DraPlugin, DraPluginServer};
use crate::api::{
    Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use crate::claims::{ClaimReader, ClaimRef, Claims};
use crate::health::HealthService;
use crate::health_api::dra_resource_health_server::DraResourceHealthServer;
use crate::registration::registration_server::{Registration, RegistrationServer};
use crate::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::slices::DriverDevice;
use crate::{authority, cdi, claim_status};

/// The service the kubelet picks: the DRA plugin API v1.
const SERVICE_V1: &str = "v1.DRAPlugin";
/// The health service, v1: the kubelet streams device health from a driver that lists it.
const HEALTH_V1: &str = "v1.DRAResourceHealth";
/// The plugin type the kubelet's plugin watcher routes to its DRA handler.
const PLUGIN_TYPE: &str = "DRAPlugin";

/// Where the driver's sockets are, under the kubelet's root directory.
#[derive(Debug, Clone)]
pub struct Sockets {
    /// The registration socket, `<root>/plugins_registry/gpu.nvidia.com-reg.sock`.
    pub registration: PathBuf,
    /// The DRA service socket, `<root>/plugins/gpu.nvidia.com/dra.sock`.
    pub service: PathBuf,
}

impl Sockets {
    /// The sockets under kubelet root `root`.
    #[must_use]
    pub fn under(root: &Path) -> Self {
        Self {
            registration: root
                .join("plugins_registry")
                .join(format!("{DRIVER}-reg.sock")),
            service: root.join("plugins").join(DRIVER).join("dra.sock"),
        }
    }
}

/// The DRA plugin service: prepares claims on the devices the driver publishes now.
pub struct Driver<R> {
    /// Reads claims from the API.
    pub reader: R,
    /// The prepared claims.
    pub claims: Arc<Claims>,
    /// The devices published now.
    pub devices: watch::Receiver<Vec<DriverDevice>>,
    /// Woken after each change of the prepared claims (GPUNode status follows).
    pub changed: Arc<Notify>,
    /// Prepared claims' device status ([`claim_status`](crate::claim_status)), written when the kubelet's calls
    /// pause.
    pub statuses: Arc<claim_status::Queue>,
}

impl<R: std::fmt::Debug> std::fmt::Debug for Driver<R> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Driver")
            .field("reader", &self.reader)
            .field("claims", &self.claims)
            .finish_non_exhaustive()
    }
}

#[tonic::async_trait]
impl<R: ClaimReader + 'static> DraPlugin for Driver<R> {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        // A call marks the kubelet busy from its start to its answer (a MIG instance's creation can take seconds).
        self.statuses.call();
        let mut response = NodePrepareResourcesResponse::default();
        for claim in request.into_inner().claims {
            let reference = ClaimRef {
                namespace: claim.namespace,
                name: claim.name,
                uid: claim.uid,
            };
            let published = self.devices.borrow().clone();
            let answer = match self
                .claims
                .prepare(&self.reader, &reference, &published)
                .await
            {
                Ok(devices) => {
                    self.statuses.prepared(&reference, &devices);
                    NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|device| Device {
                                cdi_device_ids: vec![cdi::qualified_name(
                                    &reference.uid,
                                    &device.device,
                                )],
                                request_names: device.requests,
                                pool_name: device.pool,
                                device_name: device.device,
                                share_id: device.share_id,
                            })
                            .collect(),
                        error: String::new(),
                    }
                }
                Err(error) => {
                    warn!(claim = %format!("{}/{}", reference.namespace, reference.name), %error, "cannot prepare");
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: error.to_string(),
                    }
                }
            };
            response.claims.insert(reference.uid, answer);
        }
        self.changed.notify_one();
        self.statuses.call();
        Ok(Response::new(response))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        self.statuses.call();
        let mut response = NodeUnprepareResourcesResponse::default();
        for claim in request.into_inner().claims {
            let error = match self.claims.unprepare(&claim.uid).await {
                Ok(()) => {
                    self.statuses.unprepared(&claim.uid);
                    String::new()
                }
                Err(error) => {
                    warn!(claim = %claim.uid, %error, "cannot unprepare");
                    error
                }
            };
            response
                .claims
                .insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        self.changed.notify_one();
        self.statuses.call();
        Ok(Response::new(response))
    }
}

/// The registration service: tells the kubelet what the plugin is and where its service listens.
#[derive(Debug)]
struct Registrar {
    endpoint: PathBuf,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_owned(),
            name: DRIVER.to_owned(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: vec![SERVICE_V1.to_owned(), HEALTH_V1.to_owned()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            info!("registered with the kubelet");
        } else {
            warn!(error = %status.error, "the kubelet refused the registration");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Binds a unix socket, replacing a stale one a killed driver left.
fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    UnixListener::bind(path)
}

/// Serves the DRA and health services, then registration (the kubelet dials the service as soon as it sees the
/// registration socket), both behind the [`authority`](crate::authority) front. Returns when a server stops, which
/// is an error: the driver exits and its pod restarts.
///
/// # Errors
/// When a socket cannot be bound or a server fails.
pub async fn serve<R: ClaimReader + 'static>(
    sockets: &Sockets,
    driver: Driver<R>,
    health: HealthService,
) -> anyhow::Result<()> {
    let service = bind(&sockets.service)?;
    let registration = bind(&sockets.registration)?;
    let registrar = Registrar {
        endpoint: sockets.service.clone(),
    };
    info!(socket = %sockets.service.display(), "serving the DRA plugin service");
    let routes =
        Routes::new(DraPluginServer::new(driver)).add_service(DraResourceHealthServer::new(health));
    let service = authority::serve(service, routes);
    let registration = authority::serve(
        registration,
        Routes::new(RegistrationServer::new(registrar)),
    );
    tokio::select! {
        served = service => served?,
        served = registration => served?,
    }
    anyhow::bail!("a gRPC server of the DRA driver stopped")
}

//! The kubelet's PodResources API (v1): which pod (and container) holds which device. The MIG manager asks it so
//! that a change evicts only the pods on the GPUs it disturbs ([`mig::holders`](crate::mig::holders) decides from
//! the answer); the exporter asks it for the pod, namespace and container labels of each GPU's metrics.
//!
//! The kubelet serves it on `<kubelet root>/pod-resources/kubelet.sock`; the DaemonSets mount that folder from the
//! host. The answer is read whole on each call: pods come and go while a change waits for them.
//!
//! Our device plugin advertises device IDs that are a GPU UUID (`GPU-...`), a MIG device UUID (`MIG-...`), or
//! either with a replica suffix (`GPU-...::3`, time-slicing and MPS replicas); `crd`'s `device_uuid` names the
//! device behind an ID.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use node_runtime::grpc;

#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
mod api {
    tonic::include_proto!("v1");
}

use api::pod_resources_lister_client::PodResourcesListerClient;
use api::{AllocatableResourcesRequest, ListPodResourcesRequest};

/// The socket, under the kubelet's root directory.
pub const SOCKET: &str = "pod-resources/kubelet.sock";
/// A kubelet on the same machine answers a connection at once; waiting longer would only hold up the eviction
/// loop, which then falls back to evicting every GPU pod.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The whole List call, for the same reason: a wedged kubelet must not stall the change.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The devices one pod holds, as the kubelet allocated them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDevices {
    /// `namespace/name`.
    pub pod: String,
    /// Its containers, as the kubelet lists them (those holding no device included).
    pub containers: Vec<ContainerDevices>,
}

/// The devices one container of a pod holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerDevices {
    /// The container's name in the pod spec.
    pub name: String,
    /// Device IDs by resource name (`nvidia.com/gpu` → `GPU-...::3`, ...).
    pub devices: BTreeMap<String, BTreeSet<String>>,
    /// Devices it holds through DRA claims.
    pub claims: Vec<ClaimDevice>,
}

/// One device a container holds through a ResourceClaim.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimDevice {
    /// The claim's namespace.
    pub claim_namespace: String,
    /// The claim's name.
    pub claim_name: String,
    /// The DRA driver.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
}

impl PodDevices {
    /// The pod's namespace and name (`pod` split at its `/`, which a namespace cannot contain).
    #[must_use]
    pub fn namespace_and_name(&self) -> (&str, &str) {
        self.pod.split_once('/').unwrap_or(("", &self.pod))
    }

    /// Every device the pod holds, as `(resource name, device ID)`, over all of its containers.
    pub fn devices(&self) -> impl Iterator<Item = (&str, &str)> {
        self.containers.iter().flat_map(|container| {
            container.devices.iter().flat_map(|(resource, ids)| {
                ids.iter().map(move |id| (resource.as_str(), id.as_str()))
            })
        })
    }
}

/// Why the kubelet could not say which pod holds which device.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// No socket: no kubelet on this path (a wrong `--kubelet-root`, or the folder not mounted).
    #[error("the kubelet's pod-resources socket {} does not exist", socket.display())]
    SocketMissing {
        /// The socket.
        socket: PathBuf,
    },
    /// The socket is there but nobody answers on it.
    #[error("cannot connect to the kubelet's pod-resources socket {}: {}", socket.display(), causes(source))]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// Why.
        source: tonic::transport::Error,
    },
    /// The kubelet refused or failed the call.
    #[error("the kubelet's pod-resources call failed: {0}")]
    List(#[source] tonic::Status),
}

/// An error with its causes: a transport error alone says only "transport error".
fn causes(error: &tonic::transport::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(&format!(": {inner}"));
        cause = inner.source();
    }
    text
}

/// The pod-resources socket of the kubelet whose root directory is `kubelet_root`.
#[must_use]
pub fn socket(kubelet_root: &Path) -> PathBuf {
    kubelet_root.join(SOCKET)
}

/// Every pod the kubelet knows, with the devices it holds (pods not admitted yet hold none).
///
/// # Errors
/// [`PodResourcesError::SocketMissing`] when the socket does not exist; the other variants when the kubelet does
/// not answer or fails the call.
pub async fn list(kubelet_root: &Path) -> Result<Vec<PodDevices>, PodResourcesError> {
    let answer = connect(kubelet_root)
        .await?
        .list(ListPodResourcesRequest {})
        .await
        .map_err(PodResourcesError::List)?
        .into_inner();
    Ok(answer
        .pod_resources
        .into_iter()
        .map(|pod| PodDevices {
            pod: format!("{}/{}", pod.namespace, pod.name),
            containers: pod
                .containers
                .into_iter()
                .map(|container| {
                    let mut devices: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
                    for held in container.devices {
                        devices
                            .entry(held.resource_name)
                            .or_default()
                            .extend(held.device_ids);
                    }
                    let claims = container
                        .dynamic_resources
                        .into_iter()
                        .flat_map(|claim| {
                            let (namespace, name) = (claim.claim_namespace, claim.claim_name);
                            claim
                                .claim_resources
                                .into_iter()
                                .map(move |held| ClaimDevice {
                                    claim_namespace: namespace.clone(),
                                    claim_name: name.clone(),
                                    driver: held.driver_name,
                                    pool: held.pool_name,
                                    device: held.device_name,
                                })
                        })
                        .collect();
                    ContainerDevices {
                        name: container.name,
                        devices,
                        claims,
                    }
                })
                .collect(),
        })
        .collect())
}

/// Every device the node advertises, by resource name (`nvidia.com/gpu` → `GPU-...::0`, `GPU-...::1`, ...):
/// how many replicas of each GPU the device plugin offers.
///
/// # Errors
/// As [`list`].
pub async fn allocatable(
    kubelet_root: &Path,
) -> Result<BTreeMap<String, BTreeSet<String>>, PodResourcesError> {
    let answer = connect(kubelet_root)
        .await?
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .map_err(PodResourcesError::List)?
        .into_inner();
    let mut devices: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for held in answer.devices {
        devices
            .entry(held.resource_name)
            .or_default()
            .extend(held.device_ids);
    }
    Ok(devices)
}

async fn connect(
    kubelet_root: &Path,
) -> Result<PodResourcesListerClient<tonic::transport::Channel>, PodResourcesError> {
    let socket = socket(kubelet_root);
    if matches!(tokio::fs::try_exists(&socket).await, Ok(false)) {
        return Err(PodResourcesError::SocketMissing { socket });
    }
    let endpoint = grpc::endpoint()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT);
    let channel = grpc::connect_with(endpoint, &socket)
        .await
        .map_err(|source| PodResourcesError::Connect { socket, source })?;
    Ok(PodResourcesListerClient::new(channel))
}

#[cfg(test)]
pub(crate) mod tests {
    use tokio::net::UnixListener;
    use tokio_stream::wrappers::UnixListenerStream;
    use tonic::{Request, Response, Status};

    use super::*;

    /// The server side, generated apart from the agent's client (see build.rs), with its own message types: the
    /// test goes through the wire encoding.
    #[allow(
        missing_docs,
        missing_debug_implementations,
        clippy::all,
        clippy::pedantic
    )]
    pub(crate) mod fake {
        include!(concat!(env!("OUT_DIR"), "/server/v1.rs"));
    }

    use fake::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};

    /// A kubelet that gives one fixed answer.
    struct Kubelet(fake::ListPodResourcesResponse);

    #[tonic::async_trait]
    impl PodResourcesLister for Kubelet {
        async fn list(
            &self,
            _: Request<fake::ListPodResourcesRequest>,
        ) -> Result<Response<fake::ListPodResourcesResponse>, Status> {
            Ok(Response::new(self.0.clone()))
        }

        async fn get_allocatable_resources(
            &self,
            _: Request<fake::AllocatableResourcesRequest>,
        ) -> Result<Response<fake::AllocatableResourcesResponse>, Status> {
            // Every device some container holds, and nothing else: enough for the tests that ask.
            let devices = self
                .0
                .pod_resources
                .iter()
                .flat_map(|pod| &pod.containers)
                .flat_map(|container| container.devices.clone())
                .collect();
            Ok(Response::new(fake::AllocatableResourcesResponse {
                devices,
            }))
        }
    }

    pub(crate) fn container(name: &str, devices: &[(&str, &[&str])]) -> fake::ContainerResources {
        fake::ContainerResources {
            name: name.into(),
            devices: devices
                .iter()
                .map(|(resource, ids)| fake::ContainerDevices {
                    resource_name: (*resource).into(),
                    device_ids: ids.iter().map(|id| (*id).into()).collect(),
                })
                .collect(),
            dynamic_resources: Vec::new(),
        }
    }

    /// A container holding `device` of this node's DRA driver through claim `namespace/claim`.
    pub(crate) fn claiming(
        name: &str,
        namespace: &str,
        claim: &str,
        device: &str,
    ) -> fake::ContainerResources {
        fake::ContainerResources {
            name: name.into(),
            devices: Vec::new(),
            dynamic_resources: vec![fake::DynamicResource {
                claim_name: claim.into(),
                claim_namespace: namespace.into(),
                claim_resources: vec![fake::ClaimResource {
                    cdi_devices: vec![fake::CdiDevice {
                        name: format!("k8s.gpu.nvidia.com/claim=uid-{device}"),
                    }],
                    driver_name: crd::dra::DRIVER.into(),
                    pool_name: "node-1".into(),
                    device_name: device.into(),
                }],
            }],
        }
    }

    /// Serves `answer` on `<root>/pod-resources/kubelet.sock` (the exporter's tests use it too).
    pub(crate) fn serve(root: &Path, answer: fake::ListPodResourcesResponse) {
        std::fs::create_dir_all(root.join("pod-resources")).unwrap();
        let listener = UnixListener::bind(socket(root)).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(Kubelet(answer)))
                .serve_with_incoming(UnixListenerStream::new(listener)),
        );
    }

    #[tokio::test]
    async fn the_answer_is_read_per_pod_container_and_resource() {
        let root = tempfile::tempdir().unwrap();
        serve(
            root.path(),
            fake::ListPodResourcesResponse {
                pod_resources: vec![
                    fake::PodResources {
                        name: "trainer".into(),
                        namespace: "ml".into(),
                        containers: vec![
                            container("main", &[("nvidia.com/gpu", &["GPU-a::1", "GPU-a::2"])]),
                            container(
                                "side",
                                &[
                                    ("nvidia.com/gpu", &["GPU-b::0"]),
                                    ("nvidia.com/mig-1g.10gb", &["MIG-c"]),
                                ],
                            ),
                        ],
                    },
                    fake::PodResources {
                        name: "web".into(),
                        namespace: "default".into(),
                        containers: vec![container("main", &[])],
                    },
                    fake::PodResources {
                        name: "share".into(),
                        namespace: "team".into(),
                        containers: vec![claiming("work", "team", "share-gpu-x1", "gpu-1")],
                    },
                ],
            },
        );
        let mut pods = list(root.path()).await.unwrap();
        let share = pods.pop().unwrap();
        assert_eq!(
            share.containers[0].claims,
            [ClaimDevice {
                claim_namespace: "team".into(),
                claim_name: "share-gpu-x1".into(),
                driver: "gpu.nvidia.com".into(),
                pool: "node-1".into(),
                device: "gpu-1".into(),
            }]
        );
        let set = |ids: &[&str]| ids.iter().map(|id| (*id).to_owned()).collect();
        assert_eq!(
            pods,
            [
                PodDevices {
                    pod: "ml/trainer".into(),
                    containers: vec![
                        ContainerDevices {
                            name: "main".into(),
                            devices: BTreeMap::from([(
                                "nvidia.com/gpu".into(),
                                set(&["GPU-a::1", "GPU-a::2"])
                            )]),
                            claims: Vec::new(),
                        },
                        ContainerDevices {
                            name: "side".into(),
                            devices: BTreeMap::from([
                                ("nvidia.com/gpu".into(), set(&["GPU-b::0"])),
                                ("nvidia.com/mig-1g.10gb".into(), set(&["MIG-c"])),
                            ]),
                            claims: Vec::new(),
                        },
                    ],
                },
                PodDevices {
                    pod: "default/web".into(),
                    containers: vec![ContainerDevices {
                        name: "main".into(),
                        devices: BTreeMap::new(),
                        claims: Vec::new(),
                    }],
                },
            ]
        );
        assert_eq!(pods[0].namespace_and_name(), ("ml", "trainer"));
        let held: Vec<_> = pods[0].devices().collect();
        assert_eq!(
            held,
            [
                ("nvidia.com/gpu", "GPU-a::1"),
                ("nvidia.com/gpu", "GPU-a::2"),
                ("nvidia.com/gpu", "GPU-b::0"),
                ("nvidia.com/mig-1g.10gb", "MIG-c"),
            ]
        );
        assert_eq!(pods[1].devices().count(), 0);
    }

    #[tokio::test]
    async fn a_missing_socket_is_told_apart() {
        let root = tempfile::tempdir().unwrap();
        let error = list(root.path()).await.unwrap_err();
        assert!(
            matches!(&error, PodResourcesError::SocketMissing { socket: path } if *path == socket(root.path())),
            "{error}"
        );
        // A socket file nobody listens on (a kubelet that died) is a connection failure instead.
        std::fs::create_dir_all(root.path().join("pod-resources")).unwrap();
        drop(std::os::unix::net::UnixListener::bind(socket(root.path())).unwrap());
        let error = list(root.path()).await.unwrap_err();
        assert!(
            matches!(error, PodResourcesError::Connect { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("refused"), "{error}");
    }
}

//! gRPC over a unix socket, the way the kubelet serves its APIs (device-plugin registration, pod resources) and
//! dials device plugins back.

use std::path::Path;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// An endpoint for [`connect_with`]: its URI is a placeholder gRPC needs; the connector dials the socket.
#[must_use]
pub fn endpoint() -> Endpoint {
    Endpoint::from_static("http://localhost")
}

/// A channel to the gRPC server on `socket`.
///
/// # Errors
/// When the socket cannot be connected.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    connect_with(endpoint(), socket).await
}

/// A channel to the gRPC server on `socket`, with `endpoint`'s settings (timeouts).
///
/// # Errors
/// When the socket cannot be connected.
pub async fn connect_with(
    endpoint: Endpoint,
    socket: &Path,
) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_owned();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
}

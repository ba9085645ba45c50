//! The kubelet side of the contract: registering a resource on `kubelet.sock`, and noticing the socket being
//! created again (a restarted kubelet), which calls for registering every resource again.

use std::path::{Path, PathBuf};

use node_runtime::grpc::connect;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tracing::warn;

use crate::api::registration_client::RegistrationClient;
use crate::api::{KUBELET_SOCKET, RegisterRequest, VERSION};
use crate::server::options;

/// A failed registration, with the resource it was for.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The kubelet's socket cannot be reached (no kubelet running, or not yet).
    #[error("cannot reach the kubelet at {socket}: {source}")]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// Why.
        source: tonic::transport::Error,
    },
    /// The kubelet refused (e.g. the resource name is taken by another plugin).
    #[error("the kubelet refused to register {resource}: {status}")]
    Refused {
        /// The resource.
        resource: String,
        /// The kubelet's answer.
        status: tonic::Status,
    },
}

/// Registers `resource`, served on `endpoint` (a socket file name in `dir`), with the kubelet listening on
/// `<dir>/kubelet.sock`.
///
/// # Errors
/// [`RegisterError`] when the kubelet is not there or refuses.
pub async fn register(dir: &Path, endpoint: &str, resource: &str) -> Result<(), RegisterError> {
    let socket = dir.join(KUBELET_SOCKET);
    let channel = connect(&socket)
        .await
        .map_err(|source| RegisterError::Connect { socket, source })?;
    let request = RegisterRequest {
        version: VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: Some(options()),
    };
    RegistrationClient::new(channel)
        .register(request)
        .await
        .map_err(|status| RegisterError::Refused {
            resource: resource.into(),
            status,
        })?;
    Ok(())
}

/// A watch on the device-plugin directory that yields once each time `kubelet.sock` is created. Event driven
/// (inotify on Linux), so a restarted kubelet is noticed within milliseconds and nothing polls meanwhile.
///
/// The returned watcher must be kept alive for as long as the events are wanted.
///
/// # Errors
/// When the directory cannot be created or watched.
pub fn watch_kubelet_socket(
    dir: &Path,
) -> notify::Result<(notify::RecommendedWatcher, mpsc::UnboundedReceiver<()>)> {
    std::fs::create_dir_all(dir).map_err(notify::Error::io)?;
    let (sender, receiver) = mpsc::unbounded_channel();
    let mut watcher =
        notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(event) => {
                let created = matches!(event.kind, EventKind::Create(_));
                if created
                    && event
                        .paths
                        .iter()
                        .any(|path| path.file_name().is_some_and(|name| name == KUBELET_SOCKET))
                {
                    let _ = sender.send(());
                }
            }
            Err(error) => warn!(%error, "watching the device-plugin directory failed"),
        })?;
    watcher.watch(dir, RecursiveMode::NonRecursive)?;
    Ok((watcher, receiver))
}

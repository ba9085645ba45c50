//! Talking to the local cluster's API server with the `kube` client, from the synchronous xtask code.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// How long one probe of the API server may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A client for the cluster plus the single-threaded runtime it runs on.
///
/// Its methods block; an async caller of this module's public functions should use `tokio::task::spawn_blocking`.
pub struct Connection {
    runtime: tokio::runtime::Runtime,
    pub client: kube::Client,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// A connection authenticated by the kubeconfig at `path` (nothing is sent yet).
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a tokio runtime")?;
        let kubeconfig = Kubeconfig::read_from(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let client = runtime.block_on(async {
            let mut config =
                kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .with_context(|| format!("cannot use {}", path.display()))?;
            config.connect_timeout = Some(PROBE_TIMEOUT);
            config.read_timeout = Some(Duration::from_secs(30));
            kube::Client::try_from(config).context("cannot build a Kubernetes client")
        })?;
        Ok(Self { runtime, client })
    }

    /// Runs one request (a future made with [`Self::client`]) to completion, giving up after [`PROBE_TIMEOUT`].
    pub fn request<T, E>(&self, future: impl Future<Output = Result<T, E>>) -> anyhow::Result<T>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let answer = self
            .runtime
            .block_on(async { tokio::time::timeout(PROBE_TIMEOUT, future).await });
        let answer = answer.map_err(|_| anyhow::anyhow!("no answer within {PROBE_TIMEOUT:?}"))?;
        Ok(answer?)
    }

    /// `GET /readyz`: Ok when the API server answers `ok`.
    pub fn ready(&self) -> anyhow::Result<()> {
        let request = http::Request::get("/readyz").body(Vec::new())?;
        let body = self
            .request(self.client.request_text(request))
            .context("GET /readyz")?;
        anyhow::ensure!(body.trim() == "ok", "/readyz answered {body:?}");
        Ok(())
    }
}

//! The HAMi admission webhook, served by every operator replica: pods written for HAMi (`nvidia.com/gpu` with
//! `nvidia.com/gpumem`, `gpumem-percentage` or `gpucores`, and HAMi's GPU-type annotations) are rewritten onto
//! DRA claims of the `shared.gpu.nvidia.com` class, so the kube-scheduler places them and the DRA driver enforces
//! their bounds.
//!
//! - [`hami`] (pure): the conversion of one pod.
//! - [`review`]: the admission endpoint, with the cluster's shared GPUs from a watch of the driver's slices.
//! - [`certs`] (pure): the webhook's CA and serving certificate; [`tls`]: the Secret that holds them, their
//!   renewal, and the MutatingWebhookConfiguration; [`server`]: HTTPS with a certificate replaced in place.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::routing::post;
use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

pub mod certs;
pub mod hami;
pub mod review;
pub mod server;
pub mod tls;

/// The admission path.
pub const PATH: &str = "/hami";
/// The MutatingWebhookConfiguration's name.
pub const CONFIGURATION: &str = "gpu-operator-hami";
/// The Secret with the webhook's certificate, in the operator's namespace.
pub const SECRET: &str = "gpu-operator-webhook-tls";
/// How often a replica checks the certificate (renewal, or another replica's renewal).
const RENEWAL_CHECK: Duration = Duration::from_secs(3600);

/// Where the webhook listens and how the API server reaches it.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The HTTPS address.
    pub listen: SocketAddr,
    /// The operator's namespace (the Secret's).
    pub namespace: String,
    /// The Service or URL the API server calls.
    pub endpoint: tls::Endpoint,
}

/// Serves the webhook until the process ends, keeping its certificate and configuration current.
///
/// # Errors
/// When the certificate or configuration cannot be set up at start, or the server cannot listen.
pub async fn run(client: Client, settings: Settings) -> anyhow::Result<()> {
    let hosts = settings.endpoint.hosts();
    let mut stored = tls::ensure_secret(&client, &settings.namespace, SECRET, &hosts).await?;
    let cert = server::ServingCert::new(&stored.material)?;
    let configure =
        |ca_bundle: &str| tls::configuration(CONFIGURATION, PATH, &settings.endpoint, ca_bundle);
    tls::apply_configuration(&client, &configure(&stored.ca_bundle)).await?;

    let (slices, writer) = reflector::store();
    let watch = reflector(
        writer,
        watcher(
            Api::<ResourceSlice>::all(client.clone()),
            watcher::Config::default().fields(&format!("spec.driver={}", crd::dra::DRIVER)),
        ),
    )
    .default_backoff()
    .for_each(|event| {
        if let Err(error) = event {
            warn!(%error, "the watch of ResourceSlices failed; retrying");
        }
        std::future::ready(())
    });
    let router = Router::new()
        .route(PATH, post(review::review))
        .with_state(review::Admission {
            client: client.clone(),
            slices,
        });
    info!(listen = %settings.listen, "serving the HAMi admission webhook");
    let renew = async {
        loop {
            tokio::time::sleep(RENEWAL_CHECK).await;
            match tls::ensure_secret(&client, &settings.namespace, SECRET, &hosts).await {
                Ok(latest) if latest != stored => {
                    // The API server trusts the new CA before any replica presents the new certificate.
                    if let Err(error) =
                        tls::apply_configuration(&client, &configure(&latest.ca_bundle)).await
                    {
                        warn!(%error, "cannot update the webhook's CA bundle; retrying in an hour");
                        continue;
                    }
                    match cert.replace(&latest.material) {
                        Ok(()) => info!("serving the renewed webhook certificate"),
                        Err(error) => warn!(%error, "cannot use the renewed certificate"),
                    }
                    stored = latest;
                }
                Ok(_) => {}
                Err(error) => {
                    warn!(%error, "cannot check the webhook certificate; retrying in an hour")
                }
            }
        }
    };
    tokio::select! {
        served = server::serve(settings.listen, cert.clone(), router) => served.context("the webhook server stopped"),
        () = watch => anyhow::bail!("the watch of ResourceSlices ended"),
        () = renew => unreachable!("the renewal loop never ends"),
    }
}

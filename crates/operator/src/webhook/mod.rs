//! The operator's admission webhooks, served by every operator replica:
//! - HAMi pods: pods written for HAMi (`nvidia.com/gpu` with `nvidia.com/gpumem`, `gpumem-percentage` or
//!   `gpucores`, and HAMi's GPU-type annotations) are rewritten onto DRA claims of the `shared.gpu.nvidia.com`
//!   class, so the kube-scheduler places them and the DRA driver enforces their bounds;
//! - node-bound evictions: a node agent's token evicts only pods on its own node.
//!
//! - [`hami`] (pure): the conversion of one pod; `hami_names` (pure): the resource names it reads pods by;
//!   `claim_sharing` (pure): which of its containers share one claim.
//! - [`review`]: the HAMi endpoint, with the cluster's shared GPUs from a watch of the driver's slices.
//! - [`quota`]: the GPU quota a converted pod must still be charged against.
//! - [`eviction`]: the eviction guard's decision (pure), endpoint and configuration.
//! - [`template_gc`]: the leader's sweep of the ResourceClaimTemplates no pod uses any more.
//! - [`certs`] (pure): the webhook's CA and serving certificate; [`tls`]: the Secret that holds them, their
//!   renewal, and the MutatingWebhookConfiguration; [`server`]: HTTPS with a certificate replaced in place.

use std::fmt::Display;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::watcher::DefaultBackoff;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

pub mod certs;
mod claim_sharing;
pub mod eviction;
pub mod hami;
mod hami_mig;
mod hami_names;
pub mod quota;
pub mod review;
pub mod server;
#[cfg(test)]
mod standard_tests;
pub mod template_gc;
pub mod tls;

/// The HAMi admission path.
pub const PATH: &str = "/hami";
/// The HAMi MutatingWebhookConfiguration's name.
pub const CONFIGURATION: &str = "gpu-operator-hami";
/// The Secret with the webhook's certificate, in the operator's namespace.
pub const SECRET: &str = "gpu-operator-webhook-tls";
/// How often a replica checks the certificate (renewal, or another replica's renewal).
const RENEWAL_CHECK: Duration = Duration::from_secs(3600);
/// How long the API server waits for the webhook (the configuration's `timeoutSeconds`); no part of a call is
/// allowed longer.
const API_SERVER_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest wait between retries, should the watches' backoff ever run out (it does not).
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// Where the webhook listens and how the API server reaches it.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The HTTPS address.
    pub listen: SocketAddr,
    /// The operator's namespace (the Secret's).
    pub namespace: String,
    /// The Service or URL the API server calls.
    pub endpoint: tls::Endpoint,
    /// Whether HAMi pods are converted.
    pub hami: bool,
    /// The resource names HAMi pods ask with on this cluster (HAMi's chart can rename them).
    pub hami_names: hami::ResourceNames,
    /// What becomes of a `vgpu-mode: mig` pod that no GPU served as MIG on demand can take.
    pub mig_without_dynamic_mig: hami::MigWithoutDynamicMig,
    /// Whether node agents' evictions are bound to their nodes.
    pub node_bound_evictions: bool,
    /// How long the leader keeps a HAMi ResourceClaimTemplate no pod names after its last use.
    pub templates_unused_for: Duration,
    /// Time between the leader's sweeps of the templates.
    pub templates_sweep_every: Duration,
}

/// Every webhook configuration the operator keeps, with whether `settings` (`None`: no webhook runs) enables it.
#[must_use]
pub fn configurations_enabled(
    settings: Option<&Settings>,
) -> [(tls::ConfigurationKind, &'static str, bool); 2] {
    [
        (
            tls::ConfigurationKind::Mutating,
            CONFIGURATION,
            settings.is_some_and(|settings| settings.hami),
        ),
        (
            tls::ConfigurationKind::Validating,
            eviction::CONFIGURATION,
            settings.is_some_and(|settings| settings.node_bound_evictions),
        ),
    ]
}

/// Deletes the configurations of the webhooks `settings` leaves off, so that the API server calls none that is not
/// served.
///
/// # Errors
/// When the API refuses.
pub async fn delete_unserved_configurations(
    client: &Client,
    settings: Option<&Settings>,
) -> Result<(), tls::TlsError> {
    for (kind, name, enabled) in configurations_enabled(settings) {
        if !enabled {
            tls::delete_configuration(client, kind, name).await?;
        }
    }
    Ok(())
}

/// Why the webhook cannot be set up yet; each is logged and retried.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The certificate or the configuration cannot be kept.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The server cannot take the certificate.
    #[error(transparent)]
    Server(#[from] server::ServerError),
}

/// Serves the webhook; calls `serving` once it listens and knows the cluster's GPUs (readiness). Once `leading`
/// turns true, this replica also applies the configuration and renews the certificate: only the leader writes
/// them, so a rollout's new replica (perhaps a newer version) changes neither under the old leader. A replica that
/// does not lead serves the certificate it loaded; the leader renews a month before expiry and keeps the old CA
/// trusted during the change, so it stays valid until the replica restarts or leads.
///
/// Never returns: what fails (the API refusing the Secret or the configuration, the address in use) is logged and
/// retried with backoff, so the webhook never takes the reconciler down with it. Until it serves, the API server
/// refuses HAMi pods (`failurePolicy: Fail`) and admits every other pod, which the configuration never sends.
pub async fn run(
    client: Client,
    settings: Settings,
    mut leading: watch::Receiver<bool>,
    serving: impl FnOnce(),
) {
    let hosts = settings.endpoint.hosts();
    let (mut stored, cert, acceptor) = retrying("set up the webhook's certificate", || {
        set_up(&client, &settings, &hosts)
    })
    .await;
    let listener = retrying(&format!("listen on {}", settings.listen), || {
        TcpListener::bind(settings.listen)
    })
    .await;

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
    // HAMi pods only: the eviction guard reads no slice.
    let watch = async {
        if settings.hami {
            watch.await;
        }
    };
    // Before the first list, every HAMi pod would be refused for want of GPUs.
    let ready = {
        let slices = slices.clone();
        async move {
            if !settings.hami || slices.wait_until_ready().await.is_ok() {
                info!(listen = %settings.listen, hami = settings.hami, node_bound_evictions = settings.node_bound_evictions, "serving the admission webhooks");
                serving();
            }
        }
    };
    let mut router = Router::new();
    if settings.hami {
        router = router.merge(Router::new().route(PATH, post(review::review)).with_state(
            review::Admission {
                client: client.clone(),
                slices,
                templates_unused_for: settings.templates_unused_for,
                names: settings.hami_names.clone(),
                mig_without_dynamic_mig: settings.mig_without_dynamic_mig,
            },
        ));
    }
    if settings.node_bound_evictions {
        router = router.merge(
            Router::new()
                .route(eviction::PATH, post(eviction::review))
                .with_state(client.clone()),
        );
    }
    let renew = async {
        if leading.wait_for(|leading| *leading).await.is_err() {
            // The process is ending.
            return std::future::pending().await;
        }
        retrying("apply the webhook configuration", || {
            trust(&client, &settings, &stored)
        })
        .await;
        if settings.hami {
            tokio::spawn(template_gc::run(
                client.clone(),
                settings.templates_sweep_every,
                settings.templates_unused_for,
            ));
        }
        loop {
            tokio::time::sleep(RENEWAL_CHECK).await;
            let checked = tls::ensure_secret(
                &client,
                &settings.namespace,
                SECRET,
                &hosts,
                Some(&stored.material),
            )
            .await;
            match checked {
                Ok(latest) if latest != stored => {
                    // The API server trusts the new CA before any replica presents the new certificate.
                    if let Err(error) =
                        apply_configurations(&client, &settings, &latest.ca_bundle).await
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
    let limits = server::Limits::default();
    tokio::join!(
        server::serve(listener, acceptor, router, &limits),
        watch,
        renew,
        ready
    );
}

/// The certificate in the Secret (a new one when it is missing or unusable) and the server's TLS side presenting it.
async fn set_up(
    client: &Client,
    settings: &Settings,
    hosts: &[String],
) -> Result<(tls::Stored, server::ServingCert, TlsAcceptor), WebhookError> {
    let stored = tls::ensure_secret(client, &settings.namespace, SECRET, hosts, None).await?;
    let cert = server::ServingCert::new(&stored.material)?;
    let acceptor = server::acceptor(&cert)?;
    Ok((stored, cert, acceptor))
}

/// The configurations of the enabled webhooks, trusting the CAs of `stored`; those of the others deleted.
async fn trust(
    client: &Client,
    settings: &Settings,
    stored: &tls::Stored,
) -> Result<(), tls::TlsError> {
    delete_unserved_configurations(client, Some(settings)).await?;
    apply_configurations(client, settings, &stored.ca_bundle).await
}

async fn apply_configurations(
    client: &Client,
    settings: &Settings,
    ca_bundle: &str,
) -> Result<(), tls::TlsError> {
    for configuration in configurations(settings, ca_bundle) {
        tls::apply_configuration(client, &configuration).await?;
    }
    Ok(())
}

/// The configurations of the enabled webhooks (pure).
fn configurations(settings: &Settings, ca_bundle: &str) -> Vec<Value> {
    let hami = settings.hami.then(|| {
        tls::configuration(
            CONFIGURATION,
            PATH,
            &settings.endpoint,
            ca_bundle,
            &settings.hami_names,
        )
    });
    let evictions = settings
        .node_bound_evictions
        .then(|| eviction::configuration(&settings.namespace, &settings.endpoint, ca_bundle));
    hami.into_iter().chain(evictions).collect()
}

/// `attempt` until it succeeds; each failure is logged and followed by a longer wait (the watches' backoff).
// A closure returning a future rather than an async closure: the latter's future is not `Send` for every
// lifetime it borrows, and `run` must be spawned.
async fn retrying<T, E: Display, F: Future<Output = Result<T, E>>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> T {
    let mut backoff = DefaultBackoff::default();
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(error) => {
                let delay = backoff.next().unwrap_or(MAX_RETRY_DELAY);
                warn!(%error, ?delay, "cannot {what}; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use time::OffsetDateTime;
    use tokio::time::Instant;

    use super::*;
    use api_test_kit::{Answer, FakeApi, expect};

    #[tokio::test(start_paused = true)]
    async fn failures_are_retried_with_growing_waits_until_one_succeeds() {
        let started = Instant::now();
        let mut attempts = Vec::new();
        let attempted = retrying("count", || {
            attempts.push(started.elapsed());
            std::future::ready(if attempts.len() < 4 {
                Err("not yet")
            } else {
                Ok(attempts.len())
            })
        })
        .await;
        assert_eq!(attempted, 4);
        let waits: Vec<Duration> = attempts.windows(2).map(|pair| pair[1] - pair[0]).collect();
        assert!(
            waits[0] >= Duration::from_millis(800) && waits.windows(2).all(|w| w[1] >= w[0]),
            "{waits:?}"
        );
    }

    #[tokio::test]
    async fn run_can_be_spawned() {
        fn spawnable<T: Future + Send + 'static>(_: &T) {}
        let (_, client) = FakeApi::start();
        let settings = Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            namespace: "gpu-operator".into(),
            endpoint: tls::Endpoint::Url("https://127.0.0.1:9443".into()),
            hami: true,
            hami_names: hami::ResourceNames::default(),
            mig_without_dynamic_mig: hami::MigWithoutDynamicMig::Refuse,
            node_bound_evictions: true,
            templates_unused_for: template_gc::UNUSED_FOR,
            templates_sweep_every: template_gc::SWEEP_EVERY,
        };
        let readiness = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (_, leading) = watch::channel(false);
        spawnable(&run(client, settings, leading, move || {
            readiness.store(true, std::sync::atomic::Ordering::Release)
        }));
    }

    #[tokio::test]
    async fn set_up_replaces_an_unusable_secret_and_the_api_server_trusts_the_new_ca() {
        const MUTATING: &str =
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpu-operator-hami";
        const VALIDATING: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/gpu-operator-node-bound-evictions";
        let secret = "/api/v1/namespaces/gpu-operator/secrets/gpu-operator-webhook-tls";
        let (api, client) = FakeApi::scripted(vec![
            expect(
                Method::GET,
                secret,
                Answer::Json(
                    200,
                    serde_json::json!({
                        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                        "metadata": {"name": SECRET, "resourceVersion": "3"},
                        "data": {"tls.crt": "bm90IGEgY2VydGlmaWNhdGU=", "tls.key": "", "ca.crt": ""},
                    }),
                ),
            ),
            expect(Method::PUT, secret, Answer::Echo),
            expect(Method::GET, MUTATING, Answer::Error(404, "NotFound")),
            expect(Method::PATCH, MUTATING, Answer::Echo),
            expect(Method::GET, VALIDATING, Answer::Error(404, "NotFound")),
            expect(Method::PATCH, VALIDATING, Answer::Echo),
        ]);
        let settings = Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            namespace: "gpu-operator".into(),
            endpoint: tls::Endpoint::Url("https://127.0.0.1:9443".into()),
            hami: true,
            hami_names: hami::ResourceNames::default(),
            mig_without_dynamic_mig: hami::MigWithoutDynamicMig::Refuse,
            node_bound_evictions: true,
            templates_unused_for: template_gc::UNUSED_FOR,
            templates_sweep_every: template_gc::SWEEP_EVERY,
        };
        let hosts = settings.endpoint.hosts();
        let (stored, _, _) = set_up(&client, &settings, &hosts).await.unwrap();
        trust(&client, &settings, &stored).await.unwrap();
        let received = api.finish();
        assert_eq!(received[1].body["metadata"]["resourceVersion"], "3");
        let applied = received[2..]
            .iter()
            .filter(|request| request.method == Method::PATCH);
        for configuration in applied {
            assert_eq!(
                configuration.body["webhooks"][0]["clientConfig"]["caBundle"],
                base64_of(&stored.material.ca_pem)
            );
        }
        assert!(
            !certs::needs_renewal(&stored.material, &hosts, OffsetDateTime::now_utc()).unwrap()
        );
    }

    fn base64_of(text: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(text)
    }
}

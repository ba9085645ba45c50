//! The webhook's HTTPS server: an axum router behind rustls, whose certificate can be replaced while it serves (a
//! renewed certificate is picked up by the next handshake, without a restart).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use super::certs::TlsMaterial;

/// Why the server cannot start or take a certificate.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The certificate or key is not usable PEM.
    #[error("the webhook certificate or key is not usable: {0}")]
    Material(String),
    /// The address cannot be bound.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// The certificate the server presents now.
#[derive(Debug, Clone)]
pub struct ServingCert(Arc<RwLock<Arc<CertifiedKey>>>);

impl ServingCert {
    /// Starts with `material`.
    ///
    /// # Errors
    /// When the material cannot be read.
    pub fn new(material: &TlsMaterial) -> Result<Self, ServerError> {
        Ok(Self(Arc::new(RwLock::new(certified(material)?))))
    }

    /// Presents `material` from the next handshake on.
    ///
    /// # Errors
    /// When the material cannot be read; the previous one stays.
    pub fn replace(&self, material: &TlsMaterial) -> Result<(), ServerError> {
        let key = certified(material)?;
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = key;
        Ok(())
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }
}

fn certified(material: &TlsMaterial) -> Result<Arc<CertifiedKey>, ServerError> {
    let bad = |error: &dyn std::fmt::Display| ServerError::Material(error.to_string());
    let chain = CertificateDer::pem_slice_iter(material.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| bad(&error))?;
    let key =
        PrivateKeyDer::from_pem_slice(material.key_pem.as_bytes()).map_err(|error| bad(&error))?;
    let signing = any_supported_type(&key).map_err(|error| bad(&error))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

/// Serves `router` over HTTPS on `address` with the certificate `cert` holds, until the process ends.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(
    address: SocketAddr,
    cert: ServingCert,
    router: Router,
) -> Result<(), ServerError> {
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|error| ServerError::Material(error.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(cert));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| ServerError::Listen { address, source })?;
    loop {
        let Ok((tcp, peer)) = listener.accept().await else {
            continue;
        };
        let (acceptor, router) = (acceptor.clone(), router.clone());
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(error) => {
                    debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
            };
            let service = TowerToHyperService::new(router);
            if let Err(error) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                debug!(%peer, %error, "webhook connection ended");
            }
        });
    }
}

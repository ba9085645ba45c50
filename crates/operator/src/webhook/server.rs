//! The webhook's HTTPS server: an axum router behind rustls, whose certificate can be replaced while it serves (a
//! renewed certificate is picked up by the next handshake, without a restart).
//!
//! Every wait a client can cause is bounded ([`Limits`]): the TLS handshake, the request headers (also between
//! requests on a kept-alive connection), the whole request, its body's size, and how many connections are open at
//! once (more wait in the listen backlog). It speaks HTTP/1.1 only: there the header timeout covers every idle
//! moment of a connection, where HTTP/2 would keep a silent connection (and its slot) forever; the API server falls
//! back to HTTP/1.1 when the webhook does not offer HTTP/2 over ALPN.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use super::certs::{self, CertError, TlsMaterial};

/// Why the server cannot take a certificate or be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The certificate or key is not usable.
    #[error("the webhook certificate is not usable: {0}")]
    Material(#[from] CertError),
    /// rustls refused the configuration.
    #[error("cannot configure TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// What one client may take of the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// From the TCP connection to the end of the TLS handshake.
    pub handshake: Duration,
    /// To read a request's headers, and to wait for the next request on a kept-alive connection.
    pub headers: Duration,
    /// From the headers to the response: reading the body and answering it.
    pub request: Duration,
    /// The largest request body.
    pub body_bytes: usize,
    /// Connections open at once, from accept to close.
    pub connections: usize,
}

impl Default for Limits {
    /// The API server gives up on a webhook call after the configuration's `timeoutSeconds`, so no phase of a call
    /// may take longer. It refuses request bodies over 3 MiB, so no pod it would store is larger; the review
    /// re-encodes the pod as JSON (which may be longer than the YAML or protobuf it came in) beside the request's
    /// metadata, hence 4 MiB. The API server's replicas call over a few kept-alive connections each; 128 leaves
    /// them ample room while bounding what other clients can hold.
    fn default() -> Self {
        Self {
            handshake: super::API_SERVER_TIMEOUT,
            headers: super::API_SERVER_TIMEOUT,
            request: super::API_SERVER_TIMEOUT,
            body_bytes: 4 << 20,
            connections: 128,
        }
    }
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
        Ok(Self(Arc::new(RwLock::new(certs::certified_key(material)?))))
    }

    /// Presents `material` from the next handshake on.
    ///
    /// # Errors
    /// When the material cannot be read; the previous one stays.
    pub fn replace(&self, material: &TlsMaterial) -> Result<(), ServerError> {
        let key = certs::certified_key(material)?;
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

/// The TLS side of the server, presenting what `cert` holds.
///
/// # Errors
/// When rustls refuses the configuration.
pub fn acceptor(cert: &ServingCert) -> Result<TlsAcceptor, ServerError> {
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(cert.clone()));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `router` over HTTPS on `listener` within `limits`; never returns.
pub async fn serve(listener: TcpListener, acceptor: TlsAcceptor, router: Router, limits: &Limits) {
    let router = router
        .layer(middleware::from_fn_with_state(limits.request, bounded))
        .layer(DefaultBodyLimit::max(limits.body_bytes));
    let mut http = auto::Builder::new(TokioExecutor::new()).http1_only();
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.headers);
    let http = Arc::new(http);
    let slots = Arc::new(Semaphore::new(limits.connections));
    loop {
        // A slot before the accept: past the limit, connections wait in the kernel's backlog.
        let slot = (slots.clone().acquire_owned().await).expect("the semaphore is never closed");
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, most likely: accepting again at once would spin.
                warn!(%error, "cannot accept a webhook connection; pausing");
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        let (acceptor, router, http, handshake) = (
            acceptor.clone(),
            router.clone(),
            http.clone(),
            limits.handshake,
        );
        tokio::spawn(async move {
            let _slot = slot;
            let tls = match tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    debug!(%peer, ?handshake, "TLS handshake timed out");
                    return;
                }
            };
            let service = TowerToHyperService::new(router);
            if let Err(error) = http.serve_connection(TokioIo::new(tls), service).await {
                debug!(%peer, %error, "webhook connection ended");
            }
        });
    }
}

/// How long the server waits after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Answers 503 when a request (its body and its handling) outlasts `limit`: the API server has given up on it
/// by then, and the handler's work is dropped.
async fn bounded(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            warn!(?limit, "an admission request took too long; answered 503");
            (StatusCode::SERVICE_UNAVAILABLE, "the request took too long").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::pin::pin;
    use std::time::Instant;

    use axum::body::Bytes;
    use axum::routing::post;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use rustls::{ClientConfig, RootCertStore};
    use time::OffsetDateTime;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::task::JoinHandle;
    use tokio::time::timeout;
    use tokio_rustls::TlsConnector;
    use tokio_rustls::client::TlsStream;

    use super::*;

    /// Long enough never to end a test by itself.
    const LONG: Duration = Duration::from_secs(5);
    /// The limit a test waits out.
    const SHORT: Duration = Duration::from_millis(200);

    fn limits() -> Limits {
        Limits {
            handshake: LONG,
            headers: LONG,
            request: LONG,
            body_bytes: 1024,
            connections: 8,
        }
    }

    /// The server on a free port of 127.0.0.1, with `POST /echo` answering its body's length and `POST /slow`
    /// answering after a minute.
    struct Running {
        address: SocketAddr,
        ca: String,
        server: JoinHandle<()>,
    }

    impl Drop for Running {
        fn drop(&mut self) {
            self.server.abort();
        }
    }

    impl Running {
        async fn start(limits: Limits) -> Self {
            let material =
                certs::generate(&["127.0.0.1".into()], OffsetDateTime::now_utc()).unwrap();
            let acceptor = acceptor(&ServingCert::new(&material).unwrap()).unwrap();
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let router = Router::new()
                .route(
                    "/echo",
                    post(|body: Bytes| async move { body.len().to_string() }),
                )
                .route(
                    "/slow",
                    post(|| async {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        "late"
                    }),
                );
            let server =
                tokio::spawn(async move { serve(listener, acceptor, router, &limits).await });
            Self {
                address,
                ca: material.ca_pem,
                server,
            }
        }

        async fn connect(&self) -> TlsStream<TcpStream> {
            let mut roots = RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(self.ca.as_bytes()).unwrap())
                .unwrap();
            let config = ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
            let tcp = TcpStream::connect(self.address).await.unwrap();
            TlsConnector::from(Arc::new(config))
                .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
                .await
                .unwrap()
        }

        /// `POST path` saying `length` bytes follow, then `body`; the response's status line.
        async fn post(&self, path: &str, length: usize, body: &[u8]) -> String {
            let mut tls = self.connect().await;
            let head = format!(
                "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {length}\r\nconnection: close\r\n\r\n"
            );
            tls.write_all(head.as_bytes()).await.unwrap();
            // The server may answer and close before it has read the body.
            let _ = tls.write_all(body).await;
            let mut response = Vec::new();
            let _ = tls.read_to_end(&mut response).await;
            String::from_utf8_lossy(&response)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned()
        }
    }

    /// How long until the server closes `stream`, which sends nothing.
    async fn closed_after<S: tokio::io::AsyncRead + Unpin>(mut stream: S) -> Duration {
        let started = Instant::now();
        let mut buffer = [0; 64];
        let read = timeout(LONG, stream.read(&mut buffer))
            .await
            .expect("the server keeps a silent connection open");
        assert!(!matches!(read, Ok(n) if n > 0), "the server sent {read:?}");
        started.elapsed()
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_and_one_at_it_is_served() {
        let running = Running::start(limits()).await;
        assert_eq!(
            running.post("/echo", 1024, &[b'x'; 1024]).await,
            "HTTP/1.1 200 OK"
        );
        assert_eq!(
            running.post("/echo", 1025, &[b'x'; 1025]).await,
            "HTTP/1.1 413 Payload Too Large"
        );
    }

    #[tokio::test]
    async fn a_request_over_its_time_is_answered_503() {
        let running = Running::start(Limits {
            request: SHORT,
            ..limits()
        })
        .await;
        let started = Instant::now();
        assert_eq!(
            running.post("/slow", 0, b"").await,
            "HTTP/1.1 503 Service Unavailable"
        );
        assert!(started.elapsed() < LONG);
    }

    #[tokio::test]
    async fn a_client_silent_in_the_handshake_is_dropped() {
        let running = Running::start(Limits {
            handshake: SHORT,
            ..limits()
        })
        .await;
        let silent = TcpStream::connect(running.address).await.unwrap();
        assert!(closed_after(silent).await >= SHORT);
    }

    #[tokio::test]
    async fn a_client_silent_after_the_handshake_is_dropped() {
        let running = Running::start(Limits {
            headers: SHORT,
            ..limits()
        })
        .await;
        let silent = running.connect().await;
        assert!(closed_after(silent).await >= SHORT);
    }

    #[tokio::test]
    async fn connections_past_the_cap_wait_for_a_free_slot() {
        let running = Running::start(Limits {
            connections: 1,
            ..limits()
        })
        .await;
        let silent = TcpStream::connect(running.address).await.unwrap();
        let mut served = pin!(running.post("/echo", 2, b"ok"));
        assert!(
            timeout(SHORT, &mut served).await.is_err(),
            "a second connection was served past the cap of one"
        );
        drop(silent);
        assert_eq!(
            timeout(LONG, served).await.expect("the slot was freed"),
            "HTTP/1.1 200 OK"
        );
    }
}

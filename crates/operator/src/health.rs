//! The operator's HTTP endpoints: `/healthz` answers while the process runs, `/readyz` once start-up (applying
//! the CRDs, syncing the caches) has finished, `/metrics` in Prometheus' text format.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;

/// Shared readiness flag, set once the operator can do its work.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[derive(Clone, Debug)]
struct Endpoints {
    readiness: Readiness,
    metrics: Arc<Metrics>,
}

pub fn router(readiness: Readiness, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(Endpoints { readiness, metrics })
}

async fn metrics_text(
    State(endpoints): State<Endpoints>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        endpoints.metrics.encode(),
    )
}

async fn readyz(State(endpoints): State<Endpoints>) -> (StatusCode, &'static str) {
    if endpoints.readiness.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// Serves the probe endpoints until the shutdown future completes.
pub async fn serve(
    address: SocketAddr,
    readiness: Readiness,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    axum::serve(listener, router(readiness, metrics))
        .with_graceful_shutdown(shutdown)
        .await
}

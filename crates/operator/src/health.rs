//! The operator's HTTP endpoints and what they judge.
//!
//! - `/readyz`: this replica can do its part: its watch caches hold their first full list and, when the HAMi webhook
//!   is on, the webhook serves. Not leadership: every replica keeps its caches warm and serves the webhook, so that a
//!   rollout's new pod becomes Ready while the old one still leads, and takes over as soon as the old one steps down
//!   (readiness from leadership deadlocked `kubectl rollout restart`: the new pod could not become Ready while the
//!   old one held the lease, and the old one was not stopped until the new one was Ready).
//! - `/healthz`: the controller makes progress: no reconcile has run longer than [`STUCK_RECONCILE`] and no watch
//!   has failed without a success for longer than [`FAILING_WATCH`]. The kubelet restarts a replica that is not.
//! - `/metrics`: Prometheus' text format.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;

/// A reconcile running longer than this is stuck: every request it makes has a timeout far below it.
pub const STUCK_RECONCILE: Duration = Duration::from_secs(300);
/// A watch that has failed this long without one success does not recover by itself (a connection pool or a
/// credential gone bad); a restart gets new ones. An API server down for a minute or two does not trip it.
pub const FAILING_WATCH: Duration = Duration::from_secs(300);

/// What the probes read, written by the controller, its watches and the webhook.
#[derive(Debug)]
pub struct Health {
    caches_synced: AtomicBool,
    /// `None` when the webhook is off; else whether it serves.
    webhook_serving: Option<AtomicBool>,
    /// When the reconcile in flight started.
    reconcile_started: Mutex<Option<Instant>>,
    /// Since when each failing watch has failed, by the kind it watches.
    failing_watches: Mutex<BTreeMap<String, Instant>>,
}

impl Health {
    /// Health of a replica that serves the webhook (`webhook`) or not.
    pub fn new(webhook: bool) -> Arc<Self> {
        Arc::new(Self {
            caches_synced: AtomicBool::new(false),
            webhook_serving: webhook.then(|| AtomicBool::new(false)),
            reconcile_started: Mutex::new(None),
            failing_watches: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn set_caches_synced(&self) {
        self.caches_synced.store(true, Ordering::Release);
    }

    pub fn set_webhook_serving(&self, serving: bool) {
        if let Some(flag) = &self.webhook_serving {
            flag.store(serving, Ordering::Release);
        }
    }

    /// Marks a reconcile in flight until the guard is dropped.
    pub fn reconciling(self: &Arc<Self>) -> ReconcileGuard {
        if let Ok(mut started) = self.reconcile_started.lock() {
            *started = Some(Instant::now());
        }
        ReconcileGuard(self.clone())
    }

    /// Records one result of the watch of `kind`: an error starts (or continues) its failing time, a success ends it.
    pub fn observe_watch<T, E>(&self, kind: &str, result: &Result<T, E>) {
        let Ok(mut failing) = self.failing_watches.lock() else {
            return;
        };
        match result {
            Ok(_) => {
                failing.remove(kind);
            }
            Err(_) => {
                if !failing.contains_key(kind) {
                    failing.insert(kind.to_owned(), Instant::now());
                }
            }
        }
    }

    /// `Err` with what is missing when this replica cannot do its part yet.
    pub fn readiness(&self) -> Result<(), String> {
        let mut missing = Vec::new();
        if !self.caches_synced.load(Ordering::Acquire) {
            missing.push("the watch caches have not synced");
        }
        if let Some(serving) = &self.webhook_serving
            && !serving.load(Ordering::Acquire)
        {
            missing.push("the HAMi webhook is not serving");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; "))
        }
    }

    /// `Err` with the reason when the controller has stopped making progress at `now`.
    pub fn liveness(&self, now: Instant) -> Result<(), String> {
        let reconcile_started = self.reconcile_started.lock().ok().and_then(|s| *s);
        let failing = self
            .failing_watches
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        judge_liveness(reconcile_started, &failing, now)
    }
}

/// Clears the reconcile in flight when dropped (the reconcile ended, or was cancelled).
#[derive(Debug)]
pub struct ReconcileGuard(Arc<Health>);

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        if let Ok(mut started) = self.0.reconcile_started.lock() {
            *started = None;
        }
    }
}

/// Pure judgement of liveness from the reconcile in flight and the failing watches.
fn judge_liveness(
    reconcile_started: Option<Instant>,
    failing_watches: &BTreeMap<String, Instant>,
    now: Instant,
) -> Result<(), String> {
    let mut problems = Vec::new();
    if let Some(started) = reconcile_started {
        let running = now.saturating_duration_since(started);
        if running > STUCK_RECONCILE {
            problems.push(format!(
                "a reconcile has run for {} s (limit {} s)",
                running.as_secs(),
                STUCK_RECONCILE.as_secs()
            ));
        }
    }
    for (kind, since) in failing_watches {
        let failing = now.saturating_duration_since(*since);
        if failing > FAILING_WATCH {
            problems.push(format!(
                "the watch of {kind} has failed for {} s without a success (limit {} s)",
                failing.as_secs(),
                FAILING_WATCH.as_secs()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[derive(Clone, Debug)]
struct Endpoints {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

pub fn router(health: Arc<Health>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(Endpoints { health, metrics })
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

fn answer(judgement: Result<(), String>, ok: &'static str) -> (StatusCode, String) {
    match judgement {
        Ok(()) => (StatusCode::OK, ok.into()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason),
    }
}

async fn readyz(State(endpoints): State<Endpoints>) -> (StatusCode, String) {
    answer(endpoints.health.readiness(), "ready")
}

async fn healthz(State(endpoints): State<Endpoints>) -> (StatusCode, String) {
    answer(endpoints.health.liveness(Instant::now()), "ok")
}

/// Serves the probe endpoints until the shutdown future completes.
pub async fn serve(
    address: SocketAddr,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    axum::serve(listener, router(health, metrics))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_caches_synced_and_the_webhook_serves_whoever_leads() {
        let health = Health::new(true);
        assert_eq!(
            health.readiness(),
            Err("the watch caches have not synced; the HAMi webhook is not serving".into())
        );
        health.set_caches_synced();
        assert_eq!(
            health.readiness(),
            Err("the HAMi webhook is not serving".into())
        );
        health.set_webhook_serving(true);
        assert_eq!(health.readiness(), Ok(()));

        let without_webhook = Health::new(false);
        without_webhook.set_caches_synced();
        assert_eq!(without_webhook.readiness(), Ok(()));
    }

    #[test]
    fn a_stuck_reconcile_fails_liveness_and_an_ended_one_does_not() {
        let health = Health::new(false);
        let guard = health.reconciling();
        let now = Instant::now();
        assert_eq!(health.liveness(now), Ok(()));
        let later = now + STUCK_RECONCILE + Duration::from_secs(1);
        let stuck = health.liveness(later).unwrap_err();
        assert!(stuck.contains("a reconcile has run for 30"), "{stuck}");
        drop(guard);
        assert_eq!(health.liveness(later), Ok(()), "the reconcile ended");
    }

    #[test]
    fn a_watch_failing_past_the_limit_fails_liveness_until_it_succeeds() {
        let health = Health::new(false);
        let failed: Result<(), &str> = Err("connection refused");
        health.observe_watch("GPUNode", &failed);
        health.observe_watch("GPUNode", &failed);
        let now = Instant::now();
        assert_eq!(health.liveness(now), Ok(()), "a short outage");
        let later = now + FAILING_WATCH + Duration::from_secs(1);
        let problem = health.liveness(later).unwrap_err();
        assert!(
            problem.contains("the watch of GPUNode has failed"),
            "{problem}"
        );
        health.observe_watch("GPUNode", &Ok::<(), &str>(()));
        assert_eq!(health.liveness(later), Ok(()));
    }
}

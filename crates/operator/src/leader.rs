//! Leader election through a coordination.k8s.io Lease, so that two operator replicas never reconcile at once.
//!
//! As client-go's leader election does:
//! - a candidate judges a lease expired by its own clock: from when it last saw the lease's record change, not from
//!   the holder's `renewTime` (the two machines' clocks may differ by more than the lease);
//! - the holder renews every [`RETRY_PERIOD`] and steps down when no renewal has succeeded for [`RENEW_DEADLINE`],
//!   which is shorter than [`LEASE_DURATION`]: it stops leading before any candidate may take over;
//! - every request has a timeout, so a hung connection cannot hold a renewal past the deadline;
//! - writes carry the lease's resourceVersion, so two candidates racing for an expired lease cannot both win;
//! - a holder that stops (SIGTERM in a rollout) releases the lease, and a candidate takes a released lease at once.
//!
//! A renewal is one request: the holder writes the lease it last wrote with a new `renewTime`; only a conflict
//! (someone else wrote the lease) costs a read.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::Mutex;
use tracing::{info, warn};

/// How long a lease is valid without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long the holder keeps leading without a successful renewal.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the holder renews, and a candidate retries.
pub const RETRY_PERIOD: Duration = Duration::from_secs(3);
/// The longest any one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lease {name}: {source}")]
    Api { name: String, source: kube::Error },
    #[error("lease {name}: no answer within {} s", REQUEST_TIMEOUT.as_secs())]
    Timeout { name: String },
    #[error("lost the lease {name} to {holder}")]
    Lost { name: String, holder: String },
    #[error(
        "could not renew the lease {name} for {} s; stepping down before another replica may take over",
        RENEW_DEADLINE.as_secs()
    )]
    RenewDeadline { name: String },
}

/// What a candidate should do with a lease as it stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or its holder let it expire: take it over.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds a live lease.
    Wait { holder: String },
}

/// Pure decision on a lease's spec. `unchanged_for` is how long, by this process' clock, the lease's record
/// (holder and renew time) has been as it is now.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> Decision {
    let Some(spec) = spec else {
        return Decision::Acquire;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == identity {
        return Decision::Renew;
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|seconds| u64::try_from(seconds).ok())
        .map_or(LEASE_DURATION, Duration::from_secs);
    if holder.is_empty() || unchanged_for > duration {
        Decision::Acquire
    } else {
        Decision::Wait { holder }
    }
}

/// `lease` given up: no holder, and a one-second duration from now, so that a candidate takes it at once.
fn released(mut lease: Lease) -> Lease {
    let now = MicroTime(Timestamp::now());
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
    }
    lease
}

/// Who holds `lease` ("" for nobody).
fn holder_of(lease: &Lease) -> &str {
    lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.as_deref())
        .unwrap_or_default()
}

/// The lease's record as last seen, and when this process first saw it so.
#[derive(Debug)]
struct Observed {
    record: (Option<String>, Option<MicroTime>),
    since: Instant,
}

/// The elector's memory between rounds.
#[derive(Debug, Default)]
struct State {
    observed: Option<Observed>,
    /// The lease as this process last wrote it, while it leads.
    held: Option<Lease>,
}

#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    state: Mutex<State>,
}

impl LeaderElector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str) -> Self {
        Self {
            api,
            name: name.into(),
            identity: identity.into(),
            state: Mutex::default(),
        }
    }

    /// Waits until this process holds the lease. Failed requests are retried.
    pub async fn acquire(&self) {
        let mut announced = None;
        loop {
            match self.try_acquire().await {
                Ok(Decision::Acquire | Decision::Renew) => {
                    info!(lease = %self.name, identity = %self.identity, "became the leader");
                    return;
                }
                Ok(Decision::Wait { holder }) => {
                    if announced.as_ref() != Some(&holder) {
                        info!(lease = %self.name, %holder, "another replica leads; waiting");
                        announced = Some(holder);
                    }
                }
                Err(error) => warn!(%error, "reading the lease failed; retrying"),
            }
            tokio::time::sleep(RETRY_PERIOD).await;
        }
    }

    /// Renews the lease until it is lost or cannot be renewed within [`RENEW_DEADLINE`]; returns why. The deadline
    /// is its own timer, so a renewal hanging in a request cannot hold this replica past it.
    pub async fn keep(&self) -> LeaderError {
        let mut renewed = tokio::time::Instant::now();
        loop {
            let attempt = async {
                tokio::time::sleep(RETRY_PERIOD).await;
                self.renew().await
            };
            tokio::select! {
                result = attempt => match result {
                    Ok(()) => renewed = tokio::time::Instant::now(),
                    Err(lost @ LeaderError::Lost { .. }) => return lost,
                    Err(error) => {
                        warn!(%error, "renewing the lease failed; retrying until the renew deadline");
                    }
                },
                () = tokio::time::sleep_until(renewed + RENEW_DEADLINE) => {
                    return LeaderError::RenewDeadline {
                        name: self.name.clone(),
                    };
                }
            }
        }
    }

    /// Gives the lease up, so that a waiting replica takes over at once rather than after the lease expires.
    pub async fn release(&self) {
        let Some(lease) = self.state.lock().await.held.take() else {
            return;
        };
        let released = match self.replace(&released(lease)).await {
            // A renewal that the shutdown cut short may have been written after the copy held here: release the
            // lease as it stands, if it is still ours, rather than leave the next replica waiting for it to expire.
            Err(LeaderError::Api {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 409 => match self.get().await {
                Ok(Some(current)) if holder_of(&current) == self.identity => {
                    self.replace(&released(current)).await.map(drop)
                }
                Ok(_) => return,
                Err(error) => Err(error),
            },
            written => written.map(drop),
        };
        match released {
            Ok(()) => info!(lease = %self.name, "released the lease"),
            Err(error) => warn!(%error, "releasing the lease failed; it expires by itself"),
        }
    }

    /// One read-decide-write round of a candidate. A conflicting write (another candidate won the race) reads as
    /// Wait.
    async fn try_acquire(&self) -> Result<Decision, LeaderError> {
        let existing = self.get().await?;
        let mut state = self.state.lock().await;
        let unchanged_for = state.observe(existing.as_ref());
        let decision = decide(
            existing.as_ref().and_then(|l| l.spec.as_ref()),
            &self.identity,
            unchanged_for,
        );
        if let Decision::Wait { .. } = decision {
            return Ok(decision);
        }
        let lease = self.taken(existing.clone());
        let written = match existing {
            Some(_) => self.replace(&lease).await,
            None => self.create(&lease).await,
        };
        match written {
            Ok(lease) => {
                state.held = Some(lease);
                Ok(decision)
            }
            Err(LeaderError::Api {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 409 => Ok(Decision::Wait {
                holder: "another candidate".into(),
            }),
            Err(error) => Err(error),
        }
    }

    /// One renewal: the lease as last written, with a new renew time. On a conflict, the lease is read again and
    /// renewed once more if this process still holds it.
    async fn renew(&self) -> Result<(), LeaderError> {
        let mut state = self.state.lock().await;
        let mut lease = match state.held.clone() {
            Some(lease) => lease,
            None => self.get().await?.unwrap_or_default(),
        };
        let mut conflicts = 0;
        loop {
            if let Some(spec) = lease.spec.as_mut() {
                spec.renew_time = Some(MicroTime(Timestamp::now()));
            }
            match self.replace(&lease).await {
                Ok(written) => {
                    state.held = Some(written);
                    return Ok(());
                }
                Err(LeaderError::Api {
                    source: kube::Error::Api(status),
                    ..
                }) if status.code == 409 && conflicts == 0 => {
                    conflicts += 1;
                    let current = self.get().await?;
                    let holder = current
                        .as_ref()
                        .and_then(|l| l.spec.as_ref())
                        .and_then(|s| s.holder_identity.clone())
                        .unwrap_or_default();
                    if holder != self.identity {
                        state.held = None;
                        return Err(LeaderError::Lost {
                            name: self.name.clone(),
                            holder,
                        });
                    }
                    // Still ours (someone wrote its metadata): renew the current version.
                    lease = current.unwrap_or_default();
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The lease as this process takes it over from `existing`.
    fn taken(&self, existing: Option<Lease>) -> Lease {
        let now = MicroTime(Timestamp::now());
        let had_holder = existing.is_some();
        let mut lease = existing.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        let previous = lease.spec.take().unwrap_or_default();
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            renew_time: Some(now.clone()),
            acquire_time: Some(now),
            lease_transitions: Some(
                previous.lease_transitions.unwrap_or(0) + i32::from(had_holder),
            ),
            ..previous
        });
        lease
    }

    async fn get(&self) -> Result<Option<Lease>, LeaderError> {
        self.bounded(self.api.get_opt(&self.name)).await
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaderError> {
        self.bounded(self.api.replace(&self.name, &PostParams::default(), lease))
            .await
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, LeaderError> {
        self.bounded(self.api.create(&PostParams::default(), lease))
            .await
    }

    /// A request with [`REQUEST_TIMEOUT`].
    async fn bounded<T>(
        &self,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LeaderError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
            Ok(result) => result.map_err(|source| LeaderError::Api {
                name: self.name.clone(),
                source,
            }),
            Err(_) => Err(LeaderError::Timeout {
                name: self.name.clone(),
            }),
        }
    }
}

impl State {
    /// Notes the lease as read now; returns how long its record has been unchanged by this process' clock.
    fn observe(&mut self, lease: Option<&Lease>) -> Duration {
        let spec = lease.and_then(|l| l.spec.as_ref());
        let record = (
            spec.and_then(|s| s.holder_identity.clone()),
            spec.and_then(|s| s.renew_time.clone()),
        );
        match &self.observed {
            Some(observed) if observed.record == record => observed.since.elapsed(),
            _ => {
                self.observed = Some(Observed {
                    record,
                    since: Instant::now(),
                });
                Duration::ZERO
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn decisions_by_the_local_clock() {
        let seconds = Duration::from_secs;
        assert_eq!(decide(None, "a", seconds(0)), Decision::Acquire);
        assert_eq!(
            decide(Some(&lease("a", 999)), "a", seconds(0)),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&lease("b", 990)), "a", seconds(10)),
            Decision::Wait { holder: "b".into() }
        );
        assert_eq!(
            decide(Some(&lease("b", 990)), "a", seconds(16)),
            Decision::Acquire,
            "unchanged for longer than the lease"
        );
        assert_eq!(
            decide(Some(&lease("", 999)), "a", seconds(0)),
            Decision::Acquire,
            "released"
        );
    }

    #[test]
    fn a_renew_time_from_a_skewed_clock_does_not_expire_a_live_lease() {
        // The holder's clock is an hour behind: its renew time looks ancient, but it changes with every renewal.
        let mut state = State::default();
        let first = Lease {
            spec: Some(lease("b", 1)),
            ..Lease::default()
        };
        assert_eq!(state.observe(Some(&first)), Duration::ZERO);
        let renewed = Lease {
            spec: Some(lease("b", 4)),
            ..Lease::default()
        };
        let unchanged_for = state.observe(Some(&renewed));
        assert_eq!(
            unchanged_for,
            Duration::ZERO,
            "a renewal restarts the clock"
        );
        assert_eq!(
            decide(renewed.spec.as_ref(), "a", unchanged_for),
            Decision::Wait { holder: "b".into() }
        );
    }

    #[test]
    fn the_renew_deadline_comes_before_the_lease_expires() {
        assert!(RENEW_DEADLINE < LEASE_DURATION);
        // One renewal that hangs until its timeout leaves time for another before the deadline.
        assert!(RETRY_PERIOD + REQUEST_TIMEOUT < RENEW_DEADLINE);
    }
}

//! Leader election through a coordination.k8s.io Lease, so that two operator replicas never reconcile at once.
//! The holder renews the lease every few seconds; a candidate takes it over only once it has expired. Writes
//! carry the lease's resourceVersion, so two candidates racing for an expired lease cannot both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tracing::{info, warn};

/// How long a lease is valid without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews, and a candidate retries.
pub const RETRY_PERIOD: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lease {name}: {source}")]
    Api { name: String, source: kube::Error },
    #[error("lost the lease {name} to {holder}")]
    Lost { name: String, holder: String },
}

#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
}

/// What a candidate should do with a lease as it stands at `now`.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or its holder let it expire: take it over.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds a live lease.
    Wait { holder: String },
}

/// Pure decision on a lease's spec.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else {
        return Decision::Acquire;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == identity {
        return Decision::Renew;
    }
    let duration = spec
        .lease_duration_seconds
        .map_or(LEASE_DURATION.as_secs() as i64, i64::from);
    let renewed = spec
        .renew_time
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let expired = now.as_second() - renewed.as_second() > duration;
    if holder.is_empty() || expired {
        Decision::Acquire
    } else {
        Decision::Wait { holder }
    }
}

impl LeaderElector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str) -> Self {
        Self {
            api,
            name: name.into(),
            identity: identity.into(),
        }
    }

    /// Waits until this process holds the lease.
    pub async fn acquire(&self) -> Result<(), LeaderError> {
        let mut announced = false;
        loop {
            match self.try_once().await? {
                Decision::Acquire | Decision::Renew => {
                    info!(lease = %self.name, identity = %self.identity, "became the leader");
                    return Ok(());
                }
                Decision::Wait { holder } => {
                    if !announced {
                        info!(lease = %self.name, %holder, "another replica leads; waiting");
                        announced = true;
                    }
                    tokio::time::sleep(RETRY_PERIOD).await;
                }
            }
        }
    }

    /// Renews the lease until it is lost; returns the reason it was lost.
    pub async fn keep(&self) -> LeaderError {
        loop {
            tokio::time::sleep(RETRY_PERIOD).await;
            match self.try_once().await {
                Ok(Decision::Renew | Decision::Acquire) => {}
                Ok(Decision::Wait { holder }) => {
                    return LeaderError::Lost {
                        name: self.name.clone(),
                        holder,
                    };
                }
                Err(error) => warn!(%error, "renewing the lease failed; retrying until it expires"),
            }
        }
    }

    /// One read-decide-write round. A conflicting write (another candidate won the race) reads as Wait.
    async fn try_once(&self) -> Result<Decision, LeaderError> {
        let api_error = |source| LeaderError::Api {
            name: self.name.clone(),
            source,
        };
        let now = Timestamp::now();
        let existing = self.api.get_opt(&self.name).await.map_err(api_error)?;
        let decision = decide(
            existing.as_ref().and_then(|l| l.spec.as_ref()),
            &self.identity,
            now,
        );
        if let Decision::Wait { .. } = decision {
            return Ok(decision);
        }
        let previous = existing
            .as_ref()
            .and_then(|l| l.spec.clone())
            .unwrap_or_default();
        let taking_over = decision == Decision::Acquire;
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            renew_time: Some(MicroTime(now)),
            acquire_time: if taking_over {
                Some(MicroTime(now))
            } else {
                previous.acquire_time
            },
            lease_transitions: Some(
                previous.lease_transitions.unwrap_or(0)
                    + i32::from(taking_over && existing.is_some()),
            ),
            ..previous
        };
        let result = match existing {
            Some(mut lease) => {
                lease.spec = Some(spec);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
        };
        match result {
            Ok(_) => Ok(decision),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Decision::Wait {
                holder: "another candidate".into(),
            }),
            Err(source) => Err(api_error(source)),
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
    fn decisions() {
        let now = Timestamp::from_second(1_000).unwrap();
        assert_eq!(decide(None, "a", now), Decision::Acquire);
        assert_eq!(decide(Some(&lease("a", 999)), "a", now), Decision::Renew);
        assert_eq!(
            decide(Some(&lease("b", 990)), "a", now),
            Decision::Wait { holder: "b".into() }
        );
        assert_eq!(
            decide(Some(&lease("b", 900)), "a", now),
            Decision::Acquire,
            "expired"
        );
        assert_eq!(
            decide(Some(&lease("", 999)), "a", now),
            Decision::Acquire,
            "released"
        );
    }
}

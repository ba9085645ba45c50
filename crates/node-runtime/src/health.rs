//! Which GPUs are unhealthy, from the XID events the backend reports. Pure: the caller passes the clock in, and
//! only [`HealthArgs::tracker`] reads the environment (`DP_DISABLE_HEALTHCHECKS`). The device plugin and the DRA
//! driver judge health alike through it.
//!
//! Like NVIDIA's plugin, a critical XID marks the GPU (with its MIG devices and replicas) Unhealthy, and the XIDs
//! that applications cause (13, 31, 43, 45, 68, 109) are ignored; `DP_DISABLE_HEALTHCHECKS` turns checks off.
//! Unlike it, a GPU becomes Healthy again once no new XID arrived for a quiet period: a transient fault no longer
//! needs a plugin restart to give the GPU back to the scheduler. A quiet period of zero keeps the reference's
//! behaviour (never recover).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use gpu::HealthEvent;

/// XIDs caused by applications, not the GPU, ignored by default as in NVIDIA's plugin.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];
/// The environment variable that turns health checks off, NVIDIA's name.
pub const DISABLE_ENV: &str = "DP_DISABLE_HEALTHCHECKS";

/// What `DP_DISABLE_HEALTHCHECKS` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checks {
    /// No health checks: every device is always Healthy (`all` or `xids`).
    Off,
    /// XIDs mark devices Unhealthy, except these.
    Xids {
        /// Ignored XIDs: the application XIDs and those listed.
        ignored: BTreeSet<u64>,
    },
}

/// A `DP_DISABLE_HEALTHCHECKS` entry that is neither a keyword nor an XID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{DISABLE_ENV}: \"{0}\" is not valid (use all, xids, or a comma-separated list of XID numbers)"
)]
pub struct ChecksError(String);

impl Checks {
    /// Reads the value of `DP_DISABLE_HEALTHCHECKS` (unset or empty: the defaults).
    ///
    /// # Errors
    /// [`ChecksError`] for an entry that is neither `all`, `xids` nor a number.
    pub fn parse(value: Option<&str>) -> Result<Self, ChecksError> {
        let mut ignored: BTreeSet<u64> = APPLICATION_XIDS.into_iter().collect();
        for entry in value
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
        {
            match entry.to_ascii_lowercase().as_str() {
                // XIDs are the only check there is, so turning them off turns everything off.
                "all" | "xids" => return Ok(Self::Off),
                number => {
                    ignored.insert(number.parse().map_err(|_| ChecksError(entry.to_owned()))?);
                }
            }
        }
        Ok(Self::Xids { ignored })
    }
}

/// The Unhealthy GPUs by index, each with the XID of its last critical event (`None`: the driver gave no code).
pub type Faults = BTreeMap<u32, Option<u64>>;

/// How a node-side binary judges health: its quiet period, and `DP_DISABLE_HEALTHCHECKS` from the environment.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Seconds without a new XID after which an Unhealthy GPU is Healthy again; 0: never (as NVIDIA's plugin).
    #[arg(long, default_value_t = 60)]
    pub health_recovery_seconds: u64,
}

impl HealthArgs {
    /// A tracker with these settings and the checks `DP_DISABLE_HEALTHCHECKS` asks for.
    ///
    /// # Errors
    /// [`ChecksError`] when `DP_DISABLE_HEALTHCHECKS` is not valid.
    pub fn tracker(&self) -> Result<HealthTracker, ChecksError> {
        Ok(HealthTracker::new(
            Checks::parse(std::env::var(DISABLE_ENV).ok().as_deref())?,
            Duration::from_secs(self.health_recovery_seconds),
        ))
    }
}

/// The health of every GPU, as a function of the events seen so far and the time.
#[derive(Debug, Clone)]
pub struct HealthTracker {
    checks: Checks,
    /// How long without a new XID before a GPU is Healthy again; `None`: never.
    recovery: Option<Duration>,
    /// The last critical event per GPU index: when it came, and its XID (`None`: the driver gave no code).
    last_fault: BTreeMap<u32, (Instant, Option<u64>)>,
}

impl HealthTracker {
    /// A tracker where every GPU is Healthy. A zero `recovery` means a GPU never recovers.
    #[must_use]
    pub fn new(checks: Checks, recovery: Duration) -> Self {
        Self {
            checks,
            recovery: (!recovery.is_zero()).then_some(recovery),
            last_fault: BTreeMap::new(),
        }
    }

    /// Takes one event in; returns whether it counts (it is not ignored).
    pub fn record(&mut self, event: &HealthEvent, now: Instant) -> bool {
        let counts = match (&self.checks, event.xid) {
            (Checks::Off, _) => false,
            (Checks::Xids { ignored }, Some(xid)) => !ignored.contains(&xid),
            // An event without a code is a fault the driver could not classify: not one to ignore.
            (Checks::Xids { .. }, None) => true,
        };
        if counts {
            self.last_fault.insert(event.gpu_index, (now, event.xid));
        }
        counts
    }

    /// The GPUs that are Unhealthy at `now`.
    #[must_use]
    pub fn unhealthy(&self, now: Instant) -> BTreeSet<u32> {
        self.faults(now).into_keys().collect()
    }

    /// The GPUs that are Unhealthy at `now`, each with the XID of its last critical event.
    #[must_use]
    pub fn faults(&self, now: Instant) -> Faults {
        self.last_fault
            .iter()
            .filter(|(_, (since, _))| {
                self.recovery
                    .is_none_or(|quiet| now.saturating_duration_since(*since) < quiet)
            })
            .map(|(gpu, (_, xid))| (*gpu, *xid))
            .collect()
    }

    /// When the next Unhealthy GPU recovers, if one will: the caller wakes up then to report it.
    #[must_use]
    pub fn next_recovery(&self, now: Instant) -> Option<Instant> {
        let quiet = self.recovery?;
        self.last_fault
            .values()
            .map(|(since, _)| *since + quiet)
            .filter(|at| *at > now)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn critical_xids_mark_the_gpu_and_application_xids_do_not() {
        let start = Instant::now();
        let mut tracker = HealthTracker::new(Checks::parse(None).unwrap(), Duration::from_secs(60));
        for application in APPLICATION_XIDS {
            assert!(!tracker.record(&HealthEvent::xid(0, application), start));
        }
        assert!(tracker.unhealthy(start).is_empty());
        assert!(tracker.record(&HealthEvent::xid(2, 79), start));
        assert!(tracker.record(
            &HealthEvent {
                gpu_index: 3,
                xid: None
            },
            start
        ));
        assert_eq!(tracker.unhealthy(start), BTreeSet::from([2, 3]));
        assert_eq!(
            tracker.faults(start),
            Faults::from([(2, Some(79)), (3, None)])
        );
    }

    #[test]
    fn a_gpu_recovers_after_a_quiet_period_and_a_new_xid_restarts_it() {
        let start = Instant::now();
        let quiet = Duration::from_secs(60);
        let mut tracker = HealthTracker::new(Checks::parse(Some("")).unwrap(), quiet);
        tracker.record(&HealthEvent::xid(1, 48), start);
        assert_eq!(tracker.next_recovery(start), Some(start + quiet));
        tracker.record(&HealthEvent::xid(1, 48), start + Duration::from_secs(30));
        assert_eq!(tracker.unhealthy(start + quiet), BTreeSet::from([1]));
        let later = start + Duration::from_secs(90);
        assert!(tracker.unhealthy(later).is_empty());
        assert_eq!(tracker.next_recovery(later), None);
    }

    #[test]
    fn zero_quiet_period_never_recovers() {
        let start = Instant::now();
        let mut tracker = HealthTracker::new(Checks::parse(None).unwrap(), Duration::ZERO);
        tracker.record(&HealthEvent::xid(0, 79), start);
        assert_eq!(
            tracker.unhealthy(start + Duration::from_secs(86_400)),
            BTreeSet::from([0])
        );
        assert_eq!(tracker.next_recovery(start), None);
    }

    #[test]
    fn disable_variable_forms() {
        assert_eq!(Checks::parse(Some("all")).unwrap(), Checks::Off);
        assert_eq!(Checks::parse(Some("XIDs")).unwrap(), Checks::Off);
        let Checks::Xids { ignored } = Checks::parse(Some("48, 79")).unwrap() else {
            panic!("checks are on")
        };
        assert!(ignored.contains(&48) && ignored.contains(&79) && ignored.contains(&13));
        assert_eq!(
            Checks::parse(Some("48,gpu_lost")).unwrap_err().to_string(),
            "DP_DISABLE_HEALTHCHECKS: \"gpu_lost\" is not valid (use all, xids, or a comma-separated list of XID numbers)"
        );
        let mut off = HealthTracker::new(Checks::Off, Duration::from_secs(1));
        assert!(!off.record(&HealthEvent::xid(0, 79), Instant::now()));
    }
}

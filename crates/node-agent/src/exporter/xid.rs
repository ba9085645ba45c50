//! `DCGM_FI_DEV_XID_ERRORS`: the last critical XID of each GPU. DCGM's gauge keeps the last XID forever, so an
//! alert on it fires until the exporter restarts; ours goes back to 0 once a GPU has had no critical XID for a
//! quiet period (`--xid-clear-seconds`), which a repeated XID starts over.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpu::HealthEvent;

/// The XID gauge of every GPU, fed with the backend's health events at each collection.
#[derive(Debug, Clone)]
pub struct XidGauge {
    /// `None`: never cleared, as DCGM.
    quiet_period: Option<Duration>,
    /// GPU index → its last XID and when it came. Only GPUs with a current XID are kept, so this never grows past
    /// the GPU count.
    last: BTreeMap<u32, (u64, Instant)>,
}

impl XidGauge {
    /// A gauge whose XIDs clear after `quiet_period` without a new one; zero keeps them (DCGM's behaviour).
    #[must_use]
    pub fn new(quiet_period: Duration) -> Self {
        Self {
            quiet_period: (!quiet_period.is_zero()).then_some(quiet_period),
            last: BTreeMap::new(),
        }
    }

    /// Takes the events that arrived since the previous collection (the last one of a GPU wins), as seen `now`,
    /// and clears the XIDs whose quiet period is over. An event without an XID code leaves the gauge as it was: it
    /// has no value to show.
    pub fn record(&mut self, events: &[HealthEvent], now: Instant) {
        for event in events {
            if let Some(xid) = event.xid {
                self.last.insert(event.gpu_index, (xid, now));
            }
        }
        if let Some(quiet_period) = self.quiet_period {
            self.last
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < quiet_period);
        }
    }

    /// The gauge's value for a GPU: its current XID, or 0.
    #[must_use]
    pub fn value(&self, gpu: u32) -> u64 {
        self.last.get(&gpu).map_or(0, |(xid, _)| *xid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xid_shows_then_clears_after_the_quiet_period() {
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        let mut gauge = XidGauge::new(Duration::from_secs(300));
        gauge.record(&[], at(0));
        assert_eq!(gauge.value(0), 0);

        gauge.record(
            &[
                HealthEvent::xid(0, 48),
                HealthEvent::xid(1, 13),
                HealthEvent::xid(0, 79),
            ],
            at(10),
        );
        assert_eq!(
            (gauge.value(0), gauge.value(1), gauge.value(2)),
            (79, 13, 0)
        );

        // A repeat starts the quiet period over, for its GPU only.
        gauge.record(&[HealthEvent::xid(1, 13)], at(200));
        gauge.record(&[], at(309));
        assert_eq!((gauge.value(0), gauge.value(1)), (79, 13));
        gauge.record(&[], at(310));
        assert_eq!((gauge.value(0), gauge.value(1)), (0, 13));
        gauge.record(&[], at(500));
        assert_eq!(gauge.value(1), 0);
        assert!(gauge.last.is_empty());

        // An event without a code has no value to show.
        gauge.record(
            &[HealthEvent {
                gpu_index: 0,
                xid: None,
            }],
            at(600),
        );
        assert_eq!(gauge.value(0), 0);
    }

    #[test]
    fn zero_keeps_the_last_xid_as_dcgm() {
        let start = Instant::now();
        let mut gauge = XidGauge::new(Duration::ZERO);
        gauge.record(&[HealthEvent::xid(3, 94)], start);
        gauge.record(&[], start + Duration::from_secs(86_400 * 365));
        assert_eq!(gauge.value(3), 94);
    }
}

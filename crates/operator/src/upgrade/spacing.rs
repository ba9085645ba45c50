//! The least time between two driver upgrade passes.
//!
//! A pass reads every node, and every change of a node, a driver or validator pod, a DaemonSet or a GPUNode wakes
//! one. The controller runs one pass at a time and keeps one more queued, so under a stream of events passes run
//! back to back. At 5,000 nodes, during the operands' first rollout with the driver disabled,
//! that was more than half of the operator's CPU (`perf`: 54 % of 41 s, 42 % in one scan of every node's labels
//! per pass), on the two cores the cluster's own rollout runs on.
//!
//! So a pass starts no sooner than [`PASS_SPACING`] after the previous one ended. A pass woken at rest starts at
//! once; under a stream of events the passes come once a second, each seeing every change made in between. An
//! upgrade's steps wait for pods to drain, drivers to restart and validators to pass, seconds to minutes each: a
//! second more between passes does not slow them.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The least time from the end of one pass to the start of the next.
pub const PASS_SPACING: Duration = Duration::from_secs(1);

/// When the last pass ended.
#[derive(Debug)]
pub struct Spacing {
    least: Duration,
    last_end: Mutex<Option<Instant>>,
}

impl Spacing {
    #[must_use]
    pub fn new(least: Duration) -> Self {
        Self {
            least,
            last_end: Mutex::new(None),
        }
    }

    /// Waits until `least` has passed since the last pass ended (at once for the first pass).
    pub async fn wait(&self) {
        let last_end = self.last_end.lock().ok().and_then(|last| *last);
        if let Some(last_end) = last_end {
            tokio::time::sleep_until(last_end + self.least).await;
        }
    }

    /// Notes that a pass ended now, whatever its outcome.
    pub fn ended(&self) {
        if let Ok(mut last) = self.last_end.lock() {
            *last = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_pass_starts_at_once_and_the_next_a_spacing_after_the_last_ended() {
        let spacing = Spacing::new(Duration::from_secs(1));
        let start = Instant::now();
        spacing.wait().await;
        assert_eq!(start.elapsed(), Duration::ZERO, "nothing ran before");
        tokio::time::advance(Duration::from_millis(300)).await;
        spacing.ended();
        spacing.wait().await;
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(1300),
            "a second after the end"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_woken_long_after_the_last_starts_at_once() {
        let spacing = Spacing::new(Duration::from_secs(1));
        spacing.ended();
        tokio::time::advance(Duration::from_secs(5)).await;
        let woken = Instant::now();
        spacing.wait().await;
        assert_eq!(woken.elapsed(), Duration::ZERO);
    }
}

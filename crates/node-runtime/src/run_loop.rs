//! The loop every node role runs: take the latest inputs (a Node and its ConfigMap, a report to publish), do one
//! pass, and wait for the inputs to change. A pass that fails is retried with [`Backoff`], sooner when the inputs
//! change (new input makes retrying worthwhile). Inputs arrive through a `watch` channel, so a pass that takes a
//! while sees the newest inputs once, not every state in between; nothing polls unless the role asks for an
//! interval (MIG geometry and PCI facts have no change events).

use std::fmt::Display;
use std::time::Duration;

use tokio::sync::watch;
use tracing::warn;

/// Growing waits between retries of something that failed (1 s doubling to 30 s), so that an API server outage
/// is neither hammered nor waited out for long once it ends.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);

    /// The wait before the next retry; each call doubles the following one.
    pub fn delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    /// Waits for the next retry.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.delay()).await;
    }
}

/// The inputs' sender is gone: nothing will change any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the watch of the role's inputs ended")]
pub struct InputsEnded;

/// Runs `pass` on the latest `inputs`, again each time they change, and at least every `every` when given. A
/// failed pass is logged and retried after the [`Backoff`] delay (at most `every`), or as soon as the inputs
/// change; a pass that succeeds resets the backoff. Returns only when the inputs' sender is dropped.
///
/// The future may not be `Send` when `pass` borrows from its captures (a limit of async closures), so run it on the
/// role's own task (`select!` beside the others), not with `tokio::spawn`.
pub async fn run_on_changes<T, E>(
    mut inputs: watch::Receiver<T>,
    every: Option<Duration>,
    mut pass: impl AsyncFnMut(T) -> Result<(), E>,
) -> InputsEnded
where
    T: Clone,
    E: Display,
{
    let mut backoff = Backoff::default();
    loop {
        let latest = inputs.borrow_and_update().clone();
        let wait = match pass(latest).await {
            Ok(()) => {
                backoff.reset();
                every
            }
            Err(error) => {
                // `{:#}` shows an anyhow error's causes; other errors print as usual.
                warn!(error = %format!("{error:#}"), "pass failed; retrying");
                let delay = backoff.delay();
                Some(every.map_or(delay, |every| delay.min(every)))
            }
        };
        tokio::select! {
            changed = inputs.changed() => if changed.is_err() {
                return InputsEnded;
            },
            () = sleep_or_forever(wait) => {}
        }
    }
}

/// Sleeps for `duration`, or forever without one.
async fn sleep_or_forever(duration: Option<Duration>) {
    match duration {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_limit_and_resets() {
        let mut backoff = Backoff::default();
        let delays: Vec<u64> = (0..7).map(|_| backoff.delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        backoff.reset();
        assert_eq!(backoff.delay().as_secs(), 1);
    }

    /// Passes run on every change, a failure is retried after the backoff delay, and the loop ends with the
    /// sender.
    #[tokio::test(start_paused = true)]
    async fn passes_follow_changes_and_failures_are_retried() {
        let (sender, inputs) = watch::channel(0);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let running = tokio::spawn(run_on_changes(inputs, None, async move |input: i32| {
            record.lock().unwrap().push(input);
            // Input 2 fails the first time it is seen, as an API server outage would.
            if input == 2 && record.lock().unwrap().iter().filter(|i| **i == 2).count() == 1 {
                Err("refused")
            } else {
                Ok(())
            }
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
        sender.send(1).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        sender.send(2).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            *seen.lock().unwrap(),
            [0, 1, 2],
            "no retry before the delay"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(*seen.lock().unwrap(), [0, 1, 2, 2], "retried after 1 s");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(seen.lock().unwrap().len(), 4, "no pass without a change");
        drop(sender);
        assert_eq!(running.await.unwrap(), InputsEnded);
    }

    #[tokio::test(start_paused = true)]
    async fn an_interval_runs_passes_without_changes() {
        let (_sender, inputs) = watch::channel(());
        let count = Arc::new(Mutex::new(0));
        let counter = count.clone();
        tokio::spawn(run_on_changes(
            inputs,
            Some(Duration::from_secs(10)),
            async move |()| {
                *counter.lock().unwrap() += 1;
                Ok::<(), String>(())
            },
        ));
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(*count.lock().unwrap(), 3);
    }
}

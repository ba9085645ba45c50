//! What every pass of the operator's controllers waits for before it reads a cache or writes, and how they tell
//! users about it: one gate and one Event writer for the ClusterPolicy controller and the driver upgrade controller.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::watch;
use tracing::warn;

/// Why a pass stopped at the gate.
#[derive(Debug, thiserror::Error)]
pub enum GateClosed {
    #[error("the watch caches stopped before their first list")]
    CachesStopped,
    #[error("this replica is shutting down and leads no more")]
    NotLeading,
}

impl GateClosed {
    /// The metric label of the failure.
    pub fn reason(&self) -> &'static str {
        match self {
            GateClosed::CachesStopped => "caches",
            GateClosed::NotLeading => "not-leading",
        }
    }
}

/// Open once every watch cache holds its first full list and while this replica holds the leader lease. A pass on
/// a half-filled cache would act on missing objects; a standby replica's passes wait here, and the one in the queue
/// runs as soon as the replica leads.
#[derive(Clone)]
pub struct Gate {
    caches_synced: watch::Receiver<bool>,
    leading: watch::Receiver<bool>,
}

impl Gate {
    pub fn new(caches_synced: watch::Receiver<bool>, leading: watch::Receiver<bool>) -> Self {
        Gate {
            caches_synced,
            leading,
        }
    }

    /// Waits until the gate is open; an error when it never will be (the caches or the election stopped).
    pub async fn open(&self) -> Result<(), GateClosed> {
        self.caches_synced
            .clone()
            .wait_for(|synced| *synced)
            .await
            .map_err(|_| GateClosed::CachesStopped)?;
        self.leading
            .clone()
            .wait_for(|leading| *leading)
            .await
            .map_err(|_| GateClosed::NotLeading)?;
        Ok(())
    }
}

/// Publishes an Event about `object`. A failed publish is logged and otherwise ignored: an Event tells the story,
/// it never decides anything, so it must not fail the pass that wrote it.
pub async fn publish_event(
    recorder: &Recorder,
    object: &ObjectReference,
    action: &str,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(within_note_limit(note).to_owned()),
        action: action.into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, object).await {
        warn!(%error, "publishing an event failed");
    }
}

/// The longest note the API server takes (1 kB), cut at the last whole character within it.
fn within_note_limit(note: &str) -> &str {
    let mut end = note.len().min(1024);
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    &note[..end]
}

#[cfg(test)]
mod tests {
    use super::within_note_limit;

    #[test]
    fn a_long_note_is_cut_to_the_api_servers_limit_on_a_character_boundary() {
        assert_eq!(within_note_limit("driver ready"), "driver ready");
        let ascii = "x".repeat(3000);
        assert_eq!(within_note_limit(&ascii).len(), 1024);
        // One byte, then two-byte characters: 1 + 511 × 2 = 1023 bytes fit, the 512th would end at byte 1025.
        let accented = format!("a{}", "é".repeat(1000));
        let cut = within_note_limit(&accented);
        assert_eq!(cut.len(), 1023);
        assert!(cut.ends_with('é'));
    }
}

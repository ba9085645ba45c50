//! What the driver reports in a prepared claim's own status (`status.devices`, KEP-4817): for each shared device,
//! what holds the claim to its share, so that `kubectl get resourceclaim -o yaml` answers "is my memory limit hard"
//! without a look at the node. Whole devices are the claim's alone and get no entry.
//!
//! The entries are written by server-side apply to the status subresource, after the kubelet has its answer, and
//! only once the kubelet's calls pause ([`Queue`]): a prepare never waits on this write, and the writes of a burst
//! of prepares (a kubelet starting many pods) do not compete with the prepares still coming for the node's CPU and
//! the API server. Each write used to follow its prepare at once; on a machine whose cores the drivers share with
//! the control plane, that write's work in the API server was most of the prepares' p99 (`docs/benchmarks.md`). A
//! claim unprepared before its turn is not written. A failed write is logged, not retried (the next prepare of the
//! claim, after a driver restart, writes it again). The API server lets a node's driver write only the claims
//! allocated on its node (the chart's RBAC and `node-bound-writes.yaml`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crd::dra::{DRIVER, MemoryEnforcement};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::cdi::PreparedDevice;
use crate::claims::ClaimRef;

/// The field manager of the driver's entries.
const FIELD_MANAGER: &str = "gpu-dra-driver";

/// The status patch for claim `namespace/name` prepared with `devices`, or `None` when it has no shared device.
#[must_use]
pub fn patch(namespace: &str, name: &str, devices: &[PreparedDevice]) -> Option<Value> {
    let entries: Vec<Value> = devices
        .iter()
        .filter_map(|device| {
            let limits = device.limits.as_ref()?;
            let mut entry = json!({
                "driver": DRIVER,
                "pool": device.pool,
                "device": device.device,
                "data": {
                    "memoryEnforcement": limits.enforcement,
                    "memoryMiB": limits.memory_mib,
                    "cores": limits.cores,
                    "memoryEnforcedBy": match limits.enforcement {
                        MemoryEnforcement::Driver =>
                            "the GPU driver caps the container's cgroup (allocations past it fail)",
                        MemoryEnforcement::MpsPinned =>
                            "the claim's MPS daemon pins each client's device memory",
                    },
                },
            });
            if let Some(share) = &device.share_id {
                entry["shareID"] = json!(share);
            }
            Some(entry)
        })
        .collect();
    (!entries.is_empty()).then(|| {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name},
            "status": {"devices": entries},
        })
    })
}

/// How long the kubelet's calls must have paused before a queued status is written: the kubelet prepares a
/// starting pod's claims one call after another, a burst of pods within milliseconds.
pub const QUIET: Duration = Duration::from_millis(200);
/// The longest a queued status waits for such a pause: a node whose kubelet never pauses still gets them.
pub const MAX_WAIT: Duration = Duration::from_secs(5);

/// A claim's status patch, waiting for its turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The server-side apply patch ([`patch`]).
    pub patch: Value,
    /// When it was queued.
    pub queued: Instant,
}

/// What the writer does next.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Writes the status of the claim with this UID.
    Write(String),
    /// Waits until then, unless something is queued before.
    WaitUntil(Instant),
    /// Waits for something to be queued.
    Idle,
}

/// The oldest queued status is written once the kubelet's last call is [`QUIET`] ago, or once it has waited
/// [`MAX_WAIT`].
fn next(pending: &BTreeMap<String, Pending>, last_call: Option<Instant>, now: Instant) -> Next {
    let Some((uid, oldest)) = pending.iter().min_by_key(|(_, pending)| pending.queued) else {
        return Next::Idle;
    };
    let quiet = last_call.map_or(now, |call| call + QUIET);
    let due = quiet.min(oldest.queued + MAX_WAIT);
    if due <= now {
        Next::Write(uid.clone())
    } else {
        Next::WaitUntil(due)
    }
}

#[derive(Debug, Default)]
struct State {
    /// By claim UID.
    pending: BTreeMap<String, Pending>,
    last_call: Option<Instant>,
}

/// The claim statuses waiting for a pause in the kubelet's calls, and the one writer of them ([`Queue::run`]).
#[derive(Debug, Default)]
pub struct Queue {
    state: Mutex<State>,
    queued: Notify,
}

impl Queue {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The lock is never held across an await or a panic that could poison it; a poisoned one holds valid data.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A kubelet call arrived or was answered: queued statuses wait for the next pause.
    pub fn call(&self) {
        self.state().last_call = Some(Instant::now());
    }

    /// Queues the status of `claim`, prepared with `devices`, if it has entries to write.
    pub fn prepared(&self, claim: &ClaimRef, devices: &[PreparedDevice]) {
        let Some(patch) = patch(&claim.namespace, &claim.name, devices) else {
            return;
        };
        self.state().pending.insert(
            claim.uid.clone(),
            Pending {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                patch,
                queued: Instant::now(),
            },
        );
        self.queued.notify_one();
    }

    /// The claim with UID `uid` was unprepared: its status, if still queued, is not written.
    pub fn unprepared(&self, uid: &str) {
        self.state().pending.remove(uid);
    }

    /// Writes the queued statuses with `write`, one at a time, each at its turn; runs until the future is dropped.
    pub async fn run<F, W>(&self, write: W)
    where
        W: Fn(Pending) -> F,
        F: Future<Output = ()>,
    {
        loop {
            let next = {
                let state = self.state();
                next(&state.pending, state.last_call, Instant::now())
            };
            match next {
                Next::Idle => self.queued.notified().await,
                Next::WaitUntil(due) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => {}
                        () = self.queued.notified() => {}
                    }
                }
                Next::Write(uid) => {
                    let taken = self.state().pending.remove(&uid);
                    if let Some(pending) = taken {
                        write(pending).await;
                    }
                }
            }
        }
    }
}

/// Writes a claim's status entries by server-side apply, as the driver's field manager.
pub async fn write(client: kube::Client, pending: Pending) {
    let claim = format!("{}/{}", pending.namespace, pending.name);
    let api = Api::<ResourceClaim>::namespaced(client, &pending.namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match api
        .patch_status(&pending.name, &params, &Patch::Apply(&pending.patch))
        .await
    {
        Ok(_) => debug!(%claim, "device status written"),
        Err(error) => warn!(%claim, %error, "cannot write the claim's device status"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::cdi::ShareLimits;

    fn device(name: &str, limits: Option<ShareLimits>) -> PreparedDevice {
        PreparedDevice {
            requests: vec!["gpu".into()],
            pool: "node-1".into(),
            device: name.into(),
            share_id: limits.as_ref().map(|_| format!("share-{name}")),
            uuid: "GPU-1".into(),
            device_nodes: vec![],
            limits,
            on_demand: None,
            mig_instance: None,
        }
    }

    #[test]
    fn shared_devices_say_what_holds_their_memory_and_whole_devices_say_nothing() {
        let shared = device(
            "gpu-1",
            Some(ShareLimits {
                memory_mib: 2048,
                cores: 30,
                mps_dir: PathBuf::new(),
                enforcement: MemoryEnforcement::Driver,
            }),
        );
        let written = patch("team", "claim-a", &[device("gpu-0", None), shared]).unwrap();
        assert_eq!(written["metadata"]["name"], "claim-a");
        let entries = written["status"]["devices"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{written:#}");
        assert_eq!(entries[0]["driver"], "gpu.nvidia.com");
        assert_eq!(entries[0]["pool"], "node-1");
        assert_eq!(entries[0]["device"], "gpu-1");
        assert_eq!(entries[0]["shareID"], "share-gpu-1");
        assert_eq!(entries[0]["data"]["memoryEnforcement"], "driver");
        assert_eq!(entries[0]["data"]["memoryMiB"], 2048);
        assert_eq!(entries[0]["data"]["cores"], 30);
        assert_eq!(patch("team", "claim-b", &[device("gpu-0", None)]), None);
    }

    fn shared(name: &str) -> PreparedDevice {
        device(
            name,
            Some(ShareLimits {
                memory_mib: 3000,
                cores: 10,
                mps_dir: PathBuf::new(),
                enforcement: MemoryEnforcement::MpsPinned,
            }),
        )
    }

    fn claim(name: &str) -> ClaimRef {
        ClaimRef {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn queued(uid: &str, at: Instant) -> (String, Pending) {
        let pending = Pending {
            namespace: "default".into(),
            name: uid.into(),
            patch: json!({}),
            queued: at,
        };
        (uid.to_owned(), pending)
    }

    #[test]
    fn the_oldest_status_is_written_once_the_calls_pause_or_it_waited_long_enough() {
        let start = Instant::now();
        let second = Duration::from_secs(1);
        assert_eq!(next(&BTreeMap::new(), Some(start), start), Next::Idle);
        let pending = BTreeMap::from([queued("b", start), queued("a", start + second)]);
        // A call just now: the writer waits for the pause.
        assert_eq!(
            next(&pending, Some(start + second), start + second),
            Next::WaitUntil(start + second + QUIET)
        );
        // The pause came: the oldest goes first.
        assert_eq!(
            next(&pending, Some(start), start + QUIET),
            Next::Write("b".into())
        );
        // No call since the driver started.
        assert_eq!(next(&pending, None, start), Next::Write("b".into()));
        // Calls that never pause hold a status no longer than MAX_WAIT.
        let busy = start + MAX_WAIT;
        assert_eq!(next(&pending, Some(busy), busy), Next::Write("b".into()));
    }

    #[tokio::test(start_paused = true)]
    async fn statuses_wait_for_the_kubelets_calls_to_pause_and_an_unprepared_claim_is_never_written()
     {
        let queue = std::sync::Arc::new(Queue::default());
        let written = std::sync::Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let (queue, written) = (queue.clone(), written.clone());
            tokio::spawn(async move {
                queue
                    .run(|pending| {
                        written.lock().unwrap().push((pending.name, Instant::now()));
                        std::future::ready(())
                    })
                    .await;
            })
        };
        let start = Instant::now();
        // A burst: a call every 10 ms, each preparing a claim; the second is unprepared within the burst, and a
        // claim of whole devices has nothing to write.
        for name in ["a", "b", "c"] {
            queue.call();
            queue.prepared(&claim(name), &[shared("gpu-0")]);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        queue.call();
        queue.prepared(&claim("whole"), &[device("gpu-1", None)]);
        queue.call();
        queue.unprepared("uid-b");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            written.lock().unwrap().is_empty(),
            "nothing is written during the burst"
        );
        tokio::time::sleep(QUIET).await;
        let written: Vec<_> = written.lock().unwrap().clone();
        let names: Vec<&str> = written.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
        let burst_end = start + Duration::from_millis(30);
        for (name, at) in &written {
            assert_eq!(
                *at,
                burst_end + QUIET,
                "{name} is written once the calls paused"
            );
        }
        writer.abort();
    }
}

//! What the benchmark waits for, read from the API server as the admin: the operand DaemonSets in the namespace
//! and the ClusterPolicy's state. Reading is the I/O half; [`Snapshot`]'s predicates are pure.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use harness::cluster::{self, Connection};
use harness::operators::NAMESPACE;

const POLL: Duration = Duration::from_millis(200);
/// How often a long wait says where it stands.
const PROGRESS_EVERY: Duration = Duration::from_secs(15);

/// The DaemonSet every GPU node runs under either operator; its desired count tells that the node labels are in.
const DEVICE_PLUGIN: &str = "nvidia-device-plugin-daemonset";

/// One DaemonSet's rollout, from its status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rollout {
    pub images: Vec<String>,
    pub generation: i64,
    pub observed_generation: i64,
    pub desired: i32,
    pub updated: i32,
    pub available: i32,
}

impl Rollout {
    /// The controller saw the latest spec and every pod runs it and is available.
    pub fn done(&self) -> bool {
        self.observed_generation >= self.generation
            && self.updated == self.desired
            && self.available == self.desired
    }
}

/// The operands and the ClusterPolicy at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// `status.state` of the ClusterPolicy (empty while it has none).
    pub state: String,
    pub daemonsets: BTreeMap<String, Rollout>,
}

impl Snapshot {
    /// What users wait for: the operator says ready, every operand DaemonSet is rolled out, and the device plugin
    /// runs on all `nodes` (a DaemonSet whose node labels are not in yet reads as rolled out with 0 pods).
    pub fn settled(&self, nodes: u32) -> bool {
        self.state == "ready" && self.rolled_out(nodes)
    }

    /// Every operand DaemonSet is rolled out and the device plugin runs on all `nodes`: settled but for the
    /// operator's word (the floor has no operator to say ready).
    pub fn rolled_out(&self, nodes: u32) -> bool {
        self.daemonsets.values().all(Rollout::done) && self.labelled(nodes)
    }

    /// The device plugin's DaemonSet wants a pod on every one of `nodes`: the operator has labelled them all.
    pub fn labelled(&self, nodes: u32) -> bool {
        self.daemonsets
            .get(DEVICE_PLUGIN)
            .is_some_and(|rollout| rollout.desired == nodes as i32)
    }

    /// Every operand pod the DaemonSets want is available (the cluster's part of a rollout is done).
    pub fn available(&self, nodes: u32) -> bool {
        self.labelled(nodes)
            && self
                .daemonsets
                .values()
                .all(|rollout| rollout.available == rollout.desired)
    }

    /// One line for progress output: the policy's state and the operand pods available and up to date.
    pub fn progress(&self) -> String {
        let sum = |count: fn(&Rollout) -> i32| self.daemonsets.values().map(count).sum::<i32>();
        format!(
            "state {:?}, {} DaemonSets, {} of {} pods available, {} updated",
            self.state,
            self.daemonsets.len(),
            sum(|rollout| rollout.available),
            sum(|rollout| rollout.desired),
            sum(|rollout| rollout.updated),
        )
    }

    /// Notes in `rolled_out`, for each DaemonSet, when (`at`) it became rolled out, and forgets one that is not:
    /// a DaemonSet reads as rolled out while its nodes still join it (0 of 0 pods), so what counts is the last
    /// time it became rolled out and stayed so.
    pub fn note_rolled_out(&self, rolled_out: &mut BTreeMap<String, Duration>, at: Duration) {
        for (name, rollout) in &self.daemonsets {
            if !rollout.done() {
                rolled_out.remove(name);
            } else if !rolled_out.contains_key(name) {
                rolled_out.insert(name.clone(), at);
            }
        }
    }

    /// Whether a DaemonSet runs an image ending in `suffix` (a patched version tag).
    pub fn runs_image(&self, daemonset: &str, suffix: &str) -> bool {
        self.daemonsets
            .get(daemonset)
            .is_some_and(|rollout| rollout.images.iter().any(|image| image.ends_with(suffix)))
    }
}

/// Polls the API server every 200 ms.
pub struct Observer<'a> {
    connection: &'a Connection,
}

impl<'a> Observer<'a> {
    pub fn new(connection: &'a Connection) -> Self {
        Self { connection }
    }

    pub fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let client = self.connection.client.clone();
        let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
        let list = self
            .connection
            .request(daemonsets.list(&ListParams::default()))?;
        let gvk = GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy");
        let policies: Api<DynamicObject> = Api::all_with(client, &ApiResource::from_gvk(&gvk));
        let policy = self
            .connection
            .request(policies.get_opt("cluster-policy"))?;
        let state = policy
            .and_then(|policy| policy.data["status"]["state"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let daemonsets = list
            .items
            .into_iter()
            .map(|daemonset| {
                let name = daemonset.metadata.name.clone().unwrap_or_default();
                let status = daemonset.status.unwrap_or_default();
                let images = daemonset
                    .spec
                    .template
                    .spec
                    .map(|pod| pod.containers.into_iter().filter_map(|c| c.image).collect())
                    .unwrap_or_default();
                let rollout = Rollout {
                    images,
                    generation: daemonset.metadata.generation.unwrap_or_default(),
                    observed_generation: status.observed_generation.unwrap_or_default(),
                    desired: status.desired_number_scheduled,
                    updated: status.updated_number_scheduled.unwrap_or_default(),
                    available: status.number_available.unwrap_or_default(),
                };
                (name, rollout)
            })
            .collect();
        Ok(Snapshot { state, daemonsets })
    }

    /// Polls until `done` holds, calling `seen` with every snapshot; gives up after `timeout`. Returns the time from
    /// `since` to the first snapshot where `done` held.
    pub fn until(
        &self,
        since: Instant,
        timeout: Duration,
        what: &str,
        mut seen: impl FnMut(&Snapshot, Duration),
        done: impl Fn(&Snapshot) -> bool,
    ) -> anyhow::Result<Duration> {
        let mut last = Snapshot::default();
        let mut reported = Duration::ZERO;
        while since.elapsed() < timeout {
            // A failed poll (the API server busy past the probe timeout) is retried, not fatal.
            if let Ok(snapshot) = self.snapshot() {
                let at = since.elapsed();
                seen(&snapshot, at);
                if done(&snapshot) {
                    return Ok(at);
                }
                if at >= reported + PROGRESS_EVERY {
                    reported = at;
                    cluster::progress::say(format!(
                        "  {:>4.0} s waiting for {what}: {}",
                        at.as_secs_f64(),
                        snapshot.progress()
                    ));
                }
                last = snapshot;
            }
            std::thread::sleep(POLL);
        }
        anyhow::bail!("timed out after {timeout:?} waiting for {what}; last seen: {last:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rolled_out(desired: i32) -> Rollout {
        Rollout {
            images: vec!["nvcr.io/nvidia/k8s-device-plugin:v0.17.1".into()],
            generation: 2,
            observed_generation: 2,
            desired,
            updated: desired,
            available: desired,
        }
    }

    #[test]
    fn settled_needs_ready_every_rollout_done_and_the_device_plugin_on_every_node() {
        let mut snapshot = Snapshot {
            state: "ready".into(),
            daemonsets: BTreeMap::from([
                (DEVICE_PLUGIN.to_owned(), rolled_out(10)),
                ("nvidia-mig-manager".to_owned(), rolled_out(0)),
            ]),
        };
        assert!(snapshot.settled(10));
        assert!(snapshot.labelled(10) && snapshot.available(10));
        assert!(
            !snapshot.settled(11),
            "the device plugin is not on every node"
        );
        assert!(!snapshot.labelled(11) && !snapshot.available(11));

        snapshot.state = "notReady".into();
        assert!(!snapshot.settled(10));
        assert!(
            snapshot.rolled_out(10),
            "rolled out without the operator's word"
        );
        snapshot.state = "ready".into();

        let plugin = snapshot.daemonsets.get_mut(DEVICE_PLUGIN).unwrap();
        plugin.available = 9;
        assert!(!snapshot.settled(10), "one pod is not available");
        assert!(snapshot.labelled(10) && !snapshot.available(10));
        let plugin = snapshot.daemonsets.get_mut(DEVICE_PLUGIN).unwrap();
        plugin.available = 10;
        plugin.generation = 3;
        assert!(
            !snapshot.settled(10),
            "the controller has not seen the new spec"
        );

        snapshot.daemonsets.remove(DEVICE_PLUGIN);
        assert!(!snapshot.settled(10), "no device plugin yet");
    }

    #[test]
    fn runs_image_matches_the_tag() {
        let snapshot = Snapshot {
            state: String::new(),
            daemonsets: BTreeMap::from([(
                "nvidia-container-toolkit-daemonset".to_owned(),
                rolled_out(1),
            )]),
        };
        assert!(snapshot.runs_image("nvidia-container-toolkit-daemonset", ":v0.17.1"));
        assert_eq!(
            snapshot.progress(),
            "state \"\", 1 DaemonSets, 1 of 1 pods available, 1 updated"
        );
        assert!(!snapshot.runs_image("nvidia-container-toolkit-daemonset", ":bench-2"));
        assert!(!snapshot.runs_image("nvidia-device-plugin-daemonset", ":v0.17.1"));
    }

    #[test]
    fn a_daemonset_counts_as_rolled_out_from_the_last_time_it_became_so() {
        let snapshot = |desired: i32, available: i32| Snapshot {
            state: String::new(),
            daemonsets: BTreeMap::from([(
                DEVICE_PLUGIN.to_owned(),
                Rollout {
                    available,
                    ..rolled_out(desired)
                },
            )]),
        };
        let mut rolled_out = BTreeMap::new();
        let second = |n: u64| Duration::from_secs(n);
        // No node has joined yet: 0 of 0 reads as rolled out.
        snapshot(0, 0).note_rolled_out(&mut rolled_out, second(1));
        assert_eq!(rolled_out[DEVICE_PLUGIN], second(1));
        snapshot(10, 4).note_rolled_out(&mut rolled_out, second(2));
        assert!(rolled_out.is_empty());
        snapshot(10, 10).note_rolled_out(&mut rolled_out, second(3));
        snapshot(10, 10).note_rolled_out(&mut rolled_out, second(4));
        assert_eq!(rolled_out[DEVICE_PLUGIN], second(3));
    }
}

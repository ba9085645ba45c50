//! Node labels this operator has written that its Node cache may not show yet.
//!
//! A reconcile plans each node's labels from the watch cache. On a busy API server the watch delivers a label patch
//! seconds after it succeeded, and a reconcile that starts in between (the patches' own events queue the next one)
//! sees the old labels and patches them again. Seen at 1000 nodes: after the first 1000 patches, 1323 more that
//! changed nothing, for 22 s, while the DaemonSet controller was creating the operands' pods on the same API server.
//!
//! So each patched node is remembered with the resourceVersion its plan was read at and the labels the patch left.
//! While the cache still holds that version, the patch has not reached it and the remembered labels stand in. Once
//! the cache holds any other version (the patch, or a later write by anyone), the cache is the truth again and the
//! node is forgotten. Only equality of versions is used, never their order, which the API leaves opaque.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

/// A node's labels as its last patch left them, with the version that patch was planned from.
#[derive(Debug, Clone)]
struct Written {
    planned_at: String,
    labels: BTreeMap<String, String>,
}

/// The patches the Node cache has not shown yet, by node name.
#[derive(Debug, Default)]
pub struct LabelsInFlight(Mutex<HashMap<String, Written>>);

impl LabelsInFlight {
    /// The labels to plan `node` from: the remembered ones while the cache still holds the version (`cached_at`)
    /// the last patch was planned at, else the cache's (`cached`, borrowed: the usual case, with no copy), and the
    /// node is forgotten.
    pub fn labels<'a>(
        &self,
        node: &str,
        cached_at: Option<&str>,
        cached: &'a BTreeMap<String, String>,
    ) -> Cow<'a, BTreeMap<String, String>> {
        let Ok(mut written) = self.0.lock() else {
            return Cow::Borrowed(cached);
        };
        match written.get(node) {
            Some(entry) if Some(entry.planned_at.as_str()) == cached_at => {
                Cow::Owned(entry.labels.clone())
            }
            Some(_) => {
                written.remove(node);
                Cow::Borrowed(cached)
            }
            None => Cow::Borrowed(cached),
        }
    }

    /// Notes that `node`, read at version `planned_at`, now carries `labels`.
    pub fn record(&self, node: &str, planned_at: Option<&str>, labels: BTreeMap<String, String>) {
        // A node read without a version (never from the API server) cannot be told apart later: not remembered.
        let (Some(planned_at), Ok(mut written)) = (planned_at, self.0.lock()) else {
            return;
        };
        written.insert(
            node.to_owned(),
            Written {
                planned_at: planned_at.to_owned(),
                labels,
            },
        );
    }

    /// Forgets the nodes that are not in `present` (deleted from the cluster).
    pub fn retain(&self, present: &HashSet<&str>) {
        if let Ok(mut written) = self.0.lock() {
            written.retain(|node, _| present.contains(node.as_str()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn a_cache_that_has_not_seen_the_patch_reads_as_the_patch_left_the_node() {
        let in_flight = LabelsInFlight::default();
        let before = labels(&[("nfd", "true")]);
        let after = labels(&[("nfd", "true"), ("nvidia.com/gpu.present", "true")]);
        in_flight.record("a", Some("10"), after.clone());
        assert_eq!(
            *in_flight.labels("a", Some("10"), &before),
            after,
            "still version 10"
        );
        assert_eq!(
            *in_flight.labels("a", Some("10"), &before),
            after,
            "asked again"
        );
        assert_eq!(
            *in_flight.labels("b", Some("10"), &before),
            before,
            "another node"
        );
    }

    #[test]
    fn any_other_version_in_the_cache_wins_and_the_node_is_forgotten() {
        let in_flight = LabelsInFlight::default();
        let after = labels(&[("nvidia.com/gpu.present", "true")]);
        in_flight.record("a", Some("10"), after);
        // An admin paused the device plugin after the patch: the cache shows their write, which must count.
        let admins = labels(&[
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.deploy.device-plugin", "false"),
        ]);
        assert_eq!(*in_flight.labels("a", Some("12"), &admins), admins);
        let stale = labels(&[]);
        assert_eq!(
            *in_flight.labels("a", Some("10"), &stale),
            stale,
            "forgotten: version 10 again is the cache's own word now"
        );
    }

    #[test]
    fn nodes_without_a_version_or_gone_from_the_cluster_are_not_remembered() {
        let in_flight = LabelsInFlight::default();
        let after = labels(&[("nvidia.com/gpu.present", "true")]);
        in_flight.record("unversioned", None, after.clone());
        assert_eq!(
            *in_flight.labels("unversioned", None, &labels(&[])),
            labels(&[])
        );
        in_flight.record("deleted", Some("3"), after.clone());
        in_flight.record("kept", Some("4"), after.clone());
        in_flight.retain(&HashSet::from(["kept"]));
        assert_eq!(
            *in_flight.labels("deleted", Some("3"), &labels(&[])),
            labels(&[])
        );
        assert_eq!(*in_flight.labels("kept", Some("4"), &labels(&[])), after);
    }
}

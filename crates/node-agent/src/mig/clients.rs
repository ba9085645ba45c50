//! Pausing the node's GPU clients and restoring them exactly, pure.
//!
//! While a MIG change runs, the deploy labels of the device plugin, feature discovery, DCGM and the DCGM exporter
//! say `paused-for-mig-change`, so their DaemonSets take their pods off the node. A label the operator has not
//! written yet is paused too: the DaemonSets' affinity places their pods on a GPU node without it. What each label
//! said before (or that it was not there) is
//! recorded in the [`Progress`] annotation on the Node, in the same patch that pauses them: a restarted agent
//! finds the record and restores exactly those values, and a label can never be paused without its record. The
//! reference stack's failure (labels left paused forever after a timeout) cannot happen: every way out of a
//! change, success or failure, goes through [`restore`].

use std::collections::BTreeMap;

use crd::gpu_node::{GpuMigGeometry, MigState};
use crd::labels::{MIG_CONFIG_STATE, PAUSED_FOR_MIG_CHANGE, deploy_label};
use crd::node_patch::MetadataPatch;
use serde::{Deserialize, Serialize};

/// Node annotation holding the [`Progress`] of a change underway; absent when none is.
pub const PROGRESS_ANNOTATION: &str = "nvidia.com/mig.config.progress";

/// The GPU clients: deploy-label component and the `app` label of its pods.
pub const GPU_CLIENTS: [(&str, &str); 4] = [
    ("device-plugin", "nvidia-device-plugin-daemonset"),
    ("gpu-feature-discovery", "gpu-feature-discovery"),
    ("dcgm-exporter", "nvidia-dcgm-exporter"),
    ("dcgm", "nvidia-dcgm"),
];

/// The value that deploys a component.
const DEPLOYED: &str = "true";

/// The record of a change underway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// The config being applied.
    pub config: String,
    /// Each paused deploy label with the value to restore; `None` where the label was not there (restored by
    /// removing it). Records of earlier versions hold only values.
    pub paused: BTreeMap<String, Option<String>>,
    /// The geometry before the change, to return to on failure.
    pub previous: Vec<GpuMigGeometry>,
    /// Reboots done for this change.
    #[serde(default)]
    pub reboots: u32,
}

impl Progress {
    /// A record of a change of `config` from the `previous` geometry, nothing paused yet.
    #[must_use]
    pub fn new(config: &str, previous: Vec<GpuMigGeometry>) -> Self {
        Self {
            config: config.to_owned(),
            paused: BTreeMap::new(),
            previous,
            reboots: 0,
        }
    }

    /// The record in the Node's annotations, if any.
    ///
    /// # Errors
    /// When the annotation is not a record (edited by hand).
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<Self>, serde_json::Error> {
        annotations
            .get(PROGRESS_ANNOTATION)
            .map(|text| serde_json::from_str(text))
            .transpose()
    }

    /// The annotation value.
    #[must_use]
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Starts (or resumes) a change of `config`: the record to keep and the patch that sets the state to pending,
/// pauses every client that is deployed or not yet labelled (an admin's `false` stays) and stores the record.
///
/// On resume the earlier record's values and previous geometry are kept (the labels hold `paused` now, not what
/// to restore). A client label that says paused without being in any record is restored to `true`, the only value
/// the operator deploys with, so that nothing stays paused.
#[must_use]
pub fn pause(
    labels: &BTreeMap<String, String>,
    existing: Option<Progress>,
    config: &str,
    previous: Vec<GpuMigGeometry>,
) -> (Progress, MetadataPatch) {
    let mut progress = existing.unwrap_or_else(|| Progress::new(config, previous));
    config.clone_into(&mut progress.config);
    let mut patch = MetadataPatch::default().label(MIG_CONFIG_STATE, MigState::Pending.as_str());
    for (component, _) in GPU_CLIENTS {
        let label = deploy_label(component);
        let value = labels.get(&label).map(String::as_str);
        let to_restore = match value {
            Some(DEPLOYED) => Some(DEPLOYED),
            None => None,
            Some(PAUSED_FOR_MIG_CHANGE) if !progress.paused.contains_key(&label) => Some(DEPLOYED),
            _ => continue,
        };
        progress
            .paused
            .entry(label.clone())
            .or_insert_with(|| to_restore.map(str::to_owned));
        patch = patch.label(label, PAUSED_FOR_MIG_CHANGE);
    }
    let patch = patch.annotation(PROGRESS_ANNOTATION, Some(progress.to_annotation()));
    (progress, patch.minus(labels, &BTreeMap::new()))
}

/// Ends a change: restores every paused label to its recorded value, removes the record, sets the final state
/// (when given). A label someone changed while it was paused (an admin setting `false`) keeps their value.
#[must_use]
pub fn restore(
    labels: &BTreeMap<String, String>,
    progress: Option<&Progress>,
    state: Option<MigState>,
) -> MetadataPatch {
    let mut patch = MetadataPatch::default();
    if let Some(state) = state {
        patch = patch.label(MIG_CONFIG_STATE, state.as_str());
    }
    if let Some(progress) = progress {
        for (label, value) in &progress.paused {
            if labels.get(label).map(String::as_str) == Some(PAUSED_FOR_MIG_CHANGE) {
                patch = patch.label_or_removal(label.clone(), value.clone());
            }
        }
        patch = patch.annotation(PROGRESS_ANNOTATION, None);
    }
    patch
}

/// Records a reboot: state `rebooting` and the record with one more reboot.
#[must_use]
pub fn rebooting(progress: &mut Progress) -> MetadataPatch {
    progress.reboots += 1;
    MetadataPatch::default()
        .label(MIG_CONFIG_STATE, MigState::Rebooting.as_str())
        .annotation(PROGRESS_ANNOTATION, Some(progress.to_annotation()))
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

    /// Applies a patch to labels, as the API server would.
    fn applied(
        mut labels: BTreeMap<String, String>,
        patch: &MetadataPatch,
    ) -> BTreeMap<String, String> {
        for (key, value) in &patch.labels {
            match value {
                Some(value) => labels.insert(key.clone(), value.clone()),
                None => labels.remove(key),
            };
        }
        labels
    }

    const PLUGIN: &str = "nvidia.com/gpu.deploy.device-plugin";
    const DISCOVERY: &str = "nvidia.com/gpu.deploy.gpu-feature-discovery";
    const EXPORTER: &str = "nvidia.com/gpu.deploy.dcgm-exporter";

    const DCGM: &str = "nvidia.com/gpu.deploy.dcgm";

    #[test]
    fn pauses_deployed_and_unlabelled_clients_and_restores_exactly_them() {
        let before = labels(&[(PLUGIN, "true"), (DISCOVERY, "true"), (EXPORTER, "false")]);
        let (progress, patch) = pause(&before, None, "all-1g.10gb", vec![]);
        assert_eq!(
            progress.paused,
            BTreeMap::from([
                (PLUGIN.to_owned(), Some("true".to_owned())),
                (DISCOVERY.to_owned(), Some("true".to_owned())),
                (DCGM.to_owned(), None),
            ])
        );
        let during = applied(before.clone(), &patch);
        assert_eq!(during[PLUGIN], PAUSED_FOR_MIG_CHANGE);
        assert_eq!(
            during[DCGM], PAUSED_FOR_MIG_CHANGE,
            "its pods run by the DaemonSet's affinity before the operator labels the node"
        );
        assert_eq!(during[EXPORTER], "false", "an admin's false stays");
        assert_eq!(during[MIG_CONFIG_STATE], "pending");
        assert!(patch.annotations[PROGRESS_ANNOTATION].is_some());

        let after = applied(
            during.clone(),
            &restore(&during, Some(&progress), Some(MigState::Success)),
        );
        let mut expected = before;
        expected.insert(MIG_CONFIG_STATE.into(), "success".into());
        assert_eq!(after, expected);
    }

    #[test]
    fn a_resumed_change_keeps_the_first_record() {
        let before = labels(&[(PLUGIN, "true")]);
        let geometry = vec![GpuMigGeometry::default()];
        let (first, patch) = pause(&before, None, "all-1g.10gb", geometry.clone());
        let during = applied(before, &patch);
        // The agent restarts: the labels say paused; the record says what to restore.
        let (second, again) = pause(&during, Some(first.clone()), "all-balanced", vec![]);
        assert_eq!(second.paused, first.paused);
        assert_eq!(
            second.previous, geometry,
            "the geometry before the first attempt"
        );
        assert_eq!(second.config, "all-balanced");
        assert!(
            !again.labels.contains_key(PLUGIN),
            "already paused: no change"
        );
    }

    #[test]
    fn a_paused_label_without_a_record_is_restored_to_true() {
        let stray = labels(&[(PLUGIN, PAUSED_FOR_MIG_CHANGE)]);
        let (progress, _) = pause(&stray, None, "x", vec![]);
        assert_eq!(progress.paused[PLUGIN].as_deref(), Some("true"));
    }

    #[test]
    fn an_admin_change_during_the_pause_wins() {
        let before = labels(&[(PLUGIN, "true")]);
        let (progress, patch) = pause(&before, None, "x", vec![]);
        let mut during = applied(before, &patch);
        during.insert(PLUGIN.into(), "false".into());
        let patch = restore(&during, Some(&progress), Some(MigState::Failed));
        assert!(!patch.labels.contains_key(PLUGIN));
        assert_eq!(patch.annotations[PROGRESS_ANNOTATION], None);
    }

    #[test]
    fn records_round_trip_and_count_reboots() {
        let (mut progress, _) = pause(&BTreeMap::new(), None, "x", vec![]);
        let patch = rebooting(&mut progress);
        assert_eq!(progress.reboots, 1);
        assert_eq!(patch.labels[MIG_CONFIG_STATE].as_deref(), Some("rebooting"));
        let stored = labels(&[(PROGRESS_ANNOTATION, &progress.to_annotation())]);
        assert_eq!(Progress::from_annotations(&stored).unwrap(), Some(progress));
        assert!(Progress::from_annotations(&labels(&[(PROGRESS_ANNOTATION, "{")])).is_err());
        let earlier = labels(&[(
            PROGRESS_ANNOTATION,
            r#"{"config":"x","paused":{"nvidia.com/gpu.deploy.device-plugin":"true"},"previous":[]}"#,
        )]);
        let read = Progress::from_annotations(&earlier).unwrap().unwrap();
        assert_eq!(
            read.paused[PLUGIN].as_deref(),
            Some("true"),
            "an earlier version's record"
        );
    }
}

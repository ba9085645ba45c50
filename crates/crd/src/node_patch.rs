//! A change to a Node's labels and annotations, as one JSON merge patch: the operator's label plans and the node
//! agents' changes are sent in this one shape. The MIG manager relies on one patch being
//! atomic: pausing the GPU clients and recording their previous values happen together or not at all, so a crash
//! can never leave a paused label without the record of what to restore.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Labels and annotations to set (`Some`) or remove (`None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataPatch {
    /// Label changes.
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotation changes.
    pub annotations: BTreeMap<String, Option<String>>,
}

impl MetadataPatch {
    /// True when nothing changes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }

    /// Sets a label.
    #[must_use]
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), Some(value.into()));
        self
    }

    /// Sets (`Some`) or removes (`None`) a label.
    #[must_use]
    pub fn label_or_removal(mut self, key: impl Into<String>, value: Option<String>) -> Self {
        self.labels.insert(key.into(), value);
        self
    }

    /// Sets (`Some`) or removes (`None`) an annotation.
    #[must_use]
    pub fn annotation(mut self, key: impl Into<String>, value: Option<String>) -> Self {
        self.annotations.insert(key.into(), value);
        self
    }

    /// Leaves out the changes `current` already has: setting a value it holds, removing a key it lacks.
    #[must_use]
    pub fn minus(
        mut self,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Self {
        let unchanged =
            |current: &BTreeMap<String, String>, key: &String, value: &Option<String>| {
                current.get(key) == value.as_ref()
            };
        self.labels
            .retain(|key, value| !unchanged(labels, key, value));
        self.annotations
            .retain(|key, value| !unchanged(annotations, key, value));
        self
    }

    /// The JSON merge patch (`null` removes a key).
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut metadata = serde_json::Map::new();
        if !self.labels.is_empty() {
            metadata.insert("labels".into(), json!(self.labels));
        }
        if !self.annotations.is_empty() {
            metadata.insert("annotations".into(), json!(self.annotations));
        }
        json!({ "metadata": metadata })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_removes_with_null_and_skips_what_holds() {
        let labels = BTreeMap::from([("a".to_owned(), "1".to_owned())]);
        let patch = MetadataPatch::default()
            .label("a", "1")
            .label("b", "2")
            .annotation("c", None)
            .annotation("d", None)
            .minus(&labels, &BTreeMap::from([("d".to_owned(), "x".to_owned())]));
        assert_eq!(
            patch.to_json(),
            json!({"metadata": {"labels": {"b": "2"}, "annotations": {"d": null}}})
        );
        assert!(
            MetadataPatch::default()
                .label("a", "1")
                .minus(&labels, &BTreeMap::new())
                .is_empty()
        );
    }
}

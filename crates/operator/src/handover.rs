//! Taking over the operand DaemonSets that NVIDIA's operator made, in place, when this operator is switched in
//! for it on a running cluster (docs/migrate-from-nvidia.md).
//!
//! After the switch the ClusterPolicy is the same object (same uid), and NVIDIA's DaemonSets are still owned by
//! it. Most have the names this operator renders; the driver's is one DaemonSet for the whole cluster,
//! `nvidia-driver-daemonset`, where this operator runs one per OS pool. Deleting them and creating ours would
//! unload the driver under running GPU jobs, so instead:
//! - The driver DaemonSet of the OS pool NVIDIA's driver image was built for keeps NVIDIA's name
//!   ([`driver_pool`]); the render names that pool's DaemonSet so.
//! - A DaemonSet that NVIDIA's operator made for this policy ([`made_by_nvidia`]) is applied over, never
//!   recreated: its selector, which is immutable, is kept and its labels put on the rendered pods
//!   ([`keep_selector`]), and NVIDIA's field ownership is
//!   handed to this operator's apply ([`take_ownership`]), so that the apply leaves exactly the rendered object
//!   and no field of NVIDIA's template behind. Its uid stays.
//! - The driver's template changes only under OnDelete ([`require_on_delete`]): the running driver pods stay until
//!   each is deleted on purpose (the upgrade controller, or an admin in a maintenance window).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, OwnerReference,
};
use serde_json::Value;

use crate::crd_install::FIELD_MANAGER;
use crate::model::OsPool;

/// The name of the one driver DaemonSet of NVIDIA's operator (ClusterPolicy, not precompiled).
pub const NVIDIA_DRIVER_DAEMONSET: &str = "nvidia-driver-daemonset";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HandoverError {
    #[error(
        "NVIDIA's DaemonSet {name} selects its pods with expressions, which NVIDIA's operator does not write; it is \
         left alone, delete it to have it replaced"
    )]
    SelectorWithExpressions { name: String },
    #[error(
        "NVIDIA's DaemonSet {name} would be updated with strategy {strategy}; only OnDelete keeps its running \
         driver pods"
    )]
    DriverNotOnDelete { name: String, strategy: String },
    #[error(
        "NVIDIA's driver DaemonSet {NVIDIA_DRIVER_DAEMONSET} runs image {image}, whose tag names none of the \
         GPU nodes' OS pools ({pools}); it is left alone and no driver is applied until it is removed \
         (docs/migrate-from-nvidia.md)"
    )]
    DriverPoolUnknown { image: String, pools: String },
}

/// The controlling owner reference of an object, if any.
fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true))
}

/// Whether this operator's server-side apply has written the object: it has a managed-fields entry of this
/// operator's field manager with operation Apply. NVIDIA's operator writes with plain updates, under the same
/// manager name (`gpu-operator`, its binary's), and NVIDIA's chart labels every DaemonSet its operator makes
/// `app.kubernetes.io/managed-by: gpu-operator` (the ClusterPolicy's `daemonsets.labels`), as this operator labels
/// its own; so neither the manager's name nor the label tells the two apart, the Apply does.
pub fn applied_by_this_operator(meta: &ObjectMeta) -> bool {
    meta.managed_fields.iter().flatten().any(|entry| {
        entry.manager.as_deref() == Some(FIELD_MANAGER)
            && entry.operation.as_deref() == Some("Apply")
            && entry.subresource.as_deref().unwrap_or_default().is_empty()
    })
}

/// Whether NVIDIA's operator made this object for the ClusterPolicy `policy_uid` and this operator has not taken it
/// over yet: controlled by that policy and never written by this operator's apply
/// ([`applied_by_this_operator`]). Anything else (an object of another policy, or of nobody) is not taken over.
pub fn made_by_nvidia(meta: &ObjectMeta, policy_uid: &str) -> bool {
    !applied_by_this_operator(meta)
        && controller(meta)
            .is_some_and(|owner| owner.kind == "ClusterPolicy" && owner.uid == policy_uid)
}

/// [`made_by_nvidia`] for a cached DaemonSet, whose cache keeps who wrote it (the managed-fields entries without
/// their fields): one whose writers are not known at all is taken as this operator's.
pub fn cached_made_by_nvidia(meta: &ObjectMeta, policy_uid: &str) -> bool {
    meta.managed_fields
        .as_ref()
        .is_some_and(|entries| !entries.is_empty())
        && made_by_nvidia(meta, policy_uid)
}

/// The OS pool whose driver DaemonSet takes over NVIDIA's: the pool NVIDIA's driver image was built for (its tag
/// ends `-<os><version>`, e.g. `570.148.08-ubuntu22.04`), or the only pool. NVIDIA's operator runs one driver image
/// for the whole cluster, so on nodes of any other pool its pods never held a working driver.
pub fn driver_pool(
    nvidia_driver: &DaemonSet,
    pools: &BTreeSet<OsPool>,
) -> Result<OsPool, HandoverError> {
    let image = nvidia_driver
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|pod| {
            pod.containers
                .iter()
                .find(|container| container.name == "nvidia-driver-ctr")
                .or(pod.containers.first())
        })
        .and_then(|container| container.image.clone())
        .unwrap_or_default();
    let tag = image
        .rsplit_once('/')
        .map_or(image.as_str(), |(_, name)| name)
        .split_once(':')
        .map(|(_, tag)| tag)
        .unwrap_or_default();
    if let Some(pool) = pools.iter().find(|pool| tag.ends_with(&format!("-{pool}"))) {
        return Ok(pool.clone());
    }
    match pools.iter().collect::<Vec<_>>()[..] {
        [only] => Ok(only.clone()),
        _ => Err(HandoverError::DriverPoolUnknown {
            image,
            pools: pools
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Puts the existing DaemonSet's selector into the rendered body, since a selector cannot change, and its labels
/// onto the rendered pods, so that it selects them: NVIDIA's select by `app` (which the rendered pods carry with the
/// same value) and, for feature discovery and the validator, `app.kubernetes.io/part-of` (`nvidia-gpu` for feature
/// discovery, where the rendered pods say `gpu-operator`; no selector of this operator's reads that label).
pub fn keep_selector(body: &mut Value, existing: &DaemonSet) -> Result<(), HandoverError> {
    let selector = &existing.spec.selector;
    if selector
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(HandoverError::SelectorWithExpressions {
            name: existing.metadata.name.clone().unwrap_or_default(),
        });
    }
    let wanted = selector.match_labels.clone().unwrap_or_default();
    let pod_labels = &mut body["spec"]["template"]["metadata"]["labels"];
    if !pod_labels.is_object() {
        *pod_labels = serde_json::json!({});
    }
    for (key, value) in &wanted {
        pod_labels[key] = Value::String(value.clone());
    }
    body["spec"]["selector"] = serde_json::json!({ "matchLabels": wanted });
    Ok(())
}

/// A driver DaemonSet is taken over only with the OnDelete strategy, so that its new template reaches no
/// running pod.
pub fn require_on_delete(body: &Value, name: &str) -> Result<(), HandoverError> {
    let strategy = body["spec"]["updateStrategy"]["type"]
        .as_str()
        .unwrap_or("RollingUpdate");
    if strategy == "OnDelete" {
        Ok(())
    } else {
        Err(HandoverError::DriverNotOnDelete {
            name: name.into(),
            strategy: strategy.into(),
        })
    }
}

/// The managed fields after the handover: every field NVIDIA's operator (or anyone) set with a plain update is
/// owned by `manager`'s apply, merged with what `manager` applied before. The next apply then removes each of
/// those fields that the render does not have, as it does for fields this operator applied earlier; fields set
/// through a subresource (the DaemonSet controller's status) keep their owners.
pub fn take_ownership(entries: &[ManagedFieldsEntry], manager: &str) -> Vec<ManagedFieldsEntry> {
    let (handed, mut kept): (Vec<_>, Vec<_>) = entries.iter().cloned().partition(|entry| {
        entry.subresource.as_deref().unwrap_or_default().is_empty()
            && (entry.operation.as_deref() == Some("Update")
                || (entry.operation.as_deref() == Some("Apply")
                    && entry.manager.as_deref() == Some(manager)))
    });
    if handed.is_empty() {
        return kept;
    }
    let mut fields = Value::Object(serde_json::Map::new());
    for entry in &handed {
        if let Some(FieldsV1(set)) = &entry.fields_v1 {
            merge_field_sets(&mut fields, set);
        }
    }
    let api_version = handed.iter().find_map(|entry| entry.api_version.clone());
    kept.push(ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some("Apply".into()),
        api_version,
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(fields)),
        time: handed.iter().filter_map(|entry| entry.time.clone()).max(),
        subresource: None,
    });
    kept
}

/// The union of two field sets (FieldsV1: nested objects keyed `f:<name>`, `k:<key>`, `v:<value>` or `.`).
fn merge_field_sets(into: &mut Value, from: &Value) {
    let (Value::Object(into), Value::Object(from)) = (into, from) else {
        return;
    };
    for (key, value) in from {
        match into.get_mut(key) {
            Some(existing) => merge_field_sets(existing, value),
            None => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
    use serde_json::json;

    const POLICY_UID: &str = "policy-uid";

    fn owned_by(uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "nvidia.com/v1".into(),
            kind: "ClusterPolicy".into(),
            name: "cluster-policy".into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: Some(true),
        }
    }

    fn meta(labels: &[(&str, &str)], owners: Vec<OwnerReference>) -> ObjectMeta {
        ObjectMeta {
            name: Some("nvidia-device-plugin-daemonset".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            owner_references: Some(owners),
            ..ObjectMeta::default()
        }
    }

    /// NVIDIA's driver DaemonSet as its operator writes it: selector `app`, one driver image for all nodes.
    fn nvidia_driver(image: &str) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some(NVIDIA_DRIVER_DAEMONSET.into()),
                ..meta(
                    &[("app", NVIDIA_DRIVER_DAEMONSET)],
                    vec![owned_by(POLICY_UID, true)],
                )
            },
            spec: DaemonSetSpec {
                selector: LabelSelector {
                    match_labels: Some([("app".into(), NVIDIA_DRIVER_DAEMONSET.into())].into()),
                    match_expressions: None,
                },
                template: PodTemplateSpec {
                    metadata: None,
                    spec: Some(PodSpec {
                        init_containers: Some(vec![Container {
                            name: "k8s-driver-manager".into(),
                            image: Some(
                                "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.0".into(),
                            ),
                            ..Container::default()
                        }]),
                        containers: vec![Container {
                            name: "nvidia-driver-ctr".into(),
                            image: Some(image.into()),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                ..DaemonSetSpec::default()
            },
            status: None,
        }
    }

    fn pool(id: &str, version_id: &str) -> OsPool {
        OsPool {
            id: id.into(),
            version_id: version_id.into(),
        }
    }

    fn managed(manager: &str, operation: &str) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            api_version: Some("apps/v1".into()),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn only_nvidias_objects_of_this_policy_are_taken_over() {
        // NVIDIA's chart labels NVIDIA's DaemonSets as this operator labels its own, and NVIDIA's operator writes
        // them under the same manager name, with plain updates.
        let mut nvidia = meta(
            &[
                ("app", "x"),
                (crate::render::MANAGED_BY_LABEL, crate::render::MANAGER),
            ],
            vec![owned_by(POLICY_UID, true)],
        );
        nvidia.managed_fields = Some(vec![
            managed("gpu-operator", "Update"),
            ManagedFieldsEntry {
                subresource: Some("status".into()),
                ..managed("kube-controller-manager", "Update")
            },
        ]);
        assert!(made_by_nvidia(&nvidia, POLICY_UID));
        assert!(cached_made_by_nvidia(&nvidia, POLICY_UID));
        assert!(!made_by_nvidia(&nvidia, "another-policy"));
        let mut ours = nvidia.clone();
        ours.managed_fields
            .get_or_insert_default()
            .push(managed("gpu-operator", "Apply"));
        assert!(!made_by_nvidia(&ours, POLICY_UID));
        assert!(!cached_made_by_nvidia(&ours, POLICY_UID));
        let mut applied_by_another = nvidia.clone();
        applied_by_another.managed_fields = Some(vec![managed("helm", "Apply")]);
        assert!(made_by_nvidia(&applied_by_another, POLICY_UID));
        let not_controlled = meta(&[], vec![owned_by(POLICY_UID, false)]);
        assert!(!made_by_nvidia(&not_controlled, POLICY_UID));
        assert!(!made_by_nvidia(&meta(&[], Vec::new()), POLICY_UID));
        // A cached object whose writers are not known is taken as this operator's.
        let unknown = meta(&[], vec![owned_by(POLICY_UID, true)]);
        assert!(!cached_made_by_nvidia(&unknown, POLICY_UID));
    }

    #[test]
    fn the_driver_goes_to_the_pool_its_image_was_built_for() {
        let pools: BTreeSet<_> = [pool("rhel", "9.4"), pool("ubuntu", "22.04")].into();
        let driver = nvidia_driver("nvcr.io/nvidia/driver:570.148.08-ubuntu22.04");
        assert_eq!(driver_pool(&driver, &pools), Ok(pool("ubuntu", "22.04")));
        // A registry with a port has a colon before the tag's.
        let driver = nvidia_driver("registry.local:5000/nvidia/driver:570.148.08-rhel9.4");
        assert_eq!(driver_pool(&driver, &pools), Ok(pool("rhel", "9.4")));
    }

    #[test]
    fn a_driver_image_naming_no_pool_fits_only_a_single_pool() {
        let driver = nvidia_driver("nvcr.io/nvidia/driver@sha256:0123");
        let one: BTreeSet<_> = [pool("ubuntu", "24.04")].into();
        assert_eq!(driver_pool(&driver, &one), Ok(pool("ubuntu", "24.04")));
        let two: BTreeSet<_> = [pool("rhel", "9.4"), pool("ubuntu", "24.04")].into();
        assert_eq!(
            driver_pool(&driver, &two),
            Err(HandoverError::DriverPoolUnknown {
                image: "nvcr.io/nvidia/driver@sha256:0123".into(),
                pools: "rhel9.4, ubuntu24.04".into(),
            })
        );
    }

    #[test]
    fn the_existing_selector_replaces_the_rendered_one_and_the_pods_carry_it() {
        let existing = nvidia_driver("driver:1-ubuntu22.04");
        let mut body = json!({"spec": {
            "selector": {"matchLabels": {"app": NVIDIA_DRIVER_DAEMONSET, "nvidia.com/gpu-operator.daemonset": NVIDIA_DRIVER_DAEMONSET}},
            "template": {"metadata": {"labels": {"app": NVIDIA_DRIVER_DAEMONSET, "nvidia.com/gpu-operator.daemonset": NVIDIA_DRIVER_DAEMONSET}}},
        }});
        keep_selector(&mut body, &existing).unwrap();
        assert_eq!(
            body["spec"]["selector"],
            json!({"matchLabels": {"app": NVIDIA_DRIVER_DAEMONSET}})
        );
        assert_eq!(
            body["spec"]["template"]["metadata"]["labels"],
            json!({"app": NVIDIA_DRIVER_DAEMONSET, "nvidia.com/gpu-operator.daemonset": NVIDIA_DRIVER_DAEMONSET})
        );
    }

    #[test]
    fn feature_discoverys_part_of_label_is_kept_on_its_pods() {
        let mut existing = nvidia_driver("unused");
        existing.spec.selector.match_labels = Some(
            [
                ("app".into(), "gpu-feature-discovery".into()),
                ("app.kubernetes.io/part-of".into(), "nvidia-gpu".into()),
            ]
            .into(),
        );
        let mut body = json!({"spec": {"template": {"metadata": {"labels": {
            "app": "gpu-feature-discovery", "app.kubernetes.io/part-of": "gpu-operator",
        }}}}});
        keep_selector(&mut body, &existing).unwrap();
        let pod_labels = &body["spec"]["template"]["metadata"]["labels"];
        assert_eq!(pod_labels["app.kubernetes.io/part-of"], "nvidia-gpu");
        assert_eq!(body["spec"]["selector"]["matchLabels"], *pod_labels);
    }

    #[test]
    fn a_driver_is_taken_over_only_on_delete() {
        let on_delete = json!({"spec": {"updateStrategy": {"type": "OnDelete"}}});
        assert_eq!(require_on_delete(&on_delete, "d"), Ok(()));
        let rolling = json!({"spec": {"updateStrategy": {"type": "RollingUpdate"}}});
        assert_eq!(
            require_on_delete(&rolling, "d"),
            Err(HandoverError::DriverNotOnDelete {
                name: "d".into(),
                strategy: "RollingUpdate".into()
            })
        );
        assert!(require_on_delete(&json!({"spec": {}}), "d").is_err());
    }

    fn entry(
        manager: &str,
        operation: &str,
        subresource: Option<&str>,
        fields: Value,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            api_version: Some("apps/v1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            subresource: subresource.map(Into::into),
            time: Some(Time("2026-11-01T10:00:00Z".parse().expect("a timestamp"))),
        }
    }

    #[test]
    fn updates_are_handed_to_our_apply_and_status_keeps_its_owner() {
        let entries = [
            entry(
                "gpu-operator",
                "Update",
                None,
                json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"nvidia-driver-ctr\"}": {".": {}, "f:image": {}}}}}}}),
            ),
            entry(
                "kubectl-edit",
                "Update",
                None,
                json!({"f:spec": {"f:template": {"f:spec": {"f:volumes": {".": {}}}}}}),
            ),
            entry(
                "kube-controller-manager",
                "Update",
                Some("status"),
                json!({"f:status": {"f:numberReady": {}}}),
            ),
        ];
        let handed = take_ownership(&entries, "gpu-operator");
        assert_eq!(handed.len(), 2, "{handed:#?}");
        assert_eq!(handed[0], entries[2], "the status entry is kept as it was");
        let ours = &handed[1];
        assert_eq!(ours.manager.as_deref(), Some("gpu-operator"));
        assert_eq!(ours.operation.as_deref(), Some("Apply"));
        assert_eq!(ours.subresource, None);
        assert_eq!(
            ours.fields_v1.as_ref().map(|f| &f.0),
            Some(&json!({"f:spec": {"f:template": {"f:spec": {
                "f:containers": {"k:{\"name\":\"nvidia-driver-ctr\"}": {".": {}, "f:image": {}}},
                "f:volumes": {".": {}},
            }}}}))
        );
    }

    #[test]
    fn our_earlier_apply_is_merged_not_duplicated() {
        let entries = [
            entry(
                "gpu-operator",
                "Apply",
                None,
                json!({"f:metadata": {"f:labels": {}}}),
            ),
            entry("gpu-operator", "Update", None, json!({"f:spec": {}})),
        ];
        let handed = take_ownership(&entries, "gpu-operator");
        assert_eq!(handed.len(), 1, "one apply entry per manager: {handed:#?}");
        assert_eq!(
            handed[0].fields_v1.as_ref().map(|f| &f.0),
            Some(&json!({"f:metadata": {"f:labels": {}}, "f:spec": {}}))
        );
        let applies_only = [entry("helm", "Apply", None, json!({"f:spec": {}}))];
        assert_eq!(take_ownership(&applies_only, "gpu-operator"), applies_only);
    }
}

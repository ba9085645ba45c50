//! NVIDIADriver objects in a ClusterPolicy reconcile. Observe assigns the GPU nodes to them (the pure
//! `plan::driver_assignment`); rendering makes one DaemonSet family per accepted object; after the apply each
//! object's status says what became of it, and a refusal is also a Warning Event on the object.
//!
//! A refused object keeps the DaemonSets it already has: an edit that reaches into another object's nodes is
//! refused, and the drivers it ran before keep running on its nodes until the edit is undone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crd::nvidia_driver::{NVIDIADriver, NvidiaDriverStatus};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::warn;

use super::{Context, ReconcileError, publish_event};
use crate::crd_install::FIELD_MANAGER;
use crate::model::facts::has_nvidia_gpu;
use crate::model::{AssignedDriver, ValidatedPolicy};
use crate::plan::driver_assignment::{Assignment, DriverClaim, assign};
use crate::plan::nvidia_driver_status::{self, CONFLICT_REASON, Outcome};
use crate::render::RenderedObject;
use crd::labels::DRIVER_OWNER;

/// The NVIDIADriver objects and which GPU nodes each drives.
pub(super) struct DriverObjects {
    /// Whether the ClusterPolicy hands the drivers to NVIDIADriver objects (`driver.useNvidiaDriverCRD`).
    enabled: bool,
    objects: Vec<Arc<NVIDIADriver>>,
    assignment: Assignment,
    /// The accepted object of each node it drives.
    owners: BTreeMap<String, String>,
}

impl DriverObjects {
    /// observe: the objects in the watch cache (those being deleted left out) and their nodes among the GPU nodes
    /// of `nodes`.
    pub(super) fn observe(
        policy: &ValidatedPolicy,
        nodes: &[Arc<Node>],
        store: &Store<NVIDIADriver>,
    ) -> Self {
        let enabled = policy.spec.driver.use_nvidia_driver_crd == Some(true);
        let mut objects: Vec<Arc<NVIDIADriver>> = store
            .state()
            .into_iter()
            .filter(|object| object.meta().deletion_timestamp.is_none())
            .collect();
        objects.sort_by_key(|object| object.name_any());
        let assignment = if enabled {
            let claims: Vec<DriverClaim> = objects
                .iter()
                .map(|object| DriverClaim {
                    name: object.name_any(),
                    selector: object.spec.node_selector(),
                    default: object.spec.default,
                    settled: nvidia_driver_status::accepted(
                        object.status.as_ref(),
                        object.meta().generation,
                    ),
                    created: object.creation_timestamp().map(|time| time.0),
                })
                .collect();
            let gpu_nodes: Vec<(String, BTreeMap<String, String>)> = nodes
                .iter()
                .filter(|node| has_nvidia_gpu(node.labels()))
                .map(|node| (node.name_any(), node.labels().clone()))
                .collect();
            assign(&claims, &gpu_nodes)
        } else {
            Assignment::default()
        };
        let owners = assignment
            .accepted
            .iter()
            .flat_map(|(object, nodes)| nodes.iter().map(|node| (node.clone(), object.clone())))
            .collect();
        Self {
            enabled,
            objects,
            assignment,
            owners,
        }
    }

    /// The object to name in `node`'s owner label: the accepted object that drives it, else a refused object the
    /// label already names (its kept DaemonSets still run there).
    pub(super) fn owner(&self, node: &str, current: &BTreeMap<String, String>) -> Option<String> {
        self.owners.get(node).cloned().or_else(|| {
            current
                .get(DRIVER_OWNER)
                .filter(|owner| self.assignment.refused.contains_key(*owner))
                .cloned()
        })
    }

    /// The accepted objects with their nodes, for rendering.
    pub(super) fn accepted(&self) -> Vec<AssignedDriver> {
        self.objects
            .iter()
            .filter_map(|object| {
                let nodes = self.assignment.accepted.get(&object.name_any())?;
                Some(AssignedDriver {
                    name: object.name_any(),
                    spec: object.spec.clone(),
                    nodes: nodes.iter().cloned().collect(),
                })
            })
            .collect()
    }

    /// The existing DaemonSets of refused objects, which the apply keeps.
    pub(super) fn kept(&self, daemonsets: &[Arc<DaemonSet>]) -> BTreeSet<String> {
        daemonsets
            .iter()
            .filter(|daemonset| {
                daemonset
                    .labels()
                    .get(DRIVER_OWNER)
                    .is_some_and(|object| self.assignment.refused.contains_key(object))
            })
            .map(|daemonset| daemonset.name_any())
            .collect()
    }

    /// status: each object's status written where it changed, and a Warning Event on each newly refused object.
    pub(super) async fn report(
        &self,
        rendered: &[RenderedObject],
        context: &Context,
        now: &Time,
    ) -> Result<(), ReconcileError> {
        let rendered = rendered_by_object(rendered);
        let cached = context.daemonsets.state();
        let daemonsets: BTreeMap<String, &DaemonSet> = cached
            .iter()
            .map(|daemonset| (daemonset.name_any(), daemonset.as_ref()))
            .collect();
        let none = Vec::new();
        for object in &self.objects {
            let name = object.name_any();
            let outcome = if !self.enabled {
                Outcome::Disabled
            } else if let Some(conflict) = self.assignment.refused.get(&name) {
                Outcome::Refused(conflict)
            } else {
                Outcome::Accepted {
                    nodes: self.assignment.accepted.get(&name).map_or(0, Vec::len),
                    rendered: rendered.get(&name).unwrap_or(&none),
                    daemonsets: &daemonsets,
                }
            };
            let previous = object.status.clone().unwrap_or_default();
            let status = nvidia_driver_status::compute(
                &outcome,
                &context.namespace,
                object.meta().generation,
                &previous.conditions,
                now,
            );
            if status == previous {
                continue;
            }
            if let Outcome::Refused(conflict) = &outcome
                && !refused(&previous)
            {
                warn!(nvidiadriver = %name, %conflict, "NVIDIADriver refused");
                publish_event(
                    &context.recorder,
                    &object.object_ref(&()),
                    "Assign",
                    EventType::Warning,
                    CONFLICT_REASON,
                    &conflict.to_string(),
                )
                .await;
            }
            write_status(&name, &status, context).await?;
        }
        Ok(())
    }
}

/// Whether `status` reports a refusal.
fn refused(status: &NvidiaDriverStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|condition| condition.reason == CONFLICT_REASON)
}

/// The names of the rendered DaemonSets of each NVIDIADriver object.
fn rendered_by_object(rendered: &[RenderedObject]) -> BTreeMap<String, Vec<String>> {
    let mut by_object: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for object in rendered {
        if let RenderedObject::DaemonSet(daemonset) = object
            && let Some(owner) = daemonset.labels().get(DRIVER_OWNER)
        {
            by_object
                .entry(owner.clone())
                .or_default()
                .push(daemonset.name_any());
        }
    }
    by_object
}

async fn write_status(
    name: &str,
    status: &NvidiaDriverStatus,
    context: &Context,
) -> Result<(), ReconcileError> {
    let api = Api::<NVIDIADriver>::all(context.client.clone());
    let patch =
        json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "status": status});
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|source| ReconcileError::NvidiaDriverStatus {
        name: name.to_owned(),
        source,
    })?;
    Ok(())
}

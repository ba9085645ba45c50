//! apply: server-side apply of the rendered objects under one field manager, owned by the ClusterPolicy, and
//! pruning of what is no longer rendered (a disabled component's objects disappear). An object whose rendered
//! form has not changed since this process last applied it, and that still exists, is not written again.
//! DaemonSets that NVIDIA's operator made for the same ClusterPolicy are taken over in place (see `handover`).

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use crd::ClusterPolicy;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::runtime::reflector::store::WriterDropped;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tracing::{debug, info};

use crate::crd_install::FIELD_MANAGER;
use crate::handover::{self, HandoverError, NVIDIA_DRIVER_DAEMONSET};
use crate::model::{ClusterFacts, Component, OsPool};
use crate::render::RenderedObject;

/// Label every rendered object carries; pruning only ever considers objects with it.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=gpu-operator";

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("applying {kind} {namespace}/{name}: {source}")]
    Apply {
        kind: &'static str,
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("deleting {kind} {namespace}/{name}: {source}")]
    Delete {
        kind: &'static str,
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("listing {kind} objects to prune: {source}")]
    List {
        kind: &'static str,
        source: kube::Error,
    },
    #[error("the ClusterPolicy has no uid yet")]
    NoOwner,
    #[error("reading DaemonSet {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("taking over NVIDIA's DaemonSet {namespace}/{name}: {source}")]
    TakeOver {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Handover(#[from] HandoverError),
}

/// Rendered objects by kind and name.
type ObjectSet = BTreeSet<(&'static str, String)>;

/// What one apply pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ApplySummary {
    pub applied: usize,
    pub unchanged: usize,
    pub pruned: usize,
    /// Objects whose API the cluster does not serve (e.g. ServiceMonitor without the Prometheus operator).
    pub skipped: Vec<String>,
}

/// Which version of an object an apply left: what was rendered, and the object's version after the write.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Applied {
    fingerprint: u64,
    version: Option<String>,
}

/// Applies and prunes the operator's objects in one namespace. Remembers what it applied, so that a watch
/// event that changes nothing costs no write.
pub struct Applier {
    client: Client,
    namespace: String,
    daemonsets: Store<DaemonSet>,
    services: Store<Service>,
    last_applied: Mutex<HashMap<(&'static str, String), Applied>>,
    /// The owner uid and object set of the last prune that completed. Reconciles that render the same set (every
    /// DaemonSet status change during a rollout) skip the three LIST requests a prune costs: what this operator
    /// owns changes only through it, and the first prune after a start always lists.
    last_pruned: Mutex<Option<(String, ObjectSet)>>,
    /// The uid of a policy for which NVIDIA's driver DaemonSet was looked up and not found: nothing makes one
    /// later (NVIDIA's operator is gone by then), so it is not asked for again.
    no_nvidia_driver: Mutex<Option<String>>,
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Applier {
    pub fn new(
        client: Client,
        namespace: String,
        daemonsets: Store<DaemonSet>,
        services: Store<Service>,
    ) -> Self {
        Self {
            client,
            namespace,
            daemonsets,
            services,
            last_applied: Mutex::default(),
            last_pruned: Mutex::default(),
            no_nvidia_driver: Mutex::default(),
        }
    }

    /// Waits until the caches of the objects it applies hold their first full list.
    pub async fn caches_synced(&self) -> Result<(), WriterDropped> {
        self.daemonsets.wait_until_ready().await?;
        self.services.wait_until_ready().await
    }

    /// Applies `objects` and prunes the policy's other objects, except the DaemonSets named in `kept`.
    pub async fn apply(
        &self,
        owner: &ClusterPolicy,
        objects: &[RenderedObject],
        kept: &BTreeSet<String>,
    ) -> Result<ApplySummary, ApplyError> {
        let owner_ref = owner.controller_owner_ref(&()).ok_or(ApplyError::NoOwner)?;
        let mut summary = ApplySummary::default();
        for object in objects {
            let kind = object.kind();
            let name = object.name();
            let mut body = object.to_json();
            body["metadata"]["ownerReferences"] = serde_json::json!([owner_ref]);
            let fingerprint = fingerprint(&body);
            let key = (kind, name.clone());
            if let Some(version) = self.cached_version(kind, &name)
                && self.remembered(&key)
                    == Some(Applied {
                        fingerprint,
                        version,
                    })
            {
                summary.unchanged += 1;
                continue;
            }
            if kind == "DaemonSet" {
                let cached = self
                    .daemonsets
                    .get(&ObjectRef::new(&name).within(&self.namespace));
                match cached {
                    // One taken over from NVIDIA's operator keeps NVIDIA's selector for good, since a selector
                    // cannot change; for this operator's own it is the rendered one, and nothing changes. NVIDIA's
                    // chart labels NVIDIA's DaemonSets as this operator's, so they are cached too: one this
                    // operator's apply has not written yet is taken over first.
                    Some(existing)
                        if !handover::cached_made_by_nvidia(
                            &existing.metadata,
                            &owner.uid().unwrap_or_default(),
                        ) =>
                    {
                        handover::keep_selector(&mut body, &existing)?;
                    }
                    _ => self.take_over_nvidias(owner, object, &mut body).await?,
                }
            }
            let api = self.api_for(object);
            match api
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await
            {
                Ok(written) => {
                    debug!(kind, %name, "applied");
                    let version = version_of(kind, &written.metadata);
                    self.remember(
                        key,
                        Applied {
                            fingerprint,
                            version,
                        },
                    );
                    summary.applied += 1;
                }
                Err(kube::Error::Api(status)) if status.code == 404 && kind == "ServiceMonitor" => {
                    summary.skipped.push(format!(
                        "ServiceMonitor {name}: the cluster has no monitoring.coreos.com/v1 API (install the Prometheus operator, or set dcgmExporter.serviceMonitor.enabled=false)"
                    ));
                }
                Err(source) => {
                    return Err(ApplyError::Apply {
                        kind,
                        namespace: self.namespace.clone(),
                        name,
                        source,
                    });
                }
            }
        }
        summary.pruned = self.prune(owner, objects, kept).await?;
        Ok(summary)
    }

    /// The OS pool whose driver DaemonSet takes over NVIDIA's `nvidia-driver-daemonset` (see
    /// [`handover::driver_pool`]), when NVIDIA's operator made one for `owner`; also once it has been taken over
    /// and carries this operator's labels, so that the name sticks. Asks the API server only until it has once
    /// found none for this policy.
    pub async fn nvidia_driver_pool(
        &self,
        owner: &ClusterPolicy,
        facts: &ClusterFacts,
    ) -> Result<Option<OsPool>, ApplyError> {
        let pools = facts.os_pools();
        if pools.is_empty() {
            // No pool, no driver DaemonSet rendered: nothing takes NVIDIA's over yet.
            return Ok(None);
        }
        let owner_uid = owner.uid().unwrap_or_default();
        let cached = self
            .daemonsets
            .get(&ObjectRef::new(NVIDIA_DRIVER_DAEMONSET).within(&self.namespace));
        let driver = match cached {
            Some(ours) => Some(DaemonSet::clone(&ours)),
            None => {
                let looked_up_before = self
                    .no_nvidia_driver
                    .lock()
                    .is_ok_and(|none| none.as_deref() == Some(owner_uid.as_str()));
                if looked_up_before {
                    return Ok(None);
                }
                let nvidias = self
                    .nvidias_daemonset(NVIDIA_DRIVER_DAEMONSET, &owner_uid)
                    .await?;
                if nvidias.is_none()
                    && let Ok(mut none) = self.no_nvidia_driver.lock()
                {
                    *none = Some(owner_uid.clone());
                }
                nvidias
            }
        };
        match driver {
            Some(driver) => Ok(Some(handover::driver_pool(&driver, &pools)?)),
            None => Ok(None),
        }
    }

    /// The DaemonSet `name`, read from the API server, when NVIDIA's operator made it for the ClusterPolicy
    /// `policy_uid` and this operator has not taken it over (see [`handover::made_by_nvidia`]).
    async fn nvidias_daemonset(
        &self,
        name: &str,
        policy_uid: &str,
    ) -> Result<Option<DaemonSet>, ApplyError> {
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &self.namespace);
        let found = api.get_opt(name).await.map_err(|source| ApplyError::Read {
            namespace: self.namespace.clone(),
            name: name.into(),
            source,
        })?;
        Ok(found.filter(|ds| handover::made_by_nvidia(&ds.metadata, policy_uid)))
    }

    /// Prepares the apply of a DaemonSet this operator has not applied yet: when NVIDIA's operator made one of
    /// that name for `owner`, its selector goes into `body` and its fields are handed to this operator's apply,
    /// so that the apply changes it in place into the rendered one.
    async fn take_over_nvidias(
        &self,
        owner: &ClusterPolicy,
        object: &RenderedObject,
        body: &mut serde_json::Value,
    ) -> Result<(), ApplyError> {
        let name = object.name();
        let Some(existing) = self
            .nvidias_daemonset(&name, &owner.uid().unwrap_or_default())
            .await?
        else {
            return Ok(());
        };
        if object.component() == Component::Driver {
            handover::require_on_delete(body, &name)?;
        }
        handover::keep_selector(body, &existing)?;
        let managed = handover::take_ownership(
            existing
                .metadata
                .managed_fields
                .as_deref()
                .unwrap_or_default(),
            FIELD_MANAGER,
        );
        // The resourceVersion test makes the hand-over fail, rather than hand over fields it has not seen, when
        // the object changed since it was read; the next reconcile reads it again.
        let patch = serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": existing.metadata.resource_version},
            {"op": "replace", "path": "/metadata/managedFields", "value": managed},
        ]);
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(|error| ApplyError::TakeOver {
                namespace: self.namespace.clone(),
                name: name.clone(),
                source: kube::Error::SerdeError(error),
            })?;
        // Which managers' fields were handed over, for whoever reads the log after a switch.
        let handed_over: Vec<&str> = existing
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|entry| entry.manager.as_deref())
            .collect();
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &self.namespace);
        api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .map_err(|source| ApplyError::TakeOver {
                namespace: self.namespace.clone(),
                name: name.clone(),
                source,
            })?;
        info!(%name, ?handed_over, "taking over NVIDIA's DaemonSet in place");
        Ok(())
    }

    /// The version of the cached object (see [`version_of`]); `None` when it is not cached, and kinds without a
    /// local cache are always applied (the API server answers a no-op apply cheaply).
    fn cached_version(&self, kind: &str, name: &str) -> Option<Option<String>> {
        match kind {
            "DaemonSet" => self
                .daemonsets
                .get(&ObjectRef::new(name).within(&self.namespace))
                .map(|daemonset| version_of(kind, &daemonset.metadata)),
            "Service" => self
                .services
                .get(&ObjectRef::new(name).within(&self.namespace))
                .map(|service| version_of(kind, &service.metadata)),
            _ => None,
        }
    }

    fn remembered(&self, key: &(&'static str, String)) -> Option<Applied> {
        self.last_applied
            .lock()
            .ok()
            .and_then(|map| map.get(key).cloned())
    }

    fn remember(&self, key: (&'static str, String), applied: Applied) {
        if let Ok(mut map) = self.last_applied.lock() {
            map.insert(key, applied);
        }
    }

    fn api_for(&self, object: &RenderedObject) -> Api<DynamicObject> {
        let resource = api_resource(object.kind());
        Api::namespaced_with(self.client.clone(), &self.namespace, &resource)
    }

    /// Deletes the operator's objects of this policy that were not rendered this time and are not kept.
    async fn prune(
        &self,
        owner: &ClusterPolicy,
        objects: &[RenderedObject],
        kept: &BTreeSet<String>,
    ) -> Result<usize, ApplyError> {
        let wanted: ObjectSet = objects
            .iter()
            .map(|o| (o.kind(), o.name()))
            .chain(kept.iter().map(|name| ("DaemonSet", name.clone())))
            .collect();
        let pruned = (owner.uid().unwrap_or_default(), wanted);
        if self
            .last_pruned
            .lock()
            .is_ok_and(|last| last.as_ref() == Some(&pruned))
        {
            return Ok(0);
        }
        let removal = self
            .delete_owned(owner, &pruned.1, &DeleteParams::background(), false)
            .await?;
        if let Ok(mut last) = self.last_pruned.lock() {
            *last = Some(pruned);
        }
        Ok(removal.deleted)
    }

    /// Deletes every object of this policy in the foreground, so that each stays (terminating) until its pods
    /// have stopped; returns how many are still there. The policy's cleanup waits for none, so that no operand
    /// writes a label or a GPUNode after the cleanup removed it.
    pub async fn remove_all(&self, owner: &ClusterPolicy) -> Result<usize, ApplyError> {
        if let Ok(mut last) = self.last_pruned.lock() {
            *last = None;
        }
        let removal = self
            .delete_owned(owner, &BTreeSet::new(), &DeleteParams::foreground(), true)
            .await?;
        Ok(removal.present)
    }

    /// Deletes the policy's objects not in `wanted`; those NVIDIA's operator made (labelled as this operator's by
    /// NVIDIA's chart, see `handover`) only with `nvidias_too`: after a switch, NVIDIA's DaemonSets of parts this
    /// operator does not run are left to the user.
    async fn delete_owned(
        &self,
        owner: &ClusterPolicy,
        wanted: &BTreeSet<(&str, String)>,
        params: &DeleteParams,
        nvidias_too: bool,
    ) -> Result<Removal, ApplyError> {
        let owner_uid = owner.uid().unwrap_or_default();
        let mut removal = Removal::default();
        for kind in ["DaemonSet", "Service", "ServiceMonitor"] {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &self.namespace, &api_resource(kind));
            let existing = match api
                .list_metadata(&ListParams::default().labels(MANAGED_BY_SELECTOR))
                .await
            {
                Ok(list) => list.items,
                Err(kube::Error::Api(status)) if status.code == 404 => continue,
                Err(source) => return Err(ApplyError::List { kind, source }),
            };
            for object in existing {
                let name = object.name_any();
                let owned = object.owner_references().iter().any(|r| r.uid == owner_uid);
                if !owned
                    || wanted.contains(&(kind, name.clone()))
                    || (!nvidias_too && handover::made_by_nvidia(&object.metadata, &owner_uid))
                {
                    continue;
                }
                removal.present += 1;
                if object.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                match api.delete(&name, params).await {
                    // Already gone (the garbage collector, or an earlier pass): nothing left to do.
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(source) => {
                        return Err(ApplyError::Delete {
                            kind,
                            namespace: self.namespace.clone(),
                            name: name.clone(),
                            source,
                        });
                    }
                }
                if let Ok(mut map) = self.last_applied.lock() {
                    map.remove(&(kind, name.clone()));
                }
                info!(kind, %name, "deleted");
                removal.deleted += 1;
            }
        }
        Ok(removal)
    }
}

/// What one [`Applier::delete_owned`] pass did.
#[derive(Debug, Default)]
struct Removal {
    /// Deletions it asked for.
    deleted: usize,
    /// Objects it found (those deleted included), terminating or not.
    present: usize,
}

fn api_resource(kind: &str) -> ApiResource {
    let gvk = match kind {
        "DaemonSet" => GroupVersionKind::gvk("apps", "v1", "DaemonSet"),
        "Service" => GroupVersionKind::gvk("", "v1", "Service"),
        _ => GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
    };
    ApiResource::from_gvk(&gvk)
}

/// What tells that someone changed an object since the operator applied it. A DaemonSet's generation changes with
/// every change of its spec and not with its status, which its controller writes all the time. A Service has no
/// generation and no status the operator's Services use, so its resourceVersion serves.
fn version_of(kind: &str, metadata: &ObjectMeta) -> Option<String> {
    match kind {
        "DaemonSet" => metadata.generation.map(|generation| generation.to_string()),
        _ => metadata.resource_version.clone(),
    }
}

/// A stable hash of an object's rendered JSON (serde_json maps are ordered, so equal objects hash equal).
fn fingerprint(body: &serde_json::Value) -> u64 {
    let mut hasher = DefaultHasher::new();
    body.to_string().hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_resources_have_the_right_plurals() {
        assert_eq!(api_resource("DaemonSet").plural, "daemonsets");
        assert_eq!(api_resource("Service").api_version, "v1");
        assert_eq!(api_resource("ServiceMonitor").plural, "servicemonitors");
    }

    #[test]
    fn fingerprints_change_with_content_only() {
        let a = serde_json::json!({"a": 1, "b": [1, 2]});
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_ne!(
            fingerprint(&a),
            fingerprint(&serde_json::json!({"a": 2, "b": [1, 2]}))
        );
    }
}

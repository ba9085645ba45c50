//! `gpu-operator uninstall`, which the chart's pre-delete hook runs before Helm deletes anything. Helm deletes a
//! release's objects together, the operator's Deployment and its RBAC among them, so a ClusterPolicy deleted by
//! Helm would keep its finalizer with no operator left to run it, and stay Terminating with its operands, node
//! labels and GPUNodes behind. The hook deletes the ClusterPolicies first and waits while the running operator
//! cleans up; with `--crds` (NVIDIA's `operator.cleanupCRD`) it then deletes the operator's CRDs. It also deletes the
//! HAMi webhook's configuration, which the operator made: left behind, it would refuse HAMi pods with no webhook
//! to answer.

use std::time::{Duration, Instant};

use crd::ClusterPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use tracing::info;

/// How often the remaining ClusterPolicies are listed while the operator cleans up.
const POLL: Duration = Duration::from_secs(1);
/// How many conflicting deletes of one ClusterPolicy are tried again.
const CONFLICT_RETRIES: u32 = 3;
/// How often the wait is reported in the log.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error(
        "listing ClusterPolicies: {0} (the hook's ServiceAccount needs list and delete on clusterpolicies.nvidia.com)"
    )]
    List(#[source] kube::Error),
    #[error("deleting ClusterPolicy {name}: {source}")]
    Delete { name: String, source: kube::Error },
    #[error(
        "ClusterPolicies {names:?} still exist after {seconds} s: the operator has not finished their cleanup. Check \
         that it runs (`kubectl logs deploy/gpu-operator` in its namespace) and retry the uninstall; to uninstall \
         without it, remove each finalizer (`kubectl patch clusterpolicy <name> --type=json -p \
         '[{{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}}]'`), then the nvidia.com/ node labels and the \
         GPUNodes yourself"
    )]
    Timeout { names: Vec<String>, seconds: u64 },
    #[error(
        "deleting CRD {name}: {source} (the hook's ServiceAccount needs delete on customresourcedefinitions {name})"
    )]
    DeleteCrd { name: String, source: kube::Error },
    #[error(
        "{0} (the hook's ServiceAccount needs delete on mutatingwebhookconfigurations gpu-operator-hami and validatingwebhookconfigurations gpu-operator-node-bound-evictions)"
    )]
    DeleteWebhook(#[source] crate::webhook::tls::TlsError),
}

/// Deletes every ClusterPolicy and waits up to `timeout` until the operator has finalized them all; then, when
/// `delete_crds`, deletes the operator's CRDs. Returns the names of the ClusterPolicies it deleted.
///
/// # Errors
/// When the API refuses a list or delete, or a ClusterPolicy is still there after `timeout`.
pub async fn uninstall(
    client: &Client,
    timeout: Duration,
    delete_crds: bool,
) -> Result<Vec<String>, UninstallError> {
    let policies: Api<ClusterPolicy> = Api::all(client.clone());
    let deleted = remaining(&policies).await?;
    for name in &deleted {
        // The hook runs once (a failed one fails the uninstall): a conflict with a write in between is retried here.
        let mut conflicts = 0;
        loop {
            match policies.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    info!(clusterpolicy = %name, "deleted; waiting for the operator's cleanup")
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(kube::Error::Api(status))
                    if status.code == 409 && conflicts < CONFLICT_RETRIES =>
                {
                    conflicts += 1;
                    continue;
                }
                Err(source) => {
                    return Err(UninstallError::Delete {
                        name: name.clone(),
                        source,
                    });
                }
            }
            break;
        }
    }
    let started = Instant::now();
    let mut reported = started;
    loop {
        let names = remaining(&policies).await?;
        if names.is_empty() {
            break;
        }
        if started.elapsed() >= timeout {
            return Err(UninstallError::Timeout {
                names,
                seconds: timeout.as_secs(),
            });
        }
        if reported.elapsed() >= PROGRESS_EVERY {
            reported = Instant::now();
            info!(clusterpolicies = ?names, waited_s = started.elapsed().as_secs(), "still cleaning up");
        }
        tokio::time::sleep(POLL).await;
    }
    info!(clusterpolicies = ?deleted, took = ?started.elapsed(), "cleaned up");
    crate::webhook::delete_unserved_configurations(client, None)
        .await
        .map_err(UninstallError::DeleteWebhook)?;
    if delete_crds {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in crd::crds::all() {
            let name = crd.name_any();
            // Read first, so that an uninstall run again writes nothing for what is gone.
            let refused = |source| UninstallError::DeleteCrd {
                name: name.clone(),
                source,
            };
            if crds.get_opt(&name).await.map_err(refused)?.is_none() {
                continue;
            }
            match crds.delete(&name, &DeleteParams::default()).await {
                Ok(_) => info!(crd = %name, "deleted"),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => return Err(UninstallError::DeleteCrd { name, source }),
            }
        }
    }
    Ok(deleted)
}

/// The names of the ClusterPolicies that still exist, terminating or not.
async fn remaining(policies: &Api<ClusterPolicy>) -> Result<Vec<String>, UninstallError> {
    let list = policies
        .list_metadata(&ListParams::default())
        .await
        .map_err(UninstallError::List)?;
    Ok(list.items.iter().map(ResourceExt::name_any).collect())
}

#[cfg(test)]
#[path = "uninstall_tests.rs"]
mod tests;

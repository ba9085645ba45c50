//! A node's pods as the drain sees them: listed from the API server for each node that handles pods (its pods,
//! those the policy's selectors pick, the DRA claims they hold), read into [`decide::PodFacts`].

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use tracing::warn;

use super::controller::{Context, UpgradeError};
use super::decide::{self, NodeFacts};
use super::facts::{self, PodContext};
use super::settings::Settings;
use crd::driver_upgrade::UpgradeState;

/// The pods on a node that handles pods, with what makes them GPU users and what the policy's selectors say.
pub(super) async fn read_pods(
    node: &NodeFacts,
    settings: &Settings,
    context: &Context,
) -> Result<Vec<decide::PodFacts>, UpgradeError> {
    let api = Api::<Pod>::all(context.client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={}", node.name));
    let pods = api
        .list(&on_node)
        .await
        .map_err(|source| UpgradeError::ListPods {
            node: node.name.clone(),
            source,
        })?
        .items;
    let uids_matching = |field: &'static str, selector: &str| {
        let params = on_node.clone().labels(selector);
        let api = api.clone();
        let selector = selector.to_owned();
        async move {
            api.list(&params)
                .await
                .map(|list| {
                    list.items
                        .iter()
                        .filter_map(|p| p.uid())
                        .collect::<BTreeSet<String>>()
                })
                .map_err(|source| UpgradeError::Selector {
                    field,
                    selector,
                    source,
                })
        }
    };
    let awaited = match &settings.wait_for_completion {
        Some(wait) if node.state() == Some(UpgradeState::WaitForJobsRequired) => {
            uids_matching(
                "driver.upgradePolicy.waitForCompletion.podSelector",
                &wait.pod_selector,
            )
            .await?
        }
        _ => BTreeSet::new(),
    };
    let drain_selected = match settings
        .drain
        .as_ref()
        .and_then(|d| d.pod_selector.as_deref())
    {
        Some(selector) if node.state() == Some(UpgradeState::DrainRequired) => {
            Some(uids_matching("driver.upgradePolicy.drain.podSelector", selector).await?)
        }
        _ => None,
    };
    let dra_holders = dra_holders(&pods, context).await;
    let process_pods = context
        .gpu_nodes
        .get(&ObjectRef::new(&node.name))
        .and_then(|gpu_node| gpu_node.status.as_ref().map(|s| s.gpu_process_pods.clone()))
        .unwrap_or_default();
    let refusals = context
        .refusals
        .lock()
        .map(|r| r.clone())
        .unwrap_or_default();
    let pod_context = PodContext {
        namespace: &context.namespace,
        process_pods: &process_pods,
        dra_holders: &dra_holders,
        awaited: &awaited,
        drain_selected: drain_selected.as_ref(),
        refusals: &refusals,
    };
    Ok(pods
        .iter()
        .map(|pod| facts::pod_facts(pod, &pod_context))
        .collect())
}

/// The pods (UIDs) among `pods` that hold a ResourceClaim our DRA driver allocated. A claim that cannot be read
/// is logged and counts as not ours: the pod may still be a GPU user by its processes.
async fn dra_holders(pods: &[Pod], context: &Context) -> BTreeSet<String> {
    let mut holders = BTreeSet::new();
    for pod in pods {
        let Some(statuses) = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
        else {
            continue;
        };
        let namespace = pod.namespace().unwrap_or_default();
        let api = Api::<ResourceClaim>::namespaced(context.client.clone(), &namespace);
        for claim in statuses
            .iter()
            .filter_map(|s| s.resource_claim_name.as_deref())
        {
            match api.get_opt(claim).await {
                Ok(Some(claim)) => {
                    let ours = claim
                        .status
                        .as_ref()
                        .and_then(|s| s.allocation.as_ref())
                        .and_then(|a| a.devices.as_ref())
                        .is_some_and(|d| {
                            d.results
                                .iter()
                                .flatten()
                                .any(|r| r.driver == crd::dra::DRIVER)
                        });
                    if ours {
                        holders.extend(pod.uid());
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    warn!(%error, pod = %pod.name_any(), claim, "reading a pod's ResourceClaim failed")
                }
            }
        }
    }
    holders
}

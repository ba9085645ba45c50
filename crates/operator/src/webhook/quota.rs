//! GPU quota kept across the HAMi conversion. The conversion takes `nvidia.com/gpu` (and HAMi's `gpumem`,
//! `gpucores`) out of the pod and asks for claims instead, so a ResourceQuota on those names no longer charges it.
//! The API server charges claims to `<class>.deviceclass.resource.k8s.io/devices` instead: where a namespace's
//! quota limits a GPU resource the pod asked for but not the devices of the classes its claims use, the pod is
//! refused, naming the quota and the entry to add, rather than admitted past the quota.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::hami::ResourceNames;

/// The quota name under which the API server charges the devices of claims of `class`.
#[must_use]
pub fn devices_of_class(class: &str) -> String {
    format!("{class}.deviceclass.resource.k8s.io/devices")
}

/// The GPU resources of HAMi's (by the cluster's `names`) that `pod` asks for (before the conversion), in any
/// container.
fn asked_gpu_resources<'a>(pod: &Pod, names: &'a ResourceNames) -> BTreeSet<&'a str> {
    let charged = names.quota_charged();
    let spec = pod.spec.iter();
    let containers = spec.flat_map(|spec| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
    });
    let mut asked = BTreeSet::new();
    for resources in containers.filter_map(|container| container.resources.as_ref()) {
        for list in [&resources.limits, &resources.requests]
            .into_iter()
            .flatten()
        {
            asked.extend(charged.iter().filter(|name| list.contains_key(**name)));
        }
    }
    asked
}

/// The DeviceClasses the claims of `templates` ask for.
fn classes_of(templates: &[ResourceClaimTemplate]) -> BTreeSet<String> {
    templates
        .iter()
        .filter_map(|template| template.spec.as_ref()?.spec.as_ref()?.devices.as_ref())
        .flat_map(|devices| devices.requests.iter().flatten())
        .flat_map(|request| {
            let exactly = request
                .exactly
                .iter()
                .map(|exactly| exactly.device_class_name.clone());
            let sub = request
                .first_available
                .iter()
                .flatten()
                .map(|sub| sub.device_class_name.clone());
            exactly.chain(sub).collect::<Vec<_>>()
        })
        .collect()
}

/// Why `pod`, converted onto claims from `templates`, would escape one of `quotas` (pure): each quota that limits
/// a GPU resource the pod asked for (`nvidia.com/gpu`, `requests.nvidia.com/gpu`, `limits.nvidia.com/gpu`, and the
/// same of HAMi's names) but not the devices of every class the claims use.
///
/// # Errors
/// The refusal, naming the quota, what it limits and the entry to add.
pub fn check(
    pod: &Pod,
    templates: &[ResourceClaimTemplate],
    quotas: &[ResourceQuota],
    names: &ResourceNames,
) -> Result<(), String> {
    let asked = asked_gpu_resources(pod, names);
    let classes = classes_of(templates);
    for quota in quotas {
        let hard = quota.spec.as_ref().and_then(|spec| spec.hard.as_ref());
        let Some(hard) = hard else { continue };
        let limited: Vec<&str> = hard
            .keys()
            .filter(|key| {
                let name = key
                    .strip_prefix("requests.")
                    .or_else(|| key.strip_prefix("limits."))
                    .unwrap_or(key);
                asked.contains(name)
            })
            .map(String::as_str)
            .collect();
        if limited.is_empty() {
            continue;
        }
        let missing: Vec<String> = classes
            .iter()
            .map(|class| devices_of_class(class))
            .filter(|entry| !hard.contains_key(entry))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "ResourceQuota {} limits {} in this namespace, and this pod's GPUs become DRA claims, which that \
                 quota charges as {}: add {} to the quota's spec.hard so that the claims are charged",
                quota.name_any(),
                limited.join(", "),
                missing.join(", "),
                missing
                    .iter()
                    .map(|entry| format!("`{entry}`"))
                    .collect::<Vec<_>>()
                    .join(" and "),
            ));
        }
    }
    Ok(())
}

/// The ResourceQuotas of `namespace`.
///
/// # Errors
/// When the API refuses.
pub async fn of_namespace(
    client: &Client,
    namespace: &str,
) -> Result<Vec<ResourceQuota>, kube::Error> {
    Ok(Api::<ResourceQuota>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(limits: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
        }))
        .unwrap()
    }

    fn template(class: &str) -> ResourceClaimTemplate {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "hami-gpu-1"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": class, "count": 1,
            }}]}}},
        }))
        .unwrap()
    }

    fn quota(hard: serde_json::Value) -> ResourceQuota {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"},
            "spec": {"hard": hard},
        }))
        .unwrap()
    }

    const SHARED: &str = "shared.gpu.nvidia.com";

    fn share() -> Pod {
        pod(json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}))
    }

    /// The check of [`share`] with a shared-GPU claim template, under HAMi's default names.
    fn check_share(quotas: &[ResourceQuota]) -> Result<(), String> {
        check(
            &share(),
            &[template(SHARED)],
            quotas,
            &ResourceNames::default(),
        )
    }

    #[test]
    fn a_gpu_quota_without_the_claims_class_refuses_the_pod_and_names_the_fix() {
        let why = check_share(&[quota(json!({"requests.nvidia.com/gpu": "4"}))]).unwrap_err();
        assert!(
            why.contains("ResourceQuota gpus limits requests.nvidia.com/gpu"),
            "{why}"
        );
        assert!(
            why.contains("add `shared.gpu.nvidia.com.deviceclass.resource.k8s.io/devices`"),
            "{why}"
        );
    }

    #[test]
    fn hamis_own_names_and_every_prefix_count_as_gpu_quota() {
        for key in [
            "nvidia.com/gpumem",
            "limits.nvidia.com/gpu",
            "nvidia.com/gpu",
        ] {
            let quotas = [quota(json!({key: "10"}))];
            assert!(check_share(&quotas).is_err(), "{key}");
        }
    }

    #[test]
    fn a_quota_that_charges_the_claims_class_admits_the_pod() {
        let quotas = [quota(json!({
            "requests.nvidia.com/gpu": "4",
            devices_of_class(SHARED): "4",
        }))];
        assert_eq!(check_share(&quotas), Ok(()));
    }

    #[test]
    fn quotas_on_other_resources_are_not_the_webhooks_concern() {
        let quotas = [quota(json!({"requests.cpu": "4", "pods": "10"}))];
        assert_eq!(check_share(&quotas), Ok(()));
        // A quota on HAMi's cores is not one on a pod that asks only for memory.
        let quotas = [quota(json!({"nvidia.com/gpucores": "100"}))];
        assert_eq!(check_share(&quotas), Ok(()));
    }

    #[test]
    fn renamed_resources_charge_quota_under_the_clusters_names() {
        let names = ResourceNames::renamed_example();
        let renamed = pod(json!({"example.com/vgpu": 1, "example.com/vgpu-memory": 3000}));
        let quotas = [quota(json!({"requests.example.com/vgpu": "4"}))];
        assert!(check(&renamed, &[template(SHARED)], &quotas, &names).is_err());
        // HAMi's default names are no GPU quota on such a cluster.
        let quotas = [quota(json!({"requests.nvidia.com/gpu": "4"}))];
        assert_eq!(
            check(&renamed, &[template(SHARED)], &quotas, &names),
            Ok(())
        );
    }
}

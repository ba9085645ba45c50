//! DRA shares: the memory a pod's ResourceClaims consumed on a shared GPU of this node, which is the pod's budget
//! there. A claim's allocation names devices by driver, pool and device name; the node's ResourceSlices give each
//! device's `uuid` attribute (NVIDIA's DRA driver's attribute name, which ours keeps). Claims are read once their
//! allocation is known (it does not change), slices again when a device is not found in them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::ListParams;
use kube::{Api, Client};
use tracing::debug;

use super::assess::ClaimShare;
use crate::accounting::Accounting;
use crate::accounting::pods::PodIndex;
use crd::quantity::parse_bytes as parse_quantity;

use crd::dra::{ATTRIBUTE_UUID as UUID_ATTRIBUTE, CAPACITY_MEMORY as MEMORY_CAPACITY, DRIVER};

/// A device of the driver's slices: pool and device name.
type DeviceKey = (String, String);

/// What one claim's allocation consumed on each device of the driver, in bytes.
#[must_use]
pub fn consumed(claim: &ResourceClaim) -> Vec<(DeviceKey, u64)> {
    claim
        .status
        .iter()
        .filter_map(|status| {
            status
                .allocation
                .as_ref()?
                .devices
                .as_ref()?
                .results
                .as_ref()
        })
        .flatten()
        .filter(|result| result.driver == DRIVER)
        .filter_map(|result| {
            let memory = result.consumed_capacity.as_ref()?.get(MEMORY_CAPACITY)?;
            let bytes = parse_quantity(&memory.0).ok()?;
            Some(((result.pool.clone(), result.device.clone()), bytes))
        })
        .collect()
}

/// Each device of the slices by its GPU UUID attribute.
#[must_use]
pub fn device_uuids(slices: &[ResourceSlice]) -> BTreeMap<DeviceKey, String> {
    crd::dra::driver_devices(slices)
        .filter_map(|(slice, device)| {
            let uuid = crd::dra::text_attribute(device, UUID_ATTRIBUTE)?;
            Some((
                (slice.spec.pool.name.clone(), device.name.clone()),
                uuid.to_owned(),
            ))
        })
        .collect()
}

/// The claims and slices read so far.
pub struct Claims {
    client: Client,
    node: String,
    /// `namespace/name` → what it consumed (claims seen allocated).
    consumed: BTreeMap<String, Vec<(DeviceKey, u64)>>,
    devices: BTreeMap<DeviceKey, String>,
}

impl std::fmt::Debug for Claims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claims")
            .field("node", &self.node)
            .field("claims", &self.consumed.len())
            .finish_non_exhaustive()
    }
}

impl Claims {
    /// Nothing read yet.
    #[must_use]
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            client,
            node: node.to_owned(),
            consumed: BTreeMap::new(),
            devices: BTreeMap::new(),
        }
    }

    /// The shares of this node's pods on its GPUs. A claim or slice that cannot be read costs only its share
    /// (logged): its pod then has no DRA budget this pass.
    pub async fn shares(&mut self, pods: &PodIndex, accounting: &Accounting) -> Vec<ClaimShare> {
        let wanted: BTreeSet<String> = pods
            .iter()
            .flat_map(|pod| {
                pod.claims
                    .iter()
                    .map(|claim| format!("{}/{claim}", pod.namespace))
            })
            .collect();
        self.consumed.retain(|key, _| wanted.contains(key));
        let unread: Vec<&String> = wanted
            .iter()
            .filter(|key| !self.consumed.contains_key(*key))
            .collect();
        for key in unread {
            let Some((namespace, name)) = key.split_once('/') else {
                continue;
            };
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(Some(claim))
                    if claim
                        .status
                        .as_ref()
                        .is_some_and(|s| s.allocation.is_some()) =>
                {
                    self.consumed.insert(key.clone(), consumed(&claim));
                }
                Ok(_) => {}
                Err(error) => debug!(claim = %key, %error, "cannot read the ResourceClaim"),
            }
        }
        let missing = self
            .consumed
            .values()
            .flatten()
            .any(|(device, _)| !self.devices.contains_key(device));
        if missing {
            let api: Api<ResourceSlice> = Api::all(self.client.clone());
            let params = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
            match api.list(&params).await {
                Ok(slices) => self.devices = device_uuids(&slices.items),
                Err(error) => debug!(%error, "cannot list this node's ResourceSlices"),
            }
        }
        let node_gpus: BTreeSet<&str> = accounting
            .gpus
            .iter()
            .map(|gpu| gpu.uuid.as_str())
            .collect();
        let mut shares = Vec::new();
        for pod in pods.iter() {
            for claim in &pod.claims {
                let Some(consumed) = self.consumed.get(&format!("{}/{claim}", pod.namespace))
                else {
                    continue;
                };
                for (device, bytes) in consumed {
                    if let Some(uuid) = self.devices.get(device)
                        && node_gpus.contains(uuid.as_str())
                    {
                        shares.push(ClaimShare {
                            pod: (pod.namespace.clone(), pod.name.clone()),
                            gpu_uuid: uuid.clone(),
                            bytes: *bytes,
                        });
                    }
                }
            }
        }
        shares
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_synthetic_claim_consumes_memory_on_the_gpu_its_slice_names() {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "notebook-gpu", "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0",
                 "shareID": "1c7a", "consumedCapacity": {"memory": "3000Mi", "cores": "30"}},
                {"request": "nic", "driver": "net.example.com", "pool": "node-a", "device": "eth1",
                 "consumedCapacity": {"memory": "1Gi"}}
            ]}}}
        }))
        .unwrap();
        let slice: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "node-a-gpu.nvidia.com-x"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                     "devices": [
                        {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-aaaa"}, "type": {"string": "gpu"}}},
                        {"name": "gpu-1", "attributes": {"uuid": {"string": "GPU-bbbb"}}}
                     ]}
        }))
        .unwrap();
        let consumed = consumed(&claim);
        assert_eq!(
            consumed,
            vec![(
                ("node-a".to_owned(), "gpu-0".to_owned()),
                3000 * 1024 * 1024
            )]
        );
        let uuids = device_uuids(&[slice]);
        assert_eq!(
            uuids.get(&consumed[0].0).map(String::as_str),
            Some("GPU-aaaa")
        );
    }
}

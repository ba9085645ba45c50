//! What the driver reports in a prepared claim's own status (`status.devices`, KEP-4817): for each shared device,
//! what holds the claim to its share, so that `kubectl get resourceclaim -o yaml` answers "is my memory limit hard"
//! without a look at the node. Whole devices are the claim's alone and get no entry.
//!
//! The entries are written by server-side apply to the status subresource, after the kubelet has its answer: a
//! prepare never waits on this write, and a failed write is logged, not retried (the next prepare of the claim,
//! after a driver restart, writes it again). The API server lets a node's driver write only the claims allocated
//! on its node (the chart's RBAC and `node-bound-writes.yaml`).

use crd::dra::{DRIVER, MemoryEnforcement};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tracing::{debug, warn};

use crate::cdi::PreparedDevice;

/// The field manager of the driver's entries.
const FIELD_MANAGER: &str = "gpu-dra-driver";

/// The status patch for claim `namespace/name` prepared with `devices`, or `None` when it has no shared device.
#[must_use]
pub fn patch(namespace: &str, name: &str, devices: &[PreparedDevice]) -> Option<Value> {
    let entries: Vec<Value> = devices
        .iter()
        .filter_map(|device| {
            let limits = device.limits.as_ref()?;
            let mut entry = json!({
                "driver": DRIVER,
                "pool": device.pool,
                "device": device.device,
                "data": {
                    "memoryEnforcement": limits.enforcement,
                    "memoryMiB": limits.memory_mib,
                    "cores": limits.cores,
                    "memoryEnforcedBy": match limits.enforcement {
                        MemoryEnforcement::Driver =>
                            "the GPU driver caps the container's cgroup (allocations past it fail)",
                        MemoryEnforcement::MpsPinned =>
                            "the claim's MPS daemon pins each client's device memory",
                    },
                },
            });
            if let Some(share) = &device.share_id {
                entry["shareID"] = json!(share);
            }
            Some(entry)
        })
        .collect();
    (!entries.is_empty()).then(|| {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name},
            "status": {"devices": entries},
        })
    })
}

/// Writes the claim's status entries for `devices`, if it has any to write.
pub async fn write(client: kube::Client, namespace: &str, name: &str, devices: &[PreparedDevice]) {
    let Some(patch) = patch(namespace, name, devices) else {
        return;
    };
    let api = Api::<ResourceClaim>::namespaced(client, namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match api.patch_status(name, &params, &Patch::Apply(&patch)).await {
        Ok(_) => debug!(claim = %format!("{namespace}/{name}"), "device status written"),
        Err(error) => {
            warn!(claim = %format!("{namespace}/{name}"), %error, "cannot write the claim's device status");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::cdi::ShareLimits;

    fn device(name: &str, limits: Option<ShareLimits>) -> PreparedDevice {
        PreparedDevice {
            requests: vec!["gpu".into()],
            pool: "node-1".into(),
            device: name.into(),
            share_id: limits.as_ref().map(|_| format!("share-{name}")),
            uuid: "GPU-1".into(),
            device_nodes: vec![],
            limits,
            on_demand: None,
            mig_instance: None,
        }
    }

    #[test]
    fn shared_devices_say_what_holds_their_memory_and_whole_devices_say_nothing() {
        let shared = device(
            "gpu-1",
            Some(ShareLimits {
                memory_mib: 2048,
                cores: 30,
                mps_dir: PathBuf::new(),
                enforcement: MemoryEnforcement::Driver,
            }),
        );
        let written = patch("team", "claim-a", &[device("gpu-0", None), shared]).unwrap();
        assert_eq!(written["metadata"]["name"], "claim-a");
        let entries = written["status"]["devices"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{written:#}");
        assert_eq!(entries[0]["driver"], "gpu.nvidia.com");
        assert_eq!(entries[0]["pool"], "node-1");
        assert_eq!(entries[0]["device"], "gpu-1");
        assert_eq!(entries[0]["shareID"], "share-gpu-1");
        assert_eq!(entries[0]["data"]["memoryEnforcement"], "driver");
        assert_eq!(entries[0]["data"]["memoryMiB"], 2048);
        assert_eq!(entries[0]["data"]["cores"], 30);
        assert_eq!(patch("team", "claim-b", &[device("gpu-0", None)]), None);
    }
}

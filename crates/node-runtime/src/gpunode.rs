//! The node's GPUNode: created by whichever role starts first, owned by the Node (so it is garbage-collected with
//! it), and its status written by server-side apply with one field manager per role
//! ([`crd::gpu_node::field_manager`]). Each role sends every field it owns each time; a field it stops sending (a
//! cleared `lastError`) is removed, and fields the other roles own are left alone. A status equal to the last one
//! written is not written again.

use crd::gpu_node::{GPUNode, GpuNodeSpec, GpuNodeStatus};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::debug;

use crate::inventory::{self, GpuView};
use crate::kube_io::KubeError;

/// Writes one role's part of the node's GPUNode status.
#[derive(Debug, Clone)]
pub struct GpuNodeWriter {
    api: Api<GPUNode>,
    name: String,
    manager: &'static str,
    /// The Node that owns the GPUNode, once [`GpuNodeWriter::ensure`] ran: to create it again if it is deleted.
    owner: Option<OwnerReference>,
    last: Option<GpuNodeStatus>,
}

impl GpuNodeWriter {
    /// The writer for `node`'s GPUNode under field manager `manager`.
    #[must_use]
    pub fn new(client: Client, node: &str, manager: &'static str) -> Self {
        Self {
            api: Api::all(client),
            name: node.to_owned(),
            manager,
            owner: None,
            last: None,
        }
    }

    /// Creates the GPUNode when it is missing, owned by `node`.
    ///
    /// # Errors
    /// When it can be neither read nor created.
    pub async fn ensure(&mut self, node: &Node) -> Result<(), KubeError> {
        self.owner = Some(owner(node));
        let during = || KubeError::during(format!("creating GPUNode {}", self.name));
        if self
            .api
            .get_opt(&self.name)
            .await
            .map_err(during())?
            .is_some()
        {
            return Ok(());
        }
        self.create().await
    }

    /// Creates the GPUNode, owned by the Node [`GpuNodeWriter::ensure`] saw.
    async fn create(&self) -> Result<(), KubeError> {
        let during = || KubeError::during(format!("creating GPUNode {}", self.name));
        let mut object = GPUNode::new(&self.name, GpuNodeSpec {});
        object.metadata.owner_references = self.owner.clone().map(|owner| vec![owner]);
        match self.api.create(&PostParams::default(), &object).await {
            Ok(_) => Ok(()),
            // The other role created it in the meantime.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(error) => Err(during()(error)),
        }
    }

    /// The status as stored now, for what a restarted role continues from (e.g. when its state last changed).
    ///
    /// # Errors
    /// When the GPUNode cannot be read.
    pub async fn stored(&self) -> Result<Option<GpuNodeStatus>, KubeError> {
        let object = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(KubeError::during(format!("reading GPUNode {}", self.name)))?;
        Ok(object.and_then(|object| object.status))
    }

    /// Writes this role's fields when they differ from what it wrote last; returns whether it wrote.
    ///
    /// # Errors
    /// When the API server refuses the apply.
    pub async fn publish(&mut self, status: GpuNodeStatus) -> Result<bool, KubeError> {
        let compared = comparable(&status);
        if self.last.as_ref() == Some(&compared) {
            return Ok(false);
        }
        let mut sent = status;
        sent.updated_at = Some(Time(Timestamp::now()));
        let body = json!({
            "apiVersion": GPUNode::api_version(&()),
            "kind": GPUNode::kind(&()),
            "metadata": {"name": self.name},
            "status": sent,
        });
        let params = PatchParams::apply(self.manager).force();
        let during = || KubeError::during(format!("writing the status of GPUNode {}", self.name));
        match self
            .api
            .patch_status(&self.name, &params, &Patch::Apply(&body))
            .await
        {
            // Someone deleted the GPUNode: create it again (the Node still exists, or this agent would not run).
            Err(kube::Error::Api(status)) if status.code == 404 && self.owner.is_some() => {
                self.create().await?;
                self.api
                    .patch_status(&self.name, &params, &Patch::Apply(&body))
                    .await
                    .map_err(during())?;
            }
            result => {
                result.map_err(during())?;
            }
        }
        debug!(manager = self.manager, "GPUNode status written");
        self.last = Some(compared);
        Ok(true)
    }
}

/// The status without the times that change on every write: two statuses that say the same are equal.
fn comparable(status: &GpuNodeStatus) -> GpuNodeStatus {
    let mut status = status.clone();
    status.updated_at = None;
    if let Some(error) = status.last_error.as_mut() {
        error.time = None;
    }
    status
}

/// The owner reference that ties a GPUNode's life to its Node. Not a controller reference and without
/// `blockOwnerDeletion`, which would need rights on the Node's finalizers.
fn owner(node: &Node) -> OwnerReference {
    OwnerReference {
        api_version: Node::api_version(&()).into_owned(),
        kind: Node::kind(&()).into_owned(),
        name: node.name_any(),
        uid: node.uid().unwrap_or_default(),
        ..OwnerReference::default()
    }
}

/// The fields both roles report the same way: inventory, product and GPU count.
#[must_use]
pub fn inventory_status(gpus: &[GpuView]) -> GpuNodeStatus {
    GpuNodeStatus {
        product: inventory::product(gpus),
        gpu_count: i32::try_from(gpus.len()).unwrap_or(i32::MAX),
        gpus: inventory::gpu_infos(gpus),
        ..GpuNodeStatus::default()
    }
}

/// The `lastError` entry of a component.
#[must_use]
pub fn node_error(component: &str, message: impl Into<String>) -> crd::gpu_node::NodeError {
    crd::gpu_node::NodeError {
        component: component.to_owned(),
        message: message.into(),
        time: Some(Time(Timestamp::now())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::simulated;

    #[test]
    fn owner_is_the_node() {
        let mut node = Node::default();
        node.metadata.name = Some("gpu-a100-0".into());
        node.metadata.uid = Some("1234".into());
        let owner = owner(&node);
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.api_version.as_str(),
                owner.uid.as_str()
            ),
            ("Node", "v1", "1234")
        );
        assert_eq!(owner.block_owner_deletion, None);
    }

    #[test]
    fn times_do_not_make_a_status_different() {
        let mut first = GpuNodeStatus {
            last_error: Some(node_error("mig-manager", "x")),
            ..GpuNodeStatus::default()
        };
        let second = GpuNodeStatus {
            last_error: Some(node_error("mig-manager", "x")),
            updated_at: Some(Time(Timestamp::now())),
            ..GpuNodeStatus::default()
        };
        assert_eq!(comparable(&first), comparable(&second));
        first.last_error = Some(node_error("mig-manager", "y"));
        assert_ne!(comparable(&first), comparable(&second));
    }

    #[test]
    fn inventory_status_counts_and_names_the_gpus() {
        let (_dir, simulator) = simulated("h100-80gb:8", &[]);
        let gpus = inventory::read(simulator.as_ref()).unwrap();
        let status = inventory_status(&gpus);
        assert_eq!(status.gpu_count, 8);
        assert_eq!(status.product.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(status.gpus.len(), 8);
    }
}

#[cfg(test)]
#[path = "gpunode_tests.rs"]
mod api_tests;

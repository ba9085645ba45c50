//! What every node role does first: take its node and namespace from the command line ([`NodeArgs`]), connect to
//! the API server, read its own Node, and open the GPUs (the Node's `nvidia.com/gpu.simulator` annotation serves
//! `--simulate node`).

use clap::Args;
use crd::labels::SIMULATED_GPUS_ANNOTATION;
use k8s_openapi::api::core::v1::Node;
use kube::Client;

use crate::backend::{GpuSource, Gpus};
use crate::gpunode::GpuNodeWriter;
use crate::kube_io::{self, KubeError, NodeApi, NodeEvents};

/// The node a role runs for and the operator's namespace, as the DaemonSets pass them.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Name of this node.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Namespace of the operator, its operands and their ConfigMaps.
    #[arg(long, env = "OPERATOR_NAMESPACE", default_value = "gpu-operator")]
    pub namespace: String,
}

/// A started role: its client, its Node as read at start, and the GPUs.
#[derive(Clone)]
pub struct NodeRole {
    /// The API client.
    pub client: Client,
    /// This node.
    pub node_api: NodeApi,
    /// This node as read at start.
    pub node: Node,
    /// The node's GPUs.
    pub gpus: Gpus,
}

impl std::fmt::Debug for NodeRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRole")
            .field("node", &self.node_api.name())
            .field("gpus", &self.gpus)
            .finish_non_exhaustive()
    }
}

impl NodeRole {
    /// Connects, reads the Node called `node_name` and opens the GPUs `source` names.
    ///
    /// # Errors
    /// When the API server cannot be reached, the Node cannot be read, or the GPUs cannot be opened.
    pub async fn start(source: &GpuSource, node_name: &str) -> anyhow::Result<Self> {
        let client = kube_io::client().await?;
        let node_api = NodeApi::new(client.clone(), node_name);
        let node = node_api.get().await?;
        let gpus = Gpus::open(
            source,
            Some(node_name),
            kube_io::annotation(&node, SIMULATED_GPUS_ANNOTATION),
        )?;
        Ok(Self {
            client,
            node_api,
            node,
            gpus,
        })
    }

    /// The writer of this role's GPUNode status fields under `field_manager`, the GPUNode created if missing.
    ///
    /// # Errors
    /// When the GPUNode can be neither read nor created.
    pub async fn gpu_node_writer(
        &self,
        field_manager: &'static str,
    ) -> Result<GpuNodeWriter, KubeError> {
        let mut writer =
            GpuNodeWriter::new(self.client.clone(), self.node_api.name(), field_manager);
        writer.ensure(&self.node).await?;
        Ok(writer)
    }

    /// Events on this Node, reported by `controller`.
    #[must_use]
    pub fn events(&self, controller: &str) -> NodeEvents {
        NodeEvents::new(self.client.clone(), controller, &self.node)
    }
}

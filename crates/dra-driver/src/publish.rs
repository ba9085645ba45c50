//! Keeps the driver's ResourceSlice and its GPUNode status true: on every change of the Node (its partition
//! labels), of the slice (the kubelet deletes a node's slices when it starts), of the prepared claims, of the GPUs'
//! health, and every minute (MIG changes), it reads the GPUs, publishes the devices to the gRPC services and writes
//! what differs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crd::dra::Partition;
use crd::gpu_node::GpuNodeStatus;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use node_runtime::gpunode::{GpuNodeWriter, inventory_status};
use node_runtime::health::Faults;
use node_runtime::kube_io::{self, NodeEvents};
use node_runtime::run_loop::run_on_changes;
use tokio::sync::{Notify, watch};
use tracing::info;

use crate::claims::Claims;
use crate::health;
use crate::slices::{self, DriverDevice};
use crate::status;

/// What a pass works from: the Node and the slice as stored (a change of the prepared claims sends them again).
#[derive(Debug, Clone)]
struct Inputs {
    node: Node,
    slice: Option<ResourceSlice>,
}

/// The publisher's state between passes.
pub struct Publisher {
    /// The API client.
    pub client: Client,
    /// This node's name.
    pub node: String,
    /// The GPUs.
    pub gpus: node_runtime::backend::Gpus,
    /// The ClusterPolicy's partition, which node labels override.
    pub defaults: Partition,
    /// Where the gRPC services read the devices from.
    pub devices: watch::Sender<Vec<DriverDevice>>,
    /// The Unhealthy GPUs, whose devices are tainted.
    pub faults: watch::Receiver<Faults>,
    /// The prepared claims.
    pub claims: Arc<Claims>,
    /// GPUNode status writer.
    pub gpu_node: GpuNodeWriter,
    /// Events on the Node.
    pub events: NodeEvents,
    /// Label errors already reported by an Event (each is reported once).
    pub reported: BTreeSet<String>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// The devices of the node as labelled now, and the label errors (each names the label and the fix).
    ///
    /// # Errors
    /// When the GPUs cannot be read.
    pub fn devices(&self, node: &Node) -> anyhow::Result<(Vec<DriverDevice>, Vec<String>)> {
        let (partition, errors) = crd::dra::partition(&self.defaults, node.labels());
        let warnings = errors
            .iter()
            .map(|(label, error)| {
                format!("label {label}: {error}; using the ClusterPolicy's default")
            })
            .collect();
        let views = node_runtime::inventory::read(self.gpus.backend())?;
        let mut devices = slices::devices(&views, &partition);
        health::taint_unhealthy(&mut devices, &self.faults.borrow());
        Ok((devices, warnings))
    }

    /// Runs until the watches end: one pass per change, and every minute.
    pub async fn run(mut self, changed: Arc<Notify>) -> anyhow::Result<()> {
        let inputs = watch_inputs(&self.client, &self.node, changed);
        run_on_changes(
            inputs,
            Some(Duration::from_secs(60)),
            async |inputs: Option<Inputs>| match inputs {
                Some(inputs) => self.pass(&inputs).await,
                None => Ok(()),
            },
        )
        .await;
        anyhow::bail!("the watches of the Node and the ResourceSlice ended")
    }

    async fn pass(&mut self, inputs: &Inputs) -> anyhow::Result<()> {
        let (devices, warnings) = self.devices(&inputs.node)?;
        for warning in &warnings {
            if self.reported.insert(warning.clone()) {
                self.events.publish(true, "InvalidDRALabel", warning).await;
            }
        }
        self.devices.send_if_modified(|published| {
            let changed = *published != devices;
            if changed {
                *published = devices.clone();
            }
            changed
        });
        let uid = inputs.node.uid().unwrap_or_default();
        let stored = inputs.slice.as_ref();
        let generation = stored.map_or(0, |slice| slice.spec.pool.generation);
        let wanted = slices::slice(&self.node, &uid, generation, &devices);
        let same = stored.is_some_and(|slice| slices::same_slice(slice, &wanted));
        if !same {
            // A new generation tells the scheduler to forget the pool's older slices.
            let wanted = slices::slice(&self.node, &uid, generation + 1, &devices);
            let params = PatchParams::apply(crd::gpu_node::field_manager::DRA_DRIVER).force();
            let name = slices::slice_name(&self.node);
            Api::<ResourceSlice>::all(self.client.clone())
                .patch(&name, &params, &Patch::Apply(&wanted))
                .await
                .with_context(|| format!("publishing ResourceSlice {name}"))?;
            info!(
                devices = devices.len(),
                generation = generation + 1,
                "ResourceSlice published"
            );
        }
        let views = node_runtime::inventory::read(self.gpus.backend())?;
        let prepared = self.claims.prepared().await;
        let status = GpuNodeStatus {
            dra: Some(status::status(
                &devices,
                &prepared,
                self.claims.starts_mps(),
                warnings,
            )),
            ..inventory_status(&views)
        };
        self.gpu_node.publish(status).await?;
        Ok(())
    }
}

/// The Node's and the slice's latest states, sent again when the prepared claims change, by a background task. `None` until
/// the Node and the slice have each been seen once.
fn watch_inputs(
    client: &Client,
    node: &str,
    changed: Arc<Notify>,
) -> watch::Receiver<Option<Inputs>> {
    enum Change {
        Node(Box<Option<Node>>),
        Slice(Box<Option<ResourceSlice>>),
        Claims,
    }
    let nodes = kube_io::NodeApi::new(client.clone(), node)
        .watch()
        .map(|node| Change::Node(Box::new(node)));
    let slices = kube_io::watch_resource_slice(client.clone(), &slices::slice_name(node))
        .map(|slice| Change::Slice(Box::new(slice)));
    let claims = stream::unfold(changed, |changed| async move {
        changed.notified().await;
        Some((Change::Claims, changed))
    });
    let (sender, receiver) = watch::channel(None);
    tokio::spawn(async move {
        let mut changes = stream::select(
            stream::select(nodes.boxed(), slices.boxed()),
            claims.boxed(),
        );
        let (mut node, mut slice) = (None, None);
        while let Some(change) = changes.next().await {
            match change {
                Change::Node(latest) => node = Some(*latest),
                Change::Slice(latest) => slice = Some(*latest),
                Change::Claims => {}
            }
            if let (Some(Some(node)), Some(slice)) = (&node, &slice) {
                let inputs = Inputs {
                    node: node.clone(),
                    slice: slice.clone(),
                };
                if sender.send(Some(inputs)).is_err() {
                    break;
                }
            }
        }
    });
    receiver
}

#[cfg(test)]
#[path = "publish_tests.rs"]
mod api_tests;

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
use crate::dynamic_mig;
use crate::health;
use crate::slices::{self, DriverDevice};
use crate::status;

/// What the driver publishes: its devices, the counter sets of the GPUs served as MIG on demand, and the
/// warnings about the node's labels and GPUs (each names what to fix).
#[derive(Debug, Clone, Default)]
pub struct Publication {
    /// The devices, in slice order.
    pub devices: Vec<DriverDevice>,
    /// One counter set per GPU served as MIG on demand.
    pub counter_sets: Vec<k8s_openapi::api::resource::v1::CounterSet>,
    /// The GPUs served as MIG on demand.
    pub on_demand_gpus: Vec<u32>,
    /// What is wrong with the node's labels or GPUs.
    pub warnings: Vec<String>,
}

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
    /// The slices after the first as last written: the watch follows the first slice only (the kubelet deletes
    /// them all together), so these are compared with what was written.
    pub written: Vec<ResourceSlice>,
    /// What the host lacks that the driver's configuration asks for (shown with the label warnings).
    pub host_warnings: Vec<String>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// What the node as labelled now publishes.
    ///
    /// # Errors
    /// When the GPUs cannot be read.
    pub fn publication(&self, node: &Node) -> anyhow::Result<Publication> {
        let (partition, errors) = crd::dra::partition(&self.defaults, node.labels());
        let mut warnings: Vec<String> = errors
            .iter()
            .map(|(label, error)| {
                format!("label {label}: {error}; using the ClusterPolicy's default")
            })
            .chain(self.host_warnings.iter().cloned())
            .collect();
        let backend = self.gpus.backend();
        let views = node_runtime::inventory::read(backend)?;
        let (dynamic, dynamic_warnings) = dynamic_mig::observe(backend, &views, &partition)?;
        warnings.extend(dynamic_warnings);
        let mut devices = slices::devices(&views, &partition, &dynamic);
        health::taint_unhealthy(&mut devices, &self.faults.borrow());
        Ok(Publication {
            devices,
            counter_sets: dynamic.iter().map(dynamic_mig::counter_set).collect(),
            on_demand_gpus: dynamic.iter().map(|gpu| gpu.index).collect(),
            warnings,
        })
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
        let Publication {
            devices,
            counter_sets,
            warnings,
            ..
        } = self.publication(&inputs.node)?;
        // Each once: a label that cannot be read, a GPU that cannot be served on demand, what the host lacks.
        for warning in &warnings {
            if self.reported.insert(warning.clone()) {
                self.events.publish(true, "DRADriverWarning", warning).await;
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
        let wanted = slices::slices(&self.node, &uid, generation, &devices, &counter_sets);
        let same = stored.is_some_and(|slice| slices::same_slice(slice, &wanted[0]))
            && self.written.len() + 1 == wanted.len()
            && self
                .written
                .iter()
                .zip(&wanted[1..])
                .all(|(written, wanted)| slices::same_slice(written, wanted));
        if !same {
            // A new generation tells the scheduler to forget the pool's older slices; the first slice goes last,
            // so that the watch sees it once the pool is whole.
            let wanted = slices::slices(&self.node, &uid, generation + 1, &devices, &counter_sets);
            let params = PatchParams::apply(crd::gpu_node::field_manager::DRA_DRIVER).force();
            let api = Api::<ResourceSlice>::all(self.client.clone());
            for slice in wanted[1..].iter().chain(&wanted[..1]) {
                let name = slice.metadata.name.clone().unwrap_or_default();
                api.patch(&name, &params, &Patch::Apply(slice))
                    .await
                    .with_context(|| format!("publishing ResourceSlice {name}"))?;
            }
            self.written = wanted[1..].to_vec();
            info!(
                devices = devices.len(),
                slices = wanted.len(),
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
                self.claims.memory_limit_hook(),
                warnings,
            )),
            ..inventory_status(&views)
        };
        self.gpu_node.publish(status).await?;
        Ok(())
    }
}

/// How long GPUNode status waits after a prepared claim changes, for the changes that follow it.
const CLAIMS_SETTLE: Duration = Duration::from_millis(500);

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
    // Prepared claims change in bursts (a kubelet starting many pods): one pass per burst, after it settles, not one
    // per claim, which would compete with the prepares themselves for the node's CPU and the API server.
    let claims = stream::unfold(changed, |changed| async move {
        changed.notified().await;
        tokio::time::sleep(CLAIMS_SETTLE).await;
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

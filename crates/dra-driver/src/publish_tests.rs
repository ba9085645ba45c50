//! The ResourceSlice publisher against the fake API server: the four standard tests, one pass at a time, the
//! slice read back from the server as the publisher's watch would deliver it.

use std::collections::BTreeSet;

use api_test_kit::FakeApi;
use api_test_kit::standard::{self, Retry};
use crd::dra::GpuSet;
use crd::gpu_node::field_manager::DRA_DRIVER;
use crd::gpu_node::{GPUNode, GpuNodeSpec};
use http::Method;
use node_runtime::backend::Gpus;
use node_runtime::testing::simulated;
use tempfile::TempDir;

use super::*;
use crate::claims::HostPaths;

const SLICE: &str = "/apis/resource.k8s.io/v1/resourceslices/node-1-gpu.nvidia.com";

/// Node `node-1` with two simulated A100s, both the driver's, GPU 1 shared; its GPUNode exists.
struct Fixture {
    api: FakeApi,
    publisher: Publisher,
    node: Node,
    _dirs: (TempDir, TempDir),
}

impl Fixture {
    fn new() -> Self {
        let (api, client) = FakeApi::start();
        let (gpu_dir, simulator) = simulated("a100-40gb:2", &[]);
        let host = tempfile::tempdir().unwrap();
        let mut node = Node::default();
        node.metadata.name = Some("node-1".into());
        node.metadata.uid = Some("uid-1".into());
        api.insert(&node);
        api.insert(&GPUNode::new("node-1", GpuNodeSpec {}));
        let paths = HostPaths {
            cdi_dir: host.path().join("cdi"),
            mps_root: host.path().join("mps"),
            dev_root: host.path().join("dev"),
            checkpoint: host.path().join("plugin/checkpoint.json"),
            memory_limit_hook: None,
        };
        let publisher = Publisher {
            client: client.clone(),
            node: "node-1".into(),
            gpus: Gpus::from_simulator(simulator.clone()),
            defaults: Partition {
                dra: GpuSet::All,
                shared: "1".parse().unwrap(),
                dynamic_mig: GpuSet::None,
            },
            devices: watch::channel(Vec::new()).0,
            faults: watch::channel(node_runtime::health::Faults::new()).1,
            claims: Arc::new(
                Claims::open(
                    "node-1",
                    paths,
                    Gpus::from_simulator(simulator.clone()),
                    false,
                    "boot-1",
                )
                .unwrap(),
            ),
            gpu_node: GpuNodeWriter::new(client.clone(), "node-1", DRA_DRIVER),
            events: NodeEvents::new(client, DRA_DRIVER, &node),
            reported: BTreeSet::new(),
            written: Vec::new(),
            host_warnings: Vec::new(),
        };
        Self {
            api,
            publisher,
            node,
            _dirs: (gpu_dir, host),
        }
    }

    /// One pass over the Node and the slice as the server holds it now.
    async fn pass(&mut self) -> Result<(), String> {
        let inputs = Inputs {
            node: self.node.clone(),
            slice: self.api.get(None, "node-1-gpu.nvidia.com"),
        };
        self.publisher
            .pass(&inputs)
            .await
            .map_err(|error| format!("{error:#}"))
    }
}

/// The devices of the stored slice, by name.
fn device_names(slice: &serde_json::Value) -> Vec<String> {
    slice["spec"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|device| device["name"].as_str().map(str::to_owned))
        .collect()
}

/// The slice as stored, read again: no rewrite (the benchmark once found every pass rewriting it, each time
/// with a new generation that made the scheduler forget the pool).
#[tokio::test]
async fn standard_an_unchanged_slice_is_not_written() {
    let mut fixture = Fixture::new();
    standard::unchanged_is_not_written(&fixture.api.clone(), async || fixture.pass().await).await;
}

#[tokio::test]
async fn standard_a_missing_slice_is_created() {
    let mut fixture = Fixture::new();
    let slice =
        standard::missing_is_created(&fixture.api.clone(), SLICE, async || fixture.pass().await)
            .await;
    assert_eq!(slice["spec"]["nodeName"], "node-1");
    assert_eq!(slice["spec"]["pool"]["generation"], 1);
    assert!(!device_names(&slice).is_empty(), "{slice}");
}

/// The publisher leaves the retry of a conflicting apply to its run loop: the pass fails, the next one
/// publishes every device.
#[tokio::test]
async fn standard_a_conflicting_slice_write_is_retried_by_the_next_pass() {
    let mut fixture = Fixture::new();
    let api = fixture.api.clone();
    standard::conflict_is_retried(&api, Method::PATCH, SLICE, Retry::NextPass, async || {
        fixture.pass().await
    })
    .await;
    let slice = api.object(SLICE).unwrap();
    assert!(!device_names(&slice).is_empty(), "{slice}");
}

#[tokio::test]
async fn standard_a_refused_slice_write_is_an_error_naming_the_slice_and_the_reason() {
    let mut fixture = Fixture::new();
    let api = fixture.api.clone();
    standard::refusals_are_errors(
        &api,
        Method::PATCH,
        SLICE,
        "ResourceSlice node-1-gpu.nvidia.com",
        async || fixture.pass().await,
    )
    .await;
}

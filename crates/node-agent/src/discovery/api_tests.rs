//! Feature discovery's writes (the Node's feature labels, its part of the GPUNode status) against the fake API
//! server: the four standard tests, one reconcile at a time over two simulated A100s.

use api_test_kit::FakeApi;
use api_test_kit::standard::{self, Retry};
use clap::Parser;
use crd::gpu_node::{GPUNode, GpuNodeSpec};
use http::Method;
use k8s_openapi::api::core::v1::Node;
use tempfile::TempDir;

use super::*;

const NODE: &str = "/api/v1/nodes/node-1";
const GPU_NODE: &str = "/apis/nvidia.com/v1alpha1/gpunodes/node-1";

struct Fixture {
    api: FakeApi,
    args: DiscoveryArgs,
    gpus: Gpus,
    node_api: NodeApi,
    status: GpuNodeWriter,
    _dir: TempDir,
}

fn fixture() -> Fixture {
    let cli =
        crate::cli::Cli::try_parse_from(["gpu-node-agent", "discovery", "--node-name", "node-1"])
            .unwrap();
    let crate::cli::Command::Discovery(args) = cli.command else {
        unreachable!("parsed as discovery")
    };
    let (dir, simulator) = node_runtime::testing::simulated("a100-40gb:2", &[]);
    let (api, client) = FakeApi::start();
    let mut node = Node::default();
    node.metadata.name = Some("node-1".into());
    api.insert(&node);
    api.insert(&GPUNode::new("node-1", GpuNodeSpec {}));
    Fixture {
        api,
        args,
        gpus: Gpus::from_simulator(simulator),
        node_api: NodeApi::new(client.clone(), "node-1"),
        status: GpuNodeWriter::new(client, "node-1", DISCOVERY),
        _dir: dir,
    }
}

impl Fixture {
    /// One reconcile over the Node as the server holds it now.
    async fn pass(&mut self) -> Result<(), String> {
        let watched = Watched {
            node: self.api.get(None, "node-1").unwrap(),
            config_map: None,
        };
        reconcile(
            &self.args,
            &self.gpus,
            &self.node_api,
            &mut self.status,
            &watched,
        )
        .await
        .map_err(|error| format!("{error:#}"))
    }

    fn label(&self, key: &str) -> serde_json::Value {
        self.api.object(NODE).unwrap()["metadata"]["labels"][key].clone()
    }
}

#[tokio::test]
async fn standard_unchanged_gpus_are_not_written() {
    let mut fixture = fixture();
    standard::unchanged_is_not_written(&fixture.api.clone(), async || fixture.pass().await).await;
}

/// The Node is the kubelet's and the GPUNode the first role's: what discovery creates is its labels and status.
#[tokio::test]
async fn standard_missing_labels_and_status_are_created() {
    let mut fixture = fixture();
    fixture.pass().await.unwrap();
    assert_eq!(fixture.label("nvidia.com/gpu.count"), "2");
    assert_eq!(
        fixture.api.object(GPU_NODE).unwrap()["status"]["gpuCount"],
        2
    );
}

/// Discovery leaves the retry of a conflicting write to its run loop: the pass fails, the next one writes.
#[tokio::test]
async fn standard_a_conflicting_label_patch_is_retried_by_the_next_pass() {
    let mut fixture = fixture();
    let api = fixture.api.clone();
    standard::conflict_is_retried(&api, Method::PATCH, NODE, Retry::NextPass, async || {
        fixture.pass().await
    })
    .await;
    assert_eq!(fixture.label("nvidia.com/gpu.count"), "2");
    assert_eq!(api.object(GPU_NODE).unwrap()["status"]["gpuCount"], 2);
}

#[tokio::test]
async fn standard_a_refused_label_patch_is_an_error_naming_the_node_and_the_reason() {
    let mut fixture = fixture();
    let api = fixture.api.clone();
    standard::refusals_are_errors(
        &api,
        Method::PATCH,
        NODE,
        "patching node node-1",
        async || fixture.pass().await,
    )
    .await;
}

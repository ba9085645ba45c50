//! The node's label and annotation writer ([`NodeApi::patch`], as the roles use it: read the Node, send what
//! differs) against the fake API server: the four standard tests; and a refused Event on the Node, logged.

use api_test_kit::standard::{self, Retry};
use api_test_kit::{FakeApi, logs};
use http::Method;

use super::*;

const NODE: &str = "/api/v1/nodes/gpu-0";

/// A fake API server holding Node `gpu-0` with label `old=1`, and the node's writer.
fn node_api() -> (NodeApi, FakeApi) {
    let (api, client) = FakeApi::start();
    let mut node = Node::default();
    node.metadata.name = Some("gpu-0".into());
    node.metadata.labels = Some([("old".to_owned(), "1".to_owned())].into());
    api.insert(&node);
    (NodeApi::new(client, "gpu-0"), api)
}

/// What a role wants on its Node: a label set, one removed, an annotation.
fn wanted() -> MetadataPatch {
    let mut patch = MetadataPatch::default().label("nvidia.com/gpu.present", "true");
    patch.labels.insert("old".into(), None);
    patch.annotation("nvidia.com/note", Some("x".into()))
}

/// One pass of a role: read the Node, patch what differs from what it wants.
async fn pass(node_api: &NodeApi) -> Result<(), String> {
    let node = node_api.get().await.map_err(|error| error.to_string())?;
    let patch = wanted().minus(node.labels(), node.annotations());
    node_api
        .patch(&patch)
        .await
        .map_err(|error| error.to_string())
}

#[tokio::test]
async fn standard_unchanged_labels_are_not_written() {
    let (node_api, api) = node_api();
    standard::unchanged_is_not_written(&api, async || pass(&node_api).await).await;
}

/// The Node itself is the kubelet's: what a role creates on it is its missing labels and annotations.
#[tokio::test]
async fn standard_missing_labels_are_created_and_stale_ones_removed() {
    let (node_api, api) = node_api();
    pass(&node_api).await.unwrap();
    let node = api.object(NODE).unwrap();
    assert_eq!(
        node["metadata"]["labels"],
        serde_json::json!({"nvidia.com/gpu.present": "true"})
    );
    assert_eq!(node["metadata"]["annotations"]["nvidia.com/note"], "x");
}

/// The writer leaves the retry of a conflicting patch to the role's loop: the pass fails, the next one writes
/// every change.
#[tokio::test]
async fn standard_a_conflicting_patch_is_retried_by_the_next_pass() {
    let (node_api, api) = node_api();
    standard::conflict_is_retried(&api, Method::PATCH, NODE, Retry::NextPass, async || {
        pass(&node_api).await
    })
    .await;
    let node = api.object(NODE).unwrap();
    assert_eq!(node["metadata"]["labels"]["nvidia.com/gpu.present"], "true");
    assert!(node["metadata"]["labels"]["old"].is_null());
}

#[tokio::test]
async fn standard_a_refused_patch_is_an_error_naming_the_node_and_the_reason() {
    let (node_api, api) = node_api();
    standard::refusals_are_errors(
        &api,
        Method::PATCH,
        NODE,
        "patching node gpu-0",
        async || pass(&node_api).await,
    )
    .await;
}

/// An Event is never worth failing the work it tells of: a refused one is logged, naming the Node and the API
/// server's answer.
#[tokio::test]
async fn a_refused_event_is_logged_with_the_node_and_the_reason() {
    let (node_api, api) = node_api();
    let node = node_api.get().await.unwrap();
    let events = NodeEvents::new(node_api.api.clone().into_client(), "test", &node);
    api.fail_next(Method::POST, "/events", 403);
    let ((), logged) = logs::warnings(events.publish(true, "Refused", "x")).await;
    standard::assert_names(&logged, "node=gpu-0", 403);
}

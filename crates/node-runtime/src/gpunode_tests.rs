//! The writer against the fake API server ([`api_test_kit`]): the four standard tests (unchanged → no write,
//! missing → created, conflict → retried, refused → reported), and the cases of this writer: a GPUNode deleted
//! under it, a status changed, another role creating the GPUNode first, an API error.

use api_test_kit::standard::{self, Retry};
use api_test_kit::{FakeApi, Request};
use crd::gpu_node::field_manager::DISCOVERY;
use crd::gpu_node::{GpuNodeStatus, Health};
use http::Method;
use serde_json::json;

use super::*;

const GPU_NODE: &str = "/apis/nvidia.com/v1alpha1/gpunodes/gpu-0";
const STATUS: &str = "/gpunodes/gpu-0/status";

/// A writer for node `gpu-0` over a fake API server that holds nothing yet.
fn writer() -> (GpuNodeWriter, FakeApi) {
    let (api, client) = FakeApi::start();
    (GpuNodeWriter::new(client, "gpu-0", DISCOVERY), api)
}

/// A writer whose GPUNode exists already, created by the other role.
fn writer_of_existing() -> (GpuNodeWriter, FakeApi) {
    let (writer, api) = writer();
    api.insert(&GPUNode::new("gpu-0", GpuNodeSpec {}));
    (writer, api)
}

/// The Node `gpu-0` with uid `uid-0`.
fn node() -> Node {
    let mut node = Node::default();
    node.metadata.name = Some("gpu-0".into());
    node.metadata.uid = Some("uid-0".into());
    node
}

fn status(gpus: i32) -> GpuNodeStatus {
    GpuNodeStatus {
        gpu_count: gpus,
        health: Some(Health::Healthy),
        ..GpuNodeStatus::default()
    }
}

/// One pass of a role: its GPUNode ensured, its status published.
async fn pass(writer: &mut GpuNodeWriter, gpus: i32) -> Result<(), String> {
    writer
        .ensure(&node())
        .await
        .map_err(|error| error.to_string())?;
    writer
        .publish(status(gpus))
        .await
        .map(drop)
        .map_err(|error| error.to_string())
}

fn lines(requests: &[Request]) -> Vec<String> {
    requests.iter().map(Request::line).collect()
}

#[tokio::test]
async fn standard_an_unchanged_status_is_not_written() {
    let (mut writer, api) = writer_of_existing();
    standard::unchanged_is_not_written(&api, async || pass(&mut writer, 2).await).await;
    assert!(
        !writer.publish(status(2)).await.unwrap(),
        "reported as not written"
    );
}

#[tokio::test]
async fn standard_a_missing_gpu_node_is_created_with_the_status() {
    let (mut writer, api) = writer();
    let created =
        standard::missing_is_created(&api, GPU_NODE, async || pass(&mut writer, 2).await).await;
    assert_eq!(created["status"]["gpuCount"], 2);
    assert_eq!(
        created["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": "gpu-0", "uid": "uid-0"}])
    );
}

/// The writer leaves the retry of a conflicting write to the role's run loop: the pass fails, and the next one
/// writes the same status, which the failed one did not take as written.
#[tokio::test]
async fn standard_a_conflicting_status_write_is_retried_by_the_next_pass() {
    let (mut writer, api) = writer_of_existing();
    standard::conflict_is_retried(&api, Method::PATCH, STATUS, Retry::NextPass, async || {
        pass(&mut writer, 2).await
    })
    .await;
    assert_eq!(api.object(GPU_NODE).unwrap()["status"]["gpuCount"], 2);
}

#[tokio::test]
async fn standard_a_refused_status_write_is_an_error_naming_the_gpu_node_and_the_reason() {
    let (mut writer, api) = writer_of_existing();
    standard::refusals_are_errors(&api, Method::PATCH, STATUS, "GPUNode gpu-0", async || {
        pass(&mut writer, 2).await
    })
    .await;
}

/// A GPUNode deleted under a writer is created again, owned by its Node, and its status written.
#[tokio::test]
async fn a_gpu_node_deleted_under_the_writer_is_created_again() {
    let (mut writer, api) = writer();
    writer.ensure(&node()).await.unwrap();
    api.remove(GPU_NODE);
    api.take_requests();

    assert!(writer.publish(status(2)).await.unwrap());

    let sent = api.take_requests();
    assert_eq!(
        lines(&sent),
        [
            format!("PATCH {GPU_NODE}/status"),
            "POST /apis/nvidia.com/v1alpha1/gpunodes".to_owned(),
            format!("PATCH {GPU_NODE}/status"),
        ]
    );
    assert_eq!(
        sent[1].body["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": "gpu-0", "uid": "uid-0"}])
    );
    assert_eq!(api.object(GPU_NODE).unwrap()["status"]["gpuCount"], 2);
}

/// A changed status is applied under the role's field manager, with the GPUNode's identity and the new fields.
#[tokio::test]
async fn a_changed_status_is_applied() {
    let (mut writer, api) = writer_of_existing();
    assert!(writer.publish(status(2)).await.unwrap());
    assert!(writer.publish(status(4)).await.unwrap());

    let sent = api.take_requests();
    let second = &sent[1];
    assert_eq!(second.param("fieldManager").as_deref(), Some(DISCOVERY));
    assert_eq!(second.param("force").as_deref(), Some("true"));
    let body = &second.body;
    assert_eq!(
        (&body["apiVersion"], &body["kind"], &body["metadata"]),
        (
            &json!("nvidia.com/v1alpha1"),
            &json!("GPUNode"),
            &json!({"name": "gpu-0"})
        )
    );
    assert_eq!(body["status"]["gpuCount"], 4);
    assert_eq!(body["status"]["health"], "Healthy");
    assert!(body["status"]["updatedAt"].is_string());
}

/// Another role creating the GPUNode first (409 on create) is success, not an error.
#[tokio::test]
async fn a_conflict_on_create_means_another_role_created_it() {
    let (mut writer, api) = writer();
    api.fail_next(Method::POST, "/gpunodes", 409);
    writer.ensure(&node()).await.unwrap();
    assert_eq!(api.failures_left(), 0);
}

/// A refused write is an error naming the GPUNode, and the same status is written again on the next try.
#[tokio::test]
async fn an_api_error_is_reported_and_the_write_retried() {
    let (mut writer, api) = writer_of_existing();
    api.fail_next(Method::PATCH, STATUS, 500);

    let error = writer.publish(status(2)).await.unwrap_err();
    let retried = writer.publish(status(2)).await.unwrap();

    assert_eq!(error.status_code(), Some(500));
    assert!(
        error
            .to_string()
            .starts_with("writing the status of GPUNode gpu-0: "),
        "{error}"
    );
    assert!(retried, "the failed status is not taken as written");
}

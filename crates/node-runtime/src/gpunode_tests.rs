//! The writer against a mocked API server (kube's client over `tower_test`), one test per outcome: the GPUNode
//! created, a status unchanged (no write), changed (written), a conflict, an API error.

use std::time::Duration;

use crd::gpu_node::field_manager::DISCOVERY;
use crd::gpu_node::{GpuNodeStatus, Health};
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::Handle;

use super::*;

type ApiServer = Handle<Request<Body>, Response<Body>>;

const GPU_NODES: &str = "/apis/nvidia.com/v1alpha1/gpunodes";

/// A writer for node `gpu-0` whose requests the test answers through the returned handle.
fn writer() -> (GpuNodeWriter, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    (GpuNodeWriter::new(client, "gpu-0", DISCOVERY), handle)
}

/// The Node `gpu-0` with uid `uid-0`.
fn node() -> Node {
    let mut node = Node::default();
    node.metadata.name = Some("gpu-0".into());
    node.metadata.uid = Some("uid-0".into());
    node
}

/// A status the API server answers with, as it does for a refused request.
fn failure(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
           "message": format!("{reason} (test)")})
}

/// A stored GPUNode.
fn stored(status: Option<&GpuNodeStatus>) -> Value {
    json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNode", "metadata": {"name": "gpu-0"},
           "spec": {}, "status": status})
}

/// Takes the next request, checks its method and path (query included), answers `code` with `body`, and returns
/// the request's JSON body (null when it has none).
async fn answer(api: &mut ApiServer, method: Method, path: &str, code: u16, body: Value) -> Value {
    let (request, respond) = api.next_request().await.expect("a request");
    assert_eq!(
        (
            request.method(),
            request.uri().path_and_query().unwrap().as_str()
        ),
        (&method, path)
    );
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let sent = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    respond.send_response(
        Response::builder()
            .status(StatusCode::from_u16(code).unwrap())
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
    sent
}

/// Runs a test's exchange, failing it rather than hanging when one side waits for a request or an answer that
/// never comes.
async fn within<T>(exchange: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the writer and the API server finish their exchange")
}

/// The path of a status apply by this writer.
fn apply_path() -> String {
    format!("{GPU_NODES}/gpu-0/status?&force=true&fieldManager={DISCOVERY}")
}

fn status(gpus: i32) -> GpuNodeStatus {
    GpuNodeStatus {
        gpu_count: gpus,
        health: Some(Health::Healthy),
        ..GpuNodeStatus::default()
    }
}

/// A missing GPUNode is created, owned by its Node; and created again when it is deleted under a writer.
#[tokio::test]
async fn a_missing_gpu_node_is_created_owned_by_the_node() {
    let (mut writer, mut api) = writer();
    let server = async {
        answer(
            &mut api,
            Method::GET,
            &format!("{GPU_NODES}/gpu-0"),
            404,
            failure(404, "NotFound"),
        )
        .await;
        let created = answer(
            &mut api,
            Method::POST,
            &format!("{GPU_NODES}?"),
            201,
            stored(None),
        )
        .await;
        assert_eq!(created["metadata"]["name"], "gpu-0");
        assert_eq!(
            created["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "Node", "name": "gpu-0", "uid": "uid-0"}])
        );
        // Deleted meanwhile: the apply finds nothing, the writer creates it and applies again.
        answer(
            &mut api,
            Method::PATCH,
            &apply_path(),
            404,
            failure(404, "NotFound"),
        )
        .await;
        answer(
            &mut api,
            Method::POST,
            &format!("{GPU_NODES}?"),
            201,
            stored(None),
        )
        .await;
        answer(
            &mut api,
            Method::PATCH,
            &apply_path(),
            200,
            stored(Some(&status(2))),
        )
        .await;
    };
    let written = async {
        writer.ensure(&node()).await.unwrap();
        writer.publish(status(2)).await.unwrap()
    };
    let ((), written) = within(async { tokio::join!(server, written) }).await;
    assert!(written);
}

/// A status equal to the last one written (times aside) is not sent again.
#[tokio::test]
async fn an_unchanged_status_is_not_written() {
    let (mut writer, mut api) = writer();
    let path = apply_path();
    let server = answer(
        &mut api,
        Method::PATCH,
        &path,
        200,
        stored(Some(&status(2))),
    );
    let (_, first) = within(async { tokio::join!(server, writer.publish(status(2))) }).await;
    assert!(first.unwrap());
    // A write would wait for an answer that never comes.
    let again = tokio::time::timeout(Duration::from_secs(5), writer.publish(status(2)))
        .await
        .expect("no request is sent");
    assert!(!again.unwrap());
}

/// A changed status is applied under the role's field manager, with the GPUNode's identity and the new fields.
#[tokio::test]
async fn a_changed_status_is_applied() {
    let (mut writer, mut api) = writer();
    let server = async {
        answer(
            &mut api,
            Method::PATCH,
            &apply_path(),
            200,
            stored(Some(&status(2))),
        )
        .await;
        answer(
            &mut api,
            Method::PATCH,
            &apply_path(),
            200,
            stored(Some(&status(4))),
        )
        .await
    };
    let written = async {
        let first = writer.publish(status(2)).await.unwrap();
        let second = writer.publish(status(4)).await.unwrap();
        (first, second)
    };
    let (sent, written) = within(async { tokio::join!(server, written) }).await;
    assert_eq!(written, (true, true));
    assert_eq!(
        (&sent["apiVersion"], &sent["kind"], &sent["metadata"]),
        (
            &json!("nvidia.com/v1alpha1"),
            &json!("GPUNode"),
            &json!({"name": "gpu-0"})
        )
    );
    assert_eq!(sent["status"]["gpuCount"], 4);
    assert_eq!(sent["status"]["health"], "Healthy");
    assert!(sent["status"]["updatedAt"].is_string());
}

/// Another role creating the GPUNode first (409 on create) is success, not an error.
#[tokio::test]
async fn a_conflict_on_create_means_another_role_created_it() {
    let (mut writer, mut api) = writer();
    let server = async {
        answer(
            &mut api,
            Method::GET,
            &format!("{GPU_NODES}/gpu-0"),
            404,
            failure(404, "NotFound"),
        )
        .await;
        answer(
            &mut api,
            Method::POST,
            &format!("{GPU_NODES}?"),
            409,
            failure(409, "AlreadyExists"),
        )
        .await;
    };
    let node = node();
    let ((), ensured) = within(async { tokio::join!(server, writer.ensure(&node)) }).await;
    ensured.unwrap();
}

/// A refused write is an error naming the GPUNode, and the same status is written again on the next try.
#[tokio::test]
async fn an_api_error_is_reported_and_the_write_retried() {
    let (mut writer, mut api) = writer();
    let server = async {
        answer(
            &mut api,
            Method::PATCH,
            &apply_path(),
            500,
            failure(500, "InternalError"),
        )
        .await;
        answer(
            &mut api,
            Method::PATCH,
            &apply_path(),
            200,
            stored(Some(&status(2))),
        )
        .await;
    };
    let written = async {
        let error = writer.publish(status(2)).await.unwrap_err();
        (error, writer.publish(status(2)).await.unwrap())
    };
    let ((), (error, retried)) = within(async { tokio::join!(server, written) }).await;
    assert_eq!(error.status_code(), Some(500));
    assert!(
        error
            .to_string()
            .starts_with("writing the status of GPUNode gpu-0: "),
        "{error}"
    );
    assert!(retried, "the failed status is not taken as written");
}

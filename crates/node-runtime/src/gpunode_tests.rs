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

/// One request the writer is expected to send, and the API server's answer.
struct Exchange {
    method: Method,
    path: String,
    code: u16,
    answer: Value,
}

/// `GET` of the GPUNode, which does not exist.
fn get_missing() -> Exchange {
    Exchange {
        method: Method::GET,
        path: format!("{GPU_NODES}/gpu-0"),
        code: 404,
        answer: failure(404, "NotFound"),
    }
}

/// `POST` of the GPUNode, answered `code` (201 created, 409 already there).
fn create(code: u16) -> Exchange {
    let answer = match code {
        201 => stored(None),
        _ => failure(code, "AlreadyExists"),
    };
    Exchange {
        method: Method::POST,
        path: format!("{GPU_NODES}?"),
        code,
        answer,
    }
}

/// Server-side apply of the status under the writer's field manager, answered `code` (200: the status stored).
fn apply(code: u16) -> Exchange {
    let answer = match code {
        200 => stored(Some(&status(2))),
        404 => failure(code, "NotFound"),
        _ => failure(code, "InternalError"),
    };
    Exchange {
        method: Method::PATCH,
        path: format!("{GPU_NODES}/gpu-0/status?&force=true&fieldManager={DISCOVERY}"),
        code,
        answer,
    }
}

/// Answers the requests of `script` in order, checking each one's method and path (query included), and returns
/// the JSON bodies the writer sent (null for none).
async fn serve(api: &mut ApiServer, script: Vec<Exchange>) -> Vec<Value> {
    let mut sent = Vec::new();
    for exchange in script {
        let (request, respond) = api.next_request().await.expect("a request");
        assert_eq!(
            (
                request.method(),
                request.uri().path_and_query().unwrap().as_str()
            ),
            (&exchange.method, exchange.path.as_str())
        );
        let bytes = request.into_body().collect_bytes().await.unwrap();
        sent.push(serde_json::from_slice(&bytes).unwrap_or(Value::Null));
        respond.send_response(
            Response::builder()
                .status(StatusCode::from_u16(exchange.code).unwrap())
                .body(Body::from(serde_json::to_vec(&exchange.answer).unwrap()))
                .unwrap(),
        );
    }
    sent
}

/// Runs a test's exchange, failing it rather than hanging when one side waits for a request or an answer that
/// never comes.
async fn within<T>(exchange: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the writer and the API server finish their exchange")
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
    // Deleted after the create: the apply finds nothing, the writer creates it again and applies again.
    let script = vec![
        get_missing(),
        create(201),
        apply(404),
        create(201),
        apply(200),
    ];
    let written = async {
        writer.ensure(&node()).await.unwrap();
        writer.publish(status(2)).await.unwrap()
    };
    let (sent, written) = within(async { tokio::join!(serve(&mut api, script), written) }).await;
    assert!(written);
    for created in [&sent[1], &sent[3]] {
        assert_eq!(created["metadata"]["name"], "gpu-0");
        assert_eq!(
            created["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "Node", "name": "gpu-0", "uid": "uid-0"}])
        );
    }
}

/// A status equal to the last one written (times aside) is not sent again.
#[tokio::test]
async fn an_unchanged_status_is_not_written() {
    let (mut writer, mut api) = writer();
    let (_, first) = within(async {
        tokio::join!(serve(&mut api, vec![apply(200)]), writer.publish(status(2)))
    })
    .await;
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
    let written = async {
        let first = writer.publish(status(2)).await.unwrap();
        let second = writer.publish(status(4)).await.unwrap();
        (first, second)
    };
    let script = vec![apply(200), apply(200)];
    let (sent, written) = within(async { tokio::join!(serve(&mut api, script), written) }).await;
    assert_eq!(written, (true, true));
    let sent = &sent[1];
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
    let node = node();
    let script = vec![get_missing(), create(409)];
    let (_, ensured) =
        within(async { tokio::join!(serve(&mut api, script), writer.ensure(&node)) }).await;
    ensured.unwrap();
}

/// A refused write is an error naming the GPUNode, and the same status is written again on the next try.
#[tokio::test]
async fn an_api_error_is_reported_and_the_write_retried() {
    let (mut writer, mut api) = writer();
    let written = async {
        let error = writer.publish(status(2)).await.unwrap_err();
        (error, writer.publish(status(2)).await.unwrap())
    };
    let script = vec![apply(500), apply(200)];
    let (_, (error, retried)) =
        within(async { tokio::join!(serve(&mut api, script), written) }).await;
    assert_eq!(error.status_code(), Some(500));
    assert!(
        error
            .to_string()
            .starts_with("writing the status of GPUNode gpu-0: "),
        "{error}"
    );
    assert!(retried, "the failed status is not taken as written");
}

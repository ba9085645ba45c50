//! The fake server through kube's client, as the writers use it.

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

use super::*;

fn config_map(name: &str) -> ConfigMap {
    let mut config_map = ConfigMap::default();
    config_map.metadata.name = Some(name.into());
    config_map.metadata.labels = Some([("app".to_owned(), "x".to_owned())].into());
    config_map
}

#[tokio::test]
async fn objects_are_created_read_listed_and_deleted() {
    let (api, client) = FakeApi::start();
    let config_maps: Api<ConfigMap> = Api::namespaced(client, "ns");
    config_maps
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let again = config_maps
        .create(&PostParams::default(), &config_map("a"))
        .await;
    assert!(matches!(again, Err(kube::Error::Api(status)) if status.code == 409));
    assert!(config_maps.get_opt("b").await.unwrap().is_none());
    let listed = config_maps
        .list(&ListParams::default().labels("app=x"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert!(
        config_maps
            .list(&ListParams::default().labels("app=y"))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    config_maps
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    assert!(api.get::<ConfigMap>(Some("ns"), "a").is_none());
    let lines: Vec<String> = api.take_requests().iter().map(Request::line).collect();
    assert_eq!(lines[0], "POST /api/v1/namespaces/ns/configmaps");
    assert_eq!(lines.len(), 6);
}

#[tokio::test]
async fn apply_creates_then_merges_and_a_status_needs_its_object() {
    let (api, client) = FakeApi::start();
    let nodes: Api<Node> = Api::all(client);
    let params = PatchParams::apply("test").force();
    let status = json!({"apiVersion": "v1", "kind": "Node", "status": {"phase": "Running"}});
    let missing = nodes
        .patch_status("gpu-0", &params, &Patch::Apply(&status))
        .await;
    assert!(matches!(missing, Err(kube::Error::Api(status)) if status.code == 404));
    let labels = |value: &str| json!({"apiVersion": "v1", "kind": "Node", "metadata": {"labels": {"a": value}}});
    nodes
        .patch("gpu-0", &params, &Patch::Apply(labels("1")))
        .await
        .unwrap();
    nodes
        .patch(
            "gpu-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"b": "2"}}})),
        )
        .await
        .unwrap();
    nodes
        .patch_status("gpu-0", &params, &Patch::Apply(&status))
        .await
        .unwrap();
    let node = api.get::<Node>(None, "gpu-0").unwrap();
    assert_eq!(node.metadata.labels.unwrap().len(), 2);
    assert_eq!(node.status.unwrap().phase.as_deref(), Some("Running"));
}

#[tokio::test]
async fn stale_writes_conflict_and_finalizers_hold_a_delete() {
    let (api, client) = FakeApi::start();
    let mut node = Node::default();
    node.metadata.name = Some("gpu-0".into());
    node.metadata.finalizers = Some(vec!["x".into()]);
    api.insert(&node);
    let nodes: Api<Node> = Api::all(client);
    let mut stored = nodes.get("gpu-0").await.unwrap();
    stored.metadata.resource_version = Some("0".into());
    let stale = nodes
        .replace("gpu-0", &PostParams::default(), &stored)
        .await;
    assert!(matches!(stale, Err(kube::Error::Api(status)) if status.code == 409));
    nodes
        .delete("gpu-0", &DeleteParams::default())
        .await
        .unwrap();
    let marked = api.get::<Node>(None, "gpu-0").unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
}

#[tokio::test]
async fn a_refusal_answers_the_next_matching_request_once() {
    let (api, client) = FakeApi::start();
    let config_maps: Api<ConfigMap> = Api::namespaced(client, "ns");
    api.fail_next(Method::POST, "/configmaps", 403);
    let refused = config_maps
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("Forbidden"), "{refused}");
    assert_eq!(api.failures_left(), 0);
    config_maps
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_script_answers_in_order_and_flags_the_unexpected() {
    let (api, client) = FakeApi::scripted(vec![expect(
        Method::GET,
        "/api/v1/nodes/gpu-0",
        Answer::Error(404, "NotFound"),
    )]);
    let nodes: Api<Node> = Api::all(client);
    assert!(nodes.get_opt("gpu-0").await.unwrap().is_none());
    assert_eq!(api.finish().len(), 1);
    assert!(nodes.get_opt("gpu-0").await.is_err(), "answered 500");
    let unexpected = std::panic::catch_unwind(|| api.finish());
    assert!(unexpected.is_err());
}

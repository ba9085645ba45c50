//! The node labels (`writes::label_nodes`) against the stateful fake: the four standard tests, and no second
//! write of a patch the Node cache has not shown yet.

use super::*;
use std::borrow::Cow;

const NODE_PATH: &str = "/api/v1/nodes/gpu-0";

/// A fake API server holding GPU node `gpu-0` (as Node Feature Discovery labels it), and the controller's context.
fn gpu_node() -> Fixture {
    let (api, client) = FakeApi::start();
    let mut node = Node::default();
    node.metadata.name = Some("gpu-0".into());
    node.metadata.labels = Some(
        [(
            "feature.node.kubernetes.io/pci-10de.present".to_owned(),
            "true".to_owned(),
        )]
        .into(),
    );
    api.insert(&node);
    Fixture::over(api, client)
}

/// One labelling pass over the Node as the cache would hold it now.
async fn label(fixture: &Fixture) -> Result<(), String> {
    let node: Node = fixture.api.get(None, "gpu-0").unwrap();
    let validated = validate(&policy().spec, &default_images()).unwrap();
    label_nodes(
        &validated,
        &[Arc::new(node)],
        ContainerRuntime::Containerd,
        &DriverObjects::observe(&validated, &[], &fixture.context.nvidia_drivers),
        &fixture.context,
    )
    .await
    .map(drop)
    .map_err(|error| error.to_string())
}

fn deploy_label(fixture: &Fixture) -> Value {
    fixture.api.object(NODE_PATH).unwrap()["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"].clone()
}

#[tokio::test]
async fn standard_unchanged_node_labels_are_not_written() {
    let fixture = gpu_node();
    standard::unchanged_is_not_written(&fixture.api.clone(), async || label(&fixture).await).await;
}

/// The Node is the kubelet's: what the operator creates on it is its missing labels.
#[tokio::test]
async fn standard_missing_node_labels_are_created() {
    let fixture = gpu_node();
    assert!(deploy_label(&fixture).is_null());
    label(&fixture).await.unwrap();
    assert_eq!(deploy_label(&fixture), "true");
}

/// The controller leaves the retry of a conflicting label patch to `error_policy`, which requeues the reconcile:
/// the pass fails, the next one writes every label.
#[tokio::test]
async fn standard_a_conflicting_label_patch_is_retried_by_the_next_reconcile() {
    let fixture = gpu_node();
    standard::conflict_is_retried(
        &fixture.api.clone(),
        Method::PATCH,
        NODE_PATH,
        Retry::NextPass,
        async || label(&fixture).await,
    )
    .await;
    assert_eq!(deploy_label(&fixture), "true");
}

/// A reconcile that reads the Node from a cache the last label patch has not reached yet does not patch it again;
/// once the cache holds a newer Node, that is what counts.
#[tokio::test]
async fn a_label_patch_the_cache_has_not_shown_yet_is_not_written_again() {
    let writes_since_last_look = |fixture: &Fixture| {
        fixture
            .api
            .take_requests()
            .iter()
            .filter(|r| r.is_write())
            .count()
    };
    let fixture = gpu_node();
    let mut stale: Node = fixture.api.get(None, "gpu-0").unwrap();
    stale.metadata.resource_version = Some("7".into());
    let validated = validate(&policy().spec, &default_images()).unwrap();
    let drivers = DriverObjects::observe(&validated, &[], &fixture.context.nvidia_drivers);
    let pass = async |node: &Node| {
        label_nodes(
            &validated,
            &[Arc::new(node.clone())],
            ContainerRuntime::Containerd,
            &drivers,
            &fixture.context,
        )
        .await
        .map(|labelled| {
            labelled
                .into_iter()
                .map(Cow::into_owned)
                .collect::<Vec<_>>()
        })
    };
    let first = pass(&stale).await.unwrap();
    assert_eq!(first[0]["nvidia.com/gpu.deploy.device-plugin"], "true");
    assert_eq!(writes_since_last_look(&fixture), 1);

    let again = pass(&stale).await.unwrap();
    assert_eq!(again, first, "the labels as the patch left them");
    assert!(
        fixture.api.take_requests().is_empty(),
        "the cache still shows the version the patch was planned at: nothing to write"
    );

    // An admin removed the label after the patch; the cache now shows their version, which is planned from.
    let mut admins = stale.clone();
    admins.metadata.resource_version = Some("9".into());
    pass(&admins).await.unwrap();
    assert_eq!(writes_since_last_look(&fixture), 1);
}

#[tokio::test]
async fn standard_a_refused_label_patch_is_an_error_naming_the_node_and_the_reason() {
    let fixture = gpu_node();
    standard::refusals_are_errors(
        &fixture.api.clone(),
        Method::PATCH,
        NODE_PATH,
        "labelling node gpu-0",
        async || label(&fixture).await,
    )
    .await;
}

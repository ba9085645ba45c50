//! The uninstall hook against the stateful fake API server: the four standard tests, for a deleter ("created"
//! reads "what the operator made is deleted").

use api_test_kit::FakeApi;
use api_test_kit::standard::{self, Retry};
use http::Method;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;

use super::*;

const POLICY: &str = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy";

/// A cluster with the operator's ClusterPolicy (finalized already), its HAMi webhook configuration and its CRDs.
fn installed() -> (FakeApi, Client) {
    let (api, client) = FakeApi::start();
    api.insert(&ClusterPolicy::new(
        "cluster-policy",
        crd::ClusterPolicySpec::default(),
    ));
    let mut configuration = MutatingWebhookConfiguration::default();
    configuration.metadata.name = Some(crate::webhook::CONFIGURATION.into());
    api.insert(&configuration);
    for crd in crd::crds::all() {
        api.insert(&crd);
    }
    (api, client)
}

async fn uninstall_all(client: &Client) -> Result<Vec<String>, String> {
    uninstall(client, Duration::from_secs(5), true)
        .await
        .map_err(|error| error.to_string())
}

#[tokio::test]
async fn standard_an_uninstalled_cluster_is_not_written() {
    let (api, client) = installed();
    standard::unchanged_is_not_written(&api, async || uninstall_all(&client).await.map(drop)).await;
}

#[tokio::test]
async fn standard_what_the_operator_made_is_deleted() {
    let (api, client) = installed();
    assert_eq!(uninstall_all(&client).await.unwrap(), ["cluster-policy"]);
    assert!(api.object(POLICY).is_none());
    let configuration =
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpu-operator-hami";
    assert!(api.object(configuration).is_none());
    let crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    assert!(api.objects(crds).is_empty());
}

#[tokio::test]
async fn standard_a_conflicting_delete_is_retried() {
    let (api, client) = installed();
    standard::conflict_is_retried(&api, Method::DELETE, POLICY, Retry::Itself, async || {
        uninstall_all(&client).await.map(drop)
    })
    .await;
    assert!(api.object(POLICY).is_none());
}

#[tokio::test]
async fn standard_a_refused_delete_is_an_error_naming_the_policy_and_the_reason() {
    let (api, client) = installed();
    standard::refusals_are_errors(
        &api,
        Method::DELETE,
        POLICY,
        "ClusterPolicy cluster-policy",
        async || uninstall_all(&client).await.map(drop),
    )
    .await;
}

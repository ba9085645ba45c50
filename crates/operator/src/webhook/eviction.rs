//! Evictions bound to the evicting agent's node. The MIG manager evicts the GPU pods of its own node before a MIG
//! change; RBAC can only grant `pods/eviction` cluster-wide, and a ValidatingAdmissionPolicy sees the Eviction, not
//! the pod it names, so neither can keep a compromised node's token from evicting pods anywhere. This validating
//! webhook reads the pod and allows the eviction only when it runs on the node the requester's token is bound to
//! (the `authentication.kubernetes.io/node-name` extra that the API server puts in the user info of a token the
//! kubelet got for a pod). The configuration sends it only the evictions of the agents that evict, so no other
//! eviction in the cluster waits on the operator.

use axum::Json;
use axum::extract::State;
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::{Api, Client};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::tls::Endpoint;

/// The admission path.
pub const PATH: &str = "/node-bound-evictions";
/// The ValidatingWebhookConfiguration's name.
pub const CONFIGURATION: &str = "gpu-operator-node-bound-evictions";
/// The user-info extra that names the node of a pod-bound ServiceAccount token.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// The ServiceAccounts (in the operator's namespace) that may evict, and so whose evictions are checked: the MIG
/// manager's (charts/gpu-operator/templates/node-agent-rbac.yaml grants no other agent `pods/eviction`).
pub const EVICTING_SERVICE_ACCOUNTS: [&str; 1] = ["nvidia-mig-manager"];

/// Whether an eviction of `pod` (namespace/name), found on `pod_node` (`None`: not scheduled), may go ahead when
/// `requester`'s token is bound to `requester_node` (pure). A pod that does not exist is allowed: the API server
/// then answers 404, which reveals no more than the agent's `list pods` already does.
///
/// # Errors
/// The refusal's message, naming the requester, both nodes and what to do.
pub fn verdict(
    requester: &str,
    requester_node: Option<&str>,
    pod: &str,
    pod_node: Option<Option<&str>>,
) -> Result<(), String> {
    let Some(requester_node) = requester_node else {
        return Err(format!(
            "{requester} may evict only pods on its own node, and its token names no node ({NODE_NAME_EXTRA}): \
             run it with the ServiceAccount token the kubelet mounts into its pod"
        ));
    };
    match pod_node {
        None => Ok(()),
        Some(Some(node)) if node == requester_node => Ok(()),
        Some(node) => Err(format!(
            "{requester} on node {requester_node} may evict only pods on node {requester_node}; pod {pod} {}",
            node.map_or_else(
                || "is not scheduled to a node".to_owned(),
                |node| format!("runs on node {node}")
            )
        )),
    }
}

/// The ValidatingWebhookConfiguration that sends this webhook the evictions of [`EVICTING_SERVICE_ACCOUNTS`] in
/// `namespace`. `failurePolicy: Fail`: while the operator cannot answer, the MIG manager's evictions wait (it
/// retries them, and reports the refusal), rather than going through unchecked.
#[must_use]
pub fn configuration(namespace: &str, endpoint: &Endpoint, ca_bundle: &str) -> Value {
    let users = EVICTING_SERVICE_ACCOUNTS
        .iter()
        .map(|account| format!("'system:serviceaccount:{namespace}:{account}'"))
        .collect::<Vec<_>>()
        .join(", ");
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION, "labels": {"app.kubernetes.io/managed-by": "gpu-operator"}},
        "webhooks": [{
            "name": "node-bound-evictions.gpu.nvidia.com",
            "admissionReviewVersions": ["v1"],
            "clientConfig": endpoint.client_config(PATH, ca_bundle),
            "rules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods/eviction"], "scope": "Namespaced",
            }],
            "matchConditions": [{
                "name": "evicted-by-a-node-agent",
                "expression": format!("request.userInfo.username in [{users}]"),
            }],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "timeoutSeconds": super::API_SERVER_TIMEOUT.as_secs(),
        }],
    })
}

/// `POST /node-bound-evictions`: one AdmissionReview of an Eviction.
pub async fn review(
    State(client): State<Client>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(error) => return Json(AdmissionResponse::invalid(error.to_string()).into_review()),
    };
    Json(admit(&client, &request).await.into_review())
}

async fn admit(client: &Client, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let namespace = request.namespace.clone().unwrap_or_default();
    let pod = format!("{namespace}/{}", request.name);
    let requester = request.user_info.username.clone().unwrap_or_default();
    let requester_node = request
        .user_info
        .extra
        .as_ref()
        .and_then(|extra| extra.get(NODE_NAME_EXTRA))
        .and_then(|nodes| nodes.first())
        .map(String::as_str);
    let pod_node = match Api::<Pod>::namespaced(client.clone(), &namespace)
        .get_opt(&request.name)
        .await
    {
        Ok(found) => found.map(|pod| pod.spec.and_then(|spec| spec.node_name)),
        Err(error) => {
            warn!(%pod, %error, "cannot read the pod to be evicted; refusing the eviction");
            return response.deny(format!(
                "cannot check that pod {pod} runs on the evicting agent's node: {error}"
            ));
        }
    };
    match verdict(
        &requester,
        requester_node,
        &pod,
        pod_node.as_ref().map(Option::as_deref),
    ) {
        Ok(()) => response,
        Err(why) => {
            info!(%pod, %requester, "eviction refused: {why}");
            response.deny(why)
        }
    }
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;
    use api_test_kit::{Answer, FakeApi, expect};

    const MIG_MANAGER: &str = "system:serviceaccount:gpu-operator:nvidia-mig-manager";

    #[test]
    fn a_pod_on_the_requesters_node_may_be_evicted() {
        assert_eq!(
            verdict(MIG_MANAGER, Some("a"), "team/job", Some(Some("a"))),
            Ok(())
        );
    }

    #[test]
    fn a_pod_on_another_node_may_not_and_the_refusal_names_both_nodes() {
        let why = verdict(MIG_MANAGER, Some("a"), "team/job", Some(Some("b"))).unwrap_err();
        assert!(
            why.contains("on node a may evict only pods on node a; pod team/job runs on node b"),
            "{why}"
        );
    }

    #[test]
    fn an_unscheduled_pod_is_on_no_agents_node() {
        let why = verdict(MIG_MANAGER, Some("a"), "team/job", Some(None)).unwrap_err();
        assert!(why.contains("is not scheduled to a node"), "{why}");
    }

    #[test]
    fn a_token_bound_to_no_node_evicts_nothing() {
        let why = verdict(MIG_MANAGER, None, "team/job", Some(Some("a"))).unwrap_err();
        assert!(why.contains(NODE_NAME_EXTRA), "{why}");
        assert!(verdict(MIG_MANAGER, None, "team/gone", None).is_err());
    }

    #[test]
    fn a_missing_pod_is_left_to_the_api_servers_404() {
        assert_eq!(verdict(MIG_MANAGER, Some("a"), "team/gone", None), Ok(()));
    }

    #[test]
    fn the_configuration_sends_only_the_evicting_agents_evictions() {
        let configuration = configuration(
            "gpu-operator",
            &Endpoint::Url("https://127.0.0.1:9443".into()),
            "CA",
        );
        let webhook = &configuration["webhooks"][0];
        assert_eq!(webhook["rules"][0]["resources"], json!(["pods/eviction"]));
        assert_eq!(
            webhook["matchConditions"][0]["expression"],
            format!("request.userInfo.username in ['{MIG_MANAGER}']")
        );
        assert_eq!(webhook["failurePolicy"], "Fail");
        assert_eq!(
            webhook["clientConfig"]["url"],
            format!("https://127.0.0.1:9443{PATH}")
        );
    }

    /// The AdmissionReview the API server sends for `requester_node`'s MIG manager evicting team/job.
    fn eviction_review(requester_node: &str) -> AdmissionRequest<DynamicObject> {
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "0b7e2a9c-0000-0000-0000-000000000001",
                "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "eviction",
                "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "requestSubResource": "eviction",
                "name": "job", "namespace": "team", "operation": "CREATE",
                "userInfo": {
                    "username": MIG_MANAGER,
                    "extra": {NODE_NAME_EXTRA: [requester_node]},
                },
                "object": {
                    "apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": "job", "namespace": "team"},
                },
                "dryRun": false,
            },
        }))
        .unwrap();
        review.try_into().unwrap()
    }

    /// The webhook's answer when the pod, read from the API, runs on node b.
    async fn answer_for(requester_node: &str) -> AdmissionResponse {
        let (api, client) = FakeApi::scripted(vec![expect(
            Method::GET,
            "/api/v1/namespaces/team/pods/job",
            Answer::Json(
                200,
                json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "job", "namespace": "team"},
                    "spec": {"nodeName": "b", "containers": [{"name": "main"}]},
                }),
            ),
        )]);
        let response = admit(&client, &eviction_review(requester_node)).await;
        api.finish();
        response
    }

    #[tokio::test]
    async fn the_webhook_reads_the_pod_and_allows_its_own_nodes_agent() {
        assert!(answer_for("b").await.allowed);
    }

    #[tokio::test]
    async fn the_webhook_reads_the_pod_and_refuses_another_nodes_agent() {
        let refused = answer_for("a").await;
        assert!(!refused.allowed);
        assert!(
            refused
                .result
                .message
                .contains("pod team/job runs on node b")
        );
    }
}

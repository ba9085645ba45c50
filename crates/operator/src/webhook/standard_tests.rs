//! The webhook's writers against the stateful fake API server ([`api_test_kit`]): the four standard tests for the
//! TLS Secret, the webhook configurations, the HAMi ResourceClaimTemplates and their sweep.

use api_test_kit::standard::{self, Retry};
use api_test_kit::{FakeApi, logs};
use http::Method;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::{Api, Client};
use serde_json::{Value, json};

use super::*;

const NAMESPACE: &str = "gpu-operator";
const SECRET_PATH: &str = "/api/v1/namespaces/gpu-operator/secrets/gpu-operator-webhook-tls";
const MUTATING_PATH: &str =
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpu-operator-hami";
const TEMPLATES: &str = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates";

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

// The TLS Secret.

async fn ensure_secret(client: &Client) -> Result<(), String> {
    let hosts = vec!["127.0.0.1".to_owned()];
    tls::ensure_secret(client, NAMESPACE, SECRET, &hosts, None)
        .await
        .map(drop)
        .map_err(text)
}

#[tokio::test]
async fn standard_a_usable_secret_is_not_written() {
    let (api, client) = FakeApi::start();
    standard::unchanged_is_not_written(&api, async || ensure_secret(&client).await).await;
}

#[tokio::test]
async fn standard_a_missing_secret_is_created() {
    let (api, client) = FakeApi::start();
    let secret =
        standard::missing_is_created(&api, SECRET_PATH, async || ensure_secret(&client).await)
            .await;
    assert!(secret["data"]["tls.crt"].is_string(), "{secret}");
}

/// A conflict is another replica writing first: the writer reads again and writes (or serves) within the call.
#[tokio::test]
async fn standard_a_conflicting_secret_write_is_retried() {
    let (api, client) = FakeApi::start();
    standard::conflict_is_retried(&api, Method::POST, "/secrets", Retry::Itself, async || {
        ensure_secret(&client).await
    })
    .await;
    assert!(api.object(SECRET_PATH).is_some());
}

#[tokio::test]
async fn standard_a_refused_secret_write_is_an_error_naming_the_secret_and_the_reason() {
    let (api, client) = FakeApi::start();
    standard::refusals_are_errors(
        &api,
        Method::POST,
        "/secrets",
        "Secret gpu-operator/gpu-operator-webhook-tls",
        async || ensure_secret(&client).await,
    )
    .await;
}

// The webhook configurations.

fn configuration() -> Value {
    let endpoint = tls::Endpoint::Url("https://127.0.0.1:9443".into());
    tls::configuration(
        CONFIGURATION,
        PATH,
        &endpoint,
        "a CA bundle",
        &super::hami::ResourceNames::default(),
    )
}

async fn apply_configuration(client: &Client) -> Result<(), String> {
    tls::apply_configuration(client, &configuration())
        .await
        .map_err(text)
}

#[tokio::test]
async fn standard_an_unchanged_configuration_is_not_written() {
    let (api, client) = FakeApi::start();
    standard::unchanged_is_not_written(&api, async || apply_configuration(&client).await).await;
}

#[tokio::test]
async fn standard_a_missing_configuration_is_created() {
    let (api, client) = FakeApi::start();
    let stored = standard::missing_is_created(&api, MUTATING_PATH, async || {
        apply_configuration(&client).await
    })
    .await;
    assert_eq!(stored["webhooks"], configuration()["webhooks"]);
}

/// The webhook's setup retries a failed apply of its configurations with backoff: the call fails, the next one
/// applies it.
#[tokio::test]
async fn standard_a_conflicting_configuration_apply_is_retried_by_the_next_try() {
    let (api, client) = FakeApi::start();
    standard::conflict_is_retried(
        &api,
        Method::PATCH,
        MUTATING_PATH,
        Retry::NextPass,
        async || apply_configuration(&client).await,
    )
    .await;
    assert_eq!(
        api.object(MUTATING_PATH).unwrap()["webhooks"],
        configuration()["webhooks"]
    );
}

#[tokio::test]
async fn standard_a_refused_configuration_is_an_error_naming_it_and_the_reason() {
    let (api, client) = FakeApi::start();
    standard::refusals_are_errors(
        &api,
        Method::PATCH,
        MUTATING_PATH,
        "MutatingWebhookConfiguration gpu-operator-hami",
        async || apply_configuration(&client).await,
    )
    .await;
}

/// A configuration someone edited is applied again.
#[tokio::test]
async fn an_edited_configuration_is_applied_again() {
    let (api, client) = FakeApi::start();
    apply_configuration(&client).await.unwrap();
    let configurations = Api::<
        k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
    >::all(client.clone());
    let mut edited = configurations.get(CONFIGURATION).await.unwrap();
    edited.webhooks.get_or_insert_default()[0]
        .client_config
        .ca_bundle = None;
    api.insert(&edited);
    api.take_requests();
    apply_configuration(&client).await.unwrap();
    assert!(
        api.take_requests()
            .iter()
            .any(|request| request.method == Method::PATCH)
    );
}

// The HAMi ResourceClaimTemplates.

fn template() -> ResourceClaimTemplate {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "hami-gpu-aa", "labels": {"app.kubernetes.io/managed-by": "gpu-operator"}},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "shared.gpu.nvidia.com", "count": 1, "allocationMode": "ExactCount",
        }}]}}},
    }))
    .unwrap()
}

async fn ensure_template(client: &Client) -> Result<(), String> {
    let templates = Api::namespaced(client.clone(), "team");
    review::ensure_template(&templates, &template(), template_gc::UNUSED_FOR)
        .await
        .map_err(text)
}

/// A template in use, marked moments ago, is used as it is.
#[tokio::test]
async fn standard_a_template_in_use_is_not_written() {
    let (api, client) = FakeApi::start();
    standard::unchanged_is_not_written(&api, async || ensure_template(&client).await).await;
}

#[tokio::test]
async fn standard_a_missing_template_is_created_marked_used() {
    let (api, client) = FakeApi::start();
    let path = format!("{TEMPLATES}/hami-gpu-aa");
    let created =
        standard::missing_is_created(&api, &path, async || ensure_template(&client).await).await;
    assert!(created["metadata"]["annotations"][template_gc::LAST_USED_ANNOTATION].is_string());
}

/// A create that conflicts is another replica creating the same template: read again within the call.
#[tokio::test]
async fn standard_a_conflicting_template_create_is_retried() {
    let (api, client) = FakeApi::start();
    standard::conflict_is_retried(&api, Method::POST, TEMPLATES, Retry::Itself, async || {
        ensure_template(&client).await
    })
    .await;
    assert!(api.object(&format!("{TEMPLATES}/hami-gpu-aa")).is_some());
}

/// The error refuses the pod, with this text in the admission response.
#[tokio::test]
async fn standard_a_refused_template_is_an_error_naming_it_and_the_reason() {
    let (api, client) = FakeApi::start();
    standard::refusals_are_errors(
        &api,
        Method::POST,
        TEMPLATES,
        "ResourceClaimTemplate hami-gpu-aa",
        async || ensure_template(&client).await,
    )
    .await;
}

// The templates' sweep: a deleter, so "created" reads "an unused template deleted".

/// A server holding an old template that pod `user` in `team` uses when `used`, and an old one nobody uses.
fn old_templates(used: bool) -> (FakeApi, Client) {
    let (api, client) = FakeApi::start();
    for name in ["hami-gpu-used", "hami-gpu-unused"] {
        let mut template = template();
        template.metadata.name = Some(name.into());
        template.metadata.namespace = Some("team".into());
        template.metadata.annotations = Some(
            [(
                template_gc::LAST_USED_ANNOTATION.to_owned(),
                "2020-01-01T00:00:00Z".to_owned(),
            )]
            .into(),
        );
        api.insert(&template);
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "user", "namespace": "team", "labels": {hami::CONVERTED_LABEL: "hami-dra"}},
        "spec": {"containers": [{"name": "main"}], "resourceClaims": [
            {"name": "gpu", "resourceClaimTemplateName": if used { "hami-gpu-used" } else { "none" }},
        ]},
    }))
    .unwrap();
    api.insert(&pod);
    (api, client)
}

async fn sweep(client: &Client) -> Result<(), String> {
    template_gc::sweep(client, template_gc::UNUSED_FOR)
        .await
        .map(drop)
        .map_err(text)
}

#[tokio::test]
async fn standard_a_used_template_is_not_deleted() {
    let (api, client) = old_templates(true);
    api.remove(&format!("{TEMPLATES}/hami-gpu-unused"));
    standard::unchanged_is_not_written(&api, async || sweep(&client).await).await;
    assert!(api.object(&format!("{TEMPLATES}/hami-gpu-used")).is_some());
}

#[tokio::test]
async fn standard_an_unused_template_is_deleted() {
    let (api, client) = old_templates(true);
    sweep(&client).await.unwrap();
    assert!(
        api.object(&format!("{TEMPLATES}/hami-gpu-unused"))
            .is_none()
    );
    assert!(api.object(&format!("{TEMPLATES}/hami-gpu-used")).is_some());
}

/// A conflicting delete (the template used or changed since the sweep read it) is kept; the next sweep, every
/// few minutes, deletes it if it is still unused.
#[tokio::test]
async fn standard_a_conflicting_delete_is_retried_by_the_next_sweep() {
    let (api, client) = old_templates(false);
    let unused = format!("{TEMPLATES}/hami-gpu-unused");
    api.fail_next(Method::DELETE, &unused, 409);
    let deleted = |api: &FakeApi| api.object(&unused).is_none();
    sweep(&client).await.unwrap();
    assert!(!deleted(&api) && api.failures_left() == 0);
    sweep(&client).await.unwrap();
    assert!(deleted(&api));
}

/// A refused delete is logged with the template and the API server's answer.
#[tokio::test]
async fn standard_a_refused_delete_is_logged_naming_the_template_and_the_reason() {
    for code in [403, 422] {
        let (api, client) = old_templates(true);
        let unused = format!("{TEMPLATES}/hami-gpu-unused");
        let (outcome, logged) = logs::warnings(standard::refusal_is_reported(
            &api,
            Method::DELETE,
            &unused,
            code,
            async || sweep(&client).await,
        ))
        .await;
        outcome.unwrap();
        standard::assert_names(&logged, "template=hami-gpu-unused", code);
    }
}

//! The webhook's certificate in the cluster: kept in a Secret of the operator's namespace (so every replica serves
//! the same one), created when missing and renewed a month before it expires, and the MutatingWebhookConfiguration
//! that trusts its CA. While a renewal rolls out, the `caBundle` holds the old and the new CA, so the API server
//! trusts whichever certificate a replica still presents. A Secret whose content cannot be served (not PEM, keys
//! missing, a key of another certificate) is treated as absent: a new CA and certificate replace it, with a
//! warning, rather than the operator failing on it.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use time::OffsetDateTime;
use tracing::{info, warn};

use super::certs::{self, CertError, TlsMaterial};
use super::hami;
use crate::render::{MANAGED_BY_LABEL, MANAGER};

/// The field manager of what the webhook writes.
const FIELD_MANAGER: &str = "gpu-operator-webhook";
/// Secret keys.
const CA_KEY: &str = "ca.crt";
const CERT_KEY: &str = "tls.crt";
const PRIVATE_KEY: &str = "tls.key";
/// The previous CA, trusted until the next renewal.
const PREVIOUS_CA_KEY: &str = "previous-ca.crt";

/// Why the webhook's certificate or configuration cannot be kept.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The API refused a read or write.
    #[error("{action}: {source}")]
    Api {
        /// What was done.
        action: String,
        /// The API's answer.
        source: kube::Error,
    },
    /// The certificate could not be made.
    #[error(transparent)]
    Cert(#[from] CertError),
    /// Other writers kept changing the Secret between this replica's read and its write.
    #[error("Secret {secret} kept changing while the certificate was written")]
    Contended {
        /// `namespace/name`.
        secret: String,
    },
}

fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> TlsError {
    let action = action.into();
    move |source| TlsError::Api { action, source }
}

/// The certificate in the Secret, with the CAs the API server must trust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// What the webhook serves with.
    pub material: TlsMaterial,
    /// The current CA and, during a renewal, the previous one.
    pub ca_bundle: String,
}

/// Reads the Secret `name`, creating or renewing the certificate in it when needed (for `hosts`). Two replicas
/// doing so at once are kept apart by the Secret's resourceVersion: the loser reads the winner's.
///
/// A Secret that cannot be served is replaced by new material; `serving`, the material this replica serves
/// now (if any), keeps its CA in the bundle meanwhile, since the other replicas serve the same.
///
/// # Errors
/// When the Secret cannot be read or written, or a certificate cannot be made.
pub async fn ensure_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    hosts: &[String],
    serving: Option<&TlsMaterial>,
) -> Result<Stored, TlsError> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    for _ in 0..3 {
        let existing = secrets
            .get_opt(name)
            .await
            .map_err(api(format!("reading Secret {namespace}/{name}")))?;
        let now = OffsetDateTime::now_utc();
        let current = match existing.as_ref().map(|secret| {
            let current = stored(secret)?;
            Ok::<_, CertError>((
                certs::needs_renewal(&current.material, hosts, now)?,
                current,
            ))
        }) {
            None => None,
            Some(Ok((false, current))) => return Ok(current),
            Some(Ok((true, current))) => Some(current),
            Some(Err(problem)) => {
                warn!(
                    secret = %format!("{namespace}/{name}"), %problem,
                    "the webhook's TLS Secret cannot be served; replacing it with a new CA and certificate"
                );
                None
            }
        };
        let material = certs::generate(hosts, now)?;
        let previous_ca = current
            .as_ref()
            .map(|current| &current.material)
            .or(serving)
            .map(|previous| previous.ca_pem.clone());
        let mut data = BTreeMap::from([
            (CA_KEY.to_owned(), bytes(&material.ca_pem)),
            (CERT_KEY.to_owned(), bytes(&material.cert_pem)),
            (PRIVATE_KEY.to_owned(), bytes(&material.key_pem)),
        ]);
        if let Some(previous) = &previous_ca {
            data.insert(PREVIOUS_CA_KEY.to_owned(), bytes(previous));
        }
        let mut secret = Secret {
            data: Some(data),
            type_: Some("kubernetes.io/tls".into()),
            ..Secret::default()
        };
        secret.metadata.name = Some(name.to_owned());
        secret.metadata.labels = Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_owned(),
            MANAGER.to_owned(),
        )]));
        let written = match existing {
            Some(existing) => {
                // Without it, two replicas replacing at once would both win, each serving its own CA.
                secret.metadata.resource_version = existing.metadata.resource_version;
                // A Secret's type cannot change; one created by hand as Opaque stays Opaque.
                secret.type_ = existing.type_.or(secret.type_);
                secrets.replace(name, &PostParams::default(), &secret).await
            }
            None => secrets.create(&PostParams::default(), &secret).await,
        };
        match written {
            Ok(_) => {
                info!(
                    secret = name,
                    renewed = current.is_some(),
                    "webhook certificate written"
                );
                let ca_bundle = previous_ca.map_or_else(
                    || material.ca_pem.clone(),
                    |previous| format!("{}{previous}", material.ca_pem),
                );
                return Ok(Stored {
                    material,
                    ca_bundle,
                });
            }
            // Another replica wrote first: read what it wrote.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(api(format!("writing Secret {namespace}/{name}"))(error)),
        }
    }
    Err(TlsError::Contended {
        secret: format!("{namespace}/{name}"),
    })
}

fn bytes(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

/// The material in a Secret; why not, when a key is missing or not text. A previous CA that is not text is
/// left out of the bundle: the API server would not read it either, and the current CA still verifies.
fn stored(secret: &Secret) -> Result<Stored, CertError> {
    let empty = BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    let text = |key: &str| match data.get(key) {
        None => Err(CertError::Unusable(format!("it has no {key}"))),
        Some(value) => String::from_utf8(value.0.clone())
            .map_err(|_| CertError::Unusable(format!("its {key} is not text"))),
    };
    let material = TlsMaterial {
        ca_pem: text(CA_KEY)?,
        cert_pem: text(CERT_KEY)?,
        key_pem: text(PRIVATE_KEY)?,
    };
    let mut ca_bundle = material.ca_pem.clone();
    if let Ok(previous) = text(PREVIOUS_CA_KEY) {
        ca_bundle.push_str(&previous);
    }
    Ok(Stored {
        material,
        ca_bundle,
    })
}

/// Where the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The operator's Service (in-cluster).
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its port.
        port: i32,
    },
    /// A URL (the operator outside the cluster, as in development and the end-to-end tests).
    Url(String),
}

impl Endpoint {
    /// The names the serving certificate must carry.
    #[must_use]
    pub fn hosts(&self) -> Vec<String> {
        match self {
            Self::Service {
                namespace, name, ..
            } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
            ],
            Self::Url(url) => {
                let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
                let authority = rest.split('/').next().unwrap_or_default();
                let host = authority
                    .rsplit_once(':')
                    .map_or(authority, |(host, _)| host)
                    .trim_matches(['[', ']']);
                vec![host.to_owned()]
            }
        }
    }

    pub(super) fn client_config(&self, path: &str, ca_bundle: &str) -> Value {
        let ca = base64_encode(ca_bundle.as_bytes());
        match self {
            Self::Service {
                namespace,
                name,
                port,
            } => json!({
                "service": {"namespace": namespace, "name": name, "path": path, "port": port},
                "caBundle": ca,
            }),
            Self::Url(url) => json!({
                "url": format!("{}{path}", url.trim_end_matches('/')),
                "caBundle": ca,
            }),
        }
    }
}

/// The MutatingWebhookConfiguration for HAMi pods (pure).
///
/// - `matchConditions` send only pods that ask for HAMi's `nvidia.com/gpumem`, `gpumem-percentage` or `gpucores`
///   (by the cluster's `names`, each checked to be a resource name, so safe to quote in CEL; and a renamed
///   whole-GPU name), or carry HAMi's GPU-selection annotations: no other pod ever waits on the webhook, and none fails when it is down.
/// - `failurePolicy: Fail`: a HAMi pod admitted unchanged would get a whole GPU through `nvidia.com/gpu` with no
///   memory bound, or wait forever for a resource no node offers; refused with the webhook's error, its owner sees
///   why at once.
/// - `sideEffects: NoneOnDryRun`: the webhook creates ResourceClaimTemplates, except on dry runs.
#[must_use]
pub fn configuration(
    name: &str,
    path: &str,
    endpoint: &Endpoint,
    ca_bundle: &str,
    names: &hami::ResourceNames,
) -> Value {
    let shares = names.converted_without_selection();
    let any_of = |field: &str| {
        shares
            .iter()
            .map(|resource| format!("'{resource}' in c.resources.{field}"))
            .collect::<Vec<_>>()
            .join(" || ")
    };
    let any_container = |list: &str| {
        format!(
            "(has(object.spec.{list}) && object.spec.{list}.exists(c, has(c.resources) && \
             ((has(c.resources.limits) && ({limits})) || (has(c.resources.requests) && ({requests})))))",
            limits = any_of("limits"),
            requests = any_of("requests"),
        )
    };
    let selected = format!(
        "(has(object.metadata.annotations) && ({}))",
        hami::SELECTION_ANNOTATIONS
            .iter()
            .map(|annotation| format!("'{annotation}' in object.metadata.annotations"))
            .collect::<Vec<_>>()
            .join(" || ")
    );
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpu-operator"}},
        "webhooks": [{
            "name": "hami.gpu.nvidia.com",
            "admissionReviewVersions": ["v1"],
            "clientConfig": endpoint.client_config(path, ca_bundle),
            "rules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods"], "scope": "Namespaced",
            }],
            "matchConditions": [{
                "name": "asks-for-hami-resources",
                "expression": format!(
                    "{} || {} || {selected}",
                    any_container("containers"),
                    any_container("initContainers")
                ),
            }],
            "failurePolicy": "Fail",
            "sideEffects": "NoneOnDryRun",
            "reinvocationPolicy": "Never",
            "timeoutSeconds": super::API_SERVER_TIMEOUT.as_secs(),
        }],
    })
}

/// The two kinds of webhook configuration the operator keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigurationKind {
    /// The HAMi pod conversion.
    Mutating,
    /// The node-bound eviction guard.
    Validating,
}

impl ConfigurationKind {
    fn of(configuration: &Value) -> Self {
        if configuration["kind"] == "ValidatingWebhookConfiguration" {
            Self::Validating
        } else {
            Self::Mutating
        }
    }

    fn api(self, client: &Client) -> Api<DynamicObject> {
        let resource = match self {
            Self::Mutating => ApiResource::erase::<MutatingWebhookConfiguration>(&()),
            Self::Validating => ApiResource::erase::<ValidatingWebhookConfiguration>(&()),
        };
        Api::all_with(client.clone(), &resource)
    }

    fn kind(self) -> &'static str {
        match self {
            Self::Mutating => "MutatingWebhookConfiguration",
            Self::Validating => "ValidatingWebhookConfiguration",
        }
    }
}

/// Applies the configuration (server-side apply), of either kind.
///
/// # Errors
/// When the API refuses it.
pub async fn apply_configuration(client: &Client, configuration: &Value) -> Result<(), TlsError> {
    let name = configuration["metadata"]["name"]
        .as_str()
        .unwrap_or_default();
    let kind = ConfigurationKind::of(configuration);
    let configurations = kind.api(client);
    let stored = configurations
        .get_opt(name)
        .await
        .map_err(api(format!("reading {} {name}", kind.kind())))?;
    // No write at rest: only a missing configuration, or one whose fields someone changed, is applied.
    if stored.is_some_and(|stored| holds(&json!(stored), configuration)) {
        return Ok(());
    }
    configurations
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(configuration),
        )
        .await
        .map_err(api(format!("applying {} {name}", kind.kind())))?;
    Ok(())
}

/// Whether `stored` holds every field of `wanted` with its value (what the API server added by default aside).
fn holds(stored: &Value, wanted: &Value) -> bool {
    match (stored, wanted) {
        (Value::Object(stored), Value::Object(wanted)) => wanted
            .iter()
            .all(|(key, value)| stored.get(key).is_some_and(|stored| holds(stored, value))),
        (Value::Array(stored), Value::Array(wanted)) => {
            stored.len() == wanted.len()
                && stored
                    .iter()
                    .zip(wanted)
                    .all(|(stored, wanted)| holds(stored, wanted))
        }
        _ => stored == wanted,
    }
}

/// Deletes a configuration (its webhook is switched off); gone already is fine.
///
/// # Errors
/// When the API refuses.
pub async fn delete_configuration(
    client: &Client,
    kind: ConfigurationKind,
    name: &str,
) -> Result<(), TlsError> {
    let configurations = kind.api(client);
    // Read first, so that an uninstall or a start with the webhook off writes nothing when it is gone already.
    let stored = configurations
        .get_opt(name)
        .await
        .map_err(api(format!("reading {} {name}", kind.kind())))?;
    if stored.is_none() {
        return Ok(());
    }
    match configurations
        .delete(name, &kube::api::DeleteParams::default())
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        result => result
            .map(drop)
            .map_err(api(format!("deleting {} {name}", kind.kind()))),
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;
    use api_test_kit::{Answer, FakeApi, expect};

    const NAMESPACE: &str = "gpu-operator";
    const SECRET: &str = "gpu-operator-webhook-tls";
    const SECRET_PATH: &str = "/api/v1/namespaces/gpu-operator/secrets/gpu-operator-webhook-tls";

    fn hosts() -> Vec<String> {
        vec!["127.0.0.1".into()]
    }

    fn fresh() -> TlsMaterial {
        certs::generate(&hosts(), OffsetDateTime::now_utc()).unwrap()
    }

    /// The Secret as the API server returns it, at resourceVersion 7.
    fn secret(type_: &str, data: &[(&str, &[u8])]) -> Value {
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(key, value)| ((*key).to_owned(), base64_encode(value).into()))
            .collect();
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": {"name": SECRET, "namespace": NAMESPACE, "resourceVersion": "7"},
            "data": data,
        })
    }

    fn usable(material: &TlsMaterial) -> Value {
        secret(
            "kubernetes.io/tls",
            &[
                (CA_KEY, material.ca_pem.as_bytes()),
                (CERT_KEY, material.cert_pem.as_bytes()),
                (PRIVATE_KEY, material.key_pem.as_bytes()),
            ],
        )
    }

    fn decoded(value: &Value) -> String {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value.as_str().expect("base64 text"))
            .unwrap();
        String::from_utf8(bytes).unwrap()
    }

    /// Runs `ensure_secret` on `found`, which must be replaced (this replica serving `serving`); returns what it
    /// serves now and the Secret it wrote, checked to be the same, usable, and written over the version read.
    async fn replaced(found: Value, serving: Option<&TlsMaterial>) -> (Stored, Value) {
        let (api, client) = FakeApi::scripted(vec![
            expect(Method::GET, SECRET_PATH, Answer::Json(200, found)),
            expect(Method::PUT, SECRET_PATH, Answer::Echo),
        ]);
        let stored = ensure_secret(&client, NAMESPACE, SECRET, &hosts(), serving)
            .await
            .unwrap();
        let written = api.finish().remove(1).body;
        assert_eq!(written["metadata"]["resourceVersion"], "7");
        assert_eq!(decoded(&written["data"][CA_KEY]), stored.material.ca_pem);
        assert_eq!(
            decoded(&written["data"][CERT_KEY]),
            stored.material.cert_pem
        );
        assert_eq!(
            decoded(&written["data"][PRIVATE_KEY]),
            stored.material.key_pem
        );
        assert!(
            !certs::needs_renewal(&stored.material, &hosts(), OffsetDateTime::now_utc()).unwrap()
        );
        (stored, written)
    }

    /// Replaces `found`, trusting only the new CA: nothing of the unusable Secret is kept.
    async fn replaced_from_scratch(found: Value) -> Value {
        let (stored, written) = replaced(found, None).await;
        assert_eq!(stored.ca_bundle, stored.material.ca_pem);
        assert!(written["data"].get(PREVIOUS_CA_KEY).is_none(), "{written}");
        written
    }

    #[tokio::test]
    async fn a_secret_that_is_not_pem_is_replaced() {
        let good = fresh();
        replaced_from_scratch(secret(
            "kubernetes.io/tls",
            &[
                (CA_KEY, good.ca_pem.as_bytes()),
                (CERT_KEY, b"not a certificate"),
                (PRIVATE_KEY, good.key_pem.as_bytes()),
            ],
        ))
        .await;
    }

    #[tokio::test]
    async fn a_secret_missing_a_key_is_replaced() {
        let good = fresh();
        replaced_from_scratch(secret(
            "kubernetes.io/tls",
            &[
                (CA_KEY, good.ca_pem.as_bytes()),
                (CERT_KEY, good.cert_pem.as_bytes()),
            ],
        ))
        .await;
        replaced_from_scratch(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE, "resourceVersion": "7"},
        }))
        .await;
    }

    #[tokio::test]
    async fn a_key_of_another_certificate_is_replaced() {
        let (good, other) = (fresh(), fresh());
        replaced_from_scratch(secret(
            "kubernetes.io/tls",
            &[
                (CA_KEY, good.ca_pem.as_bytes()),
                (CERT_KEY, good.cert_pem.as_bytes()),
                (PRIVATE_KEY, other.key_pem.as_bytes()),
            ],
        ))
        .await;
    }

    #[tokio::test]
    async fn a_certificate_another_ca_signed_is_replaced() {
        let (good, other) = (fresh(), fresh());
        replaced_from_scratch(secret(
            "kubernetes.io/tls",
            &[
                (CA_KEY, other.ca_pem.as_bytes()),
                (CERT_KEY, good.cert_pem.as_bytes()),
                (PRIVATE_KEY, good.key_pem.as_bytes()),
            ],
        ))
        .await;
    }

    #[tokio::test]
    async fn a_secret_that_is_not_text_is_replaced() {
        let good = fresh();
        replaced_from_scratch(secret(
            "kubernetes.io/tls",
            &[
                (CA_KEY, good.ca_pem.as_bytes()),
                (CERT_KEY, &[0xff, 0xfe, 0x00]),
                (PRIVATE_KEY, good.key_pem.as_bytes()),
            ],
        ))
        .await;
    }

    #[tokio::test]
    async fn an_opaque_secret_is_replaced_as_opaque() {
        // The API server refuses to change a Secret's type: writing kubernetes.io/tls over it would fail forever.
        let written = replaced_from_scratch(secret("Opaque", &[("password", b"hunter2")])).await;
        assert_eq!(written["type"], "Opaque");
    }

    #[tokio::test]
    async fn the_ca_this_replica_serves_stays_trusted_when_the_secret_is_replaced() {
        // The other replicas serve the same certificate until they next check the Secret.
        let serving = fresh();
        let (stored, written) =
            replaced(secret("Opaque", &[(CERT_KEY, b"garbage")]), Some(&serving)).await;
        assert_eq!(decoded(&written["data"][PREVIOUS_CA_KEY]), serving.ca_pem);
        assert_eq!(
            stored.ca_bundle,
            format!("{}{}", stored.material.ca_pem, serving.ca_pem)
        );
    }

    #[tokio::test]
    async fn a_usable_secret_is_served_as_it_is() {
        let good = fresh();
        let (api, client) = FakeApi::scripted(vec![expect(
            Method::GET,
            SECRET_PATH,
            Answer::Json(200, usable(&good)),
        )]);
        let stored = ensure_secret(&client, NAMESPACE, SECRET, &hosts(), None)
            .await
            .unwrap();
        assert_eq!(stored.material, good);
        assert_eq!(api.finish().len(), 1, "nothing written");
    }

    #[tokio::test]
    async fn a_replica_that_loses_the_race_serves_the_winners_certificate() {
        let winners = fresh();
        let (api, client) = FakeApi::scripted(vec![
            expect(
                Method::GET,
                SECRET_PATH,
                Answer::Json(200, secret("kubernetes.io/tls", &[(CERT_KEY, b"garbage")])),
            ),
            expect(Method::PUT, SECRET_PATH, Answer::Error(409, "Conflict")),
            expect(
                Method::GET,
                SECRET_PATH,
                Answer::Json(200, usable(&winners)),
            ),
        ]);
        let stored = ensure_secret(&client, NAMESPACE, SECRET, &hosts(), None)
            .await
            .unwrap();
        assert_eq!(stored.material, winners);
        api.finish();
    }

    #[tokio::test]
    async fn a_missing_secret_is_created() {
        let (api, client) = FakeApi::scripted(vec![
            expect(Method::GET, SECRET_PATH, Answer::Error(404, "NotFound")),
            expect(
                Method::POST,
                "/api/v1/namespaces/gpu-operator/secrets",
                Answer::Echo,
            ),
        ]);
        let stored = ensure_secret(&client, NAMESPACE, SECRET, &hosts(), None)
            .await
            .unwrap();
        let written = api.finish().remove(1).body;
        assert_eq!(written["type"], "kubernetes.io/tls");
        assert_eq!(
            decoded(&written["data"][CERT_KEY]),
            stored.material.cert_pem
        );
    }

    #[test]
    fn the_certificate_names_the_service_or_the_url_host() {
        let service = Endpoint::Service {
            namespace: "gpu-operator".into(),
            name: "gpu-operator-webhook".into(),
            port: 443,
        };
        assert_eq!(service.hosts()[0], "gpu-operator-webhook.gpu-operator.svc");
        assert_eq!(
            Endpoint::Url("https://127.0.0.1:9443".into()).hosts(),
            ["127.0.0.1"]
        );
        assert_eq!(Endpoint::Url("https://[::1]:9443/".into()).hosts(), ["::1"]);
    }

    #[test]
    fn only_hami_pods_are_sent_and_they_fail_closed() {
        let endpoint = Endpoint::Url("https://127.0.0.1:9443".into());
        let config = configuration(
            "gpu-operator-hami",
            "/hami",
            &endpoint,
            "CA",
            &hami::ResourceNames::default(),
        );
        let webhook = &config["webhooks"][0];
        assert_eq!(webhook["failurePolicy"], "Fail");
        assert_eq!(webhook["sideEffects"], "NoneOnDryRun");
        assert_eq!(
            webhook["clientConfig"]["url"],
            "https://127.0.0.1:9443/hami"
        );
        assert_eq!(webhook["clientConfig"]["caBundle"], "Q0E=");
        let expression = webhook["matchConditions"][0]["expression"]
            .as_str()
            .unwrap();
        for resource in [hami::GPUMEM, hami::GPUMEM_PERCENTAGE, hami::GPUCORES] {
            assert!(
                expression.contains(&format!("'{resource}' in c.resources.limits")),
                "{expression}"
            );
        }
        assert!(expression.contains("'nvidia.com/use-gputype' in object.metadata.annotations"));
        assert!(expression.contains("object.spec.initContainers.exists"));
    }

    #[test]
    fn renamed_hami_resources_are_what_the_match_condition_sends() {
        let endpoint = Endpoint::Url("https://127.0.0.1:9443".into());
        let names = hami::ResourceNames::renamed_example();
        let config = configuration("gpu-operator-hami", "/hami", &endpoint, "CA", &names);
        let expression = config["webhooks"][0]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap();
        for resource in names.shares().into_iter().chain(["example.com/vgpu"]) {
            assert!(
                expression.contains(&format!("'{resource}' in c.resources.requests")),
                "{expression}"
            );
        }
        assert!(!expression.contains("nvidia.com/gpumem"), "{expression}");
    }
}

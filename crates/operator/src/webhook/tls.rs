//! The webhook's certificate in the cluster: kept in a Secret of the operator's namespace (so every replica serves
//! the same one), created when missing and renewed a month before it expires, and the MutatingWebhookConfiguration
//! that trusts its CA. While a renewal rolls out, the `caBundle` holds the old and the new CA, so the API server
//! trusts whichever certificate a replica still presents.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use time::OffsetDateTime;
use tracing::info;

use super::certs::{self, CertError, TlsMaterial};
use super::hami;

/// The field manager of what the webhook writes.
const MANAGER: &str = "gpu-operator-webhook";
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
    /// The certificate could not be made or read.
    #[error(transparent)]
    Cert(#[from] CertError),
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
/// # Errors
/// When the Secret cannot be read or written, or a certificate cannot be made.
pub async fn ensure_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    hosts: &[String],
) -> Result<Stored, TlsError> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    for _ in 0..3 {
        let existing = secrets
            .get_opt(name)
            .await
            .map_err(api(format!("reading Secret {namespace}/{name}")))?;
        let now = OffsetDateTime::now_utc();
        let current = existing.as_ref().and_then(stored);
        if let Some(current) = &current
            && !certs::needs_renewal(&current.material, hosts, now)?
        {
            return Ok(current.clone());
        }
        let material = certs::generate(hosts, now)?;
        let mut data = BTreeMap::from([
            (CA_KEY.to_owned(), bytes(&material.ca_pem)),
            (CERT_KEY.to_owned(), bytes(&material.cert_pem)),
            (PRIVATE_KEY.to_owned(), bytes(&material.key_pem)),
        ]);
        if let Some(previous) = &current {
            data.insert(PREVIOUS_CA_KEY.to_owned(), bytes(&previous.material.ca_pem));
        }
        let mut secret = Secret {
            data: Some(data),
            type_: Some("kubernetes.io/tls".into()),
            ..Secret::default()
        };
        secret.metadata.name = Some(name.to_owned());
        secret.metadata.labels = Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_owned(),
            "gpu-operator".to_owned(),
        )]));
        let written = match existing {
            Some(existing) => {
                secret.metadata.resource_version = existing.metadata.resource_version;
                secrets.replace(name, &PostParams::default(), &secret).await
            }
            None => secrets.create(&PostParams::default(), &secret).await,
        };
        match written {
            Ok(written) => {
                info!(
                    secret = name,
                    renewed = current.is_some(),
                    "webhook certificate written"
                );
                return stored(&written).ok_or_else(|| {
                    TlsError::Cert(CertError::Parse("the written Secret lost its keys".into()))
                });
            }
            // Another replica wrote first: read what it wrote.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(api(format!("writing Secret {namespace}/{name}"))(error)),
        }
    }
    Err(TlsError::Cert(CertError::Parse(format!(
        "Secret {namespace}/{name} kept changing while the certificate was written"
    ))))
}

fn bytes(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

fn stored(secret: &Secret) -> Option<Stored> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| {
        data.get(key)
            .and_then(|value| String::from_utf8(value.0.clone()).ok())
    };
    let material = TlsMaterial {
        ca_pem: text(CA_KEY)?,
        cert_pem: text(CERT_KEY)?,
        key_pem: text(PRIVATE_KEY)?,
    };
    let mut ca_bundle = material.ca_pem.clone();
    if let Some(previous) = text(PREVIOUS_CA_KEY) {
        ca_bundle.push_str(&previous);
    }
    Some(Stored {
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

    fn client_config(&self, path: &str, ca_bundle: &str) -> Value {
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
/// - `matchConditions` send only pods that ask for HAMi's `nvidia.com/gpumem`, `gpumem-percentage` or `gpucores`,
///   or carry HAMi's GPU-selection annotations: no other pod ever waits on the webhook, and none fails when it is
///   down.
/// - `failurePolicy: Fail`: a HAMi pod admitted unchanged would get a whole GPU through `nvidia.com/gpu` with no
///   memory bound, or wait forever for a resource no node offers; refused with the webhook's error, its owner sees
///   why at once.
/// - `sideEffects: NoneOnDryRun`: the webhook creates ResourceClaimTemplates, except on dry runs.
#[must_use]
pub fn configuration(name: &str, path: &str, endpoint: &Endpoint, ca_bundle: &str) -> Value {
    let shares = [hami::GPUMEM, hami::GPUMEM_PERCENTAGE, hami::GPUCORES];
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
            "timeoutSeconds": 10,
        }],
    })
}

/// Applies the configuration (server-side apply).
///
/// # Errors
/// When the API refuses it.
pub async fn apply_configuration(client: &Client, configuration: &Value) -> Result<(), TlsError> {
    let name = configuration["metadata"]["name"]
        .as_str()
        .unwrap_or_default();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(configuration),
        )
        .await
        .map_err(api(format!("applying MutatingWebhookConfiguration {name}")))?;
    Ok(())
}

/// Deletes the configuration (the webhook is switched off); gone already is fine.
///
/// # Errors
/// When the API refuses.
pub async fn delete_configuration(client: &Client, name: &str) -> Result<(), TlsError> {
    match Api::<MutatingWebhookConfiguration>::all(client.clone())
        .delete(name, &kube::api::DeleteParams::default())
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        result => result
            .map(drop)
            .map_err(api(format!("deleting MutatingWebhookConfiguration {name}"))),
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let config = configuration("gpu-operator-hami", "/hami", &endpoint, "CA");
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
}

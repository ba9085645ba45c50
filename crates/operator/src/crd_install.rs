//! Applying the operator's CRDs with server-side apply. Helm installs `crds/` once and never upgrades them;
//! the operator therefore applies the CRDs compiled into it at every start, under its own field manager, and
//! waits until the API server serves them.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use tracing::info;

/// Field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "gpu-operator";

/// How long to wait for an applied CRD to be Established before giving up.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum CrdInstallError {
    #[error(
        "applying CRD {name}: {source} (the operator's ClusterRole needs get, create and patch on customresourcedefinitions)"
    )]
    Apply { name: String, source: kube::Error },
    #[error("waiting for CRD {name} to be established: {source}")]
    Wait {
        name: String,
        source: kube::runtime::wait::Error,
    },
    #[error("CRD {name} was not established within {seconds} s; see `kubectl describe crd {name}`")]
    Timeout { name: String, seconds: u64 },
}

/// Server-side applies every CRD of [`crd::crds::all`] and waits until each is Established. Conflicts with
/// other managers (e.g. Helm, which created them from the chart's `crds/`) are forced: the operator's
/// compiled-in schema is the one that matches its code.
pub async fn apply_crds(client: &Client) -> Result<Vec<String>, CrdInstallError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut applied = Vec::new();
    for crd in crd::crds::all() {
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(|source| CrdInstallError::Apply {
                name: name.clone(),
                source,
            })?;
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        match tokio::time::timeout(ESTABLISH_TIMEOUT, established).await {
            Ok(result) => result.map_err(|source| CrdInstallError::Wait {
                name: name.clone(),
                source,
            })?,
            Err(_) => {
                return Err(CrdInstallError::Timeout {
                    name,
                    seconds: ESTABLISH_TIMEOUT.as_secs(),
                });
            }
        };
        info!(crd = %name, "CRD applied and established");
        applied.push(name);
    }
    Ok(applied)
}

/// The CRDs as one multi-document YAML stream, for `gpu-operator crd print`.
pub fn crds_yaml() -> Result<String, serde_saphyr::SerializeError> {
    crd::crds::all()
        .iter()
        .map(|crd| serde_saphyr::to_string(crd).map(|yaml| format!("---\n{yaml}")))
        .collect()
}

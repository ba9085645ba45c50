//! The admission endpoint: a HAMi pod in, the pod rewritten onto DRA out (a JSON patch), with the
//! ResourceClaimTemplates it names created first in its namespace. The cluster's shared GPUs come from a watch of
//! the DRA driver's ResourceSlices, so admission never waits on a list.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use crd::dra::{ATTRIBUTE_PRODUCT_NAME, ATTRIBUTE_TYPE, ATTRIBUTE_UUID, CAPACITY_MEMORY, TYPE_GPU};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::runtime::reflector::Store;
use tracing::{info, warn};

use super::hami::{self, DraGpu};

/// What the endpoint works with.
#[derive(Clone)]
pub struct Admission {
    /// Creates the templates.
    pub client: Client,
    /// The DRA driver's ResourceSlices, kept current by a watch.
    pub slices: Store<ResourceSlice>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").finish_non_exhaustive()
    }
}

/// The whole GPUs the driver's slices publish, shared or not (pure).
#[must_use]
pub fn dra_gpus(slices: &[Arc<ResourceSlice>]) -> Vec<DraGpu> {
    crd::dra::driver_devices(slices.iter().map(AsRef::as_ref))
        .filter_map(|(slice, device)| {
            let text = |name: &str| crd::dra::text_attribute(device, name).map(str::to_owned);
            (text(ATTRIBUTE_TYPE)? == TYPE_GPU).then_some(())?;
            let memory = device.capacity.as_ref()?.get(CAPACITY_MEMORY)?;
            Some(DraGpu {
                node: slice.spec.node_name.clone().unwrap_or_default(),
                product_name: text(ATTRIBUTE_PRODUCT_NAME)?,
                uuid: text(ATTRIBUTE_UUID)?,
                memory_bytes: crd::quantity::parse_bytes(&memory.value.0).ok()?,
                shared: device.allow_multiple_allocations == Some(true),
            })
        })
        .collect()
}

/// `POST /hami`: one AdmissionReview.
pub async fn review(
    State(admission): State<Admission>,
    Json(review): Json<AdmissionReview<Pod>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<Pod> = match review.try_into() {
        Ok(request) => request,
        Err(error) => return Json(AdmissionResponse::invalid(error.to_string()).into_review()),
    };
    Json(admit(&admission, &request).await.into_review())
}

async fn admit(admission: &Admission, request: &AdmissionRequest<Pod>) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let Some(pod) = &request.object else {
        return response;
    };
    let pod_name = pod
        .metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone())
        .unwrap_or_default();
    let namespace = request.namespace.clone().unwrap_or_default();
    let gpus = dra_gpus(&admission.slices.state());
    let conversion = match hami::convert(pod, &gpus) {
        Ok(Some(conversion)) => conversion,
        Ok(None) => return response,
        Err(error) => {
            info!(pod = %format!("{namespace}/{pod_name}"), %error, "HAMi pod refused");
            return response.deny(error.to_string());
        }
    };
    if !request.dry_run {
        let templates =
            Api::<ResourceClaimTemplate>::namespaced(admission.client.clone(), &namespace);
        for template in &conversion.templates {
            match templates.create(&PostParams::default(), template).await {
                // Content-addressed: one that exists already says the same.
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(error) => {
                    warn!(%namespace, %error, "cannot create a ResourceClaimTemplate");
                    return response.deny(format!(
                        "cannot create the pod's ResourceClaimTemplate in namespace {namespace}: {error}"
                    ));
                }
                Ok(_) => {}
            }
        }
    }
    let (Ok(before), Ok(after)) = (
        serde_json::to_value(pod),
        serde_json::to_value(&conversion.pod),
    ) else {
        return response.deny("cannot serialise the pod");
    };
    let patch = json_patch::diff(&before, &after);
    let mut response = match response.with_patch(patch) {
        Ok(response) => response,
        Err(error) => return AdmissionResponse::invalid(error.to_string()),
    };
    if !conversion.warnings.is_empty() {
        response.warnings = Some(conversion.warnings);
    }
    info!(pod = %format!("{namespace}/{pod_name}"), templates = conversion.templates.len(), "HAMi pod converted to DRA claims");
    response
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crd::dra::DRIVER;
    use k8s_openapi::api::resource::v1::{
        Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn device(name: &str, product: &str, memory: &str, shared: bool) -> Device {
        let text = |value: &str| DeviceAttribute {
            string: Some(value.into()),
            ..DeviceAttribute::default()
        };
        Device {
            name: name.into(),
            attributes: Some(BTreeMap::from([
                (ATTRIBUTE_TYPE.to_owned(), text(TYPE_GPU)),
                (ATTRIBUTE_PRODUCT_NAME.to_owned(), text(product)),
                (ATTRIBUTE_UUID.to_owned(), text(&format!("GPU-{name}"))),
            ])),
            capacity: Some(BTreeMap::from([(
                CAPACITY_MEMORY.to_owned(),
                DeviceCapacity {
                    value: Quantity(memory.into()),
                    request_policy: None,
                },
            )])),
            allow_multiple_allocations: shared.then_some(true),
            ..Device::default()
        }
    }

    #[test]
    fn the_drivers_gpus_count_with_whether_they_are_shared() {
        let slice = |driver: &str, devices| {
            Arc::new(ResourceSlice {
                metadata: Default::default(),
                spec: ResourceSliceSpec {
                    driver: driver.into(),
                    node_name: Some("node-a".into()),
                    pool: ResourcePool {
                        name: "node-a".into(),
                        generation: 1,
                        resource_slice_count: 1,
                    },
                    devices: Some(devices),
                    ..ResourceSliceSpec::default()
                },
            })
        };
        let slices = [
            slice(
                DRIVER,
                vec![
                    device("gpu-0", "NVIDIA A100-SXM4-40GB", "40Gi", true),
                    device("gpu-1", "NVIDIA A100-SXM4-40GB", "40Gi", false),
                ],
            ),
            slice("other.example.com", vec![device("gpu-0", "X", "1Gi", true)]),
        ];
        let gpus = dra_gpus(&slices);
        assert_eq!(gpus.len(), 2, "the other driver's device is not ours");
        assert_eq!((gpus[0].uuid.as_str(), gpus[0].shared), ("GPU-gpu-0", true));
        assert_eq!(
            (gpus[1].uuid.as_str(), gpus[1].shared),
            ("GPU-gpu-1", false)
        );
        assert_eq!(gpus[0].memory_bytes, 40 << 30);
        assert_eq!(gpus[0].node, "node-a");
    }
}

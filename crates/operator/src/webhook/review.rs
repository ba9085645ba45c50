//! The admission endpoint: a HAMi pod in, the pod rewritten onto DRA out (a JSON patch), with the
//! ResourceClaimTemplates it names created first in its namespace, unless a GPU quota of the namespace would not
//! charge its claims. The cluster's shared GPUs come from a watch of
//! the DRA driver's ResourceSlices, so admission never waits on a list.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use std::collections::BTreeMap;

use crd::dra::{
    ATTRIBUTE_PARENT_UUID, ATTRIBUTE_PRODUCT_NAME, ATTRIBUTE_TYPE, ATTRIBUTE_UUID, CAPACITY_MEMORY,
    TYPE_GPU, TYPE_MIG,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaimSpec, ResourceClaimTemplate, ResourceSlice};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::runtime::reflector::Store;
use serde_json::json;
use tracing::{info, warn};

use super::hami::{self, DraGpu};
use super::{quota, template_gc};
use crate::render::{MANAGED_BY_LABEL, MANAGER};

/// What the endpoint works with.
#[derive(Clone)]
pub struct Admission {
    /// Creates the templates.
    pub client: Client,
    /// The DRA driver's ResourceSlices, kept current by a watch.
    pub slices: Store<ResourceSlice>,
    /// How long the leader's sweep keeps a template no pod names after its last use.
    pub templates_unused_for: Duration,
    /// The resource names the cluster's HAMi pods ask with.
    pub names: hami::ResourceNames,
    /// What becomes of a `vgpu-mode: mig` pod no GPU served as MIG on demand can take.
    pub mig_without_dynamic_mig: hami::MigWithoutDynamicMig,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").finish_non_exhaustive()
    }
}

/// The GPUs the driver's slices publish: whole, shared, or served as MIG on demand (pure).
#[must_use]
pub fn dra_gpus(slices: &[Arc<ResourceSlice>]) -> Vec<DraGpu> {
    let mut gpus = Vec::new();
    // GPUs served as MIG on demand, by their UUID: their placements' devices consume the GPU's counters.
    let mut on_demand: BTreeMap<String, DraGpu> = BTreeMap::new();
    for (slice, device) in crd::dra::driver_devices(slices.iter().map(AsRef::as_ref)) {
        let text = |name: &str| crd::dra::text_attribute(device, name).map(str::to_owned);
        let Some(memory) = device
            .capacity
            .as_ref()
            .and_then(|capacity| capacity.get(CAPACITY_MEMORY))
            .and_then(|memory| crd::quantity::parse_bytes(&memory.value.0).ok())
        else {
            continue;
        };
        let (Some(kind), Some(product_name)) = (text(ATTRIBUTE_TYPE), text(ATTRIBUTE_PRODUCT_NAME))
        else {
            continue;
        };
        let node = slice.spec.node_name.clone().unwrap_or_default();
        if kind == TYPE_GPU
            && let Some(uuid) = text(ATTRIBUTE_UUID)
        {
            gpus.push(DraGpu {
                node,
                product_name,
                uuid,
                memory_bytes: memory,
                shared: device.allow_multiple_allocations == Some(true),
                mig_on_demand: Vec::new(),
                device: Some(device.clone()),
            });
        } else if kind == TYPE_MIG
            && device.consumes_counters.is_some()
            && let Some(uuid) = text(ATTRIBUTE_PARENT_UUID)
        {
            let gpu = on_demand.entry(uuid.clone()).or_insert_with(|| DraGpu {
                node,
                product_name,
                uuid,
                memory_bytes: 0,
                shared: false,
                mig_on_demand: Vec::new(),
                device: None,
            });
            gpu.memory_bytes = gpu.memory_bytes.max(memory);
            if let Err(at) = gpu.mig_on_demand.binary_search(&memory) {
                gpu.mig_on_demand.insert(at, memory);
            }
        }
    }
    gpus.extend(on_demand.into_values());
    gpus
}

/// Why a pod's ResourceClaimTemplate cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The API refused to create or read it.
    #[error("cannot {action} the pod's ResourceClaimTemplate {name}: {source}")]
    Api {
        /// Create or read.
        action: &'static str,
        /// The template.
        name: String,
        /// The API's answer.
        source: kube::Error,
    },
    /// One of its name exists that this webhook did not write, or that asks for something else.
    #[error(
        "ResourceClaimTemplate {name} exists but {why}; its name is the webhook's (a hash of what the pod asks \
         for), so the pod would get other devices than it asked for. Delete or rename that template"
    )]
    Foreign {
        /// The template.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// One of its name is being deleted: a claim made from it now would fail.
    #[error("ResourceClaimTemplate {name} is being deleted; create the pod again once it is gone")]
    Deleting {
        /// The template.
        name: String,
    },
}

/// Creates `template`; when one of its name exists, checks it is the webhook's and asks for the same. Names are
/// content-addressed (`hami-gpu-<hash>`), so the webhook's own template of that name says the same; one made by
/// someone else might not, and trusting it would give the pod other devices than it asked for. Either way the
/// template is marked used ([`template_gc::LAST_USED_ANNOTATION`]), so that the leader's sweep keeps it; one the sweep
/// deleted meanwhile is created again.
///
/// # Errors
/// When the API refuses, or the existing template is not this one.
pub async fn ensure_template(
    templates: &Api<ResourceClaimTemplate>,
    template: &ResourceClaimTemplate,
    unused_for: Duration,
) -> Result<(), TemplateError> {
    let name = template.metadata.name.clone().unwrap_or_default();
    let api = |action| {
        let name = name.clone();
        move |source| TemplateError::Api {
            action,
            name,
            source,
        }
    };
    let now = Timestamp::now();
    let mut marked = template.clone();
    marked.metadata.annotations.get_or_insert_default().insert(
        template_gc::LAST_USED_ANNOTATION.to_owned(),
        now.to_string(),
    );
    // Read first: the same template serves every pod of the same shape, and one in use is used without a write.
    // Another round follows a create that lost a race with another replica (409), or a sweep that deleted the
    // template between the read and the mark.
    for _ in 0..3 {
        let Some(existing) = templates.get_opt(&name).await.map_err(api("read"))? else {
            match templates.create(&PostParams::default(), &marked).await {
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                written => return written.map(drop).map_err(api("create")),
            }
        };
        check_existing(&existing, template)?;
        if !template_gc::needs_mark(&existing, now, unused_for) {
            return Ok(());
        }
        let mark = json!({"metadata": {"annotations": {
            template_gc::LAST_USED_ANNOTATION: now.to_string(),
        }}});
        match templates
            .patch(&name, &PatchParams::default(), &Patch::Merge(&mark))
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            marked => return marked.map(drop).map_err(api("mark")),
        }
    }
    Err(TemplateError::Deleting { name })
}

/// Whether the `existing` template of `template`'s name is the webhook's, asks for the same, and stays.
fn check_existing(
    existing: &ResourceClaimTemplate,
    template: &ResourceClaimTemplate,
) -> Result<(), TemplateError> {
    let name = existing.metadata.name.clone().unwrap_or_default();
    let foreign = |why| TemplateError::Foreign {
        name: name.clone(),
        why,
    };
    let manager = existing
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(MANAGED_BY_LABEL));
    if manager.map(String::as_str) != Some(MANAGER) {
        return Err(foreign("was not written by this webhook"));
    }
    let claim = |template: &ResourceClaimTemplate| {
        template
            .spec
            .as_ref()
            .and_then(|spec| spec.spec.clone())
            .map(with_api_defaults)
    };
    if claim(existing) != claim(template) {
        return Err(foreign("asks for other devices"));
    }
    if existing.metadata.deletion_timestamp.is_some() {
        return Err(TemplateError::Deleting { name });
    }
    Ok(())
}

/// A claim spec as the API server stores it: requests without an allocation mode get `ExactCount`, the only
/// default resource.k8s.io/v1 adds to what the webhook writes (it always writes `count`).
fn with_api_defaults(mut spec: ResourceClaimSpec) -> ResourceClaimSpec {
    const EXACT_COUNT: &str = "ExactCount";
    for request in spec
        .devices
        .iter_mut()
        .flat_map(|devices| devices.requests.iter_mut().flatten())
    {
        if let Some(exactly) = request.exactly.as_mut() {
            exactly
                .allocation_mode
                .get_or_insert_with(|| EXACT_COUNT.to_owned());
        }
        for sub in request.first_available.iter_mut().flatten() {
            sub.allocation_mode
                .get_or_insert_with(|| EXACT_COUNT.to_owned());
        }
    }
    spec
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
    let conversion = match hami::convert_under(
        pod,
        &gpus,
        &admission.names,
        admission.mig_without_dynamic_mig,
    ) {
        Ok(Some(conversion)) => conversion,
        Ok(None) => return response,
        Err(error) => {
            info!(pod = %format!("{namespace}/{pod_name}"), %error, "HAMi pod refused");
            return response.deny(error.to_string());
        }
    };
    match quota::of_namespace(&admission.client, &namespace).await {
        Ok(quotas) => {
            if let Err(why) = quota::check(pod, &conversion.templates, &quotas, &admission.names) {
                info!(pod = %format!("{namespace}/{pod_name}"), %why, "HAMi pod refused: it would escape a GPU quota");
                return response.deny(format!("namespace {namespace}: {why}"));
            }
        }
        Err(error) => {
            warn!(%namespace, %error, "HAMi pod refused: cannot read its namespace's ResourceQuotas");
            return response.deny(format!(
                "cannot read the ResourceQuotas of namespace {namespace}, which must charge the pod's claims: {error}"
            ));
        }
    }
    if !request.dry_run {
        let templates =
            Api::<ResourceClaimTemplate>::namespaced(admission.client.clone(), &namespace);
        for template in &conversion.templates {
            if let Err(error) =
                ensure_template(&templates, template, admission.templates_unused_for).await
            {
                warn!(%namespace, %error, "HAMi pod refused: its ResourceClaimTemplate is not usable");
                return response.deny(format!("namespace {namespace}: {error}"));
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

    use http::Method;
    use serde_json::{Value, json};

    use super::*;
    use api_test_kit::{Answer, Expected, FakeApi, expect};

    const TEMPLATES: &str = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates";
    const NAME: &str = "hami-gpu-00000000000000aa";

    /// A template as the webhook writes it, asking for `memory` of a shared GPU.
    fn template(memory: &str) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": NAME, "labels": {"app.kubernetes.io/managed-by": "gpu-operator"}},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "shared.gpu.nvidia.com", "count": 1,
                "capacity": {"requests": {"memory": memory}},
            }}]}}},
        })
    }

    /// `template` as the API server returns it: with its own metadata and the defaults it adds.
    fn stored(mut template: Value) -> Value {
        template["metadata"]["namespace"] = json!("team");
        template["metadata"]["resourceVersion"] = json!("42");
        template["metadata"]["uid"] = json!("5c1f0d4e-0000-0000-0000-000000000000");
        template["spec"]["metadata"] = json!({"creationTimestamp": null});
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] =
            json!("ExactCount");
        template
    }

    /// `ensure_template` for the webhook's 3000 MiB template, when reading it answers `existing`, and then `more`
    /// are expected.
    async fn over_then(existing: Value, more: Vec<Expected>) -> Result<(), TemplateError> {
        let mut expected = vec![expect(
            Method::GET,
            &format!("{TEMPLATES}/{NAME}"),
            Answer::Json(200, existing),
        )];
        expected.extend(more);
        let (api, client) = FakeApi::scripted(expected);
        let ours = serde_json::from_value(template("3000Mi")).unwrap();
        let result = ensure_template(
            &Api::namespaced(client, "team"),
            &ours,
            template_gc::UNUSED_FOR,
        )
        .await;
        api.finish();
        result
    }

    /// As [`over_then`] with nothing more expected.
    async fn over(existing: Value) -> Result<(), TemplateError> {
        over_then(existing, Vec::new()).await
    }

    fn marked_now(mut template: Value) -> Value {
        template["metadata"]["annotations"] =
            json!({template_gc::LAST_USED_ANNOTATION: Timestamp::now().to_string()});
        template
    }

    #[tokio::test]
    async fn a_template_is_created_once_marked_used() {
        let (api, client) = FakeApi::scripted(vec![
            expect(
                Method::GET,
                &format!("{TEMPLATES}/{NAME}"),
                Answer::Error(404, "NotFound"),
            ),
            expect(Method::POST, TEMPLATES, Answer::Echo),
        ]);
        let ours = serde_json::from_value(template("3000Mi")).unwrap();
        ensure_template(
            &Api::namespaced(client, "team"),
            &ours,
            template_gc::UNUSED_FOR,
        )
        .await
        .unwrap();
        let created = &api.finish()[1].body;
        assert_eq!(created["metadata"]["name"], NAME);
        assert!(
            created["metadata"]["annotations"][template_gc::LAST_USED_ANNOTATION].is_string(),
            "{created:#}"
        );
    }

    #[tokio::test]
    async fn an_existing_template_the_webhook_wrote_is_used_and_marked() {
        let mark = expect(
            Method::PATCH,
            &format!("{TEMPLATES}/{NAME}"),
            Answer::Json(200, marked_now(stored(template("3000Mi")))),
        );
        over_then(stored(template("3000Mi")), vec![mark])
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_template_marked_moments_ago_is_used_without_a_write() {
        over(marked_now(stored(template("3000Mi")))).await.unwrap();
    }

    #[tokio::test]
    async fn a_template_the_sweep_deleted_before_the_mark_is_created_again() {
        let gone = expect(
            Method::PATCH,
            &format!("{TEMPLATES}/{NAME}"),
            Answer::Error(404, "NotFound"),
        );
        let missing = expect(
            Method::GET,
            &format!("{TEMPLATES}/{NAME}"),
            Answer::Error(404, "NotFound"),
        );
        let again = expect(Method::POST, TEMPLATES, Answer::Echo);
        over_then(stored(template("3000Mi")), vec![gone, missing, again])
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn an_existing_template_asking_for_other_devices_refuses_the_pod() {
        let error = over(stored(template("80Gi"))).await.unwrap_err();
        assert!(
            matches!(
                error,
                TemplateError::Foreign {
                    why: "asks for other devices",
                    ..
                }
            ),
            "{error}"
        );
        let message = error.to_string();
        assert!(
            message.contains(&format!(
                "ResourceClaimTemplate {NAME} exists but asks for other devices"
            )),
            "{message}"
        );
    }

    #[tokio::test]
    async fn an_existing_template_someone_else_wrote_refuses_the_pod() {
        let mut theirs = stored(template("3000Mi"));
        theirs["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "helm"});
        let error = over(theirs).await.unwrap_err();
        assert!(
            matches!(
                error,
                TemplateError::Foreign {
                    why: "was not written by this webhook",
                    ..
                }
            ),
            "{error}"
        );
    }

    #[tokio::test]
    async fn an_existing_template_being_deleted_refuses_the_pod() {
        let mut deleting = stored(template("3000Mi"));
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let error = over(deleting).await.unwrap_err();
        assert!(matches!(error, TemplateError::Deleting { .. }), "{error}");
    }

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

    /// A GPU served as MIG on demand publishes its placements (MIG devices consuming its counters, named after their
    /// parent): admission sees one GPU with each profile's memory once; a MIG device that exists already (no
    /// counters) is not a GPU to make instances on.
    #[test]
    fn placements_made_on_demand_count_as_their_gpu_with_its_profiles() {
        let placement = |name: &str, memory: &str, counters: bool| {
            let mut device = device(name, "NVIDIA H100 80GB HBM3", memory, false);
            let attributes = device.attributes.as_mut().unwrap();
            attributes.remove(ATTRIBUTE_UUID);
            attributes.insert(
                ATTRIBUTE_TYPE.to_owned(),
                DeviceAttribute {
                    string: Some(TYPE_MIG.into()),
                    ..DeviceAttribute::default()
                },
            );
            attributes.insert(
                ATTRIBUTE_PARENT_UUID.to_owned(),
                DeviceAttribute {
                    string: Some("GPU-h100".into()),
                    ..DeviceAttribute::default()
                },
            );
            device.consumes_counters = counters.then(|| {
                vec![k8s_openapi::api::resource::v1::DeviceCounterConsumption {
                    counter_set: "gpu-0-counter-set".into(),
                    ..Default::default()
                }]
            });
            device
        };
        let slices = [Arc::new(ResourceSlice {
            metadata: Default::default(),
            spec: ResourceSliceSpec {
                driver: DRIVER.into(),
                node_name: Some("node-m".into()),
                pool: ResourcePool {
                    name: "node-m".into(),
                    generation: 1,
                    resource_slice_count: 2,
                },
                devices: Some(vec![
                    placement("gpu-0-mig-1g10gb-19-6", "9984Mi", true),
                    placement("gpu-0-mig-1g10gb-19-5", "9984Mi", true),
                    placement("gpu-0-mig-7g80gb-0-0", "81152Mi", true),
                    placement("gpu-1-mig-1-0", "9984Mi", false),
                ]),
                ..ResourceSliceSpec::default()
            },
        })];
        let gpus = dra_gpus(&slices);
        assert_eq!(gpus.len(), 1, "{gpus:?}");
        assert_eq!(gpus[0].uuid, "GPU-h100");
        assert_eq!(gpus[0].mig_on_demand, [9984 << 20, 81152 << 20]);
        assert_eq!(gpus[0].memory_bytes, 81152 << 20);
        assert!(!gpus[0].shared);
    }
}

//! HAMi's dynamic MIG (`nvidia.com/vgpu-mode: mig`) on DRA (pure): each GPU a container asks for becomes a MIG
//! instance that the DRA driver makes on demand (class `mig.nvidia.com`), of a profile whose memory holds the
//! container's `nvidia.com/gpumem`. The driver publishes each GPU's profiles smallest first, so the scheduler's
//! first fit takes the smallest profile that holds the memory: HAMi's choice of template. Several GPUs
//! (`nvidia.com/gpu: 2`) are instances on distinct physical GPUs (`parentUUID`), as HAMi gives each of a
//! container's vGPUs its own card.
//!
//! Memory as HAMi reads it ([`crd::hami`]): MiB or bytes hold for every GPU; a percentage (or none, the whole
//! memory) depends on the GPU, so each model present gets a `firstAvailable` sub-request with its own size, the
//! size of its largest profile. `nvidia.com/gpucores` has no meaning for an instance, whose compute is its
//! profile's: it is ignored with a warning.

use std::collections::{BTreeMap, BTreeSet};

use crd::dra::{
    ATTRIBUTE_PARENT_UUID, ATTRIBUTE_PRODUCT_NAME, CAPACITY_MEMORY, CLASS_MIG,
    attribute_expression, capacity_expression,
};
use crd::hami::{Memory, Selection};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceRequest, DeviceSubRequest, ExactDeviceRequest, ResourceClaimTemplate,
};

use super::claim_sharing::Ask;
use super::hami::{
    Conversion, DraGpu, HamiError, ResourceNames, VGPU_MODE, cel, check_count, convert,
    named_template, summary,
};

/// The claim's one request.
const REQUEST: &str = "gpu";

/// The template of one container's ask for MIG instances, checked against the cluster's GPUs served as MIG on
/// demand.
pub(super) fn template_for(
    container: &str,
    ask: &Ask,
    selection: &Selection,
    gpus: &[DraGpu],
    names: &ResourceNames,
    warnings: &mut BTreeSet<String>,
) -> Result<ResourceClaimTemplate, HamiError> {
    let unsatisfiable = |why: String| HamiError::Unsatisfiable {
        container: container.to_owned(),
        why,
        have: summary(gpus),
    };
    let eligible: Vec<&DraGpu> = gpus
        .iter()
        .filter(|gpu| !gpu.mig_on_demand.is_empty())
        .filter(|gpu| selection.admits(&gpu.product_name, Some(&gpu.uuid)))
        .collect();
    if eligible.is_empty() {
        return Err(HamiError::NoMigOnDemand {
            container: container.to_owned(),
            have: summary(gpus),
        });
    }
    check_count(ask.count, &eligible, "GPUs served as MIG on demand").map_err(unsatisfiable)?;
    if ask.cores.is_some() {
        warnings.insert(format!(
            "{} is ignored with {VGPU_MODE} mig: a MIG instance has the compute of its profile",
            names.cores
        ));
    }
    let mut selectors = selection.cel_selectors(ATTRIBUTE_PARENT_UUID);
    let at_least = |bytes: u64| {
        format!(
            "{}.compareTo(quantity(\"{}Mi\")) >= 0",
            capacity_expression(CAPACITY_MEMORY),
            bytes.div_ceil(1 << 20)
        )
    };
    let count = Some(i64::from(ask.count));
    let request = if let Memory::Bytes(bytes) = ask.memory {
        let largest = eligible
            .iter()
            .flat_map(|gpu| gpu.mig_on_demand.iter().copied())
            .max()
            .unwrap_or(0);
        if bytes > largest {
            return Err(unsatisfiable(format!(
                "{} {} MiB is more than any MIG profile made on demand holds (at most {} MiB)",
                names.memory,
                bytes >> 20,
                largest >> 20
            )));
        }
        selectors.push(at_least(bytes));
        DeviceRequest {
            name: REQUEST.to_owned(),
            exactly: Some(ExactDeviceRequest {
                device_class_name: CLASS_MIG.to_owned(),
                count,
                selectors: cel(&selectors),
                ..ExactDeviceRequest::default()
            }),
            first_available: None,
        }
    } else {
        let percent = match ask.memory {
            Memory::Percent(percent) => u64::from(percent),
            _ => 100,
        };
        // Per model, the share of its largest profile (the GPU's memory in MIG mode), as HAMi takes a percentage
        // of each GPU's own memory.
        let models: BTreeMap<&str, u64> = eligible
            .iter()
            .map(|gpu| (gpu.product_name.as_str(), gpu.memory_bytes))
            .collect();
        let first_available = models
            .iter()
            .enumerate()
            .map(|(index, (product, bytes))| {
                let mut expressions = selectors.clone();
                expressions.push(format!(
                    "{} == \"{product}\"",
                    attribute_expression(ATTRIBUTE_PRODUCT_NAME)
                ));
                expressions.push(at_least(bytes * percent / 100));
                DeviceSubRequest {
                    name: format!("model-{index}"),
                    device_class_name: CLASS_MIG.to_owned(),
                    count,
                    selectors: cel(&expressions),
                    ..DeviceSubRequest::default()
                }
            })
            .collect();
        DeviceRequest {
            name: REQUEST.to_owned(),
            first_available: Some(first_available),
            exactly: None,
        }
    };
    Ok(named_template(request, ask.count, ATTRIBUTE_PARENT_UUID))
}

/// What the cluster does with a `vgpu-mode: mig` pod that no GPU served as MIG on demand can take (the operator's
/// `--hami-mig-without-dynamic-mig`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MigWithoutDynamicMig {
    /// Refuse it, naming what would serve it: the isolation it asked for is not silently replaced.
    #[default]
    Refuse,
    /// Admit it as MPS-limited shares of whole GPUs, with a warning that says it is not isolated as MIG is.
    Share,
}

/// [`convert`] under the cluster's `policy` for `vgpu-mode: mig` pods that no GPU served as MIG on demand can take:
/// with [`MigWithoutDynamicMig::Share`], such a pod is converted as if it asked for HAMi's `mps` mode (its
/// annotation kept), and warned.
///
/// # Errors
/// As [`convert`].
pub fn convert_under(
    pod: &Pod,
    gpus: &[DraGpu],
    names: &ResourceNames,
    policy: MigWithoutDynamicMig,
) -> Result<Option<Conversion>, HamiError> {
    match convert(pod, gpus, names) {
        Err(HamiError::NoMigOnDemand { container, .. })
            if policy == MigWithoutDynamicMig::Share =>
        {
            let mut as_mps = pod.clone();
            as_mps
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(VGPU_MODE.to_owned(), "mps".to_owned());
            let Some(mut conversion) = convert(&as_mps, gpus, names)? else {
                return Ok(None);
            };
            conversion.pod.metadata.annotations = pod.metadata.annotations.clone();
            conversion.warnings.push(format!(
                "container {container}: {VGPU_MODE} mig: no GPU served as MIG on demand can take it, and the \
                 cluster's policy (hamiMigWithoutDynamicMIG=share) admits it as an MPS-limited share of a whole GPU, \
                 which does not isolate memory faults or bandwidth as a MIG instance does"
            ));
            Ok(Some(conversion))
        }
        other => other,
    }
}

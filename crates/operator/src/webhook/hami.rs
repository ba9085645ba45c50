//! A HAMi pod rewritten onto DRA (pure): what each container asked HAMi for becomes a pod-level claim from a
//! ResourceClaimTemplate (owned by the pod, deleted with it), which the kube-scheduler allocates and the DRA driver
//! enforces.
//!
//! Which containers: those asking for `nvidia.com/gpumem`, `gpumem-percentage` or `gpucores` (a share of a GPU),
//! and, in a pod with HAMi's GPU-selection annotations, those asking for `nvidia.com/gpu` (whole GPUs of a chosen
//! model). A pod with neither keeps `nvidia.com/gpu` for the device plugin. Those are HAMi's default names; where
//! HAMi's chart renamed them, [`ResourceNames`] carries the cluster's, and a container asking for a renamed
//! whole-GPU resource (which no device plugin here advertises) is converted too.
//!
//! HAMi's meaning is kept (its `pkg/device/nvidia/device.go`):
//! - `nvidia.com/gpu` missing beside a share: one GPU (HAMi's `defaultGPUNum`);
//! - the memory values read as [`crd::hami`] reads them for every reader of a HAMi request: `gpumem` in MiB (or
//!   bytes with a binary suffix) wins over `gpumem-percentage`; neither: the whole memory (HAMi's
//!   `defaultMemory: 0`); a percentage over 100 is taken as 100, with a warning for each;
//! - `gpucores` missing: no share of the SMs is reserved (HAMi's `defaultCores: 0`);
//! - GPU types match when the product name contains them, in any case (HAMi's `CheckType`); UUIDs match exactly.
//!
//! DRA has no relative request, so `gpumem-percentage` becomes a `firstAvailable` list with one sub-request per
//! memory size among the eligible GPUs, each asking that share of its size.

use std::collections::{BTreeMap, BTreeSet};

use crd::dra::{
    ATTRIBUTE_UUID, CAPACITY_CORES, CAPACITY_MEMORY, CLASS_GPU, CLASS_SHARED_GPU, DRIVER,
    capacity_expression,
};
use crd::hami::{Memory, NOUSE_GPUTYPE, NOUSE_GPUUUID, Selection, USE_GPUTYPE, USE_GPUUUID};
use crd::planner::{self, Class, NodeDevices, Request};
use k8s_openapi::api::core::v1::{
    Container, Pod, PodResourceClaim, ResourceClaim as ContainerClaim,
};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequirements, Device, DeviceClaim, DeviceConstraint, DeviceRequest,
    DeviceSelector, DeviceSubRequest, ExactDeviceRequest, ResourceClaimSpec, ResourceClaimTemplate,
    ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::claim_sharing::{self, Ask, Runs};
use super::hami_mig;
pub use super::hami_mig::{MigWithoutDynamicMig, convert_under};
use crate::render::{MANAGED_BY_LABEL, MANAGER};

pub use super::hami_names::{
    GPU, GPUCORES, GPUMEM, GPUMEM_PERCENTAGE, NamesError, PRIORITY, ResourceNames,
};

/// The selection annotations, which make a pod's `nvidia.com/gpu` containers the webhook's.
pub const SELECTION_ANNOTATIONS: [&str; 4] =
    [USE_GPUTYPE, NOUSE_GPUTYPE, USE_GPUUUID, NOUSE_GPUUUID];
/// HAMi's placement policies among a node's GPUs and among nodes.
const GPU_POLICY: &str = "hami.io/gpu-scheduler-policy";
/// HAMi's choice of how a pod's share is made and enforced: `hami-core` (HAMi's CUDA interception), `mps` or `mig`.
pub const VGPU_MODE: &str = "nvidia.com/vgpu-mode";
const NODE_POLICY: &str = "hami.io/node-scheduler-policy";
/// The environment HAMi's virtual device memory is switched on with.
const OVERSUBSCRIBE_ENV: &str = "CUDA_OVERSUBSCRIBE";
/// The label on converted pods.
pub const CONVERTED_LABEL: &str = "nvidia.com/gpu-sharing";
/// The request name in every template.
const REQUEST: &str = "gpu";

/// One GPU the DRA driver publishes, as admission sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct DraGpu {
    /// Its node.
    pub node: String,
    /// NVML's product name.
    pub product_name: String,
    /// Its UUID.
    pub uuid: String,
    /// Its memory in bytes (on a GPU served as MIG on demand, its largest profile's).
    pub memory_bytes: u64,
    /// Whether claims share it (the shared class).
    pub shared: bool,
    /// The memory in bytes of each MIG profile the driver makes on demand on it, smallest first; empty for a GPU
    /// published whole.
    pub mig_on_demand: Vec<u64>,
    /// The device the driver publishes for it, which the planner places requests on; none for a GPU served as MIG
    /// on demand (its placements are the scheduler's, through the GPU's counters).
    pub device: Option<Device>,
}

/// What admission does to a HAMi pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversion {
    /// The rewritten pod.
    pub pod: Pod,
    /// The templates its claims come from, to create in its namespace when missing.
    pub templates: Vec<ResourceClaimTemplate>,
    /// Admission warnings (`kubectl` prints them).
    pub warnings: Vec<String>,
}

/// Why a HAMi pod is refused. Each says which field and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HamiError {
    /// A resource value is not what HAMi takes.
    #[error("container {container}: {resource} {value:?} is not valid: {expected}")]
    Value {
        /// The container.
        container: String,
        /// The resource.
        resource: String,
        /// What it says.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// An annotation is empty or has characters no GPU name or UUID has.
    #[error(
        "annotation {annotation} {value:?} is not valid: write comma-separated GPU {what} (letters, digits, spaces, '.', '_', '-')"
    )]
    Annotation {
        /// The annotation.
        annotation: &'static str,
        /// Its value.
        value: String,
        /// Models or UUIDs.
        what: &'static str,
    },
    /// HAMi's virtual device memory was asked for.
    #[error(
        "container {container}: {why}; HAMi's virtual device memory (GPU memory spilling into host RAM) is not offered \
         here: it needs CUDA calls intercepted in the container, which this operator does not do. Ask for at most a \
         GPU's memory"
    )]
    Oversubscription {
        /// The container.
        container: String,
        /// What asked for it.
        why: String,
    },
    /// The pod asks for a mode HAMi does not have.
    #[error("annotation {VGPU_MODE} {value:?}: HAMi's modes are hami-core, mps and mig")]
    Mode {
        /// The annotation's value.
        value: String,
    },
    /// A `vgpu-mode: mig` pod, and no GPU it may take is served as MIG on demand.
    #[error(
        "container {container}: {VGPU_MODE} mig asks for a MIG instance made for the pod, and no GPU that matches its \
         GPU type and UUID annotations is served as MIG on demand (draDriver.dynamicMIG in the ClusterPolicy, or the \
         node label nvidia.com/dra.dynamic-mig-gpus, on GPUs with MIG mode on); remove the annotation to run on an \
         MPS-limited share, which does not isolate as MIG does, or let the cluster do so \
         (draDriver.hamiMigWithoutDynamicMIG=share in the chart); the pod would stay Pending. The cluster's DRA \
         GPUs: {have}"
    )]
    NoMigOnDemand {
        /// The container.
        container: String,
        /// What the cluster has.
        have: String,
    },
    /// No GPU of the cluster can hold the request.
    #[error(
        "container {container}: {why}; the pod would stay Pending. The cluster's DRA GPUs: {have}"
    )]
    Unsatisfiable {
        /// The container.
        container: String,
        /// Why none fits.
        why: String,
        /// What the cluster has.
        have: String,
    },
}

/// Rewrites a HAMi pod onto DRA claims; `None` when it asks HAMi for nothing. `gpus` are the GPUs the DRA driver
/// publishes across the cluster, against which the request is checked.
///
/// # Errors
/// When a value is not HAMi's, HAMi's virtual memory is asked for, or no GPU of the cluster can hold a request.
pub fn convert(
    pod: &Pod,
    gpus: &[DraGpu],
    names: &ResourceNames,
) -> Result<Option<Conversion>, HamiError> {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let selection =
        Selection::from_annotations(&annotations).map_err(|error| HamiError::Annotation {
            annotation: error.list.annotation(),
            value: error.value,
            what: error.list.items(),
        })?;
    let mut converted = pod.clone();
    let spec = converted.spec.get_or_insert_with(Default::default);
    let mut templates: Vec<ResourceClaimTemplate> = Vec::new();
    let mut claims: Vec<PodResourceClaim> = Vec::new();
    let mut warnings = BTreeSet::new();
    let init = spec.init_containers.get_or_insert_with(Vec::new);
    let init_count = init.len();
    let mut containers: Vec<&mut Container> =
        init.iter_mut().chain(spec.containers.iter_mut()).collect();
    // The asking containers, by their index in `containers`, and when each runs.
    let mut asking: Vec<usize> = Vec::new();
    let mut asks: Vec<(Runs, Ask)> = Vec::new();
    let mig = match annotations.get(VGPU_MODE) {
        Some(mode) => is_mig(mode)?,
        None => false,
    };
    let template_for = |container: &str, ask: &Ask, warnings: &mut BTreeSet<String>| {
        if mig {
            hami_mig::template_for(container, ask, &selection, gpus, names, warnings)
        } else {
            template_for(container, ask, &selection, gpus, names)
        }
    };
    for (index, container) in containers.iter().enumerate() {
        let Some(ask) = ask_of(container, !selection.is_empty(), names, &mut warnings)? else {
            continue;
        };
        let runs = match (index < init_count, container.restart_policy.as_deref()) {
            (true, Some("Always")) => Runs::Sidecar,
            (true, _) => Runs::Init,
            (false, _) => Runs::Main,
        };
        asking.push(index);
        asks.push((runs, ask));
    }
    for shared in claim_sharing::claims(&asks) {
        let name_of = |member: usize| containers[asking[member]].name.clone();
        if shared.members.len() > 1 {
            // Each member's own ask first, so that the error names the container that asks too much.
            for &member in &shared.members {
                template_for(&name_of(member), &asks[member].1, &mut warnings)?;
            }
        }
        let lead = name_of(shared.lead);
        let template = template_for(&lead, &shared.ask, &mut warnings)?;
        let template_name = template.metadata.name.clone().unwrap_or_default();
        let entry = claim_entry_name(&lead);
        for &member in &shared.members {
            let container = &mut containers[asking[member]];
            strip(container, names);
            container
                .resources
                .get_or_insert_with(Default::default)
                .claims
                .get_or_insert_with(Vec::new)
                .push(ContainerClaim {
                    name: entry.clone(),
                    request: None,
                });
        }
        claims.push(PodResourceClaim {
            name: entry,
            resource_claim_template_name: Some(template_name),
            resource_claim_name: None,
        });
        if !templates.contains(&template) {
            templates.push(template);
        }
    }
    if spec.init_containers.as_ref().is_some_and(Vec::is_empty) {
        spec.init_containers = None;
    }
    if claims.is_empty() {
        return Ok(None);
    }
    spec.resource_claims
        .get_or_insert_with(Vec::new)
        .extend(claims);
    if annotations.get(GPU_POLICY).map(String::as_str) == Some("spread") {
        warnings.insert(format!(
            "{GPU_POLICY}: spread cannot be expressed with DRA (the scheduler takes a node's GPUs first fit, which \
             packs them as binpack does); the pod is admitted with binpack placement"
        ));
    }
    if annotations.contains_key(NODE_POLICY) {
        warnings.insert(format!(
            "{NODE_POLICY} is ignored: the kube-scheduler's own scoring places the pod among nodes"
        ));
    }
    converted
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(CONVERTED_LABEL.to_owned(), "hami-dra".to_owned());
    Ok(Some(Conversion {
        pod: converted,
        templates,
        warnings: warnings.into_iter().collect(),
    }))
}

/// Whether the pod's `nvidia.com/vgpu-mode` asks for MIG. Shares here are MPS-limited slices of whole GPUs, which
/// is what `mps` asks for and bounds memory as `hami-core` does; `mig` asks for the hardware isolation of a MIG
/// instance per GPU (HAMi's dynamic MIG), which the GPUs served as MIG on demand give ([`hami_mig`]), and which is
/// refused where none is, rather than replaced by weaker isolation.
fn is_mig(mode: &str) -> Result<bool, HamiError> {
    match mode.trim().to_ascii_lowercase().as_str() {
        "hami-core" | "mps" => Ok(false),
        "mig" => Ok(true),
        _ => Err(HamiError::Mode {
            value: mode.to_owned(),
        }),
    }
}

/// What a container asks for, or `None` when it is not the webhook's.
fn ask_of(
    container: &Container,
    selected: bool,
    names: &ResourceNames,
    warnings: &mut BTreeSet<String>,
) -> Result<Option<Ask>, HamiError> {
    let ResourceNames {
        gpu,
        memory: gpumem,
        memory_percentage: gpumem_percentage,
        cores: gpucores,
        priority,
    } = names;
    let name = &container.name;
    let resources = container.resources.clone().unwrap_or_default();
    let value = |resource: &str| {
        resources
            .limits
            .as_ref()
            .and_then(|limits| limits.get(resource))
            .or_else(|| {
                resources
                    .requests
                    .as_ref()
                    .and_then(|requests| requests.get(resource))
            })
            .map(|quantity| quantity.0.trim().to_owned())
    };
    // Each value as `crd::hami` reads it, the error naming the container and the resource.
    let read = |resource: &str,
                reader: &dyn Fn(&str) -> Result<Option<u64>, crd::hami::ValueError>|
     -> Result<Option<u64>, HamiError> {
        match value(resource) {
            None => Ok(None),
            Some(text) => reader(&text).map_err(|error| HamiError::Value {
                container: name.clone(),
                resource: resource.into(),
                value: text.clone(),
                expected: error.expected,
            }),
        }
    };
    if let Some(env) = container.env.iter().flatten().find(|env| {
        env.name == OVERSUBSCRIBE_ENV
            && env
                .value
                .as_deref()
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }) {
        return Err(HamiError::Oversubscription {
            container: name.clone(),
            why: format!("{}={}", env.name, env.value.as_deref().unwrap_or_default()),
        });
    }
    let memory = read(gpumem, &crd::hami::memory_bytes)?;
    let percent = read(gpumem_percentage, &crd::hami::percentage)?;
    let cores = read(gpucores, &|text| crd::hami::cores(text).map(Some))?;
    let share = value(gpumem).is_some() || value(gpumem_percentage).is_some() || cores.is_some();
    let count = read(gpu, &|text| {
        crd::quantity::parse_bytes(text)
            .map(Some)
            .map_err(|_| crd::hami::ValueError {
                expected: "a whole number of GPUs, at least 1",
            })
    })?;
    // HAMi's own name for whole GPUs is the device plugin's too, so only a selection makes such a container the
    // webhook's; a renamed one nothing else advertises, so a container asking for it is always converted.
    let whole_gpus_are_ours = selected || names.gpu_is_renamed();
    if !(share || whole_gpus_are_ours && count.is_some()) {
        return Ok(None);
    }
    let count = match count {
        Some(0) => {
            return Err(HamiError::Value {
                container: name.clone(),
                resource: gpu.clone(),
                value: "0".into(),
                expected: "a whole number of GPUs, at least 1",
            });
        }
        Some(count) => u32::try_from(count).unwrap_or(u32::MAX),
        None => 1,
    };
    let (memory, notes) = crd::hami::memory(memory, percent, [gpumem, gpumem_percentage]);
    warnings.extend(
        notes
            .into_iter()
            .map(|note| format!("container {name}: {note}")),
    );
    if value(priority).is_some() {
        warnings.insert(format!(
            "container {name}: {priority} is ignored: DRA has no task priority on a shared GPU"
        ));
    }
    Ok(Some(Ask {
        count,
        share,
        memory,
        cores,
    }))
}

/// Removes HAMi's resources from a converted container: the claim stands for them.
fn strip(container: &mut Container, names: &ResourceNames) {
    if let Some(resources) = container.resources.as_mut() {
        for list in [resources.limits.as_mut(), resources.requests.as_mut()]
            .into_iter()
            .flatten()
        {
            for resource in names.all() {
                list.remove(resource);
            }
        }
    }
}

/// The pod's claim entry for a container: `hami-<container>`, at most 63 bytes (a DNS label), a long name cut
/// and told apart by its hash. Mutating webhooks run before the API server validates the pod, so the name may be
/// anything: it is cut on a character boundary, and validation then refuses what is not a DNS label.
fn claim_entry_name(container: &str) -> String {
    const KEPT: usize = 54;
    let name = format!("hami-{container}");
    if name.len() <= 63 {
        return name;
    }
    let cut = (0..=KEPT)
        .rev()
        .find(|&index| name.is_char_boundary(index))
        .unwrap_or(0);
    format!(
        "{}-{:08x}",
        &name[..cut],
        fnv1a(container.as_bytes()) as u32
    )
}

/// The template of one container's ask, checked against the cluster's GPUs.
fn template_for(
    container: &str,
    ask: &Ask,
    selection: &Selection,
    gpus: &[DraGpu],
    names: &ResourceNames,
) -> Result<ResourceClaimTemplate, HamiError> {
    let unsatisfiable = |why: String| HamiError::Unsatisfiable {
        container: container.to_owned(),
        why,
        have: summary(gpus),
    };
    let kind = if ask.share { "shared GPU" } else { "GPU" };
    let eligible: Vec<&DraGpu> = gpus
        .iter()
        .filter(|gpu| gpu.mig_on_demand.is_empty())
        .filter(|gpu| gpu.shared || !ask.share)
        .filter(|gpu| selection.admits(&gpu.product_name, Some(&gpu.uuid)))
        .collect();
    // Whether the ask fits the cluster at all (its GPUs as they are published, none of them in use) is the
    // planner's answer, as `gpu-dra-driver plan` gives it: one reading of the devices, so the two cannot disagree.
    let request = Request {
        label: container.to_owned(),
        count: ask.count,
        memory: ask.memory,
        cores: ask.cores,
        selection: selection.clone(),
        class: if ask.share {
            Class::Shared
        } else {
            Class::WholeGpu
        },
        profile: None,
        notes: Vec::new(),
    };
    let placed = planner::plan(&published(gpus), &[request])
        .placements
        .swap_remove(0)
        .outcome;
    if let Err(unplaced) = placed {
        let largest = eligible
            .iter()
            .map(|gpu| gpu.memory_bytes)
            .max()
            .unwrap_or(0);
        let bytes = match ask.memory {
            Memory::Bytes(bytes) if !eligible.is_empty() && bytes > largest => bytes,
            _ => return Err(unsatisfiable(unplaced.to_string())),
        };
        let why = format!(
            "{} {} MiB is more than any matching {kind} has (at most {} MiB)",
            names.memory,
            bytes >> 20,
            largest >> 20
        );
        return Err(HamiError::Oversubscription {
            container: container.to_owned(),
            why,
        });
    }
    let class = if ask.share {
        CLASS_SHARED_GPU
    } else {
        CLASS_GPU
    };
    let mut selectors = selection.cel_selectors(ATTRIBUTE_UUID);
    let capacity = |memory: Option<u64>| {
        let mut requests = BTreeMap::new();
        if let Some(bytes) = memory {
            requests.insert(
                CAPACITY_MEMORY.to_owned(),
                Quantity(format!("{}Mi", bytes >> 20)),
            );
        }
        if let Some(cores) = ask.cores {
            requests.insert(CAPACITY_CORES.to_owned(), Quantity(cores.to_string()));
        }
        (!requests.is_empty()).then_some(CapacityRequirements {
            requests: Some(requests),
        })
    };
    let count = Some(i64::from(ask.count));
    let request = match ask.memory {
        Memory::Percent(pct) => {
            let sizes: BTreeSet<u64> = eligible.iter().map(|gpu| gpu.memory_bytes).collect();
            let first_available = sizes
                .iter()
                .rev()
                .map(|size| {
                    let mut expressions = selectors.clone();
                    expressions.push(format!(
                        "{}.compareTo(quantity(\"{size}\")) == 0",
                        capacity_expression(CAPACITY_MEMORY)
                    ));
                    // A share of this size, whole MiB (the driver's step), rounded down as HAMi does.
                    // In 128 bits, as `size * pct` may not fit 64; the share is at most `size`, which does.
                    let share = u64::try_from(u128::from(*size) * u128::from(pct) / 100)
                        .unwrap_or(*size)
                        >> 20
                        << 20;
                    DeviceSubRequest {
                        name: format!("mem-{}mi", size >> 20),
                        device_class_name: class.to_owned(),
                        count,
                        selectors: cel(&expressions),
                        capacity: capacity(Some(share)),
                        ..DeviceSubRequest::default()
                    }
                })
                .collect();
            DeviceRequest {
                name: REQUEST.to_owned(),
                first_available: Some(first_available),
                exactly: None,
            }
        }
        memory => {
            let bytes = match memory {
                Memory::Bytes(bytes) => Some(bytes),
                _ => None,
            };
            DeviceRequest {
                name: REQUEST.to_owned(),
                exactly: Some(ExactDeviceRequest {
                    device_class_name: class.to_owned(),
                    count,
                    selectors: cel(&std::mem::take(&mut selectors)),
                    capacity: if ask.share { capacity(bytes) } else { None },
                    ..ExactDeviceRequest::default()
                }),
                first_available: None,
            }
        }
    };
    Ok(named_template(request, ask.count, ATTRIBUTE_UUID))
}

/// The devices each node publishes for its GPUs, in the order `gpus` has them (the slices'), for the planner.
fn published(gpus: &[DraGpu]) -> Vec<NodeDevices> {
    let mut nodes: Vec<NodeDevices> = Vec::new();
    for gpu in gpus {
        let Some(device) = &gpu.device else {
            continue;
        };
        match nodes.iter_mut().find(|node| node.node == gpu.node) {
            Some(node) => node.devices.push(device.clone()),
            None => nodes.push(NodeDevices {
                node: gpu.node.clone(),
                devices: vec![device.clone()],
            }),
        }
    }
    nodes
}

/// That no node has fewer than `count` of the `eligible` GPUs, or why.
pub(super) fn check_count(count: u32, eligible: &[&DraGpu], kind: &str) -> Result<(), String> {
    let mut per_node: BTreeMap<&str, u32> = BTreeMap::new();
    for gpu in eligible {
        *per_node.entry(gpu.node.as_str()).or_default() += 1;
    }
    let most = per_node.values().copied().max().unwrap_or(0);
    if count > most {
        return Err(format!(
            "it asks for {count} {kind}s on one node, and no node has more than {most} that match"
        ));
    }
    Ok(())
}

/// The CEL selectors of `expressions`, or none.
pub(super) fn cel(expressions: &[String]) -> Option<Vec<DeviceSelector>> {
    (!expressions.is_empty()).then(|| {
        expressions
            .iter()
            .map(|expression| DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: expression.clone(),
                }),
            })
            .collect()
    })
}

/// The webhook's template of one request for `count` devices, each of another `distinct` (a device attribute of
/// this driver: the GPU they are or are carved from), named by a hash of what it asks for, so that pods asking
/// alike share it.
pub(super) fn named_template(
    request: DeviceRequest,
    count: u32,
    distinct: &str,
) -> ResourceClaimTemplate {
    let constraints = (count > 1).then(|| {
        vec![DeviceConstraint {
            requests: Some(vec![request.name.clone()]),
            distinct_attribute: Some(format!("{DRIVER}/{distinct}")),
            match_attribute: None,
        }]
    });
    let spec = ResourceClaimSpec {
        devices: Some(DeviceClaim {
            requests: Some(vec![request]),
            constraints,
            config: None,
        }),
    };
    let digest = serde_json::to_vec(&spec)
        .map(|bytes| fnv1a(&bytes))
        .unwrap_or(0);
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(format!("hami-gpu-{digest:016x}")),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGER.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceClaimTemplateSpec {
            metadata: None,
            spec: Some(spec),
        }),
    }
}

/// What the cluster's DRA GPUs are, for error messages: `2 × NVIDIA A100-SXM4-40GB (40960 MiB, shared)`.
pub(super) fn summary(gpus: &[DraGpu]) -> String {
    if gpus.is_empty() {
        return "none (is the DRA driver enabled, draDriver.enabled in the ClusterPolicy?)"
            .to_owned();
    }
    let mut kinds: BTreeMap<(String, u64, &str), usize> = BTreeMap::new();
    for gpu in gpus {
        let kind = match (gpu.mig_on_demand.is_empty(), gpu.shared) {
            (false, _) => "MIG on demand",
            (true, true) => "shared",
            (true, false) => "whole",
        };
        *kinds
            .entry((gpu.product_name.clone(), gpu.memory_bytes >> 20, kind))
            .or_default() += 1;
    }
    kinds
        .iter()
        .map(|((product, mib, kind), count)| format!("{count} × {product} ({mib} MiB, {kind})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// FNV-1a, 64 bits: a stable name for a template's content.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
#[path = "hami_tests.rs"]
mod tests;

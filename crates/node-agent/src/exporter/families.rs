//! The pure heart of the exporter: one collection's readings (GPUs, MIG devices, processes, XIDs and which pod
//! holds which device) in, metric families out, and the families in the text exposition format.
//!
//! Series, and their labels as dcgm-exporter names them:
//! - every GPU: `gpu`, `UUID`, `pci_bus_id`, `device` (`nvidia<index>`), `modelName`, `hostname`, with the GPU's
//!   readings (clocks, temperatures, power, energy, utilization, memory, XID, throttling, memory errors, NVLink).
//!   The host label is `hostname`, as dcgm-exporter 4.6.0-4.8.3 (the release NVIDIA's GPU Operator v26.7 runs)
//!   names it; releases before it wrote `Hostname`;
//! - every MIG GPU instance, with `GPU_I_PROFILE` and `GPU_I_ID` added (before `hostname`, in dcgm-exporter's
//!   order): the memory its processes use and the memory left. The GPU-wide readings stay on the GPU's series, so that summing over a GPU's series counts its
//!   power and energy once;
//! - `pod`, `namespace`, `container` when the kubelet says a container holds the GPU or a MIG device of the
//!   instance. Under time-slicing or MPS every container sharing the GPU gets its own series (dcgm-exporter
//!   names one pod per GPU), each with the GPU's value: sum per pod, take the max per GPU;
//! - label fields (`DCGM_FI_DRIVER_VERSION`, `DCGM_FI_DEV_SERIAL`, ...) as more labels on every series of the GPU,
//!   as dcgm-exporter does.
//!
//! Where dcgm-exporter has nothing, two families of ours, when the exporter accounts processes to pods
//! (`--proc-root`): `gpu_pod_memory_used_bytes`, the GPU memory each container's own processes use on each GPU
//! and MIG GPU instance (the GPU's or instance's labels, then `pod`, `namespace`, `container`), which tells apart
//! the pods sharing one GPU; and `gpu_unattributed_memory_used_bytes`, what processes of no pod of the node use.
//!
//! A reading the backend does not give (`None`, e.g. utilization with MIG on) is left out, never shown as 0.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crd::config::device_plugin::device_uuid;
use gpu::{GpuDetails, GpuInstance, GpuInventory, GpuProcess, MigDevice, Telemetry};
use node_runtime::inventory::profile_name;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::config::Selection;
use super::fields::{Field, Kind};
use super::xid::XidGauge;
use crate::pod_resources::{ClaimDevice, PodDevices};
use crd::dra::DRIVER;
use crd::dra::DeviceName;

/// One MIG GPU instance as read at one collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceReading {
    /// GPU-instance id, `GPU_I_ID`.
    pub id: u32,
    /// GPU-instance profile name (`1g.10gb`), `GPU_I_PROFILE`; `profile-<id>` for a model the catalog lacks.
    pub profile: String,
    /// The UUIDs of its MIG devices (one per compute instance): what pods hold.
    pub device_uuids: Vec<String>,
    /// Its memory in MiB.
    pub memory_mib: u64,
    /// Memory its processes use in MiB; `None` when a process's use is not reported.
    pub used_memory_mib: Option<u64>,
    /// Its profile id and first memory slice, which name the DRA driver's MIG placement made on demand; `None`
    /// when the GPU did not list its instances.
    pub placement: Option<(u32, u32)>,
}

/// One GPU as read at one collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReading {
    /// Identity, model, driver.
    pub inventory: GpuInventory,
    /// Its readings; all `None` when the GPU did not answer (its XID gauge is still exported).
    pub telemetry: Telemetry,
    /// Its board's versions and serial number, for label fields.
    pub details: GpuDetails,
    /// Its MIG GPU instances, by id; empty with MIG off.
    pub instances: Vec<InstanceReading>,
}

impl GpuReading {
    /// A GPU's reading from what the backend reported: its MIG devices grouped into GPU instances (several
    /// compute instances may share one, and its memory), with the memory use of the processes in each and the
    /// placement of each instance.
    #[must_use]
    pub fn new(
        inventory: GpuInventory,
        telemetry: Telemetry,
        details: GpuDetails,
        devices: &[MigDevice],
        processes: &[GpuProcess],
        gpu_instances: &[GpuInstance],
    ) -> Self {
        let model = inventory.model();
        let mut instances: BTreeMap<u32, InstanceReading> = BTreeMap::new();
        for device in devices {
            let instance =
                instances
                    .entry(device.gpu_instance_id)
                    .or_insert_with(|| InstanceReading {
                        id: device.gpu_instance_id,
                        profile: model
                            .and_then(|model| profile_name(model, device))
                            .map_or_else(
                                || format!("profile-{}", device.gpu_instance_profile_id),
                                |name| name.gpu_instance.to_string(),
                            ),
                        device_uuids: Vec::new(),
                        memory_mib: device.memory_mib,
                        used_memory_mib: processes
                            .iter()
                            .filter(|process| {
                                process.gpu_instance_id == Some(device.gpu_instance_id)
                            })
                            .map(|process| process.used_memory_mib)
                            .sum(),
                        placement: gpu_instances
                            .iter()
                            .find(|instance| instance.id == device.gpu_instance_id)
                            .map(|instance| (instance.profile_id, instance.placement.start)),
                    });
            instance.device_uuids.push(device.uuid.clone());
        }
        Self {
            inventory,
            telemetry,
            details,
            instances: instances.into_values().collect(),
        }
    }
}

/// A container that holds devices.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    /// Namespace of its pod.
    pub namespace: String,
    /// Its pod.
    pub pod: String,
    /// The container.
    pub container: String,
    /// The DRA claim it holds the device through, for the `dra_*` labels NVIDIA's exporter gives such series.
    pub claim: Option<ClaimDevice>,
}

/// Which containers hold which GPU or MIG device, from the kubelet's pod-resources answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    /// Device UUID (replica suffix removed) → the containers holding it or one of its replicas.
    by_uuid: BTreeMap<String, BTreeSet<Holder>>,
}

impl Holders {
    /// Reads the answer. Devices of other resources (NICs, ...) never match a GPU UUID, so need no filtering;
    /// devices held through claims of this node's DRA driver are found among `gpus` by their device names.
    #[must_use]
    pub fn new(answer: &[PodDevices], gpus: &[GpuReading]) -> Self {
        let mut by_uuid: BTreeMap<String, BTreeSet<Holder>> = BTreeMap::new();
        for pod in answer {
            let (namespace, name) = pod.namespace_and_name();
            for container in &pod.containers {
                let holder = |claim: Option<&ClaimDevice>| Holder {
                    namespace: namespace.to_owned(),
                    pod: name.to_owned(),
                    container: container.name.clone(),
                    claim: claim.cloned(),
                };
                for id in container.devices.values().flatten() {
                    by_uuid
                        .entry(device_uuid(id).to_owned())
                        .or_default()
                        .insert(holder(None));
                }
                for claim in container
                    .claims
                    .iter()
                    .filter(|claim| claim.driver == DRIVER)
                {
                    for uuid in claimed_uuids(&claim.device, gpus) {
                        by_uuid.entry(uuid).or_default().insert(holder(Some(claim)));
                    }
                }
            }
        }
        Self { by_uuid }
    }

    /// The containers holding any of the devices.
    fn of<'a>(&self, uuids: impl IntoIterator<Item = &'a str>) -> BTreeSet<&Holder> {
        uuids
            .into_iter()
            .filter_map(|uuid| self.by_uuid.get(uuid))
            .flatten()
            .collect()
    }
}

/// The UUIDs of a device of this node's DRA driver: a whole GPU's, or a MIG device's.
fn claimed_uuids(device: &str, gpus: &[GpuReading]) -> Vec<String> {
    let gpu = |index: u32| gpus.iter().find(|gpu| gpu.inventory.index == index);
    match DeviceName::parse(device) {
        Some(DeviceName::Gpu(index)) => gpu(index)
            .map(|gpu| vec![gpu.inventory.uuid.clone()])
            .unwrap_or_default(),
        Some(DeviceName::Mig {
            gpu: index,
            gpu_instance,
            ..
        }) => gpu(index)
            .and_then(|gpu| {
                gpu.instances
                    .iter()
                    .find(|instance| instance.id == gpu_instance)
            })
            .map(|instance| instance.device_uuids.clone())
            .unwrap_or_default(),
        Some(DeviceName::MigPlacement {
            gpu: index,
            profile_id,
            start,
            ..
        }) => gpu(index)
            .and_then(|gpu| {
                gpu.instances
                    .iter()
                    .find(|instance| instance.placement == Some((profile_id, start)))
            })
            .map(|instance| instance.device_uuids.clone())
            .unwrap_or_default(),
        None => Vec::new(),
    }
}

/// The labels of a holder: NVIDIA's pod, namespace and container, and for a DRA claim its `dra_*` labels.
fn holder_labels(holder: &Holder, labels: &mut Labels) {
    labels.push(("pod", holder.pod.clone()));
    labels.push(("namespace", holder.namespace.clone()));
    labels.push(("container", holder.container.clone()));
    if let Some(claim) = &holder.claim {
        labels.push(("dra_claim_name", claim.claim_name.clone()));
        labels.push(("dra_claim_namespace", claim.claim_namespace.clone()));
        labels.push(("dra_driver_name", claim.driver.clone()));
        labels.push(("dra_pool_name", claim.pool.clone()));
        labels.push(("dra_device_name", claim.device.clone()));
    }
}

/// GPU memory one process uses, and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessMemory {
    /// The GPU's index.
    pub gpu: u32,
    /// The MIG GPU instance it runs in.
    pub gpu_instance: Option<u32>,
    /// Its container; `None` when it belongs to no pod of the node.
    pub owner: Option<Holder>,
    /// Bytes it uses.
    pub used_bytes: u64,
}

/// Everything one collection read on the node.
#[derive(Debug, Clone, Copy)]
pub struct NodeReading<'a> {
    /// This node's name, the `hostname` label.
    pub hostname: &'a str,
    /// Its GPUs.
    pub gpus: &'a [GpuReading],
    /// Who holds which device.
    pub holders: &'a Holders,
    /// The XID gauge, already fed with this collection's events.
    pub xids: &'a XidGauge,
    /// Every GPU process, accounted to its container; empty when the exporter does not account processes.
    pub processes: &'a [ProcessMemory],
}

/// A sample value: counts and MiB stay integers, watts are fractional.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A whole number.
    Integer(u64),
    /// A fractional number.
    Float(f64),
}

/// The labels of one series, in dcgm-exporter's order.
pub type Labels = Vec<(&'static str, String)>;

/// One series of a family.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its labels.
    pub labels: Labels,
    /// Its value.
    pub value: Value,
}

/// One metric family: a field's series over the node.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricFamily {
    /// The DCGM field; `None` for our own per-pod families.
    pub field: Option<Field>,
    /// The metric name, as the config wrote it (the DCGM name, or dcgm-exporter 1.x's).
    pub name: String,
    /// Gauge or counter.
    pub kind: Kind,
    /// The HELP text.
    pub help: String,
    /// Its series; never empty (a field without any value is left out).
    pub series: Vec<Series>,
}

/// What a series is about: a whole GPU, or one of its MIG GPU instances.
#[derive(Debug, Clone, Copy)]
struct Entity<'a> {
    gpu: &'a GpuReading,
    instance: Option<&'a InstanceReading>,
}

impl<'a> Entity<'a> {
    /// The field's value for this entity, if the backend gave one.
    fn value(self, field: Field, xids: &XidGauge) -> Option<Value> {
        let Some(instance) = self.instance else {
            return gpu_value(field, self.gpu, xids);
        };
        match field {
            Field::FbUsed => instance.used_memory_mib.map(Value::Integer),
            Field::FbFree => instance
                .used_memory_mib
                .map(|used| Value::Integer(instance.memory_mib.saturating_sub(used))),
            _ => None,
        }
    }

    /// The device UUIDs that attribute this entity to a container.
    fn uuids(self) -> Vec<&'a str> {
        match self.instance {
            Some(instance) => instance.device_uuids.iter().map(String::as_str).collect(),
            None => vec![self.gpu.inventory.uuid.as_str()],
        }
    }
}

/// A whole GPU's value of a field.
fn gpu_value(field: Field, gpu: &GpuReading, xids: &XidGauge) -> Option<Value> {
    let telemetry = &gpu.telemetry;
    let errors = &telemetry.memory_errors;
    let nvlink = &telemetry.nvlink;
    let throttling = &telemetry.throttling;
    let small = |reading: Option<u32>| reading.map(|value| Value::Integer(value.into()));
    let count = |reading: Option<u64>| reading.map(Value::Integer);
    // DCGM shows yes/no states as 1/0.
    let flag = |reading: Option<bool>| reading.map(|yes| Value::Integer(yes.into()));
    match field {
        Field::SmClock => small(telemetry.sm_clock_mhz),
        Field::MemClock => small(telemetry.memory_clock_mhz),
        Field::MemoryTemp => small(telemetry.memory_temperature_celsius),
        Field::GpuTemp => small(telemetry.temperature_celsius),
        // DCGM reports watts; NVML milliwatts.
        Field::PowerUsage => telemetry
            .power_milliwatts
            .map(|milliwatts| Value::Float(f64::from(milliwatts) / 1000.0)),
        Field::TotalEnergyConsumption => count(telemetry.total_energy_millijoules),
        Field::PcieReplayCounter => count(telemetry.pcie_replays),
        Field::GpuUtil => small(telemetry.gpu_utilization_percent),
        Field::MemCopyUtil => small(telemetry.memory_utilization_percent),
        Field::EncUtil => small(telemetry.encoder_utilization_percent),
        Field::DecUtil => small(telemetry.decoder_utilization_percent),
        Field::XidErrors => Some(Value::Integer(xids.value(gpu.inventory.index))),
        Field::PowerViolation => count(throttling.power_ns),
        Field::ThermalViolation => count(throttling.thermal_ns),
        Field::SyncBoostViolation => count(throttling.sync_boost_ns),
        Field::BoardLimitViolation => count(throttling.board_limit_ns),
        Field::LowUtilViolation => count(throttling.low_utilization_ns),
        Field::ReliabilityViolation => count(throttling.reliability_ns),
        Field::FbFree => count(telemetry.memory_free_mib),
        Field::FbUsed => count(telemetry.memory_used_mib),
        Field::FbReserved => count(telemetry.memory_reserved_mib),
        Field::EccSbeVolTotal => count(errors.ecc_corrected_volatile),
        Field::EccDbeVolTotal => count(errors.ecc_uncorrected_volatile),
        Field::EccSbeAggTotal => count(errors.ecc_corrected_aggregate),
        Field::EccDbeAggTotal => count(errors.ecc_uncorrected_aggregate),
        Field::RetiredSbe => count(errors.retired_pages_single_bit),
        Field::RetiredDbe => count(errors.retired_pages_double_bit),
        Field::RetiredPending => flag(errors.retired_pages_pending),
        Field::NvlinkCrcFlitErrorCountTotal => count(nvlink.crc_flit_errors),
        Field::NvlinkCrcDataErrorCountTotal => count(nvlink.crc_data_errors),
        Field::NvlinkReplayErrorCountTotal => count(nvlink.replay_errors),
        Field::NvlinkRecoveryErrorCountTotal => count(nvlink.recovery_errors),
        Field::NvlinkBandwidthTotal => count(nvlink.data_kib),
        Field::UncorrectableRemappedRows => count(errors.remapped_rows_uncorrectable),
        Field::CorrectableRemappedRows => count(errors.remapped_rows_correctable),
        Field::RowRemapFailure => flag(errors.remapped_rows_failure),
        Field::RowRemapPending => flag(errors.remapped_rows_pending),
        // Text fields are labels, not values.
        Field::DriverVersion
        | Field::NvmlVersion
        | Field::Brand
        | Field::Serial
        | Field::OemInforomVer
        | Field::EccInforomVer
        | Field::PowerInforomVer
        | Field::InforomImageVer
        | Field::VbiosVersion => None,
    }
}

/// The labels every series of an entity has, before pod attribution.
fn entity_labels(node: &NodeReading<'_>, entity: Entity<'_>, selection: &Selection) -> Labels {
    let inventory = &entity.gpu.inventory;
    let mut labels: Labels = vec![
        ("gpu", inventory.index.to_string()),
        ("UUID", inventory.uuid.clone()),
        ("pci_bus_id", inventory.pci_bus_id.clone()),
        ("device", format!("nvidia{}", inventory.index)),
        ("modelName", inventory.product_name.clone()),
    ];
    if let Some(instance) = entity.instance {
        labels.push(("GPU_I_PROFILE", instance.profile.clone()));
        labels.push(("GPU_I_ID", instance.id.to_string()));
    }
    labels.push(("hostname", node.hostname.to_owned()));
    for selected in selection.fields() {
        if selected.kind == Kind::Label
            && let Some(value) = label_value(selected.field, inventory, &entity.gpu.details)
        {
            labels.push((selected.field.name(), value));
        }
    }
    labels
}

/// The value of a text field, which shows as a label; `None` (no label) when the GPU does not give it.
fn label_value(field: Field, inventory: &GpuInventory, details: &GpuDetails) -> Option<String> {
    match field {
        Field::DriverVersion => Some(&inventory.driver_version),
        Field::NvmlVersion => details.nvml_version.as_ref(),
        Field::Brand => details.brand.as_ref(),
        Field::Serial => details.serial.as_ref(),
        Field::OemInforomVer => details.inforom_oem_version.as_ref(),
        Field::EccInforomVer => details.inforom_ecc_version.as_ref(),
        Field::PowerInforomVer => details.inforom_power_version.as_ref(),
        Field::InforomImageVer => details.inforom_image_version.as_ref(),
        Field::VbiosVersion => details.vbios_version.as_ref(),
        _ => None,
    }
    .cloned()
}

/// The metric families of one collection: the selection's DCGM fields in its order (fields without any value are
/// left out), then the per-pod memory families.
#[must_use]
pub fn families(node: &NodeReading<'_>, selection: &Selection) -> Vec<MetricFamily> {
    let mut families = dcgm_families(node, selection);
    families.extend(process_families(node, selection));
    families
}

/// The per-pod and unattributed memory families, summed per container (or not) and GPU or MIG GPU instance.
fn process_families(node: &NodeReading<'_>, selection: &Selection) -> Vec<MetricFamily> {
    let mut by_owner: BTreeMap<(u32, Option<u32>, Option<&Holder>), u64> = BTreeMap::new();
    for process in node.processes {
        *by_owner
            .entry((process.gpu, process.gpu_instance, process.owner.as_ref()))
            .or_default() += process.used_bytes;
    }
    let (mut pods, mut unattributed) = (Vec::new(), Vec::new());
    for ((gpu_index, instance_id, owner), bytes) in by_owner {
        let Some(gpu) = node
            .gpus
            .iter()
            .find(|gpu| gpu.inventory.index == gpu_index)
        else {
            continue;
        };
        let instance = instance_id.and_then(|id| gpu.instances.iter().find(|i| i.id == id));
        let mut labels = entity_labels(node, Entity { gpu, instance }, selection);
        let value = Value::Integer(bytes);
        match owner {
            Some(holder) => {
                labels.push(("pod", holder.pod.clone()));
                labels.push(("namespace", holder.namespace.clone()));
                labels.push(("container", holder.container.clone()));
                pods.push(Series { labels, value });
            }
            None => unattributed.push(Series { labels, value }),
        }
    }
    [
        (
            POD_MEMORY_USED,
            "GPU memory used by the processes of one container of a pod on a GPU or MIG GPU instance (bytes)",
            pods,
        ),
        (
            UNATTRIBUTED_MEMORY_USED,
            "GPU memory used by processes that belong to no pod of this node (bytes)",
            unattributed,
        ),
    ]
    .into_iter()
    .filter(|(_, _, series)| !series.is_empty())
    .map(|(name, help, series)| MetricFamily {
        field: None,
        name: name.to_owned(),
        kind: Kind::Gauge,
        help: help.to_owned(),
        series,
    })
    .collect()
}

/// Our family of each container's GPU memory.
pub const POD_MEMORY_USED: &str = "gpu_pod_memory_used_bytes";
/// Our family of the GPU memory of processes in no pod.
pub const UNATTRIBUTED_MEMORY_USED: &str = "gpu_unattributed_memory_used_bytes";

/// The DCGM fields' families, in the selection's order.
fn dcgm_families(node: &NodeReading<'_>, selection: &Selection) -> Vec<MetricFamily> {
    let entities: Vec<Entity<'_>> = node
        .gpus
        .iter()
        .flat_map(|gpu| {
            std::iter::once(Entity {
                gpu,
                instance: None,
            })
            .chain(gpu.instances.iter().map(move |instance| Entity {
                gpu,
                instance: Some(instance),
            }))
        })
        .collect();
    // Every label set of every entity, attributed or not, computed once for all fields.
    let label_sets: Vec<Vec<Labels>> = entities
        .iter()
        .map(|&entity| {
            let base = entity_labels(node, entity, selection);
            let holders = node.holders.of(entity.uuids());
            if holders.is_empty() {
                return vec![base];
            }
            holders
                .into_iter()
                .map(|holder| {
                    let mut labels = base.clone();
                    holder_labels(holder, &mut labels);
                    labels
                })
                .collect()
        })
        .collect();
    selection
        .fields()
        .iter()
        .filter(|selected| selected.kind != Kind::Label)
        .filter_map(|selected| {
            let series: Vec<Series> = entities
                .iter()
                .zip(&label_sets)
                .filter_map(|(entity, sets)| {
                    entity
                        .value(selected.field, node.xids)
                        .map(|value| (sets, value))
                })
                .flat_map(|(sets, value)| {
                    sets.iter().map(move |labels| Series {
                        labels: labels.clone(),
                        value,
                    })
                })
                .collect();
            (!series.is_empty()).then(|| MetricFamily {
                field: Some(selected.field),
                name: selected.name.clone(),
                kind: selected.kind,
                help: selected.help.clone(),
                series,
            })
        })
        .collect()
}

/// The families as prometheus-client encodes them, for one scrape.
#[derive(Debug)]
struct Snapshot(Arc<Vec<MetricFamily>>);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in self.0.iter() {
            let metric_type = match family.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge | Kind::Label => MetricType::Gauge,
            };
            let mut metric =
                encoder.encode_descriptor(&family.name, &family.help, None, metric_type)?;
            for series in &family.series {
                let mut sample = metric.encode_family(&series.labels)?;
                // Counters too are written as plain samples: dashboards query DCGM's names, which the `_total`
                // suffix of an OpenMetrics counter sample would change (see `server::CONTENT_TYPE`).
                match series.value {
                    Value::Integer(value) => sample.encode_gauge(&value)?,
                    Value::Float(value) => sample.encode_gauge(&value)?,
                }
            }
        }
        Ok(())
    }
}

/// The families in the text exposition format.
#[must_use]
pub fn encode(families: Arc<Vec<MetricFamily>>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot(families)));
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

#[cfg(test)]
#[path = "families_tests.rs"]
mod tests;

//! The `devices` and `replicas` fields of a shared resource, whose YAML shapes need hand-written serde.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// What separates a device's UUID from the replica number in a shared device's ID, `<uuid>::<n>`, as NVIDIA's
/// plugin writes it (the kubelet and the pod-resources API show these IDs).
const REPLICA_SEPARATOR: &str = "::";

/// The device ID of replica `replica` of the GPU or MIG device `uuid`: `<uuid>::<replica>`.
#[must_use]
pub fn replica_id(uuid: &str, replica: u32) -> String {
    format!("{uuid}{REPLICA_SEPARATOR}{replica}")
}

/// The GPU or MIG device UUID a device ID names, without a replica suffix (`GPU-abc::3` → `GPU-abc`).
#[must_use]
pub fn device_uuid(device_id: &str) -> &str {
    device_id
        .split_once(REPLICA_SEPARATOR)
        .map_or(device_id, |(uuid, _)| uuid)
}

/// Whether a device ID names a replica of a shared device (`GPU-abc::3`), not the device itself.
#[must_use]
pub fn is_replica(device_id: &str) -> bool {
    device_id.contains(REPLICA_SEPARATOR)
}

/// Which devices of a resource are shared: `all`, a count, or a list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum ReplicatedDevices {
    /// Every device of the resource (also what a missing `devices` means).
    #[default]
    All,
    /// The first `n` devices; at least 1.
    Count(u32),
    /// These devices; non-empty.
    List(Vec<DeviceRef>),
}

/// One device in a `devices` list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceRef {
    /// A full GPU by index, written `0` or `"0"`.
    Index(u32),
    /// A MIG device by GPU index and MIG device index, written `"0:1"`.
    MigIndex {
        /// Index of the parent GPU.
        gpu: u32,
        /// Index of the MIG device on that GPU.
        mig: u32,
    },
    /// A GPU or MIG device by UUID: `GPU-<uuid>`, `MIG-<uuid>` or `MIG-GPU-<uuid>/<gi>/<ci>`.
    Uuid(String),
}

impl Serialize for ReplicatedDevices {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::All => serializer.serialize_str("all"),
            Self::Count(count) => serializer.serialize_u32(*count),
            Self::List(devices) => devices.serialize(serializer),
        }
    }
}

impl Serialize for DeviceRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Index(index) => serializer.serialize_u32(*index),
            Self::MigIndex { gpu, mig } => serializer.collect_str(&format_args!("{gpu}:{mig}")),
            Self::Uuid(uuid) => serializer.serialize_str(uuid),
        }
    }
}

impl<'de> Deserialize<'de> for ReplicatedDevices {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ReplicatedDevicesVisitor)
    }
}

/// Reads `"all"`, a positive count, or a non-empty list of device references.
struct ReplicatedDevicesVisitor;

/// The advice every bad `devices` value gets.
const DEVICES_FORMS: &str = "use \"all\", a count of at least 1, or a list of devices";

impl<'de> Visitor<'de> for ReplicatedDevicesVisitor {
    type Value = ReplicatedDevices;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("\"all\", a count, or a list of devices")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
        if value == "all" {
            Ok(ReplicatedDevices::All)
        } else {
            Err(E::custom(format!(
                "\"{value}\" is not a device selection, {DEVICES_FORMS}"
            )))
        }
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        u32::try_from(value)
            .ok()
            .filter(|count| *count >= 1)
            .map(ReplicatedDevices::Count)
            .ok_or_else(|| E::custom(format!("{value} is not a device count, {DEVICES_FORMS}")))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        Err(E::custom(format!(
            "{value} is not a device count, {DEVICES_FORMS}"
        )))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut devices = Vec::new();
        while let Some(device) = seq.next_element()? {
            devices.push(device);
        }
        if devices.is_empty() {
            return Err(de::Error::custom(format!(
                "the list is empty, {DEVICES_FORMS}"
            )));
        }
        Ok(ReplicatedDevices::List(devices))
    }
}

impl<'de> Deserialize<'de> for DeviceRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DeviceRefVisitor)
    }
}

/// Reads one list element: an index (number or string), `"<gpu>:<mig>"`, or a UUID.
struct DeviceRefVisitor;

/// The advice every bad list element gets.
const DEVICE_REF_FORMS: &str = concat!(
    "use a GPU index (0), a MIG device as \"<gpu>:<mig>\" (\"0:1\"), ",
    "or a UUID (GPU-... or MIG-...)"
);

impl Visitor<'_> for DeviceRefVisitor {
    type Value = DeviceRef;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a GPU index, \"<gpu>:<mig>\" or a UUID")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        u32::try_from(value)
            .map(DeviceRef::Index)
            .map_err(|_| E::custom(format!("{value} is not a device, {DEVICE_REF_FORMS}")))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        Err(E::custom(format!(
            "{value} is not a device, {DEVICE_REF_FORMS}"
        )))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
        let index = |text: &str| -> Option<u32> {
            text.bytes()
                .all(|byte| byte.is_ascii_digit())
                .then(|| text.parse().ok())
                .flatten()
        };
        if let Some(gpu) = index(value) {
            return Ok(DeviceRef::Index(gpu));
        }
        if let Some((gpu, mig)) = value.split_once(':')
            && let (Some(gpu), Some(mig)) = (index(gpu), index(mig))
        {
            return Ok(DeviceRef::MigIndex { gpu, mig });
        }
        if is_device_uuid(value) {
            return Ok(DeviceRef::Uuid(value.to_owned()));
        }
        Err(E::custom(format!(
            "\"{value}\" is not a device, {DEVICE_REF_FORMS}"
        )))
    }
}

/// `GPU-<uuid>`, `MIG-<uuid>` or `MIG-GPU-<uuid>/<gi>/<ci>`, the forms NVML reports.
fn is_device_uuid(text: &str) -> bool {
    if let Some(uuid) = text.strip_prefix("GPU-") {
        return is_uuid(uuid);
    }
    let Some(mig) = text.strip_prefix("MIG-") else {
        return false;
    };
    if is_uuid(mig) {
        return true;
    }
    let mut parts = mig.split('/');
    let gpu_uuid = parts.next().and_then(|gpu| gpu.strip_prefix("GPU-"));
    let indices: Vec<&str> = parts.collect();
    gpu_uuid.is_some_and(is_uuid)
        && indices.len() == 2
        && indices
            .iter()
            .all(|index| !index.is_empty() && index.bytes().all(|byte| byte.is_ascii_digit()))
}

/// A textual UUID: hex groups of 8-4-4-4-12.
fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups.iter().zip([8, 4, 4, 4, 12]).all(|(group, length)| {
            group.len() == length && group.bytes().all(|byte| byte.is_ascii_hexdigit())
        })
}

/// The most replicas one device may be split into. NVIDIA's plugin sets no limit; this one is far above any use its
/// guides show (2 to 10), and keeps what the plugin expands a count into small: 16 GPUs of 7 MIG devices each make
/// at most 28,672 replicas on a node, well inside the 4 MiB a gRPC peer accepts in one message by default.
pub const MAX_REPLICAS: u32 = 256;

/// The most replicas of one device under MPS: each replica is given `100 / replicas` percent of the device's
/// threads (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), which must be a whole percent of at least 1.
pub const MAX_MPS_REPLICAS: u32 = 100;

/// `deserialize_with` for `replicas`: an integer from 2 (one replica shares nothing, and NVIDIA's plugin would then
/// advertise a "shared" resource that is not) to [`MAX_REPLICAS`], checked here so that no count is ever expanded
/// before it is known to be bounded.
pub(super) fn replicas<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    let replicas = i64::deserialize(deserializer)?;
    if replicas < 2 {
        return Err(de::Error::custom(format!(
            "{replicas} is too small, replicas must be at least 2 (use 2 or more, or remove the sharing entry)"
        )));
    }
    u32::try_from(replicas)
        .ok()
        .filter(|replicas| *replicas <= MAX_REPLICAS)
        .ok_or_else(|| {
            de::Error::custom(format!(
                "{replicas} is too large, replicas must be at most {MAX_REPLICAS}"
            ))
        })
}

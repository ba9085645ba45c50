//! Where GPU requests would land on the devices nodes publish through DRA, and what would remain: the pure core
//! of the `plan` CLI, for admins ("do these pods fit?") and for tests.
//!
//! It replays what the kube-scheduler's structured allocator does with consumable capacity
//! (`k8s.io/dynamic-resource-allocation` `structured/internal/incubating`, summarised in
//! `shared/reference/dra.md` §3.4; the points are cited below as §3.4.N):
//!
//! - Requests are placed in the order given, each seeing what the earlier ones consumed.
//! - Nodes are tried in the order given and the first node where the request fits wins. The scheduler scores
//!   the feasible nodes instead, so on a cluster the node may differ; the device choice within a node does not:
//!   it is first-fit in slice and device order (§3.4.9).
//! - Which devices a request may take (its class):
//!   - [`Class::Shared`]: `type == "gpu"` and `allowMultipleAllocations`, the chart's `shared.gpu.nvidia.com`.
//!   - [`Class::WholeGpu`]: `type == "gpu"`, shared or not, as NVIDIA's `gpu.nvidia.com` class selects. On a
//!     shared GPU such a request consumes the capacities' defaults like any other claim (§3.4.2): all of its
//!     memory when it names none, so it lands only on a shared GPU nobody uses.
//!   - [`Class::Mig`]: `type == "mig"`, and the `profile` attribute when the request names one.
//! - HAMi's filters: `type`/`nouse-type` match when the device's `productName` contains the text, in any case
//!   (HAMi's meaning); `uuid`/`nouse-uuid` compare the `uuid` attribute exactly.
//! - Capacities: a capacity the request names but the device lacks rules the device out (§3.4.1). On a
//!   multi-allocatable device every capacity is consumed: the policy's default when not named, else the amount
//!   rounded onto the policy (§3.4.2), which must not exceed its max unless it is the default (§3.4.3); the
//!   device fits when what is consumed plus this stays within the value of every capacity (§3.4.4). Any other
//!   device is taken whole, once, and named capacities only filter (§3.4.5).
//! - `count` N takes N distinct devices on one node.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crd::dra::{
    ATTRIBUTE_MIG_PROFILE, ATTRIBUTE_PRODUCT_NAME, ATTRIBUTE_TYPE, ATTRIBUTE_UUID, CAPACITY_CORES,
    CAPACITY_MEMORY, CORES_TOTAL, TYPE_GPU, TYPE_MIG,
};
use k8s_openapi::api::resource::v1::{Device, DeviceCapacity};

use crate::accounting::MIB;
use crd::quantity::parse_bytes as parse_quantity;

/// The devices one node's ResourceSlices publish, in slice and device order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeDevices {
    /// The node's name.
    pub node: String,
    /// Its devices.
    pub devices: Vec<Device>,
}

/// One request, in the terms HAMi users write (the webhook turns HAMi pods into the same thing).
///
/// Parsed from comma-separated `key=value` pairs ([`FromStr`]):
///
/// | key (HAMi's name also accepted)    | value                                                               |
/// |------------------------------------|---------------------------------------------------------------------|
/// | `count` (`gpu`)                    | devices, on one node; default 1                                     |
/// | `gpumem`                           | memory per device: a number of MiB (as HAMi), or a quantity (`8Gi`) |
/// | `gpumem-percentage`                | memory per device as a percentage of that device's memory, 1–100    |
/// | `gpucores`                         | percent of the GPU's SMs, 0–100                                     |
/// | `type` (`use-gputype`)             | productName contains this, any case; a list, any may match          |
/// | `nouse-type` (`nouse-gputype`)     | productName contains none of these, any case                        |
/// | `uuid` (`use-gpuuuid`)             | the device's uuid is one of these                                   |
/// | `nouse-uuid` (`nouse-gpuuuid`)     | the device's uuid is none of these                                  |
/// | `class`                            | `shared` (default), `gpu` (a whole GPU) or `mig`; or the class name |
/// | `profile`                          | the MIG profile, e.g. `1g.5gb` (class `mig` only)                   |
///
/// Keys may carry HAMi's `nvidia.com/` prefix. A list key takes several values by repeating it
/// (`type=A100,type=V100`) or, as in HAMi's annotations, by bare words after it (`type=A100,V100`).
/// `gpumem-percentage` and `gpucores` apply to class `shared` only; `gpumem` on a whole GPU or MIG device asks
/// for a device with at least that much memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// How the request is shown: the text it was parsed from.
    pub label: String,
    /// Devices wanted, all on one node.
    pub count: u32,
    /// Memory per device; none takes the capacity's default (all of a shared GPU's memory).
    pub memory: Option<MemoryRequest>,
    /// Percent of the SMs per device; none takes the capacity's default (0 on shared GPUs).
    pub cores: Option<u64>,
    /// productName must contain one of these (any case).
    pub use_types: Vec<String>,
    /// productName must contain none of these (any case).
    pub nouse_types: Vec<String>,
    /// uuid must be one of these.
    pub uuids: Vec<String>,
    /// uuid must be none of these.
    pub nouse_uuids: Vec<String>,
    /// Which kind of device.
    pub class: Class,
    /// The MIG profile (class [`Class::Mig`]).
    pub profile: Option<String>,
}

/// Memory asked of each device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryRequest {
    /// Bytes.
    Bytes(u64),
    /// Percent of the device's memory (1–100), rounded down to whole MiB.
    Percent(u8),
}

/// Which kind of device a request takes (the DeviceClass it names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Class {
    /// A share of a GPU that allows multiple allocations (`shared.gpu.nvidia.com`).
    #[default]
    Shared,
    /// A whole GPU (`gpu.nvidia.com`).
    WholeGpu,
    /// A MIG device (`mig.nvidia.com`).
    Mig,
}

impl Class {
    fn noun(self) -> &'static str {
        match self {
            Class::Shared => "shared GPU",
            Class::WholeGpu => "GPU",
            Class::Mig => "MIG device",
        }
    }

    fn keyword(self) -> &'static str {
        match self {
            Class::Shared => "shared",
            Class::WholeGpu => "gpu",
            Class::Mig => "mig",
        }
    }
}

/// Why a request's text is not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Nothing was written.
    #[error("the request is empty; write key=value pairs such as gpumem=3000,gpucores=30")]
    Empty,
    /// A word that is neither `key=value` nor a further value of a list key.
    #[error(
        "{token:?} is not key=value; write e.g. gpumem=3000 (bare words only continue a type, nouse-type, uuid or nouse-uuid list)"
    )]
    NotKeyValue {
        /// The word.
        token: String,
    },
    /// An unknown key.
    #[error(
        "unknown key {key:?}; use count, gpumem, gpumem-percentage, gpucores, type, nouse-type, uuid, nouse-uuid, class or profile"
    )]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A key with a value it does not take.
    #[error("{key}={value:?}: expected {expected}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value.
        value: String,
        /// What the key takes.
        expected: &'static str,
    },
    /// A single-valued key written twice.
    #[error("{key} is given twice; keep one")]
    Duplicate {
        /// The key.
        key: &'static str,
    },
    /// Both ways of asking for memory.
    #[error("gpumem and gpumem-percentage are both given; keep one")]
    TwoMemories,
    /// A key that the request's class does not take.
    #[error("{key} does not apply to class={class}; {fix}")]
    NotForClass {
        /// The key.
        key: &'static str,
        /// The request's class keyword.
        class: &'static str,
        /// What to write instead.
        fix: &'static str,
    },
}

const EXPECT_COUNT: &str = "a whole number of devices, 1 or more";
const EXPECT_MEMORY: &str = "a positive number of MiB (3000) or a quantity (8Gi, 3000Mi)";
const EXPECT_PERCENT: &str = "a whole percentage from 1 to 100";
const EXPECT_CORES: &str = "a whole percentage from 0 to 100";
const EXPECT_CLASS: &str = "shared, gpu or mig";
const EXPECT_TEXT: &str = "a non-empty value";

impl FromStr for Request {
    type Err = RequestError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let label = text.trim();
        let mut request = Request {
            label: label.to_owned(),
            count: 1,
            memory: None,
            cores: None,
            use_types: Vec::new(),
            nouse_types: Vec::new(),
            uuids: Vec::new(),
            nouse_uuids: Vec::new(),
            class: Class::Shared,
            profile: None,
        };
        let mut seen: Vec<&'static str> = Vec::new();
        let mut once = |key: &'static str| {
            if seen.contains(&key) {
                return Err(RequestError::Duplicate { key });
            }
            seen.push(key);
            Ok(())
        };
        // The list a bare word continues: the last list key written, as in HAMi's `use-gputype: "A100,V100"`.
        let mut list: Option<ListKey> = None;
        let mut any = false;
        for token in label.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            any = true;
            let Some((key, value)) = token.split_once('=') else {
                let Some(key) = list else {
                    return Err(RequestError::NotKeyValue {
                        token: token.to_owned(),
                    });
                };
                request.list_mut(key).push(token.to_owned());
                continue;
            };
            let key = key.trim().to_ascii_lowercase();
            let key = key.strip_prefix("nvidia.com/").unwrap_or(&key);
            let value = value.trim();
            list = None;
            match key {
                "count" | "gpu" => {
                    once("count")?;
                    request.count = value
                        .parse()
                        .ok()
                        .filter(|count| *count > 0)
                        .ok_or_else(|| bad("count", value, EXPECT_COUNT))?;
                }
                "gpumem" => {
                    once("gpumem")?;
                    request.memory = Some(MemoryRequest::Bytes(parse_memory(value)?));
                }
                "gpumem-percentage" => {
                    once("gpumem-percentage")?;
                    let percent = value
                        .parse()
                        .ok()
                        .filter(|p| (1..=100).contains(p))
                        .ok_or_else(|| bad("gpumem-percentage", value, EXPECT_PERCENT))?;
                    request.memory = Some(MemoryRequest::Percent(percent));
                }
                "gpucores" => {
                    once("gpucores")?;
                    request.cores = Some(
                        value
                            .parse()
                            .ok()
                            .filter(|c| *c <= CORES_TOTAL)
                            .ok_or_else(|| bad("gpucores", value, EXPECT_CORES))?,
                    );
                }
                "class" => {
                    once("class")?;
                    request.class = match value.to_ascii_lowercase().as_str() {
                        "shared" | "shared.gpu.nvidia.com" => Class::Shared,
                        "gpu" | "gpu.nvidia.com" => Class::WholeGpu,
                        "mig" | "mig.nvidia.com" => Class::Mig,
                        _ => return Err(bad("class", value, EXPECT_CLASS)),
                    };
                }
                "profile" => {
                    once("profile")?;
                    if value.is_empty() {
                        return Err(bad("profile", value, EXPECT_TEXT));
                    }
                    request.profile = Some(value.to_owned());
                }
                _ => {
                    let key = ListKey::parse(key).ok_or_else(|| RequestError::UnknownKey {
                        key: key.to_owned(),
                    })?;
                    if value.is_empty() {
                        return Err(bad(key.name(), value, EXPECT_TEXT));
                    }
                    request.list_mut(key).push(value.to_owned());
                    list = Some(key);
                }
            }
        }
        if !any {
            return Err(RequestError::Empty);
        }
        if seen.contains(&"gpumem") && seen.contains(&"gpumem-percentage") {
            return Err(RequestError::TwoMemories);
        }
        request.check_class()?;
        Ok(request)
    }
}

fn bad(key: &'static str, value: &str, expected: &'static str) -> RequestError {
    RequestError::BadValue {
        key,
        value: value.to_owned(),
        expected,
    }
}

/// `gpumem`: a plain number is MiB, as in HAMi; anything else is a Kubernetes quantity of bytes.
fn parse_memory(value: &str) -> Result<u64, RequestError> {
    let bytes = if value.bytes().all(|b| b.is_ascii_digit()) {
        value
            .parse::<u64>()
            .ok()
            .and_then(|mib| mib.checked_mul(MIB))
    } else {
        parse_quantity(value).ok()
    };
    bytes
        .filter(|b| *b > 0)
        .ok_or_else(|| bad("gpumem", value, EXPECT_MEMORY))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListKey {
    UseTypes,
    NouseTypes,
    Uuids,
    NouseUuids,
}

impl ListKey {
    fn parse(key: &str) -> Option<Self> {
        Some(match key {
            "type" | "use-gputype" => ListKey::UseTypes,
            "nouse-type" | "nouse-gputype" => ListKey::NouseTypes,
            "uuid" | "use-gpuuuid" => ListKey::Uuids,
            "nouse-uuid" | "nouse-gpuuuid" => ListKey::NouseUuids,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            ListKey::UseTypes => "type",
            ListKey::NouseTypes => "nouse-type",
            ListKey::Uuids => "uuid",
            ListKey::NouseUuids => "nouse-uuid",
        }
    }
}

impl Request {
    fn list_mut(&mut self, key: ListKey) -> &mut Vec<String> {
        match key {
            ListKey::UseTypes => &mut self.use_types,
            ListKey::NouseTypes => &mut self.nouse_types,
            ListKey::Uuids => &mut self.uuids,
            ListKey::NouseUuids => &mut self.nouse_uuids,
        }
    }

    fn check_class(&self) -> Result<(), RequestError> {
        let class = self.class.keyword();
        if self.class != Class::Shared {
            if matches!(self.memory, Some(MemoryRequest::Percent(_))) {
                return Err(RequestError::NotForClass {
                    key: "gpumem-percentage",
                    class,
                    fix: "a whole GPU or MIG device has all of its memory; use class=shared for a share",
                });
            }
            if self.cores.is_some() {
                return Err(RequestError::NotForClass {
                    key: "gpucores",
                    class,
                    fix: "a whole GPU or MIG device has all of its SMs; use class=shared for a share",
                });
            }
        }
        if self.class != Class::Mig && self.profile.is_some() {
            return Err(RequestError::NotForClass {
                key: "profile",
                class,
                fix: "add class=mig",
            });
        }
        Ok(())
    }

    /// What each device must have free, for messages: "3000 MiB and 30 cores".
    fn need(&self) -> String {
        let memory = match self.memory {
            Some(MemoryRequest::Bytes(bytes)) => format_bytes(bytes),
            Some(MemoryRequest::Percent(percent)) => format!("{percent} % of its memory"),
            None => "all of its memory".to_owned(),
        };
        match self.cores {
            Some(cores) => format!("{memory} and {cores} cores"),
            None => memory,
        }
    }

    /// The device's class, ignoring the filters.
    fn in_class(&self, device: &Device) -> bool {
        let type_matches = |wanted: &str| string_attribute(device, ATTRIBUTE_TYPE) == Some(wanted);
        match self.class {
            Class::Shared => type_matches(TYPE_GPU) && multi_allocatable(device),
            Class::WholeGpu => type_matches(TYPE_GPU),
            Class::Mig => {
                type_matches(TYPE_MIG)
                    && self.profile.as_deref().is_none_or(|profile| {
                        string_attribute(device, ATTRIBUTE_MIG_PROFILE) == Some(profile)
                    })
            }
        }
    }

    /// HAMi's filters: productName contains a `type` and no `nouse-type` (any case); the uuid is listed and not
    /// excluded.
    fn passes_filters(&self, device: &Device) -> bool {
        let product = string_attribute(device, ATTRIBUTE_PRODUCT_NAME)
            .unwrap_or_default()
            .to_lowercase();
        let contains = |text: &String| product.contains(&text.to_lowercase());
        let uuid = string_attribute(device, ATTRIBUTE_UUID);
        let listed = |uuids: &[String]| uuid.is_some_and(|uuid| uuids.iter().any(|u| u == uuid));
        (self.use_types.is_empty() || self.use_types.iter().any(contains))
            && !self.nouse_types.iter().any(contains)
            && (self.uuids.is_empty() || listed(&self.uuids))
            && !listed(&self.nouse_uuids)
    }

    /// The filters, for messages: `productName contains "A100" (any case)`.
    fn filters(&self) -> String {
        let quoted = |values: &[String]| {
            values
                .iter()
                .map(|v| format!("{v:?}"))
                .collect::<Vec<_>>()
                .join(" or ")
        };
        let mut parts = Vec::new();
        if !self.use_types.is_empty() {
            parts.push(format!(
                "productName contains {} (any case)",
                quoted(&self.use_types)
            ));
        }
        if !self.nouse_types.is_empty() {
            parts.push(format!(
                "productName contains no {} (any case)",
                quoted(&self.nouse_types)
            ));
        }
        if !self.uuids.is_empty() {
            parts.push(format!("uuid is {}", quoted(&self.uuids)));
        }
        if !self.nouse_uuids.is_empty() {
            parts.push(format!("uuid is not {}", quoted(&self.nouse_uuids)));
        }
        parts.join(", ")
    }

    /// The capacities the request names, in bytes or units, for one device.
    fn requested(&self, capacity: &Capacities) -> BTreeMap<&'static str, u64> {
        let mut requested = BTreeMap::new();
        match self.memory {
            Some(MemoryRequest::Bytes(bytes)) => {
                requested.insert(CAPACITY_MEMORY, bytes);
            }
            // The percentage of this device's memory, rounded down to whole MiB as HAMi does.
            Some(MemoryRequest::Percent(percent)) => {
                let total = capacity.get(CAPACITY_MEMORY).map_or(0, |c| c.value);
                let bytes = u128::from(total) * u128::from(percent) / 100;
                let bytes = u64::try_from(bytes).unwrap_or(u64::MAX) / MIB * MIB;
                requested.insert(CAPACITY_MEMORY, bytes);
            }
            None => {}
        }
        if let Some(cores) = self.cores {
            requested.insert(CAPACITY_CORES, cores);
        }
        requested
    }
}

/// The result of planning: where each request landed, then what every device has left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// One per request, in order.
    pub placements: Vec<Placement>,
    /// One per device, in node and device order.
    pub remaining: Vec<DeviceRemaining>,
}

/// Where one request landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The request's label.
    pub request: String,
    /// Its devices (as many as its count, on one node), or why it has none.
    pub outcome: Result<Vec<Landed>, Unplaced>,
}

/// One device a request took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    /// The node.
    pub node: String,
    /// The device's name in its slice.
    pub device: String,
    /// Its `uuid` attribute.
    pub uuid: Option<String>,
    /// Its `productName` attribute.
    pub product: Option<String>,
    /// Memory the request holds there, in bytes: what it consumed on a shared GPU, all of it otherwise.
    pub memory_bytes: u64,
    /// Cores the request consumed; none on a device without a `cores` capacity (a whole GPU or MIG device, all of
    /// whose SMs it has).
    pub cores: Option<u64>,
}

/// What one device has used and left after all requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRemaining {
    /// The node.
    pub node: String,
    /// The device's name in its slice.
    pub device: String,
    /// Its `productName` attribute.
    pub product: Option<String>,
    /// How many requests took it.
    pub allocations: u32,
    /// Its `memory` capacity and how much of it is used, in bytes (none without one).
    pub memory: Option<Usage>,
    /// Its `cores` capacity and how much of it is used (none without one).
    pub cores: Option<Usage>,
}

/// A capacity's total and used amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The capacity's `value`.
    pub total: u64,
    /// What allocations consumed.
    pub used: u64,
}

impl Usage {
    /// What is left.
    #[must_use]
    pub fn free(&self) -> u64 {
        self.total.saturating_sub(self.used)
    }
}

/// Why a request has no place, in the words its author needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unplaced {
    /// No node publishes a device of the request's class.
    #[error("no node publishes a {class} (a device with {selector})")]
    NoDeviceOfClass {
        /// The class's noun.
        class: &'static str,
        /// What its devices look like.
        selector: String,
    },
    /// Devices of the class exist, but the type and uuid filters exclude all of them.
    #[error("no {class} matches {filters}; the {class}s are: {seen}")]
    NoMatch {
        /// The class's noun.
        class: &'static str,
        /// The request's filters.
        filters: String,
        /// The distinct productNames of the class's devices.
        seen: String,
    },
    /// Every matching device rules the request out, even empty: its request policy, its size, a capacity it
    /// lacks (§3.4.1) or one that cannot be read.
    #[error("no {class} can hold {need}: {detail}")]
    CannotHold {
        /// The class's noun.
        class: &'static str,
        /// What each device must give.
        need: String,
        /// The first device's reason.
        detail: String,
    },
    /// Matching devices exist but have too little left.
    #[error("no {class} {wanted}: {closest}")]
    NoRoom {
        /// The class's noun.
        class: &'static str,
        /// "has 3000 MiB and 30 cores free" or "is free".
        wanted: String,
        /// The matching devices and what they have left (the first few).
        closest: String,
    },
    /// Some devices fit, but no node has as many as the count.
    #[error(
        "count {count} needs {count} {class}s on one node that each {wanted}; at most {most} do on one node ({node})"
    )]
    TooFewOnOneNode {
        /// The count.
        count: u32,
        /// The class's noun.
        class: &'static str,
        /// "has 3000 MiB and 30 cores free" or "is free".
        wanted: String,
        /// The most fitting devices on one node.
        most: usize,
        /// That node.
        node: String,
    },
}

/// Places `requests` in order on `nodes`: see the module's documentation for the rules.
#[must_use]
pub fn plan(nodes: &[NodeDevices], requests: &[Request]) -> Plan {
    let devices: Vec<Vec<Parsed<'_>>> = nodes
        .iter()
        .map(|node| node.devices.iter().map(Parsed::new).collect())
        .collect();
    let mut consumed: Vec<Vec<Consumed>> = devices
        .iter()
        .map(|node| vec![Consumed::default(); node.len()])
        .collect();
    let placements = requests
        .iter()
        .map(|request| Placement {
            request: request.label.clone(),
            outcome: place(nodes, &devices, &mut consumed, request),
        })
        .collect();
    let remaining = nodes
        .iter()
        .zip(&devices)
        .zip(&consumed)
        .flat_map(|((node, parsed), consumed)| {
            parsed.iter().zip(consumed).map(|(device, consumed)| {
                let usage = |key: &str| {
                    let capacities = device.capacities.as_ref().ok()?;
                    Some(Usage {
                        total: capacities.get(key)?.value,
                        used: consumed.amounts.get(key).copied().unwrap_or(0),
                    })
                };
                DeviceRemaining {
                    node: node.node.clone(),
                    device: device.device.name.clone(),
                    product: string_attribute(device.device, ATTRIBUTE_PRODUCT_NAME)
                        .map(str::to_owned),
                    allocations: consumed.allocations,
                    memory: usage(CAPACITY_MEMORY),
                    cores: usage(CAPACITY_CORES),
                }
            })
        })
        .collect();
    Plan {
        placements,
        remaining,
    }
}

fn place(
    nodes: &[NodeDevices],
    devices: &[Vec<Parsed<'_>>],
    consumed: &mut [Vec<Consumed>],
    request: &Request,
) -> Result<Vec<Landed>, Unplaced> {
    let count = usize::try_from(request.count).unwrap_or(usize::MAX);
    let verdicts: Vec<Vec<Verdict>> = devices
        .iter()
        .zip(consumed.iter())
        .map(|(node, consumed)| {
            node.iter()
                .zip(consumed)
                .map(|(device, consumed)| verdict(request, device, consumed))
                .collect()
        })
        .collect();
    // First-fit: the first node with `count` fitting devices, its first `count` of them (§3.4.9).
    for (n, node) in verdicts.iter().enumerate() {
        let fitting: Vec<(usize, &BTreeMap<String, u64>)> = node
            .iter()
            .enumerate()
            .filter_map(|(d, verdict)| match verdict {
                Verdict::Fits(amounts) => Some((d, amounts)),
                _ => None,
            })
            .take(count)
            .collect();
        if fitting.len() < count {
            continue;
        }
        let mut landed = Vec::with_capacity(count);
        for (d, amounts) in fitting {
            let device = &devices[n][d];
            let entry = &mut consumed[n][d];
            entry.allocations += 1;
            for (key, amount) in amounts {
                *entry.amounts.entry(key.clone()).or_default() += amount;
            }
            landed.push(Landed {
                node: nodes[n].node.clone(),
                device: device.device.name.clone(),
                uuid: string_attribute(device.device, ATTRIBUTE_UUID).map(str::to_owned),
                product: string_attribute(device.device, ATTRIBUTE_PRODUCT_NAME).map(str::to_owned),
                memory_bytes: amounts.get(CAPACITY_MEMORY).copied().unwrap_or(0),
                cores: amounts.get(CAPACITY_CORES).copied(),
            });
        }
        return Ok(landed);
    }
    Err(why_unplaced(nodes, devices, &verdicts, request))
}

/// The reason that matters most to the request's author: the first step at which every device dropped out.
fn why_unplaced(
    nodes: &[NodeDevices],
    devices: &[Vec<Parsed<'_>>],
    verdicts: &[Vec<Verdict>],
    request: &Request,
) -> Unplaced {
    let class = request.class.noun();
    let all = || {
        nodes
            .iter()
            .zip(devices)
            .zip(verdicts)
            .flat_map(|((node, parsed), verdicts)| {
                parsed
                    .iter()
                    .zip(verdicts)
                    .map(move |(device, verdict)| (node.node.as_str(), device, verdict))
            })
    };
    let in_class: Vec<_> = all()
        .filter(|(_, _, v)| !matches!(v, Verdict::OtherClass))
        .collect();
    if in_class.is_empty() {
        return Unplaced::NoDeviceOfClass {
            class,
            selector: selector(request),
        };
    }
    let passing: Vec<_> = in_class
        .iter()
        .filter(|(_, _, v)| !matches!(v, Verdict::Filtered))
        .collect();
    if passing.is_empty() {
        let mut seen: Vec<&str> = Vec::new();
        for (_, device, _) in &in_class {
            let product = string_attribute(device.device, ATTRIBUTE_PRODUCT_NAME)
                .unwrap_or("(no productName)");
            if !seen.contains(&product) {
                seen.push(product);
            }
        }
        return Unplaced::NoMatch {
            class,
            filters: request.filters(),
            seen: seen.join(", "),
        };
    }
    let fitting = verdicts
        .iter()
        .zip(nodes)
        .map(|(node, n)| {
            let fits = node
                .iter()
                .filter(|v| matches!(v, Verdict::Fits(_)))
                .count();
            (fits, n.node.as_str())
        })
        // The first node with the most, so that the message is the same from run to run.
        .min_by_key(|(fits, _)| std::cmp::Reverse(*fits));
    let wanted = if request.class == Class::Shared {
        format!("has {} free", request.need())
    } else {
        "is free".to_owned()
    };
    if let Some((most, node)) = fitting.filter(|(fits, _)| *fits > 0) {
        return Unplaced::TooFewOnOneNode {
            count: request.count,
            class,
            wanted,
            most,
            node: node.to_owned(),
        };
    }
    let mut short = Vec::new();
    let mut cannot = None;
    for (node, device, verdict) in &passing {
        let name = &device.device.name;
        match verdict {
            Verdict::Taken => short.push(format!("{name} on {node} is allocated")),
            Verdict::NoRoom(free) => short.push(format!("{name} on {node} has {free} free")),
            Verdict::CannotHold(detail) if cannot.is_none() => {
                cannot = Some(format!("{name} on {node} {detail}"));
            }
            _ => {}
        }
    }
    // Devices that could take the request once others leave come first: that is what the author can act on.
    if let (true, Some(detail)) = (short.is_empty(), cannot) {
        return Unplaced::CannotHold {
            class,
            need: request.need(),
            detail,
        };
    }
    const SHOWN: usize = 3;
    let mut closest = short[..short.len().min(SHOWN)].join("; ");
    if short.len() > SHOWN {
        closest.push_str(&format!("; and {} more", short.len() - SHOWN));
    }
    Unplaced::NoRoom {
        class,
        wanted,
        closest,
    }
}

/// The class's device selector, for messages.
fn selector(request: &Request) -> String {
    match request.class {
        Class::Shared => format!("{ATTRIBUTE_TYPE} {TYPE_GPU:?} and allowMultipleAllocations"),
        Class::WholeGpu => format!("{ATTRIBUTE_TYPE} {TYPE_GPU:?}"),
        Class::Mig => match &request.profile {
            Some(profile) => {
                format!("{ATTRIBUTE_TYPE} {TYPE_MIG:?} and {ATTRIBUTE_MIG_PROFILE} {profile:?}")
            }
            None => format!("{ATTRIBUTE_TYPE} {TYPE_MIG:?}"),
        },
    }
}

/// A device with its capacities read.
struct Parsed<'a> {
    device: &'a Device,
    multi: bool,
    capacities: Result<Capacities, (String, String)>,
}

impl<'a> Parsed<'a> {
    fn new(device: &'a Device) -> Self {
        Self {
            device,
            multi: multi_allocatable(device),
            capacities: device
                .capacity
                .iter()
                .flatten()
                .map(|(key, capacity)| Ok((key.clone(), Capacity::parse(key, capacity)?)))
                .collect(),
        }
    }
}

type Capacities = BTreeMap<String, Capacity>;

/// A capacity's value and request policy, in whole units.
struct Capacity {
    value: u64,
    default: Option<u64>,
    rule: Rule,
}

enum Rule {
    Any,
    Range {
        min: u64,
        max: Option<u64>,
        step: Option<u64>,
    },
    Values(Vec<u64>),
}

impl Capacity {
    /// Reads the quantities; the first unreadable one comes back as (capacity, value).
    fn parse(key: &str, capacity: &DeviceCapacity) -> Result<Self, (String, String)> {
        let read = |quantity: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
            parse_quantity(&quantity.0).map_err(|_| (key.to_owned(), quantity.0.clone()))
        };
        let policy = capacity.request_policy.as_ref();
        let rule = match policy {
            Some(policy) => match (&policy.valid_range, &policy.valid_values) {
                (Some(range), _) => Rule::Range {
                    min: read(&range.min)?,
                    max: range.max.as_ref().map(read).transpose()?,
                    step: range.step.as_ref().map(read).transpose()?,
                },
                (None, Some(values)) => {
                    Rule::Values(values.iter().map(read).collect::<Result<_, _>>()?)
                }
                (None, None) => Rule::Any,
            },
            None => Rule::Any,
        };
        Ok(Self {
            value: read(&capacity.value)?,
            default: policy
                .and_then(|p| p.default.as_ref())
                .map(read)
                .transpose()?,
            rule,
        })
    }

    /// What a claim consumes of this capacity on a multi-allocatable device, or why the policy refuses it.
    ///
    /// §3.4.2: not requested → the policy's default, else the whole value; requested → the value itself, or
    /// rounded up onto the valid range's step (below min → min), or the smallest valid value at least as large.
    /// §3.4.3: an amount over the range's max is refused, unless it equals the default.
    /// The error is the largest amount the policy allows.
    fn consumption(&self, requested: Option<u64>) -> Result<u64, u64> {
        let Some(requested) = requested else {
            return Ok(self.default.unwrap_or(self.value));
        };
        let amount = match &self.rule {
            Rule::Any => requested,
            Rule::Range { min, step, .. } => match step.filter(|s| *s > 0) {
                _ if requested <= *min => *min,
                Some(step) => min + (requested - min).div_ceil(step) * step,
                None => requested,
            },
            Rule::Values(values) => *values
                .iter()
                .filter(|v| **v >= requested)
                .min()
                .ok_or_else(|| values.iter().copied().max().unwrap_or(0))?,
        };
        if let Rule::Range { max: Some(max), .. } = self.rule
            && amount > max
            && Some(amount) != self.default
        {
            return Err(max);
        }
        Ok(amount)
    }
}

/// What earlier requests took of one device.
#[derive(Debug, Clone, Default)]
struct Consumed {
    allocations: u32,
    amounts: BTreeMap<String, u64>,
}

/// One device's answer to one request.
enum Verdict {
    /// Not of the request's class.
    OtherClass,
    /// Excluded by the type or uuid filters.
    Filtered,
    /// However empty, it cannot take the request: the policy refuses the amount, the device is smaller than
    /// asked, lacks a requested capacity (§3.4.1) or has one that cannot be read. The words say which.
    CannotHold(String),
    /// A device that is not multi-allocatable, already taken.
    Taken,
    /// Not enough left; what is left, for messages.
    NoRoom(String),
    /// It fits, consuming these amounts.
    Fits(BTreeMap<String, u64>),
}

fn verdict(request: &Request, device: &Parsed<'_>, consumed: &Consumed) -> Verdict {
    if !request.in_class(device.device) {
        return Verdict::OtherClass;
    }
    if !request.passes_filters(device.device) {
        return Verdict::Filtered;
    }
    let capacities = match &device.capacities {
        Ok(capacities) => capacities,
        Err((capacity, value)) => {
            return Verdict::CannotHold(format!(
                "has capacity {capacity} = {value:?}, which is not a whole quantity"
            ));
        }
    };
    let requested = request.requested(capacities);
    // §3.4.1: a requested capacity the device lacks makes it ineligible.
    if let Some(key) = requested.keys().find(|key| !capacities.contains_key(**key)) {
        return Verdict::CannotHold(format!("has no capacity {key:?}"));
    }
    if !device.multi {
        // §3.4.5: on a device that is not multi-allocatable, requested capacities only filter; the claim takes
        // the whole device, once.
        for (key, amount) in &requested {
            let value = capacities[*key].value;
            if *amount > value {
                return Verdict::CannotHold(format!("has only {}", format_amount(key, value)));
            }
        }
        if consumed.allocations > 0 {
            return Verdict::Taken;
        }
        return Verdict::Fits(
            capacities
                .iter()
                .map(|(key, capacity)| (key.clone(), capacity.value))
                .collect(),
        );
    }
    // §3.4.2/3: every capacity of the device is consumed, named in the request or not.
    let mut amounts = BTreeMap::new();
    for (key, capacity) in capacities {
        match capacity.consumption(requested.get(key.as_str()).copied()) {
            Ok(amount) => {
                amounts.insert(key.clone(), amount);
            }
            Err(largest) => {
                return Verdict::CannotHold(format!(
                    "takes at most {} (asked {})",
                    format_amount(key, largest),
                    format_amount(key, requested.get(key.as_str()).copied().unwrap_or(0))
                ));
            }
        }
    }
    // §3.4.4: what earlier claims consumed plus this one fits within the value, for every capacity.
    let used = |key: &str| consumed.amounts.get(key).copied().unwrap_or(0);
    let fits = amounts
        .iter()
        .all(|(key, amount)| used(key).saturating_add(*amount) <= capacities[key].value);
    if fits {
        return Verdict::Fits(amounts);
    }
    // Memory first, then cores, as HAMi users read them.
    let mut keys: Vec<&String> = capacities.keys().collect();
    keys.sort_by_key(|key| {
        (
            key.as_str() != CAPACITY_MEMORY,
            key.as_str() != CAPACITY_CORES,
            *key,
        )
    });
    let free = keys
        .into_iter()
        .map(|key| (key, &capacities[key]))
        .map(|(key, capacity)| format_amount(key, capacity.value.saturating_sub(used(key))))
        .collect::<Vec<_>>()
        .join(" and ");
    Verdict::NoRoom(free)
}

fn multi_allocatable(device: &Device) -> bool {
    device.allow_multiple_allocations == Some(true)
}

fn string_attribute<'a>(device: &'a Device, name: &str) -> Option<&'a str> {
    device.attributes.as_ref()?.get(name)?.string.as_deref()
}

/// `3000 MiB` for whole MiB, bytes otherwise.
fn format_bytes(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// An amount of a capacity in its own units: memory in MiB, cores as cores.
fn format_amount(key: &str, amount: u64) -> String {
    match key {
        CAPACITY_MEMORY => format_bytes(amount),
        CAPACITY_CORES => format!("{amount} cores"),
        _ => format!("{amount} {key}"),
    }
}

impl fmt::Display for Plan {
    /// Two tables: each request's devices (memory in MiB, cores; `-` for a device without the capacity), or why
    /// it has none; then each device's memory and cores, used/free.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut placements = Table::new([
            "REQUEST",
            "NODE",
            "DEVICE",
            "PRODUCT",
            "MEMORY MiB",
            "CORES",
        ]);
        for placement in &self.placements {
            match &placement.outcome {
                Ok(landed) => {
                    for device in landed {
                        placements.row(vec![
                            placement.request.clone(),
                            device.node.clone(),
                            device.device.clone(),
                            device.product.clone().unwrap_or_else(|| "-".to_owned()),
                            (device.memory_bytes / MIB).to_string(),
                            device
                                .cores
                                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
                        ]);
                    }
                }
                Err(why) => placements.note(placement.request.clone(), format!("unplaced: {why}")),
            }
        }
        placements.write(f)?;
        writeln!(f)?;
        let mut devices = Table::new([
            "NODE",
            "DEVICE",
            "PRODUCT",
            "MEMORY USED/FREE MiB",
            "CORES USED/FREE",
        ]);
        for device in &self.remaining {
            devices.row(vec![
                device.node.clone(),
                device.device.clone(),
                device.product.clone().unwrap_or_else(|| "-".to_owned()),
                device.memory.map_or_else(
                    || "-".to_owned(),
                    |m| format!("{}/{}", m.used / MIB, m.free() / MIB),
                ),
                device
                    .cores
                    .map_or_else(|| "-".to_owned(), |c| format!("{}/{}", c.used, c.free())),
            ]);
        }
        devices.write(f)
    }
}

/// Left-aligned columns two spaces apart; a note row fills the first column and runs on past the others.
struct Table {
    header: Vec<String>,
    rows: Vec<Row>,
}

enum Row {
    Cells(Vec<String>),
    Note(String, String),
}

impl Table {
    fn new<const N: usize>(header: [&str; N]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(Row::Cells(cells));
    }

    fn note(&mut self, first: String, text: String) {
        self.rows.push(Row::Note(first, text));
    }

    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            match row {
                Row::Cells(cells) => {
                    for (width, cell) in widths.iter_mut().zip(cells) {
                        *width = (*width).max(cell.chars().count());
                    }
                }
                Row::Note(first, _) => widths[0] = widths[0].max(first.chars().count()),
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: &[String]| {
            let mut text = String::new();
            for (cell, width) in cells.iter().zip(&widths) {
                text.push_str(&format!("{cell:<width$}  "));
            }
            writeln!(f, "{}", text.trim_end())
        };
        line(f, &self.header)?;
        for row in &self.rows {
            match row {
                Row::Cells(cells) => line(f, cells)?,
                Row::Note(first, text) => line(f, &[first.clone(), text.clone()])?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;

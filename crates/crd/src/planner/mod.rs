//! Where GPU requests would land on the devices nodes publish through DRA, and what would remain: the pure core
//! of `gpu-dra-driver plan`, for admins ("do these pods fit?"), and the operator's HAMi webhook's answer to "can
//! this pod fit the cluster at all?" (each ask on the devices as published, none in use), so that the two never
//! disagree.
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

use crate::dra::{
    ATTRIBUTE_MIG_PROFILE, ATTRIBUTE_PRODUCT_NAME, ATTRIBUTE_TYPE, ATTRIBUTE_UUID, CAPACITY_CORES,
    CAPACITY_MEMORY, TYPE_GPU, TYPE_MIG, text_attribute,
};
use k8s_openapi::api::resource::v1::{Device, DeviceCapacity};

use crate::hami::MIB;
use crate::quantity::parse_bytes as parse_quantity;

mod request;
mod table;

pub use crate::hami::Memory;
pub use request::{Class, Request, RequestError};
use table::{format_amount, format_bytes};

/// The devices one node's ResourceSlices publish, in slice and device order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeDevices {
    /// The node's name.
    pub node: String,
    /// Its devices.
    pub devices: Vec<Device>,
}

impl Request {
    /// What each device must have free, for messages: "3000 MiB and 30 cores".
    fn need(&self) -> String {
        let memory = match self.memory {
            Memory::Bytes(bytes) => format_bytes(bytes),
            Memory::Percent(percent) => format!("{percent} % of its memory"),
            Memory::Whole => "all of its memory".to_owned(),
        };
        match self.cores {
            Some(cores) => format!("{memory} and {cores} cores"),
            None => memory,
        }
    }

    /// The device's class, ignoring the filters.
    fn in_class(&self, device: &Device) -> bool {
        let type_matches = |wanted: &str| text_attribute(device, ATTRIBUTE_TYPE) == Some(wanted);
        match self.class {
            Class::Shared => type_matches(TYPE_GPU) && multi_allocatable(device),
            Class::WholeGpu => type_matches(TYPE_GPU),
            Class::Mig => {
                type_matches(TYPE_MIG)
                    && self.profile.as_deref().is_none_or(|profile| {
                        text_attribute(device, ATTRIBUTE_MIG_PROFILE) == Some(profile)
                    })
            }
        }
    }

    /// HAMi's filters, as [`crate::hami::Selection::admits`] reads them for the webhook too.
    fn passes_filters(&self, device: &Device) -> bool {
        self.selection.admits(
            text_attribute(device, ATTRIBUTE_PRODUCT_NAME).unwrap_or_default(),
            text_attribute(device, ATTRIBUTE_UUID),
        )
    }

    /// The capacities the request names, in bytes or units, for one device.
    fn requested(&self, capacity: &Capacities) -> BTreeMap<&'static str, u64> {
        let mut requested = BTreeMap::new();
        match self.memory {
            Memory::Bytes(bytes) => {
                requested.insert(CAPACITY_MEMORY, bytes);
            }
            // The percentage of this device's memory, rounded down to whole MiB as HAMi does.
            Memory::Percent(percent) => {
                let total = capacity.get(CAPACITY_MEMORY).map_or(0, |c| c.value);
                let bytes = u128::from(total) * u128::from(percent) / 100;
                let bytes = u64::try_from(bytes).unwrap_or(u64::MAX) / MIB * MIB;
                requested.insert(CAPACITY_MEMORY, bytes);
            }
            Memory::Whole => {}
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
    /// What was made of values HAMi tolerates (see [`Request::notes`]).
    pub notes: Vec<String>,
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
            notes: request.notes.clone(),
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
                    product: text_attribute(device.device, ATTRIBUTE_PRODUCT_NAME)
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
                uuid: text_attribute(device.device, ATTRIBUTE_UUID).map(str::to_owned),
                product: text_attribute(device.device, ATTRIBUTE_PRODUCT_NAME).map(str::to_owned),
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
            let product =
                text_attribute(device.device, ATTRIBUTE_PRODUCT_NAME).unwrap_or("(no productName)");
            if !seen.contains(&product) {
                seen.push(product);
            }
        }
        return Unplaced::NoMatch {
            class,
            filters: request.selection.describe(),
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

#[cfg(test)]
mod tests;

//! The Node Feature Discovery labels NVIDIA's operator reads, computed from the host facts, and who owns them.
//!
//! NFD owns the `feature.node.kubernetes.io/` labels wherever it runs: its master lists the labels it manages in
//! the Node annotation `nfd.node.kubernetes.io/feature-labels`, and on such a node this role writes nothing. On
//! other nodes it writes the labels itself and lists them in its own annotation, so that a fact that goes away
//! (a GPU removed) takes its label with it, while labels it never wrote (an admin's) are left alone.

use std::collections::BTreeMap;

use crd::node_patch::MetadataPatch;

use node_runtime::host::{HostFacts, NVIDIA_VENDOR};

/// Prefix of every NFD feature label.
pub const NFD_PREFIX: &str = "feature.node.kubernetes.io/";
/// NFD master's record of the labels it manages on a Node.
pub const NFD_MANAGED_ANNOTATION: &str = "nfd.node.kubernetes.io/feature-labels";
/// This role's record of the labels it wrote (names without the prefix, comma separated, as NFD records them).
pub const OWNED_ANNOTATION: &str = "nvidia.com/node-facts.labels";

/// PCI classes NVIDIA's chart has NFD label (its `deviceClassWhitelist`): network controllers (`02`, any
/// subclass), VGA controllers (`0300`) and 3D controllers (`0302`).
fn labelled_class(class_and_subclass: u32) -> bool {
    class_and_subclass >> 8 == 0x02 || matches!(class_and_subclass, 0x0300 | 0x0302)
}

/// The NFD labels for these facts, by full name: `pci-10de.present` (NVIDIA's chart configures NFD to label by
/// vendor) and `pci-<class>_10de.present` (NFD's default, by class and vendor) for each NVIDIA device of a
/// labelled class; `system-os_release.{ID, VERSION_ID, VERSION_ID.major, VERSION_ID.minor, OSTREE_VERSION}`;
/// `kernel-version.{full, major, minor, revision}`. A value that is not a valid label value is left out, as NFD
/// does.
#[must_use]
pub fn labels(facts: &HostFacts) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut set = |name: String, value: &str| {
        if valid_label_value(value) {
            labels.insert(format!("{NFD_PREFIX}{name}"), value.to_owned());
        }
    };
    for device in facts.pci.iter().filter(|device| {
        device.vendor == NVIDIA_VENDOR && labelled_class(device.class_and_subclass())
    }) {
        set(format!("pci-{NVIDIA_VENDOR:04x}.present"), "true");
        set(
            format!(
                "pci-{:04x}_{NVIDIA_VENDOR:04x}.present",
                device.class_and_subclass()
            ),
            "true",
        );
    }
    for field in ["ID", "VERSION_ID", "OSTREE_VERSION"] {
        if let Some(value) = facts.os_release.get(field) {
            set(format!("system-os_release.{field}"), value);
        }
    }
    if let Some(version) = facts.os_release.get("VERSION_ID") {
        for (part, value) in ["major", "minor"].iter().zip(version_id_numbers(version)) {
            set(format!("system-os_release.VERSION_ID.{part}"), value);
        }
    }
    if let Some(kernel) = &facts.kernel {
        set("kernel-version.full".to_owned(), kernel);
        for (part, value) in ["major", "minor", "revision"]
            .iter()
            .zip(kernel_numbers(kernel))
        {
            set(format!("kernel-version.{part}"), value);
        }
    }
    labels
}

/// `VERSION_ID` split as NFD splits it: the leading number, then the next if it is a number (`22.04` -> [22, 04];
/// `9` -> [9]; `rolling` -> []).
fn version_id_numbers(version: &str) -> Vec<&str> {
    let numeric = |part: &&str| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit());
    version.split('.').take(2).take_while(numeric).collect()
}

/// A kernel release split as NFD splits it: up to three numbers before the first `-` (`5.15.0-119-generic` ->
/// [5, 15, 0]); nothing when that part is not such numbers.
fn kernel_numbers(release: &str) -> Vec<&str> {
    let numbers = release
        .split_once('-')
        .map_or(release, |(numbers, _)| numbers);
    let parts: Vec<&str> = numbers.split('.').collect();
    let numeric = parts
        .iter()
        .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit()));
    if numeric && parts.len() <= 3 {
        parts
    } else {
        Vec::new()
    }
}

/// At most 63 characters of letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit.
fn valid_label_value(value: &str) -> bool {
    let edges_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && edges_ok(value.chars().next())
        && edges_ok(value.chars().last())
}

/// The change that brings a Node to `desired`, or `None` when NFD manages its labels. Sets what differs, removes
/// what this role wrote before and no longer applies, and records what it now owns.
#[must_use]
pub fn patch(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> Option<MetadataPatch> {
    if annotations.contains_key(NFD_MANAGED_ANNOTATION) {
        return None;
    }
    let mut patch = MetadataPatch::default();
    for (key, value) in desired {
        patch = patch.label(key.clone(), value.clone());
    }
    let owned_before = annotations
        .get(OWNED_ANNOTATION)
        .map(String::as_str)
        .unwrap_or_default()
        .split(',')
        .filter(|name| !name.is_empty())
        .map(|name| format!("{NFD_PREFIX}{name}"));
    for key in owned_before.filter(|key| !desired.contains_key(key)) {
        patch.labels.insert(key, None);
    }
    let owned: Vec<&str> = desired
        .keys()
        .filter_map(|key| key.strip_prefix(NFD_PREFIX))
        .collect();
    let record = (!owned.is_empty()).then(|| owned.join(","));
    Some(
        patch
            .annotation(OWNED_ANNOTATION, record)
            .minus(labels, annotations),
    )
}

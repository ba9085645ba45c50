//! The mig-parted config file, version v1: named MIG geometries that nodes select with the
//! `nvidia.com/mig.config` label.
//!
//! ```yaml
//! version: v1
//! mig-configs:
//!   all-balanced:
//!     - device-filter: ["0x20B010DE"]
//!       devices: all
//!       mig-enabled: true
//!       mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
//! ```
//!
//! Each named config is checked on its own, as mig-parted checks only the config it applies: one invalid config
//! never stops the others of the same file from being used. Within a config the format is strict, as mig-parted's
//! own parser is: unknown fields, a missing `devices` or `mig-enabled`, `mig-devices` on a disabled entry and a
//! missing `mig-devices` on an enabled one are errors. Profiles are checked against the MIG catalog where the
//! catalog can speak: for every model an entry's `device-filter` names that the catalog knows. An entry whose
//! filter names only models we do not know, and an entry without a filter, are left to the node, which checks them
//! against the GPU it has; so a config written for a GPU newer than this catalog is never refused here.

mod de;
mod validate;

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::ConfigVersion;
use super::decode::{VersionField, decode};
use super::error::ConfigError;
use crate::mig::MigProfileName;

/// The key of the MIG manager's ConfigMap that holds the mig-parted file, as in NVIDIA's operator.
pub const CONFIG_KEY: &str = "config.yaml";

/// A whole mig-parted config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigPartedConfig {
    /// Always `v1`.
    pub version: ConfigVersion,
    /// Config name -> entries; a GPU takes the entries that apply to it. Sorted by name, so output is stable.
    #[serde(rename = "mig-configs")]
    pub mig_configs: BTreeMap<String, Vec<MigConfigEntry>>,
}

/// One entry of a named config: which GPUs, and what MIG geometry they get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct MigConfigEntry {
    /// The GPUs by index on the node.
    pub devices: DeviceSelector,
    /// PCI device ids the entry is limited to; empty means every model.
    #[serde(
        default,
        deserialize_with = "crate::config::de::one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub device_filter: Vec<PciDeviceId>,
    /// Whether MIG mode is on.
    pub mig_enabled: bool,
    /// Profile -> instance count. `None` when the field is absent; `Some` of an empty map (`{}`) turns MIG on
    /// without creating instances, as the well-known `all-enabled` config does.
    #[serde(
        default,
        deserialize_with = "de::profile_counts",
        skip_serializing_if = "Option::is_none"
    )]
    pub mig_devices: Option<BTreeMap<MigProfileName, u32>>,
}

impl MigConfigEntry {
    /// Whether this entry applies to the GPU with this index on its node and this PCI device id.
    #[must_use]
    pub fn applies_to(&self, gpu_index: u32, pci_device_id: u32) -> bool {
        let index_matches = match &self.devices {
            DeviceSelector::All => true,
            DeviceSelector::Indices(indices) => indices.contains(&gpu_index),
        };
        let model_matches = self.device_filter.is_empty()
            || self.device_filter.contains(&PciDeviceId(pci_device_id));
        index_matches && model_matches
    }
}

impl MigPartedConfig {
    /// The entries of config `name` that apply to one GPU, in file order; `None` when there is no such config.
    #[must_use]
    pub fn entries_for_gpu(
        &self,
        name: &str,
        gpu_index: u32,
        pci_device_id: u32,
    ) -> Option<Vec<&MigConfigEntry>> {
        let entries = self.mig_configs.get(name)?;
        Some(
            entries
                .iter()
                .filter(|entry| entry.applies_to(gpu_index, pci_device_id))
                .collect(),
        )
    }
}

/// `devices: all` or `devices: [0, 1, ...]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceSelector {
    /// Every GPU of the node.
    All,
    /// The GPUs with these indices; distinct, non-empty.
    Indices(Vec<u32>),
}

/// A PCI device id as mig-parted writes it: device in the high 16 bits, vendor in the low (`0x20B010DE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciDeviceId(pub u32);

impl fmt::Display for PciDeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:08X}", self.0)
    }
}

/// A mig-parted config file as read: the named configs that passed every check, and why each other one did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedMigConfig {
    /// The valid named configs; an invalid one is left out, so that nothing can apply it by mistake.
    pub config: MigPartedConfig,
    /// Config name -> its first problem (in document order for type errors, then in entry order).
    pub problems: BTreeMap<String, ConfigError>,
}

impl ParsedMigConfig {
    /// The problem of config `name`, when it is one of the invalid ones.
    #[must_use]
    pub fn problem(&self, name: &str) -> Option<&ConfigError> {
        self.problems.get(name)
    }
}

/// The file with each named config still untyped, so that one config's type error stays that config's problem.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMigPartedConfig {
    version: ConfigVersion,
    #[serde(rename = "mig-configs")]
    mig_configs: BTreeMap<String, serde_json::Value>,
}

/// Parses a mig-parted config from YAML or JSON text, and checks each named config against the format and the MIG
/// catalog.
///
/// # Errors
/// A [`ConfigError`] only for what makes the whole file unusable: YAML syntax, the version, an unknown top-level
/// field, no named configs. A problem inside one named config is in [`ParsedMigConfig::problems`] instead.
pub fn parse(text: &str) -> Result<ParsedMigConfig, ConfigError> {
    let raw: RawMigPartedConfig = decode(text, VersionField::Required)?;
    if raw.mig_configs.is_empty() {
        return Err(ConfigError::invalid(
            "mig-configs",
            "define at least one named config, e.g. all-disabled",
        ));
    }
    let mut parsed = ParsedMigConfig {
        config: MigPartedConfig {
            version: raw.version,
            mig_configs: BTreeMap::new(),
        },
        problems: BTreeMap::new(),
    };
    for (name, value) in raw.mig_configs {
        match named_config(&name, value) {
            Ok(entries) => {
                parsed.config.mig_configs.insert(name, entries);
            }
            Err(problem) => {
                parsed.problems.insert(name, problem);
            }
        }
    }
    Ok(parsed)
}

/// Types and checks the entries of config `name`.
fn named_config(name: &str, value: serde_json::Value) -> Result<Vec<MigConfigEntry>, ConfigError> {
    let path = format!("mig-configs.{name}");
    let entries: Vec<MigConfigEntry> =
        serde_path_to_error::deserialize(value).map_err(|error| {
            let inner = error.path().to_string();
            let located = match inner.as_str() {
                "." => path.clone(),
                index if index.starts_with('[') => format!("{path}{index}"),
                field => format!("{path}.{field}"),
            };
            // serde quotes names with backticks; the rest of our messages use double quotes, as YAML does.
            ConfigError::invalid(located, error.inner().to_string().replace('`', "\""))
        })?;
    validate::validate(name, &path, &entries)?;
    Ok(entries)
}

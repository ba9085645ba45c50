//! A ConfigMap that holds several named device-plugin configs, one per key (`any`, `slice-4`, ...): nodes pick one
//! with the `nvidia.com/device-plugin.config` label.

use std::collections::BTreeMap;

use super::{DevicePluginConfig, parse_tolerant};
use crate::config::{ConfigError, NamedConfigError, label_value_problem};

/// Every config of such a ConfigMap: the good ones by key, and an error for each bad one. Both are kept because
/// one bad key must not take the others down: nodes labelled with a good key keep working while the operator
/// reports the bad one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedConfigMap {
    /// The configs that parsed, by key.
    pub configs: BTreeMap<String, DevicePluginConfig>,
    /// One error per bad key, in key order; displays as `<key>: <path>: <message>`.
    pub errors: Vec<NamedConfigError>,
    /// For each good key whose config has keys this version ignores, their warnings.
    pub warnings: BTreeMap<String, Vec<String>>,
}

/// Parses every value of a ConfigMap's `data` as a device-plugin config.
#[must_use]
pub fn parse_config_map(data: &BTreeMap<String, String>) -> ParsedConfigMap {
    let mut parsed = ParsedConfigMap::default();
    for (key, text) in data {
        let result = match label_value_problem(key) {
            Some(problem) => Err(ConfigError::invalid(
                "",
                format!(
                    "the key cannot be selected with the nvidia.com/device-plugin.config label: {problem}"
                ),
            )),
            None => parse_tolerant(text),
        };
        match result {
            Ok(config) => {
                let warnings = config.warnings();
                if !warnings.is_empty() {
                    parsed.warnings.insert(key.clone(), warnings);
                }
                parsed.configs.insert(key.clone(), config.config);
            }
            Err(error) => parsed.errors.push(NamedConfigError {
                key: key.clone(),
                error,
            }),
        }
    }
    parsed
}

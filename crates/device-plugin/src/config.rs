//! Which device-plugin config a node uses: the key of the ConfigMap that its `nvidia.com/device-plugin.config`
//! label names, else the default key. Pure: the watchers pass in the latest Node label and ConfigMap data.

use std::collections::BTreeMap;

use crd::config::device_plugin::{DevicePluginConfig, parse_tolerant};

/// The config a node runs with, and the key it came from (`None`: the built-in defaults, no ConfigMap).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChosenConfig {
    /// The ConfigMap key, shown in GPUNode status.
    pub name: Option<String>,
    /// The parsed config.
    pub config: DevicePluginConfig,
    /// What the config has that is ignored (unknown keys, as NVIDIA's plugin ignores them).
    pub warnings: Vec<String>,
}

/// Why no config can be chosen; each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChoiceError {
    /// The ConfigMap does not exist (yet).
    #[error("ConfigMap {0} does not exist; create it or change devicePlugin.config.name")]
    NoConfigMap(String),
    /// No label, no default, and not exactly one key to fall back on.
    #[error(
        "the node has no nvidia.com/device-plugin.config label and there is no default config \
         (devicePlugin.config.default); ConfigMap {map} has keys: {keys}"
    )]
    NoKey {
        /// The ConfigMap.
        map: String,
        /// Its keys.
        keys: String,
    },
    /// The chosen key is not in the ConfigMap.
    #[error(
        "ConfigMap {map} has no key \"{key}\" (keys: {keys}); fix the node label or the ConfigMap"
    )]
    MissingKey {
        /// The ConfigMap.
        map: String,
        /// The key asked for.
        key: String,
        /// Its keys.
        keys: String,
    },
    /// The chosen key does not hold a valid config.
    #[error("ConfigMap {map} key \"{key}\": {message}")]
    Invalid {
        /// The ConfigMap.
        map: String,
        /// The key.
        key: String,
        /// The parser's message, with the field's path.
        message: String,
    },
}

/// Chooses and parses the config: the key `label` names, else `default`, else the only key there is (as NVIDIA's
/// plugin does), from the data of ConfigMap `map` (`None` while it does not exist).
///
/// # Errors
/// A [`ChoiceError`]; the caller keeps the last good config.
pub fn choose(
    map: &str,
    data: Option<&BTreeMap<String, String>>,
    label: Option<&str>,
    default: Option<&str>,
) -> Result<ChosenConfig, ChoiceError> {
    let data = data.ok_or_else(|| ChoiceError::NoConfigMap(map.to_owned()))?;
    let keys = || data.keys().cloned().collect::<Vec<_>>().join(", ");
    let key = match label.or(default).filter(|key| !key.is_empty()) {
        Some(key) => key,
        None if data.len() == 1 => data.keys().next().map_or("", String::as_str),
        None => {
            return Err(ChoiceError::NoKey {
                map: map.to_owned(),
                keys: keys(),
            });
        }
    };
    let text = data.get(key).ok_or_else(|| ChoiceError::MissingKey {
        map: map.to_owned(),
        key: key.to_owned(),
        keys: keys(),
    })?;
    let parsed = parse_tolerant(text).map_err(|error| ChoiceError::Invalid {
        map: map.to_owned(),
        key: key.to_owned(),
        message: error.to_string(),
    })?;
    Ok(ChosenConfig {
        name: Some(key.to_owned()),
        warnings: parsed.warnings(),
        config: parsed.config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> BTreeMap<String, String> {
        let shared = |replicas: u32| {
            format!(
                "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
            )
        };
        BTreeMap::from([
            ("slice-4".into(), shared(4)),
            ("slice-10".into(), shared(10)),
            ("broken".into(), "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replica: 4\n".into()),
        ])
    }

    #[test]
    fn the_label_wins_over_the_default() {
        let chosen = choose("cfg", Some(&data()), Some("slice-10"), Some("slice-4")).unwrap();
        assert_eq!(chosen.name.as_deref(), Some("slice-10"));
        let (_, shared) = chosen.config.sharing.as_ref().unwrap().active().unwrap();
        assert_eq!(shared.resources[0].replicas, 10);
        let fallback = choose("cfg", Some(&data()), None, Some("slice-4")).unwrap();
        assert_eq!(fallback.name.as_deref(), Some("slice-4"));
    }

    #[test]
    fn a_single_key_needs_no_label() {
        let single = BTreeMap::from([("any".to_owned(), "version: v1\n".to_owned())]);
        assert_eq!(
            choose("cfg", Some(&single), None, None)
                .unwrap()
                .name
                .as_deref(),
            Some("any")
        );
        assert_eq!(
            choose("cfg", Some(&data()), None, None)
                .unwrap_err()
                .to_string(),
            "the node has no nvidia.com/device-plugin.config label and there is no default config \
             (devicePlugin.config.default); ConfigMap cfg has keys: broken, slice-10, slice-4"
        );
    }

    #[test]
    fn unknown_keys_are_warnings_not_errors() {
        let data = BTreeMap::from([(
            "any".to_owned(),
            "version: v1\nflags:\n  plugin:\n    futureFlag: true\n".to_owned(),
        )]);
        let chosen = choose("cfg", Some(&data), None, None).unwrap();
        assert_eq!(
            chosen.warnings,
            ["flags.plugin.futureFlag: unknown key, ignored"]
        );
    }

    #[test]
    fn errors_name_the_map_and_key() {
        assert_eq!(
            choose("cfg", None, Some("slice-4"), None).unwrap_err(),
            ChoiceError::NoConfigMap("cfg".into())
        );
        assert_eq!(
            choose("cfg", Some(&data()), Some("slice-3"), None)
                .unwrap_err()
                .to_string(),
            "ConfigMap cfg has no key \"slice-3\" (keys: broken, slice-10, slice-4); fix the node label or the ConfigMap"
        );
        let invalid = choose("cfg", Some(&data()), Some("broken"), None)
            .unwrap_err()
            .to_string();
        assert!(
            invalid.starts_with("ConfigMap cfg key \"broken\": "),
            "{invalid}"
        );
        assert!(invalid.contains("replicas"), "{invalid}");
    }
}

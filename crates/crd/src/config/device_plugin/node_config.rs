//! Which device-plugin config a node runs with, and the MIG strategy in effect: the one decision that the device
//! plugin (the resources it advertises), feature discovery (the labels it writes) and the operator (what it checks)
//! share, so that the labels and the advertised resources of a node cannot disagree. Pure: the watchers pass in
//! the latest Node label and ConfigMap data.
//!
//! The config is the ConfigMap key that the node's `nvidia.com/device-plugin.config` label names, else the default
//! key, else the only key there is (as NVIDIA's plugin chooses). A setting that is both a command-line flag and an
//! entry of the file's `flags` follows NVIDIA's precedence: the command line (or the flag's environment variable)
//! when given, else the file, else the flag's default. NVIDIA's k8s-device-plugin decides it in
//! `api/config/v1/config.go` (`NewConfig`: the file is read first, then `Flags.UpdateFromCLIFlags`) and
//! `api/config/v1/flags.go` (`updateFromCLIFlag`: a flag overrides the file's value when it is set, and fills it
//! only when the file has none), for the device plugin and GPU feature discovery alike.

use std::collections::BTreeMap;

use super::{DevicePluginConfig, MigStrategy, Parsed, parse_tolerant};

/// The settings a node binary's command line gives that the file's `flags` also hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandLine {
    /// `--mig-strategy`, when given.
    pub mig_strategy: Option<MigStrategy>,
    /// `--no-timestamp` (feature discovery), when given.
    pub no_timestamp: bool,
}

/// Where a node's config comes from.
#[derive(Debug, Clone, Copy)]
pub struct ConfigInputs<'a> {
    /// The ConfigMap, as `namespace/name` or `name`, for messages.
    pub map: &'a str,
    /// Its data; `None` while it does not exist.
    pub data: Option<&'a BTreeMap<String, String>>,
    /// The node's `nvidia.com/device-plugin.config` label.
    pub label: Option<&'a str>,
    /// The key for nodes without the label (`devicePlugin.config.default`).
    pub default: Option<&'a str>,
}

/// The config a node runs with, the key it came from, and the settings in effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// The ConfigMap key, shown in GPUNode status; `None` for the built-in defaults (no ConfigMap).
    pub name: Option<String>,
    /// The parsed config.
    pub config: DevicePluginConfig,
    /// What the config has that is ignored (unknown keys, as NVIDIA's plugin ignores them).
    pub warnings: Vec<String>,
    /// The MIG strategy in effect.
    pub mig_strategy: MigStrategy,
    /// Whether feature discovery leaves out `nvidia.com/gfd.timestamp`.
    pub no_timestamp: bool,
    /// The GPUs the DRA driver takes on this node ([`crate::dra::partition`]): the device plugin leaves them out.
    pub dra_gpus: crate::dra::GpuSet,
}

impl NodeConfig {
    /// The config `parsed` from key `name`, with the command line's settings over the file's flags (see the
    /// module documentation for the precedence and its source).
    #[must_use]
    pub fn new(name: Option<String>, parsed: Parsed, command_line: CommandLine) -> Self {
        let flags = parsed.config.flags.as_ref();
        let mig_strategy = command_line
            .mig_strategy
            .or_else(|| flags.and_then(|flags| flags.mig_strategy))
            .unwrap_or(MigStrategy::None);
        // A boolean flag is "given" when it is on: `--no-timestamp` cannot be given as false.
        let no_timestamp = command_line.no_timestamp
            || flags
                .and_then(|flags| flags.gfd.as_ref())
                .and_then(|gfd| gfd.no_timestamp)
                .unwrap_or(false);
        Self {
            name,
            warnings: parsed.warnings(),
            config: parsed.config,
            mig_strategy,
            no_timestamp,
            dra_gpus: crate::dra::GpuSet::None,
        }
    }

    /// The config without a ConfigMap: the built-in defaults with the command line's settings.
    #[must_use]
    pub fn built_in(command_line: CommandLine) -> Self {
        Self::new(None, Parsed::default(), command_line)
    }
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

/// Chooses and parses a node's config (the key `label` names, else `default`, else the only key there is) from the
/// ConfigMap's data, and applies the command line's settings over it.
///
/// # Errors
/// A [`ChoiceError`]; the device plugin keeps its last good config, feature discovery reports it.
pub fn node_config(
    inputs: &ConfigInputs<'_>,
    command_line: CommandLine,
) -> Result<NodeConfig, ChoiceError> {
    let map = inputs.map;
    let data = inputs
        .data
        .ok_or_else(|| ChoiceError::NoConfigMap(map.to_owned()))?;
    let keys = || data.keys().cloned().collect::<Vec<_>>().join(", ");
    let key = match inputs
        .label
        .or(inputs.default)
        .filter(|key| !key.is_empty())
    {
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
    Ok(NodeConfig::new(Some(key.to_owned()), parsed, command_line))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config of a node with `label` and a ConfigMap with `data` and `default`, without command-line settings.
    fn choose(
        map: &str,
        data: Option<&BTreeMap<String, String>>,
        label: Option<&str>,
        default: Option<&str>,
    ) -> Result<NodeConfig, ChoiceError> {
        let inputs = ConfigInputs {
            map,
            data,
            label,
            default,
        };
        node_config(&inputs, CommandLine::default())
    }

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

    /// NVIDIA's precedence: the command line when given, else the file's flags, else the default.
    #[test]
    fn the_command_line_wins_over_the_files_flags() {
        let data = BTreeMap::from([
            (
                "flags".to_owned(),
                "version: v1\nflags:\n  migStrategy: mixed\n  gfd:\n    noTimestamp: false\n"
                    .to_owned(),
            ),
            ("plain".to_owned(), "version: v1\n".to_owned()),
        ]);
        let with = |label: &str, command_line: CommandLine| {
            let inputs = ConfigInputs {
                map: "cfg",
                data: Some(&data),
                label: Some(label),
                default: None,
            };
            node_config(&inputs, command_line).unwrap()
        };
        let single = CommandLine {
            mig_strategy: Some(MigStrategy::Single),
            no_timestamp: true,
        };
        let chosen = with("flags", single);
        assert_eq!(
            (chosen.mig_strategy, chosen.no_timestamp),
            (MigStrategy::Single, true)
        );
        let chosen = with("flags", CommandLine::default());
        assert_eq!(
            (chosen.mig_strategy, chosen.no_timestamp),
            (MigStrategy::Mixed, false)
        );
        let chosen = with("plain", CommandLine::default());
        assert_eq!(chosen.mig_strategy, MigStrategy::None, "neither: none");
        let built_in = NodeConfig::built_in(single);
        assert_eq!(
            (built_in.name, built_in.mig_strategy, built_in.no_timestamp),
            (None, MigStrategy::Single, true)
        );
    }
}

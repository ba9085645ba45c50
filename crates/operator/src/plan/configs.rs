//! The ConfigMaps a ClusterPolicy names, checked where users look: a device-plugin or MIG ConfigMap that is
//! missing or does not parse makes its component not ready, with the key, the field and the problem in the
//! status. The node agents keep the last good config on their nodes; this says why a change did not arrive.
//! What does not stop the component (a named MIG config that nodes cannot apply while the file's others can, keys
//! of a device-plugin config that are ignored as NVIDIA ignores them) is a warning of that component instead.

use std::collections::BTreeMap;

use crd::config::device_plugin::{self, ChoiceError, CommandLine, ConfigInputs, node_config};
use crd::config::mig_parted::{self, CONFIG_KEY};
use k8s_openapi::api::core::v1::ConfigMap;

use crate::model::{Component, ValidatedPolicy};

/// What the checks of the ConfigMaps found, by the component that reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigFindings {
    /// What keeps the component from taking its config: it is not ready.
    pub problems: BTreeMap<Component, Vec<String>>,
    /// What the component works around; it stays ready and its status names them.
    pub warnings: BTreeMap<Component, Vec<String>>,
}

impl ConfigFindings {
    fn add(&mut self, component: Component, found: Findings) {
        for (map, lines) in [
            (&mut self.problems, found.problems),
            (&mut self.warnings, found.warnings),
        ] {
            if !lines.is_empty() {
                map.entry(component).or_default().extend(lines);
            }
        }
    }
}

/// The findings about one ConfigMap.
#[derive(Debug, Default)]
struct Findings {
    problems: Vec<String>,
    warnings: Vec<String>,
}

/// Checks the ConfigMaps the policy names. `find` looks a ConfigMap up by name in the operator's namespace.
pub fn config_findings(
    policy: &ValidatedPolicy,
    namespace: &str,
    find: impl Fn(&str) -> Option<ConfigMap>,
) -> ConfigFindings {
    let mut findings = ConfigFindings::default();
    let reference = policy.spec.device_plugin.config.as_ref();
    if let Some(name) = reference
        .and_then(|r| r.name.as_deref())
        .filter(|n| !n.is_empty())
        && policy.is_enabled(Component::DevicePlugin)
    {
        let default = reference
            .and_then(|r| r.default.as_deref())
            .filter(|d| !d.is_empty());
        let found = device_plugin_findings(name, default, namespace, find(name).as_ref());
        findings.add(Component::DevicePlugin, found);
    }
    if policy.is_enabled(Component::MigManager) {
        let name = policy
            .spec
            .mig_manager
            .config
            .clone()
            .unwrap_or_default()
            .config_map_name()
            .to_owned();
        let found = mig_findings(&name, namespace, find(&name).as_ref());
        findings.add(Component::MigManager, found);
    }
    findings
}

fn device_plugin_findings(
    name: &str,
    default: Option<&str>,
    namespace: &str,
    config_map: Option<&ConfigMap>,
) -> Findings {
    let Some(config_map) = config_map else {
        return Findings {
            problems: vec![format!(
                "devicePlugin.config.name: ConfigMap {namespace}/{name} does not exist; create it (one device-plugin config per key) or clear devicePlugin.config.name"
            )],
            warnings: Vec::new(),
        };
    };
    let data = config_map.data.clone().unwrap_or_default();
    let parsed = device_plugin::parse_config_map(&data);
    let mut problems: Vec<String> = parsed
        .errors
        .iter()
        .map(|error| format!("ConfigMap {name} key {error}"))
        .collect();
    // What a node without the label runs with, as its device plugin and feature discovery choose it; a default key
    // that does not parse is already reported with the other keys.
    let unlabelled = ConfigInputs {
        map: name,
        data: Some(&data),
        label: None,
        default,
    };
    if default.is_some()
        && let Err(ChoiceError::MissingKey { key, keys, .. }) =
            node_config(&unlabelled, CommandLine::default())
    {
        problems.push(format!(
            "devicePlugin.config.default: ConfigMap {name} has no key {key:?} (keys: {keys}); add it or pick one of the keys"
        ));
    }
    let warnings = parsed
        .warnings
        .iter()
        .flat_map(|(key, ignored)| {
            ignored
                .iter()
                .map(move |warning| format!("ConfigMap {name} key {key}: {warning}"))
        })
        .collect();
    Findings { problems, warnings }
}

fn mig_findings(name: &str, namespace: &str, config_map: Option<&ConfigMap>) -> Findings {
    let problem = |line: String| Findings {
        problems: vec![line],
        warnings: Vec::new(),
    };
    let Some(config_map) = config_map else {
        return problem(format!(
            "migManager.config.name: ConfigMap {namespace}/{name} does not exist; the chart creates default-mig-parted-config, or create yours with a {CONFIG_KEY} key"
        ));
    };
    match config_map
        .data
        .as_ref()
        .and_then(|data| data.get(CONFIG_KEY))
    {
        None => problem(format!(
            "ConfigMap {name} has no {CONFIG_KEY} key holding the mig-parted config"
        )),
        // One warning per invalid named config, naming it and its entry: nodes that select it fail with the same
        // reason, the file's other configs still apply, so the MIG manager itself is not held up.
        Some(text) => match mig_parted::parse(text) {
            Ok(parsed) => Findings {
                problems: Vec::new(),
                warnings: parsed
                    .problems
                .iter()
                .map(|(config, error)| {
                    format!(
                        "ConfigMap {name} key {CONFIG_KEY}: MIG config {config} cannot be applied (nodes that select \
                         it fail; the other configs apply): {error}"
                    )
                })
                    .collect(),
            },
            Err(error) => problem(format!("ConfigMap {name} key {CONFIG_KEY}: {error}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DefaultImages, validate};
    use crd::ClusterPolicySpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn policy(spec: serde_json::Value) -> ValidatedPolicy {
        let spec: ClusterPolicySpec = serde_json::from_value(spec).unwrap();
        let images = DefaultImages(
            DefaultImages::VARIABLES
                .iter()
                .map(|v| (v.to_string(), format!("x/{v}:1")))
                .collect(),
        );
        validate(&spec, &images).unwrap()
    }

    fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ConfigMap::default()
        }
    }

    const SLICE_1: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n";
    const SLICE_4: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";

    #[test]
    fn missing_and_invalid_config_maps_are_named_with_the_fix() {
        let policy = policy(
            serde_json::json!({"devicePlugin": {"config": {"name": "sharing", "default": "any"}}}),
        );
        let problems = config_findings(&policy, "gpu-operator", |_| None).problems;
        assert_eq!(
            problems[&Component::DevicePlugin],
            [
                "devicePlugin.config.name: ConfigMap gpu-operator/sharing does not exist; create it (one device-plugin config per key) or clear devicePlugin.config.name"
            ]
        );
        assert!(problems[&Component::MigManager][0].starts_with("migManager.config.name: ConfigMap gpu-operator/default-mig-parted-config does not exist"));

        let sharing = config_map("sharing", &[("slice-1", SLICE_1), ("slice-4", SLICE_4)]);
        let mig = config_map(
            "default-mig-parted-config",
            &[("config.yaml", crd::mig::DEFAULT_MIG_CONFIG)],
        );
        let find = |name: &str| {
            [&sharing, &mig]
                .into_iter()
                .find(|cm| cm.metadata.name.as_deref() == Some(name))
                .cloned()
        };
        let problems = config_findings(&policy, "gpu-operator", find).problems;
        assert_eq!(
            problems[&Component::DevicePlugin],
            [
                "ConfigMap sharing key slice-1: sharing.timeSlicing.resources[0].replicas: 1 is too small, replicas must be at least 2 (use 2 or more, or remove the sharing entry)",
                "devicePlugin.config.default: ConfigMap sharing has no key \"any\" (keys: slice-1, slice-4); add it or pick one of the keys",
            ]
        );
        assert!(
            !problems.contains_key(&Component::MigManager),
            "the default MIG config parses"
        );
    }

    #[test]
    fn a_broken_mig_config_is_reported() {
        let policy = policy(serde_json::json!({}));
        let mig = config_map(
            "default-mig-parted-config",
            &[("config.yaml", "version: v1\nmig-configs: {}\n")],
        );
        let problems = config_findings(&policy, "gpu-operator", |_| Some(mig.clone())).problems;
        assert_eq!(
            problems[&Component::MigManager],
            [
                "ConfigMap default-mig-parted-config key config.yaml: mig-configs: define at least one named config, e.g. all-disabled"
            ]
        );
    }

    /// Each invalid named config is a warning naming it and its entry; the valid ones of the same file are not
    /// reported, and the MIG manager is not held up.
    #[test]
    fn invalid_mig_configs_are_warnings_one_by_one() {
        let policy = policy(serde_json::json!({}));
        let mig = config_map(
            "default-mig-parted-config",
            &[(
                "config.yaml",
                "version: v1\nmig-configs:\n  all-disabled:\n  - devices: all\n    mig-enabled: false\n  x:\n  - devices: all\n    mig-enabled: false\n  - device-filter: \"0x20B010DE\"\n    devices: all\n    mig-enabled: true\n    mig-devices: {\"3g.25gb\": 1}\n  y:\n  - devices: all\n",
            )],
        );
        let findings = config_findings(&policy, "gpu-operator", |_| Some(mig.clone()));
        assert!(findings.problems.is_empty(), "{findings:?}");
        assert_eq!(
            findings.warnings[&Component::MigManager],
            [
                "ConfigMap default-mig-parted-config key config.yaml: MIG config x cannot be applied (nodes that select it fail; the other configs apply): mig-configs.x[1].mig-devices: unknown profile \"3g.25gb\" for NVIDIA A100-SXM4-40GB (known profiles: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)",
                "ConfigMap default-mig-parted-config key config.yaml: MIG config y cannot be applied (nodes that select it fail; the other configs apply): mig-configs.y[0]: missing field \"mig-enabled\"",
            ]
        );
    }

    /// Keys NVIDIA's device plugin ignores are warnings naming the ConfigMap and key, not problems.
    #[test]
    fn ignored_device_plugin_keys_are_warnings() {
        let policy = policy(serde_json::json!({"devicePlugin": {"config": {"name": "sharing"}}}));
        let sharing = config_map(
            "sharing",
            &[(
                "any",
                "version: v1\nflags:\n  plugin:\n    futureFlag: true\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
            )],
        );
        let findings = config_findings(&policy, "gpu-operator", |_| Some(sharing.clone()));
        assert!(
            !findings.problems.contains_key(&Component::DevicePlugin),
            "{findings:?}"
        );
        let warnings = &findings.warnings[&Component::DevicePlugin];
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("ConfigMap sharing key any: ")
                && warnings[0].contains("futureFlag"),
            "{warnings:?}"
        );
    }

    /// NVIDIA's own default file has no problem at all.
    #[test]
    fn nvidias_default_mig_config_is_clean() {
        let policy = policy(serde_json::json!({}));
        let mig = config_map(
            "default-mig-parted-config",
            &[(
                "config.yaml",
                include_str!("../../../../tests/fixtures/nvidia/default-mig-parted-config.yaml"),
            )],
        );
        let findings = config_findings(&policy, "gpu-operator", |_| Some(mig.clone()));
        assert_eq!(findings, ConfigFindings::default());
    }
}

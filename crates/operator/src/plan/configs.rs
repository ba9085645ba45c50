//! The ConfigMaps a ClusterPolicy names, checked where users look: a device-plugin or MIG ConfigMap that is
//! missing or does not parse makes its component not ready, with the key, the field and the problem in the
//! status. The node agents keep the last good config on their nodes; this says why a change did not arrive.

use std::collections::BTreeMap;

use crd::config::{device_plugin, mig_parted};
use k8s_openapi::api::core::v1::ConfigMap;

use crate::model::{Component, ValidatedPolicy};

/// The key of the MIG manager's ConfigMap that holds the mig-parted file.
pub const MIG_CONFIG_KEY: &str = "config.yaml";

/// Problems with the ConfigMaps the policy names, by the component that reads them. `find` looks a ConfigMap up
/// by name in the operator's namespace.
pub fn config_problems(
    policy: &ValidatedPolicy,
    namespace: &str,
    find: impl Fn(&str) -> Option<ConfigMap>,
) -> BTreeMap<Component, Vec<String>> {
    let mut problems: BTreeMap<Component, Vec<String>> = BTreeMap::new();
    let reference = policy.spec.device_plugin.config.as_ref();
    if let Some(name) = reference
        .and_then(|r| r.name.as_deref())
        .filter(|n| !n.is_empty())
        && policy.is_enabled(Component::DevicePlugin)
    {
        let default = reference
            .and_then(|r| r.default.as_deref())
            .filter(|d| !d.is_empty());
        let found = device_plugin_problems(name, default, namespace, find(name).as_ref());
        problems
            .entry(Component::DevicePlugin)
            .or_default()
            .extend(found);
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
        let found = mig_problems(&name, namespace, find(&name).as_ref());
        problems
            .entry(Component::MigManager)
            .or_default()
            .extend(found);
    }
    problems.retain(|_, found| !found.is_empty());
    problems
}

fn device_plugin_problems(
    name: &str,
    default: Option<&str>,
    namespace: &str,
    config_map: Option<&ConfigMap>,
) -> Vec<String> {
    let Some(config_map) = config_map else {
        return vec![format!(
            "devicePlugin.config.name: ConfigMap {namespace}/{name} does not exist; create it (one device-plugin config per key) or clear devicePlugin.config.name"
        )];
    };
    let data = config_map.data.clone().unwrap_or_default();
    let parsed = device_plugin::parse_config_map(&data);
    let mut problems: Vec<String> = parsed
        .errors
        .iter()
        .map(|error| format!("ConfigMap {name} key {error}"))
        .collect();
    if let Some(default) = default
        && !data.contains_key(default)
    {
        let keys = data
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        problems.push(format!(
            "devicePlugin.config.default: ConfigMap {name} has no key {default:?} (keys: {keys}); add it or pick one of the keys"
        ));
    }
    problems
}

fn mig_problems(name: &str, namespace: &str, config_map: Option<&ConfigMap>) -> Vec<String> {
    let Some(config_map) = config_map else {
        return vec![format!(
            "migManager.config.name: ConfigMap {namespace}/{name} does not exist; the chart creates default-mig-parted-config, or create yours with a {MIG_CONFIG_KEY} key"
        )];
    };
    match config_map
        .data
        .as_ref()
        .and_then(|data| data.get(MIG_CONFIG_KEY))
    {
        None => vec![format!(
            "ConfigMap {name} has no {MIG_CONFIG_KEY} key holding the mig-parted config"
        )],
        // One line per invalid named config, naming it and its entry: nodes that select it fail with the same
        // reason, the file's other configs still apply.
        Some(text) => match mig_parted::parse(text) {
            Ok(parsed) => parsed
                .problems
                .iter()
                .map(|(config, error)| {
                    format!(
                        "ConfigMap {name} key {MIG_CONFIG_KEY}: MIG config {config} cannot be applied (nodes that select \
                         it fail; the other configs apply): {error}"
                    )
                })
                .collect(),
            Err(error) => vec![format!("ConfigMap {name} key {MIG_CONFIG_KEY}: {error}")],
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
        let problems = config_problems(&policy, "gpu-operator", |_| None);
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
        let problems = config_problems(&policy, "gpu-operator", find);
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
        let problems = config_problems(&policy, "gpu-operator", |_| Some(mig.clone()));
        assert_eq!(
            problems[&Component::MigManager],
            [
                "ConfigMap default-mig-parted-config key config.yaml: mig-configs: define at least one named config, e.g. all-disabled"
            ]
        );
    }

    /// Each invalid named config is reported by name and entry; the valid ones of the same file are not.
    #[test]
    fn invalid_mig_configs_are_reported_one_by_one() {
        let policy = policy(serde_json::json!({}));
        let mig = config_map(
            "default-mig-parted-config",
            &[(
                "config.yaml",
                "version: v1\nmig-configs:\n  all-disabled:\n  - devices: all\n    mig-enabled: false\n  x:\n  - devices: all\n    mig-enabled: false\n  - device-filter: \"0x20B010DE\"\n    devices: all\n    mig-enabled: true\n    mig-devices: {\"3g.25gb\": 1}\n  y:\n  - devices: all\n",
            )],
        );
        let problems = config_problems(&policy, "gpu-operator", |_| Some(mig.clone()));
        assert_eq!(
            problems[&Component::MigManager],
            [
                "ConfigMap default-mig-parted-config key config.yaml: MIG config x cannot be applied (nodes that select it fail; the other configs apply): mig-configs.x[1].mig-devices: unknown profile \"3g.25gb\" for NVIDIA A100-SXM4-40GB (known profiles: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)",
                "ConfigMap default-mig-parted-config key config.yaml: MIG config y cannot be applied (nodes that select it fail; the other configs apply): mig-configs.y[0]: missing field \"mig-enabled\"",
            ]
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
        let problems = config_problems(&policy, "gpu-operator", |_| Some(mig.clone()));
        assert!(
            !problems.contains_key(&Component::MigManager),
            "{problems:?}"
        );
    }
}

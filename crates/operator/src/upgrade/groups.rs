//! Which upgrade policy governs which driver DaemonSets: an NVIDIADriver's own `upgradePolicy` governs the
//! DaemonSets rendered from it; the ClusterPolicy's `driver.upgradePolicy` governs every other driver DaemonSet
//! (the ClusterPolicy's own, and an NVIDIADriver's without a policy). Each group is planned on its own, so that its
//! `maxParallelUpgrades` and `maxUnavailable` count its own nodes, as each NVIDIADriver's policy does in NVIDIA's
//! operator.

use std::sync::Arc;

use crd::cluster_policy::DriverUpgradePolicySpec;
use crd::nvidia_driver::NVIDIADriver;
use kube::ResourceExt;

use super::facts::OwnedDaemonSet;
use crate::render::NVIDIA_DRIVER_LABEL;

/// The object whose upgrade policy governs a group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Governor {
    ClusterPolicy,
    NvidiaDriver(String),
}

/// Driver DaemonSets under one upgrade policy.
#[derive(Debug)]
pub struct Group<'a> {
    pub governor: Governor,
    /// The policy; `None` is NVIDIA's default (no automatic upgrade).
    pub spec: Option<&'a DriverUpgradePolicySpec>,
    pub drivers: Vec<OwnedDaemonSet<'a>>,
}

/// The groups: the ClusterPolicy's first (always present: nodes whose driver DaemonSet is gone are its), then one
/// per NVIDIADriver with a policy and DaemonSets, by name.
#[must_use]
pub fn group<'a>(
    cluster_policy: Option<&'a DriverUpgradePolicySpec>,
    drivers: Vec<OwnedDaemonSet<'a>>,
    objects: &'a [Arc<NVIDIADriver>],
) -> Vec<Group<'a>> {
    let mut groups = vec![Group {
        governor: Governor::ClusterPolicy,
        spec: cluster_policy,
        drivers: Vec::new(),
    }];
    for driver in drivers {
        let own_policy = driver
            .daemonset
            .labels()
            .get(NVIDIA_DRIVER_LABEL)
            .and_then(|name| objects.iter().find(|object| &object.name_any() == name))
            .and_then(|object| {
                let spec = object.spec.upgrade_policy.as_ref()?;
                Some((object.name_any(), spec))
            });
        let (governor, spec) = match own_policy {
            Some((name, spec)) => (Governor::NvidiaDriver(name), Some(spec)),
            None => (Governor::ClusterPolicy, cluster_policy),
        };
        match groups.iter_mut().find(|group| group.governor == governor) {
            Some(group) => group.drivers.push(driver),
            None => groups.push(Group {
                governor,
                spec,
                drivers: vec![driver],
            }),
        }
    }
    groups.sort_by(|a, b| a.governor.cmp(&b.governor));
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crd::nvidia_driver::NvidiaDriverSpec;
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    fn daemonset(name: &str, object: Option<&str>) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: object.map(|o| [(NVIDIA_DRIVER_LABEL.to_owned(), o.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..DaemonSet::default()
        }
    }

    fn object(name: &str, max_parallel: Option<i32>) -> Arc<NVIDIADriver> {
        let spec = NvidiaDriverSpec {
            upgrade_policy: max_parallel.map(|n| {
                serde_json::from_value(json!({"autoUpgrade": true, "maxParallelUpgrades": n}))
                    .unwrap()
            }),
            ..serde_json::from_value(json!({"image": "driver"})).unwrap()
        };
        Arc::new(NVIDIADriver::new(name, spec))
    }

    #[test]
    fn an_nvidia_driver_with_a_policy_governs_its_daemonsets_and_the_cluster_policy_the_rest() {
        let pools = [
            daemonset("nvidia-driver-daemonset-ubuntu22.04", None),
            daemonset("nvidia-gpu-driver-a100-ubuntu22.04", Some("a100")),
            daemonset("nvidia-gpu-driver-h100-ubuntu22.04", Some("h100")),
            daemonset("nvidia-gpu-driver-h100-rhel9.4", Some("h100")),
        ];
        let objects = [object("a100", None), object("h100", Some(4))];
        let cluster: DriverUpgradePolicySpec = serde_json::from_value(json!({})).unwrap();
        let drivers = pools
            .iter()
            .map(|daemonset| OwnedDaemonSet {
                daemonset,
                revision: Some("r1".into()),
            })
            .collect();
        let groups = group(Some(&cluster), drivers, &objects);
        let names = |group: &Group<'_>| -> Vec<String> {
            group
                .drivers
                .iter()
                .map(|d| d.daemonset.name_any())
                .collect()
        };
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].governor, Governor::ClusterPolicy);
        assert_eq!(
            names(&groups[0]),
            [
                "nvidia-driver-daemonset-ubuntu22.04",
                "nvidia-gpu-driver-a100-ubuntu22.04"
            ],
            "a100 has no policy of its own"
        );
        assert_eq!(groups[1].governor, Governor::NvidiaDriver("h100".into()));
        assert_eq!(groups[1].spec.unwrap().max_parallel_upgrades, 4);
        assert_eq!(names(&groups[1]).len(), 2, "both OS pools of h100");
    }

    #[test]
    fn the_cluster_policy_group_exists_without_daemonsets() {
        let groups = group(None, Vec::new(), &[]);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].governor, Governor::ClusterPolicy);
    }
}

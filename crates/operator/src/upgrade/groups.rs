//! Which upgrade policy governs which driver DaemonSets: an NVIDIADriver's `upgradePolicy` (NVIDIA's default for
//! the type where unset) governs the DaemonSets rendered from it; the ClusterPolicy's `driver.upgradePolicy`
//! governs its own. Each group is planned on its own, so that its `maxParallelUpgrades` and `maxUnavailable` count
//! its own nodes, as each NVIDIADriver's policy does in NVIDIA's operator.

use std::sync::Arc;

use crd::cluster_policy::DriverUpgradePolicySpec;
use crd::nvidia_driver::NVIDIADriver;
use kube::ResourceExt;

use super::facts::OwnedDaemonSet;
use crd::labels::DRIVER_OWNER;

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
    /// The policy; `None` is the ClusterPolicy's default (no automatic upgrade).
    pub spec: Option<DriverUpgradePolicySpec>,
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
        spec: cluster_policy.cloned(),
        drivers: Vec::new(),
    }];
    for driver in drivers {
        let object = driver
            .daemonset
            .labels()
            .get(DRIVER_OWNER)
            .and_then(|name| objects.iter().find(|object| &object.name_any() == name));
        // A DaemonSet whose object is gone is about to be pruned; until then the ClusterPolicy's policy holds it.
        let (governor, spec) = match object {
            Some(object) => (
                Governor::NvidiaDriver(object.name_any()),
                Some(object.spec.upgrade_policy_or_default()),
            ),
            None => (Governor::ClusterPolicy, cluster_policy.cloned()),
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
                labels: object.map(|o| [(DRIVER_OWNER.to_owned(), o.to_owned())].into()),
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
    fn each_nvidia_driver_governs_its_daemonsets_with_its_policy_or_nvidias_default() {
        let pools = [
            daemonset("nvidia-driver-daemonset-ubuntu22.04", None),
            daemonset("nvidia-gpu-driver-a100-ubuntu22.04", Some("a100")),
            daemonset("nvidia-gpu-driver-h100-ubuntu22.04", Some("h100")),
            daemonset("nvidia-gpu-driver-h100-rhel9.4", Some("h100")),
            daemonset("nvidia-gpu-driver-deleted-ubuntu22.04", Some("deleted")),
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
        let governors: Vec<&Governor> = groups.iter().map(|g| &g.governor).collect();
        assert_eq!(
            governors,
            [
                &Governor::ClusterPolicy,
                &Governor::NvidiaDriver("a100".into()),
                &Governor::NvidiaDriver("h100".into())
            ]
        );
        assert_eq!(
            names(&groups[0]),
            [
                "nvidia-driver-daemonset-ubuntu22.04",
                "nvidia-gpu-driver-deleted-ubuntu22.04"
            ],
            "the ClusterPolicy's own, and one whose object is gone"
        );
        assert!(!groups[0].spec.as_ref().unwrap().auto_upgrade);
        let a100 = groups[1].spec.as_ref().unwrap();
        assert!(
            a100.auto_upgrade && a100.max_parallel_upgrades == 1,
            "NVIDIA's default for an NVIDIADriver: {a100:?}"
        );
        assert_eq!(groups[2].spec.as_ref().unwrap().max_parallel_upgrades, 4);
        assert_eq!(names(&groups[2]).len(), 2, "both OS pools of h100");
    }

    #[test]
    fn the_cluster_policy_group_exists_without_daemonsets() {
        let groups = group(None, Vec::new(), &[]);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].governor, Governor::ClusterPolicy);
    }
}

//! `driver.upgradePolicy` as the upgrade controller uses it: checked once per pass, with each bad field named.

use std::time::Duration;

use crd::cluster_policy::DriverUpgradePolicySpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The checked upgrade policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `autoUpgrade`: nodes whose driver pod runs an old revision are upgraded.
    pub auto_upgrade: bool,
    /// `maxParallelUpgrades`; `None` for 0, no limit.
    pub max_parallel: Option<usize>,
    /// `maxUnavailable`.
    pub max_unavailable: MaxUnavailable,
    /// `waitForCompletion`, when it names a pod selector.
    pub wait_for_completion: Option<WaitForCompletion>,
    /// `podDeletion`: how the pods that use the GPUs are evicted.
    pub pod_deletion: Eviction,
    /// `drain`, when enabled.
    pub drain: Option<Drain>,
    /// How long the new driver pod may take to become ready after the old one is deleted (not in NVIDIA's
    /// policy: the operator's own setting, since a driver build can take its startup probe's 21 minutes).
    pub restart_timeout: Duration,
    /// How long the validator may take to pass the new driver (the operator's own setting).
    pub validation_timeout: Duration,
}

/// `maxUnavailable`: a number of nodes or a percentage of the GPU nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnavailable {
    /// A number of nodes.
    Nodes(usize),
    /// A percentage of the GPU nodes the upgrade manages, rounded up as NVIDIA's operator rounds it.
    Percent(u32),
}

impl MaxUnavailable {
    /// How many of `total` nodes may be unavailable at once.
    #[must_use]
    pub fn of(self, total: usize) -> usize {
        match self {
            Self::Nodes(nodes) => nodes,
            Self::Percent(percent) => (total * percent as usize).div_ceil(100),
        }
    }
}

/// `waitForCompletion`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitForCompletion {
    /// The label selector of the pods to wait for.
    pub pod_selector: String,
    /// How long to wait before evicting them anyway; `None` waits until they finish.
    pub timeout: Option<Duration>,
}

/// `podDeletion`: the eviction of the pods that use the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eviction {
    /// Evict pods that no controller manages (they are not made again).
    pub force: bool,
    /// How long the pods may take to go; `None` waits until they are gone.
    pub timeout: Option<Duration>,
    /// Evict pods with emptyDir volumes, whose data is lost.
    pub delete_empty_dir: bool,
}

/// `drain`, when `enable` is true.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    /// Evict pods that no controller manages.
    pub force: bool,
    /// Only pods matching this label selector are drained.
    pub pod_selector: Option<String>,
    /// How long the drain may take; `None` waits until it is done.
    pub timeout: Option<Duration>,
    /// Evict pods with emptyDir volumes.
    pub delete_empty_dir: bool,
}

impl Drain {
    /// The drain's eviction rules.
    #[must_use]
    pub fn eviction(&self) -> Eviction {
        Eviction {
            force: self.force,
            timeout: self.timeout,
            delete_empty_dir: self.delete_empty_dir,
        }
    }
}

/// The operator's own timeouts of the steps NVIDIA's policy gives none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepTimeouts {
    /// See [`Settings::restart_timeout`].
    pub restart: Duration,
    /// See [`Settings::validation_timeout`].
    pub validation: Duration,
}

impl Default for StepTimeouts {
    fn default() -> Self {
        Self {
            restart: Duration::from_secs(30 * 60),
            validation: Duration::from_secs(10 * 60),
        }
    }
}

/// A field of `driver.upgradePolicy` the controller cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "driver.upgradePolicy.maxParallelUpgrades is {0}; it must be 0 (no limit) or a positive number of nodes"
    )]
    MaxParallel(i32),
    #[error(
        "driver.upgradePolicy.maxUnavailable is {0:?}; it must be a number of nodes such as 1 or a percentage such as 25%"
    )]
    MaxUnavailable(String),
    #[error(
        "driver.upgradePolicy.{field} is {value}; it must be 0 (no timeout) or a positive number of seconds"
    )]
    Timeout { field: &'static str, value: i32 },
}

impl Settings {
    /// The settings of `spec` (NVIDIA's defaults where it is absent).
    ///
    /// # Errors
    /// A field out of range, named by its path in the ClusterPolicy.
    pub fn from_spec(
        spec: Option<&DriverUpgradePolicySpec>,
        steps: StepTimeouts,
    ) -> Result<Self, SettingsError> {
        let Some(spec) = spec else {
            return Ok(Self::off(steps));
        };
        let max_parallel = match spec.max_parallel_upgrades {
            0 => None,
            n if n > 0 => Some(n as usize),
            n => return Err(SettingsError::MaxParallel(n)),
        };
        let wait_for_completion = match &spec.wait_for_completion {
            Some(wait) => match wait.pod_selector.as_deref().map(str::trim) {
                Some(selector) if !selector.is_empty() => Some(WaitForCompletion {
                    pod_selector: selector.to_owned(),
                    timeout: timeout("waitForCompletion.timeoutSeconds", wait.timeout_seconds)?,
                }),
                _ => None,
            },
            None => None,
        };
        let pod_deletion = match &spec.pod_deletion {
            Some(deletion) => Eviction {
                force: deletion.force,
                timeout: timeout("podDeletion.timeoutSeconds", deletion.timeout_seconds)?,
                delete_empty_dir: deletion.delete_empty_dir,
            },
            None => Eviction::default(),
        };
        let drain = match &spec.drain {
            Some(drain) if drain.enable => Some(Drain {
                force: drain.force,
                pod_selector: drain
                    .pod_selector
                    .as_deref()
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
                timeout: timeout("drain.timeoutSeconds", drain.timeout_seconds)?,
                delete_empty_dir: drain.delete_empty_dir,
            }),
            _ => None,
        };
        Ok(Self {
            auto_upgrade: spec.auto_upgrade,
            max_parallel,
            max_unavailable: max_unavailable(&spec.max_unavailable)?,
            wait_for_completion,
            pod_deletion,
            drain,
            restart_timeout: steps.restart,
            validation_timeout: steps.validation,
        })
    }

    /// No upgrade policy: automatic upgrades off, NVIDIA's defaults otherwise.
    fn off(steps: StepTimeouts) -> Self {
        Self {
            auto_upgrade: false,
            max_parallel: Some(1),
            max_unavailable: MaxUnavailable::Percent(25),
            wait_for_completion: None,
            pod_deletion: Eviction::default(),
            drain: None,
            restart_timeout: steps.restart,
            validation_timeout: steps.validation,
        }
    }
}

impl Default for Eviction {
    /// NVIDIA's defaults: no force, 300 seconds, emptyDir pods kept.
    fn default() -> Self {
        Self {
            force: false,
            timeout: Some(Duration::from_secs(300)),
            delete_empty_dir: false,
        }
    }
}

/// A timeout in seconds; 0 is none.
fn timeout(field: &'static str, seconds: i32) -> Result<Option<Duration>, SettingsError> {
    match u64::try_from(seconds) {
        Ok(0) => Ok(None),
        Ok(seconds) => Ok(Some(Duration::from_secs(seconds))),
        Err(_) => Err(SettingsError::Timeout {
            field,
            value: seconds,
        }),
    }
}

/// `maxUnavailable`: a non-negative number, a string of digits (that number), or digits and `%` up to 100%.
fn max_unavailable(value: &IntOrString) -> Result<MaxUnavailable, SettingsError> {
    let bad = || {
        SettingsError::MaxUnavailable(match value {
            IntOrString::Int(n) => n.to_string(),
            IntOrString::String(s) => s.clone(),
        })
    };
    match value {
        IntOrString::Int(n) => usize::try_from(*n)
            .map(MaxUnavailable::Nodes)
            .map_err(|_| bad()),
        IntOrString::String(text) => {
            let text = text.trim();
            if let Some(percent) = text.strip_suffix('%') {
                percent
                    .parse::<u32>()
                    .ok()
                    .filter(|p| *p <= 100)
                    .map(MaxUnavailable::Percent)
                    .ok_or_else(bad)
            } else {
                text.parse::<usize>()
                    .map(MaxUnavailable::Nodes)
                    .map_err(|_| bad())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings(policy: serde_json::Value) -> Result<Settings, SettingsError> {
        let spec: DriverUpgradePolicySpec = serde_json::from_value(policy).unwrap();
        Settings::from_spec(Some(&spec), StepTimeouts::default())
    }

    #[test]
    fn nvidias_defaults_apply_to_an_empty_policy() {
        let s = settings(json!({"autoUpgrade": true})).unwrap();
        assert!(s.auto_upgrade);
        assert_eq!(s.max_parallel, Some(1));
        assert_eq!(s.max_unavailable, MaxUnavailable::Percent(25));
        assert_eq!(s.pod_deletion, Eviction::default());
        assert_eq!(s.pod_deletion.timeout, Some(Duration::from_secs(300)));
        assert_eq!(s.wait_for_completion, None);
        assert_eq!(s.drain, None);
        assert!(
            !Settings::from_spec(None, StepTimeouts::default())
                .unwrap()
                .auto_upgrade
        );
    }

    #[test]
    fn every_field_is_read() {
        let s = settings(json!({
            "autoUpgrade": true, "maxParallelUpgrades": 0, "maxUnavailable": 3,
            "waitForCompletion": {"podSelector": "app=training", "timeoutSeconds": 0},
            "podDeletion": {"force": true, "timeoutSeconds": 60, "deleteEmptyDir": true},
            "drain": {"enable": true, "force": true, "podSelector": "tier=batch", "timeoutSeconds": 90, "deleteEmptyDir": true}
        }))
        .unwrap();
        assert_eq!(s.max_parallel, None, "0 is no limit");
        assert_eq!(s.max_unavailable, MaxUnavailable::Nodes(3));
        assert_eq!(
            s.wait_for_completion,
            Some(WaitForCompletion {
                pod_selector: "app=training".into(),
                timeout: None
            })
        );
        assert_eq!(
            s.pod_deletion,
            Eviction {
                force: true,
                timeout: Some(Duration::from_secs(60)),
                delete_empty_dir: true
            }
        );
        let drain = s.drain.unwrap();
        assert_eq!(drain.pod_selector.as_deref(), Some("tier=batch"));
        assert_eq!(drain.timeout, Some(Duration::from_secs(90)));
        assert!(drain.force && drain.delete_empty_dir);
        let disabled = settings(json!({"drain": {"enable": false, "force": true}})).unwrap();
        assert_eq!(disabled.drain, None);
        let empty_selector = settings(json!({"waitForCompletion": {"podSelector": " "}})).unwrap();
        assert_eq!(empty_selector.wait_for_completion, None);
    }

    #[test]
    fn percentages_round_up_and_numbers_are_nodes() {
        assert_eq!(MaxUnavailable::Percent(25).of(10), 3);
        assert_eq!(MaxUnavailable::Percent(25).of(4), 1);
        assert_eq!(MaxUnavailable::Percent(100).of(7), 7);
        assert_eq!(MaxUnavailable::Percent(0).of(7), 0);
        assert_eq!(MaxUnavailable::Nodes(2).of(100), 2);
        assert_eq!(
            settings(json!({"maxUnavailable": "4"}))
                .unwrap()
                .max_unavailable,
            MaxUnavailable::Nodes(4)
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let error = settings(json!({"maxUnavailable": "a quarter"})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "driver.upgradePolicy.maxUnavailable is \"a quarter\"; it must be a number of nodes such as 1 or a percentage such as 25%"
        );
        assert!(matches!(
            settings(json!({"maxUnavailable": "150%"})),
            Err(SettingsError::MaxUnavailable(_))
        ));
        assert!(matches!(
            settings(json!({"maxUnavailable": -1})),
            Err(SettingsError::MaxUnavailable(_))
        ));
        assert_eq!(
            settings(json!({"maxParallelUpgrades": -2})).unwrap_err(),
            SettingsError::MaxParallel(-2)
        );
        assert_eq!(
            settings(json!({"drain": {"enable": true, "timeoutSeconds": -5}}))
                .unwrap_err()
                .to_string(),
            "driver.upgradePolicy.drain.timeoutSeconds is -5; it must be 0 (no timeout) or a positive number of seconds"
        );
    }
}

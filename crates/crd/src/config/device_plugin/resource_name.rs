//! Extended resource names the device plugin advertises (`nvidia.com/gpu`, `nvidia.com/mig-1g.5gb`, ...).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::mig::MigProfileName;

/// The domain of every resource the device plugin advertises.
const PREFIX: &str = "nvidia.com/";
/// Kubernetes' limit on a fully qualified resource name, which NVIDIA's plugin applies to the whole name.
const MAX_LENGTH: usize = 63;
/// What renameByDefault appends to a shared resource's name.
const SHARED_SUFFIX: &str = ".shared";

/// A valid `nvidia.com/<name>` resource name.
///
/// Like NVIDIA's plugin, a bare `<name>` in a config means `nvidia.com/<name>`; the value always holds the full
/// name. Another domain is refused: the plugin only serves `nvidia.com`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ResourceName(String);

impl ResourceName {
    /// The full name, e.g. `nvidia.com/gpu`.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part after `nvidia.com/`, e.g. `gpu`.
    #[must_use]
    pub fn short_name(&self) -> &str {
        &self.0[PREFIX.len()..]
    }

    /// `<name>.shared`, the name renameByDefault advertises a shared resource under.
    ///
    /// # Errors
    /// When the suffix makes the name longer than Kubernetes allows.
    pub fn shared(&self) -> Result<Self, ResourceNameError> {
        format!("{}{SHARED_SUFFIX}", self.0).parse()
    }
}

/// Why a string is not a resource name the device plugin can advertise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid resource name \"{0}\" (expected nvidia.com/<name>, where <name> is lowercase letters, digits, '-' and \
     '.', starts and ends with a letter or digit, and the whole is at most 63 characters, e.g. nvidia.com/gpu)"
)]
pub struct ResourceNameError(String);

impl FromStr for ResourceName {
    type Err = ResourceNameError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let full = if text.starts_with(PREFIX) {
            text.to_owned()
        } else {
            format!("{PREFIX}{text}")
        };
        let name = &full[PREFIX.len()..];
        // A DNS-1123 subdomain: dot-separated labels of [a-z0-9-] that start and end alphanumeric.
        let labels_valid = name.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && bytes
                    .iter()
                    .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || *byte == b'-')
                && bytes[0] != b'-'
                && bytes[bytes.len() - 1] != b'-'
        });
        if labels_valid && full.len() <= MAX_LENGTH {
            Ok(Self(full))
        } else {
            Err(ResourceNameError(text.to_owned()))
        }
    }
}

impl TryFrom<String> for ResourceName {
    type Error = ResourceNameError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl From<ResourceName> for String {
    fn from(name: ResourceName) -> Self {
        name.0
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The resource a MIG profile is advertised as under the mixed strategy: `nvidia.com/mig-<profile>`, with `+`
/// written as `.` because `+` is not allowed in resource names (`1g.5gb+me` -> `nvidia.com/mig-1g.5gb.me`).
#[must_use]
pub fn mig_resource_name(profile: &MigProfileName) -> ResourceName {
    // A profile name is digits, lowercase letters, '.', '+' and '-' and short, so the result is always valid.
    ResourceName(format!(
        "{PREFIX}mig-{}",
        profile.to_string().replace('+', ".")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_get_the_nvidia_prefix() {
        assert_eq!(
            "gpu".parse::<ResourceName>().unwrap().as_str(),
            "nvidia.com/gpu"
        );
        let name: ResourceName = "nvidia.com/mig-1g.5gb".parse().unwrap();
        assert_eq!(name.short_name(), "mig-1g.5gb");
        assert_eq!(
            name.shared().unwrap().as_str(),
            "nvidia.com/mig-1g.5gb.shared"
        );
    }

    #[test]
    fn other_domains_and_bad_characters_are_refused() {
        for bad in [
            "example.com/gpu",
            "nvidia.com/GPU",
            "nvidia.com/",
            "nvidia.com/-gpu",
            "nvidia.com/gpu.",
            "nvidia.com/g_pu",
        ] {
            assert!(bad.parse::<ResourceName>().is_err(), "{bad}");
        }
        let long = format!("nvidia.com/{}", "a".repeat(53));
        assert!(long.parse::<ResourceName>().is_err());
        let longest: ResourceName = format!("nvidia.com/{}", "a".repeat(52)).parse().unwrap();
        assert!(longest.shared().is_err());
    }

    #[test]
    fn mig_profiles_map_to_mixed_strategy_names() {
        let name = |profile: &str| mig_resource_name(&profile.parse().unwrap()).to_string();
        assert_eq!(name("1g.5gb"), "nvidia.com/mig-1g.5gb");
        assert_eq!(name("1g.5gb+me"), "nvidia.com/mig-1g.5gb.me");
        assert_eq!(name("1g.24gb+me.all"), "nvidia.com/mig-1g.24gb.me.all");
        assert_eq!(name("1c.3g.20gb"), "nvidia.com/mig-1c.3g.20gb");
        for profile in ["1g.5gb+me", "1g.24gb-me", "7g.141gb"] {
            let advertised = name(profile);
            assert_eq!(
                advertised.parse::<ResourceName>().unwrap().as_str(),
                advertised
            );
        }
    }
}

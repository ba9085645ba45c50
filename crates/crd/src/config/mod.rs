//! The configuration file formats users already write for NVIDIA's stack, parsed strictly.
//!
//! Both formats arrive as ConfigMap values (YAML or JSON text). Parsing goes text -> `serde_json::Value` ->
//! typed structs (with the path of the offending field on error) -> a semantic pass that checks what types
//! cannot (value ranges, cross-field rules, names the MIG catalog knows). Every error is a [`ConfigError`] that
//! names the field and, where there is one, the fix: the operator shows these texts in status and Events, and
//! users act on them without reading our code.

mod de;
mod decode;
pub mod device_plugin;
mod error;
pub mod mig_parted;
#[cfg(test)]
mod mutation;

use serde::{Deserialize, Serialize};

pub use error::{ConfigError, NamedConfigError};

/// The `version` both formats carry; `v1` is the only one NVIDIA has defined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConfigVersion {
    /// `v1`.
    #[default]
    #[serde(rename = "v1")]
    V1,
}

/// Why `name` cannot be the value of a node label, if it cannot.
///
/// Config names are selected per node through labels (`nvidia.com/mig.config=<name>`,
/// `nvidia.com/device-plugin.config=<key>`), so a name that is not a valid label value can never be selected:
/// better to say so when the file is read than to leave the user wondering why the label is refused.
pub(crate) fn label_value_problem(name: &str) -> Option<&'static str> {
    let bytes = name.as_bytes();
    if name.is_empty() {
        Some("it is empty")
    } else if bytes.len() > 63 {
        Some("it is longer than 63 characters")
    } else if !bytes
        .iter()
        .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'))
    {
        Some("only letters, digits, '-', '_' and '.' are allowed")
    } else if !bytes[0].is_ascii_alphanumeric() || !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
        Some("it must start and end with a letter or digit")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::label_value_problem;

    #[test]
    fn label_values_follow_kubernetes_rules() {
        for good in ["all-1g.5gb", "2x2g.10gb-3x1g.5gb", "slice-4", "any", "A_b"] {
            assert_eq!(label_value_problem(good), None, "{good}");
        }
        assert_eq!(label_value_problem(""), Some("it is empty"));
        assert_eq!(
            label_value_problem("-x"),
            Some("it must start and end with a letter or digit")
        );
        assert_eq!(
            label_value_problem("a b"),
            Some("only letters, digits, '-', '_' and '.' are allowed")
        );
        assert_eq!(
            label_value_problem(&"a".repeat(64)),
            Some("it is longer than 63 characters")
        );
    }
}

//! Building blocks shared by every operand section of the ClusterPolicy: the container image, pull
//! settings, resources, arguments and environment, and the probe settings the driver takes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The fields of a section this operator accepts but does not implement, kept exactly as the user wrote them.
pub type UnknownFields = BTreeMap<String, Value>;

/// A section's defaults are exactly what an empty object deserialises to, so the schema defaults, the serde
/// defaults and `Default` cannot disagree.
pub(crate) fn serde_defaults<T: serde::de::DeserializeOwned>() -> T {
    match serde_json::from_value(Value::Object(serde_json::Map::new())) {
        Ok(value) => value,
        // Every field of these sections has a serde default; a missing one is a bug caught by the tests.
        Err(error) => panic!("a ClusterPolicy section lacks a serde default: {error}"),
    }
}

/// The container image and how it is pulled, as in NVIDIA's ClusterPolicy: `repository/image:version`,
/// `repository/image@version` when version is a `sha256:` digest, or `image` alone as a full reference.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// Image registry and path, e.g. `nvcr.io/nvidia`. Set it together with `image` and `version`, or
    /// leave `repository` and `version` empty and give `image` as a complete reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// Image name (e.g. `driver`), or a complete image reference when `repository` and `version` are empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Image tag (e.g. `550.127.05`), or a digest starting with `sha256:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// When the kubelet pulls the image: Always, Never or IfNotPresent (default IfNotPresent). Any other value
    /// is treated as IfNotPresent, as NVIDIA's operator does, and named in the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Names of Secrets in the operator's namespace used to pull the image from a private registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
}

/// Container settings every operand accepts.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSpec {
    /// CPU and memory requests and limits for the operand's main container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Extra command-line arguments for the operand's main container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment variables for the operand's main container; they override the operator's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

/// An environment variable given to an operand container.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub struct EnvVar {
    /// Name of the environment variable, e.g. `WITH_REBOOT`.
    pub name: String,
    /// Value of the environment variable (empty when omitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// Compute resources of a container, as in a Pod's `resources` (without claims).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct ResourceRequirements {
    /// Most of each resource the container may use, e.g. `{cpu: 500m, memory: 512Mi}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
    /// Resources the scheduler reserves for the container; defaults to the limits when only those are set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
}

/// Settings of a container probe (startup, liveness or readiness).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerProbeSpec {
    /// Seconds after the container starts before the first probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<i32>,
    /// Seconds after which one probe times out (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: Option<i32>,
    /// Seconds between probes (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub period_seconds: Option<i32>,
    /// Consecutive successes after a failure before the probe counts as passing (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub success_threshold: Option<i32>,
    /// Consecutive failures before the probe counts as failed (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub failure_threshold: Option<i32>,
}

/// A reference to a ConfigMap by name, used by the sections that take one file of configuration.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub struct ConfigMapRef {
    /// Name of a ConfigMap in the operator's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The pull policies Kubernetes knows.
pub const PULL_POLICIES: [&str; 3] = ["Always", "Never", "IfNotPresent"];

impl ImageSpec {
    /// The pull policy to give the kubelet: the spec's when Kubernetes knows it, else IfNotPresent (NVIDIA's
    /// operator maps every other value to IfNotPresent too).
    pub fn pull_policy(&self) -> &str {
        self.image_pull_policy
            .as_deref()
            .filter(|policy| PULL_POLICIES.contains(policy))
            .unwrap_or("IfNotPresent")
    }

    /// The spec's pull policy when it is set but not one Kubernetes knows (it is replaced by IfNotPresent).
    pub fn unknown_pull_policy(&self) -> Option<&str> {
        self.image_pull_policy
            .as_deref()
            .filter(|policy| !policy.is_empty() && !PULL_POLICIES.contains(policy))
    }

    /// The image reference this spec names, following NVIDIA's rules: `repository/image:version`,
    /// `repository/image@sha256:...` for digests, or `image` alone when repository and version are empty.
    /// `None` when nothing is set, so the caller falls back to its default image.
    pub fn reference(&self) -> Option<String> {
        fn set(field: &Option<String>) -> Option<&str> {
            field.as_deref().filter(|value| !value.is_empty())
        }
        match (set(&self.repository), set(&self.image), set(&self.version)) {
            (None, image, None) => image.map(str::to_owned),
            (repository, image, version) => {
                let repository = repository.unwrap_or_default();
                let image = image.unwrap_or_default();
                let version = version.unwrap_or_default();
                let separator = if version.starts_with("sha256:") {
                    '@'
                } else {
                    ':'
                };
                Some(format!("{repository}/{image}{separator}{version}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(repository: Option<&str>, image: Option<&str>, version: Option<&str>) -> ImageSpec {
        ImageSpec {
            repository: repository.map(Into::into),
            image: image.map(Into::into),
            version: version.map(Into::into),
            ..ImageSpec::default()
        }
    }

    #[test]
    fn image_reference_follows_nvidia_rules() {
        assert_eq!(
            image(Some("nvcr.io/nvidia"), Some("driver"), Some("550.127.05"))
                .reference()
                .as_deref(),
            Some("nvcr.io/nvidia/driver:550.127.05")
        );
        assert_eq!(
            image(Some("nvcr.io/nvidia"), Some("driver"), Some("sha256:abc"))
                .reference()
                .as_deref(),
            Some("nvcr.io/nvidia/driver@sha256:abc")
        );
        assert_eq!(
            image(None, Some("registry.local/driver@sha256:abc"), None)
                .reference()
                .as_deref(),
            Some("registry.local/driver@sha256:abc")
        );
        assert_eq!(image(Some(""), None, Some("")).reference(), None);
    }
}

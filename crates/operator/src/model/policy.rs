//! validate: a ClusterPolicy spec becomes a checked value that rendering can trust. Images are resolved (the
//! spec's, else the operator's environment defaults, as NVIDIA's operator does), enabled components decided, and
//! enumerations parsed once. A spec that cannot be rendered yields an error that names the field and the fix.

use std::collections::{BTreeMap, BTreeSet};

use crd::ClusterPolicySpec;
use crd::cluster_policy::ImageSpec;

use super::component::Component;

/// The images the operator falls back to when a section names none, by the environment variable that holds
/// each (the names NVIDIA's operator reads).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefaultImages(pub BTreeMap<String, String>);

impl DefaultImages {
    /// The environment variables naming default images, read from the operator's own environment.
    pub const VARIABLES: [&'static str; 9] = [
        "DRIVER_IMAGE",
        "CONTAINER_TOOLKIT_IMAGE",
        "DEVICE_PLUGIN_IMAGE",
        "DCGM_EXPORTER_IMAGE",
        "DCGM_IMAGE",
        "GFD_IMAGE",
        "VALIDATOR_IMAGE",
        "MIG_MANAGER_IMAGE",
        "DRIVER_MANAGER_IMAGE",
    ];

    pub fn from_env() -> Self {
        Self(
            Self::VARIABLES
                .iter()
                .filter_map(|name| {
                    Some((
                        name.to_string(),
                        std::env::var(name).ok().filter(|v| !v.is_empty())?,
                    ))
                })
                .collect(),
        )
    }
}

/// MIG strategy of the device plugin and feature discovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigStrategy {
    None,
    Single,
    Mixed,
}

impl MigStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            MigStrategy::None => "none",
            MigStrategy::Single => "single",
            MigStrategy::Mixed => "mixed",
        }
    }
}

/// A spec that passed validation, with what rendering derives from it.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidatedPolicy {
    pub spec: ClusterPolicySpec,
    /// Enabled components with their resolved images.
    pub images: BTreeMap<Component, String>,
    /// Image of the driver manager init container, when the driver is enabled.
    pub driver_manager_image: Option<String>,
    pub mig_strategy: MigStrategy,
    /// Sections the user enabled that this operator does not implement; reported, not fatal.
    pub unsupported: Vec<&'static str>,
}

impl ValidatedPolicy {
    pub fn enabled(&self) -> BTreeSet<Component> {
        self.images.keys().copied().collect()
    }

    pub fn is_enabled(&self, component: Component) -> bool {
        self.images.contains_key(&component)
    }

    pub fn image(&self, component: Component) -> &str {
        self.images.get(&component).map_or("", String::as_str)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValidateError {
    #[error(
        "spec.{section}: no image to run: set spec.{section}.repository, image and version (or image alone as a full reference), or set {variable} on the operator"
    )]
    NoImage {
        section: &'static str,
        variable: &'static str,
    },
    #[error("spec.mig.strategy: {0:?} is not a MIG strategy: use none, single or mixed")]
    MigStrategy(String),
    #[error(
        "spec.daemonsets.updateStrategy: {0:?} is not an update strategy: use RollingUpdate or OnDelete"
    )]
    UpdateStrategy(String),
}

/// Where one component's settings live in the spec.
struct Section<'a> {
    component: Component,
    /// The section's field name, for error messages.
    field: &'static str,
    image: &'a ImageSpec,
    /// The operator's environment variable holding the default image.
    variable: &'static str,
    /// Whether the component runs when `enabled` is unset (NVIDIA's defaults).
    on_by_default: bool,
    enabled: Option<bool>,
}

fn sections(spec: &ClusterPolicySpec) -> [Section<'_>; 9] {
    let section = |component, field, image, variable, on_by_default, enabled| Section {
        component,
        field,
        image,
        variable,
        on_by_default,
        enabled,
    };
    [
        section(
            Component::Driver,
            "driver",
            &spec.driver.image,
            "DRIVER_IMAGE",
            true,
            spec.driver.enabled,
        ),
        section(
            Component::ContainerToolkit,
            "toolkit",
            &spec.toolkit.image,
            "CONTAINER_TOOLKIT_IMAGE",
            true,
            spec.toolkit.enabled,
        ),
        section(
            Component::OperatorValidator,
            "validator",
            &spec.validator.image,
            "VALIDATOR_IMAGE",
            true,
            None,
        ),
        section(
            Component::DevicePlugin,
            "devicePlugin",
            &spec.device_plugin.image,
            "DEVICE_PLUGIN_IMAGE",
            true,
            spec.device_plugin.enabled,
        ),
        section(
            Component::GpuFeatureDiscovery,
            "gfd",
            &spec.gfd.image,
            "GFD_IMAGE",
            true,
            spec.gfd.enabled,
        ),
        section(
            Component::Dcgm,
            "dcgm",
            &spec.dcgm.image,
            "DCGM_IMAGE",
            true,
            spec.dcgm.enabled,
        ),
        section(
            Component::DcgmExporter,
            "dcgmExporter",
            &spec.dcgm_exporter.image,
            "DCGM_EXPORTER_IMAGE",
            true,
            spec.dcgm_exporter.enabled,
        ),
        section(
            Component::MigManager,
            "migManager",
            &spec.mig_manager.image,
            "MIG_MANAGER_IMAGE",
            true,
            spec.mig_manager.enabled,
        ),
        section(
            Component::NodeStatusExporter,
            "nodeStatusExporter",
            &spec.node_status_exporter.image,
            "VALIDATOR_IMAGE",
            false,
            spec.node_status_exporter.enabled,
        ),
    ]
}

/// Checks a spec and resolves what rendering needs.
pub fn validate(
    spec: &ClusterPolicySpec,
    defaults: &DefaultImages,
) -> Result<ValidatedPolicy, ValidateError> {
    let mig_strategy = match spec.mig.strategy.as_str() {
        "none" => MigStrategy::None,
        "single" => MigStrategy::Single,
        "mixed" => MigStrategy::Mixed,
        other => return Err(ValidateError::MigStrategy(other.into())),
    };
    if !matches!(
        spec.daemonsets.update_strategy.as_str(),
        "RollingUpdate" | "OnDelete"
    ) {
        return Err(ValidateError::UpdateStrategy(
            spec.daemonsets.update_strategy.clone(),
        ));
    }
    let resolve = |image: &ImageSpec, section: &'static str, variable: &'static str| {
        image
            .reference()
            .or_else(|| defaults.0.get(variable).cloned())
            .ok_or(ValidateError::NoImage { section, variable })
    };
    let mut images = BTreeMap::new();
    for section in sections(spec) {
        if section.enabled.unwrap_or(section.on_by_default) {
            images.insert(
                section.component,
                resolve(section.image, section.field, section.variable)?,
            );
        }
    }
    let driver_manager_image = match (
        &spec.driver.manager,
        images.contains_key(&Component::Driver),
    ) {
        (Some(manager), true) => manager
            .image
            .reference()
            .or_else(|| defaults.0.get("DRIVER_MANAGER_IMAGE").cloned()),
        (None, true) => defaults.0.get("DRIVER_MANAGER_IMAGE").cloned(),
        (_, false) => None,
    };
    Ok(ValidatedPolicy {
        spec: spec.clone(),
        images,
        driver_manager_image,
        mig_strategy,
        unsupported: spec.enabled_unsupported_sections(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(reference: &str) -> ImageSpec {
        ImageSpec {
            image: Some(reference.into()),
            ..ImageSpec::default()
        }
    }

    fn all_images() -> DefaultImages {
        DefaultImages(
            DefaultImages::VARIABLES
                .iter()
                .map(|v| (v.to_string(), format!("example/{v}:1")))
                .collect(),
        )
    }

    #[test]
    fn defaults_enable_what_nvidia_enables() {
        let policy = validate(&ClusterPolicySpec::default(), &all_images()).unwrap();
        let enabled: Vec<_> = policy
            .enabled()
            .into_iter()
            .map(Component::label_name)
            .collect();
        assert_eq!(
            enabled,
            [
                "driver",
                "container-toolkit",
                "operator-validator",
                "device-plugin",
                "gpu-feature-discovery",
                "dcgm",
                "dcgm-exporter",
                "mig-manager"
            ]
        );
        assert_eq!(
            policy.image(Component::DevicePlugin),
            "example/DEVICE_PLUGIN_IMAGE:1"
        );
        assert_eq!(policy.mig_strategy, MigStrategy::Single);
    }

    #[test]
    fn spec_images_win_over_environment_defaults() {
        let mut spec = ClusterPolicySpec::default();
        spec.device_plugin.image = image("registry.local/plugin@sha256:abc");
        spec.driver.enabled = Some(false);
        let policy = validate(&spec, &all_images()).unwrap();
        assert_eq!(
            policy.image(Component::DevicePlugin),
            "registry.local/plugin@sha256:abc"
        );
        assert!(!policy.is_enabled(Component::Driver));
        assert_eq!(policy.driver_manager_image, None);
    }

    #[test]
    fn missing_image_names_the_field_and_the_variable() {
        let error = validate(&ClusterPolicySpec::default(), &DefaultImages::default()).unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec.driver: no image to run: set spec.driver.repository, image and version (or image alone as a full reference), or set DRIVER_IMAGE on the operator"
        );
    }

    #[test]
    fn bad_enumerations_are_rejected_even_without_cel() {
        let mut spec = ClusterPolicySpec::default();
        spec.mig.strategy = "both".into();
        assert_eq!(
            validate(&spec, &all_images()).unwrap_err(),
            ValidateError::MigStrategy("both".into())
        );
    }
}

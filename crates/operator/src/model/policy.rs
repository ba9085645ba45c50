//! validate: a ClusterPolicy spec becomes a checked value that rendering can trust. Images are resolved (the
//! spec's, else the operator's defaults: its environment over the built-in ones, as NVIDIA's operator reads its
//! environment), enabled components decided, and enumerations parsed once. A spec that cannot be rendered
//! yields an error that names the field and the fix; what NVIDIA's operator tolerates is tolerated here too and
//! named in warnings.

use std::collections::{BTreeMap, BTreeSet};

use crd::ClusterPolicySpec;
use crd::cluster_policy::{ImageSpec, PULL_POLICIES};
use crd::config::device_plugin::MigStrategy;

use super::component::Component;

/// Where this operator's own images are published; the chart overrides it through the environment.
pub const OWN_REPOSITORY: &str = "ghcr.io/gpu-operator-rs";
/// This operator's version, which is also the tag of its own images: operands implemented here run the same
/// version as the operator that renders them.
pub const OWN_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The images the operator falls back to when a section names none, by the environment variable that holds
/// each (the names NVIDIA's operator reads, and `DRA_DRIVER_IMAGE`, ours: NVIDIA's operator reads none for a DRA
/// driver).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefaultImages(pub BTreeMap<String, String>);

impl DefaultImages {
    /// The environment variables naming default images, read from the operator's own environment.
    pub const VARIABLES: [&'static str; 10] = [
        "DRIVER_IMAGE",
        "CONTAINER_TOOLKIT_IMAGE",
        "DEVICE_PLUGIN_IMAGE",
        "DCGM_EXPORTER_IMAGE",
        "DCGM_IMAGE",
        "GFD_IMAGE",
        "VALIDATOR_IMAGE",
        "MIG_MANAGER_IMAGE",
        "DRIVER_MANAGER_IMAGE",
        "DRA_DRIVER_IMAGE",
    ];

    /// The images compiled in, so that a ClusterPolicy without image fields (NVIDIA's sample) runs: this
    /// operator's own images at its own version for the components it implements, and for the driver, the
    /// container toolkit, the driver manager and DCGM the NVIDIA images NVIDIA's v26.7.0 chart pins.
    pub fn builtin() -> Self {
        let own = |image: &str| format!("{OWN_REPOSITORY}/{image}:{OWN_VERSION}");
        Self(
            [
                ("DRIVER_IMAGE", "nvcr.io/nvidia/driver:595.91.07".to_owned()),
                (
                    "CONTAINER_TOOLKIT_IMAGE",
                    "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0".to_owned(),
                ),
                (
                    "DRIVER_MANAGER_IMAGE",
                    "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0".to_owned(),
                ),
                (
                    "DCGM_IMAGE",
                    "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04".to_owned(),
                ),
                ("DEVICE_PLUGIN_IMAGE", own("gpu-device-plugin")),
                ("DCGM_EXPORTER_IMAGE", own("gpu-node-agent")),
                ("GFD_IMAGE", own("gpu-node-agent")),
                ("VALIDATOR_IMAGE", own("gpu-node-agent")),
                ("MIG_MANAGER_IMAGE", own("gpu-node-agent")),
                ("DRA_DRIVER_IMAGE", own("gpu-dra-driver")),
            ]
            .into_iter()
            .map(|(variable, image)| (variable.to_owned(), image))
            .collect(),
        )
    }

    /// The built-in images, each replaced by the operator's environment variable of the same name when set.
    pub fn from_env() -> Self {
        Self::builtin().overridden_by(|name| std::env::var(name).ok())
    }

    fn overridden_by(mut self, lookup: impl Fn(&str) -> Option<String>) -> Self {
        for name in Self::VARIABLES {
            if let Some(image) = lookup(name).filter(|image| !image.is_empty()) {
                self.0.insert(name.to_owned(), image);
            }
        }
        self
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
    /// `mig.strategy`; `None` when unset, as NVIDIA's operator leaves it to the device-plugin config (else none).
    pub mig_strategy: Option<MigStrategy>,
    /// Sections the user enabled that this operator does not implement; reported, not fatal.
    pub unsupported: Vec<&'static str>,
    /// Settings NVIDIA's operator tolerates and ignores, each naming the field and the fix; reported, not fatal.
    pub warnings: Vec<String>,
    /// Per component, where it runs other than its section says (an NVIDIA image replaced by ours).
    pub component_warnings: BTreeMap<Component, Vec<String>>,
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

fn sections(spec: &ClusterPolicySpec) -> [Section<'_>; 11] {
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
        // The node agent's role; off unless asked for.
        section(
            Component::Watchdog,
            "watchdog",
            &spec.watchdog.image,
            "VALIDATOR_IMAGE",
            false,
            spec.watchdog.enabled,
        ),
        // Its own image; off unless asked for.
        section(
            Component::DraDriver,
            "draDriver",
            &spec.dra_driver.image,
            "DRA_DRIVER_IMAGE",
            false,
            spec.dra_driver.enabled,
        ),
    ]
}

/// The names (last path segment, without tag or digest) of NVIDIA's images for the components this operator
/// implements itself. NVIDIA's chart writes them into every ClusterPolicy it makes; they run NVIDIA's programs,
/// which do not understand the command lines rendered here, so such a component runs this operator's image.
/// Matched by name, not registry, so that mirrors of NVIDIA's images are recognised too.
fn nvidia_image_names(component: Component) -> &'static [&'static str] {
    match component {
        Component::DevicePlugin => &["k8s-device-plugin"],
        Component::GpuFeatureDiscovery => &["k8s-device-plugin", "gpu-feature-discovery"],
        Component::MigManager => &["k8s-mig-manager"],
        Component::DcgmExporter => &["dcgm-exporter"],
        Component::OperatorValidator | Component::NodeStatusExporter => {
            &["gpu-operator", "gpu-operator-validator"]
        }
        // NVIDIA's chart names its DRA driver's image in a draDriver section of its values (for its GPUCluster
        // resource), which ours reads too.
        Component::DraDriver => &["dra-driver-nvidia-gpu", "k8s-dra-driver-gpu"],
        // NVIDIA's images are what runs for these; NVIDIA has no watchdog.
        Component::Driver | Component::ContainerToolkit | Component::Dcgm | Component::Watchdog => {
            &[]
        }
    }
}

/// The name of an image reference: its last path segment without tag or digest
/// (`nvcr.io/nvidia/k8s-device-plugin:v0.20.0` -> `k8s-device-plugin`).
fn image_name(reference: &str) -> &str {
    let without_digest = reference.split('@').next().unwrap_or(reference);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    last.split(':').next().unwrap_or(last)
}

/// Checks a spec and resolves what rendering needs.
pub fn validate(
    spec: &ClusterPolicySpec,
    defaults: &DefaultImages,
) -> Result<ValidatedPolicy, ValidateError> {
    let mig_strategy = spec
        .mig
        .strategy
        .as_deref()
        .map(str::parse::<MigStrategy>)
        .transpose()
        .map_err(|error| ValidateError::MigStrategy(error.0))?;
    if !matches!(
        spec.daemonsets.update_strategy.as_str(),
        "RollingUpdate" | "OnDelete"
    ) {
        return Err(ValidateError::UpdateStrategy(
            spec.daemonsets.update_strategy.clone(),
        ));
    }
    let default_image = |section: &'static str, variable: &'static str| {
        defaults
            .0
            .get(variable)
            .cloned()
            .ok_or(ValidateError::NoImage { section, variable })
    };
    let mut images = BTreeMap::new();
    let mut component_warnings: BTreeMap<Component, Vec<String>> = BTreeMap::new();
    for section in sections(spec) {
        if !section.enabled.unwrap_or(section.on_by_default) {
            continue;
        }
        let image = match section.image.reference() {
            Some(named) if nvidia_image_names(section.component).contains(&image_name(&named)) => {
                let ours = default_image(section.field, section.variable)?;
                component_warnings
                    .entry(section.component)
                    .or_default()
                    .push(format!(
                        "spec.{field} names NVIDIA's image {named}; this operator runs its own {component} image {ours} instead (clear spec.{field}.repository, image and version, or name one of this operator's images)",
                        field = section.field,
                        component = section.component,
                    ));
                ours
            }
            Some(named) => named,
            None => default_image(section.field, section.variable)?,
        };
        images.insert(section.component, image);
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
        warnings: warnings(spec, &images),
        images,
        driver_manager_image,
        mig_strategy,
        unsupported: spec.enabled_unsupported_sections(),
        component_warnings,
    })
}

/// The settings NVIDIA's operator accepts and ignores (or reads leniently), which this operator accepts the
/// same way; each warning names the field, what happens instead, and the fix.
fn warnings(spec: &ClusterPolicySpec, images: &BTreeMap<Component, String>) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(config) = &spec.device_plugin.config
        && let Some(default) = config.default.as_deref().filter(|d| !d.is_empty())
        && config.name.as_deref().unwrap_or_default().is_empty()
    {
        warnings.push(format!(
            "spec.devicePlugin.config.default is {default:?} but spec.devicePlugin.config.name is empty: the default is ignored (as NVIDIA's operator does) and the device plugin runs its built-in config; set spec.devicePlugin.config.name to the ConfigMap holding key {default:?}, or remove spec.devicePlugin.config.default"
        ));
    }
    let runtime = spec.operator.default_runtime.as_str();
    if !["containerd", "crio", "docker"].contains(&runtime) {
        warnings.push(format!(
            "spec.operator.defaultRuntime is {runtime:?}: containerd is assumed for nodes that do not report their runtime; set containerd, crio or docker (NVIDIA's operator no longer reads this field)"
        ));
    }
    let mut pull_policies: Vec<(String, &ImageSpec)> = sections(spec)
        .into_iter()
        .filter(|section| images.contains_key(&section.component))
        .map(|section| (format!("spec.{}", section.field), section.image))
        .collect();
    if let Some(manager) = &spec.driver.manager {
        pull_policies.push(("spec.driver.manager".into(), &manager.image));
    }
    for (field, image) in pull_policies {
        if let Some(policy) = image.unknown_pull_policy() {
            warnings.push(format!(
                "{field}.imagePullPolicy is {policy:?}: IfNotPresent is used (as NVIDIA's operator does); set one of {}",
                PULL_POLICIES.join(", ")
            ));
        }
    }
    warnings
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
        // Unset, as in NVIDIA's operator: no strategy is passed on.
        assert_eq!(policy.mig_strategy, None);
        assert!(policy.warnings.is_empty(), "{:?}", policy.warnings);
        assert!(policy.component_warnings.is_empty());
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
        spec.mig.strategy = Some("both".into());
        assert_eq!(
            validate(&spec, &all_images()).unwrap_err(),
            ValidateError::MigStrategy("both".into())
        );
    }

    fn nvidia_image(repository: &str, name: &str, version: &str) -> ImageSpec {
        ImageSpec {
            repository: Some(repository.into()),
            image: Some(name.into()),
            version: Some(version.into()),
            ..ImageSpec::default()
        }
    }

    #[test]
    fn a_policy_without_image_fields_runs_the_builtin_images() {
        let policy = validate(&ClusterPolicySpec::default(), &DefaultImages::builtin()).unwrap();
        let own = |name: &str| format!("ghcr.io/gpu-operator-rs/{name}:{OWN_VERSION}");
        assert_eq!(
            policy.image(Component::Driver),
            "nvcr.io/nvidia/driver:595.91.07"
        );
        assert_eq!(
            policy.image(Component::ContainerToolkit),
            "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"
        );
        assert_eq!(
            policy.image(Component::Dcgm),
            "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"
        );
        assert_eq!(
            policy.driver_manager_image.as_deref(),
            Some("nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0")
        );
        assert_eq!(
            policy.image(Component::DevicePlugin),
            own("gpu-device-plugin")
        );
        let mut spec = ClusterPolicySpec::default();
        spec.dra_driver.enabled = Some(true);
        let with_dra = validate(&spec, &DefaultImages::builtin()).unwrap();
        assert_eq!(with_dra.image(Component::DraDriver), own("gpu-dra-driver"));
        for component in [
            Component::OperatorValidator,
            Component::GpuFeatureDiscovery,
            Component::DcgmExporter,
            Component::MigManager,
        ] {
            assert_eq!(
                policy.image(component),
                own("gpu-node-agent"),
                "{component}"
            );
        }
    }

    #[test]
    fn the_environment_overrides_builtin_images() {
        let env: BTreeMap<&str, &str> = [
            (
                "DEVICE_PLUGIN_IMAGE",
                "registry.local/gpu-device-plugin:dev",
            ),
            ("GFD_IMAGE", ""),
        ]
        .into();
        let images =
            DefaultImages::builtin().overridden_by(|name| env.get(name).map(|v| v.to_string()));
        assert_eq!(
            images.0["DEVICE_PLUGIN_IMAGE"],
            "registry.local/gpu-device-plugin:dev"
        );
        // An empty variable does not clear the built-in image.
        assert_eq!(
            images.0["GFD_IMAGE"],
            DefaultImages::builtin().0["GFD_IMAGE"]
        );
    }

    #[test]
    fn builtin_version_is_the_charts_app_version() {
        let chart = include_str!("../../../../charts/gpu-operator/Chart.yaml");
        assert!(
            chart.contains(&format!("appVersion: \"{OWN_VERSION}\"")),
            "Chart.yaml appVersion differs from the operator's version {OWN_VERSION}"
        );
    }

    /// The images NVIDIA's v26.7.0 chart writes into the ClusterPolicy it creates.
    fn spec_from_nvidias_chart() -> ClusterPolicySpec {
        let mut spec = ClusterPolicySpec::default();
        spec.device_plugin.image = nvidia_image("nvcr.io/nvidia", "k8s-device-plugin", "v0.20.0");
        spec.gfd.image = nvidia_image("nvcr.io/nvidia", "k8s-device-plugin", "v0.20.0");
        spec.mig_manager.image =
            nvidia_image("nvcr.io/nvidia/cloud-native", "k8s-mig-manager", "v0.15.0");
        spec.dcgm_exporter.image = nvidia_image(
            "nvcr.io/nvidia/k8s",
            "dcgm-exporter",
            "4.6.0-4.8.3-distroless",
        );
        spec.validator.image = nvidia_image("nvcr.io/nvidia", "gpu-operator", "v26.7.0");
        spec.node_status_exporter.enabled = Some(true);
        spec.node_status_exporter.image = nvidia_image("nvcr.io/nvidia", "gpu-operator", "v26.7.0");
        spec.driver.image = nvidia_image("nvcr.io/nvidia", "driver", "595.91.07");
        spec.toolkit.image = nvidia_image("nvcr.io/nvidia/k8s", "container-toolkit", "v1.20.0");
        // From the values' draDriver section, which our chart reads into ours.
        spec.dra_driver.enabled = Some(true);
        spec.dra_driver.image = nvidia_image("nvcr.io/nvidia", "dra-driver-nvidia-gpu", "v0.5.0");
        spec
    }

    #[test]
    fn nvidias_images_for_our_components_run_ours_and_say_so() {
        let builtin = DefaultImages::builtin();
        let policy = validate(&spec_from_nvidias_chart(), &builtin).unwrap();
        for (component, variable, field) in [
            (
                Component::DevicePlugin,
                "DEVICE_PLUGIN_IMAGE",
                "devicePlugin",
            ),
            (Component::GpuFeatureDiscovery, "GFD_IMAGE", "gfd"),
            (Component::MigManager, "MIG_MANAGER_IMAGE", "migManager"),
            (
                Component::DcgmExporter,
                "DCGM_EXPORTER_IMAGE",
                "dcgmExporter",
            ),
            (Component::OperatorValidator, "VALIDATOR_IMAGE", "validator"),
            (
                Component::NodeStatusExporter,
                "VALIDATOR_IMAGE",
                "nodeStatusExporter",
            ),
            (Component::DraDriver, "DRA_DRIVER_IMAGE", "draDriver"),
        ] {
            assert_eq!(policy.image(component), builtin.0[variable], "{component}");
            let warnings = &policy.component_warnings[&component];
            assert_eq!(warnings.len(), 1, "{component}: {warnings:?}");
            assert!(
                warnings[0].starts_with(&format!(
                    "spec.{field} names NVIDIA's image nvcr.io/nvidia/"
                )),
                "{}",
                warnings[0]
            );
            assert!(warnings[0].contains(&format!("image {} instead", builtin.0[variable])));
        }
        // The driver and the toolkit are NVIDIA's: their images run as named, without a word.
        assert_eq!(
            policy.image(Component::Driver),
            "nvcr.io/nvidia/driver:595.91.07"
        );
        assert_eq!(
            policy.image(Component::ContainerToolkit),
            "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"
        );
        assert!(!policy.component_warnings.contains_key(&Component::Driver));
        assert!(
            !policy
                .component_warnings
                .contains_key(&Component::ContainerToolkit)
        );
    }

    #[test]
    fn mirrored_nvidia_images_are_recognised_and_ours_are_kept() {
        let mut spec = ClusterPolicySpec::default();
        spec.device_plugin.image = image("registry.corp/nvidia/k8s-device-plugin@sha256:abc");
        spec.dcgm_exporter.image = image("registry.corp/gpu-operator-rs/gpu-node-agent:dev");
        let policy = validate(&spec, &all_images()).unwrap();
        assert_eq!(
            policy.image(Component::DevicePlugin),
            "example/DEVICE_PLUGIN_IMAGE:1"
        );
        assert_eq!(
            policy.image(Component::DcgmExporter),
            "registry.corp/gpu-operator-rs/gpu-node-agent:dev"
        );
        assert_eq!(policy.component_warnings.len(), 1);
    }

    #[test]
    fn image_names_drop_registry_tag_and_digest() {
        assert_eq!(
            image_name("nvcr.io/nvidia/k8s-device-plugin:v0.20.0"),
            "k8s-device-plugin"
        );
        assert_eq!(
            image_name("localhost:5000/nvidia/gpu-operator@sha256:ab"),
            "gpu-operator"
        );
        assert_eq!(image_name("dcgm-exporter"), "dcgm-exporter");
    }

    #[test]
    fn what_nvidia_ignores_is_a_warning_naming_field_and_fix() {
        let spec: ClusterPolicySpec = serde_json::from_value(serde_json::json!({
            // The AKS guide's removal patch after `"default": "any"`.
            "devicePlugin": {"config": {"name": "", "default": "any"}},
            "operator": {"defaultRuntime": "podman"},
            "toolkit": {"imagePullPolicy": "Sometimes"},
            "driver": {"enabled": false, "imagePullPolicy": "Sometimes"},
        }))
        .unwrap();
        let policy = validate(&spec, &all_images()).unwrap();
        assert_eq!(
            policy.warnings,
            [
                "spec.devicePlugin.config.default is \"any\" but spec.devicePlugin.config.name is empty: the default is ignored (as NVIDIA's operator does) and the device plugin runs its built-in config; set spec.devicePlugin.config.name to the ConfigMap holding key \"any\", or remove spec.devicePlugin.config.default",
                "spec.operator.defaultRuntime is \"podman\": containerd is assumed for nodes that do not report their runtime; set containerd, crio or docker (NVIDIA's operator no longer reads this field)",
                // The disabled driver's pull policy is never used: no warning.
                "spec.toolkit.imagePullPolicy is \"Sometimes\": IfNotPresent is used (as NVIDIA's operator does); set one of Always, Never, IfNotPresent",
            ]
        );
    }

    #[test]
    fn mig_strategy_is_passed_on_only_when_set() {
        let mut spec = ClusterPolicySpec::default();
        assert_eq!(validate(&spec, &all_images()).unwrap().mig_strategy, None);
        spec.mig.strategy = Some("mixed".into());
        assert_eq!(
            validate(&spec, &all_images()).unwrap().mig_strategy,
            Some(MigStrategy::Mixed)
        );
    }
}

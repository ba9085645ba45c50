//! What every operand shares, built once: object metadata and the labels the apply layer prunes by, the
//! DaemonSet around an operand's main container (scheduling and update strategy from `spec.daemonsets`; image,
//! pull settings, resources, extra args and env from the component's own section), host-path volumes, and the
//! init container that holds an operand until the validator has marked the driver and toolkit ready. The
//! pieces containers are made of (env, host mounts, names) are in [`parts`].

mod parts;

pub(super) use parts::{
    HostMount, RootFs, User, config_map_name, confined, container, env, gpu_access_env,
    namespace_env, node_name_env, non_empty, non_empty_map, object_name, port, privileged,
    simulator_state_mount, split_path, with_user_env,
};

use std::collections::BTreeMap;

use crd::ClusterPolicySpec;
use crd::cluster_policy::{
    ContainerSpec, DaemonsetsSpec, ImageSpec, ResourceRequirements as SpecResources,
};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMapVolumeSource, Container, LocalObjectReference, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, PodSecurityContext, PodSpec, PodTemplateSpec,
    ResourceRequirements, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::model::{ClusterFacts, Component, ValidatedPolicy};
use crate::plan::labels::deploy_terms;

/// Label naming the tool that manages an object; with [`PART_OF_LABEL`] and [`COMPONENT_LABEL`] it is how the
/// apply layer finds what it rendered before, to prune what is no longer rendered.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Label naming the application an object belongs to.
pub const PART_OF_LABEL: &str = "app.kubernetes.io/part-of";
/// Label naming the component an object belongs to (its [`Component::label_name`]).
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// Value of [`MANAGED_BY_LABEL`] and [`PART_OF_LABEL`].
pub const MANAGER: &str = "gpu-operator";
/// The label users select operand pods by (`app=nvidia-device-plugin-daemonset`), as in NVIDIA's operator.
pub const APP_LABEL: &str = "app";
/// Pod label holding the DaemonSet's own name. Per-pool DaemonSets (driver per OS pool, toolkit per runtime)
/// share one `app` label, so each selects its pods by this label too: selectors never overlap, and a
/// DaemonSet's selector, which is immutable, is the same rule for every operand.
pub const DAEMONSET_LABEL: &str = "nvidia.com/gpu-operator.daemonset";

/// The validator's and node agents' binary.
pub(super) const NODE_AGENT: &str = "gpu-node-agent";

/// Labels every rendered object carries: `operator.labels`, then `user` labels, then the three the apply layer
/// prunes by, then the object's `own` labels; later ones win, so users cannot break pruning or selection.
fn labels(
    policy: &ValidatedPolicy,
    component: Component,
    user: &BTreeMap<String, String>,
    own: &[(&str, &str)],
) -> BTreeMap<String, String> {
    let mut labels = policy.spec.operator.labels.clone();
    labels.extend(user.clone());
    labels.extend(component_labels(component));
    labels.extend(own.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    labels
}

fn component_labels(component: Component) -> [(String, String); 3] {
    [
        (MANAGED_BY_LABEL.into(), MANAGER.into()),
        (PART_OF_LABEL.into(), MANAGER.into()),
        (COMPONENT_LABEL.into(), component.label_name().into()),
    ]
}

/// Metadata of a rendered object in the operator's namespace. `user_labels`/`user_annotations` are the
/// section's own (e.g. `daemonsets.labels`, a ServiceMonitor's `additionalLabels`), layered over
/// `operator.labels`/`operator.annotations`. No owner reference: the apply layer adds it.
pub(super) fn object_meta(
    policy: &ValidatedPolicy,
    facts: &ClusterFacts,
    component: Component,
    name: &str,
    user_labels: &BTreeMap<String, String>,
    user_annotations: &BTreeMap<String, String>,
) -> ObjectMeta {
    let mut annotations = policy.spec.operator.annotations.clone();
    annotations.extend(user_annotations.clone());
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(facts.namespace.clone()),
        labels: Some(labels(
            policy,
            component,
            user_labels,
            &[(APP_LABEL, component.app_name())],
        )),
        annotations: non_empty_map(annotations),
        ..ObjectMeta::default()
    }
}

/// The image and container settings of a component's section of the spec.
pub(super) fn section(
    spec: &ClusterPolicySpec,
    component: Component,
) -> (&ImageSpec, &ContainerSpec) {
    match component {
        Component::Driver => (&spec.driver.image, &spec.driver.container),
        Component::ContainerToolkit => (&spec.toolkit.image, &spec.toolkit.container),
        Component::OperatorValidator => (&spec.validator.image, &spec.validator.container),
        Component::DevicePlugin => (&spec.device_plugin.image, &spec.device_plugin.container),
        Component::GpuFeatureDiscovery => (&spec.gfd.image, &spec.gfd.container),
        Component::Dcgm => (&spec.dcgm.image, &spec.dcgm.container),
        Component::DcgmExporter => (&spec.dcgm_exporter.image, &spec.dcgm_exporter.container),
        Component::MigManager => (&spec.mig_manager.image, &spec.mig_manager.container),
        Component::NodeStatusExporter => (
            &spec.node_status_exporter.image,
            &spec.node_status_exporter.container,
        ),
        Component::Watchdog => (&spec.watchdog.image, &spec.watchdog.container),
        Component::DraDriver => (&spec.dra_driver.image, &spec.dra_driver.container),
    }
}

/// What the validation init container waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Awaits {
    /// The driver only: the toolkit's own DaemonSet (init container `driver-validation`).
    Driver,
    /// The driver, and the toolkit when it is enabled: every GPU client (init container `toolkit-validation`,
    /// NVIDIA's name, kept even when the toolkit is disabled so `kubectl logs -c` works the same).
    DriverAndToolkit,
}

/// One operand DaemonSet under construction. An operand module sets its main container's name, command,
/// own args and env, mounts and extra node selector; [`OperandDaemonSet::build`] adds everything shared.
#[derive(Debug)]
pub(super) struct OperandDaemonSet<'a> {
    policy: &'a ValidatedPolicy,
    facts: &'a ClusterFacts,
    component: Component,
    /// The DaemonSet's name: the component's app name, with a pool suffix for per-pool operands.
    pub name: String,
    /// Image of the main container: the resolved image unless the operand derives one (driver pool tags).
    pub image: String,
    /// The main container as the operand defines it; the section's settings are layered on in `build`.
    pub main: Container,
    /// Node selector entries of this operand, over the deploy label and `daemonsets.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// Requirements of the operand's own that a label equality cannot say (a toolkit's runtime), joined to each
    /// deploy affinity term.
    pub node_requirements: Vec<NodeSelectorRequirement>,
    pub host_pid: bool,
    pub host_ipc: bool,
    pub host_network: bool,
    /// `daemonsets.updateStrategy` unless the operand has its own rule (the driver).
    pub update_strategy: DaemonSetUpdateStrategy,
    /// Operand-specific pod labels and annotations (the exporter's `podLabels`/`podAnnotations`).
    pub pod_labels: BTreeMap<String, String>,
    pub pod_annotations: BTreeMap<String, String>,
    /// Where the image pull settings, resources, args and env come from: the component's section, unless the
    /// operand renders from another object (an NVIDIADriver).
    pub section: (&'a ImageSpec, &'a ContainerSpec),
    /// Scheduling and metadata that replace `spec.daemonsets`' where set (an NVIDIADriver's own).
    pub overrides: PodOverrides,
    init_containers: Vec<Container>,
    volumes: Vec<Volume>,
    pull_secrets: Vec<String>,
}

impl<'a> OperandDaemonSet<'a> {
    pub(super) fn new(
        policy: &'a ValidatedPolicy,
        facts: &'a ClusterFacts,
        component: Component,
    ) -> Self {
        Self {
            policy,
            facts,
            component,
            name: component.app_name().into(),
            image: policy.image(component).into(),
            main: Container::default(),
            node_selector: BTreeMap::new(),
            node_requirements: Vec::new(),
            host_pid: false,
            host_ipc: false,
            host_network: false,
            update_strategy: update_strategy(&policy.spec.daemonsets),
            pod_labels: BTreeMap::new(),
            pod_annotations: BTreeMap::new(),
            section: section(&policy.spec, component),
            overrides: PodOverrides::default(),
            init_containers: Vec::new(),
            volumes: Vec::new(),
            pull_secrets: Vec::new(),
        }
    }

    /// Mounts a host path into the main container.
    pub(super) fn mount(&mut self, mount: &HostMount) {
        self.add_volume(mount.volume());
        self.main
            .volume_mounts
            .get_or_insert_default()
            .push(mount.volume_mount());
    }

    /// Mounts a ConfigMap (all its keys as files) read-only into the main container.
    pub(super) fn mount_config_map(&mut self, volume: &str, config_map: &str, mount_path: &str) {
        self.add_volume(Volume {
            name: volume.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map.into(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
        self.main
            .volume_mounts
            .get_or_insert_default()
            .push(VolumeMount {
                name: volume.into(),
                mount_path: mount_path.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
    }

    /// Adds an init container running `image`, pulled as `pull` says (its pull secrets join the pod's), with
    /// `mounts`.
    pub(super) fn add_init(
        &mut self,
        mut container: Container,
        image: &str,
        pull: &ImageSpec,
        mounts: &[HostMount],
    ) {
        container.image = Some(image.into());
        container.image_pull_policy = Some(pull_policy(pull));
        for mount in mounts {
            self.add_volume(mount.volume());
            container
                .volume_mounts
                .get_or_insert_default()
                .push(mount.volume_mount());
        }
        self.pull_secrets
            .extend(pull.image_pull_secrets.iter().cloned());
        self.init_containers.push(container);
    }

    /// Holds the operand until the validator has written its ready files: the driver's always (a pre-installed
    /// driver is validated too), the toolkit's when the operand uses the toolkit and the toolkit is enabled.
    pub(super) fn await_validation(&mut self, awaits: Awaits) {
        let with_toolkit = awaits == Awaits::DriverAndToolkit;
        let name = if with_toolkit {
            "toolkit-validation"
        } else {
            "driver-validation"
        };
        let mut command = vec![NODE_AGENT, "validate", "wait", "--for", "driver"];
        if with_toolkit && self.policy.is_enabled(Component::ContainerToolkit) {
            command.extend(["--for", "toolkit"]);
        }
        let validator = self.policy.image(Component::OperatorValidator).to_owned();
        let pull = &self.policy.spec.validator.image;
        let mut wait = container(name, command);
        // It only reads the ready files, which are world-readable.
        wait.security_context = confined(User::NonRoot, &[], RootFs::ReadOnly);
        self.add_init(
            wait,
            &validator,
            pull,
            &[HostMount::validations().read_only()],
        );
    }

    fn add_volume(&mut self, volume: Volume) {
        if !self
            .volumes
            .iter()
            .any(|existing| existing.name == volume.name)
        {
            self.volumes.push(volume);
        }
    }

    /// The DaemonSet: the operand's containers with the section's settings, scheduled and updated as
    /// `spec.daemonsets` says, selecting its pods by `app` and [`DAEMONSET_LABEL`].
    pub(super) fn build(mut self) -> DaemonSet {
        let daemonsets = &self.policy.spec.daemonsets;
        let (image_spec, container_spec) = self.section;
        let overrides = self.overrides;
        let object_labels = overrides
            .labels
            .unwrap_or_else(|| daemonsets.labels.clone());
        let object_annotations = overrides
            .annotations
            .unwrap_or_else(|| daemonsets.annotations.clone());
        let app = self.component.app_name();
        let selector = [(APP_LABEL, app), (DAEMONSET_LABEL, self.name.as_str())];

        let mut main = self.main;
        main.image = Some(self.image);
        main.image_pull_policy = Some(pull_policy(image_spec));
        main.resources = container_spec.resources.as_ref().map(resources);
        main.args = non_empty(
            main.args
                .unwrap_or_default()
                .into_iter()
                .chain(container_spec.args.iter().cloned())
                .collect(),
        );
        main.env = non_empty(with_user_env(
            main.env.unwrap_or_default(),
            &container_spec.env,
        ));
        for container in std::iter::once(&mut main).chain(self.init_containers.iter_mut()) {
            let Some(mount) = simulator_state_mount(container.env.as_deref().unwrap_or_default())
            else {
                continue;
            };
            if !self.volumes.iter().any(|v| v.name == mount.volume().name) {
                self.volumes.push(mount.volume());
            }
            container
                .volume_mounts
                .get_or_insert_default()
                .push(mount.volume_mount());
        }

        let mut pod_labels = object_labels.clone();
        pod_labels.extend(self.pod_labels);
        pod_labels.extend(component_labels(self.component));
        pod_labels.extend(selector.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut pod_annotations = object_annotations.clone();
        pod_annotations.extend(self.pod_annotations);

        // Where the operand runs is the deploy affinity's to say (whatever `daemonsets.nodeSelector` says of the
        // deploy label), with the user's selector and the operand's own (a driver's OS).
        let mut node_selector = daemonsets.node_selector.clone();
        node_selector.remove(self.component.deploy_label());
        node_selector.extend(self.node_selector);
        let mut deploy = deploy_terms(self.component);
        for term in &mut deploy {
            term.match_expressions
                .get_or_insert_default()
                .extend(self.node_requirements.iter().cloned());
        }
        let affinity = with_deploy_terms(
            with_node_affinity(daemonsets.affinity.clone(), overrides.node_affinity),
            deploy,
        );

        let mut pull_secrets: Vec<String> = image_spec.image_pull_secrets.clone();
        for secret in self.pull_secrets {
            if !pull_secrets.contains(&secret) {
                pull_secrets.push(secret);
            }
        }

        let pod = PodSpec {
            containers: vec![main],
            init_containers: non_empty(self.init_containers),
            volumes: non_empty(self.volumes),
            node_selector: non_empty_map(node_selector),
            service_account_name: Some(app.into()),
            image_pull_secrets: non_empty(
                pull_secrets
                    .into_iter()
                    .map(|name| LocalObjectReference { name })
                    .collect(),
            ),
            tolerations: non_empty(
                overrides
                    .tolerations
                    .unwrap_or_else(|| daemonsets.tolerations.clone()),
            ),
            priority_class_name: overrides
                .priority_class_name
                .or_else(|| daemonsets.priority_class_name.clone()),
            affinity: Some(affinity),
            security_context: overrides
                .pod_security_context
                .or_else(|| daemonsets.pod_security_context.clone()),
            host_pid: self.host_pid.then_some(true),
            host_ipc: self.host_ipc.then_some(true),
            host_network: self.host_network.then_some(true),
            // Pods on the host network would otherwise resolve with the node's DNS, not the cluster's.
            dns_policy: self.host_network.then(|| "ClusterFirstWithHostNet".into()),
            ..PodSpec::default()
        };
        DaemonSet {
            metadata: object_meta(
                self.policy,
                self.facts,
                self.component,
                &self.name,
                &object_labels,
                &object_annotations,
            ),
            spec: DaemonSetSpec {
                selector: LabelSelector {
                    match_labels: Some(
                        selector
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..LabelSelector::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(pod_labels),
                        annotations: non_empty_map(pod_annotations),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(pod),
                },
                update_strategy: Some(self.update_strategy),
                ..DaemonSetSpec::default()
            },
            status: None,
        }
    }
}

/// Pod settings an operand takes from its own object instead of `spec.daemonsets`; each replaces the
/// `spec.daemonsets` setting when set, as NVIDIA's operator renders an NVIDIADriver's DaemonSets from the
/// NVIDIADriver alone (its chart copies `daemonsets.tolerations` into the default NVIDIADriver for that reason).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct PodOverrides {
    pub labels: Option<BTreeMap<String, String>>,
    pub annotations: Option<BTreeMap<String, String>>,
    pub tolerations: Option<Vec<Toleration>>,
    pub priority_class_name: Option<String>,
    pub pod_security_context: Option<PodSecurityContext>,
    /// Replaces the node affinity of `daemonsets.affinity`, keeping its pod (anti-)affinity.
    pub node_affinity: Option<NodeAffinity>,
}

fn with_node_affinity(
    affinity: Option<Affinity>,
    node_affinity: Option<NodeAffinity>,
) -> Option<Affinity> {
    match node_affinity {
        None => affinity,
        Some(node_affinity) => Some(Affinity {
            node_affinity: Some(node_affinity),
            ..affinity.unwrap_or_default()
        }),
    }
}

/// `affinity` with its required node affinity narrowed to `deploy`: each of the user's terms joined with each of
/// ours, since a node must match one of each (Kubernetes ORs terms and ANDs the requirements within one).
fn with_deploy_terms(affinity: Option<Affinity>, deploy: Vec<NodeSelectorTerm>) -> Affinity {
    let mut affinity = affinity.unwrap_or_default();
    let node_affinity = affinity.node_affinity.get_or_insert_default();
    let users = node_affinity
        .required_during_scheduling_ignored_during_execution
        .take()
        .map(|selector| selector.node_selector_terms)
        .filter(|terms| !terms.is_empty());
    let terms = match users {
        None => deploy,
        Some(users) => users
            .iter()
            .flat_map(|user| {
                deploy.iter().map(move |ours| {
                    let joined =
                        |a: &Option<Vec<NodeSelectorRequirement>>,
                         b: &Option<Vec<NodeSelectorRequirement>>| {
                            non_empty(a.iter().chain(b).flatten().cloned().collect())
                        };
                    NodeSelectorTerm {
                        match_expressions: joined(&user.match_expressions, &ours.match_expressions),
                        match_fields: joined(&user.match_fields, &ours.match_fields),
                    }
                })
            })
            .collect(),
    };
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: terms,
    });
    affinity
}

/// `daemonsets.updateStrategy`: OnDelete, or RollingUpdate with `daemonsets.rollingUpdate.maxUnavailable`, else 1.
pub(super) fn update_strategy(daemonsets: &DaemonsetsSpec) -> DaemonSetUpdateStrategy {
    if daemonsets.update_strategy == "OnDelete" {
        return on_delete();
    }
    // An empty string is unset, as NVIDIA's operator reads it (its values file may leave it empty).
    let set = |value: &&IntOrString| !matches!(value, IntOrString::String(text) if text.is_empty());
    let max_unavailable = daemonsets
        .rolling_update
        .as_ref()
        .and_then(|r| r.max_unavailable.as_ref())
        .filter(set)
        .map_or(IntOrString::Int(1), kubernetes_int_or_percent);
    DaemonSetUpdateStrategy {
        type_: Some("RollingUpdate".into()),
        rolling_update: Some(RollingUpdateDaemonSet {
            max_unavailable: Some(max_unavailable),
            ..RollingUpdateDaemonSet::default()
        }),
    }
}

/// NVIDIA's ClusterPolicy types `maxUnavailable` as a string, so users write `"1"`; Kubernetes accepts a
/// string there only as a percentage. A string of digits becomes the number it spells.
fn kubernetes_int_or_percent(value: &IntOrString) -> IntOrString {
    match value {
        IntOrString::String(text) => text
            .parse()
            .map_or_else(|_| value.clone(), IntOrString::Int),
        IntOrString::Int(_) => value.clone(),
    }
}

pub(super) fn on_delete() -> DaemonSetUpdateStrategy {
    DaemonSetUpdateStrategy {
        type_: Some("OnDelete".into()),
        rolling_update: None,
    }
}

/// The section's pull policy, IfNotPresent when unset or unknown (validation warns about the latter).
fn pull_policy(image: &ImageSpec) -> String {
    image.pull_policy().to_owned()
}

fn resources(spec: &SpecResources) -> ResourceRequirements {
    ResourceRequirements {
        limits: non_empty_map(spec.limits.clone()),
        requests: non_empty_map(spec.requests.clone()),
        ..ResourceRequirements::default()
    }
}

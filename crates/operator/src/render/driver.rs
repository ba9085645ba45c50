//! The NVIDIA driver container, NVIDIA's image: one DaemonSet per OS pool (`nvidia-driver-daemonset-<pool>`,
//! image tag `<version>-<pool>`), or with `usePrecompiled` one per OS pool and kernel
//! (`nvidia-driver-daemonset-<kernel>-<pool>`, tag `<version>-<kernel>-<pool>`). Pools come from the GPU nodes
//! present, so a mixed Ubuntu/RHEL cluster gets a driver on every node instead of one OS tag for all.

use std::collections::{BTreeMap, BTreeSet};

use crd::cluster_policy::{
    ContainerProbeSpec, ContainerSpec, DriverSpec, ImageAndEnvSpec, ImageSpec,
};
use crd::labels::{DRIVER_OWNER, NFD_KERNEL_VERSION, NFD_OS_ID, NFD_OS_VERSION_ID};
use k8s_openapi::api::core::v1::{EnvFromSource, ExecAction, Probe, SecretEnvSource};

use super::RenderedObject;
use super::common::{
    HostMount, OperandDaemonSet, PodOverrides, RootFs, config_map_name, container, env,
    node_name_env, object_name, on_delete, privileged, with_user_env,
};
use crate::model::{AssignedDriver, ClusterFacts, Component, OsPool, ValidatedPolicy};

/// The probe command: the driver is up once the host kernel has the `nvidia` module loaded (`lsmod` reads the
/// host's /proc/modules). Simple on purpose: the validator checks the driver in depth before any GPU client
/// starts; this only tells the DaemonSet when the pod is ready.
const PROBE_COMMAND: &str = "lsmod | grep -q '^nvidia '";

/// Startup probe timings when the spec sets none: NVIDIA's, which allow 20 minutes for a driver build.
const STARTUP_DEFAULTS: ContainerProbeSpec = ContainerProbeSpec {
    initial_delay_seconds: Some(60),
    timeout_seconds: Some(60),
    period_seconds: Some(10),
    success_threshold: None,
    failure_threshold: Some(120),
};

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let sources = if policy.spec.driver.use_nvidia_driver_crd == Some(true) {
        facts
            .nvidia_drivers
            .iter()
            .map(|driver| DriverSource::nvidia_driver(policy, driver))
            .collect()
    } else {
        vec![DriverSource::cluster_policy(policy)]
    };
    sources
        .iter()
        .flat_map(|source| {
            source.pools(facts).into_iter().map(|(pool, kernel)| {
                pool_daemonset(policy, facts, source, &pool, kernel.as_deref())
            })
        })
        .collect()
}

/// What a family of driver DaemonSets (one per OS pool, or pool and kernel) is made from: the ClusterPolicy's
/// driver section, or one NVIDIADriver.
struct DriverSource<'a> {
    /// The DaemonSets' name before the pool suffix.
    stem: String,
    /// The image before the pool suffix.
    image: String,
    use_precompiled: bool,
    kernel_module_type: String,
    secret_env: Option<&'a str>,
    startup_probe: Option<&'a ContainerProbeSpec>,
    liveness_probe: Option<&'a ContainerProbeSpec>,
    readiness_probe: Option<&'a ContainerProbeSpec>,
    repo_config: Option<&'a str>,
    cert_config: Option<&'a str>,
    kernel_module_config: Option<&'a str>,
    manager: Option<&'a ImageAndEnvSpec>,
    manager_image: Option<String>,
    /// The NVIDIADriver's name; none for the ClusterPolicy's driver.
    nvidia_driver: Option<&'a str>,
    /// The nodes the NVIDIADriver was given; none for the ClusterPolicy's driver.
    assigned: Option<&'a BTreeSet<String>>,
    /// The NVIDIADriver's pull settings, resources, args and env.
    section: Option<(&'a ImageSpec, &'a ContainerSpec)>,
    overrides: PodOverrides,
}

impl<'a> DriverSource<'a> {
    fn cluster_policy(policy: &'a ValidatedPolicy) -> Self {
        let driver = &policy.spec.driver;
        DriverSource {
            stem: Component::Driver.app_name().into(),
            image: policy.image(Component::Driver).into(),
            use_precompiled: driver.use_precompiled == Some(true),
            kernel_module_type: kernel_module_type(driver),
            secret_env: driver.secret_env.as_deref(),
            startup_probe: driver.startup_probe.as_ref(),
            liveness_probe: driver.liveness_probe.as_ref(),
            readiness_probe: driver.readiness_probe.as_ref(),
            repo_config: driver
                .repo_config
                .as_ref()
                .and_then(|c| c.config_map_name.as_deref()),
            cert_config: config_map_name(driver.cert_config.as_ref()),
            kernel_module_config: config_map_name(driver.kernel_module_config.as_ref()),
            manager: driver.manager.as_ref(),
            manager_image: policy.driver_manager_image.clone(),
            nvidia_driver: None,
            assigned: None,
            section: None,
            overrides: PodOverrides::default(),
        }
    }

    fn nvidia_driver(policy: &'a ValidatedPolicy, driver: &'a AssignedDriver) -> Self {
        let spec = &driver.spec;
        let set = |map: &BTreeMap<String, String>| (!map.is_empty()).then(|| map.clone());
        DriverSource {
            // NVIDIA names them nvidia-gpu-driver-<os>-<hash>; the object's name here says which object it is.
            stem: format!("nvidia-gpu-driver-{}", driver.name),
            image: spec.image.reference().unwrap_or_default(),
            use_precompiled: spec.use_precompiled == Some(true),
            kernel_module_type: spec.kernel_module_type.as_str().into(),
            secret_env: spec.secret_env.as_deref(),
            startup_probe: spec.startup_probe.as_ref(),
            liveness_probe: spec.liveness_probe.as_ref(),
            readiness_probe: spec.readiness_probe.as_ref(),
            repo_config: config_map_name(spec.repo_config.as_ref()),
            cert_config: config_map_name(spec.cert_config.as_ref()),
            kernel_module_config: config_map_name(spec.kernel_module_config.as_ref()),
            manager: spec.manager.as_ref(),
            manager_image: spec
                .manager
                .as_ref()
                .and_then(|manager| manager.image.reference())
                .or_else(|| policy.driver_manager_image.clone()),
            nvidia_driver: Some(&driver.name),
            assigned: Some(&driver.nodes),
            section: Some((&spec.image, &spec.container)),
            overrides: PodOverrides {
                labels: set(&spec.labels),
                annotations: set(&spec.annotations),
                tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
                priority_class_name: spec.priority_class_name.clone(),
                pod_security_context: spec.pod_security_context.clone(),
                node_affinity: spec.node_affinity.clone(),
            },
        }
    }

    /// The OS pools (with kernels, for precompiled drivers) of the nodes this source drives.
    fn pools(&self, facts: &ClusterFacts) -> Vec<(OsPool, Option<String>)> {
        let drives = |node: &str| self.assigned.is_none_or(|nodes| nodes.contains(node));
        if self.use_precompiled {
            facts
                .os_kernel_pools_among(drives)
                .into_iter()
                .map(|(pool, kernel)| (pool, Some(kernel)))
                .collect()
        } else {
            facts
                .os_pools_among(drives)
                .into_iter()
                .map(|pool| (pool, None))
                .collect()
        }
    }
}

/// The driver DaemonSet of one OS pool (and kernel, for precompiled drivers).
fn pool_daemonset(
    policy: &ValidatedPolicy,
    facts: &ClusterFacts,
    source: &DriverSource<'_>,
    pool: &OsPool,
    kernel: Option<&str>,
) -> RenderedObject {
    let suffix = match kernel {
        Some(kernel) => format!("{kernel}-{pool}"),
        None => pool.to_string(),
    };
    let mut ds = OperandDaemonSet::new(policy, facts, Component::Driver);
    // The pool that takes over NVIDIA's one driver DaemonSet keeps its name, so that it is applied over in place
    // and its running pods stay (see `handover`). Only the ClusterPolicy's driver takes it over.
    ds.name = if source.nvidia_driver.is_none()
        && kernel.is_none()
        && facts.nvidia_driver_pool.as_ref() == Some(pool)
    {
        crate::handover::NVIDIA_DRIVER_DAEMONSET.into()
    } else {
        object_name(&format!("{}-{suffix}", source.stem))
    };
    ds.image = pool_image(&source.image, &suffix);
    // An NVIDIADriver's pods go where the operator wrote the object's name in the owner label: its nodeSelector
    // alone cannot say it for a default object, which takes the nodes no other object picks.
    if let Some(object) = source.nvidia_driver {
        ds.node_selector.insert(DRIVER_OWNER.into(), object.into());
    }
    ds.node_selector.insert(NFD_OS_ID.into(), pool.id.clone());
    ds.node_selector
        .insert(NFD_OS_VERSION_ID.into(), pool.version_id.clone());
    if let Some(kernel) = kernel {
        ds.node_selector
            .insert(NFD_KERNEL_VERSION.into(), kernel.into());
    }
    if let Some(section) = source.section {
        ds.section = section;
    }
    ds.overrides = source.overrides.clone();
    ds.update_strategy = driver_update_strategy();
    // NVIDIA's image looks for the host's processes that hold the driver before it unloads the modules.
    ds.host_pid = true;

    ds.main = container("nvidia-driver-ctr", ["nvidia-driver", "init"]);
    ds.main.env = Some(vec![env(
        "KERNEL_MODULE_TYPE",
        source.kernel_module_type.clone(),
    )]);
    ds.main.env_from = source
        .secret_env
        .filter(|name| !name.is_empty())
        .map(|name| {
            vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: name.into(),
                    optional: None,
                }),
                ..EnvFromSource::default()
            }]
        });
    // Privileged, with a writable root (NVIDIA's image): it loads kernel modules, builds them in its own
    // filesystem, and exposes that filesystem to the host through /run/nvidia.
    ds.main.security_context = privileged(RootFs::Writable);
    ds.main.startup_probe = Some(probe(source.startup_probe, &STARTUP_DEFAULTS));
    ds.main.liveness_probe = source
        .liveness_probe
        .map(|spec| probe(Some(spec), &ContainerProbeSpec::default()));
    ds.main.readiness_probe = source
        .readiness_probe
        .map(|spec| probe(Some(spec), &ContainerProbeSpec::default()));

    ds.mount(&run_nvidia());
    ds.mount(&HostMount::same("var-log", "/var/log"));
    ds.mount(&HostMount::same("dev-log", "/dev/log"));
    ds.mount(&HostMount::host_root(policy));
    // Firmware (GSP) the container installs must land where the host kernel loads firmware from.
    ds.mount(&HostMount::same("firmware", "/lib/firmware"));
    if let Some(name) = source.repo_config.filter(|name| !name.is_empty()) {
        ds.mount_config_map("repo-config", name, repo_config_dir(&pool.id));
    }
    if let Some(name) = source.cert_config {
        ds.mount_config_map("cert-config", name, cert_config_dir(&pool.id));
    }
    if let Some(name) = source.kernel_module_config {
        ds.mount_config_map("kernel-module-config", name, "/drivers");
    }

    if let Some(image) = &source.manager_image {
        let mut init = container("k8s-driver-manager", ["driver-manager", "uninstall_driver"]);
        init.env = Some(with_user_env(
            vec![node_name_env()],
            source.manager.map_or(&[], |m| m.env.as_slice()),
        ));
        // Privileged (NVIDIA's image): it unloads the driver's kernel modules and stops their host users.
        init.security_context = privileged(RootFs::Writable);
        let default_pull = ImageSpec::default();
        let pull = source.manager.map_or(&default_pull, |m| &m.image);
        ds.add_init(
            init,
            image,
            pull,
            &[run_nvidia(), HostMount::host_root(policy)],
        );
    }
    let mut daemonset = ds.build();
    if let Some(object) = source.nvidia_driver {
        daemonset
            .metadata
            .labels
            .get_or_insert_default()
            .insert(DRIVER_OWNER.into(), object.into());
    }
    daemonset.into()
}

/// `/run/nvidia`, where the driver container exposes its root filesystem (`/run/nvidia/driver`) to the host
/// and to the other operands: the mount must propagate back to the host, hence Bidirectional.
fn run_nvidia() -> HostMount {
    HostMount::same("run-nvidia", "/run/nvidia").propagation("Bidirectional")
}

/// The pool's image: `<version>-<suffix>` as the tag. A digest names one image for every pool and is used as
/// is; so is a reference without a tag, which names no version to suffix.
fn pool_image(image: &str, suffix: &str) -> String {
    let name_start = image.rfind('/').map_or(0, |slash| slash + 1);
    if image.contains('@') || !image[name_start..].contains(':') {
        return image.into();
    }
    format!("{image}-{suffix}")
}

/// Always OnDelete: a driver pod is replaced only when it is deleted, since replacing a loaded driver stops every
/// GPU workload on the node. With `upgradePolicy.autoUpgrade` the operator's upgrade controller deletes each old
/// pod once its node is cordoned and its GPU users are gone (NVIDIA's operator sets OnDelete for the same reason);
/// without it, an admin does. `daemonsets.updateStrategy` never applies to the driver: a rolling update would
/// replace drivers under running jobs.
fn driver_update_strategy() -> k8s_openapi::api::apps::v1::DaemonSetUpdateStrategy {
    on_delete()
}

/// `kernelModuleType`, except that the deprecated `useOpenKernelModules: true` still means `open` where the
/// type was left at `auto`.
fn kernel_module_type(driver: &DriverSpec) -> String {
    match driver.kernel_module_type.as_str() {
        "auto" if driver.use_open_kernel_modules == Some(true) => "open".into(),
        other => other.into(),
    }
}

/// An exec probe running [`PROBE_COMMAND`], each timing from the spec or else from `defaults`.
fn probe(spec: Option<&ContainerProbeSpec>, defaults: &ContainerProbeSpec) -> Probe {
    let spec = spec.unwrap_or(defaults);
    Probe {
        exec: Some(ExecAction {
            command: Some(vec!["sh".into(), "-c".into(), PROBE_COMMAND.into()]),
        }),
        initial_delay_seconds: spec
            .initial_delay_seconds
            .or(defaults.initial_delay_seconds),
        timeout_seconds: spec.timeout_seconds.or(defaults.timeout_seconds),
        period_seconds: spec.period_seconds.or(defaults.period_seconds),
        success_threshold: spec.success_threshold.or(defaults.success_threshold),
        failure_threshold: spec.failure_threshold.or(defaults.failure_threshold),
        ..Probe::default()
    }
}

/// Where the distribution's package manager reads repository files (`repoConfig`), as NVIDIA's operator mounts
/// them.
fn repo_config_dir(os_id: &str) -> &'static str {
    match os_id {
        "ubuntu" | "debian" => "/etc/apt/sources.list.d",
        "sles" | "sl-micro" | "opensuse-leap" => "/etc/zypp/repos.d",
        _ => "/etc/yum.repos.d",
    }
}

/// Where the distribution reads extra CA certificates (`certConfig`), as NVIDIA's operator mounts them.
fn cert_config_dir(os_id: &str) -> &'static str {
    match os_id {
        "ubuntu" | "debian" => "/usr/local/share/ca-certificates",
        "sles" | "sl-micro" | "opensuse-leap" => "/etc/pki/trust/anchors",
        _ => "/etc/pki/ca-trust/extracted/pem",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_tags_suffix_the_version_only() {
        assert_eq!(
            pool_image("nvcr.io/nvidia/driver:570.172.08", "ubuntu22.04"),
            "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04"
        );
        assert_eq!(
            pool_image("localhost:5000/driver:570", "rhel9.4"),
            "localhost:5000/driver:570-rhel9.4"
        );
        assert_eq!(
            pool_image("nvcr.io/nvidia/driver@sha256:abc", "ubuntu22.04"),
            "nvcr.io/nvidia/driver@sha256:abc"
        );
        assert_eq!(
            pool_image("localhost:5000/driver", "ubuntu22.04"),
            "localhost:5000/driver"
        );
    }
}

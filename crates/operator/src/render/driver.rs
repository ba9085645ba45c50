//! The NVIDIA driver container, NVIDIA's image: one DaemonSet per OS pool (`nvidia-driver-daemonset-<pool>`,
//! image tag `<version>-<pool>`), or with `usePrecompiled` one per OS pool and kernel
//! (`nvidia-driver-daemonset-<kernel>-<pool>`, tag `<version>-<kernel>-<pool>`). Pools come from the GPU nodes
//! present, so a mixed Ubuntu/RHEL cluster gets a driver on every node instead of one OS tag for all.

use crd::cluster_policy::{ContainerProbeSpec, DriverSpec, ImageSpec};
use crd::labels::{NFD_KERNEL_VERSION, NFD_OS_ID, NFD_OS_VERSION_ID};
use k8s_openapi::api::core::v1::{EnvFromSource, ExecAction, Probe, SecretEnvSource};

use super::RenderedObject;
use super::common::{
    HostMount, OperandDaemonSet, RootFs, config_map_name, container, env, node_name_env,
    object_name, on_delete, privileged, with_user_env,
};
use crate::model::{ClusterFacts, Component, OsPool, ValidatedPolicy};

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
    if policy.spec.driver.use_precompiled == Some(true) {
        facts
            .os_kernel_pools()
            .iter()
            .map(|(pool, kernel)| pool_daemonset(policy, facts, pool, Some(kernel)))
            .collect()
    } else {
        facts
            .os_pools()
            .iter()
            .map(|pool| pool_daemonset(policy, facts, pool, None))
            .collect()
    }
}

/// The driver DaemonSet of one OS pool (and kernel, for precompiled drivers).
fn pool_daemonset(
    policy: &ValidatedPolicy,
    facts: &ClusterFacts,
    pool: &OsPool,
    kernel: Option<&str>,
) -> RenderedObject {
    let driver = &policy.spec.driver;
    let suffix = match kernel {
        Some(kernel) => format!("{kernel}-{pool}"),
        None => pool.to_string(),
    };
    let mut ds = OperandDaemonSet::new(policy, facts, Component::Driver);
    ds.name = object_name(&format!("{}-{suffix}", Component::Driver.app_name()));
    ds.image = pool_image(policy.image(Component::Driver), &suffix);
    ds.node_selector.insert(NFD_OS_ID.into(), pool.id.clone());
    ds.node_selector
        .insert(NFD_OS_VERSION_ID.into(), pool.version_id.clone());
    if let Some(kernel) = kernel {
        ds.node_selector
            .insert(NFD_KERNEL_VERSION.into(), kernel.into());
    }
    ds.update_strategy = driver_update_strategy();
    // NVIDIA's image looks for the host's processes that hold the driver before it unloads the modules.
    ds.host_pid = true;

    ds.main = container("nvidia-driver-ctr", ["nvidia-driver", "init"]);
    ds.main.env = Some(vec![env("KERNEL_MODULE_TYPE", kernel_module_type(driver))]);
    ds.main.env_from = driver
        .secret_env
        .as_ref()
        .filter(|name| !name.is_empty())
        .map(|name| {
            vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: name.clone(),
                    optional: None,
                }),
                ..EnvFromSource::default()
            }]
        });
    // Privileged, with a writable root (NVIDIA's image): it loads kernel modules, builds them in its own
    // filesystem, and exposes that filesystem to the host through /run/nvidia.
    ds.main.security_context = privileged(RootFs::Writable);
    ds.main.startup_probe = Some(probe(driver.startup_probe.as_ref(), &STARTUP_DEFAULTS));
    ds.main.liveness_probe = driver
        .liveness_probe
        .as_ref()
        .map(|spec| probe(Some(spec), &ContainerProbeSpec::default()));
    ds.main.readiness_probe = driver
        .readiness_probe
        .as_ref()
        .map(|spec| probe(Some(spec), &ContainerProbeSpec::default()));

    ds.mount(&run_nvidia());
    ds.mount(&HostMount::same("var-log", "/var/log"));
    ds.mount(&HostMount::same("dev-log", "/dev/log"));
    ds.mount(&HostMount::host_root(policy));
    // Firmware (GSP) the container installs must land where the host kernel loads firmware from.
    ds.mount(&HostMount::same("firmware", "/lib/firmware"));
    let repo_config = driver
        .repo_config
        .as_ref()
        .and_then(|c| c.config_map_name.as_deref());
    if let Some(name) = repo_config.filter(|name| !name.is_empty()) {
        ds.mount_config_map("repo-config", name, repo_config_dir(&pool.id));
    }
    if let Some(name) = config_map_name(driver.cert_config.as_ref()) {
        ds.mount_config_map("cert-config", name, cert_config_dir(&pool.id));
    }
    if let Some(name) = config_map_name(driver.kernel_module_config.as_ref()) {
        ds.mount_config_map("kernel-module-config", name, "/drivers");
    }

    if let Some(image) = &policy.driver_manager_image {
        let manager = driver.manager.as_ref();
        let mut init = container("k8s-driver-manager", ["driver-manager", "uninstall_driver"]);
        init.env = Some(with_user_env(
            vec![node_name_env()],
            manager.map_or(&[], |m| m.env.as_slice()),
        ));
        // Privileged (NVIDIA's image): it unloads the driver's kernel modules and stops their host users.
        init.security_context = privileged(RootFs::Writable);
        let default_pull = ImageSpec::default();
        let pull = manager.map_or(&default_pull, |m| &m.image);
        ds.add_init(
            init,
            image,
            pull,
            &[run_nvidia(), HostMount::host_root(policy)],
        );
    }
    ds.build().into()
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

//! The NVIDIA container toolkit, NVIDIA's image (run with its own entrypoint, configured by environment): one
//! DaemonSet per container runtime present, because containerd, k3s, RKE2, CRI-O and Docker keep their
//! configuration and socket in different places and a DaemonSet cannot select nodes by `status.nodeInfo`. Each
//! selects its nodes by the runtime label the operator writes
//! ([`RUNTIME_LABEL`](crate::model::facts::RUNTIME_LABEL)), as [`runtime_requirement`] rules: where the cluster
//! has one runtime, also before the label is written.

use std::collections::BTreeSet;

use super::RenderedObject;
use super::common::{Awaits, HostMount, OperandDaemonSet, RootFs, env, privileged, split_path};
use crate::model::{ClusterFacts, Component, ContainerRuntime, ValidatedPolicy};
use crate::plan::labels::runtime_requirement;

/// Where the runtime's configuration folder is mounted; `RUNTIME_CONFIG` points into it.
const CONFIG_DIR: &str = "/runtime/config-dir";
/// Where the runtime's socket folder is mounted; `RUNTIME_SOCKET` points into it.
const SOCKET_DIR: &str = "/runtime/sock-dir";

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let present = facts.runtimes();
    present
        .iter()
        .map(|runtime| runtime_daemonset(policy, facts, *runtime, &present))
        .collect()
}

fn runtime_daemonset(
    policy: &ValidatedPolicy,
    facts: &ClusterFacts,
    runtime: ContainerRuntime,
    present: &BTreeSet<ContainerRuntime>,
) -> RenderedObject {
    let spec = &policy.spec;
    let install_dir = spec.toolkit.install_dir.as_str();
    let (config_dir, config_file) = split_path(runtime.config_path());
    let (socket_dir, socket_file) = split_path(runtime.socket_path());

    let mut ds = OperandDaemonSet::new(policy, facts, Component::ContainerToolkit);
    // Plain containerd keeps NVIDIA's name, which users' scripts know.
    if runtime != ContainerRuntime::Containerd {
        ds.name = format!(
            "{}-{}",
            Component::ContainerToolkit.app_name(),
            runtime.name()
        );
    }
    ds.node_requirements
        .push(runtime_requirement(runtime, present));
    ds.main.name = "nvidia-container-toolkit-ctr".into();
    ds.main.env = Some(vec![
        env("RUNTIME", runtime.toolkit_runtime()),
        env("RUNTIME_CONFIG", format!("{CONFIG_DIR}/{config_file}")),
        env("RUNTIME_SOCKET", format!("{SOCKET_DIR}/{socket_file}")),
        env(
            "CONTAINERD_RUNTIME_CLASS",
            spec.operator.runtime_class.clone(),
        ),
        env("CDI_ENABLED", spec.cdi.enabled.unwrap_or(true).to_string()),
        env("TOOLKIT_INSTALL_DIR", install_dir),
    ]);
    // Privileged, with a writable root (NVIDIA's image): it writes the host's runtime configuration, installs the
    // runtime into the host, and has the runtime reload through its socket.
    ds.main.security_context = privileged(RootFs::Writable);
    ds.mount(&HostMount::new(
        "runtime-config-dir",
        &config_dir,
        CONFIG_DIR,
    ));
    ds.mount(&HostMount::new(
        "runtime-socket-dir",
        &socket_dir,
        SOCKET_DIR,
    ));
    ds.mount(&HostMount::same("toolkit-install-dir", install_dir).create());
    // The driver container's root (/run/nvidia/driver) and the validator's ready files.
    ds.mount(&HostMount::same("run-nvidia", "/run/nvidia").propagation("HostToContainer"));
    ds.await_validation(Awaits::Driver);
    ds.build().into()
}

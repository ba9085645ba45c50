//! The pieces operand containers are made of: command lines, env (and how the user's env layers over the
//! operator's), ports, host-path mounts, and valid object names.

use std::collections::BTreeMap;
use std::path::Path;

use crd::cluster_policy::{ConfigMapRef, EnvVar as SpecEnvVar};
use crd::paths::VALIDATIONS_DIR;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HostPathVolumeSource,
    ObjectFieldSelector, SeccompProfile, SecurityContext, Volume, VolumeMount,
};

use crate::model::{ClusterFacts, ValidatedPolicy};

/// A container whose command is the first word of `command_line` and whose args are the rest.
pub(in crate::render) fn container<S: Into<String>>(
    name: &str,
    command_line: impl IntoIterator<Item = S>,
) -> Container {
    let mut words = command_line.into_iter().map(Into::into);
    Container {
        name: name.into(),
        command: words.next().map(|command| vec![command]),
        args: non_empty(words.collect()),
        ..Container::default()
    }
}

/// The non-root user of this project's images (`nonroot` in their `/etc/passwd`).
pub(in crate::render) const NON_ROOT_USER: i64 = 65532;

/// Who a confined container runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::render) enum User {
    /// Root, for a container that writes root-owned host folders, connects to the kubelet's root-only sockets or
    /// needs the root-only MIG capability devices; its capabilities are still dropped.
    Root,
    /// The images' non-root user: the container only reads world-readable files and talks to the API server.
    NonRoot,
}

/// Whether a container may write its own image's filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::render) enum RootFs {
    ReadOnly,
    /// Only for NVIDIA's images, which write into their own filesystem (driver builds, logs).
    Writable,
}

/// A privileged container: every device, every capability, the host's sysfs writable. Only where the real work
/// needs it; `render/privileges.rs` says why for each.
pub(in crate::render) fn privileged(root_fs: RootFs) -> Option<SecurityContext> {
    Some(SecurityContext {
        privileged: Some(true),
        read_only_root_filesystem: (root_fs == RootFs::ReadOnly).then_some(true),
        ..SecurityContext::default()
    })
}

/// An unprivileged container: every capability dropped but `add`, no privilege escalation (setuid binaries, file
/// capabilities), the runtime's default seccomp profile, and the user and root filesystem given.
pub(in crate::render) fn confined(
    user: User,
    add: &[&str],
    root_fs: RootFs,
) -> Option<SecurityContext> {
    let non_root = user == User::NonRoot;
    Some(SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            add: non_empty(
                add.iter()
                    .map(|capability| (*capability).to_owned())
                    .collect(),
            ),
            drop: Some(vec!["ALL".into()]),
        }),
        read_only_root_filesystem: Some(root_fs == RootFs::ReadOnly),
        run_as_non_root: non_root.then_some(true),
        run_as_user: Some(if non_root { NON_ROOT_USER } else { 0 }),
        run_as_group: Some(if non_root { NON_ROOT_USER } else { 0 }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    })
}

/// The env that makes the NVIDIA container runtime give a container every GPU: device nodes, the device-cgroup
/// rules to open them, and `libnvidia-ml.so.1` with the driver's utilities (`nvidia-smi`). An unprivileged
/// container has no other way to the GPUs; a privileged one sees the device nodes but still needs the library.
pub(in crate::render) fn gpu_access_env() -> [EnvVar; 2] {
    [
        env("NVIDIA_VISIBLE_DEVICES", "all"),
        env("NVIDIA_DRIVER_CAPABILITIES", "utility,compute"),
    ]
}

pub(in crate::render) fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// `NODE_NAME`, from the pod's node: node agents act on (and report for) their own node.
pub(in crate::render) fn node_name_env() -> EnvVar {
    EnvVar {
        name: "NODE_NAME".into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "spec.nodeName".into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// `OPERATOR_NAMESPACE`: where the ConfigMaps the policy names live.
pub(in crate::render) fn namespace_env(facts: &ClusterFacts) -> EnvVar {
    env("OPERATOR_NAMESPACE", facts.namespace.clone())
}

/// The operator's env with the user's on top: a user variable replaces the operator's of the same name in
/// place, and new ones follow in the user's order.
pub(in crate::render) fn with_user_env(mut env: Vec<EnvVar>, user: &[SpecEnvVar]) -> Vec<EnvVar> {
    for var in user {
        let var = EnvVar {
            name: var.name.clone(),
            value: var.value.clone(),
            value_from: None,
        };
        match env.iter_mut().find(|existing| existing.name == var.name) {
            Some(existing) => *existing = var,
            None => env.push(var),
        }
    }
    env
}

pub(in crate::render) fn port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

pub(in crate::render) fn non_empty<T>(items: Vec<T>) -> Option<Vec<T>> {
    (!items.is_empty()).then_some(items)
}

pub(in crate::render) fn non_empty_map<V>(map: BTreeMap<String, V>) -> Option<BTreeMap<String, V>> {
    (!map.is_empty()).then_some(map)
}

/// The ConfigMap a `{name: ...}` section names; `None` when absent or empty (an empty name turns it off).
pub(in crate::render) fn config_map_name(reference: Option<&ConfigMapRef>) -> Option<&str> {
    reference
        .and_then(|r| r.name.as_deref())
        .filter(|name| !name.is_empty())
}

/// A host path mounted into a container.
#[derive(Clone, Debug)]
pub(in crate::render) struct HostMount {
    name: &'static str,
    host_path: String,
    mount_path: String,
    read_only: bool,
    create: bool,
    propagation: Option<&'static str>,
}

impl HostMount {
    pub(in crate::render) fn new(name: &'static str, host_path: &str, mount_path: &str) -> Self {
        Self {
            name,
            host_path: host_path.into(),
            mount_path: mount_path.into(),
            read_only: false,
            create: false,
            propagation: None,
        }
    }

    /// A host path at the same path in the container.
    pub(in crate::render) fn same(name: &'static str, path: &str) -> Self {
        Self::new(name, path, path)
    }

    /// The validator's ready files, created on first use so that waiting operands can start before it.
    pub(in crate::render) fn validations() -> Self {
        Self::same("run-nvidia-validations", VALIDATIONS_DIR).create()
    }

    /// The kubelet's pod-resources folder (under `hostPaths.kubeletRootDir`), read-only at the host's path: its
    /// socket says which pod holds which device, and which devices the node advertises.
    pub(in crate::render) fn pod_resources(policy: &ValidatedPolicy) -> Self {
        let kubelet_root = &policy.spec.host_paths.kubelet_root_dir;
        Self::same("pod-resources", &format!("{kubelet_root}/pod-resources")).read_only()
    }

    /// The host's root filesystem (`hostPaths.rootFS`) at `/host`, read-only, seeing mounts made later.
    pub(in crate::render) fn host_root(policy: &ValidatedPolicy) -> Self {
        Self::new("host-root", &policy.spec.host_paths.root_fs, "/host")
            .read_only()
            .propagation("HostToContainer")
    }

    pub(in crate::render) fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Creates the folder on the host when missing (`DirectoryOrCreate`).
    pub(in crate::render) fn create(mut self) -> Self {
        self.create = true;
        self
    }

    pub(in crate::render) fn propagation(mut self, propagation: &'static str) -> Self {
        self.propagation = Some(propagation);
        self
    }

    pub(super) fn volume(&self) -> Volume {
        Volume {
            name: self.name.into(),
            host_path: Some(HostPathVolumeSource {
                path: self.host_path.clone(),
                type_: self.create.then(|| "DirectoryOrCreate".into()),
            }),
            ..Volume::default()
        }
    }

    pub(super) fn volume_mount(&self) -> VolumeMount {
        VolumeMount {
            name: self.name.into(),
            mount_path: self.mount_path.clone(),
            read_only: self.read_only.then_some(true),
            mount_propagation: self.propagation.map(Into::into),
            ..VolumeMount::default()
        }
    }
}

/// The env variable naming the simulated node's state file (read by `gpu-node-agent` and `gpu-device-plugin`,
/// with `GPU_SIMULATE`).
pub(in crate::render) const SIMULATOR_STATE_ENV: &str = "GPU_SIM_STATE";

/// When a container's env names a simulator state file by an absolute path (`GPU_SIM_STATE`, set by the user in
/// the section's `env`), that file's folder from the host, at the same path: every operand of a node must share
/// one state file, as on a real node they share the GPUs, and the simulator writes a lock file and replaces the
/// state beside it. A container without that variable (every container on real GPUs) gets no such mount.
pub(in crate::render) fn simulator_state_mount(env: &[EnvVar]) -> Option<HostMount> {
    let path = env
        .iter()
        .rev()
        .find(|var| var.name == SIMULATOR_STATE_ENV)?
        .value
        .as_deref()
        .filter(|path| Path::new(path).is_absolute())?;
    let (folder, file) = split_path(path);
    // A file directly under `/` would mount the host's root writable: no mount, and the simulator's own error.
    (!file.is_empty() && folder != "/")
        .then(|| HostMount::same("gpu-simulator-state", &folder).create())
}

/// The folder and the file name of a host path, e.g. `/etc/containerd` and `config.toml`.
pub(in crate::render) fn split_path(path: &str) -> (String, String) {
    let path = Path::new(path);
    let folder = path
        .parent()
        .map_or_else(|| "/".into(), |p| p.display().to_string());
    let file = path
        .file_name()
        .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    (folder, file)
}

/// `name` made a valid object name and label value: lower case, characters other than letters, digits, `-`
/// and `.` replaced by `-`, at most 63 characters. A longer name is cut and ends with a hash of the whole, so
/// two long names that share a prefix stay distinct.
pub(in crate::render) fn object_name(name: &str) -> String {
    const MAX: usize = 63;
    let clean: String = name
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trim = |s: &str| {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_owned()
    };
    let clean = trim(&clean);
    if clean.len() <= MAX {
        return clean;
    }
    let hash = format!("{:08x}", fnv1a(name.as_bytes()));
    format!("{}-{hash}", trim(&clean[..MAX - hash.len() - 1]))
}

/// 32-bit FNV-1a: a stable hash with no dependency, for name suffixes only.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_valid_and_distinct() {
        assert_eq!(
            object_name("nvidia-driver-daemonset-ubuntu22.04"),
            "nvidia-driver-daemonset-ubuntu22.04"
        );
        assert_eq!(object_name("Nvidia_Driver+x-"), "nvidia-driver-x");
        let a = object_name(
            "nvidia-driver-daemonset-5.15.0-1000-some-very-long-cloud-flavour-generic-ubuntu22.04",
        );
        let b = object_name(
            "nvidia-driver-daemonset-5.15.0-1000-some-very-long-cloud-flavour-generic-ubuntu24.04",
        );
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
    }

    #[test]
    fn user_env_replaces_in_place_and_appends() {
        let user = [
            SpecEnvVar {
                name: "B".into(),
                value: Some("user".into()),
            },
            SpecEnvVar {
                name: "C".into(),
                value: None,
            },
        ];
        let merged = with_user_env(vec![env("A", "1"), env("B", "2")], &user);
        let names: Vec<_> = merged
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect();
        assert_eq!(names, [("A", Some("1")), ("B", Some("user")), ("C", None)]);
    }

    #[test]
    fn only_a_simulator_state_file_in_the_env_mounts_its_host_folder() {
        let mount =
            |env: Vec<EnvVar>| simulator_state_mount(&env).map(|m| (m.volume(), m.volume_mount()));
        assert_eq!(
            mount(vec![env("GPU_SIMULATE", "node"), env("A", "/x/y")]),
            None
        );
        assert_eq!(mount(vec![env(SIMULATOR_STATE_ENV, "state.json")]), None);
        assert_eq!(mount(vec![env(SIMULATOR_STATE_ENV, "/state.json")]), None);
        let (volume, volume_mount) = mount(vec![
            env(SIMULATOR_STATE_ENV, "/old/state.json"),
            env(SIMULATOR_STATE_ENV, "/run/gpu-simulator/state.json"),
        ])
        .expect("an absolute state file is mounted");
        let host_path = volume.host_path.expect("a host path");
        assert_eq!(host_path.path, "/run/gpu-simulator");
        assert_eq!(host_path.type_.as_deref(), Some("DirectoryOrCreate"));
        assert_eq!(volume_mount.mount_path, "/run/gpu-simulator");
        assert_eq!(volume_mount.name, volume.name);
        assert_eq!(volume_mount.read_only, None);
    }

    #[test]
    fn paths_split_into_folder_and_file() {
        assert_eq!(
            split_path("/etc/containerd/config.toml"),
            ("/etc/containerd".into(), "config.toml".into())
        );
        assert_eq!(
            split_path("/var/run/docker.sock"),
            ("/var/run".into(), "docker.sock".into())
        );
    }
}

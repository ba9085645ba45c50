//! Which pod and container a process belongs to, from its `/proc/<pid>/cgroup`: the kubelet puts every pod in a
//! cgroup named after the pod's UID, and the runtime puts each container in a child named after its ID. Pure, so
//! every layout is tested on text.
//!
//! Layouts seen in the wild (`<uid>` with `-`, or `_` under the systemd driver, which reserves `-`):
//! - cgroup v2, systemd driver: `0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/`
//!   then `cri-containerd-<id>.scope` (containerd), `crio-<id>.scope` (CRI-O) or `docker-<id>.scope`;
//! - cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>` (Guaranteed pods sit right under `/kubepods`);
//! - containerd outside systemd's tree (kind, some k3s setups): `.../kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>`;
//! - cgroup v1: one line per hierarchy (`4:memory:/kubepods/...`); any of them names the pod;
//! - a kubelet without pod cgroups (`cgroupsPerQOS: false`) leaves containers where the runtime puts them:
//!   `/k8s.io/<id>` (containerd), `/docker/<id>`. Only the container ID is there; the node's pods name its pod.
//!
//! CRI-O's `crio-conmon-<id>` is the container's monitor, not the container: it has the pod but no container.

/// The pod and the container a process's cgroup names (at least one of them).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CgroupOwner {
    /// The pod's UID, with dashes, as `metadata.uid` has it; `None` where the cgroup names only the container.
    pub pod_uid: Option<String>,
    /// The container's runtime ID (64 hex digits), as `status.containerStatuses[].containerID` ends.
    pub container_id: Option<String>,
}

/// The owner named by a `/proc/<pid>/cgroup` text; `None` for a process outside any pod (a host service, the
/// kubelet, a process of a pod whose cgroup layout this does not know).
#[must_use]
pub fn owner(cgroup_file: &str) -> Option<CgroupOwner> {
    let paths = || {
        cgroup_file
            .lines()
            .filter_map(|line| line.splitn(3, ':').nth(2))
    };
    // A hierarchy that names the pod beats one that names only the container.
    paths().find_map(owner_of_path).or_else(|| {
        paths().find_map(|path| {
            let last = path.rsplit(['/', ':']).next()?;
            Some(CgroupOwner {
                pod_uid: None,
                container_id: Some(container_id(last)?),
            })
        })
    })
}

fn owner_of_path(path: &str) -> Option<CgroupOwner> {
    // `:` separates the slice from the container in containerd's non-systemd names.
    let components: Vec<&str> = path
        .split(['/', ':'])
        .filter(|part| !part.is_empty())
        .collect();
    let (pod_at, pod_uid) = components
        .iter()
        .enumerate()
        .rev()
        .find_map(|(at, component)| pod_uid(component).map(|uid| (at, uid)))?;
    let container_id = components[pod_at + 1..]
        .last()
        .filter(|name| !name.starts_with("crio-conmon-"))
        .and_then(|name| container_id(name));
    Some(CgroupOwner {
        pod_uid: Some(pod_uid),
        container_id,
    })
}

/// The pod UID in a cgroup name such as `pod<uid>` or `kubepods-besteffort-pod<uid>.slice`.
fn pod_uid(component: &str) -> Option<String> {
    let name = component.strip_suffix(".slice").unwrap_or(component);
    let (_, uid) = name.rsplit_once("pod")?;
    let uid = uid.replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// A UID: 8-4-4-4-12 hex digits.
fn is_uid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, length)| group.len() == length && is_hex(group))
}

fn is_hex(text: &str) -> bool {
    text.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// The container ID in a cgroup name: `<id>`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`.
fn container_id(component: &str) -> Option<String> {
    let name = component.strip_suffix(".scope").unwrap_or(component);
    let id = name.rsplit_once('-').map_or(name, |(_, id)| id);
    (id.len() == 64 && is_hex(id)).then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const ID: &str = "3b1d6c6b0e7e4f10a9a2c1d6a1e3f5b7c9d1e3f5a7b9c1d3e5f7a9b1c3d5e7f9";

    fn owned(container: bool) -> Option<CgroupOwner> {
        Some(CgroupOwner {
            pod_uid: Some(UID.to_owned()),
            container_id: container.then(|| ID.to_owned()),
        })
    }

    #[test]
    fn systemd_driver_under_cgroup_v2_with_each_runtime() {
        let uid = UID.replace('-', "_");
        for scope in [
            format!("cri-containerd-{ID}.scope"),
            format!("crio-{ID}.scope"),
            format!("docker-{ID}.scope"),
        ] {
            let text = format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/{scope}\n"
            );
            assert_eq!(owner(&text), owned(true), "{text}");
        }
        // A Guaranteed pod has no QoS slice.
        let text =
            format!("0::/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{ID}.scope\n");
        assert_eq!(owner(&text), owned(true));
    }

    #[test]
    fn cgroupfs_driver_under_cgroup_v1() {
        let text = format!(
            "12:pids:/kubepods/besteffort/pod{UID}/{ID}\n\
             4:memory:/kubepods/besteffort/pod{UID}/{ID}\n\
             1:name=systemd:/kubepods/besteffort/pod{UID}/{ID}\n\
             0::/\n"
        );
        assert_eq!(owner(&text), owned(true));
        let guaranteed = format!("0::/kubepods/pod{UID}/{ID}\n");
        assert_eq!(owner(&guaranteed), owned(true));
    }

    #[test]
    fn containerd_outside_systemds_tree() {
        let uid = UID.replace('-', "_");
        let text = format!(
            "0::/system.slice/containerd.service/kubepods-besteffort-pod{uid}.slice:cri-containerd:{ID}\n"
        );
        assert_eq!(owner(&text), owned(true));
        let kind = format!(
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{uid}.slice/cri-containerd-{ID}.scope\n"
        );
        assert_eq!(owner(&kind), owned(true));
    }

    #[test]
    fn without_pod_cgroups_only_the_container_is_named() {
        let container_only = Some(CgroupOwner {
            pod_uid: None,
            container_id: Some(ID.to_owned()),
        });
        let containerd =
            format!("12:pids:/k8s.io/{ID}\n4:memory:/k8s.io/{ID}\n1:name=systemd:/\n0::/\n");
        assert_eq!(owner(&containerd), container_only);
        assert_eq!(owner(&format!("0::/docker/{ID}\n")), container_only);
        // A pod's cgroup in another hierarchy wins.
        let mixed = format!("4:memory:/k8s.io/{ID}\n3:cpu:/kubepods/pod{UID}/{ID}\n");
        assert_eq!(owner(&mixed), owned(true));
    }

    #[test]
    fn a_pod_without_a_container_and_processes_outside_pods() {
        let uid = UID.replace('-', "_");
        let conmon = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/crio-conmon-{ID}.scope\n"
        );
        assert_eq!(owner(&conmon), owned(false));
        assert_eq!(
            owner(&format!("0::/kubepods/burstable/pod{UID}\n")),
            owned(false)
        );
        for outside in [
            "0::/system.slice/nvidia-persistenced.service\n",
            "0::/user.slice/user-0.slice/session-3.scope\n",
            "0::/kubepods.slice/kubepods-burstable.slice\n",
            "0::/kubepods/podnot-a-uid/abc\n",
            "",
        ] {
            assert_eq!(owner(outside), None, "{outside:?}");
        }
    }
}

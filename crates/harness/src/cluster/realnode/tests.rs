use super::*;

fn dirs() -> Dirs {
    Dirs::of(Path::new("/c/cluster"))
}

#[test]
fn containerd_keeps_to_its_own_directory() {
    let config = containerd_config(&dirs(), "ghcr.io/gpu-operator-rs/pause:1.0.0");
    for line in config.lines().filter(|line| line.contains(" = \"/")) {
        assert!(
            line.contains("\"/c/cluster/realnode/") || line.contains(&format!("\"{CNI_BIN_DIR}\"")),
            "{line}"
        );
    }
    for setting in [
        "restrict_oom_score_adj = true",
        "snapshotter = \"overlayfs\"",
        "SystemdCgroup = false",
        "sandbox_image = \"ghcr.io/gpu-operator-rs/pause:1.0.0\"",
        "address = \"/c/cluster/realnode/containerd.sock\"",
    ] {
        assert!(config.contains(setting), "{setting} missing from\n{config}");
    }
}

#[test]
fn pods_get_a_default_gateway_on_the_private_subnet() {
    let config: serde_json::Value = serde_json::from_str(&cni_config(&dirs())).unwrap();
    let bridge = &config["plugins"][0];
    assert_eq!(bridge["type"], "bridge");
    assert_eq!(bridge["isDefaultGateway"], true);
    assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], POD_SUBNET);
    assert_eq!(bridge["ipam"]["dataDir"], "/c/cluster/realnode/cni-ipam");
    assert_eq!(config["plugins"][1]["type"], "portmap");
}

#[test]
fn the_local_registry_is_reached_over_plain_http() {
    let config = containerd_config(&dirs(), "127.0.0.1:5000/gpu-operator-rs/pause:1.0.0");
    assert!(
        config.contains("config_path = \"/c/cluster/realnode/containerd/certs.d\""),
        "{config}"
    );
    let hosts = plain_http_hosts("127.0.0.1:5000");
    assert!(
        hosts.starts_with("server = \"http://127.0.0.1:5000\"\n"),
        "{hosts}"
    );
    assert!(
        hosts
            .contains("[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]")
    );
}

#[test]
fn finds_the_mounts_under_the_node_directory() {
    let mountinfo = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
90 22 0:50 / /c/cluster/realnode/containerd/state/io.containerd.runtime.v2.task/k8s.io/abc/rootfs rw - overlay overlay rw
91 22 0:51 / /c/cluster/realnode/kubelet/pods/p/volumes/kube-api-access\\040x rw - tmpfs tmpfs rw
92 22 0:52 / /c/cluster/realnodes rw - tmpfs tmpfs rw
";
    assert_eq!(
        mount_points_under(mountinfo, Path::new("/c/cluster/realnode")),
        vec![
            PathBuf::from(
                "/c/cluster/realnode/containerd/state/io.containerd.runtime.v2.task/k8s.io/abc/rootfs"
            ),
            PathBuf::from("/c/cluster/realnode/kubelet/pods/p/volumes/kube-api-access x"),
        ]
    );
}

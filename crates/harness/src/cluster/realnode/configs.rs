//! The real node's configuration files, as text: containerd's, the CNI network's and kube-proxy's (the kubelet's
//! is [`crate::cluster::kubelet`]'s).
//! Pure: where each file points comes from [`Dirs`].

use super::*;

/// containerd's configuration: everything private to `dirs`, so that it never meets a system containerd.
pub fn containerd_config(dirs: &Dirs, pause_image: &str) -> String {
    let path = |name: &str| dirs.path(name).display().to_string();
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  # This machine lacks CAP_SYS_RESOURCE: CRI's oom_score_adj of -998 for sandboxes would fail in runc.
  restrict_oom_score_adj = true
  # Pods' network namespaces under the state directory, not in the host's /var/run/netns.
  netns_mounts_under_state_dir = true

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{runc}"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni}"

# Per-registry settings (hosts.toml), such as plain HTTP for the local registry.
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "{registry_hosts}"
"#,
        root = path("containerd/root"),
        state = path("containerd/state"),
        socket = dirs.socket().display(),
        opt = path("containerd/opt"),
        runc = path("runc"),
        cni = path("cni"),
        registry_hosts = dirs.registry_hosts().display(),
    )
}

/// containerd's hosts.toml for `registry` (`host:port`): pulls and resolves over plain HTTP, for a registry
/// without TLS such as the cluster's local one.
pub fn plain_http_hosts(registry: &str) -> String {
    format!(
        r#"server = "http://{registry}"

[host."http://{registry}"]
  capabilities = ["pull", "resolve"]
"#
    )
}

/// The pod network: a bridge whose host end is every pod's default gateway (without that, pods cannot reach the
/// host's address, where the `kubernetes` Service leads), host-local addresses from [`POD_SUBNET`], and
/// portmap for hostPort.
pub fn cni_config(dirs: &Dirs) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "cniVersion": "0.4.0",
        "name": NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "isDefaultGateway": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "dataDir": dirs.path("cni-ipam").display().to_string(),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    }))
    .expect("a JSON value serialises")
}

/// kube-proxy in iptables mode, loopback-only serving, and leaving the host's conntrack and route_localnet
/// sysctls and its own OOM score (this machine cannot lower it) as they are.
pub fn kube_proxy_config(
    kubeconfig: &Path,
    node: &str,
    healthz_port: u16,
    metrics_port: u16,
) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {node}
mode: iptables
clusterCIDR: {POD_SUBNET}
healthzBindAddress: 127.0.0.1:{healthz_port}
metricsBindAddress: 127.0.0.1:{metrics_port}
oomScoreAdj: 0
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
",
        kubeconfig = kubeconfig.display(),
    )
}

//! The KubeletConfiguration of every real kubelet the harness runs: the real node's (on containerd) and the test
//! kubelets on the fake runtime of the device-plugin tests. Pure text.
//!
//! Both run on this machine, hence the settings around its limits: cgroup v1 (`failCgroupV1: false`) with the
//! cgroupfs driver, no QoS cgroups or node-allocatable enforcement, no eviction thresholds or image garbage
//! collection (the disk is shared with everything else here, and an eviction or a removed image would be the
//! machine's doing, not the test's), no swap check, no DNS configuration of the host's, and a node status every 2 s
//! so that tests see allocatable change quickly.

use std::net::Ipv4Addr;
use std::path::Path;

/// Where a kubelet serves and what it talks to.
#[derive(Debug, Clone, Copy)]
pub struct KubeletConfig<'a> {
    /// The address its API (logs, exec, metrics) is served on.
    pub address: Ipv4Addr,
    pub port: u16,
    /// Its healthz endpoint, on loopback.
    pub healthz_port: u16,
    /// The CRI runtime's socket (containers and images).
    pub runtime_socket: &'a Path,
    pub pod_logs: &'a Path,
    /// The CA whose client certificates may call its API (the cluster's, so that `kubectl logs` works through the
    /// API server); without one it accepts no client at all.
    pub client_ca: Option<&'a Path>,
}

impl KubeletConfig<'_> {
    /// The KubeletConfiguration file.
    pub fn render(&self) -> String {
        let endpoint = format!("unix://{}", self.runtime_socket.display());
        let x509 = self.client_ca.map_or_else(String::new, |ca| {
            format!("\n  x509: {{clientCAFile: {}}}", ca.display())
        });
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {address}
port: {port}
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
readOnlyPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}{x509}
authorization: {{mode: AlwaysAllow}}
containerRuntimeEndpoint: {endpoint}
imageServiceEndpoint: {endpoint}
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
evictionHard: {{memory.available: \"0%\", nodefs.available: \"0%\", imagefs.available: \"0%\"}}
imageGCHighThresholdPercent: 100
localStorageCapacityIsolation: false
protectKernelDefaults: false
resolvConf: \"\"
podLogsDir: {pod_logs}
nodeStatusUpdateFrequency: 2s
",
            address = self.address,
            port = self.port,
            healthz_port = self.healthz_port,
            pod_logs = self.pod_logs.display(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(client_ca: Option<&Path>) -> String {
        KubeletConfig {
            address: Ipv4Addr::new(192, 0, 2, 2),
            port: 1,
            healthz_port: 2,
            runtime_socket: Path::new("/c/node/containerd.sock"),
            pod_logs: Path::new("/c/node/logs"),
            client_ca,
        }
        .render()
    }

    #[test]
    fn fits_this_machine_and_points_at_the_runtime() {
        let text = config(Some(Path::new("/c/cluster/ca.crt")));
        for line in [
            "address: 192.0.2.2",
            "port: 1",
            "healthzPort: 2",
            "containerRuntimeEndpoint: unix:///c/node/containerd.sock",
            "imageServiceEndpoint: unix:///c/node/containerd.sock",
            "  x509: {clientCAFile: /c/cluster/ca.crt}",
            "failCgroupV1: false",
            "cgroupDriver: cgroupfs",
            "podLogsDir: /c/node/logs",
        ] {
            assert!(text.lines().any(|have| have == line), "{line} in\n{text}");
        }
        let parsed: serde_json::Value = serde_saphyr::from_str(&text).expect("YAML");
        assert_eq!(
            parsed["authentication"]["x509"]["clientCAFile"],
            "/c/cluster/ca.crt"
        );
        assert_eq!(parsed["kind"], "KubeletConfiguration");
    }

    #[test]
    fn without_a_client_ca_no_client_is_trusted() {
        let text = config(None);
        assert!(!text.contains("x509"), "{text}");
        let parsed: serde_json::Value = serde_saphyr::from_str(&text).expect("YAML");
        assert_eq!(parsed["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(parsed["authentication"]["webhook"]["enabled"], false);
    }
}

//! The chart's defaults on the oldest Kubernetes the chart claims (`kubeVersion` in Chart.yaml): that version's API
//! server, built from its Go module, alone on its own etcd (no controllers or nodes of a newer version would talk to
//! it), `helm install` with no values at all, and the operator reconciling against it with the chart's
//! ServiceAccount, as its Deployment would.

use std::process::Command;
use std::time::Duration;

use e2e::{
    NAMESPACE, RELEASE, Run, chart_dir, eventually, free_port, operator_bin, repo_root, step,
};
use harness::cluster::{ClusterInfo, KUBERNETES_OLDEST};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);

/// The oldest version's API server, stopped when dropped.
struct OldestApiServer {
    info: ClusterInfo,
}

impl OldestApiServer {
    fn start() -> Self {
        let info = harness::cluster::start_oldest_api_server()
            .unwrap_or_else(|error| panic!("the oldest Kubernetes' API server: {error:#}"));
        Self { info }
    }

    /// Runs `program args` (kubectl or helm) against this API server.
    fn run(&self, program: &str, args: &[&str]) -> Run {
        Command::new(program)
            .args(args)
            .envs(harness::cluster::env_vars(&self.info))
            .output()
            .unwrap_or_else(|error| panic!("cannot start {program}: {error}"))
            .into()
    }

    fn ok(&self, program: &str, args: &[&str]) -> String {
        let done = self.run(program, args);
        assert!(
            done.success,
            "{program} {} failed:\n{}\n{}",
            args.join(" "),
            done.stdout,
            done.stderr
        );
        done.stdout
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.ok("kubectl", &args)).expect("kubectl printed JSON")
    }

    fn operator_log(&self) -> String {
        std::fs::read_to_string(self.info.state_dir.join("logs/gpu-operator.log"))
            .unwrap_or_default()
    }
}

impl Drop for OldestApiServer {
    fn drop(&mut self) {
        if let Err(error) = harness::cluster::stop_oldest_api_server() {
            eprintln!("stopping the oldest Kubernetes' API server: {error:#}");
        }
    }
}

/// The minor version the chart's `kubeVersion` (`>=1.<minor>.0-0`) claims as its oldest.
fn claimed_oldest_minor() -> u32 {
    let chart = std::fs::read_to_string(repo_root().join("charts/gpu-operator/Chart.yaml"))
        .expect("Chart.yaml");
    let claim = chart
        .lines()
        .find_map(|line| line.strip_prefix("kubeVersion:"))
        .expect("the chart claims a kubeVersion")
        .trim()
        .trim_matches('"');
    claim
        .strip_prefix(">=1.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|minor| minor.parse().ok())
        .unwrap_or_else(|| panic!("kubeVersion {claim:?} is not of the form >=1.<minor>.<patch>"))
}

#[test]
#[ignore = "needs the local cluster's tools: run `cargo xtask e2e`"]
fn the_defaults_install_and_reconcile_on_the_oldest_kubernetes_claimed() {
    let server = OldestApiServer::start();
    let version = server.json(&["version"]);
    let served = version["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap_or_default();
    eprintln!("testing against kube-apiserver {served}");
    assert_eq!(served, KUBERNETES_OLDEST);
    let minor: u32 = version["serverVersion"]["minor"]
        .as_str()
        .and_then(|minor| minor.parse().ok())
        .expect("the server's minor version");
    assert_eq!(
        minor,
        claimed_oldest_minor(),
        "the test must run the oldest version the chart claims"
    );
    let api_versions = server.ok("kubectl", &["api-versions"]);
    assert!(
        !api_versions
            .lines()
            .any(|line| line == "resource.k8s.io/v1"),
        "{served} serves no resource.k8s.io/v1: {api_versions}"
    );

    step("helm install with no values at all");
    let chart = chart_dir();
    server.ok(
        "helm",
        &[
            "install",
            RELEASE,
            &chart,
            "-n",
            NAMESPACE,
            "--create-namespace",
        ],
    );
    let manifest = server.ok("helm", &["get", "manifest", RELEASE, "-n", NAMESPACE]);
    assert!(
        !manifest.contains("kind: DeviceClass"),
        "no DRA objects where the API server serves none"
    );
    for crd in [
        "clusterpolicies.nvidia.com",
        "gpunodes.nvidia.com",
        "nvidiadrivers.nvidia.com",
    ] {
        server.ok(
            "kubectl",
            &[
                "wait",
                "--for=condition=Established",
                &format!("crd/{crd}"),
                "--timeout=60s",
            ],
        );
    }

    step("the operator, as its Deployment would run it, reconciles the default ClusterPolicy");
    let health = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    harness::operators::start_operator(&server.info, &operator_bin(), "e2e-oldest", health)
        .unwrap_or_else(|error| panic!("starting the operator: {error:#}"));
    // A reconcile that went through says so: condition Error False, reason Reconciled, of this generation.
    let reconciled = |policy: &Value| {
        policy["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|condition| {
                condition["type"] == "Error"
                    && condition["status"] == "False"
                    && condition["reason"] == "Reconciled"
                    && condition["observedGeneration"] == policy["metadata"]["generation"]
            })
    };
    let status = eventually(WAIT, || {
        let policy = server.json(&["get", "clusterpolicy", "cluster-policy"]);
        Ok(reconciled(&policy).then(|| policy["status"].clone()))
    })
    .unwrap_or_else(|error| {
        panic!(
            "the operator never reconciled the default ClusterPolicy: {error:#}\n{:#}\n{}",
            server.json(&["get", "clusterpolicy", "cluster-policy"])["status"],
            server.operator_log()
        )
    });
    eprintln!("status: {status:#}");
    assert_eq!(status["gpuNodes"], 0, "{status:#}");
    let daemonsets = server.json(&["get", "daemonsets", "-n", NAMESPACE]);
    let names: Vec<&str> = daemonsets["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|daemonset| daemonset["metadata"]["name"].as_str())
        .collect();
    eprintln!("DaemonSets applied on {served}: {names:?}");
    // The driver's and the toolkit's DaemonSets are one per OS pool of GPU nodes, and this API server has no nodes.
    for operand in [
        "gpu-node-facts",
        "nvidia-operator-validator",
        "nvidia-device-plugin-daemonset",
        "gpu-feature-discovery",
        "nvidia-dcgm-exporter",
        "nvidia-mig-manager",
    ] {
        assert!(names.contains(&operand), "{operand} in {names:?}");
    }
}

//! The two operators the benchmark runs, one after the other, on the same cluster: installing each one's chart,
//! starting its binary as the chart's ServiceAccount would run it (kwok runs no containers), and removing it again
//! so that the next one starts from the same state.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use harness::cluster::{self, ClusterInfo, Workload};
use harness::command;
use harness::operators::{self, NAMESPACE, nvidia};

/// The chart values both runs use: drivers pre-installed on the nodes (NVIDIA's guide for clusters whose images
/// carry the driver) and no node-feature-discovery (the kwok nodes carry its labels already), nor our chart's
/// node-facts DaemonSet in its place (NVIDIA's chart ignores the key), so that neither run has a labeller's pods
/// on every node. Rolling updates replace a tenth of the nodes' pods at a time, as a large cluster sets it: with
/// the charts' default of one, the DaemonSet controller replaces one pod per pass over every node, and at 5,000
/// nodes the patch's rollout took about 40 minutes (130 pods a minute) whoever wrote the DaemonSet.
const VALUES: &[&str] = &[
    "driver.enabled=false",
    "nfd.enabled=false",
    "nodeFacts.enabled=false",
    "daemonsets.rollingUpdate.maxUnavailable=10%",
];

/// The CRDs either chart installs; removed between the runs, since both define `clusterpolicies.nvidia.com`.
const CRDS: &[&str] = &[
    "clusterpolicies.nvidia.com",
    "nvidiadrivers.nvidia.com",
    "gpunodes.nvidia.com",
];

/// Which operator a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Operator {
    Ours,
    Nvidia,
    /// No operator: our DaemonSets and node labels applied directly (`floor.rs`), the cluster's own speed.
    Floor,
}

impl Operator {
    /// How tables and legends name it.
    pub fn label(self) -> String {
        match self {
            Self::Ours => format!("gpu-operator-rs {}", env!("CARGO_PKG_VERSION")),
            Self::Nvidia => format!(
                "NVIDIA gpu-operator {}",
                cluster::NVIDIA_GPU_OPERATOR_RELEASE
            ),
            Self::Floor => "floor (our DaemonSets, no operator)".to_owned(),
        }
    }

    /// Whether a process of its own runs: the floor has no RSS, CPU, requests or reconciles to report.
    pub fn runs_a_process(self) -> bool {
        self != Self::Floor
    }

    /// The histogram of its reconcile durations: ours, and controller-runtime's (every controller of NVIDIA's).
    pub fn reconcile_histogram(self) -> Option<&'static str> {
        match self {
            Self::Ours => Some("gpu_operator_reconcile_duration_seconds"),
            Self::Nvidia => Some("controller_runtime_reconcile_time_seconds"),
            Self::Floor => None,
        }
    }

    /// The harness's name for its process.
    fn workload(self) -> Option<&'static str> {
        match self {
            Self::Ours => Some("gpu-operator"),
            Self::Nvidia => Some(nvidia::WORKLOAD),
            Self::Floor => None,
        }
    }
}

/// One operator with what it runs from.
#[derive(Debug, Clone)]
pub struct Contender {
    pub operator: Operator,
    /// Its Helm chart.
    chart: PathBuf,
    /// Ours: the release binary. NVIDIA's: the directory of its build (binary, `assets`, `manifests`).
    build: PathBuf,
}

impl Contender {
    pub fn ours(root: &Path, binary: PathBuf) -> Self {
        Self {
            operator: Operator::Ours,
            chart: root.join("charts/gpu-operator"),
            build: binary,
        }
    }

    /// NVIDIA's operator, built by `cluster::nvidia_gpu_operator` into `dir`.
    pub fn nvidia(dir: PathBuf) -> Self {
        Self {
            operator: Operator::Nvidia,
            chart: dir.join("gpu-operator"),
            build: dir,
        }
    }

    /// The ClusterPolicy this operator's chart renders with [`VALUES`], as YAML: what the benchmark creates.
    pub fn render_policy(&self, env: &[(String, String)]) -> anyhow::Result<String> {
        let chart = self.chart.display().to_string();
        let mut args = vec![
            "template",
            "gpu-operator",
            &chart,
            "-n",
            NAMESPACE,
            "--show-only",
            "templates/clusterpolicy.yaml",
        ];
        for value in VALUES {
            args.extend(["--set", value]);
        }
        command::output(env, "helm", &args)
    }

    /// `helm upgrade --install --wait` of the chart, then the chart's own ClusterPolicy is deleted (no operator
    /// runs yet, so nothing holds it) so that the run can time its creation.
    pub fn install(&self, root: &Path, env: &[(String, String)]) -> anyhow::Result<()> {
        let chart = self.chart.display().to_string();
        let mut args = vec![
            "upgrade",
            "--install",
            "--wait",
            "--timeout",
            "300s",
            "gpu-operator",
            "-n",
            NAMESPACE,
            "--create-namespace",
            &chart,
        ];
        for value in VALUES {
            args.extend(["--set", value]);
        }
        command::run(root, env, "helm", &args)?;
        command::run(
            root,
            env,
            "kubectl",
            &[
                "delete",
                "clusterpolicy",
                "--all",
                "--wait",
                "--timeout=60s",
            ],
        )
    }

    /// Starts the operator as its chart's ServiceAccount, with leader election as its chart runs it, serving its
    /// Prometheus metrics at `metrics_addr`.
    pub fn start(
        &self,
        info: &ClusterInfo,
        identity: &str,
        metrics_addr: SocketAddr,
    ) -> anyhow::Result<Workload> {
        match self.operator {
            Operator::Ours => operators::start_operator(info, &self.build, identity, metrics_addr),
            Operator::Nvidia => nvidia::start(info, &self.build, metrics_addr),
            Operator::Floor => anyhow::bail!("the floor runs no operator"),
        }
    }

    /// Deletes the ClusterPolicy while the operator runs (so that it does its own cleanup), waits for the operand
    /// pods to go, stops the operator, and uninstalls the chart with its CRDs: the cluster is as before `install`.
    pub fn remove(&self, root: &Path, info: &ClusterInfo) -> anyhow::Result<()> {
        let env = cluster::env_vars(info);
        command::run(
            root,
            &env,
            "kubectl",
            &[
                "delete",
                "clusterpolicy",
                "--all",
                "--wait",
                "--timeout=600s",
            ],
        )?;
        // NVIDIA's operand DaemonSets go by garbage collection (owner references), ours by the operator: either
        // way, wait for their pods.
        delete_operands(root, &env)?;
        if let Some(workload) = self.operator.workload() {
            cluster::stop_workload(info, workload)?;
        }
        self.uninstall(root, &env)
    }

    /// `helm uninstall` of the chart and removal of its CRDs.
    pub fn uninstall(&self, root: &Path, env: &[(String, String)]) -> anyhow::Result<()> {
        command::run(
            root,
            env,
            "helm",
            &[
                "uninstall",
                "gpu-operator",
                "-n",
                NAMESPACE,
                "--no-hooks",
                "--wait",
                "--timeout",
                "300s",
            ],
        )?;
        let mut delete_crds = vec!["delete", "crd", "--ignore-not-found", "--wait"];
        delete_crds.extend(CRDS);
        command::run(root, env, "kubectl", &delete_crds)
    }
}

/// Deletes every DaemonSet in the operators' namespace and waits until their pods are gone.
pub fn delete_operands(root: &Path, env: &[(String, String)]) -> anyhow::Result<()> {
    command::run(
        root,
        env,
        "kubectl",
        &[
            "delete",
            "daemonset",
            "--all",
            "-n",
            NAMESPACE,
            "--cascade=foreground",
            "--wait",
            "--timeout=600s",
        ],
    )
}

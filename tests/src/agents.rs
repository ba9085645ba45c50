//! Node agents (`gpu-node-agent`) and the DRA driver (`gpu-dra-driver`) as local processes, one set per simulated
//! node, each with the token a pod of the chart's ServiceAccount for its role has on that node ([`pod_token_kubeconfig`]), so that the chart's RBAC and its
//! node-bound-writes policies are what is tested. They run on the GPU simulator
//! (`--simulate node`: the spec comes from the Node's `nvidia.com/gpu.simulator` annotation) with one state file
//! per node, shared by the node's agents as the processes of a real node share its GPUs.
//!
//! The binaries are `E2E_NODE_AGENT_BIN` and `E2E_DRA_DRIVER_BIN`, else `gpu-node-agent` and `gpu-dra-driver` in
//! `$CARGO_TARGET_DIR/debug` (or the workspace's `target/debug`): `cargo xtask e2e` must build them (`cargo build -p
//! node-agent -p dra-driver`) before the tests run.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use serde_json::Value;

use crate::{NAMESPACE, eventually, kubectl, kubectl_json, run, simulated, workspace_binary};

/// The `gpu-node-agent` binary under test.
pub fn node_agent_bin() -> PathBuf {
    workspace_binary("E2E_NODE_AGENT_BIN", "gpu-node-agent", "node-agent")
}

/// The `gpu-dra-driver` binary under test.
pub fn dra_driver_bin() -> PathBuf {
    workspace_binary("E2E_DRA_DRIVER_BIN", "gpu-dra-driver", "dra-driver")
}

/// One agent role (or the DRA driver) running for one node; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct NodeAgent {
    child: Child,
    /// Its output, for the test log when something fails.
    pub log: PathBuf,
}

impl NodeAgent {
    /// Starts `<program> <args> --simulate node --sim-state <state>` (`program`: [`node_agent_bin`] or
    /// [`dra_driver_bin`]) for `node` as ServiceAccount `service_account`, with the environment the operator's
    /// DaemonSets give it plus `env`.
    pub fn start(
        program: &Path,
        node: &str,
        service_account: &str,
        state: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let name = program.file_name().map_or_else(
            || "agent".into(),
            |name| name.to_string_lossy().into_owned(),
        );
        let log = state.with_file_name(format!(
            "{node}-{name}-{}.log",
            args.first().copied().unwrap_or("agent")
        ));
        let output = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open the agent log");
        let child = simulated::command(program, node, state, args)
            .env("KUBECONFIG", pod_token_kubeconfig(service_account, node))
            .env("OPERATOR_NAMESPACE", NAMESPACE)
            .env(
                "RUST_LOG",
                "info,node_agent=debug,dra_driver=debug,node_runtime=debug",
            )
            .envs(env.iter().copied())
            .stdout(Stdio::from(output.try_clone().expect("log handle")))
            .stderr(Stdio::from(output))
            .spawn()
            .unwrap_or_else(|error| panic!("start {name}: {error}"));
        Self { child, log }
    }

    /// Node facts for `node` as its DaemonSet runs it, on the host folder `host`: its `etc/os-release` and a
    /// `kernel` file holding the kernel release stand in for the host's.
    pub fn node_facts(node: &str, state: &Path, host: &Path) -> Self {
        let (host_root, kernel) = (
            host.display().to_string(),
            host.join("kernel").display().to_string(),
        );
        Self::start(
            &node_agent_bin(),
            node,
            "gpu-node-facts",
            state,
            &[
                "node-facts",
                "--host-root",
                &host_root,
                "--kernel-release-file",
                &kernel,
            ],
            &[],
        )
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The agent's output so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pod of ServiceAccount `service_account` on `node` whose token a local process of that role uses: it stands
/// for the DaemonSet's pod there (a kwok node marks it running; a real kubelet runs it on its fake runtime), and is
/// made once per node and account, its token lasting as long as it exists.
pub fn token_pod(service_account: &str, node: &str) -> (String, String) {
    let name = format!("e2e-token-{service_account}-{node}");
    if !run("kubectl", &["get", "pod", &name, "-n", NAMESPACE]).success {
        // The API server names only an existing node in the token.
        eventually(std::time::Duration::from_secs(60), || {
            Ok(run("kubectl", &["get", "node", node]).success.then_some(()))
        })
        .unwrap_or_else(|error| panic!("node {node} never appeared: {error:#}"));
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"e2e": "node-agent-token"}},
            "spec": {
                "nodeName": node,
                "serviceAccountName": service_account,
                "automountServiceAccountToken": false,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}],
            },
        });
        let created = crate::kubectl_apply(&pod.to_string(), &[]);
        assert!(
            created.success,
            "creating pod {name}: {}{}",
            created.stdout, created.stderr
        );
    }
    let uid = kubectl(&[
        "get",
        "pod",
        &name,
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    (name, uid)
}

/// A kubeconfig that authenticates as ServiceAccount `service_account` with the token of its pod on `node`
/// ([`token_pod`]), as the kubelet gives the DaemonSet's pod there: the API server writes the node's name into it,
/// and the chart's node-bound-writes policies let it write that node's objects only.
pub fn pod_token_kubeconfig(service_account: &str, node: &str) -> PathBuf {
    let (pod, uid) = token_pod(service_account, node);
    let token = kubectl(&[
        "create",
        "token",
        service_account,
        "-n",
        NAMESPACE,
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        &pod,
        "--bound-object-uid",
        &uid,
        "--duration",
        "1h",
    ]);
    let cluster = harness::cluster::running().expect("the local cluster runs");
    harness::cluster::token_kubeconfig(
        &cluster,
        &format!(
            "e2e-{service_account}-{node}-{}.kubeconfig",
            std::process::id()
        ),
        &format!("system:serviceaccount:{NAMESPACE}:{service_account}"),
        token.trim(),
    )
    .unwrap_or_else(|error| panic!("the pod's kubeconfig: {error:#}"))
}

/// Runs a `gpu-node-agent simulator` tool command for `node` (admin credentials: it only reads the annotation).
pub fn simulator_tool(node: &str, state: &Path, args: &[&str]) -> String {
    let line: Vec<&str> = std::iter::once("simulator")
        .chain(args.iter().copied())
        .collect();
    simulated::run_tool(&node_agent_bin(), node, state, &line)
}

/// Creates a simulated GPU node named `name` with GPUs `spec` (e.g. `a100-80gb:1`), as a copy of the kwok node
/// `template` (its labels but the `nvidia.com/` ones, its annotations and status), plus the extra `labels`.
pub fn add_simulated_node(template: &str, name: &str, spec: &str, labels: &[(&str, &str)]) {
    let mut node: Value = kubectl_json(&["get", "node", template]);
    let metadata = node["metadata"].as_object_mut().expect("node metadata");
    for generated in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
        "generation",
    ] {
        metadata.remove(generated);
    }
    metadata.insert("name".into(), name.into());
    // What the operator and agents wrote on the template is theirs, not the new node's.
    if let Some(labels) = metadata.get_mut("labels").and_then(Value::as_object_mut) {
        labels.retain(|key, _| !key.starts_with("nvidia.com/"));
    }
    node["metadata"]["annotations"]["nvidia.com/gpu.simulator"] = spec.into();
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name.into();
    for (key, value) in labels {
        node["metadata"]["labels"][*key] = (*value).into();
    }
    if let Some(status) = node["status"].as_object_mut() {
        status.remove("conditions");
    }
    let created = crate::kubectl_apply(&node.to_string(), &[]);
    assert!(
        created.success,
        "creating node {name}: {}{}",
        created.stdout, created.stderr
    );
}

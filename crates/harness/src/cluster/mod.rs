//! The local Kubernetes cluster that the demo and the end-to-end tests run against.
//!
//! The real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and kwok for simulated
//! nodes and pods, plus kubectl and helm, are built once from their Go modules (versions in [`versions`]) into a
//! cache outside the repository (see [`paths`]), and run as local processes on 127.0.0.1.
//!
//! The e2e runner uses [`ensure_up`], [`add_nodes`], [`env_vars`] and [`down`]. They block; call them from
//! synchronous code (or `tokio::task::spawn_blocking`).

mod api;
pub mod audit;
mod certs;
mod controlplane;
mod fetch;
mod gomod;
mod kubeconfig;
pub mod kubelet;
mod nodes;
pub mod paths;
mod process;
pub mod progress;
mod realnode;
mod registry;
mod toolchain;
mod tools;
mod versions;

pub use realnode::NodeState as RealNode;

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::Context as _;

pub use api::Connection;
pub use nodes::AddNodes;
pub use realnode::AddRealNode;
pub use tools::copy_tree;
pub use versions::{
    KUBERNETES, KUBERNETES_OLDEST, NVIDIA_GPU_OPERATOR, NVIDIA_GPU_OPERATOR_RELEASE,
};

/// `export` lines for KUBECONFIG and PATH that point a shell at the cluster (`eval "$(cargo xtask cluster env)"`);
/// says so on stderr when the cluster is not up.
pub fn shell_env() -> anyhow::Result<String> {
    let layout = paths::Layout::from_env()?;
    let kubeconfig = layout.state_dir().join("kubeconfig");
    if !kubeconfig.exists() {
        progress::say("note: the cluster is not up; run `cargo xtask cluster up`");
    }
    Ok(shell_exports(
        &kubeconfig,
        &layout.bin_dir(&versions::all_tools()),
    ))
}

/// Stops a control-plane `component` of the running cluster (etcd, kube-apiserver, kube-controller-manager,
/// kube-scheduler, kwok), keeps it down for `down_for`, and starts it again with the same arguments; returns its
/// new pid once it serves again.
pub fn restart(component: &str, down_for: std::time::Duration) -> anyhow::Result<u32> {
    let state_dir = paths::Layout::from_env()?.state_dir();
    Ok(controlplane::restart(&state_dir, component, down_for)?.pid)
}

/// Where a running cluster is and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    /// The admin kubeconfig (user `admin`, group `system:masters`).
    pub kubeconfig: PathBuf,
    /// kubectl, helm, kube-apiserver, kube-controller-manager, kube-scheduler, etcd and kwok.
    pub bin_dir: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub apiserver_url: String,
    /// Certificates, kubeconfigs, `state.json`, etcd's data and the components' logs (`logs/<component>.log`).
    pub state_dir: PathBuf,
}

impl ClusterInfo {
    /// The API server's audit log (JSON; the rotated files lie beside it).
    pub fn audit_log(&self) -> PathBuf {
        self.state_dir.join("logs/audit.log")
    }
}

/// Builds the tools if they are not cached, without starting a cluster; the environment that puts them first on
/// `PATH` (as [`env_vars`] does), for checks that need only helm or kubectl.
pub fn tools_env() -> anyhow::Result<Vec<(String, String)>> {
    let layout = paths::Layout::from_env()?;
    let toolset = tools::ensure_built(&layout)?;
    Ok(vec![("PATH".into(), path_with(&toolset.bin_dir))])
}

/// Builds the tools if they are not cached, and starts the cluster unless a healthy one runs already (a cluster
/// whose processes died, or that runs other versions, is replaced). Returns once the API server is ready and the
/// controllers run (the `default` ServiceAccount exists).
pub fn ensure_up() -> anyhow::Result<ClusterInfo> {
    let layout = paths::Layout::from_env()?;
    let toolset = tools::ensure_built(&layout)?;
    let state_dir = layout.state_dir();
    let kubeconfig = state_dir.join("kubeconfig");
    let info = |state: &controlplane::State| ClusterInfo {
        kubeconfig: kubeconfig.clone(),
        bin_dir: toolset.bin_dir.clone(),
        apiserver_url: state.apiserver_url.clone(),
        state_dir: state_dir.clone(),
    };
    match controlplane::State::load(&state_dir)? {
        Some(state) => match controlplane::check_health(&state, &kubeconfig, &toolset.bin_dir) {
            Ok(()) => {
                progress::say(format!(
                    "the cluster is already up and healthy ({})",
                    state_dir.display()
                ));
                return Ok(info(&state));
            }
            Err(reason) => {
                progress::say(format!(
                    "the recorded cluster is not healthy ({reason:#}); starting a fresh one"
                ));
                controlplane::tear_down(&state_dir)?;
            }
        },
        None if state_dir.exists() => controlplane::tear_down(&state_dir).map(drop)?,
        None => {}
    }
    let state = controlplane::start(&layout, &toolset)?;
    let info = info(&state);
    print_versions(&info)?;
    Ok(info)
}

/// Where the running cluster is, without checking its health or starting one: for commands that act on the
/// cluster a test started (and may be faulting on purpose).
pub fn running() -> anyhow::Result<ClusterInfo> {
    let layout = paths::Layout::from_env()?;
    let state_dir = layout.state_dir();
    let state = controlplane::State::load(&state_dir)?
        .context("the cluster is not up; run `cargo xtask cluster up` first")?;
    Ok(ClusterInfo {
        kubeconfig: state_dir.join("kubeconfig"),
        bin_dir: layout.bin_dir(&versions::all_tools()),
        apiserver_url: state.apiserver_url,
        state_dir,
    })
}

/// Stops exactly the processes `cluster up` recorded (SIGTERM, then SIGKILL after 10 s) and removes the state
/// directory, and the oldest version's API server if one was left running. Succeeds when no cluster is up.
pub fn down() -> anyhow::Result<()> {
    let layout = paths::Layout::from_env()?;
    controlplane::tear_down(&layout.oldest_api_state_dir())?;
    if controlplane::tear_down(&layout.state_dir())? {
        progress::say("the cluster is down");
    } else {
        progress::say("no cluster was up");
    }
    Ok(())
}

/// Builds the API server of the oldest Kubernetes the chart claims ([`KUBERNETES_OLDEST`]) into the cache if it
/// is not there yet; returns the binary.
pub fn oldest_api_server_binary() -> anyhow::Result<PathBuf> {
    let layout = paths::Layout::from_env()?;
    let tool = versions::kube_apiserver_oldest();
    Ok(tools::ensure_tool(&layout, &tool)?.join("kube-apiserver"))
}

/// Starts the API server of the oldest Kubernetes the chart claims alone on its own etcd (replacing one left
/// running): no controllers, scheduler or nodes, which at the cluster's version would not talk to an API server
/// four minor versions older. Its admin kubeconfig, the cluster's kubectl and helm, and its state (for
/// [`service_account_kubeconfig`] and [`start_workload`]) are in what it returns; [`stop_oldest_api_server`] or
/// `cluster down` stops it.
pub fn start_oldest_api_server() -> anyhow::Result<ClusterInfo> {
    let layout = paths::Layout::from_env()?;
    let apiserver = oldest_api_server_binary()?;
    let toolset = tools::ensure_built(&layout)?;
    let state_dir = layout.oldest_api_state_dir();
    controlplane::tear_down(&state_dir)?;
    let state = controlplane::start_api_server_alone(&state_dir, &toolset, &apiserver)?;
    Ok(ClusterInfo {
        kubeconfig: state_dir.join("kubeconfig"),
        bin_dir: toolset.bin_dir,
        apiserver_url: state.apiserver_url,
        state_dir,
    })
}

/// Stops the oldest version's API server, its etcd and its workloads, and removes its state.
pub fn stop_oldest_api_server() -> anyhow::Result<()> {
    controlplane::tear_down(&paths::Layout::from_env()?.oldest_api_state_dir()).map(drop)
}

/// Adds simulated GPU nodes to the running cluster and waits until they are Ready; returns their names.
pub fn add_nodes(request: &AddNodes) -> anyhow::Result<Vec<String>> {
    let kubeconfig = paths::Layout::from_env()?.state_dir().join("kubeconfig");
    anyhow::ensure!(
        kubeconfig.exists(),
        "the cluster is not up; run `cargo xtask cluster up` first"
    );
    nodes::add(&kubeconfig, request)
}

/// Adds the real node to the running cluster (replacing an earlier one) and waits until it is Ready; returns its
/// name.
pub fn add_real_node(request: &AddRealNode) -> anyhow::Result<RealNode> {
    let layout = paths::Layout::from_env()?;
    realnode::add(&layout, request)
}

/// Starts the cluster's local image registry (plain HTTP on loopback, contents in memory) as a workload of the
/// running cluster, so that `cluster down` stops it; returns its address, `127.0.0.1:<port>`.
pub fn start_registry() -> anyhow::Result<String> {
    registry::start(&paths::Layout::from_env()?)
}

/// Runs `binary args` as a workload of the running cluster (replacing a running one of the same name); its log
/// is `logs/<name>.log` in the state directory, and `cluster down` stops it.
pub fn start_workload(
    info: &ClusterInfo,
    name: &str,
    binary: &Path,
    args: &[String],
    env: &[(String, String)],
) -> anyhow::Result<Workload> {
    let record = controlplane::start_workload(&info.state_dir, name, binary, args, env)?;
    Ok(Workload {
        pid: record.pid,
        log: record.log,
    })
}

/// Stops the workload `name` if it runs.
pub fn stop_workload(info: &ClusterInfo, name: &str) -> anyhow::Result<()> {
    controlplane::stop_workload(&info.state_dir, name)
}

/// NVIDIA's gpu-operator, built once into the cache from its Go module (`cargo xtask bench` compares with it).
/// Returns its directory: the static binary `nvidia-gpu-operator`, the manifests it reads (`assets`, `manifests`) and its
/// Helm chart `gpu-operator`.
pub fn nvidia_gpu_operator() -> anyhow::Result<PathBuf> {
    let layout = paths::Layout::from_env()?;
    tools::ensure_tool(&layout, &versions::nvidia_gpu_operator())
}

/// A process started on top of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub pid: u32,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

/// A kubeconfig (in the state directory) that authenticates as a ServiceAccount with a fresh token, so that a
/// process run with it has exactly that account's RBAC — as the chart's Deployment would.
pub fn service_account_kubeconfig(
    info: &ClusterInfo,
    namespace: &str,
    account: &str,
) -> anyhow::Result<PathBuf> {
    let output = Process::new("kubectl")
        .args([
            "create",
            "token",
            account,
            "-n",
            namespace,
            "--duration",
            "24h",
        ])
        .envs(env_vars(info))
        .output()
        .context("cannot run kubectl create token")?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl create token {account} -n {namespace} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let token = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let user = format!("system:serviceaccount:{namespace}:{account}");
    token_kubeconfig(
        info,
        &format!("{namespace}-{account}.kubeconfig"),
        &user,
        &token,
    )
}

/// A kubeconfig `file_name` in the state directory that authenticates as `user` with `token`: a ServiceAccount's
/// own, or one bound to a pod (`kubectl create token --bound-object-kind Pod`), as the kubelet mounts it.
pub fn token_kubeconfig(
    info: &ClusterInfo,
    file_name: &str,
    user: &str,
    token: &str,
) -> anyhow::Result<PathBuf> {
    let ca =
        std::fs::read_to_string(info.state_dir.join("ca.crt")).context("reading the cluster CA")?;
    let text = kubeconfig::render_token(&info.apiserver_url, &ca, user, token)?;
    let path = info.state_dir.join(file_name);
    // Written aside and renamed into place: tests running side by side ask for the same account's kubeconfig, and
    // a process must never read one half-written.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let partial = paths::with_suffix(&path, &format!(".{}-{write}.partial", std::process::id()));
    std::fs::write(&partial, text).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Builds the Go main package in `source_dir` (a module of this repository, e.g. the device plugin's test
/// kubelet) into `output`, with the Go toolchain the cluster's tools are built with (installed if missing).
pub fn build_go_binary(source_dir: &Path, output: &Path) -> anyhow::Result<()> {
    let go = toolchain::ensure_go(&paths::Layout::from_env()?)?;
    let result = go
        .command()
        .args(["build", "-o"])
        .arg(output)
        .arg(".")
        .current_dir(source_dir)
        .output()
        .with_context(|| format!("cannot run {}", go.binary.display()))?;
    anyhow::ensure!(
        result.status.success(),
        "go build in {} failed: {}",
        source_dir.display(),
        String::from_utf8_lossy(&result.stderr)
    );
    Ok(())
}

/// The environment for commands that use the cluster: `KUBECONFIG`, and `PATH` with [`ClusterInfo::bin_dir`] first
/// (followed by this process's PATH), so that `kubectl` and `helm` are ours.
pub fn env_vars(info: &ClusterInfo) -> Vec<(String, String)> {
    vec![
        ("KUBECONFIG".into(), info.kubeconfig.display().to_string()),
        ("PATH".into(), path_with(&info.bin_dir)),
    ]
}

/// `bin_dir`, followed by this process's PATH.
fn path_with(bin_dir: &Path) -> String {
    let mut path = bin_dir.display().to_string();
    if let Some(current) = std::env::var_os("PATH").filter(|current| !current.is_empty()) {
        path = format!("{path}:{}", current.to_string_lossy());
    }
    path
}

/// Shell lines that set KUBECONFIG and put `bin_dir` first on the caller's PATH.
fn shell_exports(kubeconfig: &Path, bin_dir: &Path) -> String {
    format!(
        "export KUBECONFIG={}\nexport PATH={}:\"$PATH\"\n",
        shell_quote(&kubeconfig.display().to_string()),
        shell_quote(&bin_dir.display().to_string())
    )
}

/// `text` in single quotes, safe for any POSIX shell.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Runs our kubectl with [`env_vars`] to show that the whole chain (binaries, kubeconfig, API server) works, and
/// prints the client and server versions.
fn print_versions(info: &ClusterInfo) -> anyhow::Result<()> {
    let output = Process::new("kubectl")
        .arg("version")
        .envs(env_vars(info))
        .output()
        .context("cannot run kubectl version")?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl version failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    progress::say(String::from_utf8_lossy(&output.stdout).trim_end());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_quote_paths_and_keep_the_callers_path() {
        let text = shell_exports(Path::new("/c/cluster/kubeconfig"), Path::new("/c/bin/it's"));
        assert_eq!(
            text,
            "export KUBECONFIG='/c/cluster/kubeconfig'\nexport PATH='/c/bin/it'\\''s':\"$PATH\"\n"
        );
    }

    #[test]
    fn env_vars_put_our_binaries_first() {
        let info = ClusterInfo {
            kubeconfig: PathBuf::from("/c/cluster/kubeconfig"),
            bin_dir: PathBuf::from("/c/bin/set"),
            apiserver_url: "https://127.0.0.1:1".into(),
            state_dir: PathBuf::from("/c/cluster"),
        };
        let vars = env_vars(&info);
        assert_eq!(
            vars[0],
            ("KUBECONFIG".into(), "/c/cluster/kubeconfig".into())
        );
        assert_eq!(vars[1].0, "PATH");
        assert!(vars[1].1.starts_with("/c/bin/set"));
    }
}

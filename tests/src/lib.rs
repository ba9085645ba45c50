//! Helpers for the end-to-end tests: they drive the real `kubectl` and `helm` against the local cluster that
//! `cargo xtask e2e` starts, exactly as a user would type them. Every test is `#[ignore]`d so that a plain
//! `cargo test` needs no cluster; `cargo xtask e2e` runs them with `--ignored` and sets:
//! - `KUBECONFIG`: the local cluster's admin kubeconfig;
//! - `PATH`: with the locally built `kubectl` and `helm` first;
//! - `E2E_OPERATOR_BIN`: the `gpu-operator` binary built from this checkout;
//! - `E2E_REPO_ROOT`: the workspace root (for the chart and fixtures).
//!
//! The cluster itself (its state, restarts of its components, ServiceAccount kubeconfigs, the operators as its
//! workloads) is reached through the `harness` library, the code `cargo xtask cluster` runs.

pub mod agents;
#[cfg(test)]
mod agreement;
pub mod dra;
pub mod kubelet;
pub mod plugin;
pub mod prometheus;
pub mod realnode;
pub mod simulated;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

/// Namespace the chart is installed into, as in NVIDIA's guides.
pub const NAMESPACE: &str = "gpu-operator";
/// Helm release name, as in NVIDIA's guides.
pub const RELEASE: &str = "gpu-operator";

/// The result of a command a test ran, with both streams as text.
#[derive(Debug)]
pub struct Run {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Self {
        Self {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// Runs a program and returns what it printed, whether or not it succeeded.
pub fn run(program: &str, args: &[&str]) -> Run {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| {
            panic!("cannot start {program}: {error} (run the tests with `cargo xtask e2e`)")
        });
    output.into()
}

/// The nodes Node Feature Discovery (or the node-facts role) marks as having an NVIDIA GPU.
pub fn gpu_node_names() -> Vec<String> {
    let nodes = kubectl_json(&[
        "get",
        "nodes",
        "-l",
        "feature.node.kubernetes.io/pci-10de.present=true",
    ]);
    nodes["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// `kubectl patch clusterpolicies.nvidia.com/cluster-policy -n gpu-operator --type merge -p <patch>`, the command
/// as NVIDIA's guides write it (the `-n` is ignored for the cluster-scoped resource, as with NVIDIA's operator).
pub fn guide_patch(patch: &str) -> String {
    kubectl(&[
        "patch",
        "clusterpolicies.nvidia.com/cluster-policy",
        "-n",
        "gpu-operator",
        "--type",
        "merge",
        "-p",
        patch,
    ])
}

/// `kubectl delete <what> --ignore-not-found`, its outcome ignored: the clean-up of a test, which also runs (from a
/// `Drop`) after a failed assertion and must not fail again.
pub fn clean_up(what: &[&str]) {
    let mut args = vec!["delete"];
    args.extend(what);
    args.push("--ignore-not-found");
    drop(run("kubectl", &args));
}

/// `helm uninstall` of the chart's release, waiting until its objects are gone.
pub fn uninstall_release() -> Run {
    run(
        "helm",
        &[
            "uninstall",
            RELEASE,
            "-n",
            NAMESPACE,
            "--wait",
            "--timeout",
            "90s",
        ],
    )
}

/// Runs a program that must succeed and returns its standard output.
pub fn ok(program: &str, args: &[&str]) -> String {
    let result = run(program, args);
    assert!(
        result.success,
        "`{program} {}` failed:\n{}\n{}",
        args.join(" "),
        result.stdout,
        result.stderr
    );
    result.stdout
}

pub fn kubectl(args: &[&str]) -> String {
    ok("kubectl", args)
}

/// `kubectl get ... -o json`, parsed.
pub fn kubectl_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(&all)).expect("kubectl printed JSON")
}

/// The Events about the cluster-scoped object `name` (a Node, the ClusterPolicy): the API server keeps them in
/// the default namespace.
pub fn events_about(name: &str) -> Vec<Value> {
    let field_selector = format!("involvedObject.name={name}");
    let events = kubectl_json(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        &field_selector,
    ]);
    events["items"].as_array().cloned().unwrap_or_default()
}

/// Applies a manifest given as text through `kubectl apply -f -` (kubectl's default strict field validation).
pub fn kubectl_apply(manifest: &str, extra: &[&str]) -> Run {
    let mut args = vec!["apply", "-f", "-"];
    args.extend_from_slice(extra);
    kubectl_with_input(&args, manifest)
}

/// Runs `kubectl` with `args`, writing `input` to its standard input (for `-f -`).
pub fn kubectl_with_input(args: &[&str], input: &str) -> Run {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write the input");
    child.wait_with_output().expect("kubectl").into()
}

pub fn repo_root() -> PathBuf {
    std::env::var_os("E2E_REPO_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
}

pub fn chart_dir() -> String {
    repo_root()
        .join("charts/gpu-operator")
        .display()
        .to_string()
}

pub fn fixture(name: &str) -> String {
    let path = repo_root().join("tests/fixtures").join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
}

/// A binary of this workspace under test: `env_var` when set (`cargo xtask e2e` sets it), else `name` in the
/// cargo target directory, which `cargo build --package <package>` fills.
pub fn workspace_binary(env_var: &str, name: &str, package: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var) {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| repo_root().join("target"), PathBuf::from);
    let path = target.join("debug").join(name);
    assert!(
        path.is_file(),
        "{} does not exist: build it with `cargo build --package {package}` (or set {env_var})",
        path.display()
    );
    path
}

pub fn operator_bin() -> PathBuf {
    workspace_binary("E2E_OPERATOR_BIN", "gpu-operator", "operator")
}

/// Installs the chart once per test process, the way NVIDIA's guide does for pre-installed drivers, and prints
/// the API server's version into the test log.
pub fn chart_installed() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let version = kubectl_json(&["version"]);
        eprintln!(
            "testing against kube-apiserver {} (kubectl {})",
            version["serverVersion"]["gitVersion"], version["clientVersion"]["gitVersion"]
        );
        let status = run("helm", &["status", RELEASE, "-n", NAMESPACE]);
        if !status.success {
            install_chart(&GUIDE_VALUES);
        }
    });
}

/// The values of NVIDIA's guide for nodes with pre-installed drivers, which [`chart_installed`] installs with.
pub const GUIDE_VALUES: [&str; 4] = [
    "--set",
    "driver.enabled=false",
    "--set",
    "nfd.enabled=false",
];

/// `helm install --wait` of the chart as release [`RELEASE`] in [`NAMESPACE`], with `values` (flags such as
/// `--set k=v` or `-f file`); the result, whether or not it succeeded.
pub fn try_install_chart(values: &[&str]) -> Run {
    let chart = chart_dir();
    let mut args = vec![
        "install",
        "--wait",
        "--timeout",
        "180s",
        RELEASE,
        "-n",
        NAMESPACE,
        "--create-namespace",
        &chart,
    ];
    args.extend_from_slice(values);
    run("helm", &args)
}

/// [`try_install_chart`], which must succeed.
pub fn install_chart(values: &[&str]) {
    let result = try_install_chart(values);
    assert!(
        result.success,
        "helm install {} failed:\n{}\n{}",
        values.join(" "),
        result.stdout,
        result.stderr
    );
}

/// Deletes every ClusterPolicy and waits until they are gone. The operator's finalizer removes its node labels,
/// so an operator must be running.
fn delete_cluster_policies() {
    let deleted = run(
        "kubectl",
        &[
            "delete",
            "clusterpolicies",
            "--all",
            "--wait=true",
            "--timeout=90s",
        ],
    );
    if !deleted.success {
        eprintln!("deleting the ClusterPolicies failed: {}", deleted.stderr);
    }
}

/// Removes the chart's release, if installed, with an operator (`<identity>-cleanup`) running while the
/// ClusterPolicies are deleted, so that its finalizer removes the node labels: the cluster as before any install.
pub fn remove_release(identity: &str) {
    if run("helm", &["status", RELEASE, "-n", NAMESPACE]).success {
        let cleaner = Operator::start(&format!("{identity}-cleanup"));
        delete_cluster_policies();
        drop(cleaner);
        let uninstalled = uninstall_release();
        assert!(
            uninstalled.success,
            "helm uninstall: {}",
            uninstalled.stderr
        );
    }
}

/// The chart installed a test's own way, with the operator running as a local process. When dropped (also when
/// the test fails), the ClusterPolicies are deleted while the operator still runs (its finalizer removes the node
/// labels), the operator stops, and the chart is installed again as [`chart_installed`] installs it, so that the
/// suites after this test find the install they expect.
#[derive(Debug)]
pub struct OwnInstall {
    pub operator: Option<Operator>,
}

impl OwnInstall {
    /// Removes the release in place (with an operator running for the ClusterPolicies' finalizer), installs the
    /// chart with `values` (`install` must succeed), and starts the operator as `identity`.
    pub fn start(values: &[&str], identity: &str) -> Self {
        Self::start_with(values, identity, Operator::start)
    }

    /// As [`OwnInstall::start`], with the operator `start` starts (e.g. one serving the HAMi webhook).
    pub fn start_with(
        values: &[&str],
        identity: &str,
        start: impl FnOnce(&str) -> Operator,
    ) -> Self {
        remove_release(identity);
        install_chart(values);
        Self {
            operator: Some(start(identity)),
        }
    }
}

impl Drop for OwnInstall {
    fn drop(&mut self) {
        // No panic here: this may run while a failed test unwinds.
        delete_cluster_policies();
        drop(self.operator.take());
        let _ = uninstall_release();
        let restored = try_install_chart(&GUIDE_VALUES);
        if !restored.success {
            eprintln!("restoring the guide's install failed: {}", restored.stderr);
        }
    }
}

/// Waits until ClusterPolicy `name` reports `state` for its current generation, and returns it.
pub fn wait_for_policy_state(name: &str, state: &str, timeout: Duration) -> Value {
    eventually(timeout, || Ok(policy_in_state(name, state))).unwrap_or_else(|error| {
        panic!(
            "ClusterPolicy {name} never became {state}: {error:#}\n{:#}",
            kubectl_json(&["get", "clusterpolicy", name])["status"]
        )
    })
}

/// ClusterPolicy `name`, if it reports `state` for its current generation.
pub fn policy_in_state(name: &str, state: &str) -> Option<Value> {
    let policy = kubectl_json(&["get", "clusterpolicy", name]);
    (policy["status"]["state"] == state
        && policy["status"]["observedGeneration"] == policy["metadata"]["generation"])
        .then_some(policy)
}

/// A TCP port on 127.0.0.1 that nothing listens on right now, for a process under test to serve on.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// A fresh folder for one scenario's state files and logs: `<temp>/<name>-<pid>`.
pub fn scenario_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scenario folder");
    dir
}

/// Announces a step of a scenario in the test log, so a failure reads in the order a user would meet it.
pub fn step(name: &str) {
    eprintln!("--- {name}");
}

/// Polls `check` until it returns `Ok(Some(value))` or the timeout passes; the last error explains a timeout.
pub fn eventually<T>(
    timeout: Duration,
    mut check: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < timeout {
        match check() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(error) => last = Some(error),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    match last {
        Some(error) => Err(error).context(format!("still failing after {timeout:?}")),
        None => bail!("condition not met after {timeout:?}"),
    }
}

/// `kubectl patch clusterpolicy cluster-policy --type merge -p <patch>`, as NVIDIA's guides patch it.
pub fn patch_cluster_policy(patch: &Value) {
    kubectl(&cluster_policy_patch(&patch.to_string()));
}

/// The `kubectl` arguments of a merge patch of the ClusterPolicy.
fn cluster_policy_patch(patch: &str) -> [&str; 7] {
    [
        "patch",
        "clusterpolicy",
        "cluster-policy",
        "--type",
        "merge",
        "-p",
        patch,
    ]
}

/// A test's cleanup of the ClusterPolicy: `patch` merged into it, then a wait (up to a minute) until the operator
/// has removed `label` from every node. Failures are printed, not raised: a cleanup runs in `Drop`.
pub fn undo_policy_patch(patch: &Value, label: &str) {
    let patched = run("kubectl", &cluster_policy_patch(&patch.to_string()));
    if !patched.success {
        eprintln!("patching the ClusterPolicy back failed: {}", patched.stderr);
    }
    let released = eventually(Duration::from_secs(60), || {
        let labelled = kubectl_json(&["get", "nodes", "-l", label])["items"]
            .as_array()
            .map_or(0, Vec::len);
        Ok((labelled == 0).then_some(()))
    });
    if let Err(error) = released {
        eprintln!("{label} was not removed from every node: {error:#}");
    }
}

/// The operand DaemonSets the operator manages, as `kubectl get -o json` lists them.
pub fn operand_daemonsets() -> Vec<Value> {
    let list = kubectl_json(&[
        "get",
        "daemonsets",
        "-n",
        NAMESPACE,
        "-l",
        "app.kubernetes.io/managed-by=gpu-operator",
    ]);
    list["items"].as_array().cloned().unwrap_or_default()
}

/// A control-plane component (`etcd`, `kube-apiserver`, ...) taken down and started again in the background by
/// the harness (as `cargo xtask cluster restart` does), while the test watches what the operator and agents do
/// meanwhile.
#[derive(Debug)]
pub struct ControlPlaneRestart {
    restart: std::thread::JoinHandle<anyhow::Result<u32>>,
    component: String,
}

impl ControlPlaneRestart {
    /// Stops `component` now, keeps it down for `down_for`, and starts it again with its arguments.
    pub fn start(component: &str, down_for: Duration) -> Self {
        let name = component.to_owned();
        let restart = std::thread::spawn(move || harness::cluster::restart(&name, down_for));
        Self {
            restart,
            component: component.to_owned(),
        }
    }

    /// Waits until the component serves again; returns when that was.
    pub fn wait(self) -> Instant {
        let served = self.restart.join().expect("the restart thread panicked");
        let back = Instant::now();
        if let Err(error) = served {
            panic!("restarting {} failed: {error:#}", self.component);
        }
        back
    }
}

/// Cuts every TCP connection to the API server (`ss -K`), as a load balancer's reset or a network blip does:
/// every client's watches drop at once while the API server keeps running. Returns how many were cut.
pub fn cut_api_server_connections() -> usize {
    let server = kubectl(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]);
    let port = server
        .trim()
        .rsplit_once(':')
        .map(|(_, port)| port.to_owned())
        .expect("the API server's URL has a port");
    let cut = ok(
        "ss",
        &["-K", "-t", "-n", "dst", "127.0.0.1", "dport", "=", &port],
    );
    // `ss -K` lists the sockets it closed under a header line.
    cut.lines()
        .skip(1)
        .filter(|line| !line.trim().is_empty())
        .count()
}

/// The HTTP status of `GET path` on 127.0.0.1:port, or `None` when nothing answers.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    http_get(port, path).map(|(status, _)| status)
}

/// The status and body of `GET path` on 127.0.0.1:port, or `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, body)| body.to_owned());
    Some((status, body))
}

/// A kubeconfig that authenticates as ServiceAccount `name` of the chart's namespace (a fresh token), against
/// the running cluster: a process run with it has exactly the chart's RBAC for that role.
pub fn service_account_kubeconfig(name: &str) -> PathBuf {
    harness::cluster::running()
        .and_then(|cluster| harness::cluster::service_account_kubeconfig(&cluster, NAMESPACE, name))
        .unwrap_or_else(|error| panic!("a kubeconfig for ServiceAccount {name}: {error:#}"))
}

/// The operator running as a local process, as the chart's Deployment runs it (`gpu-operator run`), with the
/// chart's ServiceAccount token; killed when dropped.
#[derive(Debug)]
pub struct Operator {
    child: std::process::Child,
    pub port: u16,
}

impl Operator {
    /// Starts the operator and waits until it is ready (caches synced) and leads.
    pub fn start(identity: &str) -> Self {
        let operator = Self::launch(identity);
        operator.wait_ready(Duration::from_secs(90));
        wait_leader(identity, Duration::from_secs(90));
        operator
    }

    /// [`Operator::start`] with extra environment (the operator's settings, e.g. shorter driver upgrade timeouts).
    pub fn start_with_env(identity: &str, env: &[(&str, &str)]) -> Self {
        let mut all = vec![("HAMI_WEBHOOK", "false"), ("NODE_BOUND_EVICTIONS", "false")];
        all.extend_from_slice(env);
        let operator = Self::spawn(identity, &service_account_kubeconfig("gpu-operator"), &all);
        operator.wait_ready(Duration::from_secs(90));
        wait_leader(identity, Duration::from_secs(90));
        operator
    }

    /// Starts the operator without waiting: a second replica becomes ready but waits for the lease while another
    /// one leads. Its webhooks are off: a test that needs them starts the operator with [`Operator::with_webhook`].
    pub fn launch(identity: &str) -> Self {
        Self::launch_as(identity, &service_account_kubeconfig("gpu-operator"))
    }

    /// [`Operator::launch`] with a kubeconfig made earlier: a pod restarted while the API server is away keeps
    /// its token, where making a new one would need the API server.
    pub fn launch_as(identity: &str, kubeconfig: &std::path::Path) -> Self {
        Self::spawn(
            identity,
            kubeconfig,
            &[("HAMI_WEBHOOK", "false"), ("NODE_BOUND_EVICTIONS", "false")],
        )
    }

    /// Starts the operator with its webhooks (HAMi pods, node-bound evictions), which the API server calls at
    /// `https://127.0.0.1:<port>`, and waits until it is ready, leads, and both configurations send their requests to it. The last step is the leader's
    /// own, after the lease: a pod applied before it would go to the previous operator's address.
    pub fn with_webhook(identity: &str, port: u16) -> Self {
        let address = format!("127.0.0.1:{port}");
        let url = format!("https://{address}");
        let operator = Self::spawn(
            identity,
            &service_account_kubeconfig("gpu-operator"),
            &[
                ("WEBHOOK_LISTEN", address.as_str()),
                ("WEBHOOK_URL", url.as_str()),
                // Templates no pod names are swept within seconds, so the suites see it happen.
                ("HAMI_TEMPLATES_UNUSED_FOR_SECONDS", "5"),
                ("HAMI_TEMPLATES_SWEEP_EVERY_SECONDS", "2"),
            ],
        );
        operator.wait_ready(Duration::from_secs(90));
        wait_leader(identity, Duration::from_secs(90));
        let ours = format!("{url}/");
        eventually(Duration::from_secs(90), || {
            let calls_us = |kind: &str, name: &str| {
                let configured = run(
                    "kubectl",
                    &[
                        "get",
                        kind,
                        name,
                        "-o",
                        "jsonpath={.webhooks[0].clientConfig.url}",
                    ],
                );
                configured.success && configured.stdout.starts_with(&ours)
            };
            Ok(
                (calls_us("mutatingwebhookconfiguration", "gpu-operator-hami")
                    && calls_us(
                        "validatingwebhookconfiguration",
                        "gpu-operator-node-bound-evictions",
                    ))
                .then_some(()),
            )
        })
        .expect("the webhook configurations call the new operator");
        operator
    }

    fn spawn(identity: &str, kubeconfig: &std::path::Path, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let child = Command::new(operator_bin())
            .args(["run", "--health-addr", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", kubeconfig)
            .env("OPERATOR_NAMESPACE", NAMESPACE)
            .env("POD_NAME", identity)
            .env("RUST_LOG", "info,operator=debug")
            .envs(env.iter().copied())
            .spawn()
            .expect("start gpu-operator");
        Self { child, port }
    }

    /// Waits until `/readyz` answers 200: its caches are synced (and its webhook serves, where it has one).
    pub fn wait_ready(&self, timeout: Duration) {
        eventually(timeout, || {
            Ok((http_status(self.port, "/readyz") == Some(200)).then_some(()))
        })
        .expect("operator became ready");
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// How the process ended, or None while it runs.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("check on gpu-operator")
    }

    /// Stops the process as the kubelet stops a pod (SIGTERM), and waits up to 10 s for it to end.
    pub fn terminate(mut self) {
        self.stop_gracefully();
    }

    fn stop_gracefully(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Stops the operator gracefully: it gives up its lease, so the next test's operator leads at once.
impl Drop for Operator {
    fn drop(&mut self) {
        self.stop_gracefully();
    }
}

/// The holder of the operator's leader lease ("" when nobody holds it).
pub fn lease_holder() -> String {
    run(
        "kubectl",
        &[
            "get",
            "lease",
            "gpu-operator-leader",
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
    )
    .stdout
}

/// Waits until the operator replica `identity` holds the leader lease.
pub fn wait_leader(identity: &str, timeout: Duration) {
    eventually(timeout, || Ok((lease_holder() == identity).then_some(())))
        .unwrap_or_else(|error| panic!("{identity} did not become the leader: {error}"));
}

/// Write requests (create, update, patch, delete) the API server's audit log recorded from `user` since line
/// `from` of the log, by resource; `E2E_AUDIT_LOG` names the log (`cargo xtask e2e` sets it).
pub fn audited_writes(user: &str, from: usize) -> (usize, BTreeMap<String, usize>) {
    audited_requests(
        user,
        from,
        &["create", "update", "patch", "delete", "deletecollection"],
    )
}

/// Requests with one of `verbs` that the API server's audit log recorded from `user` since line `from` of the
/// log, counted by `verb resource[/subresource]` as the benchmark counts them (a watch when it starts); and the
/// log's length, for the next call's `from`.
pub fn audited_requests(
    user: &str,
    from: usize,
    verbs: &[&str],
) -> (usize, BTreeMap<String, usize>) {
    let path = std::env::var("E2E_AUDIT_LOG").expect("E2E_AUDIT_LOG is set by `cargo xtask e2e`");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let window = lines.get(from..).unwrap_or_default().join("\n");
    let requests = harness::cluster::audit::count(&window, user)
        .by_kind
        .into_iter()
        .filter(|(kind, _)| verbs.contains(&kind.split(' ').next().unwrap_or_default()))
        .map(|(kind, count)| (kind, usize::try_from(count).unwrap_or(usize::MAX)))
        .collect();
    (lines.len(), requests)
}

/// Every leaf of `written` must appear with the same value in `read`; returns the paths that do not. `read`
/// may hold more (defaults the API server filled in).
pub fn missing_fields(written: &Value, read: &Value, path: &str) -> Vec<String> {
    match (written, read) {
        (Value::Object(written), Value::Object(read)) => written
            .iter()
            .flat_map(|(key, value)| match read.get(key) {
                Some(read_value) => missing_fields(value, read_value, &format!("{path}.{key}")),
                None => vec![format!("{path}.{key}")],
            })
            .collect(),
        (Value::Array(written), Value::Array(read)) if written.len() == read.len() => written
            .iter()
            .zip(read)
            .enumerate()
            .flat_map(|(index, (w, r))| missing_fields(w, r, &format!("{path}[{index}]")))
            .collect(),
        _ if written == read => Vec::new(),
        _ => vec![format!("{path}: wrote {written}, read {read}")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn missing_fields_finds_dropped_and_changed_leaves() {
        let written = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x"});
        let read = json!({"a": {"b": 1, "c": [1, 3], "extra": true}});
        assert_eq!(
            missing_fields(&written, &read, "spec"),
            vec!["spec.a.c[1]: wrote 2, read 3", "spec.d"]
        );
        assert!(missing_fields(&written, &written, "spec").is_empty());
    }
}

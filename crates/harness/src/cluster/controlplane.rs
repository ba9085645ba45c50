//! Starting and stopping the control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok,
//! on 127.0.0.1, as processes that outlive xtask. What runs is recorded in `<state>/state.json`.
//!
//! The one exception to loopback: the API server also listens on the host's address and advertises it as the
//! `kubernetes` Service's endpoint, because pods on the real node (see `realnode`) reach it through that Service,
//! and a pod's network namespace has its own loopback.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ServiceAccount;
use serde::{Deserialize, Serialize};

use super::certs::{self, Identity};
use super::paths::Layout;
use super::process::{self, Record};
use super::tools::Toolset;
use super::{api, kubeconfig, progress};

/// The service network. Virtual for kwok's nodes; the real node's kube-proxy routes the `kubernetes` Service.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The first address of [`SERVICE_CIDR`]: the `kubernetes` Service's cluster IP, in the serving certificate.
pub const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// Where kwok takes pod IPs from. They are only written into pod status; nothing routes to them.
pub const POD_CIDR: &str = "10.244.0.1/16";
/// kwok manages only the nodes carrying this annotation.
pub const KWOK_NODE_SELECTOR: &str = "kwok.x-k8s.io/node=fake";
/// How long `cluster down` waits after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The processes of a complete cluster, in start order.
pub const COMPONENTS: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
];

/// The identities that get a certificate and a kubeconfig. kwok uses the admin's.
pub const IDENTITIES: [Identity; 3] = [certs::ADMIN, certs::CONTROLLER_MANAGER, certs::SCHEDULER];

/// The loopback ports of one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ports {
    pub etcd_client: u16,
    pub etcd_peer: u16,
    pub apiserver: u16,
    /// kwok's server, which is also what nodes advertise as their kubelet port.
    pub kwok: u16,
}

/// What `<state>/state.json` records about the running cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub apiserver_url: String,
    /// The binaries it runs: a cluster started with other versions is restarted by `cluster up`.
    pub bin_dir: PathBuf,
    pub ports: Ports,
    /// The host address the API server advertises to pods; None on a host with no route off loopback, where the
    /// cluster works for kwok's nodes but cannot take a real one.
    #[serde(default)]
    pub host_address: Option<Ipv4Addr>,
    /// In start order.
    pub processes: Vec<Record>,
    /// Processes started on top of the cluster (the demo's operator and node agents), stopped before it.
    #[serde(default)]
    pub workloads: Vec<Record>,
}

impl State {
    fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("state.json")
    }

    /// The recorded state, or None when no cluster was started.
    pub fn load(state_dir: &Path) -> anyhow::Result<Option<Self>> {
        let path = Self::path(state_dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(error).with_context(|| format!("cannot read {}", path.display()));
            }
        };
        serde_json::from_str(&text).map(Some).with_context(|| {
            format!(
                "{} is not a cluster state; stop its processes by hand and remove {}",
                path.display(),
                state_dir.display()
            )
        })
    }

    fn save(&self, state_dir: &Path) -> anyhow::Result<()> {
        let path = Self::path(state_dir);
        std::fs::write(&path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

/// The files of one cluster, all in the state directory.
#[derive(Debug, Clone)]
pub struct Files {
    pub dir: PathBuf,
}

impl Files {
    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The admin's kubeconfig is `kubeconfig`; the components' are `<name>.kubeconfig`.
    pub fn kubeconfig(&self, identity: Identity) -> PathBuf {
        if identity == certs::ADMIN {
            self.file("kubeconfig")
        } else {
            self.file(&format!("{}.kubeconfig", identity.name))
        }
    }

    pub fn log(&self, component: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{component}.log"))
    }
}

/// Picks `count` distinct free loopback ports: binds each to port 0 (all at once, so the kernel cannot hand out one
/// twice) and releases them.
pub fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..count)
        .map(|_| {
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .context("cannot bind a free port on 127.0.0.1")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|listener| Ok(listener.local_addr()?.port()))
        .collect()
}

fn path_arg(flag: &str, path: &Path) -> String {
    format!("--{flag}={}", path.display())
}

pub fn etcd_args(files: &Files, ports: Ports) -> Vec<String> {
    let client = format!("http://127.0.0.1:{}", ports.etcd_client);
    let peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
    vec![
        "--name=local".into(),
        path_arg("data-dir", &files.file("etcd")),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=local={peer}"),
        // A throwaway test cluster: speed over durability.
        "--unsafe-no-fsync=true".into(),
        "--log-level=warn".into(),
    ]
}

/// The address of this host that other network namespaces reach it by: the source address of its route to the
/// outside (no packet is sent), or None when it has no such route.
pub fn host_address() -> Option<Ipv4Addr> {
    let socket = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket.connect((Ipv4Addr::new(203, 0, 113, 1), 9)).ok()?;
    match socket.local_addr().ok()?.ip() {
        IpAddr::V4(address) if !address.is_loopback() && !address.is_unspecified() => Some(address),
        _ => None,
    }
}

pub fn apiserver_args(files: &Files, ports: Ports, host_address: Option<Ipv4Addr>) -> Vec<String> {
    let listen = match host_address {
        // The kubeconfigs use 127.0.0.1; pods use the `kubernetes` Service, whose endpoint is the advertised address.
        Some(address) => vec![
            "--bind-address=0.0.0.0".into(),
            format!("--advertise-address={address}"),
        ],
        // Nothing can use the `kubernetes` Service's endpoints, and loopback ones would be invalid.
        None => vec![
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
        ],
    };
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd_client),
        format!("--secure-port={}", ports.apiserver),
    ];
    args.extend(listen);
    args.extend([
        // `kubectl logs` and `exec` on the real node: the kubelet trusts the cluster CA, and is reached at its
        // InternalIP (its Hostname address is the node name, which no DNS resolves).
        "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
        path_arg(
            "kubelet-client-certificate",
            &files.file("kubelet-client.crt"),
        ),
        path_arg("kubelet-client-key", &files.file("kubelet-client.key")),
        path_arg("tls-cert-file", &files.file("apiserver.crt")),
        path_arg("tls-private-key-file", &files.file("apiserver.key")),
        path_arg("client-ca-file", &files.file("ca.crt")),
        path_arg("cert-dir", &files.file("apiserver-certs")),
        "--authorization-mode=Node,RBAC".into(),
        // Operands (driver, toolkit, device plugin) are privileged DaemonSets.
        "--allow-privileged=true".into(),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        path_arg("service-account-key-file", &files.file("sa.pub")),
        path_arg("service-account-signing-key-file", &files.file("sa.key")),
        "--profiling=false".into(),
        // Every write, with who made it: how tests prove the operator leaves the API server alone at rest.
        path_arg("audit-policy-file", &files.file("audit-policy.yaml")),
        path_arg("audit-log-path", &files.log("audit")),
        "--audit-log-format=json".into(),
    ]);
    args
}

/// Audit policy: every request of the ServiceAccounts in the operator's namespace (the operator's reads and watches
/// are what `cargo xtask bench` counts), and everyone's writes, at Metadata level (verb, user, user agent, object).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: [\"system:serviceaccounts:gpu-operator\"]
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
";

/// kwok's own settings. Its default of 4 pod stages at a time makes 1000 nodes' DaemonSet pods wait minutes to
/// turn Ready (kwok, not the operators, would be measured), and its 4 lease renewals at a time fell behind at 1000
/// nodes under that load. A configuration file must name every parallelism (it leaves unnamed ones at 0).
const KWOK_CONFIGURATION: &str = "apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 32
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 16
  podsOnNodeSyncParallelism: 1
";

/// What kube-controller-manager and kube-scheduler share: their identity's kubeconfig for everything, loopback
/// only, no serving port (nothing scrapes or probes them here), no leader election, no profiling.
fn component_args(kubeconfig: &Path) -> Vec<String> {
    vec![
        path_arg("kubeconfig", kubeconfig),
        path_arg("authentication-kubeconfig", kubeconfig),
        path_arg("authorization-kubeconfig", kubeconfig),
        "--bind-address=127.0.0.1".into(),
        "--secure-port=0".into(),
        "--leader-elect=false".into(),
        "--profiling=false".into(),
    ]
}

pub fn controller_manager_args(files: &Files) -> Vec<String> {
    let mut args = component_args(&files.kubeconfig(certs::CONTROLLER_MANAGER));
    args.extend([
        "--use-service-account-credentials=true".into(),
        path_arg("service-account-private-key-file", &files.file("sa.key")),
        path_arg("root-ca-file", &files.file("ca.crt")),
        path_arg("cluster-signing-cert-file", &files.file("ca.crt")),
        path_arg("cluster-signing-key-file", &files.file("ca.key")),
        // Its default is under /usr/libexec, which it would create.
        path_arg("flex-volume-plugin-dir", &files.file("flexvolume")),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        // At 1000 kwok nodes one operand DaemonSet is 1000 pods: at the default 20 requests/s its controller alone
        // would take a minute per DaemonSet, and every operator would measure the controller manager.
        "--kube-api-qps=400".into(),
        "--kube-api-burst=800".into(),
        "--concurrent-daemonset-syncs=8".into(),
        // kwok renews the leases of every simulated node on the same two cores as the control plane; under a
        // 1000-node rollout a renewal can be late by more than the default 50 s, and the node would be tainted
        // unreachable mid-measurement. A real node's kubelet does not share its CPU with the API server.
        "--node-monitor-grace-period=5m".into(),
    ]);
    args
}

pub fn scheduler_args(files: &Files) -> Vec<String> {
    let mut args = component_args(&files.kubeconfig(certs::SCHEDULER));
    // Binding thousands of DaemonSet pods: the default 50 requests/s would be the bottleneck (see above).
    args.extend(["--kube-api-qps=400".into(), "--kube-api-burst=800".into()]);
    args
}

pub fn kwok_args(files: &Files, ports: Ports) -> Vec<String> {
    vec![
        path_arg("kubeconfig", &files.kubeconfig(certs::ADMIN)),
        path_arg("config", &files.file("kwok.yaml")),
        "--manage-all-nodes=false".into(),
        format!("--manage-nodes-with-annotation-selector={KWOK_NODE_SELECTOR}"),
        // Nodes' kubelet address: kwok's own server, so an API-server proxy call (logs, exec) stays on loopback.
        "--node-ip=127.0.0.1".into(),
        format!("--node-port={}", ports.kwok),
        format!("--server-address=127.0.0.1:{}", ports.kwok),
        path_arg("tls-cert-file", &files.file("apiserver.crt")),
        path_arg("tls-private-key-file", &files.file("apiserver.key")),
        format!("--cidr={POD_CIDR}"),
        // Keep a Lease per node, as a kubelet does, so the node lifecycle controller sees them alive.
        "--node-lease-duration-seconds=40".into(),
    ]
}

/// Several YAML files as one multi-document stream.
pub fn yaml_stream(documents: &[String]) -> String {
    documents
        .iter()
        .map(|document| document.trim())
        .collect::<Vec<_>>()
        .join("\n---\n")
        + "\n"
}

/// Whether the recorded cluster still works; Err says why not.
pub fn check_health(state: &State, kubeconfig: &Path, bin_dir: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        state.bin_dir == bin_dir,
        "it runs binaries from {}",
        state.bin_dir.display()
    );
    let started: Vec<&str> = state
        .processes
        .iter()
        .map(|record| record.name.as_str())
        .collect();
    anyhow::ensure!(
        started == COMPONENTS,
        "its start did not finish (only {} started)",
        started.join(", ")
    );
    if let Some(dead) = state
        .processes
        .iter()
        .find(|record| !process::is_running(record))
    {
        anyhow::bail!(
            "{} (pid {}) is not running; its log: {}",
            dead.name,
            dead.pid,
            dead.log.display()
        );
    }
    api::Connection::open(kubeconfig)?.ready()
}

/// Stops the recorded processes and removes the state directory.
pub fn tear_down(state_dir: &Path) -> anyhow::Result<bool> {
    let Some(state) = State::load(state_dir)? else {
        if state_dir.exists() {
            remove(state_dir)?;
        }
        return Ok(false);
    };
    // The real node first, while the API server can still take its pods away.
    super::realnode::tear_down(state_dir, &state)?;
    process::stop_all(&state.workloads, STOP_GRACE)?;
    process::stop_all(&state.processes, STOP_GRACE)?;
    remove(state_dir)?;
    Ok(true)
}

/// Starts `binary` as a workload of the running cluster, replacing a running one of the same name, with its log
/// in the cluster's `logs/<name>.log`; `cluster down` stops it.
pub fn start_workload(
    state_dir: &Path,
    name: &str,
    binary: &Path,
    args: &[String],
    env: &[(String, String)],
) -> anyhow::Result<Record> {
    let mut state = stop_workload_in(state_dir, name)?;
    let log = Files {
        dir: state_dir.to_path_buf(),
    }
    .log(name);
    let (_child, record) = process::spawn(name, binary, args, env, &log)?;
    state.workloads.push(record.clone());
    state.save(state_dir)?;
    Ok(record)
}

/// Stops the workload `name` (SIGTERM, then SIGKILL after [`STOP_GRACE`]) if it runs.
pub fn stop_workload(state_dir: &Path, name: &str) -> anyhow::Result<()> {
    stop_workload_in(state_dir, name)?.save(state_dir)
}

/// Stops the workload `name` and returns the state without it (not saved yet).
fn stop_workload_in(state_dir: &Path, name: &str) -> anyhow::Result<State> {
    let mut state = State::load(state_dir)?
        .context("the cluster is not up; run `cargo xtask cluster up` first")?;
    let (previous, others): (Vec<Record>, Vec<Record>) =
        state.workloads.into_iter().partition(|w| w.name == name);
    process::stop_all(&previous, STOP_GRACE)?;
    state.workloads = others;
    Ok(state)
}

fn remove(dir: &Path) -> anyhow::Result<()> {
    std::fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))
}

/// Starts a fresh cluster in the (absent) state directory and waits until it is ready. On failure, the processes it
/// started are stopped and the directory is kept for its logs.
pub fn start(layout: &Layout, toolset: &Toolset) -> anyhow::Result<State> {
    start_components(&layout.state_dir(), toolset, &COMPONENTS, &|name| {
        toolset.binary(name)
    })
}

/// Starts an API server alone on its own etcd in the (absent) `state_dir`, from the binary `apiserver` (another
/// Kubernetes version's): no controllers, scheduler or nodes, so that nothing of a newer version talks to it.
pub fn start_api_server_alone(
    state_dir: &Path,
    toolset: &Toolset,
    apiserver: &Path,
) -> anyhow::Result<State> {
    start_components(state_dir, toolset, &["etcd", "kube-apiserver"], &|name| {
        if name == "kube-apiserver" {
            apiserver.to_path_buf()
        } else {
            toolset.binary(name)
        }
    })
}

fn start_components(
    state_dir: &Path,
    toolset: &Toolset,
    components: &[&str],
    binary: &dyn Fn(&str) -> PathBuf,
) -> anyhow::Result<State> {
    let files = Files {
        dir: state_dir.to_path_buf(),
    };
    std::fs::create_dir_all(files.dir.join("logs"))
        .with_context(|| format!("cannot create {}", files.dir.display()))?;
    std::fs::set_permissions(&files.dir, std::fs::Permissions::from_mode(0o700))?;
    let [etcd_client, etcd_peer, apiserver, kwok] = free_ports(4)?[..] else {
        anyhow::bail!("free_ports returned the wrong number of ports");
    };
    let ports = Ports {
        etcd_client,
        etcd_peer,
        apiserver,
        kwok,
    };
    let mut state = State {
        apiserver_url: format!("https://127.0.0.1:{apiserver}"),
        bin_dir: toolset.bin_dir.clone(),
        ports,
        host_address: host_address(),
        processes: Vec::new(),
        workloads: Vec::new(),
    };
    progress::step("write certificates and kubeconfigs", |_| {
        write_files(&files, &state, toolset)
    })?;
    let mut children = Vec::new();
    let result = launch(&files, components, binary, &mut state, &mut children);
    if let Err(error) = result {
        // The error already says what failed; stopping what did start is best effort.
        if let Err(stop_error) = process::stop_all(&state.processes, STOP_GRACE) {
            progress::say(format!(
                "also failed to stop the started processes: {stop_error:#}"
            ));
        }
        return Err(error.context(format!(
            "starting the control plane failed; logs are in {}",
            files.dir.join("logs").display()
        )));
    }
    Ok(state)
}

fn write_files(files: &Files, state: &State, toolset: &Toolset) -> anyhow::Result<()> {
    let pki = certs::generate(IpAddr::V4(SERVICE_IP), &IDENTITIES)?;
    let secret = |name: &str, contents: &str| write_file(&files.file(name), contents, 0o600);
    let public = |name: &str, contents: &str| write_file(&files.file(name), contents, 0o644);
    public("ca.crt", &pki.ca.cert_pem)?;
    secret("ca.key", &pki.ca.key_pem)?;
    public("apiserver.crt", &pki.apiserver.cert_pem)?;
    secret("apiserver.key", &pki.apiserver.key_pem)?;
    secret("sa.key", &pki.service_account_key_pem)?;
    public("sa.pub", &pki.service_account_public_pem)?;
    for (identity, client) in &pki.clients {
        if *identity == certs::ADMIN {
            public("kubelet-client.crt", &client.cert_pem)?;
            secret("kubelet-client.key", &client.key_pem)?;
        }
        let text = kubeconfig::render(
            &state.apiserver_url,
            &pki.ca.cert_pem,
            identity.user,
            client,
        )?;
        write_file(&files.kubeconfig(*identity), &text, 0o600)?;
    }
    let stages = toolset
        .kwok_stages
        .iter()
        .map(|path| {
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut documents = vec![KWOK_CONFIGURATION.to_owned()];
    documents.extend(stages);
    public("kwok.yaml", &yaml_stream(&documents))?;
    public("audit-policy.yaml", AUDIT_POLICY)?;
    state.save(&files.dir)
}

fn write_file(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

fn launch(
    files: &Files,
    components: &[&str],
    binary: &dyn Fn(&str) -> PathBuf,
    state: &mut State,
    children: &mut Vec<(Child, Record)>,
) -> anyhow::Result<()> {
    for name in components {
        let args = args_of(name, files, state)?;
        let (child, record) = process::spawn(name, &binary(name), &args, &[], &files.log(name))?;
        state.processes.push(record.clone());
        state.save(&files.dir)?;
        children.push((child, record));
        wait_until_serving(name, files, state, children)?;
    }
    if !components.contains(&"kube-controller-manager") {
        return Ok(());
    }
    let connection = api::Connection::open(&files.kubeconfig(certs::ADMIN))?;
    let accounts = kube::Api::<ServiceAccount>::namespaced(connection.client.clone(), "default");
    wait_for(
        "the default ServiceAccount",
        Duration::from_secs(180),
        children,
        || {
            let found = connection.request(accounts.get_opt("default"))?;
            anyhow::ensure!(found.is_some(), "not created yet");
            Ok(())
        },
    )
}

/// The arguments the control-plane component `name` runs with in the cluster `state`.
fn args_of(name: &str, files: &Files, state: &State) -> anyhow::Result<Vec<String>> {
    Ok(match name {
        "etcd" => etcd_args(files, state.ports),
        "kube-apiserver" => apiserver_args(files, state.ports, state.host_address),
        "kube-controller-manager" => controller_manager_args(files),
        "kube-scheduler" => scheduler_args(files),
        "kwok" => kwok_args(files, state.ports),
        other => anyhow::bail!(
            "{other} is not a control-plane component (one of {})",
            COMPONENTS.join(", ")
        ),
    })
}

/// Waits until etcd or the API server serves requests; the other components have nothing to wait for.
fn wait_until_serving(
    name: &str,
    files: &Files,
    state: &State,
    children: &mut [(Child, Record)],
) -> anyhow::Result<()> {
    match name {
        "etcd" => {
            let health = format!("http://127.0.0.1:{}/health", state.ports.etcd_client);
            wait_for("etcd", Duration::from_secs(60), children, || {
                let body = super::fetch::get_text(&health)?;
                anyhow::ensure!(body.contains(r#""health":"true""#), "etcd says {body}");
                Ok(())
            })
        }
        "kube-apiserver" => {
            let connection = api::Connection::open(&files.kubeconfig(certs::ADMIN))?;
            wait_for(
                "kube-apiserver /readyz",
                Duration::from_secs(180),
                children,
                || connection.ready(),
            )
        }
        _ => Ok(()),
    }
}

/// Stops the control-plane component `name` of the running cluster (SIGTERM, then SIGKILL after [`STOP_GRACE`]),
/// leaves it down for `down_for`, and starts it again with the same arguments and log; returns once it serves
/// again. The chaos tests use it to take the API server away, or restart etcd, under the operator.
pub fn restart(state_dir: &Path, name: &str, down_for: Duration) -> anyhow::Result<Record> {
    let mut state = State::load(state_dir)?
        .context("the cluster is not up; run `cargo xtask cluster up` first")?;
    let files = Files {
        dir: state_dir.to_path_buf(),
    };
    let args = args_of(name, &files, &state)?;
    let position = state
        .processes
        .iter()
        .position(|record| record.name == name)
        .with_context(|| format!("{name} is not recorded as running"))?;
    let stopped = state.processes[position].clone();
    process::stop_all(std::slice::from_ref(&stopped), STOP_GRACE)?;
    progress::say(format!("{name} stopped; starting it again in {down_for:?}"));
    std::thread::sleep(down_for);
    let (child, record) = process::spawn(name, &stopped.binary, &args, &[], &stopped.log)?;
    state.processes[position] = record.clone();
    state.save(state_dir)?;
    wait_until_serving(name, &files, &state, &mut [(child, record.clone())])?;
    Ok(record)
}

/// Polls `probe` until it succeeds, failing early (with the tail of its log) when one of `children` exits.
pub(super) fn wait_for(
    what: &str,
    timeout: Duration,
    children: &mut [(Child, Record)],
    mut probe: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    progress::step(&format!("wait for {what}"), |step| {
        let deadline = Instant::now() + timeout;
        loop {
            for (child, record) in children.iter_mut() {
                if let Some(status) = child
                    .try_wait()
                    .with_context(|| format!("cannot check on {}", record.name))?
                {
                    anyhow::bail!(
                        "{} exited ({status}) while waiting for {what}; last lines of {}:\n{}",
                        record.name,
                        record.log.display(),
                        progress::log_tail(&record.log, 30)
                    );
                }
            }
            match probe() {
                Ok(()) => return Ok(()),
                Err(error) if Instant::now() >= deadline => {
                    anyhow::bail!(
                        "timed out after {timeout:?} waiting for {what}; last error: {error:#}"
                    )
                }
                Err(error) => step.update(&format!("{error:#}")),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Files, Ports) {
        (
            Files {
                dir: PathBuf::from("/s"),
            },
            Ports {
                etcd_client: 1,
                etcd_peer: 2,
                apiserver: 3,
                kwok: 4,
            },
        )
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(4).unwrap();
        assert_eq!(ports.len(), 4);
        assert!(ports.iter().all(|port| *port != 0));
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 4, "{ports:?}");
    }

    #[test]
    fn everything_listens_on_loopback_only() {
        let (files, ports) = sample();
        let all = [
            etcd_args(&files, ports),
            apiserver_args(&files, ports, None),
            controller_manager_args(&files),
            scheduler_args(&files),
            kwok_args(&files, ports),
        ]
        .concat();
        for arg in &all {
            if arg.contains("://") && !arg.contains("kubernetes.default.svc") {
                assert!(arg.contains("://127.0.0.1:"), "{arg}");
            }
            if arg.starts_with("--bind-address")
                || arg.starts_with("--server-address")
                || arg.starts_with("--node-ip")
            {
                assert!(arg.contains("=127.0.0.1"), "{arg}");
            }
        }
        assert!(all.contains(&"--authorization-mode=Node,RBAC".to_owned()));
        assert!(all.contains(&"--use-service-account-credentials=true".to_owned()));
        assert!(all.contains(&"--secure-port=3".to_owned()));
        assert!(all.contains(
            &"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".to_owned()
        ));
    }

    #[test]
    fn the_api_server_advertises_the_host_address_pods_can_reach() {
        let (files, ports) = sample();
        let args = apiserver_args(&files, ports, Some(Ipv4Addr::new(192, 0, 2, 2)));
        assert!(args.contains(&"--bind-address=0.0.0.0".to_owned()));
        assert!(args.contains(&"--advertise-address=192.0.2.2".to_owned()));
        assert!(
            !args
                .iter()
                .any(|arg| arg.starts_with("--endpoint-reconciler-type"))
        );
        assert!(args.contains(&"--kubelet-client-certificate=/s/kubelet-client.crt".to_owned()));
        assert!(host_address().is_none_or(|address| !address.is_loopback()));
    }

    #[test]
    fn components_use_their_own_kubeconfigs() {
        let (files, ports) = sample();
        assert!(
            controller_manager_args(&files)
                .contains(&"--kubeconfig=/s/controller-manager.kubeconfig".to_owned())
        );
        assert!(
            scheduler_args(&files).contains(&"--kubeconfig=/s/scheduler.kubeconfig".to_owned())
        );
        assert!(kwok_args(&files, ports).contains(&"--kubeconfig=/s/kubeconfig".to_owned()));
        assert_eq!(files.log("etcd"), PathBuf::from("/s/logs/etcd.log"));
    }

    #[test]
    fn joins_yaml_documents() {
        assert_eq!(
            yaml_stream(&["a: 1\n".into(), "\nb: 2".into()]),
            "a: 1\n---\nb: 2\n"
        );
    }

    #[test]
    fn state_round_trips_and_absence_is_none() {
        let dir = std::env::temp_dir().join(format!("xtask-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(State::load(&dir).unwrap().is_none());
        let (_, ports) = sample();
        let state = State {
            apiserver_url: "https://127.0.0.1:3".into(),
            bin_dir: PathBuf::from("/b"),
            ports,
            host_address: None,
            processes: vec![Record {
                name: "etcd".into(),
                pid: 7,
                binary: "/b/etcd".into(),
                log: "/s/logs/etcd.log".into(),
            }],
            workloads: Vec::new(),
        };
        state.save(&dir).unwrap();
        let loaded = State::load(&dir).unwrap().unwrap();
        assert_eq!(
            (loaded.ports, loaded.processes),
            (state.ports, state.processes)
        );
        std::fs::write(dir.join("state.json"), "not json").unwrap();
        assert!(State::load(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! `cluster add-real-node`: a node whose pods are real containers. containerd (Debian's package) runs with its own
//! config, root, state and sockets under `<cluster>/realnode/`, and pulls every image, the pod sandbox's too, from
//! a registry as a user's node does (`--insecure-registry` names one it reaches over plain HTTP, such as the
//! cluster's local registry that `cargo xtask images --push` filled); the kubelet built with the control plane
//! joins the cluster through it; kube-proxy (iptables mode, from the same
//! Kubernetes module) routes the `kubernetes` Service to the address the API server advertises, so pods reach the
//! API server the way they do in any cluster. Pods get addresses on a private bridge ([`POD_SUBNET`]).
//!
//! Every process is recorded by PID in `<cluster>/realnode/node.json`; `cluster down` takes the node's pods away
//! through the API (so the kubelet tears their sandboxes and networks down), then stops the kubelet, kube-proxy
//! (and removes its rules) and containerd, unmounts what is left under the directory and deletes the bridge.
//!
//! containerd runs in a mount namespace of its own where mounts are shared (see [`add`]), so that containers can
//! use HostToContainer mount propagation on a host whose root mount is private, without changing the host's.
//!
//! Only one real kubelet can run on a machine: its device-plugin directory is fixed at
//! `/var/lib/kubelet/device-plugins` (`add` refuses when another kubelet serves it).

mod configs;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::controlplane::wait_for as wait;
use super::controlplane::{self, STOP_GRACE, State};
use super::kubelet::KubeletConfig;
use super::nodes::{GPU_SIMULATOR_ANNOTATION, GpuSpec};
use super::paths::Layout;
use super::process::{self, Record};
use super::tools::{create_dir, write};
use super::{progress, tools, versions};
use crate::images::{PAUSE_IMAGE, REPOSITORY};
use configs::{cni_config, containerd_config, kube_proxy_config, plain_http_hosts};

/// The pods' network: a private /24 that collides with neither the service range nor kwok's pod range.
pub const POD_SUBNET: &str = "10.200.0.0/24";
/// The bridge the pods' veths hang off; the host's end is the pods' default gateway.
pub const BRIDGE: &str = "gor0";
/// The CNI network's name (also host-local's per-network directory).
const NETWORK: &str = "gpu-operator-rs";
/// The Debian packages the node needs, each with a file that shows it is installed.
const PACKAGES: [(&str, &str); 4] = [
    ("containerd", "/usr/bin/containerd"),
    ("runc", "/usr/sbin/runc"),
    ("containernetworking-plugins", "/usr/lib/cni/bridge"),
    ("iptables", "/usr/sbin/iptables"),
];
/// Where every kubelet serves device-plugin registration, whatever its `--root-dir`.
const DEVICE_PLUGIN_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
/// util-linux's unshare (essential on Debian).
const UNSHARE: &str = "/usr/bin/unshare";
/// Where Debian's containernetworking-plugins puts the plugins.
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The images' namespace in containerd that the CRI plugin (and so the kubelet) uses.
const CRI_NAMESPACE: &str = "k8s.io";
/// How long the kubelet gets to register the node and report it Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `cluster down` waits for the kubelet to stop the node's pods before killing what is left.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The taint that makes the node's pods go away on `cluster down` (DaemonSet pods do not tolerate it either).
const DRAIN_TAINT: &str = "gpu-operator-rs/shutting-down=true:NoExecute";

/// Arguments of `cluster add-real-node`.
#[derive(Debug, Clone, clap::Args)]
pub struct AddRealNode {
    /// The Node's name.
    #[arg(long, default_value = "real-node")]
    pub name: String,
    /// Simulated GPUs for the node agents on this node, as MODEL:COUNT: sets the `nvidia.com/gpu.simulator`
    /// annotation, which stands for the hardware (the agents, node-facts included, read it in place of the PCI
    /// devices and NVML). No label is set: the chart's node-facts role labels the node as it would a real one.
    #[arg(long)]
    pub gpus: Option<GpuSpec>,
    /// The directory with `images.json` from `cargo xtask images --push` (default: `<cache>/images`): the pushed
    /// pause image is the node's pod sandbox image.
    #[arg(long)]
    pub images: Option<PathBuf>,
    /// A registry (`host:port`) that containerd reaches over plain HTTP, such as the cluster's local one
    /// (registries.conf-style hosts.toml under containerd's `config_path`).
    #[arg(long)]
    pub insecure_registry: Vec<String>,
}

/// What `<cluster>/realnode/node.json` records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeState {
    pub node: String,
    /// containerd's gRPC socket.
    pub socket: PathBuf,
    pub kube_proxy: PathBuf,
    /// The kubelet's `--root-dir` (its pod-resources socket); device plugins register under
    /// `/var/lib/kubelet/device-plugins` whatever it is.
    pub kubelet_root: PathBuf,
    /// In start order: containerd, kube-proxy, kubelet.
    pub processes: Vec<Record>,
}

/// The entries of `images.json` this module reads.
#[derive(Debug, Deserialize)]
struct BuiltImage {
    /// Where `cargo xtask images --push` pushed it.
    reference: String,
}

/// The files of the real node, all under `<cluster>/realnode/`.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub root: PathBuf,
}

impl Dirs {
    pub fn of(state_dir: &Path) -> Self {
        Self {
            root: state_dir.join("realnode"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn socket(&self) -> PathBuf {
        self.path("containerd.sock")
    }

    fn state_file(&self) -> PathBuf {
        self.path("node.json")
    }

    /// containerd's `config_path`: one `<host:port>/hosts.toml` per registry with settings of its own.
    fn registry_hosts(&self) -> PathBuf {
        self.path("containerd/certs.d")
    }

    pub fn kubelet_root(&self) -> PathBuf {
        self.path("kubelet")
    }
}

/// Adds the real node to the running cluster (replacing an earlier one) and waits until it is Ready.
pub fn add(layout: &Layout, request: &AddRealNode) -> anyhow::Result<NodeState> {
    let state_dir = layout.state_dir();
    let state = State::load(&state_dir)?
        .context("the cluster is not up; run `cargo xtask cluster up` first")?;
    let host = state.host_address.context(
        "the API server advertises no address that pods can reach (this host had no route off loopback when the \
         cluster started); give the host a network address and restart the cluster",
    )?;
    let images_dir = match &request.images {
        Some(dir) => dir.clone(),
        None => layout.root.join("images"),
    };
    let images = read_images(&images_dir)?;
    let pause = images
        .iter()
        .find(|image| image.reference.contains(&format!("/{PAUSE_IMAGE}:")))
        .with_context(|| {
            format!(
                "{} lists no pause image",
                images_dir.join("images.json").display()
            )
        })?
        .reference
        .clone();
    anyhow::ensure!(
        !pause.starts_with(&format!("{REPOSITORY}/")),
        "{} names the images of {REPOSITORY}, where none is published: push them to a registry the node reaches \
         (`cargo xtask images --push <registry>/gpu-operator-rs`) first",
        images_dir.join("images.json").display()
    );
    crate::apt::ensure(&PACKAGES)?;
    let kube_proxy = tools::ensure_tool(layout, &versions::kube_proxy())?.join("kube-proxy");

    tear_down(&state_dir, &state)?;
    let registration = Path::new(DEVICE_PLUGIN_SOCKET);
    anyhow::ensure!(
        std::os::unix::net::UnixStream::connect(registration).is_err(),
        "another kubelet serves {}: only one kubelet can run on a machine; stop it first",
        registration.display()
    );
    let dirs = Dirs::of(&state_dir);
    for dir in [
        "containerd/root",
        "containerd/state",
        "containerd/opt",
        "containerd/certs.d",
        "runc",
        "cni",
        "cni-ipam",
        "logs",
    ] {
        create_dir(&dirs.path(dir))?;
    }
    let mut node = NodeState {
        node: request.name.clone(),
        socket: dirs.socket(),
        kube_proxy: kube_proxy.clone(),
        kubelet_root: dirs.kubelet_root(),
        processes: Vec::new(),
    };
    save(&dirs, &node)?;
    let mut children = Children::new();
    let kubeconfig = state_dir.join("kubeconfig");
    let logs = state_dir.join("logs");

    write(
        &dirs.path("containerd.toml"),
        &containerd_config(&dirs, &pause),
    )?;
    for registry in &request.insecure_registry {
        let dir = dirs.registry_hosts().join(registry);
        create_dir(&dir)?;
        write(&dir.join("hosts.toml"), &plain_http_hosts(registry))?;
    }
    write(
        &dirs.path("cni/10-gpu-operator-rs.conflist"),
        &cni_config(&dirs),
    )?;
    // containerd runs in a mount namespace of its own in which every mount is shared: containers may then mount
    // host paths with HostToContainer propagation (the validator's "/" does), which needs a shared or slave
    // mount, while the host's own "/" stays as it is (private here, where PID 1 is not systemd, so nothing
    // propagates back to it). The node's directory is made a shared mount on the host first: its copy in
    // containerd's namespace is then its peer, and the volumes the kubelet mounts under it reach containerd.
    share_mount(&dirs.root)?;
    let config = dirs.path("containerd.toml").display().to_string();
    let args = [
        "--mount",
        "--propagation",
        "shared",
        "--",
        PACKAGES[0].1,
        "--config",
        &config,
    ]
    .map(str::to_owned);
    let (child, mut record) = process::spawn(
        "containerd",
        Path::new(UNSHARE),
        &args,
        &[],
        &logs.join("containerd.log"),
    )?;
    // unshare execs containerd in place: the PID is containerd's.
    record.binary = PathBuf::from(PACKAGES[0].1);
    node.processes.push(record.clone());
    children.push((child, record));
    save(&dirs, &node)?;
    wait("containerd", Duration::from_secs(30), &mut children, || {
        ctr(&node.socket, &["version"]).map(drop)
    })?;
    write(
        &dirs.path("kube-proxy.yaml"),
        &kube_proxy_config(&kubeconfig, &request.name, free_port()?, free_port()?),
    )?;
    let args = vec![format!(
        "--config={}",
        dirs.path("kube-proxy.yaml").display()
    )];
    start(
        &mut node,
        &mut children,
        &dirs,
        "kube-proxy",
        &kube_proxy,
        &args,
        &logs,
    )?;

    write(
        &dirs.path("kubelet.yaml"),
        &KubeletConfig {
            address: host,
            port: free_port()?,
            healthz_port: free_port()?,
            runtime_socket: &dirs.socket(),
            pod_logs: &dirs.path("logs"),
            client_ca: Some(&state_dir.join("ca.crt")),
        }
        .render(),
    )?;
    // No --node-labels: the node starts as a user's node does, with only the kubelet's own labels; the chart's
    // node-facts role labels it as Node Feature Discovery would.
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", dirs.path("kubelet.yaml").display()),
        format!("--root-dir={}", dirs.kubelet_root().display()),
        format!("--cert-dir={}", dirs.path("kubelet-pki").display()),
        format!("--hostname-override={}", request.name),
        format!("--node-ip={host}"),
    ];
    let kubelet = state.bin_dir.join("kubelet");
    start(
        &mut node,
        &mut children,
        &dirs,
        "kubelet",
        &kubelet,
        &args,
        &logs,
    )?;
    let kubectl = state.bin_dir.join("kubectl");
    wait(
        &format!("node {} to be Ready", request.name),
        READY_TIMEOUT,
        &mut children,
        || {
            let output = kubectl_output(
                &kubectl,
                &kubeconfig,
                &[
                    "get",
                    "node",
                    &request.name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ],
            )?;
            anyhow::ensure!(output.trim() == "True", "Ready is {:?}", output.trim());
            Ok(())
        },
    )?;
    if let Some(gpus) = &request.gpus {
        kubectl_output(
            &kubectl,
            &kubeconfig,
            &[
                "annotate",
                "node",
                &request.name,
                "--overwrite",
                &format!("{GPU_SIMULATOR_ANNOTATION}={gpus}"),
            ],
        )?;
    }
    Ok(node)
}

/// Removes the real node if the cluster has one: its pods through the API (so that the kubelet stops their
/// sandboxes and frees their addresses), then its processes, kube-proxy's rules, leftover mounts and the bridge.
pub fn tear_down(state_dir: &Path, state: &State) -> anyhow::Result<()> {
    let dirs = Dirs::of(state_dir);
    let node: NodeState = match std::fs::read_to_string(dirs.state_file()) {
        Ok(text) => serde_json::from_str(&text).with_context(|| {
            format!("{} is not a real node's state", dirs.state_file().display())
        })?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(error)
                .with_context(|| format!("cannot read {}", dirs.state_file().display()));
        }
    };
    let kubectl = state.bin_dir.join("kubectl");
    let kubeconfig = state_dir.join("kubeconfig");
    let running = |name: &str| {
        node.processes
            .iter()
            .any(|record| record.name == name && process::is_running(record))
    };
    if running("kubelet")
        && running("containerd")
        && let Err(error) = drain(&kubectl, &kubeconfig, &node)
    {
        progress::say(format!(
            "the real node's pods did not all stop through the kubelet ({error:#}); killing them"
        ));
    }
    // The kubelet first, so that it restarts nothing; containerd last, after its containers are gone.
    let (containerd, others): (Vec<Record>, Vec<Record>) = node
        .processes
        .iter()
        .cloned()
        .partition(|record| record.name == "containerd");
    process::stop_all(&others, STOP_GRACE)?;
    if containerd.iter().any(process::is_running) {
        kill_containers(&node.socket);
    }
    process::stop_all(&containerd, STOP_GRACE)?;
    clear_device_plugin_dir()?;
    if node.kube_proxy.exists() {
        // Removes the KUBE-* chains and rules it installed.
        let _ = Command::new(&node.kube_proxy).arg("--cleanup").output();
    }
    unmount_under(&dirs.root)?;
    let _ = Command::new("ip").args(["link", "delete", BRIDGE]).output();
    let _ = kubectl_output(
        &kubectl,
        &kubeconfig,
        &[
            "delete",
            "node",
            &node.node,
            "--ignore-not-found",
            "--wait=false",
        ],
    );
    std::fs::remove_dir_all(&dirs.root)
        .with_context(|| format!("cannot remove {}", dirs.root.display()))
}

/// Removes what the stopped kubelet and its device plugins left in the fixed device-plugin directory (their
/// sockets and the kubelet's checkpoint of which pod got which device), so that the next kubelet on this machine
/// starts clean. Nothing is removed while a kubelet still answers there.
fn clear_device_plugin_dir() -> anyhow::Result<()> {
    let registration = Path::new(DEVICE_PLUGIN_SOCKET);
    if std::os::unix::net::UnixStream::connect(registration).is_ok() {
        return Ok(());
    }
    let Some(dir) = registration.parent() else {
        return Ok(());
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error).with_context(|| format!("cannot list {}", dir.display())),
    };
    for entry in entries {
        let path = entry?.path();
        let ours = path
            .extension()
            .is_some_and(|extension| extension == "sock")
            || path
                .file_name()
                .is_some_and(|name| name == "kubelet_internal_checkpoint");
        if ours {
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
        }
    }
    Ok(())
}

/// Taints the node so that every pod on it (DaemonSet pods included) is evicted, and waits until containerd runs
/// no container any more.
fn drain(kubectl: &Path, kubeconfig: &Path, node: &NodeState) -> anyhow::Result<()> {
    kubectl_output(
        kubectl,
        kubeconfig,
        &["taint", "node", &node.node, DRAIN_TAINT, "--overwrite"],
    )?;
    let selector = format!("spec.nodeName={}", node.node);
    kubectl_output(
        kubectl,
        kubeconfig,
        &[
            "delete",
            "pods",
            "--all-namespaces",
            "--field-selector",
            &selector,
            "--wait=false",
        ],
    )?;
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let tasks = running_tasks(&node.socket)?;
        if tasks.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "still running after {DRAIN_TIMEOUT:?}: {}",
            tasks.join(", ")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The ids of containerd's running tasks (containers and sandboxes) in the CRI namespace.
fn running_tasks(socket: &Path) -> anyhow::Result<Vec<String>> {
    let listing = ctr(socket, &["-n", CRI_NAMESPACE, "tasks", "list"])?;
    Ok(listing
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(2) == Some(&"RUNNING")).then(|| fields[0].to_owned())
        })
        .collect())
}

/// Kills and deletes every task that is left, so that containerd's shims exit with it.
fn kill_containers(socket: &Path) {
    let Ok(listing) = ctr(socket, &["-n", CRI_NAMESPACE, "tasks", "list", "--quiet"]) else {
        return;
    };
    for task in listing
        .lines()
        .map(str::trim)
        .filter(|task| !task.is_empty())
    {
        let _ = ctr(
            socket,
            &[
                "-n",
                CRI_NAMESPACE,
                "tasks",
                "kill",
                "--signal",
                "SIGKILL",
                task,
            ],
        );
        std::thread::sleep(Duration::from_millis(200));
        let _ = ctr(
            socket,
            &["-n", CRI_NAMESPACE, "tasks", "delete", "--force", task],
        );
    }
}

/// Bind-mounts `dir` onto itself and marks it shared (recursively).
fn share_mount(dir: &Path) -> anyhow::Result<()> {
    let dir = dir.display().to_string();
    mount(&["--bind", &dir, &dir])?;
    mount(&["--make-rshared", &dir])
}

fn mount(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("mount")
        .args(args)
        .output()
        .context("cannot run mount")?;
    anyhow::ensure!(
        output.status.success(),
        "mount {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// Lazily unmounts every mount point under `dir` (volumes, overlay root file systems, sandbox /dev/shm), deepest
/// first, so that the directory can be removed.
fn unmount_under(dir: &Path) -> anyhow::Result<()> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .context("cannot read /proc/self/mountinfo")?;
    let mut points = mount_points_under(&mountinfo, dir);
    points.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    for point in points {
        let status = Command::new("umount").arg("--lazy").arg(&point).status();
        anyhow::ensure!(
            status.is_ok_and(|status| status.success()),
            "cannot unmount {}",
            point.display()
        );
    }
    Ok(())
}

/// The mount points in a `/proc/<pid>/mountinfo` text that lie under `dir` (octal escapes decoded).
pub fn mount_points_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_octal(field)))
        .filter(|point| point.starts_with(dir))
        .collect()
}

fn unescape_octal(field: &str) -> String {
    let mut out = String::new();
    let mut rest = field;
    while let Some(index) = rest.find('\\') {
        out.push_str(&rest[..index]);
        let code = rest
            .get(index + 1..index + 4)
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[index + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[index + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn read_images(dir: &Path) -> anyhow::Result<Vec<BuiltImage>> {
    let path = dir.join("images.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {}: build the images with `cargo xtask images`",
            path.display()
        )
    })?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not what `cargo xtask images` writes", path.display()))
}

/// The node's processes as this xtask started them, to notice one exiting.
type Children = Vec<(Child, Record)>;

fn start(
    node: &mut NodeState,
    children: &mut Children,
    dirs: &Dirs,
    name: &str,
    binary: &Path,
    args: &[String],
    logs: &Path,
) -> anyhow::Result<()> {
    let (child, record) =
        process::spawn(name, binary, args, &[], &logs.join(format!("{name}.log")))?;
    node.processes.push(record.clone());
    children.push((child, record));
    save(dirs, node)
}

fn ctr(socket: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(args)
        .output()
        .context("cannot run ctr")?;
    anyhow::ensure!(
        output.status.success(),
        "ctr {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn kubectl_output(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(kubectl)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .with_context(|| format!("cannot run {}", kubectl.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(controlplane::free_ports(1)?[0])
}

fn save(dirs: &Dirs, node: &NodeState) -> anyhow::Result<()> {
    write(&dirs.state_file(), &serde_json::to_string_pretty(node)?)
}

#[cfg(test)]
mod tests;

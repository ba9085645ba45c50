//! The node side measured: every role of a GPU node as a local process on one real kubelet's node with 8 simulated
//! H100-80GB, each under its chart ServiceAccount's pod-bound token, with the command line its DaemonSet gives it
//! (and the default intervals). Three windows:
//! - at rest: no pod; Prometheus scrapes the exporter every 15 s, as it always does;
//! - loaded: 50 pods arrive, 40 on time-sliced GPUs through the device plugin (the kubelet calls Allocate) and 10
//!   with DRA shares (the kubelet calls NodePrepareResources), each with a GPU process that the exporter and the
//!   watchdog map to its pod;
//! - a MIG change: the pods gone, the node is labelled with one of NVIDIA's MIG configs, which the MIG manager
//!   applies while feature discovery, the device plugin and the DRA driver follow the new geometry.
//!
//! For each role: CPU per second and RSS of each window, its peak RSS, and its API requests at rest from the audit
//! log. With `E2E_NODE_SIDE_OUT` set, the figures are written there (`cargo xtask bench --node-side-only` runs
//! this suite on release binaries, 300 s at rest and 60 s for the others); the end-to-end run uses short windows
//! and checks that every role lived through all three and that the load reached each one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use e2e::agents::{NodeAgent, node_agent_bin, simulator_tool};
use e2e::dra::{claim_of, claim_pod, start_driver};
use e2e::kubelet::{DEVICE_PLUGIN_ROOT, Kubelet, allocatable, gpu_pod};
use e2e::plugin::DevicePlugin;
use e2e::*;
use harness::cluster::audit;
use harness::node_side::{NodeSide, OUT_VAR, Phase, REST_VAR, RoleUsage, WINDOW_VAR};
use harness::proc_stats;
use serde_json::{Value, json};

const NODE: &str = "e2e-node-side";
const GPUS: &str = "h100-80gb:8";
/// GPUs 6 and 7 are the DRA driver's (shared), 0 to 5 the device plugin's, time-sliced.
const DRA_GPUS: &str = "6,7";
const PLUGIN_GPUS: u32 = 6;
const REPLICAS: u32 = 8;
const PLUGIN_PODS: u32 = 40;
const DRA_PODS: u32 = 10;
const SCRAPE_INTERVAL: Duration = Duration::from_secs(15);
/// One of NVIDIA's default MIG configs for the H100-80GB.
const MIG_CONFIG: &str = "all-1g.10gb";
const PLUGIN_CONFIG_MAP: &str = "e2e-node-side-plugin-config";
const TEMPLATE: &str = "e2e-node-side-share";
/// Each pod's GPU process: well within a time-sliced replica's share (80 GB / 8) and the DRA share.
const PROCESS_MIB: u64 = 2000;
/// Time for the roles to start, register and publish before the rest window.
const SETTLE: Duration = Duration::from_secs(20);
const WAIT: Duration = Duration::from_secs(180);

/// A window's length: the seconds in environment variable `var`, else 20.
fn seconds(var: &str) -> Duration {
    Duration::from_secs(
        std::env::var(var)
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or(20),
    )
}

/// One measured role: its name, command and process.
struct Role {
    name: &'static str,
    command: &'static str,
    default_install: bool,
    account: &'static str,
    pid: u32,
}

/// Every role's `/proc` figures at one moment.
fn usage(roles: &[Role]) -> Vec<proc_stats::Usage> {
    roles
        .iter()
        .map(|role| {
            proc_stats::read(role.pid)
                .unwrap_or_else(|error| panic!("{} is gone: {error:#}", role.name))
        })
        .collect()
}

/// CPU per second over the window from `before` to `after`, and RSS at its end.
fn phases(before: &[proc_stats::Usage], after: &[proc_stats::Usage], seconds: f64) -> Vec<Phase> {
    before
        .iter()
        .zip(after)
        .map(|(before, after)| Phase {
            cpu_percent: (after.cpu_s - before.cpu_s) / seconds * 100.0,
            rss_mib: after.rss_mib,
        })
        .collect()
}

/// Scrapes the exporter every [`SCRAPE_INTERVAL`] until dropped, as Prometheus does; keeps the last body.
struct Scraper {
    stop: Arc<AtomicBool>,
    scrapes: Arc<AtomicU32>,
    last: Arc<std::sync::Mutex<String>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scraper {
    fn start(port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let scrapes = Arc::new(AtomicU32::new(0));
        let last = Arc::new(std::sync::Mutex::new(String::new()));
        let thread = std::thread::spawn({
            let (stop, scrapes, last) = (stop.clone(), scrapes.clone(), last.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    if let Some((200, body)) = http_get(port, "/metrics") {
                        scrapes.fetch_add(1, Ordering::Relaxed);
                        *last.lock().expect("the last scrape") = body;
                    }
                    while started.elapsed() < SCRAPE_INTERVAL && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            }
        });
        Self {
            stop,
            scrapes,
            last,
            thread: Some(thread),
        }
    }

    fn last(&self) -> String {
        self.last.lock().expect("the last scrape").clone()
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A pod's GPU process: a real `sleep` in the pod's cgroup under the roles' procfs, which the simulator reports on
/// the pod's GPU until it ends.
struct GpuProcess(Child);

impl Drop for GpuProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_gpu_process(state: &Path, proc_root: &Path, pod_uid: &str, gpu: u32) -> GpuProcess {
    let child = Command::new("sleep")
        .arg("3600")
        .spawn()
        .expect("start sleep");
    let process = GpuProcess(child);
    let pid = process.0.id();
    let folder = proc_root.join(pid.to_string());
    std::fs::create_dir_all(&folder).expect("the process's proc folder");
    std::fs::write(
        folder.join("cgroup"),
        format!("0::/kubepods/besteffort/pod{pod_uid}\n"),
    )
    .expect("the process's cgroup");
    std::os::unix::fs::symlink(format!("/proc/{pid}/stat"), folder.join("stat"))
        .expect("the process's stat");
    simulator_tool(
        NODE,
        state,
        &[
            "start-process",
            "--gpu",
            &gpu.to_string(),
            "--pid",
            &pid.to_string(),
            "--memory-mib",
            &PROCESS_MIB.to_string(),
            "--host-process",
        ],
    );
    process
}

/// Removes what the test made when dropped (the kubelet's Drop removes the Node).
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let mut args = vec!["pod", "-n", "default"];
            args.extend(self.0.iter().map(String::as_str));
            clean_up(&args);
        }
        clean_up(&["resourceclaimtemplate", TEMPLATE, "-n", "default"]);
        clean_up(&["configmap", PLUGIN_CONFIG_MAP, "-n", NAMESPACE]);
    }
}

fn plugin_config_map() -> String {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": PLUGIN_CONFIG_MAP, "namespace": NAMESPACE},
        "data": {"shared": format!(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: {REPLICAS}\n"
        )}
    })
    .to_string()
}

fn share_template() -> String {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{
            "name": "gpu",
            "exactly": {"deviceClassName": "shared.gpu.nvidia.com", "capacity": {"requests": {"memory": "8Gi"}}}
        }]}}}
    })
    .to_string()
}

/// The GPU index a Running plugin pod holds: the one whose UUID its container was given.
fn plugin_pod_gpu(kubelet: &Kubelet, pod: &str, uuids: &BTreeMap<String, u32>) -> Option<u32> {
    let created = kubelet.container_of(pod)?.to_string();
    uuids
        .iter()
        .find(|(uuid, _)| created.contains(uuid.as_str()))
        .map(|(_, index)| *index)
}

/// The GPU index a Running DRA pod's claim was allocated (`gpu-<index>`).
fn dra_pod_gpu(pod: &Value) -> Option<u32> {
    let claim = kubectl_json(&["get", "resourceclaim", &claim_of(pod), "-n", "default"]);
    claim["status"]["allocation"]["devices"]["results"][0]["device"]
        .as_str()?
        .strip_prefix("gpu-")?
        .parse()
        .ok()
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn every_node_role_measured_at_rest_loaded_and_through_a_mig_change() {
    chart_installed();
    let (rest, window) = (seconds(REST_VAR), seconds(WINDOW_VAR));
    let dir = scenario_dir("e2e-node-side");
    let state = dir.join(format!("{NODE}.json"));
    // The host's folders: the plugin's (its CDI specs, MPS) are where the driver's go too, one CDI folder for the
    // kubelet's runtime to resolve both from, as on a node.
    let host = e2e::plugin::kubelet_root(NODE, &state);
    let cdi_dir = host.join("cdi");
    let proc_root = dir.join("proc");
    for folder in [&cdi_dir, &proc_root, &host.join("etc")] {
        std::fs::create_dir_all(folder).expect("the node's folders");
    }
    std::fs::write(
        host.join("etc/os-release"),
        "ID=ubuntu\nVERSION_ID=\"22.04\"\n",
    )
    .expect("os-release");
    std::fs::write(host.join("kernel"), "5.15.0-122-generic\n").expect("kernel release");
    let plugin_pods: Vec<String> = (0..PLUGIN_PODS)
        .map(|n| format!("node-side-plugin-{n}"))
        .collect();
    let dra_pods: Vec<String> = (0..DRA_PODS)
        .map(|n| format!("node-side-dra-{n}"))
        .collect();
    let _cleanup = Cleanup(plugin_pods.iter().chain(&dra_pods).cloned().collect());
    assert!(kubectl_apply(&plugin_config_map(), &[]).success);
    assert!(kubectl_apply(&share_template(), &[]).success);

    step("a real kubelet with 8 simulated H100-80GB, and every role of a GPU node");
    let kubelet = Kubelet::start_resolving_cdi(NODE, &dir.join("kubelet"), &[], &cdi_dir);
    kubectl(&[
        "annotate",
        "node",
        NODE,
        &format!("nvidia.com/gpu.simulator={GPUS}"),
        "--overwrite",
    ]);
    let root = kubelet.root().display().to_string();
    let proc = proc_root.display().to_string();
    let exporter_port = free_port();
    let exporter_listen = format!("127.0.0.1:{exporter_port}");
    let watchdog_listen = format!("127.0.0.1:{}", free_port());
    let agent = |account: &str, args: &[&str], env: &[(&str, &str)]| {
        NodeAgent::start(&node_agent_bin(), NODE, account, &state, args, env)
    };
    // The command lines of the chart's DaemonSets (`gpu-operator render` of the chart's ClusterPolicy), with this
    // machine's folders for the host's.
    let node_facts = NodeAgent::node_facts(NODE, &state, &host);
    let validations = dir.join("validations").display().to_string();
    let validator = agent(
        "nvidia-operator-validator",
        &["validate", "--validations-dir", &validations, "watch"],
        &[],
    );
    let discovery = agent(
        "gpu-feature-discovery",
        &["discovery", "--mig-strategy", "single"],
        &[],
    );
    let plugin = DevicePlugin::start_on(
        Path::new(DEVICE_PLUGIN_ROOT),
        NODE,
        &state,
        &[
            "--mig-strategy",
            "single",
            "--cdi",
            "--config-map",
            PLUGIN_CONFIG_MAP,
            "--default-config",
            "shared",
            "--dra-gpus",
            DRA_GPUS,
            "--mig-poll-seconds",
            "10",
        ],
    );
    let exporter = agent(
        "nvidia-dcgm-exporter",
        &[
            "exporter",
            "--listen",
            &exporter_listen,
            "--kubelet-root",
            &root,
            "--proc-root",
            &proc,
        ],
        &[],
    );
    let mig_manager = agent(
        "nvidia-mig-manager",
        &[
            "mig",
            "--config-map",
            "default-mig-parted-config",
            "--kubelet-root",
            &root,
            "--default-config",
            "all-disabled",
        ],
        &[("DRA_GPUS", DRA_GPUS)],
    );
    let watchdog = agent(
        "nvidia-gpu-watchdog",
        &[
            "watchdog",
            "--listen",
            &watchdog_listen,
            "--kubelet-root",
            &root,
            "--proc-root",
            &proc,
        ],
        &[],
    );
    let driver = start_driver(
        NODE,
        &state,
        &kubelet.root(),
        &host,
        &[("DRA_GPUS", DRA_GPUS), ("DRA_SHARED_GPUS", "all")],
    );
    let logs = || {
        format!(
            "{}\nplugin:\n{}\ndriver:\n{}\nexporter:\n{}\nMIG manager:\n{}",
            kubelet.output(),
            plugin.output(),
            driver.output(),
            exporter.output(),
            mig_manager.output()
        )
    };
    let roles = [
        (
            "node facts",
            "gpu-node-agent node-facts",
            true,
            "gpu-node-facts",
            node_facts.pid(),
        ),
        (
            "validator",
            "gpu-node-agent validate watch",
            true,
            "nvidia-operator-validator",
            validator.pid(),
        ),
        (
            "feature discovery",
            "gpu-node-agent discovery",
            true,
            "gpu-feature-discovery",
            discovery.pid(),
        ),
        (
            "device plugin",
            "gpu-device-plugin run",
            true,
            e2e::plugin::SERVICE_ACCOUNT,
            plugin.pid(),
        ),
        (
            "exporter",
            "gpu-node-agent exporter",
            true,
            "nvidia-dcgm-exporter",
            exporter.pid(),
        ),
        (
            "MIG manager",
            "gpu-node-agent mig",
            true,
            "nvidia-mig-manager",
            mig_manager.pid(),
        ),
        (
            "watchdog",
            "gpu-node-agent watchdog",
            false,
            "nvidia-gpu-watchdog",
            watchdog.pid(),
        ),
        (
            "DRA driver",
            "gpu-dra-driver run",
            false,
            e2e::dra::DRIVER_ACCOUNT,
            driver.pid(),
        ),
    ]
    .map(|(name, command, default_install, account, pid)| Role {
        name,
        command,
        default_install,
        account,
        pid,
    });
    let replicas = (PLUGIN_GPUS * REPLICAS).to_string();
    eventually(WAIT, || {
        let node = kubectl_json(&["get", "node", NODE]);
        let labels = &node["metadata"]["labels"];
        Ok(
            (allocatable(NODE, "nvidia.com/gpu").as_deref() == Some(replicas.as_str())
                && e2e::dra::slice_of(NODE).is_some()
                && labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
                && labels["nvidia.com/gpu.product"].is_string()
                && http_get(exporter_port, "/metrics").is_some_and(|(status, _)| status == 200))
            .then_some(()),
        )
    })
    .unwrap_or_else(|error| panic!("the node's roles never came up: {error:#}\n{}", logs()));
    let scraper = Scraper::start(exporter_port);
    std::thread::sleep(SETTLE);

    step("at rest: no pod, a scrape every 15 s");
    let audit_log =
        std::env::var("E2E_AUDIT_LOG").expect("E2E_AUDIT_LOG: set by `cargo xtask e2e`");
    let mark = audit::Mark::now(Path::new(&audit_log)).expect("the audit log");
    let before = usage(&roles);
    let rest_start = Instant::now();
    std::thread::sleep(rest);
    let at_rest = phases(&before, &usage(&roles), rest_start.elapsed().as_secs_f64());
    let requests_at_rest: Vec<audit::Requests> = roles
        .iter()
        .map(|role| {
            mark.requests(&format!(
                "system:serviceaccount:{NAMESPACE}:{}",
                role.account
            ))
            .expect("the audit window")
        })
        .collect();

    step("loaded: 40 time-sliced pods and 10 DRA shares arrive, each with a GPU process");
    let before = usage(&roles);
    let load_start = Instant::now();
    let pods: Vec<Value> = plugin_pods
        .iter()
        .map(|name| gpu_pod(name, NODE, "nvidia.com/gpu", 1))
        .chain(dra_pods.iter().map(|name| claim_pod(name, NODE, TEMPLATE)))
        .map(|text| serde_json::from_str(&text).expect("a pod's JSON"))
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": pods});
    assert!(kubectl_apply(&list.to_string(), &[]).success);
    let gpus = kubectl_json(&["get", "gpunode", NODE])["status"]["gpus"].clone();
    let uuids: BTreeMap<String, u32> = gpus
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|gpu| {
            Some((
                gpu["uuid"].as_str()?.to_owned(),
                gpu["index"].as_u64()? as u32,
            ))
        })
        .collect();
    assert_eq!(uuids.len(), 8, "{gpus:#}");
    let mut processes = Vec::new();
    for (name, on_plugin) in plugin_pods
        .iter()
        .map(|name| (name, true))
        .chain(dra_pods.iter().map(|name| (name, false)))
    {
        let pod = e2e::kubelet::wait_running(name, WAIT, &logs);
        let gpu = if on_plugin {
            plugin_pod_gpu(&kubelet, name, &uuids)
        } else {
            dra_pod_gpu(&pod)
        }
        .unwrap_or_else(|| panic!("which GPU {name} holds is unknown: {pod:#}"));
        let uid = pod["metadata"]["uid"].as_str().expect("the pod's UID");
        processes.push(start_gpu_process(&state, &proc_root, uid, gpu));
    }
    let all_pods: BTreeSet<&String> = plugin_pods.iter().chain(&dra_pods).collect();
    let pods_on_series = |body: &str| -> BTreeSet<String> {
        body.lines()
            .filter(|line| line.starts_with("DCGM_FI_DEV_FB_USED{"))
            .filter_map(|line| {
                let start = line.find("pod=\"")? + 5;
                Some(line[start..start + line[start..].find('"')?].to_owned())
            })
            .collect()
    };
    eventually(WAIT, || {
        let seen = pods_on_series(
            &http_get(exporter_port, "/metrics")
                .map(|(_, body)| body)
                .unwrap_or_default(),
        );
        Ok(all_pods
            .iter()
            .all(|pod| seen.contains(pod.as_str()))
            .then_some(()))
    })
    .unwrap_or_else(|error| panic!("the exporter never showed every pod: {error:#}\n{}", logs()));
    if let Some(left) = window.checked_sub(load_start.elapsed()) {
        std::thread::sleep(left);
    }
    let loaded = phases(&before, &usage(&roles), load_start.elapsed().as_secs_f64());
    assert!(
        pods_on_series(&scraper.last()).len() >= all_pods.len(),
        "the scrapes saw every pod:\n{}",
        scraper.last()
    );

    step("a MIG change: the pods gone, the node labelled all-1g.10gb");
    drop(processes);
    let mut delete = vec!["delete", "pod", "-n", "default", "--wait=true"];
    delete.extend(all_pods.iter().map(|name| name.as_str()));
    kubectl(&delete);
    let before = usage(&roles);
    let mig_start = Instant::now();
    kubectl(&[
        "label",
        "node",
        NODE,
        &format!("nvidia.com/mig.config={MIG_CONFIG}"),
        "--overwrite",
    ]);
    // The state label already says `success` (of the default config): the GPUNode says which config it is.
    eventually(WAIT, || {
        let mig = kubectl_json(&["get", "gpunode", NODE])["status"]["mig"].clone();
        Ok((mig["config"] == MIG_CONFIG && mig["state"] == "success").then_some(()))
    })
    .unwrap_or_else(|error| panic!("the MIG change never succeeded: {error:#}\n{}", logs()));
    let mig_change_seconds = mig_start.elapsed().as_secs_f64();
    let devices = simulator_tool(NODE, &state, &["devices"]).lines().count();
    assert_eq!(devices, 8 * 7, "seven 1g.10gb on each H100-80GB");
    // Discovery, the plugin and the driver follow the geometry on their own clocks (a read every 10 to 60 s).
    if let Some(left) = window.checked_sub(mig_start.elapsed()) {
        std::thread::sleep(left);
    }
    let after = usage(&roles);
    let mig_change = phases(&before, &after, mig_start.elapsed().as_secs_f64());
    let scrapes = scraper.scrapes.load(Ordering::Relaxed);
    drop(scraper);

    let measured = NodeSide {
        gpus: GPUS.into(),
        plugin_pods: PLUGIN_PODS,
        dra_pods: DRA_PODS,
        scrape_interval_seconds: SCRAPE_INTERVAL.as_secs(),
        rest_seconds: rest.as_secs(),
        window_seconds: window.as_secs(),
        mig_change_seconds,
        mig_config: MIG_CONFIG.into(),
        roles: roles
            .iter()
            .enumerate()
            .map(|(n, role)| RoleUsage {
                role: role.name.into(),
                command: role.command.into(),
                default_install: role.default_install,
                at_rest: at_rest[n],
                loaded: loaded[n],
                mig_change: mig_change[n],
                peak_rss_mib: after[n].peak_rss_mib,
                requests_at_rest: requests_at_rest[n].clone(),
            })
            .collect(),
    };
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&measured).expect("the figures as JSON")
    );
    if let Ok(out) = std::env::var(OUT_VAR) {
        std::fs::write(&out, serde_json::to_string_pretty(&measured).expect("JSON"))
            .unwrap_or_else(|error| panic!("writing {out}: {error}"));
    }
    // Nothing is written at rest, though the Node the roles watch changes every 2 s (this kubelet's status), but
    // for feature discovery's `nvidia.com/gfd.timestamp`, renewed once a minute as NVIDIA's GFD renews it.
    for role in &measured.roles {
        let writes = role.requests_at_rest.writes() + role.requests_at_rest.lease_writes();
        let allowed = if role.role == "feature discovery" {
            rest.as_secs() / 60 + 1
        } else {
            0
        };
        assert!(
            writes <= allowed,
            "{} writes at rest: {:?}",
            role.role,
            role.requests_at_rest.by_kind
        );
    }
    // The load reached the roles it is for: the kubelet's calls, the scrapes, the change.
    assert!(scrapes >= 2, "{scrapes} scrapes");
    let role = |name: &str| {
        measured
            .roles
            .iter()
            .find(|role| role.role == name)
            .expect("a measured role")
    };
    for name in ["device plugin", "DRA driver", "exporter", "watchdog"] {
        assert!(
            role(name).loaded.cpu_percent > role(name).at_rest.cpu_percent,
            "{name} worked no more loaded than at rest: {:?}",
            role(name)
        );
    }
    assert!(
        role("MIG manager").mig_change.cpu_percent > role("MIG manager").at_rest.cpu_percent,
        "{:?}",
        role("MIG manager")
    );
}

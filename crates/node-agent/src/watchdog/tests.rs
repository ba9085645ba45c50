//! The watchdog's pass on real processes: child processes of the test, reported by the simulator as users of one
//! time-sliced GPU (4 replicas), each in its own pod (its cgroup, under a test procfs whose `stat` is the real
//! process's), judged and signalled by the same code the role runs.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use gpu::{GpuBackend, GpuProcess, Simulator};
use k8s_openapi::api::core::v1::Pod;
use tempfile::TempDir;

use super::budget::DefaultBudget;
use super::decide::{Decider, Settings, Signal};
use super::metrics::WatchdogMetrics;
use super::{assess, describe, judge, send};
use crate::accounting::pods::{PodIndex, running_pod};
use crate::accounting::{self, MIB};
use crate::pod_resources::{ContainerDevices, PodDevices};

const SECOND: Duration = Duration::from_secs(1);

/// A pod whose one container runs a child process of the test.
struct TestPod {
    name: &'static str,
    uid: String,
    container_id: String,
    child: Child,
}

impl TestPod {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn object(&self) -> Pod {
        running_pod("notebooks", self.name, &self.uid, &self.container_id)
    }

    /// How it ended, if it has.
    fn ended_by(&mut self) -> Option<Option<i32>> {
        self.child.try_wait().unwrap().map(|status| status.signal())
    }
}

impl Drop for TestPod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node with one simulated A100-40GB, its pods' processes, and a procfs that puts each in its pod's cgroup.
struct Node {
    _dir: TempDir,
    simulator: Simulator,
    proc_root: std::path::PathBuf,
    pods: Vec<TestPod>,
    uuid: String,
}

impl Node {
    fn new() -> Self {
        let dir = TempDir::new().unwrap();
        let simulator = Simulator::open(
            dir.path().join("node.json"),
            "node-a",
            &"a100-40gb:1".parse().unwrap(),
        )
        .unwrap();
        let uuid = simulator.gpu(0).unwrap().uuid;
        let proc_root = dir.path().join("proc");
        Self {
            _dir: dir,
            simulator,
            proc_root,
            pods: Vec::new(),
            uuid,
        }
    }

    /// Starts a pod's process (`script` for `sh -c`), reported as using `mib` of GPU 0.
    fn start(&mut self, name: &'static str, script: &str, mib: u64) {
        let index = self.pods.len();
        let child = Command::new("sh").args(["-c", script]).spawn().unwrap();
        let pod = TestPod {
            name,
            uid: format!("00000000-0000-4000-8000-{index:012}"),
            container_id: format!("{index:064x}"),
            child,
        };
        let folder = self.proc_root.join(pod.pid().to_string());
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(
            folder.join("cgroup"),
            format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope\n",
                pod.uid.replace('-', "_"),
                pod.container_id
            ),
        )
        .unwrap();
        std::os::unix::fs::symlink(format!("/proc/{}/stat", pod.pid()), folder.join("stat"))
            .unwrap();
        self.simulator
            .start_host_process(
                0,
                GpuProcess {
                    pid: pod.pid(),
                    used_memory_mib: Some(mib),
                    gpu_instance_id: None,
                    compute_instance_id: None,
                },
            )
            .unwrap();
        self.pods.push(pod);
    }

    fn pod(&mut self, name: &str) -> &mut TestPod {
        self.pods.iter_mut().find(|pod| pod.name == name).unwrap()
    }

    fn set_memory(&mut self, name: &str, mib: u64) {
        let pid = self.pod(name).pid();
        self.simulator.set_process_memory(0, pid, mib).unwrap();
    }

    /// What the kubelet says: each pod holds one of the GPU's 4 replicas.
    fn holdings(&self) -> assess::Holdings {
        let held: Vec<PodDevices> = self
            .pods
            .iter()
            .enumerate()
            .map(|(replica, pod)| PodDevices {
                pod: format!("notebooks/{}", pod.name),
                containers: vec![ContainerDevices {
                    name: "main".into(),
                    devices: BTreeMap::from([(
                        "nvidia.com/gpu".to_owned(),
                        BTreeSet::from([format!("{}::{replica}", self.uuid)]),
                    )]),
                    claims: Vec::new(),
                }],
            })
            .collect();
        let advertised = BTreeMap::from([(
            "nvidia.com/gpu".to_owned(),
            (0..4)
                .map(|replica| format!("{}::{replica}", self.uuid))
                .collect(),
        )]);
        assess::holdings(&held, &advertised, &[])
    }

    /// One pass at `now`: judged, and signalled unless a dry run; returns the actions as (pod, signal, dry run).
    fn pass(
        &self,
        decider: &mut Decider,
        metrics: &WatchdogMetrics,
        now: Instant,
    ) -> Vec<(String, Signal, bool)> {
        let accounting = accounting::read(&self.simulator, &self.proc_root).unwrap();
        let pods = PodIndex::new(&self.pods.iter().map(TestPod::object).collect::<Vec<_>>());
        let (assessment, actions) = judge(
            decider,
            &accounting,
            &pods,
            &self.holdings(),
            DefaultBudget::ReplicaShare,
            now,
        );
        metrics.show(&accounting, &assessment);
        actions
            .iter()
            .map(|action| {
                if !action.dry_run {
                    send(action, &self.proc_root).unwrap();
                }
                metrics.count(action);
                (action.over.pod.pod.clone(), action.signal, action.dry_run)
            })
            .collect()
    }
}

/// Waits for a signalled child to end.
fn wait_for_end(pod: &mut TestPod) -> Option<i32> {
    let deadline = Instant::now() + 10 * SECOND;
    loop {
        if let Some(ended) = pod.ended_by() {
            return ended;
        }
        assert!(Instant::now() < deadline, "{} did not end", pod.name);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn settings(dry_run: bool) -> Settings {
    Settings {
        grace: 2 * SECOND,
        kill_grace: 3 * SECOND,
        dry_run,
    }
}

/// The four processes of the issue's scenario on a 40 GB GPU of 4 replicas (10240 MiB each).
fn scenario() -> Node {
    let mut node = Node::new();
    node.start("over", "exec sleep 600", 12_000);
    node.start("under", "exec sleep 600", 8_000);
    node.start("spiky", "exec sleep 600", 12_000);
    // A shell ignoring SIGTERM keeps the disposition through exec: the sleep ignores it too.
    node.start("stubborn", "trap '' TERM; exec sleep 600", 16_000);
    node
}

#[test]
fn over_budget_processes_are_terminated_and_the_stubborn_one_killed() {
    let mut node = scenario();
    let metrics = WatchdogMetrics::new("node-a");
    let mut decider = Decider::new(settings(false));
    let start = Instant::now();

    assert_eq!(node.pass(&mut decider, &metrics, start), vec![]);
    // The spike ends inside the grace period.
    node.set_memory("spiky", 9_000);
    assert_eq!(node.pass(&mut decider, &metrics, start + SECOND), vec![]);
    let text = metrics.encode();
    assert!(text.contains(r#"gpu_watchdog_pod_budget_bytes{gpu="0",UUID=""#));
    assert!(text.contains(&format!("{}", 10_240 * MIB)), "{text}");

    let term = node.pass(&mut decider, &metrics, start + 2 * SECOND);
    assert_eq!(
        term,
        vec![
            ("over".to_owned(), Signal::Term, false),
            ("stubborn".to_owned(), Signal::Term, false),
        ]
    );
    assert_eq!(wait_for_end(node.pod("over")), Some(15), "ended by SIGTERM");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(node.pod("stubborn").ended_by(), None, "ignores SIGTERM");

    // The simulator forgets the exited process, as the driver frees its memory.
    assert_eq!(node.simulator.processes(0).unwrap().len(), 3);
    assert_eq!(
        node.pass(&mut decider, &metrics, start + 4 * SECOND),
        vec![]
    );
    let kill = node.pass(&mut decider, &metrics, start + 5 * SECOND);
    assert_eq!(kill, vec![("stubborn".to_owned(), Signal::Kill, false)]);
    assert_eq!(
        wait_for_end(node.pod("stubborn")),
        Some(9),
        "ended by SIGKILL"
    );

    assert_eq!(node.pod("under").ended_by(), None);
    assert_eq!(node.pod("spiky").ended_by(), None);
    assert_eq!(
        node.pass(&mut decider, &metrics, start + 20 * SECOND),
        vec![]
    );
    let text = metrics.encode();
    for (pod, signal) in [
        ("over", "SIGTERM"),
        ("stubborn", "SIGTERM"),
        ("stubborn", "SIGKILL"),
    ] {
        let line = text
            .lines()
            .find(|line| {
                line.starts_with("gpu_watchdog_kills_total{")
                    && line.contains(&format!(r#"pod="{pod}""#))
                    && line.contains(&format!(r#"signal="{signal}""#))
            })
            .unwrap_or_else(|| panic!("no {signal} count for {pod}:\n{text}"));
        assert!(
            line.contains(r#"dry_run="false""#) && line.ends_with(" 1"),
            "{line}"
        );
    }
    // The exited pods' use is gone with them; the survivors' is shown.
    let used: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("gpu_watchdog_pod_memory_used_bytes{"))
        .collect();
    assert_eq!(used.len(), 4, "every pod still holds its replica: {used:?}");
    let used_by = |pod: &str| {
        used.iter()
            .find(|line| line.contains(&format!(r#"pod="{pod}""#)))
            .and_then(|line| line.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(used_by("over"), Some("0".to_owned()));
    assert_eq!(used_by("stubborn"), Some("0".to_owned()));
    assert_eq!(used_by("under"), Some((8_000 * MIB).to_string()));
    assert_eq!(used_by("spiky"), Some((9_000 * MIB).to_string()));
}

#[test]
fn a_dry_run_reports_and_signals_nothing() {
    let mut node = scenario();
    let metrics = WatchdogMetrics::new("node-a");
    let mut decider = Decider::new(settings(true));
    let start = Instant::now();
    node.pass(&mut decider, &metrics, start);
    let reported = node.pass(&mut decider, &metrics, start + 2 * SECOND);
    assert_eq!(reported.len(), 3, "over, spiky and stubborn: {reported:?}");
    assert!(
        reported
            .iter()
            .all(|(_, signal, dry)| *dry && *signal == Signal::Term)
    );
    let reported = node.pass(&mut decider, &metrics, start + 5 * SECOND);
    assert!(
        reported
            .iter()
            .all(|(_, signal, dry)| *dry && *signal == Signal::Kill)
    );
    std::thread::sleep(Duration::from_millis(300));
    for pod in &mut node.pods {
        assert_eq!(
            pod.ended_by(),
            None,
            "{} was signalled in a dry run",
            pod.name
        );
    }
    assert!(metrics.encode().contains(r#"dry_run="true""#));
}

#[test]
fn processes_outside_pods_are_never_signalled() {
    let mut node = Node::new();
    node.start("tenant", "exec sleep 600", 1_000);
    // A host process on the same GPU, far over any share, in no pod.
    let mut host = Command::new("sleep").arg("600").spawn().unwrap();
    let folder = node.proc_root.join(host.id().to_string());
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("cgroup"),
        "0::/system.slice/inference.service\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(format!("/proc/{}/stat", host.id()), folder.join("stat")).unwrap();
    node.simulator
        .start_host_process(
            0,
            GpuProcess {
                pid: host.id(),
                used_memory_mib: Some(39_000),
                gpu_instance_id: None,
                compute_instance_id: None,
            },
        )
        .unwrap();
    let metrics = WatchdogMetrics::new("node-a");
    let mut decider = Decider::new(settings(false));
    let start = Instant::now();
    for second in 0..10 {
        assert_eq!(
            node.pass(&mut decider, &metrics, start + second * SECOND),
            vec![]
        );
    }
    assert_eq!(host.try_wait().unwrap(), None);
    assert!(
        metrics
            .encode()
            .contains(r#"gpu_watchdog_unattributed_processes{gpu="0""#)
    );
    host.kill().unwrap();
    host.wait().unwrap();
}

#[test]
fn the_event_names_the_process_its_use_and_the_budget() {
    let mut node = scenario();
    let mut decider = Decider::new(settings(false));
    let start = Instant::now();
    let accounting = accounting::read(&node.simulator, &node.proc_root).unwrap();
    let pods = PodIndex::new(&node.pods.iter().map(TestPod::object).collect::<Vec<_>>());
    let held = node.holdings();
    let (_, first) = judge(
        &mut decider,
        &accounting,
        &pods,
        &held,
        DefaultBudget::ReplicaShare,
        start,
    );
    assert!(first.is_empty());
    let (_, actions) = judge(
        &mut decider,
        &accounting,
        &pods,
        &held,
        DefaultBudget::ReplicaShare,
        start + 2 * SECOND,
    );
    let pid = node.pod("over").pid();
    let note = describe(&actions[0], "sent SIGTERM");
    assert_eq!(
        note,
        format!(
            "process {pid} (container main) uses 12000 MiB of GPU 0 ({uuid}); the pod uses 12000 MiB there, over its budget of 10240 MiB (1 of 4 replicas of a 40960 MiB GPU) for 2s: sent SIGTERM",
            uuid = node.uuid
        )
    );
}

use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::*;
use crate::types::GpuProcess;

fn open(dir: &TempDir, spec: &str) -> Simulator {
    Simulator::open(
        dir.path().join("node.json"),
        "node-a",
        &spec.parse().unwrap(),
    )
    .unwrap()
}

/// An A100-40GB simulator with MIG already on.
fn mig_a100(dir: &TempDir) -> Simulator {
    let sim = open(dir, "a100-40gb:1");
    sim.set_mig_mode(0, true).unwrap();
    sim.reset(0).unwrap();
    sim
}

fn at(start: u32, size: u32) -> Placement {
    Placement { start, size }
}

fn process(pid: u32, memory: u64) -> GpuProcess {
    GpuProcess {
        pid,
        used_memory_mib: Some(memory),
        gpu_instance_id: None,
        compute_instance_id: None,
    }
}

#[test]
fn mig_mode_stays_pending_until_reset() {
    let dir = TempDir::new().unwrap();
    let sim = open(&dir, "a100-40gb:2");
    assert_eq!(sim.gpu(0).unwrap().mig_mode, Some(MigMode::default()));
    let mode = sim.set_mig_mode(0, true).unwrap();
    assert_eq!(
        mode,
        MigMode {
            current: false,
            pending: true
        }
    );
    assert_eq!(sim.gpu(0).unwrap().multiprocessor_count, Some(108));
    assert!(matches!(
        sim.gpu_instances(0),
        Err(GpuError::NotSupported(_))
    ));
    assert!(matches!(
        sim.create_gpu_instance(0, 0, at(0, 8)),
        Err(GpuError::NotSupported(_))
    ));

    sim.reset(0).unwrap();
    let gpu = sim.gpu(0).unwrap();
    assert_eq!(
        gpu.mig_mode,
        Some(MigMode {
            current: true,
            pending: true
        })
    );
    // Enabling MIG on an A100-40GB costs 10 of its 108 SMs.
    assert_eq!(gpu.multiprocessor_count, Some(98));
    // The other GPU is untouched.
    assert_eq!(sim.gpu(1).unwrap().mig_mode, Some(MigMode::default()));
}

#[test]
fn reset_is_refused_while_a_process_holds_the_gpu() {
    let dir = TempDir::new().unwrap();
    let sim = open(&dir, "h100-80gb:1");
    sim.set_mig_mode(0, true).unwrap();
    sim.start_process(0, process(4242, 1024)).unwrap();
    let error = sim.reset(0).unwrap_err();
    assert!(matches!(error, GpuError::InUse(_)), "{error}");
    assert!(error.to_string().contains("4242"), "{error}");
    assert!(!sim.gpu(0).unwrap().mig_mode.unwrap().current);

    sim.stop_process(0, 4242).unwrap();
    sim.reset(0).unwrap();
    assert!(sim.gpu(0).unwrap().mig_mode.unwrap().current);
}

#[test]
fn injected_reset_failures() {
    let dir = TempDir::new().unwrap();
    let sim = open(&dir, "a30:1");
    sim.set_reset_failure(0, Some(ResetFailure::Unsupported))
        .unwrap();
    assert!(matches!(sim.reset(0), Err(GpuError::NotSupported(_))));
    sim.set_reset_failure(0, Some(ResetFailure::Fails)).unwrap();
    assert!(matches!(sim.reset(0), Err(GpuError::Other(_))));
    sim.clear_faults(0).unwrap();
    sim.reset(0).unwrap();
}

#[test]
fn placements_follow_the_catalog() {
    let dir = TempDir::new().unwrap();
    let sim = mig_a100(&dir);
    assert_eq!(
        sim.gpu_instance_placements(0, 9).unwrap(),
        [at(0, 4), at(4, 4)]
    );
    assert_eq!(sim.gpu_instance_placements(0, 19).unwrap().len(), 7);
    let profiles = sim.gpu_instance_profiles(0).unwrap();
    let ids: Vec<u32> = profiles.iter().map(|profile| profile.id).collect();
    assert_eq!(ids, [19, 14, 9, 5, 0, 20, 15]);
    let full = profiles.iter().find(|profile| profile.id == 0).unwrap();
    assert_eq!(
        (
            full.slice_count,
            full.instance_count,
            full.memory_mib,
            full.multiprocessor_count
        ),
        (7, 1, 40192, 98)
    );
    assert!(matches!(
        sim.gpu_instance_profile(0, 17),
        Err(GpuError::InvalidArgument(_))
    ));
}

#[test]
fn overlapping_or_disallowed_placements_are_insufficient_resources() {
    let dir = TempDir::new().unwrap();
    let sim = mig_a100(&dir);
    let first = sim.create_gpu_instance(0, 9, at(0, 4)).unwrap();
    assert_eq!(first.placement, at(0, 4));
    // 2g.10gb at slice 2 overlaps the 3g.20gb at 0-3.
    assert!(matches!(
        sim.create_gpu_instance(0, 14, at(2, 2)),
        Err(GpuError::InsufficientResources(_))
    ));
    // 3g.20gb may not start at slice 2.
    assert!(matches!(
        sim.create_gpu_instance(0, 9, at(2, 4)),
        Err(GpuError::InsufficientResources(_))
    ));
    // A wrong size is an invalid argument, an unknown profile too.
    assert!(matches!(
        sim.create_gpu_instance(0, 9, at(4, 2)),
        Err(GpuError::InvalidArgument(_))
    ));
    assert!(matches!(
        sim.create_gpu_instance(0, 99, at(4, 4)),
        Err(GpuError::InvalidArgument(_))
    ));
    sim.create_gpu_instance(0, 9, at(4, 4)).unwrap();
    assert_eq!(sim.gpu_instances(0).unwrap().len(), 2);
}

#[test]
fn a_profile_never_exceeds_its_maximum() {
    let dir = TempDir::new().unwrap();
    let sim = mig_a100(&dir);
    // 1g.5gb+me: one instance at most, though seven starts are allowed.
    sim.create_gpu_instance(0, 20, at(0, 1)).unwrap();
    let error = sim.create_gpu_instance(0, 20, at(1, 1)).unwrap_err();
    assert!(
        matches!(error, GpuError::InsufficientResources(_)),
        "{error}"
    );
}

#[test]
fn instances_are_destroyed_inside_out() {
    let dir = TempDir::new().unwrap();
    let sim = mig_a100(&dir);
    let gi = sim.create_gpu_instance(0, 0, at(0, 8)).unwrap();
    assert!(matches!(
        sim.create_compute_instance(0, gi.id, 5),
        Err(GpuError::NotSupported(_))
    ));
    let ci = sim.create_compute_instance(0, gi.id, 4).unwrap();
    sim.create_compute_instance(0, gi.id, 3).unwrap();
    assert!(matches!(
        sim.create_compute_instance(0, gi.id, 1),
        Err(GpuError::InsufficientResources(_))
    ));
    assert_eq!(sim.compute_instances(0, gi.id).unwrap().len(), 2);

    let devices = sim.mig_devices(0).unwrap();
    assert_eq!(devices.len(), 2);
    assert!(devices.iter().all(|device| device.uuid.starts_with("MIG-")));
    assert_eq!(devices[0].multiprocessor_count, 56);

    sim.start_process(
        0,
        GpuProcess {
            pid: 7,
            used_memory_mib: Some(100),
            gpu_instance_id: Some(gi.id),
            compute_instance_id: Some(ci.id),
        },
    )
    .unwrap();
    assert!(matches!(
        sim.destroy_gpu_instance(0, gi.id),
        Err(GpuError::InUse(_))
    ));
    assert!(matches!(
        sim.destroy_compute_instance(0, gi.id, ci.id),
        Err(GpuError::InUse(_))
    ));
    sim.stop_process(0, 7).unwrap();
    for compute in sim.compute_instances(0, gi.id).unwrap() {
        sim.destroy_compute_instance(0, gi.id, compute.id).unwrap();
    }
    sim.destroy_gpu_instance(0, gi.id).unwrap();
    assert!(sim.gpu_instances(0).unwrap().is_empty());
    assert!(matches!(
        sim.destroy_gpu_instance(0, gi.id),
        Err(GpuError::NotFound(_))
    ));
}

#[test]
fn processes_must_run_where_the_mig_mode_allows() {
    let dir = TempDir::new().unwrap();
    let sim = mig_a100(&dir);
    assert!(matches!(
        sim.start_process(0, process(1, 1)),
        Err(GpuError::InvalidArgument(_))
    ));
    let mut in_mig = process(1, 1);
    in_mig.gpu_instance_id = Some(3);
    in_mig.compute_instance_id = Some(0);
    assert!(matches!(
        sim.start_process(0, in_mig),
        Err(GpuError::NotFound(_))
    ));
}

#[test]
fn reset_clears_mig_instances() {
    let dir = TempDir::new().unwrap();
    let sim = mig_a100(&dir);
    sim.create_gpu_instance(0, 19, at(3, 1)).unwrap();
    sim.reset(0).unwrap();
    assert!(sim.gpu_instances(0).unwrap().is_empty());
}

#[test]
fn two_handles_share_one_node() {
    let dir = TempDir::new().unwrap();
    let agent = open(&dir, "a100-80gb:2");
    let plugin = open(&dir, "a100-80gb:2");
    agent.set_mig_mode(1, true).unwrap();
    assert!(plugin.gpu(1).unwrap().mig_mode.unwrap().pending);
    plugin.reset(1).unwrap();
    agent.create_gpu_instance(1, 0, at(0, 8)).unwrap();
    assert_eq!(plugin.gpu_instances(1).unwrap().len(), 1);
    assert_eq!(agent.gpus().unwrap(), plugin.gpus().unwrap());
}

#[test]
fn uuids_are_stable_across_reopens_and_distinct_across_nodes() {
    let dir = TempDir::new().unwrap();
    let first = open(&dir, "a100-40gb:2").gpus().unwrap();
    let again = open(&dir, "a100-40gb:2").gpus().unwrap();
    assert_eq!(first, again);
    assert_ne!(first[0].uuid, first[1].uuid);
    assert!(
        first[0].uuid.starts_with("GPU-") && first[0].uuid.len() == 40,
        "{}",
        first[0].uuid
    );
    let other = TempDir::new().unwrap();
    let elsewhere = Simulator::open(
        other.path().join("n.json"),
        "node-b",
        &"a100-40gb:2".parse().unwrap(),
    )
    .unwrap();
    assert_ne!(elsewhere.gpu(0).unwrap().uuid, first[0].uuid);
}

#[test]
fn a_state_file_of_another_spec_is_refused() {
    let dir = TempDir::new().unwrap();
    open(&dir, "a100-40gb:2");
    let error = Simulator::open(
        dir.path().join("node.json"),
        "node-a",
        &"h200:1".parse().unwrap(),
    )
    .unwrap_err();
    assert!(matches!(error, GpuError::InvalidArgument(_)), "{error}");
    assert!(error.to_string().contains("remove the file"), "{error}");
}

#[test]
fn xid_events_reach_every_handle_once() {
    let dir = TempDir::new().unwrap();
    let plugin = open(&dir, "h200:2");
    let exporter = open(&dir, "h200:2");
    let test = open(&dir, "h200:2");
    test.inject_xid(1, 79).unwrap();
    let expected = [HealthEvent::xid(1, 79)];
    assert_eq!(plugin.health_events().unwrap(), expected);
    assert_eq!(exporter.health_events().unwrap(), expected);
    assert!(plugin.health_events().unwrap().is_empty());
    // A handle opened later sees only later events, as an NVML event set registered later would.
    let late = open(&dir, "h200:2");
    assert!(late.health_events().unwrap().is_empty());
    assert!(matches!(test.inject_xid(2, 79), Err(GpuError::NotFound(_))));
}

#[test]
fn injected_delay_slows_operations_on_that_gpu() {
    let dir = TempDir::new().unwrap();
    let sim = open(&dir, "a30:2");
    sim.set_delay(0, Duration::from_millis(150)).unwrap();
    let started = Instant::now();
    sim.set_mig_mode(0, true).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
    let started = Instant::now();
    sim.gpu(1).unwrap();
    assert!(started.elapsed() < Duration::from_millis(150));
}

#[test]
fn telemetry_follows_the_processes() {
    let dir = TempDir::new().unwrap();
    let sim = open(&dir, "a100-40gb:1");
    let idle = sim.telemetry(0).unwrap();
    assert_eq!(idle.gpu_utilization_percent, Some(0));
    assert_eq!(idle.memory_used_mib, Some(0));
    sim.start_process(0, process(11, 2048)).unwrap();
    sim.start_process(0, process(12, 1024)).unwrap();
    let busy = sim.telemetry(0).unwrap();
    assert_eq!(busy.memory_used_mib, Some(3072));
    // Used, free and reserved add up to the board's memory, as NVML's v2 memory info does.
    assert_eq!(busy.memory_reserved_mib, Some(512));
    assert_eq!(busy.memory_free_mib, Some(40960 - 512 - 3072));
    assert!(busy.power_milliwatts > idle.power_milliwatts);
    assert!(busy.total_energy_millijoules >= idle.total_energy_millijoules);
    assert!(busy.memory_temperature_celsius > idle.memory_temperature_celsius);
    assert_eq!(sim.processes(0).unwrap().len(), 2);
}

#[test]
fn counters_are_a_healthy_gpus_until_a_test_sets_them() {
    let dir = TempDir::new().unwrap();
    let sim = open(&dir, "a100-40gb:2");
    let healthy = sim.telemetry(0).unwrap();
    assert_eq!(healthy.memory_errors.remapped_rows_correctable, Some(0));
    assert_eq!(healthy.memory_errors.remapped_rows_failure, Some(false));
    assert_eq!(healthy.nvlink.crc_flit_errors, Some(0));
    assert_eq!(healthy.pcie_replays, Some(0));
    assert_eq!(healthy.throttling.power_ns, Some(0));
    // Ampere and later remap rows instead of retiring pages: NVML gives no retired-page counts.
    assert_eq!(healthy.memory_errors.retired_pages_double_bit, None);

    let mut worn = SimulatedCounters::healthy();
    worn.memory_errors.remapped_rows_correctable = Some(3);
    worn.memory_errors.remapped_rows_pending = Some(true);
    worn.nvlink = crate::types::NvLinkCounters::default();
    sim.set_counters(1, Some(worn)).unwrap();
    // Another handle on the node, as the exporter is another process.
    let reader = open(&dir, "a100-40gb:2");
    let telemetry = reader.telemetry(1).unwrap();
    assert_eq!(telemetry.memory_errors.remapped_rows_correctable, Some(3));
    assert_eq!(telemetry.memory_errors.remapped_rows_pending, Some(true));
    assert_eq!(telemetry.nvlink.data_kib, None);
    assert_eq!(
        reader.telemetry(0).unwrap().memory_errors,
        healthy.memory_errors
    );
    sim.clear_faults(1).unwrap();
    assert_eq!(
        reader
            .telemetry(1)
            .unwrap()
            .memory_errors
            .remapped_rows_correctable,
        Some(0)
    );

    let details = reader.details(1).unwrap();
    assert_eq!(details.nvml_version.as_deref(), Some("12.570.86.15"));
    let serial = details.serial.unwrap();
    assert_eq!(serial.len(), 13);
    assert_ne!(Some(serial), reader.details(0).unwrap().serial);
}

#[test]
fn concurrent_handles_do_not_lose_updates() {
    let dir = TempDir::new().unwrap();
    mig_a100(&dir);
    let path = dir.path().join("node.json");
    let threads: Vec<_> = (0..7)
        .map(|start| {
            let path = path.clone();
            thread::spawn(move || {
                let sim = Simulator::open(path, "node-a", &"a100-40gb:1".parse().unwrap()).unwrap();
                sim.create_gpu_instance(0, 19, at(start, 1)).unwrap();
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(open(&dir, "a100-40gb:1").gpu_instances(0).unwrap().len(), 7);
}

#[test]
fn a_host_process_uses_the_gpu_until_it_exits_with_the_memory_a_test_sets() {
    let dir = TempDir::new().unwrap();
    let sim = open(&dir, "a100-40gb:1");
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = child.id();
    sim.start_host_process(0, process(pid, 1000)).unwrap();
    sim.set_process_memory(0, pid, 3000).unwrap();
    assert_eq!(sim.processes(0).unwrap(), vec![process(pid, 3000)]);
    assert_eq!(sim.telemetry(0).unwrap().memory_used_mib, Some(3000));
    // Another handle (another process of the node) sees the same.
    assert_eq!(open(&dir, "a100-40gb:1").processes(0).unwrap().len(), 1);

    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        sim.processes(0).unwrap(),
        Vec::new(),
        "exited, memory freed"
    );
    assert!(matches!(
        sim.set_process_memory(0, pid, 1),
        Err(GpuError::NotFound(_))
    ));
    // A pid no process holds cannot stand for a host process.
    assert!(matches!(
        sim.start_host_process(0, process(1 << 23, 1)),
        Err(GpuError::NotFound(_))
    ));
}

#[test]
fn only_a_reader_in_the_reporters_pid_namespace_ends_an_exited_host_process() {
    use super::faults::{Faults, HostEntry, own_pid_namespace};

    // Above pid_max: never running.
    let gone = 1 << 23;
    let mut faults = Faults {
        processes: vec![process(gone, 10), process(gone + 1, 10)],
        ..Faults::default()
    };
    for (pid, pid_namespace) in [
        (gone, own_pid_namespace()),
        (gone + 1, "pid:[1]".to_owned()),
    ] {
        faults.host_processes.insert(
            pid,
            HostEntry {
                start_time: 1,
                pid_namespace,
                cgroup: String::new(),
                pinned_limit_mib: None,
            },
        );
    }
    assert!(faults.end_exited_host_processes(&own_pid_namespace()));
    // The one reported from another PID namespace cannot be seen from here: it is left to a reader there.
    assert_eq!(faults.processes, vec![process(gone + 1, 10)]);
    assert!(!faults.end_exited_host_processes(&own_pid_namespace()));
}

#[test]
fn the_first_reader_that_sees_an_exit_records_it_in_the_file() {
    let dir = TempDir::new().unwrap();
    let sim = open(&dir, "a100-40gb:1");
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    sim.start_host_process(0, process(child.id(), 500)).unwrap();
    let file = dir.path().join("node.json");
    let pid = format!("\"pid\": {}", child.id());
    assert!(std::fs::read_to_string(&file).unwrap().contains(&pid));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(sim.processes(0).unwrap().is_empty());
    assert!(!std::fs::read_to_string(&file).unwrap().contains(&pid));
}

/// `sleep 60` with `env`, standing for a GPU user; killed when dropped.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn start(env: &[(&str, &str)]) -> Self {
        let mut command = std::process::Command::new("sleep");
        command.arg("60");
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().unwrap();
        // Right after exec, some kernels (and sandboxes) show an empty environment in /proc for a moment: wait
        // until it reads as the process's own, as it does for any process that has run long enough to use a GPU.
        let environ = format!("/proc/{}/environ", child.id());
        let started = Instant::now();
        while std::fs::read(&environ).is_ok_and(|bytes| bytes.is_empty())
            && started.elapsed() < Duration::from_secs(5)
        {
            thread::sleep(Duration::from_millis(5));
        }
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_mps_client_cannot_allocate_past_its_pinned_limit() {
    let dir = TempDir::new().unwrap();
    let sim = open(&dir, "a100-40gb:1");
    let client = Sleeper::start(&[("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=3000M")]);
    sim.start_host_process(0, process(client.pid(), 1000))
        .unwrap();
    sim.set_process_memory(0, client.pid(), 3000).unwrap();
    let refused = sim.set_process_memory(0, client.pid(), 3001).unwrap_err();
    assert!(
        matches!(&refused, GpuError::InsufficientResources(reason) if reason.contains("pinned limit of 3000 MiB")),
        "{refused}"
    );
    assert_eq!(sim.processes(0).unwrap(), vec![process(client.pid(), 3000)]);
    // A process without the limit in its environment is not held by it.
    let other = Sleeper::start(&[]);
    sim.start_host_process(0, process(other.pid(), 9000))
        .unwrap();
}

#[test]
fn the_driver_holds_a_cgroups_processes_together_to_its_limit_from_r615() {
    let dir = TempDir::new().unwrap();
    let sim = open(&dir, "h100-80gb:1");
    let (first, second) = (Sleeper::start(&[]), Sleeper::start(&[]));
    // Both run in this test's cgroup, as a container's processes share the container's.
    let cgroup = memory_limits::cgroup_of(std::path::Path::new("/proc"), first.pid());
    let refused = sim.set_memory_limit(0, &cgroup, 8192).unwrap_err();
    assert!(
        matches!(&refused, GpuError::NotSupported(reason) if reason.contains("R615")),
        "{refused}"
    );

    sim.set_driver_version("615.10.02").unwrap();
    assert_eq!(sim.gpu(0).unwrap().driver_version, "615.10.02");
    if cgroup.is_empty() {
        // A cgroup v1 host: the driver's limits cannot apply, as on real hosts.
        assert!(sim.set_memory_limit(0, &cgroup, 8192).is_err());
        return;
    }
    sim.set_memory_limit(0, &cgroup, 8192).unwrap();
    sim.start_host_process(0, process(first.pid(), 5000))
        .unwrap();
    sim.start_host_process(0, process(second.pid(), 3000))
        .unwrap();
    let refused = sim.set_process_memory(0, second.pid(), 3500).unwrap_err();
    assert!(
        matches!(&refused, GpuError::InsufficientResources(reason) if reason.contains("limited to 8192 MiB")),
        "{refused}"
    );
    // Starting past the limit fails too, and leaves nothing behind.
    let third = Sleeper::start(&[]);
    assert!(
        sim.start_host_process(0, process(third.pid(), 1000))
            .is_err()
    );
    assert_eq!(sim.processes(0).unwrap().len(), 2);
    sim.set_process_memory(0, first.pid(), 4000).unwrap();
    sim.set_process_memory(0, second.pid(), 4192).unwrap();

    // The driver's limits do not apply to MIG devices.
    let mig = TempDir::new().unwrap();
    let mig = open(&mig, "h100-80gb:1");
    mig.set_driver_version("615.10.02").unwrap();
    mig.set_mig_mode(0, true).unwrap();
    mig.reset(0).unwrap();
    assert!(matches!(
        mig.set_memory_limit(0, &cgroup, 8192),
        Err(GpuError::NotSupported(_))
    ));
}

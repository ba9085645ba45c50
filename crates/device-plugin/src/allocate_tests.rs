use crd::config::device_plugin::{MigStrategy, parse};
use node_runtime::testing::simulated;

use super::*;
use crate::plan::tests::planned;
use crate::plan::{Plan, advertise};

/// The plan of `config` on a simulated node, and the simulator's temporary folder (kept alive by the caller).
fn plan_of(
    spec: &str,
    devices: &[(&str, u32)],
    config: &str,
    strategy: MigStrategy,
) -> (tempfile::TempDir, Plan) {
    let (dir, simulator) = simulated(spec, devices);
    (
        dir,
        advertise(&planned(&simulator), &parse(config).unwrap(), strategy).unwrap(),
    )
}

fn settings(config: &str, cdi: bool) -> AllocateSettings {
    AllocateSettings::new(&parse(config).unwrap(), cdi, Path::new("/run/nvidia/mps"))
}

fn name(text: &str) -> ResourceName {
    text.parse().unwrap()
}

const TIME_SLICED: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";

#[test]
fn envvar_and_cdi_name_each_physical_gpu_once() {
    let (_dir, plan) = plan_of("a100-40gb:2", &[], TIME_SLICED, MigStrategy::None);
    let gpu = name("nvidia.com/gpu");
    let resource = &plan[&gpu];
    let ids: Vec<String> = [0, 1, 4]
        .iter()
        .map(|&position| resource.devices[position].id.clone())
        .collect();
    let response = allocate(&gpu, resource, &settings(TIME_SLICED, true), &ids).unwrap();
    let (first, second) = (&resource.devices[0].uuid, &resource.devices[4].uuid);
    assert_eq!(
        response.envs[VISIBLE_DEVICES_ENV],
        format!("{first},{second}")
    );
    let cdi: Vec<&str> = response
        .cdi_devices
        .iter()
        .map(|device| device.name.as_str())
        .collect();
    assert_eq!(
        cdi,
        [
            format!("k8s.device-plugin.nvidia.com/gpu={first}"),
            format!("k8s.device-plugin.nvidia.com/gpu={second}")
        ]
    );
    assert!(response.mounts.is_empty() && response.devices.is_empty());
    // Without --cdi, only the environment.
    let plain = allocate(&gpu, resource, &settings(TIME_SLICED, false), &ids).unwrap();
    assert!(plain.cdi_devices.is_empty());
}

#[test]
fn index_strategy_volume_mounts_and_device_specs() {
    let config = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: [volume-mounts, cdi-annotations]\n    \
                  deviceIDStrategy: index\n    passDeviceSpecs: true\n";
    let (_dir, plan) = plan_of("a100-40gb:1", &[("1g.5gb", 2)], config, MigStrategy::Mixed);
    let mig = name("nvidia.com/mig-1g.5gb");
    let resource = &plan[&mig];
    let ids = vec![resource.devices[1].id.clone()];
    let response = allocate(&mig, resource, &settings(config, true), &ids).unwrap();
    assert_eq!(response.envs[VISIBLE_DEVICES_ENV], CONTAINER_DEVICES_DIR);
    assert_eq!(
        response.mounts[0].container_path,
        "/var/run/nvidia-container-devices/0:1"
    );
    assert_eq!(response.mounts[0].host_path, "/dev/null");
    assert_eq!(
        response.annotations["cdi.k8s.io/nvidia-device-plugin_mig-1g.5gb"],
        format!(
            "k8s.device-plugin.nvidia.com/gpu={}",
            resource.devices[1].uuid
        )
    );
    let nodes: Vec<&str> = response
        .devices
        .iter()
        .map(|spec| spec.host_path.as_str())
        .collect();
    assert_eq!(
        nodes,
        [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia0"
        ]
    );
    assert!(response.cdi_devices.is_empty());
}

#[test]
fn requests_over_one_replica_fail_with_the_reference_message() {
    let config = "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n    \
                  resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";
    let (_dir, plan) = plan_of("a100-40gb:1", &[], config, MigStrategy::None);
    let shared = name("nvidia.com/gpu.shared");
    let resource = &plan[&shared];
    let ids: Vec<String> = resource.devices[..2]
        .iter()
        .map(|device| device.id.clone())
        .collect();
    let error = allocate(&shared, resource, &settings(config, false), &ids).unwrap_err();
    assert_eq!(
        error.to_string(),
        "request for 'nvidia.com/gpu.shared: 2' too large: maximum request size for shared resources is 1"
    );
    assert!(allocate(&shared, resource, &settings(config, false), &ids[..1]).is_ok());
    let unknown = allocate(
        &shared,
        resource,
        &settings(config, false),
        &["GPU-x::9".into()],
    )
    .unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "unknown device GPU-x::9 for resource nvidia.com/gpu.shared"
    );
}

#[test]
fn mps_replicas_get_memory_and_thread_limits() {
    let config = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";
    let (_dir, plan) = plan_of("a100-40gb:1", &[], config, MigStrategy::None);
    let gpu = name("nvidia.com/gpu");
    let resource = &plan[&gpu];
    let device = &resource.devices[2];
    let response = allocate(
        &gpu,
        resource,
        &settings(config, false),
        std::slice::from_ref(&device.id),
    )
    .unwrap();
    assert_eq!(
        response.envs[MPS_MEMORY_LIMIT_ENV],
        format!("{}=10240M", device.uuid)
    );
    assert_eq!(response.envs[MPS_THREADS_ENV], "25");
    assert_eq!(response.envs[MPS_PIPE_ENV], "/mps/gpu/pipe");
    assert_eq!(response.mounts[0].host_path, "/run/nvidia/mps/gpu/pipe");
    // Time-slicing has no such limits.
    let (_dir, sliced) = plan_of("a100-40gb:1", &[], TIME_SLICED, MigStrategy::None);
    let replica = sliced[&gpu].devices[0].id.clone();
    let response = allocate(
        &gpu,
        &sliced[&gpu],
        &settings(TIME_SLICED, false),
        &[replica],
    )
    .unwrap();
    assert!(!response.envs.contains_key(MPS_MEMORY_LIMIT_ENV));
}

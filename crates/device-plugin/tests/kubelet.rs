//! The plugin against a test kubelet, in process: a Registration server on a temporary `kubelet.sock` that, like
//! the kubelet, opens ListAndWatch on every plugin that registers and calls Allocate. The GPUs are simulated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crd::config::device_plugin::{CommandLine, NodeConfig, device_uuid, parse_tolerant};
use device_plugin::api::device_plugin_client::DevicePluginClient;
use device_plugin::api::registration_server::{Registration, RegistrationServer};
use device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, Empty, HEALTHY, KUBELET_SOCKET, RegisterRequest,
};
use device_plugin::manager::{ConfigUpdate, Options, Report, run};
use gpu::GpuBackend;
use gpu::Simulator;
use node_runtime::backend::Gpus;
use node_runtime::grpc::connect;
use node_runtime::health::{Checks, HealthTracker};
use tokio::net::UnixSocket;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

#[path = "support/mod.rs"]
mod support;
use support::percentiles;

/// Resource name to the device list the plugin last sent: (id, health).
type Lists = BTreeMap<String, Vec<(String, String)>>;

/// The kubelet's side: registrations received, and the latest ListAndWatch list per resource.
#[derive(Clone)]
struct TestKubelet {
    dir: PathBuf,
    registrations: mpsc::UnboundedSender<(Instant, RegisterRequest)>,
    lists: watch::Sender<Lists>,
}

#[tonic::async_trait]
impl Registration for TestKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        let _ = self.registrations.send((Instant::now(), request.clone()));
        let (socket, lists) = (self.dir.join(&request.endpoint), self.lists.clone());
        // As the kubelet does: dial the plugin back and follow its device list.
        tokio::spawn(async move {
            // A plugin that stops (the end of the test) while being dialled back ends the stream, as in the kubelet.
            let Ok(channel) = connect(&socket).await else {
                return;
            };
            let Ok(response) = DevicePluginClient::new(channel)
                .list_and_watch(Empty {})
                .await
            else {
                return;
            };
            let mut stream = response.into_inner();
            while let Ok(Some(update)) = stream.message().await {
                let devices = update
                    .devices
                    .into_iter()
                    .map(|device| (device.id, device.health))
                    .collect();
                lists.send_modify(|lists| {
                    lists.insert(request.resource_name.clone(), devices);
                });
            }
        });
        Ok(Response::new(Empty {}))
    }
}

impl TestKubelet {
    /// Serves Registration on `<dir>/kubelet.sock`; the returned sender stops it.
    fn serve(&self) -> tokio::sync::oneshot::Sender<()> {
        self.serve_after(Duration::ZERO)
    }

    /// As [`serve`](Self::serve), with `kubelet.sock` existing (bound) for `delay` before connections are
    /// accepted, as a starting kubelet's socket can: the file appears when it binds, before it listens.
    fn serve_after(&self, delay: Duration) -> tokio::sync::oneshot::Sender<()> {
        let socket = UnixSocket::new_stream().unwrap();
        socket.bind(self.dir.join(KUBELET_SOCKET)).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = RegistrationServer::new(self.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let listener = socket.listen(64).unwrap();
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        stop
    }
}

/// Healthy devices of a resource in the lists.
fn healthy(lists: &Lists, resource: &str) -> Option<usize> {
    lists.get(resource).map(|devices| {
        devices
            .iter()
            .filter(|(_, health)| health == HEALTHY)
            .count()
    })
}

/// Waits until the lists satisfy `condition`, at most 10 s.
async fn wait_for(
    lists: &mut watch::Receiver<Lists>,
    what: &str,
    condition: impl Fn(&Lists) -> bool,
) {
    let waited = tokio::time::timeout(
        Duration::from_secs(10),
        lists.wait_for(|lists| condition(lists)),
    )
    .await
    .is_ok();
    assert!(
        waited,
        "timed out waiting for {what}: {:?}",
        *lists.borrow()
    );
}

fn config(text: &str, name: &str) -> Option<ConfigUpdate> {
    let parsed = parse_tolerant(text).unwrap();
    Some(Ok(NodeConfig::new(
        Some(name.into()),
        parsed,
        CommandLine::default(),
    )))
}

fn options(dir: &Path) -> Options {
    Options {
        plugin_dir: dir.to_owned(),
        cdi: true,
        cdi_dir: dir.join("cdi"),
        mps_root: dir.join("mps"),
        start_mps: false,
        health: HealthTracker::new(Checks::parse(None).unwrap(), Duration::from_secs(2)),
        mig_poll: Duration::from_millis(200),
        health_poll: Duration::from_millis(50),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_streams_allocates_recovers_and_reregisters() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("device-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let simulator = Arc::new(
        Simulator::open(
            temp.path().join("gpus.json"),
            "node-1",
            &"a100-40gb:4".parse().unwrap(),
        )
        .unwrap(),
    );

    let (registrations, mut registered) = mpsc::unbounded_channel();
    let (lists_sender, mut lists) = watch::channel(Lists::new());
    let kubelet = TestKubelet {
        dir: dir.clone(),
        registrations,
        lists: lists_sender,
    };
    let stop_kubelet = kubelet.serve();

    let slice_4 = "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    \
                   - name: nvidia.com/gpu\n      replicas: 4\n";
    let (configs, config_receiver) = watch::channel(config(slice_4, "slice-4"));
    let (report, mut reports) = watch::channel(Report::default());
    let plugin = tokio::spawn(run(
        options(&dir),
        Gpus::from_simulator(simulator.clone()),
        config_receiver,
        report,
    ));

    // Registration and the guide's count.
    let (_, request) = tokio::time::timeout(Duration::from_secs(10), registered.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(request.resource_name, "nvidia.com/gpu.shared");
    assert_eq!(request.version, "v1beta1");
    assert_eq!(request.endpoint, "nvidia-gpu.shared.sock");
    assert!(request.options.unwrap().get_preferred_allocation_available);
    wait_for(&mut lists, "16 shared devices", |lists| {
        healthy(lists, "nvidia.com/gpu.shared") == Some(16)
    })
    .await;
    let report_seen = reports
        .wait_for(|report| report.resources.get("nvidia.com/gpu.shared") == Some(&16))
        .await;
    assert_eq!(report_seen.unwrap().config.as_deref(), Some("slice-4"));

    // Allocate: environment and CDI name, and its latency.
    let device = lists.borrow()["nvidia.com/gpu.shared"][5].0.clone();
    let uuid = device_uuid(&device).to_owned();
    let mut client =
        DevicePluginClient::new(connect(&dir.join("nvidia-gpu.shared.sock")).await.unwrap());
    let request = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: vec![device],
        }],
    };
    let mut samples = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        let response = client.allocate(request.clone()).await.unwrap().into_inner();
        samples.push(started.elapsed());
        let container = &response.container_responses[0];
        assert_eq!(container.envs["NVIDIA_VISIBLE_DEVICES"], uuid);
        assert_eq!(
            container.cdi_devices[0].name,
            format!("k8s.device-plugin.nvidia.com/gpu={uuid}")
        );
    }
    let (p50, p99) = percentiles(samples);
    println!("Allocate latency over a unix socket: p50 {p50} us, p99 {p99} us");
    assert!(
        std::fs::read_to_string(
            temp.path()
                .join("device-plugins/cdi/k8s.device-plugin.nvidia.com-gpu.json")
        )
        .unwrap()
        .contains(&uuid)
    );

    // A new config takes effect without a restart: the shared resource is withdrawn, whole GPUs registered.
    configs.send(config("version: v1\n", "whole")).unwrap();
    let (_, request) = tokio::time::timeout(Duration::from_secs(10), registered.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(request.resource_name, "nvidia.com/gpu");
    wait_for(&mut lists, "4 whole GPUs", |lists| {
        healthy(lists, "nvidia.com/gpu") == Some(4)
    })
    .await;
    assert!(!dir.join("nvidia-gpu.shared.sock").exists());

    // GPUs the DRA driver takes are withdrawn from the kubelet: the two never hand out the same GPU.
    let mut partitioned = config("version: v1\n", "whole");
    if let Some(Ok(chosen)) = partitioned.as_mut() {
        chosen.dra_gpus = "0-1".parse().unwrap();
    }
    configs.send(partitioned).unwrap();
    wait_for(&mut lists, "the 2 GPUs the DRA driver leaves", |lists| {
        healthy(lists, "nvidia.com/gpu") == Some(2)
    })
    .await;
    let offered: Vec<String> = lists.borrow()["nvidia.com/gpu"]
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    let taken: Vec<String> = simulator
        .gpus()
        .unwrap()
        .into_iter()
        .filter(|gpu| gpu.index < 2)
        .map(|gpu| gpu.uuid)
        .collect();
    assert!(offered.iter().all(|id| !taken.contains(id)), "{offered:?}");
    configs.send(config("version: v1\n", "whole")).unwrap();
    wait_for(&mut lists, "4 whole GPUs again", |lists| {
        healthy(lists, "nvidia.com/gpu") == Some(4)
    })
    .await;

    // An invalid config keeps the last good one and says why.
    configs
        .send(Some(Err("ConfigMap cfg has no key \"slice-3\"".into())))
        .unwrap();
    let report_seen = reports
        .wait_for(|report| report.error.is_some())
        .await
        .unwrap()
        .clone();
    assert_eq!(
        report_seen.error.as_deref(),
        Some("ConfigMap cfg has no key \"slice-3\"; keeping config whole")
    );
    assert_eq!(report_seen.resources["nvidia.com/gpu"], 4);

    // An injected XID drops the healthy count by one, and the GPU recovers after the quiet period.
    let injected = Instant::now();
    simulator.inject_xid(2, 79).unwrap();
    wait_for(&mut lists, "one Unhealthy GPU", |lists| {
        healthy(lists, "nvidia.com/gpu") == Some(3)
    })
    .await;
    let detected = injected.elapsed();
    wait_for(&mut lists, "the GPU to recover", |lists| {
        healthy(lists, "nvidia.com/gpu") == Some(4)
    })
    .await;
    println!(
        "XID seen after {detected:?}, recovered after {:?} (quiet period 2 s)",
        injected.elapsed()
    );
    assert!(injected.elapsed() >= Duration::from_secs(2));

    // A kubelet restart: it deletes every socket and creates kubelet.sock again, accepting connections only
    // 300 ms later; the plugin's first attempt is refused, and it registers again once the kubelet listens.
    stop_kubelet.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path
            .extension()
            .is_some_and(|extension| extension == "sock")
        {
            std::fs::remove_file(path).unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listening_late = Duration::from_millis(300);
    let restarted = Instant::now();
    let _stop_again = kubelet.serve_after(listening_late);
    let (at, request) = tokio::time::timeout(Duration::from_secs(5), registered.recv())
        .await
        .expect("registered again once the kubelet listens")
        .unwrap();
    let reregistered = at.duration_since(restarted + listening_late);
    println!("re-registered {reregistered:?} after the new kubelet.sock accepted connections");
    assert_eq!(request.resource_name, "nvidia.com/gpu");
    assert!(reregistered < Duration::from_secs(1), "{reregistered:?}");
    assert!(dir.join("nvidia-gpu.sock").exists());

    drop(configs);
    tokio::time::timeout(Duration::from_secs(10), plugin)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!dir.join("nvidia-gpu.sock").exists());
}

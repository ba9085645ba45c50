//! The MIG manager's state machine without a cluster: GPUs from the simulator, the API server from
//! [`api_test_kit`]'s stateful fake, the config from NVIDIA's default mig-parted file. Each scenario checks
//! the requests the manager sent, the Node's labels, GPUNode status and the GPUs.

use std::sync::Arc;
use std::time::Duration;

use crd::gpu_node::GpuMigGeometry;
use crd::gpu_node::{GPUNode, GpuNodeSpec};
use crd::labels::{MIG_CONFIG, MIG_CONFIG_STATE, PAUSED_FOR_MIG_CHANGE, deploy_label};
use gpu::simulator::ResetFailure;
use gpu::{GpuBackend, GpuProcess, Simulator};
use http::Method;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use serde_json::{Value, json};
use tempfile::TempDir;

use super::{MigManager, Parts, ReconcileError, Settings};
use crate::mig::clients::{PROGRESS_ANNOTATION, Progress};
use crate::mig::drain::NodePods;
use api_test_kit::standard::{self, Retry};
use api_test_kit::{FakeApi, Request as Sent};
use crd::config::mig_parted::CONFIG_KEY;
use crd::gpu_node::field_manager::MIG_MANAGER;
use node_runtime::backend::Gpus;
use node_runtime::gpunode::GpuNodeWriter;
use node_runtime::inventory;
use node_runtime::kube_io::{NodeApi, NodeEvents, Watched};
use node_runtime::testing::simulated;

use crate::mig::nvidia_config_with;
use crate::test_support::config_map;

const NODE: &str = "node-1";
const NAMESPACE: &str = "gpu-operator";
const NODE_PATH: &str = "/api/v1/nodes/node-1";
const GPU_NODE_PATH: &str = "/apis/nvidia.com/v1alpha1/gpunodes/node-1";
const STATUS_PATH: &str = "/apis/nvidia.com/v1alpha1/gpunodes/node-1/status";
const CLIENT_PODS_PATH: &str = "/api/v1/namespaces/gpu-operator/pods";
const ALL_PODS_PATH: &str = "/api/v1/pods";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// Two configs no A100 can have.
const IMPOSSIBLE: &str = r#"  test-unknown-profile:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  test-too-big:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 2, "1g.10gb": 1}
"#;

/// One node: its simulated GPUs, the fake API server holding its Node, and its MIG manager.
struct Scenario {
    api: FakeApi,
    manager: MigManager,
    simulator: Arc<Simulator>,
    config: ConfigMap,
    _dirs: (TempDir, TempDir),
}

impl Scenario {
    /// GPUs `spec` with `devices` on each (MIG off when none), a Node whose label asks for all-1g.10gb, with the
    /// device plugin deployed.
    fn asking(spec: &str, devices: &[(&str, u32)]) -> Self {
        Self::asking_with(spec, devices, |_| {})
    }

    /// As [`Scenario::asking`], with other settings.
    fn asking_with(spec: &str, devices: &[(&str, u32)], tune: impl FnOnce(&mut Settings)) -> Self {
        let plugin = plugin();
        let labels = [(MIG_CONFIG, "all-1g.10gb"), (plugin.as_str(), "true")];
        Self::with_settings(spec, devices, &labels, tune)
    }

    /// GPUs `spec` with `devices` on each (MIG off when none), a Node with `labels`.
    fn new(spec: &str, devices: &[(&str, u32)], labels: &[(&str, &str)]) -> Self {
        Self::with_settings(spec, devices, labels, |_| {})
    }

    fn with_settings(
        spec: &str,
        devices: &[(&str, u32)],
        labels: &[(&str, &str)],
        tune: impl FnOnce(&mut Settings),
    ) -> Self {
        let (gpu_dir, simulator) = simulated(spec, devices);
        let kubelet = tempfile::tempdir().unwrap();
        let mut node = Node::default();
        node.metadata.name = Some(NODE.into());
        node.metadata.uid = Some("uid-1".into());
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect(),
        );
        let (api, client) = FakeApi::start();
        api.insert(&node);
        api.insert(&GPUNode::new(NODE, GpuNodeSpec {}));
        let mut settings = Settings {
            namespace: NAMESPACE.into(),
            config_map: "default-mig-parted-config".into(),
            default_config: None,
            with_reboot: false,
            clients_timeout: Duration::from_secs(5),
            eviction_timeout: Duration::from_secs(5),
            dra: crd::dra::Partition::default(),
        };
        tune(&mut settings);
        let parts = Parts {
            node: NodeApi::new(client.clone(), NODE),
            gpus: Gpus::from_simulator(simulator.clone()),
            status: GpuNodeWriter::new(client.clone(), NODE, MIG_MANAGER),
            events: NodeEvents::new(client.clone(), MIG_MANAGER, &node),
            pods: NodePods::new(client, NODE, NAMESPACE, kubelet.path()),
        };
        Self {
            api,
            manager: MigManager::new(parts, settings, None),
            simulator,
            config: config_map(&[(CONFIG_KEY, &nvidia_config_with(IMPOSSIBLE))]),
            _dirs: (gpu_dir, kubelet),
        }
    }

    /// One reconcile of the Node as the fake API server holds it now.
    async fn reconcile(&mut self) -> Result<(), ReconcileError> {
        let watched = Watched {
            node: self.stored_node(),
            config_map: Some(self.config.clone()),
        };
        self.manager.reconcile(&watched).await
    }

    /// A reconcile that must succeed; the requests it sent.
    async fn reconciled(&mut self) -> Vec<Sent> {
        self.api.take_requests();
        self.reconcile().await.expect("the reconcile runs");
        self.api.take_requests()
    }

    fn label_config(&self, name: &str) {
        let mut node = self.stored_node();
        node.metadata
            .labels
            .get_or_insert_default()
            .insert(MIG_CONFIG.into(), name.into());
        self.api.insert(&node);
    }

    /// The MIG manager's last error in GPUNode status.
    fn last_error(&self) -> String {
        let error = &self.status()["lastError"];
        assert_eq!(error["component"], "mig-manager", "{error}");
        error["message"].as_str().unwrap_or_default().to_owned()
    }

    /// The Node as the fake API server holds it now.
    fn stored_node(&self) -> Node {
        self.api.get(None, NODE).expect("the Node")
    }

    /// A label of the Node.
    fn label(&self, key: &str) -> Option<String> {
        self.stored_node().metadata.labels?.remove(key)
    }

    /// The GPUNode status as written.
    fn status(&self) -> Value {
        self.api.object(GPU_NODE_PATH).expect("the GPUNode")["status"].clone()
    }

    /// Adds a pod on the node.
    fn add_pod(&self, pod: Value) {
        self.api
            .insert(&serde_json::from_value::<Pod>(pod).expect("a pod"));
    }

    fn geometry(&self) -> Vec<GpuMigGeometry> {
        inventory::geometries(&inventory::read(self.simulator.as_ref()).unwrap())
    }

    fn mig_device_uuids(&self) -> Vec<String> {
        let count = self.simulator.gpu_count().unwrap();
        (0..count)
            .flat_map(|gpu| self.simulator.mig_devices(gpu).unwrap())
            .map(|device| device.uuid)
            .collect()
    }
}

fn lines(sent: &[Sent]) -> Vec<String> {
    sent.iter().map(Sent::line).collect()
}

/// The bodies of the Node patches, in order.
fn node_patches(sent: &[Sent]) -> Vec<Value> {
    sent.iter()
        .filter(|sent| sent.method == Method::PATCH && sent.path == NODE_PATH)
        .map(|sent| sent.body.clone())
        .collect()
}

/// The MIG state of each GPUNode status write, in order.
fn status_states(sent: &[Sent]) -> Vec<String> {
    sent.iter()
        .filter(|sent| sent.path == STATUS_PATH)
        .filter_map(|sent| sent.body["status"]["mig"]["state"].as_str())
        .map(str::to_owned)
        .collect()
}

/// The reasons of the Events recorded, in order.
fn event_reasons(sent: &[Sent]) -> Vec<String> {
    sent.iter()
        .filter(|sent| sent.path.starts_with(EVENTS_PATH))
        .filter_map(|sent| sent.body["reason"].as_str())
        .map(str::to_owned)
        .collect()
}

fn plugin() -> String {
    deploy_label("device-plugin")
}

fn discovery() -> String {
    deploy_label("gpu-feature-discovery")
}

/// A running pod on the node that holds one whole GPU.
fn gpu_workload() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "cuda", "namespace": "default"},
        "spec": {"nodeName": NODE, "containers": [
            {"name": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]},
        "status": {"phase": "Running"},
    })
}

#[tokio::test]
async fn a_label_goes_pending_then_applied_then_success() {
    let plugin = plugin();
    let mut node = Scenario::asking("a100-80gb:1", &[]);
    node.add_pod(gpu_workload());

    let sent = node.reconciled().await;

    assert_eq!(
        lines(&sent),
        [
            format!("GET {NODE_PATH}"),
            format!("PATCH {NODE_PATH}"),
            format!("PATCH {STATUS_PATH}"),
            format!("GET {CLIENT_PODS_PATH}"),
            format!("GET {ALL_PODS_PATH}"),
            "POST /api/v1/namespaces/default/pods/cuda/eviction".to_owned(),
            format!("GET {ALL_PODS_PATH}"),
            format!("GET {NODE_PATH}"),
            format!("PATCH {NODE_PATH}"),
            format!("POST {EVENTS_PATH}"),
            format!("PATCH {STATUS_PATH}"),
        ],
        "pause, wait for the clients, evict, change, restore, report"
    );
    let patches = node_patches(&sent);
    let labels = |patch: &Value, key: &str| patch["metadata"]["labels"][key].clone();
    assert_eq!(labels(&patches[0], MIG_CONFIG_STATE), "pending");
    assert_eq!(labels(&patches[0], &plugin), PAUSED_FOR_MIG_CHANGE);
    assert!(patches[0]["metadata"]["annotations"][PROGRESS_ANNOTATION].is_string());
    assert_eq!(labels(&patches[1], MIG_CONFIG_STATE), "success");
    assert_eq!(labels(&patches[1], &plugin), "true");
    assert_eq!(status_states(&sent), ["pending", "success"]);
    assert_eq!(event_reasons(&sent), ["MigConfigApplied"]);

    assert_eq!(node.label(MIG_CONFIG_STATE).as_deref(), Some("success"));
    assert_eq!(node.label(&plugin).as_deref(), Some("true"));
    assert!(
        !node
            .stored_node()
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(PROGRESS_ANNOTATION)
    );
    let geometry = node.geometry();
    assert!(geometry[0].mig_enabled);
    assert_eq!(geometry[0].devices, [("1g.10gb".to_owned(), 7)].into());
    let status = node.status();
    assert_eq!(status["mig"]["config"], "all-1g.10gb");
    assert_eq!(status["mig"]["current"], status["mig"]["desired"]);
    assert!(status["lastError"].is_null());
}

#[tokio::test]
async fn an_unchanged_config_writes_nothing_and_leaves_the_gpus_alone() {
    let mut node = Scenario::new(
        "a100-80gb:2",
        &[("1g.10gb", 7)],
        &[(MIG_CONFIG, "all-1g.10gb"), (MIG_CONFIG_STATE, "success")],
    );
    let uuids = node.mig_device_uuids();
    let first = node.reconciled().await;
    assert_eq!(
        lines(&first),
        [format!("PATCH {STATUS_PATH}")],
        "already converged: the status is reported once, the Node (as watched) and the GPUs are left alone"
    );
    for _ in 0..2 {
        let again = node.reconciled().await;
        assert!(
            again.is_empty(),
            "no request at rest, however often the Node changes: {:?}",
            lines(&again)
        );
    }
    assert_eq!(
        node.mig_device_uuids(),
        uuids,
        "no MIG device was recreated"
    );
}

#[tokio::test]
async fn an_unknown_profile_fails_with_the_reason_and_keeps_the_last_good_geometry() {
    let plugin = plugin();
    let mut node = Scenario::asking("a100-80gb:1", &[("1g.10gb", 7)]);
    node.reconciled().await;
    let (geometry, uuids) = (node.geometry(), node.mig_device_uuids());

    node.label_config("test-unknown-profile");
    let sent = node.reconciled().await;
    assert!(
        node_patches(&sent)
            .iter()
            .all(|patch| patch["metadata"]["labels"][&plugin].is_null()),
        "nothing is paused for a config that cannot be applied: {sent:?}"
    );
    assert_eq!(event_reasons(&sent), ["MigConfigFailed"]);
    assert_eq!(node.label(MIG_CONFIG_STATE).as_deref(), Some("failed"));
    assert_eq!(node.label(&plugin).as_deref(), Some("true"));
    let status = node.status();
    assert_eq!(status["mig"]["state"], "failed");
    assert_eq!(status["mig"]["config"], "test-unknown-profile");
    let message = node.last_error();
    assert!(
        message.starts_with("profile 1g.5gb does not exist on A100-SXM4-80GB"),
        "{message}"
    );
    assert_eq!(
        (node.geometry(), node.mig_device_uuids()),
        (geometry.clone(), uuids.clone())
    );

    // The same request again (a watch event that changes nothing relevant): not retried, nothing written.
    assert_eq!(lines(&node.reconciled().await), Vec::<String>::new());

    node.label_config("test-too-big");
    node.reconciled().await;
    let message = node.last_error();
    assert!(message.contains("needs 9 memory slices"), "{message}");
    assert_eq!(
        (node.geometry(), node.mig_device_uuids()),
        (geometry, uuids)
    );
}

#[tokio::test]
async fn a_mode_change_that_needs_a_reboot_fails_without_with_reboot_and_rolls_back() {
    let plugin = plugin();
    let mut node = Scenario::asking("h100-80gb:1", &[]);
    node.simulator
        .set_reset_failure(0, Some(ResetFailure::Unsupported))
        .unwrap();
    let before = node.geometry();

    let sent = node.reconciled().await;

    assert_eq!(node.label(MIG_CONFIG_STATE).as_deref(), Some("failed"));
    assert_eq!(
        node.label(&plugin).as_deref(),
        Some("true"),
        "clients restored"
    );
    let message = node.last_error();
    assert!(
        message.contains("set WITH_REBOOT=true (migManager.env)"),
        "{message}"
    );
    assert_eq!(node.geometry(), before, "rolled back");
    let mode = node.simulator.gpu(0).unwrap().mig_mode.unwrap();
    assert!(!mode.current && !mode.pending, "{mode:?}");
    assert_eq!(status_states(&sent), ["pending", "failed"]);
}

#[tokio::test]
async fn with_reboot_the_node_reboots_and_the_change_resumes_after_it() {
    let plugin = plugin();
    let mut node =
        Scenario::asking_with("h100-80gb:1", &[], |settings| settings.with_reboot = true);
    node.simulator
        .set_reset_failure(0, Some(ResetFailure::Unsupported))
        .unwrap();

    let sent = node.reconciled().await;

    assert_eq!(node.label(MIG_CONFIG_STATE).as_deref(), Some("rebooting"));
    assert_eq!(
        node.label(&plugin).as_deref(),
        Some(PAUSED_FOR_MIG_CHANGE),
        "the clients stay paused over the reboot"
    );
    let annotations = node.stored_node().metadata.annotations.unwrap_or_default();
    let record = Progress::from_annotations(&annotations)
        .unwrap()
        .expect("the change's record");
    assert_eq!((record.config.as_str(), record.reboots), ("all-1g.10gb", 1));
    assert_eq!(status_states(&sent), ["pending", "rebooting"]);
    assert_eq!(event_reasons(&sent), ["MigRebooting"]);
    let mode = node.simulator.gpu(0).unwrap().mig_mode.unwrap();
    assert!(
        mode.current,
        "the reboot applied the pending MIG mode: {mode:?}"
    );

    // The restarted agent sees the Node with the record and finishes the change.
    let sent = node.reconciled().await;
    assert_eq!(status_states(&sent), ["pending", "success"]);
    assert_eq!(node.label(MIG_CONFIG_STATE).as_deref(), Some("success"));
    assert_eq!(node.label(&plugin).as_deref(), Some("true"));
    assert_eq!(
        node.geometry()[0].devices,
        [("1g.10gb".to_owned(), 7)].into()
    );
}

#[tokio::test]
async fn a_refused_status_write_is_retried_without_changing_the_gpus_again() {
    let mut node = Scenario::asking("a100-80gb:1", &[]);
    node.api
        .fail_next_holding(Method::PATCH, STATUS_PATH, r#""state":"success""#, 500);

    let error = node.reconcile().await.unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("writing the status of GPUNode node-1: "),
        "{error}"
    );
    assert_eq!(node.label(MIG_CONFIG_STATE).as_deref(), Some("success"));
    let uuids = node.mig_device_uuids();
    assert_eq!(uuids.len(), 7);

    // The run loop retries: the GPUs are found right, the Node as watched already says success, only the status
    // is written.
    let sent = node.reconciled().await;
    assert_eq!(lines(&sent), [format!("PATCH {STATUS_PATH}")]);
    assert_eq!(node.status()["mig"]["state"], "success");
    assert_eq!(
        node.mig_device_uuids(),
        uuids,
        "the GPUs were not changed again"
    );
}

#[tokio::test]
async fn gpu_clients_are_paused_during_a_change_and_restored_when_it_fails() {
    let (plugin, discovery) = (plugin(), discovery());
    let exporter = deploy_label("dcgm-exporter");
    let mut node = Scenario::new(
        "a100-80gb:1",
        &[],
        &[
            (MIG_CONFIG, "all-1g.10gb"),
            (plugin.as_str(), "true"),
            (discovery.as_str(), "true"),
            (exporter.as_str(), "false"),
        ],
    );
    // A process the pods do not account for keeps the GPU busy: its reset fails.
    let process = GpuProcess {
        pid: 42,
        used_memory_mib: Some(100),
        gpu_instance_id: None,
        compute_instance_id: None,
    };
    node.simulator.start_process(0, process).unwrap();

    let sent = node.reconciled().await;

    let paused = &node_patches(&sent)[0]["metadata"]["labels"];
    assert_eq!(paused[&plugin], PAUSED_FOR_MIG_CHANGE);
    assert_eq!(paused[&discovery], PAUSED_FOR_MIG_CHANGE);
    assert!(
        paused[&exporter].is_null(),
        "an admin's false is left alone"
    );
    for (label, value) in [
        (&plugin, "true"),
        (&discovery, "true"),
        (&exporter, "false"),
    ] {
        assert_eq!(node.label(label).as_deref(), Some(value), "{label}");
    }
    assert_eq!(node.label(MIG_CONFIG_STATE).as_deref(), Some("failed"));
    let message = node.last_error();
    assert!(message.starts_with("GPU 0: resetting: in use"), "{message}");
    let mode = node.simulator.gpu(0).unwrap().mig_mode.unwrap();
    assert!(!mode.pending, "the MIG mode went back: {mode:?}");
}

#[tokio::test]
async fn gpu_clients_that_do_not_leave_fail_the_change_and_are_restored() {
    let plugin = plugin();
    let mut node = Scenario::asking_with("a100-80gb:1", &[], |settings| {
        settings.clients_timeout = Duration::from_millis(300)
    });
    node.add_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "nvidia-device-plugin-daemonset-x", "namespace": NAMESPACE,
            "labels": {"app": "nvidia-device-plugin-daemonset"},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "plugin"}]},
    }));
    let before = node.geometry();

    node.reconciled().await;

    assert_eq!(node.label(MIG_CONFIG_STATE).as_deref(), Some("failed"));
    assert_eq!(node.label(&plugin).as_deref(), Some("true"));
    assert_eq!(
        node.last_error(),
        "the GPU clients' pods did not leave within 300ms: gpu-operator/nvidia-device-plugin-daemonset-x"
    );
    assert_eq!(node.geometry(), before, "the GPUs were not touched");
}

/// A node already converged, reporting its state.
fn converged() -> Scenario {
    Scenario::new(
        "a100-80gb:2",
        &[("1g.10gb", 7)],
        &[(MIG_CONFIG, "all-1g.10gb"), (MIG_CONFIG_STATE, "success")],
    )
}

#[tokio::test]
async fn standard_an_unchanged_node_is_not_written() {
    let mut node = converged();
    let api = node.api.clone();
    standard::unchanged_is_not_written(&api, async || {
        node.reconcile().await.map_err(|error| error.to_string())
    })
    .await;
}

/// The GPUNode is the first role's to create; what the MIG manager makes on it is its status.
#[tokio::test]
async fn standard_a_missing_status_is_written() {
    let mut node = converged();
    assert!(node.status().is_null());
    node.reconciled().await;
    assert_eq!(node.status()["mig"]["state"], "success");
    assert_eq!(node.status()["mig"]["config"], "all-1g.10gb");
}

/// The MIG manager leaves the retry of a conflicting write to its run loop: the reconcile fails, the next one
/// writes the same status.
#[tokio::test]
async fn standard_a_conflicting_status_write_is_retried_by_the_next_reconcile() {
    let mut node = converged();
    let api = node.api.clone();
    standard::conflict_is_retried(
        &api,
        Method::PATCH,
        STATUS_PATH,
        Retry::NextPass,
        async || node.reconcile().await.map_err(|error| error.to_string()),
    )
    .await;
    assert_eq!(node.status()["mig"]["state"], "success");
}

#[tokio::test]
async fn standard_a_refused_status_write_is_an_error_naming_the_gpu_node_and_the_reason() {
    let mut node = converged();
    let api = node.api.clone();
    standard::refusals_are_errors(
        &api,
        Method::PATCH,
        STATUS_PATH,
        "GPUNode node-1",
        async || node.reconcile().await.map_err(|error| error.to_string()),
    )
    .await;
}

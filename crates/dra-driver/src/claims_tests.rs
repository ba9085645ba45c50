use std::collections::BTreeMap;

use crd::dra::{GpuSet, Partition};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use node_runtime::testing::simulated;

use super::*;
use crate::slices;
use node_runtime::backend::Gpus;

/// Claims by namespace/name, as the API would answer.
#[derive(Default)]
struct Api(BTreeMap<String, ResourceClaim>);

impl ClaimReader for Api {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        self.0
            .get(&format!("{namespace}/{name}"))
            .cloned()
            .ok_or_else(|| "not found".to_owned())
    }
}

fn result(request: &str, device: &str, consumed: &[(&str, &str)]) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: request.into(),
        driver: DRIVER.into(),
        pool: "node-1".into(),
        device: device.into(),
        share_id: (!consumed.is_empty()).then(|| format!("share-{device}")),
        consumed_capacity: (!consumed.is_empty()).then(|| {
            consumed
                .iter()
                .map(|(key, value)| ((*key).to_owned(), Quantity((*value).to_owned())))
                .collect()
        }),
        ..DeviceRequestAllocationResult::default()
    }
}

fn claim(uid: &str, results: Vec<DeviceRequestAllocationResult>) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some("team".into()),
            name: Some(format!("claim-{uid}")),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: None,
                }),
                ..AllocationResult::default()
            }),
            ..ResourceClaimStatus::default()
        }),
        ..ResourceClaim::default()
    }
}

fn reference(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "team".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

struct Node {
    _gpus: tempfile::TempDir,
    simulator: std::sync::Arc<gpu::Simulator>,
    host_dir: tempfile::TempDir,
    published: Vec<DriverDevice>,
    memory_limit_hook: Option<PathBuf>,
}

impl Node {
    /// Two A100-40GB: GPU 0 whole, GPU 1 shared.
    fn new() -> Self {
        Self::with_driver(None, None)
    }

    /// As [`Node::new`], with driver `version` installed and the toolkit's memory-limit `hook` in use.
    fn with_driver(version: Option<&str>, hook: Option<&str>) -> Self {
        let (gpus, simulator) = simulated("a100-40gb:2", &[]);
        if let Some(version) = version {
            simulator.set_driver_version(version).unwrap();
        }
        let views = node_runtime::inventory::read(simulator.as_ref()).unwrap();
        let partition = Partition {
            dra: GpuSet::All,
            shared: "1".parse().unwrap(),
            dynamic_mig: GpuSet::None,
        };
        Self {
            _gpus: gpus,
            simulator,
            host_dir: tempfile::tempdir().unwrap(),
            published: slices::devices(&views, &partition, &[]),
            memory_limit_hook: hook.map(PathBuf::from),
        }
    }

    fn host(&self) -> HostPaths {
        let root = self.host_dir.path();
        HostPaths {
            cdi_dir: root.join("cdi"),
            mps_root: root.join("mps"),
            dev_root: root.join("dev"),
            checkpoint: root.join("state").join(CHECKPOINT),
            memory_limit_hook: self.memory_limit_hook.clone(),
        }
    }

    fn claims(&self) -> Claims {
        self.claims_in_boot(BOOT)
    }

    fn claims_in_boot(&self, boot_id: &str) -> Claims {
        Claims::open(
            "node-1",
            self.host(),
            Gpus::from_simulator(self.simulator.clone()),
            false,
            boot_id,
        )
        .unwrap()
    }
}

/// An API holding claim `a`, a 1 GiB share of GPU 1, and what preparing it once on `node` gave.
async fn one_share_prepared(node: &Node) -> (Api, Vec<PreparedDevice>) {
    let api = Api(BTreeMap::from([(
        "team/claim-a".to_owned(),
        claim("a", vec![result("gpu", "gpu-1", &[("memory", "1Gi")])]),
    )]));
    let prepared = node
        .claims()
        .prepare(&api, &reference("a"), &node.published)
        .await
        .unwrap();
    (api, prepared)
}

/// The boot the tests' claims are prepared in.
const BOOT: &str = "boot-1";

#[tokio::test]
async fn a_shared_claim_gets_its_consumed_memory_and_cores_as_mps_limits() {
    let node = Node::new();
    let api = Api(BTreeMap::from([(
        "team/claim-a".to_owned(),
        claim(
            "a",
            vec![result(
                "gpu",
                "gpu-1",
                &[("memory", "3000Mi"), ("cores", "30")],
            )],
        ),
    )]));
    let claims = node.claims();
    let devices = claims
        .prepare(&api, &reference("a"), &node.published)
        .await
        .unwrap();
    assert_eq!(devices.len(), 1);
    let limits = devices[0].limits.as_ref().unwrap();
    assert_eq!((limits.memory_mib, limits.cores), (3000, 30));
    assert_eq!(devices[0].share_id.as_deref(), Some("share-gpu-1"));
    assert!(
        limits.mps_dir.join("pipe").is_dir(),
        "the container's mounts need the pipe directory"
    );

    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cdi::path(&node.host().cdi_dir, "a")).unwrap())
            .unwrap();
    let env = spec["devices"][0]["containerEdits"]["env"].to_string();
    assert!(
        env.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3000M"),
        "{env}"
    );
    assert!(
        env.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30"),
        "{env}"
    );
}

#[tokio::test]
async fn a_restarted_driver_answers_from_its_checkpoint_and_never_prepares_twice() {
    let node = Node::new();
    let api = Api(BTreeMap::from([(
        "team/claim-a".to_owned(),
        claim("a", vec![result("gpu", "gpu-0", &[])]),
    )]));
    let first = node
        .claims()
        .prepare(&api, &reference("a"), &node.published)
        .await
        .unwrap();
    assert_eq!(first[0].limits, None, "a whole GPU has no limits");

    // A new driver with the same checkpoint: the claim is known without asking the API (now empty).
    let restarted = node.claims();
    let again = restarted
        .prepare(&Api::default(), &reference("a"), &node.published)
        .await
        .unwrap();
    assert_eq!(again, first);
    assert_eq!(restarted.prepared().await.claims.len(), 1);

    restarted.unprepare("a").await.unwrap();
    restarted.unprepare("a").await.unwrap();
    assert!(node.claims().prepared().await.claims.is_empty());
    assert!(!cdi::path(&node.host().cdi_dir, "a").exists());
}

#[tokio::test]
async fn a_prepare_interrupted_before_its_checkpoint_is_done_again_from_the_start() {
    let node = Node::new();
    let api = Api(BTreeMap::from([(
        "team/claim-a".to_owned(),
        claim(
            "a",
            vec![result("gpu", "gpu-1", &[("memory", "1Gi"), ("cores", "0")])],
        ),
    )]));
    // What a driver stopped after writing the spec leaves behind: a stale spec, no checkpoint entry.
    cdi::write(
        &node.host().cdi_dir,
        "a",
        &serde_json::json!({"stale": true}),
    )
    .unwrap();
    let devices = node
        .claims()
        .prepare(&api, &reference("a"), &node.published)
        .await
        .unwrap();
    assert_eq!(devices[0].limits.as_ref().unwrap().memory_mib, 1024);
    let spec = std::fs::read_to_string(cdi::path(&node.host().cdi_dir, "a")).unwrap();
    assert!(!spec.contains("stale") && spec.contains("claim"), "{spec}");
    assert_eq!(node.claims().prepared().await.claims.len(), 1);
}

#[tokio::test]
async fn replaced_unallocated_and_unknown_claims_are_refused_and_nothing_is_kept() {
    let node = Node::new();
    let mut unallocated = claim("c", vec![]);
    unallocated.status = None;
    let api = Api(BTreeMap::from([
        ("team/claim-a".to_owned(), claim("other", vec![])),
        (
            "team/claim-b".to_owned(),
            claim("b", vec![result("gpu", "gpu-7", &[])]),
        ),
        ("team/claim-c".to_owned(), unallocated),
    ]));
    let claims = node.claims();
    let replaced = claims.prepare(&api, &reference("a"), &node.published).await;
    assert!(
        matches!(replaced, Err(PrepareError::Replaced { ref found, .. }) if found == "other"),
        "{replaced:?}"
    );
    let unknown = claims
        .prepare(&api, &reference("b"), &node.published)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        unknown.contains("device gpu-7") && unknown.contains("delete the pod"),
        "{unknown}"
    );
    let unallocated = claims.prepare(&api, &reference("c"), &node.published).await;
    assert!(matches!(
        unallocated,
        Err(PrepareError::NotAllocated { .. })
    ));
    let missing = claims.prepare(&api, &reference("d"), &node.published).await;
    assert!(matches!(missing, Err(PrepareError::Read { .. })));
    assert!(claims.prepared().await.claims.is_empty());
    assert!(!node.host().checkpoint.exists());
}

#[test]
fn device_nodes_are_only_those_the_host_has() {
    let node = Node::new();
    let claim = claim("a", vec![result("gpu", "gpu-0", &[])]);
    let exists = |path: &str| path.ends_with("/nvidiactl") || path.ends_with("/nvidia0");
    let devices = devices_of(&claim, "node-1", &node.published, &node.host(), &exists).unwrap();
    assert_eq!(devices[0].device_nodes, ["/dev/nvidiactl", "/dev/nvidia0"]);
    let none = devices_of(&claim, "node-1", &node.published, &node.host(), &|_| false).unwrap();
    assert!(none[0].device_nodes.is_empty());
}

#[test]
fn results_of_other_drivers_and_pools_are_not_ours() {
    let node = Node::new();
    let mut foreign = result("nic", "eth0", &[]);
    foreign.driver = "net.example.com".into();
    let mut elsewhere = result("gpu", "gpu-0", &[]);
    elsewhere.pool = "node-2".into();
    let claim = claim(
        "a",
        vec![
            foreign,
            elsewhere,
            result("gpu", "gpu-1", &[("memory", "2Gi")]),
        ],
    );
    let devices = devices_of(&claim, "node-1", &node.published, &node.host(), &|_| false).unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device, "gpu-1");
    let limits = devices[0].limits.as_ref().unwrap();
    assert_eq!((limits.memory_mib, limits.cores), (2048, 0));
}

#[tokio::test]
async fn a_restarted_driver_sets_up_its_prepared_claims_daemons_again() {
    let node = Node::new();
    let api = Api(BTreeMap::from([(
        "team/claim-a".to_owned(),
        claim(
            "a",
            vec![result(
                "gpu",
                "gpu-1",
                &[("memory", "1Gi"), ("cores", "10")],
            )],
        ),
    )]));
    let devices = node
        .claims()
        .prepare(&api, &reference("a"), &node.published)
        .await
        .unwrap();
    let pipe = devices[0].limits.as_ref().unwrap().mps_dir.join("pipe");
    // What a node reboot leaves of /run: nothing.
    std::fs::remove_dir_all(node.host().mps_root).unwrap();
    node.claims().restore_daemons().await;
    assert!(pipe.is_dir(), "the containers' pipe mount exists again");
}

/// The files corrupt checkpoints were moved to, beside the checkpoint.
fn moved_aside(node: &Node) -> Vec<String> {
    let checkpoint = node.host().checkpoint;
    std::fs::read_dir(checkpoint.parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("checkpoint.json.corrupt-"))
        .collect()
}

#[tokio::test]
async fn a_corrupt_checkpoint_is_moved_aside_and_its_claims_are_prepared_again() {
    for (case, contents) in [
        ("empty", &b""[..]),
        ("truncated", &br#"{"claims": {"a": {"namespace": "te"#[..]),
        ("garbage", &[0xde, 0xad, 0xbe, 0xef][..]),
    ] {
        let node = Node::new();
        let api = Api(BTreeMap::from([(
            "team/claim-a".to_owned(),
            claim("a", vec![result("gpu", "gpu-1", &[("memory", "2Gi")])]),
        )]));
        let first = node
            .claims()
            .prepare(&api, &reference("a"), &node.published)
            .await
            .unwrap();
        // What a power loss right after the rename can leave.
        std::fs::write(node.host().checkpoint, contents).unwrap();

        let restarted = node.claims();
        assert!(
            restarted.prepared().await.claims.is_empty(),
            "{case}: the driver starts with no prepared claims"
        );
        assert_eq!(moved_aside(&node).len(), 1, "{case}");
        let again = restarted
            .prepare(&api, &reference("a"), &node.published)
            .await
            .unwrap();
        assert_eq!(again, first, "{case}: prepared again from the claim");
        let checkpoint = Checkpoint::load(&node.host().checkpoint, BOOT).unwrap();
        assert_eq!(
            checkpoint.claims.keys().collect::<Vec<_>>(),
            ["a"],
            "{case}: a valid checkpoint is written"
        );
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(cdi::path(&node.host().cdi_dir, "a")).unwrap())
                .unwrap();
        assert_eq!(spec["devices"][0]["name"], "a-gpu-1", "{case}");
        assert_eq!(moved_aside(&node).len(), 1, "{case}: nothing more moved");
    }
}

#[tokio::test]
async fn an_unprepare_of_a_claim_the_checkpoint_does_not_know_succeeds_and_cleans_up() {
    let node = Node::new();
    one_share_prepared(&node).await;
    // The checkpoint lost: the claim's spec and MPS directories are there, the driver does not know the claim.
    std::fs::write(node.host().checkpoint, b"").unwrap();
    let restarted = node.claims();

    restarted.unprepare("a").await.unwrap();
    assert!(!cdi::path(&node.host().cdi_dir, "a").exists());
    assert!(!node.host().mps_root.join("a").exists());
    restarted.unprepare("never-prepared").await.unwrap();
    assert!(restarted.prepared().await.claims.is_empty());
}

/// A reader whose answer for claim `slow` waits until the test lets it go.
struct SlowApi {
    api: Api,
    release: tokio::sync::Notify,
}

impl ClaimReader for SlowApi {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        if name == "claim-slow" {
            self.release.notified().await;
        }
        self.api.get(namespace, name).await
    }
}

#[tokio::test]
async fn a_slow_read_of_one_claim_does_not_hold_up_another() {
    let node = Node::new();
    let api = SlowApi {
        api: Api(BTreeMap::from([
            (
                "team/claim-slow".to_owned(),
                claim("slow", vec![result("gpu", "gpu-1", &[("memory", "1Gi")])]),
            ),
            (
                "team/claim-fast".to_owned(),
                claim("fast", vec![result("gpu", "gpu-1", &[("memory", "2Gi")])]),
            ),
        ])),
        release: tokio::sync::Notify::new(),
    };
    let claims = node.claims();
    let (slow_claim, fast_claim) = (reference("slow"), reference("fast"));
    let slow = claims.prepare(&api, &slow_claim, &node.published);
    let fast = async {
        let prepared = claims.prepare(&api, &fast_claim, &node.published).await;
        // Only now does the API answer for the slow claim: with the lock held across its read, the fast claim
        // would never have been prepared.
        api.release.notify_one();
        prepared
    };
    let (slow, fast) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        tokio::join!(slow, fast)
    })
    .await
    .expect("the fast claim waited for the slow claim's read");
    assert_eq!(fast.unwrap()[0].limits.as_ref().unwrap().memory_mib, 2048);
    assert_eq!(slow.unwrap()[0].limits.as_ref().unwrap().memory_mib, 1024);
    assert_eq!(
        claims.prepared().await.claims.keys().collect::<Vec<_>>(),
        ["fast", "slow"]
    );
}

#[tokio::test]
async fn on_an_r615_driver_with_the_toolkits_hook_the_driver_holds_a_shared_claims_memory() {
    let hook = "/usr/local/nvidia/toolkit/nvidia-cdi-hook";
    let capped = Node::with_driver(Some("615.10.02"), Some(hook));
    let (_, prepared) = one_share_prepared(&capped).await;
    let limits = prepared[0].limits.as_ref().unwrap();
    assert_eq!(limits.enforcement, crd::dra::MemoryEnforcement::Driver);
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cdi::path(&capped.host().cdi_dir, "a")).unwrap())
            .unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    assert_eq!(edits["hooks"][0]["path"], hook);
    let env = edits["env"].to_string();
    assert!(env.contains("NVIDIA_GPU_MEMORY_LIMIT=1024"), "{env}");
    assert!(!env.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "{env}");

    // An older driver, or no hook: MPS holds it, as before.
    for (version, hook) in [(Some("580.159.04"), Some(hook)), (Some("615.10.02"), None)] {
        let node = Node::with_driver(version, hook);
        let (_, prepared) = one_share_prepared(&node).await;
        assert_eq!(
            prepared[0].limits.as_ref().unwrap().enforcement,
            crd::dra::MemoryEnforcement::MpsPinned,
            "{version:?} {hook:?}"
        );
    }
}

/// A reader whose API server is down, with claims read ahead.
struct ReadAhead(std::sync::Mutex<BTreeMap<String, ResourceClaim>>);

impl ClaimReader for ReadAhead {
    async fn get(&self, _: &str, _: &str) -> Result<ResourceClaim, String> {
        Err("connection refused".to_owned())
    }

    fn read_ahead(&self, uid: &str) -> Option<ResourceClaim> {
        self.0.lock().unwrap().remove(uid)
    }
}

#[tokio::test]
async fn a_claim_read_ahead_is_prepared_without_a_read_and_any_other_is_read() {
    let node = Node::new();
    let reader = ReadAhead(std::sync::Mutex::new(BTreeMap::from([(
        "ahead".to_owned(),
        claim("ahead", vec![result("gpu", "gpu-1", &[("memory", "1Gi")])]),
    )])));
    let claims = node.claims();
    let prepared = claims
        .prepare(&reader, &reference("ahead"), &node.published)
        .await
        .expect("prepared from the claim read ahead");
    assert_eq!(prepared[0].limits.as_ref().unwrap().memory_mib, 1024);
    let error = claims
        .prepare(&reader, &reference("other"), &node.published)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("connection refused"), "{error}");
    assert!(claims.holds("team", "claim-ahead").await);
    assert!(!claims.holds("team", "claim-other").await);
}

#[tokio::test]
async fn a_checkpoint_of_an_earlier_boot_is_dropped_and_its_claims_prepared_again() {
    let node = Node::new();
    let (api, first) = one_share_prepared(&node).await;
    // The reboot: the runtime's CDI directory is on tmpfs, the MPS directories are gone.
    std::fs::remove_dir_all(&node.host().cdi_dir).unwrap();
    std::fs::remove_dir_all(&node.host().mps_root).unwrap();

    let after_reboot = node.claims_in_boot("boot-2");
    assert!(
        after_reboot.prepared().await.claims.is_empty(),
        "the claims of the earlier boot are not taken as prepared"
    );
    let again = after_reboot
        .prepare(&api, &reference("a"), &node.published)
        .await
        .unwrap();
    assert_eq!(again, first);
    assert!(
        cdi::path(&node.host().cdi_dir, "a").exists(),
        "the claim's CDI spec is written again, which an answer from the old checkpoint would not have done"
    );
    assert!(node.host().mps_root.join("a/gpu-1/pipe").is_dir());
    let checkpoint = Checkpoint::load(&node.host().checkpoint, "boot-2").unwrap();
    assert_eq!(checkpoint.boot_id.as_deref(), Some("boot-2"));
    assert_eq!(checkpoint.claims.keys().collect::<Vec<_>>(), ["a"]);
}

#[tokio::test]
async fn a_checkpoint_without_a_boot_keeps_its_claims_as_this_boots() {
    let node = Node::new();
    let (_, first) = one_share_prepared(&node).await;
    // What the driver of 0.1.0 wrote: no boot.
    let mut written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.host().checkpoint).unwrap()).unwrap();
    assert_eq!(written["boot_id"], BOOT, "{written}");
    written.as_object_mut().unwrap().remove("boot_id");
    std::fs::write(node.host().checkpoint, written.to_string()).unwrap();

    let upgraded = node.claims_in_boot("boot-2");
    assert_eq!(upgraded.prepared().await.claims["a"].devices, first);
}

/// An H100 served as MIG on demand: its published placements, and the claims of a driver on it.
struct OnDemandNode {
    node: Node,
}

impl OnDemandNode {
    fn new() -> Self {
        Self::with_shared(GpuSet::None)
    }

    fn with_shared(shared: GpuSet) -> Self {
        use gpu::GpuBackend as _;
        let (gpus, simulator) = simulated("h100-80gb:1", &[]);
        simulator.set_mig_mode(0, true).unwrap();
        simulator.reset(0).unwrap();
        let views = node_runtime::inventory::read(simulator.as_ref()).unwrap();
        let partition = Partition {
            dra: GpuSet::All,
            shared,
            dynamic_mig: GpuSet::All,
        };
        let (dynamic, _) =
            crate::dynamic_mig::observe(simulator.as_ref(), &views, &partition).unwrap();
        Self {
            node: Node {
                _gpus: gpus,
                simulator,
                host_dir: tempfile::tempdir().unwrap(),
                published: slices::devices(&views, &partition, &dynamic),
                memory_limit_hook: None,
            },
        }
    }

    fn device(&self, profile: &str, start: u32) -> String {
        self.node
            .published
            .iter()
            .find(|device| {
                device
                    .on_demand
                    .is_some_and(|on_demand| on_demand.placement.start == start)
                    && device.name.contains(&format!("-mig-{profile}-"))
            })
            .unwrap()
            .name
            .clone()
    }
}

/// Three claims of 1g.10gb, 2g.20gb and 3g.40gb each get an instance of their own, made at prepare, whose MIG
/// device their CDI spec names; unpreparing one destroys its instance only.
#[tokio::test]
async fn claims_of_placements_get_instances_made_at_prepare_and_destroyed_at_unprepare() {
    use gpu::GpuBackend as _;
    let on_demand = OnDemandNode::new();
    let node = &on_demand.node;
    let wanted = [("a", "1g10gb", 6), ("b", "2g20gb", 4), ("c", "3g40gb", 0)];
    let api = Api(wanted
        .iter()
        .map(|(uid, profile, start)| {
            (
                format!("team/claim-{uid}"),
                claim(
                    uid,
                    vec![result("mig", &on_demand.device(profile, *start), &[])],
                ),
            )
        })
        .collect());
    let claims = node.claims();
    let mut uuids = Vec::new();
    for (uid, _, _) in wanted {
        let devices = claims
            .prepare(&api, &reference(uid), &node.published)
            .await
            .unwrap();
        let instance = devices[0].mig_instance.clone().unwrap();
        assert!(devices[0].uuid.starts_with("MIG-"), "{}", devices[0].uuid);
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(cdi::path(&node.host().cdi_dir, uid)).unwrap())
                .unwrap();
        let env = spec["devices"][0]["containerEdits"]["env"].to_string();
        assert!(
            env.contains(&format!("NVIDIA_VISIBLE_DEVICES={}", devices[0].uuid)),
            "{env}"
        );
        uuids.push((devices[0].uuid.clone(), instance));
    }
    let listed: Vec<String> = node
        .simulator
        .mig_devices(0)
        .unwrap()
        .into_iter()
        .map(|device| device.uuid)
        .collect();
    assert_eq!(listed.len(), 3);

    claims.unprepare("b").await.unwrap();
    let left: BTreeSet<u32> = node
        .simulator
        .gpu_instances(0)
        .unwrap()
        .iter()
        .map(|instance| instance.id)
        .collect();
    assert_eq!(
        left,
        BTreeSet::from([uuids[0].1.gpu_instance, uuids[2].1.gpu_instance])
    );
    let still: BTreeSet<String> = node
        .simulator
        .mig_devices(0)
        .unwrap()
        .into_iter()
        .map(|device| device.uuid)
        .collect();
    assert_eq!(
        still,
        BTreeSet::from([uuids[0].0.clone(), uuids[2].0.clone()]),
        "the others' devices are untouched"
    );

    // A driver started again keeps the instances its checkpoint holds and destroys one nobody does.
    let stray = node
        .published
        .iter()
        .find(|device| device.name == on_demand.device("1g10gb", 4))
        .unwrap();
    node.simulator
        .create_gpu_instance(
            0,
            stray.on_demand.unwrap().profile_id,
            stray.on_demand.unwrap().placement,
        )
        .unwrap();
    let restarted = node.claims();
    assert!(restarted.reconcile_instances(vec![0]).await.is_empty());
    assert_eq!(node.simulator.gpu_instances(0).unwrap().len(), 2);
}

/// A placement taken behind the scheduler's back (an instance the driver did not make) fails the prepare with
/// the GPU's reason, and nothing is left made or checkpointed.
#[tokio::test]
async fn a_placement_that_cannot_be_made_fails_the_prepare_and_leaves_nothing() {
    use gpu::GpuBackend as _;
    let on_demand = OnDemandNode::new();
    let node = &on_demand.node;
    let seven = on_demand.device("7g80gb", 0);
    let one = on_demand.device("1g10gb", 6);
    let api = Api(BTreeMap::from([(
        "team/claim-a".to_owned(),
        claim(
            "a",
            vec![result("small", &one, &[]), result("whole", &seven, &[])],
        ),
    )]));
    let claims = node.claims();
    let error = claims
        .prepare(&api, &reference("a"), &node.published)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("creating the GPU instance"), "{error}");
    assert!(
        node.simulator.gpu_instances(0).unwrap().is_empty(),
        "the 1g instance made first is undone"
    );
    assert!(claims.prepared().await.claims.is_empty());
    assert!(!cdi::path(&node.host().cdi_dir, "a").exists());
}

/// On a GPU that shares its instances, two claims of one placement with their own memory get the one instance,
/// each with its MPS limits; it stays while either holds it and goes with the last.
#[tokio::test]
async fn a_shared_instance_is_made_for_its_first_claim_and_destroyed_with_its_last() {
    use gpu::GpuBackend as _;
    let on_demand = OnDemandNode::with_shared(GpuSet::All);
    let node = &on_demand.node;
    let three = on_demand.device("3g40gb", 4);
    assert!(
        node.published
            .iter()
            .any(|device| device.name == three && device.shared)
    );
    let api = Api(BTreeMap::from([
        (
            "team/claim-a".to_owned(),
            claim("a", vec![result("mig", &three, &[("memory", "8Gi")])]),
        ),
        (
            "team/claim-b".to_owned(),
            claim(
                "b",
                vec![result(
                    "mig",
                    &three,
                    &[("memory", "16Gi"), ("cores", "50")],
                )],
            ),
        ),
    ]));
    let claims = node.claims();
    let a = claims
        .prepare(&api, &reference("a"), &node.published)
        .await
        .unwrap();
    let b = claims
        .prepare(&api, &reference("b"), &node.published)
        .await
        .unwrap();
    assert_eq!(node.simulator.gpu_instances(0).unwrap().len(), 1);
    assert_eq!(a[0].uuid, b[0].uuid);
    assert!(a[0].uuid.starts_with("MIG-"), "{}", a[0].uuid);
    let limits = |device: &PreparedDevice| {
        let limits = device.limits.as_ref().unwrap();
        (limits.memory_mib, limits.cores)
    };
    assert_eq!((limits(&a[0]), limits(&b[0])), ((8192, 0), (16384, 50)));
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cdi::path(&node.host().cdi_dir, "b")).unwrap())
            .unwrap();
    let env = spec["devices"][0]["containerEdits"]["env"].to_string();
    assert!(
        env.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16384M"),
        "{env}"
    );

    claims.unprepare("a").await.unwrap();
    assert_eq!(
        node.simulator.gpu_instances(0).unwrap().len(),
        1,
        "b still holds it"
    );
    claims.unprepare("b").await.unwrap();
    assert!(node.simulator.gpu_instances(0).unwrap().is_empty());
}

#[tokio::test]
async fn an_upgraded_driver_takes_the_checkpoint_an_earlier_version_kept_under_the_kubelets_plugins()
 {
    let node = Node::new();
    let (api, first) = one_share_prepared(&node).await;
    let path = node.host().checkpoint;
    // Where the driver of 0.1.0 kept it.
    let legacy = node.host_dir.path().join("plugin").join(CHECKPOINT);
    std::fs::create_dir_all(legacy.parent().unwrap()).unwrap();
    std::fs::rename(&path, &legacy).unwrap();

    Checkpoint::move_from(&legacy, &path).unwrap();
    assert!(
        !legacy.exists(),
        "moved, not copied: a later start reads one checkpoint"
    );
    let upgraded = node.claims();
    assert_eq!(upgraded.prepared().await.claims["a"].devices, first);
    assert_eq!(
        upgraded
            .prepare(&api, &reference("a"), &node.published)
            .await
            .unwrap(),
        first,
        "answered from the moved checkpoint"
    );

    // Both there (the legacy one left by a downgrade and upgrade): the state directory's is the newer.
    std::fs::write(&legacy, "{\"claims\": {}}").unwrap();
    Checkpoint::move_from(&legacy, &path).unwrap();
    assert!(!legacy.exists());
    assert_eq!(node.claims().prepared().await.claims["a"].devices, first);

    // Neither there: nothing to do.
    std::fs::remove_file(&path).unwrap();
    Checkpoint::move_from(&legacy, &path).unwrap();
    assert!(!path.exists());
}

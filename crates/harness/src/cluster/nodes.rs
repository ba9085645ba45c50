//! `cluster add-nodes`: kwok-managed Nodes that look like GPU nodes to the operator (the labels node-feature-discovery
//! would publish, a kubelet-like status) and tell node agents which simulated GPUs to create.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ListParams, ObjectMeta, PostParams};

use super::{api, progress, versions};

/// The annotation that tells node agents which simulated GPUs the node has: `<model>:<count>`.
pub const GPU_SIMULATOR_ANNOTATION: &str = "nvidia.com/gpu.simulator";
/// The annotation kwok is told to look for.
pub const KWOK_NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");
/// The GPU models the simulator knows.
pub const GPU_MODELS: &[&str] = &["a100-40gb", "a100-80gb", "h100-80gb", "h200", "a30"];
/// The container runtime the nodes claim to run.
pub const CONTAINER_RUNTIME: &str = "containerd://2.1.4";
/// How long `add-nodes` waits for kwok to make the new nodes Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Arguments of `cluster add-nodes`.
#[derive(Debug, Clone, clap::Args)]
pub struct AddNodes {
    /// How many nodes to add.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub count: u32,
    /// Simulated GPUs on each node, as MODEL:COUNT (models: docs/mig-catalog.md, e.g. a100-40gb, h100-80gb, b200).
    #[arg(long)]
    pub gpus: GpuSpec,
    /// Operating system of the nodes, as <ID><VERSION_ID>: ubuntu22.04, ubuntu24.04, rhel9.4, rocky9.4, ...
    #[arg(long, default_value = "ubuntu22.04")]
    pub os: OsSpec,
    /// Node names are <PREFIX>-<N>, numbered on from the highest existing N.
    #[arg(long, default_value = "gpu-node")]
    pub prefix: String,
}

/// `--gpus MODEL:COUNT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSpec {
    pub model: String,
    pub count: u32,
}

impl FromStr for GpuSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (model, count) = text
            .split_once(':')
            .ok_or_else(|| format!("expected MODEL:COUNT (e.g. a100-40gb:4), got {text:?}"))?;
        let model = model.trim().to_ascii_lowercase();
        if !GPU_MODELS.contains(&model.as_str()) {
            return Err(format!(
                "unknown GPU model {model:?}; known models: {}",
                GPU_MODELS.join(", ")
            ));
        }
        let count = count
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("GPU count must be a whole number, got {count:?}"))?;
        if count == 0 {
            return Err("GPU count must be at least 1".into());
        }
        Ok(Self { model, count })
    }
}

impl std::fmt::Display for GpuSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.model, self.count)
    }
}

/// The operating-system families we can make a plausible node of.
const OS_FAMILIES: &[&str] = &["ubuntu", "rhel", "rocky", "almalinux", "centos", "sles"];

/// `--os`: an os-release `ID` and `VERSION_ID`, written together (`ubuntu22.04`, `rhel9.4`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OsSpec {
    pub id: String,
    pub version: String,
}

impl FromStr for OsSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim().to_ascii_lowercase();
        let split = text
            .find(|c: char| c.is_ascii_digit())
            .ok_or_else(|| format!("{text:?} has no version (e.g. ubuntu22.04)"))?;
        let (id, version) = text.split_at(split);
        if !OS_FAMILIES.contains(&id) {
            return Err(format!(
                "unknown OS {id:?}; known: {}",
                OS_FAMILIES.join(", ")
            ));
        }
        let valid_version = version
            .split('.')
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
        if !valid_version {
            return Err(format!("OS version {version:?} is not like 22.04 or 9.4"));
        }
        Ok(Self {
            id: id.to_owned(),
            version: version.to_owned(),
        })
    }
}

impl OsSpec {
    fn major(&self) -> &str {
        self.version.split('.').next().unwrap_or_default()
    }

    /// What `/etc/os-release`'s PRETTY_NAME (and so the node's `osImage`) would say.
    pub fn os_image(&self) -> String {
        let version = &self.version;
        match self.id.as_str() {
            "ubuntu" => {
                let point = match version.as_str() {
                    "20.04" => ".6",
                    "22.04" => ".5",
                    "24.04" => ".2",
                    _ => "",
                };
                format!("Ubuntu {version}{point} LTS")
            }
            "rhel" => format!("Red Hat Enterprise Linux {version}"),
            "rocky" => format!("Rocky Linux {version}"),
            "almalinux" => format!("AlmaLinux {version}"),
            "centos" => format!("CentOS Stream {}", self.major()),
            _ => format!("SUSE Linux Enterprise Server {version}"),
        }
    }

    /// A kernel release that this OS version ships.
    pub fn kernel(&self) -> String {
        let el_minor = self.version.split('.').nth(1).unwrap_or("0");
        match (self.id.as_str(), self.major()) {
            ("ubuntu", "18") => "4.15.0-213-generic".into(),
            ("ubuntu", "20") => "5.4.0-200-generic".into(),
            ("ubuntu", "22") => "5.15.0-119-generic".into(),
            ("ubuntu", _) => "6.8.0-45-generic".into(),
            ("sles", _) => "5.14.21-150500.55.65-default".into(),
            (_, "8") => format!("4.18.0-553.el8_{el_minor}.x86_64"),
            (_, "10") => format!("6.12.0-55.9.1.el10_{el_minor}.x86_64"),
            (_, _) => {
                let build = match el_minor {
                    "0" => "70.13.1",
                    "1" => "162.6.1",
                    "2" => "284.11.1",
                    "3" => "362.8.1",
                    "4" => "427.13.1",
                    "5" => "503.11.1",
                    _ => "570.12.1",
                };
                format!("5.14.0-{build}.el9_{el_minor}.x86_64")
            }
        }
    }
}

/// `count` names `<prefix>-<n>`, numbered on from the highest `n` among `existing` (from 0 when there is none).
pub fn next_names(existing: &[String], prefix: &str, count: u32) -> Vec<String> {
    let start = existing
        .iter()
        .filter_map(|name| {
            name.strip_prefix(prefix)?
                .strip_prefix('-')?
                .parse::<u64>()
                .ok()
        })
        .max()
        .map_or(0, |highest| highest + 1);
    (start..start + u64::from(count))
        .map(|index| format!("{prefix}-{index}"))
        .collect()
}

/// A stable 128-bit hex id derived from `seed` (FNV-1a, twice): for machine-id, boot-id and system-uuid.
fn pseudo_id(seed: &str) -> String {
    let fnv = |salt: u8| {
        seed.bytes()
            .chain([salt])
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            })
    };
    format!("{:016x}{:016x}", fnv(1), fnv(2))
}

fn uuid_format(hex: &str) -> String {
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The Node object for one simulated GPU node, status included (the API server keeps a Node's status on create, and
/// kwok's node-initialize stage keeps the capacity and nodeInfo it finds). It carries the Node Feature Discovery
/// labels from the start: kwok runs no containers, so the chart's node-facts pod, which labels a real node, only
/// appears to run here.
pub fn gpu_node(name: &str, request: &AddNodes) -> Node {
    let os = &request.os;
    let labels = BTreeMap::from(
        [
            (
                "feature.node.kubernetes.io/pci-10de.present",
                "true".to_owned(),
            ),
            (
                "feature.node.kubernetes.io/system-os_release.ID",
                os.id.clone(),
            ),
            (
                "feature.node.kubernetes.io/system-os_release.VERSION_ID",
                os.version.clone(),
            ),
            (
                "feature.node.kubernetes.io/kernel-version.full",
                os.kernel(),
            ),
            ("kubernetes.io/hostname", name.to_owned()),
            ("kubernetes.io/os", "linux".to_owned()),
            ("kubernetes.io/arch", "amd64".to_owned()),
            ("type", "kwok".to_owned()),
        ]
        .map(|(key, value)| (key.to_owned(), value)),
    );
    let annotations = BTreeMap::from([
        (
            KWOK_NODE_ANNOTATION.0.to_owned(),
            KWOK_NODE_ANNOTATION.1.to_owned(),
        ),
        (
            GPU_SIMULATOR_ANNOTATION.to_owned(),
            request.gpus.to_string(),
        ),
    ]);
    let resources = BTreeMap::from(
        [("cpu", "32"), ("memory", "256Gi"), ("pods", "110")]
            .map(|(key, value)| (key.to_owned(), Quantity(value.to_owned()))),
    );
    let machine_id = pseudo_id(name);
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                operating_system: "linux".into(),
                os_image: os.os_image(),
                kernel_version: os.kernel(),
                container_runtime_version: CONTAINER_RUNTIME.into(),
                kubelet_version: versions::KUBERNETES.into(),
                kube_proxy_version: String::new(),
                boot_id: uuid_format(&pseudo_id(&format!("{name}/boot"))),
                system_uuid: uuid_format(&machine_id),
                machine_id,
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
    }
}

fn is_ready(node: &Node) -> bool {
    let conditions = node
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref());
    conditions.is_some_and(|conditions| {
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Creates the nodes `request` asks for, with the admin kubeconfig at `kubeconfig`, and waits until kwok has made
/// them Ready. Returns their names.
pub fn add(kubeconfig: &Path, request: &AddNodes) -> anyhow::Result<Vec<String>> {
    let connection = api::Connection::open(kubeconfig)?;
    let nodes = kube::Api::<Node>::all(connection.client.clone());
    let existing: Vec<String> = connection
        .request(nodes.list_metadata(&ListParams::default()))
        .context("cannot list nodes")?
        .items
        .into_iter()
        .filter_map(|node| node.metadata.name)
        .collect();
    let names = next_names(&existing, &request.prefix, request.count);
    progress::step(
        &format!("create {} node(s) with {} GPUs", names.len(), request.gpus),
        |step| {
            for name in &names {
                step.update(name);
                connection
                    .request(nodes.create(&PostParams::default(), &gpu_node(name, request)))
                    .with_context(|| format!("cannot create node {name}"))?;
            }
            Ok(())
        },
    )?;
    let deadline = Instant::now() + READY_TIMEOUT;
    progress::step("wait for kwok to make them Ready", |step| {
        loop {
            let mut waiting = Vec::new();
            for name in &names {
                let node = connection
                    .request(nodes.get(name))
                    .with_context(|| format!("cannot read node {name}"))?;
                if !is_ready(&node) {
                    waiting.push(name.as_str());
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "not Ready after {READY_TIMEOUT:?}: {}; is kwok running?",
                waiting.join(", ")
            );
            step.update(&format!("waiting for {}", waiting.join(", ")));
            std::thread::sleep(Duration::from_millis(500));
        }
    })?;
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gpu_specs() {
        assert_eq!(
            "a100-40gb:4".parse(),
            Ok(GpuSpec {
                model: "a100-40gb".into(),
                count: 4
            })
        );
        assert_eq!(
            "H200:8".parse(),
            Ok(GpuSpec {
                model: "h200".into(),
                count: 8
            })
        );
        assert!(
            "a100-40gb:0"
                .parse::<GpuSpec>()
                .unwrap_err()
                .contains("at least 1")
        );
        assert!(
            "v100:2"
                .parse::<GpuSpec>()
                .unwrap_err()
                .contains("known models: a100-40gb")
        );
        assert!(
            "a30"
                .parse::<GpuSpec>()
                .unwrap_err()
                .contains("MODEL:COUNT")
        );
        assert!(
            "a30:two"
                .parse::<GpuSpec>()
                .unwrap_err()
                .contains("whole number")
        );
        assert_eq!(
            GpuSpec {
                model: "a30".into(),
                count: 1
            }
            .to_string(),
            "a30:1"
        );
    }

    #[test]
    fn splits_os_at_the_first_digit() {
        let os = |text: &str| text.parse::<OsSpec>();
        assert_eq!(
            os("ubuntu22.04"),
            Ok(OsSpec {
                id: "ubuntu".into(),
                version: "22.04".into()
            })
        );
        assert_eq!(
            os("rhel9.4"),
            Ok(OsSpec {
                id: "rhel".into(),
                version: "9.4".into()
            })
        );
        assert_eq!(
            os("Rocky9.4"),
            Ok(OsSpec {
                id: "rocky".into(),
                version: "9.4".into()
            })
        );
        assert!(os("ubuntu").unwrap_err().contains("no version"));
        assert!(os("windows11").unwrap_err().contains("unknown OS"));
        assert!(os("ubuntu22..04").unwrap_err().contains("not like"));
        assert!(os("22.04").unwrap_err().contains("unknown OS"));
    }

    #[test]
    fn kernels_and_images_are_plausible() {
        let os = |text: &str| text.parse::<OsSpec>().unwrap();
        assert_eq!(os("ubuntu22.04").kernel(), "5.15.0-119-generic");
        assert_eq!(os("ubuntu22.04").os_image(), "Ubuntu 22.04.5 LTS");
        assert_eq!(os("ubuntu24.04").kernel(), "6.8.0-45-generic");
        assert_eq!(os("rhel9.4").kernel(), "5.14.0-427.13.1.el9_4.x86_64");
        assert_eq!(os("rocky9.4").os_image(), "Rocky Linux 9.4");
        assert_eq!(os("rhel8.10").kernel(), "4.18.0-553.el8_10.x86_64");
    }

    #[test]
    fn numbers_nodes_after_the_highest_existing_index() {
        let existing = [
            "gpu-node-0",
            "gpu-node-7",
            "gpu-node-x",
            "other-9",
            "gpu-node-2",
        ]
        .map(String::from);
        assert_eq!(
            next_names(&existing, "gpu-node", 2),
            vec!["gpu-node-8", "gpu-node-9"]
        );
        assert_eq!(
            next_names(&[], "gpu-node", 2),
            vec!["gpu-node-0", "gpu-node-1"]
        );
        assert_eq!(
            next_names(&existing, "gpu", 1),
            vec!["gpu-0"],
            "gpu-node-7 is not gpu-<n>"
        );
    }

    #[test]
    fn builds_a_gpu_node() {
        let request = AddNodes {
            count: 1,
            gpus: "h100-80gb:8".parse().unwrap(),
            os: "ubuntu22.04".parse().unwrap(),
            prefix: "gpu-node".into(),
        };
        let node = gpu_node("gpu-node-3", &request);
        let labels = node.metadata.labels.as_ref().unwrap();
        assert_eq!(
            labels["feature.node.kubernetes.io/pci-10de.present"],
            "true"
        );
        assert_eq!(
            labels["feature.node.kubernetes.io/system-os_release.ID"],
            "ubuntu"
        );
        assert_eq!(
            labels["feature.node.kubernetes.io/system-os_release.VERSION_ID"],
            "22.04"
        );
        assert_eq!(
            labels["feature.node.kubernetes.io/kernel-version.full"],
            "5.15.0-119-generic"
        );
        assert_eq!(labels["kubernetes.io/hostname"], "gpu-node-3");
        assert_eq!(labels["type"], "kwok");
        let annotations = node.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["kwok.x-k8s.io/node"], "fake");
        assert_eq!(annotations[GPU_SIMULATOR_ANNOTATION], "h100-80gb:8");
        let status = node.status.as_ref().unwrap();
        assert_eq!(
            status.capacity.as_ref().unwrap()["memory"],
            Quantity("256Gi".into())
        );
        assert_eq!(
            status.allocatable.as_ref().unwrap()["pods"],
            Quantity("110".into())
        );
        let info = status.node_info.as_ref().unwrap();
        assert_eq!(info.container_runtime_version, "containerd://2.1.4");
        assert_eq!(info.kubelet_version, "v1.37.1");
        assert_eq!(info.system_uuid.len(), 36);
        assert_ne!(info.machine_id, pseudo_id("gpu-node-4"));
        assert!(!is_ready(&node));
    }
}

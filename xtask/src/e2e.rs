//! `cargo xtask e2e`: the end-to-end tests against a fresh local cluster. Starts the cluster (building the
//! Kubernetes binaries on first use), adds simulated GPU nodes, builds the binaries under test, runs the
//! `e2e` crate's tests with the cluster's environment, and stops the cluster again.
//!
//! `--real-node` runs the `real_node` suite instead, whose pods are real containers: it starts the cluster's local
//! registry, builds the images and pushes them there (`cargo xtask images --push`), and adds the real node
//! (`cluster add-real-node`), whose containerd pulls them from it, to the fresh cluster. The other suites
//! never run with it, since they start kubelets of their own and only one kubelet can run on a machine.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use harness::cluster::{self, AddNodes, AddRealNode};
use harness::{command, images};

/// The test target (`tests/tests/real_node.rs`) whose pods run on the real node.
const REAL_NODE_SUITE: &str = "real_node";
/// The real node's name and simulated GPUs: the seed guide's four A100s.
const REAL_NODE: &str = "real-node";
const REAL_NODE_GPUS: &str = "a100-40gb:4";

/// Simulated GPU nodes every end-to-end run starts with: two OS pools, two GPU models.
pub fn standard_nodes() -> Vec<AddNodes> {
    let pool = |count, gpus: &str, os: &str, prefix: &str| AddNodes {
        count,
        gpus: gpus.parse().expect("valid --gpus literal"),
        os: os.parse().expect("valid --os literal"),
        prefix: prefix.into(),
    };
    vec![
        pool(2, "a100-40gb:4", "ubuntu22.04", "gpu-a100"),
        pool(1, "h100-80gb:8", "rhel9.4", "gpu-h100"),
    ]
}

/// The binaries the end-to-end tests run as local processes, by package.
const BINARIES: [(&str, &str); 4] = [
    ("operator", "gpu-operator"),
    ("node-agent", "gpu-node-agent"),
    ("device-plugin", "gpu-device-plugin"),
    ("dra-driver", "gpu-dra-driver"),
];

/// Builds workspace binaries (`(package, binary)` pairs) in one cargo run and returns where they are.
pub fn build_binaries(root: &Path, binaries: &[(&str, &str)]) -> anyhow::Result<PathBuf> {
    let mut args = vec!["build", "--locked"];
    for (package, binary) in binaries {
        args.extend(["--package", package, "--bin", binary]);
    }
    command::run(root, &[], &command::cargo(), &args)?;
    let target_dir =
        std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), PathBuf::from);
    Ok(target_dir.join("debug"))
}

pub fn run(
    root: &Path,
    keep_cluster: bool,
    real_node: bool,
    filter: Option<&str>,
) -> anyhow::Result<()> {
    // A fresh cluster per run: no state leaks from an earlier run or a demo.
    cluster::down()?;
    let info = cluster::ensure_up()?;
    // A panic (a library's, say) is an error like any other: the cluster still goes down below, since its processes
    // would otherwise keep running and keep the e2e lock their parent took.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if real_node {
            run_real_node_tests(root, &info, filter)
        } else {
            run_tests(root, &info, filter)
        }
    }))
    .unwrap_or_else(|_| Err(anyhow::anyhow!("the end-to-end run panicked (see above)")));
    if keep_cluster {
        println!(
            "the cluster is still up: eval \"$(cargo xtask cluster env)\"; stop it with `cargo xtask cluster down`"
        );
    } else {
        cluster::down()?;
    }
    result
}

fn run_tests(root: &Path, info: &cluster::ClusterInfo, filter: Option<&str>) -> anyhow::Result<()> {
    for pool in standard_nodes() {
        cluster::add_nodes(&pool)?;
    }
    let bin_dir = build_binaries(root, &BINARIES)?;
    let env = test_env(root, info, &bin_dir)?;
    // The switch suite installs NVIDIA's chart and runs NVIDIA's operator through the harness, which finds them
    // in the cache: built here, before any test's clock starts.
    cluster::nvidia_gpu_operator()?;
    // The oldest-Kubernetes suite starts the API server of the oldest version the chart claims beside the cluster.
    cluster::oldest_api_server_binary()?;
    let suites = suites(root)?;
    let mut args = vec!["test", "--locked", "--no-fail-fast", "--package", "e2e"];
    for suite in &suites {
        args.extend(["--test", suite]);
    }
    args.extend(["--", "--ignored", "--show-output", "--test-threads=1"]);
    args.extend(filter);
    command::run_tests(root, &env, &args)
}

/// The environment of the end-to-end suites on the running cluster `info`: the cluster's, the binaries under test
/// in `bin_dir` (workspace binaries and the fake runtime, built into it here), the real kubelet, the audit log.
pub fn test_env(
    root: &Path,
    info: &cluster::ClusterInfo,
    bin_dir: &Path,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut env = cluster::env_vars(info);
    env.push((
        "E2E_OPERATOR_BIN".into(),
        bin_dir.join("gpu-operator").display().to_string(),
    ));
    env.push((
        "E2E_NODE_AGENT_BIN".into(),
        bin_dir.join("gpu-node-agent").display().to_string(),
    ));
    env.push((
        "E2E_DEVICE_PLUGIN_BIN".into(),
        bin_dir.join("gpu-device-plugin").display().to_string(),
    ));
    env.push((
        "E2E_DRA_DRIVER_BIN".into(),
        bin_dir.join("gpu-dra-driver").display().to_string(),
    ));
    let fake_cri = bin_dir.join("fake-cri");
    cluster::build_go_binary(&root.join("tests/fake-cri"), &fake_cri)?;
    env.push(("E2E_FAKE_CRI_BIN".into(), fake_cri.display().to_string()));
    env.push((
        "E2E_KUBELET_BIN".into(),
        info.bin_dir.join("kubelet").display().to_string(),
    ));
    env.push(("E2E_REPO_ROOT".into(), root.display().to_string()));
    env.push((
        "E2E_AUDIT_LOG".into(),
        info.audit_log().display().to_string(),
    ));
    Ok(env)
}

/// The e2e crate's test targets (`tests/tests/*.rs`) but the real-node suite.
fn suites(root: &Path) -> anyhow::Result<Vec<String>> {
    let dir = root.join("tests/tests");
    let mut suites = Vec::new();
    for entry in
        std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?
    {
        let path = entry?.path();
        if path.extension().is_some_and(|extension| extension == "rs")
            && let Some(stem) = path.file_stem().and_then(|stem| stem.to_str())
            && stem != REAL_NODE_SUITE
        {
            suites.push(stem.to_owned());
        }
    }
    suites.sort();
    Ok(suites)
}

/// The path under the local registry that the images are pushed to: the chart's default repository's
/// (`ghcr.io/gpu-operator-rs`), so that `global.imageRegistry` alone points the chart at them.
const REGISTRY_PREFIX: &str = "gpu-operator-rs";

/// The real node, and where its images are.
#[derive(Debug)]
pub struct RealNodeWithImages {
    pub node: cluster::RealNode,
    /// What `cargo xtask images` built and pushed.
    pub images_json: PathBuf,
    /// The local registry's address (`127.0.0.1:<port>`): the chart's `global.imageRegistry`.
    pub registry: String,
}

/// How the real node's images are built: unoptimised, since the tests check what the images do, not how fast,
/// and a cold CI run builds both platforms beside the end-to-end tests (`cargo xtask images` builds releases).
pub const IMAGES_PROFILE: images::Profile = images::Profile::Test;

/// Starts the local registry, builds the images and pushes them to it (`cargo xtask images --push`), and adds
/// the real node, on simulated A100s, pulling from it.
pub fn add_real_node_with_images(root: &Path) -> anyhow::Result<RealNodeWithImages> {
    let registry = cluster::start_registry()?;
    let built = images::run(
        root,
        &images::Args {
            push: Some(format!("{registry}/{REGISTRY_PREFIX}").parse()?),
            profile: IMAGES_PROFILE,
            ..images::Args::default()
        },
    )?;
    let images_json = built
        .first()
        .and_then(|image| image.archive.parent())
        .context("cargo xtask images built nothing")?
        .join("images.json");
    let node = cluster::add_real_node(&AddRealNode {
        name: REAL_NODE.into(),
        gpus: Some(REAL_NODE_GPUS.parse().expect("valid --gpus literal")),
        images: images_json.parent().map(Path::to_path_buf),
        insecure_registry: vec![registry.clone()],
    })?;
    Ok(RealNodeWithImages {
        node,
        images_json,
        registry,
    })
}

/// Builds the images, adds the real node, and runs the real-node suite.
fn run_real_node_tests(
    root: &Path,
    info: &cluster::ClusterInfo,
    filter: Option<&str>,
) -> anyhow::Result<()> {
    let RealNodeWithImages {
        node,
        images_json,
        registry,
    } = add_real_node_with_images(root)?;
    // The suite reports the pods' processes to the simulator with the node agent's `simulator` tool.
    let bin_dir = build_binaries(root, &[("node-agent", "gpu-node-agent")])?;
    let mut env = cluster::env_vars(info);
    env.push((
        "E2E_NODE_AGENT_BIN".into(),
        bin_dir.join("gpu-node-agent").display().to_string(),
    ));
    env.push((
        "E2E_REAL_NODE_CONTAINERD_SOCKET".into(),
        node.socket.display().to_string(),
    ));
    env.push(("E2E_REAL_NODE".into(), node.node));
    env.push((
        "E2E_REAL_NODE_KUBELET_ROOT".into(),
        node.kubelet_root.display().to_string(),
    ));
    env.push(("E2E_IMAGES_JSON".into(), images_json.display().to_string()));
    env.push(("E2E_IMAGE_REGISTRY".into(), registry));
    env.push(("E2E_REPO_ROOT".into(), root.display().to_string()));
    let mut args = vec![
        "test",
        "--locked",
        "--package",
        "e2e",
        "--test",
        REAL_NODE_SUITE,
        "--",
        "--ignored",
        "--show-output",
        "--test-threads=1",
    ];
    args.extend(filter);
    command::run_tests(root, &env, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_run_takes_every_suite_but_the_real_node_one() {
        let suites = suites(&harness::workspace_root()).unwrap();
        assert!(suites.contains(&"operator".to_owned()), "{suites:?}");
        assert!(suites.contains(&"device_plugin".to_owned()), "{suites:?}");
        assert!(!suites.contains(&REAL_NODE_SUITE.to_owned()), "{suites:?}");
    }
}

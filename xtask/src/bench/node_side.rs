//! The node side: every role of a GPU node (the node agent's roles, the device plugin, the DRA driver) as a release
//! process on one real kubelet's node, at rest, loaded and through a MIG change. The measurement is the end-to-end
//! suite `node_side` (where the real kubelet, its fake runtime and the roles' pod-bound tokens are), run here on
//! the release binaries (300 s at rest, 60 s loaded and through the MIG change); it writes [`NodeSide`], which
//! this wraps with the commit and date.

use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::report::Environment;
use super::say;
use harness::cluster::{self, ClusterInfo};
use harness::command;
use harness::node_side::{NodeSide, OUT_VAR, REST_VAR, WINDOW_VAR};

/// The loaded and MIG change windows: long enough for four scrapes and the roles' slowest timer (discovery's 60 s).
const WINDOW_SECONDS: u64 = 60;
/// The rest window: a watch ends after about five minutes and starts again, which is most of what a role asks at
/// rest.
const REST_SECONDS: u64 = 300;
const SUITE: &str = "node_side";

/// What `cargo xtask bench` records of the node side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSideBench {
    pub commit: String,
    pub date: String,
    pub measured: NodeSide,
}

/// Runs the `node_side` suite on the running cluster `info` with the release binaries `run` built.
fn measure(
    root: &Path,
    info: &ClusterInfo,
    environment: &Environment,
) -> anyhow::Result<NodeSideBench> {
    let release = command::target_dir(root).join("release");
    let mut env = crate::e2e::test_env(root, info, &release)?;
    let out = info.state_dir.join("node-side.json");
    let _ = std::fs::remove_file(&out);
    env.push((OUT_VAR.into(), out.display().to_string()));
    env.push((WINDOW_VAR.into(), WINDOW_SECONDS.to_string()));
    env.push((REST_VAR.into(), REST_SECONDS.to_string()));
    say(format!(
        "node side: every role on one node, {REST_SECONDS} s at rest, {WINDOW_SECONDS} s loaded and through a MIG \
         change"
    ));
    command::run_tests(
        root,
        &env,
        &[
            "test",
            "--locked",
            "--package",
            "e2e",
            "--test",
            SUITE,
            "--",
            "--ignored",
            "--show-output",
        ],
    )?;
    let measured: NodeSide = serde_json::from_slice(
        &std::fs::read(&out).with_context(|| format!("the suite wrote no {}", out.display()))?,
    )
    .context("the node side's figures")?;
    Ok(NodeSideBench {
        commit: environment.commit.clone(),
        date: environment.date.clone(),
        measured,
    })
}

/// On a fresh cluster, then stops it.
pub fn measure_on_fresh_cluster(
    root: &Path,
    environment: &Environment,
) -> anyhow::Result<NodeSideBench> {
    cluster::down()?;
    let info = cluster::ensure_up()?;
    // The kwok nodes the end-to-end run has: the chart's operator pod needs a node to run on before the install
    // is done.
    for pool in crate::e2e::standard_nodes() {
        cluster::add_nodes(&pool)?;
    }
    let measured = measure(root, &info, environment);
    cluster::down()?;
    measured
}

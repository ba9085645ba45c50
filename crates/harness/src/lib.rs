//! The test harness as a library, used by `cargo xtask` (its command line) and by the end-to-end tests alike, so
//! that each part exists once:
//! - [`cluster`]: the local Kubernetes cluster built from its Go modules (control plane, kwok's simulated nodes,
//!   the real node with containerd, the local registry), its state and how to reach it;
//! - [`images`]: the operator's container images for linux/amd64 and linux/arm64, built and pushed as OCI
//!   indexes;
//! - [`node_side`]: what the node side's measurement records;
//! - [`operators`]: this operator and NVIDIA's as processes on that cluster;
//! - [`apt`] and [`command`]: the Debian packages and the commands both need;
//! - [`test_report`]: which tests of a `cargo test` run failed, and why;
//! - [`proc_stats`]: a process's memory and CPU time, for the benchmarks.

pub mod apt;
pub mod cluster;
pub mod command;
pub mod images;
pub mod node_side;
pub mod operators;
pub mod proc_stats;
pub mod test_report;

use std::path::{Path, PathBuf};

/// The repository's root: the nearest directory at or above the running crate's that holds the workspace's
/// Cargo.toml. The crate comes from `CARGO_MANIFEST_DIR` as cargo sets it for `cargo run` and `cargo test` (the
/// checkout the command runs in); this library's compile-time directory is only a fallback, because two
/// checkouts sharing one cargo target directory share one build of it.
pub fn workspace_root() -> PathBuf {
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    start
        .ancestors()
        .find(|dir| is_workspace_root(dir))
        .map_or(start.clone(), Path::to_path_buf)
}

fn is_workspace_root(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("Cargo.toml"))
        .is_ok_and(|manifest| manifest.lines().any(|line| line.trim() == "[workspace]"))
}

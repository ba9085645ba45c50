//! What the node side's measurement records: each role of a GPU node (the node agent's roles, the device plugin,
//! the DRA driver) as a process on one real kubelet's node, at rest and under load. The end-to-end suite
//! `node_side` measures and writes it; `cargo xtask bench --node-side-only` runs that suite on release binaries and
//! reports it.

use serde::{Deserialize, Serialize};

use crate::cluster::audit::Requests;

/// Where the `node_side` suite writes its [`NodeSide`] (JSON), when set.
pub const OUT_VAR: &str = "E2E_NODE_SIDE_OUT";
/// The length of the loaded and MIG change windows in seconds (the suite's default is short, to keep the
/// end-to-end run quick).
pub const WINDOW_VAR: &str = "E2E_NODE_SIDE_WINDOW_SECONDS";
/// The length of the rest window in seconds: requests at rest are mostly watches that end after about five
/// minutes and start again, so a window of a minute catches them by chance.
pub const REST_VAR: &str = "E2E_NODE_SIDE_REST_SECONDS";

/// One node's roles, measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSide {
    /// The node's simulated GPUs, e.g. `h100-80gb:8`.
    pub gpus: String,
    /// Pods holding GPUs in the loaded window (time-sliced through the device plugin, and shares through DRA).
    pub plugin_pods: u32,
    pub dra_pods: u32,
    /// Seconds between two scrapes of the exporter, all through the measurement.
    pub scrape_interval_seconds: u64,
    /// Seconds of the rest window.
    pub rest_seconds: u64,
    /// Seconds of the loaded and MIG change windows.
    pub window_seconds: u64,
    /// Seconds the MIG change took, from the label to `nvidia.com/mig.config.state=success`.
    pub mig_change_seconds: f64,
    pub mig_config: String,
    pub roles: Vec<RoleUsage>,
}

/// One role's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleUsage {
    /// What users know it as, e.g. `device plugin`.
    pub role: String,
    /// The command line's start, e.g. `gpu-device-plugin run`.
    pub command: String,
    /// Whether the chart's default install runs it on a GPU node.
    pub default_install: bool,
    pub at_rest: Phase,
    /// While the pods arrive, their processes run and the exporter is scraped.
    pub loaded: Phase,
    /// While the MIG manager changes the node's geometry.
    pub mig_change: Phase,
    /// The highest RSS since the process started.
    pub peak_rss_mib: f64,
    /// Its requests to the API server in the rest window, as the audit log counts them.
    pub requests_at_rest: Requests,
}

/// CPU and memory over one window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// CPU time per wall-clock second over the window, in percent of one core.
    pub cpu_percent: f64,
    /// RSS at the window's end.
    pub rss_mib: f64,
}

impl NodeSide {
    /// The roles of the chart's default install (what every GPU node runs without options).
    pub fn default_install(&self) -> impl Iterator<Item = &RoleUsage> {
        self.roles.iter().filter(|role| role.default_install)
    }

    /// What one node of the default install sends the API server at rest, per minute, over all its roles.
    pub fn default_install_requests_per_minute(&self) -> f64 {
        self.default_install()
            .map(|role| role.requests_per_minute(self.rest_seconds))
            .sum()
    }
}

impl RoleUsage {
    /// Requests per minute at rest.
    pub fn requests_per_minute(&self, rest_seconds: u64) -> f64 {
        per_minute(self.requests_at_rest.total(), rest_seconds)
    }

    /// Writes per minute at rest, leases included.
    pub fn writes_per_minute(&self, rest_seconds: u64) -> f64 {
        per_minute(
            self.requests_at_rest.writes() + self.requests_at_rest.lease_writes(),
            rest_seconds,
        )
    }
}

fn per_minute(count: u64, seconds: u64) -> f64 {
    count as f64 * 60.0 / seconds.max(1) as f64
}

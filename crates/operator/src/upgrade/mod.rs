//! Driver upgrades: each GPU node whose driver pod runs an old revision of its (OnDelete) driver DaemonSet goes
//! through NVIDIA's states in the `nvidia.com/gpu-driver-upgrade-state` label, a few nodes at a time.
//!
//! - `settings`: `driver.upgradePolicy`, checked (pure).
//! - `decide`: the state machine's plan for every node: slots, transitions, what to report (pure).
//! - `states`: one node's decision in its state (pure).
//! - `facts`: what the cluster's objects say of each node, for `decide` (pure).
//! - `groups`: which upgrade policy (the ClusterPolicy's or an NVIDIADriver's) governs which driver DaemonSets
//!   (pure).
//! - `controller`: the passes: watches, the caches read into facts, a plan asked of `decide` and carried out.
//! - `pods`: a node's pods listed for the drain (I/O).
//! - `steps`: a node's step carried out: cordon, evictions, pod deletions, its next state (I/O).
//! - `report`: Events, GPUNode and ClusterPolicy status, metrics (I/O).
//! - `spacing`: the least time between two passes.

pub mod controller;
pub mod decide;
#[cfg(test)]
mod decide_tests;
pub mod facts;
pub mod groups;
mod kept;
mod pods;
mod report;
pub mod settings;
mod spacing;
mod states;
mod steps;

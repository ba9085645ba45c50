//! The GPU operator's cluster controller: observe -> validate -> render -> apply -> status.
//!
//! - `model`: pure types: components, the validated policy, the observed cluster facts.
//! - `plan`: pure planning: node labels, the ClusterPolicy status.
//! - `render`: pure rendering of every operand.
//! - `apply`, `controller`, `leader`, `crd_install`, `uninstall`: cluster I/O at the edge.
//! - `upgrade`: driver upgrades, NVIDIA's per-node states (a pure state machine and its controller).
//! - `handover`: taking over NVIDIA's operand DaemonSets in place after a switch from NVIDIA's operator.
//! - `webhook`: the HAMi admission webhook (pure conversion, its TLS and its server).

pub mod apply;
pub mod controller;
pub mod crd_install;
pub mod handover;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod render;
pub mod render_command;
pub mod shared_watch;
pub mod telemetry;
pub mod uninstall;
pub mod upgrade;
pub mod webhook;

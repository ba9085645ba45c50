//! API types of the GPU operator: the `ClusterPolicy` and `GPUNode` custom resources, the device-plugin and MIG
//! configuration file formats, the MIG profile catalog, and the names of the labels, annotations, host paths, field
//! managers and enums the parts agree on, and the one shape of a Node label and annotation change (`node_patch`,
//! written by the operator and the node agents alike); plus the pure decisions that several parts must make alike (which
//! device-plugin config and MIG strategy a node runs with: `config::device_plugin::node_config`; HAMi's request
//! grammar, `hami`, and where such requests land on the devices DRA drivers publish, `planner`). No client, no
//! I/O: every other crate depends on this one.

pub mod cluster_policy;
pub mod config;
pub mod crds;
pub mod dra;
pub mod driver_upgrade;
pub mod gpu_node;
pub mod hami;
pub mod labels;
pub mod mig;
pub mod node_patch;
pub mod nvidia_driver;
pub mod paths;
pub mod planner;
pub mod quantity;

pub use cluster_policy::{ClusterPolicy, ClusterPolicySpec, ClusterPolicyStatus};
pub use gpu_node::{GPUNode, GpuNodeSpec, GpuNodeStatus};

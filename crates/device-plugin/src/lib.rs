//! The kubelet device plugin, `gpu-device-plugin`: registers whole GPUs, MIG devices and shared replicas with the
//! kubelet, follows config, MIG and health changes without a restart, and reports into GPUNode status.
//!
//! Decisions are pure functions: [`plan`] (what is advertised), [`allocate`] (what a container gets),
//! [`preferred`] (which devices to give), [`cdi`] (the CDI spec),
//! [`mps::daemons`] (which MPS daemons run). Which config a node uses and the MIG strategy in effect are decided by
//! `crd::config::device_plugin::node_config`, as feature discovery decides them. I/O sits at the edge: [`server`]
//! (gRPC per resource), [`kubelet`] (registration, kubelet.sock watch), [`manager`] (the main loop), [`cluster`]
//! (Node, ConfigMap and GPUNode), [`mps`] (control daemons). What it shares with the node agent (GPU source and
//! inventory, own-Node and GPUNode I/O, the run loop, logging, gRPC over unix sockets) is the `node-runtime` crate.

pub mod allocate;
pub mod api;
pub mod cdi;
pub mod cli;
pub mod cluster;
pub mod kubelet;
pub mod manager;
pub mod mps;
pub mod plan;
pub mod preferred;
pub mod server;

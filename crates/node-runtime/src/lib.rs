//! What every node-side binary shares: `gpu-node-agent`, `gpu-device-plugin` and `gpu-dra-driver` depend on this
//! crate and never on each other.
//!
//! - [`backend`]: which GPUs a process works on, NVML or the simulator (`--simulate`, `--sim-state`).
//! - [`inventory`]: one reading of the node's GPUs, and the GPUNode fields derived from it (pure).
//! - [`kube_io`]: the own Node (read, watch, merge-patch its labels and annotations with `crd::node_patch`), one
//!   ConfigMap, Events on the Node.
//! - [`gpunode`]: the node's GPUNode, each binary writing its own fields by server-side apply.
//! - [`start`]: what every role does first (its node and namespace on the command line, client, own Node, GPUs).
//! - [`run_loop`]: the watch-driven loop every role runs, with its one [`Backoff`].
//! - [`process`]: logging (text or JSON), the stop signals and the exit status.
//! - [`grpc`]: a gRPC channel over a unix socket (the kubelet's device-plugin and pod-resources APIs).
//! - [`host`]: the host's PCI devices, OS release and kernel, as Node Feature Discovery reads them.
//! - [`health`]: which GPUs are Unhealthy, from their XIDs (pure), as the device plugin and the DRA driver judge it.
//! - [`mps`]: MPS control daemons with per-client limits as their defaults.
//! - [`state_file`]: files written atomically and durably, and read back with a corrupt one moved aside.
//! - `testing` (feature `testing`): a simulated node for the binaries' unit tests.

pub mod backend;
pub mod gpunode;
pub mod grpc;
pub mod health;
pub mod host;
pub mod inventory;
pub mod kube_io;
pub mod mps;
pub mod process;
pub mod run_loop;
pub mod start;
pub mod state_file;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use run_loop::Backoff;

//! The GPU seen through one trait, [`GpuBackend`], with two backends and a pure MIG planner.
//!
//! - [`nvml::NvmlBackend`] (feature `nvml`, on by default) talks to the driver through NVML, loaded at run time, so
//!   the crate builds and its users start on machines without a driver (they get [`GpuError::LibraryNotFound`]).
//! - [`simulator::Simulator`] answers from a state file shared by all processes of a simulated node, with the real
//!   MIG tables of the catalog in `crd::mig`, and faults a test can inject.
//! - [`planner`] turns a mig-parted config entry into explicit create/destroy steps for one GPU, and decides which
//!   GPUs of a node need a MIG mode change (and so a reset).
//!
//! Data flows one way: the planner reads what a backend reports ([`backend::current_geometry`]) and returns a plan;
//! [`apply_plan`] carries it out through the same backend.

pub mod backend;
pub mod compute;
pub mod error;
pub mod host_process;
#[cfg(feature = "nvml")]
pub mod nvml;
pub mod planner;
pub mod simulator;
pub mod types;

pub use backend::{GPU_INSTANCE_PROFILE_INDEX_COUNT, GpuBackend, apply_plan, current_geometry};
pub use error::{GpuError, Result};
pub use host_process::HostProcess;
pub use planner::{ExistingInstance, MigPlan, PlanError, plan};
pub use simulator::{SimulatedCounters, SimulatedGpus, Simulator};
pub use types::{
    ComputeInstance, CudaVersion, GpuDetails, GpuInstance, GpuInstanceProfileInfo, GpuInventory,
    GpuProcess, HealthEvent, MemoryErrors, MigDevice, MigEngines, MigMode, NvLinkCounters,
    Placement, Telemetry, ThrottleTimes,
};

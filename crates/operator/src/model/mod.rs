//! The operator's pure core model: components, the validated policy, and the observed cluster facts.

pub mod component;
pub mod facts;
pub mod placement;
pub mod policy;

pub use component::Component;
pub use facts::{AssignedDriver, ClusterFacts, ContainerRuntime, GpuNodeFacts, OsPool};
pub use policy::{DefaultImages, ValidateError, ValidatedPolicy, validate};

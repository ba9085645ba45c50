//! The GPU operator's cluster controller. Today it owns its CustomResourceDefinitions: it applies them at
//! start so that upgrading the operator (`helm upgrade`) upgrades their schemas, which Helm itself never does.

pub mod crd_install;
pub mod model;
pub mod plan;
pub mod render;
pub mod health;
pub mod telemetry;

//! Pure planning: which node labels change, and what the ClusterPolicy status says.

pub mod labels;
pub mod status;

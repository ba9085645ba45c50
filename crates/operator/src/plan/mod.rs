//! Pure planning: which node labels change, which named ConfigMaps are wrong, and what the status says.

pub mod configs;
pub mod labels;
pub mod status;

//! Pure planning: which NVIDIADriver drives which node, which node labels change, which named ConfigMaps are wrong, and what the status says.

pub mod configs;
pub mod driver_assignment;
pub mod labels;
pub mod nvidia_driver_status;
pub mod status;

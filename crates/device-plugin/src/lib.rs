//! The kubelet device plugin, `gpu-device-plugin`.

pub mod api;
pub mod plan;

//! The kubelet device plugin, `gpu-device-plugin`.

pub mod allocate;
pub mod api;
pub mod cdi;
pub mod health;
pub mod kubelet;
pub mod plan;
pub mod preferred;
pub mod server;

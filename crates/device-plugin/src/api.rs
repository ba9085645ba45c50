//! The kubelet's device plugin API, v1beta1, generated at build time from `proto/deviceplugin.proto`, and the
//! constants of its contract.

#![allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]

tonic::include_proto!("v1beta1");

/// The API version sent in `RegisterRequest`.
pub const VERSION: &str = "v1beta1";
/// The kubelet's registration socket, inside the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Where the device-plugin sockets live, under the kubelet's root directory.
pub const DEVICE_PLUGINS_DIR: &str = "device-plugins";
/// The health of a usable device.
pub const HEALTHY: &str = "Healthy";
/// The health of a device that must not be allocated.
pub const UNHEALTHY: &str = "Unhealthy";

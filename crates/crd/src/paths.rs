//! Host paths the operator mounts into its DaemonSets and the node binaries use by default: one spelling, so that
//! a rendered mount and a binary's default cannot drift apart.

/// The kubelet's root directory (`hostPaths.kubeletRootDir` by default); its `device-plugins/` and
/// `pod-resources/` folders hold the kubelet's sockets.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";
/// Where the validator writes its ready files, which every operand's init container waits for.
pub const VALIDATIONS_DIR: &str = "/run/nvidia/validations";
/// Root of the MPS control daemons' pipe and log folders (`devicePlugin.mps.root` by default).
pub const MPS_ROOT: &str = "/run/nvidia/mps";
/// Where CDI specifications are written for the container runtime to read.
pub const CDI_DIR: &str = "/var/run/cdi";

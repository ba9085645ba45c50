//! Host paths the operator mounts into its DaemonSets and the node binaries use by default: one spelling, so that
//! a rendered mount and a binary's default cannot drift apart.

/// The kubelet's root directory (`hostPaths.kubeletRootDir` by default); its `pod-resources/` folder holds the
/// kubelet's pod-resources socket.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";
/// Where the kubelet serves device-plugin registration: a path the kubelet fixes whatever its `--root-dir`
/// (`pluginapi.KubeletSocket` in its device manager), so `hostPaths.kubeletRootDir` does not move it.
pub const DEVICE_PLUGINS_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Where the validator writes its ready files, which every operand's init container waits for.
pub const VALIDATIONS_DIR: &str = "/run/nvidia/validations";
/// Root of the MPS control daemons' pipe and log folders (`devicePlugin.mps.root` by default).
pub const MPS_ROOT: &str = "/run/nvidia/mps";
/// The DRA driver's state for this boot (its checkpoint of prepared claims): on the host's tmpfs, cleared at boot
/// as the CDI specs, MPS daemons and MIG instances it describes are.
pub const DRA_STATE_DIR: &str = "/run/nvidia/dra-driver";
/// Where CDI specifications are written for the container runtime to read.
pub const CDI_DIR: &str = "/var/run/cdi";

//! Names the DRA driver, the chart's DeviceClasses, the HAMi admission webhook, the watchdog and the exporter agree
//! on. The driver, attribute and class names are NVIDIA's DRA driver's (`gpu.nvidia.com`), so that claims written
//! for it work here; the shared class and the `cores` capacity are ours.

/// The DRA driver's name: ResourceSlices' `spec.driver`, allocation results' `driver`, and the attribute domain.
pub const DRIVER: &str = "gpu.nvidia.com";

/// Device attribute: `gpu` for a whole GPU (shared or not), `mig` for a MIG device.
pub const ATTRIBUTE_TYPE: &str = "type";
/// Device attribute: the GPU's or MIG device's UUID.
pub const ATTRIBUTE_UUID: &str = "uuid";
/// Device attribute: NVML's product name, e.g. `NVIDIA A100-SXM4-40GB`.
pub const ATTRIBUTE_PRODUCT_NAME: &str = "productName";
/// Device attribute: the GPU family, e.g. `ampere`.
pub const ATTRIBUTE_ARCHITECTURE: &str = "architecture";
/// Device attribute (version): the CUDA compute capability, e.g. `8.0.0`.
pub const ATTRIBUTE_CUDA_COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
/// Device attribute (version): the kernel driver's version, e.g. `550.54.15`.
pub const ATTRIBUTE_DRIVER_VERSION: &str = "driverVersion";
/// Device attribute (version): the CUDA version the driver supports, e.g. `12.4.0`.
pub const ATTRIBUTE_CUDA_DRIVER_VERSION: &str = "cudaDriverVersion";
/// MIG device attribute: its profile, e.g. `1g.5gb`.
pub const ATTRIBUTE_MIG_PROFILE: &str = "profile";
/// MIG device attribute: the UUID of the GPU it is carved from.
pub const ATTRIBUTE_PARENT_UUID: &str = "parentUUID";
/// Device attribute (int): the GPU's index on its node (NVML's).
pub const ATTRIBUTE_INDEX: &str = "index";

/// `type` of a whole GPU.
pub const TYPE_GPU: &str = "gpu";
/// `type` of a MIG device.
pub const TYPE_MIG: &str = "mig";

/// Capacity: device memory in bytes. On shared GPUs it is consumable.
pub const CAPACITY_MEMORY: &str = "memory";
/// Capacity of shared GPUs: percent of the GPU's streaming multiprocessors, 0–100, consumable.
pub const CAPACITY_CORES: &str = "cores";
/// The whole of `cores`.
pub const CORES_TOTAL: u64 = 100;
/// Memory requests on shared GPUs are rounded up to a multiple of this (1 MiB): HAMi counts memory in MiB.
pub const MEMORY_STEP_BYTES: u64 = 1 << 20;

/// DeviceClass of whole GPUs, NVIDIA's name and selector: every `type == "gpu"` device, shared or not.
pub const CLASS_GPU: &str = "gpu.nvidia.com";
/// DeviceClass of MIG devices, NVIDIA's name and selector.
pub const CLASS_MIG: &str = "mig.nvidia.com";
/// DeviceClass of shared GPUs, ours: `type == "gpu"` devices that allow multiple allocations.
pub const CLASS_SHARED_GPU: &str = "shared.gpu.nvidia.com";

/// The CEL expression of an attribute of this driver's devices, e.g. `device.attributes["gpu.nvidia.com"].uuid`.
#[must_use]
pub fn attribute_expression(attribute: &str) -> String {
    format!("device.attributes[\"{DRIVER}\"].{attribute}")
}

/// The CEL expression of a capacity of this driver's devices, e.g. `device.capacity["gpu.nvidia.com"].memory`.
#[must_use]
pub fn capacity_expression(capacity: &str) -> String {
    format!("device.capacity[\"{DRIVER}\"].{capacity}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_name_the_driver_domain() {
        assert_eq!(
            attribute_expression(ATTRIBUTE_PRODUCT_NAME),
            r#"device.attributes["gpu.nvidia.com"].productName"#
        );
        assert_eq!(
            capacity_expression(CAPACITY_MEMORY),
            r#"device.capacity["gpu.nvidia.com"].memory"#
        );
    }
}

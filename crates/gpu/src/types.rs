//! What a backend reports, in our own types: no NVML or simulator type crosses the [`crate::GpuBackend`] trait, so
//! that callers (and their tests) do not depend on which backend they run on.

use std::fmt;

use crd::mig::{ComputeCapability, GpuInstanceProfile, GpuModel, model_by_pci_device_id};
use serde::{Deserialize, Serialize};

/// MIG mode of one GPU: what is in effect now, and what takes effect at the next GPU reset (or reboot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct MigMode {
    /// MIG enabled now.
    pub current: bool,
    /// MIG enabled after the next reset.
    pub pending: bool,
}

/// A CUDA driver API version, e.g. 12.8, as NVML reports it for the installed driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// One GPU as the node agents need to know it: identity, model, capabilities and MIG mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInventory {
    /// NVML index on the node (0-based, stable for one boot).
    pub index: u32,
    /// GPU UUID, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA A100-SXM4-40GB`.
    pub product_name: String,
    /// PCI device id, device << 16 | vendor, e.g. `0x20B010DE` (what mig-parted's `device-filter` matches).
    pub pci_device_id: u32,
    /// PCI bus id, e.g. `00000000:07:00.0`.
    pub pci_bus_id: String,
    /// Total memory in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors usable now (fewer with MIG on); `None` where the driver does not say.
    pub multiprocessor_count: Option<u32>,
    /// CUDA compute capability.
    pub compute_capability: ComputeCapability,
    /// Driver version, e.g. `570.86.15`.
    pub driver_version: String,
    /// Highest CUDA version the driver supports.
    pub cuda_driver_version: CudaVersion,
    /// MIG mode; `None` on GPUs that are not MIG capable.
    pub mig_mode: Option<MigMode>,
}

impl GpuInventory {
    /// Whether the GPU supports MIG at all.
    #[must_use]
    pub fn mig_capable(&self) -> bool {
        self.mig_mode.is_some()
    }

    /// The catalog model of this GPU, when it is one the catalog knows (the MIG planner needs it).
    #[must_use]
    pub fn model(&self) -> Option<&'static GpuModel> {
        model_by_pci_device_id(self.pci_device_id)
    }
}

/// Converts to the GPUNode status entry, the shape the agents publish.
impl From<&GpuInventory> for crd::gpu_node::GpuInfo {
    fn from(gpu: &GpuInventory) -> Self {
        let word = |enabled: bool| if enabled { "enabled" } else { "disabled" }.to_owned();
        Self {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            product: gpu.product_name.clone(),
            pci_bus_id: Some(gpu.pci_bus_id.clone()),
            memory_mib: gpu.memory_mib,
            compute_capability: gpu.compute_capability.to_string(),
            mig_capable: gpu.mig_capable(),
            mig_mode: gpu.mig_mode.map(|mode| crd::gpu_node::MigMode {
                current: word(mode.current),
                pending: word(mode.pending),
            }),
        }
    }
}

/// One GPU-instance profile as the GPU reports it (`nvidia-smi mig -lgip`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuInstanceProfileInfo {
    /// The NVML profile constant this was asked with (0 = 1 slice, 7 = 1 slice rev1, ...).
    pub nvml_index: u32,
    /// The profile id that placement and create calls take.
    pub id: u32,
    /// Compute slices of one instance (the `<G>` of the profile name).
    pub slice_count: u32,
    /// How many instances of this profile alone fit on the GPU.
    pub instance_count: u32,
    /// Memory of one instance in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of one instance.
    pub multiprocessor_count: u32,
}

/// Where a GPU instance sits: `size` memory slices from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

impl Placement {
    /// Every placement the catalog allows `profile`, by start.
    pub fn of_profile(profile: &GpuInstanceProfile) -> impl DoubleEndedIterator<Item = Self> + '_ {
        profile.placement_starts.iter().map(|&start| Self {
            start: u32::from(start),
            size: u32::from(profile.placement_size),
        })
    }

    /// The memory slices as a bit mask (bit `n` = slice `n`); placements overlap when their masks intersect.
    #[must_use]
    pub fn mask(self) -> u64 {
        let ones = 1u64.checked_shl(self.size).map_or(u64::MAX, |bit| bit - 1);
        ones.checked_shl(self.start).unwrap_or(0)
    }

    /// Whether the two placements share a memory slice.
    #[must_use]
    pub fn overlaps(self, other: Placement) -> bool {
        self.mask() & other.mask() != 0
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.start, self.size)
    }
}

/// A GPU instance that exists on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuInstance {
    /// GPU-instance id, unique on its GPU.
    pub id: u32,
    /// Its profile id.
    pub profile_id: u32,
    /// Its memory slices.
    pub placement: Placement,
}

/// A compute instance inside a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ComputeInstance {
    /// Compute-instance id, unique within its GPU instance.
    pub id: u32,
    /// The GPU instance that holds it.
    pub gpu_instance_id: u32,
    /// Its compute-instance profile id.
    pub profile_id: u32,
    /// Compute slices it uses (the `<C>` of a profile name).
    pub slice_count: u32,
}

/// A MIG device: one compute instance in one GPU instance, what CUDA and the device plugin see.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigDevice {
    /// MIG device UUID, `MIG-...`.
    pub uuid: String,
    /// The GPU instance.
    pub gpu_instance_id: u32,
    /// The GPU instance's profile id.
    pub gpu_instance_profile_id: u32,
    /// The compute instance.
    pub compute_instance_id: u32,
    /// Compute slices of the compute instance.
    pub compute_slice_count: u32,
    /// Memory of the device in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the device.
    pub multiprocessor_count: u32,
    /// Its copy and media engines; `None` where the backend does not know them (the simulator: the MIG tables it
    /// is built from carry no engine counts).
    pub engines: Option<MigEngines>,
}

/// The engines of a MIG device, as NVML's device attributes count them (shared with other devices of the same
/// GPU instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MigEngines {
    /// Copy engines.
    pub copy: u32,
    /// Video decoders (NVDEC).
    pub decoder: u32,
    /// Video encoders (NVENC).
    pub encoder: u32,
    /// JPEG decoders (NVJPG).
    pub jpeg: u32,
    /// Optical flow accelerators (OFA).
    pub ofa: u32,
}

/// A process using a GPU, and where on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuProcess {
    /// Process id (in the host PID namespace).
    pub pid: u32,
    /// GPU memory it uses in MiB; `None` where the driver does not report it.
    pub used_memory_mib: Option<u64>,
    /// The GPU instance it runs in, on a GPU with MIG on.
    pub gpu_instance_id: Option<u32>,
    /// The compute instance it runs in, on a GPU with MIG on.
    pub compute_instance_id: Option<u32>,
}

/// Momentary readings of one GPU; a reading the GPU does not offer (e.g. utilization with MIG on) is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Telemetry {
    /// Percent of time a kernel ran over the last sample period.
    pub gpu_utilization_percent: Option<u32>,
    /// Percent of time device memory was read or written.
    pub memory_utilization_percent: Option<u32>,
    /// SM clock in MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Memory clock in MHz.
    pub memory_clock_mhz: Option<u32>,
    /// GPU temperature in degrees Celsius.
    pub temperature_celsius: Option<u32>,
    /// Power draw in milliwatts.
    pub power_milliwatts: Option<u32>,
    /// Energy used since the driver was loaded, in millijoules.
    pub total_energy_millijoules: Option<u64>,
    /// Memory in use in MiB.
    pub memory_used_mib: Option<u64>,
    /// Memory free in MiB.
    pub memory_free_mib: Option<u64>,
    /// Memory the driver and firmware set aside, in MiB (neither used nor free).
    pub memory_reserved_mib: Option<u64>,
    /// Memory (HBM) temperature in degrees Celsius.
    pub memory_temperature_celsius: Option<u32>,
    /// Percent of time the video encoders were busy over the last sample period.
    pub encoder_utilization_percent: Option<u32>,
    /// Percent of time the video decoders were busy over the last sample period.
    pub decoder_utilization_percent: Option<u32>,
    /// PCIe replays (retries) since the driver was loaded.
    pub pcie_replays: Option<u64>,
    /// How long the clocks were held down, by cause.
    pub throttling: ThrottleTimes,
    /// ECC errors, retired pages and remapped rows.
    pub memory_errors: MemoryErrors,
    /// NVLink error and traffic counters, summed over the GPU's links.
    pub nvlink: NvLinkCounters,
}

/// Time the GPU's clocks were held below what was asked, by cause, in nanoseconds since the driver was loaded
/// (NVML's violation status; DCGM's `*_VIOLATION` fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct ThrottleTimes {
    /// Held to stay under the power limit.
    pub power_ns: Option<u64>,
    /// Held to stay under the temperature limits.
    pub thermal_ns: Option<u64>,
    /// Held to match the other GPUs of a sync-boost group.
    pub sync_boost_ns: Option<u64>,
    /// Held by a board limit.
    pub board_limit_ns: Option<u64>,
    /// Held down because the GPU was barely used.
    pub low_utilization_ns: Option<u64>,
    /// Held by a board reliability limit.
    pub reliability_ns: Option<u64>,
}

/// Memory errors of a GPU and what the driver did about them. Volatile counts start at zero when the driver
/// loads; aggregate counts last for the life of the board.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct MemoryErrors {
    /// Corrected (single-bit) ECC errors since the driver was loaded.
    pub ecc_corrected_volatile: Option<u64>,
    /// Uncorrected (double-bit) ECC errors since the driver was loaded.
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Corrected (single-bit) ECC errors over the board's life.
    pub ecc_corrected_aggregate: Option<u64>,
    /// Uncorrected (double-bit) ECC errors over the board's life.
    pub ecc_uncorrected_aggregate: Option<u64>,
    /// Pages retired after repeated single-bit errors (GPUs before Ampere).
    pub retired_pages_single_bit: Option<u64>,
    /// Pages retired after a double-bit error (GPUs before Ampere).
    pub retired_pages_double_bit: Option<u64>,
    /// Whether pages wait for a reset to be retired.
    pub retired_pages_pending: Option<bool>,
    /// Rows remapped after correctable errors (Ampere and later).
    pub remapped_rows_correctable: Option<u64>,
    /// Rows remapped after uncorrectable errors.
    pub remapped_rows_uncorrectable: Option<u64>,
    /// Whether a remapping waits for a reset.
    pub remapped_rows_pending: Option<bool>,
    /// Whether a remapping failed (the GPU should be replaced).
    pub remapped_rows_failure: Option<bool>,
}

/// NVLink counters of a GPU, summed over its links; `None` on a GPU without NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct NvLinkCounters {
    /// Flow-control CRC errors.
    pub crc_flit_errors: Option<u64>,
    /// Data CRC errors.
    pub crc_data_errors: Option<u64>,
    /// Replays (retransmissions).
    pub replay_errors: Option<u64>,
    /// Link recoveries.
    pub recovery_errors: Option<u64>,
    /// Data sent and received (payload, both directions), in KiB since the driver was loaded.
    pub data_kib: Option<u64>,
}

/// What identifies a GPU's board and firmware, shown as labels rather than values; a text the GPU does not give
/// is `None`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct GpuDetails {
    /// The NVML library's version, e.g. `12.570.86.15`.
    pub nvml_version: Option<String>,
    /// Brand, e.g. `Tesla` or `NVIDIA`.
    pub brand: Option<String>,
    /// Board serial number.
    pub serial: Option<String>,
    /// VBIOS version.
    pub vbios_version: Option<String>,
    /// The infoROM image version.
    pub inforom_image_version: Option<String>,
    /// The OEM object version of the infoROM.
    pub inforom_oem_version: Option<String>,
    /// The ECC object version of the infoROM.
    pub inforom_ecc_version: Option<String>,
    /// The power-management object version of the infoROM.
    pub inforom_power_version: Option<String>,
}

/// A health event the driver reported for a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HealthEvent {
    /// Index of the GPU.
    pub gpu_index: u32,
    /// The XID of a critical XID error; `None` when the driver reported one without a code.
    pub xid: Option<u64>,
}

impl HealthEvent {
    /// Critical XID `xid` on GPU `gpu_index`.
    #[must_use]
    pub const fn xid(gpu_index: u32, xid: u64) -> Self {
        Self {
            gpu_index,
            xid: Some(xid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_masks_and_overlap() {
        assert_eq!(Placement { start: 0, size: 8 }.mask(), 0xFF);
        assert_eq!(Placement { start: 4, size: 4 }.mask(), 0xF0);
        assert_eq!(Placement { start: 6, size: 1 }.mask(), 0x40);
        assert!(Placement { start: 0, size: 4 }.overlaps(Placement { start: 2, size: 2 }));
        assert!(!Placement { start: 0, size: 4 }.overlaps(Placement { start: 4, size: 4 }));
        assert_eq!(Placement { start: 4, size: 4 }.to_string(), "4:4");
    }

    #[test]
    fn inventory_converts_to_the_gpunode_entry() {
        let gpu = GpuInventory {
            index: 1,
            uuid: "GPU-1".into(),
            product_name: "NVIDIA A100-SXM4-40GB".into(),
            pci_device_id: 0x20B0_10DE,
            pci_bus_id: "00000000:11:00.0".into(),
            memory_mib: 40960,
            multiprocessor_count: Some(108),
            compute_capability: ComputeCapability { major: 8, minor: 0 },
            driver_version: "570.86.15".into(),
            cuda_driver_version: CudaVersion {
                major: 12,
                minor: 8,
            },
            mig_mode: Some(MigMode {
                current: false,
                pending: true,
            }),
        };
        assert_eq!(gpu.model().unwrap().simulator_name, "a100-40gb");
        let info = crd::gpu_node::GpuInfo::from(&gpu);
        assert_eq!(info.compute_capability, "8.0");
        assert!(info.mig_capable);
        let mode = info.mig_mode.unwrap();
        assert_eq!(
            (mode.current.as_str(), mode.pending.as_str()),
            ("disabled", "enabled")
        );
    }
}

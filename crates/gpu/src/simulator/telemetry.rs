//! The simulated readings beyond clocks, power and memory use: error and traffic counters (a healthy GPU's
//! unless a test sets others), memory temperature, reserved memory, and the board's versions. Deterministic, so
//! that every process of a node and every run reads the same.

use serde::{Deserialize, Serialize};

use super::Simulator;
use super::state::GpuState;
use crate::error::Result;
use crate::types::{GpuDetails, MemoryErrors, NvLinkCounters, ThrottleTimes};

/// Error, throttling and NVLink counters of a simulated GPU. A reading set to `None` is one the GPU does not give,
/// as NVML's `NotSupported`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SimulatedCounters {
    /// PCIe replays.
    pub pcie_replays: Option<u64>,
    /// Clock throttling times.
    pub throttling: ThrottleTimes,
    /// ECC errors, retired pages, remapped rows.
    pub memory_errors: MemoryErrors,
    /// NVLink counters.
    pub nvlink: NvLinkCounters,
}

impl SimulatedCounters {
    /// A healthy GPU of the simulated generations (Ampere and later): every counter at 0, and no retired-page
    /// counts, which NVML does not give on GPUs that remap rows instead.
    #[must_use]
    pub fn healthy() -> Self {
        Self {
            pcie_replays: Some(0),
            throttling: ThrottleTimes {
                power_ns: Some(0),
                thermal_ns: Some(0),
                sync_boost_ns: Some(0),
                board_limit_ns: Some(0),
                low_utilization_ns: Some(0),
                reliability_ns: Some(0),
            },
            memory_errors: MemoryErrors {
                ecc_corrected_volatile: Some(0),
                ecc_uncorrected_volatile: Some(0),
                ecc_corrected_aggregate: Some(0),
                ecc_uncorrected_aggregate: Some(0),
                retired_pages_single_bit: None,
                retired_pages_double_bit: None,
                retired_pages_pending: None,
                remapped_rows_correctable: Some(0),
                remapped_rows_uncorrectable: Some(0),
                remapped_rows_pending: Some(false),
                remapped_rows_failure: Some(false),
            },
            nvlink: NvLinkCounters {
                crc_flit_errors: Some(0),
                crc_data_errors: Some(0),
                replay_errors: Some(0),
                recovery_errors: Some(0),
                data_kib: Some(0),
            },
        }
    }
}

impl GpuState {
    /// The GPU's counters: what a test set, else a healthy GPU's.
    pub(crate) fn counters(&self) -> SimulatedCounters {
        self.faults
            .counters
            .unwrap_or_else(SimulatedCounters::healthy)
    }
}

/// Memory the driver sets aside on a GPU with `memory_mib`, in MiB: about 1.25%, the share real boards report.
pub(crate) fn reserved_memory_mib(memory_mib: u64) -> u64 {
    memory_mib / 80
}

/// Memory (HBM) temperature: a few degrees above the GPU's, as on real boards.
pub(crate) fn memory_temperature_celsius(gpu_celsius: u32) -> u32 {
    gpu_celsius + 5
}

/// The board's versions and serial number; the serial derives from the UUID, so it is stable and unique.
pub(crate) fn details(gpu: &GpuState) -> GpuDetails {
    let digits: String = gpu
        .uuid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .map(|digit| {
            char::from(b'0' + u8::try_from(digit.to_digit(16).unwrap_or(0) % 10).unwrap_or(0))
        })
        .take(13)
        .collect();
    GpuDetails {
        nvml_version: Some(format!(
            "{}.{}",
            super::hardware::CUDA_DRIVER_VERSION.major,
            super::hardware::DRIVER_VERSION
        )),
        brand: Some("Nvidia".to_owned()),
        serial: Some(digits),
        vbios_version: Some("92.00.45.00.06".to_owned()),
        inforom_image_version: Some("G500.0200.00.03".to_owned()),
        inforom_oem_version: Some("2.1".to_owned()),
        inforom_ecc_version: Some("6.16".to_owned()),
        // Not on the data-center boards simulated: NVML answers NotSupported.
        inforom_power_version: None,
    }
}

impl Simulator {
    /// Sets a GPU's error, throttling and NVLink counters (`None`: back to a healthy GPU's), as if the GPU had
    /// counted them; every process of the node reads them.
    ///
    /// # Errors
    /// `NotFound` for an unknown GPU.
    pub fn set_counters(&self, gpu: u32, counters: Option<SimulatedCounters>) -> Result<()> {
        self.file.update(|state| {
            state.gpu_mut(gpu)?.faults.counters = counters;
            Ok(())
        })
    }
}

//! A GPU's readings through NVML: the safe wrapper's calls where it has them, and NVML's field values for the
//! counters it lacks (memory temperature, PCIe replays, ECC, retired pages, remapped rows, NVLink). These are the
//! NVML sources DCGM itself reads for the same `DCGM_FI_*` fields.

use nvml_wrapper::enum_wrappers::device::{Clock, InfoRom, PerformancePolicy, TemperatureSensor};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::NVML_NVLINK_MAX_LINKS;
use nvml_wrapper_sys::bindings::field_id::{
    NVML_FI_DEV_ECC_DBE_AGG_TOTAL, NVML_FI_DEV_ECC_DBE_VOL_TOTAL, NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    NVML_FI_DEV_ECC_SBE_VOL_TOTAL, NVML_FI_DEV_MEMORY_TEMP,
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    NVML_FI_DEV_PCIE_REPLAY_COUNTER, NVML_FI_DEV_REMAPPED_COR, NVML_FI_DEV_REMAPPED_FAILURE,
    NVML_FI_DEV_REMAPPED_PENDING, NVML_FI_DEV_REMAPPED_UNC, NVML_FI_DEV_RETIRED_DBE,
    NVML_FI_DEV_RETIRED_PENDING, NVML_FI_DEV_RETIRED_SBE,
};

use super::fields_sys::{FieldRequest, field_values};
use super::{MIB, optional};
use crate::error::Result;
use crate::types::{GpuDetails, MemoryErrors, NvLinkCounters, Telemetry, ThrottleTimes};

/// The device-wide fields read in one call, in the order [`FieldReadings::new`] takes them.
const DEVICE_FIELDS: [u32; 17] = [
    NVML_FI_DEV_MEMORY_TEMP,
    NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
    NVML_FI_DEV_RETIRED_SBE,
    NVML_FI_DEV_RETIRED_DBE,
    NVML_FI_DEV_RETIRED_PENDING,
    NVML_FI_DEV_REMAPPED_COR,
    NVML_FI_DEV_REMAPPED_UNC,
    NVML_FI_DEV_REMAPPED_PENDING,
    NVML_FI_DEV_REMAPPED_FAILURE,
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
];

/// The per-link traffic fields, asked for every link NVML may have.
const LINK_FIELDS: [u32; 2] = [
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
];

/// Every field asked in the one field-values call: the device fields, then each link's traffic fields.
fn requests() -> Vec<FieldRequest> {
    let device = DEVICE_FIELDS
        .iter()
        .map(|&id| FieldRequest { id, scope: 0 });
    let links = (0..NVML_NVLINK_MAX_LINKS).flat_map(|link| {
        LINK_FIELDS
            .iter()
            .map(move |&id| FieldRequest { id, scope: link })
    });
    device.chain(links).collect()
}

/// What the field values gave, in our types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct FieldReadings {
    memory_temperature_celsius: Option<u32>,
    pcie_replays: Option<u64>,
    memory_errors: MemoryErrors,
    nvlink: NvLinkCounters,
}

impl FieldReadings {
    /// From the answers to [`requests`], in its order (missing answers read as not given).
    fn new(values: &[Option<u64>]) -> Self {
        let at = |position: usize| values.get(position).copied().flatten();
        let flag = |position: usize| at(position).map(|value| value != 0);
        let links = values.get(DEVICE_FIELDS.len()..).unwrap_or_default();
        // A GPU without NVLink answers no link; one with NVLink answers its links (the others are not there).
        let data_kib = links.iter().flatten().copied().reduce(u64::saturating_add);
        Self {
            memory_temperature_celsius: at(0).and_then(|celsius| u32::try_from(celsius).ok()),
            pcie_replays: at(1),
            memory_errors: MemoryErrors {
                ecc_corrected_volatile: at(2),
                ecc_uncorrected_volatile: at(3),
                ecc_corrected_aggregate: at(4),
                ecc_uncorrected_aggregate: at(5),
                retired_pages_single_bit: at(6),
                retired_pages_double_bit: at(7),
                retired_pages_pending: flag(8),
                remapped_rows_correctable: at(9),
                remapped_rows_uncorrectable: at(10),
                remapped_rows_pending: flag(11),
                remapped_rows_failure: flag(12),
            },
            nvlink: NvLinkCounters {
                crc_flit_errors: at(13),
                crc_data_errors: at(14),
                replay_errors: at(15),
                recovery_errors: at(16),
                data_kib,
            },
        }
    }
}

/// Every reading of one GPU.
pub(super) fn read(nvml: &Nvml, device: &Device<'_>, gpu: u32) -> Result<Telemetry> {
    let context = format!("GPU {gpu}: telemetry");
    let utilization = optional(device.utilization_rates(), &context)?;
    let memory = optional(device.memory_info(), &context)?;
    let violation = |policy| -> Result<Option<u64>> {
        Ok(optional(device.violation_status(policy), &context)?.map(|time| time.violation_time))
    };
    let fields = FieldReadings::new(&field_values(nvml, device, &requests())?);
    Ok(Telemetry {
        gpu_utilization_percent: utilization.as_ref().map(|rates| rates.gpu),
        memory_utilization_percent: utilization.as_ref().map(|rates| rates.memory),
        sm_clock_mhz: optional(device.clock_info(Clock::SM), &context)?,
        memory_clock_mhz: optional(device.clock_info(Clock::Memory), &context)?,
        temperature_celsius: optional(device.temperature(TemperatureSensor::Gpu), &context)?,
        power_milliwatts: optional(device.power_usage(), &context)?,
        total_energy_millijoules: optional(device.total_energy_consumption(), &context)?,
        memory_used_mib: memory.as_ref().map(|memory| memory.used / MIB),
        memory_free_mib: memory.as_ref().map(|memory| memory.free / MIB),
        memory_reserved_mib: memory.as_ref().map(|memory| memory.reserved / MIB),
        memory_temperature_celsius: fields.memory_temperature_celsius,
        encoder_utilization_percent: optional(device.encoder_utilization(), &context)?
            .map(|info| info.utilization),
        decoder_utilization_percent: optional(device.decoder_utilization(), &context)?
            .map(|info| info.utilization),
        pcie_replays: fields.pcie_replays,
        throttling: ThrottleTimes {
            power_ns: violation(PerformancePolicy::Power)?,
            thermal_ns: violation(PerformancePolicy::Thermal)?,
            sync_boost_ns: violation(PerformancePolicy::SyncBoost)?,
            board_limit_ns: violation(PerformancePolicy::BoardLimit)?,
            low_utilization_ns: violation(PerformancePolicy::LowUtilization)?,
            reliability_ns: violation(PerformancePolicy::Reliability)?,
        },
        memory_errors: fields.memory_errors,
        nvlink: fields.nvlink,
    })
}

/// The board's and firmware's versions and serial number.
pub(super) fn details(nvml: &Nvml, device: &Device<'_>, gpu: u32) -> Result<GpuDetails> {
    let context = format!("GPU {gpu}: board details");
    Ok(GpuDetails {
        nvml_version: optional(nvml.sys_nvml_version(), &context)?,
        // NVML's brand names (Tesla, Quadro, NvidiaRTX, ...), as the wrapper spells them.
        brand: optional(device.brand(), &context)?.map(|brand| format!("{brand:?}")),
        serial: optional(device.serial(), &context)?,
        vbios_version: optional(device.vbios_version(), &context)?,
        inforom_image_version: optional(device.info_rom_image_version(), &context)?,
        inforom_oem_version: optional(device.info_rom_version(InfoRom::OEM), &context)?,
        inforom_ecc_version: optional(device.info_rom_version(InfoRom::ECC), &context)?,
        inforom_power_version: optional(device.info_rom_version(InfoRom::Power), &context)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_answers_land_in_their_readings_and_links_add_up() {
        let mut values: Vec<Option<u64>> = (0..DEVICE_FIELDS.len() as u64).map(Some).collect();
        values[8] = Some(0);
        values[11] = None;
        // Links 0 and 1 answer TX and RX; the rest of NVML's links are not on this GPU.
        values.extend([Some(100), Some(50), Some(7), Some(3)]);
        values.extend(std::iter::repeat_n(None, requests().len() - values.len()));
        assert_eq!(values.len(), requests().len());
        let readings = FieldReadings::new(&values);
        assert_eq!(readings.memory_temperature_celsius, Some(0));
        assert_eq!(readings.pcie_replays, Some(1));
        assert_eq!(
            readings.memory_errors,
            MemoryErrors {
                ecc_corrected_volatile: Some(2),
                ecc_uncorrected_volatile: Some(3),
                ecc_corrected_aggregate: Some(4),
                ecc_uncorrected_aggregate: Some(5),
                retired_pages_single_bit: Some(6),
                retired_pages_double_bit: Some(7),
                retired_pages_pending: Some(false),
                remapped_rows_correctable: Some(9),
                remapped_rows_uncorrectable: Some(10),
                remapped_rows_pending: None,
                remapped_rows_failure: Some(true),
            }
        );
        assert_eq!(
            readings.nvlink,
            NvLinkCounters {
                crc_flit_errors: Some(13),
                crc_data_errors: Some(14),
                replay_errors: Some(15),
                recovery_errors: Some(16),
                data_kib: Some(160),
            }
        );
        // A PCIe card: no link answers, so no traffic reading (not a traffic of 0).
        let pcie = FieldReadings::new(&vec![None; requests().len()]);
        assert_eq!(pcie, FieldReadings::default());
    }

    #[test]
    fn every_link_is_asked_for_its_traffic() {
        let requests = requests();
        assert_eq!(
            requests.len(),
            DEVICE_FIELDS.len() + 2 * NVML_NVLINK_MAX_LINKS as usize
        );
        assert_eq!(
            requests.last(),
            Some(&FieldRequest {
                id: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
                scope: NVML_NVLINK_MAX_LINKS - 1
            })
        );
    }
}

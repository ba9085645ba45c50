//! The DCGM fields this exporter knows: every field of NVIDIA's dcgm-exporter metrics CSVs (`default-counters.csv`,
//! `dcp-metrics-included.csv` and `1.x-compatibility-metrics.csv`, their commented-out lines included), by the names
//! dashboards and alerts already query, with the Prometheus type and help text dcgm-exporter gives them.
//!
//! A known name is either a [`Field`] read from the GPU backend (NVML or the simulator) and exported, or an
//! [`Unavailable`] field: one NVML cannot give (DCP profiling fields, which need DCGM's profiling module;
//! dcgm-exporter's own computed fields; the vGPU license state). A config may list those; they are reported, with
//! the reason, and not exported.

use std::fmt;

use Kind::{Counter, Gauge, Label};

/// A DCGM field this exporter reads and exports, by its `DCGM_FI_*` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// `DCGM_FI_DEV_SM_CLOCK`: SM clock in MHz.
    SmClock,
    /// `DCGM_FI_DEV_MEM_CLOCK`: memory clock in MHz.
    MemClock,
    /// `DCGM_FI_DEV_MEMORY_TEMP`: memory temperature in °C.
    MemoryTemp,
    /// `DCGM_FI_DEV_GPU_TEMP`: GPU temperature in °C.
    GpuTemp,
    /// `DCGM_FI_DEV_POWER_USAGE`: power draw in W.
    PowerUsage,
    /// `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`: energy since the driver loaded, in mJ.
    TotalEnergyConsumption,
    /// `DCGM_FI_DEV_PCIE_REPLAY_COUNTER`: PCIe retries.
    PcieReplayCounter,
    /// `DCGM_FI_DEV_GPU_UTIL`: GPU utilization in %.
    GpuUtil,
    /// `DCGM_FI_DEV_MEM_COPY_UTIL`: memory utilization in %.
    MemCopyUtil,
    /// `DCGM_FI_DEV_ENC_UTIL`: encoder utilization in %.
    EncUtil,
    /// `DCGM_FI_DEV_DEC_UTIL`: decoder utilization in %.
    DecUtil,
    /// `DCGM_FI_DEV_XID_ERRORS`: the last critical XID.
    XidErrors,
    /// `DCGM_FI_DEV_POWER_VIOLATION`: clocks held by the power limit, in ns.
    PowerViolation,
    /// `DCGM_FI_DEV_THERMAL_VIOLATION`: clocks held by temperature limits, in ns.
    ThermalViolation,
    /// `DCGM_FI_DEV_SYNC_BOOST_VIOLATION`: clocks held by sync boost, in ns.
    SyncBoostViolation,
    /// `DCGM_FI_DEV_BOARD_LIMIT_VIOLATION`: clocks held by a board limit, in ns.
    BoardLimitViolation,
    /// `DCGM_FI_DEV_LOW_UTIL_VIOLATION`: clocks held for low utilization, in ns.
    LowUtilViolation,
    /// `DCGM_FI_DEV_RELIABILITY_VIOLATION`: clocks held by a reliability limit, in ns.
    ReliabilityViolation,
    /// `DCGM_FI_DEV_FB_FREE`: free framebuffer memory in MiB.
    FbFree,
    /// `DCGM_FI_DEV_FB_USED`: used framebuffer memory in MiB.
    FbUsed,
    /// `DCGM_FI_DEV_FB_RESERVED`: reserved framebuffer memory in MiB.
    FbReserved,
    /// `DCGM_FI_DEV_ECC_SBE_VOL_TOTAL`: single-bit ECC errors since the driver loaded.
    EccSbeVolTotal,
    /// `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`: double-bit ECC errors since the driver loaded.
    EccDbeVolTotal,
    /// `DCGM_FI_DEV_ECC_SBE_AGG_TOTAL`: single-bit ECC errors over the board's life.
    EccSbeAggTotal,
    /// `DCGM_FI_DEV_ECC_DBE_AGG_TOTAL`: double-bit ECC errors over the board's life.
    EccDbeAggTotal,
    /// `DCGM_FI_DEV_RETIRED_SBE`: pages retired for single-bit errors.
    RetiredSbe,
    /// `DCGM_FI_DEV_RETIRED_DBE`: pages retired for double-bit errors.
    RetiredDbe,
    /// `DCGM_FI_DEV_RETIRED_PENDING`: 1 while pages wait to be retired.
    RetiredPending,
    /// `DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL`: NVLink flow-control CRC errors.
    NvlinkCrcFlitErrorCountTotal,
    /// `DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL`: NVLink data CRC errors.
    NvlinkCrcDataErrorCountTotal,
    /// `DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL`: NVLink retries.
    NvlinkReplayErrorCountTotal,
    /// `DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL`: NVLink recoveries.
    NvlinkRecoveryErrorCountTotal,
    /// `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`: NVLink data over every link, in KiB.
    NvlinkBandwidthTotal,
    /// `DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS`: rows remapped for uncorrectable errors.
    UncorrectableRemappedRows,
    /// `DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS`: rows remapped for correctable errors.
    CorrectableRemappedRows,
    /// `DCGM_FI_DEV_ROW_REMAP_FAILURE`: 1 when a remapping failed.
    RowRemapFailure,
    /// `DCGM_FI_DEV_ROW_REMAP_PENDING`: 1 while a remapping waits for a reset.
    RowRemapPending,
    /// `DCGM_FI_DRIVER_VERSION`: the driver version, a label.
    DriverVersion,
    /// `DCGM_FI_NVML_VERSION`: the NVML version, a label.
    NvmlVersion,
    /// `DCGM_FI_DEV_BRAND`: the brand, a label.
    Brand,
    /// `DCGM_FI_DEV_SERIAL`: the board serial number, a label.
    Serial,
    /// `DCGM_FI_DEV_OEM_INFOROM_VER`: the infoROM's OEM object version, a label.
    OemInforomVer,
    /// `DCGM_FI_DEV_ECC_INFOROM_VER`: the infoROM's ECC object version, a label.
    EccInforomVer,
    /// `DCGM_FI_DEV_POWER_INFOROM_VER`: the infoROM's power object version, a label.
    PowerInforomVer,
    /// `DCGM_FI_DEV_INFOROM_IMAGE_VER`: the infoROM image version, a label.
    InforomImageVer,
    /// `DCGM_FI_DEV_VBIOS_VERSION`: the VBIOS version, a label.
    VbiosVersion,
}

/// How a field shows in the exposition, as the CSV's type column says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A value that only goes up (until the driver reloads).
    Counter,
    /// Text, added as a label (named after the field) to every series of the GPU, as dcgm-exporter does.
    Label,
}

/// What is known of a field: its names, usual type and help.
struct Facts {
    field: Field,
    name: &'static str,
    /// The name in dcgm-exporter 1.x's namespace (`1.x-compatibility-metrics.csv`), where it has one.
    legacy: Option<&'static str>,
    kind: Kind,
    help: &'static str,
}

/// Shorthand for the table.
const fn facts(
    field: Field,
    name: &'static str,
    legacy: Option<&'static str>,
    kind: Kind,
    help: &'static str,
) -> Facts {
    Facts {
        field,
        name,
        legacy,
        kind,
        help,
    }
}

/// Every field, in [`Field`]'s order (a test checks it): the order of NVIDIA's CSVs.
#[rustfmt::skip]
const FACTS: [Facts; 46] = [
    facts(Field::SmClock, "DCGM_FI_DEV_SM_CLOCK", Some("dcgm_sm_clock"), Gauge, "SM clock frequency (in MHz)."),
    facts(Field::MemClock, "DCGM_FI_DEV_MEM_CLOCK", Some("dcgm_memory_clock"), Gauge, "Memory clock frequency (in MHz)."),
    facts(Field::MemoryTemp, "DCGM_FI_DEV_MEMORY_TEMP", Some("dcgm_memory_temp"), Gauge, "Memory temperature (in C)."),
    facts(Field::GpuTemp, "DCGM_FI_DEV_GPU_TEMP", Some("dcgm_gpu_temp"), Gauge, "GPU temperature (in C)."),
    facts(Field::PowerUsage, "DCGM_FI_DEV_POWER_USAGE", Some("dcgm_power_usage"), Gauge, "Power draw (in W)."),
    facts(Field::TotalEnergyConsumption, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", Some("dcgm_total_energy_consumption"), Counter, "Total energy consumption since boot (in mJ)."),
    facts(Field::PcieReplayCounter, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Some("dcgm_pcie_replay_counter"), Counter, "Total number of PCIe retries."),
    facts(Field::GpuUtil, "DCGM_FI_DEV_GPU_UTIL", Some("dcgm_gpu_utilization"), Gauge, "GPU utilization (in %)."),
    facts(Field::MemCopyUtil, "DCGM_FI_DEV_MEM_COPY_UTIL", Some("dcgm_mem_copy_utilization"), Gauge, "Memory utilization (in %)."),
    facts(Field::EncUtil, "DCGM_FI_DEV_ENC_UTIL", Some("dcgm_enc_utilization"), Gauge, "Encoder utilization (in %)."),
    facts(Field::DecUtil, "DCGM_FI_DEV_DEC_UTIL", Some("dcgm_dec_utilization"), Gauge, "Decoder utilization (in %)."),
    facts(Field::XidErrors, "DCGM_FI_DEV_XID_ERRORS", Some("dcgm_xid_errors"), Gauge, "Value of the last critical XID error of the GPU; 0 once none came for the quiet period."),
    facts(Field::PowerViolation, "DCGM_FI_DEV_POWER_VIOLATION", Some("dcgm_power_violation"), Counter, "Throttling duration due to power constraints (in ns)."),
    facts(Field::ThermalViolation, "DCGM_FI_DEV_THERMAL_VIOLATION", Some("dcgm_thermal_violation"), Counter, "Throttling duration due to thermal constraints (in ns)."),
    facts(Field::SyncBoostViolation, "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", Some("dcgm_sync_boost_violation"), Counter, "Throttling duration due to sync-boost constraints (in ns)."),
    facts(Field::BoardLimitViolation, "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", Some("dcgm_board_limit_violation"), Counter, "Throttling duration due to board limit constraints (in ns)."),
    facts(Field::LowUtilViolation, "DCGM_FI_DEV_LOW_UTIL_VIOLATION", Some("dcgm_low_util_violation"), Counter, "Throttling duration due to low utilization (in ns)."),
    facts(Field::ReliabilityViolation, "DCGM_FI_DEV_RELIABILITY_VIOLATION", Some("dcgm_reliability_violation"), Counter, "Throttling duration due to reliability constraints (in ns)."),
    facts(Field::FbFree, "DCGM_FI_DEV_FB_FREE", Some("dcgm_fb_free"), Gauge, "Framebuffer memory free (in MiB)."),
    facts(Field::FbUsed, "DCGM_FI_DEV_FB_USED", Some("dcgm_fb_used"), Gauge, "Framebuffer memory used (in MiB)."),
    facts(Field::FbReserved, "DCGM_FI_DEV_FB_RESERVED", None, Gauge, "Framebuffer memory reserved (in MiB)."),
    facts(Field::EccSbeVolTotal, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", Some("dcgm_ecc_sbe_volatile_total"), Counter, "Total number of single-bit volatile ECC errors."),
    facts(Field::EccDbeVolTotal, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Some("dcgm_ecc_dbe_volatile_total"), Counter, "Total number of double-bit volatile ECC errors."),
    facts(Field::EccSbeAggTotal, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", Some("dcgm_ecc_sbe_aggregate_total"), Counter, "Total number of single-bit persistent ECC errors."),
    facts(Field::EccDbeAggTotal, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", Some("dcgm_ecc_dbe_aggregate_total"), Counter, "Total number of double-bit persistent ECC errors."),
    facts(Field::RetiredSbe, "DCGM_FI_DEV_RETIRED_SBE", Some("dcgm_retired_pages_sbe"), Counter, "Total number of retired pages due to single-bit errors."),
    facts(Field::RetiredDbe, "DCGM_FI_DEV_RETIRED_DBE", Some("dcgm_retired_pages_dbe"), Counter, "Total number of retired pages due to double-bit errors."),
    facts(Field::RetiredPending, "DCGM_FI_DEV_RETIRED_PENDING", Some("dcgm_retired_pages_pending"), Counter, "Total number of pages pending retirement."),
    facts(Field::NvlinkCrcFlitErrorCountTotal, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", Some("dcgm_nvlink_flit_crc_error_count_total"), Counter, "Total number of NVLink flow-control CRC errors."),
    facts(Field::NvlinkCrcDataErrorCountTotal, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", Some("dcgm_nvlink_data_crc_error_count_total"), Counter, "Total number of NVLink data CRC errors."),
    facts(Field::NvlinkReplayErrorCountTotal, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", Some("dcgm_nvlink_replay_error_count_total"), Counter, "Total number of NVLink retries."),
    facts(Field::NvlinkRecoveryErrorCountTotal, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", Some("dcgm_nvlink_recovery_error_count_total"), Counter, "Total number of NVLink recovery errors."),
    facts(Field::NvlinkBandwidthTotal, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", Some("dcgm_nvlink_bandwidth_total"), Counter, "Total number of NVLink bandwidth counters for all lanes."),
    facts(Field::UncorrectableRemappedRows, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", None, Counter, "Number of remapped rows for uncorrectable errors"),
    facts(Field::CorrectableRemappedRows, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", None, Counter, "Number of remapped rows for correctable errors"),
    facts(Field::RowRemapFailure, "DCGM_FI_DEV_ROW_REMAP_FAILURE", None, Gauge, "Whether remapping of rows has failed"),
    facts(Field::RowRemapPending, "DCGM_FI_DEV_ROW_REMAP_PENDING", None, Gauge, "Whether remapping of rows is pending a reset"),
    facts(Field::DriverVersion, "DCGM_FI_DRIVER_VERSION", None, Label, "Driver Version"),
    facts(Field::NvmlVersion, "DCGM_FI_NVML_VERSION", None, Label, "NVML Version"),
    facts(Field::Brand, "DCGM_FI_DEV_BRAND", None, Label, "Device Brand"),
    facts(Field::Serial, "DCGM_FI_DEV_SERIAL", None, Label, "Device Serial Number"),
    facts(Field::OemInforomVer, "DCGM_FI_DEV_OEM_INFOROM_VER", None, Label, "OEM inforom version"),
    facts(Field::EccInforomVer, "DCGM_FI_DEV_ECC_INFOROM_VER", None, Label, "ECC inforom version"),
    facts(Field::PowerInforomVer, "DCGM_FI_DEV_POWER_INFOROM_VER", None, Label, "Power management object inforom version"),
    facts(Field::InforomImageVer, "DCGM_FI_DEV_INFOROM_IMAGE_VER", None, Label, "Inforom image version"),
    facts(Field::VbiosVersion, "DCGM_FI_DEV_VBIOS_VERSION", None, Label, "VBIOS version of the device"),
];

/// Why a field NVIDIA ships is not exported here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unavailable {
    /// A DCP profiling field (`DCGM_FI_PROF_*`).
    Profiling,
    /// A field dcgm-exporter computes itself (`DCGM_EXP_*`).
    ExporterComputed,
    /// The vGPU guest license state.
    VgpuLicense,
    /// One link's NVLink traffic.
    PerLinkBandwidth,
}

impl Unavailable {
    /// The reason, in a sentence that says what to use instead where there is something.
    #[must_use]
    pub fn reason(self) -> &'static str {
        match self {
            Unavailable::Profiling => {
                "a DCP profiling field: DCGM's profiling module (nv-hostengine) measures it, NVML has no such reading, and this exporter does not run DCGM"
            }
            Unavailable::ExporterComputed => {
                "dcgm-exporter computes it from DCGM's health and event watches, which this exporter does not run; the last critical XID is DCGM_FI_DEV_XID_ERRORS"
            }
            Unavailable::VgpuLicense => {
                "the vGPU guest license state needs NVML's vGPU licensing calls, which this exporter does not make"
            }
            Unavailable::PerLinkBandwidth => {
                "per-link NVLink traffic is not exported; DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL sums every link"
            }
        }
    }
}

/// Names of NVIDIA's CSVs that are known and not exported (besides every DCP `*_PROF_*` field).
const UNAVAILABLE: [(&str, Unavailable); 8] = [
    ("DCGM_EXP_CLOCK_EVENTS_COUNT", Unavailable::ExporterComputed),
    ("DCGM_EXP_CLOCK_EVENTS_TOTAL", Unavailable::ExporterComputed),
    ("DCGM_EXP_XID_ERRORS_COUNT", Unavailable::ExporterComputed),
    ("DCGM_EXP_XID_ERRORS_TOTAL", Unavailable::ExporterComputed),
    ("DCGM_EXP_GPU_HEALTH_STATUS", Unavailable::ExporterComputed),
    ("DCGM_EXP_P2P_STATUS", Unavailable::ExporterComputed),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", Unavailable::VgpuLicense),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
        Unavailable::PerLinkBandwidth,
    ),
];

/// What a name in a config stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// A field exported here.
    Exported(Field),
    /// A field NVIDIA ships that is not exported here, and why.
    Unavailable(Unavailable),
}

/// What a config's name stands for: a field by its DCGM name or its dcgm-exporter 1.x name, a DCP profiling field
/// (any `DCGM_FI_PROF_*` name, in either namespace: all of them need DCGM), or another known field NVML cannot
/// give; `None` for a name no NVIDIA CSV uses (a typo, most likely).
#[must_use]
pub fn lookup(name: &str) -> Option<Known> {
    if let Some(facts) = FACTS
        .iter()
        .find(|facts| facts.name == name || facts.legacy == Some(name))
    {
        return Some(Known::Exported(facts.field));
    }
    if name.starts_with("DCGM_FI_PROF_") || name.starts_with("dcgm_fi_prof_") {
        return Some(Known::Unavailable(Unavailable::Profiling));
    }
    UNAVAILABLE
        .iter()
        .find(|(known, _)| *known == name)
        .map(|&(_, why)| Known::Unavailable(why))
}

impl Field {
    /// Every field, in the order of NVIDIA's CSVs.
    pub const ALL: [Field; 46] = {
        let mut all = [Field::SmClock; 46];
        let mut position = 0;
        while position < FACTS.len() {
            all[position] = FACTS[position].field;
            position += 1;
        }
        all
    };

    /// The fields exported when no config is given: those of NVIDIA's `dcp-metrics-included.csv` (the metrics
    /// NVIDIA's GPU Operator selects by default) that NVML gives, in its order.
    pub const DEFAULT: [Field; 20] = [
        Field::SmClock,
        Field::MemClock,
        Field::MemoryTemp,
        Field::GpuTemp,
        Field::PowerUsage,
        Field::TotalEnergyConsumption,
        Field::PcieReplayCounter,
        Field::GpuUtil,
        Field::MemCopyUtil,
        Field::EncUtil,
        Field::DecUtil,
        Field::XidErrors,
        Field::FbFree,
        Field::FbUsed,
        Field::FbReserved,
        Field::NvlinkBandwidthTotal,
        Field::UncorrectableRemappedRows,
        Field::CorrectableRemappedRows,
        Field::RowRemapFailure,
        Field::DriverVersion,
    ];

    fn facts(self) -> &'static Facts {
        // `FACTS` is in the enum's order (see the test), so the discriminant is the position.
        &FACTS[self as usize]
    }

    /// The `DCGM_FI_*` name: the metric name, or for a label field the label name.
    #[must_use]
    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// The type dcgm-exporter's CSVs give the field.
    #[must_use]
    pub fn default_kind(self) -> Kind {
        self.facts().kind
    }

    /// Whether the field is text (only a label can carry it) rather than a number (only a gauge or counter can).
    #[must_use]
    pub fn is_text(self) -> bool {
        self.default_kind() == Kind::Label
    }

    /// The help text when the CSV gives none.
    #[must_use]
    pub fn default_help(self) -> &'static str {
        self.facts().help
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Kind {
    /// The CSV's word for the kind.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Label => "label",
        }
    }

    /// The kind a CSV word names, in any letter case.
    #[must_use]
    pub fn from_word(word: &str) -> Option<Self> {
        [Kind::Gauge, Kind::Counter, Kind::Label]
            .into_iter()
            .find(|kind| kind.word().eq_ignore_ascii_case(word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_the_enums_order_and_names_parse_back() {
        for (position, facts) in FACTS.iter().enumerate() {
            assert_eq!(facts.field as usize, position, "{}", facts.name);
            assert_eq!(Field::ALL[position], facts.field);
            assert_eq!(lookup(facts.name), Some(Known::Exported(facts.field)));
            if let Some(legacy) = facts.legacy {
                assert_eq!(lookup(legacy), Some(Known::Exported(facts.field)));
            }
        }
        assert!(
            Field::DEFAULT
                .iter()
                .all(|field| Field::ALL.contains(field))
        );
        assert_eq!(
            lookup("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
            Some(Known::Unavailable(Unavailable::Profiling))
        );
        assert_eq!(
            lookup("dcgm_fi_prof_dram_active"),
            Some(Known::Unavailable(Unavailable::Profiling))
        );
        assert_eq!(
            lookup("DCGM_FI_DEV_VGPU_LICENSE_STATUS"),
            Some(Known::Unavailable(Unavailable::VgpuLicense))
        );
        assert_eq!(lookup("DCGM_FI_DEV_GPU_TMP"), None);
        assert_eq!(lookup("dcgm_fb_reserved"), None);
        assert_eq!(Kind::from_word("Counter"), Some(Kind::Counter));
        assert_eq!(Kind::from_word("histogram"), None);
    }
}

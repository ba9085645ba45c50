//! The DCGM fields this exporter knows: the default set of NVIDIA's dcgm-exporter, by the names dashboards and
//! alerts already query, with the Prometheus type and help text dcgm-exporter gives them.

use std::fmt;
use std::str::FromStr;

/// A DCGM field, by its `DCGM_FI_*` name.
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
    /// `DCGM_FI_DEV_FB_FREE`: free framebuffer memory in MiB.
    FbFree,
    /// `DCGM_FI_DEV_FB_USED`: used framebuffer memory in MiB.
    FbUsed,
    /// `DCGM_FI_DEV_FB_RESERVED`: reserved framebuffer memory in MiB.
    FbReserved,
    /// `DCGM_FI_DRIVER_VERSION`: the driver version, a label rather than a number.
    DriverVersion,
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

impl Field {
    /// Every field, in the order of dcgm-exporter's default CSV: the default selection.
    pub const ALL: [Field; 16] = [
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
        Field::DriverVersion,
    ];

    /// The `DCGM_FI_*` name: the metric name, or for a label field the label name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Field::SmClock => "DCGM_FI_DEV_SM_CLOCK",
            Field::MemClock => "DCGM_FI_DEV_MEM_CLOCK",
            Field::MemoryTemp => "DCGM_FI_DEV_MEMORY_TEMP",
            Field::GpuTemp => "DCGM_FI_DEV_GPU_TEMP",
            Field::PowerUsage => "DCGM_FI_DEV_POWER_USAGE",
            Field::TotalEnergyConsumption => "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            Field::PcieReplayCounter => "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            Field::GpuUtil => "DCGM_FI_DEV_GPU_UTIL",
            Field::MemCopyUtil => "DCGM_FI_DEV_MEM_COPY_UTIL",
            Field::EncUtil => "DCGM_FI_DEV_ENC_UTIL",
            Field::DecUtil => "DCGM_FI_DEV_DEC_UTIL",
            Field::XidErrors => "DCGM_FI_DEV_XID_ERRORS",
            Field::FbFree => "DCGM_FI_DEV_FB_FREE",
            Field::FbUsed => "DCGM_FI_DEV_FB_USED",
            Field::FbReserved => "DCGM_FI_DEV_FB_RESERVED",
            Field::DriverVersion => "DCGM_FI_DRIVER_VERSION",
        }
    }

    /// The type dcgm-exporter's default CSV gives the field.
    #[must_use]
    pub fn default_kind(self) -> Kind {
        match self {
            Field::TotalEnergyConsumption | Field::PcieReplayCounter => Kind::Counter,
            Field::DriverVersion => Kind::Label,
            _ => Kind::Gauge,
        }
    }

    /// Whether the field is text (only a label can carry it) rather than a number (only a gauge or counter can).
    #[must_use]
    pub fn is_text(self) -> bool {
        self == Field::DriverVersion
    }

    /// The help text when the CSV gives none.
    #[must_use]
    pub fn default_help(self) -> &'static str {
        match self {
            Field::SmClock => "SM clock frequency (in MHz).",
            Field::MemClock => "Memory clock frequency (in MHz).",
            Field::MemoryTemp => "Memory temperature (in C).",
            Field::GpuTemp => "GPU temperature (in C).",
            Field::PowerUsage => "Power draw (in W).",
            Field::TotalEnergyConsumption => "Total energy consumption since boot (in mJ).",
            Field::PcieReplayCounter => "Total number of PCIe retries.",
            Field::GpuUtil => "GPU utilization (in %).",
            Field::MemCopyUtil => "Memory utilization (in %).",
            Field::EncUtil => "Encoder utilization (in %).",
            Field::DecUtil => "Decoder utilization (in %).",
            Field::XidErrors => {
                "Value of the last critical XID error of the GPU; 0 once none came for the quiet period."
            }
            Field::FbFree => "Framebuffer memory free (in MiB).",
            Field::FbUsed => "Framebuffer memory used (in MiB).",
            Field::FbReserved => "Framebuffer memory reserved (in MiB).",
            Field::DriverVersion => "Driver Version",
        }
    }

    /// Whether the GPU backend gives a reading for the field. Those it does not are accepted in a config (so that
    /// dcgm-exporter's CSV applies unchanged) and never exported: the `GpuBackend` telemetry has no memory
    /// temperature, encoder or decoder utilization, PCIe replay count or reserved framebuffer, and a made-up value
    /// would be worse than none.
    #[must_use]
    pub fn sourced(self) -> bool {
        !matches!(
            self,
            Field::MemoryTemp
                | Field::EncUtil
                | Field::DecUtil
                | Field::PcieReplayCounter
                | Field::FbReserved
        )
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Field::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown field {0}")]
pub struct UnknownField(pub String);

impl FromStr for Field {
    type Err = UnknownField;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Field::ALL
            .into_iter()
            .find(|field| field.name() == name)
            .ok_or_else(|| UnknownField(name.to_owned()))
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
    fn names_parse_back() {
        for field in Field::ALL {
            assert_eq!(field.name().parse::<Field>(), Ok(field));
            assert_eq!(field.is_text(), field.default_kind() == Kind::Label);
        }
        assert_eq!(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE".parse::<Field>(),
            Err(UnknownField("DCGM_FI_PROF_GR_ENGINE_ACTIVE".into()))
        );
        assert_eq!(Kind::from_word("Counter"), Some(Kind::Counter));
        assert_eq!(Kind::from_word("histogram"), None);
    }
}

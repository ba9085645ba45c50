//! The metrics config: which fields are exported, in dcgm-exporter's CSV format, one field a line:
//!
//! ```text
//! # field,                     type,  help
//! DCGM_FI_DEV_GPU_TEMP,        gauge, GPU temperature (in C).
//! DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).
//! DCGM_FI_DRIVER_VERSION,      label, Driver Version
//! ```
//!
//! `#` comments and blank lines are ignored; the help may contain commas and may be left out (the field's usual
//! help is used). A number field is a gauge or a counter, as the line says; a text field (the driver version) is a
//! label on every series. A field may be named as dcgm-exporter 1.x named it (`dcgm_gpu_temp`): the metric then has
//! that name, as in dcgm-exporter.
//!
//! NVIDIA's CSVs apply unchanged: a field they list that NVML cannot give (a DCP `DCGM_FI_PROF_*` field, a
//! `DCGM_EXP_*` field, the vGPU license state) is accepted and reported as unavailable, with the reason, rather
//! than refusing the file. A line that cannot be right (bad syntax, an unknown type or field name, a number given
//! as a label, a metric listed twice) refuses the config as a whole, so that a typo never silently drops the
//! fields an alert relies on: the caller keeps what it exported before.
//!
//! In a ConfigMap the CSV is the key `dcgm-metrics.csv` (the file name NVIDIA's GPU Operator documents for
//! `kubectl create configmap --from-file`), or else the ConfigMap's only key.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::ConfigMap;

use super::fields::{Field, Kind, Known, Unavailable, lookup};

/// The ConfigMap key that holds the CSV when the ConfigMap has several.
pub const CONFIG_MAP_KEY: &str = "dcgm-metrics.csv";

/// One exported field, with its name, type and help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The field.
    pub field: Field,
    /// The metric (or, for a label field, label) name, as the config wrote it: the DCGM name or the 1.x one.
    pub name: String,
    /// How it shows.
    pub kind: Kind,
    /// The HELP text.
    pub help: String,
}

/// A field the config lists that is not exported, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnavailableField {
    /// 1-based line number (the first, when listed twice).
    pub line: usize,
    /// The name as written.
    pub name: String,
    /// Why it is not exported.
    pub why: Unavailable,
}

/// The fields to export, in the config's order, and those listed that cannot be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    fields: Vec<Selected>,
    unavailable: Vec<UnavailableField>,
}

/// The default set: the fields of NVIDIA's default CSV that NVML gives, with their type and help.
impl Default for Selection {
    fn default() -> Self {
        Self {
            fields: Field::DEFAULT
                .into_iter()
                .map(|field| Selected {
                    field,
                    name: field.name().to_owned(),
                    kind: field.default_kind(),
                    help: field.default_help().to_owned(),
                })
                .collect(),
            unavailable: Vec::new(),
        }
    }
}

/// A line of the CSV that cannot be used, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not `field, type, help`.
    #[error(
        "line {line}: expected `field, type, help` (e.g. `DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).`), got {text:?}"
    )]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// A name no NVIDIA CSV uses.
    #[error(
        "line {line}: unknown field {field}; this exporter serves {}, and accepts the DCGM_FI_PROF_* and DCGM_EXP_* fields of NVIDIA's CSVs without exporting them; correct the name, or remove the line or comment it out with #",
        known_fields()
    )]
    UnknownField {
        /// 1-based line number.
        line: usize,
        /// The name given.
        field: String,
    },
    /// A type other than gauge, counter or label.
    #[error("line {line}: {field}: unknown type {kind:?}; use gauge, counter or label")]
    UnknownType {
        /// 1-based line number.
        line: usize,
        /// The name given.
        field: String,
        /// The type given.
        kind: String,
    },
    /// A number field given as a label.
    #[error("line {line}: {field} is a number: its type must be gauge or counter, not label")]
    NumberAsLabel {
        /// 1-based line number.
        line: usize,
        /// The name given.
        field: String,
    },
    /// A text field given as a gauge or counter.
    #[error("line {line}: {field} is text: its type must be label, not {}", kind.word())]
    TextAsNumber {
        /// 1-based line number.
        line: usize,
        /// The name given.
        field: String,
        /// The type given.
        kind: Kind,
    },
    /// A metric listed twice.
    #[error("line {line}: {field} is already listed on line {first}; remove one of the two lines")]
    Duplicate {
        /// 1-based line number.
        line: usize,
        /// The name given.
        field: String,
        /// The line that listed it first.
        first: usize,
    },
    /// The bad lines past the first [`MAX_REPORTED_ERRORS`], counted rather than each reported.
    #[error("{count} more bad lines, not shown; fix the ones above first")]
    MoreBadLines {
        /// How many.
        count: usize,
    },
    /// Nothing but comments and blank lines.
    #[error(
        "the config lists no field: add `field, type, help` lines (e.g. `DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).`)"
    )]
    NoFields,
}

/// The most bad lines reported one by one: each is a log line (and the unknown-field one lists every field), so a
/// ConfigMap of thousands of bad lines must not become thousands of warnings.
pub const MAX_REPORTED_ERRORS: usize = 16;

/// The most characters of a line's own text an error quotes, so that one long line cannot make a long error.
const QUOTED_CHARACTERS: usize = 80;

/// `text` for an error message: as it is when short, else its first [`QUOTED_CHARACTERS`] characters and `…`.
fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARACTERS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The fields a config may list, for the unknown-field error.
fn known_fields() -> String {
    let mut text = String::new();
    for (position, field) in Field::ALL.iter().enumerate() {
        let separator = if position == 0 { "" } else { ", " };
        // Writing into a String cannot fail.
        let _ = write!(text, "{separator}{field}");
    }
    text
}

/// What one good line lists.
enum Line {
    /// A field to export.
    Selected(Selected),
    /// A known field that is not exported.
    Unavailable(UnavailableField),
}

impl Selection {
    /// Parses the CSV; every bad line is reported, so that one edit can fix them all.
    ///
    /// # Errors
    /// The bad lines, in order; [`ConfigError::NoFields`] when no line lists a field.
    pub fn parse(text: &str) -> Result<Self, Vec<ConfigError>> {
        let mut fields = Vec::new();
        let mut unavailable: Vec<UnavailableField> = Vec::new();
        let mut unavailable_names: BTreeSet<String> = BTreeSet::new();
        let mut first_line: BTreeMap<String, usize> = BTreeMap::new();
        let mut errors = Vec::new();
        let mut unreported = 0;
        let mut report = |error: ConfigError| {
            if errors.len() < MAX_REPORTED_ERRORS {
                errors.push(error);
            } else {
                unreported += 1;
            }
        };
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            match parse_line(line, trimmed) {
                Ok(Line::Selected(selected)) => {
                    if let Some(&first) = first_line.get(&selected.name) {
                        report(ConfigError::Duplicate {
                            line,
                            field: selected.name,
                            first,
                        });
                    } else {
                        first_line.insert(selected.name.clone(), line);
                        fields.push(selected);
                    }
                }
                // Listed twice it still exports nothing (NVIDIA's 1.x CSV lists a DCP field twice): report it once.
                Ok(Line::Unavailable(field)) => {
                    if unavailable_names.insert(field.name.clone()) {
                        unavailable.push(field);
                    }
                }
                Err(error) => report(error),
            }
        }
        if unreported > 0 {
            errors.push(ConfigError::MoreBadLines { count: unreported });
        }
        if errors.is_empty() && fields.is_empty() && unavailable.is_empty() {
            errors.push(ConfigError::NoFields);
        }
        if errors.is_empty() {
            Ok(Self {
                fields,
                unavailable,
            })
        } else {
            Err(errors)
        }
    }

    /// The selected fields, in the config's order.
    #[must_use]
    pub fn fields(&self) -> &[Selected] {
        &self.fields
    }

    /// The fields listed that are not exported, in the config's order, each once.
    #[must_use]
    pub fn unavailable(&self) -> &[UnavailableField] {
        &self.unavailable
    }
}

/// One `field, type[, help]` line.
fn parse_line(line: usize, text: &str) -> Result<Line, ConfigError> {
    let mut columns = text.splitn(3, ',').map(str::trim);
    let (Some(name), Some(word)) = (columns.next(), columns.next()) else {
        return Err(ConfigError::Malformed {
            line,
            text: quoted(text),
        });
    };
    if name.is_empty() || word.is_empty() {
        return Err(ConfigError::Malformed {
            line,
            text: quoted(text),
        });
    }
    let known = lookup(name).ok_or_else(|| ConfigError::UnknownField {
        line,
        field: quoted(name),
    })?;
    let kind = Kind::from_word(word).ok_or_else(|| ConfigError::UnknownType {
        line,
        field: name.to_owned(),
        kind: quoted(word),
    })?;
    let field = match known {
        Known::Exported(field) => field,
        Known::Unavailable(why) => {
            return Ok(Line::Unavailable(UnavailableField {
                line,
                name: name.to_owned(),
                why,
            }));
        }
    };
    match (field.is_text(), kind) {
        (false, Kind::Label) => {
            return Err(ConfigError::NumberAsLabel {
                line,
                field: name.to_owned(),
            });
        }
        (true, Kind::Gauge | Kind::Counter) => {
            return Err(ConfigError::TextAsNumber {
                line,
                field: name.to_owned(),
                kind,
            });
        }
        _ => {}
    }
    // A help quoted as in a spreadsheet's CSV, because it holds commas, is shown without the quotes.
    let help = columns
        .next()
        .map(|help| {
            help.strip_prefix('"')
                .and_then(|inner| inner.strip_suffix('"'))
                .unwrap_or(help)
        })
        .filter(|help| !help.is_empty())
        .unwrap_or(field.default_help());
    Ok(Line::Selected(Selected {
        field,
        name: name.to_owned(),
        kind,
        help: help.to_owned(),
    }))
}

/// Why a metrics ConfigMap gives no selection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigMapError {
    /// The ConfigMap does not exist.
    #[error("does not exist")]
    Missing,
    /// No data at all.
    #[error("has no data: put the CSV in the key {CONFIG_MAP_KEY}")]
    Empty,
    /// Several keys, none of them the one we read.
    #[error(
        "has several keys ({keys}) and none is {CONFIG_MAP_KEY}: name the CSV's key {CONFIG_MAP_KEY}"
    )]
    WhichKey {
        /// The keys it has, comma-separated.
        keys: String,
    },
    /// The CSV has bad lines.
    #[error("key {key}: {}", lines(errors))]
    Csv {
        /// The key read.
        key: String,
        /// Its bad lines.
        errors: Vec<ConfigError>,
    },
}

/// The bad lines of a CSV, one sentence each.
fn lines(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The selection a metrics ConfigMap (`None` while it does not exist) gives, with the key it was read from.
///
/// # Errors
/// A [`ConfigMapError`] saying what to fix; the caller keeps its previous selection.
pub fn from_config_map(
    config_map: Option<&ConfigMap>,
) -> Result<(String, Selection), ConfigMapError> {
    let data = config_map
        .ok_or(ConfigMapError::Missing)?
        .data
        .as_ref()
        .filter(|data| !data.is_empty())
        .ok_or(ConfigMapError::Empty)?;
    let (key, text) = match data.get_key_value(CONFIG_MAP_KEY) {
        Some(entry) => entry,
        None if data.len() == 1 => data.iter().next().ok_or(ConfigMapError::Empty)?,
        None => {
            return Err(ConfigMapError::WhichKey {
                keys: data.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        }
    };
    Selection::parse(text)
        .map(|selection| (key.clone(), selection))
        .map_err(|errors| ConfigMapError::Csv {
            key: key.clone(),
            errors,
        })
}

#[cfg(test)]
#[path = "config_properties.rs"]
mod properties;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::config_map;

    fn names(selection: &Selection) -> Vec<(&str, Kind, &str)> {
        selection
            .fields()
            .iter()
            .map(|selected| {
                (
                    selected.name.as_str(),
                    selected.kind,
                    selected.help.as_str(),
                )
            })
            .collect()
    }

    #[test]
    fn a_good_config_keeps_its_order_types_and_help() {
        let text = "\
# Format: field, type, help
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).

  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION ,counter,  Energy, since boot
DCGM_FI_DEV_GPU_TEMP, Gauge
DCGM_FI_DEV_SM_CLOCK, counter, \"clock, as a counter\"
DCGM_FI_DRIVER_VERSION, label,
dcgm_gpu_temp, gauge, the 1.x name
";
        let selection = Selection::parse(text).unwrap();
        assert_eq!(
            names(&selection),
            [
                (
                    "DCGM_FI_DEV_FB_USED",
                    Kind::Gauge,
                    "Framebuffer memory used (in MiB)."
                ),
                (
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                    Kind::Counter,
                    "Energy, since boot"
                ),
                (
                    "DCGM_FI_DEV_GPU_TEMP",
                    Kind::Gauge,
                    "GPU temperature (in C)."
                ),
                ("DCGM_FI_DEV_SM_CLOCK", Kind::Counter, "clock, as a counter"),
                ("DCGM_FI_DRIVER_VERSION", Kind::Label, "Driver Version"),
                ("dcgm_gpu_temp", Kind::Gauge, "the 1.x name"),
            ]
        );
        assert_eq!(selection.fields()[5].field, Field::GpuTemp);
        assert!(selection.unavailable().is_empty());
    }

    #[test]
    fn the_default_is_nvidias_default_csv_less_what_nvml_cannot_give() {
        let selection = Selection::default();
        assert_eq!(selection.fields().len(), 20);
        let energy = &selection.fields()[5];
        assert_eq!(
            (energy.field, energy.kind),
            (Field::TotalEnergyConsumption, Kind::Counter)
        );
        assert!(selection.unavailable().is_empty());
    }

    #[test]
    fn fields_nvml_cannot_give_are_accepted_and_reported_once() {
        let text = "\
DCGM_FI_DEV_GPU_TEMP, gauge, ok
DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.
DCGM_EXP_XID_ERRORS_COUNT, gauge, XIDs in the window
DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status
dcgm_fi_prof_pcie_tx_bytes, counter, once
dcgm_fi_prof_pcie_tx_bytes, counter, twice
";
        let selection = Selection::parse(text).unwrap();
        assert_eq!(selection.fields().len(), 1);
        let unavailable: Vec<(usize, &str, Unavailable)> = selection
            .unavailable()
            .iter()
            .map(|field| (field.line, field.name.as_str(), field.why))
            .collect();
        assert_eq!(
            unavailable,
            [
                (2, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", Unavailable::Profiling),
                (
                    3,
                    "DCGM_EXP_XID_ERRORS_COUNT",
                    Unavailable::ExporterComputed
                ),
                (
                    4,
                    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
                    Unavailable::VgpuLicense
                ),
                (5, "dcgm_fi_prof_pcie_tx_bytes", Unavailable::Profiling),
            ]
        );
        // A bad type is still a bad line, whatever the field.
        let errors = Selection::parse("DCGM_FI_PROF_SM_ACTIVE, histogram, x\n").unwrap_err();
        assert_eq!(
            errors[0].to_string(),
            "line 1: DCGM_FI_PROF_SM_ACTIVE: unknown type \"histogram\"; use gauge, counter or label"
        );
    }

    const DCP_METRICS_INCLUDED: &str =
        include_str!("../../../../tests/fixtures/nvidia/dcp-metrics-included.csv");
    const DEFAULT_COUNTERS: &str =
        include_str!("../../../../tests/fixtures/nvidia/default-counters.csv");
    const COMPATIBILITY: &str =
        include_str!("../../../../tests/fixtures/nvidia/1.x-compatibility-metrics.csv");

    /// The CSV with its commented-out field rows turned on, as a user who wants them all would.
    fn uncommented(csv: &str) -> String {
        csv.lines()
            .map(|line| {
                line.strip_prefix("# DCGM_")
                    .map(|rest| format!("DCGM_{rest}"))
                    .or_else(|| {
                        line.strip_prefix("# dcgm_")
                            .map(|rest| format!("dcgm_{rest}"))
                    })
                    .unwrap_or_else(|| line.to_owned())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn unavailable_names(selection: &Selection) -> Vec<&str> {
        selection
            .unavailable()
            .iter()
            .map(|field| field.name.as_str())
            .collect()
    }

    #[test]
    fn nvidias_default_csvs_apply_with_their_dcp_fields_reported() {
        for csv in [DCP_METRICS_INCLUDED, DEFAULT_COUNTERS] {
            let selection = Selection::parse(csv).unwrap();
            let fields: Vec<Field> = selection
                .fields()
                .iter()
                .map(|selected| selected.field)
                .collect();
            // What NVIDIA's operator exports by default, less what needs DCGM, is our default set.
            assert_eq!(fields, Field::DEFAULT);
            assert_eq!(
                unavailable_names(&selection),
                [
                    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                    "DCGM_FI_PROF_DRAM_ACTIVE",
                    "DCGM_FI_PROF_PCIE_TX_BYTES",
                    "DCGM_FI_PROF_PCIE_RX_BYTES",
                ]
            );
            assert!(
                selection.unavailable()[1..]
                    .iter()
                    .all(|field| field.why == Unavailable::Profiling)
            );
        }
    }

    #[test]
    fn every_field_nvidia_ships_commented_out_or_not_is_accepted() {
        let all = Selection::parse(&uncommented(DEFAULT_COUNTERS)).unwrap();
        let exported: Vec<Field> = all.fields().iter().map(|selected| selected.field).collect();
        // Every field we export is in NVIDIA's file, but for the row-remap pending flag, which DCGM has and the
        // CSVs do not list.
        let absent: Vec<Field> = Field::ALL
            .into_iter()
            .filter(|field| !exported.contains(field))
            .collect();
        assert_eq!(absent, [Field::RowRemapPending]);
        let unavailable = unavailable_names(&all);
        assert_eq!(unavailable.len(), 31, "{unavailable:#?}");
        for name in [
            "DCGM_EXP_CLOCK_EVENTS_COUNT",
            "DCGM_EXP_P2P_STATUS",
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "DCGM_FI_PROF_FP16_CYCLES_ACTIVE_TOTAL",
        ] {
            assert!(unavailable.contains(&name), "{name}");
        }
        let dcp = Selection::parse(&uncommented(DCP_METRICS_INCLUDED)).unwrap();
        assert_eq!(dcp.fields(), all.fields());

        // The 1.x namespace, commented rows on too: every name maps, DCP ones (one listed twice) reported once.
        let legacy = Selection::parse(&uncommented(COMPATIBILITY)).unwrap();
        assert_eq!(legacy.fields().len(), 32);
        assert!(
            legacy
                .fields()
                .iter()
                .all(|selected| selected.name.starts_with("dcgm_"))
        );
        assert_eq!(
            unavailable_names(&legacy),
            [
                "dcgm_fi_prof_pcie_tx_bytes",
                "dcgm_fi_prof_pcie_rx_bytes",
                "dcgm_fi_prof_gr_engine_active",
                "dcgm_fi_prof_sm_active",
                "dcgm_fi_prof_sm_occupancy",
                "dcgm_fi_prof_pipe_tensor_active",
                "dcgm_fi_prof_dram_active",
            ]
        );
    }

    #[test]
    fn every_bad_line_is_named_with_its_fix() {
        let text = "\
DCGM_FI_DEV_GPU_TEMP, gauge, ok
DCGM_FI_DEV_GPU_TMP, gauge, a typo
DCGM_FI_DEV_SM_CLOCK, histogram, SM clock
DCGM_FI_DEV_FB_USED
DCGM_FI_DEV_POWER_USAGE, label, power
DCGM_FI_DRIVER_VERSION, gauge, driver
# DCGM_FI_DEV_GPU_UTIL, nonsense: a comment
DCGM_FI_DEV_GPU_TEMP, gauge, again
, gauge, no name
";
        let errors = Selection::parse(text).unwrap_err();
        let texts: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(texts.len(), 7, "{texts:#?}");
        assert!(
            texts[0].starts_with(
                "line 2: unknown field DCGM_FI_DEV_GPU_TMP; this exporter serves DCGM_FI_DEV_SM_CLOCK, "
            ),
            "{}",
            texts[0]
        );
        assert!(
            texts[0].ends_with(
                "DCGM_FI_DEV_VBIOS_VERSION, and accepts the DCGM_FI_PROF_* and DCGM_EXP_* fields of NVIDIA's CSVs without exporting them; correct the name, or remove the line or comment it out with #"
            ),
            "{}",
            texts[0]
        );
        assert_eq!(
            texts[1..],
            [
                "line 3: DCGM_FI_DEV_SM_CLOCK: unknown type \"histogram\"; use gauge, counter or label",
                "line 4: expected `field, type, help` (e.g. `DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).`), got \"DCGM_FI_DEV_FB_USED\"",
                "line 5: DCGM_FI_DEV_POWER_USAGE is a number: its type must be gauge or counter, not label",
                "line 6: DCGM_FI_DRIVER_VERSION is text: its type must be label, not gauge",
                "line 8: DCGM_FI_DEV_GPU_TEMP is already listed on line 1; remove one of the two lines",
                "line 9: expected `field, type, help` (e.g. `DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).`), got \", gauge, no name\"",
            ]
        );
        assert_eq!(
            Selection::parse("# nothing\n\n").unwrap_err(),
            [ConfigError::NoFields]
        );
    }

    /// A ConfigMap of thousands of bad lines is reported as its first bad lines and a count, not one warning each.
    #[test]
    fn thousands_of_bad_lines_report_the_first_ones_and_a_count() {
        let text = "x, gauge\n".repeat(10_000);
        let errors = Selection::parse(&text).unwrap_err();
        assert_eq!(errors.len(), MAX_REPORTED_ERRORS + 1);
        assert_eq!(
            errors[MAX_REPORTED_ERRORS].to_string(),
            "9984 more bad lines, not shown; fix the ones above first"
        );
    }

    /// A long line is quoted by its start, so that one line of a megabyte is not a megabyte of error.
    #[test]
    fn a_long_line_is_quoted_by_its_start() {
        let long = "é".repeat(100_000);
        let errors =
            Selection::parse(&format!("{long}\nDCGM_FI_DEV_GPU_TEMP, {long}\n")).unwrap_err();
        let quoted = format!("{}…", "é".repeat(80));
        assert_eq!(
            errors,
            [
                ConfigError::Malformed {
                    line: 1,
                    text: quoted.clone()
                },
                ConfigError::UnknownType {
                    line: 2,
                    field: "DCGM_FI_DEV_GPU_TEMP".into(),
                    kind: quoted
                }
            ]
        );
    }

    #[test]
    fn the_csv_is_the_documented_key_or_the_only_one() {
        let csv = "DCGM_FI_DEV_GPU_TEMP, gauge, temperature\n";
        let (key, selection) = from_config_map(Some(&config_map(&[
            ("README", "not a CSV"),
            (CONFIG_MAP_KEY, csv),
        ])))
        .unwrap();
        assert_eq!(key, CONFIG_MAP_KEY);
        assert_eq!(selection.fields()[0].field, Field::GpuTemp);
        let (key, _) = from_config_map(Some(&config_map(&[("metrics.csv", csv)]))).unwrap();
        assert_eq!(key, "metrics.csv");

        assert_eq!(from_config_map(None), Err(ConfigMapError::Missing));
        assert_eq!(
            from_config_map(Some(&config_map(&[]))),
            Err(ConfigMapError::Empty)
        );
        let error =
            from_config_map(Some(&config_map(&[("a.csv", csv), ("b.csv", csv)]))).unwrap_err();
        assert_eq!(
            error.to_string(),
            "has several keys (a.csv, b.csv) and none is dcgm-metrics.csv: name the CSV's key dcgm-metrics.csv"
        );
        let error = from_config_map(Some(&config_map(&[(
            CONFIG_MAP_KEY,
            "DCGM_FI_DEV_GPU_TEMP, gauge\nDCGM_FI_DEV_GPU_TEMP, gauge\n",
        )])))
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "key dcgm-metrics.csv: line 2: DCGM_FI_DEV_GPU_TEMP is already listed on line 1; remove one of the two lines"
        );
    }
}

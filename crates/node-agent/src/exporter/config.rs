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
//! label on every series. A config with a bad line is refused as a whole, so that a typo never silently drops the
//! fields an alert relies on: the caller keeps what it exported before.
//!
//! In a ConfigMap the CSV is the key `dcgm-metrics.csv` (the file name NVIDIA's GPU Operator documents for
//! `kubectl create configmap --from-file`), or else the ConfigMap's only key.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::ConfigMap;

use super::fields::{Field, Kind};

/// The ConfigMap key that holds the CSV when the ConfigMap has several.
pub const CONFIG_MAP_KEY: &str = "dcgm-metrics.csv";

/// One exported field, with its type and help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The field.
    pub field: Field,
    /// How it shows.
    pub kind: Kind,
    /// The HELP text.
    pub help: String,
}

/// The fields to export, in the config's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    fields: Vec<Selected>,
}

/// The default set: every field of dcgm-exporter's default CSV, with its type and help.
impl Default for Selection {
    fn default() -> Self {
        Self {
            fields: Field::ALL
                .into_iter()
                .map(|field| Selected {
                    field,
                    kind: field.default_kind(),
                    help: field.default_help().to_owned(),
                })
                .collect(),
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
    /// A field this exporter does not know.
    #[error(
        "line {line}: unknown field {field}; this exporter serves {}; remove the line or comment it out with #",
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
        /// The field.
        field: Field,
        /// The type given.
        kind: String,
    },
    /// A number field given as a label.
    #[error("line {line}: {field} is a number: its type must be gauge or counter, not label")]
    NumberAsLabel {
        /// 1-based line number.
        line: usize,
        /// The field.
        field: Field,
    },
    /// A text field given as a gauge or counter.
    #[error("line {line}: {field} is text: its type must be label, not {}", kind.word())]
    TextAsNumber {
        /// 1-based line number.
        line: usize,
        /// The field.
        field: Field,
        /// The type given.
        kind: Kind,
    },
    /// A field listed twice.
    #[error("line {line}: {field} is already listed on line {first}; remove one of the two lines")]
    Duplicate {
        /// 1-based line number.
        line: usize,
        /// The field.
        field: Field,
        /// The line that listed it first.
        first: usize,
    },
    /// Nothing but comments and blank lines.
    #[error(
        "the config lists no field: add `field, type, help` lines (e.g. `DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).`)"
    )]
    NoFields,
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

impl Selection {
    /// Parses the CSV; every bad line is reported, so that one edit can fix them all.
    ///
    /// # Errors
    /// The bad lines, in order; [`ConfigError::NoFields`] when no line lists a field.
    pub fn parse(text: &str) -> Result<Self, Vec<ConfigError>> {
        let mut fields = Vec::new();
        let mut first_line: BTreeMap<Field, usize> = BTreeMap::new();
        let mut errors = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            match parse_line(line, trimmed) {
                Ok(selected) => {
                    if let Some(&first) = first_line.get(&selected.field) {
                        errors.push(ConfigError::Duplicate {
                            line,
                            field: selected.field,
                            first,
                        });
                    } else {
                        first_line.insert(selected.field, line);
                        fields.push(selected);
                    }
                }
                Err(error) => errors.push(error),
            }
        }
        if errors.is_empty() && fields.is_empty() {
            errors.push(ConfigError::NoFields);
        }
        if errors.is_empty() {
            Ok(Self { fields })
        } else {
            Err(errors)
        }
    }

    /// The selected fields, in the config's order.
    #[must_use]
    pub fn fields(&self) -> &[Selected] {
        &self.fields
    }

    /// The selected fields that are never exported because the backend has no reading for them.
    pub fn unsourced(&self) -> impl Iterator<Item = Field> + '_ {
        self.fields
            .iter()
            .map(|selected| selected.field)
            .filter(|field| !field.sourced())
    }
}

/// One `field, type[, help]` line.
fn parse_line(line: usize, text: &str) -> Result<Selected, ConfigError> {
    let mut columns = text.splitn(3, ',').map(str::trim);
    let (Some(name), Some(word)) = (columns.next(), columns.next()) else {
        return Err(ConfigError::Malformed {
            line,
            text: text.to_owned(),
        });
    };
    if name.is_empty() || word.is_empty() {
        return Err(ConfigError::Malformed {
            line,
            text: text.to_owned(),
        });
    }
    let field: Field = name.parse().map_err(|_| ConfigError::UnknownField {
        line,
        field: name.to_owned(),
    })?;
    let kind = Kind::from_word(word).ok_or_else(|| ConfigError::UnknownType {
        line,
        field,
        kind: word.to_owned(),
    })?;
    match (field.is_text(), kind) {
        (false, Kind::Label) => return Err(ConfigError::NumberAsLabel { line, field }),
        (true, Kind::Gauge | Kind::Counter) => {
            return Err(ConfigError::TextAsNumber { line, field, kind });
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
    Ok(Selected {
        field,
        kind,
        help: help.to_owned(),
    })
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
mod tests {
    use super::*;
    use crate::test_support::config_map;

    fn names(selection: &Selection) -> Vec<(&'static str, Kind, &str)> {
        selection
            .fields()
            .iter()
            .map(|selected| (selected.field.name(), selected.kind, selected.help.as_str()))
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
            ]
        );
        assert_eq!(selection.unsourced().count(), 0);
    }

    #[test]
    fn the_default_is_dcgm_exporters_set() {
        let selection = Selection::default();
        assert_eq!(selection.fields().len(), 16);
        let energy = &selection.fields()[5];
        assert_eq!(
            (energy.field, energy.kind),
            (Field::TotalEnergyConsumption, Kind::Counter)
        );
        assert_eq!(
            selection.unsourced().collect::<Vec<_>>(),
            [
                Field::MemoryTemp,
                Field::PcieReplayCounter,
                Field::EncUtil,
                Field::DecUtil,
                Field::FbReserved
            ]
        );
    }

    #[test]
    fn every_bad_line_is_named_with_its_fix() {
        let text = "\
DCGM_FI_DEV_GPU_TEMP, gauge, ok
DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.
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
                "line 2: unknown field DCGM_FI_PROF_GR_ENGINE_ACTIVE; this exporter serves DCGM_FI_DEV_SM_CLOCK, "
            ),
            "{}",
            texts[0]
        );
        assert!(
            texts[0].ends_with("DCGM_FI_DRIVER_VERSION; remove the line or comment it out with #"),
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

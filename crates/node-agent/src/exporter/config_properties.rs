//! Property tests of the metrics CSV parser: any text is a selection or a bounded list of errors, never a panic;
//! a selection lists each metric once with a type its field can have, and written back as a CSV it reads the same.

use proptest::prelude::*;
use proptest::sample::{select, subsequence};

use super::{ConfigError, MAX_REPORTED_ERRORS, Selection};
use crate::exporter::fields::Field;

/// Cases per property, about a millisecond each.
const CASES: u32 = 256;

/// The lines of NVIDIA's CSVs.
fn nvidia_lines() -> Vec<&'static str> {
    [
        include_str!("../../../../tests/fixtures/nvidia/default-counters.csv"),
        include_str!("../../../../tests/fixtures/nvidia/dcp-metrics-included.csv"),
        include_str!("../../../../tests/fixtures/nvidia/1.x-compatibility-metrics.csv"),
    ]
    .iter()
    .flat_map(|csv| csv.lines())
    .collect()
}

/// A field name: every one this exporter serves, some it accepts without exporting, a 1.x one, and anything.
fn name() -> impl Strategy<Value = String> {
    let served: Vec<&'static str> = Field::ALL.iter().map(|field| field.name()).collect();
    prop_oneof![
        4 => select(served).prop_map(str::to_owned),
        1 => select(vec!["DCGM_FI_PROF_SM_ACTIVE", "DCGM_EXP_XID_ERRORS_COUNT", "dcgm_gpu_temp", "dcgm_fi_prof_x"])
            .prop_map(str::to_owned),
        1 => "\\PC{0,20}",
    ]
}

/// One line: a `field, type, help` line with any of its parts odd, a comment, a blank line, or anything.
fn line() -> impl Strategy<Value = String> {
    let kind = prop_oneof![
        select(vec!["gauge", "counter", "label", "Gauge", " COUNTER ", ""]).prop_map(str::to_owned),
        "\\PC{0,8}",
    ];
    let help = prop_oneof![
        Just(None),
        "[a-zA-Z ().,\"]{0,30}".prop_map(Some),
        "\\PC{0,30}".prop_map(Some),
    ];
    prop_oneof![
        6 => (name(), kind, help).prop_map(|(name, kind, help)| match help {
            Some(help) => format!("{name}, {kind}, {help}"),
            None => format!("{name}, {kind}"),
        }),
        1 => "# \\PC{0,20}",
        1 => Just(String::new()),
        1 => "\\PC{0,40}",
    ]
}

/// A CSV of NVIDIA's lines (a random subset) and generated ones, in random order.
fn csv() -> impl Strategy<Value = String> {
    let lines = nvidia_lines();
    let count = lines.len();
    (
        subsequence(lines, 0..=count),
        prop::collection::vec(line(), 0..24),
        any::<bool>(),
    )
        .prop_flat_map(|(nvidia, generated, crlf)| {
            let all: Vec<String> = nvidia
                .into_iter()
                .map(str::to_owned)
                .chain(generated)
                .collect();
            (Just(all).prop_shuffle(), Just(crlf))
        })
        .prop_map(|(lines, crlf)| lines.join(if crlf { "\r\n" } else { "\n" }))
}

/// The selection as a CSV: one `name, type, help` line each, the help quoted when it holds a comma.
fn written(selection: &Selection) -> String {
    let mut text = String::new();
    for selected in selection.fields() {
        let help = if selected.help.contains(',') {
            format!("\"{}\"", selected.help)
        } else {
            selected.help.clone()
        };
        text.push_str(&format!(
            "{}, {}, {help}\n",
            selected.name,
            selected.kind.word()
        ));
    }
    for unavailable in selection.unavailable() {
        text.push_str(&format!("{}, gauge\n", unavailable.name));
    }
    text
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Any mix of NVIDIA's and generated lines: a selection that holds together, or errors that name real lines
    /// and are at most [`MAX_REPORTED_ERRORS`] and a count.
    #[test]
    fn csvs_are_a_consistent_selection_or_bounded_errors(text in csv()) {
        let lines = text.lines().count();
        match Selection::parse(&text) {
            Ok(selection) => {
                let mut names: Vec<&str> = selection.fields().iter().map(|selected| selected.name.as_str()).collect();
                names.sort_unstable();
                names.dedup();
                prop_assert_eq!(names.len(), selection.fields().len(), "a metric listed twice");
                for selected in selection.fields() {
                    prop_assert_eq!(selected.field.is_text(), selected.kind.word() == "label");
                    prop_assert!(!selected.help.is_empty());
                }
                prop_assert!(selection.fields().len() + selection.unavailable().len() <= lines);
                let again = Selection::parse(&written(&selection)).map_err(|errors| {
                    TestCaseError::fail(format!("{errors:?}"))
                })?;
                prop_assert_eq!(again.fields(), selection.fields());
                let unavailable = |selection: &Selection| -> Vec<String> {
                    selection.unavailable().iter().map(|field| field.name.clone()).collect()
                };
                prop_assert_eq!(unavailable(&again), unavailable(&selection));
            }
            Err(errors) => {
                prop_assert!(!errors.is_empty() && errors.len() <= MAX_REPORTED_ERRORS + 1);
                for error in &errors {
                    let line = match error {
                        ConfigError::Malformed { line, .. }
                        | ConfigError::UnknownField { line, .. }
                        | ConfigError::UnknownType { line, .. }
                        | ConfigError::NumberAsLabel { line, .. }
                        | ConfigError::TextAsNumber { line, .. }
                        | ConfigError::Duplicate { line, .. } => *line,
                        ConfigError::MoreBadLines { .. } | ConfigError::NoFields => 1,
                    };
                    prop_assert!((1..=lines.max(1)).contains(&line), "{}", error);
                }
            }
        }
    }

    /// Any text at all.
    #[test]
    fn any_text_is_a_selection_or_errors(text in "\\PC{0,300}") {
        if let Err(errors) = Selection::parse(&text) {
            prop_assert!(!errors.is_empty() && errors.len() <= MAX_REPORTED_ERRORS + 1);
        }
    }
}
